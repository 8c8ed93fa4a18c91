"""Secrets: OTLP header values never leave the process except as the headers themselves.

A token is planted in ``OTEL_EXPORTER_OTLP_HEADERS`` and in each per-signal variant; a fresh
interpreter runs a job with every logger at DEBUG, exporting to a real receiver and to the
embedded file (and, in a second run, to an endpoint where nothing listens, so the export error
paths log). Then everything the run produced is grepped for the token: stdout, stderr, every
file under the working directory, the ``traintel report`` / ``goodput`` / ``summary`` output
and the attributes of every span, event and resource the receiver decoded. The receiver itself
must still see the header: redaction must not break authentication.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.otlp_receiver import GrpcReceiver, HttpReceiver, Received
from tests.subprocess_helpers import clean_env, run_python
from traintel.exporters import redaction as _redaction
from traintel.exporters.redaction import REDACTED

pytestmark = [pytest.mark.process, pytest.mark.server]  # the suite's tiers: tests/tiers.py

JOB = """
import logging
logging.basicConfig(level=logging.DEBUG)  # every log path of traintel, the SDK, grpc, urllib3
import warnings
warnings.simplefilter("always")
from tests import reference_job
reference_job.with_context_managers()
"""


def _token() -> str:
    return "tok" + uuid.uuid4().hex  # unique: it cannot appear anywhere by chance


def _header_env(token: str, per_signal: bool) -> dict[str, str]:
    """The general variable, or one per signal; a malformed entry carries the token too."""
    env = {"OTEL_EXPORTER_OTLP_LOGS_HEADERS": f"x-logs-key={token}-logs"}
    if per_signal:
        env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = f"x-api-key={token}-traces,broken entry {token}-bad"
        env["OTEL_EXPORTER_OTLP_METRICS_HEADERS"] = f"x-api-key={token}-metrics"
    else:
        env["OTEL_EXPORTER_OTLP_HEADERS"] = (
            f"authorization=Bearer%20{token}-all,x-scope-orgid=tenant-1,broken entry {token}-bad"
        )
    return env


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "traintel.cli", *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def _assert_nowhere(token: str, tmp_path: Path, *outputs: str) -> int:
    """No output and no file mentions the token; returns how many files were checked."""
    for output in outputs:
        assert token not in output, output[max(0, output.find(token) - 300) : output.find(token) + 100]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    for path in files:
        assert token.encode() not in path.read_bytes(), path
    return len(files)


def _received_text(received: Received) -> str:
    with received.lock:
        return "".join(str(r) for r in received.traces + received.metrics)


@pytest.mark.parametrize(
    ("receiver_cls", "protocol", "per_signal"),
    [(GrpcReceiver, "grpc", False), (HttpReceiver, "http/protobuf", True)],
    ids=["grpc-general-headers", "http-per-signal-headers"],
)
def test_header_values_reach_the_collector_and_nothing_else(
    tmp_path: Path, receiver_cls: type[GrpcReceiver | HttpReceiver], protocol: str, per_signal: bool
) -> None:
    token = _token()
    runs = tmp_path / "runs"
    with receiver_cls() as receiver:
        result = run_python(
            JOB,
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
            OTEL_TRACES_EXPORTER="otlp,traintel_file",
            OTEL_METRICS_EXPORTER="otlp,traintel_file",
            OTEL_BSP_SCHEDULE_DELAY="100",
            TRAINTEL_OUTPUT_DIR=str(runs),
            **_header_env(token, per_signal),
        )
    assert result.returncode == 0, result.stderr
    assert REDACTED in result.stderr  # the SDK logged the malformed entry, without its text
    received = receiver.received
    # The collector sees the header (per signal where set), so authentication still works.
    assert received.traces and received.metrics
    for headers in received.headers:
        if per_signal:
            assert headers["x-api-key"] in (f"{token}-traces", f"{token}-metrics")
        else:
            assert headers["authorization"] == f"Bearer {token}-all"
    assert any(name == "application" for name in (span.name for _, span in received.spans()))
    assert token not in _received_text(received)  # no span, event or resource attribute
    assert list(runs.rglob("*.jsonl")), "the embedded file was written"
    checked = _assert_nowhere(
        token,
        tmp_path,
        result.stdout,
        result.stderr,
        _cli("report", str(runs)),
        _cli("report", "--json", str(runs)),
        _cli("goodput", str(runs)),
        _cli("summary", str(runs)),
    )
    assert checked >= 2  # the job script and at least one run file


def test_header_values_stay_out_of_export_error_paths(tmp_path: Path) -> None:
    """Nothing listens at the endpoint: every export fails and logs; none of it names the token."""
    token = _token()
    runs = tmp_path / "runs"
    port = _closed_port()
    result = run_python(
        JOB,
        tmp_path,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"http://127.0.0.1:{port}/v1/metrics",
        OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="http/protobuf",
        OTEL_TRACES_EXPORTER="otlp,traintel_file",
        OTEL_METRICS_EXPORTER="otlp,traintel_file",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        OTEL_BSP_SCHEDULE_DELAY="100",
        TRAINTEL_SHUTDOWN_TIMEOUT="3",
        TRAINTEL_OUTPUT_DIR=str(runs),
        **{**_header_env(token, per_signal=False), **_header_env(token, per_signal=True)},
    )
    assert result.returncode == 0, result.stderr
    # The failures were logged (so the error paths really ran) ...
    assert "Failed to export traces to 127.0.0.1" in result.stderr, result.stderr
    # the SDK's own line, or (when a loaded machine spent the 1 s before the request was made
    # and the SDK's HTTP client raised on a negative timeout instead) traintel's count at exit
    assert "Failed to export metrics" in result.stderr or "metric export(s) failed" in result.stderr, (
        result.stderr
    )
    assert REDACTED in result.stderr
    assert list(runs.rglob("*.jsonl"))
    # ... and none of them, nor anything else, carries the token.
    _assert_nowhere(
        token,
        tmp_path,
        result.stdout,
        result.stderr,
        _cli("report", str(runs)),
        _cli("goodput", str(runs)),
    )


def test_a_traceback_that_quotes_a_header_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    """An exporter exception whose text quotes the request metadata (grpc does, for invalid
    metadata) is logged with its traceback; the traceback is redacted too, the record kept."""
    token = _token()
    _redaction.install({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"x-api-key={token}%0A"})
    logger = logging.getLogger("opentelemetry.sdk.trace.export")
    try:
        with caplog.at_level(logging.DEBUG):
            try:
                raise ValueError(f"metadata was invalid: (('x-api-key', '{token}\\n'),)")
            except ValueError:
                logger.exception("Exception while exporting Span batch.")
            logger.warning("header %s and %r", f"{token}\n", token)
    finally:
        _redaction.install({})
    assert len(caplog.records) == 2
    assert token not in caplog.text
    assert "Exception while exporting Span batch." in caplog.text and "ValueError" in caplog.text
    assert caplog.text.count(REDACTED) >= 3
