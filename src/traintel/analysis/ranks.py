"""Cross-rank statistics from per-rank files, for ``traintel report``.

Why recomputed from each rank's own window events: the live exchange may be off or may have
stopped (a dead rank). Per window (keyed by job and window index) the ranks' mean iteration
times give min / median / max / p99 across ranks; the compute and data-loading statistics, the
top-k ranks and the stragglers come from the live exchange's ``ranks_metrics_update`` and
``straggler`` events when the files have them (each rank may carry the same ones: they are
counted once per job and window). In scale mode only rank 0 exported its window events: where
the live event counted more ranks than the files hold window events for, its iteration-time
statistics and rank count are the job's.

Memory is bounded: the first :data:`MAX_WINDOWS` windows of each job are kept per rank, the
rest counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from traintel import semconv
from traintel._aggregation.stats import percentile

MAX_WINDOWS = 512
_W = semconv.WINDOW_PREFIX
_R = semconv.RANKS_PREFIX


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "min": ordered[0],
        "median": percentile(ordered, 50),
        "max": ordered[-1],
        "p99": percentile(ordered, 99),
    }


@dataclass
class _Window:
    first_iteration: int
    last_iteration: int
    iteration_s: dict[int, float] = field(default_factory=dict)  # by rank
    live: dict[str, Any] | None = None  # the exchange's ranks_metrics_update
    #: Events taken into the window: what a merge with no room for it counts as dropped.
    events: int = 0


@dataclass
class CrossRankTable:
    """Per (job, window index): every rank's mean iteration time, and the live statistics."""

    windows: dict[tuple[str, int], _Window] = field(default_factory=dict)
    stragglers: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    dropped: int = 0

    def _window(self, job: str, index: int) -> _Window | None:
        """The window, new (its iterations unknown until its window event) while there is room."""
        key = (job, index)
        window = self.windows.get(key)
        if window is None:
            if len(self.windows) >= MAX_WINDOWS:
                self.dropped += 1
                return None
            window = self.windows[key] = _Window(-1, -1)
        return window

    def add_event(self, job: str, rank: int, name: str, attributes: dict[str, Any]) -> None:
        if name == semconv.Event.TRAINING_METRICS_UPDATE.value:
            index, mean = attributes.get(_W + "index"), attributes.get(_W + "iteration_time.mean")
            if isinstance(index, int) and isinstance(mean, int | float):
                window = self._window(job, index)
                if window is not None:
                    window.events += 1
                    window.iteration_s[rank] = float(mean)
                    if window.first_iteration < 0:  # new, or made by the live event
                        window.first_iteration = int(attributes.get(_W + "first_iteration", -1))
                        window.last_iteration = int(attributes.get(_W + "last_iteration", -1))
        elif name == semconv.Event.RANKS_METRICS_UPDATE.value:
            index = attributes.get(_R + "window.index")
            if isinstance(index, int):
                window = self._window(job, index)
                if window is not None:
                    window.events += 1
                    window.live = window.live or attributes
        elif name == semconv.Event.STRAGGLER.value:
            index = attributes.get(_R + "window.index")
            if isinstance(index, int) and len(self.stragglers) < MAX_WINDOWS:
                self.stragglers.setdefault((job, index), attributes)

    def merge(self, later: CrossRankTable) -> None:
        """Add a later file's table, as if its events had been added after this one's: a window
        new here takes a place while there is room, else its events count as dropped. Exact but
        where files disagree on which windows come first: a window an earlier file holds but a
        later one had no room for misses that file's ranks (in the collector's and the embedded
        default's layouts every file sees the windows in the same order)."""
        for key, window in later.windows.items():
            mine = self.windows.get(key)
            if mine is None:
                if len(self.windows) >= MAX_WINDOWS:
                    self.dropped += window.events
                else:
                    self.windows[key] = window
                continue
            mine.iteration_s.update(window.iteration_s)
            if mine.first_iteration < 0 and window.first_iteration >= 0:
                mine.first_iteration, mine.last_iteration = window.first_iteration, window.last_iteration
            mine.live = mine.live or window.live
            mine.events += window.events
        self.dropped += later.dropped
        for key, attributes in later.stragglers.items():
            if len(self.stragglers) < MAX_WINDOWS:
                self.stragglers.setdefault(key, attributes)

    def rows(self) -> list[dict[str, Any]]:
        """One row per window seen on at least two ranks, in job and window order."""
        return [
            self._row(job, index, window)
            for (job, index), window in sorted(self.windows.items())
            if len(window.iteration_s) >= 2 or window.live is not None
        ]

    def _row(self, job: str, index: int, window: _Window) -> dict[str, Any]:
        live = window.live or {}
        times = window.iteration_s
        row: dict[str, Any] = {
            "job": job,
            "window": index,
            "first_iteration": window.first_iteration,
            "last_iteration": window.last_iteration,
            "ranks": len(times),
            "iteration_time": _summary(list(times.values())) if times else None,
            "slowest_rank": max(times, key=lambda r: (times[r], -r)) if times else None,
        }
        counted, scaled = live.get(_R + "count"), _live_stats(live, "iteration_time")
        if isinstance(counted, int) and counted > len(times) and scaled is not None:  # scale mode
            row["ranks"], row["iteration_time"], row["slowest_rank"] = counted, scaled, None
        for name, _ in SPREADS:
            row[name] = _live_stats(live, name)
        row["compute_mode"] = live.get(_R + "compute_mode")  # sync_point, step (none marked), mixed
        row["top_k"] = list(live.get(_R + "top_k", []))
        straggler = self.stragglers.get((job, index)) or {}
        row["straggler_rank"] = straggler.get(semconv.STRAGGLER_RANK)
        row["straggler_factor"] = straggler.get(semconv.STRAGGLER_FACTOR)
        return row

    def as_dict(self) -> dict[str, Any]:
        return {
            "windows": self.rows(),
            "stragglers": [
                {"job": job, "window": index, **{k.rsplit(".", 1)[-1]: v for k, v in attributes.items()}}
                for (job, index), attributes in sorted(self.stragglers.items())
            ],
            "windows_dropped": self.dropped,
        }


#: The spreads across ranks a window's row holds beside its iteration time, with their titles.
SPREADS: Final = (
    ("compute_time", "compute time before the sync point"),
    ("data_loading_time", "data-loading wait"),
)


#: Said under the compute times of windows where a rank marked no synchronisation point.
UNMARKED_COMPUTE: Final = (
    "no sync point marked: the step less its data wait, which holds the time a rank waited in a "
    "collective (watch_ddp or mark_sync_point measures it)"
)


def unmarked(rows: list[dict[str, Any]]) -> bool:
    """Whether some of ``rows`` have compute times measured without a sync point."""
    return any(row["compute_mode"] in ("step", "mixed") for row in rows)


def straggler_text(row: dict[str, Any]) -> str:
    """A row's straggler as the reports name it: ``rank 3 (2.4x)``, "" for none."""
    rank, factor = row["straggler_rank"], row["straggler_factor"]
    if rank is None:
        return ""
    known = isinstance(factor, int | float) and math.isfinite(factor)  # (inf: the others computed nothing)
    return f"rank {rank}" + (f" ({factor:.1f}x)" if known else "")


def _live_stats(live: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ranks' statistics of ``name`` that the job computed live (min, median, max, p99),
    None unless all four are there."""
    stats = {s: live.get(f"{_R}{name}.{s}") for s in ("min", "median", "max", "p99")}
    return stats if all(v is not None for v in stats.values()) else None
