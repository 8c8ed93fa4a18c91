"""The running job: the one registry of this process's telemetry.

Why here, in the recorder: every phase reads the running job's engine on every step, and the
recorder must not import the runtime that builds the job. So the registry holds the job as
what it needs of it (:class:`Job`, the runtime's ``Telemetry``), and the runtime registers once
how to configure one from the environment on first use (``set_first_use``). Everything about
"the job of this process" is here: the current one, the one an explicit shutdown is closing
(its final metric export still reports it), the exit and fork hooks.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from traintel._recorder.engine import TrainingEngine

_logger = logging.getLogger("traintel")


class Job(Protocol):
    """What the registry needs of a job."""

    closed: bool

    @property
    def engine(self) -> TrainingEngine | None: ...

    def shutdown(self, timeout_s: float | None = None) -> bool: ...


J = TypeVar("J", bound=Job)

#: The running job's engine, read on every step; None before configuration, when telemetry is
#: off, after shutdown.
engine: TrainingEngine | None = None
#: The current job, and the one an explicit shutdown() is closing (still reported until shut).
job: Job | None = None
closing: Job | None = None
_forked_from: Job | None = None  # the parent's job in a forked child: closed, kept alive
lock = threading.RLock()
_first_use: Callable[[], Job] | None = None
_atexit_registered = False
_child_exit_registered = False  # the process's multiprocessing exit hook (see _at_child_exit)


def set_first_use(configure: Callable[[], Job]) -> None:
    """How a job is configured from the environment when the API is used before ``configure``
    (registered by the runtime's bootstrap; it never raises)."""
    global _first_use
    _first_use = configure


def current() -> Job | None:
    """The current job, configuring one from the environment on first use."""
    found = job
    if found is not None or _first_use is None:
        return found
    with lock:
        return job if job is not None else set_current(_first_use())


def current_engine() -> TrainingEngine | None:
    """The running engine, configuring the job on first use (the phases' slow path)."""
    found = current()
    return found.engine if found is not None else None


def set_current(new: J) -> J:
    global job, engine, _atexit_registered, _child_exit_registered
    job, engine = new, new.engine
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(_at_exit)
    if not _child_exit_registered:
        _child_exit_registered = True
        _at_child_exit()
    return new


def _at_child_exit() -> None:
    """A multiprocessing child (a pool worker, a ``Process`` target, forked) ends with
    ``os._exit`` once its finalizers ran, without the interpreter's exit hooks, so a job it
    configured is shut down among those finalizers (else its file lost everything not yet
    written). A spawned child runs them too, before its exit hooks, which then find it shut."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return
    from multiprocessing import util

    util.Finalize(None, _at_exit, exitpriority=100)


def shutdown(timeout_s: float | None = None) -> bool:
    """Flush and stop the current job now (bounded); the next API call configures afresh."""
    global job, engine, closing
    with lock:
        stopping, job, engine = job, None, None
    if stopping is None:
        return True
    closing = stopping
    try:
        return stopping.shutdown(timeout_s)
    finally:
        closing = None


def _at_exit() -> None:
    found = job
    if found is not None:
        try:
            found.shutdown()
        except Exception:
            _logger.exception("traintel: shutdown at exit failed")


def _after_fork_in_child() -> None:
    """A forked child stops recording into the parent's copy of the job, and records into a
    job of its own if it uses the API (a ``multiprocessing`` worker training a sweep's point);
    a DataLoader worker's first use configures none (see the runtime's first use).

    The copy's exporters are process-bound (``traintel.exporters.process_bound``), so nothing
    it holds is sent twice; closed, it skips any flush at exit. It is kept, not dropped: its
    objects are the parent's, and nothing in the child may finalize them.
    """
    global lock, job, engine, closing, _forked_from, _child_exit_registered
    lock = threading.RLock()  # another thread may have held it at the fork
    _child_exit_registered = False
    if job is not None:
        job.closed = True
        _forked_from = job
    job = engine = closing = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
