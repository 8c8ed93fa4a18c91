"""Everything ``traintel report`` shows, gathered in one streaming pass over a run's files.

Why one pass with bounded state: the files of a long run can be gigabytes, and a report must
not need the memory of its input. Per-window series are downsampled in place (adjacent windows
merge, weighted by their iterations and time, once a series reaches its point budget), the
phase timeline keeps its first intervals and counts the rest, and the slowest iterations are a
top-k heap. Goodput comes from the goodput analysis itself (one more pass), so both commands
always agree.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from traintel import semconv
from traintel.analysis.goodput import GoodputReader, SessionGoodput, compute_goodput
from traintel.analysis.parallel import map_files, merge_by_key
from traintel.analysis.ranks import CrossRankTable
from traintel.analysis.resources import PerResource
from traintel.analysis.run_info import run_key
from traintel.analysis.stalls import MAX_STALLS, Stall, find_stalls
from traintel.analysis.summary import (
    SELF_TELEMETRY,
    PhaseStats,
    RunSummary,
    add_mark,
    energy_figures,
    is_loss,
    phase_rows,
)
from traintel.exporters.progress_mark import read_mark
from traintel.exporters.reader import (
    EventRecord,
    LogEntry,
    MetricsRecord,
    ReadStats,
    SpanRecord,
    analysis_files,
    gc_paused,
    iter_records,
)
from traintel.semconv import Phase

_W = semconv.WINDOW_PREFIX
_FINALIZE = Phase.CHECKPOINT_FINALIZE.value
_METRIC = _W + "metric."
#: Points kept per series (per process); beyond it adjacent windows merge.
SERIES_POINTS = 256
#: Phase intervals kept for the timeline; the rest are counted.
TIMELINE_INTERVALS = 4000
#: Model metrics (``record_metrics`` names) charted per process; further names are counted.
MODEL_METRICS = 32
#: Checkpoint saves kept individually (totals count all of them).
CHECKPOINT_RECORDS = 500
#: Warning events kept with their details (counts cover all of them).
WARNING_DETAILS = 20
#: Events that are warnings a user should see.
_STRAGGLER = semconv.Event.STRAGGLER.value
WARNING_EVENTS = frozenset(
    {
        semconv.Event.SLOW_ITERATION.value,
        semconv.Event.NONFINITE_METRIC.value,
        semconv.Event.METRIC_OUT_OF_RANGE.value,
        _STRAGGLER,
        semconv.Event.WALL_CLOCK_STEP.value,
    }
)
_CONFIG_EVENTS = frozenset(
    {semconv.Event.TELEMETRY_INITIALIZATION.value, semconv.Event.TRAINING_CONFIG_UPDATE.value}
)
_TIMELINE_SKIP = {p.value for p in semconv.ITERATION_PHASES} | {p.value for p in semconv.STEP_PHASES}


def process_identity(resource: dict[str, Any]) -> tuple[str, int, str]:
    """(key, rank, label) of the process (a rank of one job) a resource describes."""
    run = str(resource.get(semconv.RUN_ID, resource.get(semconv.SERVICE_INSTANCE_ID, "?")))
    restart = resource.get(semconv.RESTART_COUNT, 0)
    rank = int(resource.get(semconv.RANK, 0) or 0)
    # run ids are often 32 hex digits: a prefix tells runs apart in a legend
    label = f"rank {rank}" + (f" · run {run[:8]}" if run != "?" else "")
    label += f" · restart {restart}" if restart else ""
    return f"{run}/{restart}/{rank}", rank, label


@dataclass(slots=True)
class WindowPoint:
    """One window of iterations (or several merged): what the charts plot."""

    first_iteration: int
    last_iteration: int
    iterations: int
    end_ns: int
    time_s: float  # total iteration time of the window
    p99_s: float  # the window's p99 (the max of p99s once merged)
    samples: float | None = None
    tokens: float | None = None
    flops_time: float | None = None  # TFLOP/s x seconds, to merge rates by time
    mfu_time: float | None = None

    @property
    def mean_s(self) -> float:
        return self.time_s / self.iterations if self.iterations else 0.0

    @property
    def samples_per_second(self) -> float | None:
        return self.samples / self.time_s if self.samples is not None and self.time_s > 0 else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.time_s if self.tokens is not None and self.time_s > 0 else None

    @property
    def tflops_per_device(self) -> float | None:
        return self.flops_time / self.time_s if self.flops_time is not None and self.time_s > 0 else None

    @property
    def mfu(self) -> float | None:
        return self.mfu_time / self.time_s if self.mfu_time is not None and self.time_s > 0 else None

    def merged(self, other: WindowPoint) -> WindowPoint:
        return WindowPoint(
            min(self.first_iteration, other.first_iteration),
            max(self.last_iteration, other.last_iteration),
            self.iterations + other.iterations,
            max(self.end_ns, other.end_ns),
            self.time_s + other.time_s,
            max(self.p99_s, other.p99_s),
            _add_known(self.samples, other.samples),
            _add_known(self.tokens, other.tokens),
            _add_known(self.flops_time, other.flops_time),
            _add_known(self.mfu_time, other.mfu_time),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_iteration": self.first_iteration,
            "last_iteration": self.last_iteration,
            "iterations": self.iterations,
            "mean_s": self.mean_s,
            "p99_s": self.p99_s,
            "samples_per_second": self.samples_per_second,
            "tokens_per_second": self.tokens_per_second,
            "tflops_per_device": self.tflops_per_device,
            "mfu": self.mfu,
        }


def _add_known(a: float | None, b: float | None) -> float | None:
    """The sum of what is known (None: neither is)."""
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def window_point(end_ns: int, attributes: dict[str, Any]) -> WindowPoint | None:
    """A point from a ``training_metrics_update`` event's attributes (None if not a window)."""
    n = int(attributes.get(_W + "iterations", 0) or 0)
    if n <= 0:
        return None
    time_s = float(attributes.get(_W + "iteration_time.mean", 0.0)) * n

    def rate_time(key: str) -> float | None:
        value = attributes.get(_W + key)
        return float(value) * time_s if isinstance(value, int | float) else None

    samples = attributes.get(_W + "samples")
    tokens = attributes.get(_W + "tokens")
    return WindowPoint(
        first_iteration=int(attributes.get(_W + "first_iteration", 0)),
        last_iteration=int(attributes.get(_W + "last_iteration", 0)),
        iterations=n,
        end_ns=end_ns,
        time_s=time_s,
        p99_s=float(
            attributes.get(_W + "iteration_time.p99", attributes.get(_W + "iteration_time.max", 0.0))
        ),
        samples=float(samples) if isinstance(samples, int | float) else None,
        tokens=float(tokens) if isinstance(tokens, int | float) else None,
        flops_time=rate_time("tflops_per_device"),
        mfu_time=rate_time("mfu"),
    )


def window_span_point(span: SpanRecord) -> WindowPoint | None:
    """A point from a ``training_window`` span: every window of the run is exported as one (the
    update events ride on the loop span, where a plain OpenTelemetry loop keeps only the SDK's
    newest 128 events), but it carries no sample or token counts."""
    get = span.attributes.get
    n = int(get(_W + "iterations", 0) or 0)
    if n <= 0:
        return None
    raw_flops, raw_peak = get(_W + "flops"), get(semconv.MFU_DENOMINATOR)
    flops = float(raw_flops) if isinstance(raw_flops, int | float) and raw_flops > 0 else None
    peak = float(raw_peak) if isinstance(raw_peak, int | float) and raw_peak > 0 else None
    return WindowPoint(
        first_iteration=int(get(_W + "first_iteration", 0)),
        last_iteration=int(get(_W + "last_iteration", 0)),
        iterations=n,
        end_ns=span.end_ns,
        time_s=float(get(_W + "iteration_time.total", 0.0)),
        p99_s=float(get(_W + "iteration_time.p99", 0.0)),
        flops_time=flops / 1e12 if flops is not None else None,  # TFLOP/s x seconds
        mfu_time=flops / peak if flops is not None and peak is not None else None,
    )


@dataclass(frozen=True)
class MetricPoint:
    """A model metric over one window (or several merged): its mean and its last value.

    The window records each metric's mean over its finite values and its last value (finite
    or not: a loss that went NaN must show). Merged windows weigh their means by iterations,
    the closest the records allow (they do not say how many values each mean is over).
    """

    first_iteration: int
    last_iteration: int
    iterations: int
    last: float
    mean: float | None  # None: no finite value in the window(s)
    mean_iterations: int = 0  # the iterations behind ``mean`` (its weight in a merge)
    windows: int = 1

    def merged(self, other: MetricPoint) -> MetricPoint:
        later = other if other.last_iteration >= self.last_iteration else self
        weight = self.mean_iterations + other.mean_iterations
        if self.mean is None or other.mean is None or weight == 0:
            mean = self.mean if other.mean is None else other.mean
        else:
            mean = (self.mean * self.mean_iterations + other.mean * other.mean_iterations) / weight
        return MetricPoint(
            min(self.first_iteration, other.first_iteration),
            max(self.last_iteration, other.last_iteration),
            self.iterations + other.iterations,
            later.last,
            mean,
            weight,
            self.windows + other.windows,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_iteration": self.first_iteration,
            "last_iteration": self.last_iteration,
            "iterations": self.iterations,
            "windows": self.windows,
            "mean": json_number(self.mean),
            "last": json_number(self.last),
        }


def json_number(value: float | None) -> float | str | None:
    """Non-finite values as text (``"nan"``): JSON has no NaN, and a diverged loss must show."""
    return value if value is None or math.isfinite(value) else str(value)


def metric_points(point: WindowPoint, attributes: dict[str, Any]) -> dict[str, MetricPoint]:
    """The model metrics of a ``training_metrics_update`` event, one point per metric name."""
    values: dict[str, dict[str, float]] = {}
    for key, value in attributes.items():
        if key.startswith(_METRIC) and isinstance(value, int | float) and not isinstance(value, bool):
            name, _, statistic = key[len(_METRIC) :].rpartition(".")
            values.setdefault(name, {})[statistic] = float(value)
    points = {}
    for name, stats in values.items():
        mean = stats.get("mean")
        if mean is not None and not math.isfinite(mean):
            mean = None
        points[name] = MetricPoint(
            point.first_iteration,
            point.last_iteration,
            point.iterations,
            stats.get("last", math.nan),
            mean,
            point.iterations if mean is not None else 0,
        )
    return points


class _Mergeable(Protocol):
    def merged(self: _P, other: _P) -> _P: ...


_P = TypeVar("_P", bound=_Mergeable)


class Series(Generic[_P]):
    """Window points in bounded memory: when full, adjacent pairs merge and later points are
    pre-merged at the new stride, so the resolution halves instead of memory growing."""

    def __init__(self, capacity: int = SERIES_POINTS) -> None:
        self.capacity = max(2, capacity)
        self.points: list[_P] = []
        self.stride = 1
        self._pending: _P | None = None
        self._pending_count = 0

    def add(self, point: _P) -> None:
        self._pending = point if self._pending is None else self._pending.merged(point)
        self._pending_count += 1
        if self._pending_count < self.stride:
            return
        self.points.append(self._pending)
        self._pending, self._pending_count = None, 0
        self.points, self.stride = self._within_capacity(self.points, self.stride)

    def _within_capacity(self, points: list[_P], stride: int) -> tuple[list[_P], int]:
        """Adjacent pairs merged (the stride doubling) until fewer than ``capacity`` remain."""
        while len(points) >= self.capacity:
            pairs = [points[i].merged(points[i + 1]) for i in range(0, len(points) - 1, 2)]
            if len(points) % 2:
                pairs.append(points[-1])
            points, stride = pairs, stride * 2
        return points, stride

    def all(self) -> list[_P]:
        return self.points + ([self._pending] if self._pending is not None else [])

    def merge(self, later: Series[_P]) -> None:
        """Append ``later``'s points (a later file's of the same process). Where both have
        points, adjacent ones merge pairwise until the budget holds, as :meth:`add` does, so the
        points are those of the same windows, grouped by file first."""
        if not later.points and later._pending is None:
            return
        if not self.points and self._pending is None:
            self.points, self.stride = list(later.points), later.stride
            self._pending, self._pending_count = later._pending, later._pending_count
            return
        points, stride = self._within_capacity(self.all() + later.all(), max(self.stride, later.stride))
        self.points, self.stride, self._pending, self._pending_count = points, stride, None, 0


@dataclass
class Process:
    """One process of one job (a rank): its identity and its per-window series."""

    key: str
    label: str
    rank: int
    # from training_metrics_update events
    series: Series[WindowPoint] = field(default_factory=Series[WindowPoint])
    # from training_window spans
    windows: Series[WindowPoint] = field(default_factory=Series[WindowPoint])
    #: The user's model metrics per window, by name (from the same events).
    metrics: dict[str, Series[MetricPoint]] = field(default_factory=dict)
    #: Metric names beyond ``MODEL_METRICS``: counted, not charted.
    metrics_dropped: set[str] = field(default_factory=set)

    def timing(self) -> list[WindowPoint]:
        """Iteration time and MFU per window: the complete window spans when the run has them."""
        return self.windows.all() or self.series.all()

    def merge(self, later: Process) -> None:
        """The same process as read from a later file."""
        self.series.merge(later.series)
        self.windows.merge(later.windows)
        for name, series in later.metrics.items():
            if (mine := self.metric(name)) is not None:
                mine.merge(series)
        self.metrics_dropped |= later.metrics_dropped - set(self.metrics)

    def add_metrics(self, points: dict[str, MetricPoint]) -> None:
        for name, point in points.items():
            if (series := self.metric(name)) is not None:
                series.add(point)

    def metric(self, name: str) -> Series[MetricPoint] | None:
        """Model metric ``name``'s series, made while fewer than ``MODEL_METRICS`` are charted;
        None beyond them (the name counted as dropped)."""
        series = self.metrics.get(name)
        if series is None and len(self.metrics) >= MODEL_METRICS:
            self.metrics_dropped.add(name)
        elif series is None:
            series = self.metrics[name] = Series[MetricPoint]()
        return series


@dataclass(frozen=True)
class Interval:
    process: str
    phase: str
    start_ns: int
    end_ns: int
    error: bool


@dataclass(frozen=True)
class CheckpointSave:
    process: str
    phase: str
    start_ns: int
    duration_s: float
    size_bytes: float | None
    iteration: int | None


#: Hang records a report keeps (a record per rank and stall, each with its stack).
HANG_RECORDS = 20_000


@dataclass
class Report:
    """What ``traintel report`` renders (terminal, JSON, HTML)."""

    summary: RunSummary = field(default_factory=lambda: RunSummary(keep_slowest=10))
    processes: dict[str, Process] = field(default_factory=dict)
    perf_tags: set[str] = field(default_factory=set)
    timeline: list[Interval] = field(default_factory=list)
    timeline_dropped: int = 0
    saves: list[CheckpointSave] = field(default_factory=list)  # the first CHECKPOINT_RECORDS
    save_bytes: float = 0.0  # of every save
    warning_details: list[dict[str, Any]] = field(default_factory=list)
    #: Straggler events on the straggler's own loop: one per window where every rank of the job
    #: records the job's straggler (under the scale threshold), the straggler among them.
    own_stragglers: int = 0
    goodput: list[SessionGoodput] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    ranks: CrossRankTable = field(default_factory=CrossRankTable)  # merged across the ranks' files
    #: The ranks' hang records (the first HANG_RECORDS), read into :attr:`stalls`.
    hang_records: list[LogEntry] = field(default_factory=list)
    #: The one run reported (a ``run_key``) when the files hold several; None: all of them.
    run: str | None = None
    #: The training configuration (``set_training_config``, the ``TRAINTEL_*`` settings) as the
    #: latest ``telemetry_initialization`` / ``training_config_update`` event left it, and its time.
    config: dict[str, Any] = field(default_factory=dict)
    config_at: int = -1
    process_of: PerResource[Process] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.process_of = PerResource(self._process_for)

    @property
    def stats(self) -> ReadStats:
        return self.summary.stats

    def _process_for(self, resource: dict[str, Any]) -> Process:
        key, rank, label = process_identity(resource)
        return self.processes.setdefault(key, Process(key, label, rank))  # (once per resource)

    def _add_event(self, process: Process, event: EventRecord) -> None:
        """A span event: the rank tables see them all; window metrics join the process's
        series; the first warnings are kept with their details (the summary counts them all)."""
        self.ranks.add_event(process.key.rsplit("/", 1)[0], process.rank, event.name, event.attributes)
        if event.name == semconv.Event.TRAINING_METRICS_UPDATE.value:
            point = window_point(event.time_ns, event.attributes)
            if point is not None:
                process.series.add(point)
                process.add_metrics(metric_points(point, event.attributes))
        elif event.name in _CONFIG_EVENTS:
            self._config(event.time_ns, event.attributes)
        if event.name == _STRAGGLER and event.attributes.get(semconv.STRAGGLER_RANK) == process.rank:
            self.own_stragglers += 1
        if event.name in WARNING_EVENTS and len(self.warning_details) < WARNING_DETAILS:
            detail = {"event": event.name, "process": process.label, "time_ns": event.time_ns}
            detail.update({k: v for k, v in event.attributes.items() if not isinstance(v, list)})
            self.warning_details.append(detail)

    def _config(self, time_ns: int, attributes: dict[str, Any]) -> None:
        if time_ns >= self.config_at:
            prefix = len(semconv.CONFIG_PREFIX)
            self.config = {
                k[prefix:]: v for k, v in attributes.items() if k.startswith(semconv.CONFIG_PREFIX)
            }
            self.config_at = time_ns

    def add_span(self, span: SpanRecord) -> None:
        self.summary.runs.add(span)
        if self.run is not None and run_key(span.resource) != self.run:
            return
        self.summary.add(span)
        process = self.process_of(span.resource)
        if semconv.PERF_TAG in span.resource:
            self.perf_tags.add(str(span.resource[semconv.PERF_TAG]))
        for event in span.events:
            self._add_event(process, event)
        if span.name == semconv.TRAINING_WINDOW_SPAN:
            point = window_span_point(span)
            if point is not None:
                process.windows.add(point)
        phase = span.attributes.get(semconv.PHASE)
        if phase is None or phase in _TIMELINE_SKIP:
            return
        phase = str(phase)
        if len(self.timeline) < TIMELINE_INTERVALS:
            self.timeline.append(Interval(process.key, phase, span.start_ns, span.end_ns, span.is_error))
        else:
            self.timeline_dropped += 1
        if phase in semconv.CHECKPOINT_SAVE_PHASES or phase == _FINALIZE:  # (an async save's
            # bytes are known when its writer finished, on its finalize span)
            size = span.attributes.get(semconv.CHECKPOINT_SIZE)
            size_bytes = float(size) if isinstance(size, int | float) else None
            self.save_bytes += size_bytes or 0.0
            if phase != _FINALIZE:
                self._add_save(process, phase, span, size_bytes)

    def _add_save(self, process: Process, phase: str, span: SpanRecord, size_bytes: float | None) -> None:
        if len(self.saves) < CHECKPOINT_RECORDS:
            iteration = span.attributes.get(semconv.CHECKPOINT_ITERATION)
            self.saves.append(
                CheckpointSave(
                    process.label,
                    phase,
                    span.start_ns,
                    span.duration_s,
                    size_bytes,
                    int(iteration) if isinstance(iteration, int) else None,
                )
            )

    def add_metrics_record(self, record: MetricsRecord) -> None:
        """traintel's own counters (dropped measurements, spans, export failures...), kept by the
        summary as ``traintel summary`` keeps them: per process (a counter is cumulative per
        process; two processes may share a run id, restart and rank)."""
        self.summary.runs.add(record)
        self.summary.add_metrics_record(record, self.run)

    def add_log(self, entry: LogEntry) -> None:
        """A log record: the hang reports are kept (bounded) for :attr:`stalls`."""
        if len(self.hang_records) < HANG_RECORDS and (
            self.run is None or run_key(entry.resource) == self.run
        ):
            self.hang_records.append(entry)

    @property
    def read_anything(self) -> bool:
        """Whether there is a report to show: spans, or a hang record, or goodput from a progress
        mark (a job killed while hung before its file wrote a span)."""
        return bool(self.summary.spans or self.hang_records or self.goodput)

    @property
    def stalls(self) -> list[Stall]:
        stalls = find_stalls(self.hang_records)[:MAX_STALLS]
        last_seen = self.last_seen_ns or None
        for stall in stalls:
            stall.last_seen_ns = last_seen
        return stalls

    @property
    def last_seen_ns(self) -> int:
        """The latest moment the files show the run alive: a span's end, a hang record, the
        end of a goodput session (its jobs' last progress marks included); 0 for none."""
        ends = [extent.last_ns for extent in self.summary.extents.values()]
        ends += [entry.time_ns for entry in self.hang_records] + [s.end_ns for s in self.goodput]
        return max(ends, default=0)

    def merge(self, later: Report) -> None:
        """Add what ``later`` read from the files after this one's, as if read after it (exact
        but as :meth:`~traintel.analysis.ranks.CrossRankTable.merge` and :meth:`Series.merge` say)."""
        self.summary.merge(later.summary)
        merge_by_key(self.processes, later.processes)
        self.perf_tags |= later.perf_tags
        room = TIMELINE_INTERVALS - len(self.timeline)
        self.timeline.extend(later.timeline[:room])
        self.timeline_dropped += later.timeline_dropped + max(0, len(later.timeline) - room)
        self.saves.extend(later.saves[: max(0, CHECKPOINT_RECORDS - len(self.saves))])
        self.save_bytes += later.save_bytes
        self.own_stragglers += later.own_stragglers
        self.warning_details.extend(
            later.warning_details[: max(0, WARNING_DETAILS - len(self.warning_details))]
        )
        self._config(later.config_at, {semconv.CONFIG_PREFIX + k: v for k, v in later.config.items()})
        self.hang_records.extend(later.hang_records[: max(0, HANG_RECORDS - len(self.hang_records))])
        self.ranks.merge(later.ranks)
        self.process_of.clear()

    # --- views ---------------------------------------------------------------------------------
    @property
    def warnings(self) -> dict[str, int]:
        """The warning events by name, counted (the summary counts every event); stragglers
        once per window, not once per rank that recorded the job's verdict."""
        counts = {name: n for name, n in self.summary.events.items() if name in WARNING_EVENTS}
        if _STRAGGLER in counts:  # (both are lower bounds: the straggler's file may be missing,
            # and the table keeps MAX_WINDOWS windows)
            counts[_STRAGGLER] = max(self.own_stragglers, len(self.ranks.stragglers))
        return counts

    @property
    def stage_s(self) -> dict[str, float]:
        """Seconds per checkpoint stage (staging, write, ...), from the summary's phase table."""
        phases = self.summary.phases
        stages = semconv.CHECKPOINT_STAGES.items()
        return {stage: phases[phase].total_s for stage, phase in stages if phase in phases}

    def stage_rows(self) -> list[tuple[str, float]]:
        """The checkpoint tables' stage rows, by name. What ran beside training (an async save's
        finalize, its writer's time; a stage its writer thread marked) is said in its own row,
        under a table of blocking times."""
        writers = Phase.CHECKPOINT_SAVE_ASYNC.value in self.summary.phases
        beside = self.stage_beside_s
        rows: list[tuple[str, float]] = []
        for stage, seconds in sorted(self.stage_s.items()):
            if writers and stage == "finalize":
                rows.append((f"{stage} (async writers, beside training)", seconds))
                continue
            away = beside.get(stage, 0.0)
            if seconds > away or not away:
                rows.append((stage, seconds - away))
            if away:
                rows.append((f"{stage} (writer threads, beside training)", away))
        return rows

    @property
    def stage_beside_s(self) -> dict[str, float]:
        """Of :attr:`stage_s`, the seconds of stages marked off the training thread."""
        phases = self.summary.phases
        stages = semconv.CHECKPOINT_STAGES.items()
        return {s: phases[p].beside_s for s, p in stages if p in phases and phases[p].beside_s}

    def checkpoints(self) -> dict[str, Any]:
        """Every checkpoint save, synchronous or not, and load, from the summary's phase table (the
        save records kept for the chart stop at :data:`CHECKPOINT_RECORDS`; these never do):
        summed over every rank and job, which ``summed_over`` counts (the summary's checkpoint
        line is one loop's, of one rank of the latest job)."""
        phases = self.summary.phases
        saves = PhaseStats()
        for phase in semconv.CHECKPOINT_SAVE_PHASES:
            saves.merge(phases.get(phase, PhaseStats()))
        loads = phases.get(Phase.CHECKPOINT_LOAD.value, PhaseStats())
        return {
            "saves": saves.count,
            # its blocking part raised, or (an async save) its writer's finish did
            "failed_saves": saves.errors + phases.get(_FINALIZE, PhaseStats()).errors,
            "save_time_total_s": saves.total_s,
            "save_time_mean_s": saves.mean_s if saves.count else None,
            "save_time_max_s": saves.max_s if saves.count else None,
            "bytes_total": self.save_bytes,
            "stages_s": self.stage_s,
            "stages_beside_training_s": self.stage_beside_s,
            "loads": loads.count,
            "failed_loads": loads.errors,
            "summed_over": {"jobs": max(1, self.summary.jobs), "ranks": max(1, len(self.summary.ranks))},
        }

    def notices(self) -> list[tuple[str, float]]:
        """What a reader should see went wrong, counted: warning events by name, what traintel's
        own series say was lost, unreadable lines skipped."""
        losses = [
            (name, total) for name, total in self.summary.self_telemetry.items() if total and is_loss(name)
        ]
        skipped = [("unreadable lines skipped", self.stats.skipped)] if self.stats.skipped else []
        return [*sorted(self.warnings.items()), *losses, *skipped]

    def rank_labels(self) -> list[tuple[str, str]]:
        """(process key, label), ordered by rank then key."""
        ordered = sorted(self.processes.values(), key=lambda p: (p.rank, p.key))
        return [(p.key, p.label) for p in ordered]

    @property
    def start_ns(self) -> int:
        """When the run's first process started (0: no span)."""
        return min((e.first_ns for e in self.summary.extents.values() if e.first_ns), default=0)

    @property
    def duration_s(self) -> float:
        """From the first start to the last exported end, over every process."""
        end = max((e.last_ns for e in self.summary.extents.values()), default=0)
        return max(0, end - self.start_ns) / 1e9 if self.start_ns else 0.0

    def model_metric_names(self) -> list[str]:
        """Every model metric name any process recorded in a window, sorted."""
        return sorted({name for process in self.processes.values() for name in process.metrics})

    def _model_metrics(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        return {
            name: {
                label: [p.as_dict() for p in self.processes[key].metrics[name].all()]
                for key, label in self.rank_labels()
                if name in self.processes[key].metrics
            }
            for name in self.model_metric_names()
        }

    def as_dict(self) -> dict[str, Any]:
        s = self.summary
        value = s.summary_value
        windows_mean_s = s.window_iteration_s / s.window_iterations if s.window_iterations else None
        mean_s = value("iteration_time.mean")
        return {
            "run": self.run,
            "files": self.files,
            "identity": {
                "services": sorted(s.services),
                "run_ids": sorted(s.run_ids),
                "session_tags": sorted(s.session_tags),
                "perf_tags": sorted(self.perf_tags),
                "ranks": sorted(s.ranks),
                "hosts": sorted(s.hosts),
            },
            "spans": s.spans,
            "skipped_lines": self.stats.skipped,
            "skipped_reasons": self.stats.reasons,
            "phases": [row.__dict__ for row in phase_rows(s)],
            "iterations": {
                "count": s.iteration_count(),
                "first_s": value("first_iteration_time"),
                # a loop without traintel's end-of-loop summary: the windows' mean
                "mean_s": windows_mean_s if mean_s is None else mean_s,
                **{f"{stat}_s": value(f"iteration_time.{stat}") for stat in ("stddev", "p50", "p90", "p99")},
            },
            "windows_mean_s": windows_mean_s,
            "throughput": {
                "samples_per_second": value("samples_per_second"),
                "tokens_per_second": value("tokens_per_second"),
                "tflops_per_device": value("tflops_per_device"),
                "mfu": value("mfu"),
                "mfu_measured_peak": value("mfu_measured"),
                "hfu": value("hfu"),
            },
            "energy": energy_figures(value),
            "checkpoints": self.checkpoints(),
            "goodput": [g.as_dict() for g in self.goodput],
            "slowest_iterations": [slow._asdict() for slow in sorted(s.slowest, reverse=True)],
            "errors": [failure.as_dict() for failure in s.failures.values()],
            "other_errors": s.other_failures,
            "exported_iterations": s.exported_iterations,
            "warnings": self.warnings,
            "warning_details": self.warning_details,
            "self_telemetry": self.summary.self_telemetry,
            "windows": {
                label: [p.as_dict() for p in self.processes[key].timing()]
                for key, label in self.rank_labels()
            },
            "throughput_windows": {
                label: [p.as_dict() for p in self.processes[key].series.all()]
                for key, label in self.rank_labels()
            },
            "model_metrics": self._model_metrics(),
            "model_metrics_last_window": {
                name: {stat: json_number(v) for stat, v in stats.items()}
                for name, stats in s.window_metrics().items()
            },
            "model_metrics_evaluation": {
                phase: {name: json_number(v) for name, v in metrics.items()}
                for phase, metrics in s.evaluation_metrics().items()
            },
            "config": dict(sorted(self.config.items())),
            "start_unix_nano": self.start_ns,
            "duration_s": self.duration_s,
            "timeline_intervals_dropped": self.timeline_dropped,
            "cross_rank": self.ranks.as_dict(),
            "stalls": [stall.as_dict() for stall in self.stalls],
        }


def build_report(
    paths: Iterable[str | os.PathLike[str]],
    progress: Callable[[int], None] | None = None,
    with_goodput: bool = True,
    run: str | None = None,
    workers: int = 1,
) -> Report:
    """Read the files once and gather the report, goodput included: of the one run ``run``
    (a :func:`~traintel.analysis.summary.run_key`) when given, else of everything.

    Each file is read on its own into a partial report and goodput state, merged in file order
    (:meth:`Report.merge`, :meth:`~traintel.analysis.goodput.GoodputReader.merge`): with
    ``workers`` > 1 the files are read in that many processes, with the same result.
    """
    files = analysis_files(paths)
    report = Report(files=[str(f) for f in files], run=run)
    goodput = GoodputReader()
    task = functools.partial(report_file, run, with_goodput)
    for part, part_goodput in map_files(task, report.files, workers, progress):
        report.merge(part)
        if part_goodput is not None:
            goodput.merge(part_goodput)
    if with_goodput and files:
        jobs = [job for job in goodput.jobs() if run is None or job.session == run]
        report.goodput = compute_goodput(jobs)
    return report


def report_file(
    run: str | None, with_goodput: bool, path: str, progress: Callable[[int], None] | None = None
) -> tuple[Report, GoodputReader | None]:
    """One file's partial report and goodput state, from one pass (a part of :func:`build_report`;
    goodput reads every run's records, the report only ``run``'s)."""
    report = Report(run=run)
    goodput = GoodputReader() if with_goodput else None
    with gc_paused():
        records = iter_records(
            [path], report.stats, progress, windows_expanded=True, logs=True, metric_names=SELF_TELEMETRY
        )
        for record in records:
            if isinstance(record, LogEntry):
                report.add_log(record)
                continue
            if goodput is not None:
                goodput.add(record)
            if isinstance(record, SpanRecord):
                report.add_span(record)
            else:
                report.add_metrics_record(record)
    mark = read_mark(path)
    add_mark(report.summary, mark, run)
    if goodput is not None:
        goodput.add_mark(mark)
    report.summary.runs.in_file(path, mark)
    return report, goodput
