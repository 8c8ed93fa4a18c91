"""A wall-clock step mid-run leaves every duration right, and is said: by the job, by
``traintel report`` and by ``traintel goodput``.

The job's wall clock is injected: ``time.time_ns`` is replaced, before OpenTelemetry and traintel
are imported, by the real clock plus an offset the job changes between two stretches of
iterations (an hour back, or a day forward). The oracle is order and consistency, not time:
every iteration starts after the previous one ended, the application holds them all, and
goodput's wall time is the application's.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.subprocess_helpers import run_python
from traintel.cli import main
from traintel.exporters.reader import iter_spans

pytestmark = [pytest.mark.process]

JOB = """
import os, time
real_time_ns, offset = time.time_ns, [0]
time.time_ns = lambda: real_time_ns() + offset[0]  # the wall clock, as the job's host sets it
import traintel

def iterations(n):
    for _ in range(n):
        with traintel.training_iteration():
            with traintel.model_forward():
                time.sleep(0.002)

with traintel.application():
    with traintel.training_loop():
        iterations(10)
        offset[0] = int(os.environ["STEP_S"]) * 10**9  # the wall clock steps
        iterations(10)
print("trained", flush=True)
"""


@pytest.mark.parametrize("step_s", [-3600, 86_400])
def test_durations_survive_a_wall_clock_step_and_the_step_is_said(
    tmp_path: Path, step_s: int, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_python(
        JOB,
        tmp_path,
        STEP_S=str(step_s),
        TRAINTEL_LOG_EVERY_N_ITERATIONS="5",
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(f"the wall clock stepped by {step_s:+.1f} s") == 1, result.stderr
    spans = list(iter_spans([tmp_path / "runs"]))
    iterations = sorted(
        (s for s in spans if s.name == "training_iteration"),
        key=lambda s: s.attributes["ml.training.iteration"],
    )
    assert len(iterations) == 20
    for before, after in itertools.pairwise(iterations):
        assert before.end_ns <= after.start_ns, "each iteration after the one before, on one timeline"
    [application] = [s for s in spans if s.name == "application"]
    assert application.start_ns <= iterations[0].start_ns and iterations[-1].end_ns <= application.end_ns
    assert application.duration_s < abs(step_s), "the step is not in the job's length"
    assert main(["goodput", str(tmp_path / "runs"), "--json"]) == 0
    session = json.loads(capsys.readouterr().out)["sessions"][0]
    assert session["total_seconds"] == pytest.approx(application.duration_s, rel=1e-6)
    assert 0 < session["goodput"] <= 1
    assert session["jobs"][0]["wall_clock_step_s"] == pytest.approx(step_s, abs=1)
    assert main(["goodput", str(tmp_path / "runs")]) == 0
    assert f"the wall clock stepped by {step_s:+.1f} s during this job:" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "runs"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # said once (a loaded machine may add slow iterations beside it: 2 ms steps)
    assert report["warnings"].get("wall_clock_step") == 1, report["warnings"]
