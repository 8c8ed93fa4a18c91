"""The hot path's context operations give exactly what the OpenTelemetry API gives."""

from __future__ import annotations

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, INVALID_SPAN_CONTEXT, NonRecordingSpan, SpanContext, TraceFlags

from traintel._recorder.engine import _span_context
from traintel._sdk import fastctx as fast


def test_with_span_and_current_span_match_the_api() -> None:
    span = NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(1)))
    base = context_api.set_value("user-key", "value", Context())
    ours = fast.with_span(span, base)
    theirs = trace.set_span_in_context(span, base)
    assert ours == theirs and type(ours) is type(theirs)
    assert base == {"user-key": "value"}  # the base context is not mutated
    assert fast.current_span(ours) is trace.get_current_span(theirs) is span
    assert fast.current_span(Context()) is trace.get_current_span(Context()) is INVALID_SPAN


def test_attach_detach_through_the_runtime_variable_is_seen_by_the_api() -> None:
    span = NonRecordingSpan(SpanContext(3, 4, False, TraceFlags(1)))
    before = context_api.get_current()
    token = fast.attach(fast.with_span(span, fast.get_current()))
    try:
        assert trace.get_current_span() is span
        assert fast.get_current() is context_api.get_current()
        api_token = context_api.attach(context_api.set_value("k", 1))  # nesting with the API works
        assert trace.get_current_span() is span
        context_api.detach(api_token)
    finally:
        fast.detach(token)
    assert context_api.get_current() == before
    assert fast.FAST  # the default ContextVar runtime context is what these tests run on


def test_span_context_fast_construction_equals_the_api() -> None:
    ours = _span_context(0xABC, 0xDEF, TraceFlags(1))
    theirs = SpanContext(0xABC, 0xDEF, False, TraceFlags(1))
    assert ours == theirs
    assert ours.is_valid and ours.trace_flags.sampled and not ours.is_remote
    assert ours.trace_state == theirs.trace_state
    assert ours != INVALID_SPAN_CONTEXT
