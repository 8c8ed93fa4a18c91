"""Hang records leave like the rest of the telemetry: through the OTLP logs pipeline built from
``OTEL_LOGS_EXPORTER`` (gRPC and HTTP to a real receiver, next to the embedded file), or through a
LoggerProvider the job set itself (DESIGN rule 2); a bad exporter name is an error that names the
variable. Each job is a real process with a real one-second stall."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tests.otlp_receiver import GrpcReceiver, HttpReceiver
from tests.subprocess_helpers import clean_env, run_python, wait_for
from traintel import cli, semconv
from traintel.analysis.summary import fmt_seconds
from traintel.exporters.progress_mark import MARK_SUFFIX
from traintel.exporters.reader import LogEntry, iter_records, logs_in

#: One iteration completes, the next sleeps for 4 s: a suspect after 2 s, then its recovery (a
#: watcher that a loaded machine wakes a second late still sees a blocked sleep, not a held GIL).
JOB = """
import time
import traintel
{setup}
traintel.configure()
with traintel.training_loop():
    for i in range(2):
        with traintel.training_iteration(samples=1):
            if i == 1:
                time.sleep(4)
traintel.shutdown()
{after}
"""
STALL_ENV = {"TRAINTEL_STALL_SECONDS": "2"}
pytestmark = [pytest.mark.process, pytest.mark.server]  # the suite's tiers: tests/tiers.py


def _events(entries: list[LogEntry]) -> list[str]:
    return [e.event_name for e in sorted(entries, key=lambda e: e.time_ns)]


def _received(requests: list[ExportLogsServiceRequest]) -> list[LogEntry]:
    return [entry for request in requests for entry in logs_in(request)]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_logs_and_the_embedded_file_get_the_same_records(tmp_path: Path, protocol: str) -> None:
    receiver_type = GrpcReceiver if protocol == "grpc" else HttpReceiver
    with receiver_type() as receiver:
        result = run_python(
            JOB.format(setup="", after=""),
            tmp_path,
            OTEL_LOGS_EXPORTER="otlp,traintel_file",
            OTEL_EXPORTER_OTLP_LOGS_ENDPOINT=receiver.endpoint + ("/v1/logs" if protocol != "grpc" else ""),
            OTEL_EXPORTER_OTLP_LOGS_PROTOCOL=protocol,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
            **STALL_ENV,
        )
        assert result.returncode == 0, result.stderr
    sent = _received(receiver.received.logs)
    in_file = [e for e in iter_records([tmp_path / "runs"], logs=True) if isinstance(e, LogEntry)]
    suspect, recovered = semconv.EVENT_HANG_SUSPECT, semconv.EVENT_HANG_RECOVERED
    assert _events(sent) == _events(in_file) == [suspect, recovered]
    assert sorted(sent, key=lambda e: e.time_ns) == sorted(in_file, key=lambda e: e.time_ns)
    record = next(e for e in sent if e.event_name == suspect)
    assert record.severity_number == 13  # WARN
    assert record.attributes[semconv.HANG_PYTHON] == semconv.PYTHON_BLOCKED  # asleep: the GIL released
    assert (
        record.attributes[semconv.ITERATION] == 0 and record.attributes[semconv.PHASE] == "training_iteration"
    )
    assert record.attributes[semconv.HANG_TOP_FRAME].startswith("<module> (")
    assert record.resource[semconv.SERVICE_NAME] == "job" and record.scope == semconv.INSTRUMENTATION_SCOPE
    assert len(record.trace_id) == 32 and len(record.span_id) == 16  # linked to the stalled iteration
    # the iteration, slow, was exported: the record points at it
    spans = [s for s in iter_records([tmp_path / "runs"]) if getattr(s, "name", "") == "training_iteration"]
    assert (record.trace_id, record.span_id) in {(s.trace_id, s.span_id) for s in spans}


def test_a_logger_provider_the_job_set_gets_the_records_and_no_file_does(tmp_path: Path) -> None:
    setup = """
from opentelemetry._logs import set_logger_provider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
exporter = InMemoryLogRecordExporter()
provider = LoggerProvider()
provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
set_logger_provider(provider)
"""
    after = "print([r.log_record.event_name for r in exporter.get_finished_logs()])"
    result = run_python(
        JOB.format(setup=setup, after=after),
        tmp_path,
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        **STALL_ENV,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == repr([semconv.EVENT_HANG_SUSPECT, semconv.EVENT_HANG_RECOVERED])
    assert [e for e in iter_records([tmp_path / "runs"], logs=True) if isinstance(e, LogEntry)] == []


def test_an_unknown_logs_exporter_is_an_error_naming_the_variable(tmp_path: Path) -> None:
    code = """
import traintel
try:
    traintel.configure()
except traintel.ConfigurationError as exc:
    print(exc)
"""
    result = run_python(code, tmp_path, OTEL_LOGS_EXPORTER="carrier_pigeon")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OTEL_LOGS_EXPORTER='carrier_pigeon': unknown exporter 'carrier_pigeon'")


def _logged(runs: Path) -> bool:
    return any(isinstance(e, LogEntry) for e in iter_records([runs], logs=True))


def _mark(runs: Path) -> str:
    return "".join(mark.read_text() for mark in runs.glob("*" + MARK_SUFFIX))


def test_a_job_killed_while_hung_before_any_span_left_gets_its_hang_in_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user kills the hung job before the file wrote a span (it gathers them for 60 s): the
    record naming where it hangs, and the job's time from its mark, are what the files hold."""
    code = """
import time
import traintel
def stuck_read():
    time.sleep(120)
traintel.configure()
with traintel.training_loop():
    for i in range(2):
        with traintel.training_iteration(samples=1):
            with traintel.data_loading():
                if i == 1:
                    stuck_read()
"""
    runs = tmp_path / "runs"
    (tmp_path / "job.py").write_text(code)
    env = clean_env(
        TRAINTEL_OUTPUT_DIR=str(runs), OTEL_BSP_SCHEDULE_DELAY="600000", TRAINTEL_STALL_SECONDS="1"
    )
    with subprocess.Popen([sys.executable, "job.py"], cwd=tmp_path, env=env) as job:
        try:
            hung = wait_for(lambda: _logged(runs) and '"iterations":1' in _mark(runs), 60)
        finally:
            job.kill()
    assert hung and job.returncode == -signal.SIGKILL
    assert not any(not isinstance(e, LogEntry) for e in iter_records([runs], logs=True))  # no span
    assert cli.main(["report", str(runs)]) == 0  # before: "no readable spans", exit 1
    out = capsys.readouterr().out
    assert "Stall 1" in out and "not recovered" in out, out
    assert "culprit  rank 0" in out and "data_loading after iteration 0" in out and "at stuck_read" in out, (
        out
    )
    assert "Goodput" in out, out  # the job's time, from its progress mark
    mark = json.loads(_mark(runs))["traintel.progress"]
    run_id = mark["resource"][semconv.RUN_ID]
    assert cli.main(["report", str(runs), "--json"]) == 0
    (stall,) = json.loads(capsys.readouterr().out)["stalls"]
    assert stall["end_unix_nano"] is None and stall["last_seen_unix_nano"] == mark["time_unix_nano"]
    stalled = fmt_seconds((mark["time_unix_nano"] - stall["start_unix_nano"]) / 1e9)
    assert f"not recovered, at least {stalled} (to the job's last sign of life" in " ".join(out.split()), out
    assert re.search(rf"run id +{run_id}", out), out  # (before: "-", the run named by its mark alone)
    assert re.search(r"^ iterations +1 *$", out, re.MULTILINE), out  # (before: 0)
    assert cli.main(["summary", str(runs)]) == 0  # before: "no readable spans", exit 1
    out = capsys.readouterr().out
    assert f"run {run_id}" in out and "No spans yet" in out, out
    assert "Iterations: 1, to iteration 0, in the progress mark" in out, out
    assert cli.main(["runs", str(runs)]) == 0  # before: "no runs in ...: no readable spans"
    out = capsys.readouterr().out
    assert re.search(rf"^{run_id[:12]} +job .* 1 +1 +1$", out, re.MULTILINE), out  # 1 rank, iteration, file
