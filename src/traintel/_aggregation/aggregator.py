"""Training metrics from per-iteration observations: windows, totals, checkpoints, evaluation.

Pure arithmetic, no OpenTelemetry and no torch, so every formula can be tested with exact
numbers. Memory is O(window size + sketch buckets), never O(iterations).

Definitions (the README repeats them):

* An iteration is one optimizer step. Its samples, tokens, padding tokens and FLOPs are this
  rank's work in that step (micro-batches summed), never cumulative counters.
* Window = consecutive iterations (tumbling; when one closes is the recorder's choice, at most
  MAX_WINDOW_ITERATIONS unless ``log_every_n_iterations`` asks for more). Totals = every
  iteration after the first ``warmup_iterations`` of the job.
* per-device samples/s = Σ samples / Σ duration of the iterations that reported samples;
  job samples/s = per-device × world size (assumes balanced ranks; stated in
  ``ml.training.throughput.aggregation``). Tokens likewise.
* FLOPs of an iteration = given FLOPs, else flops_per_token × tokens, else flops_per_sample ×
  samples. FLOP/s per device = Σ FLOPs / Σ duration of iterations with FLOPs.
* MFU = FLOP/s per device / dense peak FLOP/s of the device; HFU the same with executed
  (recompute-included) FLOPs. A value above 1 is reported as an error, not as a metric.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from itertools import compress, repeat
from typing import Any

from traintel import semconv
from traintel._aggregation.stats import IndexedBatch, QuantileSketch, RunningStats, percentile
from traintel._aggregation.window import ClosedWindow, ModelMetric, RawRow, Row, columns

#: The most iterations a window holds (unless ``log_every_n_iterations`` is larger), whatever its
#: floor in time: a loop of 100,000 iterations/s would otherwise keep a million rows (~300 MB)
#: to its 10 s floor. 10,000 rows are ~1.5 MB.
MAX_WINDOW_ITERATIONS = 10_000

_W = semconv.WINDOW_PREFIX
_T = semconv.TOTAL_PREFIX


class _Prefixed(dict[str, str]):
    """``prefix + name``, built once per name: a window event has ~60 keys, and a new string
    per key per window (concatenated, then hashed on insertion) was a tenth of its cost."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def __missing__(self, name: str) -> str:
        key = self[name] = self.prefix + name
        return key


_KEYS = {prefix: _Prefixed(prefix) for prefix in (_W, _T)}
#: ``WINDOW_PREFIX + name`` and ``TOTAL_PREFIX + name``, built once per name (goodput too).
WINDOW_KEYS, TOTAL_KEYS = _KEYS[_W], _KEYS[_T]
#: Indices of the step-phase timings carried with each iteration.
DATA, FORWARD, BACKWARD, OPTIMIZER = range(4)
STEP_PHASE_NAMES = ("data_loading", "forward", "backward", "optimizer")
_TIME_NAMES = tuple("time." + name for name in STEP_PHASE_NAMES)
#: The window attributes every window has, in the order ``window_attributes`` gives their values.
_WINDOW_HEAD = tuple(
    WINDOW_KEYS[name]
    for name in (
        "index", "iterations", "first_iteration", "last_iteration", "iteration_time.min",
        "iteration_time.mean", "iteration_time.max", "iteration_time.p50", "iteration_time.p90",
        "iteration_time.p99", "iteration_time.stddev", "samples", "tokens", "padding_tokens",
        "nonfinite_iterations", "slow_iterations", "exported_iterations",
    )
)  # fmt: skip
#: Where each step phase's time goes in those timings, by phase (span) name.
STEP_INDEX = {
    semconv.Phase.DATA_LOADING.value: DATA,
    semconv.Phase.MODEL_FORWARD.value: FORWARD,
    semconv.Phase.MODEL_BACKWARD.value: BACKWARD,
    semconv.Phase.OPTIMIZER_UPDATE.value: OPTIMIZER,
}


@dataclass(frozen=True)
class RateInputs:
    """What turns counts into rates: resolved once per window from the configuration."""

    world_size: int = 1
    peak_flops: float | None = None
    peak_source: str | None = None
    peak_missing_reason: str | None = None
    flops_method: str | None = None
    executed_flops_ratio: float | None = None  # executed / model FLOPs, from the counter
    timing_mode: str = "wall_clock"
    peak_dtype: str | None = None  # the peak table's column, and why (traintel._host.compute_dtype)
    peak_dtype_reason: str | None = None
    measured_peak_flops: float | None = None  # the calibrated matmul peak (traintel._host.calibration)
    measured_peak_method: str | None = None


def seconds_of(nanoseconds: object) -> list[float]:
    """``[v / 1e9 for v in nanoseconds]`` with C-level iterators (exactly the same divisions)."""
    return list(map(operator.truediv, nanoseconds, repeat(1e9)))  # type: ignore[call-overload]


def _column(
    values: tuple[float | None, ...], durations: tuple[int, ...], total_ns: int
) -> tuple[float, float]:
    """The sum of a count column and the time (s) of the iterations that reported it."""
    missing = values.count(None)
    if not missing:
        return float(sum(values)), total_ns / 1e9  # type: ignore[arg-type]
    if missing == len(values):  # the common case without counts: no per-value bytecode
        return 0.0, 0.0
    present = [v is not None for v in values]  # (no tuple per row: see window.columns)
    return float(sum(compress(values, present))), sum(compress(durations, present)) / 1e9  # type: ignore[arg-type]


@dataclass
class _Counts:
    """Sums over a set of iterations; shared by windows and totals."""

    iterations: int = 0
    duration_s: float = 0.0
    samples: float = 0.0
    samples_time: float = 0.0
    tokens: float = 0.0
    tokens_time: float = 0.0
    padding: float = 0.0
    flops: float = 0.0
    flops_time: float = 0.0
    phase_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])

    @classmethod
    def of_columns(cls, table: tuple[tuple[Any, ...], ...]) -> _Counts:
        """Sums of a window's rows as columns (``window.columns``), taken with C-level ``sum``
        (the per-step path only appends a row; folding each step into running sums cost more
        than the step). Durations are summed in integer nanoseconds, so the sums are exact
        before conversion. The step-phase columns hold None where an iteration did not time them."""
        durations, samples, tokens, padding, flops, *phases, _numbers, _ends = table
        counts = cls()
        total_ns = sum(durations)
        counts.iterations = len(durations)
        counts.duration_s = total_ns / 1e9
        counts.samples, counts.samples_time = _column(samples, durations, total_ns)
        counts.tokens, counts.tokens_time = _column(tokens, durations, total_ns)
        counts.padding = _column(padding, durations, total_ns)[0]
        counts.flops, counts.flops_time = _column(flops, durations, total_ns)
        if phases[0].count(None) < len(phases[0]):
            counts.phase_s = [sum(filter(None, column)) / 1e9 for column in phases]
        return counts

    def merge(self, other: _Counts) -> None:
        """Add another set of sums."""
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for i in range(4):
            self.phase_s[i] += other.phase_s[i]

    def rates(
        self, inputs: RateInputs, prefix: str, out: dict[str, float | int | str], split: bool = True
    ) -> list[str]:
        """Throughput, FLOP/s, MFU/HFU into ``out`` (and, with ``split``, the per-device rates,
        padding and the step-phase time split); returns MFU/HFU range errors."""
        errors: list[str] = []
        keys = _KEYS[prefix]
        for what, amount, seconds in (
            ("samples", self.samples, self.samples_time),
            ("tokens", self.tokens, self.tokens_time),
        ):
            if seconds > 0:  # per device; for the job, assuming balanced ranks
                per_device = amount / seconds
                if split:
                    out[keys[what + "_per_second_per_device"]] = per_device
                out[keys[what + "_per_second"]] = per_device * inputs.world_size
        if self.flops_time > 0:
            flops_per_second = self.flops / self.flops_time
            out[keys["flops_per_second_per_device"]] = flops_per_second
            out[keys["tflops_per_device"]] = flops_per_second / 1e12
            if inputs.peak_flops or inputs.measured_peak_flops:
                errors = _utilization(flops_per_second, inputs, keys, out)
        if split:
            self._split(keys, out)
        return errors

    def _split(self, keys: _Prefixed, out: dict[str, float | int | str]) -> None:
        """Padding, and the step-phase time split."""
        if self.padding > 0 and self.tokens + self.padding > 0:
            out[keys["padding_fraction"]] = self.padding / (self.tokens + self.padding)
        if self.duration_s > 0:
            out.update(zip(map(keys.__getitem__, _TIME_NAMES), self.phase_s, strict=True))
            out[keys["data_loading_fraction"]] = self.phase_s[DATA] / self.duration_s


#: The fields of :class:`_Counts` that add up as they are (the step-phase split adds per phase).
_SUMMED = tuple(f.name for f in fields(_Counts) if f.name != "phase_s")


def _utilization(
    flops_per_second: float, inputs: RateInputs, keys: _Prefixed, out: dict[str, float | int | str]
) -> list[str]:
    """MFU (and HFU, given the executed FLOPs ratio) into ``out``; a value above 1 is not a
    metric but an error, returned."""
    errors: list[str] = []
    if inputs.measured_peak_flops:
        measured = flops_per_second / inputs.measured_peak_flops
        if measured <= 1:
            out[keys["mfu_measured"]] = measured
        else:
            errors.append(f"mfu against the measured peak {measured:.3f} > 1")
    if not inputs.peak_flops:
        return errors
    mfu = flops_per_second / inputs.peak_flops
    if mfu <= 1:
        out[keys["mfu"]] = mfu
    else:
        errors.append(f"mfu {mfu:.3f} > 1")
    if inputs.executed_flops_ratio is not None:
        hfu = mfu * inputs.executed_flops_ratio
        if hfu <= 1:
            out[keys["hfu"]] = hfu
        else:
            errors.append(f"hfu {hfu:.3f} > 1")
    return errors


@dataclass
class WindowSums:
    """A window's numbers as sums, counts and extremes: what the record of several windows in a
    row is made of, exactly (``window_merge``). Its percentiles are not here: they do not add up
    (``batch``, the window's step times with their sketch buckets, feeds a sketch instead)."""

    counts: _Counts
    #: Sum of squared deviations of the step times from their mean, the fastest and slowest (s).
    m2: float
    low: float
    high: float
    nonfinite_iterations: int
    slow_iterations: int
    exported_iterations: int
    metrics: dict[str, ModelMetric]
    batch: IndexedBatch | None = None

    def merged(self, later: WindowSums) -> WindowSums:
        """These windows' sums and a later window's: counts and sums added, the variance by
        Chan's pairwise combination, each model metric's sum and count added and its last value
        the later one's (the sketch batch is not carried: the merger holds the sketch)."""
        counts = _Counts()
        counts.merge(self.counts)
        counts.merge(later.counts)
        na, nb = self.counts.iterations, later.counts.iterations
        delta = later.counts.duration_s / nb - self.counts.duration_s / na
        metrics = dict(self.metrics)
        for name, metric in later.metrics.items():
            earlier = metrics.get(name)
            if earlier is not None:
                combined = metrics[name] = ModelMetric()
                combined.sum, combined.count = earlier.sum + metric.sum, earlier.count + metric.count
                combined.last = metric.last
            else:
                metrics[name] = metric
        return WindowSums(
            counts, self.m2 + later.m2 + delta * delta * na * nb / (na + nb),
            min(self.low, later.low), max(self.high, later.high),
            self.nonfinite_iterations + later.nonfinite_iterations,
            self.slow_iterations + later.slow_iterations,
            self.exported_iterations + later.exported_iterations,
            metrics,
        )  # fmt: skip


def window_attributes(
    index: int, first_iteration: int, last_iteration: int, sums: WindowSums,
    quantiles: tuple[float, float, float], inputs: RateInputs,
) -> tuple[dict[str, float | int | str], list[str]]:  # fmt: skip
    """A window's ``training_metrics_update`` attributes (without the totals) from its sums and
    percentiles, and the MFU/HFU range errors: one window's, or several merged."""
    counts = sums.counts
    n = counts.iterations
    p50, p90, p99 = quantiles
    attributes: dict[str, float | int | str] = dict(
        zip(
            _WINDOW_HEAD,
            (
                index, n, first_iteration, last_iteration, sums.low, counts.duration_s / n, sums.high,
                p50, p90, p99, math.sqrt(sums.m2 / n), counts.samples, counts.tokens, counts.padding,
                sums.nonfinite_iterations, sums.slow_iterations, sums.exported_iterations,
            ),
            strict=True,
        )
    )  # fmt: skip
    errors = counts.rates(inputs, _W, attributes)
    for name, metric in sums.metrics.items():
        # not through WINDOW_KEYS: user metric names are the user's, and that cache never shrinks
        attributes[_W + "metric." + name + ".last"] = metric.last
        if metric.count:
            attributes[_W + "metric." + name + ".mean"] = metric.sum / metric.count
    _describe_inputs(inputs, attributes)
    return attributes, errors


@dataclass
class WindowReport:
    """One closed window: the ``training_metrics_update`` attributes and gauge values."""

    index: int
    first_iteration: int
    last_iteration: int
    attributes: dict[str, float | int | str]
    errors: list[str]
    #: The window's raw material for goodput: durations in arrival order (seconds), its time
    #: span (first iteration's start to last iteration's end) and its sums.
    durations: list[float] = field(default_factory=list)
    #: The same durations (ascending) with their sketch bucket counts (computed once, shared).
    batch: IndexedBatch | None = None
    start_ns: int = 0
    end_ns: int = 0
    duration_s: float = 0.0
    data_loading_s: float = 0.0
    flops: float = 0.0
    #: Data-loading wait (s) of each iteration that timed its step phases, in arrival order.
    data_loading_durations: list[float] = field(default_factory=list)
    #: p50, p90, p99 and max of ``durations`` (s), as in ``attributes``.
    quantiles: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    #: Categorised phases inside its iterations (s), and the synchronisation-point compute
    #: time summed over the iterations that marked it (see ``ClosedWindow``).
    nested_badput_s: float = 0.0
    sync_compute_ns: int = 0
    sync_marked: int = 0
    #: The window's sums, for a record that merges it with the windows after it.
    sums: WindowSums | None = None
    #: Each iteration's data-loading wait (ns; None where it timed no step phases), in the
    #: order of ``durations``.
    data_loading_column: Sequence[int | None] = ()
    #: The job's warm-up iterations among its rows (the first ones): compilation, cold caches.
    warm: int = 0

    def get(self, key: str) -> float | None:
        value = self.attributes.get(key)
        return float(value) if isinstance(value, int | float) else None


class TrainingAggregator:
    """Streaming training statistics for one job on one rank: a closed window in, its report
    out, the totals carried from one window to the next."""

    def __init__(self, warmup_iterations: int = 1) -> None:
        self.warmup_iterations = warmup_iterations
        #: Windows reported so far (a window whose report failed is not one).
        self.windows_closed = 0
        self.iterations_seen = 0  # in the windows closed so far
        self.first_iteration_s: float | None = None
        self.total = _Counts()
        self._total_stats = RunningStats()
        self._total_sketch = QuantileSketch(0.01)
        self.last_window: WindowReport | None = None

    # --- window boundary ------------------------------------------------------------------------
    def close_window(self, window: ClosedWindow, inputs: RateInputs) -> WindowReport | None:
        """The closed window's report (None for a window without iterations). Its iterations
        count as seen even if the report fails: the next window's totals go on from them."""
        rows, seen_before = window.rows, window.seen_before
        if not rows:
            return None
        self.iterations_seen = seen_before + len(rows)
        first, last = Row._make(rows[0]), Row._make(rows[-1])
        if self.first_iteration_s is None and not seen_before:
            self.first_iteration_s = first.duration_ns / 1e9
        warm = min(max(self.warmup_iterations - seen_before, 0), len(rows))  # the job's first rows
        table = columns(rows)
        durations_ns, _samples, _tokens, _padding, _flops, data_loading_ns, *_rest = table
        counts = _Counts.of_columns(table)
        durations = seconds_of(durations_ns)
        ordered = sorted(durations)
        batch = IndexedBatch(ordered)  # bucket counts do not depend on the order
        n = len(ordered)
        mean = counts.duration_s / n
        deviations = list(map(operator.sub, ordered, repeat(mean)))
        m2 = math.fsum(map(operator.mul, deviations, deviations))
        low, high = ordered[0], ordered[-1]
        moments = (n, counts.duration_s, mean, m2, low, high)
        self._fold_into_totals(rows, durations, warm, counts, batch, moments)
        p50, p90, p99 = percentile(ordered, 50), percentile(ordered, 90), percentile(ordered, 99)
        sums = WindowSums(
            counts, m2, low, high, window.nonfinite_iterations, window.slow_iterations,
            window.exported_iterations, window.metrics, batch,
        )  # fmt: skip
        attributes, errors = window_attributes(
            window.index, first.iteration, last.iteration, sums, (p50, p90, p99), inputs
        )
        self._totals(inputs, attributes)
        report = WindowReport(
            window.index,
            first.iteration,
            last.iteration,
            attributes,
            errors,
            durations,
            batch,
            first.start_ns,
            last.end_ns,
            counts.duration_s,
            counts.phase_s[DATA],
            counts.flops,
            seconds_of(wait for wait in data_loading_ns if wait is not None),
            (p50, p90, p99, high),
            window.nested_s,
            window.sync_compute_ns,
            window.sync_marked,
            sums,
            data_loading_ns,
            warm,
        )
        self.windows_closed += 1
        self.last_window = report
        return report

    def _fold_into_totals(
        self,
        rows: list[RawRow],
        durations: list[float],
        warm: int,
        counts: _Counts,
        batch: IndexedBatch,
        moments: tuple[int, float, float, float, float, float],
    ) -> None:
        """Add the window's post-warm-up iterations to the totals (Chan's parallel merge for
        the mean and variance: exact and stable, with no per-iteration cost). A window with no
        warm-up rows (all but the first) hands over the moments and bucket indices it has."""
        if not warm:
            self.total.merge(counts)
            self._total_stats.merge_moments(*moments)
            self._total_sketch.add_many(batch)
            return
        post = durations[warm:]  # in arrival order: the warm-up rows are the first ones
        if not post:
            return
        self.total.merge(_Counts.of_columns(columns(rows[warm:])))
        self._total_stats.merge(post)
        self._total_sketch.add_many(post)

    def _totals(self, inputs: RateInputs, out: dict[str, float | int | str]) -> None:
        out[TOTAL_KEYS["iterations"]] = self.iterations_seen
        stats = self._total_stats
        if stats.count:
            out[TOTAL_KEYS["iteration_time.mean"]] = stats.mean
            out[TOTAL_KEYS["iteration_time.stddev"]] = stats.stddev
            p50, p90, p99 = self._total_sketch.quantiles((0.50, 0.90, 0.99))
            out[TOTAL_KEYS["iteration_time.p50"]] = p50
            out[TOTAL_KEYS["iteration_time.p90"]] = p90
            out[TOTAL_KEYS["iteration_time.p99"]] = p99
            self.total.rates(inputs, _T, out, split=False)  # the totals carry no time split

    # --- end of loop ----------------------------------------------------------------------------
    def summary(self, inputs: RateInputs, train_time_s: float | None) -> dict[str, float | int | str]:
        """The at-a-glance numbers for the training_loop span."""
        out: dict[str, float | int | str] = {semconv.SUMMARY_PREFIX + "iterations": self.iterations_seen}
        if train_time_s is not None:
            out[semconv.SUMMARY_PREFIX + "train_time"] = train_time_s
        if self.first_iteration_s is not None:
            out[semconv.SUMMARY_PREFIX + "first_iteration_time"] = self.first_iteration_s
        totals: dict[str, float | int | str] = {}
        self._totals(inputs, totals)
        for key, value in totals.items():
            out[semconv.SUMMARY_PREFIX + key[len(_T) :]] = value
        if semconv.SUMMARY_PREFIX + "mfu" in out or semconv.SUMMARY_PREFIX + "mfu_measured" in out:
            # what the run's MFU was computed from
            for key, value in (
                (semconv.MFU_NUMERATOR, out[semconv.SUMMARY_PREFIX + "flops_per_second_per_device"]),
                (semconv.MFU_FLOPS_METHOD, inputs.flops_method or "config"),
                (semconv.MFU_TIMING_MODE, inputs.timing_mode),
                *_peak_attributes(inputs).items(),
            ):
                out[semconv.SUMMARY_PREFIX + key.removeprefix("ml.training.")] = value
        return out


def _describe_inputs(inputs: RateInputs, out: dict[str, float | int | str]) -> None:
    out[semconv.THROUGHPUT_AGGREGATION] = f"rank x world_size ({inputs.world_size})"
    if WINDOW_KEYS["flops_per_second_per_device"] in out:
        out[semconv.MFU_TIMING_MODE] = inputs.timing_mode
        out[semconv.MFU_FLOPS_METHOD] = inputs.flops_method or "config"
        if inputs.peak_flops or inputs.measured_peak_flops:
            out[semconv.MFU_NUMERATOR] = out[WINDOW_KEYS["flops_per_second_per_device"]]
            out.update(_peak_attributes(inputs))


def _peak_attributes(inputs: RateInputs) -> dict[str, float | int | str]:
    """The denominators behind MFU: the datasheet's (and its source and dtype, with why that
    dtype) and the measured one, where each exists."""
    out: dict[str, float | int | str] = {}
    if inputs.peak_flops:
        out[semconv.MFU_DENOMINATOR] = inputs.peak_flops
        out[semconv.MFU_PEAK_SOURCE] = inputs.peak_source or "config"
    if inputs.peak_dtype is not None:
        out[semconv.MFU_DTYPE] = inputs.peak_dtype
        out[semconv.MFU_DTYPE_REASON] = inputs.peak_dtype_reason or ""
    if inputs.measured_peak_flops:
        out[semconv.MFU_MEASURED_PEAK] = inputs.measured_peak_flops
        out[semconv.MFU_MEASURED_PEAK_METHOD] = inputs.measured_peak_method or ""
    return out


class CheckpointStats:
    """Checkpoint saves and loads: counts, times (blocking part), bytes, stages."""

    def __init__(self) -> None:
        self.saves = RunningStats()
        self.first_save_s: float | None = None
        self.last_save_s: float | None = None
        self.bytes = 0
        self.background = RunningStats()
        self.loads = RunningStats()
        self.stages: dict[str, float] = {}
        self.by_strategy: dict[str, int] = {}

    def add_save(self, duration_s: float, size_bytes: int | None, strategy: str) -> None:
        self.saves.add(duration_s)
        if self.first_save_s is None:
            self.first_save_s = duration_s
        self.last_save_s = duration_s
        self.by_strategy[strategy] = self.by_strategy.get(strategy, 0) + 1
        if size_bytes is not None:
            self.bytes += size_bytes

    def add_background(self, duration_s: float, size_bytes: int | None) -> None:
        self.background.add(duration_s)
        if size_bytes is not None:
            self.bytes += size_bytes

    def add_load(self, duration_s: float) -> None:
        self.loads.add(duration_s)

    def add_stage(self, stage: str, duration_s: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + duration_s

    def attributes(self, prefix: str = semconv.CHECKPOINT_PREFIX) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {prefix + "saves": self.saves.count}
        if self.saves.count:
            out[prefix + "save_time.first"] = self.first_save_s or 0.0
            out[prefix + "save_time.last"] = self.last_save_s or 0.0
            out[prefix + "save_time.min"] = self.saves.min
            out[prefix + "save_time.max"] = self.saves.max
            out[prefix + "save_time.mean"] = self.saves.mean
            out[prefix + "save_time.total"] = self.saves.sum
        if self.bytes:
            out[prefix + "bytes.total"] = self.bytes
        if self.background.count:
            out[prefix + "background_time.total"] = self.background.sum
            out[prefix + "background_time.max"] = self.background.max
        if self.loads.count:
            out[prefix + "loads"] = self.loads.count
            out[prefix + "load_time.total"] = self.loads.sum
        for stage, seconds in sorted(self.stages.items()):
            out[prefix + "stage." + stage + ".time_total"] = seconds
        return out


class EvalStats:
    """One validation or testing loop."""

    def __init__(self) -> None:
        self.durations = RunningStats()
        self.samples = 0.0
        self.metrics: dict[str, ModelMetric] = {}

    def add_iteration(self, duration_ns: int, samples: float | None) -> None:
        self.durations.add(duration_ns / 1e9)
        if samples is not None:
            self.samples += samples

    def attributes(self, loop_duration_s: float) -> dict[str, float | int | str]:
        p = semconv.EVAL_PREFIX
        out: dict[str, float | int | str] = {
            p + "iterations": self.durations.count,
            p + "duration": loop_duration_s,
        }
        if self.durations.count:
            out[p + "iteration_time.mean"] = self.durations.mean
            out[p + "iteration_time.max"] = self.durations.max
        if self.samples:
            out[p + "samples"] = self.samples
            if self.durations.sum > 0:
                out[p + "samples_per_second"] = self.samples / self.durations.sum
        for name, metric in self.metrics.items():
            out[p + "metric." + name + ".last"] = metric.last
            if metric.count:
                out[p + "metric." + name + ".mean"] = metric.sum / metric.count
        return out
