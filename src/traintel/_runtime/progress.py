"""The progress mark's writer: every INTERVAL_S, on a thread of its own, the open window's
account (``_aggregation.progress``) into the mark beside the embedded file
(``exporters.progress_mark``); at each flush too.

Why a thread of its own: the window pipeline's worker runs only when a window closes, the file's
metric reader every five minutes, the batch span processors only when spans end; the mark must
be written every few seconds whatever the job does, and a job stuck in a kernel or a collective
still gets its last mark. The training thread pays nothing: the writer reads the rows and
counters it already keeps, as the heartbeat does. A kill therefore loses at most INTERVAL_S of
accounting (plus the time a write takes); the first mark is written as the job starts, so even a
job killed in its first seconds is one of its session's jobs.

A mark is written whole or not at all: the closed windows' sums must reach the open window's
first row. A window handed over but not yet processed (the worker behind, under load) would
leave a gap the mark cannot see, counting the job's iterations short; the writer waits for it a
moment, and otherwise keeps the last mark until the next interval.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from traintel._aggregation.aggregator import WindowReport
from traintel._aggregation.progress import Account, OpenWindowProgress, job_progress
from traintel._aggregation.window import ClosedWindow
from traintel._recorder.engine import TrainingEngine
from traintel.exporters.progress_mark import MarkFile, identity, mark_path, process_key

_logger = logging.getLogger(__name__)

#: Seconds between two marks.
INTERVAL_S: Final = 5.0
#: The longest a mark (or the job's end) waits for the one being written.
LOCK_WAIT_S: Final = 1.0


class ProgressMarks:
    """Writes one job's mark, periodically from its own thread and when asked (a flush)."""

    def __init__(
        self,
        engine: TrainingEngine,
        output_file: Callable[[], Path | None],
        resource: Mapping[str, Any],
        flush_windows: Callable[[float], bool],
    ) -> None:
        self._engine = engine
        self._output_file = output_file
        self._instance = process_key(resource)
        # the job, named, and when its telemetry started: read alone if the job dies before its file
        self._job = {"resource": identity(resource), "start_unix_nano": time.time_ns()}
        self._flush_windows = flush_windows
        self._closed = Account()  # the windows the pipeline's worker processed
        self._closed_through = 0  # the iterations of the job before the next window to process
        self._open = OpenWindowProgress()
        self._file = MarkFile()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="traintel-progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No more marks (the job's end: its window records hold what the mark said)."""
        self._stop.set()
        if self._lock.acquire(timeout=LOCK_WAIT_S):
            try:
                self._file.close()
            finally:
                self._lock.release()

    def window_closed(self, report: WindowReport | None, window: ClosedWindow) -> None:
        """A window the pipeline processed (its worker): into the closed windows' sums. (A window
        whose report failed is passed over by the next one: its sums are missing, not the marks.)"""
        closed = Account()
        if report is not None:
            closed = Account(
                report.first_iteration, report.last_iteration, len(report.durations), report.start_ns,
                report.end_ns, report.duration_s - report.nested_badput_s, report.data_loading_s,
            )  # fmt: skip
        with self._lock:
            self._closed.add(closed)
            self._closed_through = window.seen_before + len(window.rows)

    def _run(self) -> None:
        self.mark()  # at once: a job killed in its first seconds is still one of its session's jobs
        while not self._stop.wait(INTERVAL_S):
            self.mark()

    def mark(self) -> None:
        """Write the mark now (never raises; nothing in a forked child)."""
        if os.getpid() != self._pid:
            return
        try:
            if self._engine.window.current[1] > self._closed_through:  # a window on its way
                self._flush_windows(1.0)
            if not self._lock.acquire(timeout=LOCK_WAIT_S):
                return  # a mark is being written: by another thread, or by this one's code that a
                # signal handler (a preemption's flush) interrupted - waiting would never end
            try:
                path = self._output_file()
                if path is None or self._stop.is_set():
                    return
                mark = self._sample()
                if mark is not None:  # (None: a window on its way; the last mark stands)
                    self._file.write(mark_path(path), mark)
            finally:
                self._lock.release()
        except Exception as exc:
            if not self._failed:
                self._failed = True
                _logger.warning("traintel: could not write the progress mark (%s); training goes on", exc)

    def _sample(self) -> dict[str, Any] | None:
        """The job's account now (None: a window handed over is not processed yet). The open
        window's rows are read while no window is handed over, else read again."""
        engine = self._engine
        window = engine.window
        for _ in range(3):
            rows, before = window.current
            nested, first = window.nested, window.index == 0
            if window.current[0] is rows:
                break
        if before != self._closed_through:
            return None
        open_window, startup, own_ideal = self._open.update(rows, nested, first)
        ledger = engine.goodput
        startup += ledger.booked()["program_startup"]
        ideal = ledger.ideal_step_time_s if ledger.ideal_step_time_s is not None else own_ideal
        progress = job_progress(self._closed, open_window, startup, self._open.slowest, ideal)
        mark: dict[str, Any] = {"instance": self._instance, "time_unix_nano": time.time_ns(), **self._job}
        if progress is not None:
            mark["progress"] = dataclasses.asdict(progress)
        return mark
