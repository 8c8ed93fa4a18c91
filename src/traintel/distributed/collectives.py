"""This rank's collective sequence: how many collectives it entered, and how many completed.

Why: when a job hangs, every rank but one waits in the same collective. Counted the same way on
every rank, the collectives a rank entered say who that one is: the ranks at the wavefront (the
highest count) entered collective #k and wait in it (entered #k, completed #k-1); the rank
behind it never got there (entered #k-1). The heartbeat and the stall watcher read the two
counts from their own threads.

What counts: the ``torch.distributed`` collective functions (``all_reduce``, ``all_gather``,
``barrier``, ``broadcast``... as the module exports them, and the calls they make of each
other), wrapped when traintel is configured in a process that imported torch (or, under
``opentelemetry-instrument``, when the script imports it): that is the same point of the
program on every rank, so the counts agree. DDP's gradient all-reduce runs in C++ and is counted
through the comm hook of :func:`traintel.distributed.watch_ddp` (the hook's all-reduce is one
of those functions, and registering it wraps them if they were not). Calls inside a region that
``torch.compile`` traces are the compiled graph's and are not counted (on every rank alike).

What the training thread pays: two counter increments per collective under an uncontended lock
(a collective takes tens of microseconds at the very least). Completion is seen without a
host-device sync: a blocking call completes when it returns (gloo's CPU collectives have
finished then); an ``async_op`` call, and a comm hook's bucket, when its future completes (on
NCCL that is when the collective was handed to the GPU's stream, not when the GPU finished it).

This module imports torch only through ``sys.modules``: the heartbeat reads it in any process.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

#: The collective functions wrapped, where the installed torch has them (point-to-point sends
#: and receives are not collectives: their counts differ between ranks by design). FSDP2 calls
#: the ``_single`` spellings (newer torch), which the ``_into_tensor`` / ``_tensor`` ones call.
COLLECTIVE_FUNCTIONS = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "all_gather_coalesced", "all_gather_object", "all_to_all", "all_to_all_single", "barrier",
    "monitored_barrier", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "reduce_scatter_single", "gather", "gather_object", "scatter",
    "scatter_object_list",
)  # fmt: skip
_C10D = "torch.distributed.distributed_c10d"
_DIST = "torch.distributed"


class CollectiveSequence:
    """The two counts, the name of the collective entered last, and the threads with a
    collective in flight; safe from any thread (a comm hook runs on autograd's threads, a
    future's callback on the backend's).

    Why the threads: ranks must call their collectives on a process group in the same order. Two
    threads that both call them on one group (an async checkpoint writer on the default group,
    say) may interleave differently on each rank and deadlock; a hung rank with collectives in
    flight from two threads says so."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entered = 0
        self.completed = 0
        self.last_entered = ""
        self._in_flight: dict[str, int] = {}  # by thread name

    def enter(self, name: str) -> str:
        """One collective entered by this thread; the thread's name, for :meth:`complete`."""
        thread = threading.current_thread().name
        with self._lock:
            self.entered += 1
            self.last_entered = name
            self._in_flight[thread] = self._in_flight.get(thread, 0) + 1
        return thread

    def complete(self, thread: str | None = None, *_ignored: object) -> None:
        """One collective entered by ``thread`` (default: this one) completed (a future's done
        callback, through a partial, passes the future too)."""
        thread = threading.current_thread().name if thread is None else thread
        with self._lock:
            self.completed += 1
            left = self._in_flight.pop(thread, 0) - 1
            if left > 0:
                self._in_flight[thread] = left

    def snapshot(self) -> tuple[int, int, str]:
        with self._lock:
            return self.entered, self.completed, self.last_entered

    def threads_in_flight(self) -> tuple[str, ...]:
        """The threads that entered a collective not completed yet, by name."""
        with self._lock:
            return tuple(sorted(self._in_flight))


#: The process's sequence (ranks are processes).
SEQUENCE = CollectiveSequence()

#: (module, name, original) for every attribute wrapped, to restore them exactly.
_wrapped: list[tuple[Any, str, Any]] = []
_install_lock = threading.RLock()


def _counting(
    name: str, original: Callable[..., Any], is_compiling: Callable[[], bool]
) -> Callable[..., Any]:
    sequence = SEQUENCE

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if is_compiling():  # traced into a compiled graph: the graph's collective, not counted
            return original(*args, **kwargs)
        thread = sequence.enter(name)
        try:
            result = original(*args, **kwargs)
        except BaseException:
            sequence.complete(thread)  # it left the collective (a timeout, a bad argument)
            raise
        get_future = getattr(result, "get_future", None)
        if get_future is None:  # a blocking call: it completed as it returned
            sequence.complete(thread)
            return result
        try:  # counted when its future completes
            get_future().add_done_callback(functools.partial(sequence.complete, thread))
        except Exception:  # a future that cannot be followed: counted now
            sequence.complete(thread)
        return result

    collective.__traintel_original__ = original  # type: ignore[attr-defined]
    return collective


def watch_torch_collectives() -> None:
    """Wrap the collective functions if this process imported ``torch.distributed``
    (idempotent). Never imports torch; never raises."""
    c10d, dist = sys.modules.get(_C10D), sys.modules.get(_DIST)
    if c10d is None or dist is None:
        return
    with _install_lock:
        if _wrapped:
            return
        try:
            compiler = getattr(sys.modules.get("torch"), "compiler", None)
            is_compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
            for name in COLLECTIVE_FUNCTIONS:
                original = getattr(c10d, name, None)
                if original is None or hasattr(original, "__traintel_original__"):
                    continue
                wrapper = _counting(name, original, is_compiling)
                for module in (c10d, dist):
                    if getattr(module, name, None) is original:
                        _wrapped.append((module, name, original))
                        setattr(module, name, wrapper)
        except Exception:
            unwatch_torch_collectives()


def unwatch_torch_collectives() -> None:
    """Put every wrapped function back, exactly as it was."""
    with _install_lock:
        while _wrapped:
            module, name, original = _wrapped.pop()
            setattr(module, name, original)
