"""What a collector answers, for real: spans it refuses inside an accepted request (OTLP partial
success) are counted and said; "try again later" (HTTP 429 with ``Retry-After``, gRPC
RESOURCE_EXHAUSTED with ``RetryInfo``) keeps batches live in the spool, never set aside as
refused, and the exit stays bounded while the collector keeps asking.

A real job exports every iteration to a real receiver on loopback (gRPC and HTTP); spans are
compared by id with the embedded file, which never fails.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.otlp_receiver import GrpcReceiver, HttpReceiver, Received, Throttle
from tests.subprocess_helpers import run_python
from traintel.cli import main
from traintel.exporters.reader import iter_spans

pytestmark = [pytest.mark.process, pytest.mark.server]

JOB = """
import traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(40):
            with traintel.training_iteration():
                with traintel.model_forward():
                    pass
print("trained", flush=True)
"""

PROTOCOLS = [("grpc", GrpcReceiver), ("http/protobuf", HttpReceiver)]
Receiver = type[GrpcReceiver] | type[HttpReceiver]


def _run(tmp_path: Path, endpoint: str, protocol: str, **extra: str) -> tuple[str, list[str]]:
    settings = dict(
        OTEL_TRACES_EXPORTER="otlp,traintel_file",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="16",
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_SPOOL_RETRY_INTERVAL="0.2",
        TRAINTEL_SHUTDOWN_TIMEOUT="20",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    result = run_python(JOB, tmp_path, **(settings | extra))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    produced = [s.span_id for s in iter_spans(sorted((tmp_path / "runs").glob("*.otlp.jsonl")))]
    assert len(produced) == 83  # application, loop, window record, 40 x (iteration, forward)
    return result.stderr, produced


def _received(received: Received) -> collections.Counter[str]:
    return collections.Counter(span.span_id.hex() for _, span in received.spans())


def _is_forward(span: Span) -> bool:
    return span.name == "model_forward"


@pytest.mark.parametrize(("protocol", "receiver_class"), PROTOCOLS)
def test_spans_a_collector_refuses_in_an_accepted_request_are_counted_and_said(
    tmp_path: Path, protocol: str, receiver_class: Receiver
) -> None:
    with receiver_class(partial=_is_forward) as receiver:
        stderr, produced = _run(tmp_path, receiver.endpoint, protocol)
    received = _received(receiver.received)
    assert set(received.values()) == {1}
    refused = set(produced) - set(received)
    assert len(refused) == 40 and set(received) <= set(produced)
    assert stderr.count("the collector accepted a request but rejected") == 1, stderr
    assert "span(s) refused by the test's rule" in stderr
    assert "40 span(s) dropped (collector_rejected 40)" in stderr, stderr


@pytest.mark.parametrize(("protocol", "receiver_class"), PROTOCOLS)
def test_a_throttling_collector_gets_every_batch_live_none_set_aside(
    tmp_path: Path, protocol: str, receiver_class: Receiver
) -> None:
    """Retry-After (2 s) beyond the exporter's timeout (1 s): the exporter gives up at once, and
    the spool waits as asked, three times, then delivers."""
    throttle = Throttle(requests=3, retry_after_s=2)
    with receiver_class(throttle=throttle) as receiver:
        stderr, produced = _run(tmp_path, receiver.endpoint, protocol)
    assert throttle.answered == 3
    received = _received(receiver.received)
    assert sorted(received) == sorted(produced) and set(received.values()) == {1}
    assert not list((tmp_path / "runs").rglob("quarantine")), "throttled is not refused"
    assert stderr.count("the collector asks to wait") == 1, stderr
    assert "rejected" not in stderr and "set aside" not in stderr, stderr
    assert "not delivered, kept in" not in stderr, stderr


@pytest.mark.parametrize(("protocol", "receiver_class"), PROTOCOLS)
def test_a_collector_that_keeps_throttling_gets_a_bounded_exit_and_a_replayable_spool(
    tmp_path: Path, protocol: str, receiver_class: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    """Retry-After of an hour, for ever: the exit does not wait for it (its own bound), nothing
    goes to quarantine, and the spool holds the run for a replay."""
    throttle = Throttle(requests=None, retry_after_s=3600)
    with receiver_class(throttle=throttle) as receiver:
        stderr, produced = _run(tmp_path, receiver.endpoint, protocol, TRAINTEL_SHUTDOWN_TIMEOUT="2")
    assert not list(receiver.received.spans())
    assert not list((tmp_path / "runs").rglob("quarantine")), "throttled is not refused"
    assert "83 span(s) in" in stderr and "not delivered, kept in" in stderr, stderr
    [spool] = (tmp_path / "runs" / "spool").iterdir()
    with receiver_class() as healthy:
        assert main(["replay", str(spool), "--endpoint", healthy.endpoint, "--protocol", protocol]) == 0
    received = _received(healthy.received)
    assert sorted(received) == sorted(produced) and set(received.values()) == {1}, capsys.readouterr().out


def _file_only(directory: Path) -> tuple[Path, list[str]]:
    directory.mkdir()
    result = run_python(
        JOB,
        directory,
        OTEL_TRACES_EXPORTER="traintel_file",
        OTEL_METRICS_EXPORTER="none",
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_OUTPUT_DIR=str(directory / "runs"),
    )
    assert result.returncode == 0, result.stderr
    produced = [s.span_id for s in iter_spans(sorted((directory / "runs").glob("*.otlp.jsonl")))]
    assert len(produced) == 83
    return directory / "runs", produced


@pytest.mark.parametrize(("protocol", "receiver_class"), PROTOCOLS)
def test_replay_stops_when_asked_to_wait_and_says_what_the_collector_refused(
    tmp_path: Path,
    protocol: str,
    receiver_class: Receiver,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``traintel replay`` of a run's file: throttled, it stops where it is (nothing set aside)
    and a later run resumes; spans refused inside accepted requests are said and the file kept.
    The exporter's timeout is the SDK's default (the suite's is 120 s), shorter than the
    collector's Retry-After, so the exporter gives up at the first answer instead of waiting
    out three 30 s retries."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "10")
    runs, produced = _file_only(tmp_path / "first")
    argv = ["replay", str(runs), "--protocol", protocol, "--delete-sent", "--endpoint"]
    throttle = Throttle(requests=None, retry_after_s=30)
    with receiver_class(throttle=throttle) as throttled:
        assert main([*argv, throttled.endpoint]) == 1
        out = capsys.readouterr().out
        assert "the collector asks to wait" in out and "run the same command again later" in out, out
        assert not list(runs.rglob("quarantine")) and list(runs.glob("*.otlp.jsonl"))
        throttle.requests = throttle.answered  # it takes requests again, at the same endpoint
        assert main([*argv, throttled.endpoint]) == 0, capsys.readouterr().out
    received = _received(throttled.received)
    assert sorted(received) == sorted(produced) and set(received.values()) == {1}
    runs, produced = _file_only(tmp_path / "second")
    with receiver_class(partial=_is_forward) as partial:
        argv = ["replay", str(runs), "--protocol", protocol, "--delete-sent", "--endpoint", partial.endpoint]
        assert main(argv) == 1
    out = capsys.readouterr().out
    assert "not delivered: 40 span(s) refused by the collector inside requests it accepted" in out, out
    assert list(runs.glob("*.otlp.jsonl")), "kept: not all delivered"
