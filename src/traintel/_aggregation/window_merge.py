"""One record for several windows in a row: what ties the export volume to time.

Why: a window closes after ``log_every_n_iterations`` once it spans the time floor, or at
MAX_WINDOW_ITERATIONS rows whatever its time (memory). Above 10,000 steps/s the row bound comes
first, and each window leaving as its own ``training_window`` record wrote 194 records in 20 s
at 96,600 steps/s (about 73 MB per rank-hour, against under 1 MB at 10 steps/s). The training
thread still hands over at most that many rows at a time, and every window is accounted as it
closes (the goodput ledger, the metric instruments, the progress mark, the loop's attributes);
only its record waits: windows in a row shorter than the floor become one record, exported once
it spans the floor, when the loop ends, or at shutdown. Records follow the clock, not the rate.
In a job of several ranks every rank must hold the same windows in each record (the offline
commands compare ranks record by record), so there a window's length is the one the ranks
agreed on through the cross-rank exchange (its size at the slowest rank's pace), never a
rank's own clock; the first windows, before any agreement, each leave on their own.

A merged record holds the numbers one window over the same iterations would (sums added: see
``WindowSums.merged``; rates and MFU from the added sums; the slowest step and its iteration),
but for the percentiles, which do not add up: they come from a quantile sketch of all its step
times (within 1 %, as the run's totals), and ``merged_windows`` says how many windows it holds.
Device figures: the memory peaks the largest, device times and their counts added, the rest
(timing modes, cumulative totals) the latest window's.

Pure: no OpenTelemetry, no torch.
"""

from __future__ import annotations

from traintel import semconv
from traintel._aggregation.aggregator import RateInputs, WindowSums, window_attributes
from traintel._aggregation.goodput import WindowGoodput
from traintel._aggregation.stats import QuantileSketch

Value = float | int | str
Attributes = dict[str, Value]

#: Peaks: the merged record's is the largest of its windows'.
_PEAKS = frozenset(
    {
        semconv.WINDOW_DEVICE_MEMORY_PEAK_ALLOCATED,
        semconv.WINDOW_DEVICE_MEMORY_PEAK_RESERVED,
        semconv.WINDOW_PROCESS_PEAK_RSS_SINCE_START,
    }
)
#: Under the device-time prefix but not added: the latest window's.
_DEVICE_LATEST = frozenset({semconv.WINDOW_DEVICE_TIMING_MODE, semconv.WINDOW_DEVICE_TIME_PENDING})
#: The merged record's percentiles: within 1 %, as the run's totals.
RELATIVE_ACCURACY = 0.01


class RecordMerger:
    """The records of windows shorter than the floor, held and merged until they span it."""

    def __init__(self) -> None:
        self._held: WindowGoodput | None = None
        self._held_ns = 0  # how long the held windows are, as the ranks agreed (see add)
        self._sketch: QuantileSketch | None = None  # the held windows' step times, once two are held

    def add(
        self, record: WindowGoodput, floor_ns: int, inputs: RateInputs, agreed_ns: int | None = None
    ) -> list[WindowGoodput]:
        """The records to export now: ``record`` (merged with those held before it) once it
        spans ``floor_ns``, else none (it is held). ``agreed_ns``: the window's length as the
        ranks of a multi-rank job agreed it (its size times the slowest rank's pace), counted in
        place of this process's clock so that every rank groups the same windows."""
        held, ready, held_ns = self._held, [], self._held_ns
        if held is None:
            merged = record
        elif held.sums is None or record.sums is None or record.first_iteration <= held.last_iteration:
            # not mergeable exactly, or numbered back (a rollback to an older checkpoint, which
            # the analysis tells by the ranges): each its own
            ready, merged, held_ns = self.flush(), record, 0
        else:
            merged = self._merge(held, record, held.sums, record.sums, inputs)
        length = merged.end_ns - merged.start_ns if agreed_ns is None else held_ns + agreed_ns
        if length >= floor_ns:
            self._held, self._held_ns, self._sketch = None, 0, None
            ready.append(merged)
        else:
            self._held, self._held_ns = merged, length
        return ready

    def flush(self) -> list[WindowGoodput]:
        """What is held, as it is (the loop ended, or telemetry shuts down)."""
        held, self._held, self._held_ns, self._sketch = self._held, None, 0, None
        return [] if held is None else [held]

    def _merge(
        self, a: WindowGoodput, b: WindowGoodput, a_sums: WindowSums, b_sums: WindowSums, inputs: RateInputs
    ) -> WindowGoodput:
        sketch = self._sketch
        if sketch is None:
            sketch = self._sketch = QuantileSketch(RELATIVE_ACCURACY, exact_limit=0)
            if a_sums.batch is not None:
                sketch.add_many(a_sums.batch)
        if b_sums.batch is not None:
            sketch.add_many(b_sums.batch)
        p50, p90, p99 = sketch.quantiles((0.50, 0.90, 0.99))
        sums = a_sums.merged(b_sums)
        slower = b if b.max_s > a.max_s else a  # the first slowest, as within a window
        metrics = None
        if a.metrics is not None and b.metrics is not None:
            metrics = _merged_metrics(a, b, sums, (p50, p90, p99), inputs)
        return WindowGoodput(  # positional, as the ledger builds them
            a.index, a.first_iteration, b.last_iteration, a.iterations + b.iterations, a.start_ns, b.end_ns,
            a.iteration_time_s + b.iteration_time_s, a.data_loading_s + b.data_loading_s,
            a.nested_badput_s + b.nested_badput_s, a.program_startup_s + b.program_startup_s,
            a.flops + b.flops, b.peak_flops, p50, p90, p99, slower.max_s, slower.slowest_iteration,
            b.ideal_step_time_s, metrics, None, sums, a.windows + b.windows,
            a.sync_compute_s + b.sync_compute_s, a.sync_marked + b.sync_marked,
        )  # fmt: skip


def _merged_metrics(
    a: WindowGoodput, b: WindowGoodput, sums: WindowSums, quantiles: tuple[float, float, float],
    inputs: RateInputs,
) -> Attributes:  # fmt: skip
    """The window numbers of the merged record: rebuilt from the added sums, then what the
    windows' reports were given besides (the device's part, the totals) combined by kind."""
    assert a.metrics is not None and b.metrics is not None
    out, _errors = window_attributes(a.index, a.first_iteration, b.last_iteration, sums, quantiles, inputs)
    for key in {**a.metrics, **b.metrics}:
        if key not in out:
            out[key] = _combined(key, a.metrics.get(key), b.metrics.get(key))
    return out


def _combined(
    key: str, earlier: float | int | str | None, later: float | int | str | None
) -> float | int | str:
    """One attribute of two windows' reports, for the record that holds both."""
    if earlier is None or later is None:
        value = later if earlier is None else earlier
        assert value is not None
        return value
    if isinstance(earlier, str) or isinstance(later, str):
        return later
    if key in _PEAKS:
        return max(earlier, later)
    return earlier + later if _added(key) else later


def _added(key: str) -> bool:
    """Device times and their counts add up; the rest is the latest window's."""
    return key.startswith(semconv.WINDOW_DEVICE_TIME_PREFIX) and key not in _DEVICE_LATEST
