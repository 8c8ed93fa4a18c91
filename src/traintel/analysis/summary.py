"""A short human summary of a run, read back from its OTLP/JSON-lines files.

Why from the file and not from live state: the summary then shows exactly what reached the
exporter (what a collector would have received), and works for any finished run, including
one that crashed. Analysis code reads files and the vocabulary only (never the live runtime).

Per-step numbers come from the ``training_metrics_update`` window events and the training
loop's ``ml.training.summary.*`` attributes, because with tail sampling most iterations are
counted but not exported as spans. Exported iteration spans are listed for what they are: the
sampled ones (first, every M-th, slow, failed), with their trace and span ids.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import itertools
import math
import os
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from traintel import semconv
from traintel.analysis.links import TraceLinks
from traintel.analysis.parallel import map_files, merge_by_key
from traintel.analysis.resources import PerResource
from traintel.analysis.run_info import RunsSeen, launches, run_key, utc_text
from traintel.exporters.progress_mark import process_key, read_mark
from traintel.exporters.reader import (
    MetricSeries,
    MetricsRecord,
    ReadStats,
    SpanRecord,
    analysis_files,
    gc_paused,
    iter_records,
)
from traintel.semconv import Phase

_PHASE_ORDER = {phase.value: i for i, phase in enumerate(Phase)}
_W = semconv.WINDOW_PREFIX
_S = semconv.SUMMARY_PREFIX
#: Where a loop summary keeps its job (run id, world size), and the rates summed over ranks.
_JOB = "job"
_JOB_RATES = ("samples_per_second", "tokens_per_second")
_STEP_PHASES = (
    ("data_loading", Phase.DATA_LOADING.value),
    ("forward", Phase.MODEL_FORWARD.value),
    ("backward", Phase.MODEL_BACKWARD.value),
    ("optimizer", Phase.OPTIMIZER_UPDATE.value),
)
_PER_STEP = {p.value for p in semconv.ITERATION_PHASES} | {p.value for p in semconv.STEP_PHASES}
_EVALUATION_LOOPS = {Phase.VALIDATION_LOOP.value, Phase.TESTING_LOOP.value}
#: An evaluation loop's iteration phase (its iterations are counted in the loop's own update).
_ITERATION_OF_LOOP = {loop.value: iteration.value for iteration, loop in semconv.LOOP_OF_ITERATION.items()}
_E = semconv.EVAL_PREFIX
_EVAL_METRIC = _E + "metric."
_LOOP_METRIC = semconv.METRIC_PREFIX

#: The row of a step phase run on another thread than the one that trains (a prefetcher's).
BESIDE_TRAINING = " (beside training)"
#: Phases without a share of the wall time: the whole of it, and time spent beside training
#: (an async save's background write runs while the loop goes on).
_NO_SHARE = {Phase.APPLICATION.value, Phase.CHECKPOINT_FINALIZE.value}
#: The width every line keeps to where it can (an 80-column terminal); ids get lines of their own.
_COLUMNS_WIDE = 80
#: Decimals of the smallest fraction ``plain_number`` spells out (``0.000…01``); below it, 0.
_MAX_DECIMALS = 24

#: The names of traintel's own series: the only metric values the analysis reads.
SELF_TELEMETRY = "traintel."
#: Self-telemetry series that mean something was lost, refused or failed.
_LOSS_WORDS = ("dropped", "failures", "split")


def is_loss(name: str) -> bool:
    """Whether a ``traintel.*`` series' total counts something lost, refused or failed (its
    ``name{label}`` parts are not counted again)."""
    return "{" not in name and any(word in name for word in _LOSS_WORDS)


def _precedence(resource: Mapping[str, Any], time_ns: int) -> tuple[int, int, int]:
    """Which of several records of one run speaks for it: the latest restart, its lowest rank
    (every rank carries the job's numbers), then the latest in time. File order must not
    decide: it is alphabetical, not chronological."""
    return (_count(resource, semconv.RESTART_COUNT), -_count(resource, semconv.RANK), time_ns)


class SlowIteration(NamedTuple):
    """An exported iteration among the slowest, ordered by its time."""

    seconds: float
    trace_id: str
    span_id: str
    iteration: int
    rank: int  # 0 where the resource names none
    run_id: str
    restart: int

    def where(self, summary: RunSummary) -> str:
        """``"iteration 12"``, ``" on rank 3"`` where the run has several ranks, and the job's
        run id and restart count where it has several jobs (iteration numbers repeat after a
        resume)."""
        rank = f" on rank {self.rank}" if len(summary.ranks) > 1 else ""
        job = f" of job {self.run_id}, restart {self.restart}" if summary.jobs > 1 else ""
        return f"iteration {self.iteration}{rank}{job}"


#: How many distinct errors a summary keeps (the rest are counted).
MAX_FAILURES = 5


@dataclass
class Failure:
    """An error spans ended with: the first span that carried it (the innermost: a span ends
    before the spans around it, which carry the same error) and how many spans did."""

    message: str
    span: str
    iteration: int | None
    rank: int
    end_ns: int
    trace_id: str
    span_id: str
    spans: int = 1

    def where(self, summary: RunSummary) -> str:
        """``"training_iteration 33"`` (a checkpoint's: ``"checkpoint_finalize of iteration 60"``),
        with ``" on rank 3"`` where the run has several ranks."""
        at = " of iteration" if self.span.startswith("checkpoint") else ""
        number = f"{at} {self.iteration}" if self.iteration is not None else ""
        return self.span + number + (f" on rank {self.rank}" if len(summary.ranks) > 1 else "")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _count(resource: Mapping[str, Any], key: str) -> int:
    """A restart count or rank of a resource, 0 where it has none."""
    value = resource.get(key, 0)
    return value if isinstance(value, int) else 0


def plain_number(value: Any, significant: int = 4) -> str:
    """A number as people write it: ``21,323``, ``6,342``, ``0.2583``, ``0.00003``.

    Never scientific notation (``2.132e+04`` reads as noise in a table or a CI log): grouped
    integers at ``10 ** (significant - 1)`` and above, else fixed decimals keeping about
    ``significant`` digits, trailing zeros dropped. Non-finite values say so (``nan``): a
    diverged loss must show, not read as missing.
    """
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 10 ** (significant - 1):
        return f"{value:,.0f}"
    return _fraction(value, significant)


def _fraction(value: float, significant: int) -> str:
    """Fixed decimals enough for ``significant`` digits, trailing zeros dropped."""
    if value == 0:
        return "0"
    decimals = min(_MAX_DECIMALS, significant - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:,.{decimals}f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def fmt_seconds(seconds: float | None) -> str:
    """A duration in the unit that keeps it short: µs, ms, s, min, h (fixed decimals)."""
    if seconds is None or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return "-"
    magnitude = abs(seconds)
    if magnitude < 1e-3:  # (a zero is no measurement of microseconds)
        return f"{seconds * 1e6:.1f} µs" if magnitude else "0 s"
    if magnitude < 1:
        return f"{seconds * 1e3:.2f} ms"
    if magnitude < 120:
        return f"{seconds:.2f} s"
    if magnitude < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:,.1f} h"


@dataclass
class PhaseStats:
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    errors: int = 0
    #: Of ``total_s``, the spans' run off the training thread (an async writer's stages): time
    #: beside training, without a share of the wall time.
    beside_s: float = 0.0
    #: A phase of the user's own seen inside iterations (its spans carry the iteration's
    #: number): exported with its iteration only, so counted in the exported iterations alone.
    in_iterations: bool = False

    def add(self, seconds: float, error: bool, count: int = 1) -> None:
        self.count += count
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds if count == 1 else self.max_s)
        self.errors += int(error)

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else 0.0

    @property
    def shared_s(self) -> float | None:
        """Its time on the training thread, which has a share of the wall time; none where all
        of it ran beside training."""
        blocking = self.total_s - self.beside_s
        return blocking if blocking > 0 or not self.beside_s else None

    def merge(self, later: PhaseStats) -> None:
        self.count += later.count
        self.total_s += later.total_s
        self.max_s = max(self.max_s, later.max_s)
        self.errors += later.errors
        self.beside_s += later.beside_s
        self.in_iterations |= later.in_iterations


@dataclass
class Extent:
    """One process's exported application time and the span of time its records cover."""

    process: str
    application_s: float = 0.0
    first_ns: int = 0
    last_ns: int = 0
    application_end_ns: int = 0  # where its last exported application (or segment of one) ends

    def see(self, start_ns: int, end_ns: int) -> None:
        if start_ns and (not self.first_ns or start_ns < self.first_ns):
            self.first_ns = start_ns
        self.last_ns = max(self.last_ns, end_ns)

    @property
    def open_s(self) -> float:
        """The time its records go on past its last exported application's end (a run still
        going, or killed): all of it where none ended. Not the time between two applications
        (a notebook cell run twice), nor before the first."""
        since = max(self.application_end_ns, self.first_ns)
        return max(0, self.last_ns - since) / 1e9 if self.first_ns else 0.0

    def merge(self, later: Extent) -> None:
        self.application_s += later.application_s
        self.application_end_ns = max(self.application_end_ns, later.application_end_ns)
        self.see(later.first_ns, later.last_ns)


@dataclass
class RunSummary:
    """What ``traintel summary`` prints; also returned for programmatic use and tests."""

    services: set[str] = field(default_factory=set)
    run_ids: set[str] = field(default_factory=set)
    #: The processes that wrote the records: (run id, restart count, rank, process). Restarts by
    #: torchrun or a Slurm requeue share the run id, so the run ids alone do not tell one job from
    #: several; a job launched again under the same id and count has a rank written twice.
    processes: set[tuple[str, int, int, str]] = field(default_factory=set)
    session_tags: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    #: The runs summarised (their :func:`run_key`): those of :attr:`runs` the figures are of.
    run_keys: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    application_s: float = 0.0
    spans: int = 0
    windows: int = 0
    window_iterations: int = 0
    window_iteration_s: float = 0.0
    window_iteration_max_s: float = 0.0
    #: Iterations after the window records, in the files' progress marks (a job killed
    #: mid-window, or still running), and the last iteration they reach.
    marked_iterations: int = 0
    marked_last_iteration: int | None = None
    step_phase_s: dict[str, float] = field(default_factory=dict)
    #: Failed iterations and steps, per phase: counted from their exported spans, since the
    #: window events count iterations but not failures (a failed iteration is always exported,
    #: unless ``TRAINTEL_EXPORT_ITERATIONS=none`` exports none).
    per_step_errors: Counter[str] = field(default_factory=Counter)
    #: Training loop spans another tracer than traintel's made (they carry no loop summary).
    foreign_loops: int = 0
    #: The errors spans ended with, by message, earliest first (the ``MAX_FAILURES`` earliest:
    #: in a job of many ranks the first error is the cause, the others' "peer closed" follow
    #: it), and how many spans ended with another one.
    failures: dict[str, Failure] = field(default_factory=dict)
    other_failures: int = 0
    #: The loops' ``ml.training.summary.*`` attributes, ordered by precedence (the last speaks).
    loop_summaries: list[tuple[tuple[int, int, int], dict[str, Any]]] = field(default_factory=list)
    last_window: dict[str, Any] = field(default_factory=dict)
    #: The precedence of ``last_window`` (latest restart, lowest rank, latest time).
    last_window_at: tuple[int, int, int] | None = None
    #: Per evaluation phase (validation_loop, testing_loop): the precedence and the model
    #: metrics (``name -> last value``) of its latest loop that recorded any.
    last_evaluation: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = field(default_factory=dict)
    #: Validation and testing iterations, every one, from their loops' own counts (as the
    #: training iterations from the window records): by iteration phase.
    eval_iterations: dict[str, PhaseStats] = field(default_factory=dict)
    #: The precedence and the ``ml.training.checkpoint.*`` totals of the latest
    #: ``checkpoint_metrics_update`` event: the job's saves so far, a save after its loop ended
    #: (the final checkpoint) included, which the loop's summary cannot hold.
    last_checkpoints: tuple[tuple[int, int, int], dict[str, Any]] | None = None
    exported_iterations: Counter[str] = field(default_factory=Counter)
    slowest: list[SlowIteration] = field(default_factory=list)
    events: Counter[str] = field(default_factory=Counter)
    stats: ReadStats = field(default_factory=ReadStats)
    #: ``traintel.*`` self-telemetry: the last value of each series, per process.
    self_telemetry_latest: dict[tuple[str, str], MetricSeries] = field(default_factory=dict)
    #: How many of the slowest exported iterations are kept (a bounded heap).
    keep_slowest: int = 5
    #: Every run the read met, the one summarised or not (see ``run_info``).
    runs: RunsSeen = field(default_factory=RunsSeen, repr=False, compare=False)
    #: Per process and phase cut into segments (a long run's application and loop): the whole
    #: duration so far, so that a segment is counted as part of one span, not as another.
    segmented: dict[tuple[str, str], float] = field(default_factory=dict)
    #: Per process: its exported application time and the times of its first and last records,
    #: the time its shares are of (a run still going has not exported its last segment yet).
    extents: dict[str, Extent] = field(default_factory=dict)
    _extent_of: PerResource[Extent] | None = field(default=None, repr=False, compare=False)

    def _identity(self, resource: dict[str, Any]) -> None:
        for key, target in (
            (semconv.SERVICE_NAME, self.services),
            (semconv.RUN_ID, self.run_ids),
            (semconv.SESSION_TAG, self.session_tags),
            (semconv.HOST_NAME, self.hosts),
        ):
            if key in resource:
                target.add(str(resource[key]))
        if semconv.RANK in resource:
            self.ranks.add(int(resource[semconv.RANK]))
        if semconv.RUN_ID in resource:
            restart, rank = _count(resource, semconv.RESTART_COUNT), _count(resource, semconv.RANK)
            self.processes.add((str(resource[semconv.RUN_ID]), restart, rank, process_key(resource)))

    def add(self, span: SpanRecord) -> None:
        self.spans += 1
        resource = span.resource
        if self._extent_of is None:
            self._extent_of = PerResource(self._new_resource)
        extent = self._extent_of(resource)
        extent.see(span.start_ns, span.end_ns)
        if span.is_error:
            self._failed(span)
        if span.events:
            self._events(span)
        phase = span.attributes.get(semconv.PHASE)
        if phase is None:
            return
        phase = str(phase)
        seconds = span.duration_s
        if phase == Phase.TRAINING_ITERATION:
            self._exported_iteration(span, seconds)
        if phase in _PER_STEP:  # counted from the window events, not from the sampled spans
            phase = self._per_step(phase, span)
            if phase is None:
                return
        self._phase(extent, phase, seconds, span)
        self._outer(extent, phase, seconds, span)

    def _events(self, span: SpanRecord) -> None:
        """A span's events: counted by name; window records and checkpoint totals read."""
        resource = span.resource
        for event in span.events:
            self.events[event.name] += 1
            if event.name == semconv.Event.TRAINING_METRICS_UPDATE:
                self._window(event.attributes, _precedence(resource, event.time_ns))
            elif event.name == semconv.Event.CHECKPOINT_METRICS_UPDATE:
                self._checkpoints((_precedence(resource, event.time_ns), event.attributes))

    def _per_step(self, phase: str, span: SpanRecord) -> str | None:
        """A step phase's span: its error counted (its time is the windows'); but on a thread
        beside training (a prefetcher's loading), every span, on a row of its own."""
        if semconv.THREAD_NAME in span.attributes:
            return phase + BESIDE_TRAINING
        self.per_step_errors[phase] += span.is_error
        return None

    def _failed(self, span: SpanRecord) -> None:
        iteration = span.attributes.get(semconv.ITERATION, span.attributes.get(semconv.CHECKPOINT_ITERATION))
        message = span.status_message.removesuffix(": ")  # (an exception without a message: "Name: ")
        failure = Failure(
            message or "ERROR", span.name, iteration if isinstance(iteration, int) else None,
            _count(span.resource, semconv.RANK), span.end_ns, span.trace_id, span.span_id,
        )  # fmt: skip
        self._add_failures([failure])

    def _add_failures(self, failures: Iterable[Failure]) -> None:
        kept = self.failures
        for failure in failures:
            seen = kept.get(failure.message)
            first = failure if seen is None or failure.end_ns < seen.end_ns else seen
            kept[failure.message] = dataclasses.replace(
                first, spans=failure.spans + (seen.spans if seen else 0)
            )
        ordered = sorted(kept.values(), key=lambda f: f.end_ns)  # (stable: file order among equals)
        self.failures = {f.message: f for f in ordered[:MAX_FAILURES]}
        self.other_failures += sum(f.spans for f in ordered[MAX_FAILURES:])

    def _exported_iteration(self, span: SpanRecord, seconds: float) -> None:
        """An exported (sampled) iteration: counted by sampling reason, kept if among the slowest
        (unless it raised: not a completed iteration, its time is in no iteration statistic; the
        errors name it)."""
        reason = str(span.attributes.get(semconv.SAMPLING_REASON, "foreign"))
        self.exported_iterations[reason] += 1
        if span.is_error:
            return
        iteration = int(span.attributes.get(semconv.ITERATION, -1))
        resource = span.resource
        run_id, restart = str(resource.get(semconv.RUN_ID, "")), _count(resource, semconv.RESTART_COUNT)
        slow = SlowIteration(
            seconds, span.trace_id, span.span_id, iteration, _count(resource, semconv.RANK), run_id, restart
        )
        self._keep_slowest([slow])

    def _keep_slowest(self, items: Iterable[SlowIteration]) -> None:
        for item in items:
            if len(self.slowest) < self.keep_slowest:
                heapq.heappush(self.slowest, item)
            else:
                heapq.heappushpop(self.slowest, item)

    def _outer(self, extent: Extent, phase: str, seconds: float, span: SpanRecord) -> None:
        """The application's time; a training loop's summary; an evaluation loop's metrics."""
        resource = span.resource
        if phase == Phase.APPLICATION:
            self.application_s += seconds
            extent.application_s += seconds
            extent.application_end_ns = max(extent.application_end_ns, span.end_ns)
            self._loop_metrics(phase, span.attributes, _precedence(resource, span.end_ns))
        elif phase == Phase.TRAINING_LOOP and span.scope != semconv.INSTRUMENTATION_SCOPE:
            self.foreign_loops += 1
        elif phase == Phase.TRAINING_LOOP:
            at = _precedence(resource, span.end_ns)
            self._loop_metrics(phase, span.attributes, at)  # (on the segment that had them)
            if _S + "iterations" in span.attributes:
                loop = {k: v for k, v in span.attributes.items() if k.startswith(_S)}
                loop[_JOB] = (resource.get(semconv.RUN_ID), resource.get(semconv.WORLD_SIZE))
                bisect.insort(self.loop_summaries, (at, loop), key=lambda item: item[0])
        elif phase in _EVALUATION_LOOPS:
            self._evaluation(phase, span.attributes, _precedence(resource, span.end_ns))

    def _new_resource(self, resource: dict[str, Any]) -> Extent:
        """A resource met for the first time: its identity noted, its process's extent."""
        self._identity(resource)
        self.run_keys.add(run_key(resource))
        process = process_key(resource)
        return self.extents.setdefault(process, Extent(process))

    def _phase(self, extent: Extent, phase: str, seconds: float, span: SpanRecord) -> None:
        """A phase span; a segment of a phase cut into segments counts as part of its span: the
        first one counts the span, the later ones add their time, its max is the whole."""
        stats = self.phases.setdefault(phase, PhaseStats())
        if phase not in _PHASE_ORDER and semconv.ITERATION in span.attributes:
            stats.in_iterations = True
        if semconv.THREAD_NAME in span.attributes:
            stats.beside_s += seconds
        index = span.attributes.get(semconv.SEGMENT_INDEX)
        if not isinstance(index, int) or isinstance(index, bool):
            stats.add(seconds, span.is_error)
            return
        key = (extent.process, phase)
        whole = self.segmented[key] = self.segmented.get(key, 0.0) + seconds
        stats.add(seconds, span.is_error, count=int(index == 0))
        stats.max_s = max(stats.max_s, whole)

    @property
    def wall_s(self) -> float:
        """The time the phase shares are of: per process its application time, and where the
        files end after its last application does (a run still going, or killed before its
        application, or a segment of it, ended), the time its records go on; summed over the
        processes, whose phases all count. A process without any application (loops run
        without ``application()``): the time from its first record to its last."""
        return sum(e.application_s + e.open_s for e in self.extents.values())

    @property
    def open_at_end(self) -> bool:
        """Whether some process's last records lie past its exported application time (in a run
        that uses the application phase: a process of it without one was killed before its end)."""
        extents = self.extents.values()
        return any(e.application_s > 0 for e in extents) and any(e.open_s > 0 for e in extents)

    def _evaluation(self, phase: str, attributes: dict[str, Any], at: tuple[int, int, int]) -> None:
        self._eval_iterations(phase, attributes)
        self._loop_metrics(
            phase,
            {key[: -len(".last")]: value for key, value in attributes.items() if key.endswith(".last")},
            at,
            _EVAL_METRIC,
        )

    def _loop_metrics(
        self, phase: str, attributes: dict[str, Any], at: tuple[int, int, int], prefix: str = _LOOP_METRIC
    ) -> None:
        """A loop's model metrics as it ended (``prefix`` + name): an evaluation loop's last
        values, what a training loop was given between its iterations (a per-epoch accuracy)
        or an application outside every loop (a final test accuracy); for each phase, the
        loop that ended last."""
        metrics = {key[len(prefix) :]: value for key, value in attributes.items() if key.startswith(prefix)}
        if metrics and (phase not in self.last_evaluation or self.last_evaluation[phase][0] <= at):
            self.last_evaluation[phase] = (at, metrics)

    def _eval_iterations(self, phase: str, attributes: dict[str, Any]) -> None:
        """An evaluation loop's iterations, every one, as its record counts them."""
        count, mean = attributes.get(_E + "iterations"), attributes.get(_E + "iteration_time.mean")
        if isinstance(count, int) and count > 0 and isinstance(mean, int | float):
            stats = self.eval_iterations.setdefault(_ITERATION_OF_LOOP[phase], PhaseStats())
            stats.add(count * mean, False, count)
            stats.max_s = max(stats.max_s, float(attributes.get(_E + "iteration_time.max", mean)))

    def _checkpoints(self, entry: tuple[tuple[int, int, int], dict[str, Any]]) -> None:
        if self.last_checkpoints is None or self.last_checkpoints[0] <= entry[0]:
            self.last_checkpoints = entry

    def checkpoint_value(self, key: str) -> Any:
        """A checkpoint total (``saves``, ``save_time.total``, ``bytes.total`` ...) of the latest
        job (lowest rank that saved): its latest save's, else its loop summary's."""
        if self.last_checkpoints is not None:
            return self.last_checkpoints[1].get(semconv.CHECKPOINT_PREFIX + key)
        return self.summary_value("checkpoint." + key)

    def checkpoint_rank(self) -> int | None:
        """The rank whose totals :meth:`checkpoint_value` gives."""
        if self.last_checkpoints is not None:
            return -self.last_checkpoints[0][1]
        return self.summary_rank("checkpoint.saves")

    def _window(self, attributes: dict[str, Any], at: tuple[int, int, int]) -> None:
        n = int(attributes.get(_W + "iterations", 0))
        if not n:
            return
        self.windows += 1
        self.window_iterations += n
        self.window_iteration_s += float(attributes.get(_W + "iteration_time.mean", 0.0)) * n
        self.window_iteration_max_s = max(
            self.window_iteration_max_s, float(attributes.get(_W + "iteration_time.max", 0.0))
        )
        for short, _phase in _STEP_PHASES:
            value = attributes.get(_W + "time." + short)
            if value is not None:
                self.step_phase_s[short] = self.step_phase_s.get(short, 0.0) + float(value)
        if self.last_window_at is None or self.last_window_at <= at:
            self.last_window, self.last_window_at = attributes, at

    def add_metrics_record(self, record: MetricsRecord, run: str | None = None) -> None:
        """traintel's own series (every ``traintel.*`` sum or gauge, each attribute set apart:
        ``name{key=value}``) of one resource's metrics record: a series is cumulative per
        process, so its last value counts."""
        if run is not None and run_key(record.resource) != run:
            return
        process = process_key(record.resource)
        for series in record.metrics:
            if series.kind in ("sum", "gauge") and series.name.startswith(SELF_TELEMETRY):
                self.self_telemetry_latest[(process, series.name)] = series

    def merge(self, later: RunSummary) -> None:
        """Add what ``later`` read from the files after this one's, as if read after it: counts
        and sets add up, the ordered and the "latest" choices follow the same rules as
        :meth:`add` (sums of seconds are added per file, then across files)."""
        self.services |= later.services
        self.run_ids |= later.run_ids
        self.processes |= later.processes
        self.session_tags |= later.session_tags
        self.hosts |= later.hosts
        self.ranks |= later.ranks
        self.run_keys |= later.run_keys
        self.runs.merge(later.runs)
        self._merge_choices(later)
        merge_by_key(self.phases, later.phases)
        merge_by_key(self.extents, later.extents)
        self._extent_of = None
        for key, seconds in later.segmented.items():
            self.segmented[key] = self.segmented.get(key, 0.0) + seconds
            phase = self.phases.get(key[1])
            if phase is not None:
                phase.max_s = max(phase.max_s, self.segmented[key])
        self.application_s += later.application_s
        self.spans += later.spans
        self.windows += later.windows
        self.window_iterations += later.window_iterations
        self.marked_iterations += later.marked_iterations
        if later.marked_last_iteration is not None:
            self.marked_last_iteration = max(self.marked_last_iteration or 0, later.marked_last_iteration)
        self.window_iteration_s += later.window_iteration_s
        self.window_iteration_max_s = max(self.window_iteration_max_s, later.window_iteration_max_s)
        for short, seconds in later.step_phase_s.items():
            self.step_phase_s[short] = self.step_phase_s.get(short, 0.0) + seconds
        self.exported_iterations.update(later.exported_iterations)
        self.per_step_errors.update(later.per_step_errors)
        self.foreign_loops += later.foreign_loops
        self._add_failures(later.failures.values())
        self.other_failures += later.other_failures
        self._keep_slowest(later.slowest)
        self.events.update(later.events)
        self.stats.merge(later.stats)
        self.self_telemetry_latest.update(later.self_telemetry_latest)

    def _merge_choices(self, later: RunSummary) -> None:
        """The ordered loop summaries and the "latest record speaks" choices of a merge."""
        for item in later.loop_summaries:  # stable: equal precedence keeps file order
            bisect.insort(self.loop_summaries, item, key=lambda entry: entry[0])
        if later.last_window_at is not None and (
            self.last_window_at is None or self.last_window_at <= later.last_window_at
        ):
            self.last_window, self.last_window_at = later.last_window, later.last_window_at
        if later.last_checkpoints is not None:
            self._checkpoints(later.last_checkpoints)
        for phase, (at, metrics) in later.last_evaluation.items():
            if phase not in self.last_evaluation or self.last_evaluation[phase][0] <= at:
                self.last_evaluation[phase] = (at, metrics)
        merge_by_key(self.eval_iterations, later.eval_iterations)

    @property
    def jobs(self) -> int:
        """How many jobs (launches) the records come from (:func:`launches`). With several, the
        loop's figures are the latest job's."""
        return launches(self.processes)

    @property
    def self_telemetry(self) -> dict[str, float]:
        """Each ``traintel.*`` series' last value, summed over processes: its total under its
        name, and each attribute set's under ``name{key=value,...}`` when its points have any."""
        totals: dict[str, float] = {}
        for series in self.self_telemetry_latest.values():
            for name, value in series.labelled():
                totals[name] = totals.get(name, 0.0) + value
        return dict(sorted(totals.items()))

    def _speaking_loop(self, key: str) -> tuple[tuple[int, int, int], dict[str, Any]] | None:
        """The last training loop summary (by precedence) that has ``key``."""
        for at, loop in reversed(self.loop_summaries):
            if _S + key in loop:
                return at, loop
        return None

    def iteration_count(self) -> int:
        """Training iterations run: the loop's own count where it ended, else as the run index
        counts them (per launch the most any rank ran, its progress mark included, summed over
        launches). Not the window records' sum, which adds up the ranks (2 ranks of 6: 12)."""
        counted = self.summary_value("iterations")
        if counted is not None:
            return int(counted)
        return sum(self.runs.runs[key].iterations for key in self.run_keys if key in self.runs.runs)

    def summary_value(self, key: str) -> Any:
        """A ``ml.training.summary.<key>`` value of the last training loop that has it; the job's
        samples or tokens per second summed over its ranks' own where every rank's loop was read
        (a loop gives its rank's rate times the world size: balanced ranks assumed)."""
        entry = self._speaking_loop(key)
        if entry is None:
            return None
        return (self._ranks_rate(key, *entry) if key in _JOB_RATES else None) or entry[1][_S + key]

    def _ranks_rate(self, key: str, at: tuple[int, int, int], loop: dict[str, Any]) -> float | None:
        """The sum of each rank's own rate (its latest loop's job figure over the world size) in
        the job of ``loop``, when every rank of it was read; None otherwise."""
        job, world = loop[_JOB], loop[_JOB][1]
        own: dict[int, float] = {}
        for (restart, rank, _time), other in self.loop_summaries:  # by precedence: the latest wins
            rate = other.get(_S + key)
            if restart == at[0] and other[_JOB] == job and rate is not None:
                own[-rank] = rate
        if not isinstance(world, int) or world < 2 or sorted(own) != list(range(world)):
            return None
        return sum(own.values()) / world

    def summary_rank(self, key: str) -> int | None:
        """The rank whose loop gives :meth:`summary_value` for ``key``."""
        entry = self._speaking_loop(key)
        return -entry[0][1] if entry is not None else None  # precedence holds the rank negated

    def window_metrics(self) -> dict[str, dict[str, Any]]:
        """The model metrics of the run's last window: ``name -> {"last": v, "mean": v}``."""
        metrics: dict[str, dict[str, Any]] = {}
        for key, value in self.last_window.items():
            if key.startswith(_W + "metric."):
                name, _, statistic = key[len(_W + "metric.") :].rpartition(".")
                metrics.setdefault(name, {})[statistic] = value
        return dict(sorted(metrics.items()))

    def evaluation_metrics(self) -> dict[str, dict[str, Any]]:
        """The model metrics of the last loop of each phase (evaluation loops; a training loop's
        given between its iterations), and the application's given outside every loop:
        ``phase -> {name: last}``."""
        return {
            phase: dict(sorted(self.last_evaluation[phase][1].items()))
            for phase in sorted(self.last_evaluation, key=lambda p: _PHASE_ORDER.get(p, 99))
        }


def summarize(
    paths: Iterable[str | os.PathLike[str]],
    run: str | None = None,
    workers: int = 1,
    progress: Callable[[int], None] | None = None,
) -> RunSummary:
    """The run's numbers from exported OTLP/JSON-lines files or folders of them: phases,
    iterations, throughput, MFU, checkpoints, self-telemetry (what ``traintel summary`` prints).

    ``run`` (a :func:`run_key`) keeps one run of files that hold several: added together, two
    runs' phase times would sum while their iteration lines showed one of them.

    Each file is summarised on its own, then the summaries are merged in file order
    (:meth:`RunSummary.merge`): with ``workers`` > 1 the files are read in that many processes,
    with the same result. ``progress`` is told the bytes read.
    """
    files = [str(path) for path in analysis_files(paths)]
    summary = RunSummary()
    for part in map_files(functools.partial(summarize_file, run), files, workers, progress):
        summary.merge(part)
    return summary


def summarize_file(run: str | None, path: str, progress: Callable[[int], None] | None = None) -> RunSummary:
    """One file's :class:`RunSummary` (a part of :func:`summarize`)."""
    summary = RunSummary()
    resource: dict[str, Any] | None = None
    kept = True
    runs = summary.runs
    with gc_paused():
        for record in iter_records(
            [path], summary.stats, progress, windows_expanded=True, metric_names=SELF_TELEMETRY
        ):
            runs.add(record)
            if isinstance(record, SpanRecord):
                if record.resource is not resource:  # the spans of a request share their resource
                    resource = record.resource
                    kept = run is None or run_key(resource) == run
                if kept:
                    summary.add(record)
            else:
                summary.add_metrics_record(record, run)
    mark = read_mark(path)
    add_mark(summary, mark if kept else None, run)
    runs.in_file(path, mark)
    return summary


def add_mark(summary: RunSummary, mark: dict[str, Any] | None, run: str | None) -> None:
    """A file's progress mark (its process's account to its last iteration), less the
    iterations its window records hold; of a file without spans (a job killed in its first
    minute, before its file wrote any), also the process it names: a summary of the run
    ``run`` (None: any) rather than of nothing."""
    resource = mark.get("resource") if mark is not None else None
    if not summary.spans and isinstance(resource, dict) and run in (None, run_key(resource)):
        summary._identity(resource)
        summary.run_keys.add(run_key(resource))
    progress = mark.get("progress") if mark is not None else None
    if not isinstance(progress, dict):
        return
    beyond = int(progress.get("iterations", 0)) - summary.window_iterations
    if beyond > 0:
        summary.marked_iterations += beyond
        summary.marked_last_iteration = int(progress.get("last_iteration", 0))


#: The phase table's columns after the name: count, total, mean, max, share, errors.
_COLUMNS = (("count", 8), ("total", 11), ("mean", 11), ("max", 11), ("share", 8), ("errors", 8))
#: The name column's least width: with it the table is 79 columns wide.
_NAME_WIDTH = 22


@dataclass(frozen=True)
class PhaseRow:
    """One line of the wall-time-by-phase table; ``share`` is of the application's time."""

    phase: str
    count: int
    total_s: float
    mean_s: float
    max_s: float | None
    share: float | None
    errors: int
    #: Counted in the exported iterations only (a phase of the user's own inside iterations,
    #: of a run that did not export every iteration): see :func:`sampled_note`.
    sampled: bool = False

    @property
    def shown(self) -> str:
        """The phase as the tables name it: marked ``*`` where :func:`sampled_note` applies."""
        return self.phase + "*" if self.sampled else self.phase


def phase_rows(summary: RunSummary) -> list[PhaseRow]:
    """Wall time by phase, in span-tree order. Per-step phases come from the window events
    (every iteration counted), and evaluation iterations from their loops' counts, not from
    the tail-sampled iteration spans; their errors from
    the exported spans (every failed one is, but with ``TRAINTEL_EXPORT_ITERATIONS=none``).
    Shares are of :attr:`RunSummary.wall_s`, and of the time on the training thread (a phase
    run beside training only, such as an async writer's, has none)."""
    total = summary.wall_s

    def share(seconds: float | None) -> float | None:
        return seconds / total if seconds is not None and total > 0 else None

    rows: list[PhaseRow] = []
    sampled = sum(summary.exported_iterations.values()) < summary.window_iterations
    for name, stats in summary.phases.items():
        shown = share(stats.shared_s) if name not in _NO_SHARE else None
        counts = (stats.count, stats.total_s, stats.mean_s, stats.max_s, shown, stats.errors)
        rows.append(PhaseRow(name, *counts, sampled=sampled and stats.in_iterations))
    n, errors = summary.window_iterations, summary.per_step_errors
    if n:
        seconds = summary.window_iteration_s
        rows.append(
            PhaseRow(
                Phase.TRAINING_ITERATION.value,
                n,
                seconds,
                seconds / n,
                # an exported iteration the windows lost (a killed job's last ones) may be slower
                max([summary.window_iteration_max_s, *(slow.seconds for slow in summary.slowest)]),
                share(seconds),
                errors[Phase.TRAINING_ITERATION.value],
            )
        )
        for short, phase in _STEP_PHASES:
            seconds = summary.step_phase_s.get(short, 0.0)
            if seconds:
                rows.append(PhaseRow(phase, n, seconds, seconds / n, None, share(seconds), errors[phase]))
    for phase, stats in summary.eval_iterations.items():
        counts = (stats.count, stats.total_s, stats.mean_s, stats.max_s, share(stats.total_s), errors[phase])
        rows.append(PhaseRow(phase, *counts))
    return sorted(rows, key=lambda r: _PHASE_ORDER.get(r.phase, 99))


def render(summary: RunSummary, links: TraceLinks | None = None) -> str:
    """The summary as plain text for a terminal; trace ids with their links where
    ``TRAINTEL_TRACE_URL`` sets them."""
    prose = (
        _run_lines(summary),
        _iteration_lines(summary),
        _rate_lines(summary),
        _model_metric_lines(summary),
        _failure_lines(summary, links),
        _export_lines(summary, links),
        _telemetry_lines(summary),
    )
    run, *rest = [[wrapped for line in lines for wrapped in _fit(line)] for lines in prose]
    phases = _phase_lines(summary) if summary.spans else ["", *_fit(_why_no_spans(summary))]
    body = list(itertools.chain.from_iterable(rest))
    if body and body[0]:  # a run without training iterations: its rates follow the table apart
        body.insert(0, "")
    return "\n".join([*run, *phases, *body])


def _why_no_spans(summary: RunSummary) -> str:
    """Said of a run with no span in its files: lost on the way (its metrics count them), kept
    elsewhere (its metrics count iterations: a sampler or another exporter took its spans), or
    not written yet (a run known from its progress mark alone)."""
    telemetry = summary.self_telemetry
    lost = telemetry.get(semconv.METRIC_SPANS_DROPPED)
    if lost:
        why = _spans_lost(lost)
    elif telemetry.get(semconv.METRIC_ITERATIONS_EXPORTED):
        return _spans_elsewhere(telemetry[semconv.METRIC_ITERATIONS_EXPORTED])
    else:
        why = _NO_SPANS_YET
    return why + (_MARKED_BELOW if summary.marked_iterations else _MARKED_NO_ITERATION)


def _spans_elsewhere(iterations: float) -> str:
    return (
        f"No spans in its file, though its metrics count {iterations:,.0f} iterations: the job's "
        "trace was dropped by its sampler (OTEL_TRACES_SAMPLER), or its spans went to another "
        "exporter (OTEL_TRACES_EXPORTER) or tracer provider of the job's own. The file holds its "
        "metrics only."
    )


#: Said of a run known from its progress mark alone.
_NO_SPANS_YET = (
    "No spans yet: the job stopped, or is still running, before its file wrote any (it gathers "
    "them for up to a minute). "
)


def _spans_lost(count: float) -> str:
    """Said of a run whose metric lines count spans lost before the file had any (a full disk,
    say): not a job that stopped early."""
    return (
        f"No spans in its file: {count:,.0f} were lost before they were written (the file could "
        "not be written, or the export queue overflowed: the job said why on its stderr). "
    )


_MARKED_BELOW = (
    "What it ran is in its progress mark, below; where it hung, if it did, in its hang records: "
    "traintel report."
)
_MARKED_NO_ITERATION = (
    "Its progress mark names it and counts no iteration (it is written every few seconds); where "
    "it hung, if it did, is in its hang records: traintel report."
)


#: A number with its unit, and a name with its number, kept on one line when a line is wrapped.
_NUMBER_UNIT = re.compile(r"(\d) (?=(?:[kMGT]?B|[mµn]?s|min|h|%)(?:[\s,;)]|$))|([A-Za-z_]) (?=-?\d)")


def _fit(line: str) -> list[str]:
    """A line in 80 columns, continued indented; never breaking a word (ids, paths, links), a
    number from its unit or a name from its number."""
    if len(line) <= _COLUMNS_WIDE:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + 2)
    joined = _NUMBER_UNIT.sub(lambda m: f"{m[1] or m[2]}\xa0", line)  # (textwrap breaks at ASCII spaces only)
    wrapped = textwrap.wrap(joined, _COLUMNS_WIDE, subsequent_indent=indent, break_long_words=False,
                            break_on_hyphens=False)  # fmt: skip
    return [part.replace("\xa0", " ") for part in wrapped]


def _failure_lines(summary: RunSummary, links: TraceLinks | None) -> list[str]:
    """The errors the run's spans ended with: each where it first happened, and its trace."""
    if not summary.failures:
        return []
    total = sum(f.spans for f in summary.failures.values()) + summary.other_failures
    lines = [
        "",
        f"Errors: {plain_number(total)} span(s) ended with one, earliest first, each where it first happened",
    ]
    for failure in summary.failures.values():
        around = f", and {failure.spans - 1} span(s) around it" if failure.spans > 1 else ""
        lines.append(f"  {failure.message}")
        lines.append(f"    in {failure.where(summary)} at {utc_text(failure.end_ns)} UTC{around}")
        lines.append(f"    trace {failure.trace_id} span {failure.span_id}")
        url = links.url(failure.trace_id, failure.span_id) if links is not None else None
        if url:
            lines.append(f"    {url}")
    if summary.other_failures:
        lines.append(f"  and {plain_number(summary.other_failures)} span(s) with other errors")
    return [*lines, ""]


def _run_lines(summary: RunSummary) -> list[str]:
    ident = [
        f"service {', '.join(sorted(summary.services)) or '-'}",
        f"run {', '.join(sorted(summary.run_ids)) or '-'}",
        f"ranks {sorted(summary.ranks) or '-'}",
        f"host {', '.join(sorted(summary.hosts)) or '-'}",
    ]
    if summary.session_tags and summary.session_tags != summary.run_ids:
        ident.insert(2, f"session {', '.join(sorted(summary.session_tags))}")
    run = "Run: " + " | ".join(ident)
    lines = [run] if len(run) <= _COLUMNS_WIDE else ["Run:", *(f"  {item}" for item in ident)]
    lines.append(f"Spans read: {summary.spans:,} from {summary.stats.files:,} file(s)")
    if summary.stats.skipped:
        lines.append(f"Skipped lines: {summary.stats.skipped} ({'; '.join(summary.stats.reasons[:3])})")
    return lines


def summed_over(summary: RunSummary) -> str:
    """``", summed over the 2 jobs and the 8 ranks"``: what a count added over processes says
    it adds up; empty for one job of one rank."""
    parts = [
        f"the {n} {what}" for n, what in ((summary.jobs, "jobs"), (len(summary.ranks), "ranks")) if n > 1
    ]
    return f", summed over {' and '.join(parts)}" if parts else ""


def sampled_note(summary: RunSummary, rows: list[PhaseRow]) -> str | None:
    """What a ``*`` after a phase's name says, if a row has one."""
    if not any(row.sampled for row in rows):
        return None
    exported = sum(summary.exported_iterations.values())
    return (
        f"* inside iterations: counted in the exported ones only ({plain_number(exported)} of "
        f"{plain_number(summary.window_iterations)}); the metric {semconv.METRIC_PHASE_DURATION} "
        "counts every one"
    )


def _phase_lines(summary: RunSummary) -> list[str]:
    """The table fits 80 columns for traintel's phase names; a longer name of the user's own
    widens its column rather than being cut."""
    rows = phase_rows(summary)
    name_width = max([_NAME_WIDTH - 2, *(len(row.shown) for row in rows)]) + 2
    header = f"{'phase':<{name_width}}" + "".join(f"{title:>{width}}" for title, width in _COLUMNS)
    lines = [""]
    if summary.open_at_end:
        lines += _fit(
            "The files end before the run's application does (still running, or killed): shares "
            "are of the time up to its last record."
        )
    summed = summed_over(summary)
    if summed:
        lines.append(f"Wall time by phase{summed}:")
    lines += [header, "-" * len(header)]
    for row in rows:
        share = f"{100 * row.share:.1f}%" if row.share is not None else ""
        cells = (
            plain_number(row.count),
            fmt_seconds(row.total_s),
            fmt_seconds(row.mean_s),
            fmt_seconds(row.max_s),
            share,
            plain_number(row.errors) if row.errors else "",
        )
        line = f"{row.shown:<{name_width}}" + "".join(
            f"{cell:>{width}}" for cell, (_title, width) in zip(cells, _COLUMNS, strict=True)
        )
        lines.append(line.rstrip())
    return lines + _note_lines(sampled_note(summary, rows))


def _note_lines(note: str | None) -> list[str]:
    return _fit(note) if note else []


def _iteration_lines(summary: RunSummary) -> list[str]:
    value = summary.summary_value
    iterations = value("iterations")
    n = summary.window_iterations
    marked = summary.marked_iterations
    if iterations is None and not n and not marked:
        return []
    if value("iteration_time.mean") is None and (n or marked):  # no loop summary (yet)
        ended = summary.foreign_loops > 0  # a loop span of the user's own: no summary comes
        why = (
            "(its loop span is not traintel's: the percentiles come with traintel's training_loop)"
            if ended
            else "(all in the warm-up, TRAINTEL_WARMUP_ITERATIONS: no percentiles or rates)"
            if iterations is not None  # its loop ended, every iteration in the warm-up
            else "so far (the run's percentiles come with the end of its training_loop; iterations "
            "outside any get none)"
        )
        lines = [""]
        if n:
            summed = summed_over(summary)  # and what the run itself ran, where that differs
            summed += f"; the run ran {plain_number(summary.iteration_count())}" if summed else ""
            lines += [
                f"Iterations: {plain_number(n)} in {plain_number(summary.windows)} window(s){summed} {why}",
                f"  mean {fmt_seconds(summary.window_iteration_s / n)}  "
                f"max {fmt_seconds(summary.window_iteration_max_s)}",
            ]
        if marked:  # (with window records, what they leave out; else the run's count)
            tail = f"to iteration {summary.marked_last_iteration}, in the progress mark (killed, or running)"
            lines.append(
                f"  and {plain_number(marked)}{summed_over(summary)} after the last window record, {tail}"
                if n
                else f"Iterations: {plain_number(summary.iteration_count())}, {tail}"
            )
        return lines
    latest = "the latest job's loop; " if summary.jobs > 1 else ""
    lines = [
        "",
        f"Iterations: {plain_number(iterations if iterations is not None else n)} "
        f"({latest}mean and percentiles after warm-up)",
        f"  mean {fmt_seconds(value('iteration_time.mean'))}  "
        f"p50 {fmt_seconds(value('iteration_time.p50'))}  p90 {fmt_seconds(value('iteration_time.p90'))}  "
        f"p99 {fmt_seconds(value('iteration_time.p99'))}",
    ]
    if marked:  # another job of the run, killed mid-window (or still running)
        lines.append(
            f"  and {plain_number(marked)} of a job after its last window record, to iteration "
            f"{summary.marked_last_iteration}, in its progress mark (killed, or running)"
        )
    first = value("first_iteration_time")
    if first is not None:
        lines.append(f"First iteration: {fmt_seconds(first)}")
    return lines


def _rate_lines(summary: RunSummary) -> list[str]:
    """Throughput, compute and checkpoint cost, where the run has them."""
    value = summary.summary_value
    lines = []
    samples_per_second = value("samples_per_second")
    if samples_per_second is not None:
        lines.append(f"Throughput: {samples_per_second:,.1f} samples/s (job)")
    tokens_per_second = value("tokens_per_second")
    if tokens_per_second is not None:
        lines.append(f"Throughput: {tokens_per_second:,.1f} tokens/s (job)")
    tflops = value("tflops_per_device")
    if tflops is not None:
        mfu, measured = value("mfu"), value("mfu_measured")
        lines.append(
            f"Compute: {plain_number(tflops)} TFLOP/s per device"
            + (f", MFU {100 * mfu:.1f}%" if mfu is not None else "")
            + (f" ({100 * measured:.1f}% of the measured matmul peak)" if measured is not None else "")
        )
    energy = energy_figures(value)
    if energy is not None:
        lines.append(energy_text(energy))
    checkpoint = summary.checkpoint_value
    saves = checkpoint("saves")
    if saves:
        megabytes = checkpoint("bytes.total")
        # the job's saves: with several ranks, one rank's (often the only one that saves)
        rank = summary.checkpoint_rank() if len(summary.ranks) > 1 else None
        lines.append(
            f"Checkpoints{f' of rank {rank}' if rank is not None else ''}"
            f"{' of the latest job' if summary.jobs > 1 else ''}: {plain_number(saves)} "
            f"save{'s' if saves != 1 else ''}, "
            f"{fmt_seconds(checkpoint('save_time.total'))} blocking in total, "
            f"mean {fmt_seconds(checkpoint('save_time.mean'))}, "
            f"max {fmt_seconds(checkpoint('save_time.max'))}"
            + (f", {megabytes / 1e6:,.2f} MB" if megabytes else "")
        )
    return lines


#: Where a loop summary's energy may have gone: productive time, or a badput category.
ENERGY_PARTS = ("productive", *semconv.BADPUT_CATEGORIES)


def energy_figures(value: Callable[[str], Any]) -> dict[str, Any] | None:
    """The GPU energy of a loop's summary (J, up to its last window), None without one."""
    joules = value("energy")
    if joules is None:
        return None
    return {
        "joules": joules,
        "seconds": value("energy.time"),
        "per_token": value("energy.per_token"),
        "per_sample": value("energy.per_sample"),
        "cost": value("energy.cost"),
        "by_category": {part: value("energy." + part) for part in ENERGY_PARTS if value("energy." + part)},
    }


def energy_text(energy: dict[str, Any]) -> str:
    joules = energy["joules"]
    per = [f"{energy[k]:,.3g} J/{k[4:]}" for k in ("per_token", "per_sample") if energy[k] is not None]
    shares = (
        ", ".join(f"{part} {j / joules:.0%}" for part, j in energy["by_category"].items()) if joules else ""
    )
    return (
        f"GPU energy: {joules / 1e3:,.2f} kJ"
        + (f" ({', '.join(per)})" if per else "")
        + (f", cost {energy['cost']:,.4g}" if energy["cost"] is not None else "")
        + (f"; {shares}" if shares else "")
    )


def _model_metric_lines(summary: RunSummary) -> list[str]:
    """The user's model metrics as the run left them: the last window's last value (its mean
    next to it, the window's iterations named), and each evaluation loop's last values."""
    lines = []
    metrics = summary.window_metrics()
    if metrics:
        first = summary.last_window.get(_W + "first_iteration")
        last = summary.last_window.get(_W + "last_iteration")
        where = f" (iterations {plain_number(first)}-{plain_number(last)})" if first is not None else ""
        shown = ", ".join(_metric_text(name, stats) for name, stats in metrics.items())
        lines.append(f"Model metrics, last window{where}: {shown}")
    for phase, values in summary.evaluation_metrics().items():
        shown = ", ".join(f"{name} {plain_number(value)}" for name, value in values.items())
        lines.append(f"Model metrics, last {phase.replace('_', ' ')}: {shown}")
    return lines


def _metric_text(name: str, stats: dict[str, Any]) -> str:
    """``loss 0.1047 (mean 0.2583)``; the mean is left out where it reads the same as the last."""
    last, mean = plain_number(stats.get("last")), plain_number(stats.get("mean"))
    return f"{name} {last}" + (f" (mean {mean})" if "mean" in stats and mean != last else "")


def _export_lines(summary: RunSummary, links: TraceLinks | None) -> list[str]:
    """Which iterations were exported as spans, the slowest of them, and the notable events."""
    lines = []
    if summary.exported_iterations:
        reasons = ", ".join(
            f"{reason} {count}" for reason, count in sorted(summary.exported_iterations.items())
        )
        exported = sum(summary.exported_iterations.values())
        lines.append(f"Iterations exported as spans{summed_over(summary)}: {exported} ({reasons})")
        for slow in sorted(summary.slowest, reverse=True)[:3]:
            lines.append(f"  slowest exported: {slow.where(summary)} {fmt_seconds(slow.seconds)}")
            lines.append(f"    trace {slow.trace_id} span {slow.span_id}")
            url = links.url(slow.trace_id, slow.span_id) if links is not None else None
            if url:
                lines.append(f"    {url}")
    notable = {
        k: v
        for k, v in summary.events.items()
        if k in ("slow_iteration", "nonfinite_metric", "metric_out_of_range")
    }
    if notable:
        lines.append("Events: " + ", ".join(f"{k} x{v}" for k, v in sorted(notable.items())))
    return lines


def _telemetry_lines(summary: RunSummary) -> list[str]:
    """What the telemetry itself lost or has not delivered yet."""
    lines = []
    losses = {name: value for name, value in summary.self_telemetry.items() if value and is_loss(name)}
    if losses:
        shown = ", ".join(f"{name} {plain_number(value)}" for name, value in losses.items())
        lines.append(f"Telemetry losses: {shown}")
    spooled = summary.self_telemetry.get(semconv.METRIC_SPOOL_SIZE)
    if spooled:
        lines.append(f"Telemetry not yet delivered: {spooled:,.0f} bytes in the spool (traintel replay DIR)")
    return lines
