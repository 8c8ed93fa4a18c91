"""Files and directories only their owner can read, whatever the process's umask.

Why: telemetry holds host names, paths, model and run details, and sometimes the contents of
error messages; a job started under ``umask 000`` (common in containers) must not leave it
world-readable. ``Path.mkdir(parents=True)`` gives the parents it creates 0777 less the umask,
and ``open()`` gives 0666 less the umask, so neither is enough on its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO


def make_private_dirs(directory: Path) -> None:
    """``mkdir -p`` where every directory it creates is 0700 (existing ones are left alone)."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask; 0700 must survive any


def open_private(path: str | os.PathLike[str], *, append: bool = False) -> IO[str]:
    """A text file for writing, created 0600 (an existing file keeps its mode)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, "a" if append else "w", encoding="utf-8")
