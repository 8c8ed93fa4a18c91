"""The exchange: every rank's window row, gathered over a gloo group of traintel's own.

Why its own group: the user's collectives (NCCL or gloo, on the default group) must never be
interleaved with ours, and a gloo group works on every machine whatever the training backend.
Why a background thread: an all-gather waits for the slowest rank, and that wait must not be
the training thread's. Why a timeout: a rank that is dead or hung must never hang training
through telemetry; the group's timeout bounds each gather, a failed gather abandons the
exchange for good (a gloo group after a timeout cannot be trusted to be in step), and the
training thread only ever waits with a bound.

This module imports torch; it is imported only once ``torch.distributed`` is initialised.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from traintel.distributed.stats import MAX_PENDING_WINDOWS as MAX_PENDING

_logger = logging.getLogger("traintel")

#: How long closing waits for the last gathers (the other ranks reach them within moments).
CLOSE_WAIT_S = 5.0
#: How long a rank waits, before the group is made, for every other rank to say it is there.
PRESENCE_WAIT_S = 5.0
_PRESENCE_POLL_S = 0.02
_ALL_THERE = "all"
_attempts = itertools.count()  # the ranks' n-th attempt in this process: its own store keys


def store_prefix() -> str:
    """This attempt's own keys in the default group's store.

    Why the restart count: torchrun's agent serves one store for every attempt of a job, so
    the keys of a failed attempt (its ranks' presence, their verdict, the addresses of its
    group's members) are still there when the restarted ranks come up; read, they made the
    restarted group connect to dead ranks and fail. Why the count within the process: a job that
    destroys and re-initialises torch.distributed starts a new exchange in the same store.
    (Where torchrun's agents on different nodes count restarts differently, the ranks find
    each other missing and the statistics stay off for that attempt, with the warning.)"""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"traintel/cross_rank/{restart}/{next(_attempts)}/"


def missing_ranks(prefix: str, rank: int, world: int, wait_s: float) -> tuple[list[int], float]:
    """The ranks that did not say they are there within ``wait_s`` (empty: all are), as every
    live rank agrees, and the seconds this rank waited.

    Why: making the group waits for every rank of the world, for the group's whole timeout, and
    a rank that died before the group exists would stall each survivor that long. So each rank
    first writes its key in the default group's store; once all keys are there, or once a rank
    has waited ``wait_s``, the first rank to decide writes the verdict (``compare_set``: the
    first writer wins), and every rank, the late ones too, reads the same one. All live ranks
    then make the group, or none does: the order of their collectives and groups stays the
    same on every rank."""
    store = dist.distributed_c10d._get_default_store()
    keys = [f"{prefix}present/{r}" for r in range(world)]
    verdict_key = prefix + "verdict"
    store.set(keys[rank], "1")
    started = time.monotonic()
    verdict = None
    while verdict is None:
        verdict = _verdict(store, keys, verdict_key, time.monotonic() - started >= wait_s)
        if verdict is None:
            time.sleep(_PRESENCE_POLL_S)
    waited = time.monotonic() - started
    text = verdict.decode()
    return ([] if text == _ALL_THERE else [int(r) for r in text.split(",")]), waited


def _verdict(store: Any, keys: list[str], verdict_key: str, waited_enough: bool) -> bytes | None:
    """The verdict: read if a rank wrote it, else written (first writer wins) once every rank
    is there or this one has waited enough; None: wait on."""
    if store.check([verdict_key]):
        return bytes(store.get(verdict_key))
    if store.check(keys):
        return bytes(store.compare_set(verdict_key, "", _ALL_THERE))
    if not waited_enough:
        return None
    missing = ",".join(str(r) for r, key in enumerate(keys) if not store.check([key]))
    return bytes(store.compare_set(verdict_key, "", missing or _ALL_THERE))


class Exchange:
    """All-gathers fixed-size rows (every rank's the size of its own) on a background thread;
    results go to ``on_rows``."""

    def __init__(self, prefix: str, timeout_s: float, on_rows: Callable[[list[list[float]]], None]) -> None:
        # Making the group is collective: every rank does it at the same point of its program
        # (the first window after torch.distributed is initialised), on the training thread,
        # once every rank is known to be there (see missing_ranks). A gloo group on this
        # attempt's own keys rather than new_group's: new_group names its keys by a count that
        # starts again in a restarted process (the dead ranks' addresses are under that name),
        # and it would shift the names of the user's later groups.
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        c10d = dist.distributed_c10d
        store = c10d.PrefixStore(prefix + "group/", c10d._get_default_store())
        self.group = dist.ProcessGroupGloo(store, self.rank, self.world, timedelta(seconds=timeout_s))
        self.timeout_s = timeout_s
        self.failed: str | None = None
        self._on_rows = on_rows
        self._queue: queue.Queue[list[float] | None] = queue.Queue(MAX_PENDING)
        self._pending = 0
        self._done = 0  # gathers whose rows were handed over
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="traintel-cross-rank", daemon=True)
        self._thread.start()

    def submit(self, row: list[float]) -> None:
        """Queue this rank's row; never blocks. Dropped once the exchange is abandoned."""
        if self.failed is not None:
            return
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(row)
        except queue.Full:
            with self._idle:
                self._pending -= 1
            self.abandon(f"{MAX_PENDING} windows waiting for the other ranks")

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the queued exchanges to finish (or fail)."""
        return self._wait(lambda: not self._pending, timeout_s)

    def wait_done(self, count: int, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` until ``count`` gathers have been handed over (or the
        exchange failed)."""
        return self._wait(lambda: self._done >= count, timeout_s) and self._done >= count

    def _wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """False if ``timeout_s`` ran out before ``done()`` (or the exchange failed)."""
        with self._idle:
            return self._idle.wait_for(lambda: done() or self.failed is not None, timeout_s)

    def close(self) -> None:
        """Stop the thread after the queued rows, waiting for them a bounded while.

        Why wait: the last window's gather is usually still waiting for a slower rank when this
        rank shuts down, and a process that exits (or destroys its groups) while a thread is
        inside a gloo collective is aborted by the C++ runtime ("terminate called without an
        active exception"). The other ranks reach the same gather within moments; a dead or hung
        one costs at most ``CLOSE_WAIT_S`` (the thread is a daemon: it never blocks exit)."""
        deadline = time.monotonic() + min(self.timeout_s, CLOSE_WAIT_S)
        self.wait_idle(deadline - time.monotonic())
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            return
        if self.failed is None:
            self._thread.join(max(0.0, deadline - time.monotonic()))

    def abandon(self, reason: str) -> None:
        """Stop exchanging for good (every later submit is refused), saying why once."""
        if self.failed is None:
            self.failed = reason
            _logger.warning(
                "traintel: cross-rank exchange stopped on rank %d (%s); rank statistics end here, "
                "training goes on",
                self.rank,
                reason,
            )
        with self._idle:
            self._idle.notify_all()

    def _run(self) -> None:
        while True:
            row = self._queue.get()
            if row is None:
                return
            try:
                rows = self._gather(row)
            except Exception as exc:  # timeout, dead peer, destroyed group: stop for good
                with self._idle:
                    self._pending = 0
                self.abandon(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                return
            try:
                self._on_rows(rows)
            except Exception:
                _logger.exception("traintel: could not report cross-rank statistics")
            with self._idle:
                self._pending -= 1
                self._done += 1
                self._idle.notify_all()

    def _gather(self, row: list[float]) -> list[list[float]]:
        mine = torch.tensor(row, dtype=torch.float64)
        out = [torch.zeros(len(row), dtype=torch.float64) for _ in range(self.world)]
        self.group.allgather([out], [mine]).wait()  # type: ignore[attr-defined]  # (not in torch's stubs)
        return [tensor.tolist() for tensor in out]
