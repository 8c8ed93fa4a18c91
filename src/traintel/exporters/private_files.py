"""Files and directories only their owner can read, whatever the process's umask.

Why: telemetry holds host names, paths, model and run details, and sometimes the contents of
error messages; a job started under ``umask 000`` (common in containers) must not leave it
world-readable. ``Path.mkdir(parents=True)`` gives the parents it creates 0777 less the umask,
and ``open()`` gives 0666 less the umask, so neither is enough on its own.

What the ``traintel`` commands write (``report --html``, ``export-trace -o``) is written to a
fresh file beside the target and renamed over it: a symbolic link planted at the path is
replaced, never followed, and an existing file is replaced by an owner-only one, not rewritten
in place (which would keep its mode).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def make_private_dirs(directory: Path) -> None:
    """``mkdir -p`` where every directory it creates is 0700 (existing ones are left alone)."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask; 0700 must survive any


def open_append(path: str | os.PathLike[str]) -> int:
    """A file descriptor appending to ``path``, created 0600 (an existing file keeps its mode);
    a symbolic link at ``path`` is refused (``OSError``), not followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o600)


def _writes_in_place(path: Path) -> bool:
    """A device or a pipe (``/dev/stdout``, a fifo): written to where it is, as asked."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # missing, or a dangling link: a fresh file takes its place
        return False


@contextlib.contextmanager
def open_private(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """A text file to write ``path`` whole: a fresh 0600 file beside it, renamed over it when
    the block ends without an error (removed otherwise). Nothing at ``path`` is followed or
    rewritten in place, except a device or a pipe."""
    target = Path(path)
    if _writes_in_place(target):
        with open(target, "w", encoding="utf-8") as fh:
            yield fh
        return
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp: O_EXCL, mode 0600
            yield fh
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
