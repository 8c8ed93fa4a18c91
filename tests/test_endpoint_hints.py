"""Two mistakes of a first OTLP setup, said once and plainly: an endpoint without a scheme,
and a protocol that does not exist (real jobs, automatic and explicit configuration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.subprocess_helpers import run_python
from traintel._runtime.pipeline import PipelineOptions, build_pipeline
from traintel.config import ConfigurationError, TrainingConfig

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

JOB = """
import sys, traintel
if sys.argv[1:] == ["explicit"]:
    traintel.configure()
with traintel.training_loop():
    with traintel.training_iteration():
        pass
print("trained")
"""


def _lines(stderr: str, text: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


def test_an_unknown_protocol_is_said_once_for_both_signals(tmp_path: Path) -> None:
    result = run_python(
        JOB,
        tmp_path,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL="carrier-pigeon",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        TRAINTEL_SHUTDOWN_TIMEOUT="1",
    )
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    assert len(_lines(result.stderr, "unknown OTLP protocol")) == 1, result.stderr


def test_an_http_endpoint_without_a_scheme_says_how_to_write_it(tmp_path: Path) -> None:
    env = dict(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT="127.0.0.1:9",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        TRAINTEL_SHUTDOWN_TIMEOUT="1",
    )
    result = run_python(JOB, tmp_path, **env)
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    [line] = _lines(result.stderr, "has no scheme")
    assert "OTEL_EXPORTER_OTLP_ENDPOINT='127.0.0.1:9' has no scheme: write http://127.0.0.1:9" in line
    with pytest.raises(ConfigurationError, match=r"has no scheme: write http://127.0.0.1:9"):
        build_pipeline(TrainingConfig(), PipelineOptions(metric_readers=[]), strict=True, environ=env)


def test_a_grpc_endpoint_without_a_scheme_warns_about_tls_once(tmp_path: Path) -> None:
    result = run_python(
        JOB,
        tmp_path,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT="127.0.0.1:9",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        TRAINTEL_SHUTDOWN_TIMEOUT="1",
    )
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    [line] = _lines(result.stderr, "has no scheme")
    assert "so gRPC uses TLS to reach it: write http://127.0.0.1:9 (plaintext)" in line
