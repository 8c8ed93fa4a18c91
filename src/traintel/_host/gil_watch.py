"""The helper process that reports a rank whose interpreter C code holds, while it holds it.

Why a process: C code that holds the GIL (a native call that never releases it, a pathological
regular expression) stops every Python thread of the process, the stall watcher included, so
nothing in the process can report it until it lets go. Two pieces need no GIL:

- ``faulthandler``'s timer is a C thread. The watcher re-arms it at every wake with the stall
  threshold (``dump_traceback_later``): while the watcher runs, it never fires; once the watcher
  has been kept from running for the threshold, it dumps every thread's Python stack, without
  the GIL, into a pipe.
- This module, run as a script (``python gil_watch.py``: no import of traintel, about 10 MB)
  in a process of its own per rank, reads that pipe, and the state the watcher writes to a
  second pipe at each wake (phase, iteration, collective sequence, the iteration's ids). When
  a dump arrives it imports traintel, builds a logs pipeline from the ``OTEL_*`` environment it
  inherited (the embedded file: one of its own beside the rank's, ``-gil`` before the suffix)
  and sends the ``ml.training.hang_suspect`` record with ``ml.training.hang.python`` =
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

import json
import os
import re
import select
import subprocess
import sys
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: A thread's header in a ``faulthandler`` dump, and one of its frames (most recent first).
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
#: How long the helper waits for the rest of a dump after its last bytes.
_DUMP_QUIET_S = 0.3


def held_stack(dump: str, thread: int) -> tuple[str, str]:
    """The stack of ``thread`` in a ``faulthandler`` dump, as Python prints a traceback (most
    recent call last, with the source lines), and its top frame; empty when the dump lacks it."""
    import linecache

    stacks: dict[int, list[tuple[str, int, str]]] = {}
    frames: list[tuple[str, int, str]] | None = None
    for line in dump.splitlines():
        header = _THREAD.match(line)
        if header is not None:
            frames = stacks.setdefault(int(header.group(1), 16), [])
            continue
        frame = _FRAME.match(line)
        if frame is not None and frames is not None:
            frames.append((frame.group(1), int(frame.group(2)), frame.group(3)))
    found = stacks.get(thread)
    if not found:
        return "", ""
    lines = []
    for filename, lineno, name in reversed(found):
        lines.append(f'  File "{filename}", line {lineno}, in {name}\n')
        source = linecache.getline(filename, lineno).strip()
        if source:
            lines.append(f"    {source}\n")
    filename, lineno, name = found[0]
    return "".join(lines), f"{name} ({filename}:{lineno})"


def _in_a_multi_rank_job() -> bool:
    """``torch.distributed`` runs with other ranks: they would wait on this one."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:
        return False


class GilWatch:
    """The rank's side: starts the helper, re-arms the timer and hands over the state."""

    def __init__(self, threshold_s: float, rank: int, resource: Mapping[str, Any], file: Path | None) -> None:
        self._threshold_s = threshold_s
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
            faulthandler.dump_traceback_later(self._threshold_s, repeat=False, file=self._dump_w, exit=False)
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
                [sys.executable, __file__, str(state_r), str(dump_r), json.dumps(self._setup)],
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
        for fd in (self._state_w, self._dump_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._state_w = self._dump_w = -1
        self._process = None

    def stop(self) -> None:
        """Disarm the timer, close the pipes (the helper exits) and reap the helper, briefly."""
        import faulthandler

        if self._dump_w >= 0:
            faulthandler.cancel_dump_traceback_later()  # before its file descriptor closes
        for fd in (self._state_w, self._dump_w):
            if fd >= 0:
                os.close(fd)
        self._state_w = self._dump_w = -1
        _running.discard(self)
        process, self._process = self._process, None
        if process is not None:
            try:
                process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass  # still sending a report: it exits by itself


#: The helpers of this process, whose pipes a forked child closes.
_running: weakref.WeakSet[GilWatch] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for watch in list(_running):
        watch.forget()
    _running.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --- the helper process ---------------------------------------------------------------------------
def _report(setup: Mapping[str, Any], state: Mapping[str, Any], dump: str) -> None:
    """Send the hang record of a rank whose GIL is held (imports traintel: only now)."""
    sys.path.insert(0, setup["path"])
    from opentelemetry.sdk.resources import Resource

    from traintel import semconv
    from traintel._host import stall
    from traintel._sdk.providers import environment_log_pipeline

    now = time.time_ns()
    thread = int(state.get("thread") or 0)
    stack, top = held_stack(dump, thread)
    report = stall.StallReport(
        rank=int(setup["rank"]),
        phase=str(state.get("phase", "")),
        iteration=state.get("iteration"),
        entered=int(state.get("entered", 0)),
        completed=int(state.get("completed", 0)),
        waiting_in=state.get("waiting_in"),
        stalled_s=(now - int(state.get("progress_ns", now))) / 1e9,
        python=semconv.PYTHON_HOLDING_GIL,
        stack=stack,
        top_frame=top,
        thread_id=thread,
    )
    logs = environment_log_pipeline(Resource(setup["resource"]), setup.get("file"))
    link = stall.span_context(int(state.get("trace_id") or 0), int(state.get("span_id") or 0))
    # the watcher's last look came at most a second before C code took the GIL: a fast loop may
    # have gone a few iterations further since
    body = report.describe() + " (phase, iteration and collectives as last seen, up to a second before)"
    stall.emit(logs.logger(), semconv.EVENT_HANG_SUSPECT, report, link, now, body)
    logs.shutdown(10_000)


def main(argv: list[str]) -> None:
    """Wait for a dump (or the end of the rank); report each dump with the latest state."""
    state_fd, dump_fd, setup = int(argv[1]), int(argv[2]), json.loads(argv[3])
    state: dict[str, Any] = {}
    pending, dump = b"", b""
    while True:
        readable, _, _ = select.select([state_fd, dump_fd], [], [], _DUMP_QUIET_S if dump else None)
        if not readable and dump:  # the dump is complete
            _report(setup, state, dump.decode("utf-8", "replace"))
            dump = b""
            continue
        for fd in readable:
            data = os.read(fd, 1 << 16)
            if not data:  # the rank closed its end, or died
                if dump:
                    _report(setup, state, dump.decode("utf-8", "replace"))
                return
            if fd == dump_fd:
                dump += data
                continue
            *lines, pending = (pending + data).split(b"\n")
            if lines:
                state = json.loads(lines[-1])


if __name__ == "__main__":
    del sys.path[0]  # this script's folder: its modules are not top-level ones
    main(sys.argv)
