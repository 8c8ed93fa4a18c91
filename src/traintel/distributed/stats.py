"""Cross-rank statistics of one window: pure arithmetic over every rank's window means.

Why compute time before the synchronisation point: under DDP the gradient all-reduce inside
backward makes every rank wait for the slowest, so every rank's iteration time comes out the
same and comparing them blames nobody. The time a rank spends before it arrives at the
collective is its own; the rank that arrives last is the straggler.

Why an EWMA per rank: one slow window (a GC pause, a noisy neighbour) is a one-off stall; a rank
whose smoothed compute time stays above the others' is chronically lagging (a bad GPU, a hot
node, an unbalanced shard) and is worth a ticket. The ``straggler`` event says which it is.

No torch and no OpenTelemetry here, so every number can be tested exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from traintel import semconv
from traintel._aggregation.aggregator import MAX_WINDOW_ITERATIONS
from traintel._aggregation.stats import percentile

#: Smoothing of the per-rank compute EWMA (weight of the newest window): one window three times
#: slower than the others moves it by a fifth of the gap, below the default straggler factor,
#: while a lag that lasts crosses it within a few windows.
EWMA_ALPHA = 0.1
#: A straggler must lag the other ranks' median by at least this much: below it, differences
#: are timer and scheduler noise on small steps, not a slow rank.
MIN_LAG_S = 0.005
#: The fields every rank contributes per window, in exchange order.
FIELDS = (
    "window_index", "iterations", "iteration_s", "data_loading_s", "compute_s", "sync_marked", "pace_s",
    "warm_up",
)  # fmt: skip
#: Windows that may wait for the exchange thread. More pending means the exchange cannot keep
#: up (a rank is stuck): this rank stops exchanging rather than fall out of step.
MAX_PENDING_WINDOWS = 8
#: Window k's gathered rows size window k + AGREEMENT_LAG: window k + 1 gives the gather time
#: to finish before anyone needs its answer.
AGREEMENT_LAG = 2


def agreed_pace(rows: Sequence[RankWindow]) -> float:
    """The slowest rank's pace in one window's gathered rows (0.0: none): every rank reads the
    same rows, so every rank gets the same float."""
    pace = max((row.pace_s for row in rows), default=0.0)
    return pace if pace > 0 and math.isfinite(pace) else 0.0


def agreed_window_size(rows: Sequence[RankWindow], fewest: int, floor_s: float, ceiling_s: float) -> int:
    """The iterations every rank gives a later window, from one window's gathered rows: at least
    ``fewest`` and ``floor_s`` long, at most ``ceiling_s`` long, at the slowest rank's pace (and
    at most MAX_WINDOW_ITERATIONS, unless ``fewest`` is more).
    Every rank computes it from the same gathered numbers, so every rank gets the same size."""
    pace = agreed_pace(rows)
    if not pace:
        return fewest
    size = max(fewest, min(math.ceil(floor_s / pace), MAX_WINDOW_ITERATIONS))
    if size * pace > ceiling_s:
        size = max(1, math.floor(ceiling_s / pace))
    return size


@dataclass(frozen=True)
class RankWindow:
    """One rank's means over one window (seconds per iteration)."""

    rank: int
    window_index: int
    iterations: int
    iteration_s: float
    data_loading_s: float
    compute_s: float
    sync_marked: bool  # compute measured to a synchronisation point (else: the step minus data)
    #: Its pace: the time from its first iteration's start to its last one's end per iteration
    #: (the time between iterations included), which is how long the rank's windows take.
    pace_s: float
    #: It holds warm-up iterations (compilation, cold caches), which tell no straggler.
    warm_up: bool = False

    def vector(self) -> list[float]:
        """The fixed-size row this rank sends (its rank is its position in the gather)."""
        return [float(getattr(self, name)) for name in FIELDS]

    @classmethod
    def from_vector(cls, rank: int, row: Sequence[float]) -> RankWindow:
        return cls(rank, int(row[0]), int(row[1]), row[2], row[3], row[4], row[5] > 0.5, row[6], row[7] > 0.5)


@dataclass(frozen=True)
class Summary:
    min: float
    median: float
    max: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        ordered = sorted(values)
        return cls(ordered[0], percentile(ordered, 50), ordered[-1], percentile(ordered, 99))

    def items(self) -> tuple[tuple[str, float], ...]:
        return (("min", self.min), ("median", self.median), ("max", self.max), ("p99", self.p99))


@dataclass(frozen=True)
class Straggler:
    rank: int
    compute_s: float
    others_median_s: float
    factor: float  # compute / the other ranks' median
    ewma_s: float
    chronic: bool  # the EWMA too exceeds k times the other ranks' EWMA median

    def attributes(self, window_index: int) -> dict[str, float | int | str | bool]:
        return {
            semconv.STRAGGLER_RANK: self.rank,
            semconv.STRAGGLER_COMPUTE_TIME: self.compute_s,
            semconv.STRAGGLER_MEDIAN_COMPUTE_TIME: self.others_median_s,
            semconv.STRAGGLER_FACTOR: self.factor,
            semconv.STRAGGLER_COMPUTE_EWMA: self.ewma_s,
            semconv.STRAGGLER_CHRONIC: self.chronic,
            semconv.RANKS_PREFIX + "window.index": window_index,
        }


@dataclass(frozen=True)
class CrossRankWindow:
    """The job's view of one window, identical on every rank that computed it."""

    window_index: int
    ranks: int
    iteration: Summary
    data_loading: Summary
    compute: Summary
    compute_mode: str  # sync_point (every rank marked one), step, or mixed
    top_k: tuple[int, ...]  # slowest ranks by compute time, slowest first
    top_k_compute: tuple[float, ...]
    ewma: tuple[float, ...]  # per rank, after this window
    straggler: Straggler | None
    pace: float  # the slowest rank's: what later windows are sized by (agreed_pace)

    def attributes(self) -> dict[str, float | int | str | bool | list[int] | list[float]]:
        """The ``ranks_metrics_update`` event (and job-level summary) attributes."""
        p = semconv.RANKS_PREFIX
        out: dict[str, float | int | str | bool | list[int] | list[float]] = {
            p + "window.index": self.window_index,
            p + "count": self.ranks,
            p + "compute_mode": self.compute_mode,
            p + "top_k": list(self.top_k),
            p + "top_k.compute_time": list(self.top_k_compute),
            p + "pace": self.pace,
        }
        for name, summary in (
            ("iteration_time", self.iteration),
            ("data_loading_time", self.data_loading),
            ("compute_time", self.compute),
        ):
            for statistic, value in summary.items():
                out[f"{p}{name}.{statistic}"] = value
        if self.straggler is not None:
            out[semconv.STRAGGLER_RANK] = self.straggler.rank
        return out


def _compute_mode(rows: list[RankWindow]) -> str:
    """How the window's compute times were measured: every rank at its synchronisation point,
    none (the step less its data wait), or some of each."""
    marked = sum(row.sync_marked for row in rows)
    return "sync_point" if marked == len(rows) else "step" if marked == 0 else "mixed"


def _waited(worst: RankWindow, others: list[RankWindow], lag: float) -> bool:
    """Whether ``worst``'s compute lag may be time it waited in a collective: measured without a
    sync point, with an iteration time lagging the others' median by less than half of it."""
    iteration_lag = worst.iteration_s - percentile(sorted(row.iteration_s for row in others), 50)
    return not worst.sync_marked and iteration_lag < lag / 2


class RankTracker:
    """Per-rank EWMAs across windows: O(world size) memory, whatever the number of windows."""

    def __init__(self, top_k: int = 3, factor: float = 1.25) -> None:
        self.top_k = top_k
        self.factor = factor
        self._ewma: dict[int, float] = {}

    def update(self, rows: Sequence[RankWindow]) -> CrossRankWindow | None:
        """Fold one window's rows (one per rank) in; None if they do not describe one window.
        A window that holds warm-up iterations on any rank names no straggler and leaves the
        EWMAs alone: one rank compiling longer, or missing a cache the others hit, is no lag."""
        rows = [row for row in rows if row.iterations > 0]
        if not rows or len({row.window_index for row in rows}) != 1:
            return None
        warm_up = any(row.warm_up for row in rows)
        if not warm_up:
            self._fold_ewma(rows)
        return self._window(rows, sorted(rows, key=lambda row: (-row.compute_s, row.rank)), warm_up)

    def _window(self, rows: list[RankWindow], by_compute: list[RankWindow], warm_up: bool) -> CrossRankWindow:
        top = by_compute[: self.top_k]
        return CrossRankWindow(
            window_index=rows[0].window_index,
            ranks=len(rows),
            iteration=Summary.of([row.iteration_s for row in rows]),
            data_loading=Summary.of([row.data_loading_s for row in rows]),
            compute=Summary.of([row.compute_s for row in rows]),
            compute_mode=_compute_mode(rows),
            top_k=tuple(row.rank for row in top),
            top_k_compute=tuple(row.compute_s for row in top),
            ewma=tuple(self._ewma.get(rank, 0.0) for rank in range(max(self._ewma, default=-1) + 1)),
            straggler=None if warm_up else self._straggler(by_compute),
            pace=agreed_pace(rows),
        )

    def _fold_ewma(self, rows: list[RankWindow]) -> None:
        for row in rows:
            previous = self._ewma.get(row.rank)
            self._ewma[row.rank] = (
                row.compute_s
                if previous is None
                else EWMA_ALPHA * row.compute_s + (1 - EWMA_ALPHA) * previous
            )

    def _straggler(self, by_compute: list[RankWindow]) -> Straggler | None:
        """The slowest rank by compute time, if it lags the others' median by the factor and the
        noise floor. Without a synchronisation point its compute time is the step less its data
        wait, which holds the time it waited in a collective for a rank whose data came late:
        it is named only if its iteration time lags too (by half the compute lag at least), as
        a rank's that does not wait for the others does. Ranks that synchronise every step have
        equal iteration times, so the rank that waited is not blamed."""
        if len(by_compute) < 2:
            return None
        worst, others = by_compute[0], by_compute[1:]
        median = percentile(sorted(row.compute_s for row in others), 50)
        lag = worst.compute_s - median
        if worst.compute_s <= self.factor * median or lag < MIN_LAG_S or _waited(worst, others, lag):
            return None
        ewma = self._ewma[worst.rank]
        others_ewma = percentile(sorted(self._ewma[row.rank] for row in others), 50)
        factor = worst.compute_s / median if median > 0 else float("inf")
        return Straggler(worst.rank, worst.compute_s, median, factor, ewma, ewma > self.factor * others_ewma)

    def chronic(self, rank: int) -> bool:
        """Whether ``rank``'s EWMA exceeds k times the median EWMA of the other ranks."""
        mine = self._ewma.get(rank)
        others = sorted(value for other, value in self._ewma.items() if other != rank)
        return mine is not None and bool(others) and mine > self.factor * percentile(others, 50)
