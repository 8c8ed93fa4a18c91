"""traintel's own tracer provider, the direct writer of its finished spans, and the Resource.

The pipelines around them (which exporters, spooling, the bounded exit) are assembled by the
runtime (``traintel._runtime.pipeline``): this package never imports the exporters.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanContext
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._sdk.otel_private import SpanWriter
from traintel.config import TrainingConfig
from traintel.resource_detectors import TrainingResourceDetector

_logger = logging.getLogger("traintel")


def build_resource(config: TrainingConfig, service_name: str | None = None) -> Resource:
    """The job's Resource: SDK defaults < detected identity < ``OTEL_*`` env < explicit args."""
    detected = TrainingResourceDetector(config).detect()
    _say_bad_pairs(os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    quiet = _SaidHere()  # the SDK reads the variable twice here, saying each bad pair each time
    _SDK_RESOURCE_LOGGER.addFilter(quiet)
    try:
        resource = Resource.create({}).merge(detected).merge(OTELResourceDetector().detect())
    finally:
        _SDK_RESOURCE_LOGGER.removeFilter(quiet)
    if service_name:
        resource = resource.merge(Resource({semconv.SERVICE_NAME: service_name}))
    elif str(resource.attributes.get(semconv.SERVICE_NAME, "")).startswith("unknown_service"):
        script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
        resource = resource.merge(Resource({semconv.SERVICE_NAME: script or "traintel"}))
    return resource


def _say_bad_pairs(text: str) -> None:
    """Each pair of ``OTEL_RESOURCE_ATTRIBUTES`` that is not ``key=value``, said once with the
    variable named (the pair is left out of the resource)."""
    bad = [pair.strip() for pair in text.split(",") if pair.strip() and "=" not in pair]
    if bad:
        said = "not key=value: left out of the resource"
        _logger.warning("traintel: OTEL_RESOURCE_ATTRIBUTES: %s %s", ", ".join(map(repr, bad)), said)


_SDK_RESOURCE_LOGGER = logging.getLogger("opentelemetry.sdk.resources")


class _SaidHere(logging.Filter):
    """The SDK's line for a bad pair, which names neither the variable nor its role, said by
    :func:`_say_bad_pairs` instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Invalid key value resource attribute pair")


def _is_unset_meter_provider(provider: object) -> bool:
    # The API hands out a proxy until a real provider is set; it has no public type.
    return type(provider).__name__ == "_ProxyMeterProvider"


class OwnedTracerProvider(TracerProvider):
    """traintel's own tracer provider: it knows whether a span processor was added beside
    traintel's (one the user added to the global provider, say), so traintel writes its own
    finished spans straight to the export path only while nobody else would see them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.others = 0  # processors added by anyone but traintel
        self._adding_ours = False

    def add_traintel_processor(self, processor: SpanProcessor) -> None:
        self._adding_ours = True
        try:
            self.add_span_processor(processor)
        finally:
            self._adding_ours = False

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        if not self._adding_ours:
            self.others += 1


@dataclass
class DirectSpans:
    """Where traintel's own finished spans go when it writes them itself: the export filter's
    path (trace budget, exporting processors), while the provider has no processor but ours."""

    writer: SpanWriter
    forward: Callable[[ReadableSpan], None]
    provider: OwnedTracerProvider

    def usable(self) -> bool:
        return self.provider.others == 0

    def write(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: Mapping[str, AttributeValue],
        start_ns: int,
        end_ns: int,
    ) -> None:
        self.forward(self.writer.span(name, context, parent, attributes, start_ns, end_ns))
