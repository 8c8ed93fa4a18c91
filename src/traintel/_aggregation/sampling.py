"""Which iterations become exported spans: the tail-sampling policy.

Why tail sampling: a run of a million steps must not send four million spans, but the steps
a user opens in Jaeger — the first ones, a regular sample to compare against, the slow ones,
the failed ones — must be there whole. Every iteration is counted in the metrics whatever
this policy says.

Head reasons (known when the iteration starts): first K, every M-th iteration number, "all".
Tail reasons (known when it ends): slower than k x the rolling median of recent iterations,
an error, a non-finite model metric. "Every M-th" uses the iteration number, so all ranks of a
job export the same iterations and can be compared side by side.

Why the rates are tied to time: what a rank exports per hour must not grow with its step rate
(a backend holds bytes per hour, not per step). The every-M-th stride doubles (M, 2M, 4M ...)
until the sampled iterations are at least ``every_s`` apart at the loop's pace, so a faster
loop samples bigger multiples of M: every rank keeps exporting iteration numbers that are
multiples of M, and ranks that agree on the pace agree on the stride. Slow and non-finite
iterations (which a noisy or diverging loop can produce at every step) draw on a token bucket
refilled at ``tail_per_minute``; errors always go out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from traintel._aggregation.stats import percentile

#: Recent iterations the slow-iteration median is taken over; and how many it needs first.
MEDIAN_WINDOW = 101
MEDIAN_MIN_SAMPLES = 10
#: The largest stride, as a power of two times M: beyond any loop's pace.
MAX_STRIDE_DOUBLINGS = 40
#: The tail bucket holds this many minutes' allowance: a burst at the start, or after a quiet
#: spell, is exported whole up to it.
TAIL_BURST_MINUTES = 2.0
_NS_PER_MINUTE = 60e9


def stride_for(every_n: int, every_s: float, seconds_per_iteration: float) -> int:
    """Every-M-th tied to time: the smallest ``M * 2**k`` whose iterations span ``every_s`` at
    this pace (M itself without a time floor or a pace)."""
    stride = every_n
    if every_n <= 0 or every_s <= 0 or not seconds_per_iteration > 0:
        return stride
    doublings = 0
    while stride * seconds_per_iteration < every_s and doublings < MAX_STRIDE_DOUBLINGS:
        stride *= 2
        doublings += 1
    return stride


def _first_ns_above(seconds: float) -> float:
    """The smallest integer ``d`` with ``d / 1e9 > seconds`` (inf for an infinite threshold):
    ``seconds * 1e9`` rounds differently from the division at a boundary."""
    if not math.isfinite(seconds):
        return float("inf")
    d = math.floor(seconds * 1e9)
    while d / 1e9 <= seconds:
        d += 1
    while (d - 1) / 1e9 > seconds:
        d -= 1
    return d


@dataclass(slots=True, eq=False)
class IterationSampler:
    """Head and tail decisions. The slow threshold is k x the median of the last 101 durations
    (``recent``, filled by the engine with each window's durations, and with the first 10 as
    soon as they exist), recomputed then, so the engine's per-iteration cost is one comparison
    with ``threshold_ns``."""

    policy: str = "sampled"
    first: int = 10
    #: The every-M-th stride in use: M (``every_n_configured``) times a power of two.
    every_n: int = 100
    slow_factor: float = 3.0
    every_s: float = 0.0
    tail_per_minute: float = math.inf
    every_n_configured: int = field(init=False)
    pace_s: float = field(init=False, default=0.0)
    tail_tokens: float = field(init=False)
    tail_checked_ns: int = field(init=False, default=0)
    seen: int = field(init=False, default=0)
    recent: deque[float] = field(init=False, default_factory=lambda: deque(maxlen=MEDIAN_WINDOW))
    median: float = field(init=False, default=0.0)
    threshold: float = field(init=False, default=math.inf)  # seconds
    #: The smallest whole number of nanoseconds above ``threshold``: the per-iteration test
    #: ``duration_ns >= threshold_ns`` says exactly what ``duration_ns / 1e9 > threshold`` says.
    threshold_ns: float = field(init=False, default=math.inf)

    def __post_init__(self) -> None:
        self.every_n_configured = self.every_n
        self.tail_tokens = self._tail_capacity()

    def head_reason(self, index: int, iteration: int) -> str | None:
        """The export reason known at the start of the ``index``-th iteration of the job,
        numbered ``iteration``, if any. The engine asks only when one may apply: a policy other
        than "sampled", one of the first K, or a multiple of M."""
        policy = self.policy
        if policy == "all":
            return "all"
        if policy == "none":
            return None
        if index < self.first:
            return "first"
        if self.every_n and iteration % self.every_n == 0:
            return "every_n"
        return None

    def set_rates(self, every_n: int, every_s: float, tail_per_minute: float) -> None:
        """The configured M, time floor and tail rate (the stride follows at once)."""
        self.every_n_configured = every_n
        self.every_s = every_s
        if tail_per_minute != self.tail_per_minute:
            self.tail_per_minute = tail_per_minute
            self.tail_tokens = min(self.tail_tokens, self._tail_capacity())
        self.every_n = stride_for(every_n, every_s, self.pace_s)

    def set_pace(self, seconds_per_iteration: float) -> None:
        """The loop's pace (window boundaries): the stride for the iterations that follow."""
        self.pace_s = seconds_per_iteration
        if self.every_n:  # 0: routine sampling is off (or stopped on this rank)
            self.every_n = stride_for(self.every_n_configured, self.every_s, seconds_per_iteration)

    def _tail_capacity(self) -> float:
        return max(1.0, self.tail_per_minute * TAIL_BURST_MINUTES)

    def _tail_token(self, end_ns: int) -> bool:
        """One slow or non-finite export, if the bucket (refilled by time) holds one."""
        if self.tail_per_minute == math.inf:
            return True
        if self.tail_checked_ns:
            refill = (end_ns - self.tail_checked_ns) * self.tail_per_minute / _NS_PER_MINUTE
            self.tail_tokens = min(self._tail_capacity(), self.tail_tokens + max(0.0, refill))
        self.tail_checked_ns = end_ns
        if self.tail_tokens >= 1.0:
            self.tail_tokens -= 1.0
            return True
        return False

    def refresh(self) -> None:
        """Recompute the median of the recent durations (window boundaries)."""
        if len(self.recent) >= MEDIAN_MIN_SAMPLES:
            self.median = percentile(sorted(self.recent), 50)
            self.threshold = self.slow_factor * self.median if self.median > 0 else float("inf")
            self.threshold_ns = _first_ns_above(self.threshold)

    def tail(
        self, head_reason: str | None, slow: bool, error: bool, nonfinite: bool, end_ns: int = 0
    ) -> str | None:
        """The final export reason: head reason, else error / non-finite / slow (these two while
        the tail bucket holds a token), else None."""
        if head_reason is not None:
            return head_reason
        if self.policy == "none":
            return None
        if error:
            return "error"
        if not (nonfinite or slow) or not self._tail_token(end_ns):
            return None
        return "nonfinite" if nonfinite else "slow"
