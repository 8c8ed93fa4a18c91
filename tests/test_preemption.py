"""Preemption in a real child process: a signal arrives mid-iteration (or mid-checkpoint); the
open spans end with ERROR and a reason, a ``preemption`` event says what was lost, everything
is flushed, and the process exits exactly as it would have without traintel."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.subprocess_helpers import clean_env
from traintel import semconv
from traintel.analysis.goodput import compute_goodput, load_jobs
from traintel.analysis.summary import summarize
from traintel.exporters.reader import MetricsRecord, iter_records, iter_spans

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

# Trains 6 iterations, saves a checkpoint after the 4th (resume would start at 4), then blocks
# in iteration 6's backward (or just after it, in a second save, or loading data before it)
# until a signal arrives.
TRAIN = textwrap.dedent(
    """
    import os, signal, sys, time
    mode, where = sys.argv[1], sys.argv[2]
    if mode == "user_handler":
        stop = []
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    if mode != "plain":
        import traintel
        traintel.configure(log_every_n_iterations=2, warmup_iterations=0)
    else:
        import contextlib
        class _T:
            def __getattr__(self, name):
                return lambda *a, **k: contextlib.nullcontext()
        traintel = _T()

    def block():
        print("ready", flush=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.01)
            if mode == "user_handler" and stop:
                return
        print("never signalled", flush=True)

    with traintel.application():
        with traintel.training_loop():
            for n in range(8):
                if n == 4:
                    with traintel.checkpoint_save(iteration=4):
                        pass
                if n == 6 and where == "checkpoint":
                    with traintel.checkpoint_save(iteration=6):
                        block()
                    break
                if n == 6 and where == "data_loading":  # waiting for a batch, before the iteration
                    with traintel.data_loading():
                        block()
                with traintel.training_iteration(n, samples=8):
                    with traintel.model_forward():
                        pass
                    with traintel.model_backward():
                        if n == 6 and where == "backward":
                            block()
                    if n == 6 and where == "after_backward":
                        block()
                    with traintel.optimizer_update():
                        pass
                if mode == "user_handler" and stop:
                    with traintel.checkpoint_save(iteration=n + 1):
                        time.sleep(0.05)
                    break
    print("clean exit", flush=True)
    """
)


class Run(NamedTuple):
    code: int
    out: str
    err: str
    took: float  # seconds from the signal to the child's exit
    sent_ns: int  # wall clock just before the signal was sent


def run_and_signal(
    tmp_path: Path, mode: str, where: str, signum: int, script_text: str = TRAIN, **env: str
) -> Run:
    """Run ``script_text`` (argv: mode, where) until it prints "ready", then signal it."""
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(script_text)
    child = subprocess.Popen(
        [sys.executable, str(script), mode, where],
        cwd=tmp_path,
        env=clean_env(TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), TRAINTEL_SHUTDOWN_TIMEOUT="5", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    sent = time.monotonic()
    sent_ns = time.time_ns()
    child.send_signal(signum)
    out, err = child.communicate(timeout=60)
    return Run(child.returncode, out, err, time.monotonic() - sent, sent_ns)


def run_to_end(tmp_path: Path, script_text: str, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script_text`` (with ``argv``) to its end, telemetry under ``tmp_path/runs``."""
    script = tmp_path / "train.py"
    script.write_text(script_text)
    return subprocess.run(
        [sys.executable, str(script), *argv],
        check=False,
        cwd=tmp_path,
        env=clean_env(TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def spans(tmp_path: Path) -> list[Any]:
    return list(iter_spans([tmp_path / "runs"]))


def the_event(found: list[Any]) -> dict[str, Any]:
    events = [e for s in found for e in s.events if e.name == semconv.Event.PREEMPTION.value]
    assert len(events) == 1, events
    return events[0].attributes


@pytest.mark.parametrize("where", ["backward", "checkpoint"])
def test_sigterm_ends_open_spans_reports_the_loss_and_dies_by_the_signal(tmp_path: Path, where: str) -> None:
    code, out, err, _, _ = run_and_signal(tmp_path, "traintel", where, signal.SIGTERM)
    assert code == -signal.SIGTERM, err  # died by SIGTERM, as without traintel
    assert "clean exit" not in out and "Traceback" not in err
    # the flush is bounded (TRAINTEL_SHUTDOWN_TIMEOUT=5): the process says when its bound cut it
    assert "not finished within" not in err, err
    found = spans(tmp_path)
    by_name = {s.name: s for s in found}
    for name in ("application", "training_loop") + (
        ("checkpoint_save_sync",) if where == "checkpoint" else ()
    ):
        span = (
            by_name[name]
            if name != "checkpoint_save_sync"
            else max((s for s in found if s.name == name), key=lambda s: s.start_ns)
        )
        assert span.is_error, name
        assert span.attributes[semconv.END_REASON] == "preempted: SIGTERM", name
    event = the_event(found)
    assert event[semconv.PREEMPTION_SIGNAL] == "SIGTERM"
    assert event[semconv.PREEMPTION_LAST_ITERATION] == 5
    assert event[semconv.PREEMPTION_CHECKPOINT_ITERATION] == 4
    assert event[semconv.PREEMPTION_ITERATIONS_LOST] == 2  # 4 and 5 are redone after a resume
    assert event[semconv.PREEMPTION_SAVE_AFTER_SIGNAL] is False
    if where == "backward":  # the cut-short iteration is exported, with the step it stopped in
        (cut,) = [s for s in found if s.name == "training_iteration" and s.attributes[semconv.ITERATION] == 6]
        assert cut.is_error and cut.attributes[semconv.END_REASON] == "preempted: SIGTERM"
    (job,) = compute_goodput(load_jobs([tmp_path / "runs"]))[0].jobs
    assert job.status == "preempted"
    # one error, shown once where it happened: the cut spans and those around them say the same
    # (the loop and application read "preempted: SIGTERM", the cut iteration "Terminated: ...")
    errored = [s for s in found if s.is_error]
    summary = summarize([tmp_path / "runs"])
    assert {s.status_message for s in errored} == {"Terminated: preempted: SIGTERM"}
    (failure,) = summary.failures.values()
    assert failure.spans == len(errored) and summary.other_failures == 0


def test_a_users_own_sigterm_handler_keeps_control(tmp_path: Path) -> None:
    code, out, err, took, _ = run_and_signal(tmp_path, "user_handler", "backward", signal.SIGTERM)
    assert code == 0 and "clean exit" in out, err  # the user's graceful path ran to the end
    found = spans(tmp_path)
    app = next(s for s in found if s.name == "application")
    assert not app.is_error and semconv.END_REASON not in app.attributes
    event = the_event(found)  # reported when the application ended, after the user's save
    assert event[semconv.PREEMPTION_SIGNAL] == "SIGTERM"
    assert event[semconv.PREEMPTION_LAST_ITERATION] == 6  # the user's loop finished its step
    assert event[semconv.PREEMPTION_CHECKPOINT_ITERATION] == 7
    assert event[semconv.PREEMPTION_ITERATIONS_LOST] == 0
    assert event[semconv.PREEMPTION_SAVE_AFTER_SIGNAL] is True
    # the user's 0.05 s save, made between the signal and the exit
    assert 0.05 <= event[semconv.PREEMPTION_SAVE_AFTER_SIGNAL_TIME] <= took


def test_sigint_exits_as_without_traintel(tmp_path: Path) -> None:
    plain, _, plain_err, _, _ = run_and_signal(tmp_path, "plain", "backward", signal.SIGINT)  # no traintel
    code, _, err, _, _ = run_and_signal(tmp_path, "traintel", "backward", signal.SIGINT)
    assert code == plain  # KeyboardInterrupt, exit status as Python gives it
    assert "KeyboardInterrupt" in err and "KeyboardInterrupt" in plain_err
    found = spans(tmp_path)
    app = next(s for s in found if s.name == "application")
    assert app.is_error and "KeyboardInterrupt" in app.status_message
    assert the_event(found)[semconv.PREEMPTION_SIGNAL] == "SIGINT"


@pytest.mark.parametrize("policy", ["sampled", "all"])
def test_the_step_open_at_the_signal_is_exported_cut_at_the_signal(tmp_path: Path, policy: str) -> None:
    """SIGTERM inside iteration 6's backward: that backward is a child span of the exported
    iteration, ERROR with the reason, ended when the signal came. ``sampled``: step phases are
    records on the fast path; ``all``: they are SDK spans from the start."""
    run = run_and_signal(tmp_path, "traintel", "backward", signal.SIGTERM, TRAINTEL_EXPORT_ITERATIONS=policy)
    assert run.code == -signal.SIGTERM, run.err
    assert "Traceback" not in run.err and "ended span" not in run.err, run.err
    found = spans(tmp_path)
    received = the_event(found)[semconv.PREEMPTION_RECEIVED]
    (cut,) = [s for s in found if s.name == "training_iteration" and s.attributes[semconv.ITERATION] == 6]
    assert cut.is_error and cut.attributes[semconv.END_REASON] == "preempted: SIGTERM"
    children = {s.name: s for s in found if s.parent_span_id == cut.span_id}
    assert sorted(children) == ["model_backward", "model_forward"]  # no optimizer step: never reached
    assert sum(1 for s in found if s.parent_span_id == cut.span_id) == 2  # none twice
    forward, backward = children["model_forward"], children["model_backward"]
    assert not forward.is_error and semconv.END_REASON not in forward.attributes
    assert backward.is_error and backward.attributes[semconv.END_REASON] == "preempted: SIGTERM"
    assert backward.attributes[semconv.PHASE] == "model_backward"
    assert backward.end_ns == received  # ended when the signal came, not when the report ran
    assert run.sent_ns <= received < run.sent_ns + 2_000_000_000  # the same wall clock, both sides
    assert forward.end_ns <= backward.start_ns < backward.end_ns <= cut.end_ns
    if policy == "all":  # the backward of every completed iteration too, and none of them cut
        done = [s for s in found if s.name == "model_backward" and s is not backward]
        assert len(done) == 6 and not any(s.is_error for s in done)


def test_a_signal_between_steps_cuts_the_iteration_and_no_step(tmp_path: Path) -> None:
    """SIGTERM after iteration 6's backward closed, before its optimizer step: the iteration is
    cut, the steps it completed are exported as they were, none is cut twice or made ERROR."""
    run = run_and_signal(tmp_path, "traintel", "after_backward", signal.SIGTERM)
    assert run.code == -signal.SIGTERM, run.err
    assert "Traceback" not in run.err and "could not" not in run.err, run.err
    found = spans(tmp_path)
    (cut,) = [s for s in found if s.name == "training_iteration" and s.attributes[semconv.ITERATION] == 6]
    assert cut.is_error and cut.attributes[semconv.END_REASON] == "preempted: SIGTERM"
    children = sorted((s for s in found if s.parent_span_id == cut.span_id), key=lambda s: s.start_ns)
    assert [s.name for s in children] == ["model_forward", "model_backward"]
    assert not any(s.is_error or semconv.END_REASON in s.attributes for s in children)
    assert children[1].end_ns < the_event(found)[semconv.PREEMPTION_RECEIVED]


def test_a_signal_while_loading_data_before_the_iteration_cuts_that_span(tmp_path: Path) -> None:
    """``data_loading`` outside any iteration is an SDK span of its own (badput): cut at the
    signal like a step inside one, parented to the training loop."""
    run = run_and_signal(tmp_path, "traintel", "data_loading", signal.SIGTERM)
    assert run.code == -signal.SIGTERM, run.err
    assert "Traceback" not in run.err and "could not" not in run.err, run.err
    found = spans(tmp_path)
    event = the_event(found)
    assert event[semconv.PREEMPTION_LAST_ITERATION] == 5 and event[semconv.PREEMPTION_ITERATIONS_LOST] == 2
    (loading,) = [s for s in found if s.name == "data_loading"]
    (loop,) = [s for s in found if s.name == "training_loop"]
    assert loading.parent_span_id == loop.span_id
    assert loading.is_error and loading.attributes[semconv.END_REASON] == "preempted: SIGTERM"
    assert loading.end_ns == event[semconv.PREEMPTION_RECEIVED]
    assert not [s for s in found if s.name == "training_iteration" and s.attributes[semconv.ITERATION] == 6]


# Configures traintel and has the signal SIGNAL land inside its own bookkeeping of iteration 3's
# end, after the iteration stopped being the open one and before its export was decided: raised
# from the method that adds its row to the window, the handler runs before that method returns;
# then after_signal() runs there. The script defines SIGNAL and after_signal() first.
SIGNAL_IN_ITERATION_3_END = textwrap.dedent(
    """
    import traintel
    from traintel._runtime import state

    traintel.configure(warmup_iterations=0)
    engine = state.configured().engine
    add_row = engine._completed

    def add_row_then_signal(record, duration_ns, end_ns):
        add_row(record, duration_ns, end_ns)
        if record.iteration == 3:
            signal.raise_signal(SIGNAL)
            after_signal()

    engine._completed = add_row_then_signal
    """
)

IN_ITERATION_END = (
    textwrap.dedent(
        """
        import signal, sys
        SIGNAL = getattr(signal, sys.argv[1])

        def after_signal():  # printed only if the handler waited for the bookkeeping to finish
            print("handled after the iteration's end", 3, flush=True)
        """
    )
    + SIGNAL_IN_ITERATION_3_END
    + textwrap.dedent(
        """
        with traintel.application(), traintel.training_loop():
            for n in range(6):
                with traintel.training_iteration(n, samples=8):
                    with traintel.model_forward():
                        pass
                    with traintel.optimizer_update():
                        pass
        print("clean exit", flush=True)
        """
    )
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_an_iterations_end_is_recorded_waits_for_it(tmp_path: Path, signum: int) -> None:
    """Handled where it landed, the iteration was neither open (for the report to cut) nor
    exported, yet counted as the last completed: it went missing from the file. It is handled
    as traintel's bookkeeping returns: the iteration is exported whole, and the job stops there
    as it would have (SIGTERM's death, SIGINT's KeyboardInterrupt out of the ``with``)."""
    child = run_to_end(
        tmp_path, IN_ITERATION_END, signal.Signals(signum).name, TRAINTEL_EXPORT_ITERATIONS="all"
    )
    assert child.returncode == -signum, child.stderr  # Python re-raises an uncaught Ctrl-C's signal
    if signum == signal.SIGTERM:
        assert "Traceback" not in child.stderr, child.stderr
    else:
        assert child.stderr.count("Traceback") == 1 and "KeyboardInterrupt" in child.stderr, child.stderr
    assert "could not" not in child.stderr, child.stderr
    found = spans(tmp_path)
    event = the_event(found)
    assert event[semconv.PREEMPTION_LAST_ITERATION] == 3
    iterations = sorted(
        (s for s in found if s.name == "training_iteration"), key=lambda s: s.attributes[semconv.ITERATION]
    )
    assert [s.attributes[semconv.ITERATION] for s in iterations] == [0, 1, 2, 3]
    for iteration in iterations:
        assert not iteration.is_error, iteration.attributes
        children = sorted(
            (s for s in found if s.parent_span_id == iteration.span_id), key=lambda s: s.start_ns
        )
        assert [s.name for s in children] == ["model_forward", "optimizer_update"]
    # the handler ran after the bookkeeping's rest, not inside it; the job went no further
    assert child.stdout == "handled after the iteration's end 3\n", child.stdout


# A user's own SIGTERM handler (installed first, so the job goes on) that raises a second SIGTERM
# while it handles the first, which waited for iteration 3's end.
SECOND_SIGNAL = (
    textwrap.dedent(
        """
        import signal
        SIGNAL = signal.SIGTERM
        calls = []

        def on_term(signum, frame):
            calls.append(signum)
            if len(calls) == 1:
                signal.raise_signal(signal.SIGTERM)

        def after_signal():
            pass

        signal.signal(signal.SIGTERM, on_term)
        """
    )
    + SIGNAL_IN_ITERATION_3_END
    + textwrap.dedent(
        """
        with traintel.application(), traintel.training_loop():
            for n in range(6):
                with traintel.training_iteration(n, samples=8):
                    pass
                if n == 3:
                    print("handled by iteration 3's end:", len(calls), flush=True)
        print("clean exit", len(calls), flush=True)
        """
    )
)


def test_a_signal_during_a_waiting_signals_handling_is_not_deferred_again(tmp_path: Path) -> None:
    """The waiting signal is handled as the bookkeeping returns; one that arrives while that
    handling runs is handled at once, not left for an iteration end that may never come."""
    child = run_to_end(tmp_path, SECOND_SIGNAL)
    assert child.returncode == 0, child.stderr
    assert child.stdout.splitlines() == ["handled by iteration 3's end: 2", "clean exit 2"], child.stdout
    assert "Traceback" not in child.stderr and "could not" not in child.stderr, child.stderr


# The training thread is stopped by SIGTERM while it holds the goodput ledger's lock, booking a
# data-loading wait outside the iterations (directly in the loop's body it would be the next
# iteration's first step, booked with it; under a span of the script's own it is booked as it
# ends) (the signal is raised right after the lock is taken, on the main thread):
# between iterations, or inside a checkpoint save that the report must then end and book.
SIGNAL_IN_BOOKING = textwrap.dedent(
    """
    import signal, sys, threading
    import traintel
    from traintel._runtime import state

    traintel.configure(warmup_iterations=0)
    ledger = state.configured().engine.goodput
    real = ledger.lock
    armed = []

    class SignalWhileHeld:
        def acquire(self, *args, **kwargs):
            got = real.acquire(*args, **kwargs)
            if got and armed and threading.current_thread() is threading.main_thread():
                armed.clear()
                signal.raise_signal(signal.SIGTERM)
            return got

        def release(self):
            real.release()

        def __enter__(self):
            return self.acquire()

        def __exit__(self, *exc):
            self.release()

    ledger.lock = SignalWhileHeld()
    where = sys.argv[1]
    with traintel.application(), traintel.training_loop():
        for n in range(6):
            if n == 3 and where == "between_iterations":
                armed.append(True)
            with traintel.timed_span("fetch"), traintel.data_loading():
                pass  # (under a span of its own: a real span, booked as it ends)
            if n == 3 and where == "in_checkpoint":
                with traintel.checkpoint_save(iteration=3):
                    armed.append(True)
                    with traintel.data_loading():
                        pass
            with traintel.training_iteration(n, samples=8):
                pass
    print("not stopped", flush=True)
    """
)


@pytest.mark.parametrize("where", ["between_iterations", "in_checkpoint"])
def test_a_signal_while_the_training_thread_books_goodput_is_reported_fully(
    tmp_path: Path, where: str
) -> None:
    """The report runs on a helper thread while the training thread, stopped by the signal,
    holds the goodput ledger's lock: the last metric collection reads the ledger without it,
    and a phase the report ends (the open save) is not waited for forever but said to be
    unbooked. Before, the report waited the whole shutdown timeout and the spans were lost."""
    child = run_to_end(tmp_path, SIGNAL_IN_BOOKING, where, TRAINTEL_SHUTDOWN_TIMEOUT="3")
    assert child.returncode == -signal.SIGTERM, child.stderr
    assert "not finished" not in child.stderr and "Traceback" not in child.stderr, child.stderr
    assert child.stdout == "", child.stdout
    found = spans(tmp_path)
    assert the_event(found)[semconv.PREEMPTION_LAST_ITERATION] == 2
    (loop,) = [s for s in found if s.name == "training_loop"]
    assert loop.attributes[semconv.END_REASON] == "preempted: SIGTERM"
    # the last metric collection (at the pipeline's shutdown) read the live goodput
    final = [r for r in iter_records([tmp_path / "runs"]) if isinstance(r, MetricsRecord)][-1]
    assert semconv.METRIC_GOODPUT in {series.name for series in final.metrics}
    if where == "in_checkpoint":
        (save,) = [s for s in found if s.name == "checkpoint_save_sync"]
        assert save.is_error and save.attributes[semconv.END_REASON] == "preempted: SIGTERM"
        assert "goodput of 1 phase(s) ended by the preemption is not booked" in child.stderr, child.stderr


@pytest.mark.parametrize("where", ["backward", "data_loading"])
def test_a_preemption_exports_the_open_window_and_the_held_records(tmp_path: Path, where: str) -> None:
    """With the shipped window floor (records of windows shorter than 30 s are held and leave
    together), the iterations completed before the signal are all in the file: the loop's end
    closes the open window, and its record and the held ones go out before the process dies.
    Before, they were lost: the report showed no iteration, goodput booked the time as other."""
    run = run_and_signal(tmp_path, "traintel", where, signal.SIGTERM, TRAINTEL_WINDOW_MIN_SECONDS="30")
    assert run.code == -signal.SIGTERM, run.err
    assert "not finished" not in run.err and "Traceback" not in run.err, run.err
    # iterations 0-5 completed; 6, cut short in its backward, is exported (ERROR) and not
    # counted: it did not complete
    last = 5
    assert summarize([tmp_path / "runs"]).window_iterations == last + 1
    (job,) = compute_goodput(load_jobs([tmp_path / "runs"]))[0].jobs
    assert job.status == "preempted"
    assert (job.first_iteration, job.last_iteration, job.inferred_tail) == (0, last, None)  # all in records


# Blocks the main thread inside C++ (a store wait for a key no one sets, as a rank does whose
# peer died), or forks a child that it stops with SIGTERM and then goes on itself.
BLOCKED_IN_CPP = textwrap.dedent(
    """
    import datetime, os, signal, sys, time
    import torch.distributed as dist
    import traintel

    traintel.configure()
    with traintel.application():
        if sys.argv[1] == "blocked":
            store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=600))
            with traintel.dist_init():
                print("ready", flush=True)
                store.get("never-set")
        else:
            child = os.fork()
            if child == 0:
                time.sleep(60)
                os._exit(0)
            time.sleep(0.2)
            os.kill(child, signal.SIGTERM)
            _, status = os.waitpid(child, 0)
            time.sleep(2 * 1.0)  # past the watch's grace: a signal it took for this process's would act
            print("child", os.waitstatus_to_exitcode(status), "parent goes on", flush=True)
    """
)


def test_sigterm_while_the_main_thread_waits_in_cpp_still_ends_the_job(tmp_path: Path) -> None:
    """A Python handler runs only when the main thread returns to Python: stuck in a C++ wait,
    the job ignored SIGTERM until the wait's timeout (without traintel it dies at once). The
    signal is now noticed off the main thread: the report runs there and the job dies by it."""
    run = run_and_signal(tmp_path, "blocked", "-", signal.SIGTERM, script_text=BLOCKED_IN_CPP)
    assert run.code == -signal.SIGTERM, run.err
    assert "Traceback" not in run.err, run.err
    found = spans(tmp_path)
    the_event(found)
    for name in ("application", "dist_init"):
        (span,) = [s for s in found if s.name == name]
        assert span.is_error and span.attributes[semconv.END_REASON] == "preempted: SIGTERM", name


def test_a_forked_childs_sigterm_is_not_its_parents(tmp_path: Path) -> None:
    """The child's signals are its own: the parent's watch never sees them, so it goes on."""
    child = run_to_end(tmp_path, BLOCKED_IN_CPP, "fork")
    assert child.returncode == 0, child.stderr
    assert child.stdout == f"child {-signal.SIGTERM} parent goes on\n", child.stdout


# Reports slowly (an exporter taking 20 s per batch), so a second SIGTERM lands in the report.
SLOW_REPORT = textwrap.dedent(
    """
    import time
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    import traintel

    class Slow(SpanExporter):
        def export(self, spans):
            time.sleep(20)
            return SpanExportResult.SUCCESS

    traintel.configure(span_exporters=[Slow()])
    with traintel.application(), traintel.training_loop():
        print("ready", flush=True)
        time.sleep(60)
    """
)


def test_a_second_sigterm_while_the_first_is_reported_ends_the_job_at_once(tmp_path: Path) -> None:
    """The second signal is the job's call (a scheduler's, a user's Ctrl-C): it ends the
    process at once, as without traintel, rather than waiting for the first one's report."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "train.py").write_text(SLOW_REPORT)
    child = subprocess.Popen(
        [sys.executable, str(tmp_path / "train.py")],
        cwd=tmp_path,
        env=clean_env(TRAINTEL_SHUTDOWN_TIMEOUT="30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # into the first report's 20 s export
    child.send_signal(signal.SIGTERM)
    _out, err = child.communicate(timeout=15)  # (the first report alone would take 20 s)
    assert child.returncode == -signal.SIGTERM, err


def test_a_signal_in_validation_inside_a_training_step_ends_both_iterations(tmp_path: Path) -> None:
    """SIGTERM during a validation iteration run inside training iteration 2: both iterations
    end at the signal and are exported, innermost first, with the validation loop (before: the
    training step was never ended, and it and the spans it held were lost)."""
    code = textwrap.dedent(
        """
        import signal, traintel
        with traintel.application():
            with traintel.training_loop():
                for i in range(3):
                    with traintel.training_iteration(samples=1):
                        if i == 2:
                            with traintel.validation_loop():
                                with traintel.validation_iteration():
                                    signal.raise_signal(signal.SIGTERM)
        print("not reached")
        """
    )
    result = run_to_end(tmp_path, code)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert "Traceback" not in result.stderr
    cut = {
        (s.name, s.attributes.get(semconv.ITERATION)): s
        for s in spans(tmp_path)
        if s.attributes.get(semconv.END_REASON) == "preempted: SIGTERM"
    }
    assert set(cut) == {
        ("validation_iteration", 0),
        ("training_iteration", 2),
        ("validation_loop", None),
        ("training_loop", None),
        ("application", None),
    }
    inner, outer = cut[("validation_iteration", 0)], cut[("training_iteration", 2)]
    assert inner.parent_span_id == cut[("validation_loop", None)].span_id
    assert outer.start_ns < inner.start_ns and inner.end_ns <= outer.end_ns
