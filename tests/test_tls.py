"""TLS export to a real TLS receiver on loopback, configured only through ``OTEL_*``.

The test generates a CA and a server certificate (``tests/tls_certs.py``); the job gets nothing
but ``OTEL_EXPORTER_OTLP_ENDPOINT=https://...`` and ``OTEL_EXPORTER_OTLP_CERTIFICATE``. With the
right CA every span of the reference job arrives over gRPC and over HTTP/protobuf; with a wrong
CA the export fails with a clear certificate error, the job trains to the end and exits 0 within
the shutdown bound.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests import reference_job
from tests.otlp_receiver import GrpcReceiver, HttpReceiver
from tests.subprocess_helpers import run_python
from tests.tls_certs import TlsFiles, make_tls_files

JOB = """
from tests import reference_job
reference_job.with_context_managers()
print("trained", flush=True)
"""

GRPC_CORE_LINE = re.compile(r"^[IWEF]\d{4} \d")
CERTIFICATE_ERROR = re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed")
EXPECTED_SPANS = sum(reference_job.EXPECTED_COUNTS.values())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[TlsFiles, TlsFiles]:
    directory = tmp_path_factory.mktemp("tls")
    return make_tls_files(directory, "good"), make_tls_files(directory, "other")


def _receiver(protocol: str, tls: TlsFiles) -> GrpcReceiver | HttpReceiver:
    if protocol == "grpc":
        return GrpcReceiver(tls=tls.server_pair())
    return HttpReceiver(tls=(str(tls.server_cert), str(tls.server_key)))


def _run(tmp_path: Path, endpoint: str, protocol: str, ca: Path, **extra: str) -> tuple[int, str, str, float]:
    started = time.monotonic()
    result = run_python(
        JOB,
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_CERTIFICATE=str(ca),
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_METRIC_EXPORT_INTERVAL="60000",
        **extra,
    )
    return result.returncode, result.stdout, result.stderr, time.monotonic() - started


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_export_over_tls_with_the_generated_ca(
    tmp_path: Path, certs: tuple[TlsFiles, TlsFiles], protocol: str
) -> None:
    good, other = certs
    with _receiver(protocol, good) as receiver:
        assert receiver.endpoint.startswith("https://127.0.0.1:")
        # Set on many clusters and images; requests lets it override the exporter's CA file
        # (psf/requests#3829) unless traintel's session keeps it: point it at the wrong CA.
        bundle = {"REQUESTS_CA_BUNDLE": str(other.ca_cert), "CURL_CA_BUNDLE": str(other.ca_cert)}
        code, out, err, _ = _run(tmp_path, receiver.endpoint, protocol, good.ca_cert, **bundle)
    assert code == 0 and "trained" in out, err
    assert err == "", err
    spans = [span for _, span in receiver.received.spans()]
    assert len(spans) == EXPECTED_SPANS  # every span, once, over TLS
    assert len({span.span_id for span in spans}) == EXPECTED_SPANS
    assert receiver.received.metric_names(), "metrics arrived over TLS too"


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_wrong_ca_fails_export_cleanly_and_training_goes_on(
    tmp_path: Path, certs: tuple[TlsFiles, TlsFiles], protocol: str
) -> None:
    good, other = certs
    with _receiver(protocol, good) as receiver:
        code, out, err, took = _run(
            tmp_path,
            receiver.endpoint,
            protocol,
            other.ca_cert,  # signed by a CA the job does not trust
            OTEL_EXPORTER_OTLP_TIMEOUT="2",
            TRAINTEL_SHUTDOWN_TIMEOUT="3",
        )
    assert code == 0 and "trained" in out, err  # training ran to the end, exit status untouched
    assert "Traceback" not in err, err
    assert took < 30  # bounded by the timeouts, not by retries against a peer we refuse
    assert list(receiver.received.spans()) == []  # nothing was sent to an unverified peer
    # grpc's C core adds its own "I<date> ... Handshake failed" lines per attempt (GRPC_VERBOSITY
    # silences them). What Python logs is the exporters' certificate failure (a retry notice or
    # the final error, per signal, depending on when the bounded shutdown cuts the retries).
    logged = [line for line in err.splitlines() if line.strip() and not GRPC_CORE_LINE.match(line)]
    assert any(CERTIFICATE_ERROR.search(line) for line in logged), err
    assert len(logged) <= 7, err  # plus, at most, traintel's "shutdown did not finish in time"
