"""Segment boundaries the 100,000-iteration test does not reach: by time, by the byte budget,
the per-segment span and byte counts, and what a crash (SIGKILL) leaves in the file."""

from __future__ import annotations

import signal
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import traintel
from tests.subprocess_helpers import run_python
from traintel import callbacks, semconv
from traintel._aggregation.otlp_size import estimate_span_bytes
from traintel._sdk.export_filter import TraceBudget
from traintel.exporters.reader import iter_spans

T0 = 1_700_000_000_000  # ms since the epoch


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    traintel.shutdown(2)


def traces(exporter: InMemorySpanExporter) -> dict[int, list[ReadableSpan]]:
    traintel.get_telemetry().flush(60)
    by_trace: dict[int, list[ReadableSpan]] = defaultdict(list)
    for span in exporter.get_finished_spans():
        by_trace[span.context.trace_id].append(span)
    return by_trace


def loop_segments(by_trace: dict[int, list[ReadableSpan]]) -> list[ReadableSpan]:
    loops = [s for spans in by_trace.values() for s in spans if s.name == "training_loop"]
    return sorted(loops, key=lambda s: s.attributes[semconv.SEGMENT_INDEX])  # type: ignore[index]


def test_segments_by_time_close_on_the_period_and_count_their_spans(exporter: InMemorySpanExporter) -> None:
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], segment_seconds=10, log_every_n_iterations=4
    )
    callbacks.on_app_start(start_time_msec=T0)
    callbacks.on_train_start(start_time_msec=T0)
    for i in range(25):  # 1 s iterations: a segment every 10
        callbacks.on_training_single_iteration_start(start_time_msec=T0 + 1000 * i)
        callbacks.on_training_single_iteration_end(finish_time_msec=T0 + 1000 * (i + 1))
    callbacks.on_train_end(finish_time_msec=T0 + 25_000)
    callbacks.on_app_end(finish_time_msec=T0 + 26_000)
    by_trace = traces(exporter)
    assert len(by_trace) == 3
    loops = loop_segments(by_trace)
    bounds = [((s.start_time or 0) // 10**6 - T0, (s.end_time or 0) // 10**6 - T0) for s in loops]
    assert bounds == [(0, 10_000), (10_000, 20_000), (20_000, 25_000)]
    ranges = [
        (s.attributes[semconv.SEGMENT_FIRST_ITERATION], s.attributes[semconv.SEGMENT_LAST_ITERATION])
        for s in loops
    ]  # type: ignore[index]
    assert ranges == [(0, 9), (10, 19), (20, 24)]
    assert [s.attributes[semconv.SEGMENT_CONTINUES] for s in loops] == [True, True, False]  # type: ignore[index]
    for loop in loops:
        # what the segment counted is what its trace holds besides its application and loop spans;
        # its byte count is an estimate of their OTLP size (see the xfail below for how close)
        assert loop.attributes[semconv.SEGMENT_SPANS] == len(by_trace[loop.context.trace_id]) - 2  # type: ignore[index]
        counted = [
            s for s in by_trace[loop.context.trace_id] if s.name not in ("application", "training_loop")
        ]
        real = len(encode_spans(counted).SerializeToString())
        assert real / 2 <= loop.attributes[semconv.SEGMENT_BYTES] <= 2 * real  # type: ignore[index,operator]
    assert loops[-1].attributes[semconv.SUMMARY_PREFIX + "segments"] == 3  # type: ignore[index]


def run_all_mode(exporter: InMemorySpanExporter, max_bytes: int) -> dict[int, list[ReadableSpan]]:
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_iterations="all", max_bytes_per_trace=max_bytes,
        log_every_n_iterations=10,
    )  # fmt: skip
    with traintel.application(), traintel.training_loop():
        for _ in range(1000):
            with traintel.training_iteration(samples=4), traintel.model_forward():
                traintel.record_metrics(loss=1.0, lr=0.1, grad_norm=2.0)
    return traces(exporter)


def test_the_byte_budget_closes_segments_early(exporter: InMemorySpanExporter) -> None:
    by_trace = run_all_mode(exporter, max_bytes=30_000)
    loops = loop_segments(by_trace)
    assert len(loops) > 5  # 2,000 spans of ~200 B cannot fit one 30 kB trace
    assert all(s.attributes[semconv.SEGMENT_BYTES] <= 30_000 for s in loops)  # type: ignore[index,operator]
    iterations = sorted(
        s.attributes[semconv.ITERATION]
        for t in by_trace.values()
        for s in t
        if s.name == "training_iteration"
    )  # type: ignore[index,misc]
    assert iterations == list(range(1000))


def test_the_byte_budget_holds_for_the_real_otlp_size(exporter: InMemorySpanExporter) -> None:
    by_trace = run_all_mode(exporter, max_bytes=30_000)
    sizes = [len(encode_spans(spans).SerializeToString()) for spans in by_trace.values()]
    assert max(sizes) <= 30_000, sizes


def test_the_budget_sizes_every_kind_of_span_in_a_periodic_trace() -> None:
    """20 small spans then one large one, over and over: a cycle of 21 spans. Sizing every 7th
    span whatever its kind never sized the large one (it once let a 30 kB trace reach 31.5 kB)."""
    collected = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(collected))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("root"):
        for _ in range(30):
            for i in range(20):
                tracer.start_span("training_iteration", attributes={"ml.training.iteration": i}).end()
            window = {f"ml.training.window.value_{k}": float(k) / 3 for k in range(60)}
            tracer.start_span("training_window", attributes=window).end()
    spans = [s for s in collected.get_finished_spans() if s.name != "root"]
    budget = TraceBudget()
    for span in spans:
        budget.add(span)
    count, estimated = budget.usage(spans[0].context.trace_id)
    assert count == len(spans) == 630
    real = len(encode_spans(spans).SerializeToString())
    assert estimated == sum(map(estimate_span_bytes, spans))  # each kind's size repeats exactly here
    assert real <= estimated <= 1.3 * real, (real, estimated)


def test_a_failed_span_is_sized_apart_from_its_kind() -> None:
    """A failed iteration carries its exception (a stack trace): it must not stand in for, or be
    stood in for by, the ordinary iterations of the same name."""
    collected = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(collected))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("root"):
        tracer.start_span("training_iteration").end()
        failed = tracer.start_span("training_iteration")
        failed.record_exception(RuntimeError("x" * 3000))
        failed.set_status(StatusCode.ERROR)
        failed.end()
    spans = [s for s in collected.get_finished_spans() if s.name != "root"]
    budget = TraceBudget()
    for span in spans:
        budget.add(span)
    _count, estimated = budget.usage(spans[0].context.trace_id)
    assert estimated == sum(map(estimate_span_bytes, spans)) > 3000


@pytest.mark.parametrize("max_bytes", [8_000, 15_000])
def test_the_byte_budget_holds_with_long_evaluation_loops_under_small_budgets(
    exporter: InMemorySpanExporter, max_bytes: int
) -> None:
    """An evaluation loop cannot rotate the segment: the room kept for one more iteration is
    what stops it exporting before the trace is full (a 2 kB room let 8 kB traces reach 12 kB)."""
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_iterations="all", max_bytes_per_trace=max_bytes,
        log_every_n_iterations=10,
    )  # fmt: skip
    with traintel.application(), traintel.training_loop():
        for _ in range(6):
            with traintel.training_iteration(samples=4), traintel.model_forward():
                traintel.record_metrics(loss=1.0, lr=0.1, grad_norm=2.0)
            with traintel.validation_loop():
                for _ in range(200):
                    with traintel.validation_iteration(), traintel.model_forward():
                        traintel.record_metrics(val_loss=1.0, acc=0.5)
    sizes = [len(encode_spans(spans).SerializeToString()) for spans in traces(exporter).values()]
    assert max(sizes) <= max_bytes, sorted(sizes)[-3:]


CRASHING_JOB = """
import os, signal, time
import traintel
from traintel.exporters.reader import iter_spans


def closed_segments_written():
    try:
        spans = list(iter_spans([os.environ["TRAINTEL_OUTPUT_DIR"]]))
    except Exception:  # a line still being written
        return False
    names = [s.name for s in spans]
    return names.count("training_loop") >= 3 and names.count("application") >= 3


traintel.configure(segment_iterations=100, log_every_n_iterations=50, slow_iteration_factor=1e9)
with traintel.application(), traintel.training_loop():
    for i in range(350):
        with traintel.training_iteration(), traintel.model_forward():
            pass
    # no flush: the closed segments must already be on their way (a job that held them back
    # waits here until the deadline and is killed without them)
    deadline = time.monotonic() + 60
    while not closed_segments_written() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.process
def test_a_crash_loses_at_most_the_open_segment(tmp_path: Path) -> None:
    result = run_python(
        CRASHING_JOB, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "out"), OTEL_BSP_SCHEDULE_DELAY="200"
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    spans = list(iter_spans([tmp_path / "out"]))
    by_trace: dict[str, list[str]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span.span_id)
    loops = sorted(
        (s for s in spans if s.name == "training_loop"), key=lambda s: s.attributes[semconv.SEGMENT_INDEX]
    )
    apps = sorted(
        (s for s in spans if s.name == "application"), key=lambda s: s.attributes[semconv.SEGMENT_INDEX]
    )
    # the three closed segments arrived whole; only the open fourth (iterations 300-349) is lost
    assert [s.attributes[semconv.SEGMENT_INDEX] for s in loops] == [0, 1, 2]
    assert [s.attributes[semconv.SEGMENT_INDEX] for s in apps] == [0, 1, 2]
    for k, (app, loop) in enumerate(zip(apps, loops, strict=True)):
        assert loop.attributes[semconv.SEGMENT_FIRST_ITERATION] == 100 * k
        assert loop.attributes[semconv.SEGMENT_LAST_ITERATION] == 100 * k + 99
        assert loop.parent_span_id == app.span_id and app.parent_span_id in ("", None)
        ids = set(by_trace[loop.trace_id])
        trace_spans = [s for s in spans if s.trace_id == loop.trace_id]
        assert all(not s.parent_span_id or s.parent_span_id in ids for s in trace_spans)  # no orphan
    exported = {s.attributes[semconv.ITERATION] for s in spans if s.name == "training_iteration"}
    assert set(range(10)) | {100, 200} <= exported


def test_the_span_budget_holds_for_a_long_validation_loop_in_all_mode(exporter: InMemorySpanExporter) -> None:
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_iterations="all", max_spans_per_trace=100
    )
    with traintel.application(), traintel.training_loop():
        with traintel.training_iteration():
            pass
        with traintel.validation_loop():
            for _ in range(300):  # no training iteration starts in between: no rotation
                with traintel.validation_iteration():
                    pass
    sizes = [len(spans) for spans in traces(exporter).values()]
    assert max(sizes) <= 100, sizes
