"""The span processor: live-span registry, phase durations, and metrics from anyone's spans.

Why it exists next to the fast path: any span carrying ``ml.training.phase`` is understood,
whoever created it. traintel's own API feeds the engine directly (it knows the numbers before
the span ends, and its iterations are not SDK spans unless exported); spans from other
instrumentation scopes — the user's plain ``tracer.start_as_current_span(...)`` with a phase
attribute — are turned into the same aggregates here, at ``on_end``.

Why a registry of live spans: an SDK span is frozen once it ends (DESIGN rule 5), so anything
traintel wants to attach — a model metric, an event on the enclosing loop — must go to a span
that is still open. The registry maps span ids to open spans, so code holding the current span
can walk up to its enclosing iteration or loop, even through user spans in between. It holds
open spans only: bounded by nesting depth and concurrency, never by the number of iterations.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from traintel import semconv
from traintel._aggregation.aggregator import STEP_INDEX
from traintel.semconv import Phase

if TYPE_CHECKING:
    from traintel._recorder.engine import TrainingEngine
    from traintel._sdk.export_filter import TraceBudget
    from traintel._sdk.instruments import TrainingInstruments

_logger = logging.getLogger(__name__)
_get_ident = threading.get_ident

#: Open spans tracked at most. Only spans that are never ended (a leak in someone's code) can
#: reach it; past it, spans without ``ml.training.phase`` are no longer tracked.
MAX_TRACKED_OPEN_SPANS = 100_000

_PER_STEP = frozenset({p.value for p in semconv.ITERATION_PHASES} | {p.value for p in semconv.STEP_PHASES})
_STAGE_OF = {phase.value: stage for stage, phase in semconv.CHECKPOINT_STAGES.items()}
_CATEGORY_OF = semconv.BADPUT_CATEGORY_OF_PHASE
_DATA_LOADING = Phase.DATA_LOADING.value
_TRAINING_ITERATION = Phase.TRAINING_ITERATION.value


class TrainingMetricsProcessor(SpanProcessor):
    """Registry of open spans; ``ml.training.phase.duration``; aggregates for foreign spans."""

    def __init__(
        self,
        instruments: TrainingInstruments | None = None,
        own_scope: str = semconv.INSTRUMENTATION_SCOPE,
        budget: TraceBudget | None = None,
    ) -> None:
        self._open: dict[int, Span] = {}
        #: When a phase span last ended (the heartbeat's progress stamp).
        self.last_end_ns = 0
        self._phase_counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._enabled = True
        self._instruments = instruments
        self._own_scope = own_scope
        self._own_scope_seen: object = None
        self._budget = budget
        self._attribute_cache: dict[str, dict[str, str]] = {}
        self._overflow_warned = False
        self._foreign_steps: dict[int, list[int]] = {}
        self.engine: TrainingEngine | None = None
        self.on_error: Callable[[str], None] = lambda kind: None

    # --- SpanProcessor ---------------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        engine = self.engine
        if not self._enabled or (engine is not None and engine.materializing == _get_ident()):
            return  # an exported iteration's spans: created and ended at once, already counted
        if span.name in _PER_STEP and self._is_own(span):
            return  # our own per-step spans ("all" mode; our span names are phases): counted directly
        context = span.get_span_context()
        phase = (span.attributes or {}).get(semconv.PHASE)
        if phase is not None or len(self._open) < MAX_TRACKED_OPEN_SPANS:
            self._open[context.span_id] = span
        elif not self._overflow_warned:
            self._overflow_warned = True
            _logger.warning(
                "traintel: %d spans are open at once (spans that are never ended?); "
                "no longer tracking spans without ml.training.phase",
                MAX_TRACKED_OPEN_SPANS,
            )
        if phase is not None:
            if engine is not None and span.start_time is not None:
                engine.goodput.started(span.start_time)
                if phase in _CATEGORY_OF and phase != _DATA_LOADING:
                    self._keep_enclosing_iteration(engine, span, str(phase))
            key = str(phase)
            with self._lock:
                self._phase_counts[key] = self._phase_counts.get(key, 0) + 1
            if key == Phase.TRAINING_ITERATION.value and not self._is_own(span):
                self._foreign_steps[context.span_id] = [0, 0, 0, 0]

    def on_end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        if context is None:
            return
        if self._budget is not None:
            self._budget.add(span)
        engine = self.engine
        if engine is not None and engine.materializing == _get_ident():
            return
        if span.name in _PER_STEP and self._is_own(span):
            if span.name == _DATA_LOADING and engine is not None and self._enabled:
                self._goodput(engine, span, _DATA_LOADING)  # outside an iteration: badput
            return
        phase = (span.attributes or {}).get(semconv.PHASE)
        if phase is None:
            self._open.pop(context.span_id, None)
            return
        live = self._open.pop(context.span_id, None)
        self.last_end_ns = span.end_time or 0
        key = str(phase)
        if live is not None:
            with self._lock:
                remaining = self._phase_counts.get(key, 0) - 1
                if remaining > 0:
                    self._phase_counts[key] = remaining
                else:
                    self._phase_counts.pop(key, None)
        if not self._enabled or span.start_time is None or span.end_time is None:
            return
        duration_ns = span.end_time - span.start_time
        if engine is not None and key in _CATEGORY_OF:
            self._goodput(engine, span, key)
        if key not in _PER_STEP and self._instruments is not None:
            attributes = self._attribute_cache.get(key)
            if attributes is None:
                attributes = self._attribute_cache.setdefault(key, {semconv.PHASE: key})
            self._instruments.phase_duration.record(duration_ns / 1e9, attributes)
        if not self._is_own(span):
            try:
                self._foreign(span, key, duration_ns)
            except Exception:
                self.on_error("foreign_span")

    def _goodput(self, engine: TrainingEngine, span: ReadableSpan, phase: str) -> None:
        """Book a categorised phase's time: its own time less the categorised phases inside it
        (innermost wins); its whole time is taken from what encloses it. Data loading inside an
        iteration is already the iteration's data-loading wait."""
        context = span.get_span_context()
        if context is None or span.start_time is None or span.end_time is None:
            return
        duration_ns = span.end_time - span.start_time
        kind, ancestor = self._goodput_parent(engine, span)
        if phase == _DATA_LOADING and kind == "iteration":
            return
        ledger = engine.goodput
        ledger.phase_ended(_CATEGORY_OF[phase], context.span_id, duration_ns)
        if kind == "phase":
            ledger.nested_in_phase(ancestor, duration_ns)
        elif kind == "iteration":
            ledger.nested_in_iteration(duration_ns)

    def _keep_enclosing_iteration(self, engine: TrainingEngine, span: Span, phase: str) -> None:
        """A checkpoint save or evaluation inside a fast-path iteration: export that iteration,
        so the phase span is not dropped with it (it is badput the analysis must see)."""
        kind, span_id = self._goodput_parent(engine, span)
        record = engine.active
        if (
            kind == "iteration"
            and record is not None
            and record.span_id == span_id
            and record.head_reason is None
        ):
            record.head_reason = "checkpoint" if phase.startswith("checkpoint") else "nested_phase"
            record.notable = True

    def _goodput_parent(self, engine: TrainingEngine, span: ReadableSpan) -> tuple[str | None, int]:
        """The nearest enclosing categorised phase ("phase", its id) or training iteration
        ("iteration"), walking up through uncategorised spans (the user's, loops, application)."""
        parent = span.parent
        span_id = parent.span_id if parent is not None else 0
        active = engine.active
        for _ in range(256):  # a cycle guard, not a real depth
            if active is not None and span_id == active.span_id and active.phase == _TRAINING_ITERATION:
                return "iteration", span_id
            live = self._open.get(span_id)
            if live is None:
                return None, 0
            phase = (live.attributes or {}).get(semconv.PHASE)
            if phase == _TRAINING_ITERATION:
                return "iteration", span_id
            if phase in _CATEGORY_OF:
                return "phase", span_id
            if live.parent is None:
                return None, 0
            span_id = live.parent.span_id
        return None, 0

    def _is_own(self, span: ReadableSpan) -> bool:
        scope = span.instrumentation_scope
        if scope is self._own_scope_seen:  # one scope object per tracer: compare names once
            return scope is not None
        if scope is not None and scope.name == self._own_scope:
            self._own_scope_seen = scope
            return True
        return False

    def _foreign(self, span: ReadableSpan, phase: str, duration_ns: int) -> None:
        """Aggregate a span traintel's API did not create."""
        engine = self.engine
        if engine is None:
            return
        context = span.get_span_context()
        attributes = span.attributes or {}
        index = STEP_INDEX.get(phase)
        if index is not None:
            parent = span.parent
            steps = self._foreign_steps.get(parent.span_id) if parent is not None else None
            if steps is not None:
                steps[index] += duration_ns
            return
        if phase == Phase.TRAINING_ITERATION.value:
            steps = self._foreign_steps.pop(context.span_id, None) if context is not None else None
            engine.foreign_iteration(span, duration_ns, steps, self.enclosing_loop(span))
        elif phase in (Phase.CHECKPOINT_SAVE_SYNC.value, Phase.CHECKPOINT_SAVE_ASYNC.value):
            size = attributes.get(semconv.CHECKPOINT_SIZE)
            strategy = "async" if phase == Phase.CHECKPOINT_SAVE_ASYNC.value else "sync"
            iteration = attributes.get(semconv.CHECKPOINT_ITERATION)
            engine.checkpoint_saved(
                duration_ns / 1e9, int(size) if isinstance(size, int) else None, strategy, None,
                self.enclosing_parent(span), iteration if isinstance(iteration, int) else None,
            )  # fmt: skip
        elif phase == Phase.CHECKPOINT_LOAD.value:
            engine.checkpoint_loaded(duration_ns / 1e9)
        elif phase == Phase.TRAINING_LOOP.value and context is not None:
            engine.foreign_loop_ended(context)
        elif phase in _STAGE_OF:
            engine.checkpoint_stage_done(_STAGE_OF[phase], duration_ns / 1e9)

    # --- queries ---------------------------------------------------------------------------------
    def open_spans(self) -> list[Span]:
        """The spans open now (a copy; may raise RuntimeError if the registry changes meanwhile)."""
        return list(self._open.values())

    def is_open(self, phase: str) -> bool:
        """Whether any span of ``phase`` is open right now (in any thread)."""
        return self._phase_counts.get(phase, 0) > 0

    def enclosing(self, span_id: int, phases: Collection[str]) -> Span | None:
        """The nearest open span, starting at ``span_id`` and walking up, whose phase is in
        ``phases``; ``None`` when the chain leaves the registry first."""
        seen = 0
        span = self._open.get(span_id)
        while span is not None and seen < 256:  # 256: a cycle guard, not a real depth
            phase = (span.attributes or {}).get(semconv.PHASE)
            if phase is not None and phase in phases:
                return span
            parent = span.parent
            if parent is None:
                return None
            span = self._open.get(parent.span_id)
            seen += 1
        return None

    def enclosing_loop(self, span: ReadableSpan) -> Span | None:
        parent = span.parent
        if parent is None:
            return None
        return self.enclosing(parent.span_id, (Phase.TRAINING_LOOP.value,))

    def enclosing_parent(self, span: ReadableSpan) -> Span | None:
        parent = span.parent
        return self._open.get(parent.span_id) if parent is not None else None

    def open_count(self) -> int:
        return len(self._open)

    def disable(self) -> None:
        """Stop tracking (after traintel shut down); the SDK offers no way to remove us."""
        self._enabled = False
        self._open.clear()
        self._foreign_steps.clear()
        self.engine = None
        with self._lock:
            self._phase_counts.clear()

    def shutdown(self) -> None:
        self.disable()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
