"""A span handle that forwards the whole Span API to the span it holds.

Why: what a ``with`` binds is sometimes more than the SDK span: a long phase whose span is
replaced at each trace segment (the handle follows the current one), or a checkpoint save that
also gives its writer's completion. Either stays a real :class:`~opentelemetry.trace.Span` for
the code that holds it.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.trace import Span, SpanContext, Status, StatusCode
from opentelemetry.util import types


class ForwardingSpan(Span):
    """Every Span method forwarded to ``current``."""

    def __init__(self, current: Span) -> None:
        self.current = current

    def end(self, end_time: int | None = None) -> None:
        self.current.end(end_time=end_time)

    def get_span_context(self) -> SpanContext:
        return self.current.get_span_context()

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        self.current.set_attributes(attributes)

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        self.current.set_attribute(key, value)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        self.current.add_event(name, attributes, timestamp)

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        self.current.add_link(context, attributes)

    def update_name(self, name: str) -> None:
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
