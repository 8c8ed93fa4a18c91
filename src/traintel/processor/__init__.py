"""Span processors: turn training spans into state and metrics (never imports torch)."""

from traintel.processor.live_spans import DURATION_BUCKETS_S, LiveSpanProcessor

__all__ = ["DURATION_BUCKETS_S", "LiveSpanProcessor"]
