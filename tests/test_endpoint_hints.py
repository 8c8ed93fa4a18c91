"""The mistakes of a first OTLP setup, said once and plainly: an endpoint without a scheme, a
protocol that does not exist, the other protocol's port, a signal's own HTTP endpoint without
its path (real jobs, automatic and explicit configuration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.otlp_receiver import GrpcReceiver, HttpReceiver
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


def test_the_other_protocol_s_port_and_a_signal_endpoint_without_its_path_are_said(tmp_path: Path) -> None:
    """gRPC (the default protocol) to the collector's HTTP port 4318 retried "Failed parsing
    HTTP/2" until the exit; a signal's own HTTP endpoint is used as given, so without
    ``/v1/metrics`` the collector answered 404. Each is said once, with the fix."""
    result = run_python(
        JOB,
        tmp_path,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318",
        OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://127.0.0.1:9/",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        TRAINTEL_SHUTDOWN_TIMEOUT="1",
    )
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    [port] = _lines(result.stderr, "OTLP http/protobuf port")
    assert (
        "OTEL_EXPORTER_OTLP_ENDPOINT='http://127.0.0.1:4318' is the collector's OTLP http/protobuf port, and "
        "the protocol is grpc: set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf, or use its grpc port (4317)"
    ) in port
    [path] = _lines(result.stderr, "is used as given")
    assert (
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT='http://127.0.0.1:9/' is used as given, without the path the "
        "collector takes metrics on: write http://127.0.0.1:9/v1/metrics"
    ) in path


@pytest.mark.parametrize(
    ("insecure", "warned"),
    [
        ({}, True),
        ({"OTEL_EXPORTER_OTLP_INSECURE": "false"}, True),  # TLS, as without it
        ({"OTEL_EXPORTER_OTLP_INSECURE": "true"}, False),
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
                "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none",
            },
            False,
        ),
    ],
)
def test_a_grpc_endpoint_without_a_scheme_warns_about_tls_once(
    tmp_path: Path, insecure: dict[str, str], warned: bool
) -> None:
    """Said where the exporter uses TLS: not where the signal's own variable asks plaintext,
    and where the general one is ``false``."""
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp", **insecure}
    result = run_python(
        JOB,
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT="127.0.0.1:9",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        TRAINTEL_SHUTDOWN_TIMEOUT="1",
        **env,
    )
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    lines = _lines(result.stderr, "has no scheme")
    assert len(lines) == warned, result.stderr
    assert all("so gRPC uses TLS to reach it: write http://127.0.0.1:9 (plaintext)" in line for line in lines)


@pytest.mark.server
def test_a_timeout_of_zero_or_below_is_replaced_and_one_in_milliseconds_is_said(tmp_path: Path) -> None:
    """The Python exporters read the timeout in seconds: ``-1`` failed every export at once (the
    run's spans never reached a listening collector), and the specification's ``10000`` ms is
    2.8 h per export. The first is replaced by the default and said; the second is said."""
    with GrpcReceiver() as receiver:
        result = run_python(
            JOB,
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="-1",
            OTEL_EXPORTER_OTLP_TIMEOUT="10000",
            OTEL_EXPORTER_OTLP_INSECURE="true",
        )
        assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    assert "training_iteration" in [span.name for _, span in receiver.received.spans()], result.stderr
    assert receiver.received.metric_names(), result.stderr
    [refused] = _lines(result.stderr, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT='-1'")
    assert "expected a positive number of seconds (every export would fail); using the default, 10" in refused
    [said] = _lines(result.stderr, "OTEL_EXPORTER_OTLP_TIMEOUT='10000' is in seconds")
    assert "for 10 s write 10" in said
    with pytest.raises(
        ConfigurationError, match=r"^OTEL_EXPORTER_OTLP_TRACES_TIMEOUT='-1': expected a positive"
    ):
        build_pipeline(
            TrainingConfig(),
            PipelineOptions(metric_readers=[]),
            strict=True,
            environ=dict(
                OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="-1"
            ),
        )


@pytest.mark.server
def test_http_json_is_sent_as_http_protobuf_to_the_same_endpoint(tmp_path: Path) -> None:
    """The specification's ``http/json`` names a collector's HTTP port; the Python exporters
    cannot send it, and the gRPC default sent there delivered nothing."""
    with HttpReceiver() as receiver:
        result = run_python(
            JOB,
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/json",
        )
        assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    assert "training_iteration" in [span.name for _, span in receiver.received.spans()], result.stderr
    assert receiver.received.metric_names(), result.stderr
    [said] = _lines(result.stderr, "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'")
    assert "do not send OTLP/JSON; sending http/protobuf to the same endpoint" in said
