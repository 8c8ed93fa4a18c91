"""A bounded on-disk spool of trace batches the collector did not take.

Why one file per batch: a batch is removed the moment it is delivered (no rewriting of a
shared file), the oldest is dropped by deleting one file when the size bound is reached, and
names sort in write order. The span count is in the name, so dropping a batch reports how
many spans went with it without reading it.

Why binary OTLP protobuf (the ``ExportTraceServiceRequest`` bytes a collector receives) and
not the embedded default's JSON lines: spooling happens exactly while the collector is down,
for every batch, and JSON encoding costs about twice the protobuf encoding the exporter does
anyway; serialising the encoded request is nearly free. ``traintel replay`` reads both.

A batch that can never be delivered as it is (the collector rejects it while it takes
others, or it cannot be read back) is moved to a ``quarantine`` directory inside the spool,
where it is kept, named in the log and counted, instead of blocking every batch behind it.

Files are written to a temporary name and renamed, so a crash never leaves half a batch
under a name a reader picks up. Directories are 0700 and files 0600: spans may carry data
the job owner did not mean to share. Only span data is written, never exporter settings
such as header values.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from traintel.exporters.private_files import make_private_dirs

_logger = logging.getLogger(__name__)

#: A spooled batch: one serialised ``ExportTraceServiceRequest``.
SPOOL_SUFFIX = ".otlp.pb"
#: Where a spool keeps the batches it set aside (a subdirectory of the spool).
QUARANTINE_DIR = "quarantine"
_NAME = re.compile(r"^batch-(\d{12})-(\d+)spans" + re.escape(SPOOL_SUFFIX) + "$")


@dataclass(frozen=True, order=True)
class SpoolEntry:
    """One spooled batch: its sequence number (write order), span count and file."""

    seq: int
    spans: int
    path: Path
    size: int


class Spool:
    """Batches of one process, oldest first, within ``max_bytes`` on disk.

    The directory is created on the first write only: a job whose collector never fails
    leaves nothing behind. Thread-safe.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        self.directory = Path(directory).absolute()
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: list[SpoolEntry] = []
        self._next_seq = 0
        self._bytes = 0
        self._write_failed_once = False
        #: Batches set aside in the quarantine directory, oldest first (they share the bound).
        self._quarantined: list[SpoolEntry] = []
        #: Batches and spans deleted to respect the bound (oldest first), since start.
        self.dropped_batches = 0
        self.dropped_spans = 0
        #: Spans moved to the quarantine directory, since start.
        self.quarantined_spans = 0

    @property
    def quarantine_directory(self) -> Path:
        return self.directory / QUARANTINE_DIR

    # --- state -------------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def pending_spans(self) -> int:
        with self._lock:
            return sum(e.spans for e in self._entries)

    def entries(self) -> list[SpoolEntry]:
        """The batches waiting, oldest first (a snapshot)."""
        with self._lock:
            return list(self._entries)

    # --- writing and removing ----------------------------------------------------------------
    def put(self, request: ExportTraceServiceRequest, spans: int) -> SpoolEntry | None:
        """Spool one trace export request; drops the oldest batches to make room.

        Returns ``None`` when the batch cannot be kept: larger than the whole bound, or the
        directory is not writable (logged once). The caller counts it as dropped.
        """
        data = request.SerializeToString()
        if len(data) > self.max_bytes:
            return None
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            path = self.directory / batch_name(seq, spans)
            try:
                make_private_dirs(self.directory)
                write_batch(path, data)
            except OSError as exc:
                if not self._write_failed_once:
                    self._write_failed_once = True
                    _logger.error(
                        "traintel: cannot write the export spool %s (%s); batches the collector "
                        "refuses are dropped (and counted) until it is writable",
                        self.directory,
                        exc,
                    )
                return None
            entry = SpoolEntry(seq, spans, path, len(data))
            self._entries.append(entry)
            self._bytes += entry.size
            while self._bytes > self.max_bytes and (self._quarantined or len(self._entries) > 1):
                self._drop_oldest()
            return entry

    def _drop_oldest(self) -> None:
        """The bound: a quarantined batch goes first (it is the least likely to be delivered)."""
        self._dropped((self._quarantined or self._entries).pop(0))

    def _dropped(self, entry: SpoolEntry) -> None:
        self._bytes -= entry.size
        self.dropped_batches += 1
        self.dropped_spans += entry.spans
        entry.path.unlink(missing_ok=True)

    def remove(self, entry: SpoolEntry) -> None:
        """Forget a delivered batch (no-op if the bound already dropped it)."""
        with self._lock:
            if entry in self._entries:
                self._entries.remove(entry)
                self._bytes -= entry.size
        entry.path.unlink(missing_ok=True)

    def quarantine(self, entry: SpoolEntry) -> Path | None:
        """Move a batch that cannot be delivered as it is out of the way of the rest.

        Returns where it now is, or ``None`` if it was already gone. If it cannot be moved it
        is deleted and counted as dropped: a batch left in place would block the spool.
        """
        with self._lock:
            if entry not in self._entries:
                return None
            self._entries.remove(entry)
            try:
                target = move_to_quarantine(entry.path)
            except OSError as exc:
                _logger.error("traintel: cannot move %s to %s (%s); deleted", entry.path, QUARANTINE_DIR, exc)
                self._dropped(entry)
                return None
            self._quarantined.append(SpoolEntry(entry.seq, entry.spans, target, entry.size))
            self.quarantined_spans += entry.spans
            return target

    def read(self, entry: SpoolEntry) -> ExportTraceServiceRequest | None:
        """The batch, or ``None`` if it is gone (dropped, or removed by someone else)."""
        try:
            return read_batch(entry.path)
        except OSError:
            self.remove(entry)
            return None

    def remove_if_empty(self) -> None:
        """At exit: a spool that was fully delivered leaves no directory behind."""
        with self._lock:
            if self._entries or self._quarantined:
                return
        try:
            self.directory.rmdir()
        except OSError:
            pass


def move_to_quarantine(path: Path) -> Path:
    """Move a spooled batch into the ``quarantine`` directory beside it (created 0700); where
    it now is. Raises ``OSError`` if it cannot be moved."""
    target = path.parent / QUARANTINE_DIR / path.name
    make_private_dirs(target.parent)
    os.replace(path, target)
    return target


def write_batch(path: Path, data: bytes) -> None:
    """Write a serialised request (0600) under a temporary name, then rename it."""
    temporary = path.with_name("." + path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def batch_name(seq: int, spans: int) -> str:
    return f"batch-{seq:012d}-{spans}spans{SPOOL_SUFFIX}"


def batch_seq(path: Path) -> int | None:
    """The sequence number in a spooled batch's name (``None`` if it is not one)."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def batch_spans(path: Path) -> int | None:
    """How many spans a spooled batch was written with, from its name (``None``: not one)."""
    match = _NAME.match(path.name)
    return int(match.group(2)) if match else None


def read_batch(path: Path) -> ExportTraceServiceRequest:
    """One spooled batch (raises ``OSError``, or ``DecodeError`` for a corrupt file; a batch
    that decodes may still hold values no span can have, see ``proto_spans``)."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(path.read_bytes())
    return request


def spool_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Spooled batches in ``paths`` (files, or directories searched recursively), in write order."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob(f"*{SPOOL_SUFFIX}") if _NAME.match(p.name)))
        elif path.name.endswith(SPOOL_SUFFIX):
            found.append(path)
    return found


def spooled_requests(paths: Iterable[str | os.PathLike[str]]) -> Iterator[ExportTraceServiceRequest]:
    """Every readable spooled batch in ``paths``, in write order (for tests and tools)."""
    for path in spool_files(paths):
        yield read_batch(path)
