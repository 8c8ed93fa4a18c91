"""TLS export to a real TLS receiver on loopback, configured only through ``OTEL_*``.

The test generates a CA and a server certificate (``tests/tls_certs.py``); the job gets nothing
but ``OTEL_EXPORTER_OTLP_ENDPOINT=https://...`` and ``OTEL_EXPORTER_OTLP_CERTIFICATE``. With the
right CA every span of the reference job arrives over gRPC and over HTTP/protobuf; with a wrong
CA the job logs one clear error naming the endpoint and the CA file, trains to the end, exits 0
within the shutdown bound, and the spool keeps every span.
"""

from __future__ import annotations

import inspect
import logging
import re
import uuid
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc import exporter as grpc_exporter

from tests import reference_job
from tests.otlp_receiver import GrpcReceiver, HttpReceiver
from tests.subprocess_helpers import exit_seconds, run_python, with_exit_clock
from tests.tls_certs import TlsFiles, make_tls_files
from traintel.exporters import tls_errors
from traintel.exporters.redaction import REDACTED, url_secrets
from traintel.exporters.spool import read_batch

pytestmark = [pytest.mark.process, pytest.mark.server]  # the suite's tiers: tests/tiers.py

JOB = """
from tests import reference_job
reference_job.with_context_managers()
print("trained", flush=True)
"""

GRPC_CORE_LINE = re.compile(r"^[IWEF]\d{4} \d")
#: Whether this OTLP gRPC exporter logs an error's details (from 1.43): what says it was TLS.
GRPC_EXPORTER_LOGS_DETAILS = "error details" in inspect.getsource(grpc_exporter).lower()
EXPECTED_SPANS = sum(reference_job.EXPECTED_COUNTS.values())
SECRET = "planted-tls-header-token"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[TlsFiles, TlsFiles]:
    directory = tmp_path_factory.mktemp("tls")
    return make_tls_files(directory, "good"), make_tls_files(directory, "other")


def _receiver(protocol: str, tls: TlsFiles) -> GrpcReceiver | HttpReceiver:
    if protocol == "grpc":
        return GrpcReceiver(tls=tls.server_pair())
    return HttpReceiver(tls=(str(tls.server_cert), str(tls.server_key)))


def _run(tmp_path: Path, endpoint: str, protocol: str, ca: Path, **extra: str) -> tuple[int, str, str, float]:
    """The job's status, output, errors and how long its exit took (:func:`exit_seconds`)."""
    result = run_python(
        with_exit_clock(JOB),
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_CERTIFICATE=str(ca),
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_METRIC_EXPORT_INTERVAL="60000",
        **extra,
    )
    return result.returncode, result.stdout, result.stderr, exit_seconds(tmp_path)


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
def test_a_wrong_ca_says_so_once_training_goes_on_and_the_spool_keeps_the_spans(
    tmp_path: Path, certs: tuple[TlsFiles, TlsFiles], protocol: str
) -> None:
    good, other = certs
    with _receiver(protocol, good) as receiver:
        bound, send = 3.0, 2.0
        code, out, err, exit_s = _run(
            tmp_path,
            receiver.endpoint,
            protocol,
            other.ca_cert,  # signed by a CA the job does not trust
            OTEL_EXPORTER_OTLP_TIMEOUT=str(send),
            OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{SECRET}",
            TRAINTEL_SHUTDOWN_TIMEOUT=str(bound),
            TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        )
    assert code == 0 and "trained" in out, err  # training ran to the end, exit status untouched
    assert "Traceback" not in err and SECRET not in err, err
    # bounded by the timeouts (its own, one send's), not by retries against a peer we refuse
    assert exit_s < bound + send
    assert list(receiver.received.spans()) == []  # nothing was sent to an unverified peer
    # grpc's C core adds its own INFO lines ("I<date> ... Handshake failed") per attempt, outside
    # Python logging (GRPC_VERBOSITY=ERROR silences them). Everything else is traintel's:
    # the one certificate error, then the spool notice and the exit report. Before, each
    # exporter logged its own retry and failure lines per signal, none naming the CA file.
    assert "metric export(s) failed, none delivered: this run's metrics were not delivered" in err
    assert "traintel: span export failed; spooling" in err
    if protocol == "grpc" and not GRPC_EXPORTER_LOGS_DETAILS:
        # Before 1.43 the gRPC exporter logs only the status code (UNAVAILABLE), never the
        # TLS error: there is nothing to explain from, and its own lines pass as they are.
        assert "certificate verification" not in err
    else:
        logged = [line for line in err.splitlines() if line.strip() and not GRPC_CORE_LINE.match(line)]
        assert all(line.startswith("traintel: ") for line in logged), err
        (certificate,) = [line for line in logged if "certificate" in line.lower()]
        assert "failed TLS certificate verification (unable to get local issuer certificate)" in certificate
        assert f"OTEL_EXPORTER_OTLP_ENDPOINT={receiver.endpoint} " in certificate
        assert f"the CA in {other.ca_cert} (OTEL_EXPORTER_OTLP_CERTIFICATE)" in certificate
        others = [line for line in logged if line != certificate]
        notices = ("traintel: span export failed; spooling", "traintel: telemetry ")  # + exit report
        assert all(line.startswith(notices) for line in others), err
    # The spool kept every span of the run, once.
    spooled = [
        span.span_id
        for path in sorted((tmp_path / "runs" / "spool").rglob("*.otlp.pb"))
        for resource_spans in read_batch(path).resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]
    assert len(spooled) == len(set(spooled)) == EXPECTED_SPANS, err


def test_the_certificate_error_names_the_signals_own_variables_and_lets_other_lines_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The per-signal endpoint and CA win; without a CA file the error says what to set; lines
    that are not about the certificate pass, until that signal's failure was explained."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "https://metrics:4318/v1/metrics",
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "/etc/ca/traces.pem",
    }
    exporter = logging.getLogger("opentelemetry.exporter.test_tls_errors")
    exporter.propagate = False
    kept: list[str] = []
    handler = _ListHandler(kept)
    exporter.addHandler(handler)
    certificate_filter = tls_errors.CertificateFailureFilter(tls_errors.tls_targets(env))
    exporter.addFilter(certificate_filter)
    failure = (  # as requests words it
        "HTTPSConnectionPool(host='collector', port=4318): Max retries exceeded with url: /v1/traces "
        "(Caused by SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] "
        "certificate verify failed: self-signed certificate (_ssl.c:1006)')))"
    )
    with caplog.at_level(logging.ERROR, logger="traintel"):
        exporter.warning("Failed to export metrics batch due to timeout, max retries or shutdown.")
        exporter.warning("Transient error %s encountered while exporting spans batch, retrying.", failure)
        exporter.warning("Transient error %s encountered while exporting spans batch, retrying.", failure)
        exporter.error("Failed to export spans batch due to timeout, max retries or shutdown.")
        exporter.warning("Transient error %s encountered while exporting metrics batch.", failure)
    exporter.removeHandler(handler)
    exporter.removeFilter(certificate_filter)
    said = [r.getMessage() for r in caplog.records if r.name == "traintel"]
    assert kept == ["Failed to export metrics batch due to timeout, max retries or shutdown."]
    assert len(said) == 2, said  # one per (endpoint, CA): traces, then metrics
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=https://collector:4318 " in said[0]
    assert "(self-signed certificate)" in said[0]
    assert "the CA in /etc/ca/traces.pem (OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE)" in said[0]
    assert "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=https://metrics:4318/v1/metrics " in said[1]
    assert "not trusted by this machine's CA store (set OTEL_EXPORTER_OTLP_CERTIFICATE" in said[1]


class _ListHandler(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_password_in_the_endpoint_url_is_never_printed(
    tmp_path: Path, certs: tuple[TlsFiles, TlsFiles], protocol: str
) -> None:
    """``https://user:PASS@host``: the certificate error and the exporters' own lines name the
    endpoint with the password redacted; neither stderr nor any file holds it."""
    good, other = certs
    password = "pw" + uuid.uuid4().hex
    with _receiver(protocol, good) as receiver:
        endpoint = receiver.endpoint.replace("https://", f"https://trainer:{password}@")
        code, out, err, _ = _run(
            tmp_path, endpoint, protocol, other.ca_cert, OTEL_EXPORTER_OTLP_TIMEOUT="2",
            TRAINTEL_SHUTDOWN_TIMEOUT="3", TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        )  # fmt: skip
    assert code == 0 and "trained" in out, err
    assert password not in err and password not in out, err
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or password.encode() not in path.read_bytes(), path
    if protocol == "http/protobuf":
        redacted = receiver.endpoint.replace("https://", f"https://trainer:{REDACTED}@")
        assert f"OTEL_EXPORTER_OTLP_ENDPOINT={redacted} failed TLS certificate verification" in err, err


def test_url_secrets_are_the_password_and_the_query_values() -> None:
    assert url_secrets("https://user:s3cr%40t@host:4318/v1/traces?token=abcd1234&x=1") == {
        "s3cr%40t", "s3cr@t", "abcd1234"
    }  # fmt: skip
    assert url_secrets("https://host:4318") == set()
    assert url_secrets("http://[::1") == set()  # not a URL: nothing, and no error
