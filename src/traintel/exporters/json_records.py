"""OTLP/JSON lines straight to flat records with orjson: the offline tools' fast decoder.

Why not the proto classes for analysis: ``json_format.ParseDict`` builds a protobuf message field
by field in Python, after an id-rewriting walk of its own; the analysis then walks the message a
third time to flatten it. That read about 9 MB/s. Here orjson (C) parses the line into plain
dicts and one pass turns each span into the :class:`~traintel.exporters.reader.SpanRecord` the
analysis reads (ids are already lowercase hex in OTLP/JSON, 64-bit integers are decimal strings,
attribute values are tagged ``stringValue`` / ``intValue`` / ``doubleValue`` / ...).

The records must be exactly those of the proto path, and a span line the proto path refuses
must stay refused with the same reason. So this path accepts only the canonical spelling of each
field (what traintel's writer and the collector's file exporter print: camelCase keys, int64 as
decimal strings, enums as numbers, lowercase hex ids, one member per ``AnyValue``) and checks
the type of every span field, read or not. Any other spelling raises :class:`NotCanonical` and
the caller decodes that line the proto way (:func:`traintel.exporters.otlp_json.json_line_to_request`),
whose answer, records or a skip reason, is the reference. Damaged lines therefore cost a second
decode; good ones never do.

Metric lines are read for what the analysis takes from them: each metric's name and kind, its
points' times and number values. Those are checked, and every key on the way must be a
canonical field of its message (so a ``data_points`` alias is never read as "no points"); the
values nothing reads (histogram buckets, exemplars, point attributes, descriptions) are not
parsed further. Under the default volume budget metric lines are half of a file, and checking
each bucket count cost more than everything the analysis does with the line; a line damaged
only there is read where the proto path would skip it, with the same records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from google.protobuf.descriptor import Descriptor
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
    Summary,
    SummaryDataPoint,
)

__all__ = [
    "MetricSeries",
    "MetricsRecord",
    "NotCanonical",
    "decode_metrics",
    "decode_tree",
    "loads",
]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1
_UINT32_MAX = (1 << 32) - 1
_HEX = frozenset("0123456789abcdef")
_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class NotCanonical(Exception):
    """The line is not in the canonical OTLP/JSON spelling: leave it to the proto path."""


def loads(raw: bytes) -> Any:
    """orjson's parse; anything it refuses (bad UTF-8, NaN literals, lone surrogates, numbers
    out of range) is left to the reference path, which names the reason."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise NotCanonical from None


# --- scalars -------------------------------------------------------------------------------------
def _uint64(value: object) -> int:
    """A fixed64/uint64 field: a decimal string (canonical) or a JSON integer."""
    if type(value) is str:
        if not (value.isdigit() and value.isascii()):
            raise NotCanonical
        number = int(value)
    elif type(value) is int:
        number = value
    else:
        raise NotCanonical
    if number > _UINT64_MAX or number < 0:
        raise NotCanonical
    return number


def _int64(value: object) -> int:
    if type(value) is str:
        digits = value[1:] if value[:1] == "-" else value
        if not (digits.isdigit() and digits.isascii()):
            raise NotCanonical
        number = int(value)
    elif type(value) is int:
        number = value
    else:
        raise NotCanonical
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise NotCanonical
    return number


def _double(value: object) -> float:
    kind = type(value)
    if kind is float:
        return value  # type: ignore[return-value]
    if kind is int:
        return float(value)  # type: ignore[arg-type]
    if kind is str and value in _NON_FINITE:
        return _NON_FINITE[value]  # type: ignore[index]
    raise NotCanonical


def _uint32(value: object) -> int:
    if type(value) is not int or not 0 <= value <= _UINT32_MAX:
        raise NotCanonical
    return value


def _string(value: object) -> str:
    if type(value) is not str:
        raise NotCanonical
    return value


def _hex_id(value: object) -> str:
    """A trace or span id: lowercase hex, as OTLP/JSON writes it (the proto path lowercases)."""
    if type(value) is not str or len(value) % 2 or not _HEX.issuperset(value):
        raise NotCanonical
    return value


def _list(value: object) -> list[Any]:
    if type(value) is not list:
        raise NotCanonical
    return value  # type: ignore[return-value]


def _dict(value: object) -> dict[str, Any]:
    if type(value) is not dict:
        raise NotCanonical
    return value  # type: ignore[return-value]


# --- attributes ----------------------------------------------------------------------------------
def _array(value: object) -> list[Any]:
    body = _dict(value)
    if not body:
        return []
    if len(body) != 1 or "values" not in body:
        raise NotCanonical
    return [_any_value(item) for item in _list(body["values"])]


def _kvlist(value: object) -> dict[str, Any]:
    body = _dict(value)
    if not body:
        return {}
    if len(body) != 1 or "values" not in body:
        raise NotCanonical
    return attributes(body["values"])


def _refuse() -> Any:
    raise NotCanonical


def _bool(value: object) -> bool:
    if type(value) is not bool:
        raise NotCanonical
    return value  # type: ignore[return-value]


#: ``AnyValue`` members as the proto path returns them (``bytesValue`` is base64: left to it).
_ANY_VALUE: dict[str, Callable[[object], Any]] = {
    "stringValue": _string,
    "intValue": _int64,
    "doubleValue": _double,
    "boolValue": _bool,
    "arrayValue": _array,
    "kvlistValue": _kvlist,
}


def _any_value(value: object) -> Any:
    if type(value) is not dict:
        raise NotCanonical
    if len(value) != 1:  # type: ignore[arg-type]
        if not value:
            return None  # no member set
        raise NotCanonical
    for tag, member in value.items():  # type: ignore[attr-defined]
        convert = _ANY_VALUE.get(tag)
        if convert is None:
            raise NotCanonical
        if tag == "stringValue" and type(member) is str:  # the common case, without a call
            return member
        return convert(member)
    raise AssertionError("unreachable")  # pragma: no cover


def attributes(value: object) -> dict[str, Any]:
    """A ``KeyValue`` list as a dict (a repeated key: the last wins, as with the proto path).

    The canonical string, double and small non-negative integer values are taken inline: a
    window record has dozens of attributes, and a call per value was most of the decode time.
    """
    if type(value) is not list:
        raise NotCanonical
    out: dict[str, Any] = {}
    for kv in value:
        try:
            key = kv["key"]
            raw = kv["value"]
            ((tag, member),) = raw.items()
        except ValueError:  # an AnyValue with no member (null), or with several
            out[kv["key"]] = _any_value(kv["value"]) if type(kv["key"]) is str else _refuse()
            continue
        except (KeyError, TypeError, AttributeError):
            raise NotCanonical from None
        if type(key) is not str:  # (other members of a KeyValue: unknown, ignored by both paths)
            raise NotCanonical
        kind = type(member)
        if kind is str:
            if tag == "stringValue":
                out[key] = member
                continue
            if tag == "intValue" and len(member) < 19 and member.isdigit() and member.isascii():
                out[key] = int(member)  # under 19 digits: inside int64
                continue
        elif kind is float and tag == "doubleValue":
            out[key] = member
            continue
        out[key] = _any_value(raw)
    return out


# --- metrics ----------------------------------------------------------------------------------
def _json_keys(descriptor: Descriptor) -> frozenset[str]:
    return frozenset(field.json_name for field in descriptor.fields)


_METRIC_KEYS = _json_keys(Metric.DESCRIPTOR)
#: The ``Metric.data`` oneof: JSON key -> (the proto member name the analysis code uses, the
#: keys of that message, the keys of its points).
_DATA_KINDS = {
    "gauge": ("gauge", _json_keys(Gauge.DESCRIPTOR), _json_keys(NumberDataPoint.DESCRIPTOR)),
    "sum": ("sum", _json_keys(Sum.DESCRIPTOR), _json_keys(NumberDataPoint.DESCRIPTOR)),
    "histogram": ("histogram", _json_keys(Histogram.DESCRIPTOR), _json_keys(HistogramDataPoint.DESCRIPTOR)),
    "exponentialHistogram": (
        "exponential_histogram",
        _json_keys(ExponentialHistogram.DESCRIPTOR),
        _json_keys(ExponentialHistogramDataPoint.DESCRIPTOR),
    ),
    "summary": ("summary", _json_keys(Summary.DESCRIPTOR), _json_keys(SummaryDataPoint.DESCRIPTOR)),
}
_DATA_KEYS = frozenset(_DATA_KINDS)


class MetricSeries(NamedTuple):
    """One metric of a metrics request, reduced to what the analysis reads (a tuple: a file
    holds millions of them, and a frozen dataclass costs twice as much to build)."""

    name: str
    #: The ``data`` member (``gauge``, ``sum``, ``histogram``, ...), None when unset.
    kind: str | None
    #: Sum over the points of ``as_double`` / ``as_int`` (gauge and sum; 0.0 otherwise).
    total: float
    #: The latest ``time_unix_nano`` of its points (0 without points).
    last_time_ns: int


@dataclass(frozen=True, slots=True)
class MetricsRecord:
    """A ``ResourceMetrics``: the resource's attributes and its metrics, all scopes together."""

    resource: dict[str, Any]
    metrics: tuple[MetricSeries, ...]


def _series(metric: dict[str, Any]) -> MetricSeries:
    """What the analysis reads of a metric: its name, kind, points' times and number values,
    each checked, under keys that are all canonical fields of their message."""
    keys = metric.keys()
    if not keys <= _METRIC_KEYS:
        raise NotCanonical
    name = _string(metric.get("name", ""))
    kinds = keys & _DATA_KEYS
    if len(kinds) != 1:
        if kinds:  # a oneof with two members
            raise NotCanonical
        return MetricSeries(name, None, 0.0, 0)
    (key,) = kinds
    kind, data_keys, point_keys = _DATA_KINDS[key]
    data = _dict(metric[key])
    if not data.keys() <= data_keys:
        raise NotCanonical
    numbers = kind in ("gauge", "sum")
    total, last = 0.0, 0
    for value in _list(data.get("dataPoints", [])):
        point = _dict(value)
        if not point.keys() <= point_keys:
            raise NotCanonical
        last = max(last, _uint64(point.get("timeUnixNano", "0")))
        if not numbers:
            continue
        if "asDouble" not in point:
            total += _int64(point.get("asInt", "0"))
        elif "asInt" in point:  # a oneof with two members
            raise NotCanonical
        else:
            total += _double(point["asDouble"])
    return MetricSeries(name, kind, total, last)


def decode_metrics(tree: dict[str, Any]) -> list[MetricsRecord]:
    """The records of one ``ExportMetricsServiceRequest`` tree; :class:`NotCanonical` if any
    part of it is not canonical."""
    if len(tree) != 1:
        raise NotCanonical
    out = []
    for resource_metrics in _list(tree["resourceMetrics"]):
        body = _dict(resource_metrics)
        if not body.keys() <= {"resource", "scopeMetrics", "schemaUrl"}:
            raise NotCanonical
        _string(body.get("schemaUrl", ""))
        resource = _resource(body.get("resource", {}))
        series: list[MetricSeries] = []
        for scope_metrics in _list(body.get("scopeMetrics", [])):
            scope_body = _dict(scope_metrics)
            if not scope_body.keys() <= {"scope", "metrics", "schemaUrl"}:
                raise NotCanonical
            _string(scope_body.get("schemaUrl", ""))
            _scope_name(scope_body.get("scope", {}))
            series += [_series(_dict(metric)) for metric in _list(scope_body.get("metrics", []))]
        out.append(MetricsRecord(resource, tuple(series)))
    return out


# --- spans ----------------------------------------------------------------------------------------
_RESOURCE_KEYS = frozenset({"attributes", "droppedAttributesCount"})
_SCOPE_KEYS = frozenset({"name", "version", "attributes", "droppedAttributesCount"})
_SPAN_KEYS = frozenset(
    {
        "traceId",
        "spanId",
        "traceState",
        "parentSpanId",
        "flags",
        "name",
        "kind",
        "startTimeUnixNano",
        "endTimeUnixNano",
        "attributes",
        "droppedAttributesCount",
        "events",
        "droppedEventsCount",
        "links",
        "droppedLinksCount",
        "status",
    }
)
_EVENT_KEYS = frozenset({"timeUnixNano", "name", "attributes", "droppedAttributesCount"})
_LINK_KEYS = frozenset({"traceId", "spanId", "traceState", "attributes", "droppedAttributesCount", "flags"})
_STATUS_KEYS = frozenset({"message", "code"})
_SPAN_KINDS = frozenset(range(6))
_STATUS_CODES = frozenset(range(3))


def _resource(value: object) -> dict[str, Any]:
    body = _dict(value)
    if not body.keys() <= _RESOURCE_KEYS:
        raise NotCanonical
    if "droppedAttributesCount" in body:
        _uint32(body["droppedAttributesCount"])
    return attributes(body["attributes"]) if "attributes" in body else {}


def _scope_name(value: object) -> str:
    body = _dict(value)
    if not body.keys() <= _SCOPE_KEYS:
        raise NotCanonical
    if "version" in body:
        _string(body["version"])
    if "attributes" in body:
        attributes(body["attributes"])
    if "droppedAttributesCount" in body:
        _uint32(body["droppedAttributesCount"])
    return _string(body.get("name", ""))


def _unread_span_fields(span: dict[str, Any]) -> None:
    """Fields no analysis reads, checked all the same: the proto path would refuse a bad one."""
    if "traceState" in span:
        _string(span["traceState"])
    if "flags" in span:
        _uint32(span["flags"])
    if "kind" in span and (type(span["kind"]) is not int or span["kind"] not in _SPAN_KINDS):
        raise NotCanonical
    for key in ("droppedAttributesCount", "droppedEventsCount", "droppedLinksCount"):
        if key in span:
            _uint32(span[key])


def _event(value: object, record: Callable[..., Any]) -> Any:
    event = _dict(value)
    if not event.keys() <= _EVENT_KEYS:
        raise NotCanonical
    if "droppedAttributesCount" in event:
        _uint32(event["droppedAttributesCount"])
    return record(
        _string(event.get("name", "")),
        _uint64(event.get("timeUnixNano", "0")),
        attributes(event["attributes"]) if "attributes" in event else {},
    )


def _link(value: object) -> tuple[str, str]:
    link = _dict(value)
    if not link.keys() <= _LINK_KEYS:
        raise NotCanonical
    if "traceState" in link:
        _string(link["traceState"])
    if "attributes" in link:
        attributes(link["attributes"])
    if "droppedAttributesCount" in link:
        _uint32(link["droppedAttributesCount"])
    if "flags" in link:
        _uint32(link["flags"])
    return _hex_id(link.get("traceId", "")), _hex_id(link.get("spanId", ""))


def _status(value: object) -> tuple[int, str]:
    status = _dict(value)
    if not status.keys() <= _STATUS_KEYS:
        raise NotCanonical
    code = status.get("code", 0)
    if type(code) is not int or code not in _STATUS_CODES:
        raise NotCanonical
    return code, _string(status.get("message", ""))


def decode_spans(
    tree: dict[str, Any], span_record: Callable[..., Any], event_record: Callable[..., Any]
) -> list[Any]:
    """The span records of one ``ExportTraceServiceRequest`` tree, built by ``span_record``
    (the fields of :class:`~traintel.exporters.reader.SpanRecord`, in order) and
    ``event_record``; :class:`NotCanonical` if any part of the tree is not canonical."""
    if len(tree) != 1:
        raise NotCanonical
    out = []
    for resource_spans in _list(tree["resourceSpans"]):
        body = _dict(resource_spans)
        if not body.keys() <= {"resource", "scopeSpans", "schemaUrl"}:
            raise NotCanonical
        if "schemaUrl" in body:
            _string(body["schemaUrl"])
        resource = _resource(body["resource"]) if "resource" in body else {}
        for scope_spans in _list(body.get("scopeSpans", [])):
            scope_body = _dict(scope_spans)
            if not scope_body.keys() <= {"scope", "spans", "schemaUrl"}:
                raise NotCanonical
            if "schemaUrl" in scope_body:
                _string(scope_body["schemaUrl"])
            scope = _scope_name(scope_body["scope"]) if "scope" in scope_body else ""
            for value in _list(scope_body.get("spans", [])):
                span = _dict(value)
                if not span.keys() <= _SPAN_KEYS:
                    raise NotCanonical
                _unread_span_fields(span)
                parent = _hex_id(span["parentSpanId"]) if "parentSpanId" in span else ""
                events = span.get("events")
                links = span.get("links")
                code, message = _status(span["status"]) if "status" in span else (0, "")
                out.append(
                    span_record(
                        _string(span.get("name", "")),
                        _hex_id(span.get("traceId", "")),
                        _hex_id(span.get("spanId", "")),
                        parent or None,
                        _uint64(span.get("startTimeUnixNano", "0")),
                        _uint64(span.get("endTimeUnixNano", "0")),
                        attributes(span["attributes"]) if "attributes" in span else {},
                        tuple(_event(e, event_record) for e in _list(events)) if events is not None else (),
                        tuple(_link(link) for link in _list(links)) if links is not None else (),
                        code,
                        message,
                        resource,
                        scope,
                    )
                )
    return out


def decode_tree(tree: object) -> tuple[str, dict[str, Any]]:
    """Which request a parsed line is (``"spans"`` or ``"metrics"``) and its tree."""
    if type(tree) is not dict:
        raise NotCanonical
    if "resourceSpans" in tree:
        return "spans", tree  # type: ignore[return-value]
    if "resourceMetrics" in tree:
        return "metrics", tree  # type: ignore[return-value]
    raise NotCanonical
