"""The helper process that reports a rank whose interpreter C code holds, while it holds it.

Why a process: C code that holds the GIL (a native call that never releases it, a pathological
regular expression) stops every Python thread of the process, the stall watcher included, so
nothing in the process can report it until it lets go. Two pieces need no GIL:

- ``faulthandler``'s timer is a C thread. The watcher re-arms it at every wake with its wake
  period plus the stall threshold (``dump_traceback_later``): while the watcher runs, it never
  fires; once the watcher has been kept from running for the threshold past its next wake, it
  dumps every thread's Python stack, without the GIL, into a pipe.
- A helper script (``traintel._runtime.gil_helper``: no import of traintel until it reports,
  about 10 MB), in a process of its own per rank, reads that pipe, and the state the watcher
  writes to a second pipe at each wake (phase, iteration, collective sequence, the iteration's
  ids), and sends the ``ml.training.hang_suspect`` record with ``ml.training.hang.python`` =
  ``holding_gil`` and the training thread's stack from the dump. The rank's watcher sends the
  ``hang_recovered`` record once it runs again.

Why not the alternatives: a pending call (``Py_AddPendingCall``) that never runs shows that
the main thread runs no bytecode, but it is equally stuck behind a blocking call that released
the GIL, and whatever notices it must itself run without the GIL; a native helper thread needs
a compiled extension; a record written when the GIL is released again comes after the hang.

The helper runs for a rank of a multi-rank job (``torch.distributed`` initialised with more
than one rank: the others wait on it), from the watcher's first wake after that; a process on its
own has nobody waiting, and its watcher reports a held GIL once it runs again. The helper exits
when the rank closes the pipes (its shutdown) or dies (end of file). Its cost is one idle process
per rank; the rank's is one ``dump_traceback_later`` (a thread start in C) and one small pipe
write per second.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _in_a_multi_rank_job() -> bool:
    """``torch.distributed`` runs with other ranks: they would wait on this one."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:
        return False


class GilWatch:
    """The rank's side: starts the helper, re-arms the timer and hands over the state."""

    def __init__(
        self, after_s: float, rank: int, resource: Mapping[str, Any], file: Path | None, helper: Path
    ) -> None:
        self._after_s = after_s  # the watcher's silence that means a held GIL
        self._helper = str(helper)  # the helper process's script
        self._setup = {
            "rank": rank,
            "resource": dict(resource),
            "file": str(file.with_name(file.name.replace(".otlp.", "-gil.otlp.", 1))) if file else None,
            "path": str(Path(__file__).resolve().parents[2]),  # where this traintel is imported from
        }
        self._process: subprocess.Popen[bytes] | None = None
        self._state_w = self._dump_w = -1
        self._last_state = b""
        self._started = False

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None and self._dump_w >= 0

    def tick(self, state: Mapping[str, object], watched: bool) -> None:
        """One wake of the watcher: the helper starts at the first, the timer is re-armed (while
        the rank is watched: a GIL held before the first iteration is not a stall) and the state
        sent (when it changed)."""
        import faulthandler

        if not self._started:
            if not _in_a_multi_rank_job():
                return
            self._started = True
            self._start()
        if not self.alive():
            return
        if watched:
            faulthandler.dump_traceback_later(self._after_s, repeat=False, file=self._dump_w, exit=False)
        else:
            faulthandler.cancel_dump_traceback_later()
        line = json.dumps(state, separators=(",", ":")).encode() + b"\n"
        if line == self._last_state:
            return
        try:
            os.write(self._state_w, line)
            self._last_state = line
        except BlockingIOError:
            pass  # the helper is busy reporting: the next wake sends the state again
        except OSError:
            self.stop()  # the helper is gone: nothing left to report to

    def _start(self) -> None:
        state_r, state_w = os.pipe()
        dump_r, dump_w = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, self._helper, str(state_r), str(dump_r), json.dumps(self._setup)],
                pass_fds=(state_r, dump_r),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except OSError:
            os.close(state_w)
            os.close(dump_w)
            return
        finally:
            os.close(state_r)
            os.close(dump_r)
        os.set_blocking(state_w, False)
        self._state_w, self._dump_w = state_w, dump_w
        _running.add(self)

    def forget(self) -> None:
        """In a forked child (a data loader worker): these pipes are the parent's. Closed, so
        the helper sees its end of file when the parent exits, not when the last worker does."""
        self._close_pipes()
        self._process = None

    def stop(self) -> None:
        """Disarm the timer, close the pipes (the helper exits) and reap the helper, briefly."""
        import faulthandler

        if self._dump_w >= 0:
            faulthandler.cancel_dump_traceback_later()  # before its file descriptor closes
        self._close_pipes()
        _running.discard(self)
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):  # still sending a report: it exits by itself
                process.wait(timeout=1.0)

    def _close_pipes(self) -> None:
        for fd in (self._state_w, self._dump_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._state_w = self._dump_w = -1


#: The helpers of this process, whose pipes a forked child closes.
_running: weakref.WeakSet[GilWatch] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for watch in list(_running):
        watch.forget()
    _running.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
