"""The ``traintel`` command as a person uses it: ``--version``, a closed pipe, and inputs in
which nothing is readable (a real job's files, real pipes, the installed entry point)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocess_helpers import clean_env, run_python
from traintel.cli import main
from traintel.version import __version__

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

JOB = """
import traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(30):
            with traintel.training_iteration():
                with traintel.model_forward():
                    pass
print("trained")
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "traintel.cli", *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"traintel {__version__}\n"


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_workers_below_one_is_an_error_naming_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """(``--workers 0`` ran one process, said nowhere.)"""
    for command in ("summary", "goodput", "report"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, str(tmp_path), "--workers", value])
        assert exit_info.value.code == 2
        expected = f"argument --workers: expected a number of processes, 1 or more: {value!r}"
        assert expected in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``traintel goodput DIR --json | head -1``: the reader leaves after one line."""
    assert run_python(JOB, tmp_path, TRAINTEL_EXPORT_ITERATIONS="all").returncode == 0
    for command in (["goodput", "traintel-runs", "--json"], ["report", "traintel-runs", "--json"]):
        pipeline = subprocess.Popen(
            [sys.executable, "-m", "traintel.cli", *command],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert pipeline.stdout is not None and pipeline.stderr is not None
        assert pipeline.stdout.readline().strip() == b"{"
        pipeline.stdout.close()  # what head does after its line
        stderr = pipeline.stderr.read().decode()
        pipeline.wait(timeout=60)
        assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
        assert stderr == ""


@pytest.mark.parametrize("command", ["summary", "goodput", "report"])
def test_files_with_no_readable_span_exit_non_zero_and_say_why(tmp_path: Path, command: str) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "job.otlp.jsonl").write_text('{"resourceSpans": [\n')  # a job killed mid-line
    result = _cli(command, str(runs), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"traintel: no readable spans in {runs}: 1 unreadable line(s)")
    assert "Traceback" not in result.stderr
