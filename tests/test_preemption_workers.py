"""Preemption of a job with DataLoader workers, signalled as Slurm, Kubernetes or a terminal do:
the whole process group at once.

The workers die with the main process, and torch's SIGCHLD handler then raises "DataLoader
worker ... killed by signal" in the main thread, possibly while traintel's SIGTERM handler is
waiting for its report: that used to cut the wait short ("could not report the preemption", a
traceback, spans lost). Each case runs a real training loop on CPU with ``num_workers=2`` in its
own session, is signalled with ``os.killpg``, and is compared with the same script without
traintel where its exit is at stake.
"""

from __future__ import annotations

import os
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
from traintel.exporters.reader import iter_spans

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

# argv: "traintel" or "plain", then "default" (SIGTERM's default action; signalled while it
# trains) or "user": a flag handler installed before traintel's and no application span, so
# traintel flushes, then hands the signal over, and the job goes on. That job is signalled in
# a long step of its own code; torch's error comes up where the workers' deaths are noticed,
# in that step or in traintel's phase code after it, whose guards raise it on
# (tests/test_signal_raised.py pins the latter deterministically).
JOB = textwrap.dedent(
    """
    import contextlib, os, signal, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    use_traintel, handler = sys.argv[1] == "traintel", sys.argv[2]
    stop = []
    if handler == "user":
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    if use_traintel:
        import traintel
    else:
        class _NoTelemetry:
            def __getattr__(self, name):
                return lambda *a, **k: contextlib.nullcontext()
        traintel = _NoTelemetry()

    class Batches(Dataset):
        def __len__(self):
            return 1_000_000

        def __getitem__(self, index):
            time.sleep(0.002)  # the loop waits on its workers, as a data-bound job does
            return torch.randn(8), torch.randn(1)

    def main():
        if use_traintel:
            traintel.configure(warmup_iterations=0)
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        batches = iter(DataLoader(Batches(), batch_size=4, num_workers=2))
        app = traintel.application() if handler == "default" else contextlib.nullcontext()
        deadline = time.monotonic() + 30
        with app, traintel.training_loop():
            for n in range(1_000_000):
                with traintel.training_iteration(n, samples=4):
                    with traintel.data_loading():
                        x, y = next(batches)
                    with traintel.model_forward():
                        loss = torch.nn.functional.mse_loss(model(x), y)
                    with traintel.model_backward():
                        loss.backward()
                        if handler == "user" and n == 3:
                            print("ready", os.getpid(), flush=True)
                            while not stop and time.monotonic() < deadline:
                                time.sleep(0.01)
                    with traintel.optimizer_update():
                        optimizer.step()
                        optimizer.zero_grad()
                if handler == "default" and n == 3:
                    print("ready", os.getpid(), flush=True)
                if stop:
                    time.sleep(2)  # saving a checkpoint
                    break
                if time.monotonic() > deadline:
                    print("never signalled", flush=True)
                    break
        print("clean exit", flush=True)

    if __name__ == "__main__":
        main()
    """
)


class Run(NamedTuple):
    code: int
    out: str
    err: str
    took: float  # seconds from the signal to the exit
    pid: int
    runs: Path


def killpg_mid_training(tmp_path: Path, mode: str, handler: str, signum: int = signal.SIGTERM) -> Run:
    """Start the job in its own session, let it train, then signal its whole process group."""
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(JOB)
    runs = tmp_path / "runs"
    child = subprocess.Popen(
        [sys.executable, str(script), mode, handler],
        cwd=tmp_path,
        env=clean_env(
            TRAINTEL_OUTPUT_DIR=str(runs),
            # Room for a loaded CI machine to write every exported iteration: what is tested is
            # that torch's SIGCHLD error no longer cuts the wait short, not how long it takes.
            TRAINTEL_SHUTDOWN_TIMEOUT="30",
            TRAINTEL_EXPORT_ITERATIONS="all",  # every iteration ended is exported: none may be missing
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, with its workers
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line.startswith("ready"):
            child.kill()
            raise AssertionError(f"the job did not start: {line!r} {child.communicate()[1]}")
        pid = line.split()[1]
        time.sleep(0.2)  # mid-training, workers busy
        sent = time.monotonic()
        os.killpg(child.pid, signum)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:  # never leave a job or its workers behind
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
    return Run(child.returncode, out, err, time.monotonic() - sent, int(pid), runs)


def preemption_events(spans: list[Any]) -> list[dict[str, Any]]:
    return [dict(e.attributes) for s in spans for e in s.events if e.name == semconv.Event.PREEMPTION.value]


PREEMPTED = "preempted: SIGTERM"


def chained(err: str) -> int:
    """How many tracebacks in ``err`` continue the one before (Python's chained exceptions)."""
    return err.count("During handling of the above exception") + err.count("was the direct cause")


def test_sigterm_to_the_group_is_reported_in_full_and_kills_the_job(tmp_path: Path) -> None:
    run = killpg_mid_training(tmp_path, "traintel", "default")
    assert run.code == -signal.SIGTERM, run.err  # died by the signal, as without traintel
    assert "clean exit" not in run.out
    # Neither torch's error nor a report cut short, in the main process or a worker.
    for text in ("Traceback", "could not report the preemption", "DataLoader worker", "not finished within"):
        assert text not in run.err, run.err
    # Only the main process wrote telemetry: the workers, killed by the same signal, did not.
    files = [p.name for p in run.runs.rglob("*") if p.is_file()]
    assert files and all(str(run.pid) in name for name in files), files
    spans = list(iter_spans([run.runs]))
    (event,) = preemption_events(spans)
    assert event[semconv.PREEMPTION_SIGNAL] == "SIGTERM"
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    for name in ("application", "training_loop"):
        (span,) = by_name[name]
        assert span.is_error and span.attributes[semconv.END_REASON] == PREEMPTED, name
    # The wait was not cut short: every iteration the job ended is in the file, each once, with
    # its phases. The signal lands where the loop is: an iteration it cut (the last one, ERROR,
    # with the phases it reached, the one open then ERROR too), or between two.
    iterations = sorted(by_name["training_iteration"], key=lambda s: s.attributes[semconv.ITERATION])
    numbers = [s.attributes[semconv.ITERATION] for s in iterations]
    assert numbers == list(range(len(numbers))), numbers
    last_done = event[semconv.PREEMPTION_LAST_ITERATION]
    assert last_done >= 3 and numbers[-1] in (last_done, last_done + 1), (last_done, numbers)
    phases = ["data_loading", "model_forward", "model_backward", "optimizer_update"]
    for iteration in iterations:
        children = sorted(
            (s for s in spans if s.parent_span_id == iteration.span_id), key=lambda s: s.start_ns
        )
        names = [s.name for s in children]
        if iteration.attributes[semconv.ITERATION] <= last_done:
            assert names == phases and not any(s.is_error for s in [iteration, *children]), names
            continue
        assert iteration.is_error and iteration.attributes[semconv.END_REASON] == PREEMPTED
        assert names == phases[: len(names)], names
        *done, last = children or [iteration]
        assert not any(s.is_error for s in done)
        assert not last.is_error or last.attributes[semconv.END_REASON] == PREEMPTED
    (job,) = compute_goodput(load_jobs([run.runs]))[0].jobs
    assert job.status == "preempted"


def test_a_job_that_goes_on_still_gets_torchs_error_after_the_report(tmp_path: Path) -> None:
    """The user's handler only sets a flag: the job goes on, and torch's "worker killed" error,
    which traintel held while it flushed, reaches the job after that handler, as without it."""
    plain = killpg_mid_training(tmp_path / "plain", "plain", "user")
    run = killpg_mid_training(tmp_path / "traintel", "traintel", "user")
    assert run.code == plain.code == 1, (plain.err, run.err)
    for result in (plain, run):
        assert "clean exit" not in result.out, result.err
        assert "RuntimeError: DataLoader worker (pid" in result.err, result.err
        assert "killed by signal: Terminated" in result.err, result.err
    assert "could not report the preemption" not in run.err, run.err
    assert "not finished within" not in run.err, run.err
    spans = list(iter_spans([run.runs]))
    (event,) = preemption_events(spans)
    assert event[semconv.PREEMPTION_SIGNAL] == "SIGTERM"
    (loop,) = [s for s in spans if s.name == "training_loop"]
    assert loop.is_error and "DataLoader worker" in loop.status_message  # ended by torch's error


def test_ctrl_c_to_the_group_exits_as_without_traintel(tmp_path: Path) -> None:
    """SIGINT reaches the workers too, and there traintel's handler (inherited by the fork) runs
    and must stay silent: the worker's KeyboardInterrupt is torch's to handle."""
    plain = killpg_mid_training(tmp_path / "plain", "plain", "default", signal.SIGINT)
    run = killpg_mid_training(tmp_path / "traintel", "traintel", "default", signal.SIGINT)
    assert run.code == plain.code, (plain.err, run.err)
    assert "KeyboardInterrupt" in plain.err and "KeyboardInterrupt" in run.err
    for result in (plain, run):
        # One traceback, the main process's: chained when the signal lands while torch is
        # handling another exception (plain runs do that too), never a worker's beside it.
        assert result.err.count("Traceback") == 1 + chained(result.err), result.err
        assert "_utils/worker.py" not in result.err, result.err
    assert "could not report the preemption" not in run.err and "DataLoader worker" not in run.err
    files = [p.name for p in run.runs.rglob("*") if p.is_file()]
    assert files and all(str(run.pid) in name for name in files), files
    spans = list(iter_spans([run.runs]))
    (event,) = preemption_events(spans)
    assert event[semconv.PREEMPTION_SIGNAL] == "SIGINT"
    (app,) = [s for s in spans if s.name == "application"]
    assert app.is_error and "KeyboardInterrupt" in app.status_message
