"""A segment is a segment: a real run cut into several traces (``TRAINTEL_SEGMENT_ITERATIONS``)
is one application, one training loop, in ``summary``, ``report`` and ``goodput``; and read while
it is still going (here: killed after its segments were flushed), its summary shows the
iteration statistics its windows give and shares of no more than the time it covers."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.subprocess_helpers import run_python
from traintel import cli
from traintel.exporters.reader import iter_spans

JOB = """
import os, sys, traintel
iterations, kill_after = int(sys.argv[1]), int(sys.argv[2])
with traintel.application():
    with traintel.training_loop(train_iterations_start=0):
        for i in range(iterations):
            with traintel.training_iteration(samples=4):
                sum(range(2000))
            if i == kill_after:  # as a reader finds the files of a run still going
                traintel.get_telemetry().pipeline.tracer_provider.force_flush()
                os.kill(os.getpid(), 9)
"""
SEGMENTS = {"TRAINTEL_SEGMENT_ITERATIONS": "100", "TRAINTEL_LOG_EVERY_N_ITERATIONS": "25"}


def _run(tmp_path: Path, iterations: int, kill_after: int = -1) -> Path:
    out = tmp_path / "runs"
    script = JOB.replace("sys.argv[1]", str(iterations)).replace("sys.argv[2]", str(kill_after))
    done = run_python(script, tmp_path, TRAINTEL_OUTPUT_DIR=str(out), **SEGMENTS)
    assert done.returncode == (-signal.SIGKILL if kill_after >= 0 else 0), done.stderr
    return out


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.process
def test_a_run_of_several_segments_is_one_application(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _run(tmp_path, 350)
    applications = [s for s in iter_spans([runs]) if s.name == "application"]
    assert len(applications) == 4, "the run is cut into 4 traces"
    whole = sum(s.duration_s for s in applications)
    data = json.loads(_cli(capsys, "report", str(runs), "--json"))
    phases = {row["phase"]: row for row in data["phases"]}
    assert (phases["application"]["count"], phases["training_loop"]["count"]) == (1, 1)
    assert phases["application"]["total_s"] == pytest.approx(whole)
    assert phases["application"]["max_s"] == pytest.approx(whole)  # the span, not one segment
    assert phases["training_iteration"]["count"] == 350
    summary = _cli(capsys, "summary", str(runs))
    rows = [
        line.split()[:2] for line in summary.splitlines() if line.startswith(("application", "training_"))
    ]
    assert rows[:2] == [["application", "1"], ["training_loop", "1"]]
    (session,) = json.loads(_cli(capsys, "goodput", str(runs), "--json"))["sessions"]
    assert len(session["jobs"]) == 1 and session["last_iteration"] == 349


@pytest.mark.process
def test_a_run_read_mid_way_shows_its_iterations_and_shares_within_its_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _run(tmp_path, 1000, kill_after=349)
    data = json.loads(_cli(capsys, "report", str(runs), "--json"))
    phases = {row["phase"]: row for row in data["phases"]}
    assert phases["application"]["count"] == 1 and phases["training_iteration"]["count"] == 350
    shares = {row["phase"]: row["share"] for row in data["phases"] if row["share"] is not None}
    assert shares and all(0 < share <= 1 for share in shares.values()), shares
    assert data["iterations"]["count"] == 350 and data["iterations"]["mean_s"] > 0
    summary = _cli(capsys, "summary", str(runs))
    assert "Iterations: 350 in 14 window(s) so far" in summary
    mean = next(line for line in summary.splitlines() if line.startswith("  mean "))
    assert "max " in mean and "-" not in mean.split()
    assert "still running, or killed" in summary
