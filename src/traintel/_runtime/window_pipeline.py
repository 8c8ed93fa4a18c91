"""The window pipeline: every closed window becomes one report, handed to its consumers in
order, on one worker thread.

Why: the training thread decides *when* a window closes and hands its rows over; the report
(sorting, percentiles, the totals' sketch) and what is made of it (the metric instruments, the
goodput record and its ``training_window`` span, the loop span, the cross-rank row, the device's
memory peaks and timings) cost tens of milliseconds a window at 10,000 iterations. On a worker,
one window at a time and in order, no iteration pays for it.

The training thread's part, per window: a lock, a counter, one queue put (C calls). The rest of
the job waits for it where it must: the loop's end (its summary is the totals of all its
windows), the application's end, a flush, shutdown and preemption (like the batch span
processors, the pipeline is flushed first, within the same bound). A segment rotation does not
wait: the next segment starts at once, and the previous one is ended by the pipeline after the
windows it holds (``then``), so a window's record always lands on the segment that holds it.
A worker more than MAX_PENDING windows behind (windows of a few iterations at a very high step
rate) makes the closing thread wait: memory stays bounded and no window is dropped.

Adding a consumer is a ``register`` call in the bootstrap: the recorder does not change.
``SYNCHRONOUS`` (tests) processes each window on the thread that closes it, so numbers that
tests assert exactly are there as soon as the window closes.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from queue import SimpleQueue

from opentelemetry.trace import Span

from traintel._aggregation.aggregator import RateInputs, TrainingAggregator, WindowReport
from traintel._aggregation.window import ClosedWindow
from traintel._host.flops import current_cuda_device
from traintel._recorder.segments import SegmentedSpan
from traintel.config import Settings, TrainingConfig
from traintel.distributed.cross_rank import AGREEMENT_WAIT_S
from traintel.distributed.stats import AGREEMENT_LAG

_logger = logging.getLogger("traintel")

#: Process windows on the thread that closes them (the test suite sets this).
SYNCHRONOUS = False
#: Windows waiting for the worker at most before the closing thread waits for it.
MAX_PENDING = 16


@dataclass(frozen=True)
class WindowEvent:
    """One closed window, as every consumer sees it."""

    #: None for a window without iterations (the loop ended right after the last close).
    report: WindowReport | None
    window: ClosedWindow
    settings: Settings
    inputs: RateInputs
    #: The loop (traintel's handle, or a plain OpenTelemetry loop span), and the span of it that
    #: held the window: its events go there (the segment, when traintel's loop is segmented).
    loop: Span | None
    segment: Span | None
    #: The span its ``training_window`` record goes under: that segment, or a plain
    #: OpenTelemetry loop that just ended.
    parent: Span | None
    #: The training thread's CUDA device, if the job uses one.
    device: int | None
    #: The window's size and pace (s per iteration) the ranks of a multi-rank job agreed on
    #: (pace 0.0: none agreed yet); None in a job of one process.
    agreed: tuple[int, float] | None = None


Consumer = Callable[[WindowEvent], None]
#: What a window's rates are computed with, from its configuration and the training device.
RateSource = Callable[[TrainingConfig, Settings, int | None], RateInputs]
#: A closed window's report and consumers, or a task queued behind the windows (``then``).
_Job = Callable[[], None]


class WindowPipeline:
    """The engine's window sink: closed windows in, reports out to the registered consumers."""

    def __init__(
        self,
        aggregator: TrainingAggregator,
        rates: RateSource,
        warn_once: Callable[..., None],
        before_handover: Callable[[Settings, int | None], None],
    ) -> None:
        self.aggregator = aggregator
        #: Run on the closing thread before a window is handed over (the opt-in peak calibration).
        self._before_handover = before_handover
        self._rates = rates
        self._warn_once = warn_once
        self._consumers: list[tuple[str, Consumer]] = []
        self._inputs: RateInputs | None = None
        #: The cross-rank exchange's agreed sizes (see :meth:`window_size_for`).
        self.agreed_size: Callable[[int], tuple[int, float] | None] = lambda index: None
        self._agreed: dict[int, tuple[int, float]] = {}  # window index -> its agreed size, until reported
        self._queue: SimpleQueue[_Job | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._done = threading.Condition()
        self._submitted = 0
        self._processed = 0
        self._reported = -1  # the index of the last window processed
        self._worker: threading.Thread | None = None
        self._closed = False
        self._at_close: list[Callable[[], None]] = []

    def register(self, name: str, consumer: Consumer) -> None:
        """Call ``consumer`` with every window, after those registered before it."""
        self._consumers.append((name, consumer))

    # --- the training thread's side ------------------------------------------------------------------
    def submit(
        self, window: ClosedWindow, config: TrainingConfig, settings: Settings, loop: Span | None,
        ended_loop: Span | None,
    ) -> None:  # fmt: skip
        """Hand a closed window over (any thread that closes one: the training thread, or the
        one that ended a plain OpenTelemetry loop)."""
        segment = loop.current if isinstance(loop, SegmentedSpan) else loop
        parent = segment if segment is not None else ended_loop
        device = current_cuda_device()
        try:
            self._before_handover(settings, device)
        except Exception:
            self._warn_once("before_handover", "could not prepare a window's rates")
        self._put(functools.partial(self._report, window, config, settings, loop, segment, parent, device))

    def at_close(self, task: Callable[[], None]) -> None:
        """Run ``task`` when the pipeline closes, after the windows handed over before it (what a
        consumer still holds: the records waiting to be merged)."""
        self._at_close.append(task)

    def then(self, task: Callable[[], None]) -> None:
        """Run ``task`` after the windows handed over so far (a segment's end)."""
        self._put(task)

    def _put(self, job: _Job) -> None:
        if SYNCHRONOUS or self._closed:
            self._process(job)
            return
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="traintel-windows", daemon=True)
                self._worker.start()
            self._submitted += 1
            behind = self._submitted - self._processed
        self._queue.put(job)
        if behind > MAX_PENDING:
            self._wait_for(self._submitted - MAX_PENDING, None)

    def flush(self, timeout_s: float | None = 10.0) -> bool:
        """Wait until every window submitted so far is processed (at most ``timeout_s``)."""
        return self._wait_for(self._submitted, timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Flush, then stop the worker; later windows are processed where they close."""
        for task in self._at_close:
            self.then(task)
        done = self.flush(timeout_s)
        self._closed = True
        if self._worker is not None:
            self._queue.put(None)
        return done

    def window_size_for(self, index: int) -> tuple[int, float] | None:
        """The size the ranks of a multi-rank job agreed on for window ``index`` (None: one
        process). It is computed from the gather of window ``index - AGREEMENT_LAG``, which this
        rank's row joins when that window is processed: normally long done (a window ago), so
        this waits only for a worker that lags that far, and at most AGREEMENT_WAIT_S."""
        if index - AGREEMENT_LAG > self._reported:
            self._wait(lambda: index - AGREEMENT_LAG <= self._reported, AGREEMENT_WAIT_S)
        agreed = self.agreed_size(index)
        if agreed is not None:  # for the window's event: read on the worker, after it closes
            if len(self._agreed) > 2 * MAX_PENDING:  # left by windows whose report failed
                for stale in [i for i in list(self._agreed) if i <= self._reported]:  # (not waiting ones)
                    self._agreed.pop(stale, None)
            self._agreed[index] = agreed
        return agreed

    def summary(self, train_time_s: float | None) -> dict[str, float | int | str]:
        """The loop's at-a-glance numbers, from the windows processed so far (flush first)."""
        inputs = self._inputs if self._inputs is not None else RateInputs()
        return self.aggregator.summary(inputs, train_time_s)

    # --- the worker's side ---------------------------------------------------------------------------
    def _wait_for(self, target: int, timeout_s: float | None) -> bool:
        return self._wait(lambda: self._processed >= target, timeout_s)

    def _wait(self, done: Callable[[], bool], timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._done:
            while not done():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._done.wait(left)
        return True

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._process(job)
            finally:
                del job  # the window's rows are not kept until the next one
                with self._done:
                    self._processed += 1
                    self._done.notify_all()

    def _process(self, job: _Job) -> None:
        try:
            job()
        except Exception:
            self._warn_once("window_task", "could not run a queued window task (a report or a segment's end)")

    def _report(
        self, window: ClosedWindow, config: TrainingConfig, settings: Settings, loop: Span | None,
        segment: Span | None, parent: Span | None, device: int | None,
    ) -> None:  # fmt: skip
        try:
            inputs = self._inputs = self._rates(config, settings, device)
            report = self.aggregator.close_window(window, inputs)
        except Exception:
            self._warn_once("window_report", "could not report a window (its iterations stay counted)")
        else:
            agreed = self._agreed.pop(window.index, None)
            event = WindowEvent(report, window, settings, inputs, loop, segment, parent, device, agreed)
            asynchronous = not SYNCHRONOUS
            for name, consumer in self._consumers:
                try:
                    consumer(event)
                except Exception:
                    self._warn_once("window:" + name, "could not hand a window to %s", name)
                if asynchronous:
                    time.sleep(0)  # the GIL to the training thread between two consumers, if it waits
        finally:
            if window.rows:
                self._reported = window.index
