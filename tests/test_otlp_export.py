"""Environment-only configuration end to end, over real sockets (gRPC and HTTP/protobuf).

A fresh interpreter runs the reference job with nothing but OTEL_* / TRAINTEL_* variables;
a real OTLP receiver in this process decodes the Export*ServiceRequest bytes it sends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import reference_job
from tests.otlp_receiver import GrpcReceiver, HttpReceiver, Received
from tests.subprocess_helpers import run_python
from traintel import semconv

pytestmark = [pytest.mark.process, pytest.mark.server]  # the suite's tiers: tests/tiers.py

JOB = """
from tests import reference_job
reference_job.with_context_managers()
"""

COMMON_ENV = {
    "OTEL_SERVICE_NAME": "env-only-job",
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,team=ml",
    "OTEL_EXPORTER_OTLP_HEADERS": "x-scope-orgid=tenant-1,authorization=Bearer%20s3cr3t",
    "OTEL_BSP_SCHEDULE_DELAY": "100",
    "OTEL_METRIC_EXPORT_INTERVAL": "60000",
    "TRAINTEL_SESSION_TAG": "session-a",
    "TRAINTEL_PERF_TAG": "perf-a",
    "TRAINTEL_GLOBAL_BATCH_SIZE": "16",
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
}


def _assert_received_reference_job(received: Received) -> None:
    spans = list(received.spans())
    names = [span.name for _, span in spans]
    assert sorted(names) == sorted(
        name for name, count in reference_job.EXPECTED_COUNTS.items() for _ in range(count)
    )
    by_id = {span.span_id: span for _, span in spans}
    for _, span in spans:
        parent = by_id[span.parent_span_id].name if span.parent_span_id else None
        assert parent == reference_job.EXPECTED_PARENTS[span.name]
        phase = next((kv.value.string_value for kv in span.attributes if kv.key == semconv.PHASE), None)
        assert phase == (None if span.name in reference_job.RECORDS else span.name)
    resource, _ = spans[0]
    assert resource[semconv.SERVICE_NAME] == "env-only-job"
    assert resource["deployment.environment"] == "ci"
    assert resource["team"] == "ml"
    assert resource[semconv.SESSION_TAG] == "session-a"
    assert resource[semconv.PERF_TAG] == "perf-a"
    assert (resource[semconv.RANK], resource[semconv.LOCAL_RANK], resource[semconv.WORLD_SIZE]) == (1, 1, 2)
    assert resource[semconv.RUN_ID]
    assert resource[semconv.SERVICE_INSTANCE_ID]
    app = next(span for _, span in spans if span.name == "application")
    init = app.events[0]
    assert init.name == "telemetry_initialization"
    config = {kv.key: kv.value for kv in init.attributes}
    assert config["traintel.config.global_batch_size"].int_value == 16
    iteration = next(span for _, span in spans if span.name == "training_iteration")
    loss = next(kv.value.double_value for kv in iteration.attributes if kv.key == "ml.training.metric.loss")
    assert loss == 1.5


def _assert_headers(received: Received) -> None:
    assert received.headers, "nothing was received"
    for headers in received.headers:
        assert headers["x-scope-orgid"] == "tenant-1"
        assert headers["authorization"] == "Bearer s3cr3t"


def test_grpc_env_only(tmp_path: Path) -> None:
    with GrpcReceiver() as receiver:
        result = run_python(
            JOB,
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_EXPORTER_OTLP_INSECURE="true",
            **COMMON_ENV,
        )
        assert result.returncode == 0, result.stderr
    _assert_received_reference_job(receiver.received)
    _assert_headers(receiver.received)
    assert semconv.METRIC_PHASE_DURATION in receiver.received.metric_names()
    # An OTLP endpoint replaces the embedded default: no telemetry file. (A batch handed over
    # while a send was still under way, on a loaded machine, waits in the spool directory and is
    # delivered from there: nothing of it may be left.)
    left = [p for p in (tmp_path / "traintel-runs").rglob("*") if p.is_file()]
    assert left == [], "an OTLP endpoint replaces the embedded default"
    assert result.stderr == ""


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_http_protobuf_env_only(tmp_path: Path, compression: str) -> None:
    with HttpReceiver() as receiver:
        result = run_python(
            JOB,
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_COMPRESSION=compression,
            **COMMON_ENV,
        )
        assert result.returncode == 0, result.stderr
    _assert_received_reference_job(receiver.received)
    _assert_headers(receiver.received)
    assert semconv.METRIC_PHASE_DURATION in receiver.received.metric_names()
    if compression == "gzip":
        assert all(h.get("content-encoding") == "gzip" for h in receiver.received.headers)


def test_per_signal_endpoints_and_protocols(tmp_path: Path) -> None:
    with HttpReceiver() as traces, GrpcReceiver() as metrics:
        result = run_python(
            JOB,
            tmp_path,
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=traces.endpoint + "/v1/traces",
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=metrics.endpoint,
            OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="grpc",
            OTEL_EXPORTER_OTLP_METRICS_INSECURE="true",
            **COMMON_ENV,
        )
        assert result.returncode == 0, result.stderr
    _assert_received_reference_job(traces.received)
    assert not traces.received.metrics
    assert not metrics.received.traces
    assert semconv.METRIC_PHASE_DURATION in metrics.received.metric_names()


def test_otlp_and_local_file_together(tmp_path: Path) -> None:
    with GrpcReceiver() as receiver:
        result = run_python(
            JOB + "\nimport traintel\nprint(traintel.get_telemetry().output_file)\n",
            tmp_path,
            OTEL_TRACES_EXPORTER="otlp,traintel_file",
            OTEL_METRICS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
            **COMMON_ENV,
        )
        assert result.returncode == 0, result.stderr
    _assert_received_reference_job(receiver.received)
    assert not receiver.received.metrics
    from traintel.exporters.reader import iter_spans

    local = Path(result.stdout.strip())
    assert local.parent == tmp_path / "runs"
    assert sorted(s.name for s in iter_spans([local])) == sorted(s.name for _, s in receiver.received.spans())
