"""Trace context inside traintel's phases is what the OpenTelemetry SDK would give a real span:
the parent's tracestate and flags (the random-trace-id flag included), an id generator that
keeps the whole ``IdGenerator`` interface, and a step phase's ``as span`` handle that is the
step itself."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import context as context_api
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import traintel
from traintel import semconv

RANDOM_FLAG = 0x02
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SDK_HAS_RANDOM_FLAG = hasattr(IdGenerator, "is_trace_id_random")


def sdk_flags_under(parent: context_api.Context) -> int:
    """The trace flags the SDK itself gives a span under ``parent``."""
    provider = TracerProvider(shutdown_on_exit=False)
    with provider.get_tracer("plain").start_as_current_span("plain", context=parent) as span:
        return int(span.get_span_context().trace_flags)


def spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    traintel.get_telemetry().flush(5)
    return list(exporter.get_finished_spans())


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans(exporter) if s.name == name]


@pytest.mark.parametrize("policy", ["sampled", "all"])
def test_spans_inside_an_iteration_keep_the_remote_parents_tracestate_and_flags(policy: str) -> None:
    exporter = InMemorySpanExporter()
    traintel.configure(span_exporters=[exporter], export_iterations=policy)
    propagator = TraceContextTextMapPropagator()
    remote = propagator.extract({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-03", "tracestate": "vendor=abc"})
    tracer = traintel.get_telemetry().pipeline.tracer_provider.get_tracer("user-code")  # type: ignore[union-attr]
    carriers: list[dict[str, str]] = []
    token = context_api.attach(remote)
    try:
        with traintel.training_loop(), traintel.training_iteration() as iteration:
            outgoing: dict[str, str] = {}
            propagator.inject(outgoing)  # what a request made from inside the iteration carries
            carriers.append(outgoing)
            assert iteration.get_span_context().trace_state.get("vendor") == "abc"
            with tracer.start_as_current_span("user work"):
                pass
    finally:
        context_api.detach(token)
    (user,) = named(exporter, "user work")
    (exported_iteration,) = named(exporter, "training_iteration")
    expected = sdk_flags_under(remote)
    assert expected == (0x03 if SDK_HAS_RANDOM_FLAG else 0x01)  # older SDKs carry "sampled" only
    for span in (user, exported_iteration):
        assert span.context.trace_id == int(TRACE_ID, 16)
        assert span.context.trace_flags == expected, span.name
        assert dict(span.context.trace_state) == {"vendor": "abc"}, span.name
    assert user.parent is not None and user.parent.span_id == exported_iteration.context.span_id
    assert carriers[0]["traceparent"].endswith(f"-{expected:02x}")
    assert carriers[0]["tracestate"] == "vendor=abc"


@pytest.mark.skipif(not SDK_HAS_RANDOM_FLAG, reason="this opentelemetry-sdk has no random-trace-id flag")
@pytest.mark.parametrize("policy", ["sampled", "all"])
def test_every_span_of_traintels_pipeline_keeps_the_random_trace_id_flag(policy: str) -> None:
    assert RandomIdGenerator().is_trace_id_random()
    exporter = InMemorySpanExporter()
    traintel.configure(span_exporters=[exporter], export_iterations=policy, log_every_n_iterations=2)
    with traintel.application(), traintel.training_loop():
        for _ in range(3):
            with traintel.training_iteration(), traintel.model_forward():
                pass
    traintel.shutdown(5)
    found = list(exporter.get_finished_spans())
    assert {s.name for s in found} >= {"application", "training_loop", "training_iteration", "model_forward"}
    assert [s.name for s in found if not s.context.trace_flags & RANDOM_FLAG] == []


def test_the_id_generator_forwards_the_whole_interface() -> None:
    class Custom(IdGenerator):
        def generate_span_id(self) -> int:
            return 7

        def generate_trace_id(self) -> int:
            return 11

        def is_trace_id_random(self) -> bool:
            return False

    from traintel._sdk.ids import ForcingIdGenerator

    for inner, random in ((Custom(), False), (RandomIdGenerator(), SDK_HAS_RANDOM_FLAG)):
        ids = ForcingIdGenerator(inner)
        assert ids.is_trace_id_random() is random
        if isinstance(inner, Custom):
            assert (ids.generate_span_id(), ids.generate_trace_id()) == (7, 11)
        ids.force(5, 9)
        assert (ids.generate_span_id(), ids.generate_trace_id()) == (5, 9)


STEP_FACTORIES = (
    traintel.data_loading,
    traintel.model_forward,
    traintel.model_backward,
    traintel.optimizer_update,
)


@pytest.mark.parametrize("policy", ["sampled", "all"])
@pytest.mark.parametrize("factory", STEP_FACTORIES, ids=lambda f: f.__name__)
def test_a_step_phases_handle_is_the_step(policy: str, factory: Any) -> None:
    """What is set on ``with model_forward() as span`` lands on the exported model_forward span,
    not on its iteration."""
    exporter = InMemorySpanExporter()
    traintel.configure(span_exporters=[exporter], export_iterations=policy)
    with traintel.training_loop(), traintel.training_iteration() as iteration:
        with factory() as span:
            assert span is not iteration
            span.set_attribute("x", 1)
            span.set_attributes({"y": "two"})
            span.add_event("inside the step", {"z": 3})
    (step,) = named(exporter, factory.__name__)
    (exported_iteration,) = named(exporter, "training_iteration")
    assert step.attributes is not None and (step.attributes["x"], step.attributes["y"]) == (1, "two")
    assert [(e.name, dict(e.attributes or {})) for e in step.events] == [("inside the step", {"z": 3})]
    assert step.attributes[semconv.PHASE] == factory.__name__
    assert "x" not in (exported_iteration.attributes or {})
    assert not [e for e in exported_iteration.events if e.name == "inside the step"]


@pytest.mark.parametrize("configured", ["unconfigured", "sampled", "all", "shut down"])
@pytest.mark.parametrize("factory", STEP_FACTORIES, ids=lambda f: f.__name__)
def test_every_call_of_a_phase_factory_is_a_new_object(configured: str, factory: Any) -> None:
    if configured in ("sampled", "all", "shut down"):
        policy = "all" if configured == "all" else "sampled"
        traintel.configure(span_exporters=[InMemorySpanExporter()], export_iterations=policy)
    if configured == "shut down":
        traintel.shutdown(1)
    assert factory() is not factory()
