"""``traintel replay`` when things go wrong, against real receivers: a collector that goes down
partway, one that rejects a batch, spooled batches that are corrupt or invalid, and a directory
holding the same spans in a spool and a file. Every run is compared by span id: nothing lost
uncounted, nothing sent twice, and the exit status says whether everything was delivered."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.otlp_receiver import GrpcReceiver, HttpReceiver, Received, has_span_named
from traintel.cli import main
from traintel.exporters.file import OtlpJsonFileSpanExporter
from traintel.exporters.otlp_json import request_to_json_line
from traintel.exporters.spool import Spool, read_batch

pytestmark = [pytest.mark.server]  # the suite's tiers: tests/tiers.py

Receiver = type[GrpcReceiver] | type[HttpReceiver]
RECEIVERS = pytest.mark.parametrize(
    ("protocol", "receiver_class"), [("grpc", GrpcReceiver), ("http/protobuf", HttpReceiver)]
)


@pytest.fixture(autouse=True)
def _short_exporter_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # read by the exporter replay builds


def _spans(count: int, poison_at: int | None = None) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "replayed"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(count):
        tracer.start_span("poison" if i == poison_at else f"s{i}").end()
    return list(memory.get_finished_spans())


def _write_file(path: Path, spans: list[ReadableSpan], per_line: int = 100) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    exporter = OtlpJsonFileSpanExporter(path)
    for start in range(0, len(spans), per_line):
        exporter.export(spans[start : start + per_line])
    exporter.shutdown()


def _ids(spans: list[ReadableSpan]) -> list[str]:
    return sorted(f"{s.context.span_id:016x}" for s in spans)


def _arrived(received: Received) -> collections.Counter[str]:
    return collections.Counter(span.span_id.hex() for _, span in received.spans())


def _replay(paths: list[Path], receiver: GrpcReceiver | HttpReceiver, protocol: str, *flags: str) -> int:
    return main(["replay", *map(str, paths), "--endpoint", receiver.endpoint, "--protocol", protocol, *flags])


@RECEIVERS
def test_a_replay_stopped_by_an_outage_resumes_where_it_stopped(
    tmp_path: Path, protocol: str, receiver_class: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = _spans(2000)
    _write_file(tmp_path / "runs" / "job.otlp.jsonl", spans)
    with receiver_class() as receiver:
        receiver.fail_after(2)  # two batches of 512 arrive, then the collector goes down
        assert _replay([tmp_path / "runs"], receiver, protocol) == 1
        out = capsys.readouterr().out
        assert "replayed 1024 span(s)" in out and "stopped at" in out and "run the same command again" in out
        # an outage, not a throttle (before: "the collector asks to wait (gRPC UNAVAILABLE)")
        assert "asks to wait" not in out and "the collector is unavailable (" in out, out
        receiver.fail_after(None)  # back up
        assert _replay([tmp_path / "runs"], receiver, protocol) == 0
        out = capsys.readouterr().out
        assert "replayed 976 span(s)" in out and "1024 span(s) delivered by an earlier replay" in out
        arrived = _arrived(receiver.received)
        assert sorted(arrived) == _ids(spans) and set(arrived.values()) == {1}, "each span once"
        # A third replay to the same endpoint sends nothing, and says so.
        assert _replay([tmp_path / "runs" / "job.otlp.jsonl"], receiver, protocol) == 0
        assert "replayed 0 span(s)" in capsys.readouterr().out
        assert sum(_arrived(receiver.received).values()) == 2000


def test_a_directory_with_the_same_spans_spooled_and_in_a_file_sends_each_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job exporting to a collector and to the embedded default: the spool holds what the
    collector missed, the file holds everything."""
    spans = _spans(300)
    _write_file(tmp_path / "runs" / "job.otlp.jsonl", spans)
    spool = Spool(tmp_path / "runs" / "spool" / "job-otlp", max_bytes=10_000_000)
    spool.put(encode_spans(spans[100:150]), 50)
    spool.put(encode_spans(spans[200:260]), 60)
    with HttpReceiver() as receiver:
        assert _replay([tmp_path / "runs"], receiver, "http/protobuf", "--delete-sent") == 0
    out = capsys.readouterr().out
    assert "replayed 300 span(s)" in out and "110 span(s) both spooled and in a file: sent once" in out
    arrived = _arrived(receiver.received)
    assert sorted(arrived) == _ids(spans) and set(arrived.values()) == {1}
    assert not list((tmp_path / "runs").rglob("*.otlp.*")), "all delivered: --delete-sent removed them"


@RECEIVERS
def test_a_batch_the_collector_rejects_is_set_aside_and_the_replay_goes_on(
    tmp_path: Path, protocol: str, receiver_class: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = _spans(1500, poison_at=700)
    _write_file(tmp_path / "runs" / "job.otlp.jsonl", spans)
    with receiver_class(reject=has_span_named("poison")) as receiver:
        assert _replay([tmp_path / "runs"], receiver, protocol, "--delete-sent") == 1
        out = capsys.readouterr().out
        [aside] = (tmp_path / "runs" / "quarantine").iterdir()
        assert "not delivered: 512 span(s) rejected by the collector" in out and str(aside) in out
        assert "run the same command again" not in out, "not an outage"
        assert (tmp_path / "runs" / "job.otlp.jsonl").exists(), "not all delivered: kept"
        set_aside = [
            s.span_id.hex()
            for rs in read_batch(aside).resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]
        assert sorted([*_arrived(receiver.received), *set_aside]) == _ids(spans)
        assert len(set_aside) == 512  # the second batch (spans 512-1023), the first and third arrived
        # Again: only the set-aside batch is tried (and refused) again; nothing else is re-sent.
        before = sum(_arrived(receiver.received).values())
        assert _replay([tmp_path / "runs"], receiver, protocol) == 1
        assert sum(_arrived(receiver.received).values()) == before
        assert "rejected by the collector" in capsys.readouterr().out


def test_corrupt_and_invalid_spooled_batches_are_set_aside_never_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = _spans(40)
    directory = tmp_path / "spool" / "job-otlp"
    spool = Spool(directory, max_bytes=10_000_000)
    entries = [spool.put(encode_spans(spans[i : i + 10]), 10) for i in range(0, 40, 10)]
    assert all(entries)
    corrupt, invalid = entries[1], entries[2]
    assert corrupt is not None and invalid is not None
    corrupt.path.write_bytes(b"\xff" * 40)  # does not decode
    request = read_batch(invalid.path)
    request.resource_spans[0].scope_spans[0].spans[3].status.code = 7  # type: ignore[assignment]
    invalid.path.write_bytes(request.SerializeToString())  # decodes; no span has status 7
    with HttpReceiver() as receiver:
        assert _replay([directory], receiver, "http/protobuf", "--delete-sent") == 1
    out = capsys.readouterr().out
    # The invalid span is set aside alone; the 9 others of its batch are sent.
    assert "replayed 29 span(s)" in out and "not sent: 2 unreadable" in out
    assert sorted(_arrived(receiver.received)) == _ids(spans[:10] + spans[20:23] + spans[24:])
    kept = sorted(p.name for p in (directory / "quarantine").iterdir())
    assert kept == sorted([corrupt.path.name, "batch-000000000004-1spans.otlp.pb"]), (
        "moved aside, not deleted"
    )
    [alone] = read_batch(directory / "quarantine" / kept[1]).resource_spans[0].scope_spans[0].spans
    assert alone.span_id.hex() == _ids(spans[23:24])[0] and alone.status.code == 7
    assert not list(directory.glob("*.otlp.pb")), "the delivered batches were deleted"


def test_an_emptied_spooled_batch_is_set_aside_not_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = _spans(30)
    directory = tmp_path / "spool" / "job-otlp"
    spool = Spool(directory, max_bytes=10_000_000)
    entries = [spool.put(encode_spans(spans[i : i + 10]), 10) for i in range(0, 30, 10)]
    emptied = entries[1]
    assert emptied is not None
    emptied.path.write_bytes(b"")
    with HttpReceiver() as receiver:
        assert _replay([directory], receiver, "http/protobuf", "--delete-sent") == 1
    out = capsys.readouterr().out
    assert "cannot be read back (0 span(s) in it, written with 10)" in out, out
    assert sorted(_arrived(receiver.received)) == _ids(spans[:10] + spans[20:])
    assert (directory / "quarantine" / emptied.path.name).is_file(), "kept, not deleted as delivered"


def test_a_line_holding_an_invalid_span_sends_the_rest_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = _spans(30)
    good = encode_spans(spans[:10])
    bad = encode_spans(spans[10:20])
    bad.resource_spans[0].scope_spans[0].spans[0].status.code = 9  # type: ignore[assignment]
    path = tmp_path / "job.otlp.jsonl"
    path.write_text("\n".join(request_to_json_line(r) for r in (good, bad, encode_spans(spans[20:]))) + "\n")
    with HttpReceiver() as receiver:
        assert _replay([path], receiver, "http/protobuf", "--delete-sent") == 1
    out = capsys.readouterr().out
    assert "replayed 29 span(s)" in out and "not sent: 1 unreadable" in out and "'s10'" in out
    assert sorted(_arrived(receiver.received)) == _ids(spans[:10] + spans[11:])
    assert path.exists(), "a file with a span not delivered is kept"
