"""Step phases (``data_loading``, ``model_forward``, ``model_backward``, ``optimizer_update``):
each factory call is one phase object; inside a fast-path iteration it is timed into the
iteration, anywhere else it is a span of its own, and ``with`` and the callbacks take the same
path."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from traintel import callbacks, semconv
from traintel._aggregation.aggregator import STEP_INDEX
from traintel._recorder import clock
from traintel._recorder.phases import STEP_KINDS, IterationPhase, PhaseSpan, StepPhase

STEP_FACTORIES = {
    "data_loading": traintel.data_loading,
    "model_forward": traintel.model_forward,
    "model_backward": traintel.model_backward,
    "optimizer_update": traintel.optimizer_update,
}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    traintel.configure(span_exporters=[exporter], metric_readers=[], slow_iteration_factor=1e9)
    yield exporter
    traintel.shutdown(2)


def finished(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    traintel.get_telemetry().flush(10)
    return list(exporter.get_finished_spans())


def children_of(span: ReadableSpan, spans: list[ReadableSpan]) -> list[ReadableSpan]:
    kids = [s for s in spans if s.parent is not None and s.parent.span_id == span.context.span_id]
    return sorted(kids, key=lambda s: s.start_time or 0)


def iterations(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    found = [s for s in spans if s.name == "training_iteration"]
    return sorted(found, key=lambda s: s.attributes[semconv.ITERATION])  # type: ignore[index]


def test_each_step_is_recorded_with_its_own_times_in_its_own_iteration(
    exporter: InMemorySpanExporter,
) -> None:
    with traintel.training_loop():
        for _ in range(3):
            with traintel.training_iteration():
                with traintel.model_forward():
                    pass
                with traintel.model_backward():
                    pass
                with traintel.optimizer_update():
                    pass
    spans = finished(exporter)
    for iteration in iterations(spans):  # the first 10 are exported
        kids = children_of(iteration, spans)
        assert [s.name for s in kids] == ["model_forward", "model_backward", "optimizer_update"]
        assert all(s.context.trace_id == iteration.context.trace_id for s in kids)
        bounds = [iteration.start_time] + [t for s in kids for t in (s.start_time, s.end_time)]
        assert bounds == sorted(bounds) and (kids[-1].end_time or 0) <= (iteration.end_time or 0)
    assert len(iterations(spans)) == 3


def test_a_step_nested_in_a_step_is_recorded_too(exporter: InMemorySpanExporter) -> None:
    with traintel.training_loop(), traintel.training_iteration():
        with traintel.model_forward():
            with traintel.model_forward():
                pass
            with traintel.model_backward():
                pass
        with traintel.optimizer_update():
            pass
    spans = finished(exporter)
    (iteration,) = iterations(spans)
    kids = children_of(iteration, spans)
    names = sorted(s.name for s in kids)
    assert names == ["model_backward", "model_forward", "model_forward", "optimizer_update"]
    inner, outer = sorted((s for s in kids if s.name == "model_forward"), key=lambda s: s.end_time or 0)
    assert (outer.start_time or 0) <= (inner.start_time or 0)
    assert (inner.start_time or 0) <= (inner.end_time or 0) <= (outer.end_time or 0)


def test_a_step_under_a_user_span_nests_under_it_and_its_time_counts(exporter: InMemorySpanExporter) -> None:
    pipeline = traintel.get_telemetry().pipeline
    assert pipeline is not None
    tracer = trace.get_tracer("user", tracer_provider=pipeline.tracer_provider)
    with traintel.training_loop(), traintel.training_iteration():
        with tracer.start_as_current_span("user_work"):
            with traintel.model_forward():
                pass
    spans = finished(exporter)
    (user,) = [s for s in spans if s.name == "user_work"]
    (forward,) = [s for s in spans if s.name == "model_forward"]
    assert forward.parent is not None and forward.parent.span_id == user.context.span_id
    (loop,) = [s for s in spans if s.name == "training_loop"]
    (window,) = [e for e in loop.events if e.name == "training_metrics_update"]
    assert window.attributes[semconv.WINDOW_PREFIX + "time.forward"] > 0  # type: ignore[index,operator]


def test_a_timed_span_with_a_step_phase_is_that_step_under_its_own_name(
    exporter: InMemorySpanExporter,
) -> None:
    """``timed_span("fwd", phase="model_forward")`` in an iteration was a span the windows did
    not count: no forward time, no model_forward row in the summary. It is now that step,
    exported under its own name with the step's phase."""
    with traintel.training_loop():
        for _ in range(3):
            with traintel.training_iteration():
                with traintel.timed_span("fwd", phase=semconv.Phase.MODEL_FORWARD, attributes={"k": 1}):
                    pass
                with traintel.timed_span("bwd", phase="model_backward"):
                    pass
    spans = finished(exporter)
    for iteration in iterations(spans):
        kids = children_of(iteration, spans)
        assert [(s.name, dict(s.attributes or {})) for s in kids] == [
            ("fwd", {semconv.PHASE: "model_forward", "k": 1}),
            ("bwd", {semconv.PHASE: "model_backward"}),
        ]
    (loop,) = [s for s in spans if s.name == "training_loop"]
    (window,) = [e for e in loop.events if e.name == "training_metrics_update"]
    for name, key in (("fwd", "time.forward"), ("bwd", "time.backward")):
        total_ns = sum((s.end_time or 0) - (s.start_time or 0) for s in spans if s.name == name)
        assert window.attributes[semconv.WINDOW_PREFIX + key] == total_ns / 1e9  # type: ignore[index]


def test_a_step_on_another_thread_meanwhile_is_a_span_of_its_own(exporter: InMemorySpanExporter) -> None:
    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            with traintel.model_forward():
                pass
        except BaseException as exc:  # pragma: no cover - the assertion below says what
            errors.append(exc)

    with traintel.training_loop(), traintel.training_iteration():
        with traintel.model_forward():  # open on the fast path while the other thread runs one
            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join()
    assert not errors
    spans = finished(exporter)
    (iteration,) = iterations(spans)
    assert [s.name for s in children_of(iteration, spans)] == ["model_forward"]
    others = [s for s in spans if s.name == "model_forward" and s.parent is None]
    assert len(others) == 1  # the thread's own, outside any iteration


def test_decorators_attributes_and_all_mode(exporter: InMemorySpanExporter) -> None:
    @traintel.model_forward()
    def forward(depth: int) -> int:
        return forward(depth - 1) + 1 if depth else 0

    with traintel.training_loop():
        with traintel.training_iteration():
            assert forward(2) == 2  # each call its own object: recursion nests
            with traintel.model_backward({"k": "v"}):
                pass
        traintel.set_training_config(export_iterations="all")
        with traintel.training_iteration():
            with traintel.optimizer_update():
                pass
    spans = finished(exporter)
    first, second = iterations(spans)
    assert len([s for s in spans if s.name == "model_forward"]) == 3
    assert [s.name for s in children_of(second, spans)] == ["optimizer_update"]
    first_children = [s.name for s in children_of(first, spans)]
    assert first_children == ["model_forward"] * 3 + ["model_backward"]  # the body's children
    (backward,) = [s for s in spans if s.name == "model_backward"]
    assert backward.attributes == {semconv.PHASE: "model_backward", "k": "v"}  # given at construction


def test_an_exit_after_the_iteration_ended_or_a_second_exit_does_nothing(
    exporter: InMemorySpanExporter,
) -> None:
    backward = traintel.model_backward()
    with traintel.training_loop():
        iteration = traintel.training_iteration()
        iteration.__enter__()
        backward.__enter__()
        iteration.__exit__(None, None, None)  # the step is still open: misuse
        assert backward.__exit__(None, None, None) is None  # never suppresses an exception
        assert backward.__exit__(None, None, None) is None
        with traintel.training_iteration(), traintel.model_backward():
            pass
    spans = finished(exporter)
    first, second = iterations(spans)
    assert children_of(first, spans) == []  # never closed inside it
    assert [s.name for s in children_of(second, spans)] == ["model_backward"]


@pytest.mark.parametrize("name", list(STEP_FACTORIES))
def test_every_factory_builds_the_step_callbacks_and_integrations_drive(name: str) -> None:
    """One class, one constructor: what ``with`` uses is what the callbacks use."""
    phases = (STEP_FACTORIES[name](), StepPhase(STEP_KINDS[name]))
    assert {type(phase) for phase in phases} == {StepPhase}
    for phase in phases:
        assert (phase._name, dict(phase._attributes or {}), phase._index) == (
            name,
            {semconv.PHASE: name},
            STEP_INDEX[name],
        )
    assert type(traintel.training_iteration()) is IterationPhase
    for cls in (StepPhase, IterationPhase):  # callbacks run what with runs
        assert cls._open is not PhaseSpan._open and cls.__enter__ is not PhaseSpan.__enter__


def test_with_and_callbacks_record_the_same_spans(exporter: InMemorySpanExporter) -> None:
    """The same job through both styles: the same exported tree and attributes."""
    with traintel.training_loop():
        with traintel.training_iteration(samples=4):
            with traintel.data_loading():
                pass
            with traintel.model_forward():
                pass
    callbacks.on_train_start()
    callbacks.on_training_single_iteration_start(samples=4)
    callbacks.on_data_loading_start()
    callbacks.on_data_loading_end()
    callbacks.on_model_forward_start()
    callbacks.on_model_forward_end()
    callbacks.on_training_single_iteration_end()
    callbacks.on_train_end()
    spans = finished(exporter)
    managed, called = iterations(spans)[0], iterations(spans)[1]

    def tree(iteration: ReadableSpan) -> list[tuple[str, dict[str, Any]]]:
        return [(s.name, dict(s.attributes or {})) for s in children_of(iteration, spans)]

    assert (
        tree(managed)
        == tree(called)
        == [
            ("data_loading", {semconv.PHASE: "data_loading"}),
            ("model_forward", {semconv.PHASE: "model_forward"}),
        ]
    )
    ignore = {semconv.ITERATION}
    assert {k: v for k, v in (managed.attributes or {}).items() if k not in ignore} == {
        k: v for k, v in (called.attributes or {}).items() if k not in ignore
    }


def test_asyncio_tasks_interleaving_in_one_iteration_each_close_their_own_step(
    exporter: InMemorySpanExporter,
) -> None:
    """Two tasks on one thread each enter a step and leave in the other order: each exit closes
    its own step at its own time."""
    order: list[str] = []

    async def step(name: str, entered: asyncio.Event, release: asyncio.Event) -> None:
        with traintel.model_forward():
            order.append(name + " in")
            entered.set()
            await release.wait()
            order.append(name + " out")

    async def main() -> None:
        a_in, b_in, a_go, b_go = (asyncio.Event() for _ in range(4))
        a = asyncio.ensure_future(step("a", a_in, a_go))
        await a_in.wait()
        b = asyncio.ensure_future(step("b", b_in, b_go))
        await b_in.wait()
        a_go.set()  # a leaves first, while b is still inside
        await a
        b_go.set()
        await b

    with traintel.training_loop(), traintel.training_iteration():
        asyncio.run(main())
    assert order == ["a in", "b in", "a out", "b out"]
    spans = finished(exporter)
    (iteration,) = iterations(spans)
    a_span, b_span = children_of(iteration, spans)  # by start time: a, then b
    assert a_span.name == b_span.name == "model_forward"
    times = [a_span.start_time, b_span.start_time, a_span.end_time, b_span.end_time]
    assert times == sorted(times, key=lambda t: t or 0)  # a closed when a left


def test_a_step_holding_an_evaluation_iteration_keeps_its_time(exporter: InMemorySpanExporter) -> None:
    """The step closes in the iteration it was entered in, not whichever is active at its exit."""
    with traintel.training_loop(), traintel.training_iteration():
        with traintel.optimizer_update():
            with traintel.validation_loop(), traintel.validation_iteration():
                with traintel.optimizer_update():
                    pass
    spans = finished(exporter)
    (iteration,) = iterations(spans)
    assert [s.name for s in children_of(iteration, spans)] == ["optimizer_update", "validation_loop"]
    (validation,) = [s for s in spans if s.name == "validation_iteration"]
    assert [s.name for s in children_of(validation, spans)] == ["optimizer_update"]


def test_generators_interleaving_on_one_thread_each_close_their_own_step(
    exporter: InMemorySpanExporter,
) -> None:
    ends: dict[str, int] = {}

    def work(name: str) -> Iterator[None]:
        with traintel.model_forward():
            yield
            ends[name] = clock.time_ns()  # traintel's timeline: the wall clock drifts from it (NTP)

    left: dict[str, int] = {}
    with traintel.training_loop(), traintel.training_iteration():
        first, second = work("first"), work("second")
        next(first)
        next(second)
        for name, generator in (("first", first), ("second", second)):  # the first leaves first
            next(generator, None)
            left[name] = clock.time_ns()
            time.sleep(0.002)
    spans = finished(exporter)
    (iteration,) = iterations(spans)
    a, b = children_of(iteration, spans)
    # each closed at its own exit, while its generator left the block, not at the other's
    assert ends["first"] <= (a.end_time or 0) <= left["first"] < ends["second"]
    assert ends["second"] <= (b.end_time or 0) <= left["second"]


def test_an_exit_stack_entering_and_leaving_from_other_frames_closes_the_step(
    exporter: InMemorySpanExporter,
) -> None:
    pipeline = traintel.get_telemetry().pipeline
    assert pipeline is not None
    tracer = trace.get_tracer("user", tracer_provider=pipeline.tracer_provider)
    with traintel.training_loop(), traintel.training_iteration():
        with tracer.start_as_current_span("user_work") as user, contextlib.ExitStack() as stack:
            stack.enter_context(traintel.model_backward())  # under a user span: a real span
        assert trace.get_current_span() is not user  # every context entered was left
        with contextlib.ExitStack() as stack:
            stack.enter_context(traintel.model_forward())  # directly in the iteration: its record
    spans = finished(exporter)
    (backward,) = [s for s in spans if s.name == "model_backward"]
    assert backward.parent is not None and backward.parent.span_id == user.get_span_context().span_id
    (iteration,) = iterations(spans)
    assert [s.name for s in children_of(iteration, spans)] == ["user_work", "model_forward"]


MS = 1_000_000  # ns per ms
T0_MS = 1_700_000_000_000  # the callbacks' times: ms since the epoch


def _at(ms: float) -> int:
    return (T0_MS + ms) * MS  # type: ignore[return-value]


def test_a_step_before_an_iteration_is_its_first_step_timed_without_a_span(
    exporter: InMemorySpanExporter,
) -> None:
    """The batch fetched in the loop's body before the iteration opens (as the docs advise for an
    epoch's end). Before: a span of its own every step, exported every time (55 µs a step
    against 9 µs inside the iteration; 6.7 MB of file against 44 kB for 20,000 steps), left out
    of the phase table. Now the next iteration starts with it: 3 ms loading, 1 ms of the
    script's own, 6 ms forward make a 10 ms iteration whose wait for data is 3 ms."""
    callbacks.on_train_start(start_time_msec=T0_MS)
    for k in range(4):
        base = T0_MS + 10 * k
        callbacks.on_data_loading_start(start_time_msec=base)
        callbacks.on_data_loading_end(finish_time_msec=base + 3)
        callbacks.on_training_single_iteration_start(start_time_msec=base + 4, samples=2)
        callbacks.on_model_forward_start(start_time_msec=base + 4)
        callbacks.on_model_forward_end(finish_time_msec=base + 10)
        callbacks.on_training_single_iteration_end(finish_time_msec=base + 10)
    callbacks.on_data_loading_start(start_time_msec=T0_MS + 40)  # the data ran out: no iteration
    callbacks.on_data_loading_end(finish_time_msec=T0_MS + 41)
    callbacks.on_train_end(finish_time_msec=T0_MS + 42)
    spans = finished(exporter)
    (loop,) = [s for s in spans if s.name == "training_loop"]
    steps = iterations(spans)
    assert [(s.start_time, s.end_time) for s in steps] == [(_at(10 * k), _at(10 * k + 10)) for k in range(4)]
    for k, step in enumerate(steps):
        kids = children_of(step, spans)
        assert [(c.name, c.start_time, c.end_time) for c in kids] == [
            ("data_loading", _at(10 * k), _at(10 * k + 3)),
            ("model_forward", _at(10 * k + 4), _at(10 * k + 10)),
        ]
    (lone,) = children_of(loop, [s for s in spans if s.name == "data_loading"])
    assert (lone.start_time, lone.end_time) == (_at(40), _at(41))
    assert loop.attributes[semconv.SUMMARY_PREFIX + "iterations"] == 4  # type: ignore[index]
    badput = loop.attributes[semconv.SUMMARY_PREFIX + "badput.data_loading_time"]  # type: ignore[index]
    assert badput == pytest.approx(0.013)  # 4 waits of 3 ms, and the last 1 ms on its own


def test_a_step_before_what_is_no_iteration_is_a_span_of_its_own(exporter: InMemorySpanExporter) -> None:
    """A batch loaded, then a checkpoint saved, or an evaluation run, before the next iteration;
    a load that fails; a load under the script's own span: each a span under the loop (or that
    span), as before."""
    with traintel.training_loop():
        with traintel.training_iteration():
            pass
        with traintel.data_loading():
            pass
        with traintel.checkpoint_save(path=None):
            pass
        with contextlib.suppress(OSError), traintel.data_loading():
            raise OSError("the reader died")
        with traintel.timed_span("prefetch"), traintel.data_loading():
            pass
        with traintel.training_iteration():
            pass
    spans = finished(exporter)
    loads = [s for s in spans if s.name == "data_loading"]
    assert len(loads) == 3
    parents = {s.context.span_id: s.name for s in spans}
    by_parent = sorted((parents[s.parent.span_id], s.status.is_ok) for s in loads if s.parent is not None)
    assert by_parent == [("prefetch", True), ("training_loop", False), ("training_loop", True)]
    save = next(s for s in spans if s.name == "checkpoint_save_sync")
    first = min(loads, key=lambda s: s.start_time or 0)
    assert first.end_time is not None and save.start_time is not None and first.end_time <= save.start_time
    assert all(not children_of(step, spans) for step in iterations(spans))


def test_a_step_before_an_iteration_keeps_its_attributes_and_an_iteration_inside_it_its_time(
    exporter: InMemorySpanExporter,
) -> None:
    """Attributes given to a step before an iteration go on its span in that iteration; an
    iteration that begins inside a step still open (callbacks out of order) does not take it,
    nor does the next one (it would start before the one before it ended): a span of its own."""
    with traintel.training_loop():
        with traintel.data_loading(attributes={"shard": 3}):
            pass
        with traintel.training_iteration():
            pass
        with traintel.data_loading():
            with traintel.training_iteration():
                pass
        with traintel.training_iteration():
            pass
    spans = finished(exporter)
    first, second, third = iterations(spans)
    (load,) = children_of(first, spans)
    assert (load.name, load.attributes["shard"]) == ("data_loading", 3)  # type: ignore[index]
    assert not children_of(second, spans) and not children_of(third, spans)
    assert second.end_time is not None and third.start_time is not None
    assert second.end_time <= third.start_time
    (loop,) = [s for s in spans if s.name == "training_loop"]
    (lone,) = [s for s in children_of(loop, spans) if s.name == "data_loading"]
    assert lone.start_time is not None and lone.start_time <= second.start_time  # type: ignore[operator]


def test_a_shutdown_inside_a_step_before_an_iteration_ends_it_with_the_reason(
    exporter: InMemorySpanExporter,
) -> None:
    with traintel.training_loop():
        with traintel.training_iteration():
            pass
        with traintel.data_loading():
            traintel.get_telemetry().flush(10)
            before = len(exporter.get_finished_spans())
            traintel.shutdown(5)
    spans = list(exporter.get_finished_spans())
    (load,) = [s for s in spans[before:] if s.name == "data_loading"]
    assert load.attributes[semconv.END_REASON] == "telemetry shutdown"  # type: ignore[index]
    (loop,) = [s for s in spans if s.name == "training_loop"]
    assert load.parent is not None and load.parent.span_id == loop.context.span_id


def test_in_all_mode_a_step_before_an_iteration_is_its_child_too() -> None:
    """``TRAINTEL_EXPORT_ITERATIONS=all`` exports every iteration: the batch fetched before one is
    its first child there too, and the tables count it (before: a span of its own under the
    loop, which the phase table, counting steps from the windows, left out)."""
    exporter = InMemorySpanExporter()
    traintel.configure(span_exporters=[exporter], metric_readers=[], export_iterations="all")
    try:
        with traintel.training_loop():
            for _ in range(3):
                with traintel.data_loading():
                    pass
                with traintel.training_iteration():
                    with traintel.model_forward():
                        pass
        spans = finished(exporter)
    finally:
        traintel.shutdown(2)
    steps = iterations(spans)
    assert len(steps) == 3
    assert all([c.name for c in children_of(s, spans)] == ["data_loading", "model_forward"] for s in steps)
    assert len([s for s in spans if s.name == "data_loading"]) == 3
