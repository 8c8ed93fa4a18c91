"""A short human summary of a run, read back from its OTLP/JSON-lines files.

Why from the file and not from live state: the summary then shows exactly what reached the
exporter (what a collector would have received), and works for any finished run, including
one that crashed. Analysis code reads files and the vocabulary only (never the live runtime).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from traintel import semconv
from traintel.exporters.reader import ReadStats, SpanRecord, iter_spans
from traintel.semconv import Phase

_PHASE_ORDER = {phase.value: i for i, phase in enumerate(Phase)}


@dataclass
class PhaseStats:
    count: int = 0
    total_s: float = 0.0
    min_s: float = math.inf
    max_s: float = 0.0
    errors: int = 0

    def add(self, seconds: float, error: bool) -> None:
        self.count += 1
        self.total_s += seconds
        self.min_s = min(self.min_s, seconds)
        self.max_s = max(self.max_s, seconds)
        self.errors += int(error)

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else 0.0


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an ascending list."""
    if not sorted_values:
        return math.nan
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


@dataclass
class RunSummary:
    """What ``traintel summary`` prints; also returned for programmatic use and tests."""

    services: set[str] = field(default_factory=set)
    run_ids: set[str] = field(default_factory=set)
    session_tags: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    iteration_s: list[float] = field(default_factory=list)
    first_iteration_s: float | None = None
    _first_iteration_start_ns: int = 2**63
    samples: int = 0
    tokens: int = 0
    iterations_with_samples_s: float = 0.0
    iterations_with_tokens_s: float = 0.0
    global_batch_size: int | None = None
    checkpoint_bytes: int = 0
    last_metrics: dict[str, Any] = field(default_factory=dict)
    application_s: float = 0.0
    spans: int = 0
    stats: ReadStats = field(default_factory=ReadStats)

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
        phase = span.attributes.get(semconv.PHASE)
        if phase is None:
            return
        phase = str(phase)
        seconds = span.duration_s
        self.phases.setdefault(phase, PhaseStats()).add(seconds, span.is_error)
        if phase == Phase.APPLICATION:
            self.application_s += seconds
            for event in span.events:
                if event.name == semconv.Event.TELEMETRY_INITIALIZATION:
                    batch = event.attributes.get(semconv.CONFIG_PREFIX + "global_batch_size")
                    if batch is not None:
                        self.global_batch_size = int(batch)
        elif phase == Phase.TRAINING_ITERATION:
            self.iteration_s.append(seconds)
            if span.start_ns < self._first_iteration_start_ns:
                self._first_iteration_start_ns = span.start_ns
                self.first_iteration_s = seconds
            samples = span.attributes.get(semconv.SAMPLES)
            if samples is not None:
                self.samples += int(samples)
                self.iterations_with_samples_s += seconds
            tokens = span.attributes.get(semconv.TOKENS)
            if tokens is not None:
                self.tokens += int(tokens)
                self.iterations_with_tokens_s += seconds
            for key, value in span.attributes.items():
                if key.startswith(semconv.METRIC_PREFIX):
                    self.last_metrics[key[len(semconv.METRIC_PREFIX) :]] = value
        elif phase in (Phase.CHECKPOINT_SAVE_SYNC, Phase.CHECKPOINT_SAVE_ASYNC):
            size = span.attributes.get(semconv.CHECKPOINT_SIZE)
            if size is not None:
                self.checkpoint_bytes += int(size)

    @property
    def sample_throughput(self) -> float | None:
        """Samples per second of iteration time: reported samples, else global batch size."""
        if self.samples and self.iterations_with_samples_s > 0:
            return self.samples / self.iterations_with_samples_s
        if self.global_batch_size and self.iteration_s:
            return self.global_batch_size * len(self.iteration_s) / sum(self.iteration_s)
        return None

    @property
    def token_throughput(self) -> float | None:
        if self.tokens and self.iterations_with_tokens_s > 0:
            return self.tokens / self.iterations_with_tokens_s
        return None


def summarize(paths: Iterable[str | os.PathLike[str]]) -> RunSummary:
    summary = RunSummary()
    for span in iter_spans(paths, summary.stats):
        summary.add(span)
    return summary


def _fmt_s(seconds: float) -> str:
    if math.isnan(seconds) or math.isinf(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def render(summary: RunSummary) -> str:
    """The summary as plain text for a terminal."""
    lines: list[str] = []
    ident = [
        f"service {', '.join(sorted(summary.services)) or '-'}",
        f"run {', '.join(sorted(summary.run_ids)) or '-'}",
        f"ranks {sorted(summary.ranks) or '-'}",
        f"host {', '.join(sorted(summary.hosts)) or '-'}",
    ]
    lines.append("Run: " + " | ".join(ident))
    lines.append(f"Spans read: {summary.spans} from {summary.stats.files} file(s)")
    if summary.stats.skipped:
        lines.append(f"Skipped lines: {summary.stats.skipped} ({'; '.join(summary.stats.reasons[:3])})")
    lines.append("")
    header = f"{'phase':<22}{'count':>8}{'total':>12}{'mean':>12}{'max':>12}{'share':>8}{'errors':>8}"
    lines.append(header)
    lines.append("-" * len(header))
    total = summary.application_s
    for name in sorted(summary.phases, key=lambda n: (_PHASE_ORDER.get(n, 99), n)):
        stats = summary.phases[name]
        share = f"{100 * stats.total_s / total:.1f}%" if total > 0 and name != Phase.APPLICATION else ""
        lines.append(
            f"{name:<22}{stats.count:>8}{_fmt_s(stats.total_s):>12}{_fmt_s(stats.mean_s):>12}"
            f"{_fmt_s(stats.max_s):>12}{share:>8}{stats.errors or '':>8}"
        )
    if summary.iteration_s:
        ordered = sorted(summary.iteration_s)
        lines.append("")
        lines.append(
            f"Iterations: {len(ordered)}  mean {_fmt_s(sum(ordered) / len(ordered))}  "
            f"p50 {_fmt_s(percentile(ordered, 50))}  p90 {_fmt_s(percentile(ordered, 90))}  "
            f"p99 {_fmt_s(percentile(ordered, 99))}  max {_fmt_s(ordered[-1])}"
        )
        if summary.first_iteration_s is not None:
            lines.append(f"First iteration: {_fmt_s(summary.first_iteration_s)}")
    if summary.sample_throughput is not None:
        lines.append(f"Throughput: {summary.sample_throughput:,.1f} samples/s (samples / iteration time)")
    if summary.token_throughput is not None:
        lines.append(f"Throughput: {summary.token_throughput:,.1f} tokens/s")
    if summary.checkpoint_bytes:
        lines.append(f"Checkpoints written: {summary.checkpoint_bytes / 1e6:,.2f} MB")
    if summary.last_metrics:
        shown = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.last_metrics.items()
        )
        lines.append(f"Last model metrics: {shown}")
    return "\n".join(lines)
