"""The exporters' failure lines during an outage: the first attempt's, then one line saying the
rest are left out, then again after a delivery (real OTLP exporters, a port nothing listens on)."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.subprocess_helpers import run_python
from traintel.exporters import retry_lines


def _spans() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("t").start_span("s").end()
    return list(memory.get_finished_spans())


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_failure_lines_are_said_once_per_outage(protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    port = _closed_port()
    exporter = (
        GrpcExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True, timeout=1)
        if protocol == "grpc"
        else HttpExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=1)
    )
    line_filter = retry_lines.install()
    retry_lines.delivered()  # whatever an earlier test left
    dropped_before = line_filter.dropped
    spans = _spans()
    caplog.set_level(logging.INFO)

    def failed_lines() -> int:
        return sum(r.getMessage().startswith("Failed to export") for r in caplog.records)

    def attempt() -> None:
        try:
            exporter.export(spans)
        except ValueError:  # SDK 1.40's HTTP exporter can compute a negative timeout near its deadline
            pass

    for _ in range(4):
        attempt()
    assert failed_lines() == 1
    notes = [r for r in caplog.records if "further retry lines are left out" in r.getMessage()]
    # gRPC may fail the later attempts in its connection backoff without a line; HTTP logs each
    dropped = line_filter.dropped - dropped_before
    assert dropped > 0 or protocol == "grpc"
    assert [r.name for r in notes] == (["traintel"] if dropped else [])
    retry_lines.delivered()  # the collector took a batch: a new outage is shown again
    for _ in range(3):  # an attempt cut short by the SDK 1.40 error above logs nothing
        attempt()
        if failed_lines() == 2:
            break
    if protocol == "http":  # gRPC may fail it in its connection backoff, without a line
        assert failed_lines() == 2
    exporter.shutdown()


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
