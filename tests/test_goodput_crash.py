"""Goodput after a crash: real processes killed with SIGKILL, then the session read back.

Each job is a real interpreter writing through the embedded default (files under
TRAINTEL_OUTPUT_DIR). Its wall clock is a counter the job advances itself (``time.time_ns`` is
replaced before anything is imported), so every span - traintel's own API or plain OpenTelemetry
- has an exact timestamp and every bucket can be asserted to the second.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.subprocess_helpers import run_python
from traintel import cli
from traintel.analysis.goodput import SessionGoodput, compute_goodput, load_jobs
from traintel.semconv import BADPUT_CATEGORIES

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

T0_S = 1_700_000_000

#: A job on a counter clock: ``tick(s)`` moves it. ``phase``/``loop``/``save``/``load`` open
#: traintel's phases (STYLE=traintel) or plain OpenTelemetry spans with ``ml.training.phase``.
HARNESS = """
import os, signal, time
S = 10**9
NOW = [(T0_S + START) * S]
time.time_ns = lambda: NOW[0]
time.monotonic_ns = time.time_ns  # traintel times with both: one simulated timeline
def tick(seconds):
    NOW[0] += round(seconds * S)
import traintel
from traintel import semconv
telemetry = traintel.configure(warmup_iterations=0)
tracer = telemetry.pipeline.tracer_provider.get_tracer("user-code")
def plain(name, **attributes):
    return tracer.start_as_current_span(name, attributes={semconv.PHASE: name, **attributes})
def phase(name, number=None):
    if STYLE == "traintel":
        return getattr(traintel, name)()
    return plain(name, **({semconv.ITERATION: number} if number is not None else {}))
def loop(start):
    if STYLE == "traintel":
        return traintel.training_loop(train_iterations_start=start)
    return plain("training_loop", **{semconv.TRAIN_ITERATIONS_START: start})
def save(iteration):
    if STYLE == "traintel":
        return traintel.checkpoint_save(iteration=iteration)
    return plain("checkpoint_save_sync", **{semconv.CHECKPOINT_ITERATION: iteration})
def load(iteration):
    if STYLE == "traintel":
        return traintel.checkpoint_load(iteration=iteration)
    return plain("checkpoint_load", **{semconv.CHECKPOINT_ITERATION: iteration})
def kill():
    telemetry.flush(60)  # what was recorded is on disk; then the node goes
    os.kill(os.getpid(), signal.SIGKILL)
"""

#: Killed inside its first window (50 iterations): 0-64 s. Init 10 s; iteration 0 takes 7 s (2 s
#: startup over the typical 5 s); iteration 3 waits 1 s for data; a 2 s save after iteration 5
#: (resume point 6); iterations 6-9 (20 s) are redone by the next job.
KILLED_IN_FIRST_WINDOW = """
with phase("application"):
    with phase("model_init"):
        tick(10)
    with loop(0):
        for i in range(10):
            with phase("training_iteration", i):
                if i == 3:
                    with phase("data_loading"):
                        tick(1)
                    tick(4)
                else:
                    tick(7 if i == 0 else 5)
            if i == 5:
                with save(6):
                    tick(2)
        kill()
"""

#: Starts at 80 s, loads the checkpoint of iteration 6 (4 s), runs 6-9, ends cleanly at 105 s.
RESUMED = """
with phase("application"):
    with load(6):
        tick(4)
    with loop(6):
        for i in range(6, 10):
            with phase("training_iteration", i):
                tick(5)
    tick(1)
traintel.shutdown()
"""


def run_job(tmp_path: Path, body: str, style: str, restart: int, start_s: float, **env: str) -> None:
    work = tmp_path / f"job-{restart}"
    work.mkdir()
    result = run_python(
        f"T0_S = {T0_S}\nSTART = {start_s}\nSTYLE = {style!r}\n" + HARNESS + body,
        work,
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        TRAINTEL_SESSION_TAG="session",
        TRAINTEL_RUN_ID="job",
        TORCHELASTIC_RESTART_COUNT=str(restart),
        **env,
    )
    assert result.returncode in (0, -signal.SIGKILL), result.stderr[-3000:]


def session_of(directory: Path) -> SessionGoodput:
    (session,) = compute_goodput(load_jobs([directory]))
    return session


def expect(result: SessionGoodput, total: float, productive: float, **badput: float) -> None:
    assert result.total_s == pytest.approx(total, abs=1e-9)
    assert result.productive_s == pytest.approx(productive, abs=1e-9)
    for category in BADPUT_CATEGORIES:
        assert result.badput_s[category] == pytest.approx(badput.get(category, 0.0), abs=1e-9), category
    assert result.productive_s + sum(result.badput_s.values()) == pytest.approx(result.total_s, abs=1e-9)


@pytest.mark.parametrize("style", ["traintel", "otel"])
def test_a_job_killed_in_its_first_window_then_resumed(
    tmp_path: Path, style: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_job(tmp_path, KILLED_IN_FIRST_WINDOW, style, restart=0, start_s=0)
    run_job(tmp_path, RESUMED, style, restart=1, start_s=80)
    result = session_of(tmp_path / "runs")
    # Job 1: 52 s of iterations = 1 data + 2 startup + 49 productive, of which iterations 6-9
    # (20 s) were run again; 64 -> 80 s recovery; job 2: 4 s load, 20 s productive, 1 s other.
    expect(
        result, 105, productive=49, initialization=10, checkpoint_save=2, checkpoint_load=4,
        data_loading=1, program_startup=2, wasted_progress=20, infrastructure_recovery=16, other=1,
    )  # fmt: skip
    killed, resumed = result.jobs
    assert (killed.status, killed.first_iteration, killed.last_iteration) == ("no end exported", 0, 9)
    assert killed.inferred_tail is not None
    assert killed.inferred_tail.as_dict() == {
        "first_iteration": 0,
        "last_iteration": 9,
        "exported_iterations": 10,
        "missing_iterations": 0,
        "productive_seconds": 49.0,
        "source": "exported training_iteration spans after the last window record",
    }
    assert (resumed.status, resumed.resumed_from, resumed.inferred_tail) == ("completed", 6, None)
    assert result.last_iteration == 9
    # goodput and report read the same numbers
    assert cli.main(["goodput", str(tmp_path / "runs"), "--json"]) == 0
    goodput = json.loads(capsys.readouterr().out)["sessions"]
    assert cli.main(["report", str(tmp_path / "runs"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["goodput"] == goodput
    assert cli.main(["goodput", str(tmp_path / "runs")]) == 0
    assert "iterations 0-9 after the last window record: counted from 10 exported" in capsys.readouterr().out


#: 25 s iterations: the 60 s ceiling closes windows after iterations 2 (75 s) and 5 (150 s);
#: iterations 6-7 run to 200 s, then 300 s of uncategorised work before the kill at 500 s.
KILLED_LONG_AFTER_A_WINDOW = """
with phase("application"):
    with loop(0):
        for i in range(8):
            with phase("training_iteration", i):
                tick(25)
        tick(300)
        kill()
"""


@pytest.mark.parametrize(
    ("policy", "productive", "tail"),
    [
        ("sampled", 200, (6, 7, 2, 0)),  # the first 10 iterations are exported: the tail counts
        ("none", 150, None),  # nothing exported after the last window: at most 60 s lost
    ],
)
def test_a_kill_long_after_the_last_window_closed_by_time(
    tmp_path: Path, policy: str, productive: float, tail: tuple[int, int, int, int] | None
) -> None:
    run_job(
        tmp_path, KILLED_LONG_AFTER_A_WINDOW, "traintel", restart=0, start_s=0,
        TRAINTEL_WINDOW_MIN_SECONDS="10", TRAINTEL_EXPORT_ITERATIONS=policy,
    )  # fmt: skip
    result = session_of(tmp_path / "runs")
    expect(result, 500, productive=productive, other=500 - productive)
    (job,) = result.jobs
    assert job.last_iteration == (7 if tail else 5)
    got = job.inferred_tail
    assert (
        None
        if got is None
        else (got.first_iteration, got.last_iteration, got.exported_iterations, got.missing_iterations)
    ) == tail
    assert 200 - productive <= 60  # what the accounting lost: at most the ceiling


#: Sampled exports leave gaps in a tail: the exported ones count, the others are named.
KILLED_WITH_A_SAMPLED_TAIL = """
with phase("application"):
    with loop(0):
        for i in range(14):
            with phase("training_iteration", i):
                tick(20 if i in (11, 13) else 2)
        kill()
"""


def test_a_sampled_tail_counts_the_exported_iterations_and_names_the_others(tmp_path: Path) -> None:
    # N = 8 and a 10 s floor: window [0-7] closes at 16 s; 8-13 are open at the kill. Exported:
    # the first 10 (8 and 9 of the tail), and 11 and 13, slow (20 s against ~2 s); 10 and 12 not.
    run_job(
        tmp_path, KILLED_WITH_A_SAMPLED_TAIL, "traintel", restart=0, start_s=0,
        TRAINTEL_WINDOW_MIN_SECONDS="10", TRAINTEL_LOG_EVERY_N_ITERATIONS="8",
    )  # fmt: skip
    (job,) = session_of(tmp_path / "runs").jobs
    assert job.inferred_tail is not None
    summary: dict[str, Any] = job.inferred_tail.as_dict()
    assert (summary["first_iteration"], summary["last_iteration"]) == (8, 13)
    assert (summary["exported_iterations"], summary["missing_iterations"]) == (4, 2)
    assert summary["productive_seconds"] == pytest.approx(44)
    assert job.productive_s == pytest.approx(16 + 44)  # the window, then 8, 9, 11 and 13


#: Ends cleanly, but its end carries 300 s (its exit flush ran late).
LATE_END = """
with phase("application"):
    with loop(0):
        for i in range(4):
            with phase("training_iteration", i):
                tick(10)
    tick(260)
traintel.shutdown()
"""
#: ``RESUMED`` ending at 150 s when started at 100 s.
RESUMED_UNTIL_150 = RESUMED.replace("tick(1)", "tick(26)")


def test_a_late_exit_flush_does_not_stretch_the_session(tmp_path: Path) -> None:
    # Job 1 ends cleanly, but its end carries 300 s, after job 2 started at 100 s (its exit flush
    # ran late); job 2 ends at 150 s. Every total is clipped at job 2's start.
    run_job(tmp_path, LATE_END, "otel", restart=0, start_s=0)
    run_job(tmp_path, RESUMED_UNTIL_150, "otel", restart=1, start_s=100)
    result = session_of(tmp_path / "runs")
    assert result.total_s == pytest.approx(150)
    first, second = result.jobs
    assert (first.total_s, second.total_s) == (pytest.approx(100), pytest.approx(50))
    assert first.total_s + second.total_s == pytest.approx(result.total_s)
    assert result.productive_s + sum(result.badput_s.values()) == pytest.approx(result.total_s)
    # 40 s of job 1's iterations, 20 of job 2's (6-9 were never run before: nothing wasted)
    expect(result, 150, productive=60, checkpoint_load=4, other=150 - 60 - 4)
