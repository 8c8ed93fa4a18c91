"""The export path around the standard exporters: count what is lost, split, spool, resend.

Why a wrapper and not a fork of the OTLP exporters: they stay responsible for the wire
(endpoint, headers, TLS, compression, retries within their timeout); this adds only what they
lack for a training job that must lose nothing:

- **Split by bytes.** A batch whose OTLP encoding is over ``MAX_BATCH_BYTES`` (gRPC refuses
  messages over 4 MiB by default) is halved until every part fits, never refused.
- **Never wait for the network on the batch processor's thread.** A processor waiting for a
  dead, black-holed or slow collector stops draining its queue, which overflows and drops
  spans. Here a batch goes to our own sender thread when it is idle and nothing is spooled,
  and otherwise straight to a bounded on-disk :class:`~traintel.exporters.spool.Spool`.
- **Spool on failure, resend.** A failed send is spooled too; the sender then retries the
  oldest spooled batch every ``retry_interval_s`` and sends the rest as soon as one goes
  through, after which batches go direct again.
- **Set aside what the collector refuses.** A spooled batch that fails while the collector
  accepts an empty request is refused for what it holds: after one more try it goes to the
  spool's ``quarantine`` directory, so it does not hold back every batch behind it.
- **Spill at exit.** If the spool cannot be drained within the bound at shutdown, the batch
  in flight and whatever is still queued are written to the spool instead of vanishing. A
  send is not started that would outlast the bound (judged by how long the last one took),
  and the send under way is waited for, so a batch delivered late is not also left spooled.

Delivery is at least once: a batch whose send is still under way when the process ends stays
spooled and may arrive twice, and a collector that took a batch but whose answer timed out
gets it again (deduplicate by span id if it matters).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from traintel._aggregation.otlp_size import estimate_span_bytes
from traintel._sdk.otel_private import batch_queue, watch_collector_answers
from traintel.exporters import health as health_module
from traintel.exporters import retry_lines
from traintel.exporters.collector_answers import CollectorAnswers
from traintel.exporters.health import HEALTH, ExportHealth
from traintel.exporters.proto_spans import InvalidSpanError, proto_spans, readable_span
from traintel.exporters.span_repair import encodable, encoded_mending
from traintel.exporters.spool import Spool, SpoolEntry

_logger = logging.getLogger(__name__)

#: What a bounded exit names when it runs out while a batch is with the span exporter.
SENDING_SPANS = "the collector (a span export under way)"
#: gRPC's default maximum message size is 4 MiB; stay clear of it with headroom for framing.
MAX_BATCH_BYTES = 4 * 1024 * 1024 - 64 * 1024
#: The share of the exit's drain time it then waits, after the spill, for the send under way:
#: if it succeeds, its copy is taken out of the spool again (a replay would send it twice).
_LATE_SEND_SHARE = 0.25
#: How long the exit waits for the sender to finish writing a failed batch it already took
#: (a local disk write; without the wait the process could end in the middle of it).
_OWNED_WRITE_TIMEOUT_S = 2.0


def split_by_bytes(
    spans: Sequence[ReadableSpan], max_bytes: int
) -> list[tuple[Sequence[ReadableSpan], ExportTraceServiceRequest | None]]:
    """Consecutive parts of ``spans`` whose encoded request fits ``max_bytes`` (halving).

    A part's request is ``None`` when twice the estimate fits: then it is not encoded here
    (the exporter does that). A single span over the limit stays a part of its own, with its
    request, for the caller to refuse.
    """
    if 2 * sum(estimate_span_bytes(s) for s in spans) <= max_bytes:
        return [(spans, None)]
    request = encode_spans(spans)
    if len(spans) <= 1 or request.ByteSize() <= max_bytes:
        return [(spans, request)]
    middle = len(spans) // 2
    return split_by_bytes(spans[:middle], max_bytes) + split_by_bytes(spans[middle:], max_bytes)


def _sampled(span: ReadableSpan) -> bool:
    context = span.context
    return bool(context and context.trace_flags.sampled)


class QueueGuard:
    """An SDK batch span processor's queue with its queue-full and event-cap drops counted
    exactly; its depth, and what it holds at a stuck exit.

    Why a lock: the SDK's queue silently pushes out its oldest span when a span is added to a
    full queue, so a check made before handing over races the other producing threads and the
    export thread, and miscounts. Here producers hand over one at a time, a span that finds the
    queue full is the one dropped (not handed over) and counted, and the SDK's queue never
    overflows: produced = exported + dropped. The export thread only takes from the queue, so
    it never turns a check into a drop. If a future SDK keeps its queue elsewhere, drops go
    uncounted and we say so once.

    Why the producer yields once the queue is three-quarters full: the export thread, woken at a
    batch's worth, needs the interpreter, and a training thread running Python keeps it for the
    interpreter's whole switch interval (5 ms) each time; on a loaded machine that is late enough
    for a fast producer (traintel exporting every iteration makes its spans in half the bare SDK's
    time) to fill the queue and lose spans. Handing the interpreter over (``time.sleep(0)``) while
    the export thread is behind lets it drain the queue now: what the training thread waits for
    is the export those spans need anyway, at most a switch interval; below the mark it costs one
    comparison.
    """

    def __init__(
        self,
        processor: BatchSpanProcessor,
        emit: Callable[[ReadableSpan], None],
        health: ExportHealth,
        hand_over: Callable[[float], object] = time.sleep,
    ) -> None:
        self._health = health
        self._emit = emit  # the SDK's on_end: it queues sampled spans
        self._hand_over = hand_over
        self._queue: deque[ReadableSpan] | None
        self._queue, self._max_queue = batch_queue(processor)
        self._behind = self._max_queue * 3 // 4  # past this depth the export thread is behind
        self._handover = threading.Lock()
        if self._queue is None:
            _logger.warning(
                "traintel: this opentelemetry-sdk's BatchSpanProcessor keeps its queue elsewhere; "
                "queue-overflow drops are not counted"
            )
        health.watch_queue(self)

    def depth(self) -> int:
        return len(self._queue) if self._queue is not None else 0

    def on_end(self, span: ReadableSpan) -> None:
        # Called for every exported span; only the rare case (dropped events, a full queue)
        # asks whether it is sampled (the SDK's on_end leaves unsampled spans out of the queue).
        dropped_events = span.dropped_events
        if dropped_events:
            if not _sampled(span):
                return
            self._health.add("events_dropped", dropped_events)
        queue = self._queue
        if queue is None or self._max_queue <= 0:
            self._emit(span)
            return
        with self._handover:
            depth = len(queue)
            if depth < self._max_queue:
                self._emit(span)
        if depth >= self._max_queue:
            if _sampled(span):
                self._health.drop_spans(health_module.QUEUE_FULL, 1)
        elif depth >= self._behind:
            self._hand_over(0)  # the export thread takes the interpreter, if it waits for it

    def take_queued(self) -> list[ReadableSpan]:
        """Everything still queued, oldest first, taken out (for the spill at a stuck exit)."""
        queue = self._queue
        taken: list[ReadableSpan] = []
        while queue:
            try:
                taken.append(queue.pop())  # the SDK appends on the left: the right is oldest
            except IndexError:  # the export thread took the last one
                break
        return taken


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's batch processor behind a :class:`QueueGuard`: its drops counted exactly."""

    def __init__(self, exporter: SpanExporter, *, health: ExportHealth = HEALTH, **kwargs: Any) -> None:
        super().__init__(exporter, **kwargs)
        self.guard = guard_queue(self, health)  # on_end replaced: no extra call per span


def guard_queue(processor: BatchSpanProcessor, health: ExportHealth = HEALTH) -> QueueGuard:
    """Count the drops of a batch processor someone else built (the distro's): its ``on_end``
    is replaced on the instance by the guard's, which hands spans on to the original."""
    guard = QueueGuard(processor, processor.on_end, health)
    processor.on_end = guard.on_end  # type: ignore[method-assign]
    return guard


_Batch = tuple[Sequence[ReadableSpan], ExportTraceServiceRequest | None]


class SpoolingSpanExporter(SpanExporter):
    """Wraps any ``SpanExporter``: split by bytes, send on its own thread, spool, resend (the
    module's docstring says why and how)."""

    def __init__(
        self,
        exporter: SpanExporter,
        spool: Spool | None,
        *,
        retry_interval_s: float = 5.0,
        drain_timeout_s: float = 5.0,
        health: ExportHealth = HEALTH,
        hint: str = "",
    ) -> None:
        self.exporter = exporter
        #: Said with the first failure only: what to set (the distro's default endpoint, say).
        self._hint = hint
        self.spool = spool
        self._retry_interval_s = retry_interval_s
        self._drain_timeout_s = drain_timeout_s
        self._health = health
        self._failed_once = False
        #: What the collector answers (partial success counted, throttling told from refusal).
        self._answers = CollectorAnswers(health)
        watch_collector_answers(exporter, self._answers)
        self._said_throttled = False
        self._init_state()
        if spool is not None:
            health.watch_spool(spool)
        reference = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork_in_child(reference))

    def _init_state(self) -> None:
        self._cond = threading.Condition()
        #: The batch handed to the sender thread and not yet taken.
        self._handoff: _Batch | None = None
        #: The sender is sending (a handed-off batch or a spooled one).
        self._busy = False
        #: Spooled batches wait: new batches queue behind them until the sender drains them.
        self._backlog = False
        self._retry_at = 0.0
        #: The exit's drain: when it ends, and whether the next send could still end before it.
        self._drain_deadline: float | None = None
        self._drain_hopeless = False
        #: How long the last send took: a send that cannot end before the drain does is not
        #: started (cut off by the exit, its outcome unknown, a replay could send it twice).
        self._last_send_s = 0.0
        #: How long the collector asked to wait before the next try (Retry-After, RetryInfo).
        self._asked_wait_s = 0.0
        self._stopped = False
        self._thread: threading.Thread | None = None
        #: The handed-off batch the sender is sending (spilled to disk if the exit comes first).
        self._in_flight: Sequence[ReadableSpan] | None = None
        #: The in-flight batch the exit spilled, and its spool entry: removed if the send succeeds.
        self._spilled: tuple[Sequence[ReadableSpan], SpoolEntry] | None = None
        #: The sender owns a failed batch and is writing it to the spool.
        self._writing = False
        #: A send failed since batches last went direct (the spool is then more than a queue).
        self._outage = False

    def _reinit_in_child(self) -> None:
        """A forked child has no sender thread and must not write into its parent's spool."""
        self._init_state()
        if self.spool is not None:
            parent = self.spool.directory
            self.spool = Spool(parent.with_name(f"{parent.name}-fork{os.getpid()}"), self.spool.max_bytes)
            self._health.watch_spool(self.spool)

    # --- the batch processor's thread: never waits for the network ---------------------------
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        if self._stopped:
            self._health.drop_spans(health_module.NOT_SPOOLED, len(spans))
            return SpanExportResult.FAILURE
        try:
            parts = self._parts(spans)
        except Exception:
            _logger.exception("traintel: could not encode a span batch; %d span(s) dropped", len(spans))
            self._health.drop_spans(health_module.NOT_SPOOLED, len(spans))
            return SpanExportResult.FAILURE
        if len(parts) > 1:
            self._health.add("batches_split", len(parts) - 1)
        kept = True
        for part, request in parts:
            kept = self._export_part(part, request) and kept
        return SpanExportResult.SUCCESS if kept else SpanExportResult.FAILURE

    def _parts(self, spans: Sequence[ReadableSpan]) -> list[_Batch]:
        """``split_by_bytes``; a batch whose encoding fails is split with its bad spans mended
        or dropped (``span_repair``)."""
        return (
            encoded_mending(lambda part: split_by_bytes(part, MAX_BATCH_BYTES), spans, self._health)[1] or []
        )

    def _export_part(self, spans: Sequence[ReadableSpan], request: ExportTraceServiceRequest | None) -> bool:
        if request is not None and request.ByteSize() > MAX_BATCH_BYTES:  # one span alone
            _logger.error(
                "traintel: span %r encodes to %d bytes, over the %d-byte export limit; dropped",
                spans[0].name,
                request.ByteSize(),
                MAX_BATCH_BYTES,
            )
            self._health.drop_spans(health_module.TOO_LARGE, len(spans))
            return False
        if self.spool is None:
            return self._send_direct(spans)
        with self._cond:
            if self._idle():
                self._handoff = (spans, request)
                self._busy = True
                self._start_sender()
                self._cond.notify_all()
                return True
        return self._to_spool(spans, request) is not None

    def _idle(self) -> bool:
        return not self._busy and self._handoff is None and not self._backlog

    def _send_mending(self, spans: Sequence[ReadableSpan]) -> tuple[bool, Sequence[ReadableSpan]]:
        """Send ``spans``; if that failed before the collector answered because the exporter's
        encoder refused a span (it raises, or reports a failure), send them again with their
        bad spans mended or dropped (``span_repair``). Returns whether they were delivered, and
        the spans as sent."""
        error: Exception | None = None
        try:
            if self._send(spans, raising=True):
                return True, spans
        except Exception as exc:
            error = exc
        if self._answers.last_failure is not None:  # the collector answered: not the encoding
            return False, spans
        try:
            encode_spans(spans)
        except Exception:
            mended = encodable(spans, self._health)
            return (not mended or self._send(mended)), mended
        if error is not None:
            self._said_raised(error)
        return False, spans

    def _said_raised(self, exc: Exception) -> None:
        if not self._failed_once:
            self._failed_once = True
            _logger.error("traintel: span exporter %s raised: %s", type(self.exporter).__name__, exc)

    def _send(self, spans: Sequence[ReadableSpan], raising: bool = False) -> bool:
        started = time.monotonic()
        self._answers.forget()
        try:
            with self._health.busy(SENDING_SPANS):
                return self.exporter.export(spans) == SpanExportResult.SUCCESS
        except Exception as exc:
            if raising:
                raise
            self._said_raised(exc)
            return False
        finally:
            self._last_send_s = time.monotonic() - started

    def _to_spool(
        self, spans: Sequence[ReadableSpan], request: ExportTraceServiceRequest | None
    ) -> SpoolEntry | None:
        if self.spool is None:
            self._health.drop_spans(health_module.NOT_SPOOLED, len(spans))
            return None
        if request is None:
            spans, request = encoded_mending(encode_spans, spans, self._health)
        if request is None or not spans:
            return None  # each one dropped and counted
        count = len(spans)
        with self._cond:
            entry = self.spool.put(request, count)
            if entry is None:
                self._health.drop_spans(health_module.NOT_SPOOLED, count)
                return None
            self._health.add("spans_spooled", count)
            self._backlog = True
            self._start_sender()
            self._cond.notify_all()
            return entry

    def _send_direct(self, spans: Sequence[ReadableSpan]) -> bool:
        """Without a spool (``TRAINTEL_SPOOL_MAX_BYTES=0``): the SDK's own behaviour, send on
        the processor's thread and wait; a failed batch is dropped, and counted."""
        delivered, spans = self._send_mending(spans)
        if delivered:
            return True
        self._health.add("export_failures")
        self._health.drop_spans(health_module.NOT_SPOOLED, len(spans))
        return False

    # --- the sender thread -------------------------------------------------------------------
    def _start_sender(self) -> None:
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._sender_loop, name="traintel-export", daemon=True)
            self._thread.start()

    def _next_job(self) -> _Batch | SpoolEntry | None:
        """Under the lock: a handed-off batch, the oldest spooled batch when a retry is due, or
        ``None`` to stop. Waits otherwise."""
        while True:
            if self._handoff is not None:
                job, self._handoff = self._handoff, None
                self._in_flight = job[0]
                self._busy = True
                return job
            if self._stopped:
                return None
            wait: float | None = None
            if self._backlog and self.spool is not None:
                entries = self.spool.entries()
                if not entries:
                    self._backlog_delivered()
                    continue
                wait = self._retry_wait()
                if wait <= 0:
                    self._busy = True
                    return entries[0]
            self._busy = False
            self._cond.notify_all()
            self._cond.wait(wait)

    def _backlog_delivered(self) -> None:
        """The spool is empty again: direct export; said only after a failure (a busy sender
        is nothing wrong)."""
        self._backlog = False
        if self._outage:
            self._outage = False
            _logger.warning("traintel: spooled spans delivered; exporting directly again")
            retry_lines.delivered()

    def _retry_wait(self) -> float:
        """Seconds until the oldest spooled batch is retried (0 or less: now). At exit, past a
        deadline no retry can meet, the rest stays on disk for a replay."""
        now = time.monotonic()
        deadline = self._drain_deadline
        if deadline is not None and (now + self._last_send_s > deadline or self._retry_at > deadline):
            self._drain_hopeless = True
            return max(0.05, deadline - now)
        return self._retry_at - now

    def _sender_loop(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
                if job is None:
                    self._busy = False
                    self._cond.notify_all()
                    return
            try:
                delivered = self._resend(job) if isinstance(job, SpoolEntry) else self._first_send(*job)
            except Exception:
                _logger.exception("traintel: span export failed unexpectedly")
                delivered = False
            if not delivered:
                with self._cond:
                    self._outage = True
                    wait, self._asked_wait_s = max(self._retry_interval_s, self._asked_wait_s), 0.0
                    self._retry_at = time.monotonic() + wait

    def _first_send(self, spans: Sequence[ReadableSpan], request: ExportTraceServiceRequest | None) -> bool:
        delivered, sent = self._send_mending(spans)
        with self._cond:  # whoever clears _in_flight owns the batch: here, or spill() at exit
            mine, self._in_flight = self._in_flight is spans, None
            spilled, self._spilled = self._spilled, None
            # Owned and failed: shutdown() waits for the write (the exit must not cut it short).
            self._writing = mine and not delivered
        if delivered:
            if not mine:
                self._drop_exit_copy(spans, spilled)
            return True
        self._health.add("export_failures")
        self._asked_to_wait()  # a Retry-After applies to the retry of what is spooled now
        if mine:  # (else the exit already wrote it to the spool)
            self._spool_failed(sent, request if sent is spans else None)
        return False

    def _drop_exit_copy(
        self, spans: Sequence[ReadableSpan], spilled: tuple[Sequence[ReadableSpan], SpoolEntry] | None
    ) -> None:
        """Delivered late: the copy the exit spooled must not be sent again."""
        if spilled is not None and spilled[0] is spans and self.spool is not None:
            self.spool.remove(spilled[1])
            self._health.add("spans_resent", len(spans))

    def _spool_failed(self, sent: Sequence[ReadableSpan], encoded: ExportTraceServiceRequest | None) -> None:
        """A failed batch this thread owns, to the spool (shutdown waits for the write); said
        when spooling begins."""
        try:
            spooled = self._to_spool(sent, encoded) is not None
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
        if spooled and self._backlog:
            assert self.spool is not None
            hint, self._hint = self._hint, ""
            _logger.warning(
                "traintel: span export failed; spooling batches to %s and retrying every %gs "
                "(training continues)%s",
                self.spool.directory,
                self._retry_interval_s,
                f". {hint}" if hint else "",
            )

    def _resend(self, entry: SpoolEntry) -> bool:
        """The oldest spooled batch; True when it left the queue (delivered or set aside)."""
        spool = self.spool
        assert spool is not None
        spans = self._read_back(spool, entry)
        if spans is None:
            return True  # set aside, or gone (dropped by the bound meanwhile): nothing to send
        if self._stopped:
            return False
        if not self._send(spans):
            self._health.add("export_failures")
            delivered = self._after_failure(spans)
            if delivered is None:
                return False  # throttled, down, black-holed or refusing everything: retry later
            if not delivered:
                self._quarantine(entry, "rejected by the collector, which accepts other requests")
                return True
        spool.remove(entry)
        self._health.add("spans_resent", len(spans))
        return True

    def _read_back(self, spool: Spool, entry: SpoolEntry) -> list[ReadableSpan] | None:
        """A spooled batch's spans; None if it is gone, or set aside: it does not decode, holds
        a value no span can have, or holds other than the spans it was written with (an emptied
        or cut file decodes too, and must not be deleted as delivered)."""
        try:
            request = spool.read(entry)
            if request is None:
                return None
            spans = [readable_span(*found) for found in proto_spans(request)]
            if len(spans) != entry.spans:
                raise DecodeError(f"{len(spans)} span(s) in it, written with {entry.spans}")
        except (DecodeError, InvalidSpanError) as exc:
            self._quarantine(entry, f"cannot be read back: {exc}")
            return None
        return spans

    def _after_failure(self, spans: Sequence[ReadableSpan]) -> bool | None:
        """After a spooled batch failed: ``None`` to try again later (the collector asked to
        wait, or takes nothing, not even an empty request), else whether one more try delivered
        it (False: refused for what it holds)."""
        if self._stopped or self._asked_to_wait() or not self._collector_accepts():
            return None
        if self._send(spans):  # once more: the failure may have been a moment's outage
            return True
        return None if self._asked_to_wait() else False

    def _asked_to_wait(self) -> bool:
        """Did the collector answer the last send with "try again later"? Then the batch waits
        in the spool as long as the collector asks (Retry-After, RetryInfo), and is sent live."""
        answer = self._answers.asked_to_wait()
        if answer is None:
            return False
        self._asked_wait_s = answer.retry_after_s or 0.0
        if answer.throttled and not self._said_throttled:
            self._said_throttled = True
            _logger.warning(
                "traintel: the collector asks to wait (%s); batches wait in the spool and are sent "
                "as it takes them (training continues)",
                answer,
            )
        return True

    def _collector_accepts(self) -> bool:
        """Is the collector up? Asked with an empty request, which the standard exporters send
        and a collector that is up accepts. Exporters report every failure the same way, so this
        is how a batch the collector refuses for what it holds (HTTP 400, gRPC INVALID_ARGUMENT)
        is told from an outage; otherwise it would be retried forever at the head of the
        spool, holding back every batch behind it."""
        return self._send(())

    def _quarantine(self, entry: SpoolEntry, why: str) -> None:
        assert self.spool is not None
        moved = self.spool.quarantine(entry)
        if moved is not None:
            _logger.error(
                "traintel: spooled batch of %d span(s) %s; set aside as %s and the rest sent on",
                entry.spans,
                why,
                moved,
            )

    # --- lifecycle ---------------------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until every batch handed over has left memory: delivered or spooled."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._busy and self._handoff is None, timeout_millis / 1000
            )

    def drain(self, timeout_s: float) -> bool:
        """Retry the spool now and wait up to ``timeout_s`` for everything to be delivered.

        Returns early (False) when the next send would take longer than the time left, as the
        last one did: what is left stays in the spool, its delivery not in doubt."""
        with self._cond:
            self._retry_at = 0.0
            self._drain_deadline = time.monotonic() + timeout_s
            self._drain_hopeless = False
            self._cond.notify_all()
            try:
                done = self._cond.wait_for(
                    lambda: self._idle() or self._stopped or self._drain_hopeless, timeout_s
                )
                return done and self._idle()
            finally:
                self._drain_deadline = None

    def shutdown(self) -> None:
        drained = self.drain(self._drain_timeout_s)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if not drained:
            self.spill(())  # what is still in memory goes to disk before the process ends
            with self._cond:
                # The send under way: if it succeeds, its spilled copy is removed.
                self._cond.wait_for(lambda: not self._busy, _LATE_SEND_SHARE * self._drain_timeout_s)
                # A failed batch the sender took before the spill: let it land on disk.
                self._cond.wait_for(lambda: not self._writing, _OWNED_WRITE_TIMEOUT_S)
        try:
            self.exporter.shutdown()
        except Exception:
            _logger.exception("traintel: span exporter shutdown failed")
        if self.spool is not None:
            self.spool.remove_if_empty()

    def spill(self, queued: Sequence[ReadableSpan]) -> int:
        """At a stuck exit: the batch in flight or handed over, and ``queued`` spans, go to the
        spool (no network). Returns the number of spans written. If the in-flight send then
        succeeds before the process ends, its copy is removed again; if the process ends
        first, the batch may arrive twice (at least once, never lost). The hint (what to set),
        if not said yet, is said here: the exit bound may end the process before this exporter's
        own shutdown gets to it."""
        hint, self._hint = self._hint, ""
        if hint:
            _logger.warning("traintel: span export did not complete before exit. %s", hint)
        written = 0
        with self._cond:  # held while the copy is written: a send finishing now waits for it
            handoff, self._handoff = self._handoff, None
            in_flight, self._in_flight = self._in_flight, None
            if in_flight is not None:
                entry = self._to_spool(in_flight, None)
                if entry is not None:
                    written += len(in_flight)
                    self._spilled = (in_flight, entry)
        if handoff is not None and self._to_spool(*handoff) is not None:
            written += len(handoff[0])
        if queued:
            for part, request in self._parts(list(queued)):
                if self._to_spool(part, request) is not None:
                    written += len(part)
        return written


def _after_fork_in_child(reference: weakref.ref[SpoolingSpanExporter]) -> None:
    exporter = reference()
    if exporter is not None:
        exporter._reinit_in_child()
