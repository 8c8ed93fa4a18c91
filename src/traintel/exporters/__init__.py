"""Exporters: the embedded OTLP/JSON-lines file default and its reader."""

from traintel.exporters.file import OtlpJsonFileMetricExporter, OtlpJsonFileSpanExporter, OtlpJsonLinesFile
from traintel.exporters.reader import ReadStats, SpanRecord, iter_spans, read_requests

__all__ = [
    "OtlpJsonFileMetricExporter",
    "OtlpJsonFileSpanExporter",
    "OtlpJsonLinesFile",
    "ReadStats",
    "SpanRecord",
    "iter_spans",
    "read_requests",
]
