"""Goodput and badput across the jobs of a training session, from the embedded default's files.

Why files: a session spans restarts (a crash, a preemption, a requeue), and no live process
sees it whole. Every job's process wrote its spans; the ones that matter here are always
exported: the phase spans (init, checkpoints, evaluation, loops) and one ``training_window``
record per window of iterations (iteration spans themselves are tail-sampled).

The rules, applied to each job's reference rank (the lowest, unless asked):

* A job lasts from its first span's start to the end of its outermost span (``application``,
  else ``training_loop``); a job whose end was never exported (SIGKILL, node loss) ends at its
  last exported activity (span end, event or metric point). A job that overlaps the next one
  ends where the next begins.
* Inside a job every instant belongs to the innermost categorised phase covering it
  (``semconv.BADPUT_CATEGORY_OF_PHASE``; data loading inside an iteration excepted: it is the
  window's data-loading wait). Time inside a window not covered by a phase holds the window's
  productive time, data-loading wait and program startup; the rest of it (between iterations)
  and of the job is ``other``.
* Jobs are clipped where the next job of the session starts (a late exit flush can carry a
  later time); the session ends at the latest clipped end, so its total is the sum of its jobs
  and the gaps between them, and of its buckets.
* Between jobs: ``infrastructure_recovery`` after a job that did not end cleanly (error status,
  or no exported end), ``other`` (a scheduling gap) after one that did.
* A job's iterations after its last window record (the window open when it was killed) are
  counted from its exported iteration spans, as one inferred window: exact when every iteration
  was exported (plain-OpenTelemetry loops, "all" mode, or the first ones of a run), the exported
  ones only when they were sampled; the job's ``inferred_tail`` says which and how many.
* ``wasted_progress``: the productive time of a job's iterations that a later job of the
  session ran again (it resumed from an older checkpoint). Windows are the granularity: a window
  partly redone contributes its productive time in proportion to the iterations redone.
* An interval (``start``/``end``) clips phases exactly; a window cut by the interval
  contributes in proportion to its uncovered time inside the interval.

Every category is a share of the same total and the shares sum to 1 (``other`` is the rest).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from traintel import semconv
from traintel._aggregation.stats import percentile
from traintel.analysis.columns import Table
from traintel.analysis.parallel import map_files, merge_by_key
from traintel.exporters.reader import ReadStats, Record, SpanRecord, expand_paths, gc_paused, iter_records
from traintel.semconv import BADPUT_CATEGORIES, BADPUT_CATEGORY_OF_PHASE, Phase

__all__ = [
    "JobGoodput",
    "SessionGoodput",
    "compute_goodput",
    "load_jobs",
    "render_goodput",
    "session_goodput",
]

_W = semconv.WINDOW_PREFIX
_ITERATION = Phase.TRAINING_ITERATION.value
_DATA_LOADING = Phase.DATA_LOADING.value
_APPLICATION = Phase.APPLICATION.value
_LOOP = Phase.TRAINING_LOOP.value
_PREEMPTION = semconv.Event.PREEMPTION.value
_FRAMEWORK = ("initialization", "checkpoint_load", "checkpoint_save", "data_loading", "evaluation",
              "program_startup")  # fmt: skip


@dataclass
class _Window:
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
    inferred: bool = False  # built from exported iteration spans, not a window record


@dataclass(frozen=True)
class InferredTail:
    """The iterations after a job's last window record, counted from its exported spans."""

    first_iteration: int
    last_iteration: int
    exported_iterations: int  # the spans counted
    missing_iterations: int  # numbered in the range but not exported: not counted
    productive_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_iteration": self.first_iteration,
            "last_iteration": self.last_iteration,
            "exported_iterations": self.exported_iterations,
            "missing_iterations": self.missing_iterations,
            "productive_seconds": self.productive_s,
            "source": "exported training_iteration spans after the last window record",
        }


#: Typecodes of a window record's row: start, end, first, last, iterations, productive, data,
#: startup, flops, peak (0: none), p50, p90, p99, max, slowest, ideal (0: none), has a slowest.
_WINDOW_ROW = "QQqqqdddddddddqdB"
#: An exported iteration: number, start, end, trace id (two halves), span id.
_ITERATION_ROW = "qQQQQQ"
#: A span's link to its parent: span id, parent id, flags (1: an iteration, 2: has a parent).
_LINK_ROW = "QQB"
#: A data-loading span: start, end, parent id, has a parent.
_DATA_ROW = "QQQB"
_IS_ITERATION, _HAS_PARENT = 1, 2


def _span_key(span_id: str) -> int | str:
    """A span id as one 64-bit number (an id of another length stays text, kept aside)."""
    return int(span_id, 16) if len(span_id) == 16 else span_id


def _trace_key(trace_id: str) -> tuple[int, int] | tuple[str, str]:
    if len(trace_id) == 32:
        return int(trace_id[:16], 16), int(trace_id[16:], 16)
    return trace_id, ""


def _trace_hex(high: int | str, low: int | str) -> str:
    return high if isinstance(high, str) else f"{high:016x}{low:016x}"


def _span_hex(key: int | str) -> str:
    return key if isinstance(key, str) else f"{key:016x}"


@dataclass
class _Process:
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
    outermost: str | None = None
    phases: list[tuple[int, int, str]] = field(default_factory=list)
    #: Data-loading spans, resolved (inside an iteration or not) once every span is read.
    data_loading: Table = field(default_factory=lambda: Table(_DATA_ROW))
    #: Every span's parent, for that resolution.
    links: Table = field(default_factory=lambda: Table(_LINK_ROW))
    #: The window records, in arrival order.
    window_rows: Table = field(default_factory=lambda: Table(_WINDOW_ROW))
    resume: int | None = None
    #: Exported iterations: their number, times and ids, in arrival order.
    iterations: Table = field(default_factory=lambda: Table(_ITERATION_ROW))
    #: Windows inferred from the exported iterations after the last window record.
    inferred: list[_Window] = field(default_factory=list)
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
        return self.end_ns if self.end_ns is not None else max(self.last_ns, self.start_ns)

    def see(self, start_ns: int, end_ns: int) -> None:
        if start_ns and start_ns < self.start_ns:
            self.start_ns = start_ns
        self.last_ns = max(self.last_ns, end_ns)

    def merge(self, later: _Process) -> None:
        """Add what ``later`` read (from the files after this one's) as if read after it."""
        self.see(later.start_ns if later.start_ns != 2**63 else 0, later.last_ns)
        if later.outermost is not None and (
            self.outermost is None or (later.outermost == _APPLICATION and self.outermost == _LOOP)
        ):
            self.outermost, self.end_ns, self.end_error = later.outermost, later.end_ns, later.end_error
        self.preempted = self.preempted or later.preempted
        self.phases.extend(later.phases)
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

    @property
    def energy(self) -> dict[str, float]:
        return self.job_energy if self.job_energy is not None else self.window_energy

    def windows(self, later: list[tuple[int, int]]) -> list[_Window]:
        """The process's windows, records then inferred ones, ordered by start, each with the
        share of its iterations that a later job ran again (``later``: their ranges)."""
        out = [
            _Window(
                start_ns=row[0],
                end_ns=row[1],
                first=row[2],
                last=row[3],
                iterations=row[4],
                productive_s=row[5],
                data_s=row[6],
                startup_s=row[7],
                flops=row[8],
                peak=row[9] or None,
                p50=row[10],
                p90=row[11],
                p99=row[12],
                max_s=row[13],
                slowest=row[14] if row[16] else None,
                ideal=row[15] or None,
            )
            for row in self.window_rows
        ]
        out.extend(dataclasses.replace(w) for w in self.inferred)
        out.sort(key=lambda w: w.start_ns)
        for w in out:
            span = w.last - w.first + 1
            w.wasted_fraction = _redone(later, w.first, w.last) / span if later and span > 0 else 0.0
        return out


@dataclass
class Job:
    """One launch of the training program: its ranks (processes) share run id and restart."""

    session: str
    perf_tag: str | None
    run_id: str
    restart: int
    ranks: dict[int, _Process] = field(default_factory=dict)


class _Share:
    """Goodput over ``[start_ns, end_ns]`` from productive seconds (jobs and sessions)."""

    start_ns: int
    end_ns: int
    productive_s: float

    @property
    def total_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def goodput(self) -> float:
        return self.productive_s / self.total_s if self.total_s > 0 else 0.0


@dataclass
class JobGoodput(_Share):
    run_id: str
    restart: int
    ranks: list[int]
    rank_used: int
    start_ns: int
    end_ns: int
    status: str  # "completed", "failed", "preempted", or "no end exported" (killed, or still running)
    productive_s: float
    badput_s: dict[str, float]
    first_iteration: int | None
    last_iteration: int | None
    resumed_from: int | None
    goodput_by_rank: dict[int, float]
    #: The reference rank's iterations after its last window record, counted from spans.
    inferred_tail: InferredTail | None = None


@dataclass
class SessionGoodput(_Share):
    """A session's goodput over ``[start_ns, end_ns]``: seconds by category, and the detail."""

    session: str
    perf_tags: list[str]
    start_ns: int
    end_ns: int
    productive_s: float
    badput_s: dict[str, float]
    disruptions: int
    last_iteration: int | None
    jobs: list[JobGoodput]
    scheduling_gap_s: float = 0.0
    model_flops_utilization: float | None = None
    ideal_step_time_s: float | None = None
    recent_deviation: list[dict[str, float]] = field(default_factory=list)
    most_deviating: list[dict[str, Any]] = field(default_factory=list)
    #: GPU energy of the session's jobs, every rank, whole jobs (J: "total" and by category).
    energy_j: dict[str, float] = field(default_factory=dict)

    def badput(self, category: str) -> float:
        return self.badput_s.get(category, 0.0) / self.total_s if self.total_s > 0 else 0.0

    def layers(self) -> dict[str, dict[str, float]]:
        """Infrastructure (between jobs), framework (inside jobs) and model (MFU) views."""
        total = self.total_s or 1.0
        infrastructure = self.badput_s["infrastructure_recovery"] + self.scheduling_gap_s
        framework = sum(self.badput_s[c] for c in _FRAMEWORK)
        out: dict[str, dict[str, float]] = {
            "infrastructure": {
                "badput": infrastructure / total,
                "infrastructure_recovery": self.badput("infrastructure_recovery"),
                "scheduling_gap": self.scheduling_gap_s / total,
            },
            "framework": {"badput": framework / total, **{c: self.badput(c) for c in _FRAMEWORK}},
        }
        if self.model_flops_utilization is not None:
            out["model"] = {"mfu_over_productive_time": self.model_flops_utilization}
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "perf_tags": self.perf_tags,
            "start_unix_nano": self.start_ns,
            "end_unix_nano": self.end_ns,
            "total_seconds": self.total_s,
            "goodput": self.goodput,
            "productive_seconds": self.productive_s,
            "badput": {c: self.badput(c) for c in BADPUT_CATEGORIES},
            "badput_seconds": dict(self.badput_s),
            "scheduling_gap_seconds": self.scheduling_gap_s,
            "disruptions": self.disruptions,
            "last_iteration": self.last_iteration,
            "layers": self.layers(),
            "energy_joules": self.energy_j or None,
            "step_time": {
                "ideal_seconds": self.ideal_step_time_s,
                "recent_windows": self.recent_deviation,
                "most_deviating": self.most_deviating,
            },
            "jobs": [
                {
                    "run_id": j.run_id,
                    "restart": j.restart,
                    "ranks": j.ranks,
                    "rank_used": j.rank_used,
                    "start_unix_nano": j.start_ns,
                    "end_unix_nano": j.end_ns,
                    "status": j.status,
                    "total_seconds": j.total_s,
                    "goodput": j.goodput,
                    "productive_seconds": j.productive_s,
                    "badput_seconds": j.badput_s,
                    "first_iteration": j.first_iteration,
                    "last_iteration": j.last_iteration,
                    "resumed_from": j.resumed_from,
                    "goodput_by_rank": {str(k): v for k, v in j.goodput_by_rank.items()},
                    "inferred_tail": j.inferred_tail.as_dict() if j.inferred_tail is not None else None,
                }
                for j in self.jobs
            ],
        }


# --- reading -------------------------------------------------------------------------------------
def _float(value: object, default: float = 0.0) -> float:
    if type(value) is float:  # the common case, before the general checks
        return value
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


#: A window record's attributes in the order of its row's columns (:data:`_WINDOW_ROW`).
_ROW_INTS = (_W + "first_iteration", _W + "last_iteration", _W + "iterations")
_ROW_FLOATS = (
    _W + "productive_time", _W + "data_loading_time", _W + "program_startup_time", _W + "flops",
    semconv.MFU_DENOMINATOR, _W + "iteration_time.p50", _W + "iteration_time.p90",
    _W + "iteration_time.p99", _W + "iteration_time.max",
)  # fmt: skip
_ROW_SLOWEST = _W + "slowest_iteration"


def _window_row(start_ns: int, end_ns: int, a: dict[str, Any]) -> tuple[Any, ...]:
    """A window record's row (:data:`_WINDOW_ROW`), as ``_Process.windows`` reads it back."""
    get = a.get
    slowest = _int(get(_ROW_SLOWEST))
    return (
        start_ns,
        end_ns,
        *[_int(get(key)) or 0 for key in _ROW_INTS],
        *[_float(get(key)) for key in _ROW_FLOATS],
        slowest if slowest is not None else 0,  # (the ranks' records have none in scale mode)
        _float(get(semconv.STEP_TIME_IDEAL)),
        slowest is not None,
    )


class GoodputReader:
    """The processes of the records read so far, keyed by instance (service instance id, else
    run id): fed one file's records in order, merged with the reader of the files after it
    (:meth:`merge`, exact: see :class:`_Process`), grouped into jobs at the end."""

    def __init__(self) -> None:
        self.processes: dict[str, _Process] = {}
        self._resource: dict[str, Any] | None = None  # the last resource seen, and its process
        self._process: _Process | None = None

    def process_of(self, resource: dict[str, Any]) -> _Process:
        if resource is self._resource and self._process is not None:
            return self._process  # the spans of one request share their resource's dict
        key = str(resource.get(semconv.SERVICE_INSTANCE_ID) or resource.get(semconv.RUN_ID) or "unknown")
        found = self.processes.get(key)
        if found is None:
            found = self.processes[key] = _Process(key, resource)
        self._resource, self._process = resource, found
        return found

    def add(self, record: Record) -> None:
        """A span into its process; a resource's metrics: their points' times (a job killed
        before its spans were exported still shows how long it lived)."""
        process = self.process_of(record.resource)
        if isinstance(record, SpanRecord):
            _add_span(process, record)
        else:
            for series in record.metrics:
                if series.kind is not None:
                    process.see(0, series.last_time_ns)

    def merge(self, later: GoodputReader) -> None:
        merge_by_key(self.processes, later.processes)
        self._resource = self._process = None

    def __getstate__(self) -> dict[str, Any]:  # sent between processes without the cache
        return {"processes": self.processes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.processes = state["processes"]
        self._resource = self._process = None

    def jobs(self) -> list[Job]:
        return _group_jobs(self.processes.values())


def load_jobs(
    paths: Iterable[str | os.PathLike[str]],
    stats: ReadStats | None = None,
    workers: int = 1,
    progress: Callable[[int], None] | None = None,
) -> list[Job]:
    """Read the files (streaming) into jobs: grouped by session, run id and restart count.

    Each file is read on its own and the states merged in file order (exactly: see
    :class:`_Process`); with ``workers`` > 1 in that many processes. ``progress`` is told the
    bytes read.
    """
    stats = stats if stats is not None else ReadStats()
    reader = GoodputReader()
    files = [str(path) for path in expand_paths(paths)]
    for part, part_stats in map_files(read_file, files, workers, progress):
        reader.merge(part)
        stats.merge(part_stats)
    return reader.jobs()


def read_file(path: str, progress: Callable[[int], None] | None = None) -> tuple[GoodputReader, ReadStats]:
    """One file's goodput state and read counts (a part of :func:`load_jobs`)."""
    reader, stats = GoodputReader(), ReadStats()
    with gc_paused():
        for record in iter_records([path], stats, progress, windows_expanded=True):
            reader.add(record)
    return reader, stats


def _group_jobs(processes: Iterable[_Process]) -> list[Job]:
    """Processes with a timeline, grouped into jobs by session, run id and restart count."""
    jobs: dict[tuple[str, str, int], Job] = {}
    for process in processes:
        if process.start_ns == 2**63:
            continue  # metrics only: no timeline
        _resolve_data_loading(process)
        _infer_tail(process)
        r = process.resource
        session = str(r.get(semconv.SESSION_TAG) or r.get(semconv.RUN_ID) or process.instance)
        run_id = str(r.get(semconv.RUN_ID) or process.instance)
        restart = _int(r.get(semconv.RESTART_COUNT)) or 0
        perf = r.get(semconv.PERF_TAG)
        job = jobs.get((session, run_id, restart))
        if job is None:
            job = jobs[(session, run_id, restart)] = Job(
                session, str(perf) if perf else None, run_id, restart
            )
        job.ranks[process.rank] = process
    return list(jobs.values())


def _add_span(process: _Process, span: SpanRecord) -> None:
    start, end = span.start_ns, span.end_ns
    process.see(start, end)
    for event in span.events:
        process.see(0, event.time_ns)
        if event.name == _PREEMPTION:
            process.preempted = True
    attributes = span.attributes
    if span.name == semconv.TRAINING_WINDOW_SPAN:  # a leaf: no ancestor of any data loading
        process.window_rows.append(_window_row(start, end, attributes))
        if _W + "energy" in attributes:
            for key, joules in _energy_of(attributes, _W + "energy").items():
                process.window_energy[key] = process.window_energy.get(key, 0.0) + joules
        return
    parent = span.parent_span_id
    phase = attributes.get(semconv.PHASE)
    is_iteration = phase == _ITERATION
    if is_iteration or parent is not None:  # a root that is no iteration: as good as unknown
        flags = (_IS_ITERATION if is_iteration else 0) | (_HAS_PARENT if parent is not None else 0)
        process.links.append((_span_key(span.span_id), _span_key(parent) if parent is not None else 0, flags))
    if is_iteration:
        iteration = _int(attributes.get(semconv.ITERATION))
        if iteration is not None:
            process.iterations.append(
                (iteration, start, end, *_trace_key(span.trace_id), _span_key(span.span_id))
            )
        return
    if phase in (_APPLICATION, _LOOP):
        _add_outer(process, span, str(phase))
        return
    category = BADPUT_CATEGORY_OF_PHASE.get(str(phase)) if phase is not None else None
    if category is None:
        return
    if phase == _DATA_LOADING:
        has_parent = parent is not None
        process.data_loading.append((start, end, _span_key(parent) if parent is not None else 0, has_parent))
    else:
        process.phases.append((start, end, category))


def _add_outer(process: _Process, span: SpanRecord, phase: str) -> None:
    """An application or training-loop span (segment): the resume point and the job's end."""
    attributes = span.attributes
    if phase == _LOOP and attributes.get(semconv.SEGMENT_INDEX, 0) == 0:
        resume = _int(attributes.get(semconv.TRAIN_ITERATIONS_START))
        if resume is not None and (process.resume is None or resume < process.resume):
            process.resume = resume
    final = not attributes.get(semconv.SEGMENT_CONTINUES, False)
    if final and (process.outermost is None or (phase == _APPLICATION and process.outermost == _LOOP)):
        process.outermost = phase
        process.end_ns = span.end_ns
        process.end_error = span.status_code == 2  # STATUS_CODE_ERROR
    if phase == _APPLICATION and _JOB_ENERGY in attributes:
        process.job_energy = _energy_of(attributes, _JOB_ENERGY)


_JOB_ENERGY = "ml.training.energy"
_ENERGY_PARTS = ("productive", *BADPUT_CATEGORIES)


def _energy_of(attributes: dict[str, Any], key: str) -> dict[str, float]:
    """``{"total": J, category: J}`` from ``<key>`` and ``<key>.<category>`` attributes."""
    out = {"total": _float(attributes.get(key))}
    for part in _ENERGY_PARTS:
        value = attributes.get(key + "." + part)
        if value is not None:
            out[part] = _float(value)
    return out


def _session_energy(jobs: list[Job]) -> dict[str, float]:
    """The GPU energy of every rank of the session's jobs (J, "total" and by category)."""
    out: dict[str, float] = {}
    for job in jobs:
        for member in job.ranks.values():
            for key, joules in member.energy.items():
                out[key] = out.get(key, 0.0) + joules
    return out


def _resolve_data_loading(process: _Process) -> None:
    """Data loading outside iterations is badput of its own; inside, the window has it."""
    if process.data_loading:
        parents = {
            span: (parent if flags & _HAS_PARENT else None, bool(flags & _IS_ITERATION))
            for span, parent, flags in process.links
        }
        for start, end, parent_key, has_parent in process.data_loading:
            parent = parent_key if has_parent else None
            inside = False
            seen = 0
            while parent is not None and seen < 256:
                entry = parents.get(parent)
                if entry is None:
                    break
                if entry[1]:
                    inside = True
                    break
                parent = entry[0]
                seen += 1
            if inside:
                process.inner_data.append((start, end))
            else:
                process.phases.append((start, end, "data_loading"))
    process.data_loading.clear()
    process.links.clear()


def _union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The intervals merged into disjoint ones, ascending."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _covered_ns(union: list[tuple[int, int]], start: int, end: int) -> int:
    """How much of [start, end] the disjoint ascending intervals ``union`` cover."""
    total = 0
    at = bisect.bisect_right(union, (start, start)) - 1
    for s, e in union[max(at, 0) :]:
        if s >= end:
            break
        if e > start:
            total += min(e, end) - max(s, start)
    return total


def _infer_tail(process: _Process) -> None:
    """The exported iterations after the last window record, each as an inferred window of one
    iteration (so a later job redoing some of them wastes exactly theirs), accounted by the live
    rules: an iteration's time is productive but for its data-loading wait and the categorised
    phases inside it; if the job has no window record at all, its first iteration's excess over
    the median of the others is program startup."""
    covered = max((row[3] for row in process.window_rows), default=-1)  # the last iteration recorded
    after: dict[int, tuple[int, int]] = {}
    for number, start, end, *_ids in process.iterations:
        if number > covered:
            after[number] = (start, end)  # exported twice: the later one, as when read in order
    tail = sorted(after.items())
    inner = process.inner_data
    process.inner_data = []
    if not tail:
        return
    begin = tail[0][1][0]
    inner_data = _union(d for d in inner if d[1] > begin)
    phases = _union((start, end) for start, end, _ in process.phases if end > begin)
    durations = [(end - start) / 1e9 for _, (start, end) in tail]
    no_records = not process.window_rows
    typical = percentile(sorted(durations[1:]), 50) if len(durations) >= 2 and no_records else None
    productive_total = 0.0
    for position, (number, (start, end)) in enumerate(tail):
        duration = durations[position]
        data = _covered_ns(inner_data, start, end) / 1e9
        room = duration - data - _covered_ns(phases, start, end) / 1e9
        startup = max(0.0, min(duration - typical, room)) if typical is not None and position == 0 else 0.0
        productive = max(0.0, room - startup)
        productive_total += productive
        process.inferred.append(
            _Window(
                start_ns=start, end_ns=end, first=number, last=number, iterations=1,
                productive_s=productive, data_s=data, startup_s=startup, flops=0.0, peak=None,
                p50=duration, p90=duration, p99=duration, max_s=duration, slowest=number,
                ideal=None, inferred=True,
            )
        )  # fmt: skip
    first, last = tail[0][0], tail[-1][0]
    process.tail = InferredTail(first, last, len(tail), last - first + 1 - len(tail), productive_total)


# --- the timeline ------------------------------------------------------------------------------
def _job_timeline(
    process: _Process,
    all_windows: list[_Window],
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
    windows: list[_Window],
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


def _prorate(windows: list[_Window]) -> tuple[float, dict[str, float]]:
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


def _redone(later: list[tuple[int, int]], first: int, last: int) -> int:
    """How many of the iterations ``first..last`` the later jobs' ranges cover."""
    covered: list[tuple[int, int]] = []
    for low, high in sorted(later):
        lo, hi = max(low, first), min(high, last)
        if lo > hi:
            continue
        if covered and lo <= covered[-1][1] + 1:
            covered[-1] = (covered[-1][0], max(covered[-1][1], hi))
        else:
            covered.append((lo, hi))
    return sum(hi - lo + 1 for lo, hi in covered)


def _ran(process: _Process) -> tuple[int, int] | None:
    """The iteration range a job ran: from its resume point (or first window) to its last."""
    firsts = [row[2] for row in process.window_rows] + [w.first for w in process.inferred]
    if not firsts:
        return None
    first = min(firsts)
    if process.resume is not None:
        first = min(first, process.resume)
    return first, max([row[3] for row in process.window_rows] + [w.last for w in process.inferred])


def _reference(job: Job, rank: int | None) -> _Process:
    if rank is not None and rank in job.ranks:
        return job.ranks[rank]
    return job.ranks[min(job.ranks)]


def compute_goodput(
    jobs: list[Job],
    start_ns: int | None = None,
    end_ns: int | None = None,
    rank: int | None = None,
    by_perf_tag: bool = False,
) -> list[SessionGoodput]:
    """Goodput of each session (``session_tag``; with ``by_perf_tag`` also split by perf tag)."""
    sessions: dict[tuple[str, str | None], list[Job]] = defaultdict(list)
    for job in jobs:
        sessions[(job.session, job.perf_tag if by_perf_tag else None)].append(job)
    results = []
    for (session, _), members in sorted(sessions.items(), key=lambda kv: kv[0][0]):
        result = _session(session, members, start_ns, end_ns, rank)
        if result is not None:
            results.append(result)
    return results


def session_goodput(
    paths: Iterable[str | os.PathLike[str]],
    start_ns: int | None = None,
    end_ns: int | None = None,
    rank: int | None = None,
    by_perf_tag: bool = False,
) -> list[SessionGoodput]:
    """Goodput of every session in the files or directories (the embedded default's output of
    one or more jobs and ranks), optionally over ``[start_ns, end_ns]`` (Unix nanoseconds)."""
    if start_ns is not None and end_ns is not None and end_ns <= start_ns:
        raise ValueError(f"end_ns={end_ns} must be after start_ns={start_ns}")
    return compute_goodput(load_jobs(paths), start_ns, end_ns, rank, by_perf_tag)


def _session(
    session: str, jobs: list[Job], start: int | None, end: int | None, rank: int | None
) -> SessionGoodput | None:
    jobs = sorted(jobs, key=lambda j: _reference(j, rank).start_ns)
    refs = [_reference(j, rank) for j in jobs]
    # Each job clipped where the next starts: the session ends at the latest clipped end.
    clipped = [
        min(p.stop_ns, refs[i + 1].start_ns) if i + 1 < len(refs) else p.stop_ns for i, p in enumerate(refs)
    ]
    session_start = refs[0].start_ns
    session_end = max(max(end, p.start_ns) for end, p in zip(clipped, refs, strict=True))
    a = session_start if start is None else max(start, session_start)
    b = session_end if end is None else min(end, session_end)
    if b <= a:
        return None
    # wasted progress: the share of each window that a later job ran again
    # (each rank's windows are read back from their rows when its job is computed)
    ranges = [_ran(p) for p in refs]
    later_of = [[r for r in ranges[i + 1 :] if r is not None] for i in range(len(refs))]
    ref_windows = [p.windows(later) for p, later in zip(refs, later_of, strict=True)]
    totals_ns: dict[str, int] = {}
    seconds: dict[str, float] = dict.fromkeys(BADPUT_CATEGORIES, 0.0)
    productive = 0.0
    scheduling_gap_ns = 0
    disruptions = 0
    job_results = []
    for i, (job, process) in enumerate(zip(jobs, refs, strict=True)):
        job_end = process.stop_ns
        if i + 1 < len(refs):
            job_end = min(job_end, refs[i + 1].start_ns)
            gap = (max(job_end, a), min(refs[i + 1].start_ns, b))
            if not process.ended_cleanly:
                disruptions += 1
            if gap[1] > gap[0]:
                if process.ended_cleanly:
                    scheduling_gap_ns += gap[1] - gap[0]
                    totals_ns["other"] = totals_ns.get("other", 0) + gap[1] - gap[0]
                else:
                    key = "infrastructure_recovery"
                    totals_ns[key] = totals_ns.get(key, 0) + gap[1] - gap[0]
        job_end = max(job_end, process.start_ns)
        job_productive, prorated = _job_timeline(
            process, ref_windows[i], process.start_ns, job_end, a, b, totals_ns
        )
        productive += job_productive
        for category, value in prorated.items():
            seconds[category] += value
        limit = refs[i + 1].start_ns if i + 1 < len(refs) else None
        job_results.append(_job_result(job, process, ref_windows[i], later_of[i], limit))
    for category, value in totals_ns.items():
        seconds[category] += value / 1e9
    total_s = (b - a) / 1e9
    named = sum(v for k, v in seconds.items() if k != "other")
    seconds["other"] = total_s - productive - named  # the residual, so the shares sum to 1
    # Step-time and model statistics come from window records; inferred iterations count above.
    windows = sorted((w for ws in ref_windows for w in ws if not w.inferred), key=lambda w: w.end_ns)
    last_iteration = max((w.last for ws in ref_windows for w in ws), default=None)
    result = SessionGoodput(
        session=session,
        perf_tags=sorted({j.perf_tag for j in jobs if j.perf_tag}),
        start_ns=a,
        end_ns=b,
        productive_s=productive,
        badput_s=seconds,
        disruptions=disruptions,
        last_iteration=last_iteration,
        jobs=job_results,
        scheduling_gap_s=scheduling_gap_ns / 1e9,
    )
    _model_goodput(result, windows)
    _step_time(result, windows, refs)
    result.energy_j = _session_energy(jobs)
    return result


def _job_result(
    job: Job,
    process: _Process,
    windows: list[_Window],
    later: list[tuple[int, int]],
    limit: int | None,
) -> JobGoodput:
    """A job on its own, over its own time (ending where the next job starts, if it overlaps
    it): the reference rank's breakdown (``windows``: its windows) and each rank's goodput
    (``later``: the ranges of the later jobs, which decide its wasted progress)."""
    by_rank: dict[int, float] = {}
    productive, badput = 0.0, {}
    job_end = process.start_ns
    for number, member in sorted(job.ranks.items()):
        end = member.stop_ns if limit is None else min(member.stop_ns, limit)
        end = max(end, member.start_ns)
        counted: dict[str, int] = {}
        member_windows = windows if member is process else member.windows(later)
        kept, prorated = _job_timeline(
            member, member_windows, member.start_ns, end, member.start_ns, end, counted
        )
        total = (end - member.start_ns) / 1e9
        by_rank[number] = kept / total if total > 0 else 0.0
        if member is process:
            productive, job_end = kept, end
            badput = {k: v / 1e9 for k, v in counted.items()}
            for k, v in prorated.items():
                badput[k] = badput.get(k, 0.0) + v
    if process.preempted:  # told to stop (SIGTERM/SIGINT), not a failure of the job
        status = "preempted"
    elif process.end_ns is None:
        status = "no end exported"
    else:
        status = "failed" if process.end_error else "completed"
    ranged = _ran(process)
    return JobGoodput(
        run_id=job.run_id,
        restart=job.restart,
        ranks=sorted(job.ranks),
        rank_used=process.rank,
        start_ns=process.start_ns,
        end_ns=job_end,
        status=status,
        productive_s=productive,
        badput_s=badput,
        first_iteration=ranged[0] if ranged else None,
        last_iteration=ranged[1] if ranged else None,
        resumed_from=process.resume,
        goodput_by_rank=by_rank,
        inferred_tail=process.tail,
    )


def _model_goodput(result: SessionGoodput, windows: list[_Window]) -> None:
    flops = useful = 0.0
    for w in windows:
        kept = w.productive_s * (1 - w.wasted_fraction)
        if w.flops and w.peak and w.productive_s > 0:
            flops += w.flops * (1 - w.wasted_fraction)
            useful += kept * w.peak
    if useful > 0:
        result.model_flops_utilization = flops / useful


def _step_time(
    result: SessionGoodput, windows: list[_Window], refs: list[_Process], recent: int = 10
) -> None:
    ideal = next((w.ideal for w in reversed(windows) if w.ideal), None)
    result.ideal_step_time_s = ideal
    if not ideal:
        return
    result.recent_deviation = [
        {
            "first_iteration": w.first,
            "last_iteration": w.last,
            "p50": w.p50 / ideal - 1,
            "p90": w.p90 / ideal - 1,
            "p99": w.p99 / ideal - 1,
        }
        for w in windows[-recent:]
    ]
    worst = heapq.nlargest(5, (w for w in windows if w.slowest is not None), key=lambda w: w.max_s)
    wanted = {w.slowest for w in worst}
    exported: dict[int, tuple[str, str]] = {}  # exported twice: the later one, as read in order
    for process in refs:
        for number, _start, _end, high, low, span_id in process.iterations:
            if number in wanted:
                exported[number] = (_trace_hex(high, low), _span_hex(span_id))
    for w in worst:
        entry: dict[str, Any] = {
            "iteration": w.slowest,
            "seconds": w.max_s,
            "deviation": w.max_s / ideal - 1,
        }
        ids = exported.get(w.slowest) if w.slowest is not None else None
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        result.most_deviating.append(entry)


# --- text ------------------------------------------------------------------------------------
def _bar(share: float, width: int = 30) -> str:
    share = min(1.0, max(0.0, share))
    return "#" * round(share * width)


def _clock(ns: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def render_goodput(results: list[SessionGoodput]) -> str:
    """The tables a person reads."""
    if not results:
        return "no training sessions found"
    lines: list[str] = []
    for r in results:
        tags = f" (perf_tag {', '.join(r.perf_tags)})" if r.perf_tags else ""
        lines.append(f"session {r.session}{tags}")
        lines.append(
            f"  {_clock(r.start_ns)} -> {_clock(r.end_ns)} UTC, {r.total_s:,.1f} s, {len(r.jobs)} job(s), "
            f"{r.disruptions} disruption(s), last iteration {r.last_iteration}"
        )
        lines.append(f"  {'goodput':<26}{r.goodput:8.2%}  {r.productive_s:12.1f} s  {_bar(r.goodput)}")
        for category in BADPUT_CATEGORIES:
            share = r.badput(category)
            lines.append(
                f"  {'badput ' + category:<26}{share:8.2%}  {r.badput_s[category]:12.1f} s  {_bar(share)}"
            )
        layers = r.layers()
        lines.append(
            f"  layers: infrastructure {layers['infrastructure']['badput']:.2%} badput, "
            f"framework {layers['framework']['badput']:.2%} badput"
            + (
                f", model MFU over productive time {r.model_flops_utilization:.2%}"
                if r.model_flops_utilization is not None
                else ""
            )
        )
        if r.energy_j.get("total"):
            lines.append(_energy_line(r.energy_j))
        if r.ideal_step_time_s:
            lines.append(
                f"  ideal step time {r.ideal_step_time_s * 1e3:.2f} ms (mean of steps <= median + 3 MAD)"
            )
            if r.recent_deviation:
                last = r.recent_deviation[-1]
                lines.append(
                    f"  last window deviation: p50 {last['p50']:+.1%}  p90 {last['p90']:+.1%}  "
                    f"p99 {last['p99']:+.1%}"
                )
            for entry in r.most_deviating:
                ids = f"  trace {entry['trace_id']} span {entry['span_id']}" if "trace_id" in entry else ""
                lines.append(
                    f"    iteration {entry['iteration']}: {entry['seconds'] * 1e3:.1f} ms "
                    f"({entry['deviation']:+.0%}){ids}"
                )
        lines.append(
            f"  {'job (run id, restart)':<40}{'ranks':>6}{'start':>21}{'seconds':>11}{'goodput':>9}  "
            f"{'iterations':<15}status"
        )
        for j in r.jobs:
            lines.extend(_job_lines(j))
        lines.append("")
    return "\n".join(lines).rstrip()


def _energy_line(energy: dict[str, float]) -> str:
    total = energy["total"]
    parts = ", ".join(f"{k} {v / total:.1%}" for k, v in energy.items() if k != "total" and v)
    return f"  GPU energy {total / 1e3:,.1f} kJ (all ranks)" + (f": {parts}" if parts else "")


def _job_lines(j: JobGoodput) -> list[str]:
    """A job's row of the table, and what of it was inferred."""
    iterations = f"{j.first_iteration}-{j.last_iteration}" if j.first_iteration is not None else "-"
    name = f"{j.run_id[:32]}, {j.restart}"
    lines = [
        f"  {name:<40}{len(j.ranks):>6}{_clock(j.start_ns):>21}{j.total_s:>11.1f}{j.goodput:>9.2%}  "
        f"{iterations:<15}{j.status}"
    ]
    tail = j.inferred_tail
    if tail is not None:
        missing = f", {tail.missing_iterations} not exported (not counted)" if tail.missing_iterations else ""
        lines.append(
            f"    iterations {tail.first_iteration}-{tail.last_iteration} after the last window "
            f"record: counted from {tail.exported_iterations} exported iteration spans{missing}"
        )
    return lines


def parse_time(text: str) -> int:
    """Unix nanoseconds from ISO 8601 (UTC unless an offset is given) or Unix seconds."""
    import datetime

    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError(f"not a finite time: {text!r}")
        return round(seconds * 1e9)
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO 8601 time or Unix seconds: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return round(moment.timestamp() * 1e9)
