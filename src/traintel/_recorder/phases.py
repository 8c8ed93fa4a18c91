"""The phases: context managers (that also work as decorators) and what callbacks drive.

Each phase is a span in the current OpenTelemetry context, made current for its body, so the
user's own ``tracer.start_as_current_span`` nests inside ours and ours inside theirs. Two kinds
run every step and take the fast path (``record.py``): an iteration is a record while it runs,
and a step phase inside it (data loading, forward, backward, optimizer) is timed into that
record. Everything else, and a step phase anywhere but directly in its iteration's body on the
iteration's thread, is a real SDK span.

Why classes instead of ``@contextlib.contextmanager``: a generator-based context manager
costs several microseconds, and iteration phases run millions of times. Why
not swallow exceptions: a user exception marks the span ERROR and propagates as the same
object with the same traceback; only telemetry's own failures are contained.

One protocol for both styles: ``_open(engine, start_ns)`` and ``_close(engine, exc, end_ns,
reason)``; ``with`` passes no times, callbacks pass theirs.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar, cast

from opentelemetry import trace as trace_api
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode
from opentelemetry.util import types
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._aggregation.aggregator import STEP_INDEX
from traintel._recorder import active, clock
from traintel._recorder.engine import LOOP_OF_ITERATION, TrainingEngine, mark_error
from traintel._recorder.record import MAX_EVENTS, IterationRecord, StepExtras, Terminated
from traintel._recorder.segments import SegmentedSpan
from traintel._sdk.attributes import clean_attributes, clean_value
from traintel._sdk.otel_private import attach, detach, get_current, new_span_id, with_span
from traintel.semconv import Phase

F = TypeVar("F", bound=Callable[..., Any])

_time_ns = clock.time_ns
_get_ident = threading.get_ident
_new = object.__new__
_INVALID_SPAN = trace_api.INVALID_SPAN
_TRAINING_LOOP = Phase.TRAINING_LOOP.value


def phase_attributes(
    phase: Phase, extra: Mapping[str, AttributeValue | None] | None = None
) -> dict[str, AttributeValue]:
    """A phase's start attributes: its name, and the given ones that are set (cleaned)."""
    attributes: dict[str, AttributeValue] = {semconv.PHASE: phase.value}
    if extra:
        attributes.update(clean_attributes({k: v for k, v in extra.items() if v is not None}))
    return attributes


def clean_exit(exc: BaseException | None) -> BaseException | None:
    """The exception to record: none for ``sys.exit(0)``, nor for the end of an iterator
    (``next(batches)`` inside a phase at an epoch's end: the loop's control flow, not a failure).
    """
    if exc is None or isinstance(exc, StopIteration | StopAsyncIteration):
        return None
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return None
    return exc


class PhaseSpan:
    """A span for one phase: ``with phase as span: ...`` or ``@phase`` on a function.

    As a decorator every call gets its own span (the object is only a template), so a decorated
    function may recurse or run in several threads at once."""

    # Defaults on the class: a phase object stores only what its use changes (the step and
    # iteration classes are built with no __init__ at all: four per step).
    _name: str
    _attributes: Mapping[str, AttributeValue] | None = None
    _span: Span = _INVALID_SPAN
    _token: object | None = None  # the context attached for the body
    _thread = 0
    _start_ns = 0
    _engine: TrainingEngine | None = None  # the job it was opened in, while open
    _users = False  # a span of the user's own (``timed_span``): see ``UsersSpan``
    #: What an open phase holds, as a closed one has it (a clone starts closed).
    _OPEN_STATE: Mapping[str, object] = MappingProxyType(
        {"_span": _INVALID_SPAN, "_token": None, "_engine": None}
    )

    def __init__(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        self._name = name
        self._attributes = attributes

    # --- hooks for phases with behaviour ---------------------------------------------------------
    def _start_attributes(self, engine: TrainingEngine) -> Mapping[str, AttributeValue] | None:
        return self._attributes

    def _wrap(self, engine: TrainingEngine, span: Span) -> Span:
        return span

    def _before_end(self, engine: TrainingEngine, span: Span, exc: BaseException | None, end_ns: int) -> None:
        return None

    # --- a real span: every phase's general case; callbacks pass the times ---------------------------
    def _open(self, engine: TrainingEngine, start_ns: int | None = None) -> Span:
        start = _time_ns() if start_ns is None else start_ns
        self._start_ns = start
        span = self._wrap(
            engine, engine.start_span(self._name, self._start_attributes(engine), start, self._users)
        )
        self._span = span
        self._token = attach(with_span(span, get_current()))
        self._thread = _get_ident()
        self._engine = engine
        engine.open_phases[id(self)] = self._end_at_shutdown
        device = engine.device
        if device is not None:
            record = engine.active  # a step phase as a real span inside an iteration: name it
            device.started(self._name, record.iteration if record is not None else None)
        return span

    def _close(
        self,
        engine: TrainingEngine,
        exc: BaseException | None,
        end_ns: int | None = None,
        reason: str | None = None,
    ) -> None:
        token = self._token
        if token is None:
            return
        self._token = self._engine = None
        try:
            self._end_span(engine, exc, end_ns, reason)
        finally:  # what a signal handler raised in there goes on up; the context is put right
            self._detach(engine, token)

    def _end_span(
        self, engine: TrainingEngine, exc: BaseException | None, end_ns: int | None, reason: str | None
    ) -> None:
        """End the span, once: at the ``with``'s end, or before it at the job's shutdown."""
        span = self._span
        if span is _INVALID_SPAN:
            return
        self._span = _INVALID_SPAN
        engine.open_phases.pop(id(self), None)
        end = _time_ns() if end_ns is None else end_ns
        error = clean_exit(exc)
        try:
            if engine.device is not None:
                engine.device.ended(self._name)
            try:
                self._before_end(engine, span, error, end)
            except Exception:
                engine.warn_once("before_end:" + self._name, "could not finish attributes of %r", self._name)
        finally:
            engine.end_span(span, error, end, reason)

    def _end_at_shutdown(self, reason: str) -> None:
        """The job shuts down (``traintel.shutdown()`` inside an ``application``, say) while this
        phase is open: its span ends now, with the reason, as the job's last records; its
        ``with`` ends later and only puts the context back. Without this the span ended after
        its job had released the exporters, and was lost (the application's with the job's
        goodput)."""
        engine = self._engine
        if engine is not None:
            self._end_span(engine, None, None, reason)

    def _detach(self, engine: TrainingEngine, token: object) -> None:
        if self._thread == _get_ident():
            try:
                detach(token)
            except Exception:
                pass
        else:
            engine.warn_once(
                "cross_thread:" + self._name,
                "%r was started and ended on different threads; its span is ended, the starting "
                "thread's context is left as it is",
                self._name,
            )

    # --- with: how a ``with`` runs the phase ---------------------------------------------------------
    def __enter__(self) -> Span:
        engine = active.engine or active.current_engine()
        if engine is None or engine.closed:
            return _INVALID_SPAN
        try:
            return self._open(engine)
        except Exception:
            engine.warn_once("enter:" + self._name, "could not start phase %r", self._name)
            return _INVALID_SPAN

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        engine = self._engine  # its own job's, though another may run now
        if engine is not None:
            try:
                self._close(engine, exc)
            except Exception:
                engine.warn_once("exit:" + self._name, "could not end phase %r", self._name)

    def _clone(self) -> PhaseSpan:
        """A fresh object with this one's settings (what each decorated call uses)."""
        clone = _new(type(self))
        clone.__dict__.update(self.__dict__)
        clone.__dict__.update(self._OPEN_STATE)
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


class UsersSpan(PhaseSpan):
    """``timed_span``: a span of the user's own, in a scope of its own, so the processor
    aggregates it as any span with a phase (a checkpoint save's counts, a loop, an iteration):
    in traintel's scope it was taken for one the engine had counted, and was not."""

    _users = True


# --- application and loops ---------------------------------------------------------------------
class ApplicationPhase(PhaseSpan):
    """The whole job: its start carries the ``telemetry_initialization`` event; its end the
    job's goodput."""

    def _wrap(self, engine: TrainingEngine, span: Span) -> Span:
        if not span.is_recording():
            return span
        engine.hooks.on_application_start(span)
        proxy = SegmentedSpan(span, self._name, self._attributes)
        if engine.app is None:
            engine.app = proxy
        return proxy

    def _end_span(
        self, engine: TrainingEngine, exc: BaseException | None, end_ns: int | None, reason: str | None
    ) -> None:
        ends_job = engine.app is not None and engine.app is self._span
        super()._end_span(engine, exc, end_ns, reason)
        if ends_job:
            engine.hooks.after_application_end()

    def _before_end(self, engine: TrainingEngine, span: Span, exc: BaseException | None, end_ns: int) -> None:
        if engine.app is span:
            engine.window_sink.flush()  # the job's goodput (and energy) is its windows' too
            engine.hooks.on_application_end(span, exc)
            engine.goodput.ended(end_ns)
            span.set_attributes(engine.goodput.snapshot(end_ns).attributes())
            if isinstance(span, SegmentedSpan) and span.segment_index:
                span.close_segment(end_ns, continues=False)()
            engine.app = None


class LoopPhase(PhaseSpan):
    """A loop: counted open, so an iteration can tell it is inside its loop even when the
    sampler dropped the loop span (the processor never sees unsampled spans). A loop run inside
    an iteration (validation every N steps, inside the step) is counted on that iteration too:
    ``record_metrics`` on the loop itself then goes on the loop, not on the iteration around it."""

    _inside: IterationRecord | None = None  # the iteration it runs in, on its thread, while open
    _OPEN_STATE = MappingProxyType({**PhaseSpan._OPEN_STATE, "_inside": None})

    def _start_attributes(self, engine: TrainingEngine) -> Mapping[str, AttributeValue] | None:
        engine.loop_opened(self._name)
        record = engine.active
        if record is not None and engine.active_thread == _get_ident():
            record.inner_loops += 1
            self._inside = record
        return self._attributes

    def _before_end(self, engine: TrainingEngine, span: Span, exc: BaseException | None, end_ns: int) -> None:
        engine.loop_closed(self._name)
        record, self._inside = self._inside, None
        if record is not None:
            record.inner_loops -= 1


class TrainingLoopPhase(LoopPhase):
    def __init__(self, attributes: Mapping[str, AttributeValue], iterations_start: int) -> None:
        super().__init__(_TRAINING_LOOP, attributes)
        self._iterations_start = iterations_start

    def _start_attributes(self, engine: TrainingEngine) -> Mapping[str, AttributeValue] | None:
        engine.next_train_iteration = self._iterations_start
        return super()._start_attributes(engine)

    def _wrap(self, engine: TrainingEngine, span: Span) -> Span:
        if not span.is_recording() or engine.loop is not None:
            return span
        proxy = SegmentedSpan(span, self._name, self._attributes)
        engine.training_loop_opened(proxy, self._start_ns)
        if engine.app is None:  # run without application(): the job's configuration goes here
            engine.hooks.on_application_start(proxy)
        return proxy

    def _before_end(self, engine: TrainingEngine, span: Span, exc: BaseException | None, end_ns: int) -> None:
        super()._before_end(engine, span, exc, end_ns)
        if isinstance(span, SegmentedSpan):
            engine.training_loop_closing(span, end_ns)


class EvalLoopPhase(LoopPhase):
    def _start_attributes(self, engine: TrainingEngine) -> Mapping[str, AttributeValue] | None:
        engine.eval_loop_opened(self._name)
        return super()._start_attributes(engine)

    def _before_end(self, engine: TrainingEngine, span: Span, exc: BaseException | None, end_ns: int) -> None:
        super()._before_end(engine, span, exc, end_ns)
        if span.is_recording():
            engine.eval_loop_closing(self._name, span, (end_ns - self._start_ns) / 1e9)


# --- iterations: the fast path -----------------------------------------------------------------
class _TimedPhase(PhaseSpan):
    """A phase whose ``__enter__``/``__exit__`` take the times themselves (0: the clock's), so a
    callback opens and closes it through them rather than as a real span."""

    def __enter__(self, start_ns: int = 0) -> Span:
        raise NotImplementedError

    def __exit__(self, *exc_info: Any) -> None:
        raise NotImplementedError

    def _open(self, engine: TrainingEngine, start_ns: int | None = None) -> Span:
        return self.__enter__(start_ns or 0)

    def _close(
        self,
        engine: TrainingEngine,
        exc: BaseException | None,
        end_ns: int | None = None,
        reason: str | None = None,
    ) -> None:
        self.__exit__(None if exc is None else type(exc), exc, None, end_ns or 0, reason)


class IterationPhase(_TimedPhase):
    """A training, validation or testing iteration, numbered automatically: a record while it
    runs (see ``record.py``), exported as spans at its end if the policy keeps it. Everything
    its fast path reads is set in ``__init__`` (as for :class:`StepPhase`)."""

    _record: IterationRecord | None = None  # while open
    _OPEN_STATE = MappingProxyType({**PhaseSpan._OPEN_STATE, "_record": None})

    def __init__(
        self,
        name: str,
        iteration: int | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        self._name = name
        self._loop = LOOP_OF_ITERATION[name]
        self._iteration = iteration  # the number given; None: the loop's running count
        self._attributes = attributes

    def __enter__(self, start_ns: int = 0) -> Span:
        """``with`` passes no time (the clock's); callbacks pass theirs."""
        engine = active.engine or active.current_engine()
        if engine is None or engine.closed:
            return _INVALID_SPAN
        try:
            start = start_ns or _time_ns()
            if not engine.open_loops.get(self._loop):
                engine.outside_loop(self._name, self._loop)
            context = get_current()
            record = self._record = engine.begin_iteration(
                self._name, self._iteration, start, self._attributes, context
            )
            device = engine.device
            if device is not None:
                device.started(self._name, record.iteration)
            body = record.context = with_span(record, context)
            self._token = attach(body)
            self._thread = engine.active_thread  # begin_iteration's thread: this one
            return record
        except Exception:
            engine.warn_once("enter:" + self._name, "could not start phase %r", self._name)
            return _INVALID_SPAN

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
        end_ns: int = 0,
        reason: str | None = None,
    ) -> None:
        """``with`` passes no time (the clock's); callbacks pass theirs, and a reason."""
        record, token, engine = self._record, self._token, active.engine
        if token is None or record is None:
            return
        if engine is None or record.end_ns:  # ended at the job's shutdown: the context goes back
            self._record = self._token = None
            if self._thread == _get_ident():
                detach(token)
            return
        try:
            end = end_ns or _time_ns()
            self._record = self._token = None
            if self._thread == _get_ident():
                detach(token)
            else:
                self._detach(engine, token)  # says so once
            if engine.device is not None:
                engine.device.ended(self._name)
            if exc is not None or reason is not None:
                _mark_end(record, exc, reason)
            engine.end_iteration(record, end)
        except Exception:
            engine.warn_once("exit:" + self._name, "could not end phase %r", self._name)


def _mark_end(record: IterationRecord, exc: BaseException | None, reason: str | None) -> None:
    """An iteration that ends early (``reason``) or failed; without an exception a failure set
    on its handle (record_exception) stays."""
    if reason is not None:
        record.set_end_reason(reason)
    error = None if exc is None else clean_exit(exc)
    if error is not None:
        record.fail(error)


class StepKind:
    """A kind of step phase: its span name, where its time goes in the iteration's step split,
    and its start attributes."""

    __slots__ = ("attributes", "index", "name")

    def __init__(self, name: str, index: int, phase: str | None = None) -> None:
        self.name = name
        self.index = index
        self.attributes: Mapping[str, AttributeValue] = MappingProxyType({semconv.PHASE: phase or name})


class StepPhase(_TimedPhase, NonRecordingSpan):
    """Data loading, forward, backward, optimizer.

    Directly in a fast-path iteration's body, on its thread, the step is timed into the
    iteration's record and this object is its handle: attributes, events and a status set on it
    land on the step's span if the iteration is exported. Spans started inside it are children
    of the iteration, except in "all" mode, where every iteration is exported and the step's
    context is its own (an id is drawn for it when a span starts inside). Anywhere else (under a
    user span inside the iteration, outside any iteration, on another thread) it is a real
    span, whose time still counts.

    Everything the fast path reads is set in ``__init__``: an attribute read that falls through
    to a class default costs several times an instance one on the per-step path."""

    _attributes: Mapping[str, AttributeValue]
    _record: IterationRecord | None = None  # while open on the fast path
    _prelude: TrainingEngine | None = None  # while open before an iteration, timed without a span
    _OPEN_STATE = MappingProxyType({**PhaseSpan._OPEN_STATE, "_record": None, "_extras": None})

    def __init__(self, kind: StepKind, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        self._name = kind.name
        self._index = kind.index
        # given attributes beyond its phase go on its exported span
        self._custom = bool(attributes)
        self._attributes = (
            {**kind.attributes, **clean_attributes(attributes)} if attributes else kind.attributes
        )
        self._extras: StepExtras | None = None
        self._hooked: TrainingEngine | None = None  # the engine, while open with step hooks on

    @property
    def open_name(self) -> str | None:
        """Its phase while it is open in an iteration's body or before one (the stall watcher
        reads it)."""
        return self._name if self._record is not None or self._prelude is not None else None

    @property
    def open_since_ns(self) -> int:
        return self._start_ns

    def __enter__(self, start_ns: int = 0) -> Span:
        """``with`` passes no time (the clock's); callbacks pass theirs."""
        engine = active.engine or active.current_engine()
        if engine is None:
            return _INVALID_SPAN
        record = engine.active
        if record is None or engine.active_thread != _get_ident() or get_current() is not record.context:
            return self._enter_elsewhere(engine, record, start_ns)
        self._record = record
        self._start_ns = start_ns or _time_ns()
        record.open_step = self
        if self._custom:  # its own attributes go on its exported span
            self._extras = StepExtras(self._attributes)
        if engine.step_hooks:  # "all" mode or a device feature: more to do at both ends
            self._hooked = engine
            self._hooks_started(engine, record)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
        end_ns: int = 0,
        reason: str | None = None,
    ) -> None:
        """``with`` passes no time (the clock's); callbacks and a terminating signal pass
        theirs, and a reason."""
        record = self._record
        if record is None:  # a real span, before an iteration (or exited twice, or cut)
            self._exit_elsewhere(exc, end_ns, reason)
            return
        self._record = None
        end = end_ns or _time_ns()
        if self._hooked is not None:
            self._hooks_ended(self._hooked)
        error = None if exc is None else clean_exit(exc)
        extras = self._extras
        record.children.append((self._name, self._start_ns, end, error, extras))
        record.phase_ns[self._index] += end - self._start_ns
        if extras is not None:
            self._extras = None

    def _hooks_started(self, engine: TrainingEngine, record: IterationRecord) -> None:
        if engine.export_all:  # spans started inside are this step's children
            self._token = attach(with_span(self, record.context))  # type: ignore[arg-type]
        if engine.device is not None:
            engine.device.started(self._name, record.iteration)

    def _hooks_ended(self, engine: TrainingEngine) -> None:
        self._hooked = None
        token = self._token
        if token is not None:  # "all" mode's step context, attached on this thread
            self._token = None
            detach(token)
        if engine.device is not None:
            engine.device.ended(self._name)

    def _enter_elsewhere(self, engine: TrainingEngine, record: IterationRecord | None, start_ns: int) -> Span:
        """Anywhere but directly in the iteration's body, on its thread: a real span; directly in
        the training loop's body, a step before the next iteration (see ``engine.prelude``)."""
        if engine.closed:
            return _INVALID_SPAN
        try:
            if record is None and engine.prelude_opens(self):
                return self._enter_prelude(engine, start_ns)
            span = PhaseSpan._open(self, engine, start_ns or None)
            if record is None:
                engine.open_step = self  # outside any iteration (data loading before it opens)
            elif engine.active_thread == _get_ident():
                record.open_step = self  # a real span inside the iteration (under a user span)
            return span
        except Exception:
            engine.warn_once("enter:" + self._name, "could not start phase %r", self._name)
            return _INVALID_SPAN

    def _enter_prelude(self, engine: TrainingEngine, start_ns: int) -> Span:
        """Before the next iteration, in the loop's body: timed, its handle this object."""
        self._prelude = engine
        self._start_ns = start_ns or _time_ns()
        if self._custom:  # its own attributes go on its span
            self._extras = StepExtras(self._attributes)
        return self

    def _exit_elsewhere(self, exc: BaseException | None, end_ns: int, reason: str | None) -> None:
        prelude = self._prelude
        if prelude is not None:
            self._prelude = None
            end = end_ns or _time_ns()
            error = None if exc is None else clean_exit(exc)
            prelude.prelude_ended((self._name, self._start_ns, end, error, self._extras), self._index)
            self._extras = None
            return
        engine = self._engine
        if engine is None:
            return
        try:
            PhaseSpan._close(self, engine, exc, end_ns or None, reason)
        except Exception:
            engine.warn_once("exit:" + self._name, "could not end phase %r", self._name)

    def _before_end(self, engine: TrainingEngine, span: Span, exc: BaseException | None, end_ns: int) -> None:
        record = engine.active
        if record is not None and engine.active_thread == _get_ident():
            record.add_step_time(self._index, end_ns - self._start_ns)

    def cut(self, record: IterationRecord | None, error: Terminated, end_ns: int) -> None:
        """A terminating signal came while this step was open in ``record`` (or outside any
        iteration: ``None``): end it at ``end_ns``, ERROR with the reason. Nothing is detached:
        the process is about to die, and this runs on the preemption thread. A step closed
        meanwhile is left alone."""
        if record is not None and self._record is record:  # on the fast path: closed here
            self._token = None  # its context is the training thread's: left as it is
            self._hooked = None
            self.__exit__(Terminated, error, None, end_ns)  # a later __exit__ finds nothing open
            return
        if record is None and self._prelude is not None:  # before an iteration: its span now
            self._exit_elsewhere(error, end_ns, None)
            return
        if self._token is None:  # closed
            return
        span = self._span
        self._token, self._span = None, _INVALID_SPAN
        if record is not None:
            record.add_step_time(self._index, end_ns - self._start_ns)
        span.set_attribute(semconv.END_REASON, str(error))
        mark_error(span, error, end_ns)
        span.end(end_time=end_ns)

    # --- the handle: what ``with model_forward() as span`` gives on the fast path ------------------
    def _keep(self) -> StepExtras:
        extras = self._extras
        if extras is None:
            extras = self._extras = StepExtras(self._attributes or {})
        return extras

    def get_span_context(self) -> SpanContext:
        """The iteration's context; in "all" mode, the step's own (in the iteration's trace)."""
        record = self._record
        if record is None:
            return trace_api.INVALID_SPAN_CONTEXT
        iteration = record.get_span_context()
        if self._token is None:
            return iteration
        extras = self._keep()
        if not extras.span_id:
            extras.span_id = new_span_id()
            record.add_step_id(extras.span_id)
        return SpanContext(
            iteration.trace_id, extras.span_id, False, iteration.trace_flags, iteration.trace_state
        )

    def is_recording(self) -> bool:
        return self._record is not None

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        cleaned = clean_value(key, value)
        if cleaned is not None:
            self._keep().attributes[key] = cleaned

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        events = self._keep().events
        if len(events) < MAX_EVENTS:
            events.append((name, dict(attributes or {}), timestamp or _time_ns()))

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self._keep().status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        self.add_event(
            "exception",
            {"exception.type": type(exception).__name__, "exception.message": str(exception)},
            timestamp,
        )

    def end(self, end_time: int | None = None) -> None:
        """A no-op: the step ends with its phase (``with`` or the end callback)."""

    def __repr__(self) -> str:
        return f"StepPhase({self._name!r})"


#: The step kinds by span name (what callbacks and integrations look up).
STEP_KINDS: dict[str, StepKind] = {name: StepKind(name, index) for name, index in STEP_INDEX.items()}
DATA_LOADING = STEP_KINDS[Phase.DATA_LOADING.value]
MODEL_FORWARD = STEP_KINDS[Phase.MODEL_FORWARD.value]
MODEL_BACKWARD = STEP_KINDS[Phase.MODEL_BACKWARD.value]
OPTIMIZER_UPDATE = STEP_KINDS[Phase.OPTIMIZER_UPDATE.value]


def end_open_phases(engine: TrainingEngine, reason: str) -> None:
    """End the job's phases still open, innermost first: the iterations the shutdown is called
    inside (on their thread: an early stop inside the step), counted as the loop around them
    ends, then the spans (see :meth:`PhaseSpan._end_at_shutdown`); never raises."""
    try:
        _end_open_iterations(engine, reason)
        _end_open_prelude(engine, reason)
    except Exception:
        engine.warn_once("end_open_iterations", "could not end an iteration open at shutdown")
    for end in reversed(list(engine.open_phases.values())):
        try:
            end(reason)
        except Exception:
            engine.warn_once("end_open_phases", "could not end a phase open at shutdown")


#: Iterations open one within another that a shutdown or a signal ends (a bound: the chain is
#: the user's).
_NESTED_ITERATIONS = 8


def open_iterations(engine: TrainingEngine, record: IterationRecord | None) -> Iterator[IterationRecord]:
    """``record`` (the engine's active iteration, read once by the caller) and those open around
    it, innermost first, for the caller to end each before the next is given: the one it began
    within (a training step running validation), active again."""
    for _ in range(_NESTED_ITERATIONS):
        if record is None:
            return
        yield record
        outer = engine.active
        if outer is record:  # not ended: nothing further out is reached
            return
        record = outer


def _end_open_prelude(engine: TrainingEngine, reason: str) -> None:
    """A step open before the next iteration, on this thread, ends now with the reason: no
    iteration follows, so it becomes a span of its own as the loop around it ends."""
    step = engine.open_step
    if isinstance(step, StepPhase) and step._prelude is engine and engine.training_thread == _get_ident():
        step.set_attribute(semconv.END_REASON, reason)
        step._exit_elsewhere(None, 0, reason)


def _end_open_iterations(engine: TrainingEngine, reason: str) -> None:
    """The fast path's iterations open on this thread end now, with the reason: the iteration
    an early stop shuts the job down in was lost (49 of 50 counted). One open on another
    thread is left to that thread."""
    if engine.active_thread != _get_ident():
        return
    for record in open_iterations(engine, engine.active):
        record.set_end_reason(reason)
        engine.end_iteration(record, _time_ns())
