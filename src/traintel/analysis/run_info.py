"""Which runs a read went through: who each was, when, how big, and which files hold it.

Why here, apart from the listing and the choosing (``runs.py``): every command that reads the
files fully (``summary``, ``report``) notes the runs as it goes, so that when the files turn out
to hold one run, the one read is enough to name it and nothing is read twice. ``traintel runs``
reads the same records through the same class.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from traintel import semconv
from traintel.analysis.parallel import merge_by_key
from traintel.analysis.resources import PerResource
from traintel.exporters.progress_mark import process_key, read_mark
from traintel.exporters.reader import Record, SpanRecord, gc_paused, iter_records

_W = semconv.WINDOW_PREFIX
_WINDOW_SPAN = semconv.TRAINING_WINDOW_SPAN
_WINDOW_EVENT = semconv.Event.TRAINING_METRICS_UPDATE.value
UNKNOWN_RUN = "unknown"

#: A process of a run: (run id, restart count, rank).
_Process = tuple[str, int, int]


def launches(processes: Iterable[tuple[str, int, int, str]]) -> int:
    """How many jobs processes (run id, restart count, rank, process key) come from: per run
    id and restart count, the most processes one rank had. A launch started again under the
    same id and count (torchrun rerun with its ``--rdzv-id``, a resume given the run id by
    hand) writes each rank a second time: a job of its own, as a restart is."""
    per_rank = Counter(process[:3] for process in processes)
    most: dict[tuple[str, int], int] = {}
    for (run_id, restart, _rank), count in per_rank.items():
        most[run_id, restart] = max(most.get((run_id, restart), 0), count)
    return sum(most.values())


def run_key(resource: Mapping[str, Any]) -> str:
    """The run a process belongs to, the unit the commands report on one at a time.

    The session tag, because the ranks of a job share its run id and the jobs of a restarted
    one share its session tag (which defaults to the run id): neither is split apart. Foreign
    data without them falls back to the run id, then to the process itself. The same rule as
    the goodput sessions, so a run's report and its goodput are about the same processes.
    """
    for key in (semconv.SESSION_TAG, semconv.RUN_ID, semconv.SERVICE_INSTANCE_ID):
        value = resource.get(key)
        if value is not None and value != "":
            return str(value)
    return UNKNOWN_RUN


def utc_text(time_ns: int) -> str:
    """A time in UTC, to the second (the file names' clock, whatever the local zone)."""
    return datetime.fromtimestamp(time_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class RunInfo:
    """One run in the files: who it was, when, how big, and which files hold it."""

    id: str
    services: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    #: Its processes: (run id, restart count, rank, process key); a restarted job has several
    #: launches (:func:`launches`).
    processes: set[tuple[str, int, int, str]] = field(default_factory=set)
    start_ns: int = 0
    end_ns: int = 0
    spans: int = 0
    #: The files holding the run, in the order read (a dict keeps order and drops repeats).
    file_set: dict[str, None] = field(default_factory=dict)
    #: Per process, iterations counted from its window spans and from its window events.
    window_iterations: dict[_Process, list[int]] = field(default_factory=dict)
    #: Per process, the iterations its progress mark counts (a job killed mid-window ran more
    #: than its window records hold).
    marked: dict[_Process, int] = field(default_factory=dict)

    @property
    def run_ids(self) -> set[str]:
        return {process[0] for process in self.processes}

    @property
    def restarts(self) -> int:
        """Launches after the first (see :func:`launches`)."""
        return max(0, launches(self.processes) - 1)

    @property
    def files(self) -> list[str]:
        return list(self.file_set)

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    @property
    def started(self) -> str:
        return utc_text(self.start_ns)

    @property
    def iterations(self) -> int:
        """Training iterations run: per launch the most any of its ranks ran (every rank runs
        them all), summed over launches (iterations a restart ran again count again). Window
        spans are preferred: every window is exported as one, whereas a plain OpenTelemetry
        loop span keeps only its newest window events."""
        per_job: dict[tuple[str, int], int] = {}
        for process, (from_spans, from_events) in self.window_iterations.items():
            counted = max(from_spans or from_events, self.marked.get(process, 0))
            per_job[process[:2]] = max(per_job.get(process[:2], 0), counted)
        return sum(per_job.values())

    def see(self, resource: Mapping[str, Any]) -> _Process:
        """A resource of this run; returns its process."""
        run_id = str(resource.get(semconv.RUN_ID) or resource.get(semconv.SERVICE_INSTANCE_ID) or self.id)
        restart = _int(resource.get(semconv.RESTART_COUNT))
        rank = _int(resource.get(semconv.RANK))
        self.processes.add((run_id, restart, rank, process_key(resource)))
        self.ranks.add(rank)
        for key, target in ((semconv.SERVICE_NAME, self.services), (semconv.HOST_NAME, self.hosts)):
            if resource.get(key):
                target.add(str(resource[key]))
        return (run_id, restart, rank)

    def add_span(self, process: _Process, span: SpanRecord) -> None:
        self.spans += 1
        start = span.start_ns
        if start and (not self.start_ns or start < self.start_ns):
            self.start_ns = start
        self.end_ns = max(self.end_ns, span.end_ns, start)
        counts = self.window_iterations.get(process)
        if counts is None:
            counts = self.window_iterations[process] = [0, 0]
        if span.name == _WINDOW_SPAN:
            counts[0] += max(0, _int(span.attributes.get(_W + "iterations")))
        for event in span.events:
            if event.name == _WINDOW_EVENT:
                counts[1] += max(0, _int(event.attributes.get(_W + "iterations")))

    def merge(self, later: RunInfo) -> None:
        """Add what a later read (another file) saw of the same run."""
        self.services |= later.services
        self.hosts |= later.hosts
        self.ranks |= later.ranks
        self.processes |= later.processes
        if later.start_ns and (not self.start_ns or later.start_ns < self.start_ns):
            self.start_ns = later.start_ns
        self.end_ns = max(self.end_ns, later.end_ns)
        self.spans += later.spans
        self.file_set.update(later.file_set)
        for process, (spans, events) in later.window_iterations.items():
            counts = self.window_iterations.setdefault(process, [0, 0])
            counts[0] += spans
            counts[1] += events
        for process, marked in later.marked.items():
            self.marked[process] = max(self.marked.get(process, 0), marked)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_ids": sorted(self.run_ids),
            "services": sorted(self.services),
            "hosts": sorted(self.hosts),
            "ranks": sorted(self.ranks),
            "restarts": self.restarts,
            "start_unix_nano": self.start_ns,
            "start_utc": self.started,
            "duration_s": self.duration_s,
            "iterations": self.iterations,
            "spans": self.spans,
            "files": self.files,
        }


class RunsSeen:
    """The runs of the records added, by :func:`run_key`; merged file after file."""

    def __init__(self) -> None:
        self.runs: dict[str, RunInfo] = {}
        self._of = PerResource(self._identify)

    def _identify(self, resource: dict[str, Any]) -> tuple[RunInfo, _Process]:
        key = run_key(resource)
        run = self.runs.setdefault(key, RunInfo(key))  # (once per resource)
        return run, run.see(resource)

    def add(self, record: Record) -> None:
        run, process = self._of(record.resource)
        if isinstance(record, SpanRecord):
            run.add_span(process, record)

    def in_file(self, path: str, mark: dict[str, Any] | None) -> None:
        """Every run added so far is in ``path`` (a per-file collector says so at its end), and
        the file's progress ``mark`` is its one process's (the embedded default's file)."""
        if not self.runs and mark is not None:
            self._marked_only(mark)
        for run in self.runs.values():
            run.file_set.setdefault(path, None)
        progress = (mark or {}).get("progress")
        processes = [(run, process) for run in self.runs.values() for process in run.window_iterations]
        if isinstance(progress, dict) and len(processes) == 1:
            run, process = processes[0]
            run.marked[process] = max(run.marked.get(process, 0), _int(progress.get("iterations")))

    def _marked_only(self, mark: dict[str, Any]) -> None:
        """The run of a file that holds no record yet, from its progress mark: a job killed in
        its first minute (hung in its first collective or data load) before its file wrote a
        span is still a run, of the time and iterations its mark counts."""
        resource = mark.get("resource")
        if not isinstance(resource, dict):
            return
        run, process = self._identify(resource)
        start, end = _int(mark.get("start_unix_nano")), _int(mark.get("time_unix_nano"))
        run.start_ns = start or end
        run.end_ns = max(start, end)
        run.window_iterations.setdefault(process, [0, 0])
        run.marked.setdefault(process, 0)  # a run, if of no iteration yet (killed in its init)

    def merge(self, later: RunsSeen) -> None:
        merge_by_key(self.runs, later.runs)
        self._of.clear()

    def newest_first(self) -> list[RunInfo]:
        """The runs with spans or a progress mark, newest (latest start) first."""
        found = [run for run in self.runs.values() if run.spans or run.marked]
        return sorted(found, key=lambda run: (run.start_ns, run.id), reverse=True)


def runs_in_file(path: str, progress: Callable[[int], None] | None = None) -> RunsSeen:
    """The runs in one file (a task for :func:`~traintel.analysis.parallel.map_files`)."""
    seen = RunsSeen()
    with gc_paused():
        for record in iter_records([path], progress=progress, metric_names=None):
            seen.add(record)
    seen.in_file(path, read_mark(path))
    return seen
