"""OTLP/JSON encoding of export requests, per the OpenTelemetry file-exporter format.

Why the proto encoders and not a hand-written serialiser: the SDK's own
``opentelemetry-exporter-otlp-proto-common`` builds exactly the request a collector receives,
and ``google.protobuf.json_format`` prints the canonical JSON mapping. The one difference the
OTLP/JSON spec makes is that trace and span ids are lowercase hex, not base64; we rewrite
those keys on the way out and back on the way in, so a file line is a valid OTLP/JSON
``Export*ServiceRequest`` that a collector's ``otlpjsonfile`` receiver or ``traintel replay``
can send on.

Spans, the bulk of a file, are the exception: that path costs the export thread tens of
microseconds of GIL per span, so they are written directly from the SDK's span objects
(:mod:`traintel.exporters.otlp_json_spans`), with the same content. Metrics stay on the proto
path: one request per collection interval, not a stream; so do log records (a hang report).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan

from traintel._sdk import otel_private
from traintel.exporters.otlp_json_spans import FastPathUnsupported, spans_to_json_bytes
from traintel.exporters.records import DecodeError

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})

ExportRequest = ExportTraceServiceRequest | ExportMetricsServiceRequest | ExportLogsServiceRequest


def _rewrite_ids(node: Any, convert: Any) -> None:
    """Rewrite every id key in a decoded JSON tree in place (spans, links, exemplars)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = convert(value)
            else:
                _rewrite_ids(value, convert)
    elif isinstance(node, list):
        for item in node:
            _rewrite_ids(item, convert)


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def request_to_json_line(request: ExportRequest) -> str:
    """One OTLP/JSON line (no trailing newline) for an export request."""
    tree = json_format.MessageToDict(request, use_integers_for_enums=True)
    _rewrite_ids(tree, _b64_to_hex)
    return json.dumps(tree, separators=(",", ":"), ensure_ascii=False)


def spans_to_json_line(spans: Sequence[ReadableSpan]) -> str:
    """One OTLP/JSON trace line, written straight from the spans (:mod:`.otlp_json_spans`);
    a batch holding a value that path leaves to the SDK goes the proto way instead."""
    try:
        return spans_to_json_bytes(spans).decode("utf-8")
    except FastPathUnsupported:
        return proto_spans_to_json_line(spans)


def proto_spans_to_json_line(spans: Sequence[ReadableSpan]) -> str:
    """The reference encoding (the SDK's proto request, printed by ``json_format``): the
    fallback of :func:`spans_to_json_line`, and what tests compare it with."""
    return request_to_json_line(encode_spans(spans))


def metrics_to_json_line(metrics_data: MetricsData) -> str:
    return request_to_json_line(encode_metrics(metrics_data))


def logs_to_json_line(batch: Sequence[otel_private.ReadableLogRecord]) -> str:
    """One OTLP/JSON logs line (a few records at most: traintel's hang reports)."""
    return request_to_json_line(otel_private.encode_logs(batch))


def json_line_to_request(line: str) -> ExportRequest:
    """Parse one line back into the proto request it encodes (trace, metrics or logs)."""
    try:
        tree = json.loads(line)
    except (ValueError, RecursionError) as exc:  # ValueError: also an integer of 5,000 digits
        raise DecodeError(f"not JSON: {_short(exc)}") from None
    if not isinstance(tree, dict):
        raise DecodeError("not a JSON object")
    request: ExportRequest
    if "resourceSpans" in tree:
        request = ExportTraceServiceRequest()
    elif "resourceMetrics" in tree:
        request = ExportMetricsServiceRequest()
    elif "resourceLogs" in tree:
        request = ExportLogsServiceRequest()
    else:
        raise DecodeError("neither resourceSpans, resourceMetrics nor resourceLogs")
    try:
        _rewrite_ids(tree, _hex_to_b64)
        json_format.ParseDict(tree, request, ignore_unknown_fields=True)
    except Exception as exc:  # whatever the parser makes of hostile input (upb raised SystemError)
        raise DecodeError(f"not an OTLP request: {_short(exc)}") from None
    return request


def _short(exc: BaseException) -> str:
    """An error's message for a skip reason: a hostile line can make it huge."""
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "..."
