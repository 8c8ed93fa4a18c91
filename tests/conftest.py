"""Shared fixtures: a private SDK pipeline per test and a clean environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from tests.integration_helpers import metric_points
from tests.subprocess_helpers import SUITE_ENV
from tests.tiers import (  # noqa: F401  (the suite's tiers: pytest finds these hooks here)
    pytest_addoption,
    pytest_collection_finish,
    pytest_configure,
    pytest_ignore_collect,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)
from traintel._recorder import active
from traintel._runtime import window_pipeline
from traintel.distributed.collectives import SEQUENCE

#: The embedded default's directory as a test run from the repository would create it.
_REPO_RUNS = Path(__file__).resolve().parent.parent / "traintel-runs"
_REPO_RUNS_BEFORE = set(_REPO_RUNS.glob("*")) if _REPO_RUNS.is_dir() else set()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite writes nothing into the repository's ``traintel-runs/`` (a provider traintel
    builds from the environment defaults to it): every test's default output is its own."""
    left = (set(_REPO_RUNS.glob("*")) if _REPO_RUNS.is_dir() else set()) - _REPO_RUNS_BEFORE
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nthe suite left telemetry in the repository: {sorted(map(str, left))}")


@pytest.fixture(autouse=True)
def clean_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """No test sees the developer's OTEL_* / TRAINTEL_* settings or another test's runtime.

    The suite's loops last milliseconds, so windows close every N iterations and iterations
    are sampled by count, without the defaults' floors in time (their tests set their own);
    child processes inherit that too (``subprocess_helpers.clean_env``). The
    in-process tests read each window's numbers from the full ``training_metrics_update`` event;
    child processes (files read back by the report commands) get the default compact record.
    """
    for name in list(os.environ):
        if name.startswith(("OTEL_", "TRAINTEL_")):
            monkeypatch.delenv(name)
    for name, value in SUITE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "on")
    # a provider built from the environment (a test that passes only a tracer provider gets
    # traintel's metrics file) writes here, not into the working directory
    monkeypatch.setenv("TRAINTEL_OUTPUT_DIR", str(tmp_path_factory.mktemp("default-output")))
    # Each closed window is reported on the thread that closes it: exact numbers at once.
    monkeypatch.setattr(window_pipeline, "SYNCHRONOUS", True)
    active.shutdown(0.5)
    # the process's collective sequence starts at zero for each test, as in a fresh job
    SEQUENCE.entered = SEQUENCE.completed = 0
    yield
    active.shutdown(0.5)
    # OpenTelemetry sets a global provider once per process: every later configure would attach
    # to one a test published (tests/test_config.py's errors from OTEL_* would not be raised)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), (
        "the test published a global tracer provider: run it in a child process (subprocess_helpers)"
    )
    # a test that leaves a span current would parent every later test's spans under it
    leaked = trace.get_current_span()
    context_api.attach(context_api.Context())  # the next test starts clean either way
    assert leaked is trace.INVALID_SPAN, f"the test left span {leaked} current"


@dataclass
class Pipeline:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def by_name(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.by_name(name)
        assert len(found) == 1, f"expected one {name!r} span, got {len(found)}"
        return found[0]


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    traintel.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield Pipeline(tracer_provider, meter_provider, exporter, reader)
    traintel.shutdown(1.0)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def parent_name(span: ReadableSpan, spans: list[ReadableSpan]) -> str | None:
    if span.parent is None:
        return None
    for candidate in spans:
        if candidate.context.span_id == span.parent.span_id:
            return candidate.name
    raise AssertionError(f"{span.name}: parent {span.parent.span_id:x} not among exported spans")


@dataclass
class Owned:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        # a hang guard, not a deadline: a flush cut short on a busy machine would lose spans
        traintel.get_telemetry().flush(60)
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [dict(e.attributes or {}) for s in self.spans() for e in s.events if e.name == name]

    def metric_points(self, name: str) -> list[Any]:
        return metric_points(self.reader, name)


@pytest.fixture
def owned() -> Iterator[Any]:
    """A pipeline traintel builds itself (export filter included) around in-memory parts."""

    def make(**training: object) -> Owned:
        exporter = InMemorySpanExporter()
        reader = InMemoryMetricReader()
        traintel.configure(span_exporters=[exporter], metric_readers=[reader], **training)
        return Owned(exporter, reader)

    yield make
    traintel.shutdown(2)
