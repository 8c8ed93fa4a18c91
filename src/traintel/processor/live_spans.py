"""A span processor that knows which spans are open, and records phase durations.

Why a registry of live spans: an SDK span is frozen once it ends (DESIGN rule 5), so anything
traintel wants to put on a span — a model metric from ``record_metrics``, an event on the
enclosing loop — must go to a span that is still open. The registry maps span ids to open
spans, so code holding only the current span can walk up to its enclosing iteration or loop,
even through user spans in between. It holds open spans only: its size is bounded by nesting
depth and concurrency, never by the number of iterations.

Any span with ``ml.training.phase`` is understood, whoever created it (our context managers,
callbacks, or the user's plain ``tracer.start_as_current_span``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

from opentelemetry import metrics as metrics_api
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from traintel import semconv
from traintel.version import __version__

_logger = logging.getLogger(__name__)

#: Bucket boundaries in seconds: the SDK's defaults are for milliseconds and would put every
#: training step in the first bucket. Spans 1 ms to 2 h cover kernels to checkpoints.
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0,
    250.0, 500.0, 1000.0, 2500.0, 7200.0,
)  # fmt: skip


#: Open spans tracked at most. Only spans that are never ended (a leak in someone's code) can
#: reach it; past it, non-phase spans are no longer tracked, so memory stays bounded.
MAX_TRACKED_OPEN_SPANS = 100_000


class LiveSpanProcessor(SpanProcessor):
    """Tracks open spans by id and open phase counts; records ``ml.training.phase.duration``."""

    def __init__(self, meter_provider: metrics_api.MeterProvider | None = None) -> None:
        self._open: dict[int, Span] = {}
        self._phase_counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._enabled = True
        meter = (meter_provider or metrics_api.get_meter_provider()).get_meter(
            semconv.INSTRUMENTATION_SCOPE, __version__
        )
        self._phase_duration = meter.create_histogram(
            semconv.METRIC_PHASE_DURATION,
            unit="s",
            description="Wall time of each training phase span, by ml.training.phase.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS_S),
        )
        self._attribute_cache: dict[str, dict[str, str]] = {}
        self._overflow_warned = False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if not self._enabled:
            return
        context = span.get_span_context()
        phase = (span.attributes or {}).get(semconv.PHASE)
        if len(self._open) < MAX_TRACKED_OPEN_SPANS or phase is not None:
            self._open[context.span_id] = span
        elif not self._overflow_warned:
            self._overflow_warned = True
            _logger.warning(
                "traintel: %d spans are open at once (spans that are never ended?); "
                "no longer tracking spans without ml.training.phase",
                MAX_TRACKED_OPEN_SPANS,
            )
        if phase is not None:
            key = str(phase)
            with self._lock:
                self._phase_counts[key] = self._phase_counts.get(key, 0) + 1

    def on_end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        if context is None:
            return
        live = self._open.pop(context.span_id, None)
        phase = (span.attributes or {}).get(semconv.PHASE)
        if phase is None:
            return
        key = str(phase)
        if live is not None:
            with self._lock:
                remaining = self._phase_counts.get(key, 0) - 1
                if remaining > 0:
                    self._phase_counts[key] = remaining
                else:
                    self._phase_counts.pop(key, None)
        if not self._enabled or span.start_time is None or span.end_time is None:
            return
        attributes = self._attribute_cache.get(key)
        if attributes is None:
            attributes = self._attribute_cache.setdefault(key, {semconv.PHASE: key})
        self._phase_duration.record((span.end_time - span.start_time) / 1e9, attributes)

    def is_open(self, phase: str) -> bool:
        """Whether any span of ``phase`` is open right now (in any thread)."""
        return self._phase_counts.get(phase, 0) > 0

    def open_span(self, span_id: int) -> Span | None:
        return self._open.get(span_id)

    def enclosing(self, span_id: int, phases: Collection[str]) -> Span | None:
        """The nearest open span, starting at ``span_id`` and walking up, whose phase is in
        ``phases``; ``None`` when the chain leaves the registry first."""
        seen = 0
        span = self._open.get(span_id)
        while span is not None and seen < 256:  # 256: a cycle guard, not a real depth
            phase = (span.attributes or {}).get(semconv.PHASE)
            if phase is not None and phase in phases:
                return span
            parent = span.parent
            if parent is None:
                return None
            span = self._open.get(parent.span_id)
            seen += 1
        return None

    def open_count(self) -> int:
        return len(self._open)

    def disable(self) -> None:
        """Stop tracking (after traintel shut down); the SDK offers no way to remove us."""
        self._enabled = False
        self._open.clear()
        with self._lock:
            self._phase_counts.clear()

    def shutdown(self) -> None:
        self.disable()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
