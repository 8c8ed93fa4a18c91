"""The span processor: live-span registry, phase durations, and metrics from anyone's spans.

Why it exists next to the fast path: any span carrying ``ml.training.phase`` is understood,
whoever created it. traintel's own API feeds the engine directly (it knows the numbers before
the span ends, and its iterations are not SDK spans unless exported); spans from other
instrumentation scopes — the user's plain ``tracer.start_as_current_span(...)`` with a phase
attribute — are turned into the same aggregates here, at ``on_end``.

It also fills the registry of open spans (``open_spans.py`` says why it is needed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanContext, StatusCode
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._aggregation.aggregator import STEP_INDEX
from traintel._aggregation.goodput import GoodputLedger
from traintel._sdk.export_filter import TraceBudget
from traintel._sdk.instruments import TrainingInstruments
from traintel._sdk.open_spans import OpenSpans
from traintel.semconv import Phase

_get_ident = threading.get_ident
_logger = logging.getLogger(__name__)


class RunningIteration(Protocol):
    """What the processor reads of the engine's running iteration."""

    span_id: int
    phase: str
    iteration: int

    def keep(self, reason: str) -> None: ...


class SpanEngine(Protocol):
    """What the processor needs of the training engine (it never imports the recorder)."""

    #: Threads creating traintel's own records through the tracer: their spans are skipped.
    materializing: set[int]
    goodput: GoodputLedger

    @property
    def active(self) -> RunningIteration | None: ...

    def foreign_iteration(
        self, span: Any, duration_ns: int, steps: list[int] | None, loop_span: Span | None
    ) -> None: ...

    def foreign_loop_ended(self, context: SpanContext) -> None: ...

    def next_foreign_iteration(self) -> int: ...

    def nested_in_iteration(self, duration_ns: int) -> None: ...

    def checkpoint_saved(
        self,
        duration_s: float,
        size_bytes: int | None,
        strategy: str,
        target: Span | None,
        iteration: int | None = None,
        failed: bool = False,
    ) -> dict[str, AttributeValue]: ...

    def checkpoint_loaded(self, duration_s: float, end_ns: int, failed: bool = False) -> None: ...

    def checkpoint_stage_done(self, stage: str, duration_s: float) -> None: ...


_PER_STEP = frozenset({p.value for p in semconv.ITERATION_PHASES} | {p.value for p in semconv.STEP_PHASES})
_STAGE_OF = {phase.value: stage for stage, phase in semconv.CHECKPOINT_STAGES.items()}
_CATEGORY_OF = semconv.BADPUT_CATEGORY_OF_PHASE
_DATA_LOADING = Phase.DATA_LOADING.value
_OURS = frozenset(phase.value for phase in Phase)
#: Phases of the user's own that ``ml.training.phase.duration`` keeps apart; later ones are
#: ``other`` there (see ``TrainingMetricsProcessor._label``).
MAX_OWN_PHASES = 64
OTHER_PHASE = "other"
_TRAINING_ITERATION = Phase.TRAINING_ITERATION.value
_CONTINUES = semconv.SEGMENT_CONTINUES
_APPLICATION = Phase.APPLICATION.value
_SAVES = {phase.value: strategy for strategy, phase in semconv.CHECKPOINT_SAVE_PHASE_OF.items()}


def _phase_of(span: ReadableSpan) -> str | None:
    raw = (span.attributes or {}).get(semconv.PHASE)
    return str(raw) if raw is not None else None


class TrainingMetricsProcessor(SpanProcessor):
    """The open-span registry's writer; ``ml.training.phase.duration``; aggregates for spans
    traintel's API did not create."""

    def __init__(
        self,
        engine: SpanEngine,
        open_spans: OpenSpans,
        instruments: TrainingInstruments | None = None,
        budget: TraceBudget | None = None,
        on_error: Callable[[str], None] = lambda kind: None,
    ) -> None:
        self.engine: SpanEngine | None = engine
        self.open_spans = open_spans
        self._instruments = instruments
        self._budget = budget  # in a user's pipeline there is no export filter to count the trace
        self._on_error = on_error
        self._own_scope_seen: object = None
        self._foreign_steps: dict[int, list[int]] = {}
        self._own_phases: set[str] = set()  # the user's phases the phase-duration metric keeps
        self._said_too_many = False

    # --- SpanProcessor ---------------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        engine = self.engine
        if engine is None or _get_ident() in engine.materializing:
            return  # shut down; or an exported iteration's spans: created at once, already counted
        if span.name in _PER_STEP and self._is_own(span):
            return  # traintel's own step phases as real spans: the engine counts them directly
        span_id = span.get_span_context().span_id
        phase = _phase_of(span)
        self.open_spans.started(span, span_id, phase)
        if phase is not None:
            self._phase_started(engine, span, phase, span_id)

    def _phase_started(self, engine: SpanEngine, span: Span, phase: str, span_id: int) -> None:
        """A span with a phase started: the job's time runs; a checkpoint or evaluation keeps the
        iteration it is in; a phase of the user's own inside an iteration carries its number; a
        foreign iteration gets its step-phase tally."""
        if span.start_time is not None:
            engine.goodput.started(span.start_time)
            if phase in _CATEGORY_OF and phase != _DATA_LOADING:
                self._keep_enclosing_iteration(engine, span, phase)
            elif phase not in _OURS:
                self._number_by_enclosing_iteration(engine, span)
        if phase == _TRAINING_ITERATION and not self._is_own(span):
            self._foreign_steps[span_id] = [0, 0, 0, 0]
            if semconv.ITERATION not in (span.attributes or {}):  # numbered as the window counts it
                span.set_attribute(semconv.ITERATION, engine.next_foreign_iteration())

    def on_end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        if context is None:
            return
        if self._budget is not None:
            self._budget.add(span)
        engine = self.engine
        if engine is None or _get_ident() in engine.materializing:
            return
        if span.name in _PER_STEP and self._is_own(span):
            self._own_step_ended(engine, span)
            return
        phase = _phase_of(span)
        self.open_spans.ended(context.span_id, phase, span.end_time or 0, span.attributes)
        if phase is not None:
            self._phase_ended(engine, span, phase, context)

    def _own_step_ended(self, engine: SpanEngine, span: ReadableSpan) -> None:
        """traintel's own step phase as a real span: the engine counted it, but data loading
        outside an iteration is badput, booked here."""
        if span.name == _DATA_LOADING:
            self._goodput(engine, span, _DATA_LOADING)

    def _phase_ended(self, engine: SpanEngine, span: ReadableSpan, phase: str, context: SpanContext) -> None:
        """A span with a phase ended: its goodput category, its ``ml.training.phase.duration``, and
        the aggregates of a span traintel's API did not create."""
        start, end = span.start_time, span.end_time
        if start is None or end is None:
            return
        duration_ns = end - start
        if phase in _CATEGORY_OF:
            self._goodput(engine, span, phase)
        if phase not in _PER_STEP and self._instruments is not None:
            self._instruments.phase_duration.record(duration_ns / 1e9, {semconv.PHASE: self._label(phase)})
        if not self._is_own(span):
            try:
                self._foreign(engine, span, phase, duration_ns, context)
            except Exception:
                self._on_error("foreign_span")

    def _label(self, phase: str) -> str:
        """The phase-duration metric's phase: ours, or one of the first ``MAX_OWN_PHASES`` of the
        user's, else ``other`` (said once). A phase per layer or per step (``phase=f"layer_{i}"``)
        made a histogram series per value in every backend: 2,000 per metric before the SDK
        folds the rest into its overflow series."""
        if phase in _OURS or phase in self._own_phases:
            return phase
        if len(self._own_phases) < MAX_OWN_PHASES:
            self._own_phases.add(phase)
            return phase
        if not self._said_too_many:
            self._said_too_many = True
            _logger.warning(
                "traintel: phase %r is one more than the %d phases of your own that %s keeps apart; "
                "it and later new ones count as phase 'other' there (a phase names a kind of work: "
                "put the layer or step in an attribute)",
                phase,
                MAX_OWN_PHASES,
                semconv.METRIC_PHASE_DURATION,
            )
        return OTHER_PHASE

    def _goodput(self, engine: SpanEngine, span: ReadableSpan, phase: str) -> None:
        """Book a categorised phase's time: its own time less the categorised phases inside it
        (innermost wins); its whole time is taken from what encloses it. Data loading inside an
        iteration is already the iteration's data-loading wait; a phase off the training thread
        did not hold training up."""
        if semconv.THREAD_NAME in (span.attributes or {}):
            return  # it ran beside training (a prefetcher's loading, a writer's save): not badput
        self._book(engine, span, phase)

    def _book(self, engine: SpanEngine, span: ReadableSpan, phase: str) -> None:
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
            engine.nested_in_iteration(duration_ns)

    def _keep_enclosing_iteration(self, engine: SpanEngine, span: Span, phase: str) -> None:
        """A checkpoint save or evaluation inside a fast-path iteration: export that iteration,
        so the phase span is not dropped with it (it is badput the analysis must see)."""
        record = self._enclosing_fast_iteration(engine, span)
        if record is not None:
            record.keep("checkpoint" if phase.startswith("checkpoint") else "nested_phase")

    def _number_by_enclosing_iteration(self, engine: SpanEngine, span: Span) -> None:
        """A phase of the user's own (``timed_span(..., phase="grad_clip")``) inside a fast-path
        iteration: it is exported only with that iteration, so the offline tables, which count
        it from its spans, say so (they read this number); and a trace viewer shows which
        iteration's it is."""
        record = self._enclosing_fast_iteration(engine, span)
        if record is not None:
            span.set_attribute(semconv.ITERATION, record.iteration)

    def _enclosing_fast_iteration(self, engine: SpanEngine, span: Span) -> RunningIteration | None:
        """The engine's running iteration, if it is the nearest iteration or categorised phase
        around ``span`` (a fast-path iteration: no span of its own in the registry)."""
        kind, span_id = self._goodput_parent(engine, span)
        record = engine.active
        return record if kind == "iteration" and record is not None and record.span_id == span_id else None

    def _goodput_parent(self, engine: SpanEngine, span: ReadableSpan) -> tuple[str | None, int]:
        """The nearest enclosing categorised phase ("phase", its id) or training iteration
        ("iteration"), walking up through uncategorised spans (the user's, loops, application)."""
        parent = span.parent
        active = engine.active
        for span_id, live in self.open_spans.ancestors(parent.span_id if parent is not None else 0):
            if active is not None and span_id == active.span_id and active.phase == _TRAINING_ITERATION:
                return "iteration", span_id
            phase = _phase_of(live) if live is not None else None
            if phase == _TRAINING_ITERATION:
                return "iteration", span_id
            if phase in _CATEGORY_OF:
                return "phase", span_id
        return None, 0

    def _is_own(self, span: ReadableSpan) -> bool:
        scope = span.instrumentation_scope
        if scope is self._own_scope_seen:  # one scope object per tracer: compare names once
            return scope is not None
        if scope is not None and scope.name == semconv.INSTRUMENTATION_SCOPE:
            self._own_scope_seen = scope
            return True
        return False

    def _foreign(
        self, engine: SpanEngine, span: ReadableSpan, phase: str, duration_ns: int, context: SpanContext
    ) -> None:
        """Aggregate a span traintel's API did not create."""
        index = STEP_INDEX.get(phase)
        if index is not None:
            self._foreign_step(span, index, duration_ns)
        elif phase == _TRAINING_ITERATION:
            steps = self._foreign_steps.pop(context.span_id, None)
            engine.foreign_iteration(span, duration_ns, steps, self.open_spans.enclosing_loop(span))
        elif phase == Phase.TRAINING_LOOP.value:
            engine.foreign_loop_ended(context)
        elif phase == _APPLICATION:
            if span.end_time is not None and not (span.attributes or {}).get(_CONTINUES):
                engine.goodput.ended(span.end_time)  # the job's time stops, as for traintel's own
        else:
            self._foreign_checkpoint(engine, span, phase, duration_ns / 1e9)

    def _foreign_step(self, span: ReadableSpan, index: int, duration_ns: int) -> None:
        """A step phase: into the tally of the foreign iteration it is in, if it is in one."""
        parent = span.parent
        steps = self._foreign_steps.get(parent.span_id) if parent is not None else None
        if steps is not None:
            steps[index] += duration_ns

    def _foreign_checkpoint(
        self, engine: SpanEngine, span: ReadableSpan, phase: str, duration_s: float
    ) -> None:
        """A checkpoint save, load or save stage traintel's API did not time."""
        if phase in _SAVES:
            attributes = span.attributes or {}
            size = attributes.get(semconv.CHECKPOINT_SIZE)
            iteration = attributes.get(semconv.CHECKPOINT_ITERATION)
            engine.checkpoint_saved(
                duration_s, int(size) if isinstance(size, int) else None, _SAVES[phase],
                self.open_spans.enclosing_parent(span), iteration if isinstance(iteration, int) else None,
                failed=span.status.status_code is StatusCode.ERROR,
            )  # fmt: skip
        elif phase == Phase.CHECKPOINT_LOAD.value:
            end_ns = span.end_time or 0
            engine.checkpoint_loaded(duration_s, end_ns, failed=span.status.status_code is StatusCode.ERROR)
        elif phase in _STAGE_OF:
            engine.checkpoint_stage_done(_STAGE_OF[phase], duration_s)

    def shutdown(self) -> None:
        """Stop tracking: the provider's shutdown, or traintel's own (the SDK offers no way to
        remove a processor from a provider that lives on)."""
        self.engine = None
        self.open_spans.clear()
        self._foreign_steps.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
