"""Reading the files into goodput state: each span and metrics record into its process,
window records and exported iterations as rows, then per process the data loading resolved
(inside an iteration or not) and the iterations after the last window record inferred.
"""

from __future__ import annotations

import bisect
import math
import operator
import os
from collections.abc import Callable, Iterable
from typing import Any

from traintel import semconv
from traintel._aggregation.goodput import startup_seconds
from traintel._aggregation.progress import JobProgress
from traintel.analysis.goodput.process import (
    APPLICATION,
    HAS_PARENT,
    IS_ITERATION,
    LOOP,
    InferredTail,
    Job,
    Process,
    Window,
    span_key,
    trace_key,
    union,
)
from traintel.analysis.parallel import map_files, merge_by_key
from traintel.analysis.resources import PerResource
from traintel.analysis.summary import ENERGY_PARTS
from traintel.exporters.progress_mark import process_key, read_mark
from traintel.exporters.reader import ReadStats, Record, SpanRecord, analysis_files, gc_paused, iter_records
from traintel.semconv import BADPUT_CATEGORY_OF_PHASE, Phase

_W = semconv.WINDOW_PREFIX
_ITERATION = Phase.TRAINING_ITERATION.value
_DATA_LOADING = Phase.DATA_LOADING.value
_PREEMPTION = semconv.Event.PREEMPTION.value
_WALL_CLOCK_STEP = semconv.Event.WALL_CLOCK_STEP.value


def _float(value: object, default: float = 0.0) -> float:
    if type(value) is float:  # the common case, before the general checks
        return value
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


#: A window record's attributes in the order of its row's columns (:data:`WINDOW_ROW`).
_ROW_INTS = (_W + "first_iteration", _W + "last_iteration", _W + "iterations")
_ROW_FLOATS = (
    _W + "productive_time", _W + "data_loading_time", _W + "program_startup_time", _W + "flops",
    semconv.MFU_DENOMINATOR, _W + "iteration_time.p50", _W + "iteration_time.p90",
    _W + "iteration_time.p99", _W + "iteration_time.max",
)  # fmt: skip
_ROW_SLOWEST = _W + "slowest_iteration"


_FLOAT = frozenset({float})


def _window_row(start_ns: int, end_ns: int, a: dict[str, Any]) -> tuple[Any, ...]:
    """A window record's row (:data:`WINDOW_ROW`), as ``Process.windows`` reads it back. The
    usual record (integers and floats where they belong, a slowest iteration named) is taken
    as it is; anything else through the checked conversions."""
    get = a.get
    first, last, iterations = ints = [get(key) for key in _ROW_INTS]
    floats = [get(key, 0.0) for key in _ROW_FLOATS]
    slowest, ideal = get(_ROW_SLOWEST), get(semconv.STEP_TIME_IDEAL, 0.0)
    if (
        type(first) is int
        and type(last) is int
        and type(iterations) is int
        and type(slowest) is int
        and type(ideal) is float
        and set(map(type, floats)) <= _FLOAT
    ):
        return (start_ns, end_ns, first, last, iterations, *floats, slowest, ideal, True)
    checked = _int(slowest)
    return (
        start_ns,
        end_ns,
        *[_int(value) or 0 for value in ints],
        *[_float(value) for value in floats],
        checked if checked is not None else 0,  # (the ranks' records have none in scale mode)
        _float(ideal),
        checked is not None,
    )


class GoodputReader:
    """The processes of the records read so far, keyed by instance (service instance id, else
    run id): fed one file's records in order, merged with the reader of the files after it
    (:meth:`merge`, exact: see :class:`Process`), grouped into jobs at the end."""

    def __init__(self) -> None:
        self.processes: dict[str, Process] = {}
        self.process_of = PerResource(self._process_of)

    def _process_of(self, resource: dict[str, Any]) -> Process:
        key = process_key(resource)
        return self.processes.setdefault(key, Process(key, resource))  # (once per resource)

    def add(self, record: Record) -> None:
        """A span into its process; a resource's metrics: their points' times (a job killed
        before its spans were exported still shows how long it lived)."""
        process = self.process_of(record.resource)
        if isinstance(record, SpanRecord):
            _add_span(process, record)
        else:
            process.see(0, record.last_time_ns)

    def add_mark(self, mark: dict[str, Any] | None) -> None:
        """The progress mark of the file just read, into its process (its records' resource); of
        a file never written, into the process its mark names (a job killed in its first minute)."""
        if mark is None:
            return
        process = self.processes.get(str(mark.get("instance")))
        job, start = mark.get("resource"), _int(mark.get("start_unix_nano"))
        if process is None and isinstance(job, dict) and start is not None:
            process = self._process_of(job)
            process.see(start, start)
        at = _int(mark.get("time_unix_nano"))
        if process is None or at is None or at < process.mark_ns:
            return
        process.see(0, at)
        progress = mark.get("progress")
        process.mark_ns, process.mark = at, progress if isinstance(progress, dict) else None

    def merge(self, later: GoodputReader) -> None:
        merge_by_key(self.processes, later.processes)
        self.process_of.clear()

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
    :class:`Process`); with ``workers`` > 1 in that many processes. ``progress`` is told the
    bytes read (a file never written counts its job from its mark).
    """
    stats = stats if stats is not None else ReadStats()
    reader = GoodputReader()
    files = [str(path) for path in analysis_files(paths)]
    for part, part_stats in map_files(read_file, files, workers, progress):
        reader.merge(part)
        stats.merge(part_stats)
    return reader.jobs()


def read_file(path: str, progress: Callable[[int], None] | None = None) -> tuple[GoodputReader, ReadStats]:
    """One file's goodput state and read counts (a part of :func:`load_jobs`)."""
    reader, stats = GoodputReader(), ReadStats()
    with gc_paused():
        for record in iter_records([path], stats, progress, metric_names=None):  # (nor window numbers)
            reader.add(record)
    reader.add_mark(read_mark(path))
    return reader, stats


def _group_jobs(processes: Iterable[Process]) -> list[Job]:
    """Processes with a timeline, grouped into jobs by session, run id, restart count and
    launch. The launch tells apart a job started again under the same id and count (torchrun
    rerun with its ``--rdzv-id``), which must not take the first one's place: in start order, a
    process is its rank's n-th under that key, and its launch the largest n of any rank so far
    (the ClickHouse views count the same way)."""
    jobs: dict[tuple[str, str, int, int], Job] = {}
    seen: dict[tuple[str, str, int, int], int] = {}  # (key, rank) -> processes so far
    launches: dict[tuple[str, str, int], int] = {}
    for process in sorted(processes, key=lambda p: (p.start_ns, p.instance)):
        if process.start_ns == 2**63:
            continue  # metrics only: no timeline
        _resolve_data_loading(process)
        _infer_tail(process)
        _trained_past_its_end(process)
        r = process.resource
        session = str(r.get(semconv.SESSION_TAG) or r.get(semconv.RUN_ID) or process.instance)
        run_id = str(r.get(semconv.RUN_ID) or process.instance)
        restart = _int(r.get(semconv.RESTART_COUNT)) or 0
        key = (session, run_id, restart)
        of_rank = (session, run_id, restart, process.rank)
        occurrence = seen[of_rank] = seen.get(of_rank, 0) + 1
        launch = launches[key] = max(launches.get(key, 0), occurrence)
        job = jobs.get((session, run_id, restart, launch))
        if job is None:
            perf = r.get(semconv.PERF_TAG)
            job = jobs[session, run_id, restart, launch] = Job(
                session, str(perf) if perf else None, run_id, restart
            )
        job.ranks[process.rank] = process
    return list(jobs.values())


def _add_events(process: Process, span: SpanRecord) -> None:
    for event in span.events:
        process.see(0, event.time_ns)
        if event.name == _PREEMPTION:
            process.preempted = True
        elif event.name == _WALL_CLOCK_STEP:
            step = event.attributes.get(semconv.WALL_CLOCK_STEP)
            if isinstance(step, float) and math.isfinite(step):
                process.wall_clock_step_s = max(process.wall_clock_step_s, step, key=abs)


def _add_span(process: Process, span: SpanRecord) -> None:
    start, end = span.start_ns, span.end_ns
    process.see(start, end)
    _add_events(process, span)
    attributes = span.attributes
    if span.name == semconv.TRAINING_WINDOW_SPAN:  # a leaf: no ancestor of any data loading
        process.window_rows.append(_window_row(start, end, attributes))
        if _W + "energy" in attributes:
            for key, joules in _energy_of(attributes, _W + "energy").items():
                process.window_energy[key] = process.window_energy.get(key, 0.0) + joules
        return
    _add_phase_span(process, span, attributes.get(semconv.PHASE))


def _add_phase_span(process: Process, span: SpanRecord, phase: object) -> None:
    """A span other than a window record: the parent links, an exported iteration, the job's
    outer spans, a categorised phase."""
    start, end = span.start_ns, span.end_ns
    parent = span.parent_span_id
    attributes = span.attributes
    is_iteration = phase == _ITERATION
    if is_iteration or parent is not None:  # a root that is no iteration: as good as unknown
        flags = (IS_ITERATION if is_iteration else 0) | (HAS_PARENT if parent is not None else 0)
        process.links.append((span_key(span.span_id), span_key(parent) if parent is not None else 0, flags))
    if is_iteration:
        iteration = _int(attributes.get(semconv.ITERATION))
        if iteration is not None and not span.is_error:  # one that raised did not complete
            process.iterations.append(
                (iteration, start, end, *trace_key(span.trace_id), span_key(span.span_id))
            )
        return
    if phase in (APPLICATION, LOOP):
        _add_outer(process, span, str(phase))
        return
    category = BADPUT_CATEGORY_OF_PHASE.get(str(phase)) if phase is not None else None
    if category is None or semconv.THREAD_NAME in attributes:  # (beside training: not badput)
        return
    if phase == _DATA_LOADING:
        has_parent = parent is not None
        process.data_loading.append((start, end, span_key(parent) if parent is not None else 0, has_parent))
    else:
        process.phases.append((start, end, category))


def _add_outer(process: Process, span: SpanRecord, phase: str) -> None:
    """An application or training-loop span (segment): the resume point and the job's end."""
    attributes = span.attributes
    if phase == LOOP and attributes.get(semconv.SEGMENT_INDEX, 0) == 0:
        resume = _int(attributes.get(semconv.TRAIN_ITERATIONS_START))
        if resume is not None and (process.resume is None or resume < process.resume):
            process.resume = resume
    if not attributes.get(semconv.SEGMENT_CONTINUES, False):
        process.ended(phase, span.end_ns, span.status_code == 2)  # STATUS_CODE_ERROR
    if phase == APPLICATION and semconv.METRIC_ENERGY in attributes:
        process.job_energy = _energy_of(attributes, semconv.METRIC_ENERGY)


def _energy_of(attributes: dict[str, Any], key: str) -> dict[str, float]:
    """``{"total": J, category: J}`` from ``<key>`` and ``<key>.<category>`` attributes."""
    out = {"total": _float(attributes.get(key))}
    for part in ENERGY_PARTS:
        value = attributes.get(key + "." + part)
        if value is not None:
            out[part] = _float(value)
    return out


def _resolve_data_loading(process: Process) -> None:
    """Data loading outside iterations is badput of its own; inside, the window has it."""
    if process.data_loading:
        parents = {
            span: (parent if flags & HAS_PARENT else None, bool(flags & IS_ITERATION))
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


def _marked_window(process: Process, covered: int) -> Window | None:
    """The iterations after the last window record, from the progress mark: the job's account
    to its last iteration, by the live rules (``_aggregation.progress``), less its records."""
    if process.mark is None:
        return None
    try:
        progress = JobProgress(**process.mark)
    except TypeError:  # not a mark this version wrote
        return None
    if progress.last_iteration <= covered:
        return None  # recorded since
    first, last = progress.first_iteration, progress.last_iteration
    recorded = [row for row in process.window_rows if first <= row[2] and row[3] <= last]
    iterations, productive, start = progress.iterations, progress.productive_s, progress.start_ns
    data, startup = progress.data_loading_s, progress.program_startup_s
    for row in recorded:
        iterations -= row[4]
        productive, data, startup = productive - row[5], data - row[6], startup - row[7]
        start = max(start, row[1])
    if iterations <= 0:
        return None
    return Window(
        start_ns=start, end_ns=progress.end_ns, first=max(first, covered + 1), last=last,
        iterations=iterations, productive_s=max(0.0, productive), data_s=max(0.0, data),
        startup_s=max(0.0, startup), flops=0.0, peak=None, p50=0.0, p90=0.0, p99=0.0,
        max_s=progress.max_s, slowest=progress.slowest_iteration, ideal=progress.ideal_step_time_s,
        inferred=True, quantiles=False,
    )  # fmt: skip


def _trained_past_its_end(process: Process) -> None:
    """A job of loops without ``application()`` whose latest exported loop end comes before
    iterations it ran (a second stage killed mid-way, its loop never ended) has no end: it did
    not complete where its first stage did."""
    if process.outermost != LOOP or process.end_ns is None:
        return
    trained = max(
        max((row[1] for row in process.window_rows), default=0),
        max((window.end_ns for window in process.inferred), default=0),
    )
    if trained > process.end_ns:
        process.outermost, process.end_ns, process.end_error = None, None, False


def _infer_tail(process: Process) -> None:
    """The iterations after the last window record: the progress mark's account of them (one
    inferred window), then each exported iteration after it as an inferred window of one
    iteration (so a later job redoing some of them wastes exactly theirs), accounted by the live
    rules: an iteration's time is productive but for its data-loading wait and the categorised
    phases inside it; if the job has neither a window record nor a mark, its first iteration's
    excess over the median of the others is program startup."""
    covered = max((row[3] for row in process.window_rows), default=-1)  # the last iteration recorded
    marked = _marked_window(process, covered)
    if marked is not None:
        process.inferred.append(marked)
        covered = marked.last
    tail = _iterations_after(process, covered)
    inner = process.inner_data
    process.inner_data = []
    recorded = bool(process.window_rows)
    if not tail:
        if marked is not None:
            process.tail = InferredTail(
                marked.first, marked.last, 0, 0, marked.productive_s, marked.iterations, recorded
            )
        return
    no_records = not process.window_rows and marked is None
    productive_total = _infer_iterations(process, tail, inner, no_records)
    first, last = tail[0][0], tail[-1][0]
    marked_iterations = 0
    if marked is not None:
        first, marked_iterations = marked.first, marked.iterations
        productive_total += marked.productive_s
    missing = last - first + 1 - len(tail) - marked_iterations
    counted = len(tail)
    process.tail = InferredTail(first, last, counted, missing, productive_total, marked_iterations, recorded)


def _iterations_after(process: Process, covered: int) -> list[tuple[int, tuple[int, int]]]:
    """The exported iterations after iteration ``covered``: ``(number, (start, end))`` by number
    (one exported twice: the later one, as when read in order)."""
    after: dict[int, tuple[int, int]] = {}
    for number, start, end, *_ids in process.iterations:
        if number > covered:
            after[number] = (start, end)
    return sorted(after.items())


def _infer_iterations(
    process: Process,
    tail: list[tuple[int, tuple[int, int]]],
    inner: list[tuple[int, int]],
    no_records: bool,
) -> float:
    """Each iteration of ``tail`` as an inferred window of one iteration, by the live rules
    (``inner``: the data loading inside iterations; ``no_records``: the first one's excess over
    the median of the others, each without its data-loading wait, is program startup); returns
    their productive seconds."""
    begin = tail[0][1][0]
    inner_data = union(d for d in inner if d[1] > begin)
    phases = union((start, end) for start, end, _ in process.phases if end > begin)
    durations = [(end - start) / 1e9 for _, (start, end) in tail]
    waits = [_covered_ns(inner_data, start, end) / 1e9 for _, (start, end) in tail]
    steps = list(map(operator.sub, durations, waits))  # compared without their data-loading wait
    productive_total = 0.0
    for position, (number, (start, end)) in enumerate(tail):
        duration, data = durations[position], waits[position]
        room = duration - data - _covered_ns(phases, start, end) / 1e9
        startup = startup_seconds(steps, room) if no_records and position == 0 else 0.0
        productive = max(0.0, room - startup)
        productive_total += productive
        process.inferred.append(
            Window(
                start_ns=start, end_ns=end, first=number, last=number, iterations=1,
                productive_s=productive, data_s=data, startup_s=startup, flops=0.0, peak=None,
                p50=duration, p90=duration, p99=duration, max_s=duration, slowest=number,
                ideal=None, inferred=True,
            )
        )  # fmt: skip
    return productive_total
