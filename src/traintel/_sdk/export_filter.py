"""The export filter: holds spans started inside an in-flight iteration until it is decided.

Why: whether an iteration is exported is known only when it ends (was it slow? did it fail?),
but spans the user starts inside it end earlier. The filter sits between the tracer provider
and the batch processors traintel built; it buffers every span whose ancestry leads to an
undecided iteration and, at the decision, forwards them all or drops them all. So an exported
iteration arrives whole (user spans included) and a dropped one leaves no orphan.

It also counts what it forwards per trace (spans and estimated OTLP bytes): the budget that
keeps each trace under the backends' limits.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanContext, StatusCode

from traintel._aggregation.otlp_size import estimate_span_bytes
from traintel._sdk.otel_private import forward_on_ending

_logger = logging.getLogger(__name__)

#: Spans held for one iteration at most; more are exported at once, whatever its decision
#: (memory stays bounded; nothing is lost, though a dropped iteration then leaves those orphans).
MAX_BUFFERED_PER_ITERATION = 10_000
#: Recently dropped iterations remembered, so their late-ending descendants are dropped too.
_DROPPED_MEMORY = 4096


def _no_op(self: object, span: object, parent_context: object = None) -> None:
    pass


def _is_no_op(method: object) -> bool:
    """True for a missing hook or one whose body is ``pass``: nothing to call."""
    if method is None:
        return True
    code = getattr(method, "__code__", None)
    return code is not None and code.co_code == _no_op.__code__.co_code and not code.co_names


#: Span kinds whose size is remembered; past this many the memory starts afresh (span names
#: are the user's, so their number is not ours to bound).
_MAX_KINDS = 512
#: A kind is sized again on every this-many-th span of it (the estimate walks attributes).
_RESIZE_EVERY = 16


class TraceBudget:
    """Spans and estimated bytes sent per trace, for the last few traces."""

    def __init__(self, keep: int = 64) -> None:
        self._usage: OrderedDict[int, list[int]] = OrderedDict()
        self._keep = keep
        self._lock = threading.Lock()
        self._last: tuple[int, list[int]] = (0, [0, 0])  # consecutive spans share a trace
        # Per span kind (name and status): [spans seen, its last size].
        self._kinds: dict[tuple[str, StatusCode], list[int]] = {}

    def add(self, span: ReadableSpan, context: SpanContext | None = None) -> None:
        """Count a span that is being exported (unsampled spans are not: they never leave).
        ``context``: the span's, when the caller has read it already."""
        if context is None:
            context = span.get_span_context()
        if context is None or not context.trace_flags.sampled:
            return
        trace_id = context.trace_id
        last_id, usage = self._last
        if trace_id != last_id:
            usage = self._switch_trace(trace_id)
        # Sizing a span walks its attributes (~2 µs for one, ~9 µs for 60), so a span stands for
        # the spans of its kind (a name and a status: a failed span carries its exception) until
        # the kind is sized again. Per kind: a trace's spans come in fixed cycles (an iteration's
        # phases, a window record every N iterations) in which one sample period for all kinds
        # can miss a large one every time. Unlocked: an estimate; concurrent ends of one trace
        # may lose an increment, not a span.
        kind = (span.name, span.status.status_code)
        sized = self._kinds.get(kind) or self._new_kind(kind)
        if sized[0] % _RESIZE_EVERY == 0:
            sized[1] = estimate_span_bytes(span)
        sized[0] += 1
        usage[0] += 1
        usage[1] += sized[1]

    def _switch_trace(self, trace_id: int) -> list[int]:
        """The usage of a trace other than the last span's (kept for the last ``keep``)."""
        found = self._usage.get(trace_id)
        if found is None:
            with self._lock:
                found = self._usage.get(trace_id)
                if found is None:
                    found = self._usage[trace_id] = [0, 0]
                    if len(self._usage) > self._keep:
                        self._usage.popitem(last=False)
        self._last = (trace_id, found)
        return found

    def _new_kind(self, kind: tuple[str, StatusCode]) -> list[int]:
        if len(self._kinds) >= _MAX_KINDS:
            self._kinds.clear()
        sized = self._kinds[kind] = [0, 0]
        return sized

    def usage(self, trace_id: int) -> tuple[int, int]:
        usage = self._usage.get(trace_id)
        return (usage[0], usage[1]) if usage is not None else (0, 0)


class IterationExportFilter(SpanProcessor):
    """Wraps the exporting processors; see the module docstring."""

    def __init__(self, processors: list[SpanProcessor], budget: TraceBudget) -> None:
        self._processors = processors
        self.budget = budget
        self._pending: dict[int, list[ReadableSpan]] = {}
        self._owner: dict[int, int] = {}
        self._dropped: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()
        self._open_children: dict[int, int] = {}
        # Only processors whose hooks do something are called for every span (the SDK's batch
        # and simple processors do nothing at start, and nothing while a span is ending).
        self._starting = [p for p in processors if not _is_no_op(getattr(type(p), "on_start", None))]
        forward_on_ending(self, processors)
        #: Returns the running fast-path iteration (set by the engine): its span id is the parent
        #: of spans the user starts inside it. Registering lazily, on the first such span, keeps
        #: iterations without user spans free of any filter work.
        self.active_iteration: Callable[[], Any] = lambda: None
        #: Waits (at most the given seconds) for the window pipeline (set by the runtime).
        self.before_flush: Callable[[float], object] = lambda timeout_s: None

    # --- decisions, from the iteration fast path ---------------------------------------------------
    def close_iteration(self, span_id: int, export: bool) -> None:
        """The decision for an iteration some user span was started in."""
        with self._lock:
            held = self._pending.pop(span_id, None) or []
            still_open = self._open_children.pop(span_id, 0)
            if not export and still_open:  # late-ending descendants must be dropped too
                self._dropped[span_id] = None
                if len(self._dropped) > _DROPPED_MEMORY:
                    self._dropped.popitem(last=False)
        if export:
            for span in held:
                self.forward(span)

    # --- SpanProcessor ---------------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        owner = self._owner
        # nothing held: only a span started directly in a running iteration is news
        if owner or self.active_iteration() is not None:
            self._track(span, owner)
        for processor in self._starting:
            processor.on_start(span, parent_context=parent_context)

    def _track(self, span: Span, owner: dict[int, int]) -> None:
        """Hold ``span`` if its parent is a deferred iteration, or a span already held."""
        parent = span.parent
        if parent is None:
            return
        parent_id = parent.span_id
        root = owner.get(parent_id)
        active = None
        if root is None:
            active = self.active_iteration()
            if active is None or not active.owns(parent_id):
                return
            root = active.span_id
            # Flagged before it is looked at again: the engine stops naming an iteration active
            # before it reads the flag, so one still active here will have its decision release
            # what is held. One that ended meanwhile (the span was started on another thread)
            # may have been decided without the flag: its span goes out as any other, rather
            # than wait for a decision that never comes.
            active.hold_user_spans()
        with self._lock:
            if active is not None:
                if self.active_iteration() is not active:
                    return
                self._pending.setdefault(root, [])
            owner[span.get_span_context().span_id] = root
            self._open_children[root] = self._open_children.get(root, 0) + 1

    def on_end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        if self._owner and context is not None:
            with self._lock:
                root = self._owner.pop(context.span_id, None)
                if root is not None:
                    remaining = self._open_children.get(root, 0) - 1
                    if remaining > 0:
                        self._open_children[root] = remaining
                    else:
                        self._open_children.pop(root, None)
                    held = self._pending.get(root)
                    if held is not None and len(held) < MAX_BUFFERED_PER_ITERATION:
                        held.append(span)
                        return
                    if held is None and root in self._dropped:  # its iteration was not exported
                        return
        self.forward(span, context)

    def forward(self, span: ReadableSpan, context: SpanContext | None = None) -> None:
        """Count ``span`` in its trace's budget and hand it to the exporting processors."""
        self.budget.add(span, context)
        for processor in self._processors:
            processor.on_end(span)

    def shutdown(self) -> None:
        for processor in self._processors:
            processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """The windows closed so far first (their records join what is flushed: a job killed
        right after a flush of the provider keeps them), then the exporting processors."""
        self.before_flush(timeout_millis / 1000)
        return all(processor.force_flush(timeout_millis) for processor in self._processors)
