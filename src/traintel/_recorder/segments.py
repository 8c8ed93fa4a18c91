"""When the running trace is closed and the run goes on in a new one (segmented traces).

Why: backends assume a trace finishes in minutes and hold a bounded number of spans and bytes
per trace. Every ``segment_iterations`` training iterations or ``segment_seconds``, or before
the span / byte budget is reached, the open ``application`` and ``training_loop`` spans end and
continue in a fresh trace (see ``traintel._sdk.segments``). The rotation happens at the start of
the next iteration, never after the last one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from traintel._sdk.export_filter import TraceBudget
from traintel._sdk.segments import SegmentedSpan, span_event_limit
from traintel.config import TrainingConfig

if TYPE_CHECKING:
    from traintel._recorder.engine import TrainingEngine

#: Fraction of the trace budget at which a segment is closed early.
BUDGET_ROTATE: Final = 0.9
#: Estimated bytes kept free in a trace for one more exported iteration: an evaluation loop,
#: which cannot rotate the segment, stops exporting when they run out.
ROOM_BYTES: Final = 4096
#: The segment's budget is checked every this many iterations (and after every export).
BUDGET_CHECK_EVERY: Final = 16
#: What the open loop and application spans add when they end, on top of their events: the
#: last loop segment with its summary is ~4.5 kB.
OPEN_SPANS_MARGIN: Final = 6144


class Segments:
    """The running segment's budget and the rotation to the next one."""

    def __init__(self, engine: TrainingEngine, budget: TraceBudget) -> None:
        self._engine = engine
        self.budget = budget
        self.rotate_pending = False
        self.closed = 0  # segments closed so far in this job
        self.next_check = BUDGET_CHECK_EVERY
        self.due_ns = 1 << 62

    def configure(self, config: TrainingConfig) -> None:
        self.segment_iterations = int(config.get("segment_iterations"))
        self.segment_ns = int(float(config.get("segment_seconds")) * 1e9)
        self.max_spans = int(config.get("max_spans_per_trace"))
        self.max_bytes = int(config.get("max_bytes_per_trace"))
        # Due before the loop span's events reach the SDK's limit: a window event can come with
        # each of the BUDGET_CHECK_EVERY iterations between two checks, and capped others.
        limit = span_event_limit()
        self.rotate_events = (1 << 62) if limit is None else max(1, limit - 2 * BUDGET_CHECK_EVERY)
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
        spans, size = self.budget.usage(loop.get_span_context().trace_id)
        previous_loop = loop.get_span_context()
        loop.close_segment(now_ns, continues=True, spans=spans, estimated_bytes=size)
        new_parent = None
        if app is not None and app.get_span_context().trace_id == previous_loop.trace_id:
            previous_app = app.get_span_context()
            app.close_segment(now_ns, continues=True)
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
            spans, size = self.budget.usage(loop.get_span_context().trace_id)
            loop.close_segment(end_ns, continues=False, spans=spans, estimated_bytes=size)
