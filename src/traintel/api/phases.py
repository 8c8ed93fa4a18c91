"""Context managers (that also work as decorators) for every training phase.

Each phase is a real SDK span started in the current OpenTelemetry context and made current
for its body, so the user's own ``tracer.start_as_current_span`` nests inside ours and ours
inside theirs. The span is what ``with ... as span`` yields.

Why classes with ``__slots__`` instead of ``@contextlib.contextmanager``: a generator-based
context manager costs several microseconds per use, and iteration phases run millions of
times. Why not swallow exceptions: a user exception marks the span ERROR and propagates as the
same object with the same traceback; only telemetry's own failures are contained.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar, cast

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from traintel import _runtime, semconv
from traintel.semconv import Phase

F = TypeVar("F", bound=Callable[..., Any])


class PhaseSpan:
    """A span for one phase: ``with phase as span: ...`` or ``@phase`` on a function.

    As a decorator every call gets its own span (the object is only a template), so a
    decorated function may recurse or run in several threads at once.
    """

    __slots__ = ("_attributes", "_name", "_span", "_token")

    def __init__(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        self._name = name
        self._attributes = attributes
        self._span: Span = trace_api.INVALID_SPAN
        self._token: object | None = None

    # Hooks for phases that compute attributes when they start or finish.
    def _start_attributes(self, telemetry: _runtime.Telemetry) -> Mapping[str, AttributeValue] | None:
        return self._attributes

    def _before_end(self, telemetry: _runtime.Telemetry, span: Span) -> None:
        return None

    def __enter__(self) -> Span:
        telemetry = _runtime.current()
        if not telemetry.enabled:
            return trace_api.INVALID_SPAN
        try:
            span = telemetry.start_span(self._name, self._start_attributes(telemetry))
            self._span = span
            self._token = context_api.attach(trace_api.set_span_in_context(span))
        except Exception:
            telemetry.warn_once("enter:" + self._name, "could not start phase %r", self._name)
        return self._span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        span, token = self._span, self._token
        if token is None:
            return False
        self._span, self._token = trace_api.INVALID_SPAN, None
        telemetry = _runtime.current()
        try:
            self._before_end(telemetry, span)
        except Exception:
            telemetry.warn_once("before_end:" + self._name, "could not finish attributes of %r", self._name)
        try:
            context_api.detach(token)  # type: ignore[arg-type]
        except Exception:
            pass
        telemetry.end_span(span, exc)
        return False

    def _clone(self) -> PhaseSpan:
        clone = object.__new__(type(self))
        for cls in type(self).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if hasattr(self, slot):
                    object.__setattr__(clone, slot, getattr(self, slot))
        clone._span = trace_api.INVALID_SPAN
        clone._token = None
        return clone

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with self._clone():
                    return await func(*args, **kwargs)

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._clone():
                return func(*args, **kwargs)

        return cast(F, wrapper)


def _phase_attributes(
    phase: Phase, extra: Mapping[str, AttributeValue | None] | None = None
) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {semconv.PHASE: phase.value}
    if extra:
        attributes.update({k: v for k, v in extra.items() if v is not None})
    return attributes


class _Application(PhaseSpan):
    __slots__ = ()

    def __enter__(self) -> Span:
        span = super().__enter__()
        if span.is_recording():
            _runtime.current().initialization_event(span)
        return span


class _Loop(PhaseSpan):
    """A loop phase: counts itself open, so an iteration can tell it is inside its loop even
    when the sampler dropped the loop span (the processor never sees unsampled spans)."""

    __slots__ = ()

    def _start_attributes(self, telemetry: _runtime.Telemetry) -> Mapping[str, AttributeValue] | None:
        telemetry.open_loops[self._name] = telemetry.open_loops.get(self._name, 0) + 1
        return self._attributes

    def _before_end(self, telemetry: _runtime.Telemetry, span: Span) -> None:
        telemetry.open_loops[self._name] = max(0, telemetry.open_loops.get(self._name, 0) - 1)


class _TrainingLoop(_Loop):
    __slots__ = ("_iterations_start",)

    def __init__(self, attributes: Mapping[str, AttributeValue], iterations_start: int) -> None:
        super().__init__(Phase.TRAINING_LOOP.value, attributes)
        self._iterations_start = iterations_start

    def _start_attributes(self, telemetry: _runtime.Telemetry) -> Mapping[str, AttributeValue] | None:
        telemetry.next_train_iteration = self._iterations_start
        return super()._start_attributes(telemetry)


class _Iteration(PhaseSpan):
    """An iteration of the training, validation or testing loop, numbered automatically."""

    __slots__ = ("_iteration", "_loop", "_phase")

    def __init__(self, phase: Phase, iteration: int | None, attributes: Mapping[str, AttributeValue]) -> None:
        super().__init__(phase.value, attributes)
        self._phase = phase
        self._loop = semconv.LOOP_OF_ITERATION[phase]
        self._iteration = iteration

    def _start_attributes(self, telemetry: _runtime.Telemetry) -> Mapping[str, AttributeValue] | None:
        processor = telemetry.processor
        loop = self._loop.value
        if processor is not None and not telemetry.open_loops.get(loop) and not processor.is_open(loop):
            telemetry.warn_once(
                "outside_loop:" + self._phase.value,
                "%s started outside any %s; recorded where it is",
                self._phase.value,
                self._loop.value,
            )
        if self._phase is Phase.TRAINING_ITERATION:
            number = telemetry.next_train_iteration if self._iteration is None else self._iteration
            telemetry.next_train_iteration = number + 1
        else:
            key = self._loop.value
            number = telemetry.next_eval_iteration.get(key, 0) if self._iteration is None else self._iteration
            telemetry.next_eval_iteration[key] = number + 1
        attributes = dict(self._attributes or {})
        attributes[semconv.ITERATION] = number
        return attributes


class _EvalLoop(_Loop):
    __slots__ = ()

    def _start_attributes(self, telemetry: _runtime.Telemetry) -> Mapping[str, AttributeValue] | None:
        telemetry.next_eval_iteration[self._name] = 0
        return super()._start_attributes(telemetry)


def directory_size(path: str | os.PathLike[str]) -> int:
    """Bytes in a file, or in all files under a directory (checkpoints are often directories)."""
    root = Path(path)
    if root.is_file():
        return root.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name), follow_symlinks=False).st_size
            except OSError:
                continue
    return total


class _CheckpointSave(PhaseSpan):
    __slots__ = ("_iteration", "_path", "_size_bytes")

    def __init__(
        self,
        strategy: str,
        iteration: int | None,
        size_bytes: int | None,
        path: str | os.PathLike[str] | None,
        attributes: Mapping[str, AttributeValue] | None,
    ) -> None:
        phase = Phase.CHECKPOINT_SAVE_ASYNC if strategy == "async" else Phase.CHECKPOINT_SAVE_SYNC
        extra: dict[str, AttributeValue | None] = {
            semconv.CHECKPOINT_STRATEGY: strategy,
            semconv.CHECKPOINT_SIZE: size_bytes,
            semconv.CHECKPOINT_PATH: os.fspath(path) if path is not None else None,
        }
        extra.update(attributes or {})
        super().__init__(phase.value, _phase_attributes(phase, extra))
        self._iteration = iteration
        self._size_bytes = size_bytes
        self._path = path

    def _start_attributes(self, telemetry: _runtime.Telemetry) -> Mapping[str, AttributeValue] | None:
        attributes = dict(self._attributes or {})
        iteration = telemetry.next_train_iteration if self._iteration is None else self._iteration
        attributes[semconv.CHECKPOINT_ITERATION] = iteration
        return attributes

    def _before_end(self, telemetry: _runtime.Telemetry, span: Span) -> None:
        if self._size_bytes is None and self._path is not None and span.is_recording():
            try:
                span.set_attribute(semconv.CHECKPOINT_SIZE, directory_size(self._path))
            except OSError:
                telemetry.warn_once(
                    "ckpt_size", "could not measure checkpoint size at %s", os.fspath(self._path)
                )


def _checked_strategy(strategy: object) -> str:
    if strategy in ("sync", "async"):
        return str(strategy)
    _runtime.current().warn_once(
        "bad_strategy",
        "checkpoint_save(strategy=%r): expected 'sync' or 'async'; recording it as 'sync'",
        strategy,
    )
    return "sync"


def _simple(phase: Phase, attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return PhaseSpan(phase.value, _phase_attributes(phase, attributes))


# --- the public phase factories ---------------------------------------------------------------
def application(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """The whole job; its start carries the ``telemetry_initialization`` event."""
    return _Application(Phase.APPLICATION.value, _phase_attributes(Phase.APPLICATION, attributes))


def dist_init(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """Process-group initialisation (``torch.distributed.init_process_group``)."""
    return _simple(Phase.DIST_INIT, attributes)


def data_loader_init(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _simple(Phase.DATA_LOADER_INIT, attributes)


def checkpoint_load(
    path: str | os.PathLike[str] | None = None,
    iteration: int | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """Loading a checkpoint; ``iteration`` is the iteration it resumes from."""
    extra: dict[str, AttributeValue | None] = {
        semconv.CHECKPOINT_PATH: os.fspath(path) if path is not None else None,
        semconv.CHECKPOINT_ITERATION: iteration,
    }
    extra.update(attributes or {})
    return _simple(Phase.CHECKPOINT_LOAD, _drop_none(extra))


def model_init(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _simple(Phase.MODEL_INIT, attributes)


def optimizer_init(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _simple(Phase.OPTIMIZER_INIT, attributes)


def training_loop(
    train_iterations_start: int = 0,
    train_samples_start: int | None = None,
    train_iterations_target: int | None = None,
    train_samples_target: int | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """The training loop. ``train_iterations_start`` is the number of iterations already done
    (non-zero when resuming): the first iteration of this loop is numbered with it."""
    extra: dict[str, AttributeValue | None] = {
        semconv.TRAIN_ITERATIONS_START: train_iterations_start,
        semconv.TRAIN_SAMPLES_START: train_samples_start,
        semconv.TRAIN_ITERATIONS_TARGET: train_iterations_target,
        semconv.TRAIN_SAMPLES_TARGET: train_samples_target,
    }
    extra.update(attributes or {})
    return _TrainingLoop(_phase_attributes(Phase.TRAINING_LOOP, extra), int(train_iterations_start))


def _iteration_attributes(
    phase: Phase,
    samples: int | None,
    tokens: int | None,
    attributes: Mapping[str, AttributeValue] | None,
) -> dict[str, AttributeValue]:
    extra: dict[str, AttributeValue | None] = {semconv.SAMPLES: samples, semconv.TOKENS: tokens}
    extra.update(attributes or {})
    return _phase_attributes(phase, extra)


def training_iteration(
    iteration: int | None = None,
    samples: int | None = None,
    tokens: int | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """One optimizer step. ``samples`` / ``tokens`` are this step's work (all micro-batches);
    ``iteration`` defaults to the loop's running count."""
    return _Iteration(
        Phase.TRAINING_ITERATION,
        iteration,
        _iteration_attributes(Phase.TRAINING_ITERATION, samples, tokens, attributes),
    )


def data_loading(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """Waiting for the next batch (the time the loop was blocked on data)."""
    return _simple(Phase.DATA_LOADING, attributes)


def model_forward(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _simple(Phase.MODEL_FORWARD, attributes)


def model_backward(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _simple(Phase.MODEL_BACKWARD, attributes)


def optimizer_update(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _simple(Phase.OPTIMIZER_UPDATE, attributes)


def checkpoint_save(
    strategy: str = "sync",
    iteration: int | None = None,
    size_bytes: int | None = None,
    path: str | os.PathLike[str] | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """Saving a checkpoint: span ``checkpoint_save_sync`` or ``checkpoint_save_async``.

    ``iteration`` defaults to the number of training iterations completed so far (the value
    a job resuming from this checkpoint passes as ``train_iterations_start``). Given a
    ``path`` and no ``size_bytes``, the size is measured when the span ends.
    """
    return _CheckpointSave(_checked_strategy(strategy), iteration, size_bytes, path, attributes)


def validation_loop(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _EvalLoop(Phase.VALIDATION_LOOP.value, _phase_attributes(Phase.VALIDATION_LOOP, attributes))


def validation_iteration(
    iteration: int | None = None,
    samples: int | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    return _Iteration(
        Phase.VALIDATION_ITERATION,
        iteration,
        _iteration_attributes(Phase.VALIDATION_ITERATION, samples, None, attributes),
    )


def testing_loop(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _EvalLoop(Phase.TESTING_LOOP.value, _phase_attributes(Phase.TESTING_LOOP, attributes))


def testing_iteration(
    iteration: int | None = None,
    samples: int | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    return _Iteration(
        Phase.TESTING_ITERATION,
        iteration,
        _iteration_attributes(Phase.TESTING_ITERATION, samples, None, attributes),
    )


def timed_span(
    name: str,
    phase: str | Phase | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """Any span of your own; give it a ``phase`` and the processor treats it like ours."""
    merged: dict[str, AttributeValue] = dict(attributes or {})
    if phase is not None:
        merged[semconv.PHASE] = phase.value if isinstance(phase, Phase) else str(phase)
    return PhaseSpan(name, merged)


def _drop_none(values: Mapping[str, AttributeValue | None]) -> dict[str, AttributeValue]:
    return {k: v for k, v in values.items() if v is not None}
