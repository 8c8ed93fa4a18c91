"""The embedded default: OTLP/JSON lines written, read back with the proto classes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, StatusCode

from tests.subprocess_helpers import run_python
from traintel.exporters.file import OtlpJsonFileMetricExporter, OtlpJsonFileSpanExporter, OtlpJsonLinesFile
from traintel.exporters.reader import ReadStats, iter_metric_requests, iter_spans, read_requests


def _providers(tmp_path: Path) -> tuple[TracerProvider, MeterProvider, OtlpJsonLinesFile]:
    file = OtlpJsonLinesFile(output_dir=tmp_path)
    resource = Resource({"service.name": "unit/test job", "ml.training.rank": 1})
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileSpanExporter(file=file)))
    reader = PeriodicExportingMetricReader(
        OtlpJsonFileMetricExporter(file=file), export_interval_millis=10**9
    )
    meter_provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
    return tracer_provider, meter_provider, file


def test_spans_round_trip_with_hex_ids(tmp_path: Path) -> None:
    tracer_provider, meter_provider, file = _providers(tmp_path)
    tracer = tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("root", start_time=1_000):
        child = tracer.start_span("child", attributes={"a": 1, "b": [1.5, 2.5], "c": "x"}, start_time=2_000)
        child.add_event("evt", {"k": True}, timestamp=2_500)
        child.set_status(StatusCode.ERROR, "broken")
        child.end(end_time=3_000)
        linked = tracer.start_span("linked", links=[Link(child.get_span_context())], start_time=3_100)
        linked.end(end_time=3_200)
    meter_provider.get_meter("m").create_counter("things").add(3, {"kind": "a"})
    meter_provider.shutdown()
    tracer_provider.shutdown()

    assert file.path is not None
    assert file.path.parent == tmp_path
    assert file.path.name.startswith("unit_test_job-") and file.path.name.endswith(
        f"-{os.getpid()}.otlp.jsonl"
    )
    assert stat.S_IMODE(file.path.stat().st_mode) == 0o600

    first_line = json.loads(file.path.read_text().splitlines()[0])
    raw_span = first_line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert raw_span["traceId"] == format(child.get_span_context().trace_id, "032x")  # hex, per OTLP/JSON
    assert raw_span["spanId"] == format(child.get_span_context().span_id, "016x")

    spans = {s.name: s for s in iter_spans([tmp_path])}
    assert set(spans) == {"root", "child", "linked"}
    read_child = spans["child"]
    assert read_child.span_id == format(child.get_span_context().span_id, "016x")
    assert read_child.parent_span_id == spans["root"].span_id
    assert spans["root"].parent_span_id is None
    assert (read_child.start_ns, read_child.end_ns) == (2_000, 3_000)
    assert read_child.attributes == {"a": 1, "b": [1.5, 2.5], "c": "x"}
    assert read_child.events[0].name == "evt" and read_child.events[0].time_ns == 2_500
    assert read_child.events[0].attributes == {"k": True}
    assert read_child.is_error and read_child.status_message == "broken"
    assert spans["linked"].links == ((read_child.trace_id, read_child.span_id),)
    assert read_child.resource == {"service.name": "unit/test job", "ml.training.rank": 1}

    metrics = list(iter_metric_requests([tmp_path]))
    names = {
        m.name for r in metrics for rm in r.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert names == {"things"}


def test_reader_skips_bad_and_truncated_lines(tmp_path: Path) -> None:
    tracer_provider, meter_provider, file = _providers(tmp_path)
    tracer = tracer_provider.get_tracer("t")
    tracer.start_span("one").end()
    tracer.start_span("two").end()
    meter_provider.shutdown()
    tracer_provider.shutdown()
    assert file.path is not None
    good = file.path.read_text()
    broken = tmp_path / "broken.otlp.jsonl"
    broken.write_text(
        "not json\n"
        + '{"something": "else"}\n'
        + "[1, 2]\n"
        + '{"resourceSpans": [{"resource": 5}]}\n'
        + good
        + good.splitlines()[0][: len(good) // 3]  # a crash mid-write: truncated last line
    )
    stats = ReadStats()
    names = [s.name for s in iter_spans([broken], stats)]
    assert names == ["one", "two"]
    assert stats.skipped == 5
    assert stats.lines == 2
    assert any("truncated last line" in reason for reason in stats.reasons)
    assert any("not JSON" in reason for reason in stats.reasons)


def test_reader_reports_missing_files(tmp_path: Path) -> None:
    stats = ReadStats()
    assert list(read_requests([tmp_path / "nope.otlp.jsonl"], stats)) == []
    assert stats.skipped == 1 and "cannot open" in stats.reasons[0]


def test_unwritable_destination_reports_once_and_fails_export(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    file = OtlpJsonLinesFile(output_dir=blocker / "sub")
    exporter = OtlpJsonFileSpanExporter(file=file)
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    for _ in range(3):
        tracer_provider.get_tracer("t").start_span("s").end()
    assert caplog.text.count("cannot write telemetry file") == 1
    assert file.lines_written == 0


def test_shared_file_closes_after_last_exporter(tmp_path: Path) -> None:
    file = OtlpJsonLinesFile(output_dir=tmp_path)
    spans = OtlpJsonFileSpanExporter(file=file)
    metrics = OtlpJsonFileMetricExporter(file=file)
    spans.shutdown()
    spans.shutdown()  # idempotent: must not release twice
    assert file.write_line('{"resourceSpans":[]}', "svc")
    metrics.shutdown()
    assert not file.write_line('{"resourceSpans":[]}', "svc")


def test_disk_full_reports_once_and_otlp_export_is_unaffected(caplog: pytest.LogCaptureFixture) -> None:
    """The file exporter writes to /dev/full (every write fails with ENOSPC) next to a real OTLP
    exporter: training runs to the end, one clear error, the collector gets every span."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    import traintel
    from tests.otlp_receiver import GrpcReceiver

    with GrpcReceiver() as receiver:
        file = OtlpJsonLinesFile(path="/dev/full")
        traintel.configure(
            span_exporters=[
                OtlpJsonFileSpanExporter(file=file),
                OTLPSpanExporter(receiver.endpoint, insecure=True),
            ],
            metric_readers=[],
            export_iterations="all",
        )
        with traintel.application(), traintel.training_loop():
            for n in range(5):
                with traintel.training_iteration(n), traintel.model_forward():
                    pass
        traintel.shutdown(5)
        names = [span.name for _resource, span in receiver.received.spans()]
    assert names.count("training_iteration") == 5 and "application" in names and "training_loop" in names
    assert caplog.text.count("cannot write telemetry file /dev/full") == 1
    assert "No space left on device" in caplog.text
    assert file.lines_written == 0


def test_a_file_removed_mid_run_is_recreated_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "run.otlp.jsonl"
    file = OtlpJsonLinesFile(path=path)
    exporter = OtlpJsonFileSpanExporter(file=file)
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tracer_provider.get_tracer("t")
    tracer.start_span("before").end()
    path.unlink()
    tracer.start_span("after-1").end()
    path.unlink()
    tracer.start_span("after-2").end()
    assert [s.name for s in iter_spans([path])] == ["after-2"]
    assert caplog.text.count("was removed while in use") == 1
    assert file.lines_written == 3


def test_files_are_owner_only(tmp_path: Path) -> None:
    file = OtlpJsonLinesFile(output_dir=tmp_path / "runs" / "deeper")
    assert file.write_line('{"resourceSpans":[]}', "svc")
    (written,) = (tmp_path / "runs" / "deeper").iterdir()
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "runs" / "deeper").stat().st_mode) == 0o700
    file.close()


def test_everything_traintel_creates_is_owner_only_under_umask_000(tmp_path: Path) -> None:
    """Directories it makes for TRAINTEL_OUTPUT_DIR (parents included), its files, and what the
    CLI writes (--html, export-trace): 0700 / 0600 even when the job runs under umask 000."""
    code = """
import os, subprocess, sys
os.umask(0)
import traintel
traintel.configure()
with traintel.training_loop():
    with traintel.training_iteration():
        pass
traintel.shutdown()
for args in (["report", "a/b/c", "--html", "report.html"], ["export-trace", "a/b/c", "-o", "trace.json"]):
    done = subprocess.run([sys.executable, "-m", "traintel.cli", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
"""
    result = run_python(code, tmp_path, TRAINTEL_OUTPUT_DIR="a/b/c")
    assert result.returncode == 0, result.stderr[-3000:]
    made = [tmp_path / "a", *(tmp_path / "a").rglob("*"), tmp_path / "report.html", tmp_path / "trace.json"]
    assert any(p.suffix == ".jsonl" for p in made)
    for path in made:
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
