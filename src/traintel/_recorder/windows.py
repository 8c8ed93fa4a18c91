"""Closing a window: the ``training_metrics_update`` event, the goodput record, the gauges.

The engine appends one row per iteration. A window closes after ``log_every_n_iterations``
iterations once it also spans ``window_min_seconds`` (the floor bounds what a fast loop
exports and spends on closes) or holds MAX_WINDOW_ITERATIONS (memory), and after
``log_every_n_seconds`` whatever its count (the ceiling bounds what a killed job's accounting
can lose), or when the loop ends. In a job of
several ranks the windows must stay the same iterations on every rank (their statistics are
gathered per window), so there the size in iterations is agreed through the cross-rank
exchange from the slowest rank's pace, instead of read from each rank's own clock.

Closed here: the aggregator turns the rows into the window's numbers, which go on the training
loop span as an event, into the metric instruments, and out as a ``training_window`` span (the
goodput record, exported at once so a killed job loses at most its open window). The
slow-iteration threshold is refreshed from the window's durations, and the device's peak
FLOP/s for MFU is looked up once it is known.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, TraceFlags

from traintel import semconv
from traintel._aggregation.aggregator import MAX_WINDOW_ITERATIONS, RateInputs, WindowReport, seconds_of
from traintel._aggregation.goodput import WindowGoodput
from traintel._aggregation.sampling import MEDIAN_MIN_SAMPLES
from traintel._aggregation.window_record import loop_attributes
from traintel._host.calibration import MeasuredPeak, measure_peak
from traintel._host.compute_dtype import DtypeChoice, choose_dtype, seen_parameters
from traintel._host.device import AutocastProbe, DeviceHooks, annotate_window, device_hooks
from traintel._host.flops import autocast_dtype, current_device_name, peak_flops_for
from traintel._recorder import clock
from traintel._recorder.clock import wall_step_ns
from traintel._recorder.record import RANDOM_TRACE_ID
from traintel._sdk.ids import new_span_id
from traintel._sdk.otel_private import add_clean_event, set_clean_attributes
from traintel._sdk.providers import DirectSpans
from traintel._sdk.segments import SegmentedSpan
from traintel.config import TrainingConfig, window_seconds
from traintel.semconv import Event

if TYPE_CHECKING:
    from traintel._recorder.engine import TrainingEngine

_TRAINING_METRICS_UPDATE: Final = Event.TRAINING_METRICS_UPDATE.value
#: Where a window's record holds the user's record_metrics names (two attributes each).
_USER_METRICS: Final = semconv.WINDOW_PREFIX + "metric."
#: A wall clock this far (or more) off traintel's timeline has stepped (NTP slews by far less).
_WALL_STEP_NS: Final = 1_000_000_000
#: A mark that is never reached: no row count (or time) to look again at.
NEVER: Final = sys.maxsize
_FLOPS_PER_DEVICE: Final = semconv.WINDOW_PREFIX + "flops_per_second_per_device"


class Windows:
    """The open window's bookkeeping and its close."""

    def __init__(self, engine: TrainingEngine) -> None:
        self._engine = engine
        self._median_rows = 0  # rows of the open window already in the slow threshold's sample
        #: end_iteration calls close_if_due once the window has this many rows or an
        #: iteration ends at due_ns (the first row of a window, to learn its start, at the latest).
        self.rows_mark = 1
        self.due_ns = NEVER
        self._size = 0  # the window's iterations (the fewest, on this process's own clock)
        self._floor_ns = self._ceiling_ns = 0
        self._agreed = False  # ranks agreed on the size: no clock involved
        self._opened = False  # the open window's size is decided (at its first row)
        self._rate_inputs: RateInputs | None = None
        self._dtype_seen: str | None = None
        self._dtype: DtypeChoice | None = None  # the peak column, once the device is known
        self._device_lookup: tuple[float | None, str | None, str | None] | None = None
        self._measured: MeasuredPeak | None = None
        self._window_parent: tuple[Span | None, Context] = (None, Context())
        self.hooks: DeviceHooks | None = None
        self.dtype_probing = False
        self._wall_step_said = 0  # the wall clock's step last said (ns)

    def configure(self, config: TrainingConfig) -> None:
        engine = self._engine
        self._lazy_config = config.has_lazy  # callables re-read at every window close
        self._rate_inputs = None
        if not hasattr(self, "_configured"):  # once: the device features are fixed at start
            self._configured = True
            self.hooks = device_hooks(config, engine.warn_once)
            # Until the compute dtype is known, phase starts look at autocast (a CUDA or ROCm
            # build of torch imported, no dtype or peak configured): see AutocastProbe.
            version = getattr(sys.modules.get("torch"), "version", None)
            gpu_build = getattr(version, "cuda", None) or getattr(version, "hip", None)
            self.dtype_probing = (
                gpu_build is not None and config.get("dtype") is None and config.get("peak_flops") is None
            )
            engine.set_device(
                AutocastProbe(self.hooks, self._dtype_found) if self.dtype_probing else self.hooks
            )
        floor, ceiling = window_seconds(config)
        self._floor_ns, self._ceiling_ns = int(floor * 1e9), int(ceiling * 1e9)
        if not self._agreed:
            self._size = engine.window_size
        self._set_marks()

    # --- when the window closes -----------------------------------------------------------------------
    def _set_marks(self) -> None:
        """When end_iteration next calls in: at the window's first row (its start is that row's),
        at its size, at its floor or ceiling in time; sooner while the slow threshold still waits
        for its first MEDIAN_MIN_SAMPLES durations."""
        rows = self._engine.rows
        if not rows or not self._opened:
            mark, due = 1, NEVER
        elif self._agreed:
            mark, due = self._size, NEVER
        else:
            start = rows[0][7] - rows[0][0]
            if len(rows) < self._size:
                mark, due = self._size, start + self._ceiling_ns
            else:  # bounded in rows too: the floor may be a million iterations away
                mark, due = max(self._size, MAX_WINDOW_ITERATIONS), start + self._floor_ns
        missing = MEDIAN_MIN_SAMPLES - len(self._engine.sampler.recent)
        if missing > 0:
            mark = min(mark, self._median_rows + missing)
        self.rows_mark, self.due_ns = mark, due

    def close_if_due(self, end_ns: int) -> None:
        """Close the window if it is complete at ``end_ns`` (its last row's end), else say when
        to look again."""
        rows = self._engine.rows
        if not rows:
            return
        if not self._opened:
            self._open_window()
        if self._agreed:
            due = len(rows) >= self._size
        else:
            elapsed = end_ns - (rows[0][7] - rows[0][0])
            count = len(rows)
            due = (
                elapsed >= self._ceiling_ns
                or (count >= self._size and elapsed >= self._floor_ns)
                or count >= max(self._size, MAX_WINDOW_ITERATIONS)
            )
        if due:
            self.close()
        else:
            self._set_marks()

    def _open_window(self) -> None:
        """The open window's size: agreed by the ranks of a multi-rank job, else this process's
        own count and clock."""
        engine = self._engine
        self._opened = True
        agreed = engine.window_size_for(engine.aggregator.windows_closed) if engine.window_size_for else None
        self._agreed = agreed is not None
        if agreed is None:
            self._size = engine.window_size
        else:  # every rank samples the same iteration numbers: the stride follows the agreed pace
            self._size, pace = agreed
            if pace:
                engine.sampler.set_pace(pace)

    # --- the slow threshold's first durations -------------------------------------------------------
    def catch_up_median(self) -> None:
        """Add the open window's durations not yet in the slow threshold's recent ones."""
        engine = self._engine
        rows = engine.rows
        if len(rows) > self._median_rows:
            engine.sampler.recent.extend(seconds_of(row[0] for row in rows[self._median_rows :]))
            self._median_rows = len(rows)

    def start_threshold_if_due(self) -> None:
        """The job's first durations for the slow threshold ended inside the open window: it
        starts from them now (the window close adds the rest of the window's)."""
        sampler = self._engine.sampler
        if len(sampler.recent) < MEDIAN_MIN_SAMPLES:
            self.catch_up_median()
            sampler.refresh()
            if sampler.median and not self._agreed:  # the stride, without waiting for a window
                sampler.set_pace(sampler.median)
            self._set_marks()

    # --- the compute dtype and the device's peak ------------------------------------------------------
    def _dtype_found(self, dtype: str) -> None:
        self._dtype_seen = dtype
        self._end_dtype_probe()

    def _end_dtype_probe(self) -> None:
        """Back to the plain device hooks: the per-step cost of looking ends here."""
        if self.dtype_probing:
            self.dtype_probing = False
            self._engine.set_device(self.hooks)

    def look_at_autocast(self) -> None:
        dtype = autocast_dtype()
        if dtype is not None:
            self._dtype_found(dtype)

    def rate_inputs(self) -> RateInputs:
        engine = self._engine
        config = engine.config
        method = config.get("flops_method")
        if method is None:
            lazy = config.is_lazy("flops_per_sample") or config.is_lazy("flops_per_token")
            method = "callable" if lazy else "config"
        executed = config.get("executed_flops_per_sample")
        model = config.get("flops_per_sample")
        ratio = executed / model if executed and model else None
        peak = config.get("peak_flops")
        measured = self._measured
        if peak is not None:
            inputs = RateInputs(engine.world_size, peak, "config (TRAINTEL_PEAK_FLOPS)", None, method, ratio)
        else:
            peak, source, reason = self._device_peak()
            dtype = self._dtype
            inputs = RateInputs(
                engine.world_size, peak, source, reason, method, ratio,
                peak_dtype=dtype.dtype if dtype else None, peak_dtype_reason=dtype.reason if dtype else None,
            )  # fmt: skip
        if measured is None or not measured.flops_per_second:
            return inputs
        return dataclasses.replace(
            inputs, measured_peak_flops=measured.flops_per_second, measured_peak_method=measured.method
        )

    def _device_peak(self) -> tuple[float | None, str | None, str | None]:
        """The table's peak for the device and dtype, looked up at the first window close
        where the device is known (the job initialised CUDA) and kept from then on; the dtype
        is what runs (``traintel._host.compute_dtype``), a guess said once."""
        if self._device_lookup is not None:
            return self._device_lookup
        self._end_dtype_probe()
        device = current_device_name()
        if device is None:
            return (None, None, "no GPU: set TRAINTEL_PEAK_FLOPS to compute MFU on this device")
        configured = self._engine.config.get("dtype")
        self._dtype = dtype = choose_dtype(configured, self._dtype_seen, seen_parameters())
        if dtype.guess is not None:
            self._engine.warn_once("mfu_dtype", "MFU: %s", dtype.guess)
        found = peak_flops_for(device, dtype.dtype)
        self._device_lookup = (found.peak_flops, found.source, found.reason)
        return self._device_lookup

    def measure_peak_if_asked(self) -> None:
        """``TRAINTEL_MEASURE_PEAK=on``: time the device's matmul peak in the run's dtype, once,
        on the calling (training) thread, so that nothing of the job runs beside it."""
        if self._measured is not None or self._engine.config.get("measure_peak") != "on":
            return
        if self._device_lookup is None and current_device_name() is None:
            return  # no GPU (yet): asked again at the next window
        self._device_peak()
        dtype = self._dtype.dtype if self._dtype is not None else "fp32"
        try:
            self._measured = measure_peak(dtype)
        except Exception as exc:
            self._engine.warn_once("measure_peak", "could not measure the matmul peak: %s", exc)
        if self._measured is None:  # not again
            self._measured = MeasuredPeak(0.0, f"no {dtype} matmul calibration", (), 0.0)
        self._rate_inputs = None

    # --- the close ----------------------------------------------------------------------------------
    def close(self, final: bool = False, ended_loop: Span | None = None) -> WindowReport | None:
        engine = self._engine
        self.measure_peak_if_asked()
        inputs = self._rate_inputs
        if (
            inputs is None
            or self._lazy_config
            or (
                inputs.peak_flops is None
                and self._device_lookup is None
                and current_device_name() is not None
            )
        ):
            inputs = self._rate_inputs = self.rate_inputs()  # the device is known now
        report = self._report(inputs)
        if report is not None and not self._agreed and report.durations:
            engine.sampler.set_pace(report.duration_s / len(report.durations))  # this process's own
        if report is not None and engine.instruments is not None:
            engine.instruments.defer_window(report.durations, report.data_loading_durations)
        engine.sampler.refresh()
        if engine.window_hook is not None:
            engine.window_hook(report, final)
        if report is None:
            if final:
                self._export_goodput(self._released(engine.goodput.flush_held(), final), ended_loop)
            return None
        annotate_window(report.attributes, engine.device)
        self._check_wall_clock(report)
        # The window's numbers ride on its record (the default), or on a full event on the loop.
        compact = engine.window_events and engine.config.get("window_events") == "off"
        metrics = report.attributes if compact else None
        records = engine.goodput.close_window(report, inputs.peak_flops, final, metrics)
        self._export_goodput(self._released(records, final), ended_loop)
        if self._lazy_config:
            engine.apply_config(engine.config)  # lazy values are re-resolved once per window
        if inputs.peak_flops is None and report.attributes.get(_FLOPS_PER_DEVICE):
            engine.warn_once("no_peak", "no MFU: %s", inputs.peak_missing_reason or "unknown peak FLOP/s")
        self._window_events(report, inputs, compact)
        return report

    def _released(self, records: list[WindowGoodput], final: bool) -> list[WindowGoodput]:
        """The released records, once their consumers have annotated them."""
        hook = self._engine.goodput_records
        if hook is not None and (records or final):
            hook(records, final)
        return records

    def _check_wall_clock(self, report: WindowReport) -> None:
        """A wall-clock step since the last window close (1 s or more): said once, and a
        ``wall_clock_step`` event on the loop for the offline commands."""
        step = wall_step_ns()
        if abs(step - self._wall_step_said) < _WALL_STEP_NS:
            return
        self._wall_step_said = step
        engine = self._engine
        engine.warn_once(
            "wall_clock_step",
            "the wall clock stepped by %+.1f s (at or before iteration %s); durations stay exact "
            "(traintel times from the monotonic clock), and its timestamps are that far off the wall "
            "clock from here on",
            step / 1e9, report.last_iteration,
        )  # fmt: skip
        loop = engine.loop_span()
        if loop is not None:
            attributes = {semconv.WALL_CLOCK_STEP: step / 1e9, semconv.ITERATION: report.last_iteration}
            loop.add_event(Event.WALL_CLOCK_STEP.value, attributes, timestamp=clock.time_ns())

    def _report(self, inputs: RateInputs) -> WindowReport | None:
        """The aggregator's report; the window's durations join the slow threshold's sample
        whether or not the report succeeds (the aggregator empties the window either way)."""
        engine = self._engine
        added = self._median_rows
        pending = engine.rows[added:]
        report = None
        try:
            report = engine.aggregator.close_window(inputs)
        finally:
            recent = engine.sampler.recent
            if report is not None:
                recent.extend(report.durations[added:])
            else:
                recent.extend(seconds_of(row[0] for row in pending))
            self._median_rows = 0
            self._opened = False
            self._set_marks()
        return report

    def _window_events(self, report: WindowReport, inputs: RateInputs, compact: bool) -> None:
        """The loop's part: the window's constants and totals (overwritten each window), or the
        full ``training_metrics_update`` event; and any out-of-range value."""
        engine = self._engine
        loop = engine.loop_span()
        if loop is not None and engine.window_events:
            if compact:
                loop.set_attributes(loop_attributes(report.attributes))
            else:
                update = engine.names_cap.event(
                    report.attributes, _USER_METRICS, "training_metrics_update event"
                )
                if isinstance(loop, SegmentedSpan):
                    loop.add_clean_event(_TRAINING_METRICS_UPDATE, update)
                else:
                    add_clean_event(loop, _TRAINING_METRICS_UPDATE, update)
            for error in report.errors:
                loop.add_event(
                    Event.METRIC_OUT_OF_RANGE.value,
                    {
                        semconv.ERROR_REASON: error,
                        semconv.MFU_NUMERATOR: report.attributes.get(_FLOPS_PER_DEVICE, 0.0),
                        semconv.MFU_DENOMINATOR: inputs.peak_flops or 0.0,
                        semconv.MFU_PEAK_SOURCE: inputs.peak_source or "",
                    },
                )
        for error in report.errors:
            engine.warn_once(
                "out_of_range",
                "%s: check flops_per_* and the peak FLOP/s%s (not reported as a metric)",
                error,
                f" ({self._dtype.guess})" if self._dtype is not None and self._dtype.guess else "",
            )

    def _export_goodput(self, windows: list[WindowGoodput], ended_loop: Span | None) -> None:
        """Each window's goodput record as a ``training_window`` span, exported at once (not
        with the segment). Its parent is the loop segment holding it (``ended_loop``: a foreign
        loop that just ended)."""
        if not windows:
            return
        engine = self._engine
        loop = engine.loop_span()
        parent = loop.current if isinstance(loop, SegmentedSpan) else loop
        if parent is None:
            parent = ended_loop
        cached = self._window_parent  # the segment's context, built once per segment
        if cached[0] is not parent or parent is None:
            context = trace_api.set_span_in_context(parent) if parent is not None else Context()
            cached = self._window_parent = (parent, context)
        direct = engine.direct
        if direct is not None and direct.usable() and parent is not None:
            self._write_goodput(windows, parent.get_span_context(), direct, self._record_attributes)
            return
        # The metrics processor skips these, as it skips exported iterations: they are
        # traintel's own records, with nothing in them to count (the trace budget still is).
        materializing, engine.materializing = engine.materializing, threading.get_ident()
        try:
            for window in windows:
                # Started without attributes, then given them uncleaned: they are traintel's numbers.
                span = engine.tracer.start_span(
                    semconv.TRAINING_WINDOW_SPAN, context=cached[1], start_time=window.start_ns
                )
                set_clean_attributes(span, self._record_attributes(window))
                span.end(end_time=max(window.end_ns, window.start_ns))
        finally:
            engine.materializing = materializing

    def _record_attributes(self, window: WindowGoodput) -> dict[str, float | int | str]:
        """A window record's attributes; the user's metric names left out past the span limit."""
        return self._engine.names_cap.span(window.attributes(), _USER_METRICS, "training_window span")

    @staticmethod
    def _write_goodput(
        windows: list[WindowGoodput],
        parent: SpanContext,
        direct: DirectSpans,
        attributes: Callable[[WindowGoodput], dict[str, float | int | str]],
    ) -> None:
        """The records as the tracer would make them under ``parent``: sampled with it, or not
        exported at all."""
        if not parent.trace_flags.sampled:
            return
        flags = TraceFlags(TraceFlags.SAMPLED | (parent.trace_flags & RANDOM_TRACE_ID))
        for window in windows:
            context = SpanContext(parent.trace_id, new_span_id(), False, flags, parent.trace_state)
            span = direct.writer.span(
                semconv.TRAINING_WINDOW_SPAN, context, parent, attributes(window), window.start_ns,
                max(window.end_ns, window.start_ns),
            )  # fmt: skip
            direct.forward(span)
