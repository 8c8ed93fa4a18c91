"""Span ids chosen in advance, so a span can be exported after the fact under its real id.

Why: an iteration on the fast path is not an SDK span while it runs, but spans the user starts
inside it need a parent id. The iteration draws an id when first asked; if it is exported, its
SDK span is created later with exactly that id, so those children are not orphans. The SDK
picks ids through the tracer's ``IdGenerator``; this wrapper returns a forced id when one is
pending on the calling thread and asks the generator it wraps otherwise, for every part of the
interface (``is_trace_id_random`` included: the SDK sets the W3C random-trace-id flag from it).
"""

from __future__ import annotations

import os
import random
import threading
from typing import Any

from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

#: traintel's own generator, seeded from the OS (again in a forked child): the ``random``
#: module's shared state is what training code seeds (``seed_everything`` on every rank) and
#: saves and restores (Lightning's ``isolate_rng`` around its sanity check), so ids drawn from
#: it repeat.
_ids_random = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids_random.seed)
_random_bits = _ids_random.getrandbits


def new_span_id() -> int:
    """A random non-zero 64-bit span id, drawn as the SDK's ``RandomIdGenerator`` draws it
    without its call overhead (from traintel's own generator): an iteration draws its id when
    first asked, a window record when written."""
    span_id = _random_bits(64)
    while span_id == 0:
        span_id = _random_bits(64)
    return span_id


def new_trace_id() -> int:
    trace_id = _random_bits(128)
    while trace_id == 0:
        trace_id = _random_bits(128)
    return trace_id


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
        # bound once: the SDK asks for a span id on every span. The SDK's default generator
        # draws from the `random` module's shared state: traintel's own generator instead
        default = type(self.inner) is RandomIdGenerator
        self._inner_span_id = new_span_id if default else self.inner.generate_span_id
        self._inner_trace_id = new_trace_id if default else self.inner.generate_trace_id

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
