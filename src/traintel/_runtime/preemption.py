"""Preemption: a job told to stop (SIGTERM from Slurm or Kubernetes, SIGINT) still reports why.

Without this, SIGTERM's default action kills the process where it stands: open spans are never
ended, the buffered batch is lost, and the run looks like a crash. With it, when a terminating
signal arrives whose action would end the process:

1. a ``preemption`` event goes on the outermost open span (signal, time received, last completed
   iteration, last checkpoint iteration, iterations lost, whether a save ran after the signal);
2. the step phase the signal landed in (``model_backward``, a ``data_loading`` between
   iterations...) ends at the time the signal was received, then the open iteration and every
   open phase span, innermost first, all with ERROR status and
   ``traintel.end_reason = "preempted: SIGTERM"``;
3. everything is flushed — all of it on a helper thread joined with ``TRAINTEL_SHUTDOWN_TIMEOUT``
   as the deadline, because the interrupted training thread may hold a lock an SDK call needs
   (traintel's own goodput ledger is read without its lock, and the report's bookings wait for
   it briefly, then are counted and said to be lost);
4. the signal is handed to the handler installed before traintel's, or re-raised with the
   default action, so the job exits exactly as it would have (same status, same signal).

A main thread inside C++ (a collective that never returns) cannot run a Python handler: a
watch notices the signal off it and, after a grace period, reports and ends the process from
there (:mod:`traintel._runtime.signal_watch`); whichever of the two begins first reports.

While traintel reports, the process's other Python-level signal handlers are held (see
:class:`_Held`). A stop sent to the whole process group (Slurm, Kubernetes, ``kill -TERM -PGID``)
also kills the DataLoader workers, and torch's SIGCHLD handler then raises "DataLoader worker
... killed by signal" in the main thread wherever it stands: raised inside this handler, it
would cut the flush wait short and lose the spans. Without traintel the default action would
have ended the process before any other handler ran, so a held signal is delivered only if the
process lives on after the hand-over.

A signal that lands while traintel records an iteration's end waits for that to return, a
few microseconds: handled midway, the iteration would be neither open (for step 2 to end) nor
exported, while the event counts it as completed.

A handler the user installed first (a graceful-shutdown flag, say) is called as is: the job is
not ending now, so nothing is ended early; the event is still recorded and its checkpoint
fields say whether the save that follows has happened (see :func:`note_checkpoint`). A signal
set to be ignored stays ignored. Handlers are installed once per process, from the main thread.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import Span
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._recorder import active, clock
from traintel._recorder.engine import TrainingEngine, mark_error
from traintel._recorder.phases import open_iterations
from traintel._recorder.record import IterationRecord, OpenStep, Terminated
from traintel._runtime import signal_watch
from traintel._runtime import state as _state
from traintel._sdk.open_spans import OpenSpans

_logger = logging.getLogger("traintel")

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
_previous: dict[int, _Handler] = {}
_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Install the handlers (once per process, main thread only)."""
    global _installed
    with _install_lock:
        if not _installed and threading.current_thread() is threading.main_thread():
            _take_signals()
            _installed = True
            signal_watch.watch(SIGNALS, _stuck)


def chain_later_handlers() -> None:
    """When the application span opens: a handler installed after traintel's is chained.

    A script that configures traintel first and then installs its own SIGTERM handler (save,
    then exit) replaces traintel's, and the run would end without a ``preemption`` event.
    traintel takes the signal back and calls that handler as it calls one installed before it.
    A signal set to be ignored stays ignored. Main thread only; never raises.
    """
    if _installed and threading.current_thread() is threading.main_thread():
        with _install_lock:
            _take_signals()


def _take_signals() -> None:
    """traintel's handler in front of each signal's current one, which it calls on; a signal
    ignored, or handled outside Python, is left as it is."""
    for signum in SIGNALS:
        try:
            current = signal.getsignal(signum)
            if current is _handle or current in (signal.SIG_IGN, None):
                continue
            signal.signal(signum, _handle)
            _previous[signum] = current
        except (ValueError, OSError):  # not supported here
            continue


#: A signal the user's own handler took over: (signal, received ns, last iteration completed
#: when it arrived), reported when traintel's application span ends, so the event can say
#: whether a save followed the signal. The iteration is taken at the signal: the one it cut
#: short ends later (with the user's exit) but was not completed.
_pending: tuple[int, int, int | None] | None = None


def _handle(signum: int, frame: FrameType | None) -> None:
    signal_watch.handling(signum)
    telemetry = _state.running() if signum == signal.SIGTERM else None  # (Ctrl-C still cuts an exit short)
    if telemetry is not None and telemetry.defer_signal(signum):
        return  # raised again once the job's shutdown, under way on this thread, is done
    engine = active.engine
    if engine is not None and engine.deferred_signal is None and _ending_an_iteration(frame):
        # handled as the iteration's end returns (see the module docstring)
        engine.deferred_signal = functools.partial(_handle_now, signum, frame)
        return
    _handle_now(signum, frame)


def _ending_an_iteration(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code is _END_ITERATION:
            return True
        frame = frame.f_back
    return False


_END_ITERATION = TrainingEngine.end_iteration.__code__


def _handle_now(signum: int, frame: FrameType | None) -> None:
    global _pending
    received_ns = clock.time_ns()
    held = _Held.hold()  # first: another handler may be due at any bytecode from here on
    try:
        previous = _previous.get(signum, signal.SIG_DFL)
        try:
            engine = active.engine
            ends_process = previous in (signal.SIG_DFL, signal.default_int_handler)  # the default action
            if not ends_process and engine is not None and engine.app is not None:
                # the job goes on: report when its application ends
                _pending = (signum, received_ns, _last_completed(engine))
            elif previous is signal.SIG_DFL and not _claim_report():
                if _reporter[0] != threading.get_ident():
                    threading.Event().wait()  # the watch reports this signal and ends the process
                # else a second signal while this thread reports the first: the job's call, at once
            else:
                _report(signum, received_ns, end_spans=previous is signal.SIG_DFL)
        except Exception:  # never let telemetry change how the job stops
            _logger.exception("traintel: could not report the preemption")
        if not callable(previous):
            # Dies here, the others still held (see the module docstring).
            _die(signum)
    finally:
        held.release()
    # The job goes on: the user's handler (or SIGINT's, raising KeyboardInterrupt) runs first,
    # its signal came first; then what the held handlers would have done, even if it raised.
    try:
        if callable(previous):
            previous(signum, frame)
    finally:
        held.deliver()


def report_pending(
    telemetry: _state.Telemetry, span: trace_api.Span, exc: BaseException | None = None
) -> None:
    """Called just before traintel's application span ends: the deferred ``preemption`` event.

    Ending cleanly, the user's loop went on after the signal: the iterations it finished count.
    Ending by an exception (a handler that saves and then ``sys.exit``s from inside the signal),
    the iteration the signal interrupted ended with that exit and did not complete: the last
    completed one is the one taken when the signal arrived.
    """
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        signum, received_ns, at_signal = pending
        completed = at_signal if exc is not None else _last_completed(telemetry.engine)
        attributes = preemption_attributes(telemetry, signum, received_ns, completed)
        span.add_event(semconv.Event.PREEMPTION.value, attributes, received_ns)


def _die(signum: int) -> None:
    """By the same signal, as without traintel."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


#: Taken by whichever reports a signal that ends the process: the main thread's handler, or
#: the watch when that handler cannot run (see :mod:`traintel._runtime.signal_watch`); and
#: which thread took it.
_reporting = threading.Lock()
_reporter = [0]


def _forget_in_child() -> None:
    """A forked child keeps its parent's handlers but not its watch: a job of its own installs
    one (see :mod:`traintel._runtime.signal_watch`)."""
    global _installed, _install_lock, _reporting
    _installed = False
    _install_lock, _reporting = threading.Lock(), threading.Lock()  # (a thread may have held them)
    _reporter[0] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _claim_report() -> bool:
    if not _reporting.acquire(blocking=False):
        return False
    _reporter[0] = threading.get_ident()
    return True


def _stuck(signum: int, received_ns: int) -> None:
    """The main thread, inside C++, has not begun handling a signal whose default action ends
    the process: the report runs here, then the process dies by the signal, as it would have."""
    telemetry = _state.running()
    if telemetry is not None and telemetry.shutting_down:
        return  # bounded: the main thread takes the signal once its shutdown is done
    if _previous.get(signum, signal.SIG_DFL) is not signal.SIG_DFL or not _claim_report():
        return
    _logger.warning(
        "traintel: %s while the main thread is inside a call that does not return to Python; "
        "reporting from another thread, then exiting by the signal",
        signal.Signals(signum).name,
    )
    _report(signum, received_ns, end_spans=True)
    _die_off_main(signum)


def _die_off_main(signum: int) -> None:
    """By the same signal from a thread other than the main one, where ``signal.signal`` may
    not be called: the C library puts the default action back (the interpreter's own table of
    handlers is left as it is: the process is ending)."""
    try:
        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(ctypes.c_int(signum), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(1.0)  # (delivered at once; should it not be, the exit below)
    finally:
        os._exit(128 + signum)


class _Held:
    """The process's other Python-level signal handlers, held while traintel reports.

    Each is swapped for this object, which notes its signal; :meth:`release` puts them back and
    :meth:`deliver` raises each noted signal again, where the job goes on. Every signal, not only
    SIGCHLD: any handler that raises (a SIGALRM watchdog, say) would cut the report short the
    same way. traintel's own handler is not held: a second SIGTERM or Ctrl-C is the job's call.
    Swapped, not blocked with ``pthread_sigmask``: a mask is per thread, and a signal the main
    thread blocks goes to another one (an exporter's), whose trampoline still has the main
    thread run the handler. Only handlers set from Python are swapped: C-level ones (torch's in a
    worker, faulthandler's) are left alone. Main thread only, as signal handlers are.

    ``signal.signal()`` first runs the handlers already due, and an exception may come up at any
    bytecode: each pass is retried whole, a handler is recorded before it is swapped (so never
    lost), and what was raised is kept for :meth:`deliver`.
    """

    def __init__(self) -> None:
        self.handlers: dict[int, _Handler] = {}
        self.noted: set[int] = set()
        self.raised: BaseException | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.noted.add(signum)

    @classmethod
    def hold(cls) -> _Held:
        held = cls()
        for _ in range(3):
            try:
                held._swap_all()
                break
            except BaseException as exc:  # a handler due before its signal was held
                held.raised = held.raised or exc
        return held

    def _swap_all(self) -> None:
        for signum in sorted(signal.valid_signals()):
            handler = signal.getsignal(signum)
            if callable(handler) and handler is not _handle and not isinstance(handler, _Held):
                self.handlers[signum] = handler
                try:
                    signal.signal(signum, self)
                except (ValueError, OSError):  # not settable here: left as it is
                    del self.handlers[signum]

    def release(self) -> None:
        for _ in range(3):
            try:
                for signum, handler in list(self.handlers.items()):
                    if signal.getsignal(signum) is self:  # not replaced meanwhile
                        signal.signal(signum, handler)
                    del self.handlers[signum]
                return
            except BaseException as exc:  # traintel's own handler, nested: a second Ctrl-C
                self.raised = self.raised or exc

    def deliver(self) -> None:
        """What the held handlers would have done, now that the job goes on: one that raises
        does not keep the others from running (Python itself runs them in the unwinding)."""
        try:
            if self.raised is not None:
                raised, self.raised = self.raised, None
                raise raised
        finally:
            noted, self.noted = sorted(self.noted), set()
            _raise_signals(noted)


def _raise_signals(signums: list[int]) -> None:
    if signums:
        try:
            signal.raise_signal(signums[0])
        finally:
            _raise_signals(signums[1:])


def _report(signum: int, received_ns: int, end_spans: bool) -> None:
    """Event, span ends and flush on a helper thread, waited for up to the shutdown timeout."""
    telemetry = _state.configured()
    if telemetry is None or telemetry.closed or telemetry.pipeline is None:
        return
    timeout = telemetry.settings.shutdown_timeout
    worker = threading.Thread(
        target=_finish,
        args=(telemetry, signum, received_ns, end_spans),
        name="traintel-preemption",
        daemon=True,
    )
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        _logger.warning("traintel: preemption report not finished within %.1f s; exiting anyway", timeout)


def _last_completed(engine: TrainingEngine | None) -> int | None:
    return engine.last_iteration if engine is not None else None


#: How long the report's goodput bookings wait for the ledger's lock, which a training thread
#: stopped by the signal inside a booking holds for good (its critical section takes microseconds).
_BOOKING_WAIT_S = 0.1

#: The pipeline's share of ``TRAINTEL_SHUTDOWN_TIMEOUT`` when the process dies by the signal:
#: the rest is for the spill to disk that follows when the collector did not answer in time.
_PIPELINE_SHARE = 0.8


def preemption_attributes(
    telemetry: _state.Telemetry, signum: int, received_ns: int, completed: int | None
) -> dict[str, AttributeValue]:
    """The event's attributes; ``completed`` is the last iteration done when the signal came."""
    name = signal.Signals(signum).name
    attributes: dict[str, AttributeValue] = {
        semconv.PREEMPTION_SIGNAL: name,
        semconv.PREEMPTION_RECEIVED: received_ns,
    }
    engine = telemetry.engine
    if engine is None:
        return attributes
    if completed is not None:
        attributes[semconv.PREEMPTION_LAST_ITERATION] = completed
    checkpoint = engine.last_checkpoint
    attributes[semconv.PREEMPTION_SAVE_AFTER_SIGNAL] = False  # said even when nothing was saved
    if checkpoint is not None:
        iteration, end_ns, seconds = checkpoint
        attributes[semconv.PREEMPTION_CHECKPOINT_ITERATION] = iteration
        saved_after = end_ns >= received_ns
        attributes[semconv.PREEMPTION_SAVE_AFTER_SIGNAL] = saved_after
        if saved_after:
            attributes[semconv.PREEMPTION_SAVE_AFTER_SIGNAL_TIME] = seconds
    # Completed iterations a resume redoes; none completed (cut in warm-up): nothing but the
    # step in progress, which is never counted as done.
    resume = checkpoint[0] if checkpoint is not None else 0
    lost = completed + 1 - resume if completed is not None else 0
    attributes[semconv.PREEMPTION_ITERATIONS_LOST] = max(0, lost)
    return attributes


def _finish(telemetry: _state.Telemetry, signum: int, received_ns: int, end_spans: bool) -> None:
    try:
        reason = f"{semconv.END_REASON_PREEMPTED}: {signal.Signals(signum).name}"
        phase_spans = _open_phase_spans(telemetry.open_spans)
        attributes = preemption_attributes(telemetry, signum, received_ns, _last_completed(telemetry.engine))
        if phase_spans:
            phase_spans[0].add_event(semconv.Event.PREEMPTION.value, attributes, timestamp=received_ns)
        if end_spans:
            _end_at_signal(telemetry, reason, received_ns, phase_spans)
        else:
            telemetry.flush(telemetry.settings.shutdown_timeout)
    except Exception:
        _logger.exception("traintel: could not report the preemption")


def _open_phase_spans(registry: OpenSpans | None) -> list[Span]:
    """The open spans of phases, outermost first."""
    open_spans: list[Span] = []
    if registry is not None:
        for _ in range(3):  # the registry may change while copied; it settles at once
            try:
                open_spans = registry.spans()
                break
            except RuntimeError:
                continue
    phase_spans = [s for s in open_spans if (s.attributes or {}).get(semconv.PHASE)]
    phase_spans.sort(key=lambda s: s.start_time or 0)
    return phase_spans


def _end_at_signal(
    telemetry: _state.Telemetry, reason: str, received_ns: int, phase_spans: list[Span]
) -> None:
    """End what is open (the iteration and its step at the signal), then release the pipeline."""
    now = clock.time_ns()
    engine = telemetry.engine
    if engine is not None:
        engine.goodput.interrupted(_BOOKING_WAIT_S)
        _cut_training(engine, reason, received_ns, now)
    deadline = time.monotonic() + _PIPELINE_SHARE * telemetry.settings.shutdown_timeout
    windows = telemetry.windows
    if windows is not None:  # the closed windows' numbers go on the spans first
        windows.flush(_PIPELINE_SHARE * telemetry.settings.shutdown_timeout)
    if engine is not None:
        _close_loop(engine, now)
    for span in reversed(phase_spans):  # innermost first, ended as the cut iteration is: one error
        mark_error(span, Terminated(reason), now)
        span.set_attribute(semconv.END_REASON, reason)
        span.end(end_time=now)
    if windows is not None:  # the last window's record and the ones held for the export floor
        # go out, as at a normal exit
        windows.close(max(0.0, deadline - time.monotonic()))
    if engine is not None:
        _say_lost_bookings(engine)
    telemetry.closed = True  # the process is about to die: nothing more to record
    if telemetry.pipeline is not None:
        # Released as at a normal exit, so a batch stuck in a send to an unresponsive
        # collector and whatever is queued go to the spool (or are counted), not away.
        # Its share of the bound leaves time for that spill before _report stops waiting.
        telemetry.pipeline.shutdown(max(0.0, deadline - time.monotonic()))


def _close_loop(engine: TrainingEngine, now: int) -> None:
    """As the training loop's own end would: its open window closes, its summary goes on it."""
    if engine.loop is None:
        return
    try:
        engine.training_loop_closing(engine.loop, now)
    except Exception:
        _logger.exception("traintel: could not close the training loop's last window")


def _say_lost_bookings(engine: TrainingEngine) -> None:
    if engine.goodput.bookings_lost:
        _logger.warning(
            "traintel: the goodput of %d phase(s) ended by the preemption is not booked (the training "
            "thread was stopped while booking); their spans carry the time",
            engine.goodput.bookings_lost,
        )


def _cut_training(engine: TrainingEngine, reason: str, received_ns: int, now: int) -> None:
    """The open step ends at the signal, then its iteration, then the iteration that one began
    within (a training step running validation), innermost first; between iterations (loading
    data for the next one, say) only the open step."""
    error = Terminated(reason)
    innermost = engine.active
    if innermost is None:
        _cut_open_step(engine.open_step, None, error, received_ns)
        return
    for record in open_iterations(engine, innermost):
        _cut_open_step(record.open_step, record, error, received_ns)
        record.set_end_reason(reason)
        record.fail(error)
        engine.end_iteration(record, now)


def _cut_open_step(
    step: OpenStep | None, record: IterationRecord | None, error: Terminated, received_ns: int
) -> None:
    """The step phase the signal landed in (backward, say) ends at the signal, before its
    iteration; a failure here must not stop the rest of the report."""
    if step is None:
        return
    try:
        step.cut(record, error, received_ns)
    except Exception:
        _logger.exception("traintel: could not end the step phase open at the signal")
