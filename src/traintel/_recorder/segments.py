"""Segmented traces: a long run continues in new traces, linked, each closed within its period.

Why: backends assume a trace finishes in minutes. A training run of days as one trace has a
root that arrives last or never, blows Tempo's per-trace byte limit and Jaeger's UI. So every
``segment_seconds`` (or ``segment_iterations`` training iterations, if set; or before the span /
byte budget is reached), the open ``application`` and ``training_loop`` spans end and continue as
new root ``application`` / child ``training_loop`` spans in a fresh trace, linked to the
previous segment and to the run's first ``application`` span, carrying the segment index and
iteration range. A short run never rotates and is exactly one trace. The rotation happens at
the start of the next iteration, never after the last one.

The user holds a :class:`SegmentedSpan`: a span handle that always forwards to the current
segment, so ``span.set_attribute(...)`` after a rotation still lands, and spans started under
it (through the context it was attached in) parent to the current segment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.trace import Link, Span, SpanContext
from opentelemetry.util import types

from traintel import semconv
from traintel._aggregation.otlp_size import estimate_attributes_bytes
from traintel._recorder.forwarding_span import ForwardingSpan
from traintel._recorder.ports import TraceBudget, WindowSink
from traintel._sdk.otel_private import add_clean_event
from traintel.config import Settings

#: Fraction of the trace budget at which a segment is closed early.
BUDGET_ROTATE: Final = 0.9
#: Estimated bytes kept free in a trace for one more exported iteration: an evaluation loop,
#: which cannot rotate the segment, stops exporting when they run out.
ROOM_BYTES: Final = 4096
#: The segment's budget is checked every this many iterations (and after every export).
BUDGET_CHECK_EVERY: Final = 16
#: No bound (iterations per segment when none is set: segments follow time).
NO_LIMIT: Final = 1 << 62
#: What the open loop and application spans add when they end, on top of their events: the
#: last loop segment with its summary is ~4.5 kB.
OPEN_SPANS_MARGIN: Final = 6144


class SegmentOwner(Protocol):
    """What the segment bookkeeping reads of the engine that owns it."""

    loop: SegmentedSpan | None
    app: SegmentedSpan | None
    tracer: trace_api.Tracer
    window_sink: WindowSink

    def segment_started(self) -> None: ...


class Segments:
    """The running segment's budget and the rotation to the next one."""

    def __init__(self, engine: SegmentOwner, budget: TraceBudget) -> None:
        self._engine = engine
        self.budget = budget
        self.rotate_pending = False
        self.closed = 0  # segments closed so far in this job
        self.next_check = BUDGET_CHECK_EVERY
        self.due_ns = NO_LIMIT

    def configure(self, settings: Settings) -> None:
        self.segment_iterations = settings.segment_iterations or NO_LIMIT
        self.segment_ns = int(settings.segment_seconds * 1e9)
        self.max_spans = settings.max_spans_per_trace
        self.max_bytes = settings.max_bytes_per_trace
        # Due before the loop span's events reach the SDK's limit: a window event can come with
        # each of the BUDGET_CHECK_EVERY iterations between two checks, and capped others. The
        # limit: OTEL_SPAN_EVENT_COUNT_LIMIT, 128 by default; None, no limit.
        limit = SpanLimits().max_events
        self.rotate_events = NO_LIMIT if limit is None else max(1, limit - 2 * BUDGET_CHECK_EVERY)
        # Due at BUDGET_ROTATE of the budget, or sooner under a small budget, so that a
        # training loop rotates before its ROOM_BYTES run out.
        self.rotate_bytes = min(BUDGET_ROTATE * self.max_bytes, self.max_bytes - 2 * ROOM_BYTES)
        loop = self._engine.loop
        if loop is not None:  # changed mid-segment: checked again from the next iteration
            self._segment_started(loop, loop.segment_start_ns)

    def loop_opened(self, loop: SegmentedSpan, start_ns: int) -> None:
        self.rotate_pending = False
        self._segment_started(loop, start_ns)

    def _segment_started(self, loop: SegmentedSpan, start_ns: int) -> None:
        loop.segment_start_ns = start_ns
        #: When ``check`` is next due: at this many iterations in the segment, or at this time
        #: (the engine tests the two per iteration; an exported iteration calls it at once).
        self.next_check = min(BUDGET_CHECK_EVERY, self.segment_iterations)
        self.due_ns = start_ns + self.segment_ns

    def check(self, loop: SegmentedSpan, end_ns: int, exported_now: bool) -> None:
        """After an iteration: is the segment due (iterations, time), or its budget near? Called
        when ``next_check`` or ``due_ns`` is reached, and after an exported iteration."""
        if exported_now:  # exports fill the trace: check now
            self._check_budget(loop)
        in_segment = loop.segment_iterations
        if in_segment >= self.segment_iterations or end_ns >= self.due_ns:
            self.rotate_pending = True
        elif in_segment >= self.next_check:  # the budget, every BUDGET_CHECK_EVERY iterations too
            self._check_budget(loop)
        if in_segment >= self.next_check:
            next_multiple = (in_segment // BUDGET_CHECK_EVERY + 1) * BUDGET_CHECK_EVERY
            self.next_check = min(next_multiple, max(self.segment_iterations, in_segment + 1))

    def _check_budget(self, loop: SegmentedSpan) -> None:
        spans, size = self.budget.usage(loop.get_span_context().trace_id)
        size += self._open_bytes(loop)
        if (
            spans >= BUDGET_ROTATE * self.max_spans
            or size >= self.rotate_bytes
            or loop.open_events >= self.rotate_events
        ):
            self.rotate_pending = True

    def _open_bytes(self, loop: SegmentedSpan) -> int:
        """What the open loop (and application) segment will add to the trace when it ends."""
        app = self._engine.app
        same_trace = app is not None and app.get_span_context().trace_id == loop.get_span_context().trace_id
        return loop.open_bytes + (app.open_bytes if same_trace and app is not None else 0) + OPEN_SPANS_MARGIN

    def has_room(self) -> bool:
        """Room in the current segment's trace for one more exported iteration."""
        loop = self._engine.loop
        if loop is None:
            return True
        spans, size = self.budget.usage(loop.get_span_context().trace_id)
        size += self._open_bytes(loop) + ROOM_BYTES
        return spans + 8 <= self.max_spans and size <= self.max_bytes

    def rotate(self, now_ns: int) -> None:
        """Close the current segment (loop, and application if in its trace) and continue in a
        new trace, linked to the previous segment and to the run's first application span."""
        self.rotate_pending = False
        engine = self._engine
        loop = engine.loop
        if loop is None:
            return
        app = engine.app
        previous_loop = loop.get_span_context()
        # Closed after the windows already handed over: their records go on the segment that
        # holds them. The next segment starts now: the next iteration is in it.
        then = engine.window_sink.then
        then(
            loop.close_segment(
                now_ns, continues=True, usage=lambda: self.budget.usage(previous_loop.trace_id)
            )
        )
        new_parent = None
        if app is not None and app.get_span_context().trace_id == previous_loop.trace_id:
            previous_app = app.get_span_context()
            then(app.close_segment(now_ns, continues=True))
            app.start_next(engine.tracer, now_ns, None, [previous_app, app.first_context])
            new_parent = app.current
            root_links = [previous_loop]
        else:
            root_links = [previous_loop] + ([app.first_context] if app is not None else [])
        loop.start_next(engine.tracer, now_ns, new_parent, root_links)
        self._segment_started(loop, now_ns)
        engine.segment_started()
        self.closed += 1

    def loop_closing(self, loop: SegmentedSpan, end_ns: int) -> None:
        """The loop ends: if it was ever rotated, its last segment is marked as the last."""
        if self.closed:
            trace_id = loop.get_span_context().trace_id
            loop.close_segment(end_ns, continues=False, usage=lambda: self.budget.usage(trace_id))()


class SegmentedSpan(ForwardingSpan):
    """A stable handle on a phase whose SDK span is replaced at each segment boundary."""

    def __init__(self, first: Span, name: str, attributes: Mapping[str, types.AttributeValue] | None) -> None:
        super().__init__(first)
        self.first_context = self._context = first.get_span_context()
        self.name = name
        self.start_attributes = dict(attributes or {})
        self.segment_index = 0
        self.segment_start_ns = 0
        self.segment_first_iteration: int | None = None
        self.segment_last_iteration: int | None = None
        self.segment_iterations = 0
        #: Estimated OTLP bytes of the events on the open segment: they reach the trace only
        #: when the segment ends, but count against its budget now.
        self.open_bytes = 0
        #: Events on the open segment: the SDK drops those beyond the span's event limit.
        self.open_events = 0

    # --- Span API: forwarded to the current segment, but for these ------------------------------
    def get_span_context(self) -> SpanContext:
        return self._context  # the current segment's; read once per iteration, so cached

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        self.open_events += 1
        self.open_bytes += 24 + len(name) + estimate_attributes_bytes(attributes)
        self.current.add_event(name, attributes, timestamp)

    def add_clean_event(
        self, name: str, attributes: Mapping[str, types.AttributeValue], segment: Span
    ) -> None:
        """``add_event`` for attributes traintel computed (plain numbers and strings): stored
        without the SDK's per-value cleaning (see ``traintel._sdk.otel_private``), on
        ``segment``, the one that held a window (counted if it is still the open one)."""
        if segment is self.current:
            self.open_events += 1
            self.open_bytes += 24 + len(name) + estimate_attributes_bytes(attributes)
        add_clean_event(segment, name, attributes)

    def update_name(self, name: str) -> None:
        self.name = name
        self.current.update_name(name)

    def __repr__(self) -> str:
        return f"SegmentedSpan({self.name!r}, segment={self.segment_index}, current={self.current!r})"

    # --- segment bookkeeping --------------------------------------------------------------------
    def close_segment(
        self, end_ns: int, continues: bool, usage: Callable[[], tuple[int, int]] | None = None
    ) -> Callable[[], None]:
        """What marks the current segment's span, and ends it if the run continues in a next
        one; returned, to be called once the windows closed in this segment are in it (see
        ``Segments.rotate``). ``usage``, read then, gives what its trace was sent (spans,
        estimated bytes)."""
        span = self.current
        attributes: dict[str, types.AttributeValue] = {
            semconv.SEGMENT_INDEX: self.segment_index,
            semconv.SEGMENT_CONTINUES: continues,
        }
        if self.segment_first_iteration is not None and self.segment_last_iteration is not None:
            attributes[semconv.SEGMENT_FIRST_ITERATION] = self.segment_first_iteration
            attributes[semconv.SEGMENT_LAST_ITERATION] = self.segment_last_iteration

        def close() -> None:
            spans, size = usage() if usage is not None else (0, 0)
            if spans:
                attributes[semconv.SEGMENT_SPANS] = spans
                attributes[semconv.SEGMENT_BYTES] = size
            span.set_attributes(attributes)
            if continues:
                span.end(end_time=end_ns)

        return close

    def start_next(
        self,
        tracer: trace_api.Tracer,
        start_ns: int,
        parent: Span | None,
        links: Sequence[SpanContext],
    ) -> None:
        """Continue in a new span: a root (new trace) unless ``parent`` is given."""
        self.segment_index += 1
        attributes = dict(self.start_attributes)
        attributes[semconv.SEGMENT_INDEX] = self.segment_index
        context = trace_api.set_span_in_context(parent) if parent is not None else Context()
        self.current = tracer.start_span(
            self.name,
            context=context,
            attributes=attributes,
            links=[Link(link) for link in links if link.is_valid],
            start_time=start_ns,
        )
        self._context = self.current.get_span_context()
        self.segment_start_ns = start_ns
        self.segment_first_iteration = None
        self.segment_last_iteration = None
        self.segment_iterations = 0
        self.open_bytes = 0
        self.open_events = 0
