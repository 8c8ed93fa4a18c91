"""The sweep of one job's timeline: every instant to the innermost categorised phase covering it,
else to the window holding it (its productive, data-loading and startup seconds prorated by the
share of its free time inside the interval), else to ``other``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from collections import defaultdict

from traintel.analysis.goodput.process import Process, Window


def job_timeline(
    process: Process,
    all_windows: list[Window],
    job_start: int,
    job_end: int,
    a: int,
    b: int,
    badput: dict[str, int],
) -> tuple[float, dict[str, float]]:
    """Sweep one job's [job_start, job_end]: nanoseconds by category inside [a, b] into
    ``badput``; returns the productive seconds and the window-prorated seconds by category."""
    windows = [w for w in all_windows if w.end_ns > job_start and w.start_ns < job_end]
    phases = sorted(p for p in process.phases if p[1] > job_start and p[0] < job_end)
    for w in windows:
        w.free_total = w.free_in = 0
    ordered = _edges(job_start, job_end, (a, b), [(s, e) for s, e, _ in phases], windows)
    open_phases, window_at = _OpenPhases(phases), _WindowCursor(windows)
    for p, q in itertools.pairwise(ordered):
        inside = a <= p and q <= b
        length = q - p
        category = open_phases.innermost_at(p)
        if category is None:
            window = window_at(p)
            if window is not None:  # free time of a window: prorated by _prorate
                window.free_total += length
                window.free_in += length if inside else 0
                continue
            category = "other"
        if inside:
            badput[category] = badput.get(category, 0) + length
    return _prorate(windows)


class _OpenPhases:
    """The categorised phases open at the sweep's time (asked in ascending order): a heap of
    ``(-start, end, order, category)``, the innermost (latest start; then the first listed) on
    top; ended ones are removed once they reach the top."""

    def __init__(self, phases: list[tuple[int, int, str]]) -> None:
        self.phases = phases
        self.next = 0
        self.active: list[tuple[int, int, int, str]] = []

    def innermost_at(self, time_ns: int) -> str | None:
        """The category of the innermost phase covering ``[time_ns, next edge]``, if any."""
        phases, active = self.phases, self.active
        while self.next < len(phases) and phases[self.next][0] <= time_ns:
            start, end, category = phases[self.next]
            heapq.heappush(active, (-start, end, self.next, category))
            self.next += 1
        while active and active[0][1] <= time_ns:
            heapq.heappop(active)
        return active[0][3] if active else None


class _WindowCursor:
    """The window holding the sweep's time (asked in ascending order), if any."""

    def __init__(self, windows: list[Window]) -> None:
        self.windows = windows
        self.next = 0

    def __call__(self, time_ns: int) -> Window | None:
        windows = self.windows
        while self.next < len(windows) and windows[self.next].end_ns <= time_ns:
            self.next += 1
        window = windows[self.next] if self.next < len(windows) else None
        return window if window is not None and window.start_ns <= time_ns else None


def _edges(
    job_start: int,
    job_end: int,
    cuts: tuple[int, int],
    phases: list[tuple[int, int]],
    windows: list[Window],
) -> list[int]:
    """Every time in [job_start, job_end] where what covers the timeline may change: the job's
    ends, the interval's ends inside it, each phase's and window's ends (clipped), ascending.
    (Clipped as a slice of all of them sorted: an end outside the job clips to one of the job's
    own ends, which are there already.)"""
    points = {job_start, job_end, *cuts}
    points.update(itertools.chain.from_iterable(phases))
    points.update(map(_START, windows), map(_END, windows))
    ordered = sorted(points)
    return ordered[bisect.bisect_left(ordered, job_start) : bisect.bisect_right(ordered, job_end)]


_START, _END = operator.attrgetter("start_ns"), operator.attrgetter("end_ns")


def _prorate(windows: list[Window]) -> tuple[float, dict[str, float]]:
    """Each window's productive time and badput in the share of its free time that lay inside
    the interval (set by the sweep): the productive seconds and the seconds by category."""
    productive = 0.0
    prorated: dict[str, float] = defaultdict(float)
    for w in windows:
        if not w.free_total or not w.free_in:
            continue
        share = w.free_in / w.free_total
        kept = w.productive_s * (1 - w.wasted_fraction)
        productive += share * kept
        prorated["wasted_progress"] += share * w.productive_s * w.wasted_fraction
        prorated["data_loading"] += share * w.data_s
        prorated["program_startup"] += share * w.startup_s
        prorated["other"] += w.free_in / 1e9 - share * (w.productive_s + w.data_s + w.startup_s)
    return productive, prorated
