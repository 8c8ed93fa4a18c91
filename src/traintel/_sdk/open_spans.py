"""The registry of open spans: which phases are running now, and what encloses a span.

Why: an SDK span is frozen once it ends, so anything traintel attaches (a model metric, an event
on the enclosing loop) must go to a span that is still open; code holding the current span walks
up to its enclosing iteration or loop through here, even through user spans in between. The span
processor fills it (``on_start`` / ``on_end``); the phases, the heartbeat, preemption and
``record_metrics`` read it. It holds open spans only: bounded by nesting depth and concurrency,
never by the number of iterations.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterator, Mapping

from opentelemetry.sdk.trace import ReadableSpan, Span

from traintel import semconv
from traintel.semconv import Phase

_logger = logging.getLogger("traintel")

#: Open spans tracked at most. Only spans that are never ended (a leak in someone's code) can
#: reach it; past it, spans without ``ml.training.phase`` are no longer tracked.
MAX_TRACKED_OPEN_SPANS = 100_000
_CYCLE_GUARD = 256  # a guard against a parent cycle, not a real depth


class OpenSpans:
    """Open spans by span id, and how many spans of each phase are open."""

    def __init__(self) -> None:
        self._open: dict[int, Span] = {}
        self._phase_counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._overflow_warned = False
        #: When a phase span last ended (the heartbeat's progress stamp).
        self.last_end_ns = 0

    # --- written by the span processor -------------------------------------------------------------
    def started(self, span: Span, span_id: int, phase: str | None) -> None:
        if phase is not None or len(self._open) < MAX_TRACKED_OPEN_SPANS:
            self._open[span_id] = span
        elif not self._overflow_warned:
            self._overflow_warned = True
            _logger.warning(
                "traintel: %d spans are open at once (spans that are never ended?); "
                "no longer tracking spans without ml.training.phase",
                MAX_TRACKED_OPEN_SPANS,
            )
        if phase is not None:
            with self._lock:
                self._phase_counts[phase] = self._phase_counts.get(phase, 0) + 1

    def ended(
        self, span_id: int, phase: str | None, end_ns: int, attributes: Mapping[str, object] | None = None
    ) -> None:
        """Forget an ended span; its end is progress unless it ran beside training (a writer
        thread's stage ending says nothing of the training thread)."""
        live = self._open.pop(span_id, None)
        if phase is None:
            return
        if semconv.THREAD_NAME not in (attributes or {}):
            self.last_end_ns = end_ns
        if live is not None:
            with self._lock:
                remaining = self._phase_counts.get(phase, 0) - 1
                if remaining > 0:
                    self._phase_counts[phase] = remaining
                else:
                    self._phase_counts.pop(phase, None)

    def clear(self) -> None:
        self._open.clear()
        with self._lock:
            self._phase_counts.clear()

    # --- queries -----------------------------------------------------------------------------------
    def spans(self) -> list[Span]:
        """The spans open now (a copy; may raise RuntimeError if the registry changes meanwhile)."""
        return list(self._open.values())

    def is_open(self, phase: str) -> bool:
        """Whether any span of ``phase`` is open right now (in any thread)."""
        return self._phase_counts.get(phase, 0) > 0

    def ancestors(self, span_id: int) -> Iterator[tuple[int, Span | None]]:
        """``span_id`` and the ids of its ancestors, nearest first, each with its open span; the
        last is None where the chain leaves the registry."""
        for _ in range(_CYCLE_GUARD):
            span = self._open.get(span_id)
            yield span_id, span
            if span is None or span.parent is None:
                return
            span_id = span.parent.span_id

    def enclosing(self, span_id: int, phases: Collection[str]) -> Span | None:
        """The nearest open span, starting at ``span_id`` and walking up, whose phase is in
        ``phases``; ``None`` when the chain leaves the registry first."""
        for _, span in self.ancestors(span_id):
            if span is not None and (span.attributes or {}).get(semconv.PHASE) in phases:
                return span
        return None

    def enclosing_loop(self, span: ReadableSpan) -> Span | None:
        parent = span.parent
        return self.enclosing(parent.span_id, (Phase.TRAINING_LOOP.value,)) if parent is not None else None

    def enclosing_parent(self, span: ReadableSpan) -> Span | None:
        parent = span.parent
        return self._open.get(parent.span_id) if parent is not None else None
