"""The OpenTelemetry metric instruments traintel exports, and how they are fed.

Why per window: an SDK histogram ``record`` costs microseconds (attribute hashing, locks,
exemplar sampling), as much as a whole iteration of the recorder. The iteration times are
therefore recorded once per closed window, by the window pipeline's worker (``record_sorted``).
Nothing is buffered between windows, so nothing can be lost waiting for a reader. The samples
and tokens counters observe the engine's running totals at each collection (every iteration so
far); gauges report the last closed window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from opentelemetry import metrics as metrics_api
from opentelemetry.metrics import CallbackOptions, NoOpHistogram, Observation

from traintel import semconv
from traintel._aggregation.aggregator import STEP_PHASE_NAMES, TrainingAggregator, WindowReport
from traintel._aggregation.goodput import GoodputLedger, GoodputSnapshot
from traintel._sdk.otel_private import record_sorted
from traintel.version import __version__

#: Bucket boundaries in seconds: the SDK's defaults are for milliseconds and would put every
#: training step in the first bucket. 1 ms to 2 h covers kernels to checkpoints.
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0,
    250.0, 500.0, 1000.0, 2500.0, 7200.0,
)  # fmt: skip
#: Checkpoint sizes: 1 MB to 10 TB.
SIZE_BUCKETS_BY: tuple[float, ...] = tuple(float(10**e) for e in range(6, 14))

_W = semconv.WINDOW_PREFIX
_Callback = Callable[[CallbackOptions], Iterable[Observation]]
#: Gauges of the last closed window's figures: name, unit, the window's key, and whether the
#: figure is per job with a per-device twin (else per device alone).
_LAST_WINDOW_GAUGES = (
    (semconv.METRIC_SAMPLE_THROUGHPUT, "{sample}/s", "samples_per_second", True),
    (semconv.METRIC_TOKEN_THROUGHPUT, "{token}/s", "tokens_per_second", True),
    (semconv.METRIC_FLOPS_THROUGHPUT, "FLOP/s", "flops_per_second_per_device", False),
    (semconv.METRIC_MFU, "1", "mfu", False),
    (semconv.METRIC_MFU_MEASURED, "1", "mfu_measured", False),
    (semconv.METRIC_HFU, "1", "hfu", False),
)


class MetricSource(Protocol):
    """What the instruments read when a reader collects: the training engine's totals."""

    samples_total: float
    tokens_total: float
    exported_iterations: int
    unexported_iterations: int
    goodput: GoodputLedger


class TrainingInstruments:
    """Creates the instruments on ``meter_provider`` and records into them off the hot path."""

    def __init__(
        self,
        meter_provider: metrics_api.MeterProvider,
        source: MetricSource,
        windows: TrainingAggregator,
        now_ns: Callable[[], int],
    ) -> None:
        meter = meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE, __version__)
        self._source = source
        self._now_ns = now_ns  # the recorder's timeline, which the goodput ledger's times are on
        self._windows = windows
        self.window_series = True  # False: scale mode, a rank other than 0 (stop_window_series)

        def histogram(
            name: str, description: str, unit: str = "s", buckets: Iterable[float] = DURATION_BUCKETS_S
        ) -> metrics_api.Histogram:
            return meter.create_histogram(
                name, unit=unit, description=description, explicit_bucket_boundaries_advisory=list(buckets)
            )

        self.iteration_duration = histogram(
            semconv.METRIC_ITERATION_DURATION, "Wall time of each training iteration (one optimizer step)."
        )
        self.data_loading_duration = histogram(
            semconv.METRIC_DATA_LOADING_DURATION, "Time each training iteration waited for its batch."
        )
        self.phase_duration = histogram(
            semconv.METRIC_PHASE_DURATION,
            "Wall time of phase spans other than per-step ones, by ml.training.phase.",
        )
        self.checkpoint_save_duration = histogram(
            semconv.METRIC_CHECKPOINT_SAVE_DURATION,
            "Blocking time of each checkpoint save (async: until training resumed).",
        )
        self.checkpoint_load_duration = histogram(
            semconv.METRIC_CHECKPOINT_LOAD_DURATION, "Time of each checkpoint load."
        )
        self.checkpoint_size = histogram(
            semconv.METRIC_CHECKPOINT_SIZE, "Size of each checkpoint written.", "By", SIZE_BUCKETS_BY
        )
        # (kept in scale mode: a failure is an anomaly every rank reports, and none exports nothing)
        self.checkpoint_failures = meter.create_counter(
            semconv.METRIC_CHECKPOINT_FAILURES,
            unit="{checkpoint}",
            description="Checkpoint saves and loads that failed, by ml.training.phase "
            "(checkpoint_finalize: an async save's writer).",
        )
        for last_window in _LAST_WINDOW_GAUGES:
            self._gauge(meter, *last_window)
        gauge, counter = meter.create_observable_gauge, meter.create_observable_counter
        observed = (  # the first three: the engine's running totals, every iteration so far
            (counter, semconv.METRIC_SAMPLES, self._total(lambda: source.samples_total), "{sample}",
             "Training samples processed by this rank."),
            (counter, semconv.METRIC_TOKENS, self._total(lambda: source.tokens_total), "{token}",
             "Training tokens processed by this rank."),
            (counter, semconv.METRIC_ITERATIONS_EXPORTED, self._exported, "{iteration}",
             "Iterations exported as spans (tail sampling), by traintel.exported."),
            (gauge, semconv.METRIC_STEP_PHASE_TIME, self._phase_times, "s",
             "Mean time per iteration spent in each step phase over the last window."),
            (gauge, semconv.METRIC_GOODPUT, self._of_goodput(lambda s: [Observation(s.goodput)]), "1",
             "This job's productive training time / its wall time so far."),
            (gauge, semconv.METRIC_BADPUT, self._of_goodput(_badput), "1",
             "This job's unproductive time / its wall time so far, by badput category."),
            (counter, semconv.METRIC_GOODPUT_TIME, self._of_goodput(_seconds_by_category), "s",
             "This job's seconds so far by goodput category (productive, or a badput category)."),
            (counter, semconv.METRIC_JOB_TIME, self._of_goodput(lambda s: [Observation(s.total_s)]), "s",
             "This job's wall time so far: from its first span's start to now, or to its end."),
            (gauge, semconv.METRIC_JOB_START_TIME, self._of_ledger(_job_start), "s",
             "Unix time this job started (its first span's start)."),
            (gauge, semconv.METRIC_JOB_LAST_PROGRESS_TIME, self._of_ledger(_last_progress), "s",
             "Unix time of the end of this job's last closed window of iterations."),
            (gauge, semconv.METRIC_STEP_TIME_IDEAL, self._of_ledger(_ideal), "s",
             "Ideal step time: mean of the steps at most median + 3 MAD."),
            (gauge, semconv.METRIC_STEP_TIME_DEVIATION, self._of_ledger(_deviation), "1",
             "Last window's step time percentiles / ideal step time - 1, by quantile."),
        )  # fmt: skip
        for create, name, callback, unit, description in observed:
            create(name, callbacks=[callback], unit=unit, description=description)

    def stop_window_series(self) -> None:
        """This rank's window series are rank 0's to report (scale mode): from now on every
        ``ml.training.*`` instrument here reports nothing. The gauges' sources become empty,
        the recording instruments no-ops. traintel's own counter of exported iterations stays:
        it is how the reduction itself shows."""
        self.window_series = False
        self.iteration_duration = self.data_loading_duration = NoOpHistogram("")
        self.phase_duration = self.checkpoint_save_duration = NoOpHistogram("")
        self.checkpoint_load_duration = self.checkpoint_size = NoOpHistogram("")

    def _last_window(self) -> WindowReport | None:
        return self._windows.last_window if self.window_series else None

    def _of_ledger(self, observe: Callable[[GoodputLedger], list[Observation]]) -> _Callback:
        """A callback observing the goodput ledger (nothing on a rank that stopped its series)."""
        return lambda options: observe(self._source.goodput) if self.window_series else []

    def _of_goodput(self, observe: Callable[[GoodputSnapshot], list[Observation]]) -> _Callback:
        """A callback observing the job's goodput so far (nothing before the job has any time)."""

        def snapshot(ledger: GoodputLedger) -> list[Observation]:
            now = ledger.snapshot(self._now_ns())
            return observe(now) if now.total_s > 0 else []

        return self._of_ledger(snapshot)

    def _gauge(
        self, meter: metrics_api.Meter, name: str, unit: str, key: str, per_device: bool = False
    ) -> None:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            window = self._last_window()
            if window is None:
                return []
            observations = []
            job = window.get(_W + key)
            if job is not None:
                scope = "job" if per_device else "device"
                observations.append(Observation(job, {semconv.THROUGHPUT_SCOPE: scope}))
            if per_device:
                device = window.get(_W + key + "_per_device")
                if device is not None:
                    observations.append(Observation(device, {semconv.THROUGHPUT_SCOPE: "device"}))
            return observations

        meter.create_observable_gauge(
            name, callbacks=[observe], unit=unit, description=f"Last window's {key}."
        )

    def _phase_times(self, options: CallbackOptions) -> Iterable[Observation]:
        window = self._last_window()
        if window is None:
            return []
        iterations = window.get(_W + "iterations") or 0
        if not iterations:
            return []
        observations = []
        for phase in STEP_PHASE_NAMES:
            total = window.get(_W + "time." + phase)
            if total is not None:
                observations.append(Observation(total / iterations, {semconv.PHASE: phase}))
        return observations

    def window_closed(self, report: WindowReport | None) -> None:
        """A closed window's iteration times and data-loading waits (the window pipeline's
        worker)."""
        if report is None or not self.window_series:
            return
        ordered = report.batch.values if report.batch is not None else sorted(report.durations)
        record_sorted(self.iteration_duration, ordered, DURATION_BUCKETS_S)
        record_sorted(self.data_loading_duration, sorted(report.data_loading_durations), DURATION_BUCKETS_S)

    def _total(self, read: Callable[[], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            total = read()
            return [Observation(total)] if self.window_series and total else []

        return observe

    def _exported(self, options: CallbackOptions) -> Iterable[Observation]:
        source = self._source
        return [
            Observation(source.exported_iterations, {"traintel.exported": True}),
            Observation(source.unexported_iterations, {"traintel.exported": False}),
        ]

    # --- checkpoints (the engine's CheckpointMetrics) -------------------------------------------
    def checkpoint_saved(self, duration_s: float, size_bytes: int | None, strategy: str) -> None:
        attributes = {semconv.CHECKPOINT_STRATEGY: strategy}
        self.checkpoint_save_duration.record(duration_s, attributes)
        if size_bytes is not None:
            self.checkpoint_size.record(size_bytes, attributes)

    def checkpoint_loaded(self, duration_s: float) -> None:
        self.checkpoint_load_duration.record(duration_s)

    def checkpoint_failed(self, phase: str) -> None:
        self.checkpoint_failures.add(1, {semconv.PHASE: phase})

    def background_written(self, size_bytes: int | None) -> None:
        if size_bytes is not None:
            self.checkpoint_size.record(size_bytes, {semconv.CHECKPOINT_STRATEGY: "async"})


def _badput(snapshot: GoodputSnapshot) -> list[Observation]:
    return [Observation(snapshot.badput(c), {semconv.BADPUT_CATEGORY: c}) for c in snapshot.badput_s]


def _seconds_by_category(snapshot: GoodputSnapshot) -> list[Observation]:
    """Monotonic: productive and badput seconds only grow (a window's time is booked when it
    closes); ``other``, the residual that shrinks when a window closes, is left to the backend
    (the job's time less these). A category appears once it has time (most jobs never evaluate
    or load a checkpoint: no series, no bytes)."""
    seconds = {"productive": snapshot.productive_s, **snapshot.badput_s}
    category = semconv.GOODPUT_CATEGORY
    return [Observation(v, {category: name}) for name, v in seconds.items() if v > 0 and name != "other"]


def _job_start(ledger: GoodputLedger) -> list[Observation]:
    return [] if ledger.job_start_ns is None else [Observation(ledger.job_start_ns / 1e9)]


def _last_progress(ledger: GoodputLedger) -> list[Observation]:
    window = ledger.last_window
    return [] if window is None else [Observation(window.end_ns / 1e9)]


def _ideal(ledger: GoodputLedger) -> list[Observation]:
    return [] if ledger.ideal_step_time_s is None else [Observation(ledger.ideal_step_time_s)]


def _deviation(ledger: GoodputLedger) -> list[Observation]:
    """Over the ideal the window was closed with, as its record: the ledger's may already
    include the window the worker is closing."""
    window = ledger.last_window
    ideal = window.ideal_step_time_s if window is not None else None
    if ideal is None or window is None or ideal <= 0:
        return []
    return [
        Observation(value / ideal - 1, {semconv.STEP_TIME_QUANTILE: name})
        for name, value in (("p50", window.p50_s), ("p90", window.p90_s), ("p99", window.p99_s))
    ]
