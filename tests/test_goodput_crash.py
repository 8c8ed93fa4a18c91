"""Goodput after a crash: real processes killed with SIGKILL, then the session read back.

Each job is a real interpreter writing through the embedded default (files under
TRAINTEL_OUTPUT_DIR). Its wall clock is a counter the job advances itself (``time.time_ns`` is
replaced before anything is imported), so every span - traintel's own API or plain OpenTelemetry
- has an exact timestamp and every bucket can be asserted to the second.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.subprocess_helpers import run_python
from traintel import cli, semconv
from traintel._aggregation.progress import Account, OpenWindowProgress, job_progress
from traintel.analysis.goodput import SessionGoodput, compute_goodput, load_jobs
from traintel.analysis.report import build_report
from traintel.exporters.progress_mark import MARK_KEY, MARK_SUFFIX
from traintel.exporters.reader import iter_spans
from traintel.semconv import BADPUT_CATEGORIES, HOST_NAME

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


#: An iteration numbered ``i`` in either style (the harness's traintel phases count their own).
NUMBERED = """
def step(i):
    if STYLE == "traintel":
        return traintel.training_iteration(iteration=i)
    return phase("training_iteration", i)
"""

#: An in-process restart (the training function run again after a fault, as NVIDIA's resiliency
#: extension does): 5 s iterations 0-5 (0-30 s), a fault, the checkpoint of iteration 4 loaded
#: (30-33 s), iterations 4-7 again (33-53 s), 1 s more. Iterations 4-5 of the first pass (10 s)
#: are discarded progress.
RESTARTED_IN_PROCESS = """
with phase("application"):
    for start, stop in ((0, 6), (4, 8)):
        if start:
            with load(start):
                tick(3)
        with loop(start):
            for i in range(start, stop):
                with step(i):
                    tick(5)
    tick(1)
traintel.shutdown()
"""

#: A rollback inside one loop (after a loss spike): the same times, without the loop's end.
ROLLED_BACK_IN_ITS_LOOP = """
with phase("application"):
    with loop(0):
        for i in [*range(0, 6), *range(4, 8)]:
            if i == 4 and NOW[0] > (T0_S + START + 29) * S:
                with load(4):
                    tick(3)
            with step(i):
                tick(5)
    tick(1)
traintel.shutdown()
"""

#: A load between every two iterations that takes nothing back (a ``torch.load`` of data, say):
#: 12 iterations of 5 s, each after a 1 s load.
LOADS_GOING_ON = """
with phase("application"):
    with loop(0):
        for i in range(12):
            with load(i):
                tick(1)
            with step(i):
                tick(5)
traintel.shutdown()
"""

#: Iterations numbered per epoch (0-5, then 0-3 again), no checkpoint loaded: nothing discarded.
NUMBERED_PER_EPOCH = """
with phase("application"):
    with loop(0):
        for i in [*range(0, 6), *range(0, 4)]:
            with step(i):
                tick(5)
    tick(1)
traintel.shutdown()
"""


def run_job(tmp_path: Path, body: str, style: str, restart: int, start_s: float, **env: str) -> None:
    work = tmp_path / f"job-{restart}"
    work.mkdir()
    harness = HARNESS
    for every in (MARKS_EVERY_20_MS, MARKS_HOURLY):
        if every in body:  # before traintel starts its thread
            harness = harness.replace("import traintel\n", every + "import traintel\n", 1)
    result = run_python(
        f"T0_S = {T0_S}\nSTART = {start_s}\nSTYLE = {style!r}\n" + harness + body,
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
@pytest.mark.parametrize(
    "body", [RESTARTED_IN_PROCESS, ROLLED_BACK_IN_ITS_LOOP], ids=["restarted", "rolled-back"]
)
def test_progress_a_checkpoint_load_takes_back_in_the_process_is_wasted(
    tmp_path: Path, style: str, body: str
) -> None:
    """54 s: 40 s of iterations kept, 10 s of the first pass of iterations 4-5 discarded by the
    load of iteration 4's checkpoint (3 s), 1 s after the loop (before: all 50 s productive;
    the offline rule, and traintel's window closing at the load, keep them apart)."""
    run_job(tmp_path, NUMBERED + body, style, restart=0, start_s=0)
    result = session_of(tmp_path / "runs")
    expect(result, 54, 40, wasted_progress=10, checkpoint_load=3, other=1)
    (job,) = result.jobs
    assert (job.first_iteration, job.last_iteration, job.status) == (0, 7, "completed")


@pytest.mark.parametrize("style", ["traintel", "otel"])
def test_loads_that_take_nothing_back_leave_the_windows_alone(tmp_path: Path, style: str) -> None:
    """A load before every iteration, the numbers going on: the windows close every 4
    iterations as configured (a window closed at every load would make a record per
    iteration, and ranks that load apart would stop agreeing on their windows)."""
    run_job(tmp_path, NUMBERED + LOADS_GOING_ON, style, 0, 0, TRAINTEL_LOG_EVERY_N_ITERATIONS="4")
    windows = [s for s in iter_spans([tmp_path / "runs"]) if s.name == "training_window"]
    assert [s.attributes[semconv.WINDOW_PREFIX + "first_iteration"] for s in windows] == [0, 4, 8]
    expect(session_of(tmp_path / "runs"), 72, 60, checkpoint_load=12)


@pytest.mark.parametrize("style", ["traintel", "otel"])
def test_iterations_numbered_per_epoch_waste_nothing(tmp_path: Path, style: str) -> None:
    """Numbers that start again without a checkpoint load (per epoch) take nothing back, each
    epoch in windows of its own."""
    run_job(tmp_path, NUMBERED + NUMBERED_PER_EPOCH, style, 0, 0, TRAINTEL_LOG_EVERY_N_ITERATIONS="6")
    expect(session_of(tmp_path / "runs"), 51, 50, other=1)


@pytest.mark.parametrize("style", ["traintel", "otel"])
def test_a_job_killed_in_its_first_window_then_resumed(
    tmp_path: Path, style: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_job(tmp_path, KILLED_IN_FIRST_WINDOW, style, restart=0, start_s=0)
    run_job(tmp_path, RESUMED, style, restart=1, start_s=80)
    result = session_of(tmp_path / "runs")
    # Job 1: 52 s of iterations = 1 data + 2 startup + 49 productive, its progress mark's open
    # window of iterations 0-9, of which 6-9 were run again: 4/10 of it wasted (a window's share
    # of iterations, as for a window record); 64 -> 80 s recovery; job 2: 4 s load, 20 s
    # productive, 1 s other.
    expect(
        result, 105, productive=49 * 0.6 + 20, initialization=10, checkpoint_save=2, checkpoint_load=4,
        data_loading=1, program_startup=2, wasted_progress=49 * 0.4, infrastructure_recovery=16, other=1,
    )  # fmt: skip
    killed, resumed = result.jobs
    assert (killed.status, killed.first_iteration, killed.last_iteration) == ("no end exported", 0, 9)
    assert killed.inferred_tail is not None
    assert killed.inferred_tail.as_dict() == {
        "first_iteration": 0,
        "last_iteration": 9,
        "marked_iterations": 10,
        "exported_iterations": 0,
        "missing_iterations": 0,
        "productive_seconds": 49.0,
        "source": "the progress mark with no window record in the files",
    }
    assert (killed.unaccounted_s, resumed.unaccounted_s) == (0.0, 0.0)
    assert (resumed.status, resumed.resumed_from, resumed.inferred_tail) == ("completed", 6, None)
    assert result.last_iteration == 9
    # goodput and report read the same numbers
    assert cli.main(["goodput", str(tmp_path / "runs"), "--json"]) == 0
    goodput = json.loads(capsys.readouterr().out)["sessions"]
    assert cli.main(["report", str(tmp_path / "runs"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["goodput"] == goodput
    assert cli.main(["goodput", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    tail = "iterations 0-9 with no window record in the files:\n    counted from 10 in the progress mark"
    assert tail in out
    assert "unaccounted" not in out


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


def drop_marks(directory: Path) -> None:
    """Leave the files as a job without progress marks wrote them (an older version)."""
    for mark in directory.rglob("*" + MARK_SUFFIX):
        mark.unlink()


@pytest.mark.parametrize("policy", ["sampled", "none"])
def test_a_kill_long_after_the_last_window_closed_by_time(
    tmp_path: Path, policy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_job(
        tmp_path, KILLED_LONG_AFTER_A_WINDOW, "traintel", restart=0, start_s=0,
        TRAINTEL_WINDOW_MIN_SECONDS="10", TRAINTEL_EXPORT_ITERATIONS=policy,
    )  # fmt: skip
    runs = tmp_path / "runs"
    # The progress mark holds iterations 6-7 (the open window), whatever was exported.
    result = session_of(runs)
    expect(result, 500, productive=200, other=300)
    (job,) = result.jobs
    assert job.last_iteration == 7
    assert job.inferred_tail is not None
    tail = job.inferred_tail
    assert (tail.first_iteration, tail.last_iteration, tail.marked_iterations, tail.exported_iterations) == (
        6, 7, 2, 0,
    )  # fmt: skip
    assert job.unaccounted_s == 0.0
    # Without the mark: the exported iterations count (the first 10 are), else nothing after
    # the last window record, and goodput says how long is unknown rather than showing it as 0.
    drop_marks(runs)
    productive, last = (200, 7) if policy == "sampled" else (150, 5)
    result = session_of(runs)
    expect(result, 500, productive=productive, other=500 - productive)
    (job,) = result.jobs
    assert (job.last_iteration, job.unaccounted_after, job.unaccounted_s) == (last, last, 500 - productive)
    assert cli.main(["goodput", str(runs)]) == 0
    unaccounted = "5.0 min" if policy == "sampled" else "5.8 min"  # 300 s, 350 s
    assert f"unaccounted: {unaccounted} after iteration {last}" in capsys.readouterr().out


#: Killed in its first window, 45 s in: iteration 0 waits 20 s for its batch, then computes 5 s
#: as every iteration does.
KILLED_AFTER_A_SLOW_FIRST_BATCH = """
with phase("application"):
    with loop(0):
        for i in range(5):
            with phase("training_iteration", i):
                if i == 0:
                    with phase("data_loading"):
                        tick(20)
                tick(5)
        kill()
"""


def test_a_first_batch_slow_to_come_is_data_loading_in_a_tail_of_exported_iterations(tmp_path: Path) -> None:
    """No window record and no mark: the exported iterations count one by one, and the first
    one's excess is compared without its data-loading wait: data loading, not startup."""
    run_job(tmp_path, KILLED_AFTER_A_SLOW_FIRST_BATCH, "traintel", restart=0, start_s=0)
    runs = tmp_path / "runs"
    drop_marks(runs)
    expect(session_of(runs), 45, productive=25, data_loading=20)


#: Prepended to a job that dies once the progress mark's own thread (every 20 ms here instead of
#: 5 s) wrote a given iteration, without a flush.
MARKS_EVERY_20_MS = "import traintel._runtime.progress\ntraintel._runtime.progress.INTERVAL_S = 0.02\n"
DIE_ONCE_MARKED = (
    MARKS_EVERY_20_MS
    + """
from traintel.exporters.progress_mark import read_mark
def die_once_marked(iteration):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        mark = read_mark(telemetry.output_file) or {}
        if mark.get("progress", {}).get("last_iteration") == iteration:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.005)
    raise SystemExit("no progress mark of iteration %d" % iteration)
"""
)

#: Killed without a flush at iteration KILL_AT, once the progress mark's own thread (every 20 ms
#: here instead of 5 s) has written it: 8-iteration windows, whose records wait in the batch
#: span processor (a 10-minute delay) and die with the job. Its start is on disk (a flush after
#: the 10 s init). Iteration 0 takes 7 s (2 s startup over the typical 5 s), every 7th from
#: iteration 3 waits 1 s for data, the last takes 20 s (+300 %).
KILLED_WITHOUT_A_FLUSH = """
with phase("application"):
    with phase("model_init"):
        tick(10)
    telemetry.flush(60)
    with loop(0):
        for i in range(KILL_AT + 1):
            with phase("training_iteration", i):
                if i % 7 == 3:
                    with phase("data_loading"):
                        tick(1)
                    tick(4)
                else:
                    tick(7 if i == 0 else 20 if i == KILL_AT else 5)
        die_once_marked(KILL_AT)
"""


@pytest.mark.parametrize(
    ("style", "kill_at", "windows_closed"),
    # in the first window, in the second, after five
    [("traintel", 5, 0), ("traintel", 12, 1), ("traintel", 44, 5), ("otel", 12, 1)],
)
def test_a_kill_without_a_flush_loses_no_iteration_the_mark_reached(
    tmp_path: Path, style: str, kill_at: int, windows_closed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    run_job(
        tmp_path, f"KILL_AT = {kill_at}\n" + DIE_ONCE_MARKED + KILLED_WITHOUT_A_FLUSH, style,
        restart=0, start_s=0, TRAINTEL_LOG_EVERY_N_ITERATIONS="8", OTEL_BSP_SCHEDULE_DELAY="600000",
    )  # fmt: skip
    runs = tmp_path / "runs"
    records = [s for s in iter_spans([runs]) if s.name == "training_window"]
    assert records == []  # every window's record was lost with the job: the mark holds them
    iterations = kill_at + 1
    waits = len(range(3, iterations, 7))
    seconds = 7 + 5 * (kill_at - 1) + 20
    result = session_of(runs)
    expect(
        result, 10 + seconds, productive=seconds - waits - 2, initialization=10, data_loading=waits,
        program_startup=2,
    )  # fmt: skip
    (job,) = result.jobs
    assert (job.status, job.first_iteration, job.last_iteration) == ("no end exported", 0, kill_at)
    assert job.inferred_tail is not None
    assert job.inferred_tail.as_dict() == {
        "first_iteration": 0,
        "last_iteration": kill_at,
        "marked_iterations": iterations,
        "exported_iterations": 0,
        "missing_iterations": 0,
        "productive_seconds": seconds - waits - 2,
        "source": "the progress mark with no window record in the files",
    }
    assert job.unaccounted_s == 0.0
    # the step-time view lists the crashed tail: its slowest iteration against the ideal step
    assert windows_closed == kill_at // 8
    assert result.ideal_step_time_s == pytest.approx(5.0)
    slowest = result.most_deviating[0]
    assert (slowest["iteration"], slowest["seconds"]) == (kill_at, 20.0)
    assert slowest["deviation"] == pytest.approx(3.0)
    assert cli.main(["goodput", str(runs)]) == 0
    assert f"iteration {kill_at}: 20.00 s (+300%)" in capsys.readouterr().out
    assert cli.main(["summary", str(runs)]) == 0
    assert (
        f"Iterations: {iterations}, to iteration {kill_at}, in the progress mark"  # (no window record left)
        in capsys.readouterr().out.replace("\n  ", " ")
    )
    # the report counts them too (it said 0: the window records alone)
    assert build_report([runs]).as_dict()["iterations"]["count"] == iterations


#: The issue's case: 0.1 s iterations with the default window (50 iterations, a 30 s floor), killed
#: without a flush after iteration 90, 9.1 s into the loop: all of it in the open window.
KILLED_AT_90 = """
with phase("application"):
    with phase("model_init"):
        tick(10)
    telemetry.flush(60)
    with loop(0):
        for i in range(91):
            with phase("training_iteration", i):
                tick(0.1)
        die_once_marked(90)
"""
#: Resumed at 30 s from the checkpoint of iteration 50 (2 s), runs 50-99 (5 s), ends at 37 s.
RESUMED_AT_50 = """
with phase("application"):
    with load(50):
        tick(2)
    with loop(50):
        for i in range(50, 100):
            with phase("training_iteration", i):
                tick(0.1)
traintel.shutdown()
"""


def test_the_iterations_a_killed_job_ran_in_its_open_window_are_wasted_when_redone(tmp_path: Path) -> None:
    floor = {"TRAINTEL_WINDOW_MIN_SECONDS": "30"}  # the default floor (the suite's is 0)
    run_job(tmp_path, DIE_ONCE_MARKED + KILLED_AT_90, "traintel", restart=0, start_s=0, **floor)
    run_job(tmp_path, RESUMED_AT_50, "traintel", restart=1, start_s=30, **floor)
    result = session_of(tmp_path / "runs")
    # job 1: 10 s init, 9.1 s of iterations 0-90, of which 50-90 (41 x 0.1 s) were run again;
    # 19.1 -> 30 s recovery; job 2: 2 s load, 5 s of iterations 50-99.
    expect(
        result, 37, productive=9.1 - 4.1 + 5, initialization=10, checkpoint_load=2, wasted_progress=4.1,
        infrastructure_recovery=30 - 19.1,
    )  # fmt: skip
    killed, _resumed = result.jobs
    assert (killed.first_iteration, killed.last_iteration, killed.unaccounted_s) == (0, 90, 0.0)


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
    assert job.inferred_tail is not None and job.inferred_tail.marked_iterations == 6  # the mark: all
    assert job.productive_s == pytest.approx(16 + 48)
    drop_marks(tmp_path / "runs")  # without it, the exported spans
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


@pytest.mark.parametrize("traces", ["console", "none"])
def test_no_progress_mark_where_the_run_s_spans_do_not_go_to_the_file(tmp_path: Path, traces: str) -> None:
    """Spans sent elsewhere, the embedded file holds at most hang records (logs still go to it):
    a mark beside it, superseded by no window record, would outlive the job as its only record
    and say it stopped at the mark's last write (its start, for a short job)."""
    run_job(tmp_path, RESUMED, "traintel", restart=0, start_s=0,
            OTEL_TRACES_EXPORTER=traces, OTEL_METRICS_EXPORTER="none")  # fmt: skip
    assert not list((tmp_path / "runs").rglob("*" + MARK_SUFFIX))
    run_job(tmp_path, RESUMED, "traintel", restart=1, start_s=0)  # to the file: marked
    assert len(list((tmp_path / "runs").rglob("*" + MARK_SUFFIX))) == 1


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


def test_the_mark_s_account_reads_each_row_once_and_starts_over_with_a_new_window() -> None:
    s = 10**9
    rows: list[Any] = []  # (duration, samples, tokens, padding, flops, 4 step phases, iteration, end)

    def iteration(number: int, seconds: int, data: int = 0) -> None:
        end = (rows[-1][10] if rows else 0) + seconds * s
        rows.append((seconds * s, None, None, None, None, data * s, 0, 0, 0, number, end))

    account = OpenWindowProgress()
    for number, seconds in enumerate((7, 5, 5)):
        iteration(number, seconds, data=1 if number == 1 else 0)
    window, startup, ideal = account.update(rows, (0, 0, 0), first_window=True)
    assert (window.first_iteration, window.last_iteration, window.iterations) == (0, 2, 3)
    assert (window.start_ns, window.end_ns, window.busy_s, window.data_loading_s) == (0, 17 * s, 17.0, 1.0)
    # 7 s over the median 4.5 s of the others without their data wait (5 - 1 and 5 s)
    assert (startup, ideal, account.slowest) == (2.5, 5.0, (7.0, 0))
    iteration(3, 9)
    window, _, _ = account.update(rows, (3, 0, 2 * s), first_window=True)  # a 2 s save in iteration 3
    assert (window.iterations, window.busy_s, account.slowest) == (4, 24.0, (9.0, 3))
    window, _, _ = account.update(rows, (4, 2 * s, 5 * s), first_window=True)  # 3 s more in the running 4
    assert (window.iterations, window.busy_s) == (4, 24.0)  # its row is not in: nor its save
    closed = window
    rows = []  # the window closed: a new list of rows
    iteration(4, 5)
    window, startup, ideal = account.update(rows, (0, 0, 0), first_window=False)
    assert (window.first_iteration, window.iterations, startup, ideal, account.slowest) == (
        4,
        1,
        0.0,
        None,
        (5.0, 4),
    )
    job = job_progress(closed, window, 2.0, account.slowest, 5.0)
    assert job is not None
    assert (job.first_iteration, job.last_iteration, job.iterations) == (0, 4, 5)
    assert (job.productive_s, job.data_loading_s, job.program_startup_s) == (24 + 5 - 1 - 2, 1.0, 2.0)
    assert job_progress(Account(), Account(), 0.0, (0.0, None), None) is None


#: A job's start that writes its progress mark when asked, and reads back the fields named.
MARKED = """
import json
import traintel
from traintel.exporters.progress_mark import read_mark
telemetry = traintel.configure(warmup_iterations=0)
def marked(*keys):
    telemetry.progress.mark()
    progress = (read_mark(telemetry.output_file) or {}).get("progress") or {}
    return [progress.get(key) for key in keys]
"""

#: The window worker held (a task queued before the first window) while the job runs on: the
#: marks written meanwhile, then after the worker caught up.
MARKS_WHILE_THE_WORKER_IS_BEHIND = (
    MARKED
    + """
import threading
KEYS = ("first_iteration", "last_iteration", "iterations")
seen = []
held = threading.Event()
with traintel.training_loop(train_iterations_start=0):
    for i in range(2):
        with traintel.training_iteration():
            pass
    seen.append(marked(*KEYS))
    telemetry.windows.then(lambda: held.wait(60))
    for i in range(2, 6):  # iterations 0-3 close the first window: handed over, not processed
        with traintel.training_iteration():
            pass
    seen.append(marked(*KEYS))
    held.set()
    telemetry.windows.flush(60)
    seen.append(marked(*KEYS))
print(json.dumps(seen))
"""
)


def test_a_mark_is_never_written_with_a_window_the_worker_has_not_processed(tmp_path: Path) -> None:
    """Under load the window worker lags the training thread. A mark written then from the
    processed windows and the open one would skip the window in between: the iterations 0-5
    counted as 2. The last whole mark stands until the worker has caught up."""
    result = run_python(
        MARKS_WHILE_THE_WORKER_IS_BEHIND, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        TRAINTEL_LOG_EVERY_N_ITERATIONS="4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    before, behind, caught_up = json.loads(result.stdout.splitlines()[-1])
    assert before == [0, 1, 2]
    assert behind == before  # not [4, 5, 2]
    assert caught_up == [0, 5, 6]


#: A save nested in the third iteration; a mark taken after the save, as that iteration runs on.
MARK_AFTER_A_SAVE_IN_THE_RUNNING_ITERATION = (
    """
import time
S = 10**9
NOW = [1_700_000_000 * S]
time.time_ns = lambda: NOW[0]
time.monotonic_ns = time.time_ns
def tick(seconds):
    NOW[0] += round(seconds * S)
"""
    + MARKED
    + """
KEYS = ("last_iteration", "iterations", "productive_s")
seen = []
with traintel.training_loop(train_iterations_start=0):
    for i in range(3):
        with traintel.training_iteration():
            tick(2)
            if i == 2:
                with traintel.checkpoint_save(iteration=3):
                    tick(3)
                seen.append(marked(*KEYS))
                tick(1)
seen.append(marked(*KEYS))
print(json.dumps(seen))
"""
)


def test_a_mark_counts_a_nested_save_with_the_iteration_it_ran_in(tmp_path: Path) -> None:
    """A save inside an iteration is that iteration's badput, not productive time. The mark
    read the open window's rows and the time nested in them, and the save's 3 s were in the time
    as it ended, its iteration's row not yet in: a mark then took them off iterations 0-1
    (productive 1 s of 4), for as long as that iteration ran on."""
    result = run_python(
        MARK_AFTER_A_SAVE_IN_THE_RUNNING_ITERATION, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    in_the_iteration, after_the_loop = json.loads(result.stdout.splitlines()[-1])
    assert in_the_iteration == [1, 2, 4.0]  # iterations 0-1, 2 s each
    assert after_the_loop == [2, 3, 2 + 2 + 6 - 3]  # the third, 6 s with its 3 s save


#: Killed in its first minute, before the file's first line (no flush after the 10 s init): 0-57 s,
#: iterations 0-5 (47 s: 2 s startup, 1 s data). Then ``RESUMED`` at 80 s: a 4 s load, 6-9, 105 s.
KILLED_BEFORE_ITS_FILE = KILLED_WITHOUT_A_FLUSH.replace("    telemetry.flush(60)\n", "")


#: The mark's thread writes once an hour here: its first mark, written as the job starts, is the
#: only one a job killed in its first seconds can have.
MARKS_HOURLY = "import traintel._runtime.progress\ntraintel._runtime.progress.INTERVAL_S = 3600\n"
#: Killed in its first seconds (its init: the OOM killer at the first allocation, say), once its
#: first mark is on disk. Its telemetry started at 0 s.
KILLED_AT_ONCE = (
    MARKS_HOURLY
    + """
from traintel.exporters.progress_mark import read_mark
deadline = time.monotonic() + 30
while read_mark(telemetry.output_file) is None and time.monotonic() < deadline:
    time.sleep(0.005)
with phase("application"):
    with phase("model_init"):
        tick(10)
        os.kill(os.getpid(), signal.SIGKILL)
"""
)


def test_a_job_killed_in_its_first_seconds_is_one_of_its_session_s_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first mark is written as the job starts, not one interval later: a job killed before
    then was absent, its session started with the next job and showed no disruption (one job,
    97 % goodput for a crash and a restart). Now its start opens the session, and the time to
    the next job is recovery."""
    run_job(tmp_path, KILLED_AT_ONCE, "traintel", restart=0, start_s=0)
    runs = tmp_path / "runs"
    (mark,) = runs.iterdir()
    assert mark.name.endswith(MARK_SUFFIX)  # a mark, no file: it names the job and its host
    assert json.loads(mark.read_text())[MARK_KEY]["resource"][HOST_NAME] == socket.gethostname()
    # alone, it is a run of no iteration (before: `runs` said "no runs", `summary` read "0 from
    # 0 file(s)" and pointed at iterations "below" that were not there)
    assert cli.main(["runs", str(runs), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert (run["id"], run["iterations"], run["duration_s"]) == ("session", 0, 0)  # (its session tag)
    assert cli.main(["summary", str(runs)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Spans read: 0 from 1 file(s)" in text and "counts no iteration" in text
    run_job(tmp_path, RESUMED, "traintel", restart=1, start_s=80)
    result = session_of(runs)
    expect(result, 105, productive=20, other=1, checkpoint_load=4, infrastructure_recovery=80)
    killed, resumed = result.jobs
    assert (killed.status, killed.first_iteration, killed.start_ns, killed.end_ns) == (
        "no end exported", None, T0_S * 10**9, T0_S * 10**9,
    )  # fmt: skip
    assert (resumed.status, resumed.resumed_from) == ("completed", 6)
    assert cli.main(["goodput", str(runs)]) == 0
    assert "a job with no iteration by its progress mark has no spans written" in capsys.readouterr().err


def test_a_job_killed_before_its_file_s_first_line_counts_from_its_mark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash loop's jobs die in their first minute: each leaves a progress mark and no file.
    The mark names its job and when its telemetry started, so the job stays in its session:
    its iterations from the mark, the time before its first iteration as other (no span says
    what it was), the gap to the next job as recovery."""
    body = "KILL_AT = 5\n" + DIE_ONCE_MARKED + KILLED_BEFORE_ITS_FILE
    run_job(tmp_path, body, "traintel", restart=0, start_s=0)
    runs = tmp_path / "runs"
    (mark,) = runs.iterdir()
    assert mark.name.endswith(MARK_SUFFIX)  # a mark, no file: it names the job and its host
    assert json.loads(mark.read_text())[MARK_KEY]["resource"][HOST_NAME] == socket.gethostname()
    run_job(tmp_path, RESUMED, "traintel", restart=1, start_s=80)
    result = session_of(runs)
    expect(
        result, 105, productive=44 + 20, data_loading=1, program_startup=2, other=10 + 1,
        checkpoint_load=4, infrastructure_recovery=80 - 57,
    )  # fmt: skip
    killed, resumed = result.jobs
    assert (killed.status, killed.first_iteration, killed.last_iteration) == ("no end exported", 0, 5)
    assert (killed.start_ns, killed.end_ns) == (T0_S * 10**9, (T0_S + 57) * 10**9)
    assert (resumed.status, resumed.resumed_from) == ("completed", 6)
    # the commands read it too, and say where it comes from
    assert cli.main(["goodput", str(runs), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["sessions"][0]["total_seconds"] == 105
    assert "a job at iteration 5 by its progress mark has no spans written" in captured.err
    assert cli.main(["report", str(runs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["goodput"][0]["total_seconds"] == 105
