"""``traintel replay``: send spooled batches or embedded-default files to an OTLP endpoint later.

Why through the standard OTLP span exporters: the endpoint may be given on the command line,
everything else (headers, certificate, compression, timeout) comes from the same
``OTEL_EXPORTER_OTLP_*`` variables a job uses, read by the same code. Spans are re-created
from the spooled OTLP requests or the OTLP/JSON lines (:mod:`traintel.exporters.proto_spans`),
batched, and split by bytes like live export.

In order, file by file; on the first failed send it stops (the collector is down: carrying on
would only reorder), reports what was sent and exits non-zero, so running it again resumes.
With ``delete_sent`` a file whose spans were all delivered is removed, so a spool is drained
and a second run sends nothing twice. Metric lines are counted, not sent: replayed cumulative
points would arrive out of order at most backends.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from traintel._sdk.providers import otlp_protocol
from traintel.config import ConfigurationError
from traintel.exporters.proto_spans import readable_spans
from traintel.exporters.reader import ReadStats, expand_paths, read_requests
from traintel.exporters.spool import SPOOL_SUFFIX, read_batch, spool_files
from traintel.exporters.spooling import DEFAULT_MAX_BATCH_BYTES, split_by_bytes

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
    failed_file: Path | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    @property
    def ok(self) -> bool:
        return self.failed_file is None


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


def _batches(spans: Iterable[ReadableSpan], size: int) -> Iterable[list[ReadableSpan]]:
    batch: list[ReadableSpan] = []
    for span in spans:
        batch.append(span)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _send(exporter: SpanExporter, spans: Sequence[ReadableSpan], result: ReplayResult) -> bool:
    for part, _request in split_by_bytes(spans, DEFAULT_MAX_BATCH_BYTES):
        try:
            ok = exporter.export(part) == SpanExportResult.SUCCESS
        except Exception as exc:
            _logger.error("traintel replay: export raised %s", exc)
            ok = False
        if not ok:
            return False
        result.spans_sent += len(part)
        result.requests_sent += 1
    return True


def replay_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Embedded-default files and spooled batches in ``paths``, each directory in name order
    (a spool's names sort in write order)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted({*expand_paths([path]), *spool_files([path])}))
        else:
            found.append(path)
    return found


def _spans_of(path: Path, result: ReplayResult) -> Iterator[ReadableSpan]:
    """Streaming: a long run's file is never held in memory whole."""
    if path.name.endswith(SPOOL_SUFFIX):
        try:
            yield from readable_spans(read_batch(path))
        except (OSError, DecodeError) as exc:
            result.stats.skip(str(path), f"unreadable spooled batch ({exc})")
        return
    for request in read_requests([path], result.stats):
        if isinstance(request, ExportTraceServiceRequest):
            yield from readable_spans(request)
        else:
            result.metric_requests_skipped += 1


def replay(
    paths: Iterable[str | os.PathLike[str]],
    exporter: SpanExporter,
    *,
    delete_sent: bool = False,
    batch_spans: int = BATCH_SPANS,
) -> ReplayResult:
    """Send every span in ``paths`` (files or directories) through ``exporter``, in order."""
    result = ReplayResult()
    for path in replay_files(paths):
        if not all(_send(exporter, b, result) for b in _batches(_spans_of(path, result), batch_spans)):
            result.failed_file = path
            return result
        result.files_done.append(path)
        if delete_sent and path.is_file():
            path.unlink()
            result.files_deleted += 1
    return result


def render(result: ReplayResult, target: str) -> str:
    lines = [
        f"replayed {result.spans_sent} span(s) in {result.requests_sent} request(s) "
        f"from {len(result.files_done)} file(s) to {target}"
    ]
    if result.files_deleted:
        lines.append(f"deleted {result.files_deleted} delivered file(s)")
    if result.metric_requests_skipped:
        lines.append(
            f"skipped {result.metric_requests_skipped} metrics request(s) (metrics are not replayed)"
        )
    if result.stats.skipped:
        lines.append(
            f"skipped {result.stats.skipped} unreadable line(s): {'; '.join(result.stats.reasons[:3])}"
        )
    if result.failed_file is not None:
        lines.append(
            f"export failed at {result.failed_file}; stopped there (run again when the collector is up)"
        )
    return "\n".join(lines)
