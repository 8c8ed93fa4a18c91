"""Segmented traces: a long run continues in new traces, linked, each closed within its period.

Why: backends assume a trace finishes in minutes. A training run of days as one trace has a
root that arrives last or never, blows Tempo's per-trace byte limit and Jaeger's UI. So every
``segment_iterations`` training iterations or ``segment_seconds`` (or before the span budget
is reached), the open ``application`` and ``training_loop`` spans end and continue as new root
``application`` / child ``training_loop`` spans in a fresh trace, linked to the previous
segment and to the run's first ``application`` span, carrying the segment index and iteration
range. A short run never rotates and is exactly one trace.

The user holds a :class:`SegmentedSpan`: a span handle that always forwards to the current
segment, so ``span.set_attribute(...)`` after a rotation still lands, and spans started under
it (through the context it was attached in) parent to the current segment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode
from opentelemetry.util import types

from traintel import semconv
from traintel._sdk.export_filter import estimate_attributes_bytes
from traintel._sdk.otel_private import add_clean_event


def span_event_limit() -> int | None:
    """The events an SDK span keeps (``OTEL_SPAN_EVENT_COUNT_LIMIT``, 128 by default); None:
    no limit."""
    return SpanLimits().max_events


class SegmentedSpan(Span):
    """A stable handle on a phase whose SDK span is replaced at each segment boundary."""

    def __init__(self, first: Span, name: str, attributes: Mapping[str, types.AttributeValue] | None) -> None:
        self.current = first
        self.first_context = self._context = first.get_span_context()
        self.name = name
        self.start_attributes = dict(attributes or {})
        self.segment_index = 0
        self.segment_start_ns = 0
        self.segment_first_iteration: int | None = None
        self.segment_last_iteration: int | None = None
        self.segment_iterations = 0
        #: Estimated OTLP bytes of the events on the open segment: they reach the trace only
        #: when the segment ends, but count against its budget now.
        self.open_bytes = 0
        #: Events on the open segment: the SDK drops those beyond the span's event limit.
        self.open_events = 0

    # --- Span API: forward to the current segment -------------------------------------------------
    def end(self, end_time: int | None = None) -> None:
        self.current.end(end_time=end_time)

    def get_span_context(self) -> SpanContext:
        return self._context  # the current segment's; read once per iteration, so cached

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        self.current.set_attributes(attributes)

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        self.current.set_attribute(key, value)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        self.open_events += 1
        self.open_bytes += 24 + len(name) + estimate_attributes_bytes(attributes)
        self.current.add_event(name, attributes, timestamp)

    def add_clean_event(
        self, name: str, attributes: Mapping[str, types.AttributeValue], timestamp: int | None = None
    ) -> None:
        """``add_event`` for attributes traintel computed (plain numbers and strings): stored
        without the SDK's per-value cleaning (see ``traintel._sdk.otel_private``)."""
        self.open_events += 1
        self.open_bytes += 24 + len(name) + estimate_attributes_bytes(attributes)
        add_clean_event(self.current, name, attributes, timestamp)

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        self.current.add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self.name = name
        self.current.update_name(name)

    def is_recording(self) -> bool:
        return self.current.is_recording()

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self.current.set_status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        self.current.record_exception(exception, attributes, timestamp, escaped)

    def __repr__(self) -> str:
        return f"SegmentedSpan({self.name!r}, segment={self.segment_index}, current={self.current!r})"

    # --- segment bookkeeping --------------------------------------------------------------------
    def close_segment(self, end_ns: int, continues: bool, spans: int = 0, estimated_bytes: int = 0) -> None:
        """Mark and end the current segment's span."""
        span = self.current
        attributes: dict[str, types.AttributeValue] = {
            semconv.SEGMENT_INDEX: self.segment_index,
            semconv.SEGMENT_CONTINUES: continues,
        }
        if self.segment_first_iteration is not None and self.segment_last_iteration is not None:
            attributes[semconv.SEGMENT_FIRST_ITERATION] = self.segment_first_iteration
            attributes[semconv.SEGMENT_LAST_ITERATION] = self.segment_last_iteration
        if spans:
            attributes[semconv.SEGMENT_SPANS] = spans
            attributes[semconv.SEGMENT_BYTES] = estimated_bytes
        span.set_attributes(attributes)
        if continues:
            span.end(end_time=end_ns)

    def start_next(
        self,
        tracer: trace_api.Tracer,
        start_ns: int,
        parent: Span | None,
        links: Sequence[SpanContext],
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Continue in a new span: a root (new trace) unless ``parent`` is given."""
        self.segment_index += 1
        attributes = dict(self.start_attributes)
        attributes[semconv.SEGMENT_INDEX] = self.segment_index
        attributes.update(extra or {})
        context = trace_api.set_span_in_context(parent) if parent is not None else Context()
        self.current = tracer.start_span(
            self.name,
            context=context,
            attributes=attributes,
            links=[Link(link) for link in links if link.is_valid],
            start_time=start_ns,
        )
        self._context = self.current.get_span_context()
        self.segment_start_ns = start_ns
        self.segment_first_iteration = None
        self.segment_last_iteration = None
        self.segment_iterations = 0
        self.open_bytes = 0
        self.open_events = 0
