"""OTLP trace requests back into SDK spans, so any configured ``SpanExporter`` can send them.

Why back to ``ReadableSpan`` and not raw proto over our own gRPC/HTTP client: the standard
OTLP exporters already read every ``OTEL_EXPORTER_OTLP_*`` setting (endpoint, headers,
certificate, compression, timeout, retries). Handing them spans reuses all of that for the
spool's resend and for ``traintel replay``, instead of a second, subtly different client.
The round trip keeps names, ids, parents, times, kinds, status, attributes, events and links;
it loses only the dropped-item counts, which the SDK does not let us set.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from traintel.exporters.reader import any_value

#: OTLP's span flags: the W3C trace flags in the low byte, "parent is remote" in bit 9.
_TRACE_FLAGS_MASK = 0xFF
_PARENT_IS_REMOTE = 0x200
#: OTLP's span kinds as the SDK's (``SPAN_KIND_UNSPECIFIED``, and any other number, read as internal).
_KINDS = {ProtoSpan.SpanKind.Value(f"SPAN_KIND_{kind.name}"): kind for kind in SpanKind}


def _attribute(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _attributes(attributes: Sequence[KeyValue]) -> dict[str, Any]:
    return {kv.key: _attribute(any_value(kv.value)) for kv in attributes}


def _flags(span_flags: int) -> TraceFlags:
    # Spans without flags (older senders) were sampled, or they would not have been exported.
    return TraceFlags(span_flags & _TRACE_FLAGS_MASK if span_flags else TraceFlags.SAMPLED)


def _trace_state(raw: str) -> TraceState:
    return TraceState.from_header([raw]) if raw else TraceState()


class InvalidSpanError(ValueError):
    """A span that decodes but holds a value no span can have (a status code outside 0-2,
    say: one flipped bit in a spooled file). Its batch cannot be sent as it is."""


def readable_span(span: ProtoSpan, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """One span as an SDK span; raises :class:`InvalidSpanError` if it cannot be one."""
    try:
        return _convert(span, resource, scope)
    except Exception as exc:
        raise InvalidSpanError(f"span {span.name!r} ({span.span_id.hex() or 'no id'}): {exc}") from exc


#: The sizes OTLP gives trace and span ids: an id of any other length has no SDK span (and no
#: encoder takes it back: a 9-byte span id raised OverflowError in the middle of a replay).
_TRACE_ID_BYTES = 16
_SPAN_ID_BYTES = 8


def _id(value: bytes, size: int, what: str) -> int:
    if len(value) != size:
        raise ValueError(f"{what} of {len(value)} bytes, expected {size}")
    return int.from_bytes(value, "big")


def _convert(span: ProtoSpan, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    trace_id = _id(span.trace_id, _TRACE_ID_BYTES, "trace id")
    flags = _flags(span.flags)
    context = SpanContext(
        trace_id,
        _id(span.span_id, _SPAN_ID_BYTES, "span id"),
        is_remote=False,
        trace_flags=flags,
        trace_state=_trace_state(span.trace_state),
    )
    parent = None
    if span.parent_span_id:
        parent = SpanContext(
            trace_id,
            _id(span.parent_span_id, _SPAN_ID_BYTES, "parent span id"),
            is_remote=bool(span.flags & _PARENT_IS_REMOTE),
            trace_flags=flags,
        )
    links = [
        Link(
            SpanContext(
                _id(link.trace_id, _TRACE_ID_BYTES, "linked trace id"),
                _id(link.span_id, _SPAN_ID_BYTES, "linked span id"),
                is_remote=True,
                trace_flags=_flags(link.flags),
                trace_state=_trace_state(link.trace_state),
            ),
            _attributes(link.attributes),
        )
        for link in span.links
    ]
    return ReadableSpan(
        name=span.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=_attributes(span.attributes),
        events=[Event(e.name, _attributes(e.attributes), e.time_unix_nano) for e in span.events],
        links=links,
        kind=_KINDS.get(span.kind, SpanKind.INTERNAL),
        status=Status(StatusCode(span.status.code), span.status.message or None),
        start_time=span.start_time_unix_nano,
        end_time=span.end_time_unix_nano,
        instrumentation_scope=scope,
    )


def _groups(request: ExportTraceServiceRequest) -> Iterator[tuple[Any, Resource, Any, InstrumentationScope]]:
    """Each resource's and scope's spans of one request: the proto groups, with the resource and
    scope as the SDK's (each built once per group, not per span)."""
    for resource_spans in request.resource_spans:
        resource = Resource(_attributes(resource_spans.resource.attributes), resource_spans.schema_url)
        for scope_spans in resource_spans.scope_spans:
            scope = InstrumentationScope(
                scope_spans.scope.name,
                scope_spans.scope.version or None,
                scope_spans.schema_url or None,
                _attributes(scope_spans.scope.attributes) or None,
            )
            yield resource_spans, resource, scope_spans, scope


def proto_spans(
    request: ExportTraceServiceRequest,
) -> Iterator[tuple[ProtoSpan, Resource, InstrumentationScope]]:
    """Every span of one OTLP trace export request, with its resource and scope as the SDK's."""
    for _, resource, scope_spans, scope in _groups(request):
        for span in scope_spans.spans:
            yield span, resource, scope


def split_invalid(
    request: ExportTraceServiceRequest,
) -> tuple[ExportTraceServiceRequest, ExportTraceServiceRequest, list[str]]:
    """``request`` as two requests: the spans that can be SDK spans, and those that cannot,
    each with its resource and scope; and why each of the latter cannot. One span with a bad
    id is then set aside alone instead of its batch."""
    good, bad = ExportTraceServiceRequest(), ExportTraceServiceRequest()
    reasons: list[str] = []
    #: (the resource's group in ``request``, valid) -> its copy in ``good`` or ``bad``
    copied: dict[tuple[int, bool], Any] = {}
    for resource_spans, resource, scope_spans, scope in _groups(request):
        copies: dict[bool, Any] = {}
        for span in scope_spans.spans:
            try:
                readable_span(span, resource, scope)
                valid = True
            except InvalidSpanError as exc:
                reasons.append(str(exc))
                valid = False
            if valid not in copies:
                key = (id(resource_spans), valid)
                if key not in copied:
                    copied[key] = (good if valid else bad).resource_spans.add(
                        resource=resource_spans.resource, schema_url=resource_spans.schema_url
                    )
                copies[valid] = copied[key].scope_spans.add(
                    scope=scope_spans.scope, schema_url=scope_spans.schema_url
                )
            copies[valid].spans.append(span)
    return good, bad, reasons
