"""The progress mark: a few hundred bytes beside the embedded file, overwritten in place.

Why beside and in place: the mark says how far a job got since its last window record (its
iterations, where their time went, when it was last alive) so that a job killed with
``kill -9`` loses seconds of accounting, not a window. Written every few seconds into the OTLP
file, each mark would be a line with the whole resource (~1 kB): hundreds of kB per rank-hour,
and lines that no collector needs (window records already carry all of it once the window
closes). Overwritten in place, it costs no bytes per hour and no metadata operation on a shared
filesystem (no rename): one ``pwrite`` at offset 0, never shorter than the last one (padded with
spaces, which JSON ignores), so a reader sees the last mark whole or the one before.

``traintel`` commands read ``<file>.progress`` with ``<file>``; a collector never sees it. A
mark also names its job (the resource's identity) and when telemetry started: a job killed before
its file's first line (the file gathers spans for a minute) is then still one of its session's
jobs, read from its mark alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from traintel import semconv
from traintel.exporters.private_files import make_private_dirs

MARK_SUFFIX: Final = ".progress"
#: The key of a mark's object: what it is, should anything else read it.
MARK_KEY: Final = "traintel.progress"
_MIN_WIDTH = 512


def mark_path(file: str | os.PathLike[str]) -> Path:
    """Where the mark of the OTLP file ``file`` is."""
    path = Path(file)
    return path.with_name(path.name + MARK_SUFFIX)


#: The resource attributes a mark names its job with: what the analysis groups processes by,
#: and the host it ran on (a node that keeps killing its jobs).
IDENTITY: Final = (
    semconv.SERVICE_NAME, semconv.SERVICE_INSTANCE_ID, semconv.RUN_ID, semconv.SESSION_TAG,
    semconv.RESTART_COUNT, semconv.RANK, semconv.PERF_TAG, semconv.HOST_NAME,
)  # fmt: skip


def identity(resource: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``resource`` a mark carries (see :data:`IDENTITY`)."""
    return {key: resource[key] for key in IDENTITY if key in resource}


def lone_marks(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The OTLP files, under the directories of ``paths``, that have a mark and do not exist:
    jobs whose spans never left the process (killed in their first minute, or still in it)."""
    marks = [
        mark for path in map(Path, paths) if path.is_dir() for mark in sorted(path.rglob("*" + MARK_SUFFIX))
    ]
    files = [mark.with_name(mark.name.removesuffix(MARK_SUFFIX)) for mark in marks]
    return [file for file in files if not file.exists()]


def process_key(resource: Mapping[str, Any]) -> str:
    """The process a resource's records belong to (its service instance, else its run id): how
    the analysis keys processes, and how a mark names its own."""
    return str(resource.get(semconv.SERVICE_INSTANCE_ID) or resource.get(semconv.RUN_ID) or "unknown")


class MarkFile:
    """One process's mark, overwritten in place (the caller serialises writes)."""

    def __init__(self) -> None:
        self._path: Path | None = None
        self._fd: int | None = None
        self._width = _MIN_WIDTH

    def write(self, path: Path, mark: dict[str, Any]) -> None:
        if path != self._path:
            self.close()
            make_private_dirs(path.parent)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            self._path, self._width = path, _MIN_WIDTH
        payload = json.dumps({MARK_KEY: mark}, separators=(",", ":"))
        self._width = max(self._width, len(payload))
        assert self._fd is not None
        os.pwrite(self._fd, payload.ljust(self._width).encode(), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = self._path = None


def read_mark(file: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The mark of the OTLP file ``file``, if it has a readable one."""
    try:
        found = json.loads(mark_path(file).read_bytes()).get(MARK_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) else None
