"""Streaming statistics with bounded memory, for numbers that arrive once per iteration.

Why these: a window of N iterations keeps its N values (N is a config knob, so memory is
bounded) and gets exact percentiles; the cumulative view over millions of iterations cannot
keep values, so it uses a log-bucketed quantile sketch whose size depends on the range of
values, not their number.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left, bisect_right
from collections import _count_elements  # type: ignore[attr-defined]
from dataclasses import dataclass, field
from itertools import accumulate, repeat


def percentile(sorted_values: list[float], q: float) -> float:
    """Linearly interpolated percentile (``q`` in 0..100) of an ascending list; NaN if empty.

    The same definition as ``numpy.percentile(..., method="linear")``, so users can check us.
    """
    n = len(sorted_values)
    if n == 0:
        return math.nan
    position = (n - 1) * q / 100.0
    low = int(position)
    high = low + 1 if low + 1 < n else low
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def robust_mean(sorted_values: list[float], k: float = 3.0) -> float:
    """The ideal step time: the mean after dropping values above ``median + k * MAD`` (median
    absolute deviation). Slow outliers (a checkpoint stall, a GC pause) do not inflate it, and
    no arbitrary minimum step length is assumed."""
    if not sorted_values:
        return math.nan
    median = percentile(sorted_values, 50)
    mad = percentile(sorted(abs(v - median) for v in sorted_values), 50)
    limit = median + k * mad
    kept = [v for v in sorted_values if v <= limit]
    return math.fsum(kept) / len(kept)


def _weighted_median_of(values: list[float], counts: list[int]) -> float:
    """The lower median of ascending ``values`` each seen ``counts`` times: the first value at
    which the running count reaches half the total (C-level running sums, then a bisection)."""
    seen = list(accumulate(counts))
    j = bisect_left(seen, seen[-1] / 2)
    return values[min(j, len(values) - 1)]


class RunningStats:
    """Count, sum, min, max, mean and population standard deviation of a stream."""

    __slots__ = ("_m2", "count", "max", "mean", "min", "sum")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.mean = 0.0
        self._m2 = 0.0

    def add(self, value: float) -> None:
        # Welford: numerically stable for long runs of nearly equal step times.
        self.count += 1
        self.sum += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        delta = value - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (value - self.mean)

    def merge(self, values: list[float]) -> None:
        """Add a batch of values at once (Chan et al.'s pairwise combination of moments)."""
        n = len(values)
        if n == 0:
            return
        batch_sum = math.fsum(values)
        batch_mean = batch_sum / n
        deviations = [v - batch_mean for v in values]
        batch_m2 = math.fsum(map(operator.mul, deviations, deviations))
        self.merge_moments(n, batch_sum, batch_mean, batch_m2, min(values), max(values))

    def merge_moments(self, n: int, total: float, mean: float, m2: float, low: float, high: float) -> None:
        """Add a batch given by its moments (a window that computed them already)."""
        if n == 0:
            return
        count = self.count + n
        delta = mean - self.mean
        self._m2 += m2 + delta * delta * self.count * n / count
        self.mean += delta * n / count
        self.count = count
        self.sum += total
        self.min = min(self.min, low)
        self.max = max(self.max, high)

    @property
    def stddev(self) -> float:
        return math.sqrt(self._m2 / self.count) if self.count else math.nan


class IndexedBatch:
    """A batch of values (a window's step times) counted per sketch bucket, at most once: the
    run's totals and the goodput ledger sketch the same values at the same accuracy, and
    bucketing is most of what adding a batch costs."""

    __slots__ = ("_log_gamma", "_tally", "values", "zeros")

    def __init__(self, values: list[float]) -> None:
        self.values = values
        self._tally: dict[int, int] | None = None
        self._log_gamma = 0.0
        self.zeros = 0

    def tally(self, log_gamma: float) -> dict[int, int]:
        """How many positive values fall in each bucket ``ceil(log2(v) / log2(gamma))``
        (``log_gamma`` is ``log2(gamma)``); ``zeros`` counts the others. A window's step times
        fill a handful of buckets, so the sketches merge a few counts instead of a value each.
        Base 2 because ``math.log2`` takes its argument directly, where ``math.log`` (which
        also takes a base) parses an argument tuple: half the cost per value."""
        if self._tally is None or log_gamma != self._log_gamma:
            values = self.values
            inverse = 1.0 / log_gamma  # as in QuantileSketch.add (multiplication commutes exactly)
            ceil, log2 = math.ceil, math.log2
            # zeros (and NaN, never a bucket) left out
            indices = [ceil(inverse * log2(v)) for v in values if v > 0.0]
            tally: dict[int, int] = {}
            # Counter.update's own helper (always defined, in C on CPython): update() itself first
            # asks isinstance(x, Mapping), an ABC check
            _count_elements(tally, indices)
            self._tally = tally
            self.zeros = len(values) - len(indices)
            self._log_gamma = log_gamma
        return self._tally


@dataclass(slots=True, eq=False)
class QuantileSketch:
    """Exact quantiles for the first ``exact_limit`` values, then a relative-error sketch.

    Short runs get the same linear-interpolated percentiles as the windows. Past the limit the
    values fold into logarithmic buckets (the DDSketch idea): a quantile is answered with its
    bucket's representative value, within ``relative_accuracy`` of the true sample quantile, and
    never outside the smallest and largest value seen (which the true quantile cannot be): steps
    that all take the same time get that time back, not their bucket's representative.
    Memory is one counter per occupied bucket: with 1 % accuracy, values from 1 µs to 1 day
    occupy at most ~1,300 buckets, whatever the number of iterations.
    """

    relative_accuracy: float = 0.01
    exact_limit: int = 2048
    _gamma: float = field(init=False)
    _log_gamma: float = field(init=False)  # bucket indices in base 2 (see IndexedBatch)
    _counts: dict[int, int] = field(init=False, default_factory=dict)  # occupied bucket index -> values in it
    #: The sorted bucket indices, kept while no bucket is added (the quantiles at every window
    #: close are then one C-level running sum in key order).
    _keys: list[int] = field(init=False, default_factory=list)
    _exact: list[float] | None = field(init=False, default_factory=list)
    count: int = field(init=False, default=0)
    zeros: int = field(init=False, default=0)
    low: float = field(init=False, default=math.inf)  # the smallest value seen
    high: float = field(init=False, default=-math.inf)  # the largest

    def __post_init__(self) -> None:
        if not 0 < self.relative_accuracy < 1:
            raise ValueError(f"relative_accuracy={self.relative_accuracy!r}: expected 0 < a < 1")
        self._gamma = (1 + self.relative_accuracy) / (1 - self.relative_accuracy)
        self._log_gamma = math.log2(self._gamma)

    @property
    def is_exact(self) -> bool:
        return self._exact is not None

    def add_many(self, values: list[float] | IndexedBatch) -> None:
        """Add a batch (a window's values): one C-level sort instead of an insort per value;
        an :class:`IndexedBatch` shares its bucket counts with other sketches."""
        batch = values if isinstance(values, IndexedBatch) else IndexedBatch(values)
        if batch.values:
            low, high = min(batch.values), max(batch.values)
            self.low, self.high = min(self.low, low), max(self.high, high)
        exact = self._exact
        if exact is None:
            self._merge(batch.tally(self._log_gamma))
            self.zeros += batch.zeros
            self.count += len(batch.values)
            return
        exact.extend(batch.values)
        exact.sort()  # timsort merges the two sorted runs in linear time
        self.count += len(batch.values)
        if len(exact) > self.exact_limit:
            self._exact = None
            folded = IndexedBatch(exact)
            self._merge(folded.tally(self._log_gamma))
            self.zeros += folded.zeros

    def _merge(self, tally: dict[int, int]) -> None:
        """Add bucket counts (a window's step times fill a handful of buckets)."""
        counts = self._counts
        get = counts.get
        for index, n in tally.items():
            counts[index] = get(index, 0) + n

    def _sorted_keys(self) -> list[int]:
        keys = self._keys
        if len(keys) != len(self._counts):  # buckets are only ever added: same length, same keys
            keys = self._keys = sorted(self._counts)
        return keys

    def bucket_counts(self) -> list[tuple[int, int]]:
        """``(bucket index, count)`` of every occupied bucket, ascending."""
        return sorted(self._counts.items())

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1): the value of rank ``q * (count - 1)``."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: tuple[float, ...]) -> list[float]:
        """Several quantiles (ascending ``qs``) in one walk over the buckets: the totals ask for
        p50, p90 and p99 at every window close."""
        if self.count == 0:
            return [math.nan] * len(qs)
        if self._exact is not None:
            return [percentile(self._exact, q * 100) for q in qs]
        counts, gamma = self._counts, self._gamma
        keys = self._sorted_keys()
        # seen[j]: values at or below bucket keys[j - 1] (seen[0]: the zeros); C-level sums.
        seen = list(accumulate(map(counts.__getitem__, keys), initial=self.zeros))
        out: list[float] = []
        for q in qs:
            # the first j with seen[j] > rank: rank below the zeros' count is 0, past the end the top
            j = bisect_right(seen, q * (self.count - 1))
            if j == 0:
                out.append(0.0)
            else:
                index = keys[j - 1] if j <= len(keys) else keys[-1]
                out.append(min(max(2 * gamma**index / (gamma + 1), self.low), self.high))
        return out

    def robust_mean(self, k: float = 3.0) -> float:
        """Mean of the values at most ``median + k * MAD`` (exact while exact; from bucket
        representatives, so within the sketch's relative accuracy, after that)."""
        if self.count == 0:
            return math.nan
        if self._exact is not None:
            return robust_mean(self._exact, k)
        gamma = self._gamma
        keys = self._sorted_keys()
        counts = list(map(self._counts.__getitem__, keys))
        # each bucket's representative, 2 * gamma**index / (gamma + 1), as in quantiles()
        doubled = map(operator.mul, repeat(2), map(gamma.__pow__, keys))
        values: list[float] = list(map(operator.truediv, doubled, repeat(gamma + 1)))
        if self.zeros:
            values.insert(0, 0.0)
            counts.insert(0, self.zeros)
        median = _weighted_median_of(values, counts)
        spread = list(map(abs, map(operator.sub, values, repeat(median))))
        order = sorted(range(len(spread)), key=spread.__getitem__)
        limit = median + k * _weighted_median_of(
            list(map(spread.__getitem__, order)), list(map(counts.__getitem__, order))
        )
        kept = bisect_right(values, limit)  # values ascend: the kept ones are a prefix
        weighted: float = sum(map(operator.mul, values[:kept], counts[:kept]))
        return min(max(weighted / sum(counts[:kept]), self.low), self.high)
