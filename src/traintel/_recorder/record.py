"""The per-step record: one iteration on the fast path, and the span handle its body sees.

Why a record and not an SDK span: a real span costs tens of microseconds, four per step would
dwarf a small model's step, and a million-step run must not send four million spans. The
record holds the iteration's numbers with ``clock.time_ns`` timestamps; its step phases are
tuples in ``children``. When the iteration ends it is aggregated, and exported as real SDK spans
(same ids, exact timestamps, children included) only if the sampling policy keeps it.

The record is also the span the body sees (``with training_iteration() as span``): a
non-recording span whose context is the iteration's, so spans started inside nest under it,
and whose attributes, events and status are kept here until the iteration is exported.

Its invariant: the end of a plain iteration reads two flags. ``counted``: work counts were
reported on it. ``notable``: anything that may export or flag it (a head reason, an error, a
non-finite metric, user spans held for it). Every field behind those flags is written by a
method of this class, which sets the flag with it; other modules only read them
(``tests/test_architecture.py`` checks that). The rest (the body's context, the open step,
timings) the phases and the engine store directly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final, Protocol

from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util import types
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._recorder import clock
from traintel._sdk.attributes import as_number, clean_value
from traintel._sdk.otel_private import RANDOM_TRACE_ID, new_span_id, new_trace_id

_PLAIN = (str, bool, int, float)
_SAMPLED: Final = 0x01
#: Iteration attributes that are the step's work counts (record fields, in add_work's order).
COUNT_ATTRIBUTES: Final = {
    semconv.SAMPLES: "samples",
    semconv.TOKENS: "tokens",
    semconv.PADDING_TOKENS: "padding",
    semconv.FLOPS: "flops",
}
#: Events kept on a record at most (the SDK keeps 128 on a span by default).
MAX_EVENTS = 128


class Terminated(Exception):
    """Why a phase was cut short by a terminating signal; its message is the end reason
    (``traintel.end_reason``), set on every span ended with it."""


class OpenStep(Protocol):
    """A step phase open in an iteration, or outside any (``record`` None): what a terminating
    signal ends, with ``Terminated``."""

    def cut(self, record: IterationRecord | None, error: Terminated, end_ns: int) -> None: ...


class StepExtras:
    """What a fast-path step carries beyond its name and times, for its exported span: its
    start attributes with what was set on its handle, events, a status, and the span id drawn
    for it when a span was started inside it ("all" mode)."""

    __slots__ = ("attributes", "events", "span_id", "status")

    def __init__(self, attributes: Mapping[str, AttributeValue]) -> None:
        self.attributes: dict[str, AttributeValue] = dict(attributes)
        self.events: list[tuple[str, dict[str, AttributeValue], int]] = []
        self.status: Status | None = None
        self.span_id = 0


#: A step phase of an iteration: (name, start ns, end ns, error, its extras if any).
Child = tuple[str, int, int, BaseException | None, StepExtras | None]


def number(value: object) -> float | None:
    """A count as a float: Python numbers as they are, a numpy scalar or one-element tensor
    through its value; None for anything else, and for a negative or non-finite count (one NaN
    step would make the window's and the whole run's totals and rates NaN)."""
    found = as_number(value)
    return float(found) if found is not None and 0 <= found < math.inf else None


def new_record(phase: str, iteration: int, start_ns: int, parent: SpanContext) -> IterationRecord:
    """A new record: what every iteration sets or reads; the rest is a class default."""
    record: IterationRecord = object.__new__(IterationRecord)  # no __init__: one per step
    record.phase = phase
    record.iteration = iteration
    record.start_ns = start_ns
    record.parent = parent
    record.children = []
    record.phase_ns = [0, 0, 0, 0]
    # read at every iteration's end: set here, not left to the class (a read that falls
    # through to the class costs several times an instance one)
    record.step_spans = record.counted = record.notable = False
    record.metrics = None
    return record


class IterationRecord(NonRecordingSpan):
    """See the module docstring. What most iterations never set has its default on the class;
    ``new_record`` stores what every iteration sets or reads."""

    # --- set at creation (``new_record``) --------------------------------------------------------
    phase: str
    iteration: int
    start_ns: int
    parent: SpanContext
    children: list[Child]
    phase_ns: list[int]  # data loading, forward, backward, optimizer

    # --- defaults --------------------------------------------------------------------------------
    counted = False
    notable = False
    metrics: dict[str, float] | None = None
    end_ns = 0
    span_id = 0
    trace_id = 0
    root_flags = 0  # trace flags a root iteration takes beside "sampled" (the random-id flag)
    samples: float | None = None
    tokens: float | None = None
    padding: float | None = None
    flops: float | None = None
    micro_batches = 0
    attributes: dict[str, AttributeValue] | None = None
    events: list[tuple[str, dict[str, AttributeValue], int]] | None = None
    status: Status | None = None
    error: BaseException | None = None
    nonfinite = False
    head_reason: str | None = None
    holds_user_spans = False  # the export filter holds spans started inside it
    outer: IterationRecord | None = None  # the open iteration this one began within, on its thread
    inner_loops = 0  # loops open inside it, on its thread (record_metrics goes on the innermost)
    step_spans = False  # a step phase ran as a real span (under a user span)
    sampled = False  # the trace flag spans started inside inherit
    step_ids: set[int] | None = None  # ids drawn for its steps (spans were started inside them)
    context: object = None  # the Context attached for the body
    open_step: OpenStep | None = None  # the step phase entered last: what a signal ends
    sync_ns = 0  # when this rank reached the iteration's first collective (mark_sync_point)
    _span_context: SpanContext | None = None

    # --- the Span API a user sees inside the iteration ---------------------------------------------
    def get_span_context(self) -> SpanContext:
        """The iteration's context as the SDK would give it: the parent's trace, tracestate and
        random-trace-id flag, sampled as decided when it began."""
        context = self._span_context
        if context is None:
            context = self._span_context = self._build_context(self.sampled)
        return context

    def exported_context(self) -> SpanContext:
        """The context of its exported span (sampled, whatever the policy said at its start)."""
        return self.get_span_context() if self.sampled else self._build_context(True)

    def _build_context(self, sampled: bool) -> SpanContext:
        if not self.span_id:
            self.assign_ids()
        parent = self.parent
        if parent.is_valid:
            flags, state = parent.trace_flags & RANDOM_TRACE_ID, parent.trace_state
        else:
            flags, state = self.root_flags, TraceState()
        return SpanContext(self.trace_id, self.span_id, False, TraceFlags(flags | sampled), state)

    def assign_ids(self) -> None:
        """Draw the span id (and, for a root, the trace id) on first need: most iterations are
        never asked (no user span, not exported)."""
        parent = self.parent
        self.trace_id = parent.trace_id if parent.is_valid else new_trace_id()
        self.span_id = new_span_id()

    def is_recording(self) -> bool:
        return True

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        if type(value) not in _PLAIN:
            cleaned = clean_value(key, value)
            if cleaned is None:
                return
            value = cleaned
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value
        field = COUNT_ATTRIBUTES.get(key)
        if field is not None:  # the step's work set as an attribute counts, as on a plain OTel span
            setattr(self, field, number(value))
            self.counted = True

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        if self.events is None:
            self.events = []
        if len(self.events) < MAX_EVENTS:
            self.events.append((name, dict(attributes or {}), timestamp or clock.time_ns()))

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self.status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        self.fail(exception)

    def __repr__(self) -> str:
        return f"IterationRecord({self.phase!r}, iteration={self.iteration})"

    # --- what the phases and the engine record -----------------------------------------------------
    def owns(self, span_id: int) -> bool:
        """Whether ``span_id`` is this iteration's or one of its steps' (a span started there
        waits for the iteration's decision)."""
        return span_id == self.span_id or (self.step_ids is not None and span_id in self.step_ids)

    def add_step_id(self, span_id: int) -> None:
        if self.step_ids is None:
            self.step_ids = set()
        self.step_ids.add(span_id)

    def add_step_time(self, index: int, duration_ns: int) -> None:
        """A step phase that ran as a real span (nested under a user span): its time only."""
        self.phase_ns[index] += duration_ns
        self.step_spans = True

    def add_work(
        self, samples: float | None, tokens: float | None, padding: float | None, flops: float | None
    ) -> None:
        """One micro-batch's counts, summed into the step (never counted per micro-batch)."""
        self.micro_batches += 1
        self.counted = True
        if samples is not None:
            self.samples = (self.samples or 0) + samples
        if tokens is not None:
            self.tokens = (self.tokens or 0) + tokens
        if padding is not None:
            self.padding = (self.padding or 0) + padding
        if flops is not None:
            self.flops = (self.flops or 0) + flops

    def mark_sync(self, now_ns: int) -> None:
        """The iteration reached its first collective (later marks are other gradient buckets)."""
        if not self.sync_ns:
            self.sync_ns = now_ns

    def record_metric(self, name: str, value: float) -> None:
        metrics = self.metrics
        if metrics is None:
            metrics = self.metrics = {}
        metrics[name] = value
        if not math.isfinite(value):
            self.nonfinite = self.notable = True

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.notable = True

    def start_reason(self, reason: str) -> None:
        """A reason to export it, known when it begins (first K, every M-th, "all")."""
        self.head_reason = reason
        self.notable = True

    def keep(self, reason: str) -> None:
        """Export it whatever its end (a checkpoint or an evaluation ran inside it)."""
        if self.head_reason is None:
            self.start_reason(reason)

    def hold_user_spans(self) -> None:
        """Spans the user started inside it wait in the export filter for its decision."""
        self.holds_user_spans = self.notable = True

    def end(self, end_time: int | None = None) -> None:
        """A no-op: the iteration ends with its phase (``with`` or the end callback)."""

    def set_end_reason(self, reason: str) -> None:
        self.attributes = {**(self.attributes or {}), semconv.END_REASON: reason}
