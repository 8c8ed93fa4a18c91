"""The training engine: iterations on the fast path, tail sampling, loops, checkpoints, events.

Every iteration, in every export policy, is a record while it runs (``record.py`` says why);
at its end it is aggregated, then exported as real SDK spans if the policy keeps it, else
counted and dropped with the user spans the export filter held for it, so nothing is orphaned.
Windows are closed by ``windows.py``, traces rotated by ``segments.py``. What the engine needs
of the SDK side is named in ``ports.py`` and given through its constructor.

Everything here runs on the training thread and never raises into it: callers wrap calls.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._aggregation.aggregator import CheckpointStats, EvalStats
from traintel._aggregation.export_policy import RankExportPolicy
from traintel._aggregation.goodput import GoodputLedger
from traintel._aggregation.sampling import IterationSampler
from traintel._aggregation.window import OpenWindow, RawRow, Row, add_metrics
from traintel._recorder import clock
from traintel._recorder.ports import (
    CheckpointMetrics,
    DirectWriter,
    HeldSpans,
    IdSteering,
    OpenPhases,
    PhaseHooks,
    TraceBudget,
    WindowSink,
)
from traintel._recorder.record import (
    COUNT_ATTRIBUTES,
    Child,
    IterationRecord,
    OpenStep,
    StepExtras,
    Terminated,
    new_record,
    number,
)
from traintel._recorder.segments import SegmentedSpan, Segments
from traintel._recorder.windows import Windows
from traintel._sdk.attributes import UserNamesCap
from traintel._sdk.otel_private import attribute_limits, current_span, get_current, new_span_id
from traintel.config import TrainingConfig
from traintel.semconv import Event, Phase

_TRAINING_ITERATION: Final = Phase.TRAINING_ITERATION.value
_METRIC_PREFIX: Final = semconv.METRIC_PREFIX
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
LOOP_OF_ITERATION: Final = {i.value: loop.value for i, loop in semconv.LOOP_OF_ITERATION.items()}
#: An evaluation loop's iteration phase and the event that sums it up.
_EVAL_LOOPS: Final = {
    Phase.VALIDATION_LOOP.value: (Phase.VALIDATION_ITERATION.value, Event.VALIDATION_METRICS_UPDATE.value),
    Phase.TESTING_LOOP.value: (Phase.TESTING_ITERATION.value, Event.TESTING_METRICS_UPDATE.value),
}
#: Where a resume would start: (its first iteration, the save's end ns, its seconds), or None.
ResumePoint = tuple[int, int, float] | None
#: The step-phase fields of the row of an iteration that did not time its step phases.
_UNTIMED: Final = (None, None, None, None)
_get_ident = threading.get_ident
#: A step run before an iteration: the step, and its index in the step split.
PreludeStep = tuple[Child, int]
_NO_PARENT: Final = (None, trace_api.INVALID_SPAN_CONTEXT, True, 0)  # matches no Context
#: Events of one kind (slow_iteration, nonfinite_metric) per segment at most; iterations that are
#: not exported may take half of them, so that the exported ones (whose event names their trace
#: and span) keep theirs under load. The rest are counted in the window events. The SDK keeps
#: only the newest 128 events of a span.
MAX_EVENTS_PER_SEGMENT = 20


@dataclass(frozen=True)
class SpanOutlet:
    """Where the engine's spans go: its tracer, the trace budget, and with traintel's own
    providers the id generator that lets an exported iteration keep its id, the export filter
    holding spans started inside an undecided iteration, and the direct span writer."""

    tracer: trace_api.Tracer
    budget: TraceBudget
    ids: IdSteering | None = None
    export_filter: HeldSpans | None = None
    direct: DirectWriter | None = None
    #: ``timed_span``'s spans: the user's own, in a scope of their own (default: ``tracer``).
    user_tracer: trace_api.Tracer | None = None


@dataclass(frozen=True)
class EngineHooks:
    """What the runtime around the engine is told, and how it says things once."""

    warn_once: Callable[..., None]
    #: As traintel's application span starts (the telemetry_initialization event, the signal
    #: handlers; a training loop's, without an application), and just before it ends, with the
    #: exception (a deferred preemption event).
    on_application_start: Callable[[Span], None]
    on_application_end: Callable[[Span, BaseException | None], None]
    #: The job's world size as known now: a process group initialised after the telemetry
    #: started can change it (each rank's share of the global batch follows).
    world_size: Callable[[], int] = lambda: 1
    #: Just after traintel's application span ended (its records can be written now).
    after_application_end: Callable[[], None] = lambda: None


class TrainingEngine:
    """State of the running job's training loop(s); one per configured job."""

    last_iteration: int | None
    #: Step phases run directly in the training loop's body since the last iteration (the next
    #: batch fetched before the iteration opens): the next iteration starts with them.
    prelude: tuple[PreludeStep, ...] = ()
    _foreign_next = 0  # the next number for a foreign iteration span that carries none
    load_end_ns = 0  # when a checkpoint load last ended (see _rolled_back)

    def __init__(
        self,
        config: TrainingConfig,
        outlet: SpanOutlet,
        hooks: EngineHooks,
        window_sink: WindowSink,
        open_spans: OpenPhases,
        metrics: CheckpointMetrics | None = None,
    ) -> None:
        self.tracer, self.user_tracer = outlet.tracer, outlet.user_tracer or outlet.tracer
        self.direct = outlet.direct
        self.hooks = hooks
        self.ids = ids = outlet.ids
        self.export_filter = outlet.export_filter
        self.window_sink = window_sink
        self.metrics = metrics
        self.open_spans = open_spans
        self.world_size = hooks.world_size
        self.warn_once = hooks.warn_once
        self.lock = threading.RLock()
        #: Set when the job is shut down or the process forked: the phase API records nothing.
        self.closed = False
        self.active: IterationRecord | None = None
        self.active_thread = 0
        #: The thread that trains (that opened the job's first phase, then its latest training
        #: loop; 0 before): a phase's span started on another ran beside training and says on
        #: which. (Not the thread that configured traintel: a job may configure on the main
        #: thread and train in one of its own.)
        self.training_thread = 0
        #: The step phase entered last outside any iteration (a ``data_loading`` before the
        #: iteration opens): what a terminating signal ends, if it is still open.
        self.open_step: OpenStep | None = None
        self.app: SegmentedSpan | None = None
        #: The phases opened as real spans (not iterations or their steps) and not yet ended,
        #: in the order opened: how each ends if the job shuts down first (``end_open_phases``).
        self.open_phases: dict[int, Callable[[str], None]] = {}
        self.loop: SegmentedSpan | None = None
        self.foreign_loop: Span | None = None
        self.loop_start_ns = 0
        self.eval_stats: dict[str, EvalStats] = {}
        self.eval_samplers: dict[str, IterationSampler] = {}
        #: Loops opened through traintel's API and not yet closed, by phase name (an iteration
        #: can tell it is inside its loop even when the sampler dropped the loop span).
        self.open_loops: dict[str, int] = {}
        self.next_train_iteration = 0  # the training loop sets the start, each iteration the next
        self.next_eval_iteration: dict[str, int] = {}
        self.last_exported: SpanContext | None = None  # the last training iteration, if exported
        #: Threads creating traintel's own records through the tracer (an exported iteration's
        #: spans, a window's record): the processor skips their spans, already counted.
        self.materializing: set[int] = set()
        self.samples_total = self.tokens_total = 0.0  # every iteration's, read by the metric reader
        #: Training iterations decided exported, and not: each only grows (observable counters;
        #: not derived from the iterations seen, which count an iteration before its decision).
        self.exported_iterations = self.unexported_iterations = 0
        #: The heartbeat's progress stamp: when an iteration of any loop last ended (read on the
        #: metric reader's and the stall watcher's threads), and the last training iteration done.
        self.iteration_end_ns, self.last_iteration = 0, None
        self.last_checkpoint: ResumePoint = None
        #: A terminating signal that landed while :meth:`end_iteration` ran on the main thread,
        #: delivered when it returns: cut there, the iteration would be neither open (for the
        #: preemption report to end) nor exported. Set by the signal handler.
        self.deferred_signal: Callable[[], None] | None = None
        self.event_counts: dict[str, int] = {}  # events of each kind in this segment
        self.goodput = GoodputLedger()
        # What this rank exports (None: not decided yet, everything); see set_rank_export.
        self.rank_export: RankExportPolicy | None = None
        self.window_events = True  # training_metrics_update, read once per window
        random_roots = ids is not None and ids.is_trace_id_random()
        self._root_flags = 0x02 if random_roots else 0  # the W3C random-trace-id flag
        # The parent SpanContext of the last iteration, the Context it was read from (immutable;
        # only a segment rotation changes what its span answers), whether it is sampled, and the
        # flags a root iteration takes (0 under a parent).
        self._parent_cache: tuple[object, SpanContext, bool, int] = _NO_PARENT
        #: Called at each step phase's start and end when a device feature is on (None: one
        #: test per phase); set by the runtime, which owns the device features.
        self.device: PhaseHooks | None = None
        #: A step phase has more to do than time itself: "all" mode or device hooks (one test).
        self.step_hooks = False
        self.export_all = False
        #: The open window (training thread); the statistics of closed ones (window pipeline).
        self.window = OpenWindow()
        self.checkpoints = CheckpointStats()
        self.rows: list[RawRow] = self.window.rows  # the open window's, replaced at each close
        self.sampler = IterationSampler()  # configured by apply_config
        self.segments = Segments(self, outlet.budget)
        self.windows = Windows(self)
        self.apply_config(config)

    def set_export_all(self, export_all: bool) -> None:
        self.export_all = export_all
        self.step_hooks = export_all or self.device is not None

    def set_device(self, device: PhaseHooks | None) -> None:
        self.device = device
        self.step_hooks = self.export_all or device is not None

    # --- spans ------------------------------------------------------------------------------------
    def start_span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None,
        start_time: int | None = None,
        users: bool = False,
    ) -> Span:
        """A real span of a phase, in the current context; never raises. ``users``: a span of the
        user's own (``timed_span``), aggregated by the processor as any span with a phase."""
        if self.closed:
            return trace_api.INVALID_SPAN
        if self.prelude and _get_ident() == self.training_thread:
            self.flush_prelude()  # no iteration came next: its own spans, before this one
        try:
            attributes = self.thread_attributes(attributes)
            return (self.user_tracer if users else self.tracer).start_span(
                name, self._badput_parent(name, attributes), attributes=attributes, start_time=start_time
            )
        except Exception:
            self.warn_once("start_span", "could not start span %r", name)
            return trace_api.INVALID_SPAN

    def thread_attributes(
        self, attributes: Mapping[str, AttributeValue] | None
    ) -> Mapping[str, AttributeValue] | None:
        """``attributes``, with the thread's name off the training thread: the span ran beside
        training (an async writer's stage), which the reports and the trace view keep apart."""
        thread = _get_ident()
        if thread == self.training_thread:
            return attributes
        if not self.training_thread:  # the job's first phase: where it trains, until a loop says
            self.training_thread = thread
            return attributes
        return {**(attributes or {}), semconv.THREAD_NAME: threading.current_thread().name}

    def _badput_parent(self, name: str, attributes: Mapping[str, AttributeValue] | None) -> Context | None:
        """A checkpoint or evaluation (by its phase; a ``timed_span`` is named otherwise) inside
        an iteration the policy does not sample (``TRAINTEL_EXPORT_ITERATIONS=none``): under the
        iteration's sampled context, so that it is recorded, counted and booked as badput (the
        SDK would drop it with its parent); anything else in the current context."""
        record = self.active
        if record is None or record.sampled:
            return None
        phase = str((attributes or {}).get(semconv.PHASE, name))
        if phase not in semconv.BADPUT_CATEGORY_OF_PHASE:
            return None
        if self.active_thread != _get_ident():
            return None
        return trace_api.set_span_in_context(NonRecordingSpan(record.exported_context()))

    def end_span(
        self,
        span: Span,
        error: BaseException | None = None,
        end_time: int | None = None,
        end_reason: str | None = None,
    ) -> None:
        """End a phase's span, ERROR with ``error`` if given; never raises."""
        try:
            if error is not None:
                mark_error(span, error, end_time)
            if end_reason is not None:
                span.set_attribute(semconv.END_REASON, end_reason)
            span.end(end_time=end_time)
        except Exception:
            self.warn_once("end_span", "could not end a span")

    # --- configuration --------------------------------------------------------------------------
    def apply_config(self, config: TrainingConfig) -> None:
        """(Re)read the knobs; called at start, on set_training_config, and at window ends."""
        self.config = config
        self.settings = settings = config.resolve()
        self.set_export_all(settings.export_iterations == "all")
        sampler = self.sampler  # the export policy can change mid-run (set_training_config)
        sampler.policy = settings.export_iterations
        sampler.first = settings.export_first_iterations
        sampler.set_rates(
            settings.export_every_n_iterations,
            settings.export_every_n_seconds,
            settings.export_tail_per_minute,
        )
        factor = settings.slow_iteration_factor
        if factor != sampler.slow_factor:
            sampler.slow_factor = factor
            self.windows.catch_up_median()  # the median of the last 101, as at a window close
            sampler.refresh()
        if self.rank_export is not None and self.rank_export.anomalies_only:
            self._stop_routine_sampling()
        global_batch = settings.global_batch_size
        self.default_samples: float | None = (
            global_batch / max(1, self.world_size()) if global_batch else None
        )
        self.seq_len = settings.seq_len
        self.flops_per_token = settings.flops_per_token
        self.flops_per_sample = settings.flops_per_sample
        # Without a default batch, a step that reports nothing has nothing derived (_counts).
        self._derives_counts = self.default_samples is not None
        self.windows.configure(settings)
        self.segments.configure(settings)

    def set_rank_export(self, policy: RankExportPolicy) -> None:
        """Apply what this rank exports; the first decision stands (scale mode is decided once
        per job), later calls are ignored. Nothing of it is read per iteration."""
        if self.rank_export is not None:
            return
        self.rank_export = policy
        self.window_events = not policy.anomalies_only
        if policy.anomalies_only:
            self._stop_routine_sampling()

    def _stop_routine_sampling(self) -> None:
        """No head reasons (first K, every M-th, "all"): only tail reasons export an iteration."""
        for sampler in (self.sampler, *self.eval_samplers.values()):
            sampler.first = sampler.every_n = sampler.every_n_configured = 0
            if sampler.policy == "all":
                sampler.policy = "sampled"
        self.set_export_all(False)

    # --- iterations -----------------------------------------------------------------------------
    def begin_iteration(
        self,
        phase: str,
        given_number: int | None,
        start_ns: int,
        attributes: Mapping[str, AttributeValue] | None,
        context: Context,
    ) -> IterationRecord:
        """The record (and span handle) of an iteration whose body starts now in ``context``;
        numbered ``given_number``, else its loop's running count."""
        prelude = self.prelude
        if prelude:  # the steps run since the last iteration: its first ones, from their start
            start_ns, prelude = self._take_prelude(phase, context, start_ns)
        if phase == _TRAINING_ITERATION:
            iteration = self.next_train_iteration if given_number is None else given_number
            if given_number is not None and self.load_end_ns:
                self._rolled_back(iteration)
            self.next_train_iteration = iteration + 1
            sampler = self.sampler
            if self.segments.rotate_pending:
                self.segments.rotate(start_ns)  # at the start of the next iteration, never after the last
        else:
            iteration, sampler = self._begin_eval(phase, given_number)
        cached = self._parent_cache
        if context is not cached[0]:  # not the loop's context of the previous iteration
            cached = self._parent_cache = self._parent_of(context)
        record = new_record(phase, iteration, start_ns, cached[1])
        for child, index in prelude:  # (none, mostly)
            record.children.append(child)
            record.phase_ns[index] += child[2] - child[1]
        if attributes:  # samples= / tokens= among them count as the step's work
            record.set_attributes(attributes)
        index = sampler.seen
        sampler.seen = index + 1
        reason = None
        if (
            index < sampler.first
            or sampler.policy != "sampled"
            or (sampler.every_n and not iteration % sampler.every_n)
        ):  # a reason known at its start, maybe: the sampler names it
            reason = sampler.head_reason(index, iteration)
            if reason is not None:
                record.start_reason(reason)
        # The trace flag spans started inside inherit, under a sampled parent (or none): with
        # traintel's providers, sampled (the filter holds them until the decision) unless the
        # policy is "none"; with the user's own pipeline, the head decision (ParentBased
        # samplers follow it).
        if cached[2]:
            ours = self.export_filter is not None
            record.sampled = sampler.policy != "none" if ours else reason is not None
            record.root_flags = cached[3]
        thread = _get_ident()
        if self.active is not None and self.active_thread == thread:
            record.outer = self.active  # an iteration within an iteration: the outer one comes back
        self.active = record
        self.active_thread = thread
        return record

    # --- step phases before an iteration ------------------------------------------------------------
    def prelude_opens(self, step: OpenStep) -> bool:
        """Whether a step phase opening outside any iteration is timed without a span, to be the
        next iteration's first step: directly in the training loop's body, on its thread, without
        device timing (it times steps on the device as they run). A span per step cost 55 µs a
        step (9 µs inside the iteration) and one exported span each, and the tables left it out."""
        loop = self.loop
        if loop is None or self.device is not None or _get_ident() != self.training_thread:
            return False
        if current_span(get_current()) is not loop:
            return False
        self.open_step = step
        return True

    def _take_prelude(
        self, phase: str, context: Context, start_ns: int
    ) -> tuple[int, tuple[PreludeStep, ...]]:
        """The steps before an iteration beginning in ``context``, with its start: a training
        iteration directly in the loop's body starts with them; anything else, without (they
        become spans of their own), and so does one that began inside them (their start is
        before the last iteration's end)."""
        prelude = self.prelude
        first = prelude[0][0][1]
        if (
            phase == _TRAINING_ITERATION
            and current_span(context) is self.loop
            and first >= self.iteration_end_ns
        ):
            self.prelude = ()
            return first, prelude
        self.flush_prelude()
        return start_ns, ()

    def prelude_ended(self, child: Child, index: int) -> None:
        self.open_step = None
        self.prelude += ((child, index),)
        if child[3] is not None:  # it failed: no iteration is its, its span says so now
            self.flush_prelude()

    def flush_prelude(self) -> None:
        """The steps run before an iteration that did not come (the loop ended, an evaluation or
        a checkpoint came first, a step failed): each a span of its own under the loop, as a
        step phase outside any iteration is (data loading there is badput of its own)."""
        prelude, self.prelude = self.prelude, ()
        loop = self.loop
        context = trace_api.set_span_in_context(loop) if loop is not None else get_current()
        for child, _index in prelude:
            try:
                self._step_span(child, context)
            except Exception:
                self.warn_once("prelude", "could not record the step %r before an iteration", child[0])

    def _step_span(self, child: Child, context: Context) -> None:
        """A step's span, started and ended at its times under ``context``: its own attributes
        (else its phase), the reason a signal cut it, what was set on its handle."""
        name, start_ns, end_ns, error, extras = child
        attributes = extras.attributes if extras is not None else {semconv.PHASE: name}
        if isinstance(error, Terminated):  # cut by a signal: it says why it ended
            attributes = {**attributes, semconv.END_REASON: str(error)}
        step_id = extras.span_id if extras is not None else 0  # drawn if spans started inside
        _finish(self._start(name, context, attributes, start_ns, step_id), extras, error, end_ns)

    def _begin_eval(self, phase: str, given_number: int | None) -> tuple[int, IterationSampler]:
        """A validation or testing iteration's number (its loop's running count unless given)
        and sampler."""
        loop = LOOP_OF_ITERATION[phase]
        iteration = self.next_eval_iteration.get(loop, 0) if given_number is None else given_number
        self.next_eval_iteration[loop] = iteration + 1
        return iteration, self._eval_sampler(phase)

    def _parent_of(self, context: Context) -> tuple[Context, SpanContext, bool, int]:
        """The parent an iteration started in ``context`` takes, and what it decides."""
        parent = current_span(context).get_span_context()
        if not parent.is_valid:
            return (context, parent, True, self._root_flags)
        return (context, parent, parent.trace_flags.sampled, 0)

    def _eval_sampler(self, phase: str) -> IterationSampler:
        sampler = self.eval_samplers.get(phase)
        if sampler is None:
            sampler = self.eval_samplers[phase] = IterationSampler(
                self.sampler.policy,
                self.sampler.first,
                self.sampler.every_n_configured,
                self.sampler.slow_factor,
            )
        return sampler

    def end_iteration(
        self, record: IterationRecord, end_ns: int, exported_as: tuple[int, int] | None = None
    ) -> None:
        """Aggregate an ended iteration and decide whether it is exported.

        ``exported_as`` marks a span someone else already exported (a plain-OTel iteration seen
        by the processor): aggregated the same way, with no decision to take. The common case
        (not notable, not slow) appends one row; anything else goes to :meth:`_export_decision`.
        """
        try:
            record.end_ns = end_ns
            record.context = None  # the body's Context holds the record: break the cycle for refcounting
            # Progress, stamped before the iteration stops being active: a reader that saw
            # neither would take the previous iteration's end for the rank's last progress.
            self.iteration_end_ns = end_ns
            if self.active is record:  # the iteration it began within (a training step running
                # validation) is active again while open: its later work and phases are its own
                outer = record.outer
                self.active = outer if outer is not None and not outer.end_ns else None
            duration_ns = end_ns - record.start_ns
            if record.phase != _TRAINING_ITERATION:
                self._end_eval_iteration(record, duration_ns)
                return
            iteration = record.iteration
            if record.error is None:  # one that raised (or a signal cut short) did no work that stays
                self._completed(record, duration_ns, end_ns)
            windows = self.windows
            at_mark = len(self.rows) >= windows.rows_mark or end_ns >= windows.due_ns
            if at_mark:  # the slow threshold may start with this iteration, before it is tested
                windows.start_threshold_if_due()
            slow = duration_ns >= self.sampler.threshold_ns
            self.last_exported = None  # the common case: counted, not exported
            exported_now = False
            if slow or record.notable or exported_as is not None:
                exported_now = self._export_decision(record, exported_as, slow, duration_ns / 1e9)
            else:
                self.unexported_iterations += 1
            if at_mark:
                windows.close_if_due(end_ns)
            loop = self.loop
            if loop is not None:  # the segment's iteration range, and whether its budget is checked now
                in_segment = loop.segment_iterations = loop.segment_iterations + 1
                if in_segment == 1:
                    loop.segment_first_iteration = iteration
                loop.segment_last_iteration = iteration
                segments = self.segments
                if exported_now or in_segment >= segments.next_check or end_ns >= segments.due_ns:
                    segments.check(loop, end_ns, exported_now)
        finally:  # a terminating signal that landed in the lines above is handled now
            deliver = self.deferred_signal
            if deliver is not None:
                self._deliver_deferred(deliver)

    def _deliver_deferred(self, deliver: Callable[[], None]) -> None:
        try:
            deliver()  # still set meanwhile: a signal that lands in it is not deferred
        finally:
            self.deferred_signal = None

    def _completed(self, record: IterationRecord, duration_ns: int, end_ns: int) -> None:
        """A completed training iteration: the rank's last, and its row in the open window (its
        time, work and step phases)."""
        self.last_iteration = iteration = record.iteration
        if record.metrics or record.sync_ns:
            self._add_to_window(record)
        timed = record.children or record.step_spans
        data, forward, backward, optimizer = record.phase_ns if timed else _UNTIMED
        if not record.counted and not self._derives_counts:  # no work reported or derived
            self.rows.append(
                (duration_ns, None, None, None, None, data, forward, backward, optimizer, iteration, end_ns)
            )
            return
        samples, tokens, flops = self._counts(record)
        if samples is not None:
            self.samples_total += samples
        if tokens is not None:
            self.tokens_total += tokens
        self.rows.append(
            (duration_ns, samples, tokens, record.padding, flops, data, forward, backward, optimizer,
             iteration, end_ns)
        )  # fmt: skip

    def _add_to_window(self, record: IterationRecord) -> None:
        """The iteration's model metrics, and its compute time before the collective (for the
        cross-rank row), into the open window."""
        window = self.window
        if record.metrics:
            add_metrics(window.metrics, record.metrics)
        if record.sync_ns:
            window.sync_compute_ns += record.sync_ns - record.start_ns - record.phase_ns[0]
            window.sync_marked += 1

    def _counts(self, record: IterationRecord) -> tuple[float | None, float | None, float | None]:
        """This step's samples, tokens and FLOPs: reported, else derived from the config."""
        samples = record.samples if record.samples is not None else self.default_samples
        tokens = record.tokens
        if tokens is None and samples is not None and self.seq_len:
            tokens = samples * self.seq_len
        flops = record.flops
        if flops is None:
            if self.flops_per_token and tokens is not None:
                flops = self.flops_per_token * tokens
            elif self.flops_per_sample and samples is not None:
                flops = self.flops_per_sample * samples
        return samples, tokens, flops

    def _export_decision(
        self, record: IterationRecord, exported_as: tuple[int, int] | None, slow: bool, seconds: float
    ) -> bool:
        """A training iteration that is slow, failed, non-finite, sampled at its head, holds
        user spans or was exported by someone else: decide, flag, and emit its events. Whether
        it is exported now (by traintel: not ``exported_as``)."""
        exported = exported_as
        if exported_as is None:
            reason = self.sampler.tail(
                record.head_reason, slow, record.error is not None, record.nonfinite, record.end_ns
            )
            exported = self._decide(record, self._within_budget(reason))
        window = self.window
        window.nonfinite_iterations += record.nonfinite
        window.slow_iterations += slow
        window.exported_iterations += exported is not None
        self.last_exported = SpanContext(exported[0], exported[1], False, _SAMPLED) if exported else None
        if slow:
            self._slow_event(record, seconds, exported)
        if record.nonfinite:
            self._nonfinite_events(record, exported)
        if exported is not None:
            self.exported_iterations += 1
        else:
            self.unexported_iterations += 1
        return exported is not None and exported_as is None

    def _end_eval_iteration(self, record: IterationRecord, duration_ns: int) -> None:
        loop = LOOP_OF_ITERATION[record.phase]
        stats = self.eval_stats.get(loop)
        if stats is None:
            stats = self.eval_stats[loop] = EvalStats()
        stats.add_iteration(duration_ns, record.samples)
        if record.metrics:
            add_metrics(stats.metrics, record.metrics)
        sampler = self._eval_sampler(record.phase)
        reason = sampler.tail(record.head_reason, False, record.error is not None, record.nonfinite)
        self._decide(record, self._within_budget(reason))

    def _within_budget(self, reason: str | None) -> str | None:
        """Errors always go out; anything else only while the current trace has room."""
        if reason is None or reason in ("error", "nonfinite") or self.segments.has_room():
            return reason
        # Full before the segment could rotate (a long evaluation loop inside it, say): the
        # next training iteration starts a new segment; until then iterations are only counted.
        self.segments.rotate_pending = True
        self.warn_once(
            "budget_full",
            "trace span/byte budget reached before the segment could be rotated (inside a long "
            "evaluation loop?); iterations until the next training iteration are counted but "
            "not exported",
        )
        return None

    def _decide(self, record: IterationRecord, reason: str | None) -> tuple[int, int] | None:
        """Release or drop what the filter held, and create the iteration's spans if kept."""
        if record.holds_user_spans and self.export_filter is not None:
            self.export_filter.close_iteration(record.span_id, reason is not None)
        if reason is None:
            return None
        if record.parent.is_valid and not record.parent.trace_flags.sampled:
            return None
        return self._materialize(record, reason)

    # --- exported iterations ----------------------------------------------------------------------
    def _materialize(self, record: IterationRecord, reason: str) -> tuple[int, int]:
        """The iteration's spans, created now with its ids and timestamps: written directly
        when nothing but the exporters would see them (see ``SpanWriter``), else through the
        tracer."""
        direct = self.direct
        if direct is not None and direct.usable() and _plain(record):
            return self._write(record, reason, direct)
        return self._trace(record, reason)

    @functools.cached_property
    def names_cap(self) -> UserNamesCap:
        """traintel's numbers before the user's metric names, within the tracer's limits."""
        return UserNamesCap(*attribute_limits(self.tracer), self.warn_once)

    def _span_attributes(self, record: IterationRecord, reason: str) -> dict[str, AttributeValue]:
        """An exported iteration's attributes: what was set on its handle, its number, why it is
        exported, its work and its model metrics (user metric names within the tracer's limits)."""
        attributes: dict[str, AttributeValue] = dict(record.attributes or {})
        attributes[semconv.PHASE] = record.phase
        attributes[semconv.ITERATION] = record.iteration
        attributes[semconv.SAMPLING_REASON] = reason
        for key, value in (
            (semconv.SAMPLES, record.samples),
            (semconv.TOKENS, record.tokens),
            (semconv.PADDING_TOKENS, record.padding),
            (semconv.FLOPS, record.flops),
        ):
            if value is not None:
                attributes[key] = value
        if record.micro_batches > 1:
            attributes[semconv.MICRO_BATCHES] = record.micro_batches
        if record.metrics:
            for name, value in record.metrics.items():
                attributes[semconv.METRIC_PREFIX + name] = value
        return self.names_cap.span(attributes, _METRIC_PREFIX, "training_iteration span")

    def _write(self, record: IterationRecord, reason: str, direct: DirectWriter) -> tuple[int, int]:
        context = record.exported_context()
        trace_id, flags, state = context.trace_id, context.trace_flags, context.trace_state
        for name, start_ns, end_ns, _error, extras in record.children:
            span_id = extras.span_id if extras is not None and extras.span_id else new_span_id()
            attributes = extras.attributes if extras is not None else {semconv.PHASE: name}
            step = SpanContext(trace_id, span_id, False, flags, state)
            direct.write(name, step, context, attributes, start_ns, end_ns)
        parent = record.parent if record.parent.is_valid else None
        attributes = self._span_attributes(record, reason)
        direct.write(record.phase, context, parent, attributes, record.start_ns, record.end_ns)
        return (trace_id, context.span_id)

    def _trace(self, record: IterationRecord, reason: str) -> tuple[int, int]:
        """Through the tracer: what every processor on the provider sees."""
        parent = record.parent
        context = trace_api.set_span_in_context(NonRecordingSpan(parent)) if parent.is_valid else Context()
        if not record.span_id:
            record.assign_ids()
        thread = _get_ident()
        self.materializing.add(thread)  # the processor skips these: already counted
        try:
            attributes = self._span_attributes(record, reason)
            root_trace = None if parent.is_valid else record.trace_id
            span = self._start(record.phase, context, attributes, record.start_ns, record.span_id, root_trace)
            inside = trace_api.set_span_in_context(span)
            for child in record.children:
                self._step_span(child, inside)
            _finish(span, record, record.error, record.end_ns)
        finally:
            self.materializing.discard(thread)
        exported = span.get_span_context()
        return (exported.trace_id, exported.span_id)

    def _start(
        self,
        name: str,
        context: Context,
        attributes: Mapping[str, AttributeValue],
        start_ns: int,
        span_id: int,
        trace_id: int | None = None,
    ) -> Span:
        """A span started through the tracer with the id drawn for it (0: the generator's own)."""
        ids = self.ids
        if ids is not None and span_id:
            ids.force(span_id, trace_id)
        try:
            return self.tracer.start_span(name, context=context, attributes=attributes, start_time=start_ns)
        finally:
            if ids is not None:
                ids.clear()

    def loop_span(self) -> Span | None:
        """The training loop span events go on: traintel's, else one seen in plain OTel spans."""
        return self.loop if self.loop is not None else self.foreign_loop

    def allow_event(self, kind: str, exported: bool = False) -> bool:
        """Caps events of each kind per segment, half of them for iterations not exported."""
        count = self.event_counts.get(kind, 0)
        if count >= (MAX_EVENTS_PER_SEGMENT if exported else MAX_EVENTS_PER_SEGMENT // 2):
            return False
        self.event_counts[kind] = count + 1
        return True

    def _slow_event(self, record: IterationRecord, seconds: float, exported: tuple[int, int] | None) -> None:
        loop = self.loop_span()
        if loop is None or not self.allow_event("slow", exported is not None):
            return
        median = self.sampler.median
        attributes: dict[str, AttributeValue] = {
            semconv.ITERATION: record.iteration,
            semconv.ITERATION_DURATION: seconds,
            semconv.ITERATION_MEDIAN: median,
            semconv.SLOW_FACTOR: seconds / median if median else math.inf,
        }
        loop.add_event(Event.SLOW_ITERATION.value, _with_exported(attributes, exported), record.end_ns)

    def _nonfinite_events(self, record: IterationRecord, exported: tuple[int, int] | None) -> None:
        loop = self.loop_span()
        if loop is None or not record.metrics:
            return
        for name, value in record.metrics.items():
            if math.isfinite(value) or not self.allow_event("nonfinite"):
                continue
            attributes: dict[str, AttributeValue] = {
                semconv.ITERATION: record.iteration,
                semconv.METRIC_NAME: name,
                semconv.METRIC_VALUE: repr(value),
            }
            loop.add_event(Event.NONFINITE_METRIC.value, _with_exported(attributes, exported), record.end_ns)

    def mark_sync_point(self, now_ns: int) -> None:
        """This rank arrives at the iteration's collective: its compute time ends here (the
        first mark of an iteration counts; a DDP hook fires once per gradient bucket)."""
        record = self.active
        if record is not None and record.phase == _TRAINING_ITERATION:
            record.mark_sync(now_ns)

    def nested_in_iteration(self, duration_ns: int) -> None:
        """A categorised phase (a checkpoint save, say) ended inside an iteration of the open
        window: its time is that window's nested badput."""
        self.window.nested_in_running(duration_ns)

    def segment_started(self) -> None:
        """A new trace began: the loop's context answers anew, the event caps start over."""
        self._parent_cache = _NO_PARENT
        self.event_counts = {}

    # --- loops ----------------------------------------------------------------------------------
    def loop_opened(self, phase: str) -> None:
        self.open_loops[phase] = self.open_loops.get(phase, 0) + 1

    def loop_closed(self, phase: str) -> None:
        self.open_loops[phase] = max(0, self.open_loops.get(phase, 0) - 1)

    def outside_loop(self, phase: str, loop: str) -> None:
        """An iteration starts with none of traintel's ``loop`` open: said once, unless a plain
        OpenTelemetry span of that phase is open (someone else's loop)."""
        if not self.open_spans.is_open(loop):
            self.warn_once(
                "outside_loop:" + phase, "%s started outside any %s; recorded where it is", phase, loop
            )

    def shutting_down(self) -> None:
        """Telemetry shuts down between iterations: the open window's iterations close now,
        as a loop's end closes its last window (iterations run outside any training loop had
        nothing else to close it: their last window, all of a short run's, was lost)."""
        self.flush_prelude()
        if self.active is None and self.rows:
            self.windows.close(final=True)

    def training_loop_opened(self, loop: SegmentedSpan, start_ns: int) -> None:
        """The loop's start: its first K iterations are exported, and the global batch is shared
        by the ranks of a process group initialised since the configuration was read."""
        self.apply_config(self.config)
        self.training_thread = _get_ident()
        self.sampler.seen = 0
        self.goodput.started(start_ns)
        self.loop = loop
        self.loop_start_ns = start_ns
        self.segments.loop_opened(loop, start_ns)

    def training_loop_closing(self, loop: SegmentedSpan, end_ns: int) -> None:
        """Last partial window, the at-a-glance summary and the segment marks, before end()."""
        if self.loop is not loop:
            return
        self.flush_prelude()
        self.windows.close(final=True)
        self.window_sink.flush()  # the loop's own numbers are the totals of all its windows
        train_time = (end_ns - self.loop_start_ns) / 1e9 if self.loop_start_ns else None
        summary = self.window_sink.summary(train_time)
        summary.update(self.checkpoints.attributes(semconv.SUMMARY_PREFIX + "checkpoint."))
        summary[semconv.SUMMARY_PREFIX + "segments"] = self.segments.closed + 1
        summary[semconv.SUMMARY_PREFIX + "exported_iterations"] = self.exported_iterations
        summary.update(self.goodput.snapshot(end_ns).attributes(semconv.SUMMARY_PREFIX))
        if self.goodput.ideal_step_time_s is not None:
            summary[semconv.SUMMARY_PREFIX + "step_time.ideal"] = self.goodput.ideal_step_time_s
        if self.rank_export is not None and self.rank_export.anomalies_only:
            summary[semconv.SUMMARY_RANK_EXPORT] = semconv.RANK_EXPORT_ANOMALIES_ONLY
        loop.set_attributes(summary)
        self.segments.loop_closing(loop, end_ns)
        self.loop = None

    def eval_loop_opened(self, phase: str) -> None:
        self.eval_stats[phase] = EvalStats()
        self.next_eval_iteration[phase] = 0
        self.eval_samplers.pop(_EVAL_LOOPS[phase][0], None)

    def eval_loop_closing(self, phase: str, span: Span, duration_s: float) -> None:
        stats = self.eval_stats.pop(phase, None) or EvalStats()
        attributes = stats.attributes(duration_s)
        span.add_event(_EVAL_LOOPS[phase][1], attributes)
        span.set_attributes(attributes)

    # --- checkpoints ----------------------------------------------------------------------------
    def iteration_starting_checkpoint(self) -> SpanContext | None:
        """The span context of the iteration an async checkpoint belongs to, if it is (or will
        be) exported: the running iteration, whose export this forces, else the last one if it
        was exported."""
        record = self.active
        if record is not None and record.phase == _TRAINING_ITERATION:
            record.keep("checkpoint")
            return record.get_span_context()
        return self.last_exported

    def checkpoint_saved(
        self,
        duration_s: float,
        size_bytes: int | None,
        strategy: str,
        target: Span | None,
        iteration: int | None = None,
        failed: bool = False,
    ) -> dict[str, AttributeValue]:
        """Count a save's blocking part; the ``checkpoint_metrics_update`` event goes on
        ``target``: the save span while it is open (ours), else its live parent. A ``failed``
        save cost its time but left no checkpoint a resume could start from."""
        # What a preemption loses: iterations after the last save (``iteration`` = the first
        # iteration a resume from this checkpoint runs; unknown: the one after the last done).
        done = self.last_iteration
        with self.lock:
            if not failed:
                self.last_checkpoint = (
                    iteration if iteration is not None else 0 if done is None else done + 1,
                    clock.time_ns(),
                    duration_s,
                )
            self.checkpoints.add_save(duration_s, size_bytes, strategy)
            attributes: dict[str, AttributeValue] = dict(self.checkpoints.attributes())
        if size_bytes is not None and duration_s > 0:
            attributes[semconv.CHECKPOINT_BYTES_PER_SECOND] = size_bytes / duration_s
        if self.metrics is not None:
            self.metrics.checkpoint_saved(duration_s, size_bytes, strategy)
            if failed:
                phase = semconv.CHECKPOINT_SAVE_PHASE_OF.get(strategy, Phase.CHECKPOINT_SAVE_SYNC)
                self.metrics.checkpoint_failed(phase.value)
        if target is not None:
            target.add_event(Event.CHECKPOINT_METRICS_UPDATE.value, attributes)
        return attributes

    def checkpoint_background_done(
        self, duration_s: float, size_bytes: int | None, failed: bool = False
    ) -> dict[str, AttributeValue]:
        with self.lock:
            self.checkpoints.add_background(duration_s, size_bytes)
            attributes: dict[str, AttributeValue] = dict(self.checkpoints.attributes())
        if self.metrics is not None:
            self.metrics.background_written(size_bytes)
            if failed:
                self.metrics.checkpoint_failed(Phase.CHECKPOINT_FINALIZE.value)
        return attributes

    def checkpoint_unwritten(self, made: ResumePoint, before: ResumePoint) -> None:
        """An async save's writer failed: the resume point its blocking part ``made`` is taken
        back (``before`` it is again), unless a later save has made another since."""
        with self.lock:
            if made is not None and self.last_checkpoint is made:
                self.last_checkpoint = before

    def checkpoint_loaded(self, duration_s: float, end_ns: int, failed: bool = False) -> None:
        if not failed:  # it may have taken the model back to an older step (see _rolled_back)
            self.load_end_ns = max(self.load_end_ns, end_ns)
        with self.lock:
            self.checkpoints.add_load(duration_s)
        if self.metrics is not None:
            self.metrics.checkpoint_loaded(duration_s)
            if failed:
                self.metrics.checkpoint_failed(Phase.CHECKPOINT_LOAD.value)

    def _rolled_back(self, iteration: int) -> None:
        """A checkpoint was loaded since the open window's last iteration, and ``iteration`` is
        numbered at or below that one: the model went back to an older step (a rollback after a
        loss spike). The window closes, so that the iterations run before the load and those
        run again after it are in windows of their own (the analysis counts the progress
        discarded). A load that takes nothing back (numbers going on, a ``torch.load`` of data)
        leaves the window as it is."""
        rows = self.rows
        if not rows:
            return
        last = Row._make(rows[-1])
        if last.end_ns > self.load_end_ns:  # the load came before the window's last iteration
            self.load_end_ns = 0  # (read: not again)
        elif iteration <= last.iteration:
            self.windows.close()

    def checkpoint_stage_done(self, stage: str, duration_s: float) -> None:
        with self.lock:
            self.checkpoints.add_stage(stage, duration_s)

    # --- spans from other instrumentation (plain OTel with ml.training.phase) ----------------------
    def foreign_loop_ended(self, context: SpanContext) -> None:
        """Someone else's training loop ended: its last partial window closes now. The loop span
        is frozen, so that window's event has nowhere to go; its record still parents to it."""
        if self.loop is not None:
            return
        self.foreign_loop = None
        self.windows.close(final=True, ended_loop=NonRecordingSpan(context))

    def next_foreign_iteration(self) -> int:
        """The number a foreign iteration span starting now gets where it carries none: as the
        windows count, but past the last one numbered (one that raised is not counted in the
        windows: the next took its number)."""
        number = max(self.window.iterations_seen, self._foreign_next)
        self._foreign_next = number + 1
        return number

    def foreign_iteration(
        self, span: Any, duration_ns: int, steps: list[int] | None, loop_span: Span | None
    ) -> None:
        """A training iteration span someone else created (and exported): same aggregates."""
        attributes = span.attributes or {}
        if loop_span is not None:
            self.foreign_loop = loop_span
        record = new_record(
            _TRAINING_ITERATION,
            int(attributes.get(semconv.ITERATION, self.window.iterations_seen)),
            span.start_time,
            span.parent or trace_api.INVALID_SPAN_CONTEXT,
        )
        record.add_work(*(number(attributes.get(key)) for key in COUNT_ATTRIBUTES))
        self._rolled_back(record.iteration)
        if span.status.status_code is StatusCode.ERROR:  # it raised: no completed iteration
            record.fail(RuntimeError(span.status.description or "the iteration failed"))
        _foreign_steps_and_metrics(record, steps, attributes)
        context = span.get_span_context()
        self.end_iteration(record, span.start_time + duration_ns, (context.trace_id, context.span_id))


def _foreign_steps_and_metrics(
    record: IterationRecord, steps: list[int] | None, attributes: Mapping[str, object]
) -> None:
    """A foreign iteration's step phase times and its model metrics (attributes by prefix)."""
    for index, duration in enumerate(steps or ()):
        if duration:
            record.add_step_time(index, duration)
    for key, value in attributes.items():
        if key.startswith(_METRIC_PREFIX) and isinstance(value, int | float):
            record.record_metric(key[len(_METRIC_PREFIX) :], float(value))


def _finish(
    span: Span, handle: IterationRecord | StepExtras | None, error: BaseException | None, end_ns: int
) -> None:
    """End a materialized span with what was set on its handle (events, a status) and its error."""
    if handle is not None:
        for name, attributes, timestamp in handle.events or ():
            span.add_event(name, attributes, timestamp)
        if handle.status is not None:
            span.set_status(handle.status)
    if error is not None:
        mark_error(span, error, end_ns)
    span.end(end_time=end_ns)


def _plain(record: IterationRecord) -> bool:
    """Nothing on the iteration or its steps but attributes: what SpanWriter writes."""
    if record.events or record.status is not None or record.error is not None:
        return False
    for _name, _start, _end, error, extras in record.children:
        if error is not None or (extras is not None and (extras.events or extras.status is not None)):
            return False
    return True


def _with_exported(
    attributes: dict[str, AttributeValue], exported: tuple[int, int] | None
) -> dict[str, AttributeValue]:
    if exported is not None:
        attributes[semconv.EXPORTED_TRACE_ID] = format(exported[0], "032x")
        attributes[semconv.EXPORTED_SPAN_ID] = format(exported[1], "016x")
    return attributes


def mark_error(span: Span, error: BaseException, timestamp: int | None) -> None:
    span.record_exception(error, timestamp=timestamp, escaped=True)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
