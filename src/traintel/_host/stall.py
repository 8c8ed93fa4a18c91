"""Hang reports: a rank that has made no progress for ``TRAINTEL_STALL_SECONDS`` says so, live.

Why a thread of its own: the heartbeat gauges say how long a rank has been stuck, at each metric
collection; a hang needs more, and needs it once: which collective the rank waits in (its
collective sequence, :mod:`traintel.distributed.collectives`), what its training thread is doing
(its Python stack, read with ``sys._current_frames``), and whether its Python runs at all. The
watcher wakes once a second, reads the state the training thread already keeps (the heartbeat's
engine and span registry, the sequence counts), and decides. The training thread pays nothing.

What is a stall: no iteration or phase started or ended, and no collective entered or completed,
for the threshold, while the rank waits in a collective, or (once its first training iteration
completed) while it is inside any phase below ``application``: before the loop, long model
loading and compilation are normal, and after it the job is no longer training.

What is said: one ``ml.training.hang_suspect`` log record (WARN) per stall, with the rank, phase,
iteration, sequence numbers, seconds stalled, the training thread's stack (``code.stacktrace``)
and its top frame, linked to the current iteration's trace and span; then one
``ml.training.hang_recovered`` record (INFO) when the rank moves again, with the stall's length.
Whether Python runs (``ml.training.hang.python``): ``running`` when the training thread ran
Python between two wakes (on the main thread: a pending call, ``Py_AddPendingCall``, asked at one
wake has run by the next; on another thread: its top frame moved), ``blocked`` when it did not (a
call that released the GIL: a collective, I/O, a lock, a sleep), and ``holding_gil`` when C code
held the GIL so long that this thread could not run at all: then no Python thread can report,
and the helper process of :mod:`traintel._host.gil_watch` does (in a multi-rank job), from the
last state this thread gave it and the stack ``faulthandler``'s C thread dumps.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry.trace import SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._host.heartbeat import IDLE, Heartbeat, HeartbeatSample

if TYPE_CHECKING:
    from traintel._host.gil_watch import GilWatch

_logger = logging.getLogger(__name__)

#: Sends one record: its event name, the report, the span it links to, its time and its body
#: (None: the report's own description). The runtime's logs pipeline gives it
#: (``traintel._runtime.hang_records``): this package never reaches the OpenTelemetry logs SDK.
Send = Callable[[str, "StallReport", SpanContext | None, int, "str | None"], None]

#: How often the watcher wakes (at most once a second: it must not cost the job anything).
WAKE_S = 1.0
#: Frames kept of a stack (the innermost ones).
STACK_FRAMES = 64
_UNWATCHED = frozenset({IDLE, semconv.Phase.APPLICATION.value})


class Training(Protocol):
    """What the watcher reads of the engine (it never writes to it, but to draw the span id of
    a stalled iteration that has none yet)."""

    active_thread: int

    @property
    def active(self) -> Any: ...


@dataclass(frozen=True)
class StallReport:
    """What one hang record says."""

    rank: int
    phase: str
    iteration: int | None
    entered: int
    completed: int
    #: The collective it entered and has not completed, if any.
    waiting_in: str | None
    stalled_s: float
    python: str
    stack: str
    top_frame: str
    thread_id: int
    #: The threads with a collective in flight, when it waits in one.
    threads: tuple[str, ...] = ()

    def attributes(self) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            semconv.RANK: self.rank,
            semconv.PHASE: self.phase,
            semconv.HANG_STALLED_SECONDS: round(self.stalled_s, 3),
            semconv.HANG_PYTHON: self.python,
            semconv.COLLECTIVES_ENTERED: self.entered,
            semconv.COLLECTIVES_COMPLETED: self.completed,
            semconv.THREAD_ID: self.thread_id,
        }
        if self.iteration is not None:
            attributes[semconv.ITERATION] = self.iteration
        if self.waiting_in is not None:
            attributes[semconv.HANG_WAITING_IN] = self.waiting_in
            if self.threads:
                attributes[semconv.HANG_COLLECTIVE_THREADS] = list(self.threads)
        if self.stack:
            attributes[semconv.CODE_STACKTRACE] = self.stack
            attributes[semconv.HANG_TOP_FRAME] = self.top_frame
        return attributes

    def describe(self) -> str:
        where = f"in {self.phase}" + (
            f" after iteration {self.iteration}" if self.iteration is not None else ""
        )
        if self.waiting_in is not None:
            collective = f"waits in collective #{self.entered} ({self.waiting_in})"
            if len(self.threads) > 1:
                collective += f", with collectives in flight from threads {', '.join(self.threads)}"
        else:
            collective = f"in no collective (entered #{self.entered}, all completed)"
        python = {
            semconv.PYTHON_BLOCKED: "Python blocked in a call that released the GIL",
            semconv.PYTHON_RUNNING: "Python running",
            semconv.PYTHON_HOLDING_GIL: "C code holding the GIL (no Python runs)",
        }.get(self.python, self.python)
        at = f" at {self.top_frame}" if self.top_frame else ""
        return f"rank {self.rank}: no progress for {self.stalled_s:.1f} s {where}; {collective}; {python}{at}"


def python_stack(frame: FrameType) -> tuple[str, str]:
    """``frame``'s stack as Python prints a traceback (most recent call last), and its top."""
    summary = traceback.extract_stack(frame, limit=STACK_FRAMES)
    top = summary[-1]
    return "".join(summary.format()), f"{top.name} ({top.filename}:{top.lineno})"


def span_context(trace_id: int, span_id: int) -> SpanContext | None:
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, False, TraceFlags(TraceFlags.SAMPLED))


class PendingCallProbe:
    """Does the main thread run Python? A call scheduled with ``Py_AddPendingCall`` runs at the
    main thread's next bytecode, and not while it waits in a call that released the GIL (a
    collective, I/O, a lock, a sleep). Asked at one wake and looked at the next, it tells one from
    the other where the top frame cannot (a loop may be caught on the same instruction twice)."""

    def __init__(self) -> None:
        self.runs = 0
        self._pending = self._asked = False
        try:
            import ctypes

            callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
            self._callback = callback_type(self._ran)  # kept: the interpreter holds only its address
            add = ctypes.PYFUNCTYPE(ctypes.c_int, callback_type, ctypes.c_void_p)
            self._add: Callable[[Any, Any], int] | None = add(("Py_AddPendingCall", ctypes.pythonapi))
        except (ImportError, AttributeError, OSError):  # not CPython
            self._add = None

    @property
    def usable(self) -> bool:
        return self._add is not None

    def _ran(self, _argument: object) -> int:
        self.runs += 1
        self._pending = False
        return 0

    def ask(self) -> bool | None:
        """Whether the main thread ran Python since the previous ask (None: no previous ask);
        asks again."""
        answer = None if not self._asked else not self._pending
        if not self._pending and self._add is not None:
            self._pending = self._add(self._callback, None) == 0
        self._asked = True
        return answer

    def forget(self) -> None:
        """The next answer starts afresh (a call still pending stays so)."""
        self._asked = False


@functools.cache
def _main_thread_probe() -> PendingCallProbe:
    """The process's probe: one, never freed (a call may stay pending after its watcher is gone,
    and the interpreter then calls its address)."""
    return PendingCallProbe()


@dataclass
class _Stall:
    """A stall reported (by this thread or the helper process) and not yet recovered."""

    progress_ns: int  # the last progress before it
    python: str
    held_s: float = 0.0  # C code held the GIL: how long this thread could not run


class StallWatcher:
    """The watcher thread (see the module docstring). :meth:`check` is one wake, callable with
    an injected time."""

    def __init__(
        self,
        heartbeat: Heartbeat,
        training: Training,
        send: Send,
        threshold_s: float,
        rank: int,
        *,
        gil_watch: GilWatch | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._heartbeat = heartbeat
        self._training = training
        self._send = send
        self.threshold_s = threshold_s
        self._rank = rank
        self._gil_watch = gil_watch
        self._clock = clock
        now = clock()
        self._last_wake_ns = now
        self._last_wake_mono = time.perf_counter_ns()
        self._progress_ns = now
        self._counts = (0, 0)
        self._counts_moved_ns = now
        self._stall: _Stall | None = None
        self._watched = False
        self._frame_key: tuple[object, int] | None = None
        self._probe = _main_thread_probe()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="traintel-stall-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread, then one last look: a stall that ended with the job's loop is said
        recovered."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        if self._gil_watch is not None:
            self._gil_watch.stop()
        if thread is None or not thread.is_alive():
            try:
                self.check(final=True)
            except Exception:
                _logger.debug("traintel: the stall watcher's last look failed", exc_info=True)

    def _run(self) -> None:
        failed = False
        while not self._stop.wait(WAKE_S):
            try:
                self.check()
            except Exception:
                if not failed:  # said once; the next wake tries again
                    failed = True
                    _logger.warning("traintel: the stall watcher failed once", exc_info=True)

    # --- one wake -------------------------------------------------------------------------------
    def check(self, now_ns: int | None = None, *, final: bool = False) -> None:
        """One wake; ``final``: the last, as the job shuts down (a stall that ended with the job's
        loop is reported recovered; no new suspect)."""
        now = self._clock() if now_ns is None else now_ns
        # How long this thread could not run, in real elapsed time (perf_counter: traintel's own
        # clock follows a simulation that replaces time.time_ns and time.monotonic_ns): a stepped
        # or simulated clock is not a held GIL. An injected time stands for both clocks.
        awake = time.perf_counter_ns()
        since = now - self._last_wake_ns if now_ns is not None else awake - self._last_wake_mono
        gap_s, self._last_wake_ns, self._last_wake_mono = since / 1e9, now, awake
        sample = self._heartbeat.sample(now)
        progress, watched, was_watched = self._observe(sample, now)
        stall = self._stall
        if stall is not None and (progress > stall.progress_ns or not watched):
            self._recovered(stall, now)
        if self._stall is None and gap_s - WAKE_S >= self.threshold_s and was_watched:
            self._held(progress, gap_s, now, final)  # this thread could not run: C code held the GIL
        if final:
            stall = self._stall
            if stall is not None and not watched:
                self._recovered(stall, now)
            return
        self._suspect(sample, progress, watched, now)
        if self._gil_watch is not None:
            self._gil_watch.tick(self._state(sample, progress), watched)

    def _observe(self, sample: HeartbeatSample, now: int) -> tuple[int, bool, bool]:
        """The rank's last progress (the heartbeat's, or its collective counts moving), whether
        it is watched now, and whether it was at the previous wake."""
        counts = (sample.collectives_entered, sample.collectives_completed)
        if counts != self._counts:
            self._counts, self._counts_moved_ns = counts, now
        progress = self._progress_ns = max(sample.progress_ns, self._counts_moved_ns)
        waiting = sample.waiting_in is not None
        watched = waiting or (sample.iteration is not None and sample.phase not in _UNWATCHED)
        was_watched, self._watched = self._watched, watched
        return progress, watched, was_watched

    def _suspect(self, sample: HeartbeatSample, progress: int, watched: bool, now: int) -> None:
        """A new stall: watched, and no progress for the threshold (the stack is read from a
        second without progress on, so that whether it moves is known by then)."""
        stalled_s = (now - progress) / 1e9
        frame = self._training_frame() if watched and stalled_s >= WAKE_S else None
        moved = self._moved(frame)
        if self._stall is None and watched and stalled_s >= self.threshold_s:
            python = semconv.PYTHON_RUNNING if moved else semconv.PYTHON_BLOCKED
            self._say(semconv.EVENT_HANG_SUSPECT, now, stalled_s, python, frame, sample)
            self._stall = _Stall(progress, python)

    def _held(self, progress_ns: int, gap_s: float, now: int, final: bool) -> None:
        """This thread was kept from running for ``gap_s`` while the rank was watched: the helper
        process reported the stall while it lasted; without one, it is reported now. It recovers
        at the next progress (which may already have come as the GIL was let go), or when the
        rank leaves its phases, after ``gap_s``."""
        self._stall = _Stall(progress_ns, semconv.PYTHON_HOLDING_GIL, gap_s)
        if self._gil_watch is not None and self._gil_watch.alive():
            return
        frame = None if final else self._training_frame()
        self._say(semconv.EVENT_HANG_SUSPECT, now, gap_s, semconv.PYTHON_HOLDING_GIL, frame)

    def _recovered(self, stall: _Stall, now: int) -> None:
        self._stall = None
        seconds = stall.held_s or (self._progress_ns - stall.progress_ns) / 1e9
        body = f"rank {self._rank}: moved again after {seconds:.1f} s without progress"
        self._say(semconv.EVENT_HANG_RECOVERED, now, seconds, stall.python, None, body=body)

    # --- what the training thread is doing ----------------------------------------------------------
    def _training_thread(self) -> int:
        return self._training.active_thread or threading.main_thread().ident or 0

    def _training_frame(self) -> FrameType | None:
        return sys._current_frames().get(self._training_thread())

    def _moved(self, frame: FrameType | None) -> bool:
        """Whether the training thread ran Python since the previous wake (see the module
        docstring; a tight loop can be caught twice on the same instruction)."""
        if frame is None:
            self._frame_key = None
            self._probe.forget()
            return False
        if self._training_thread() == threading.main_thread().ident and self._probe.usable:
            return self._probe.ask() is True
        key = (frame.f_code, frame.f_lasti)
        previous, self._frame_key = self._frame_key, key
        return previous is not None and key != previous

    def _say(
        self,
        event: str,
        now: int,
        stalled_s: float,
        python: str,
        frame: FrameType | None,
        sample: HeartbeatSample | None = None,
        body: str | None = None,
    ) -> None:
        """Send one record of the rank as seen at this wake (by default as now, with no
        collective named as waited in)."""
        sample = (
            replace(self._heartbeat.sample(now), waiting_in=None, waiting_threads=())
            if sample is None
            else sample
        )
        stack, top = python_stack(frame) if frame is not None else ("", "")
        report = StallReport(
            self._rank, sample.step or sample.phase, sample.iteration, sample.collectives_entered,
            sample.collectives_completed, sample.waiting_in, stalled_s, python, stack, top,
            self._training_thread(), sample.waiting_threads,
        )  # fmt: skip
        self._send(event, report, self._link(), now, body)

    def _link(self) -> SpanContext | None:
        """The current iteration's span (its id drawn now if it had none), else the innermost
        open phase span."""
        record = self._training.active
        if record is not None:
            try:
                context: SpanContext = record.get_span_context()
                return context
            except Exception:
                return None
        span = self._heartbeat.innermost_open_span()
        return span.get_span_context() if span is not None else None

    def _state(self, sample: HeartbeatSample, progress: int) -> dict[str, object]:
        """What the helper process needs to report a stall this thread cannot: ids already drawn
        only (drawing one for every iteration would race the training thread)."""
        trace_id = span_id = 0
        record = self._training.active
        if record is not None:
            trace_id = record.trace_id or record.parent.trace_id
            span_id = record.span_id or record.parent.span_id
        else:
            span = self._heartbeat.innermost_open_span()
            if span is not None:
                trace_id, span_id = span.context.trace_id, span.context.span_id
        return {
            "phase": sample.step or sample.phase,
            "iteration": sample.iteration,
            "entered": sample.collectives_entered,
            "completed": sample.collectives_completed,
            "waiting_in": sample.waiting_in,
            "threads": list(sample.waiting_threads),
            "progress_ns": progress,
            "thread": self._training_thread(),
            "trace_id": trace_id,
            "span_id": span_id,
        }
