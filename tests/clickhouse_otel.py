"""traintel's OTLP/JSON files into the tables the OpenTelemetry Collector's ``clickhouse``
exporter writes, row for row as the exporter would write them (a test and benchmark helper).

Why a helper and not a ``traintel`` feature: a user with a collector gets these rows from the
exporter itself, and a user with files sends them there with ``traintel replay``; what is left
is the tests' need to put exactly those rows into an embedded ClickHouse (chdb) without a
collector. So this follows the exporter, not a design of ours:

* the tables are the exporter's default ones (deploy/clickhouse/otel_tables.sql says from where);
* every attribute value becomes a string as pdata's ``Value.AsString`` makes it: integers in
  decimal, doubles as Go's encoding/json writes them (ES6 number formatting: positional between
  1e-6 and 1e21, else ``1e-7`` style), booleans ``true``/``false``, arrays and maps as JSON;
* ``Duration`` is end minus start in nanoseconds, ``SpanKind`` and ``StatusCode`` are pdata's
  names (``Internal``, ``Unset``/``Ok``/``Error``), ids are lower-case hex, and the scope's
  name and version have their own columns.

Exponential histograms and summaries (traintel emits neither) are not loaded.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

_TABLES = Path(__file__).resolve().parent.parent / "deploy" / "clickhouse" / "otel_tables.sql"


def statements(sql: str) -> list[str]:
    """A SQL file's statements, comments dropped (each ends with a semicolon at a line's end)."""
    text = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [s for s in text.split(";\n") if s.strip()]


#: The exporter's default tables (``create_schema: true``), from deploy/clickhouse/otel_tables.sql.
DDL = tuple(statements(_TABLES.read_text()))

_SPAN_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
_STATUS_CODES = ("Unset", "Ok", "Error")
_SPAN_KIND_NAMES = {f"SPAN_KIND_{k.upper()}": k for k in _SPAN_KINDS}
_STATUS_NAMES = {"STATUS_CODE_UNSET": "Unset", "STATUS_CODE_OK": "Ok", "STATUS_CODE_ERROR": "Error"}


# --- pdata's Value.AsString -----------------------------------------------------------------------
def go_float(value: float) -> str:
    """A double as Go's encoding/json (and so pdata) writes it: ES6 number formatting."""
    if math.isnan(value) or math.isinf(value):
        return "json: unsupported value: " + (
            "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
        )
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        text = repr(value)  # shortest round-trip digits, exponent form like Go's 'e' with -1 digits
        mantissa, _, exponent = text.partition("e")
        sign, digits = exponent[0], exponent[1:]
        return f"{mantissa}e{sign}{digits.lstrip('0') if sign == '-' else digits}"  # e-07 -> e-7
    text = repr(value)  # shortest round-trip digits
    if "e" in text:  # Python writes 1e-05 and 1e+16 with an exponent, Go positionally
        text = format(decimal.Decimal(text), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _raw(any_value: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as pdata's AsRaw gives it (for arrays and maps, then JSON)."""
    if "stringValue" in any_value:
        return any_value["stringValue"]
    if "boolValue" in any_value:
        return bool(any_value["boolValue"])
    if "intValue" in any_value:
        return int(any_value["intValue"])
    if "doubleValue" in any_value:
        return _double(any_value["doubleValue"])
    if "arrayValue" in any_value:
        return [_raw(v) for v in any_value["arrayValue"].get("values", [])]
    if "kvlistValue" in any_value:
        return {kv["key"]: _raw(kv.get("value", {})) for kv in any_value["kvlistValue"].get("values", [])}
    if "bytesValue" in any_value:
        return base64.b64decode(any_value["bytesValue"])
    return None


def _double(value: Any) -> float:
    return float(value) if not isinstance(value, str) else float({"Infinity": "inf"}.get(value, value))


def _go_json(value: Any) -> str:
    """Go's json.Marshal of an AsRaw value: compact, map keys sorted, HTML characters escaped."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, bytes):
        return _go_json(base64.b64encode(value).decode())
    if isinstance(value, str):
        text = orjson.dumps(value).decode()
        return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    if isinstance(value, list):
        return "[" + ",".join(_go_json(v) for v in value) + "]"
    return "{" + ",".join(f"{_go_json(k)}:{_go_json(value[k])}" for k in sorted(value)) + "}"


def as_string(any_value: dict[str, Any]) -> str:
    """pdata's ``Value.AsString`` of an OTLP/JSON AnyValue."""
    if "stringValue" in any_value:
        return str(any_value["stringValue"])
    if "boolValue" in any_value:
        return "true" if any_value["boolValue"] else "false"
    if "intValue" in any_value:
        return str(int(any_value["intValue"]))
    if "doubleValue" in any_value:
        return go_float(_double(any_value["doubleValue"]))
    if "bytesValue" in any_value:
        return str(any_value["bytesValue"])  # already base64 in OTLP/JSON
    if "arrayValue" in any_value or "kvlistValue" in any_value:
        return _go_json(_raw(any_value))
    return ""


def attributes(key_values: Iterable[dict[str, Any]] | None) -> dict[str, str]:
    return {kv["key"]: as_string(kv.get("value") or {}) for kv in key_values or ()}


# --- rows -----------------------------------------------------------------------------------------
_EPOCH = datetime.datetime(1970, 1, 1)


@functools.lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    return f"{_EPOCH + datetime.timedelta(seconds=seconds):%Y-%m-%d %H:%M:%S}"


def _time(nanos: int | str) -> str:
    """A DateTime64(9) value as text ClickHouse reads exactly (UTC, nanosecond digits)."""
    seconds, fraction = divmod(int(nanos), 10**9)
    return f"{_second(seconds)}.{fraction:09d}"


def _hex_id(value: str | None, size: int) -> str:
    """Lower-case hex, or "" for an empty id (OTLP/JSON ids are hex; base64 ones are converted)."""
    if not value:
        return ""
    if len(value) == 2 * size:
        return value.lower()
    raw = base64.b64decode(value)
    return "" if not any(raw) else raw.hex()


def _enum(value: Any, names: tuple[str, ...], by_name: dict[str, str]) -> str:
    if isinstance(value, str):
        return by_name.get(value, value)
    return names[int(value or 0)] if 0 <= int(value or 0) < len(names) else str(value)


def span_rows(request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The exporter's rows for one ExportTraceServiceRequest (as OTLP/JSON)."""
    for resource_spans in request.get("resourceSpans", []):
        resource = attributes((resource_spans.get("resource") or {}).get("attributes"))
        service = resource.get("service.name", "")
        for scope_spans in resource_spans.get("scopeSpans", []):
            scope = scope_spans.get("scope") or {}
            for span in scope_spans.get("spans", []):
                start, end = int(span.get("startTimeUnixNano", 0)), int(span.get("endTimeUnixNano", 0))
                status = span.get("status") or {}
                events = span.get("events") or []
                links = span.get("links") or []
                yield {
                    "Timestamp": _time(start),
                    "TraceId": _hex_id(span.get("traceId"), 16),
                    "SpanId": _hex_id(span.get("spanId"), 8),
                    "ParentSpanId": _hex_id(span.get("parentSpanId"), 8),
                    "TraceState": span.get("traceState", ""),
                    "SpanName": span.get("name", ""),
                    "SpanKind": _enum(span.get("kind"), _SPAN_KINDS, _SPAN_KIND_NAMES),
                    "ServiceName": service,
                    "ResourceAttributes": resource,
                    "ScopeName": scope.get("name", ""),
                    "ScopeVersion": scope.get("version", ""),
                    "SpanAttributes": attributes(span.get("attributes")),
                    "Duration": max(0, end - start),  # pdata: the uint64 difference
                    "StatusCode": _enum(status.get("code"), _STATUS_CODES, _STATUS_NAMES),
                    "StatusMessage": status.get("message", ""),
                    "Events.Timestamp": [_time(e.get("timeUnixNano", 0)) for e in events],
                    "Events.Name": [e.get("name", "") for e in events],
                    "Events.Attributes": [attributes(e.get("attributes")) for e in events],
                    "Links.TraceId": [_hex_id(link.get("traceId"), 16) for link in links],
                    "Links.SpanId": [_hex_id(link.get("spanId"), 8) for link in links],
                    "Links.TraceState": [link.get("traceState", "") for link in links],
                    "Links.Attributes": [attributes(link.get("attributes")) for link in links],
                }


def _point_common(
    resource_metrics: dict[str, Any],
    scope_metrics: dict[str, Any],
    metric: dict[str, Any],
    point: dict[str, Any],
) -> dict[str, Any]:
    resource = attributes((resource_metrics.get("resource") or {}).get("attributes"))
    scope = scope_metrics.get("scope") or {}
    return {
        "ResourceAttributes": resource,
        "ResourceSchemaUrl": resource_metrics.get("schemaUrl", ""),
        "ScopeName": scope.get("name", ""),
        "ScopeVersion": scope.get("version", ""),
        "ScopeAttributes": attributes(scope.get("attributes")),
        "ScopeDroppedAttrCount": int(scope.get("droppedAttributesCount", 0)),
        "ScopeSchemaUrl": scope_metrics.get("schemaUrl", ""),
        "ServiceName": resource.get("service.name", ""),
        "MetricName": metric.get("name", ""),
        "MetricDescription": metric.get("description", ""),
        "MetricUnit": metric.get("unit", ""),
        "Attributes": attributes(point.get("attributes")),
        "StartTimeUnix": _time(point.get("startTimeUnixNano", 0)),
        "TimeUnix": _time(point.get("timeUnixNano", 0)),
        "Flags": int(point.get("flags", 0)),
    }


def _number(point: dict[str, Any]) -> float:
    return float(int(point["asInt"])) if "asInt" in point else _double(point.get("asDouble", 0.0))


def _temporality(value: Any) -> int:
    names = {"AGGREGATION_TEMPORALITY_DELTA": 1, "AGGREGATION_TEMPORALITY_CUMULATIVE": 2}
    return names.get(value, 0) if isinstance(value, str) else int(value or 0)


def metric_rows(request: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(table, row) for every gauge, sum and histogram point of one ExportMetricsServiceRequest."""
    for resource_metrics in request.get("resourceMetrics", []):
        for scope_metrics in resource_metrics.get("scopeMetrics", []):
            for metric in scope_metrics.get("metrics", []):
                for kind in ("gauge", "sum", "histogram"):
                    data = metric.get(kind)
                    if data is None:
                        continue
                    for point in data.get("dataPoints", []):
                        row = _point_common(resource_metrics, scope_metrics, metric, point)
                        if kind == "histogram":
                            row.update(
                                Count=int(point.get("count", 0)),
                                Sum=_double(point.get("sum", 0.0)),
                                BucketCounts=[int(c) for c in point.get("bucketCounts", [])],
                                ExplicitBounds=[_double(b) for b in point.get("explicitBounds", [])],
                                Min=_double(point.get("min", 0.0)),
                                Max=_double(point.get("max", 0.0)),
                                AggregationTemporality=_temporality(data.get("aggregationTemporality")),
                            )
                        else:
                            row["Value"] = _number(point)
                        if kind == "sum":
                            row["AggregationTemporality"] = _temporality(data.get("aggregationTemporality"))
                            row["IsMonotonic"] = bool(data.get("isMonotonic", False))
                        yield f"otel_metrics_{kind}", row


def rows_from_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(table, row) for every span and metric point in the OTLP/JSON-lines files (directories
    are searched for ``*.jsonl``); a line that is not a JSON object (a torn write) is skipped."""
    files: list[Path] = []
    for path in map(Path, paths):
        files.extend(sorted(path.rglob("*.jsonl")) if path.is_dir() else [path])
    for file in files:
        with file.open("rb") as lines:
            for line in lines:
                try:
                    request = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(request, dict):
                    continue
                for row in span_rows(request):
                    yield "otel_traces", row
                yield from metric_rows(request)


def load(session: Any, paths: Iterable[str | os.PathLike[str]], batch: int = 20_000) -> dict[str, int]:
    """Create the exporter's tables in a chdb session (if missing) and insert the files' rows;
    returns the rows inserted per table."""
    for statement in DDL:
        session.query(statement)
    pending: dict[str, list[bytes]] = {}
    counts: dict[str, int] = {}

    def flush(table: str) -> None:
        rows = pending.pop(table, [])
        if rows:
            session.query(f"INSERT INTO {table} FORMAT JSONEachRow\n" + b"\n".join(rows).decode())

    for table, row in rows_from_files(paths):
        pending.setdefault(table, []).append(orjson.dumps(row))
        counts[table] = counts.get(table, 0) + 1
        if len(pending[table]) >= batch:
            flush(table)
    for table in list(pending):
        flush(table)
    return counts
