"""What a set of span attributes weighs in OTLP, estimated: the trace budget's arithmetic.

Why an estimate: sizing a span exactly means encoding it, and the budget is checked while
training runs. Pure: no OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def estimate_attributes_bytes(attributes: Mapping[str, Any] | None) -> int:
    """OTLP size of a set of attributes: per KeyValue its key, its value (a string as long as
    it is, a number up to 9 bytes, an array per element) and ~8 bytes of framing. C-level
    passes over keys and values: the loop's window events have ~60 attributes."""
    if not attributes:
        return 0
    values = attributes.values()
    size = sum(map(len, attributes)) + 17 * len(attributes)
    kinds = set(map(type, values))  # one pass: plain scalars need no array walk
    arrays = not kinds <= _SCALARS
    if str in kinds or arrays:
        size += _strings_bytes(list(filter(_IS_STR, values)))
    if arrays:
        size += _arrays_bytes(values)
    return size


def _strings_bytes(strings: list[str]) -> int:
    return sum(map(len, strings)) + sum(3 * len(v) for v in strings if not v.isascii())  # UTF-8: up to 4 B


def _arrays_bytes(values: Iterable[Any]) -> int:
    size = 0
    for kind in (tuple, list):
        for array in filter(kind.__instancecheck__, values):
            size += sum(len(v) + 2 if isinstance(v, str) else 10 for v in array)
    return size


_IS_STR = str.__instancecheck__
_SCALARS = frozenset({str, bool, int, float, type(None)})


def estimate_span_bytes(span: Any) -> int:
    """An estimate of a span's OTLP protobuf size, on the high side (the budget is a limit):
    ids, parent, times, kind, status and framing (~90 B), the name, attributes, events (~24 B
    each with name and attributes) and links (~44 B each with attributes). Checked against the
    real encoding in the tests. ``span``: an SDK ``ReadableSpan`` (read by its attributes)."""
    size = 90 + len(span.name) + estimate_attributes_bytes(span.attributes)
    for event in span.events:
        size += 24 + len(event.name) + estimate_attributes_bytes(event.attributes)
    for link in span.links:
        size += 44 + estimate_attributes_bytes(link.attributes)
    return size
