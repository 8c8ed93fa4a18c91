"""Context managers (that also work as decorators) for every training phase.

Each phase is a span in the current OpenTelemetry context, made current for its body, so the
user's own ``tracer.start_as_current_span`` nests inside ours and ours inside theirs.

Iterations take the fast path (see ``traintel._engine``): while they run they are a
pre-allocated context, not an SDK span, and they become real SDK spans with their exact
timestamps and ids only if the tail-sampling policy exports them. The step phases inside an
iteration (data loading, forward, backward, optimizer) are timed into the iteration's record.

Why classes with ``__slots__`` instead of ``@contextlib.contextmanager``: a generator-based
context manager costs several microseconds, and iteration phases run millions of times. Why
not swallow exceptions: a user exception marks the span ERROR and propagates as the same
object with the same traceback; only telemetry's own failures are contained.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal, TypeVar, cast

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._aggregation.aggregator import STEP_INDEX
from traintel._host.device import DeviceHooks
from traintel._recorder.engine import IterationSpan, Terminated, TrainingEngine, mark_error
from traintel._runtime import preemption
from traintel._runtime import state as _state
from traintel._sdk import fastctx as _fast
from traintel._sdk.attributes import as_number, clean_attributes, clean_value
from traintel._sdk.segments import SegmentedSpan
from traintel.semconv import Phase

F = TypeVar("F", bound=Callable[..., Any])

_time_ns = time.time_ns
_get_ident = threading.get_ident
_attach = _fast.attach
_detach = _fast.detach
_get_current = _fast.get_current
_with_span = _fast.with_span
_new_context = Context
_dict_setitem = dict.__setitem__
_SPAN_KEY = _fast.SPAN_KEY
_TRAINING_ITERATION = Phase.TRAINING_ITERATION.value
_TRAINING_LOOP = Phase.TRAINING_LOOP.value
_LOOP_OF = {iteration.value: loop.value for iteration, loop in semconv.LOOP_OF_ITERATION.items()}
_set_span_in_context = trace_api.set_span_in_context


def _clean_exit(exc: BaseException | None) -> BaseException | None:
    """The exception to record: none for ``sys.exit(0)``."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return None
    return exc


class PhaseSpan:
    """A span for one phase: ``with phase as span: ...`` or ``@phase`` on a function.

    As a decorator every call gets its own span (the object is only a template), so a
    decorated function may recurse or run in several threads at once. Callbacks drive the same
    objects through :meth:`_open` and :meth:`_close` (per-use ones: the shared step objects of
    :class:`_SharedStep` have no per-use state and refuse ``_open``).
    """

    __slots__ = ("_attributes", "_name", "_span", "_start_ns", "_thread", "_token")

    def __init__(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        self._name = name
        self._attributes = attributes
        self._span: Span = trace_api.INVALID_SPAN
        self._token: object | None = None
        self._thread = 0
        self._start_ns = 0

    # --- hooks for phases with behaviour ---------------------------------------------------------
    def _start_attributes(self, telemetry: _state.Telemetry) -> Mapping[str, AttributeValue] | None:
        return self._attributes

    def _wrap(self, telemetry: _state.Telemetry, span: Span) -> Span:
        return span

    def _before_end(
        self, telemetry: _state.Telemetry, span: Span, exc: BaseException | None, end_ns: int
    ) -> None:
        return None

    # --- the protocol shared by context managers and callbacks -----------------------------------
    def _open(self, telemetry: _state.Telemetry, start_ns: int | None = None) -> Span:
        start = start_ns if start_ns is not None else _time_ns()
        self._start_ns = start
        span = telemetry.start_span(self._name, self._start_attributes(telemetry), start)
        span = self._wrap(telemetry, span)
        self._span = span
        self._token = _attach(_with_span(span, _get_current()))
        self._thread = _get_ident()
        engine = telemetry.engine
        if engine is not None and engine.device is not None:
            active = engine.active  # a step phase exported as a real span: name its iteration
            engine.device.started(self._name, active.iteration if active is not None else None)
        return span

    def _close(
        self,
        telemetry: _state.Telemetry,
        exc: BaseException | None,
        end_ns: int | None = None,
        reason: str | None = None,
    ) -> None:
        span, token = self._span, self._token
        if token is None:
            return
        self._span, self._token = trace_api.INVALID_SPAN, None
        end = end_ns if end_ns is not None else _time_ns()
        engine = telemetry.engine
        if engine is not None and engine.device is not None:
            engine.device.ended(self._name)
        error = _clean_exit(exc)
        try:
            self._before_end(telemetry, span, error, end)
        except Exception:
            telemetry.warn_once("before_end:" + self._name, "could not finish attributes of %r", self._name)
        self._detach(telemetry, token)
        telemetry.end_span(span, error, end, reason)

    def _detach(self, telemetry: _state.Telemetry, token: object) -> None:
        if self._thread == _get_ident():
            try:
                _detach(token)  # type: ignore[arg-type]
            except Exception:
                pass
        else:
            telemetry.warn_once(
                "cross_thread:" + self._name,
                "%r was started and ended on different threads; its span is ended, the starting "
                "thread's context is left as it is",
                self._name,
            )

    def __enter__(self) -> Span:
        telemetry = _state.current()
        if not telemetry.enabled:
            return trace_api.INVALID_SPAN
        try:
            return self._open(telemetry)
        except Exception:
            telemetry.warn_once("enter:" + self._name, "could not start phase %r", self._name)
            return trace_api.INVALID_SPAN

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if self._token is not None:
            telemetry = _state.current()
            try:
                self._close(telemetry, exc)
            except Exception:
                telemetry.warn_once("exit:" + self._name, "could not end phase %r", self._name)
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
        attributes.update(clean_attributes({k: v for k, v in extra.items() if v is not None}))
    return attributes


# --- application and loops ---------------------------------------------------------------------
class _Application(PhaseSpan):
    __slots__ = ()

    def _wrap(self, telemetry: _state.Telemetry, span: Span) -> Span:
        if not span.is_recording():
            return span
        telemetry.initialization_event(span)
        preemption.chain_later_handlers()
        proxy = SegmentedSpan(span, self._name, self._attributes)
        if telemetry.engine is not None and telemetry.engine.app is None:
            telemetry.engine.app = proxy
        return proxy

    def _before_end(
        self, telemetry: _state.Telemetry, span: Span, exc: BaseException | None, end_ns: int
    ) -> None:
        engine = telemetry.engine
        if engine is not None and engine.app is span:
            preemption.report_pending(telemetry, span, exc)
            engine.goodput.ended(end_ns)
            span.set_attributes(engine.goodput.snapshot(end_ns).attributes())
            if isinstance(span, SegmentedSpan) and span.segment_index:
                span.close_segment(end_ns, continues=False)
            engine.app = None


class _Loop(PhaseSpan):
    """A loop phase: counts itself open, so an iteration can tell it is inside its loop even
    when the sampler dropped the loop span (the processor never sees unsampled spans)."""

    __slots__ = ()

    def _start_attributes(self, telemetry: _state.Telemetry) -> Mapping[str, AttributeValue] | None:
        telemetry.open_loops[self._name] = telemetry.open_loops.get(self._name, 0) + 1
        return self._attributes

    def _before_end(
        self, telemetry: _state.Telemetry, span: Span, exc: BaseException | None, end_ns: int
    ) -> None:
        telemetry.open_loops[self._name] = max(0, telemetry.open_loops.get(self._name, 0) - 1)


class _TrainingLoop(_Loop):
    __slots__ = ("_iterations_start",)

    def __init__(self, attributes: Mapping[str, AttributeValue], iterations_start: int) -> None:
        super().__init__(Phase.TRAINING_LOOP.value, attributes)
        self._iterations_start = iterations_start

    def _start_attributes(self, telemetry: _state.Telemetry) -> Mapping[str, AttributeValue] | None:
        telemetry.next_train_iteration = self._iterations_start
        return super()._start_attributes(telemetry)

    def _wrap(self, telemetry: _state.Telemetry, span: Span) -> Span:
        engine = telemetry.engine
        if engine is None or not span.is_recording() or engine.loop is not None:
            return span
        proxy = SegmentedSpan(span, self._name, self._attributes)
        engine.loop_start_ns = self._start_ns
        engine.training_loop_opened(proxy, self._start_ns)
        return proxy

    def _before_end(
        self, telemetry: _state.Telemetry, span: Span, exc: BaseException | None, end_ns: int
    ) -> None:
        super()._before_end(telemetry, span, exc, end_ns)
        engine = telemetry.engine
        if engine is not None and isinstance(span, SegmentedSpan):
            engine.training_loop_closing(span, end_ns)


class _EvalLoop(_Loop):
    __slots__ = ()

    def _start_attributes(self, telemetry: _state.Telemetry) -> Mapping[str, AttributeValue] | None:
        telemetry.next_eval_iteration[self._name] = 0
        if telemetry.engine is not None:
            telemetry.engine.eval_loop_opened(self._name)
        return super()._start_attributes(telemetry)

    def _before_end(
        self, telemetry: _state.Telemetry, span: Span, exc: BaseException | None, end_ns: int
    ) -> None:
        super()._before_end(telemetry, span, exc, end_ns)
        if telemetry.engine is not None and span.is_recording():
            telemetry.engine.eval_loop_closing(self._name, span, (end_ns - self._start_ns) / 1e9)


# --- iterations: the fast path -----------------------------------------------------------------
class _Iteration(PhaseSpan):
    """A training, validation or testing iteration, numbered automatically, on the fast path."""

    # Built by _iteration_phase (no type call into a Python __init__: one per step).
    __slots__ = ("_iteration", "_loop", "_phase", "_record")
    _iteration: int | None
    _loop: str
    _phase: str
    _record: IterationSpan | None

    def __enter__(self) -> Span:
        telemetry = _state._telemetry or _state.current()
        engine = telemetry.engine
        if engine is None:
            return trace_api.INVALID_SPAN
        try:
            if (
                self._phase is _TRAINING_ITERATION
                and not engine.export_all
                and engine.device is None
                and not telemetry.closed
                and telemetry.open_loops.get(_TRAINING_LOOP)
            ):  # the per-step case, _open inlined: one Python call (begin_iteration) fewer
                start = _time_ns()
                context = _get_current()
                number = telemetry.next_train_iteration if self._iteration is None else self._iteration
                telemetry.next_train_iteration = number + 1
                record = self._record = engine.begin_iteration(
                    _TRAINING_ITERATION, number, start, self._attributes, context
                )
                body = record.context = _new_context(context)  # _with_span(record, context), inlined
                _dict_setitem(body, _SPAN_KEY, record)
                self._span = record
                self._token = _attach(body)
                self._thread = engine.active_thread  # begin_iteration's thread: this one
                return record
            return self._open(telemetry)
        except Exception:
            telemetry.warn_once("enter:" + self._name, "could not start phase %r", self._name)
            return trace_api.INVALID_SPAN

    def _open(self, telemetry: _state.Telemetry, start_ns: int | None = None) -> Span:
        """Every case (``__enter__`` inlines the common one, kept alike by
        ``tests/test_fast_path_twins.py``; callbacks give ``start_ns``)."""
        engine = telemetry.engine
        if engine is None or telemetry.closed:
            return trace_api.INVALID_SPAN
        start = start_ns if start_ns is not None else _time_ns()
        context = _get_current()
        loop = self._loop
        if not telemetry.open_loops.get(loop):
            processor = telemetry.processor
            if processor is not None and not processor.is_open(loop):
                telemetry.warn_once(
                    "outside_loop:" + self._phase,
                    "%s started outside any %s; recorded where it is",
                    self._phase,
                    loop,
                )
        if self._phase == _TRAINING_ITERATION:  # number it: the loop's running count unless given
            number = telemetry.next_train_iteration if self._iteration is None else self._iteration
            telemetry.next_train_iteration = number + 1
        else:
            number = (
                telemetry.next_eval_iteration.get(loop, 0) if self._iteration is None else self._iteration
            )
            telemetry.next_eval_iteration[loop] = number + 1
        record = engine.begin_iteration(self._name, number, start, self._attributes, context)
        self._record = record
        if engine.device is not None:
            engine.device.started(self._name, number)
        if engine.export_all and (self._phase == _TRAINING_ITERATION or engine.trace_has_room()):
            # Every iteration exported: a real span from the start; step phases become real
            # spans under it (record.context stays None, so they do not take the fast path).
            # An evaluation loop cannot rotate the segment: past the trace budget its
            # iterations take the fast path and are counted, not exported.
            handle = engine.start_real_iteration(record, context)
            body = record.real_context = _with_span(handle, context)
        else:
            handle = record
            body = record.context = _new_context(context)  # _with_span(record, context), inlined
            _dict_setitem(body, _SPAN_KEY, record)
        self._span = handle
        self._token = _attach(body)
        self._thread = engine.active_thread  # begin_iteration's thread: this one
        return handle

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        # The common case inlined: same thread, no explicit end time, no end reason.
        record, token = self._record, self._token
        if token is None or record is None:
            return False
        end = _time_ns()
        self._record = self._token = None
        telemetry = _state._telemetry or _state.current()
        try:
            if self._thread == _get_ident():
                try:
                    _detach(token)
                except Exception:
                    pass
            else:
                self._detach(telemetry, token)
            engine = telemetry.engine
            if engine is not None:
                if engine.device is not None:
                    engine.device.ended(self._name)
                # None keeps what the body recorded (record_exception on the handle)
                engine.end_iteration(record, None if exc is None else _clean_exit(exc), end)
        except Exception:
            telemetry.warn_once("exit:" + self._name, "could not end phase %r", self._name)
        return False

    def _close(
        self,
        telemetry: _state.Telemetry,
        exc: BaseException | None,
        end_ns: int | None = None,
        reason: str | None = None,
    ) -> None:
        record, token = self._record, self._token
        if token is None or record is None:
            return
        end = end_ns if end_ns is not None else _time_ns()
        self._record, self._token = None, None
        self._span = trace_api.INVALID_SPAN
        self._detach(telemetry, token)
        engine = telemetry.engine
        if engine is not None:
            if engine.device is not None:
                engine.device.ended(self._name)
            if reason is not None:
                if record.attributes is None:
                    record.attributes = {}
                record.attributes[semconv.END_REASON] = reason
            error = _clean_exit(exc)
            engine.end_iteration(record, error if error is not None else record.error, end)


class _StepPhase(PhaseSpan):
    """Data loading, forward, backward, optimizer: timed into the running iteration's record
    (no span of their own unless the iteration is exported). Under a user span inside the
    iteration they are real spans (so they nest under it) whose time still counts; outside
    any iteration, plain spans."""

    # Built by the factories with three stores (no type call into a Python __init__: three
    # per step); the fast path sets what it reads, every other path starts with _init_slow.
    __slots__ = ("_device", "_index", "_real", "_record")
    _index: int
    _record: IterationSpan | None
    _real: IterationSpan | None  # "all" mode: the running iteration, if direct
    _device: DeviceHooks | None  # the device hooks, if on, while open on the fast path

    def _init_slow(self) -> None:
        """The state a path other than the fast one reads (the factories leave it unset)."""
        self._record = self._real = self._device = self._token = None
        self._span = _INVALID_SPAN
        self._thread = self._start_ns = 0

    def _before_end(
        self, telemetry: _state.Telemetry, span: Span, exc: BaseException | None, end_ns: int
    ) -> None:
        engine = telemetry.engine
        if engine is not None and engine.active is not None and engine.active_thread == _get_ident():
            engine.active.add_step_time(self._name, end_ns - self._start_ns)

    def _open(self, telemetry: _state.Telemetry, start_ns: int | None = None) -> Span:
        self._init_slow()
        engine = telemetry.engine
        if engine is not None:
            record = engine.active
            if (
                record is not None
                and engine.active_thread == _get_ident()
                and _get_current() is record.context
            ):
                self._record = record
                self._start_ns = start_ns if start_ns is not None else _time_ns()
                self._token = True
                self._started_in(record, engine)
                return record
        span = super()._open(telemetry, start_ns)
        if engine is not None:
            active = engine.active
            if active is None:
                engine.open_step = self  # outside any iteration (data loading before it opens)
            elif engine.active_thread == _get_ident():
                active.open_step = self  # a real span inside the iteration (under a user span)
        return span

    def _close(
        self,
        telemetry: _state.Telemetry,
        exc: BaseException | None,
        end_ns: int | None = None,
        reason: str | None = None,
    ) -> None:
        record = self._record
        if record is None:
            super()._close(telemetry, exc, end_ns, reason)
            return
        end = end_ns if end_ns is not None else _time_ns()
        self._record = None
        self._token = None
        if self._device is not None:
            self._device.ended(self._name)
            self._device = None
        record.children.append((self._name, self._start_ns, end, _clean_exit(exc)))
        record.phase_ns[self._index] += end - self._start_ns

    def __enter__(self) -> Span:
        # Inlined fast path: the common case is an enclosing fast-path iteration on this thread.
        telemetry = _state._telemetry
        if telemetry is not None:
            engine = telemetry.engine
            if engine is not None:
                record = engine.active
                if record is not None and engine.active_thread == _get_ident():
                    current = _get_current()
                    if current is record.context:
                        self._record = record
                        self._start_ns = _time_ns()
                        record.open_step = self  # _started_in, inlined on the per-step path
                        device = self._device = engine.device
                        if device is not None:
                            device.started(self._name, record.iteration)
                        return record
                    if current is record.real_context and not telemetry.closed:
                        self._init_slow()
                        return self._enter_real(engine, record, current)
        self._init_slow()
        return super().__enter__()

    def _started_in(self, record: IterationSpan, engine: TrainingEngine) -> None:
        """Open in ``record``: what a terminating signal cuts, and the device hooks' start."""
        record.open_step = self
        device = self._device = engine.device
        if device is not None:
            device.started(self._name, record.iteration)

    def _enter_real(self, engine: TrainingEngine, record: IterationSpan, current: Context) -> Span:
        """ "all" mode, directly in the running iteration: an SDK span with nothing around it
        (the generic path costs as much again as the span itself)."""
        start = _time_ns()
        try:
            span = engine.tracer.start_span(
                self._name, context=current, attributes=self._attributes, start_time=start
            )
            self._token = _attach(_with_span(span, current))
        except Exception:
            return super().__enter__()
        self._span = span
        self._start_ns = start
        self._real = record
        self._started_in(record, engine)
        return span

    def _exit_real(self, record: IterationSpan, exc: BaseException | None) -> None:
        end = _time_ns()
        self._real = None
        token, self._token = self._token, None
        span, self._span = self._span, trace_api.INVALID_SPAN
        try:
            _detach(token)  # type: ignore[arg-type]
        except Exception:
            pass
        if self._device is not None:
            self._device.ended(self._name)
            self._device = None
        record.add_step_time(self._name, end - self._start_ns)
        error = None if exc is None else _clean_exit(exc)
        if error is not None:
            mark_error(span, error, end)
        span.end(end_time=end)

    def cut(self, record: IterationSpan | None, error: Terminated, end_ns: int) -> None:
        """A terminating signal came while this step was open in ``record`` (or outside any
        iteration: ``None``): end it at ``end_ns``, ERROR with the reason (a record on the
        fast path, the SDK span otherwise). Nothing is detached: the process is about to die,
        and this runs on the preemption thread, not the one that entered the step. A step
        closed meanwhile (its record or token cleared) is left alone."""
        mine: IterationSpan | None = getattr(self, "_record", None)  # unset until entered
        if record is not None and mine is record:  # fast path: the iteration's child
            self._record = self._real = self._token = None  # its __exit__, if it comes, does nothing
            record.children.append((self._name, self._start_ns, end_ns, error))
            record.phase_ns[self._index] += end_ns - self._start_ns
            return
        if getattr(self, "_token", None) is None:  # closed, or a fast-path step (no token or span)
            return
        span = self._span
        self._real, self._token, self._span = None, None, trace_api.INVALID_SPAN
        if record is not None:
            record.add_step_time(self._name, end_ns - self._start_ns)
        span.set_attribute(semconv.END_REASON, str(error))
        mark_error(span, error, end_ns)
        span.end(end_time=end_ns)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        record = self._record
        if record is not None:
            self._record = None
            end = _time_ns()
            if self._device is not None:
                self._device.ended(self._name)
                self._device = None
            start = self._start_ns
            record.children.append((self._name, start, end, None if exc is None else _clean_exit(exc)))
            record.phase_ns[self._index] += end - start
            return False
        # Unset after a fast-path exit: the same object exited twice, or nested in itself.
        real: IterationSpan | None = getattr(self, "_real", None)
        if real is not None:
            try:
                self._exit_real(real, exc)
            except Exception:
                _state.current().warn_once("exit:" + self._name, "could not end phase %r", self._name)
            return False
        if getattr(self, "_token", None) is None:
            return False
        return super().__exit__(exc_type, exc, traceback)


#: Per context (each thread, each asyncio task): the ``with`` blocks shared steps handed to
#: per-use objects, innermost last, as (shared step, per-use step, the frame of the ``with``).
#: The frame pairs an exit with its own enter even when generators suspended inside such a
#: ``with`` interleave on one thread (they share the thread's context, not their frames).
_DELEGATED: ContextVar[tuple[tuple[_SharedStep, _StepPhase, FrameType], ...]] = ContextVar(
    "traintel_delegated_steps", default=()
)
_DELEGATES_LOCK = threading.Lock()
_caller_frame = sys._getframe


class _SharedStep(_StepPhase):
    """What ``model_forward()``, ``model_backward()`` and ``optimizer_update()`` return on the
    per-step path: one object per phase, shared by every step, so a step builds no object (~5 %
    fewer instructions per not-exported iteration).

    The object serves one ``with`` at a time itself: inside a fast-path iteration, on its
    thread, directly in its body, with no device hooks, and while the object is not already
    open (``_open_in``, the record it is open in, and ``_start_ns``). Every other ``with`` (this
    phase nested in itself, a step under a user span, outside any iteration, on another thread,
    in another task or generator while it is open, "all" mode) is handed to a fresh per-use
    :class:`_StepPhase`, remembered in ``_DELEGATED`` with the frame of its ``with`` for the
    exit; ``_delegates`` counts those in flight, so an exit on the common path looks at nothing
    else. Decorators, callbacks and integrations get per-use objects (``_clone``, ``fresh_step``).
    """

    __slots__ = ("_delegates", "_open_in")

    def __init__(self, name: str) -> None:
        super().__init__(name, _STEP_ATTRIBUTES[name])
        self._index = STEP_INDEX[name]
        self._delegates = 0
        self._open_in: IterationSpan | None = None

    def __enter__(self) -> Span:
        telemetry = _state._telemetry
        if telemetry is not None and self._open_in is None:
            engine = telemetry.engine
            if engine is not None:
                record = engine.active
                if (
                    record is not None
                    and engine.active_thread == _get_ident()
                    and _get_current() is record.context
                    and engine.device is None
                ):
                    self._start_ns = _time_ns()
                    self._open_in = record
                    record.open_step = self
                    return record
        return self._delegate()

    def _delegate(self) -> Span:
        phase = self._clone()
        with _DELEGATES_LOCK:
            self._delegates += 1
        _DELEGATED.set((*_DELEGATED.get(), (self, phase, _caller_frame(2))))
        return phase.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if self._delegates:
            stack = _DELEGATED.get()
            if stack:
                index = self._delegated_index(stack, _caller_frame(1))
                if index is not None:
                    phase = stack[index][1]
                    _DELEGATED.set(stack[:index] + stack[index + 1 :])
                    with _DELEGATES_LOCK:
                        self._delegates -= 1
                    return phase.__exit__(exc_type, exc, traceback)
        record = self._open_in
        if record is not None:  # else exited twice, or cut by a signal: nothing
            end = _time_ns()
            start = self._start_ns
            self._open_in = None
            error = None if exc is None else _clean_exit(exc)
            record.children.append((self._name, start, end, error))
            record.phase_ns[self._index] += end - start
        return False

    def _delegated_index(
        self, stack: tuple[tuple[_SharedStep, _StepPhase, FrameType], ...], frame: FrameType
    ) -> int | None:
        """Which delegated ``with`` an exit from ``frame`` ends: the one entered in that frame;
        else, if this object is not open itself, its innermost one (``ExitStack`` and manual
        calls enter and exit from different frames, last in first out); else none (the exit is
        the object's own: generators interleaving, one of them on the common path)."""
        innermost = None
        for i in range(len(stack) - 1, -1, -1):
            owner, _phase, entered_in = stack[i]
            if owner is self:
                if entered_in is frame:
                    return i
                if innermost is None:
                    innermost = i
        return innermost if self._open_in is None else None

    def cut(self, record: IterationSpan | None, error: Terminated, end_ns: int) -> None:
        """A terminating signal came while this object was open in ``record``; a later
        ``__exit__`` finds nothing open and does nothing."""
        if record is not None and self._open_in is record:
            self._open_in = None
            start = self._start_ns
            record.children.append((self._name, start, end_ns, error))
            record.phase_ns[self._index] += end_ns - start

    def _clone(self) -> _StepPhase:
        """A per-use object for this phase: what a decorated call or a delegated ``with`` uses."""
        return _step_phase(self._name, _STEP_ATTRIBUTES[self._name], self._index)

    def _open(self, telemetry: _state.Telemetry, start_ns: int | None = None) -> Span:
        raise TypeError("a shared step phase has no per-use state: drive a _step_phase() object")


# --- checkpoints ---------------------------------------------------------------------------------
def directory_size(path: str | os.PathLike[str]) -> int:
    """Bytes in a file, or in all files under a directory (checkpoints are often directories)."""
    root = Path(path)
    if root.is_file():
        return root.stat().st_size
    if not root.exists():
        raise FileNotFoundError(os.fspath(path))
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name), follow_symlinks=False).st_size
            except OSError:
                continue
    return total


class AsyncCheckpointCompletion:
    """The background half of an async save: call :meth:`finish` from the writer thread.

    It records a ``checkpoint_finalize`` span from the moment control returned to training
    until ``finish()``, parented to the training loop's current segment and linked to the
    ``checkpoint_save_async`` span (which carries the iteration it captured) and to the
    iteration that started the save: the enclosing iteration when the save ran inside one (that
    iteration is then exported), else the iteration just completed if it was exported. Its time
    is background time, not training time. Idempotent and thread-safe; never raises.
    """

    def __init__(
        self,
        save_context: SpanContext,
        iteration: int,
        parent: Span | None,
        iteration_context: SpanContext | None = None,
    ) -> None:
        self._save_context = save_context
        self._iteration_context = iteration_context
        self._iteration = iteration
        self._parent = parent
        self._start_ns = 0
        self._done = False
        self._lock = threading.Lock()

    def _started(self, start_ns: int) -> None:
        self._start_ns = start_ns

    @property
    def done(self) -> bool:
        return self._done

    def finish(
        self,
        size_bytes: int | None = None,
        path: str | os.PathLike[str] | None = None,
        error: BaseException | None = None,
    ) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        telemetry = _state.current()
        try:
            end = _time_ns()
            start = self._start_ns or end
            engine = telemetry.engine
            if engine is None or telemetry.closed:
                return
            if size_bytes is None and path is not None:
                try:
                    size_bytes = directory_size(path)
                except OSError:
                    telemetry.warn_once(
                        "ckpt_size", "could not measure checkpoint size at %s", os.fspath(path)
                    )
            attributes: dict[str, AttributeValue] = {
                semconv.PHASE: Phase.CHECKPOINT_FINALIZE.value,
                semconv.CHECKPOINT_STRATEGY: "async",
                semconv.CHECKPOINT_ITERATION: self._iteration,
            }
            if size_bytes is not None:
                attributes[semconv.CHECKPOINT_SIZE] = size_bytes
            parent = engine.loop if engine.loop is not None else self._parent
            context = _set_span_in_context(parent) if parent is not None else None
            span = telemetry.tracer.start_span(
                Phase.CHECKPOINT_FINALIZE.value,
                context=context,
                attributes=attributes,
                links=[
                    Link(c)
                    for c in (self._save_context, self._iteration_context)
                    if c is not None and c.is_valid
                ],
                start_time=start,
            )
            totals = engine.checkpoint_background_done((end - start) / 1e9, size_bytes)
            if size_bytes is not None and end > start:
                totals[semconv.CHECKPOINT_BYTES_PER_SECOND] = size_bytes / ((end - start) / 1e9)
            if error is None:
                span.add_event(
                    semconv.Event.SAVE_CHECKPOINT_SUCCESS.value,
                    {semconv.CHECKPOINT_ITERATION: self._iteration},
                )
            span.add_event(semconv.Event.CHECKPOINT_METRICS_UPDATE.value, totals)
            telemetry.end_span(span, error, end)
        except Exception:
            telemetry.warn_once("ckpt_finish", "could not record the async checkpoint completion")


class _CheckpointSave(PhaseSpan):
    __slots__ = ("_completion", "_iteration", "_path", "_size_bytes", "_strategy")

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
        self._strategy = strategy
        self._iteration = iteration
        self._size_bytes = size_bytes
        self._path = path
        self._completion: AsyncCheckpointCompletion | None = None

    def _start_attributes(self, telemetry: _state.Telemetry) -> Mapping[str, AttributeValue] | None:
        attributes = dict(self._attributes or {})
        if self._iteration is None:
            self._iteration = telemetry.next_train_iteration
        attributes[semconv.CHECKPOINT_ITERATION] = self._iteration
        return attributes

    def completion(self) -> AsyncCheckpointCompletion:
        """The handle the background writer finishes (async saves); call inside the ``with``."""
        if self._completion is None:
            span = self._span
            engine = _state.current().engine
            parent = engine.loop if engine is not None else None
            started_by = engine.iteration_starting_checkpoint() if engine is not None else None
            self._completion = AsyncCheckpointCompletion(
                span.get_span_context(),
                self._iteration if self._iteration is not None else 0,
                parent,
                started_by,
            )
        return self._completion

    def _before_end(
        self, telemetry: _state.Telemetry, span: Span, exc: BaseException | None, end_ns: int
    ) -> None:
        if self._completion is not None:
            self._completion._started(end_ns)
        size = self._size_bytes
        if size is None and self._path is not None and exc is None:
            try:
                size = directory_size(self._path)
            except OSError:
                telemetry.warn_once(
                    "ckpt_size", "could not measure checkpoint size at %s", os.fspath(self._path)
                )
        if size is not None and span.is_recording():
            span.set_attribute(semconv.CHECKPOINT_SIZE, size)
        engine = telemetry.engine
        if engine is None or not span.is_recording():
            return
        success = semconv.Event.SAVE_CHECKPOINT_SUCCESS.value
        # once: on_save_checkpoint_success() may have added it already (with its own attributes)
        if exc is None and not any(e.name == success for e in getattr(span, "events", ())):
            span.add_event(success, {semconv.CHECKPOINT_ITERATION: self._iteration or 0})
        duration = (end_ns - self._start_ns) / 1e9
        attributes = engine.checkpoint_saved(duration, size, self._strategy, span, None, self._iteration)
        rate = attributes.get(semconv.CHECKPOINT_BYTES_PER_SECOND)
        if rate is not None:
            span.set_attribute(semconv.CHECKPOINT_BYTES_PER_SECOND, rate)


class _CheckpointLoad(PhaseSpan):
    __slots__ = ()

    def _before_end(
        self, telemetry: _state.Telemetry, span: Span, exc: BaseException | None, end_ns: int
    ) -> None:
        if telemetry.engine is not None and span.is_recording():
            telemetry.engine.checkpoint_loaded((end_ns - self._start_ns) / 1e9)


class _CheckpointStage(PhaseSpan):
    __slots__ = ("_stage",)

    def __init__(self, stage: str, attributes: Mapping[str, AttributeValue] | None) -> None:
        phase = semconv.CHECKPOINT_STAGES[stage]
        super().__init__(
            phase.value, _phase_attributes(phase, {semconv.CHECKPOINT_STAGE: stage, **(attributes or {})})
        )
        self._stage = stage

    def _before_end(
        self, telemetry: _state.Telemetry, span: Span, exc: BaseException | None, end_ns: int
    ) -> None:
        if telemetry.engine is not None and span.is_recording():
            telemetry.engine.checkpoint_stage_done(self._stage, (end_ns - self._start_ns) / 1e9)


def _checked_strategy(strategy: object) -> str:
    if strategy in ("sync", "async"):
        return str(strategy)
    _state.current().warn_once(
        "bad_strategy",
        "checkpoint_save(strategy=%r): expected 'sync' or 'async'; recording it as 'sync'",
        strategy,
    )
    return "sync"


def _simple(phase: Phase, attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return PhaseSpan(phase.value, _phase_attributes(phase, attributes))


# Per-step phases are constructed once per step: names and attribute maps are precomputed
# (an Enum member's .value costs more than the rest of the constructor). They are never
# mutated: the span copies its attributes.
_DATA_LOADING = Phase.DATA_LOADING.value
_MODEL_FORWARD = Phase.MODEL_FORWARD.value
_MODEL_BACKWARD = Phase.MODEL_BACKWARD.value
_OPTIMIZER_UPDATE = Phase.OPTIMIZER_UPDATE.value
_STEP_ATTRIBUTES = {
    name: {semconv.PHASE: name}
    for name in (_DATA_LOADING, _MODEL_FORWARD, _MODEL_BACKWARD, _OPTIMIZER_UPDATE)
}
_EMPTY: dict[str, AttributeValue] = {}


_new_step = _StepPhase.__new__
_new_iteration = _Iteration.__new__
_INVALID_SPAN = trace_api.INVALID_SPAN


def _step_phase(name: str, attributes: Mapping[str, AttributeValue], index: int) -> _StepPhase:
    """A step phase, built without a type call into a Python ``__init__`` (which costs more
    than the stores); ``data_loading()`` repeats these lines to save this call per step
    (``tests/test_fast_path_twins.py`` keeps them alike)."""
    phase = _new_step(_StepPhase)
    phase._name = name
    phase._attributes = attributes
    phase._index = index
    return phase


_DATA_LOADING_ATTRIBUTES = _STEP_ATTRIBUTES[_DATA_LOADING]
_MODEL_FORWARD_ATTRIBUTES = _STEP_ATTRIBUTES[_MODEL_FORWARD]
_MODEL_BACKWARD_ATTRIBUTES = _STEP_ATTRIBUTES[_MODEL_BACKWARD]
_OPTIMIZER_UPDATE_ATTRIBUTES = _STEP_ATTRIBUTES[_OPTIMIZER_UPDATE]
_DATA_LOADING_INDEX = STEP_INDEX[_DATA_LOADING]
_MODEL_FORWARD_INDEX = STEP_INDEX[_MODEL_FORWARD]
_MODEL_BACKWARD_INDEX = STEP_INDEX[_MODEL_BACKWARD]
_OPTIMIZER_UPDATE_INDEX = STEP_INDEX[_OPTIMIZER_UPDATE]
_SHARED_MODEL_FORWARD = _SharedStep(_MODEL_FORWARD)
_SHARED_MODEL_BACKWARD = _SharedStep(_MODEL_BACKWARD)
_SHARED_OPTIMIZER_UPDATE = _SharedStep(_OPTIMIZER_UPDATE)


def _iteration_phase(
    phase: str, iteration: int | None, attributes: Mapping[str, AttributeValue]
) -> _Iteration:
    """An iteration phase, built without a type call into a Python ``__init__`` (one per step;
    ``training_iteration`` repeats these lines to save this call; a test keeps them alike)."""
    it = _new_iteration(_Iteration)
    it._name = it._phase = phase
    it._attributes = attributes
    it._span = _INVALID_SPAN
    it._token = None
    it._thread = it._start_ns = 0
    it._loop = _LOOP_OF[phase]
    it._iteration = iteration
    it._record = None
    return it


def fresh_step(name: str) -> PhaseSpan:
    """A per-use step phase, never the shared object ``model_forward()`` and the others return
    on the per-step path: for callers that keep the object open across calls (callbacks,
    framework integrations) and drive it through ``_open`` / ``_close``."""
    return _step(name)


def _step(name: str, attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    if attributes:
        return _step_phase(name, {**_STEP_ATTRIBUTES[name], **attributes}, STEP_INDEX[name])
    return _step_phase(name, _STEP_ATTRIBUTES[name], STEP_INDEX[name])


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
    return _CheckpointLoad(Phase.CHECKPOINT_LOAD.value, _phase_attributes(Phase.CHECKPOINT_LOAD, extra))


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
    samples: float | None,
    tokens: float | None,
    attributes: Mapping[str, AttributeValue] | None,
) -> dict[str, AttributeValue]:
    if samples is None and tokens is None and not attributes:
        return _EMPTY
    extra: dict[str, AttributeValue] = clean_attributes(attributes) if attributes else {}
    for key, value in ((semconv.SAMPLES, samples), (semconv.TOKENS, tokens)):
        if value is not None:
            number = as_number(value)  # a numpy count or a tensor: its number, not its str()
            if number is not None:
                extra[key] = number
            else:
                clean_value(key, value)  # says once why it was dropped
    return extra


def training_iteration(
    iteration: int | None = None,
    samples: float | None = None,
    tokens: float | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """One optimizer step. ``samples`` / ``tokens`` are this rank's work in the step (all
    micro-batches; or report each with :func:`record_batch`); ``iteration`` defaults to the
    loop's running count."""
    if samples is None and tokens is None and not attributes:  # the per-step case: _iteration_phase, inlined
        it = _new_iteration(_Iteration)
        it._name = it._phase = _TRAINING_ITERATION
        it._attributes = _EMPTY
        it._span = _INVALID_SPAN
        it._token = it._record = None
        it._thread = it._start_ns = 0
        it._loop = _TRAINING_LOOP
        it._iteration = iteration
        return it
    extra = _iteration_attributes(samples, tokens, attributes)
    return _iteration_phase(_TRAINING_ITERATION, iteration, extra)


def data_loading(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """Waiting for the next batch (the time the loop was blocked on data)."""
    if not attributes:  # the per-step case: _step_phase, inlined
        phase = _new_step(_StepPhase)
        phase._name = _DATA_LOADING
        phase._attributes = _DATA_LOADING_ATTRIBUTES
        phase._index = _DATA_LOADING_INDEX
        return phase
    return _step(_DATA_LOADING, attributes)


def model_forward(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    if not attributes:  # the per-step case: the shared object (per-use unconfigured or in "all" mode)
        telemetry = _state._telemetry
        if telemetry is not None:
            engine = telemetry.engine
            if engine is not None and not engine.export_all:
                return _SHARED_MODEL_FORWARD
        return _step_phase(_MODEL_FORWARD, _MODEL_FORWARD_ATTRIBUTES, _MODEL_FORWARD_INDEX)
    return _step(_MODEL_FORWARD, attributes)


def model_backward(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    if not attributes:  # the per-step case: the shared object (per-use unconfigured or in "all" mode)
        telemetry = _state._telemetry
        if telemetry is not None:
            engine = telemetry.engine
            if engine is not None and not engine.export_all:
                return _SHARED_MODEL_BACKWARD
        return _step_phase(_MODEL_BACKWARD, _MODEL_BACKWARD_ATTRIBUTES, _MODEL_BACKWARD_INDEX)
    return _step(_MODEL_BACKWARD, attributes)


def optimizer_update(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    if not attributes:  # the per-step case: the shared object (per-use unconfigured or in "all" mode)
        telemetry = _state._telemetry
        if telemetry is not None:
            engine = telemetry.engine
            if engine is not None and not engine.export_all:
                return _SHARED_OPTIMIZER_UPDATE
        return _step_phase(_OPTIMIZER_UPDATE, _OPTIMIZER_UPDATE_ATTRIBUTES, _OPTIMIZER_UPDATE_INDEX)
    return _step(_OPTIMIZER_UPDATE, attributes)


def checkpoint_save(
    strategy: str = "sync",
    iteration: int | None = None,
    size_bytes: int | None = None,
    path: str | os.PathLike[str] | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> _CheckpointSave:
    """Saving a checkpoint: span ``checkpoint_save_sync`` or ``checkpoint_save_async``.

    The span covers the blocking part (until control returns to training); for an async save
    call ``.completion()`` on the object inside the ``with`` and ``finish()`` it from the writer.
    ``iteration`` defaults to the number of training iterations completed so far (the value
    a job resuming from this checkpoint passes as ``train_iterations_start``). Given a
    ``path`` and no ``size_bytes``, the size is measured when the span ends.
    """
    return _CheckpointSave(_checked_strategy(strategy), iteration, size_bytes, path, attributes)


def checkpoint_stage(stage: str, attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """A marked part of a checkpoint save: ``staging``, ``write``, ``upload``, ``finalize`` or
    ``barrier``; each stage's total time is reported in ``checkpoint_metrics_update``."""
    if stage not in semconv.CHECKPOINT_STAGES:
        _state.current().warn_once(
            "bad_stage", "checkpoint_stage(%r): expected one of %s", stage, sorted(semconv.CHECKPOINT_STAGES)
        )
        return PhaseSpan("checkpoint_" + str(stage), attributes)
    return _CheckpointStage(stage, attributes)


def validation_loop(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _EvalLoop(Phase.VALIDATION_LOOP.value, _phase_attributes(Phase.VALIDATION_LOOP, attributes))


def validation_iteration(
    iteration: int | None = None,
    samples: float | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    return _iteration_phase(
        Phase.VALIDATION_ITERATION.value, iteration, _iteration_attributes(samples, None, attributes)
    )


def testing_loop(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return _EvalLoop(Phase.TESTING_LOOP.value, _phase_attributes(Phase.TESTING_LOOP, attributes))


def testing_iteration(
    iteration: int | None = None,
    samples: float | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    return _iteration_phase(
        Phase.TESTING_ITERATION.value, iteration, _iteration_attributes(samples, None, attributes)
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
    telemetry = _state.current()
    engine = telemetry.engine
    if engine is None:
        return
    record = engine.active
    if record is None or engine.active_thread != _get_ident():
        telemetry.warn_once("batch_outside", "record_batch called outside a training iteration; ignored")
        return
    for name, value in (
        ("samples", samples),
        ("tokens", tokens),
        ("padding_tokens", padding_tokens),
        ("flops", flops),
    ):
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value < 0):
            telemetry.warn_once(
                "batch_value:" + name,
                "record_batch(%s=%r): expected a non-negative number; ignored",
                name,
                value,
            )
            return
    record.add_work(samples, tokens, padding_tokens, flops)
