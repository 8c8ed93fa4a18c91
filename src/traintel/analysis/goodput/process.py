"""What one process (one rank of one job) exported, reduced to what goodput needs: its window
records, exported iterations and phases in compact rows, and the jobs they group into.

Why apart from the reading and the maths: this state is what a file's read leaves behind and
what worker processes send back, so it must merge exactly (:meth:`Process.merge`) whatever
reads it or computes from it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from traintel import semconv
from traintel.analysis.columns import Table
from traintel.semconv import Phase

APPLICATION = Phase.APPLICATION.value
LOOP = Phase.TRAINING_LOOP.value
CHECKPOINT_LOAD = Phase.CHECKPOINT_LOAD.value


@dataclass(slots=True)
class Window:
    start_ns: int
    end_ns: int
    first: int
    last: int
    iterations: int
    productive_s: float
    data_s: float
    startup_s: float
    flops: float
    peak: float | None
    p50: float
    p90: float
    p99: float
    max_s: float
    slowest: int | None
    ideal: float | None
    wasted_fraction: float = 0.0
    free_total: int = 0
    free_in: int = 0
    inferred: bool = False  # built from the progress mark or exported iteration spans, not a record
    quantiles: bool = True  # p50, p90 and p99 are known (a progress mark's window has its max only)


@dataclass(frozen=True)
class InferredTail:
    """The iterations after a job's last window record, counted from its progress mark (the
    open window's account, written every few seconds) and the spans exported after it."""

    first_iteration: int
    last_iteration: int
    exported_iterations: int  # the spans counted
    missing_iterations: int  # numbered in the range but neither marked nor exported: not counted
    productive_s: float
    marked_iterations: int = 0  # counted from the progress mark
    recorded: bool = True  # the job's files hold a window record (the tail is after the last)

    @property
    def after(self) -> str:
        """Where the tail is: after the last window record, or in a job whose files hold none."""
        return "after the last window record" if self.recorded else "with no window record in the files"

    @property
    def source(self) -> str:
        parts = ["the progress mark"] if self.marked_iterations else []
        if self.exported_iterations:
            parts.append("exported training_iteration spans")
        return " and ".join(parts) + " " + self.after

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_iteration": self.first_iteration,
            "last_iteration": self.last_iteration,
            "marked_iterations": self.marked_iterations,
            "exported_iterations": self.exported_iterations,
            "missing_iterations": self.missing_iterations,
            "productive_seconds": self.productive_s,
            "source": self.source,
        }


#: Typecodes of a window record's row: start, end, first, last, iterations, productive, data,
#: startup, flops, peak (0: none), p50, p90, p99, max, slowest, ideal (0: none), has a slowest.
WINDOW_ROW = "QQqqqdddddddddqdB"
#: An exported iteration: number, start, end, trace id (two halves), span id.
ITERATION_ROW = "qQQQQQ"
#: A span's link to its parent: span id, parent id, flags (1: an iteration, 2: has a parent).
LINK_ROW = "QQB"
#: A data-loading span: start, end, parent id, has a parent.
DATA_ROW = "QQQB"
IS_ITERATION, HAS_PARENT = 1, 2


def span_key(span_id: str) -> int | str:
    """A span id as one 64-bit number (an id of another length stays text, kept aside)."""
    return int(span_id, 16) if len(span_id) == 16 else span_id


def trace_key(trace_id: str) -> tuple[int, int] | tuple[str, str]:
    if len(trace_id) == 32:
        return int(trace_id[:16], 16), int(trace_id[16:], 16)
    return trace_id, ""


def trace_hex(high: int | str, low: int | str) -> str:
    return high if isinstance(high, str) else f"{high:016x}{low:016x}"


def span_hex(key: int | str) -> str:
    return key if isinstance(key, str) else f"{key:016x}"


@dataclass
class Process:
    """What one process (one rank of one job) exported, reduced to what goodput needs.

    Per-window and per-span state is kept in :class:`~traintel.analysis.columns.Table` rows in
    arrival order, and read back only when the process is computed: memory grows with the
    windows and exported spans, at a few dozen bytes each. Nothing here depends on the order
    rows arrive in beyond "the later of two equal keys wins", so the states of two files merge
    exactly (:meth:`merge`).
    """

    instance: str
    resource: dict[str, Any]
    start_ns: int = 2**63
    last_ns: int = 0
    end_ns: int | None = None  # the outermost span's final end, if exported
    end_error: bool = False
    preempted: bool = False  # a terminating signal's ``preemption`` event was exported
    wall_clock_step_s: float = 0.0  # the largest step of the wall clock a ``wall_clock_step`` event said
    outermost: str | None = None
    phases: list[tuple[int, int, str]] = field(default_factory=list)
    #: Where its training loops ended (each loop has an ideal step time of its own).
    loop_ends: list[int] = field(default_factory=list)
    #: Data-loading spans, resolved (inside an iteration or not) once every span is read.
    data_loading: Table = field(default_factory=lambda: Table(DATA_ROW))
    #: Every span's parent, for that resolution.
    links: Table = field(default_factory=lambda: Table(LINK_ROW))
    #: The window records, in arrival order.
    window_rows: Table = field(default_factory=lambda: Table(WINDOW_ROW))
    resume: int | None = None
    #: Exported iterations: their number, times and ids, in arrival order.
    iterations: Table = field(default_factory=lambda: Table(ITERATION_ROW))
    #: The last progress mark: its time and the job's account (``JobProgress``'s fields).
    mark_ns: int = 0
    mark: dict[str, Any] | None = None
    #: Windows inferred from the mark and the exported iterations after the last window record.
    inferred: list[Window] = field(default_factory=list)
    inner_data: list[tuple[int, int]] = field(default_factory=list)  # data loading inside iterations
    tail: InferredTail | None = None
    #: GPU energy (J; "total" and by category) summed over the window records, and the job's own
    #: (the tail after the last window included) from the application span when it ended.
    window_energy: dict[str, float] = field(default_factory=dict)
    job_energy: dict[str, float] | None = None

    @property
    def rank(self) -> int:
        value = self.resource.get(semconv.RANK)
        return int(value) if isinstance(value, int) else 0

    @property
    def ended_cleanly(self) -> bool:
        return self.end_ns is not None and not self.end_error

    @property
    def stop_ns(self) -> int:
        """Where the process's account ends: its application's end; without one (loops run
        without ``application()``), its last record, the evaluation after the loop included."""
        if self.end_ns is not None and self.outermost == APPLICATION:
            return self.end_ns
        return max(self.last_ns, self.start_ns, self.end_ns or 0)

    def ended(self, phase: str, end_ns: int, error: bool) -> None:
        """An application or loop span's final end. The process's is its latest application's
        (a notebook cell run again is a second one); without one, its latest loop's (a
        fine-tuning stage after pre-training). The latest, not the first read: files merge in
        any order to the same end."""
        if phase == LOOP:
            self.loop_ends.append(end_ns)
        self._outermost_end(phase, end_ns, error)

    def _outermost_end(self, phase: str, end_ns: int, error: bool) -> None:
        rank = (phase == APPLICATION, end_ns)
        if self.outermost is None or rank >= (self.outermost == APPLICATION, self.end_ns or 0):
            self.outermost, self.end_ns, self.end_error = phase, end_ns, error

    def see(self, start_ns: int, end_ns: int) -> None:
        if start_ns and start_ns < self.start_ns:
            self.start_ns = start_ns
        self.last_ns = max(self.last_ns, end_ns)

    def merge(self, later: Process) -> None:
        """Add what ``later`` read (from the files after this one's) as if read after it."""
        self.see(later.start_ns if later.start_ns != 2**63 else 0, later.last_ns)
        if later.outermost is not None and later.end_ns is not None:
            self._outermost_end(later.outermost, later.end_ns, later.end_error)
        self.preempted = self.preempted or later.preempted
        self.wall_clock_step_s = max(self.wall_clock_step_s, later.wall_clock_step_s, key=abs)
        self.phases.extend(later.phases)
        self.loop_ends.extend(later.loop_ends)
        if later.resume is not None and (self.resume is None or later.resume < self.resume):
            self.resume = later.resume
        for mine, theirs in (
            (self.data_loading, later.data_loading),
            (self.links, later.links),
            (self.window_rows, later.window_rows),
            (self.iterations, later.iterations),
        ):
            mine.extend(theirs)
        for key, joules in later.window_energy.items():
            self.window_energy[key] = self.window_energy.get(key, 0.0) + joules
        if later.job_energy is not None:
            self.job_energy = later.job_energy
        if later.mark_ns >= self.mark_ns:
            self.mark_ns, self.mark = later.mark_ns, later.mark

    @property
    def energy(self) -> dict[str, float]:
        return self.job_energy if self.job_energy is not None else self.window_energy

    def windows(self, later: list[tuple[int, int]]) -> list[Window]:
        """The process's windows, records then inferred ones, ordered by start, each with the
        share of its iterations that a later job ran again (``later``: their ranges)."""
        out = [
            Window(start, end, first, last, iterations, productive, data, startup, flops, peak or None,
                   p50, p90, p99, max_s, slowest if has_slowest else None, ideal or None)
            for start, end, first, last, iterations, productive, data, startup, flops, peak,
                p50, p90, p99, max_s, slowest, ideal, has_slowest in self.window_rows
        ]  # fmt: skip
        out.extend(dataclasses.replace(w) for w in self.inferred)
        out.sort(key=lambda w: w.start_ns)
        for w, redoing in zip(out, redoing_ranges(out, later, self.phases), strict=True):
            span = w.last - w.first + 1
            w.wasted_fraction = redone(redoing, w.first, w.last) / span if redoing and span > 0 else 0.0
        return out


def redoing_ranges(
    windows: list[Window], later: list[tuple[int, int]], phases: list[tuple[int, int, str]]
) -> list[list[tuple[int, int]]]:
    """For each window (ordered by start), the iteration ranges run again after it: the later
    jobs' (``later``), and from the lowest iteration a later window of the same process went
    back to after a checkpoint load. A loop restarted in the process from an older checkpoint
    (an in-process restart, a rollback after a loss spike) discards the progress made past it,
    as a later job's resuming there does. Without a load between them, a window numbered lower
    is not one (iterations numbered per epoch)."""
    ranges: list[list[tuple[int, int]]] = []
    floor: int | None = None  # the lowest iteration a later window went back to
    for w, to in zip(reversed(windows), reversed(_went_back(windows, phases)), strict=True):
        ranges.append(later if floor is None else [*later, (floor, w.last)])
        if to is not None:
            floor = to if floor is None else min(floor, to)
    return ranges[::-1]


def _went_back(windows: list[Window], phases: list[tuple[int, int, str]]) -> list[int | None]:
    """Each window's first iteration if it went back to one run before, after a checkpoint load
    since the window before it (None otherwise)."""
    load_ends = sorted(end for _start, end, category in phases if category == CHECKPOINT_LOAD)
    went_back: list[int | None] = []
    reached, previous_end = -1, 0  # (iterations are numbered from 0)
    for w in windows:
        load = bisect.bisect_left(load_ends, previous_end)  # the first load since the last window
        loaded = load < len(load_ends) and load_ends[load] <= w.start_ns
        went_back.append(w.first if loaded and w.first <= reached else None)
        reached, previous_end = max(reached, w.last), w.end_ns
    return went_back


@dataclass
class Job:
    """One launch of the training program: its ranks (processes) share run id and restart."""

    session: str
    perf_tag: str | None
    run_id: str
    restart: int
    ranks: dict[int, Process] = field(default_factory=dict)


def redone(later: list[tuple[int, int]], first: int, last: int) -> int:
    """How many of the iterations ``first..last`` the later jobs' ranges cover."""
    clipped = [(max(low, first), min(high, last) + 1) for low, high in later]  # half-open
    return sum(hi - lo for lo, hi in union(c for c in clipped if c[0] < c[1]))


def union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The half-open intervals merged into disjoint ones (touching ones join), ascending."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def ran(process: Process) -> tuple[int, int] | None:
    """The iteration range a job ran: from its resume point (or first window) to its last."""
    firsts = [row[2] for row in process.window_rows] + [w.first for w in process.inferred]
    if not firsts:
        return None
    first = min(firsts)
    if process.resume is not None:
        first = min(first, process.resume)
    return first, max([row[3] for row in process.window_rows] + [w.last for w in process.inferred])


def reference(job: Job, rank: int | None) -> Process:
    if rank is not None and rank in job.ranks:
        return job.ranks[rank]
    return job.ranks[min(job.ranks)]
