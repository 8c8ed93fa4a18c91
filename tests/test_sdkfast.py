"""Storing traintel's own attributes without the SDK's per-value cleaning gives exactly what
the public API gives, within the span's limits; anything else takes the public API."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from traintel._sdk import sdkfast as _sdkfast

WINDOW: dict[str, AttributeValue] = {
    **{f"ml.training.window.value{i}": i / 7 for i in range(50)},
    "ml.training.window.iterations": 50,
    "ml.training.window.final": True,
    "ml.training.throughput.aggregation": "rank x world_size (1)",
}


def _two_spans(limits: SpanLimits | None = None) -> tuple[ReadableSpan, ReadableSpan]:
    """The same event and attributes through the public API and through the fast path."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    public = tracer.start_span("public", start_time=1)
    public.add_event("training_metrics_update", WINDOW, timestamp=5)
    public.set_attributes(WINDOW)
    public.end(end_time=9)
    fast = tracer.start_span("fast", start_time=1)
    _sdkfast.add_clean_event(fast, "training_metrics_update", WINDOW, timestamp=5)
    _sdkfast.set_clean_attributes(fast, WINDOW)
    fast.end(end_time=9)
    first, second = exporter.get_finished_spans()
    return first, second


def _same(public: ReadableSpan, fast: ReadableSpan) -> None:
    assert dict(fast.attributes or {}) == dict(public.attributes or {})
    assert list(fast.attributes or {}) == list(public.attributes or {})  # same order
    assert fast.dropped_attributes == public.dropped_attributes
    assert len(fast.events) == len(public.events) == 1
    ours, theirs = fast.events[0], public.events[0]
    assert (ours.name, ours.timestamp) == (theirs.name, theirs.timestamp)
    assert dict(ours.attributes or {}) == dict(theirs.attributes or {})
    assert type(ours.attributes) is type(theirs.attributes)
    assert ours.dropped_attributes == theirs.dropped_attributes
    with pytest.raises(TypeError):  # event attributes stay immutable, as the SDK makes them
        ours.attributes["x"] = 1  # type: ignore[index]


def test_clean_attributes_and_events_equal_the_public_api() -> None:
    assert _sdkfast.FAST  # this SDK's layout is the one the fast path was checked against
    public, fast = _two_spans()
    _same(public, fast)
    assert len(fast.attributes or {}) == len(WINDOW)


@pytest.mark.parametrize(
    "limits",
    [
        SpanLimits(max_event_attributes=10, max_span_attributes=12),  # fewer than the window has
        SpanLimits(max_attribute_length=5),  # the aggregation string is longer
        SpanLimits(max_span_attribute_length=5),  # span values only: events keep theirs whole
    ],
)
def test_over_the_span_limits_the_public_api_applies_them(limits: SpanLimits) -> None:
    public, fast = _two_spans(limits)
    _same(public, fast)
    assert (
        public.dropped_attributes
        or public.events[0].dropped_attributes
        or any(isinstance(v, str) and len(v) == 5 for v in (public.attributes or {}).values())
    )


def test_values_that_need_cleaning_take_the_public_api() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("test").start_span("s")
    _sdkfast.add_clean_event(span, "e", {"list": [1, 2], "n": 1})  # type: ignore[dict-item]
    _sdkfast.set_clean_attributes(span, {"list": [3, 4]})  # type: ignore[dict-item]
    span.end()
    (finished,) = exporter.get_finished_spans()
    assert finished.events[0].attributes == {"list": (1, 2), "n": 1}  # cleaned to a tuple
    assert finished.attributes == {"list": (3, 4)}


def test_a_span_that_is_not_the_sdks_takes_the_public_api() -> None:
    span = NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(1)))
    _sdkfast.add_clean_event(span, "e", {"a": 1})  # a no-op span: nothing to store, no error
    _sdkfast.set_clean_attributes(span, {"a": 1})


def test_an_ended_span_is_not_changed() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("test").start_span("s")
    span.end()
    _sdkfast.add_clean_event(span, "late", {"a": 1})
    _sdkfast.set_clean_attributes(span, {"a": 1})
    (finished,) = exporter.get_finished_spans()
    assert not finished.events and not finished.attributes


def test_the_layout_check_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job run with OTEL_TRACES_SAMPLER=always_off or tight OTEL_*_LIMIT settings still gets
    the fast path (which applies the limits of each span it writes to)."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    monkeypatch.setenv("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "1")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "0")
    assert _sdkfast._sdk_layout_matches()
