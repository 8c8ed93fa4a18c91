"""OpenTelemetry context operations for the per-step hot path.

Why: ``context.attach`` / ``trace.set_span_in_context`` / ``get_current_span`` each go through
several Python calls and dict copies (~1 µs apiece here); an iteration needs all three. When
the runtime context is the SDK's default (a ``ContextVar``, as it is unless
``OTEL_PYTHON_CONTEXT`` names another), the same operations are done on that variable directly.
Any other runtime context uses the public API unchanged. The results are identical: a test
checks both paths against each other.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.context.context import Context
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, Span


def _find_span_key() -> str:
    """The context key under which the API stores the current span (found, not imported)."""
    marker = NonRecordingSpan(trace_api.INVALID_SPAN_CONTEXT)
    context = trace_api.set_span_in_context(marker, Context())
    keys = [key for key, value in context.items() if value is marker]
    if len(keys) != 1:
        raise RuntimeError("cannot find the span key of the OpenTelemetry context")
    return keys[0]


SPAN_KEY = _find_span_key()


def _runtime_var() -> ContextVar[Context] | None:
    runtime = getattr(context_api, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    if isinstance(variable, ContextVar) and isinstance(variable.get(), Context):
        return variable
    return None


_VAR = _runtime_var()
FAST = _VAR is not None

get_current: Callable[[], Context]
attach: Callable[[Context], Any]
detach: Callable[[Any], None]
if _VAR is not None:
    get_current = _VAR.get
    attach = _VAR.set
    detach = _VAR.reset
else:  # pragma: no cover - only with a custom OTEL_PYTHON_CONTEXT
    get_current = context_api.get_current
    attach = context_api.attach
    detach = context_api.detach  # type: ignore[assignment]


_dict_setitem = dict.__setitem__


def with_span(span: Span, context: Context) -> Context:
    """``trace.set_span_in_context(span, context)`` in one dict copy (Context forbids item
    assignment only through its own ``__setitem__``; a fresh copy is not shared yet)."""
    new = Context(context)
    _dict_setitem(new, SPAN_KEY, span)
    return new


def current_span(context: Context) -> Span:
    """``trace.get_current_span(context)`` without the extra calls (only spans are stored under
    the key: the API's own setter is the only writer)."""
    span: Span | None = context.get(SPAN_KEY)  # type: ignore[assignment]
    return INVALID_SPAN if span is None else span
