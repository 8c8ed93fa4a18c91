"""The embedded default: OTLP/JSON lines in a local file, one export request per line.

Why a file and not a local collector: ``make demo`` and a first experiment must work with
nothing else installed, and a file of standard OTLP/JSON requests can later be replayed to
any collector or read by ``traintel`` commands. Traces, metrics and logs (hang reports) of one
process share one file (the line's top-level key says which), named by service, start time,
host and pid so ranks and restarts never collide: the host because the nodes of a job in
containers often run their ranks under the same pids, started in the same second, and write to
one shared directory.

Writes happen on the SDK's export threads, never on the training thread. A write error is
reported once and the export fails; training goes on and other exporters are unaffected. A
line is either written whole or not at all: a write cut short (a full disk) is truncated away
before anything else is appended, so the next line is never glued to half of this one and lost
with it. What could not be written is counted, said when the file is writable again, and at
exit.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import socket
import stat
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from traintel import environment_variables as ev
from traintel._sdk import otel_private
from traintel.exporters.health import HEALTH, NOT_WRITTEN, ExportHealth
from traintel.exporters.otlp_json import logs_to_json_line, metrics_to_json_line, spans_to_json_line
from traintel.exporters.private_files import make_private_dirs, open_append
from traintel.exporters.records import FILE_SUFFIX
from traintel.exporters.span_repair import encoded_mending

_logger = logging.getLogger(__name__)

DEFAULT_OUTPUT_DIR = "traintel-runs"

#: How often the file gets a metric line when ``OTEL_METRIC_EXPORT_INTERVAL`` is not set (the
#: SDK's default is 60 s). The file is read after the fact, and what its readers take from metric
#: lines is each counter's last cumulative value (the per-window figures are in the spans), so a
#: line a minute would be most of the file (0.8 of 1.4 MB per rank-hour at 10 steps/s) for
#: nothing; the last line is written at exit, and a killed job's counters are at most this old.
FILE_METRIC_EXPORT_INTERVAL_MILLIS = 300_000
#: How long the file's batch processor gathers spans when ``OTEL_BSP_SCHEDULE_DELAY`` is not set
#: (the SDK's default is 5 s). Every batch is one line repeating the resource and scope (~1 kB):
#: at the SDK's 5 s a real hour at 10 steps/s wrote 234 of them, 0.23 MB, and the file went over
#: its 1 MB budget. A killed job loses no accounting by the wait: the progress mark beside the
#: file holds its account to the last iteration every 5 s; a preemption or exit flushes.
FILE_SPAN_EXPORT_DELAY_MILLIS = 60_000
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: What a bounded exit names when it runs out while a line is being written.
WRITING_THE_FILE = "the telemetry file writer"


def _file_name(service_name: str, started: float, pid: int) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    safe = _UNSAFE.sub("_", service_name).strip("._") or "traintel"
    host = _UNSAFE.sub("_", socket.gethostname()).strip("._")[:64] or "host"
    return f"{safe}-{stamp}-{host}-{pid}{FILE_SUFFIX}"


class OtlpJsonLinesFile:
    """An append-only OTLP/JSON-lines file shared by a process's span and metric exporters.

    The path is fixed on the first write (the service name comes from the first resource
    seen), or given explicitly. After a fork the child starts its own file.
    """

    def __init__(
        self, output_dir: str | os.PathLike[str] | None = None, path: str | os.PathLike[str] | None = None
    ):
        # Absolute now: a job that changes directory later must not scatter its telemetry.
        self._output_dir = Path(
            output_dir or os.environ.get(ev.TRAINTEL_OUTPUT_DIR) or DEFAULT_OUTPUT_DIR
        ).absolute()
        self._explicit_path = Path(path).absolute() if path is not None else None
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._path: Path | None = self._explicit_path
        self._pid = os.getpid()
        self._started = time.time()
        self._failed_once = False
        self._reopened_once = False
        self._closed = False
        self._users = 0
        self.lines_written = 0
        #: Lines not written (a write error) since the last said, and whether the file may end in
        #: half a line that could not be truncated (the next line then starts on a line of its own).
        self._lost_since_said = 0
        self._fragment = False

    def acquire(self) -> None:
        """Register an exporter writing here; the file closes when the last one releases."""
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self.close()

    @property
    def path(self) -> Path | None:
        """Where lines go; ``None`` until the first write decides it."""
        return self._path

    def planned_path(self, service_name: str) -> Path:
        """The path the first write will use for ``service_name`` (for reports at start)."""
        if self._explicit_path is not None:
            return self._explicit_path
        if self._path is not None and self._pid == os.getpid():
            return self._path
        return self._output_dir / _file_name(service_name, self._started, os.getpid())

    def _open(self, service_name: str) -> int:
        if self._pid != os.getpid():  # forked: the parent's handle and name are not ours
            self._fd = None
            self._path = self._explicit_path
            self._pid = os.getpid()
            self._started = time.time()
        if self._fd is None:
            path = self.planned_path(service_name)
            make_private_dirs(path.parent)
            self._fd = open_append(path)
            self._path = path
        return self._fd

    def _drop_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def write_line(self, line: str, service_name: str) -> bool:
        data = (line + "\n").encode("utf-8")
        with self._lock, HEALTH.busy(WRITING_THE_FILE):
            if self._closed:
                return False
            fd: int | None = None
            start = 0
            try:
                fd = self._open(service_name)
                info = os.fstat(fd)
                if info.st_nlink == 0 and stat.S_ISREG(info.st_mode):
                    fd = self._reopen_removed(service_name)
                    info = os.fstat(fd)
                start = info.st_size
                if self._fragment:  # half a line we could not truncate: ours starts on a new one
                    data = b"\n" + data
                _write_all(fd, data)
                self._fragment = False
            except OSError as exc:
                self._lost(fd, start, exc)
                return False
            self.lines_written += 1
            if self._lost_since_said:
                _logger.warning(
                    "traintel: telemetry file %s is writable again; %d line(s) could not be written "
                    "meanwhile and are lost (counted in the exit report)",
                    self._path,
                    self._lost_since_said,
                )
                self._lost_since_said = 0
            return True

    def _lost(self, fd: int | None, start: int, exc: OSError) -> None:
        """A line not written: cut what of it reached the file, count it, say the first."""
        self._lost_since_said += 1
        if fd is not None:
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode) and os.fstat(fd).st_size > start:
                    os.ftruncate(fd, start)
            except OSError:
                self._fragment = True
        if not self._failed_once:
            self._failed_once = True
            target = self._path or self._output_dir
            _logger.error(
                "traintel: cannot write telemetry file %s (%s); training continues, "
                "this exporter drops data until the file is writable (counted, and said at exit)",
                target,
                exc,
            )
        self._drop_fd()

    def _reopen_removed(self, service_name: str) -> int:
        """The file was deleted under us (a cleanup job, a user): writing on would fill an
        unlinked inode nobody can read. Start a new file at the same path, and say so once."""
        removed = self._path
        self._drop_fd()
        self._fragment = False
        fd = self._open(service_name)
        if not self._reopened_once:
            self._reopened_once = True
            _logger.warning(
                "traintel: telemetry file %s was removed while in use; writing a new one there "
                "(what the removed file held is gone)",
                removed,
            )
        return fd

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop_fd()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


_default_files: dict[str, OtlpJsonLinesFile] = {}
_default_files_lock = threading.Lock()


def default_file(output_dir: str | os.PathLike[str] | None = None) -> OtlpJsonLinesFile:
    """The process-wide file for ``output_dir``, so span and metric exporters share it."""
    key = _default_key(output_dir)
    with _default_files_lock:
        existing = _default_files.get(key)
        if existing is None or existing._closed:
            existing = _default_files[key] = OtlpJsonLinesFile(key)
        return existing


def made_default_file(output_dir: str | os.PathLike[str] | None = None) -> OtlpJsonLinesFile | None:
    """:func:`default_file`'s file if an exporter made it, closed or not (what the exporters
    the SDK built from ``OTEL_*`` write): None, and none made, if not."""
    with _default_files_lock:
        return _default_files.get(_default_key(output_dir))


def _default_key(output_dir: str | os.PathLike[str] | None) -> str:
    return str(Path(output_dir or os.environ.get(ev.TRAINTEL_OUTPUT_DIR) or DEFAULT_OUTPUT_DIR).resolve())


def _service_name_of(resource_attributes: object) -> str:
    name = getattr(resource_attributes, "get", lambda _k: None)("service.name")
    return str(name) if name else "traintel"


class _FileWriter:
    """What the three exporters share: the file they write to (given, at ``path``, or the
    process's default), held until their shutdown; nothing to flush (a line is written whole
    by ``export``); where what was not written is counted."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        file: OtlpJsonLinesFile | None = None,
        health: ExportHealth = HEALTH,
    ) -> None:
        super().__init__()
        self.file = file or (OtlpJsonLinesFile(path=path) if path is not None else default_file())
        self.file.acquire()
        self._released = False
        self._health = health

    def force_flush(self, timeout_millis: float = 30_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        if not self._released:
            self._released = True
            self.file.release()


class OtlpJsonFileSpanExporter(_FileWriter, SpanExporter):
    """Span exporter writing one ``ExportTraceServiceRequest`` per line.

    Registered as the ``traintel_file`` traces exporter, so ``OTEL_TRACES_EXPORTER=otlp,traintel_file``
    keeps a local copy next to OTLP export.
    """

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:  # one bad span is mended or dropped, not its batch (span_repair)
            spans, line = encoded_mending(spans_to_json_line, spans, self._health)
        except Exception:
            _logger.exception("traintel: could not encode %d spans", len(spans))
            return SpanExportResult.FAILURE
        if line is None:
            return SpanExportResult.SUCCESS  # each one dropped and counted
        if self.file.write_line(line, _service_name_of(spans[0].resource.attributes)):
            return SpanExportResult.SUCCESS
        self._health.drop_spans(NOT_WRITTEN, len(spans))
        return SpanExportResult.FAILURE


class OtlpJsonFileMetricExporter(_FileWriter, MetricExporter):
    """Metric exporter writing one ``ExportMetricsServiceRequest`` per line (cumulative)."""

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> MetricExportResult:
        if not metrics_data.resource_metrics:
            return MetricExportResult.SUCCESS
        try:
            line = metrics_to_json_line(metrics_data)
        except Exception:
            _logger.exception("traintel: could not encode metrics")
            return MetricExportResult.FAILURE
        service = _service_name_of(metrics_data.resource_metrics[0].resource.attributes)
        if self.file.write_line(line, service):
            return MetricExportResult.SUCCESS
        self._health.add("metric_lines_not_written")
        return MetricExportResult.FAILURE


class OtlpJsonFileLogExporter(_FileWriter):
    """Log record exporter writing one ``ExportLogsServiceRequest`` per line (traintel's hang
    reports). Registered as the ``traintel_file`` logs exporter. Duck-typed as the SDK's
    ``LogRecordExporter``, whose module is imported only when a record is exported."""

    def export(self, batch: Sequence[otel_private.ReadableLogRecord]) -> object:
        result = otel_private.LogRecordExportResult
        if not batch:
            return result.SUCCESS
        try:
            line = logs_to_json_line(batch)
        except Exception:
            _logger.exception("traintel: could not encode %d log records", len(batch))
            return result.FAILURE
        ok = self.file.write_line(line, _service_name_of(batch[0].resource.attributes))
        return result.SUCCESS if ok else result.FAILURE
