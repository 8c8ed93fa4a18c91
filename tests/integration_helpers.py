"""What the framework-integration tests share: a traintel-built pipeline around in-memory parts
(export filter included) with every iteration exported, and span-tree helpers."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from traintel import semconv


@dataclass
class Captured:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        traintel.get_telemetry().flush(60)
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return sorted((s for s in self.spans() if s.name == name), key=lambda s: s.start_time or 0)

    def counts(self) -> Counter[str]:
        return Counter(s.name for s in self.spans())

    def metric_sum(self, name: str) -> float:
        return sum(point.value for point in metric_points(self.reader, name))


def metric_points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """Every point of the metric ``name`` the reader collects now, across resources and scopes."""
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def capture(**training: object) -> Captured:
    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    traintel.configure(
        span_exporters=[exporter], metric_readers=[reader], export_iterations="all", **training
    )
    return Captured(exporter, reader)


def children(span: ReadableSpan, spans: list[ReadableSpan]) -> Counter[str]:
    return Counter(s.name for s in spans if s.parent is not None and s.parent.span_id == span.context.span_id)


def attr(span: ReadableSpan, key: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(key)


def window_updates(captured: Captured) -> list[dict[str, Any]]:
    return [
        dict(e.attributes or {})
        for s in captured.named(semconv.Phase.TRAINING_LOOP.value)
        for e in s.events
        if e.name == semconv.Event.TRAINING_METRICS_UPDATE.value
    ]
