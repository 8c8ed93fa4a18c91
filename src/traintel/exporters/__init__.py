"""Exporters: the embedded OTLP/JSON-lines file default and its reader.

The names are loaded on first use: the offline tools import the reader alone, without the
OpenTelemetry SDK the exporters are built on.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traintel.exporters.file import (
        OtlpJsonFileMetricExporter,
        OtlpJsonFileSpanExporter,
        OtlpJsonLinesFile,
    )
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


def __getattr__(name: str) -> Any:
    import importlib

    if name not in __all__:
        raise AttributeError(f"module 'traintel.exporters' has no attribute {name!r}")
    module = "traintel.exporters.file" if name.startswith("OtlpJson") else "traintel.exporters.reader"
    return getattr(importlib.import_module(module), name)
