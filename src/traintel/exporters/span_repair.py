"""Spans an OTLP encoder refuses, mended or dropped one by one, so one bad span never costs
the batch it is in.

Why: the encoders (protobuf for OTLP over gRPC and HTTP and for the spool; orjson, then
protobuf, for the embedded file) refuse a whole request when one span's name, event name or
status message is not valid Unicode, and the SDK lets such strings in: ``os.fsdecode`` gives
a Latin-1 file name as lone surrogates (``'\\udce9'``), and a span named after it lost its
batch of 512 in every exporter. An id that does not fit its field (a hand-edited or corrupt
file replayed) fails the same way.

Only after an encoding failed is a batch looked at span by span, so a healthy batch costs
nothing. A span that does not encode alone is copied with every string made valid (each lone
surrogate becomes U+FFFD) and every integer outside int64 written as its decimal string; it is
counted (``traintel.spans.repaired``) and said once. One that still does not encode is dropped
and counted (``traintel.spans.dropped{traintel.drop.reason=unencodable}``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link
from opentelemetry.trace.status import Status

from traintel.exporters import health as health_module
from traintel.exporters.health import ExportHealth

_logger = logging.getLogger(__name__)

_SURROGATE = re.compile("[\ud800-\udfff]")
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_said = False
T = TypeVar("T")


def mend_text(text: str) -> str:
    """``text`` with each lone surrogate (what ``os.fsdecode`` makes of a non-UTF-8 byte)
    replaced by U+FFFD, so it encodes as UTF-8."""
    return _SURROGATE.sub("\ufffd", text)


def _value(value: Any) -> Any:
    if isinstance(value, str):
        return mend_text(value)
    if isinstance(value, bool | float | bytes) or value is None:
        return value
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _INT64_MAX else str(value)
    return _container(value)


def _container(value: Any) -> Any:
    """A mapping or a sequence, each member mended; anything else as its mended text."""
    if isinstance(value, Mapping):
        return {mend_text(str(k)): _value(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return tuple(_value(item) for item in value)
    return mend_text(str(value))


def _attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {mend_text(str(key)): _value(value) for key, value in (attributes or {}).items()}


def _mended(span: ReadableSpan, resources: dict[int, Resource]) -> ReadableSpan:
    resource = span.resource
    mended_resource = resources.get(id(resource))
    if mended_resource is None:
        mended_resource = resources[id(resource)] = Resource(
            _attributes(resource.attributes), resource.schema_url
        )
    scope = span.instrumentation_scope
    if scope is not None:
        scope = InstrumentationScope(
            mend_text(scope.name),
            mend_text(scope.version) if scope.version else scope.version,
            scope.schema_url,
            _attributes(scope.attributes) or None,
        )
    status = span.status
    if status.description:
        status = Status(status.status_code, mend_text(status.description))
    return ReadableSpan(
        name=mend_text(span.name),
        context=span.context,
        parent=span.parent,
        resource=mended_resource,
        attributes=_attributes(span.attributes),
        events=[Event(mend_text(e.name), _attributes(e.attributes), e.timestamp) for e in span.events],
        links=[Link(link.context, _attributes(link.attributes)) for link in span.links],
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=scope,
    )


def _encodes(span: ReadableSpan) -> bool:
    try:
        encode_spans([span])
    except Exception:
        return False
    return True


def encodable(spans: Sequence[ReadableSpan], health: ExportHealth) -> list[ReadableSpan]:
    """``spans`` after their encoding failed: each span that encodes alone as it is, each
    other one mended or, if even that does not encode, left out; both counted in ``health``
    and the first said once."""
    out: list[ReadableSpan] = []
    resources: dict[int, Resource] = {}
    first: str | None = None
    repaired = dropped = 0
    for span in spans:
        if _encodes(span):
            out.append(span)
            continue
        mended = _mended_if_it_encodes(span, resources)
        if mended is not None:
            out.append(mended)
            repaired += 1
            first = first or f"span {mended.name!r} was sent with its invalid text replaced by U+FFFD"
        else:
            dropped += 1
            first = first or f"span {mend_text(str(span.name))!r} cannot be encoded and was dropped"
    _count_and_say(health, repaired, dropped, first)
    return out


def encoded_mending(
    encode: Callable[[Sequence[ReadableSpan]], T], spans: Sequence[ReadableSpan], health: ExportHealth
) -> tuple[Sequence[ReadableSpan], T | None]:
    """``encode(spans)``; if that raises, ``encode`` of the :func:`encodable` spans (what it
    raises then propagates). The spans encoded, and their encoding (``None``: none was left)."""
    try:
        return spans, encode(spans)
    except Exception:
        spans = encodable(spans, health)
        return spans, (encode(spans) if spans else None)


def _mended_if_it_encodes(span: ReadableSpan, resources: dict[int, Resource]) -> ReadableSpan | None:
    try:
        mended = _mended(span, resources)
    except Exception:
        return None
    return mended if _encodes(mended) else None


def _count_and_say(health: ExportHealth, repaired: int, dropped: int, first: str | None) -> None:
    """Count the mended and the dropped spans; say the first one, once per process."""
    global _said
    if repaired:
        health.add("spans_repaired", repaired)
    if dropped:
        health.drop_spans(health_module.UNENCODABLE, dropped)
    if first is not None and not _said:
        _said = True
        _logger.warning(
            "traintel: %s (a string that is not valid Unicode, an integer beyond int64 or an id "
            "that does not fit); the rest of its batch is exported as usual, and such spans are "
            "counted in traintel.spans.repaired and traintel.spans.dropped{unencodable}",
            first,
        )
