"""One task per file, in worker processes, results in file order: the offline tools' parallelism.

Why per file and merged: a multi-node job's telemetry is many files (one per rank from the
embedded default, one per node from a collector's file exporter), and each command's state
reduces a file to a small partial result (by process, window and rank, never a list of all
iterations) that merges exactly with the next file's. So the files are read in parallel and the
parent only merges; with one worker the very same partial results are computed in-process and
merged the same way, so the answer does not depend on the number of workers.

Why processes: decoding is CPU-bound Python (the GIL rules threads out). Forked where the
parent runs one thread (on Linux): a forked worker starts at once, where a spawned one first
imports the reader again (about 0.1 s of CPU each, which at 200 MB was 5 % of a command's
work). Spawned otherwise: a forked child of a parent with threads (the progress bar's) can
inherit a held lock, and macOS does not fork safely.
Workers report bytes read through a queue, so a progress bar moves while big files are read.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

R = TypeVar("R")
K = TypeVar("K")
#: Below this much input one process reads it faster than workers can start (about 0.3 s each).
PARALLEL_BYTES = 64 * 1024 * 1024
#: Bytes a worker reads between two progress reports.
_REPORT_BYTES = 4 * 1024 * 1024

Progress = Callable[[int], None]


class FileTask(Protocol[R]):  # type: ignore[misc]
    def __call__(self, path: str, progress: Progress | None = None) -> R: ...


class _Mergeable(Protocol):
    def merge(self, later: Any, /) -> None: ...


M = TypeVar("M", bound=_Mergeable)


def merge_by_key(into: dict[K, M], later: Mapping[K, M]) -> None:
    """Fold a later file's partial results by key (processes, runs, phases) into ``into``: a
    key new here is taken as it is, one seen before merges the later part into its own."""
    for key, part in later.items():
        mine = into.get(key)
        if mine is None:
            into[key] = part
        else:
            mine.merge(part)


def input_bytes(files: Iterable[str]) -> int:
    """The bytes to read in ``files``; a file never written (its job read from its progress
    mark) has none."""
    return sum(os.path.getsize(path) for path in files if os.path.isfile(path))


def auto_workers(files: list[str]) -> int:
    """Workers for the CLI: one per CPU up to one per file, when the input is large enough."""
    try:
        total = input_bytes(files)
    except OSError:
        return 1
    if len(files) < 2 or total < PARALLEL_BYTES:
        return 1
    return max(1, min(len(files), os.cpu_count() or 1))


_progress_queue: Any = None  # set in each worker by _init_worker


def _init_worker(progress_queue: Any) -> None:
    global _progress_queue
    _progress_queue = progress_queue


def _run(task: FileTask[R], path: str, with_progress: bool) -> R:
    """``task`` in a worker, its byte counts batched into few messages on the progress queue."""
    pending = 0

    def report(count: int) -> None:
        nonlocal pending
        pending += count
        if pending >= _REPORT_BYTES:
            _progress_queue.put(pending)
            pending = 0

    try:
        return task(path, report if with_progress else None)
    finally:
        if pending:
            _progress_queue.put(pending)


def map_files(
    task: FileTask[R], files: list[str], workers: int, progress: Progress | None = None
) -> Iterator[R]:
    """``task(path, progress)`` for every file, yielded in file order; in ``workers``
    processes when more than one (``task`` must then be picklable: a module-level function,
    or a :func:`functools.partial` of one)."""
    workers = min(workers, len(files))
    if workers <= 1:
        for path in files:
            yield task(path, progress)
        return
    alone = sys.platform == "linux" and threading.active_count() == 1
    context = multiprocessing.get_context("fork" if alone else "spawn")
    progress_queue = context.Queue() if progress is not None else None
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(progress_queue,)
    ) as pool:
        futures = [pool.submit(_run, task, path, progress is not None) for path in files]
        try:
            for future in futures:
                while True:
                    try:
                        result = future.result(timeout=0.1)
                        break
                    except concurrent.futures.TimeoutError:
                        _drain(progress_queue, progress)
                _drain(progress_queue, progress)
                yield result
        finally:
            for future in futures:
                future.cancel()
    _drain(progress_queue, progress)


def _drain(progress_queue: Any, progress: Progress | None) -> None:
    if progress_queue is None or progress is None:
        return
    while True:
        try:
            progress(progress_queue.get_nowait())
        except queue.Empty:
            return
