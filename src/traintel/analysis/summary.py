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

import heapq
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from traintel import semconv
from traintel._aggregation.stats import percentile
from traintel.exporters.reader import ReadStats, SpanRecord, attributes_dict, read_requests, spans_in
from traintel.semconv import Phase

_PHASE_ORDER = {phase.value: i for i, phase in enumerate(Phase)}
_W = semconv.WINDOW_PREFIX
_S = semconv.SUMMARY_PREFIX
_STEP_PHASES = (
    ("data_loading", Phase.DATA_LOADING.value),
    ("forward", Phase.MODEL_FORWARD.value),
    ("backward", Phase.MODEL_BACKWARD.value),
    ("optimizer", Phase.OPTIMIZER_UPDATE.value),
)
_PER_STEP = {p.value for p in semconv.ITERATION_PHASES} | {p.value for p in semconv.STEP_PHASES}

__all__ = [
    "PhaseRow",
    "PhaseStats",
    "RunSummary",
    "is_loss",
    "percentile",
    "phase_rows",
    "render",
    "self_telemetry_points",
    "summarize",
]

#: Self-telemetry series that mean something was lost, refused or failed.
_LOSS_WORDS = ("dropped", "failures", "split")


def self_telemetry_points(
    request: ExportMetricsServiceRequest,
) -> Iterator[tuple[dict[str, Any], str, float]]:
    """``(resource, name, value)`` of every ``traintel.*`` sum or gauge in a metrics request,
    summed over its points (attributes such as the drop reason)."""
    for resource_metrics in request.resource_metrics:
        resource = attributes_dict(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if not metric.name.startswith("traintel."):
                    continue
                kind = metric.WhichOneof("data")
                if kind not in ("sum", "gauge"):
                    continue
                total = 0.0
                for point in getattr(metric, kind).data_points:
                    total += point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                yield resource, metric.name, total


def is_loss(name: str) -> bool:
    """Whether a ``traintel.*`` series counts something lost, refused or failed."""
    return any(word in name for word in _LOSS_WORDS)


@dataclass
class PhaseStats:
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    errors: int = 0

    def add(self, seconds: float, error: bool, count: int = 1) -> None:
        self.count += count
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds if count == 1 else self.max_s)
        self.errors += int(error)

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else 0.0


@dataclass
class RunSummary:
    """What ``traintel summary`` prints; also returned for programmatic use and tests."""

    services: set[str] = field(default_factory=set)
    run_ids: set[str] = field(default_factory=set)
    session_tags: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    application_s: float = 0.0
    spans: int = 0
    windows: int = 0
    window_iterations: int = 0
    window_iteration_s: float = 0.0
    window_iteration_max_s: float = 0.0
    step_phase_s: dict[str, float] = field(default_factory=dict)
    loop_summaries: list[dict[str, Any]] = field(default_factory=list)
    last_window: dict[str, Any] = field(default_factory=dict)
    exported_iterations: dict[str, int] = field(default_factory=dict)
    slowest: list[tuple[float, str, str, int]] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)
    stats: ReadStats = field(default_factory=ReadStats)
    #: ``traintel.*`` self-telemetry: the last value of each series, per process.
    self_telemetry_latest: dict[tuple[str, str], float] = field(default_factory=dict)
    #: How many of the slowest exported iterations are kept (a bounded heap).
    keep_slowest: int = 5

    def add(self, span: SpanRecord) -> None:
        self.spans += 1
        resource = span.resource
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
        for event in span.events:
            self.events[event.name] = self.events.get(event.name, 0) + 1
            if event.name == semconv.Event.TRAINING_METRICS_UPDATE:
                self._window(event.attributes)
        phase = span.attributes.get(semconv.PHASE)
        if phase is None:
            return
        phase = str(phase)
        seconds = span.duration_s
        if phase == Phase.TRAINING_ITERATION:
            reason = str(span.attributes.get(semconv.SAMPLING_REASON, "foreign"))
            self.exported_iterations[reason] = self.exported_iterations.get(reason, 0) + 1
            item = (seconds, span.trace_id, span.span_id, int(span.attributes.get(semconv.ITERATION, -1)))
            if len(self.slowest) < self.keep_slowest:
                heapq.heappush(self.slowest, item)
            else:
                heapq.heappushpop(self.slowest, item)
        if phase in _PER_STEP:
            return  # counted from the window events, not from the sampled spans
        self.phases.setdefault(phase, PhaseStats()).add(seconds, span.is_error)
        if phase == Phase.APPLICATION:
            self.application_s += seconds
        elif phase == Phase.TRAINING_LOOP and _S + "iterations" in span.attributes:
            self.loop_summaries.append({k: v for k, v in span.attributes.items() if k.startswith(_S)})

    def _window(self, attributes: dict[str, Any]) -> None:
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
        self.last_window = attributes

    def add_metrics(self, request: ExportMetricsServiceRequest) -> None:
        for resource, name, value in self_telemetry_points(request):
            process = str(resource.get(semconv.SERVICE_INSTANCE_ID, resource.get(semconv.RUN_ID, "?")))
            self.self_telemetry_latest[(process, name)] = value

    @property
    def self_telemetry(self) -> dict[str, float]:
        """Each ``traintel.*`` series' last value, summed over processes."""
        totals: dict[str, float] = {}
        for (_process, name), value in self.self_telemetry_latest.items():
            totals[name] = totals.get(name, 0.0) + value
        return dict(sorted(totals.items()))

    def summary_value(self, key: str) -> Any:
        """A ``ml.training.summary.<key>`` value of the last training loop that has it."""
        for summary in reversed(self.loop_summaries):
            if _S + key in summary:
                return summary[_S + key]
        return None


def summarize(paths: Iterable[str | os.PathLike[str]]) -> RunSummary:
    """The run's numbers from exported OTLP/JSON-lines files or folders of them: phases,
    iterations, throughput, MFU, checkpoints, self-telemetry (what ``traintel summary`` prints)."""
    summary = RunSummary()
    for request in read_requests(paths, summary.stats):
        if isinstance(request, ExportTraceServiceRequest):
            for span in spans_in(request):
                summary.add(span)
        else:
            summary.add_metrics(request)
    return summary


def _fmt_s(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds) or math.isinf(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _fmt_number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _row(
    name: str, count: int, total: float, mean: float, maximum: float | None, share: str, errors: int
) -> str:
    return (
        f"{name:<22}{count:>8}{_fmt_s(total):>12}{_fmt_s(mean):>12}"
        f"{_fmt_s(maximum):>12}{share:>8}{errors or '':>8}"
    )


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


def phase_rows(summary: RunSummary) -> list[PhaseRow]:
    """Wall time by phase, in span-tree order. Per-step phases come from the window events
    (every iteration counted), not from the tail-sampled iteration spans."""
    total = summary.application_s

    def share(seconds: float) -> float | None:
        return seconds / total if total > 0 else None

    rows: list[PhaseRow] = []
    for name, stats in summary.phases.items():
        shown = share(stats.total_s) if name != Phase.APPLICATION else None
        rows.append(
            PhaseRow(name, stats.count, stats.total_s, stats.mean_s, stats.max_s, shown, stats.errors)
        )
    n = summary.window_iterations
    if n:
        seconds = summary.window_iteration_s
        rows.append(
            PhaseRow(
                Phase.TRAINING_ITERATION.value,
                n,
                seconds,
                seconds / n,
                summary.window_iteration_max_s,
                share(seconds),
                0,
            )
        )
        for short, phase in _STEP_PHASES:
            seconds = summary.step_phase_s.get(short, 0.0)
            if seconds:
                rows.append(PhaseRow(phase, n, seconds, seconds / n, None, share(seconds), 0))
    return sorted(rows, key=lambda r: _PHASE_ORDER.get(r.phase, 99))


def render(summary: RunSummary) -> str:
    """The summary as plain text for a terminal."""
    return "\n".join(
        [
            *_run_lines(summary),
            *_phase_lines(summary),
            *_iteration_lines(summary),
            *_rate_lines(summary),
            *_model_metric_lines(summary),
            *_export_lines(summary),
            *_telemetry_lines(summary),
        ]
    )


def _run_lines(summary: RunSummary) -> list[str]:
    ident = [
        f"service {', '.join(sorted(summary.services)) or '-'}",
        f"run {', '.join(sorted(summary.run_ids)) or '-'}",
        f"ranks {sorted(summary.ranks) or '-'}",
        f"host {', '.join(sorted(summary.hosts)) or '-'}",
    ]
    lines = ["Run: " + " | ".join(ident), f"Spans read: {summary.spans} from {summary.stats.files} file(s)"]
    if summary.stats.skipped:
        lines.append(f"Skipped lines: {summary.stats.skipped} ({'; '.join(summary.stats.reasons[:3])})")
    return lines


def _phase_lines(summary: RunSummary) -> list[str]:
    header = f"{'phase':<22}{'count':>8}{'total':>12}{'mean':>12}{'max':>12}{'share':>8}{'errors':>8}"
    lines = ["", header, "-" * len(header)]
    for row in phase_rows(summary):
        share = f"{100 * row.share:.1f}%" if row.share is not None else ""
        lines.append(_row(row.phase, row.count, row.total_s, row.mean_s, row.max_s, share, row.errors))
    return lines


def _iteration_lines(summary: RunSummary) -> list[str]:
    value = summary.summary_value
    iterations = value("iterations")
    n = summary.window_iterations
    if iterations is None and not n:
        return []
    lines = [
        "",
        f"Iterations: {iterations if iterations is not None else n}  "
        f"mean {_fmt_s(value('iteration_time.mean'))}  p50 {_fmt_s(value('iteration_time.p50'))}  "
        f"p90 {_fmt_s(value('iteration_time.p90'))}  p99 {_fmt_s(value('iteration_time.p99'))}"
        "  (after warm-up)",
    ]
    first = value("first_iteration_time")
    if first is not None:
        lines.append(f"First iteration: {_fmt_s(first)}")
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
        mfu = value("mfu")
        lines.append(
            f"Compute: {tflops:,.3f} TFLOP/s per device"
            + (f", MFU {100 * mfu:.1f}%" if mfu is not None else "")
        )
    saves = value("checkpoint.saves")
    if saves:
        megabytes = value("checkpoint.bytes.total")
        lines.append(
            f"Checkpoints: {saves} saves, {_fmt_s(value('checkpoint.save_time.total'))} blocking in total, "
            f"mean {_fmt_s(value('checkpoint.save_time.mean'))}, "
            f"max {_fmt_s(value('checkpoint.save_time.max'))}"
            + (f", {megabytes / 1e6:,.2f} MB" if megabytes else "")
        )
    return lines


def _model_metric_lines(summary: RunSummary) -> list[str]:
    metrics: dict[str, dict[str, Any]] = {}
    for key, metric_value in summary.last_window.items():
        if key.startswith(_W + "metric."):
            name, _, statistic = key[len(_W + "metric.") :].rpartition(".")
            metrics.setdefault(name, {})[statistic] = metric_value
    if not metrics:
        return []
    shown = "; ".join(
        f"{name} " + ", ".join(f"{stat} {_fmt_number(v)}" for stat, v in sorted(stats.items(), reverse=True))
        for name, stats in sorted(metrics.items())
    )
    return [f"Last window's model metrics: {shown}"]


def _export_lines(summary: RunSummary) -> list[str]:
    """Which iterations were exported as spans, the slowest of them, and the notable events."""
    lines = []
    if summary.exported_iterations:
        reasons = ", ".join(
            f"{reason} {count}" for reason, count in sorted(summary.exported_iterations.items())
        )
        exported = sum(summary.exported_iterations.values())
        lines.append(f"Iterations exported as spans: {exported} ({reasons})")
        for seconds, trace_id, span_id, iteration in sorted(summary.slowest, reverse=True)[:3]:
            lines.append(
                f"  slowest exported: iteration {iteration} {_fmt_s(seconds)}  "
                f"trace {trace_id} span {span_id}"
            )
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
        lines.append(
            "Telemetry losses: " + ", ".join(f"{name} {_fmt_number(value)}" for name, value in losses.items())
        )
    spooled = summary.self_telemetry.get(semconv.METRIC_SPOOL_SIZE)
    if spooled:
        lines.append(f"Telemetry not yet delivered: {spooled:,.0f} bytes in the spool (traintel replay DIR)")
    return lines
