"""``record_metrics`` and ``record_batch``: the user's model metrics (loss, lr, grad norm...) and
work counts (samples, tokens, FLOPs) on the current step.

Why on the span and not straight into OTel metrics: a loss belongs to an iteration, and the
span is what a user opens in Jaeger when a step looks wrong. The metric goes on the innermost
open iteration (training, validation or testing) enclosing the current context, else on the
innermost open loop, as ``ml.training.metric.<name>``. On a validation or testing loop they
also count toward its ``*_metrics_update`` event (last and mean), like per-iteration values.
"""

from __future__ import annotations

import reprlib
import threading
from collections.abc import Mapping

from opentelemetry import trace as trace_api
from opentelemetry.trace import Span

from traintel import semconv
from traintel._aggregation.window import add_metrics
from traintel._host.signal_raised import raised_by_signal_handler
from traintel._recorder import active
from traintel._recorder.engine import TrainingEngine
from traintel._recorder.record import IterationRecord
from traintel._recorder.record import number as count_of
from traintel._runtime import state as _state


def _as_number(value: object) -> float | int | bool | None:
    """A plain number for ``value``: Python numbers as they are, tensors and numpy scalars
    through ``.item()`` (which synchronises a CUDA tensor: pass ``loss.item()`` yourself where
    you already synchronise), anything else ``None``."""
    if isinstance(value, bool | int | float):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            result = item()  # a CUDA tensor's waits for the device: a signal may well land here
        except Exception as exc:
            if raised_by_signal_handler(exc):
                raise
            return None
        if isinstance(result, bool | int | float):
            return result
    return None


def _numbers(
    telemetry: _state.Telemetry, metrics: Mapping[str, object] | None, more: Mapping[str, object]
) -> dict[str, float | int | bool]:
    """The values that are numbers (``more`` wins); each other one is dropped with one warning
    per name."""
    numbers: dict[str, float | int | bool] = {}
    for name, raw in dict(metrics or {}, **more).items():
        number = _as_number(raw)
        if number is None:
            telemetry.warn_once(
                "metric_type:" + name,
                "record_metrics(%s=%r): not a number; dropped",
                name,
                type(raw).__name__,
            )
        else:
            numbers[name] = number
    return numbers


_ITERATIONS_AND_LOOPS = frozenset(p.value for p in (*semconv.ITERATION_PHASES, *semconv.LOOP_PHASES))
_APPLICATION = frozenset({semconv.Phase.APPLICATION.value})


def _metrics_target(telemetry: _state.Telemetry) -> Span | None:
    """The innermost open iteration or loop span enclosing the current context (a validation
    loop inside a training step: the loop), else the innermost iteration or loop a callback
    opened; outside every loop, the application (a final test accuracy)."""
    open_spans = telemetry.open_spans
    if open_spans is None:
        return None
    current = trace_api.get_current_span().get_span_context().span_id
    for phases in (_ITERATIONS_AND_LOOPS, _APPLICATION):
        enclosing = open_spans.enclosing(current, phases)
        if enclosing is not None:
            return enclosing
    for phase in (*semconv.ITERATION_PHASES, *semconv.LOOP_PHASES, semconv.Phase.APPLICATION):
        target = telemetry.callback_span(phase.value)
        if target is not None:
            return target
    return None


def record_metrics(metrics: Mapping[str, object] | None = None, /, **more: object) -> None:
    """Attach model metrics to the innermost iteration or loop around the call (a validation
    loop run inside a training step: that loop), else to the application. Never raises for a
    failure of its own (an exception a signal handler raises meanwhile is the job's, and goes on up).

    Non-numeric values are dropped with one warning; non-finite ones are kept (a NaN loss
    is exactly what a user needs to find).
    """
    telemetry = _state.current()
    if not telemetry.enabled or telemetry.open_spans is None:
        return
    try:
        numbers = _numbers(telemetry, metrics, more)
        engine = telemetry.engine
        record = _running_iteration(engine)
        if record is not None:
            for name, number in numbers.items():
                record.record_metric(name, float(number))
            return
        _record_on_span(telemetry, engine, numbers)
    except Exception:
        telemetry.warn_once("record_metrics", "record_metrics failed")


def _running_iteration(engine: TrainingEngine | None) -> IterationRecord | None:
    """The fast path's iteration running on this thread, if the call is directly in it (not in
    a loop opened inside it: a validation's, whose values are the loop's)."""
    record = engine.active if engine is not None else None
    if record is None or engine is None or engine.active_thread != threading.get_ident():
        return None
    return None if record.inner_loops else record


def _record_on_span(
    telemetry: _state.Telemetry, engine: TrainingEngine | None, numbers: Mapping[str, float | int]
) -> None:
    """Outside the fast path's iteration: the metrics go on the enclosing iteration or loop span."""
    target = _metrics_target(telemetry)
    if target is None:
        if engine is not None and any(engine.open_loops.values()):
            return  # inside a loop whose spans the sampler dropped: nothing to attach to
        telemetry.warn_once(
            "metrics_outside_loop",
            "record_metrics called outside any application, loop or iteration; ignored",
        )
        return
    for name, number in numbers.items():
        target.set_attribute(semconv.METRIC_PREFIX + name, number)
    # On a validation/testing loop itself (after its iterations: an epoch-level accuracy,
    # a framework's eval_loss), the values also count toward the loop's update event.
    stats = engine.eval_stats.get(getattr(target, "name", "")) if engine is not None else None
    if stats is not None:
        add_metrics(stats.metrics, {name: float(number) for name, number in numbers.items()})


def record_batch(
    samples: float | None = None,
    tokens: float | None = None,
    padding_tokens: float | None = None,
    flops: float | None = None,
) -> None:
    """Add one micro-batch's work to the running iteration (summed per optimizer step).

    Call it once per micro-batch under gradient accumulation, or once per step. Never raises;
    outside an iteration it is ignored with one warning.
    """
    engine = active.current_engine()
    if engine is None:
        return
    record = _running_iteration(engine)
    if record is None:  # outside any iteration, or in a loop run inside one (a validation's)
        inside = engine.active is not None and engine.active_thread == threading.get_ident()
        where = "in a loop run inside" if inside else "outside"
        engine.warn_once("batch_outside", "record_batch called %s a training iteration; ignored", where)
        return
    counts = [
        checked_count("record_batch", name, value)
        for name, value in zip(_WORK, (samples, tokens, padding_tokens, flops), strict=True)
    ]
    if record.counted and not record.micro_batches:  # counts given to the iteration: they add up
        _say_given_twice(engine, record, counts)
    record.add_work(*counts)


_WORK = ("samples", "tokens", "padding_tokens", "flops")


def _say_given_twice(engine: TrainingEngine, record: IterationRecord, counts: list[float | None]) -> None:
    """Once: a count of the step's first micro-batch that the iteration was given already
    (``training_iteration(samples=8)`` and two ``record_batch(samples=4)``: 16 a step)."""
    given = (record.samples, record.tokens, record.padding, record.flops)
    twice = [name for name, count, had in zip(_WORK, counts, given, strict=True) if None not in (count, had)]
    if twice:
        engine.warn_once(
            "batch_and_given",
            "record_batch(%s) on iteration %s, which was given it already (training_iteration(...) "
            "or its attributes): the two add up; give each count in one place",
            "/".join(twice),
            record.iteration,
        )


def checked_count(call: str, name: str, value: object) -> float | None:
    """A count as a Python float (a numpy scalar or one-element tensor through ``.item()``);
    ``None`` for one not given, or for a value that is no finite non-negative number (said
    once, naming the call and argument, and only that count is left out: one NaN or negative
    count would poison every later total and rate of the run)."""
    if value is None:
        return None
    found = count_of(value)
    engine = active.current_engine() if found is None else None
    if engine is not None:
        why = "%s(%s=%s): expected a finite non-negative number (a count such as len(batch)); ignored"
        engine.warn_once(f"count:{call}:{name}", why, call, name, _shown(value))
    return found


def _shown(value: object) -> str:
    """A bad value as a warning names it: a tensor or array by its type and shape where its
    repr is long (the batch itself passed as ``samples=``: many lines of it), anything else by
    its repr, cut short."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return reprlib.repr(value)
    text = repr(value)
    return (
        text if len(text) <= 80 and "\n" not in text else f"<{type(value).__name__} of shape {tuple(shape)}>"
    )
