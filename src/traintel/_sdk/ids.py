"""Span ids chosen in advance, so a span can be exported after the fact under its real id.

Why: an iteration on the fast path is not an SDK span while it runs, but spans the user starts
inside it need a parent id. The iteration draws an id when first asked; if it is exported, its
SDK span is created later with exactly that id, so those children are not orphans. The SDK
picks ids through the tracer's ``IdGenerator``; this wrapper returns a forced id when one is
pending on the calling thread and asks the generator it wraps otherwise, for every part of the
interface (``is_trace_id_random`` included: the SDK sets the W3C random-trace-id flag from it).
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator


class _Forced(threading.local):
    """The ids queued for this thread's next span (class-level defaults: a thread that never
    forced one reads ``None`` here instead of raising and catching an AttributeError)."""

    span_id: int | None = None
    trace_id: int | None = None


class ForcingIdGenerator(IdGenerator):
    """Delegates to ``inner`` unless :meth:`force` queued ids for this thread's next span."""

    def __init__(self, inner: IdGenerator | None = None) -> None:
        self.inner = inner or RandomIdGenerator()
        self._local = _Forced()
        # bound once: the SDK asks for a span id on every span
        self._inner_span_id = self.inner.generate_span_id
        self._inner_trace_id = self.inner.generate_trace_id

    def force(self, span_id: int, trace_id: int | None = None) -> None:
        """The next span started on this thread gets ``span_id`` (and ``trace_id`` if a root)."""
        self._local.span_id = span_id
        self._local.trace_id = trace_id

    def clear(self) -> None:
        self._local.span_id = None
        self._local.trace_id = None

    def generate_span_id(self) -> int:
        local = self._local
        forced = local.span_id
        if forced is not None:
            local.span_id = None
            return forced
        return self._inner_span_id()

    def generate_trace_id(self) -> int:
        local = self._local
        forced = local.trace_id
        if forced is not None:
            local.trace_id = None
            return forced
        return self._inner_trace_id()

    def is_trace_id_random(self) -> bool:
        """The wrapped generator's answer (forced ids were drawn from it too)."""
        method = getattr(self.inner, "is_trace_id_random", None)
        return bool(method()) if method is not None else False

    def __getattr__(self, name: str) -> Any:
        """Anything a later SDK adds to the interface, or the user's generator offers."""
        if name in ("inner", "_local"):  # not set yet: never forward these
            raise AttributeError(name)
        return getattr(self.inner, name)
