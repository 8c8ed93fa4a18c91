"""A closed window's goodput record, out as a ``training_window`` span under its loop segment.

Why a span of its own, exported at once (not with the segment): a job killed mid-segment then
loses at most the window that was open. Written straight to the export path when nothing but
the exporters would see it (``SpanWriter``), else through the tracer, with the metrics
processor told to skip it: it is traintel's own record, with nothing in it to count (the trace
budget still counts it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, TraceFlags

from traintel import semconv
from traintel._sdk.otel_private import RANDOM_TRACE_ID, new_span_id, set_clean_attributes
from traintel._sdk.providers import DirectSpans

#: A window's record: its start and end (ns) and its attributes.
Record = tuple[int, int, Mapping[str, float | int | str]]


class WindowSpans:
    """Writes window records as ``training_window`` spans."""

    def __init__(self, tracer: trace_api.Tracer, direct: DirectSpans | None, quiet: set[int]) -> None:
        self._tracer = tracer
        self._direct = direct
        #: Threads whose spans the metrics processor skips (the engine's ``materializing``).
        self._quiet = quiet

    def export(self, records: Iterable[Record], parent: Span | None) -> None:
        direct = self._direct
        if direct is not None and direct.usable() and parent is not None:
            self._write(records, parent.get_span_context(), direct)
            return
        context = trace_api.set_span_in_context(parent) if parent is not None else Context()
        thread = threading.get_ident()
        self._quiet.add(thread)
        try:
            for start_ns, end_ns, attributes in records:
                # Started without attributes, then given them uncleaned: they are traintel's numbers.
                span = self._tracer.start_span(
                    semconv.TRAINING_WINDOW_SPAN, context=context, start_time=start_ns
                )
                set_clean_attributes(span, attributes)
                span.end(end_time=max(end_ns, start_ns))
        finally:
            self._quiet.discard(thread)

    @staticmethod
    def _write(records: Iterable[Record], parent: SpanContext, direct: DirectSpans) -> None:
        """The records as the tracer would make them under ``parent``: sampled with it, or not
        exported at all."""
        if not parent.trace_flags.sampled:
            return
        flags = TraceFlags(TraceFlags.SAMPLED | (parent.trace_flags & RANDOM_TRACE_ID))
        for start_ns, end_ns, attributes in records:
            context = SpanContext(parent.trace_id, new_span_id(), False, flags, parent.trace_state)
            direct.write(
                semconv.TRAINING_WINDOW_SPAN, context, parent, attributes, start_ns, max(end_ns, start_ns)
            )
