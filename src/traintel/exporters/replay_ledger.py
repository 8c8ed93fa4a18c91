"""What ``traintel replay`` already delivered, remembered per directory and endpoint.

Why: a replay stopped partway (the collector went down again) must resume where it stopped,
not send the whole file again; and a spool replayed twice must not arrive twice. The ledger
records, for each file and endpoint, how many of the file's spans (in file order) were dealt
with: delivered, set aside as rejected, or skipped as sent already from a spool batch.

Why a file in the same directory as the files it describes: whichever path a later run is
given (the directory, its parent, the file itself), it finds the same ledger. The endpoint is
kept without user name, password or query, so no secret is written to disk. A file whose first
bytes changed is a different file and starts over; one that grew (a job still writing) keeps
its progress.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from traintel.exporters.private_files import open_private

_logger = logging.getLogger(__name__)

LEDGER_NAME = ".traintel-replay.json"
_FORMAT = 1
#: A file is recognised by a hash of up to this many of its first bytes.
_HEAD_BYTES = 64 * 1024


def target_key(protocol: str, endpoint: str) -> str:
    """``protocol endpoint`` with user name, password, query and fragment left out."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{protocol} {urlunsplit((parts.scheme, host, parts.path, '', ''))}"


def _fingerprint(path: Path, head: int) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read(head)).hexdigest()


class Ledger:
    """The ledger of one directory, for one endpoint. Saved after every change (atomically)."""

    def __init__(self, directory: Path, target: str) -> None:
        self.path = directory / LEDGER_NAME
        self.target = target
        self._data: dict[str, Any] = self._load()
        self._warned = False

    def _load(self) -> dict[str, Any]:
        data = None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            _logger.warning("traintel replay: ignoring unreadable %s (%s)", self.path, exc)
        if isinstance(data, dict) and data.get("format") == _FORMAT and isinstance(data.get("targets"), dict):
            return data
        return {"format": _FORMAT, "targets": {}}

    def _files(self) -> dict[str, Any]:
        files: dict[str, Any] = self._data["targets"].setdefault(self.target, {})
        return files

    def done(self, file: Path) -> int:
        """How many of ``file``'s spans (in file order) were dealt with: where to resume it; 0 if
        it is unknown or its first bytes changed."""
        entry = self._files().get(file.name)
        if not isinstance(entry, dict):
            return 0
        try:
            head = int(entry["head"])
            return int(entry["done"]) if _fingerprint(file, head) == entry["fingerprint"] else 0
        except (OSError, KeyError, TypeError, ValueError):
            return 0

    def record(self, file: Path, done: int) -> None:
        try:
            head = min(_HEAD_BYTES, file.stat().st_size)
            fingerprint = _fingerprint(file, head)
        except OSError:
            return
        self._files()[file.name] = {
            "fingerprint": fingerprint,
            "head": head,
            "done": done,
        }
        self._save()

    def forget(self, file: Path) -> None:
        """A file deleted after delivery: nothing to remember."""
        if self._files().pop(file.name, None) is not None:
            self._save()

    def _save(self) -> None:
        try:
            with open_private(self.path) as fh:  # written whole, then renamed into place
                json.dump(self._data, fh)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                _logger.warning(
                    "traintel replay: cannot record progress in %s (%s); running again will send "
                    "this directory's spans again",
                    self.path,
                    exc,
                )
