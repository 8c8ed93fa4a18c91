"""Hang reports as OpenTelemetry log records: what the stall watcher (``traintel._host.stall``)
and its helper process (``gil_helper``) send, through the job's logs pipeline.

Why here: a record goes through the OpenTelemetry logs SDK, reached through the internals module
(``_sdk.otel_private``); the watcher lives with the host's other samplers, which never import the
SDK side, so the runtime hands it :func:`emit` on the job's logger when it wires the job.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import trace as trace_api
from opentelemetry.trace import NonRecordingSpan, SpanContext

from traintel import semconv
from traintel._host.stall import StallReport
from traintel._sdk import otel_private


def emit(
    logger: Callable[[], otel_private.Logger],
    event: str,
    report: StallReport,
    link: SpanContext | None,
    now_ns: int,
    body: str | None = None,
) -> None:
    """One log record of ``report`` through ``logger()``, linked to ``link`` (its trace and span
    ids). A logs pipeline builds its provider on the first record, so a job that never reports a
    hang loads no logs code."""
    suspect = event == semconv.EVENT_HANG_SUSPECT
    severity = otel_private.SeverityNumber.WARN if suspect else otel_private.SeverityNumber.INFO
    context = trace_api.set_span_in_context(NonRecordingSpan(link)) if link is not None else None
    logger().emit(
        timestamp=now_ns,
        observed_timestamp=now_ns,
        context=context,
        severity_number=severity,
        severity_text="WARN" if suspect else "INFO",
        body=body if body is not None else report.describe(),
        attributes=report.attributes(),
        event_name=event,
    )
