"""Preemption where tests/test_preemption.py does not look: during validation, during warm-up
(before the first iteration completes, and within the warm-up iterations), and a user's own
SIGTERM handler that saves a checkpoint *after* the signal and then exits.

Each case runs in a real child process, is signalled for real, and is compared with the same
script without traintel: the exit status must be identical.
"""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.test_preemption import run_and_signal, the_event
from traintel import semconv
from traintel.analysis.goodput import compute_goodput, load_jobs
from traintel.exporters.reader import iter_spans

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

# where: "validation" blocks in validation iteration 1 after 4 training iterations and a save
# after the 2nd; "first_iteration" blocks in iteration 0's forward; "warmup" blocks in
# iteration 2 of 5 warm-up iterations (a save after iteration 1); "handler_saves" installs a
# SIGTERM handler that saves a checkpoint (taking 0.2 s) and exits with status 143;
# "failed_save" blocks in iteration 5 after a save at iteration 4 that raised (and was caught);
# "failed_plain_save" does the same with the save a plain OpenTelemetry span.
SCRIPT = textwrap.dedent(
    """
    import contextlib, os, sys, time
    use_traintel, where = sys.argv[1] == "traintel", sys.argv[2]
    def install_handler():
        import signal
        def save_then_exit(signum, frame):
            with traintel.checkpoint_save(iteration=done[0]):
                time.sleep(0.2)
            sys.exit(128 + signum)
        signal.signal(signal.SIGTERM, save_then_exit)

    if where == "handler_saves":  # installed before traintel's, which hands it the signal
        install_handler()
    if use_traintel:
        import traintel
        traintel.configure(log_every_n_iterations=2, warmup_iterations=5 if where == "warmup" else 0)
    else:
        class _NoTelemetry:
            def __getattr__(self, name):
                return lambda *a, **k: contextlib.nullcontext()
        traintel = _NoTelemetry()
    if where == "handler_saves_late":  # installed after traintel configured: replaces its handler
        install_handler()

    def block():
        print("ready", flush=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.01)
        print("never signalled", flush=True)

    done = [0]
    block_at = {"first_iteration": 0, "warmup": 2, "handler_saves": 5, "handler_saves_late": 5,
                "failed_save": 5, "failed_plain_save": 5}.get(where)
    with traintel.application():
        with traintel.training_loop():
            for n in range(8):
                with traintel.training_iteration(n, samples=8):
                    with traintel.model_forward():
                        if n == block_at:
                            block()
                    with traintel.model_backward():
                        pass
                done[0] = n + 1
                if n == 1:
                    with traintel.checkpoint_save(iteration=2):
                        pass
                if n == 3 and where == "failed_save":  # the job logs the failure and trains on
                    with contextlib.suppress(OSError):
                        with traintel.checkpoint_save(iteration=4):
                            raise OSError("disk full")
                if n == 3 and where == "failed_plain_save":  # the same save, a plain OTel span
                    from opentelemetry import trace
                    save = {"ml.training.phase": "checkpoint_save_sync",
                            "ml.training.checkpoint.iteration": 4}
                    with contextlib.suppress(OSError):
                        with trace.get_tracer("user").start_as_current_span("save", attributes=save):
                            raise OSError("disk full")
                if n == 3 and where == "validation":
                    with traintel.validation_loop():
                        for v in range(3):
                            with traintel.validation_iteration():
                                if v == 1:
                                    block()
    print("clean exit", flush=True)
    """
)


def _status(runs: Path) -> str:
    (job,) = compute_goodput(load_jobs([runs]))[0].jobs
    return job.status


PREEMPTED = "preempted: SIGTERM"


def _done_and_saved(event: dict[str, Any]) -> tuple[int, int]:
    """(last completed iteration, last checkpoint iteration) as the event reports them."""
    return event[semconv.PREEMPTION_LAST_ITERATION], event[semconv.PREEMPTION_CHECKPOINT_ITERATION]


@pytest.mark.parametrize(
    "where", ["validation", "first_iteration", "warmup", "failed_save", "failed_plain_save"]
)
def test_sigterm_outside_a_plain_training_step(tmp_path: Path, where: str) -> None:
    plain_code = run_and_signal(tmp_path / "plain", "plain", where, signal.SIGTERM, SCRIPT).code
    code, out, err, _, _ = run_and_signal(tmp_path, "traintel", where, signal.SIGTERM, SCRIPT)
    assert code == plain_code == -signal.SIGTERM, err  # died by the signal, exactly as without us
    assert "clean exit" not in out and "Traceback" not in err, err
    assert "not finished within" not in err, err  # the report ended within its bound
    found = list(iter_spans([tmp_path / "runs"]))
    by_name: dict[str, list[Any]] = {}
    for span in found:
        by_name.setdefault(span.name, []).append(span)
    cut = ["application", "training_loop"]
    if where == "validation":
        cut += ["validation_loop", "validation_iteration"]
    else:
        cut += ["training_iteration"]
    for name in cut:
        last = max(by_name[name], key=lambda s: s.start_ns)
        assert last.is_error and last.attributes[semconv.END_REASON] == PREEMPTED, name
    event = the_event(found)
    assert event[semconv.PREEMPTION_SIGNAL] == "SIGTERM"
    (app,) = by_name["application"]
    assert app.start_ns < event[semconv.PREEMPTION_RECEIVED] < app.end_ns  # when it came
    assert event[semconv.PREEMPTION_SAVE_AFTER_SIGNAL] is False
    assert semconv.PREEMPTION_SAVE_AFTER_SIGNAL_TIME not in event
    if where == "validation":  # iterations 0..3 done, saved at 2: 2 and 3 are redone
        assert _done_and_saved(event) == (3, 2)
        assert event[semconv.PREEMPTION_ITERATIONS_LOST] == 2
        (validation,) = by_name["validation_iteration"][-1:]
        assert validation.attributes[semconv.END_REASON] == PREEMPTED
    elif where.startswith("failed"):  # 0..4 done; the save at 4 failed: a resume starts from 2
        assert _done_and_saved(event) == (4, 2)
        assert event[semconv.PREEMPTION_ITERATIONS_LOST] == 3
    elif where == "warmup":  # iterations 0, 1 done, saved at 2: nothing to redo
        assert _done_and_saved(event) == (1, 2)
        assert event[semconv.PREEMPTION_ITERATIONS_LOST] == 0
    else:  # nothing completed, nothing saved: nothing is lost but the step in progress
        assert semconv.PREEMPTION_LAST_ITERATION not in event
        assert semconv.PREEMPTION_CHECKPOINT_ITERATION not in event
        assert event[semconv.PREEMPTION_ITERATIONS_LOST] == 0
    assert _status(tmp_path / "runs") == "preempted"


@pytest.mark.parametrize("where", ["handler_saves", "handler_saves_late"])
def test_a_users_handler_saves_after_the_signal_then_exits(tmp_path: Path, where: str) -> None:
    """The handler installed before traintel configured, or after (traintel chains it when the
    application span opens)."""
    plain_code = run_and_signal(tmp_path / "plain", "plain", where, signal.SIGTERM, SCRIPT).code
    code, out, err, took, _ = run_and_signal(tmp_path, "traintel", where, signal.SIGTERM, SCRIPT)
    assert code == plain_code == 128 + signal.SIGTERM, err  # the user's sys.exit(143), unchanged
    assert "clean exit" not in out and "Traceback" not in err, err
    assert "not finished within" not in err, err  # the report ended within its bound
    found = list(iter_spans([tmp_path / "runs"]))
    saves = sorted((s for s in found if s.name == "checkpoint_save_sync"), key=lambda s: s.start_ns)
    assert [s.attributes[semconv.CHECKPOINT_ITERATION] for s in saves] == [2, 5]  # the handler's save
    event = the_event(found)
    assert event[semconv.PREEMPTION_SIGNAL] == "SIGTERM"
    assert event[semconv.PREEMPTION_SAVE_AFTER_SIGNAL] is True
    measured = (saves[1].end_ns - saves[1].start_ns) / 1e9
    assert event[semconv.PREEMPTION_SAVE_AFTER_SIGNAL_TIME] == pytest.approx(measured)
    assert 0.2 <= measured <= took  # its own 0.2 s, between the signal and the exit
    assert event[semconv.PREEMPTION_RECEIVED] <= saves[1].start_ns
    # iterations 0..4 done; the save after the signal captured iteration 5: nothing is redone
    assert _done_and_saved(event) == (4, 5)
    assert event[semconv.PREEMPTION_ITERATIONS_LOST] == 0
    assert _status(tmp_path / "runs") == "preempted"  # told to stop, not a failure
