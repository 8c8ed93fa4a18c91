"""Exporters that send only from the process that created them.

Why: a forked child (a DataLoader worker under ``fork``, or a ``forkserver`` template forked
from a configured parent) inherits the providers, and the SDK restarts the batch span
processor's and the periodic metric reader's threads in the child (``os.register_at_fork``).
Left alone, every worker would export its copy of the parent's metric state under the
parent's identity - cumulative counters duplicated per worker - and any span user code makes
in the worker. Wrapped, a child's exports are dropped (reported as success so the SDK does not
retry or log), and flush/shutdown in the child never touch the parent's connection or file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from traintel._sdk.otel_private import metric_exporter_preferences


class ProcessBoundSpanExporter(SpanExporter):
    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self._pid = os.getpid()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if os.getpid() != self._pid:
            return SpanExportResult.SUCCESS
        return self.inner.export(spans)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if os.getpid() != self._pid:
            return True
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        if os.getpid() == self._pid:
            self.inner.shutdown()

    def __getattr__(self, name: str) -> Any:  # the inner exporter's own API stays reachable
        return getattr(self.inner, name)


class ProcessBoundMetricExporter(MetricExporter):
    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(**metric_exporter_preferences(inner))
        self.inner = inner
        self._pid = os.getpid()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        if os.getpid() != self._pid:
            return True
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if os.getpid() == self._pid:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
