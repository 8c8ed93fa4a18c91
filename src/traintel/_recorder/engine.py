"""The training engine: the iteration fast path, tail sampling, windows, segments, events.

Why a fast path: a real SDK span costs ~30-60 µs here, four per step would dwarf a small
model's step, and a million-step run must not send four million spans. An iteration on the
fast path is a small record with ``time.time_ns`` timestamps and a span id drawn on first need; the
context of its body is a non-recording span with that id, so user spans nest under it. When the
iteration ends it is aggregated, then exported as real SDK spans (same ids, exact timestamps,
children included) only if the sampling policy keeps it; otherwise it is counted and dropped,
and the export filter drops the user spans it held for it, so nothing is orphaned.

Everything here runs on the training thread and never raises into it: callers wrap calls.
"""

from __future__ import annotations

import logging
import math
import operator
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE
from opentelemetry.util import types
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._aggregation.aggregator import (
    STEP_INDEX,
    EvalStats,
    RateInputs,
    TrainingAggregator,
    WindowReport,
    seconds_of,
)
from traintel._aggregation.export_policy import RankExportPolicy
from traintel._aggregation.goodput import GoodputLedger, WindowGoodput
from traintel._aggregation.sampling import MEDIAN_MIN_SAMPLES, IterationSampler
from traintel._host.device import AutocastProbe, DeviceHooks, annotate_window, device_hooks
from traintel._host.flops import autocast_dtype, current_device_name, peak_flops_for
from traintel._sdk.attributes import as_number, clean_value
from traintel._sdk.export_filter import IterationExportFilter, TraceBudget
from traintel._sdk.fastctx import current_span as _current_span
from traintel._sdk.ids import ForcingIdGenerator, new_span_id, new_trace_id
from traintel._sdk.instruments import TrainingInstruments
from traintel._sdk.sdkfast import add_clean_event, set_clean_attributes
from traintel._sdk.segments import SegmentedSpan
from traintel.config import TrainingConfig
from traintel.exporters.health import HEALTH
from traintel.semconv import Event, Phase

_logger = logging.getLogger("traintel")

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_TRAINING_ITERATION = Phase.TRAINING_ITERATION.value
_new_tuple = tuple.__new__
_PLAIN = (str, bool, int, float)
_getrandbits = random.getrandbits
_new_record = object.__new__
_get_ident = threading.get_ident
_TRAINING_METRICS_UPDATE = Event.TRAINING_METRICS_UPDATE.value
_WINDOW_FLOPS_PER_DEVICE = semconv.WINDOW_PREFIX + "flops_per_second_per_device"
_FP32_ASSUMED = (
    " (the peak is fp32's: no autocast was active at the start of an iteration or step phase in"
    " the first window; set TRAINTEL_DTYPE, e.g. bf16, when the model computes in another dtype)"
)
_DURATION_NS = operator.itemgetter(0)  # of a window row


def _span_context(trace_id: int, span_id: int, flags: TraceFlags) -> SpanContext:
    """A local SpanContext without re-validating ids we generated (saves ~1 µs per step)."""
    return _new_tuple(SpanContext, (trace_id, span_id, False, flags, DEFAULT_TRACE_STATE, True))  # type: ignore[no-any-return]


def _checked_fast_path() -> bool:
    fast = _span_context(1, 2, _SAMPLED)
    slow = SpanContext(1, 2, False, _SAMPLED)
    return fast == slow and fast.is_valid and fast.trace_state is slow.trace_state


if not _checked_fast_path():  # an API release changed SpanContext's layout: build it normally

    def _span_context(trace_id: int, span_id: int, flags: TraceFlags) -> SpanContext:
        return SpanContext(trace_id, span_id, False, flags)


class Terminated(Exception):
    """Why a span was cut short by a terminating signal; its message is the end reason
    (``traintel.end_reason``), set on every span ended with it."""


class OpenStep(Protocol):
    """A step phase open in an iteration (``IterationSpan.open_step``) or outside any
    (``TrainingEngine.open_step``, ``record`` None): at a terminating signal it is ended there,
    with ``Terminated``."""

    def cut(self, record: IterationSpan | None, error: Terminated, end_ns: int) -> None: ...


#: Iteration attributes that are the step's work counts (IterationSpan fields).
_COUNT_ATTRIBUTES: Final = {
    semconv.SAMPLES: "samples",
    semconv.TOKENS: "tokens",
    semconv.PADDING_TOKENS: "padding",
    semconv.FLOPS: "flops",
}
#: Events of one kind (slow_iteration, nonfinite_metric) per segment at most; the rest are
#: counted in the window events. The SDK keeps only the newest 128 events of a span.
MAX_EVENTS_PER_SEGMENT = 20
#: Fraction of the trace budget at which a segment is closed early, and at which we warn.
BUDGET_ROTATE = 0.9
#: Estimated bytes kept free in a trace for one more exported iteration: an evaluation loop,
#: which cannot rotate the segment, stops exporting when they run out.
ROOM_BYTES = 4096


class IterationSpan(NonRecordingSpan):
    """One iteration on the fast path (training, validation or testing) — and the span handle
    its body sees.

    Its context is the iteration's pre-allocated one, so spans started inside nest under it;
    attributes, events and status set on it are kept here and appear on the SDK span if the
    iteration is exported. Defaults live on the class, so creating a record sets only what
    every iteration has: this runs once per step and every attribute store counts.

    Two flags keep the end of a plain iteration to two tests: ``counted`` (work counts were
    reported on it) and ``notable`` (anything that may export or flag it: a head reason, an
    error, a non-finite metric, user spans held for it, a real span). Whatever sets one of
    those fields sets the flag too.
    """

    end_ns = 0
    span_id = 0
    trace_id = 0
    samples: float | None = None
    tokens: float | None = None
    padding: float | None = None
    flops: float | None = None
    micro_batches = 0
    metrics: dict[str, float] | None = None
    attributes: dict[str, AttributeValue] | None = None
    error: BaseException | None = None
    nonfinite = False
    head_reason: str | None = None
    filtered = False
    events: list[tuple[str, dict[str, AttributeValue], int]] | None = None
    status: Status | None = None
    context: object = None  # the Context object attached for the body
    step_spans = False
    counted = False  # samples / tokens / padding / FLOPs were reported (instance value, always set)
    notable = False  # see the class docstring (instance value, always set)
    materializing = False
    real_span: Span | None = None  # "all" mode: the SDK span the iteration is while it runs
    real_context: object = None  # "all" mode: the Context attached for the body
    sampled = False  # the trace flag user spans inside inherit
    _span_context: SpanContext | None = None
    # The step phase entered last (one store per step; a per-use one is open while its own
    # record is still set, a shared one while it is open in this record): what a terminating
    # signal ends with the iteration.
    open_step: OpenStep | None = None

    # Built by iteration_record (no type call into a Python __init__: one per step).
    phase: str
    iteration: int
    start_ns: int
    parent: SpanContext
    children: list[tuple[str, int, int, BaseException | None]]
    phase_ns: list[int]

    # --- the Span API a user sees inside the iteration ---------------------------------------------
    def get_span_context(self) -> SpanContext:
        # Built on first use: most iterations are never asked (no user span, not exported).
        context = self._span_context
        if context is None:
            if not self.span_id:
                self.assign_ids()
            context = self._span_context = _span_context(
                self.trace_id, self.span_id, _SAMPLED if self.sampled else _NOT_SAMPLED
            )
        return context

    def assign_ids(self) -> None:
        """Draw the iteration's span id (and its trace id: the parent's, or a new one for a root)
        on first need: most iterations are never asked (no user span, not exported)."""
        parent = self.parent
        self.trace_id = parent[0] if parent[5] else new_trace_id()  # SpanContext.is_valid
        self.span_id = _getrandbits(64) or new_span_id()

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
        count = _COUNT_ATTRIBUTES.get(key)
        if count is not None:  # the step's work set as an attribute counts, as on a plain OTel span
            setattr(self, count, _num(value))
            self.counted = True

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        if self.events is None:
            self.events = []
        if len(self.events) < 128:
            self.events.append((name, dict(attributes or {}), timestamp or time.time_ns()))

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self.status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        self.error = exception
        self.notable = True

    def __repr__(self) -> str:
        return f"IterationSpan({self.phase!r}, iteration={self.iteration})"

    def add_step_time(self, phase: str, duration_ns: int) -> None:
        """A step phase that ran as a real span (nested under a user span): time only."""
        index = STEP_INDEX.get(phase)
        if index is not None:
            self.phase_ns[index] += duration_ns
            self.step_spans = True

    def add_work(
        self, samples: float | None, tokens: float | None, padding: float | None, flops: float | None
    ) -> None:
        """Micro-batch counts are summed into the step (never counted per micro-batch)."""
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


def iteration_record(phase: str, iteration: int, start_ns: int, parent: SpanContext) -> IterationSpan:
    """A new iteration record: what every iteration has; the rest are class defaults.
    ``begin_iteration`` repeats these stores to save a call per step; a test
    (``tests/test_fast_path_twins.py``) keeps the two alike."""
    record: IterationSpan = _new_record(IterationSpan)
    record.phase = phase
    record.iteration = iteration
    record.start_ns = start_ns
    record.parent = parent
    record.children = []
    record.phase_ns = [0, 0, 0, 0]
    # Read on every iteration's end: instance values are read faster than class defaults.
    record.metrics = None
    record.counted = record.notable = False
    return record


class _EventBudget:
    """Caps events of each kind per segment."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def allow(self, kind: str) -> bool:
        count = self.counts.get(kind, 0)
        self.counts[kind] = count + 1
        return count < MAX_EVENTS_PER_SEGMENT


class TrainingEngine:
    """State of the running job's training loop(s); one per configured Telemetry."""

    def __init__(
        self,
        config: TrainingConfig,
        tracer: trace_api.Tracer,
        ids: ForcingIdGenerator | None,
        export_filter: IterationExportFilter | None,
        budget: TraceBudget,
        instruments: TrainingInstruments | None,
        world_size: int,
        warn_once: Any,
    ) -> None:
        self.tracer = tracer
        self.ids = ids
        self.export_filter = export_filter
        self.budget = budget
        self.instruments = instruments
        self.world_size = max(1, world_size)
        self.warn_once = warn_once
        self.lock = threading.RLock()
        self.active: IterationSpan | None = None
        self.active_thread = 0
        #: The step phase entered last outside any iteration (a ``data_loading`` before the
        #: iteration opens): what a terminating signal ends, if it is still open.
        self.open_step: OpenStep | None = None
        self.app: SegmentedSpan | None = None
        self.loop: SegmentedSpan | None = None
        self.eval_stats: dict[str, EvalStats] = {}
        self.eval_samplers: dict[str, IterationSampler] = {}
        self.foreign_loop: Span | None = None
        self.last_exported: SpanContext | None = None  # the last training iteration, if exported
        self.loop_start_ns = 0
        self.rotate_pending = False
        self.materializing = 0  # the thread materialising an exported iteration, if any
        if export_filter is not None:
            export_filter.active_iteration = lambda: self.active
        self.samples_total = 0.0
        # The heartbeat's progress stamp (read on the metric reader's thread).
        self.last_iteration_end_ns = 0
        self.last_iteration = -1
        self.last_checkpoint: tuple[int, int, float] | None = None  # (iteration, end ns, seconds)
        self.tokens_total = 0.0
        self.events = _EventBudget()
        self.segments_closed = 0
        self.goodput = GoodputLedger()
        self._dtype_seen: str | None = None
        self._dtype_assumed = False  # the table's peak is fp32's for want of a dtype
        self._device_lookup: tuple[float | None, str | None, str | None] | None = None
        # Called with every closed window (None: nothing to close) and whether the loop ends.
        self.window_hook: Callable[[WindowReport | None, bool], None] | None = None
        # What this rank exports (None: not decided yet, everything); see set_rank_export.
        self.rank_export: RankExportPolicy | None = None
        # The parent SpanContext of the last iteration and the Context it was read from (a
        # Context is immutable; only a segment rotation changes what its span answers).
        self._parent_cache: tuple[object, SpanContext, bool] = (None, trace_api.INVALID_SPAN_CONTEXT, True)
        self._window_parent: tuple[Span | None, Context] = (None, Context())
        HEALTH.report_zeros = True  # until a scale-mode decision says otherwise
        self.window_events = True  # training_metrics_update: read once per window
        self._median_rows = 0  # rows of the open window already in sampler.recent
        self.apply_config(config)
        # CUDA-event timing / NVTX at phase boundaries: None (one `is None` test) unless asked for.
        self.device: DeviceHooks | None = device_hooks(config, warn_once)
        # Until the compute dtype is known, phase starts look at autocast (a CUDA build of torch
        # imported, no dtype or peak configured): see AutocastProbe.
        self._dtype_probing = (
            getattr(getattr(sys.modules.get("torch"), "version", None), "cuda", None) is not None
            and config.get("dtype") is None
            and config.get("peak_flops") is None
        )
        if self._dtype_probing:
            self.device = AutocastProbe(self.device, self._dtype_found)

    def _dtype_found(self, dtype: str) -> None:
        self._dtype_seen = dtype
        self._end_dtype_probe()

    def _end_dtype_probe(self) -> None:
        """Back to the plain device hooks: the per-step cost of probing ends here."""
        self._dtype_probing = False
        device = self.device
        if isinstance(device, AutocastProbe):
            self.device = device.hooks

    # --- configuration --------------------------------------------------------------------------
    def apply_config(self, config: TrainingConfig) -> None:
        """(Re)read the knobs; called at start, on set_training_config, and at window ends."""
        self.config = config
        self._lazy_config = config.has_lazy  # callables re-read at every window close
        self._rate_inputs: RateInputs | None = None
        self.export_all = config.get("export_iterations") == "all"
        self.window_size = int(config.get("log_every_n_iterations"))
        if not hasattr(self, "aggregator"):
            self.aggregator = TrainingAggregator(self.window_size, int(config.get("warmup_iterations")))
            self._rows = self.aggregator.rows  # stable: emptied in place at each window close
            self.sampler = IterationSampler(
                str(config.get("export_iterations")),
                int(config.get("export_first_iterations")),
                int(config.get("export_every_n_iterations")),
                float(config.get("slow_iteration_factor")),
            )
        self.aggregator.window_size = self.window_size
        self._set_rows_mark()
        sampler = self.sampler  # the export policy can change mid-run (set_training_config)
        sampler.policy = str(config.get("export_iterations"))
        sampler.first = int(config.get("export_first_iterations"))
        sampler.every_n = int(config.get("export_every_n_iterations"))
        factor = float(config.get("slow_iteration_factor"))
        if factor != sampler.slow_factor:
            sampler.slow_factor = factor
            self._catch_up_median()  # the median of the last 101 durations, as at a window close
            sampler.refresh()
        if self.rank_export is not None and not self.rank_export.routine_iterations:
            self._stop_routine_sampling()
        global_batch = config.get("global_batch_size")
        self.default_samples: float | None = global_batch / self.world_size if global_batch else None
        self.seq_len: int | None = config.get("seq_len")
        self.flops_per_token: float | None = config.get("flops_per_token")
        self.flops_per_sample: float | None = config.get("flops_per_sample")
        # Without a default batch, a step that reports nothing has nothing derived (_counts).
        self._derives_counts = self.default_samples is not None
        self.segment_iterations = int(config.get("segment_iterations"))
        self.segment_ns = int(float(config.get("segment_seconds")) * 1e9)
        self.max_spans = int(config.get("max_spans_per_trace"))
        self.max_bytes = int(config.get("max_bytes_per_trace"))
        # Where a segment is due to rotate: at BUDGET_ROTATE of the budget, or sooner under a
        # small budget, so that a training loop rotates before its ROOM_BYTES run out.
        self.rotate_bytes = min(BUDGET_ROTATE * self.max_bytes, self.max_bytes - 2 * ROOM_BYTES)

    def set_rank_export(self, policy: RankExportPolicy) -> None:
        """Apply what this rank exports; the first decision stands (scale mode is decided once
        per job), later calls are ignored. Nothing of it is read per iteration."""
        if self.rank_export is not None:
            return
        self.rank_export = policy
        self.window_events = policy.window_events
        if not policy.routine_iterations:
            self._stop_routine_sampling()
        if not policy.window_series and self.instruments is not None:
            self.instruments.stop_window_series()
        HEALTH.report_zeros = not policy.anomalies_only  # self-telemetry: only what went wrong

    def _stop_routine_sampling(self) -> None:
        """No head reasons (first K, every M-th, "all"): only tail reasons export an iteration.
        Set once on the samplers the fast path already reads, so it costs nothing per step."""
        for sampler in (self.sampler, *self.eval_samplers.values()):
            sampler.first = sampler.every_n = 0
            if sampler.policy == "all":
                sampler.policy = "sampled"
        self.export_all = False

    def rate_inputs(self) -> RateInputs:
        config = self.config
        method = config.get("flops_method")
        if method is None:
            lazy = config.is_lazy("flops_per_sample") or config.is_lazy("flops_per_token")
            method = "callable" if lazy else "config"
        executed = config.get("executed_flops_per_sample")
        model = config.get("flops_per_sample")
        ratio = executed / model if executed and model else None
        peak = config.get("peak_flops")
        if peak is not None:
            return RateInputs(self.world_size, peak, "config (TRAINTEL_PEAK_FLOPS)", None, method, ratio)
        peak, source, reason = self._device_peak()
        return RateInputs(self.world_size, peak, source, reason, method, ratio)

    def _device_peak(self) -> tuple[float | None, str | None, str | None]:
        """The table's peak for the device and dtype, looked up at the first window close
        where the device is known (the job initialised CUDA) and kept from then on; the
        dtype is the configured one, else autocast's as seen so far, else fp32."""
        if self._device_lookup is not None:
            return self._device_lookup
        self._end_dtype_probe()
        device = current_device_name()
        if device is None:
            return (None, None, "no GPU: set TRAINTEL_PEAK_FLOPS to compute MFU on this device")
        dtype = self.config.get("dtype") or self._dtype_seen
        self._dtype_assumed = dtype is None
        found = peak_flops_for(device, dtype or "fp32")
        self._device_lookup = (found.peak_flops, found.source, found.reason)
        return self._device_lookup

    # --- iterations: the fast path --------------------------------------------------------------
    def begin_iteration(
        self,
        phase: str,
        iteration: int,
        start_ns: int,
        attributes: Mapping[str, AttributeValue] | None,
        context: Context,
    ) -> IterationSpan:
        """The record (and span handle) of an iteration whose body starts now in ``context``."""
        if self.rotate_pending and phase == _TRAINING_ITERATION:
            # Rotated at the start of the next iteration, never after the last one.
            self.rotate_pending = False
            self.rotate(start_ns)
        # The parent and whether it is sampled (or none: a root), cached with the Context they
        # were read from (immutable; only a segment rotation changes what its span answers).
        # One tuple: two threads never pair a context with another's parent.
        cached = self._parent_cache
        if context is not cached[0]:  # not the loop's context of the previous iteration
            parent = _current_span(context).get_span_context()
            cached = self._parent_cache = (context, parent, not parent.is_valid or parent.trace_flags.sampled)
        parent = cached[1]
        record: IterationSpan = _new_record(IterationSpan)  # iteration_record, inlined (one per step)
        record.phase = phase
        record.iteration = iteration
        record.start_ns = start_ns
        record.parent = parent
        record.children = []
        record.phase_ns = [0, 0, 0, 0]
        record.metrics = None
        record.counted = record.notable = False
        if attributes:
            record.attributes = dict(attributes)
            samples = attributes.get(semconv.SAMPLES)
            tokens = attributes.get(semconv.TOKENS)
            if samples is not None or tokens is not None:
                record.add_work(_num(samples), _num(tokens), None, None)
                record.micro_batches = 0
        sampler = self.sampler
        if phase == _TRAINING_ITERATION:
            index = sampler.seen
            sampler.seen = index + 1
            if (
                index < sampler.first
                or sampler.policy != "sampled"
                or (sampler.every_n and not iteration % sampler.every_n)
            ):  # a head reason, maybe (the common case is decided inline: none)
                sampler.seen = index
                reason = record.head_reason = sampler.head(iteration)
                if reason is not None:
                    record.notable = True
            if self._dtype_probing:  # plain-OpenTelemetry iterations pass no device hook
                dtype = autocast_dtype()
                if dtype is not None:
                    self._dtype_found(dtype)
        else:
            reason = record.head_reason = self._eval_sampler(phase).head(iteration)
            if reason is not None:
                record.notable = True
        # Ids are drawn on first need (IterationSpan.assign_ids). The trace flag user spans
        # inside inherit, under a sampled parent (or none): with traintel's providers, sampled
        # (the filter holds them until the decision; it registers the iteration on the first
        # one) unless the policy is "none"; with the user's own pipeline, the head decision
        # (ParentBased samplers follow it).
        if cached[2]:
            if self.export_filter is not None:
                record.sampled = sampler.policy != "none"
            else:
                record.sampled = record.head_reason is not None
        self.active = record
        self.active_thread = _get_ident()
        return record

    def _set_rows_mark(self) -> None:
        """Where end_iteration next looks up from appending rows: the window's end, or sooner
        while the slow threshold still waits for its first MEDIAN_MIN_SAMPLES durations."""
        missing = MEDIAN_MIN_SAMPLES - len(self.sampler.recent)
        mark = self.window_size
        if missing > 0:
            mark = min(mark, self._median_rows + missing)
        self._rows_mark = mark

    def _catch_up_median(self) -> None:
        """Add the open window's durations not yet in the slow threshold's recent ones."""
        rows = self._rows
        if len(rows) > self._median_rows:
            self.sampler.recent.extend(seconds_of(map(_DURATION_NS, rows[self._median_rows :])))
            self._median_rows = len(rows)

    def _start_median(self) -> None:
        """The job's first durations for the slow threshold ended inside the open window: it
        starts from them now (the window close adds the rest of the window's)."""
        self._catch_up_median()
        self.sampler.refresh()
        self._set_rows_mark()

    def _eval_sampler(self, phase: str) -> IterationSampler:
        sampler = self.eval_samplers.get(phase)
        if sampler is None:
            sampler = self.eval_samplers[phase] = IterationSampler(
                self.sampler.policy, self.sampler.first, self.sampler.every_n, self.sampler.slow_factor
            )
        return sampler

    def end_iteration(
        self,
        record: IterationSpan,
        error: BaseException | None,
        end_ns: int,
        exported_as: tuple[int, int] | None = None,
    ) -> None:
        """Aggregate an ended iteration and decide whether it is exported.

        ``exported_as`` marks a span someone else already exported (a plain-OTel iteration seen
        by the processor): it is aggregated the same way, with no decision to take. This is the
        per-step hot path: the common case (counted, not exported) reads each field once and
        calls nothing but the row append; anything unusual goes to :meth:`_export_decision`.
        """
        record.end_ns = end_ns
        record.context = None  # the body's Context holds the record: break the cycle for refcounting
        if self.active is record:
            self.active = None
        if error is not None:
            record.error = error
            record.notable = True
        duration_ns = end_ns - record.start_ns
        if record.notable and record.real_span is not None:
            _take_counts(record, record.real_span)  # "all" mode: the body saw the SDK span, not the record
        if record.phase != _TRAINING_ITERATION:
            self._end_eval_iteration(record, duration_ns)
            return
        iteration = record.iteration
        self.last_iteration_end_ns = end_ns
        self.last_iteration = iteration
        phases = record.phase_ns if record.children or record.step_spans else None
        rows = self._rows  # the window's rows (TrainingAggregator.rows): one row per iteration
        if record.counted or self._derives_counts:
            samples, tokens, flops = self._counts(record)
            if samples is not None:
                self.samples_total += samples
            if tokens is not None:
                self.tokens_total += tokens
            rows.append((duration_ns, samples, tokens, record.padding, flops, phases, iteration, end_ns))
        else:  # no work reported or derived
            rows.append((duration_ns, None, None, None, None, phases, iteration, end_ns))
        if record.metrics:
            for name, value in record.metrics.items():
                self.aggregator.add_model_metric(name, value)
        at_mark = len(rows) >= self._rows_mark
        if at_mark and len(self.sampler.recent) < MEDIAN_MIN_SAMPLES:
            # The job's first MEDIAN_MIN_SAMPLES durations: the threshold starts before this one
            # is tested (each later window's refresh comes after its last iteration's test).
            self._start_median()
        slow = duration_ns >= self.sampler.threshold_ns
        if slow or record.notable or exported_as is not None:
            exported = self._export_decision(record, exported_as, slow, duration_ns / 1e9)
        else:  # the common case: counted, not exported
            exported = self.last_exported = None
        loop = self.loop
        if loop is not None:  # the segment's iteration range
            in_segment = loop.segment_iterations = loop.segment_iterations + 1
            if loop.segment_first_iteration is None:
                loop.segment_first_iteration = iteration
            loop.segment_last_iteration = iteration
        if at_mark and len(rows) >= self.window_size:
            self.close_window()
        if loop is not None:
            if exported is not None and exported_as is None:  # exports fill the trace: check now
                self._check_budget(end_ns)
            if in_segment >= self.segment_iterations or end_ns - loop.segment_start_ns >= self.segment_ns:
                self.rotate_pending = True  # done at the start of the next iteration
            elif in_segment % 16 == 0:  # the budget, every 16 iterations too
                self._check_budget(end_ns)

    def _export_decision(
        self, record: IterationSpan, exported_as: tuple[int, int] | None, slow: bool, seconds: float
    ) -> tuple[int, int] | None:
        """A training iteration that is slow, failed, non-finite, sampled at its head, holds
        user spans or was exported by someone else: decide, flag, and emit its events."""
        sampler = self.sampler
        exported = exported_as
        if exported_as is None:
            reason = sampler.tail(record.head_reason, slow, record.error is not None, record.nonfinite)
            if reason is not None:
                reason = self._within_budget(reason)
            if reason is not None or record.filtered or record.real_span is not None:
                exported = self._decide(record, reason)
        if record.nonfinite or slow or exported is not None:
            self.aggregator.flag(record.nonfinite, slow, exported is not None)
        self.last_exported = (
            _span_context(exported[0], exported[1], _SAMPLED) if exported is not None else None
        )
        if slow:
            self._slow_event(record, seconds, sampler.median, exported)
        if record.nonfinite:
            self._nonfinite_events(record, exported)
        if exported is not None and self.instruments is not None:
            self.instruments.exported_iterations += 1
        return exported

    def _counts(self, record: IterationSpan) -> tuple[float | None, float | None, float | None]:
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

    def _end_eval_iteration(self, record: IterationSpan, duration_ns: int) -> None:
        loop_phase = semconv.LOOP_OF_ITERATION[Phase(record.phase)].value
        stats = self.eval_stats.get(loop_phase)
        if stats is None:
            stats = self.eval_stats[loop_phase] = EvalStats()
        stats.add_iteration(duration_ns, record.samples)
        if record.metrics:
            for name, value in record.metrics.items():
                stats.add_metric(name, value)
        sampler = self._eval_sampler(record.phase)
        reason = sampler.tail(record.head_reason, False, record.error is not None, record.nonfinite)
        self._decide(record, self._within_budget(reason))

    def _within_budget(self, reason: str | None) -> str | None:
        """Errors always go out; anything else only while the current trace has room."""
        if reason is None or reason in ("error", "nonfinite"):
            return reason
        if self.trace_has_room():
            return reason
        # Full before the segment could rotate (a long validation loop inside it, say): the
        # next training iteration starts a new segment; until then iterations are only counted.
        self.rotate_pending = True
        self.warn_once(
            "budget_full",
            "trace span/byte budget reached before the segment could be rotated (inside a long "
            "evaluation loop?); iterations until the next training iteration are counted but "
            "not exported",
        )
        return None

    def trace_has_room(self) -> bool:
        """Room in the current segment's trace for one more exported iteration."""
        loop = self.loop
        if loop is None:
            return True
        spans, size = self.budget.usage(loop.get_span_context().trace_id)
        size += self._open_bytes(loop) + ROOM_BYTES
        return spans + 8 <= self.max_spans and size <= self.max_bytes

    # --- "all" mode: every iteration is a real span from the start --------------------------------
    def start_real_iteration(self, record: IterationSpan, context: Context) -> Span:
        """With every iteration exported there is nothing to defer: the iteration is an SDK span
        while it runs (its step phases and the user's spans nest as usual), and the record only
        carries the numbers for the aggregates."""
        attributes: dict[str, AttributeValue] = {
            semconv.PHASE: record.phase,
            semconv.ITERATION: record.iteration,
        }
        if record.head_reason is not None:  # known now ("all"): one attribute fewer to set at the end
            attributes[semconv.SAMPLING_REASON] = record.head_reason
        span = self.tracer.start_span(
            record.phase, context=context, attributes=attributes, start_time=record.start_ns
        )
        record.real_span = span
        record.notable = True
        record.materializing = True  # not a deferred iteration: the filter holds nothing for it
        record.span_id = span.get_span_context().span_id
        return span

    def _finish_real(self, record: IterationSpan, reason: str | None) -> tuple[int, int] | None:
        span = record.real_span
        if span is None:
            return None
        attributes = self._span_attributes(record, reason or "all")
        del attributes[semconv.PHASE], attributes[semconv.ITERATION]
        if attributes.get(semconv.SAMPLING_REASON) == record.head_reason:
            del attributes[semconv.SAMPLING_REASON]  # set at the start
        if attributes:
            set_clean_attributes(span, attributes)  # plain values, or the public API cleans them
        _finish_span(span, record)
        context = span.get_span_context()
        return (context.trace_id, context.span_id) if context.trace_flags.sampled else None

    def _decide(self, record: IterationSpan, reason: str | None) -> tuple[int, int] | None:
        """Release or drop what the filter held, and materialise the iteration if kept."""
        if record.real_span is not None:
            return self._finish_real(record, reason)
        if record.filtered and self.export_filter is not None:
            self.export_filter.close_iteration(record.span_id, reason is not None)
        if reason is None:
            return None
        if not (record.parent.trace_flags.sampled if record.parent.is_valid else True):
            return None
        return self._materialize(record, reason)

    @staticmethod
    def _span_attributes(record: IterationSpan, reason: str) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = dict(record.attributes or {})
        attributes[semconv.PHASE] = record.phase
        attributes[semconv.ITERATION] = record.iteration
        attributes[semconv.SAMPLING_REASON] = reason
        if record.samples is not None:
            attributes[semconv.SAMPLES] = record.samples
        if record.tokens is not None:
            attributes[semconv.TOKENS] = record.tokens
        if record.padding is not None:
            attributes[semconv.PADDING_TOKENS] = record.padding
        if record.flops is not None:
            attributes[semconv.FLOPS] = record.flops
        if record.micro_batches > 1:
            attributes[semconv.MICRO_BATCHES] = record.micro_batches
        if record.metrics:
            for name, value in record.metrics.items():
                attributes[semconv.METRIC_PREFIX + name] = value
        return attributes

    def _materialize(self, record: IterationSpan, reason: str) -> tuple[int, int] | None:
        parent = record.parent
        context = trace_api.set_span_in_context(NonRecordingSpan(parent)) if parent.is_valid else Context()
        attributes = self._span_attributes(record, reason)
        self.materializing = threading.get_ident()  # the processor skips these: already counted
        try:
            return self._materialize_spans(record, context, attributes)
        finally:
            self.materializing = 0

    def _materialize_spans(
        self, record: IterationSpan, context: Context, attributes: dict[str, AttributeValue]
    ) -> tuple[int, int]:
        tracer = self.tracer
        parent = record.parent
        ids = self.ids
        if not record.span_id:
            record.assign_ids()
        if ids is not None:
            ids.force(record.span_id, None if parent.is_valid else record.trace_id)
        try:
            span = tracer.start_span(
                record.phase, context=context, attributes=attributes, start_time=record.start_ns
            )
        finally:
            if ids is not None:
                ids.clear()
        child_context = trace_api.set_span_in_context(span)
        for name, start_ns, end_ns, child_error in record.children:
            child = tracer.start_span(
                name, context=child_context, attributes={semconv.PHASE: name}, start_time=start_ns
            )
            if child_error is not None:
                mark_error(child, child_error, end_ns)
                if isinstance(child_error, Terminated):
                    child.set_attribute(semconv.END_REASON, str(child_error))
            child.end(end_time=end_ns)
        _finish_span(span, record)
        context_out = span.get_span_context()
        return (context_out.trace_id, context_out.span_id)

    def _loop_span_for(self, record: IterationSpan | None = None) -> Span | None:
        return self.loop if self.loop is not None else self.foreign_loop

    def _slow_event(
        self, record: IterationSpan, seconds: float, median: float, exported: tuple[int, int] | None
    ) -> None:
        loop = self._loop_span_for(record)
        if loop is None or not self.events.allow("slow"):
            return
        attributes: dict[str, AttributeValue] = {
            semconv.ITERATION: record.iteration,
            semconv.ITERATION_DURATION: seconds,
            semconv.ITERATION_MEDIAN: median,
            semconv.SLOW_FACTOR: seconds / median if median else math.inf,
        }
        if exported is not None:
            attributes[semconv.EXPORTED_TRACE_ID] = format(exported[0], "032x")
            attributes[semconv.EXPORTED_SPAN_ID] = format(exported[1], "016x")
        loop.add_event(Event.SLOW_ITERATION.value, attributes, timestamp=record.end_ns)

    def _nonfinite_events(self, record: IterationSpan, exported: tuple[int, int] | None) -> None:
        loop = self._loop_span_for(record)
        if loop is None or not record.metrics:
            return
        for name, value in record.metrics.items():
            if math.isfinite(value) or not self.events.allow("nonfinite"):
                continue
            attributes: dict[str, AttributeValue] = {
                semconv.ITERATION: record.iteration,
                semconv.METRIC_NAME: name,
                semconv.METRIC_VALUE: repr(value),
            }
            if exported is not None:
                attributes[semconv.EXPORTED_TRACE_ID] = format(exported[0], "032x")
                attributes[semconv.EXPORTED_SPAN_ID] = format(exported[1], "016x")
            loop.add_event(Event.NONFINITE_METRIC.value, attributes, timestamp=record.end_ns)

    # --- model metrics --------------------------------------------------------------------------
    def record_metric(self, record: IterationSpan, name: str, value: float) -> None:
        metrics = record.metrics
        if metrics is None:
            metrics = record.metrics = {}
        metrics[name] = value
        if not math.isfinite(value):
            record.nonfinite = record.notable = True

    # --- windows --------------------------------------------------------------------------------
    def close_window(self, final: bool = False, ended_loop: Span | None = None) -> WindowReport | None:
        inputs = self._rate_inputs
        if inputs is None or self._lazy_config or (inputs.peak_flops is None and self._device_lookup is None):
            inputs = self._rate_inputs = self.rate_inputs()  # the device may be known now
        # The window's durations not yet in the slow threshold's recent ones: from the report, or
        # from the rows if the report fails (the aggregator empties the window either way).
        added = self._median_rows
        pending = self._rows[added:]
        report = None
        try:
            report = self.aggregator.close_window(inputs)
        finally:
            if report is not None:
                self.sampler.recent.extend(report.durations[added:])
            else:
                self.sampler.recent.extend(seconds_of(map(_DURATION_NS, pending)))
            self._median_rows = 0
            self._set_rows_mark()
        if report is not None and self.instruments is not None:
            self.instruments.defer_window(report.durations, report.data_loading_durations)
        self.sampler.refresh()
        if self.window_hook is not None:
            self.window_hook(report, final)
        if report is None:
            if final:
                self._export_windows(self.goodput.flush_held(), ended_loop)
            return None
        annotate_window(report.attributes, self.device)
        self._export_windows(self.goodput.close_window(report, inputs.peak_flops, final), ended_loop)
        if self._lazy_config:
            self.apply_config(self.config)  # lazy values are re-resolved once per window
        if inputs.peak_flops is None and report.attributes.get(_WINDOW_FLOPS_PER_DEVICE):
            self.warn_once("no_peak", "no MFU: %s", inputs.peak_missing_reason or "unknown peak FLOP/s")
        loop = self._loop_span_for()
        if loop is not None and self.window_events:
            if isinstance(loop, SegmentedSpan):
                loop.add_clean_event(_TRAINING_METRICS_UPDATE, report.attributes)
            else:
                add_clean_event(loop, _TRAINING_METRICS_UPDATE, report.attributes)
            for error in report.errors:
                loop.add_event(
                    Event.METRIC_OUT_OF_RANGE.value,
                    {
                        semconv.ERROR_REASON: error,
                        semconv.MFU_NUMERATOR: report.attributes.get(_WINDOW_FLOPS_PER_DEVICE, 0.0),
                        semconv.MFU_DENOMINATOR: inputs.peak_flops or 0.0,
                        semconv.MFU_PEAK_SOURCE: inputs.peak_source or "",
                    },
                )
        for error in report.errors:
            self.warn_once(
                "out_of_range",
                "%s: check flops_per_* and the peak FLOP/s%s (not reported as a metric)",
                error,
                _FP32_ASSUMED if self._dtype_assumed else "",
            )
        return report

    def _export_windows(self, windows: list[WindowGoodput], ended_loop: Span | None) -> None:
        """Each window's goodput record as a ``training_window`` span, exported at once (not
        with the segment), so a job killed mid-segment loses at most its open window. Its
        parent is the loop segment holding it (``ended_loop``: a foreign loop that just ended)."""
        if not windows:
            return
        loop = self._loop_span_for()
        parent = loop.current if isinstance(loop, SegmentedSpan) else loop
        if parent is None:
            parent = ended_loop
        cached = self._window_parent  # the segment's context, built once per segment
        if cached[0] is not parent or parent is None:
            cached = self._window_parent = (
                parent,
                trace_api.set_span_in_context(parent) if parent is not None else Context(),
            )
        context = cached[1]
        # The metrics processor skips these, as it skips materialised iterations: they are
        # traintel's own records, with nothing in them to count (the trace budget still is).
        materializing, self.materializing = self.materializing, _get_ident()
        try:
            for window in windows:
                # Started without attributes, then given them uncleaned: they are traintel's numbers.
                span = self.tracer.start_span(
                    semconv.TRAINING_WINDOW_SPAN, context=context, start_time=window.start_ns
                )
                set_clean_attributes(span, window.attributes())
                span.end(end_time=max(window.end_ns, window.start_ns))
        finally:
            self.materializing = materializing

    # --- segments -------------------------------------------------------------------------------
    def _check_budget(self, now_ns: int) -> None:
        loop = self.loop
        if loop is None:
            return
        spans, size = self.budget.usage(loop.get_span_context().trace_id)
        size += self._open_bytes(loop)
        if spans >= BUDGET_ROTATE * self.max_spans or size >= self.rotate_bytes:
            self.rotate_pending = True

    def _open_bytes(self, loop: SegmentedSpan) -> int:
        """What the open loop (and application) segment will add to the trace when it ends: its
        events so far, and a margin for the two spans with their summaries (~6 kB: the last loop
        segment with its summary is ~4.5 kB)."""
        app = self.app
        same_trace = app is not None and app.get_span_context().trace_id == loop.get_span_context().trace_id
        return loop.open_bytes + (app.open_bytes if same_trace and app is not None else 0) + 6144

    def rotate(self, now_ns: int) -> None:
        """Close the current segment (loop, and application if ours) and continue in a new trace."""
        loop = self.loop
        if loop is None:
            return
        app = self.app
        spans, size = self.budget.usage(loop.get_span_context().trace_id)
        previous_loop = loop.get_span_context()
        loop.close_segment(now_ns, continues=True, spans=spans, estimated_bytes=size)
        new_parent: Span | None = None
        if app is not None and app.get_span_context().trace_id == previous_loop.trace_id:
            previous_app = app.get_span_context()
            app.close_segment(now_ns, continues=True)
            app.start_next(self.tracer, now_ns, None, [previous_app, app.first_context])
            new_parent = app.current
            root_links = [previous_loop]
        else:
            root_links = [previous_loop] + ([app.first_context] if app is not None else [])
        loop.start_next(self.tracer, now_ns, new_parent, root_links)
        self._parent_cache = (None, trace_api.INVALID_SPAN_CONTEXT, True)  # the loop answers anew now
        self.segments_closed += 1
        self.events = _EventBudget()

    # --- loops ----------------------------------------------------------------------------------
    def training_loop_opened(self, loop: SegmentedSpan, start_ns: int) -> None:
        self.goodput.started(start_ns)
        self.loop = loop
        self.rotate_pending = False
        loop.segment_start_ns = start_ns

    def training_loop_closing(self, loop: SegmentedSpan, end_ns: int) -> None:
        """Last partial window, the at-a-glance summary and the segment marks, before end()."""
        if self.loop is not loop:
            return
        self.close_window(final=True)
        train_time = (end_ns - self.loop_start_ns) / 1e9 if self.loop_start_ns else None
        summary = self.aggregator.summary(self.rate_inputs(), train_time)
        summary[semconv.SUMMARY_PREFIX + "segments"] = self.segments_closed + 1
        summary[semconv.SUMMARY_PREFIX + "exported_iterations"] = (
            self.instruments.exported_iterations if self.instruments is not None else 0
        )
        summary.update(self.goodput.snapshot(end_ns).attributes(semconv.SUMMARY_PREFIX))
        if self.goodput.ideal_step_time_s is not None:
            summary[semconv.SUMMARY_PREFIX + "step_time.ideal"] = self.goodput.ideal_step_time_s
        if self.rank_export is not None and self.rank_export.anomalies_only:
            summary[semconv.SUMMARY_RANK_EXPORT] = semconv.RANK_EXPORT_ANOMALIES_ONLY
        loop.set_attributes(summary)
        if self.segments_closed:
            spans, size = self.budget.usage(loop.get_span_context().trace_id)
            loop.close_segment(end_ns, continues=False, spans=spans, estimated_bytes=size)
        self.loop = None

    def eval_loop_opened(self, phase: str) -> None:
        self.eval_stats[phase] = EvalStats()
        iteration_phase = (
            Phase.VALIDATION_ITERATION if phase == Phase.VALIDATION_LOOP.value else Phase.TESTING_ITERATION
        )
        self.eval_samplers.pop(iteration_phase.value, None)

    def eval_loop_closing(self, phase: str, span: Span, duration_s: float) -> None:
        stats = self.eval_stats.pop(phase, None) or EvalStats()
        event = (
            Event.VALIDATION_METRICS_UPDATE
            if phase == Phase.VALIDATION_LOOP.value
            else Event.TESTING_METRICS_UPDATE
        )
        attributes = stats.attributes(duration_s)
        span.add_event(event.value, attributes)
        span.set_attributes(attributes)

    # --- checkpoints ----------------------------------------------------------------------------
    def iteration_starting_checkpoint(self) -> SpanContext | None:
        """The span context of the iteration an async checkpoint belongs to, if it is (or will
        be) exported: the running iteration, whose export this forces, else the last one if it
        was exported."""
        record = self.active
        if record is not None and record.real_span is None and record.phase == _TRAINING_ITERATION:
            if record.head_reason is None:
                record.head_reason = "checkpoint"
                record.notable = True
            if not record.span_id:
                record.assign_ids()
            return _span_context(record.trace_id, record.span_id, _SAMPLED)
        if record is not None and record.real_span is not None:
            return record.real_span.get_span_context()
        return self.last_exported

    def checkpoint_saved(
        self,
        duration_s: float,
        size_bytes: int | None,
        strategy: str,
        own_span: Span | None,
        parent: Span | None,
        iteration: int | None = None,
    ) -> dict[str, AttributeValue]:
        """Count a save's blocking part; the ``checkpoint_metrics_update`` event goes on the
        save span while it is open (ours), else on its live parent."""
        # What a preemption loses: iterations after the last save (``iteration`` = the first
        # iteration a resume from this checkpoint runs; unknown: the one after the last done).
        self.last_checkpoint = (
            iteration if iteration is not None else self.last_iteration + 1,
            time.time_ns(),
            duration_s,
        )
        with self.lock:
            self.aggregator.checkpoints.add_save(duration_s, size_bytes, strategy)
            attributes: dict[str, AttributeValue] = dict(self.aggregator.checkpoints.attributes())
        if size_bytes is not None and duration_s > 0:
            attributes[semconv.CHECKPOINT_BYTES_PER_SECOND] = size_bytes / duration_s
        instruments = self.instruments
        if instruments is not None:
            instruments.checkpoint_save_duration.record(duration_s, {semconv.CHECKPOINT_STRATEGY: strategy})
            if size_bytes is not None:
                instruments.checkpoint_size.record(size_bytes, {semconv.CHECKPOINT_STRATEGY: strategy})
        target = own_span if own_span is not None else parent
        if target is not None:
            target.add_event(Event.CHECKPOINT_METRICS_UPDATE.value, attributes)
        return attributes

    def checkpoint_background_done(
        self, duration_s: float, size_bytes: int | None
    ) -> dict[str, AttributeValue]:
        with self.lock:
            self.aggregator.checkpoints.add_background(duration_s, size_bytes)
            attributes: dict[str, AttributeValue] = dict(self.aggregator.checkpoints.attributes())
        if self.instruments is not None and size_bytes is not None:
            self.instruments.checkpoint_size.record(size_bytes, {semconv.CHECKPOINT_STRATEGY: "async"})
        return attributes

    def checkpoint_loaded(self, duration_s: float) -> None:
        with self.lock:
            self.aggregator.checkpoints.add_load(duration_s)
        if self.instruments is not None:
            self.instruments.checkpoint_load_duration.record(duration_s)

    def checkpoint_stage_done(self, stage: str, duration_s: float) -> None:
        with self.lock:
            self.aggregator.checkpoints.add_stage(stage, duration_s)

    # --- spans from other instrumentation (plain OTel with ml.training.phase) ----------------------
    def foreign_loop_ended(self, context: SpanContext) -> None:
        """Someone else's training loop ended: its last partial window closes now. The loop span
        is frozen, so that window's event has nowhere to go; its record still parents to it."""
        if self.loop is not None:
            return
        self.foreign_loop = None
        self.close_window(final=True, ended_loop=NonRecordingSpan(context))

    def foreign_iteration(
        self, span: Any, duration_ns: int, steps: list[int] | None, loop_span: Span | None
    ) -> None:
        """A training iteration span someone else created (and exported): same aggregates."""
        attributes = span.attributes or {}
        if loop_span is not None:
            self.foreign_loop = loop_span
        record = iteration_record(
            _TRAINING_ITERATION,
            int(attributes.get(semconv.ITERATION, self.aggregator.iterations_seen)),
            span.start_time,
            span.parent or trace_api.INVALID_SPAN_CONTEXT,
        )
        record.add_work(
            _num(attributes.get(semconv.SAMPLES)),
            _num(attributes.get(semconv.TOKENS)),
            _num(attributes.get(semconv.PADDING_TOKENS)),
            _num(attributes.get(semconv.FLOPS)),
        )
        if steps is not None and any(steps):
            record.phase_ns = steps
            record.step_spans = True
        for key, value in attributes.items():
            if key.startswith(semconv.METRIC_PREFIX) and isinstance(value, int | float):
                self.record_metric(record, key[len(semconv.METRIC_PREFIX) :], float(value))
        context = span.get_span_context()
        self.end_iteration(record, None, span.start_time + duration_ns, (context.trace_id, context.span_id))


def _finish_span(span: Span, record: IterationSpan) -> None:
    """Give an iteration's SDK span what was set on its handle, then end it at its end time."""
    if record.events:
        for name, event_attributes, timestamp in record.events:
            span.add_event(name, event_attributes, timestamp)
    if record.status is not None:
        span.set_status(record.status)
    if record.error is not None:
        mark_error(span, record.error, record.end_ns)
    span.end(end_time=record.end_ns)


def mark_error(span: Span, error: BaseException, timestamp: int) -> None:
    span.record_exception(error, timestamp=timestamp, escaped=True)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def _take_counts(record: IterationSpan, span: Span) -> None:
    """Work counts the user set as attributes on the iteration's SDK span."""
    attributes = getattr(span, "attributes", None)
    if attributes:
        for key, field_name in _COUNT_ATTRIBUTES.items():
            value = attributes.get(key)
            if value is not None:
                setattr(record, field_name, _num(value))
                record.counted = True


def _num(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    number = as_number(value)  # a numpy scalar or a one-element tensor
    return float(number) if number is not None else None
