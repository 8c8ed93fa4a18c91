"""``traintel replay``: send spooled batches or embedded-default files to an OTLP endpoint later.

Why through the standard OTLP span exporters: the endpoint may be given on the command line,
everything else (headers, certificate, compression, timeout) comes from the same
``OTEL_EXPORTER_OTLP_*`` variables a job uses, read by the same code. Spans are re-created
from the spooled OTLP requests or the OTLP/JSON lines (:mod:`traintel.exporters.proto_spans`),
batched, and split by bytes like live export.

What a user can count on:

- **Nothing twice.** Spooled batches are sent first, then the files; a span already sent from
  a spooled batch is not sent again from a file (a job with both a collector and the embedded
  default has the spool's spans in its file too). What was delivered is remembered per
  directory and endpoint (:mod:`traintel.exporters.replay_ledger`), so a replay that stopped
  resumes where it stopped and a second replay of the same files sends nothing.
- **A rejected batch does not stop the rest.** A batch that fails while the collector accepts
  an empty request is refused for what it holds (HTTP 400, gRPC INVALID_ARGUMENT): after one
  more try it is set aside in a ``quarantine`` directory next to its file, and the replay
  goes on. A batch that cannot be read back (corrupt, or holding a value no span can have)
  is moved there too.
- **Stops when the collector is down.** When even the empty request fails, carrying on would
  only fail again: the replay says where it stopped and that running it again resumes.
- **Exit status.** Zero only when every span was delivered (now or by an earlier replay);
  otherwise non-zero, saying what was not. ``--delete-sent`` removes only files whose spans
  were all delivered, and only when the replay did not stop.

Metric lines are counted, not sent: replayed cumulative points would arrive out of order at
most backends.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from google.protobuf.message import DecodeError
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from traintel._sdk.otel_private import watch_collector_answers
from traintel.config import ConfigurationError
from traintel.exporters.collector_answers import CollectorAnswers
from traintel.exporters.health import COLLECTOR_REJECTED, ExportHealth
from traintel.exporters.otlp_env import otlp_protocol
from traintel.exporters.private_files import make_private_dirs
from traintel.exporters.proto_spans import InvalidSpanError, proto_spans, readable_span, split_invalid
from traintel.exporters.reader import ReadStats, expand_paths, read_requests
from traintel.exporters.replay_ledger import Ledger, target_key
from traintel.exporters.spool import (
    QUARANTINE_DIR,
    SPOOL_SUFFIX,
    batch_name,
    batch_seq,
    batch_spans,
    move_to_quarantine,
    read_batch,
    spool_files,
    write_batch,
)
from traintel.exporters.spooling import MAX_BATCH_BYTES, split_by_bytes
from traintel.exporters.tls_errors import tls_targets

_logger = logging.getLogger(__name__)

#: Spans per export request (the batch span processor's default batch size).
BATCH_SPANS = 512


@dataclass
class ReplayResult:
    spans_sent: int = 0
    requests_sent: int = 0
    files_done: list[Path] = field(default_factory=list)
    files_deleted: int = 0
    metric_requests_skipped: int = 0
    #: Spans an earlier replay to the same endpoint delivered (skipped).
    spans_sent_before: int = 0
    #: Spans in a file that were already sent from a spooled batch (skipped).
    spans_in_spool_and_file: int = 0
    #: Spans the collector rejected, and where they are kept.
    spans_rejected: int = 0
    quarantined: list[Path] = field(default_factory=list)
    #: Spooled batches that cannot be read back, and spans no span can be (not sent).
    unreadable: list[str] = field(default_factory=list)
    #: Spans the collector refused inside requests it accepted (partial success), and why.
    spans_refused_in_accepted: int = 0
    refused_message: str = ""
    #: Where the replay stopped because the collector took nothing, not even an empty request,
    #: asked to wait (``asked_to_wait``: its answer, e.g. "HTTP 429, retry after 30s"), or was
    #: unavailable (``unavailable``: "gRPC UNAVAILABLE", "HTTP 503", also what a gRPC exporter
    #: gets where nothing listens: no collector asked anything then).
    failed_file: Path | None = None
    asked_to_wait: str = ""
    unavailable: str = ""
    stats: ReadStats = field(default_factory=ReadStats)

    @property
    def ok(self) -> bool:
        """Everything was delivered, now or before."""
        return (
            self.failed_file is None
            and not self.spans_rejected
            and not self.spans_refused_in_accepted
            and not self.unreadable
            and not self.stats.skipped
        )


def otlp_span_exporter(endpoint: str | None = None, protocol: str | None = None) -> SpanExporter:
    """The standard OTLP span exporter for ``protocol`` (else ``OTEL_EXPORTER_OTLP_*``).

    ``endpoint`` overrides the environment's; for HTTP a bare ``http://host:port`` gets the
    ``/v1/traces`` path the collector serves.
    """
    protocol = protocol or otlp_protocol("traces", os.environ, strict=True)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint) if endpoint else GrpcExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        if endpoint and urlparse(endpoint).path in ("", "/"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        return HttpExporter(endpoint=endpoint) if endpoint else HttpExporter()
    raise ConfigurationError(f"--protocol={protocol!r}: expected grpc or http/protobuf")


def endpoint_key(endpoint: str | None = None, protocol: str | None = None) -> str:
    """What the ledger calls the endpoint ``otlp_span_exporter`` sends to (without secrets)."""
    protocol = protocol or otlp_protocol("traces", os.environ, strict=True)
    endpoint = endpoint or (
        tls_targets(os.environ)["traces"].endpoint
        or ("http://localhost:4317" if protocol == "grpc" else "http://localhost:4318")
    )
    return target_key(protocol, endpoint)


def replay_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Spooled batches (each directory's in write order), then embedded-default files."""
    batches: list[Path] = []
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            batches.extend(spool_files([path]))
            files.extend(expand_paths([path]))
        elif path.name.endswith(SPOOL_SUFFIX):
            batches.append(path)
        else:
            files.append(path)
    return list(dict.fromkeys(batches)) + list(dict.fromkeys(files))


def _count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class _Sent(enum.Enum):
    DELIVERED = "delivered"
    REJECTED = "rejected"
    STOPPED = "stopped"


_SpanKey = tuple[bytes, bytes]


class _Replay:
    def __init__(self, exporter: SpanExporter, target: str | None) -> None:
        self.exporter = exporter
        self.target = target
        self.result = ReplayResult()
        #: What the collector answers (partial success, throttling), if the exporter lets it be seen.
        self.health = ExportHealth()
        self.answers = CollectorAnswers(self.health, say=False)
        watch_collector_answers(exporter, self.answers)
        #: Every span id seen in a spooled batch: not sent again from a file.
        self.spooled: set[_SpanKey] = set()
        self._ledgers: dict[Path, Ledger] = {}
        #: Files all of whose spans were delivered (``--delete-sent`` may remove them).
        self.delivered: list[Path] = []
        #: The spooled batch just read had its bad spans moved to a batch of their own: the file
        #: that now holds the rest.
        self._rewritten: Path | None = None

    def ledger(self, path: Path) -> Ledger | None:
        if self.target is None:
            return None
        directory = path.parent.absolute()
        if directory not in self._ledgers:
            self._ledgers[directory] = Ledger(directory, self.target)
        return self._ledgers[directory]

    # --- one file ----------------------------------------------------------------------------
    def file(self, path: Path) -> bool:
        """Send what is left of ``path``; False when the collector took nothing (stop)."""
        spooled = path.name.endswith(SPOOL_SUFFIX)
        ledger = self.ledger(path)
        done_before = ledger.done(path) if ledger is not None else 0
        skipped_before, undelivered_before = self.result.stats.skipped, self._undelivered()
        spans = self._batch_of(path) if spooled else self._lines_of(path)
        if spans is None:  # a spooled batch that cannot be read back: set aside
            return True
        if spooled and self._rewritten is not None:  # its bad spans are aside: a whole file again
            path, done_before, undelivered_before = self._rewritten, 0, self._undelivered()
        position = self._send_all(path, spans, spooled, ledger, done_before)
        if position is None:
            return False
        self._file_done(path, position, ledger)
        if self.result.stats.skipped == skipped_before and self._undelivered() == undelivered_before:
            self.delivered.append(path)
        return True

    def _file_done(self, path: Path, position: int, ledger: Ledger | None) -> None:
        """Every span of ``path`` read and sent: recorded, so a later replay skips the file."""
        if ledger is not None:
            ledger.record(path, position)
        self.result.files_done.append(path)

    def _send_all(
        self, path: Path, spans: Iterable[tuple[_SpanKey, ReadableSpan | None]], spooled: bool,
        ledger: Ledger | None, done_before: int,
    ) -> int | None:  # fmt: skip
        """Send the file's spans not sent before, in batches; the spans read (None: stopped)."""
        position = 0
        batch: list[ReadableSpan] = []
        for key, span in spans:
            position += 1
            taken = self._take(key, span, spooled, position, done_before)
            if taken is None:
                continue
            batch.append(taken)
            if len(batch) >= BATCH_SPANS:
                if not self._deliver(path, batch, ledger, position):
                    return None
                batch = []
        if batch and not self._deliver(path, batch, ledger, position):
            return None
        return position

    def _take(
        self, key: _SpanKey, span: ReadableSpan | None, spooled: bool, position: int, done_before: int
    ) -> ReadableSpan | None:
        """The span to send; None if a replay sent it before, a spooled batch holds it (read
        from a file), or it is not a span."""
        if spooled:
            self.spooled.add(key)
        if position <= done_before:
            self.result.spans_sent_before += 1
            return None
        if not spooled and key in self.spooled:
            self.result.spans_in_spool_and_file += 1
            return None
        return span

    def _undelivered(self) -> int:
        refused = self.health.spans_dropped.get(COLLECTOR_REJECTED, 0)  # inside accepted requests
        return self.result.spans_rejected + len(self.result.unreadable) + refused

    def _batch_of(self, path: Path) -> list[tuple[_SpanKey, ReadableSpan | None]] | None:
        """A spooled batch's spans, or ``None`` (set aside) if it cannot be read back at all.
        Spans that cannot be SDK spans (an id of the wrong size, say) are set aside alone, in
        a batch of their own in ``quarantine/``, and the file keeps the rest."""
        self._rewritten = None
        try:
            good, bad, reasons = split_invalid(read_batch(path))
            written, found = batch_spans(path), _count(good) + len(reasons)
            if written is not None and found != written:  # emptied or cut: not a batch to deliver
                raise DecodeError(f"{found} span(s) in it, written with {written}")
        except (OSError, DecodeError) as exc:
            where = self._set_aside_file(path)
            self.result.unreadable.append(f"{path}: cannot be read back ({exc})" + where)
            return None
        if reasons:
            self.result.unreadable.extend(f"{path}: {reason}" for reason in reasons)
            if not good.resource_spans:  # nothing in it can be sent: the file goes aside whole
                self.result.unreadable[-1] += self._set_aside_file(path)
                return None
            if path.parent.name != QUARANTINE_DIR:
                self._split_batch(path, good, bad, len(reasons))
        return [((s.trace_id, s.span_id), readable_span(s, r, c)) for s, r, c in proto_spans(good)]

    def _split_batch(
        self, path: Path, good: ExportTraceServiceRequest, bad: ExportTraceServiceRequest, spans: int
    ) -> None:
        """The batch's bad spans into a batch of their own in quarantine, the rest rewritten
        under its count (for later replays too)."""
        kept = self._write_aside(path.parent, bad.SerializeToString(), spans)
        if kept is None:
            return
        self.result.unreadable[-1] += f"; set aside in {kept}"
        with contextlib.suppress(OSError):
            rest = path.with_name(batch_name(batch_seq(path) or 0, _count(good)))
            write_batch(rest, good.SerializeToString())
            path.unlink()
            self._rewritten = rest

    def _lines_of(self, path: Path) -> Iterator[tuple[_SpanKey, ReadableSpan | None]]:
        """Streaming: a long run's file is never held in memory whole. A span that cannot be
        one is counted and skipped (``None``), the rest of its line sent."""
        for request in read_requests([path], self.result.stats):
            if not isinstance(request, ExportTraceServiceRequest):
                self.result.metric_requests_skipped += 1
                continue
            for span, resource, scope in proto_spans(request):
                try:
                    converted: ReadableSpan | None = readable_span(span, resource, scope)
                except InvalidSpanError as exc:
                    self.result.unreadable.append(f"{path}: {exc}")
                    converted = None
                yield (span.trace_id, span.span_id), converted

    # --- sending -----------------------------------------------------------------------------
    def _deliver(self, path: Path, batch: list[ReadableSpan], ledger: Ledger | None, position: int) -> bool:
        outcome = self._send_or_set_aside(path, batch)
        if outcome is _Sent.STOPPED:
            self.result.failed_file = path
            return False
        # Rejected from a quarantined file: not recorded, so the next replay tries again.
        if ledger is not None and (outcome is _Sent.DELIVERED or path.parent.name != QUARANTINE_DIR):
            ledger.record(path, position)
        return True

    def _send_or_set_aside(self, path: Path, batch: Sequence[ReadableSpan]) -> _Sent:
        left = batch[self._send(batch) :]
        if not left:
            return _Sent.DELIVERED
        if self._asked_to_wait() or not self._export(()):  # throttled, down, unreachable or refusing all
            return _Sent.STOPPED
        left = left[self._send(left) :]  # once more: the failure may have been a moment's outage
        if not left:
            return _Sent.DELIVERED
        if self._asked_to_wait():
            return _Sent.STOPPED
        self.result.spans_rejected += len(left)
        if path.parent.name != QUARANTINE_DIR:
            self._write_aside(path.parent, encode_spans(left).SerializeToString(), len(left))
        elif path not in self.result.quarantined:
            self.result.quarantined.append(path)
        return _Sent.REJECTED

    def _send(self, spans: Sequence[ReadableSpan]) -> int:
        """Send ``spans`` split by bytes; how many were delivered (parts before a failure)."""
        sent = 0
        for part, _request in split_by_bytes(spans, MAX_BATCH_BYTES):
            if not self._export(part):
                break
            sent += len(part)
            self.result.spans_sent += len(part)
            self.result.requests_sent += 1
        return sent

    def _asked_to_wait(self) -> bool:
        """The collector answered "try again later": the replay stops where it is, to be run
        again later."""
        answer = self.answers.asked_to_wait()
        if answer is not None and answer.throttled:
            self.result.asked_to_wait = str(answer)
        elif answer is not None:
            self.result.unavailable = str(answer)
        return answer is not None

    def _export(self, spans: Sequence[ReadableSpan]) -> bool:
        self.answers.forget()
        try:
            return self.exporter.export(spans) == SpanExportResult.SUCCESS
        except Exception as exc:
            _logger.error("traintel replay: export raised %s", exc)
            return False

    # --- setting aside -----------------------------------------------------------------------
    def _write_aside(self, directory: Path, data: bytes, spans: int) -> Path | None:
        """Keep ``spans`` spans (a serialised request) in ``directory``'s quarantine."""
        quarantine = directory / QUARANTINE_DIR
        try:
            make_private_dirs(quarantine)
            seq = 1 + max(
                (batch_seq(p) or 0 for p in (*directory.iterdir(), *quarantine.iterdir())), default=0
            )
            target = quarantine / batch_name(seq, spans)
            write_batch(target, data)
        except OSError as exc:
            self.result.unreadable.append(f"{directory}: cannot keep {spans} span(s) set aside ({exc})")
            return None
        self.result.quarantined.append(target)
        return target

    def _set_aside_file(self, path: Path) -> str:
        """Move an unreadable spooled batch into its directory's quarantine (if not there yet)."""
        if path.parent.name == QUARANTINE_DIR:
            return ""
        try:
            return f"; moved to {move_to_quarantine(path)}"
        except OSError:
            return ""

    # --- after the run -----------------------------------------------------------------------
    def delete_delivered(self) -> None:
        for path in self.delivered:
            try:
                path.unlink()
            except OSError as exc:
                _logger.warning("traintel replay: cannot delete %s (%s)", path, exc)
                continue
            self.result.files_deleted += 1
            ledger = self.ledger(path)
            if ledger is not None:
                ledger.forget(path)


def replay(
    paths: Iterable[str | os.PathLike[str]],
    exporter: SpanExporter,
    *,
    delete_sent: bool = False,
    target: str | None = None,
) -> ReplayResult:
    """Send every span in ``paths`` (files or directories) through ``exporter``, spooled
    batches first. ``target`` names the endpoint in each directory's ledger (see
    :func:`endpoint_key`); without it nothing is remembered between replays."""
    run = _Replay(exporter, target)
    for path in replay_files(paths):
        if not run.file(path):
            break
    refused = run.health.spans_dropped.get(COLLECTOR_REJECTED, 0)
    if refused:
        run.result.spans_refused_in_accepted = refused
        run.result.refused_message = run.answers.partial_message or ""
    if delete_sent and run.result.failed_file is None:
        run.delete_delivered()
    return run.result


def render(result: ReplayResult, target: str) -> str:
    lines = [
        f"replayed {result.spans_sent} span(s) in {result.requests_sent} request(s) "
        f"from {len(result.files_done)} file(s) to {target}"
    ]
    lines.extend(_counted(result))
    lines.extend(_not_delivered(result))
    stopped = _stopped(result)
    if stopped:
        lines.append(stopped)
    return "\n".join(lines)


def _counted(result: ReplayResult) -> Iterator[str]:
    """What was not sent on purpose: sent before, sent once, deleted, metrics, unreadable."""
    if result.spans_sent_before:
        yield f"{result.spans_sent_before} span(s) delivered by an earlier replay: not sent again"
    if result.spans_in_spool_and_file:
        yield f"{result.spans_in_spool_and_file} span(s) both spooled and in a file: sent once"
    if result.files_deleted:
        yield f"deleted {result.files_deleted} delivered file(s)"
    if result.metric_requests_skipped:
        yield f"skipped {result.metric_requests_skipped} metrics request(s) (metrics are not replayed)"
    if result.stats.skipped:
        yield f"not sent: {result.stats.skipped} unreadable line(s): {'; '.join(result.stats.reasons[:3])}"
    if result.unreadable:
        yield f"not sent: {len(result.unreadable)} unreadable: {'; '.join(result.unreadable[:3])}"


def _not_delivered(result: ReplayResult) -> Iterator[str]:
    """What the collector would not take."""
    if result.spans_rejected:
        yield (
            f"not delivered: {result.spans_rejected} span(s) rejected by the collector, which accepted "
            "other requests (its log says why); kept in " + ", ".join(str(p) for p in result.quarantined)
        )
    if result.spans_refused_in_accepted:
        yield (
            f"not delivered: {result.spans_refused_in_accepted} span(s) refused by the collector inside "
            f"requests it accepted (partial success: {result.refused_message})"
        )


def _stopped(result: ReplayResult) -> str | None:
    """Where the replay stopped, and why, if it did."""
    if result.failed_file is None:
        return None
    if result.asked_to_wait:
        return (
            f"stopped at {result.failed_file}: the collector asks to wait ({result.asked_to_wait}); "
            "run the same command again later to resume (what was delivered is not sent again)"
        )
    if result.unavailable:
        return (
            f"stopped at {result.failed_file}: the collector is unavailable ({result.unavailable}: "
            "down, unreachable or restarting); run the same command again to resume "
            "(what was delivered is not sent again)"
        )
    return (
        f"stopped at {result.failed_file}: the collector took no request, not even an empty one "
        "(down, unreachable, or refusing everything); run the same command again to resume "
        "(what was delivered is not sent again)"
    )
