"""What a closed window is made into, consumer by consumer (see ``window_pipeline``): each method
takes the :class:`WindowEvent` and does one job with it through the module that owns that job,
in the order the bootstrap registers them. The MFU peak lookup (:class:`PeakFlops`) is the
pipeline's rate source, not a consumer: the report's rates need it. The user's
``record_metrics`` names come after traintel's own numbers on the record and the loop's event,
within the span limits (``UserNamesCap``): past a limit the user's names are left out, never
traintel's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Final

from opentelemetry.trace import Span

from traintel import semconv
from traintel._aggregation.aggregator import WINDOW_KEYS, RateInputs, WindowReport
from traintel._aggregation.goodput import WindowGoodput
from traintel._aggregation.window_merge import RecordMerger
from traintel._aggregation.window_record import loop_attributes
from traintel._host.calibration import MeasuredPeak, measure_peak
from traintel._host.compute_dtype import DtypeChoice, choose_dtype, seen_parameters
from traintel._host.device import DeviceHooks, annotate_window
from traintel._host.flops import current_device_name, peak_flops_for
from traintel._recorder import clock
from traintel._recorder.engine import TrainingEngine
from traintel._recorder.segments import SegmentedSpan
from traintel._runtime.window_pipeline import WindowEvent
from traintel._sdk.otel_private import add_clean_event
from traintel._sdk.window_spans import WindowSpans
from traintel.config import Settings, TrainingConfig
from traintel.semconv import Event

_TRAINING_METRICS_UPDATE: Final = Event.TRAINING_METRICS_UPDATE.value
_OUT_OF_RANGE: Final = Event.METRIC_OUT_OF_RANGE.value
_FLOPS_PER_DEVICE: Final = semconv.WINDOW_PREFIX + "flops_per_second_per_device"
#: Where a window's record holds the user's record_metrics names (two attributes each).
_USER_METRICS: Final = semconv.WINDOW_PREFIX + "metric."
#: A wall clock this far (or more) off traintel's timeline has stepped (NTP slews by far less).
_WALL_STEP_NS: Final = 1_000_000_000


class PeakFlops:
    """The window's rate inputs: the world size, the FLOP method and the peak FLOP/s, the
    configured one or the table's for the device and the dtype that runs
    (``traintel._host.compute_dtype``), looked up at the first window close where the device is
    known (the job initialised CUDA) and kept from then on; and the measured matmul peak, when
    ``TRAINTEL_MEASURE_PEAK=on``."""

    def __init__(
        self, world_size: int, warn_once: Callable[..., None], end_probe: Callable[[], None] | None = None
    ) -> None:
        self.world_size = world_size
        self._warn_once = warn_once
        self._end_probe = end_probe  # back to the plain device hooks: autocast is looked at no more
        self.dtype_seen: str | None = None
        self.dtype: DtypeChoice | None = None  # the peak column, once the device is known
        self._found: tuple[float | None, str | None, str | None] | None = None
        self._measured: MeasuredPeak | None = None

    def dtype_found(self, dtype: str) -> None:
        """Autocast's dtype, seen at a phase start (the device hooks' probe)."""
        self.dtype_seen = dtype
        self._stop_probing()

    def _stop_probing(self) -> None:
        end, self._end_probe = self._end_probe, None
        if end is not None:
            end()

    def __call__(self, config: TrainingConfig, settings: Settings, device: int | None) -> RateInputs:
        lazy = config.is_lazy("flops_per_sample") or config.is_lazy("flops_per_token")
        method = settings.flops_method or ("callable" if lazy else "config")
        executed, model = settings.executed_flops_per_sample, settings.flops_per_sample
        ratio = executed / model if executed and model else None
        inputs = self._peak_inputs(settings, device, method, ratio)
        measured = self._measured
        if measured is None or not measured.flops_per_second:
            return inputs
        return replace(
            inputs, measured_peak_flops=measured.flops_per_second, measured_peak_method=measured.method
        )

    def _peak_inputs(
        self, settings: Settings, device: int | None, method: str, ratio: float | None
    ) -> RateInputs:
        """The configured peak, else the table's for the device and the dtype that runs."""
        if settings.peak_flops is not None:
            configured = "config (TRAINTEL_PEAK_FLOPS)"
            return RateInputs(self.world_size, settings.peak_flops, configured, None, method, ratio)
        peak, source, reason = self._device_peak(settings, device)
        dtype = self.dtype
        return RateInputs(
            self.world_size, peak, source, reason, method, ratio,
            peak_dtype=dtype.dtype if dtype else None, peak_dtype_reason=dtype.reason if dtype else None,
        )  # fmt: skip

    def _device_peak(
        self, settings: Settings, device: int | None
    ) -> tuple[float | None, str | None, str | None]:
        if self._found is not None:
            return self._found
        self._stop_probing()  # the first window: the dtype is what autocast showed so far
        name = current_device_name(device)
        if name is None:
            return (None, None, "no GPU: set TRAINTEL_PEAK_FLOPS to compute MFU on this device")
        self.dtype = dtype = choose_dtype(settings.dtype, self.dtype_seen, seen_parameters())
        if dtype.guess is not None:
            self._warn_once("mfu_dtype", "MFU: %s", dtype.guess)
        found = peak_flops_for(name, dtype.dtype)
        self._found = (found.peak_flops, found.source, found.reason)
        return self._found

    def measure_if_asked(self, settings: Settings, device: int | None) -> None:
        """``TRAINTEL_MEASURE_PEAK=on``: time the device's matmul peak in the run's dtype, once.
        Called on the thread that closes a window (the training thread), before the window is
        handed over, so that nothing of the job runs beside it."""
        if self._measured is not None or settings.measure_peak != "on":
            return
        if self._found is None and current_device_name(device) is None:
            return  # no GPU (yet): asked again at the next window
        self._device_peak(settings, device)
        dtype = self.dtype.dtype if self.dtype is not None else "fp32"
        try:
            self._measured = measure_peak(dtype)
        except Exception as exc:
            self._warn_once("measure_peak", "could not measure the matmul peak: %s", exc)
        if self._measured is None:  # not again
            self._measured = MeasuredPeak(0.0, f"no {dtype} matmul calibration", (), 0.0)


class WindowConsumers:
    """A job's consumers of closed windows, each one method (see the module docstring)."""

    def __init__(
        self,
        engine: TrainingEngine,
        spans: WindowSpans,
        peak: PeakFlops,
        warn_once: Callable[..., None],
        release: Callable[[list[WindowGoodput], Span | None], None],
    ) -> None:
        self._engine = engine
        self._spans = spans
        self._peak = peak
        self._warn_once = warn_once
        #: Told of the goodput records before they are exported (it may annotate them: their
        #: energy), with the loop span at the loop's end.
        self._release = release
        self._wall_step_said = 0  # the wall clock's step last said (ns)
        self._merger = RecordMerger()
        self._held_parent: Span | None = None  # where the held records go (the latest window's)

    def _compact(self, event: WindowEvent) -> bool:
        """The window's numbers ride on its record (the default, and where no loop is open to
        take them: a plain OpenTelemetry loop's last window), or on a full event on the loop."""
        return self._engine.window_events and (event.settings.window_events == "off" or event.segment is None)

    def annotate_device(self, event: WindowEvent) -> None:
        if event.report is not None:
            hooks = self._engine.device  # the autocast probe's until the dtype is known: same timer
            timed = hooks if isinstance(hooks, DeviceHooks) else None
            annotate_window(event.report.attributes, timed, event.device)

    def book_goodput(self, event: WindowEvent) -> None:
        """The goodput ledger's account of the window, and its record exported at once."""
        ledger, report, final = self._engine.goodput, event.report, event.window.final
        if report is None:
            records = ledger.flush_held() if final else []
        else:
            metrics = report.attributes if self._compact(event) else None
            records = ledger.close_window(report, event.inputs.peak_flops, final, metrics)
        if final:
            ledger.loop_ended()
        self._held_parent = event.parent
        self._export(self._by_time(records, event), final, event.segment if final else None)

    def _by_time(self, records: list[WindowGoodput], event: WindowEvent) -> list[WindowGoodput]:
        """Windows shorter than the time floor (closed by their row bound, at a high step rate)
        leave as one record once together they span it (``window_merge``). In a job of several
        ranks a window's length is the agreed one, the same on every rank; without an agreement
        (no exchange yet, or none at all) each window is its own record."""
        floor_ns = round(event.settings.window_seconds[0] * 1e9)
        agreed = event.agreed
        if agreed is None:
            policy = self._engine.rank_export  # torch.distributed's world, decided at the first window
            if event.inputs.world_size > 1 or (policy is not None and policy.world_size > 1):
                return records
        ready = []
        for record in records:
            agreed_ns = None
            if agreed is not None:  # the first window, held by the ledger, was never agreed
                size, pace = agreed if record.index == event.window.index else (0, 0.0)
                agreed_ns = round(size * pace * 1e9) if pace else floor_ns
            ready += self._merger.add(record, floor_ns, event.inputs, agreed_ns)
        return ready + self._merger.flush() if event.window.final else ready

    def release_held(self) -> None:
        """Telemetry shuts down with the loop open: the records held for merging leave now."""
        try:
            self._export(self._merger.flush(), False, None)
        except Exception:
            self._warn_once("held_records", "could not export the held window records")

    def _export(self, records: list[WindowGoodput], final: bool, final_loop: Span | None) -> None:
        """Release the records (their energy is added; at the loop's end, its span too) and
        export them as ``training_window`` spans under the segment of the latest window."""
        if records or final:
            self._release(records, final_loop)
        if records:
            cap = self._engine.names_cap
            self._spans.export(
                (
                    (w.start_ns, w.end_ns, cap.span(w.attributes(), _USER_METRICS, "training_window span"))
                    for w in records
                ),
                self._held_parent,
            )

    def update_loop(self, event: WindowEvent) -> None:
        """The loop's part: the window's constants and totals on the segment (overwritten each
        window; compact mode), or the full ``training_metrics_update`` event; one event per
        out-of-range value; and that value said once."""
        report, inputs, segment = event.report, event.inputs, event.segment
        if report is None:
            return
        if segment is not None and self._engine.window_events:
            if self._compact(event):
                segment.set_attributes(loop_attributes(report.attributes))
            else:
                cap = self._engine.names_cap
                update = cap.event(report.attributes, _USER_METRICS, "training_metrics_update event")
                _add_loop_event(event, _TRAINING_METRICS_UPDATE, update)
            for error in report.errors:
                _add_loop_event(event, _OUT_OF_RANGE, {
                    semconv.ERROR_REASON: error,
                    semconv.MFU_NUMERATOR: report.attributes.get(_FLOPS_PER_DEVICE, 0.0),
                    semconv.MFU_DENOMINATOR: inputs.peak_flops or 0.0,
                    semconv.MFU_PEAK_SOURCE: inputs.peak_source or "",
                })  # fmt: skip
        self._say_mfu_problems(report, inputs)

    def _say_mfu_problems(self, report: WindowReport, inputs: RateInputs) -> None:
        """No MFU for want of a peak, said once; an MFU or HFU above 1 is no metric: said once,
        with the dtype guess behind the peak."""
        if inputs.peak_flops is None and report.attributes.get(_FLOPS_PER_DEVICE):
            self._warn_once("no_peak", "no MFU: %s", inputs.peak_missing_reason or "unknown peak FLOP/s")
        dtype = self._peak.dtype
        guess = f" ({dtype.guess})" if dtype is not None and dtype.guess else ""
        for error in report.errors:
            self._warn_once(
                "out_of_range", "%s: check flops_per_* and the peak FLOP/s%s (not reported as a metric)",
                error, guess,
            )  # fmt: skip

    def say_counts_over_the_batch(self, event: WindowEvent) -> None:
        """More samples (tokens) per iteration across the ranks than ``global_batch_size``
        (× ``seq_len``): ``samples=`` and ``tokens=`` are each rank's (the job's throughput
        multiplies them by the world size), so one of the two is wrong, usually the global batch
        given as each rank's, and every samples/s (tokens/s) is too high by that much. Said once
        with the numbers (the samples first); the counts stay as given."""
        report, settings = event.report, event.settings
        batch, seq_len = settings.global_batch_size, settings.seq_len
        if report is None or not batch or not report.durations:
            return
        world = event.inputs.world_size
        for what, step, limit in (
            ("samples", batch, f"global_batch_size={batch}"),
            ("tokens", batch * (seq_len or 0), f"global_batch_size x seq_len={batch} x {seq_len}"),
        ):
            per_rank = float(report.attributes.get(WINDOW_KEYS[what], 0.0)) / len(report.durations)
            if step and per_rank * world > step * (1 + 1e-9):
                self._warn_once(
                    what + "_over_batch",
                    "%s= counts %s per iteration on each of %d rank(s), %s per step, more than %s: "
                    "%s= is each rank's share, and the job's %s/s multiplies it by the world size "
                    "(throughput is %.3gx the global batch's)",
                    what, f"{per_rank:g}", world, f"{per_rank * world:g}", limit, what, what,
                    per_rank * world / step,
                )  # fmt: skip
                return  # (tokens derived from too many samples are too many too: said once)

    def say_wall_clock_step(self, event: WindowEvent) -> None:
        """A wall-clock step since the last window (1 s or more): said once, and a
        ``wall_clock_step`` event on the loop for the offline commands (traintel's timestamps
        are that far off the wall clock from here on)."""
        if event.report is None:
            return
        step = clock.wall_step_ns()
        if abs(step - self._wall_step_said) < _WALL_STEP_NS:
            return
        self._wall_step_said = step
        iteration = event.report.last_iteration
        self._warn_once(
            "wall_clock_step",
            "the wall clock stepped by %+.1f s (at or before iteration %s); durations stay exact "
            "(traintel times from the monotonic clock), and its timestamps are that far off the wall "
            "clock from here on",
            step / 1e9, iteration,
        )  # fmt: skip
        attributes: dict[str, float | int | str] = {
            semconv.WALL_CLOCK_STEP: step / 1e9,
            semconv.ITERATION: iteration,
        }
        _add_loop_event(event, Event.WALL_CLOCK_STEP.value, attributes)


def _add_loop_event(event: WindowEvent, name: str, attributes: dict[str, float | int | str]) -> None:
    """An event on the loop segment that held the window (counted in the segment's budget)."""
    loop, segment = event.loop, event.segment
    if segment is None:
        return
    if isinstance(loop, SegmentedSpan):
        loop.add_clean_event(name, attributes, segment)
    else:
        add_clean_event(segment, name, attributes)
