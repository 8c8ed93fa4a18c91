"""Tail sampling of iterations: which are exported, whole, and never an orphan."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import traintel
from tests.conftest import Pipeline
from traintel import callbacks, semconv

T0 = 1_700_000_000_000


def ms(seconds: float) -> float:
    return T0 + seconds * 1000


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    traintel.shutdown(2)


def finished(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    traintel.get_telemetry().flush(60)
    return list(exporter.get_finished_spans())


def assert_no_orphans(spans: list[ReadableSpan]) -> None:
    ids = {s.context.span_id for s in spans}
    for span in spans:
        if span.parent is not None:
            assert span.parent.span_id in ids, f"{span.name} is an orphan"


def run_job(durations: list[float]) -> None:
    """Iterations at explicit times, each with a user span inside."""
    tracer = trace.get_tracer("user-code", tracer_provider=_provider())
    callbacks.on_app_start(start_time_msec=ms(0))
    callbacks.on_train_start(start_time_msec=ms(0))
    t = 0.0
    for duration in durations:
        callbacks.on_training_single_iteration_start(start_time_msec=ms(t))
        with tracer.start_as_current_span("user_work"):
            with tracer.start_as_current_span("user_inner"):
                pass
        callbacks.on_model_forward_start(start_time_msec=ms(t))
        callbacks.on_model_forward_end(finish_time_msec=ms(t + duration / 2))
        callbacks.on_training_single_iteration_end(finish_time_msec=ms(t + duration))
        t += duration
    callbacks.on_train_end(finish_time_msec=ms(t + 1))
    callbacks.on_app_end(finish_time_msec=ms(t + 2))


def _provider() -> Any:
    pipeline = traintel.get_telemetry().pipeline
    assert pipeline is not None
    return pipeline.tracer_provider


def exported_by_iteration(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.attributes[semconv.ITERATION]: s for s in spans if s.name == "training_iteration"}  # type: ignore[misc]


def test_first_every_n_and_slow_are_exported_whole(exporter: InMemorySpanExporter) -> None:
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_first_iterations=2,
        export_every_n_iterations=5, slow_iteration_factor=3,
    )  # fmt: skip
    durations = [1.0] * 20
    durations[12] = 5.0  # slower than 3 x the median of 1 s
    run_job(durations)
    spans = finished(exporter)
    assert_no_orphans(spans)
    by_iteration = exported_by_iteration(spans)
    reasons = {i: s.attributes[semconv.SAMPLING_REASON] for i, s in by_iteration.items()}
    assert reasons == {0: "first", 1: "first", 5: "every_n", 10: "every_n", 12: "slow", 15: "every_n"}
    assert by_iteration[12].end_time - by_iteration[12].start_time == 5 * 10**9  # type: ignore[operator]
    # whole: every exported iteration has its user spans (held by the filter) and its phases
    for iteration, span in by_iteration.items():
        children = [s for s in spans if s.parent is not None and s.parent.span_id == span.context.span_id]
        assert sorted(c.name for c in children) == ["model_forward", "user_work"], iteration
    user_work = [s for s in spans if s.name == "user_work"]
    assert len(user_work) == len(by_iteration)  # the other 14 iterations' user spans were dropped
    assert len([s for s in spans if s.name == "user_inner"]) == len(by_iteration)
    (slow_event,) = [e for s in spans for e in s.events if e.name == "slow_iteration"]
    attributes = slow_event.attributes or {}
    assert attributes[semconv.ITERATION] == 12
    assert attributes[semconv.ITERATION_DURATION] == 5.0
    assert attributes[semconv.ITERATION_MEDIAN] == 1.0
    assert attributes[semconv.EXPORTED_SPAN_ID] == format(by_iteration[12].context.span_id, "016x")
    assert attributes[semconv.EXPORTED_TRACE_ID] == format(by_iteration[12].context.trace_id, "032x")
    # exported iterations keep the span ids their children saw while they ran
    assert len({s.context.trace_id for s in spans}) == 1


def test_spans_beyond_what_is_held_for_an_iteration_are_exported_not_lost(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An iteration holds at most MAX_BUFFERED_PER_ITERATION user spans for its decision (memory);
    the ones beyond go out at once instead of vanishing uncounted, and the held ones share the
    iteration's fate (here: not exported)."""
    from traintel._sdk import export_filter

    monkeypatch.setattr(export_filter, "MAX_BUFFERED_PER_ITERATION", 3)
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_first_iterations=0, export_every_n_iterations=0
    )
    tracer = trace.get_tracer("user-code", tracer_provider=_provider())
    with traintel.training_loop(), traintel.training_iteration():
        for i in range(5):
            with tracer.start_as_current_span(f"user_{i}"):
                pass
    names = sorted(s.name for s in finished(exporter) if s.name.startswith("user_"))
    assert names == ["user_3", "user_4"]


def test_failed_iteration_is_exported_with_its_spans(exporter: InMemorySpanExporter) -> None:
    traintel.configure(span_exporters=[exporter], metric_readers=[], export_first_iterations=1)
    tracer = trace.get_tracer("user-code", tracer_provider=_provider())
    with traintel.training_loop():
        for i in range(5):
            try:
                with traintel.training_iteration():
                    with tracer.start_as_current_span("user_work"):
                        if i == 3:
                            raise ZeroDivisionError("bad batch")
            except ZeroDivisionError:
                pass
    spans = finished(exporter)
    assert_no_orphans(spans)
    by_iteration = exported_by_iteration(spans)
    assert {i: s.attributes[semconv.SAMPLING_REASON] for i, s in by_iteration.items()} == {
        0: "first",
        3: "error",
    }
    failed = by_iteration[3]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ZeroDivisionError: bad batch"
    assert [e.name for e in failed.events] == ["exception"]
    (user_work,) = [s for s in spans if s.name == "user_work" and s.parent.span_id == failed.context.span_id]  # type: ignore[union-attr]
    assert user_work.status.status_code is StatusCode.ERROR


@pytest.mark.parametrize(("policy", "expected"), [("all", 20), ("none", 0)])
def test_all_and_none_policies(exporter: InMemorySpanExporter, policy: str, expected: int) -> None:
    traintel.configure(span_exporters=[exporter], metric_readers=[], export_iterations=policy)
    run_job([1.0] * 20)
    spans = finished(exporter)
    assert_no_orphans(spans)
    assert len(exported_by_iteration(spans)) == expected
    assert len([s for s in spans if s.name == "user_work"]) == expected
    assert len([s for s in spans if s.name == "training_metrics_update"]) == 0
    loop = next(s for s in spans if s.name == "training_loop")
    assert sum(1 for e in loop.events if e.name == "training_metrics_update") == 1  # metrics regardless


def test_the_export_policy_changes_mid_run(exporter: InMemorySpanExporter) -> None:
    traintel.configure(
        span_exporters=[exporter],
        metric_readers=[],
        export_first_iterations=2,
        export_every_n_iterations=5,
        slow_iteration_factor=1e9,
    )
    with traintel.training_loop():
        for _ in range(10):
            with traintel.training_iteration():
                pass
        traintel.set_training_config(export_every_n_iterations=0, export_first_iterations=0)
        for _ in range(10):
            with traintel.training_iteration():
                pass
        traintel.set_training_config(export_every_n_iterations=4)
        for _ in range(10):
            with traintel.training_iteration():
                pass
    exported = sorted(exported_by_iteration(finished(exporter)))
    assert exported == [0, 1, 5, 20, 24, 28]  # first 2, every 5th; nothing; every 4th


def test_each_training_loop_exports_its_own_first_iterations(exporter: InMemorySpanExporter) -> None:
    """A second loop in the same process (a notebook cell run again, a fine-tuning stage after
    pre-training) is seen from its start as the first was."""
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_first_iterations=2,
        export_every_n_iterations=0, slow_iteration_factor=1e9,
    )  # fmt: skip
    for start in (0, 100):
        with traintel.training_loop(train_iterations_start=start):
            for _ in range(5):
                with traintel.training_iteration():
                    pass
    reasons = {
        i: s.attributes[semconv.SAMPLING_REASON] for i, s in exported_by_iteration(finished(exporter)).items()
    }
    assert reasons == {0: "first", 1: "first", 100: "first", 101: "first"}


def test_the_end_of_the_data_inside_an_iteration_is_no_error(exporter: InMemorySpanExporter) -> None:
    """``next(batches)`` inside the iteration raises StopIteration at each epoch's end, and the
    loop catches it: each ended its iteration and data_loading ERROR, exported for it, and the
    summary counted 6 errors in a run of 3 epochs that had none."""
    traintel.configure(
        span_exporters=[exporter],
        metric_readers=[],
        export_first_iterations=0,
        export_every_n_iterations=0,
        slow_iteration_factor=1e9,  # (microsecond steps: a slow one is noise, and exported)
    )
    with traintel.application(), traintel.training_loop():
        for _epoch in range(3):
            batches = iter(range(4))
            while True:
                try:
                    with traintel.training_iteration(), traintel.data_loading():
                        next(batches)
                except StopIteration:
                    break
    spans = finished(exporter)
    assert not exported_by_iteration(spans)  # none exported for an error
    assert [s.name for s in spans if s.status.status_code is StatusCode.ERROR] == []


def test_user_provider_without_filter_leaves_no_orphans(pipeline: Pipeline) -> None:
    """In the user's own pipeline traintel cannot hold spans back: user spans follow the head
    decision (ParentBased sampling), tail-exported iterations come without them."""
    traintel.configure(
        tracer_provider=pipeline.tracer_provider, meter_provider=pipeline.meter_provider,
        export_first_iterations=1, export_every_n_iterations=0,
    )  # fmt: skip
    tracer = pipeline.tracer_provider.get_tracer("user-code")
    callbacks.on_train_start(start_time_msec=ms(0))
    for i, duration in enumerate([1.0] * 15 + [9.0]):
        callbacks.on_training_single_iteration_start(start_time_msec=ms(i))
        with tracer.start_as_current_span("user_work"):
            pass
        callbacks.on_training_single_iteration_end(finish_time_msec=ms(i + duration))
    callbacks.on_train_end(finish_time_msec=ms(30))
    spans = pipeline.spans()
    assert_no_orphans(spans)
    by_iteration = exported_by_iteration(spans)
    assert {i: s.attributes[semconv.SAMPLING_REASON] for i, s in by_iteration.items()} == {
        0: "first",
        15: "slow",
    }
    user_work = [s for s in spans if s.name == "user_work"]
    assert [s.parent.span_id for s in user_work] == [by_iteration[0].context.span_id]  # type: ignore[union-attr]


def test_all_policy_step_spans_nest_count_and_fail_like_the_fast_path(exporter: InMemorySpanExporter) -> None:
    """In "all" mode the step phases are SDK spans started directly in the iteration: they
    nest under it, user spans nest under them, their time lands in the window, and a failing
    step is an ERROR span whose exception propagates unchanged (its iteration is not counted)."""
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_iterations="all", log_every_n_iterations=3
    )
    tracer = trace.get_tracer("user-code", tracer_provider=_provider())
    with traintel.training_loop():
        for i in range(3):
            try:
                with traintel.training_iteration():
                    with traintel.model_forward():
                        with tracer.start_as_current_span("user_kernel"):
                            pass
                    with traintel.model_backward():
                        if i == 2:
                            raise FloatingPointError("overflow")
                    with traintel.optimizer_update():
                        pass
            except FloatingPointError as error:
                assert str(error) == "overflow" and i == 2
    spans = finished(exporter)
    assert_no_orphans(spans)
    by_id = {s.context.span_id: s for s in spans}
    iterations = exported_by_iteration(spans)
    assert sorted(iterations) == [0, 1, 2]
    steps = [s for s in spans if s.name in ("model_forward", "model_backward", "optimizer_update")]
    assert len(steps) == 8  # the third iteration stopped in backward
    for step in steps:
        parent = by_id[step.parent.span_id]  # type: ignore[union-attr]
        assert parent.name == "training_iteration"
        assert step.attributes[semconv.PHASE] == step.name
    for kernel in (s for s in spans if s.name == "user_kernel"):
        assert by_id[kernel.parent.span_id].name == "model_forward"  # type: ignore[union-attr]
    (failed,) = [s for s in steps if s.status.status_code is StatusCode.ERROR]
    assert failed.name == "model_backward"
    assert failed.status.description == "FloatingPointError: overflow"
    assert [e.name for e in failed.events] == ["exception"]
    assert by_id[failed.parent.span_id].status.status_code is StatusCode.ERROR  # type: ignore[union-attr]
    loop = next(s for s in spans if s.name == "training_loop")
    (window,) = [e.attributes for e in loop.events if e.name == "training_metrics_update"]
    # the window's split is of the completed iterations: the one that raised did no work that stays
    completed = [s for s in steps if by_id[s.parent.span_id].status.is_ok]  # type: ignore[union-attr]
    assert len(completed) == 6
    for name, phase in (("forward", "model_forward"), ("backward", "model_backward")):
        expected = sum((s.end_time or 0) - (s.start_time or 0) for s in completed if s.name == phase) / 1e9
        assert window[semconv.WINDOW_PREFIX + "time." + name] == pytest.approx(expected, abs=1e-9)


def test_step_phases_as_decorators_clone_their_state(exporter: InMemorySpanExporter) -> None:
    """A bare step (class-level state, no __init__) and one with attributes, each used as a
    decorator: every call is its own phase, exported with the iteration ("all")."""
    traintel.configure(span_exporters=[exporter], metric_readers=[], export_iterations="all")

    @traintel.model_forward()
    def forward(depth: int) -> int:
        return depth if depth == 0 else forward(depth - 1) + 1

    @traintel.optimizer_update({"optimizer": "sgd"})
    def step() -> None:
        pass

    with traintel.training_loop():
        for _ in range(2):
            with traintel.training_iteration():
                assert forward(1) == 1
                step()
    spans = finished(exporter)
    assert_no_orphans(spans)
    forwards = [s for s in spans if s.name == "model_forward"]
    assert len(forwards) == 4  # two calls per iteration (the recursion nests)
    steps = [s for s in spans if s.name == "optimizer_update"]
    assert len(steps) == 2 and all(s.attributes["optimizer"] == "sgd" for s in steps)  # type: ignore[index]
    iterations = {s.context.span_id for s in spans if s.name == "training_iteration"}
    assert {s.parent.span_id for s in steps} == iterations  # type: ignore[union-attr]


def _slow_iterations_with_callbacks(durations: list[float], window: int, after: Any = None) -> list[int]:
    """Iterations at explicit times through the callbacks; returns those flagged slow."""
    traintel.configure(
        span_exporters=[InMemorySpanExporter()], metric_readers=[], export_first_iterations=0,
        export_every_n_iterations=0, log_every_n_iterations=window, slow_iteration_factor=3,
    )  # fmt: skip
    engine = traintel.get_telemetry().engine
    assert engine is not None
    flagged: list[int] = []
    slow_event = engine._slow_event

    def spy(record: Any, *args: Any) -> None:
        flagged.append(record.iteration)
        slow_event(record, *args)

    engine._slow_event = spy  # type: ignore[method-assign]
    callbacks.on_app_start(start_time_msec=ms(0))
    callbacks.on_train_start(start_time_msec=ms(0))
    t = 0.0
    for i, duration in enumerate(durations):
        if after is not None:
            after(i)
        callbacks.on_training_single_iteration_start(start_time_msec=ms(t))
        callbacks.on_training_single_iteration_end(finish_time_msec=ms(t + duration))
        t += duration
    callbacks.on_train_end(finish_time_msec=ms(t + 1))
    callbacks.on_app_end(finish_time_msec=ms(t + 2))
    traintel.shutdown(60)
    return flagged


@pytest.mark.parametrize("window", [50, 4, 5, 7, 10])
def test_the_tenth_iteration_is_tested_against_the_first_median(window: int) -> None:
    """The threshold starts from the first 10 durations, the 10th included, before the 10th is
    tested; whatever the window size (windows refresh it only after their last iteration)."""
    assert _slow_iterations_with_callbacks([1.0] * 9 + [10.0, 1.0, 1.0], window) == [9]


def test_a_new_slow_factor_mid_window_uses_the_median_of_the_last_durations() -> None:
    """Changing slow_iteration_factor mid-window recomputes the threshold from the last 101
    durations, the open window's included (median 2 s here, so 2 s is not slow at 1.2x)."""

    def change(i: int) -> None:
        if i == 30:
            traintel.set_training_config(slow_iteration_factor=1.2)

    assert _slow_iterations_with_callbacks([1.0] * 10 + [2.0] * 25, 50, change) == []


def test_the_slow_test_in_nanoseconds_says_what_the_test_in_seconds_says() -> None:
    """duration_ns >= threshold_ns is duration_ns / 1e9 > threshold, to the nanosecond,
    including at the boundary (where seconds * 1e9 rounds differently)."""
    import random

    from traintel._aggregation.sampling import IterationSampler

    rng = random.Random(2)
    sampler = IterationSampler(slow_factor=3.0)
    for _ in range(2000):
        median_ns = rng.randrange(10**6, 5 * 10**9)
        sampler.recent.clear()
        sampler.recent.extend([median_ns / 1e9] * 11)
        sampler.refresh()
        for duration_ns in range(3 * median_ns - 3, 3 * median_ns + 4):
            assert (duration_ns >= sampler.threshold_ns) == (duration_ns / 1e9 > sampler.threshold)


def test_every_exported_slow_iteration_has_its_event_whatever_the_cap(exporter: InMemorySpanExporter) -> None:
    """Iterations that are not exported take at most half of the slow_iteration events of a
    segment (10 of 20): an exported slow iteration still gets the event that names its ids."""
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_first_iterations=0,
        export_every_n_iterations=10**6, slow_iteration_factor=1.5, log_every_n_iterations=2,
        window_min_seconds=0, export_tail_per_minute=1,
    )  # fmt: skip
    run_job([1.0] * 101 + [1.6] * 50)  # 50 slow in 80 s: a minute's tail budget exports few of them
    spans = finished(exporter)
    slow = {
        i: s
        for i, s in exported_by_iteration(spans).items()
        if (s.attributes or {})[semconv.SAMPLING_REASON] == "slow"
    }
    events = {
        (e.attributes or {})[semconv.ITERATION]: e
        for s in spans
        for e in s.events
        if e.name == "slow_iteration"
    }
    assert len(slow) >= 3, sorted(slow)
    not_exported = [e for e in events.values() if semconv.EXPORTED_SPAN_ID not in (e.attributes or {})]
    assert 0 < len(not_exported) <= 10  # their share of the segment's 20 (shared with the exported)
    assert len(events) == len(not_exported) + len(slow) <= 20
    for iteration, span in slow.items():
        assert iteration in events, f"exported slow iteration {iteration} has no event"
        exported_id = (events[iteration].attributes or {})[semconv.EXPORTED_SPAN_ID]
        assert exported_id == format(span.context.span_id, "016x")


def test_a_span_started_on_another_thread_as_its_iteration_ends_is_not_held_forever(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user thread starts a span under the running iteration; before it flags the iteration as
    holding user spans, the training thread ends that iteration, sees no flag and drops it
    without a decision for the filter. The span then waited for a decision that never came: it
    was never exported, and stayed in memory. It goes out as any other span instead."""
    import threading

    from traintel._recorder.record import IterationRecord

    traintel.configure(
        span_exporters=[exporter], metric_readers=[], export_first_iterations=0, export_every_n_iterations=0
    )
    pipeline = traintel.get_telemetry().pipeline
    assert pipeline is not None and pipeline.export_filter is not None
    tracer = trace.get_tracer("user-code", tracer_provider=_provider())
    looked, ended = threading.Event(), threading.Event()
    flag = IterationRecord.hold_user_spans

    def hold_after_the_iteration_ended(record: IterationRecord) -> None:
        if threading.current_thread().name == "user-thread":
            looked.set()  # the filter found the iteration running ...
            assert ended.wait(30)  # ... and the training thread ends it before it is flagged
        flag(record)

    monkeypatch.setattr(IterationRecord, "hold_user_spans", hold_after_the_iteration_ended)
    with traintel.training_loop():
        with traintel.training_iteration():
            parent = trace.get_current_span()
            context = trace.set_span_in_context(parent)
            user = threading.Thread(
                target=lambda: tracer.start_span("late_user_span", context=context).end(), name="user-thread"
            )
            user.start()
            assert looked.wait(30)
        ended.set()
        user.join(30)
        with traintel.training_iteration():
            pass
    names = [s.name for s in finished(exporter)]
    assert "late_user_span" in names  # not exported as an iteration, not lost with it either
    assert "training_iteration" not in names
    assert not pipeline.export_filter._pending  # nothing waits for a decision
