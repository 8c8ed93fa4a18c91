"""SDK span operations for attributes traintel built itself (numbers and short strings).

Why: the SDK cleans every attribute value it is given (a recursive type check and a locked
store per key). For a user's attributes that is right. For the ``training_metrics_update``
event, ~60 floats traintel computed, it was most of a window close: 30 µs of SDK cleaning
against 2 µs to store the same event. These helpers store already-clean values straight into
the same SDK objects the public API builds (``BoundedAttributes``, ``Event``), within the
span's limits (``OTEL_*_ATTRIBUTE_COUNT_LIMIT``, ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``).

Anything they cannot vouch for takes the public API unchanged: a span that is not the SDK's,
a value that is not a plain ``str`` / ``bool`` / ``int`` / ``float``, more attributes than
the limit allows, a string longer than the value-length limit, or an SDK release whose
internals differ (checked once at import against the public path). A test compares the
exported result of both paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, SpanLimits, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

_PLAIN = frozenset((str, bool, int, float))
_IS_STR = str.__instancecheck__


def _clean_enough(
    attributes: Mapping[str, AttributeValue], maxlen: int | None, max_value_len: int | None
) -> bool:
    """True when the SDK's cleaning would keep ``attributes`` exactly as they are."""
    if maxlen is not None and len(attributes) > maxlen:
        return False
    values = attributes.values()
    if not set(map(type, values)) <= _PLAIN:
        return False
    if max_value_len is not None:
        strings: list[str] = list(filter(_IS_STR, values))  # type: ignore[arg-type]
        return all(len(v) <= max_value_len for v in strings)
    return True


def _bounded(
    attributes: Mapping[str, AttributeValue], maxlen: int | None, max_value_len: int | None, immutable: bool
) -> BoundedAttributes:
    """A ``BoundedAttributes`` holding ``attributes`` as given (as the SDK's own copy does)."""
    bounded = BoundedAttributes(maxlen, None, immutable=immutable, max_value_len=max_value_len)
    bounded._dict = dict(attributes)
    return bounded


def _sdk_layout_matches() -> bool:
    """The fast paths build what the public API builds, on this SDK release. Checked with a
    sampler and limits of its own: the environment's (OTEL_TRACES_SAMPLER, OTEL_*_LIMIT) say
    nothing about the layout and must not turn the fast path off."""
    try:
        limits = SpanLimits(
            max_span_attributes=128,
            max_event_attributes=128,
            max_events=128,
            max_attribute_length=SpanLimits.UNSET,
            max_span_attribute_length=SpanLimits.UNSET,
        )
        provider = TracerProvider(sampler=ALWAYS_ON, span_limits=limits, shutdown_on_exit=False)
        span = provider.get_tracer("traintel.check").start_span("check")
        if not isinstance(span, SdkSpan):
            return False
        attributes: dict[str, AttributeValue] = {"a": 1.5, "b": "x", "c": True, "d": 2}
        span.add_event("public", attributes, 7)
        span._add_event(
            Event(
                "fast",
                _bounded(attributes, limits.max_event_attributes, limits.max_attribute_length, True),
                7,
            )
        )
        public, fast = span.events
        span.set_attributes(attributes)
        locked = hasattr(span, "_lock") and hasattr(span, "_end_time")
        same_event = (
            dict(public.attributes or {}) == dict(fast.attributes or {})
            and public.timestamp == fast.timestamp
            and type(public.attributes) is type(fast.attributes)
            and public.dropped_attributes == fast.dropped_attributes
        )
        return (
            same_event
            and locked
            and isinstance(span._attributes, BoundedAttributes)
            and hasattr(span._attributes, "_dict")
        )
    except Exception:
        return False


FAST = _sdk_layout_matches()


def add_clean_event(
    span: Span, name: str, attributes: Mapping[str, AttributeValue], timestamp: int | None = None
) -> None:
    """``span.add_event(name, attributes, timestamp)`` without re-cleaning clean values."""
    if FAST and isinstance(span, SdkSpan):
        limits = span._limits
        maxlen, max_value_len = limits.max_event_attributes, limits.max_attribute_length
        if _clean_enough(attributes, maxlen, max_value_len):
            span._add_event(Event(name, _bounded(attributes, maxlen, max_value_len, True), timestamp))
            return
    span.add_event(name, attributes, timestamp)


def set_clean_attributes(span: Span, attributes: Mapping[str, AttributeValue]) -> None:
    """``span.set_attributes(attributes)`` without re-cleaning clean values (new keys only
    take the fast path when they all fit under the span's attribute count limit). Under the
    span's lock, as the SDK's own setter: an ended span is left as it is either way."""
    if FAST and isinstance(span, SdkSpan):
        own: Any = span._attributes
        maxlen = own.maxlen
        if _clean_enough(attributes, None, own.max_value_len):  # the span's value-length limit
            with span._lock:
                if (
                    span._end_time is None
                    and not own._immutable
                    and (maxlen is None or len(own) + len(attributes) <= maxlen)
                ):
                    own._dict.update(attributes)
                    return
    span.set_attributes(attributes)
