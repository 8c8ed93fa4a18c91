"""The exporters' failure lines during an outage: the first attempt's, then one line saying the
rest are left out, then again after a delivery (real OTLP exporters, a port nothing listens on)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocess_helpers import clean_env, run_python

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: Runs in a fresh interpreter: the exporters' loggers carry process-wide filters (this one and
#: the TLS one), whose state an earlier test in the same process would change.
OUTAGE = """
import json, logging, sys
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from traintel.exporters import retry_lines

protocol, port = sys.argv[1], int(sys.argv[2])
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.name, record.getMessage()))
logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.INFO)
exporter = (
    GrpcExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True, timeout=1)
    if protocol == "grpc"
    else HttpExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=1)
)
line_filter = retry_lines.install()
memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
provider.get_tracer("t").start_span("s").end()
spans = list(memory.get_finished_spans())

def attempt():
    try:
        exporter.export(spans)
    except ValueError:  # SDK 1.40's HTTP exporter can compute a negative timeout near its deadline
        pass

def failed():
    return sum(message.startswith("Failed to export") for _, message in records)

for _ in range(4):
    attempt()
first = failed()
notes = [name for name, message in records if "further retry lines are left out" in message]
dropped = line_filter.dropped
retry_lines.delivered()  # the collector took a batch: a new outage is shown again
for _ in range(3):  # an attempt cut short by the SDK 1.40 error above logs nothing
    attempt()
    if failed() == 2:
        break
print(json.dumps({"first": first, "notes": notes, "dropped": dropped, "after": failed()}))
"""


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_failure_lines_are_said_once_per_outage(protocol: str, tmp_path: Path) -> None:
    script = tmp_path / "outage.py"
    script.write_text(OUTAGE)
    done = subprocess.run(
        [sys.executable, str(script), protocol, str(_closed_port())],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["first"] == 1, done.stderr
    # gRPC may fail the later attempts in its connection backoff without a line; HTTP logs each
    assert report["dropped"] > 0 or protocol == "grpc"
    assert report["notes"] == (["traintel"] if report["dropped"] else [])
    if protocol == "http":
        assert report["after"] == 2


def test_a_job_with_its_collector_down_logs_a_bounded_number_of_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    job = """
import time, traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(40):
            with traintel.training_iteration():
                with traintel.model_forward():
                    time.sleep(0.05)
print("trained")
"""
    result = run_python(
        job,
        tmp_path,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{_closed_port()}",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        OTEL_BSP_SCHEDULE_DELAY="100",
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_SPOOL_RETRY_INTERVAL="0.1",
        TRAINTEL_SHUTDOWN_TIMEOUT="2",
    )
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    lines = result.stderr.splitlines()
    exporter_lines = [line for line in lines if line.startswith(("Transient error", "Failed to export"))]
    assert 1 <= len(exporter_lines) <= 3, result.stderr  # the first attempt's, not one per retry
    assert sum("further retry lines are left out" in line for line in lines) == 1
    assert "span export attempt(s) failed" in result.stderr  # the count is still said at exit
