"""A terminating signal the main thread cannot take: noticed off it, so the job still stops.

A Python signal handler runs only when the main thread comes back to the interpreter. A job
whose main thread waits inside C++ (a collective that never completes, a store wait after a
peer died) would, with traintel's SIGTERM handler installed, live on until that call returns,
where without it the signal's default action ends the process at once: the scheduler's SIGTERM
would be ignored for as long as the collective's timeout, then escalate to SIGKILL.

CPython's C-level handler writes each signal's number to the "wakeup" file descriptor whatever
the main thread is doing; a thread here reads it. When the main thread has not begun handling
the signal within :data:`GRACE_S`, ``on_stuck(signum, received_ns)`` runs on that thread (the
preemption report, then death by the signal).

A forked child's signals are its own, and the parent's watch thread did not survive the fork:
the child lets the descriptor go (where it cannot, it is pointed at ``/dev/null``), and a job
the child configures (a ``multiprocessing.Pool`` worker that trains) starts a watch of its own.
Without one, such a worker, whose job's threads may take the signal while its main thread
waits in C for its next task, lived on after its pool's ``terminate()``, and the pool's exit
waited for it forever. Nothing is installed where the descriptor is already someone else's (an
asyncio loop's), nor on Windows.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection

_logger = logging.getLogger("traintel")

#: How long the main thread has to begin handling a signal before it counts as stuck in C: a
#: Python thread reaches its handler within milliseconds (the interpreter's switch interval).
GRACE_S = 1.0

_lock = threading.RLock()  # (re-entered by a second signal's handler while the first counts)
_seen: dict[int, int] = {}  # signal -> times the watch read it
_handled: dict[int, int] = {}  # signal -> times the main thread's handler began
_changed = threading.Condition(_lock)
_sockets: list[socket.socket] = []  # (kept: the writer's descriptor is the one CPython writes to)


def handling(signum: int) -> None:
    """The main thread's handler began for ``signum`` (called first thing in it)."""
    with _changed:
        _handled[signum] = _handled.get(signum, 0) + 1
        _changed.notify_all()


def watch(signums: Collection[int], on_stuck: Callable[[int, int], None]) -> bool:
    """Start watching (main thread, once per process); False where it cannot."""
    if os.name == "nt":
        return False
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):  # not the main thread
        reader.close()
        writer.close()
        return False
    if previous != -1:  # someone else's (an event loop's): theirs stays
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
        return False
    _sockets.extend((reader, writer))
    thread = threading.Thread(
        target=_run, args=(reader, frozenset(signums), on_stuck), name="traintel-signals", daemon=True
    )
    thread.start()
    return True


def _forget() -> None:
    """In a forked child: the parent's watch (its descriptor, counts, sockets and lock, which
    its thread may have held at the fork) let go."""
    global _lock, _changed
    _lock = threading.RLock()
    _changed = threading.Condition(_lock)
    _seen.clear()
    _handled.clear()
    if not _sockets:  # the parent watched nothing
        return
    fd = _sockets[-1].fileno()  # the writer
    try:
        previous = signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        _silence(fd)
        return
    if previous != fd:  # someone else's since: theirs stays
        signal.set_wakeup_fd(previous)
        _silence(fd)
        return
    for sock in _sockets:
        sock.close()
    _sockets.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def _silence(fd: int) -> None:
    """In a forked child that cannot let its descriptor go: its signals go to /dev/null, not to
    its parent's watch."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass


def _run(reader: socket.socket, signums: frozenset[int], on_stuck: Callable[[int, int], None]) -> None:
    while True:
        try:
            data = reader.recv(256)
        except OSError:
            return
        received_ns = time.time_ns()
        for signum in (s for s in data if s in signums):
            with _changed:
                _seen[signum] = seen = _seen.get(signum, 0) + 1
                begun = _changed.wait_for(lambda: _handled.get(signum, 0) >= seen, GRACE_S)  # noqa: B023
            if not begun:
                try:
                    on_stuck(signum, received_ns)
                except Exception:
                    _logger.exception("traintel: could not handle signal %d off the main thread", signum)
