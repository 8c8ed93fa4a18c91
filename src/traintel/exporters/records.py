"""The flat records the analysis reads: a span with its resource, a resource's metrics.

Why a module of their own: both decoders build them (the typed-struct one in
:mod:`~traintel.exporters.json_records`, the proto one in :mod:`~traintel.exporters.reader`),
and neither should import the other to get them; nor should a reader need the writer's module
(and the OpenTelemetry SDK it is built on) for the file suffix or the decoding error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

_STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR


#: The name ending of the embedded default's files (what the readers look for in a directory).
FILE_SUFFIX = ".otlp.jsonl"


class DecodeError(ValueError):
    """A line is not an OTLP/JSON trace, metrics or logs export request."""


class NotCanonical(Exception):
    """The line is not in the canonical OTLP/JSON spelling: leave it to the proto path."""


class MetricSeries(NamedTuple):
    """One metric of a metrics request, reduced to what the analysis reads (a tuple: a file
    holds millions of them, and a frozen dataclass costs twice as much to build)."""

    name: str
    #: The ``data`` member (``gauge``, ``sum``, ``histogram``, ...), None when unset.
    kind: str | None
    #: Each point's :func:`attribute_label` ("" for a point without attributes) and its
    #: ``as_double`` / ``as_int`` (gauge and sum; empty otherwise).
    values: tuple[tuple[str, float], ...]
    #: The latest ``time_unix_nano`` of its points (0 without points).
    last_time_ns: int

    @property
    def total(self) -> float:
        """The sum over its points."""
        return sum(value for _label, value in self.values)

    def labelled(self) -> list[tuple[str, float]]:
        """``(name, total)``, then ``(name{label}, value)`` per attribute set when its points
        have attributes: a counter split by an attribute is read apart as well as summed."""
        return [  # (a label repeated, as in a damaged line, is added up by the reader of these)
            (self.name, self.total),
            *((f"{self.name}{{{label}}}", value) for label, value in self.values if label),
        ]


def attribute_label(attributes: dict[str, Any]) -> str:
    """A point's attributes as one text, keys in order (``traintel.exported=true``)."""
    return ",".join(f"{key}={_label_value(attributes[key])}" for key in sorted(attributes))


def _label_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@dataclass(frozen=True, slots=True)
class MetricsRecord:
    """A ``ResourceMetrics``: the resource's attributes and its metrics, all scopes together."""

    resource: dict[str, Any]
    #: Those of the metrics the reader asked for (``metric_names``): none, some or all.
    metrics: tuple[MetricSeries, ...]
    #: The latest ``time_unix_nano`` of its points (0 without points).
    last_time_ns: int


class EventRecord(NamedTuple):
    name: str
    time_ns: int
    attributes: dict[str, Any]


class SpanRecord(NamedTuple):
    """A flat view of one exported span with its resource, for analysis code (a tuple, as
    :class:`MetricSeries`: a frozen dataclass of these 13 fields costs four times as much to
    build, 5 % of ``traintel report``'s time per file)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[EventRecord, ...]
    links: tuple[tuple[str, str], ...]
    status_code: int
    status_message: str
    resource: dict[str, Any]
    scope: str

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def is_error(self) -> bool:
        return self.status_code == _STATUS_ERROR
