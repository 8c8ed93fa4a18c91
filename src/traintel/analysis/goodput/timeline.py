"""The sweep of one job's timeline: every instant to the innermost categorised phase covering it,
else to the window holding it (its productive, data-loading and startup seconds prorated by the
share of its free time inside the interval), else to ``other``.
"""

from __future__ import annotations

import heapq
import itertools
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
    # open phases, the innermost (latest start; then shortest) first: (-start, end, order, category)
    active: list[tuple[int, int, int, str]] = []
    next_phase = 0
    next_window = 0
    for p, q in itertools.pairwise(ordered):
        while next_phase < len(phases) and phases[next_phase][0] <= p:
            start, end, category = phases[next_phase]
            heapq.heappush(active, (-start, end, next_phase, category))
            next_phase += 1
        while active and active[0][1] <= p:  # ended: removed once they reach the top
            heapq.heappop(active)
        inside = a <= p and q <= b
        length = q - p
        if active:  # the top started at or before p and ends after it: it covers [p, q]
            category = active[0][3]
            if inside:
                badput[category] = badput.get(category, 0) + length
            continue
        while next_window < len(windows) and windows[next_window].end_ns <= p:
            next_window += 1
        window = windows[next_window] if next_window < len(windows) else None
        if window is not None and window.start_ns <= p:
            window.free_total += length
            if inside:
                window.free_in += length
        elif inside:
            badput["other"] = badput.get("other", 0) + length
    return _prorate(windows)


def _edges(
    job_start: int,
    job_end: int,
    cuts: tuple[int, int],
    phases: list[tuple[int, int]],
    windows: list[Window],
) -> list[int]:
    """Every time in [job_start, job_end] where what covers the timeline may change: the job's
    ends, the interval's ends inside it, each phase's and window's ends (clipped), ascending."""
    points = {job_start, job_end}
    points.update(edge for edge in cuts if job_start < edge < job_end)
    for start, end in phases:
        points.update((max(start, job_start), min(end, job_end)))
    for w in windows:
        points.update((max(w.start_ns, job_start), min(w.end_ns, job_end)))
    return sorted(points)


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
