"""Carry the OpenTelemetry context into other threads.

Why: OTel context lives in ``contextvars``, which a new thread or a pool worker does not
inherit. An async checkpoint writer or a prefetcher started inside ``checkpoint_save`` would
otherwise create root spans in a trace of their own instead of children of the save.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from opentelemetry import context as context_api

__all__ = ["ContextThreadPoolExecutor", "submit_with_context", "wrap_with_context"]

P = ParamSpec("P")
R = TypeVar("R")


def wrap_with_context(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` bound to the caller's current context: wherever it runs, spans it starts
    are children of the span that was current here."""
    captured = context_api.get_current()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        token = context_api.attach(captured)
        try:
            return fn(*args, **kwargs)
        finally:
            context_api.detach(token)

    return run


class ContextThreadPoolExecutor(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` whose tasks run in the context of the ``submit`` call."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        return super().submit(wrap_with_context(fn), *args, **kwargs)


def submit_with_context(executor: Any, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
    """``executor.submit`` with the caller's context, for executors you do not construct."""
    future: Future[R] = executor.submit(wrap_with_context(fn), *args, **kwargs)
    return future
