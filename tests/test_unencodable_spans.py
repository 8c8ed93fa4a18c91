"""One span no encoder takes as it is (a name holding a lone surrogate, what ``os.fsdecode``
gives for a Latin-1 file name) is mended and counted; the batch it is in is delivered.

A real job makes 1,500 spans with a plain OpenTelemetry tracer, one of them named after a
non-UTF-8 file name, and writes every span id it made. Each encoder is checked by span id
against that list: the embedded file (orjson, then protobuf), OTLP over gRPC and HTTP to a real
receiver, and the spool (collector down for the whole run, then ``traintel replay``).
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.otlp_receiver import GrpcReceiver, HttpReceiver
from tests.subprocess_helpers import run_python
from traintel.cli import main
from traintel.exporters.reader import iter_spans
from traintel.exporters.spool import read_batch, spool_files, spooled_requests

pytestmark = [pytest.mark.process, pytest.mark.server]


def spans_of(request: ExportTraceServiceRequest) -> list[tuple[str, Span]]:
    return [
        (ss.scope.name, span) for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
    ]


SPANS = 1500
BAD = 700
MENDED_NAME = "shard-\ufffd.bin"

JOB = f"""
import os
import traintel
from opentelemetry import trace

traintel.configure()
tracer = trace.get_tracer("user")
ids = []
with traintel.application():
    for i in range({SPANS}):
        name = os.fsdecode(b"shard-\\xe9.bin") if i == {BAD} else "read_shard"
        with tracer.start_as_current_span(name, attributes={{"shard": i}}) as span:
            ids.append(format(span.get_span_context().span_id, "016x"))
with open("ids.txt", "w") as fh:
    fh.write("\\n".join(ids))
print("made", len(ids), flush=True)
"""


def _made(tmp_path: Path) -> list[str]:
    return (tmp_path / "ids.txt").read_text().split("\n")


def _user_spans_in_file(tmp_path: Path) -> dict[str, str]:
    files = sorted((tmp_path / "runs").glob("*.otlp.jsonl"))
    return {s.span_id: s.name for s in iter_spans(files) if s.scope == "user"}


def _check_stderr(stderr: str, exporters: int) -> None:
    """Said once; counted once per exporter that sent it mended."""
    assert stderr.count("was sent with its invalid text replaced by U+FFFD") == 1, stderr
    assert f"{exporters} span(s) exported with invalid text replaced by U+FFFD" in stderr, stderr
    assert "Traceback" not in stderr and "could not encode" not in stderr, stderr


@pytest.mark.parametrize(
    ("protocol", "receiver_class"), [("grpc", GrpcReceiver), ("http/protobuf", HttpReceiver)]
)
def test_one_unencodable_span_costs_no_batch_in_the_file_or_over_otlp(
    tmp_path: Path, protocol: str, receiver_class: type[GrpcReceiver] | type[HttpReceiver]
) -> None:
    with receiver_class() as receiver:
        result = run_python(
            JOB,
            tmp_path,
            OTEL_TRACES_EXPORTER="otlp,traintel_file",
            OTEL_METRICS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        )
    assert result.returncode == 0, result.stderr
    made = _made(tmp_path)
    assert len(made) == SPANS
    in_file = _user_spans_in_file(tmp_path)
    assert sorted(in_file) == sorted(made), f"file: {len(set(made) - set(in_file))} of {SPANS} lost"
    assert in_file[made[BAD]] == MENDED_NAME
    received = collections.Counter(
        span.span_id.hex() for _, span in receiver.received.spans() if span.name != "application"
    )
    assert sorted(received) == sorted(made), f"OTLP: {len(set(made) - set(received))} of {SPANS} lost"
    assert set(received.values()) == {1}
    names = {span.span_id.hex(): span.name for _, span in receiver.received.spans()}
    assert names[made[BAD]] == MENDED_NAME
    _check_stderr(result.stderr, exporters=2)


def test_one_unencodable_span_costs_no_batch_in_the_spool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with GrpcReceiver() as closed:
        port = closed.port  # bound, then closed: nothing listens there during the run
    result = run_python(
        JOB,
        tmp_path,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        TRAINTEL_SHUTDOWN_TIMEOUT="2",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    assert result.returncode == 0, result.stderr
    _check_stderr(result.stderr, exporters=1)
    made = _made(tmp_path)
    [spool] = (tmp_path / "runs" / "spool").iterdir()
    with GrpcReceiver() as receiver:
        code = main(["replay", str(spool), "--endpoint", receiver.endpoint, "--protocol", "grpc"])
    assert code == 0, capsys.readouterr().out
    received = collections.Counter(
        span.span_id.hex() for _, span in receiver.received.spans() if span.name != "application"
    )
    assert sorted(received) == sorted(made), f"spool: {len(set(made) - set(received))} of {SPANS} lost"
    assert set(received.values()) == {1}


def test_a_spooled_span_with_a_9_byte_id_is_set_aside_alone_and_the_rest_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replay: the span that cannot be one is set aside in ``quarantine/`` and counted; every
    other span, before and after it in the same batch and in later batches, is sent once."""
    with GrpcReceiver() as closed:
        port = closed.port
    result = run_python(
        JOB.replace('b"shard-\\\\xe9.bin"', 'b"shard-e.bin"'),
        tmp_path,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        TRAINTEL_SHUTDOWN_TIMEOUT="2",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    assert result.returncode == 0, result.stderr
    [spool] = (tmp_path / "runs" / "spool").iterdir()
    batches = spool_files([spool])
    assert len(batches) >= 3
    request = read_batch(batches[0])
    spans = request.resource_spans[0].scope_spans[0].spans
    bad = spans[len(spans) // 2]
    bad_id = bad.span_id.hex()
    bad.span_id = bad.span_id + b"\x01"  # 9 bytes
    batches[0].write_bytes(request.SerializeToString())
    made = set(_made(tmp_path)) | {
        s.span_id.hex() for r in spooled_requests([spool]) for _, s in spans_of(r) if s.name == "application"
    }
    with GrpcReceiver() as receiver:
        code = main(["replay", str(spool), "--endpoint", receiver.endpoint, "--protocol", "grpc"])
        out = capsys.readouterr().out
        # Again: nothing sent twice, the bad span still not sent, still said.
        again = main(["replay", str(spool), "--endpoint", receiver.endpoint, "--protocol", "grpc"])
    assert code == 1, out
    assert again == 1 and "span id of 9 bytes" in capsys.readouterr().out
    received = collections.Counter(span.span_id.hex() for _, span in receiver.received.spans())
    assert sorted(received) == sorted(made - {bad_id}), f"{len(made - set(received))} not sent"
    assert set(received.values()) == {1}
    assert "span id of 9 bytes, expected 8" in out and "Traceback" not in out, out
    [aside] = (spool / "quarantine").iterdir()
    kept = [s for _, s in spans_of(read_batch(aside))]
    assert [s.span_id for s in kept] == [bytes.fromhex(bad_id) + b"\x01"], "the bad span, alone, kept"
