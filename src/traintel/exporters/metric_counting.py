"""Failed metric exports, counted and stated at exit.

Why metrics are counted but not spooled like spans: the OTLP metric exporters send cumulative
temporality by default, so each export carries the running totals since the start, and the
next export that goes through makes up for every failed one before it (only the resolution of
the points in between is lost). What a collector that is down cannot get is the state after
the last delivered export; and with delta temporality
(``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta``) each failed interval's data.
A snapshot spooled mid-run would be resent behind newer points once the collector returns,
which backends refuse as out of order; only the final one at exit would be worth keeping for
``traintel replay`` (not done: replay sends spans only). So the count goes to
``traintel.export.failures{traintel.export.signal=metrics}`` and the exit line says whether
the last export, the one with the final totals, was delivered.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from traintel.exporters.health import HEALTH, ExportHealth
from traintel.exporters.process_bound import ProcessBoundMetricExporter

#: What a bounded exit names when it runs out while metrics are with the exporter.
SENDING_METRICS = "the collector (a metric export under way)"


class CountingMetricExporter(ProcessBoundMetricExporter):
    """A process-bound metric exporter whose every export's outcome reaches ``health``."""

    def __init__(self, inner: MetricExporter, health: ExportHealth = HEALTH) -> None:
        super().__init__(inner)
        self._health = health

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self._health.metric_export_started()
        delivered = False
        try:
            with self._health.busy(SENDING_METRICS):
                result = super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            delivered = result == MetricExportResult.SUCCESS
            return result
        finally:
            self._health.metric_export_done(delivered)
