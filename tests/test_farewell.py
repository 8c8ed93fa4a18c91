"""The lines a job leaves on stderr as its telemetry starts (where it goes) and ends: where the
telemetry is and the command that reads it (a real job in a child process, the command then
run), or the OTLP endpoint it was sent to; silent on other ranks and under ``TRAINTEL_QUIET``."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from tests.subprocess_helpers import run_python
from traintel import cli
from traintel._runtime.farewell import farewell, greeting, say

JOB = """
import traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(3):
            with traintel.training_iteration():
                pass
"""

#: The console script beside this Python (the test environment's), and a PATH that finds it.
SCRIPT = Path(sys.executable).with_name("traintel")
ON_PATH = {"PATH": str(SCRIPT.parent)}


@pytest.mark.process
def test_a_job_says_where_its_telemetry_is_and_the_command_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = run_python(JOB, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "my runs"), TRAINTEL_QUIET="0")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("traintel: telemetry of this run")]
    assert len(lines) == 2, done.stderr  # one as it starts, one as it ends
    (output,) = (tmp_path / "my runs").glob("*.otlp.jsonl")
    assert lines[0] == f"traintel: telemetry of this run goes to {output}"  # the file it then wrote
    assert f"is in {output};" in lines[1]
    command = shlex.split(lines[1].split("read it with: ", 1)[1])
    assert command[0] in ("traintel", str(SCRIPT)) and command[1] == "summary"  # SCRIPT: not on PATH
    assert cli.main(command[1:]) == 0 and "Spans read: " in capsys.readouterr().out
    quiet = run_python(JOB, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "quiet"), TRAINTEL_QUIET="1")
    assert quiet.returncode == 0 and "telemetry" not in quiet.stderr, quiet.stderr


@pytest.mark.process
def test_a_file_that_could_not_be_written_is_not_pointed_at(tmp_path: Path) -> None:
    """``TRAINTEL_OUTPUT_DIR`` naming a file: the job trains on and says why each write
    failed, but its last line said its telemetry "is in" the file it could not write, and
    gave the command to read it."""
    taken = tmp_path / "not-a-directory"
    taken.write_text("")
    done = run_python(JOB, tmp_path, TRAINTEL_OUTPUT_DIR=str(taken), TRAINTEL_QUIET="0")
    assert done.returncode == 0, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"traintel: telemetry of this run could not be written to {taken}/"), done.stderr
    assert last.endswith(".otlp.jsonl (said above; TRAINTEL_OUTPUT_DIR sets where it goes)")
    assert "Not a directory" in done.stderr


@pytest.mark.process
def test_a_file_that_would_hold_only_hang_records_is_not_named(tmp_path: Path) -> None:
    """Spans to the console and no metrics: the embedded file is there for hang records alone,
    and a job that never hangs writes none. Both lines named it as where the run was, a file
    that did not exist; nothing is named now (console output says where the spans went)."""
    done = run_python(
        JOB, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), TRAINTEL_QUIET="0",
        OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "telemetry of this run" not in done.stderr, done.stderr
    assert not list((tmp_path / "runs").glob("*.otlp.jsonl"))


OWN_PROVIDER_JOB = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
import traintel
trace.set_tracer_provider(TracerProvider())  # the user's: no exporter, no service name
with traintel.application():
    with traintel.training_loop():
        for i in range(3):
            with traintel.training_iteration():
                pass
"""


@pytest.mark.process
def test_beside_the_user_s_tracer_provider_the_file_is_named_as_written_and_said_to_hold_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's own tracer provider takes the spans; the meters traintel builds write the
    embedded file. The first line named a file of the user's resource's service name
    (``unknown_service_python-…``) that was never written, and the last pointed at
    ``traintel summary``, which found no span there and said only that."""
    runs = tmp_path / "runs"
    done = run_python(OWN_PROVIDER_JOB, tmp_path, TRAINTEL_OUTPUT_DIR=str(runs), TRAINTEL_QUIET="0")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("traintel: telemetry of this run")]
    (output,) = (tmp_path / "runs").glob("*.otlp.jsonl")
    assert lines == [
        f"traintel: telemetry of this run goes to {output} (metrics only)",
        f"traintel: telemetry of this run is in {output} (metrics only)",
    ], done.stderr
    assert cli.main(["summary", str(output.parent)]) == 1
    said = capsys.readouterr().err
    assert "line(s) of metrics or logs only (the job's spans were exported elsewhere" in said, said


def test_the_line_names_the_otlp_endpoint_and_only_rank_0_says_it(tmp_path: Path) -> None:
    output = tmp_path / "run.otlp.jsonl"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    assert (
        farewell(None, ["otlp"], 0, env)
        == "traintel: telemetry of this run was sent to http://collector:4317 (OTLP)"
    )
    assert farewell(
        output, ["otlp", "traintel_file"], 0, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", **ON_PATH}
    ) == (
        "traintel: telemetry of this run was sent to http://localhost:4318/v1/traces (OTLP) "
        f"and is kept in {output}; read it with: traintel summary {tmp_path}"
    )
    assert (
        farewell(None, ["otlp"], 0, env, spooled=True)
        == "traintel: telemetry of this run could not all be sent to http://collector:4317 (OTLP)"
    )
    secret = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://trainer:s3cr3t-pw@collector:4317?token=t0k3n-x"}
    line = farewell(None, ["otlp"], 0, secret)
    assert line is not None and "s3cr3t-pw" not in line and "t0k3n-x" not in line and "collector:4317" in line
    assert farewell(output, ["traintel_file"], 1, {}) is None  # one line per job, not per rank
    assert farewell(output, ["traintel_file"], 0, {"TRAINTEL_QUIET": "true"}) is None
    assert greeting(output, ["otlp", "traintel_file"], 0, env) == (
        f"traintel: telemetry of this run goes to http://collector:4317 (OTLP) and {output}"
    )
    assert greeting(None, ["otlp"], 0, secret) is not None and "s3cr3t-pw" not in str(
        greeting(None, ["otlp"], 0, secret)
    )
    assert greeting(output, ["traintel_file"], 1, {}) is None
    assert greeting(output, ["traintel_file"], 0, {"TRAINTEL_QUIET": "1"}) is None
    assert greeting(None, ["console"], 0, {}) is None  # nothing to say where
    # Spans elsewhere (the console, or the user's own provider): the file has the metrics only.
    said = "traintel: telemetry of this run"
    assert greeting(output, ["console"], 0, {}) == f"{said} goes to {output} (metrics only)"
    assert farewell(output, None, 0, ON_PATH) == f"{said} is in {output} (metrics only)"
    assert farewell(output, ["otlp"], 0, env) == (
        f"{said} was sent to http://collector:4317 (OTLP) and is kept in {output} (metrics only)"
    )
    assert farewell(output, None, 0, {"OTEL_TRACES_EXPORTER": "traintel_file", **ON_PATH}) == (
        f"traintel: telemetry of this run is in {output}; read it with: traintel summary {tmp_path}"
    )  # the distro's file exporter takes the spans
    assert farewell(None, None, 0, {}) is None  # the user's own providers: nothing known to say


def test_the_command_runs_as_pasted_where_traintel_is_not_on_the_path(tmp_path: Path) -> None:
    """``make demo`` runs ``.venv/bin/python`` without activating the environment: there
    ``traintel`` is not on PATH, and the line names the console script beside the interpreter."""
    assert SCRIPT.is_file()  # an environment traintel is installed in
    output = tmp_path / "run.otlp.jsonl"
    said = f"traintel: telemetry of this run is in {output}; read it with:"
    not_on_path = {"PATH": str(tmp_path)}
    assert farewell(output, ["traintel_file"], 0, not_on_path) == f"{said} {SCRIPT} summary {tmp_path}"
    assert farewell(output, ["traintel_file"], 0, ON_PATH) == f"{said} traintel summary {tmp_path}"


@pytest.mark.process
def test_spans_dropped_without_a_spool_are_not_said_to_be_sent(tmp_path: Path) -> None:
    """No spool and no collector: every span is dropped (and counted, said before), so the last
    line must not say the telemetry was sent."""
    result = run_python(
        JOB,
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        TRAINTEL_SPOOL_MAX_BYTES="0",
        TRAINTEL_SHUTDOWN_TIMEOUT="3",
        TRAINTEL_QUIET="0",
    )
    assert result.returncode == 0, result.stderr
    assert "span(s) dropped" in result.stderr, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last == "traintel: telemetry of this run could not all be sent to http://127.0.0.1:9 (OTLP)", (
        result.stderr
    )


def test_a_line_is_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks ``torch.multiprocessing.spawn`` starts share one terminal: a line written as
    its text and then its newline ran into the next rank's (two lines on one)."""
    writes: list[str] = []

    class Stream:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    say("traintel: telemetry of this run goes to x")
    say(None)
    assert writes == ["traintel: telemetry of this run goes to x\n"]
