"""Segmented traces: a long run is many short, linked traces that together are the run."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from traintel import semconv


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    traintel.shutdown(2)


def spans_of(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    traintel.get_telemetry().flush(60)
    return list(exporter.get_finished_spans())


def test_short_run_is_one_trace(exporter: InMemorySpanExporter) -> None:
    traintel.configure(span_exporters=[exporter], metric_readers=[])
    with traintel.application(), traintel.training_loop():
        for _ in range(200):
            with traintel.training_iteration():
                pass
    spans = spans_of(exporter)
    assert len({s.context.trace_id for s in spans}) == 1
    assert not any(semconv.SEGMENT_INDEX in (s.attributes or {}) for s in spans)


def test_by_default_a_segment_follows_time_not_its_count_of_iterations(
    exporter: InMemorySpanExporter,
) -> None:
    """A count of iterations is a different length of time at every step rate (a million at
    100,000 steps/s are 10 s: 360 traces an hour): unless TRAINTEL_SEGMENT_ITERATIONS is set, a
    segment of a billion iterations (its counter set so) goes on."""
    traintel.configure(span_exporters=[exporter], metric_readers=[], log_every_n_iterations=100)
    with traintel.training_loop() as loop:
        with traintel.training_iteration():
            pass
        loop.segment_iterations = 10**9  # type: ignore[attr-defined]
        for _ in range(40):  # past the next check of the segment's bounds
            with traintel.training_iteration():
                pass
    loops = [s for s in spans_of(exporter) if s.name == "training_loop"]
    assert len(loops) == 1 and semconv.SEGMENT_INDEX not in (loops[0].attributes or {})


def test_a_segment_rotates_before_its_window_events_reach_the_span_event_limit(
    exporter: InMemorySpanExporter,
) -> None:
    """Windows of 5 iterations, their full events on the loop (the suite's default), and no
    iteration or time limit near: 300 events would pass the SDK's 128 on one span."""
    traintel.configure(span_exporters=[exporter], metric_readers=[], log_every_n_iterations=5)
    with traintel.training_loop():
        for _ in range(1500):
            with traintel.training_iteration():
                pass
    loops = [s for s in spans_of(exporter) if s.name == "training_loop"]
    assert len(loops) > 2
    assert all(s.dropped_events == 0 and len(s.events) <= 128 for s in loops)
    updates = [e for s in loops for e in s.events if e.name == "training_metrics_update"]
    assert sum(e.attributes[semconv.WINDOW_PREFIX + "iterations"] for e in updates) == 1500  # type: ignore[index,misc]


def test_hundred_thousand_iterations(exporter: InMemorySpanExporter) -> None:
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], segment_iterations=1000, log_every_n_iterations=100,
        max_spans_per_trace=500, slow_iteration_factor=1e9,  # µs-long steps: timer noise is not slowness
    )  # fmt: skip
    with traintel.application():
        with traintel.model_init():
            pass
        with traintel.training_loop():
            for i in range(100_000):
                with traintel.training_iteration(), traintel.model_forward():
                    pass
                if i % 25_000 == 24_999:
                    with traintel.checkpoint_save(size_bytes=10):
                        pass
        with traintel.testing_loop():
            pass
    spans = spans_of(exporter)
    by_trace: dict[int, list[ReadableSpan]] = defaultdict(list)
    for span in spans:
        by_trace[span.context.trace_id].append(span)
    assert len(by_trace) == 100
    apps = sorted(
        (s for s in spans if s.name == "application"),
        key=lambda s: s.attributes.get(semconv.SEGMENT_INDEX, 0),  # type: ignore[union-attr]
    )
    loops = sorted(
        (s for s in spans if s.name == "training_loop"),
        key=lambda s: s.attributes.get(semconv.SEGMENT_INDEX, 0),  # type: ignore[union-attr]
    )
    assert len(apps) == len(loops) == 100
    first_app = apps[0]
    for k, (app, loop) in enumerate(zip(apps, loops, strict=True)):
        trace_spans = by_trace[app.context.trace_id]
        # one root per trace: the application segment; the loop segment is its child
        assert [s.name for s in trace_spans if s.parent is None] == ["application"]
        assert loop.parent is not None and loop.parent.span_id == app.context.span_id
        assert loop.context.trace_id == app.context.trace_id
        # no orphans inside a trace, every trace within its span budget
        ids = {s.context.span_id for s in trace_spans}
        assert all(s.parent is None or s.parent.span_id in ids for s in trace_spans)
        assert len(trace_spans) <= 500
        assert app.attributes.get(semconv.SEGMENT_INDEX, 0) == k  # type: ignore[union-attr]
        continues = k < 99
        assert loop.attributes[semconv.SEGMENT_CONTINUES] is continues  # type: ignore[index]
        assert loop.attributes[semconv.SEGMENT_FIRST_ITERATION] == 1000 * k  # type: ignore[index]
        assert loop.attributes[semconv.SEGMENT_LAST_ITERATION] == 1000 * k + 999  # type: ignore[index]
        if k:
            previous_app, previous_loop = apps[k - 1], loops[k - 1]
            assert [link.context.span_id for link in app.links] == [
                previous_app.context.span_id,
                first_app.context.span_id,
            ]
            assert [link.context.span_id for link in loop.links] == [previous_loop.context.span_id]
            assert app.start_time == previous_app.end_time  # contiguous: nothing falls between
        # every window event sits on the segment that holds its iterations
        for event in loop.events:
            if event.name == "training_metrics_update":
                first = event.attributes[semconv.WINDOW_PREFIX + "first_iteration"]  # type: ignore[index]
                last = event.attributes[semconv.WINDOW_PREFIX + "last_iteration"]  # type: ignore[index]
                assert 1000 * k <= first <= last <= 1000 * k + 999
    # the union of segments is the run
    iterations = sorted(s.attributes[semconv.ITERATION] for s in spans if s.name == "training_iteration")  # type: ignore[index]
    assert iterations == sorted(set(range(10)) | set(range(0, 100_000, 100)))
    windows = [e for s in loops for e in s.events if e.name == "training_metrics_update"]
    assert sum(e.attributes[semconv.WINDOW_PREFIX + "iterations"] for e in windows) == 100_000  # type: ignore[index,misc]
    last_loop = loops[-1]
    assert last_loop.attributes[semconv.SUMMARY_PREFIX + "iterations"] == 100_000  # type: ignore[index]
    assert last_loop.attributes[semconv.SUMMARY_PREFIX + "segments"] == 100  # type: ignore[index]
    assert last_loop.attributes[semconv.SUMMARY_PREFIX + "checkpoint.saves"] == 4  # type: ignore[index]
    # what follows the loop (testing) nests under the last application segment
    (testing,) = [s for s in spans if s.name == "testing_loop"]
    assert testing.parent is not None and testing.parent.span_id == apps[-1].context.span_id
    (model_init,) = [s for s in spans if s.name == "model_init"]
    assert model_init.context.trace_id == first_app.context.trace_id


def test_span_budget_closes_a_segment_early(exporter: InMemorySpanExporter) -> None:
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_iterations="all", max_spans_per_trace=200,
    )  # fmt: skip
    with traintel.application(), traintel.training_loop():
        for _ in range(300):
            with traintel.training_iteration(), traintel.model_forward(), traintel.model_backward():
                pass
    spans = spans_of(exporter)
    counts: dict[int, int] = defaultdict(int)
    for span in spans:
        counts[span.context.trace_id] += 1
    assert len(counts) > 4  # 900 iteration spans cannot fit one 200-span trace
    assert max(counts.values()) <= 200
    assert sorted(s.attributes[semconv.ITERATION] for s in spans if s.name == "training_iteration") == list(
        range(300)
    )  # type: ignore[index]
