"""Collector down for a whole run, then ``traintel replay``: a real job exports to a port where
nothing listens, exits within its bound, leaves an owner-only spool, and the replay delivers
every span of it, once, to a real receiver (gRPC and HTTP); the embedded default file replays
the same way."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.otlp_receiver import GrpcReceiver, HttpReceiver
from tests.subprocess_helpers import exit_seconds, run_python, with_exit_clock
from traintel.cli import main
from traintel.exporters.reader import iter_spans, spans_in
from traintel.exporters.spool import spooled_requests

pytestmark = [pytest.mark.process, pytest.mark.server]  # the suite's tiers: tests/tiers.py

JOB = """
import traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(6):
            with traintel.training_iteration():
                with traintel.model_forward():
                    pass
                traintel.record_metrics(loss=1.0 / (i + 1))
print("trained")
"""


def _free_port() -> int:
    with GrpcReceiver() as receiver:  # bound, then closed: nothing listens there afterwards
        return receiver.port


#: traintel's exit bound and the exporter's timeout in the run below: the exporter would retry
#: the refused connection that long, so an exit that waited for it could not end before
BOUND, SEND = 2.0, 30.0


def _run_with_collector_down(tmp_path: Path, protocol: str) -> tuple[float, str, Path]:
    result = run_python(
        with_exit_clock(JOB),
        tmp_path,
        OTEL_TRACES_EXPORTER="otlp,traintel_file",
        OTEL_METRICS_EXPORTER="traintel_file",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{_free_port()}",
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_EXPORTER_OTLP_TIMEOUT=str(SEND),
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_SHUTDOWN_TIMEOUT=str(BOUND),
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    exit_s = exit_seconds(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    [spool] = (tmp_path / "runs" / "spool").iterdir()
    return exit_s, result.stderr, spool


@pytest.mark.parametrize(
    ("protocol", "receiver_class"), [("grpc", GrpcReceiver), ("http/protobuf", HttpReceiver)]
)
def test_down_for_the_whole_run_then_replayed_exactly_once(
    tmp_path: Path,
    protocol: str,
    receiver_class: type[GrpcReceiver] | type[HttpReceiver],
    capsys: pytest.CaptureFixture[str],
) -> None:
    exit_s, stderr, spool = _run_with_collector_down(tmp_path, protocol)
    # Exit bound: its 2 s, not the exporter's retries.
    assert exit_s < SEND, stderr
    assert "not delivered, kept in" in stderr and f"traintel replay {spool}" in stderr
    produced = sorted(s.span_id for s in iter_spans(sorted((tmp_path / "runs").glob("*.otlp.jsonl"))))
    assert len(produced) == 15  # application, loop, window record, 6 x (iteration, forward)
    spooled = sorted(s.span_id for request in spooled_requests([spool]) for s in spans_in(request))
    assert spooled == produced, "the spool holds the whole run"
    with receiver_class() as receiver:
        code = main(
            ["replay", str(spool), "--endpoint", receiver.endpoint, "--protocol", protocol, "--delete-sent"]
        )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "replayed 15 span(s)" in out
    counts = collections.Counter(span.span_id.hex() for _, span in receiver.received.spans())
    assert sorted(counts) == produced and set(counts.values()) == {1}
    assert not list(spooled_requests([spool])), "--delete-sent drained the spool"
    app = next(span for _, span in receiver.received.spans() if span.name == "application")
    assert app.events[0].name == "telemetry_initialization"


def test_replay_of_the_embedded_default_file_and_a_failed_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # read by the exporter replay builds
    result = run_python(JOB, tmp_path, TRAINTEL_EXPORT_ITERATIONS="all")
    assert result.returncode == 0, result.stderr
    runs = tmp_path / "traintel-runs"
    produced = sorted(s.span_id for s in iter_spans([runs]))
    # Nothing listening: the replay says where it stopped and fails, deleting nothing.
    assert main(["replay", str(runs), "--endpoint", f"http://127.0.0.1:{_free_port()}",
                 "--protocol", "http/protobuf", "--delete-sent"]) == 1  # fmt: skip
    assert "stopped at" in capsys.readouterr().out
    assert sorted(s.span_id for s in iter_spans([runs])) == produced
    with HttpReceiver() as receiver:
        assert (
            main(["replay", str(runs), "--endpoint", receiver.endpoint, "--protocol", "http/protobuf"]) == 0
        )
    out = capsys.readouterr().out
    assert "metrics request(s) (metrics are not replayed)" in out
    assert sorted(span.span_id.hex() for _, span in receiver.received.spans()) == produced
