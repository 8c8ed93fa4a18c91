"""Which iterations become exported spans: the tail-sampling policy.

Why tail sampling: a run of a million steps must not send four million spans, but the steps
a user opens in Jaeger — the first ones, a regular sample to compare against, the slow ones,
the failed ones — must be there whole. Every iteration is counted in the metrics whatever
this policy says.

Head reasons (known when the iteration starts): first K, every M-th iteration number, "all".
Tail reasons (known when it ends): slower than k x the rolling median of recent iterations,
an error, a non-finite model metric. "Every M-th" uses the iteration number, so all ranks of a
job export the same iterations and can be compared side by side.
"""

from __future__ import annotations

import math
from collections import deque

from traintel._aggregation.stats import percentile

#: Recent iterations the slow-iteration median is taken over; and how many it needs first.
MEDIAN_WINDOW = 101
MEDIAN_MIN_SAMPLES = 10


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


class IterationSampler:
    """Head and tail decisions. The slow threshold is k x the median of the last 101 durations
    (``recent``, filled by the engine with each window's durations, and with the first 10 as
    soon as they exist), recomputed then, so the engine's per-iteration cost is one comparison
    with ``threshold_ns``."""

    __slots__ = (
        "every_n",
        "first",
        "median",
        "policy",
        "recent",
        "seen",
        "slow_factor",
        "threshold",
        "threshold_ns",
    )

    def __init__(
        self, policy: str = "sampled", first: int = 10, every_n: int = 100, slow_factor: float = 3.0
    ):
        self.policy = policy
        self.first = first
        self.every_n = every_n
        self.slow_factor = slow_factor
        self.seen = 0
        self.recent: deque[float] = deque(maxlen=MEDIAN_WINDOW)
        self.median = 0.0
        self.threshold = float("inf")  # seconds
        # The smallest whole number of nanoseconds above ``threshold``: the per-iteration test
        # ``duration_ns >= threshold_ns`` says exactly what ``duration_ns / 1e9 > threshold`` says.
        self.threshold_ns: float = float("inf")

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

    def refresh(self) -> None:
        """Recompute the median of the recent durations (window boundaries)."""
        if len(self.recent) >= MEDIAN_MIN_SAMPLES:
            self.median = percentile(sorted(self.recent), 50)
            self.threshold = self.slow_factor * self.median if self.median > 0 else float("inf")
            self.threshold_ns = _first_ns_above(self.threshold)

    def tail(self, head_reason: str | None, slow: bool, error: bool, nonfinite: bool) -> str | None:
        """The final export reason: head reason, else error / non-finite / slow, else None."""
        if head_reason is not None:
            return head_reason
        if self.policy == "none":
            return None
        if error:
            return "error"
        if nonfinite:
            return "nonfinite"
        if slow:
            return "slow"
        return None
