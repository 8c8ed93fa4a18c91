"""The embedded default: OTLP/JSON lines written, read back with the proto classes."""

from __future__ import annotations

import json
import math
import os
import stat
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    TraceState,
)

from tests.subprocess_helpers import run_python
from traintel.exporters.file import OtlpJsonFileMetricExporter, OtlpJsonFileSpanExporter, OtlpJsonLinesFile
from traintel.exporters.health import ExportHealth
from traintel.exporters.otlp_json import json_line_to_request, proto_spans_to_json_line, spans_to_json_line
from traintel.exporters.otlp_json_spans import FastPathUnsupported, spans_to_json_bytes
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


def test_processes_of_the_same_pid_and_second_on_two_hosts_write_two_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nodes of a job in containers run their ranks under the same pids, started in the
    same second, into one shared directory: the host in the name keeps their files (and their
    progress marks and spools) apart, where two appenders would interleave in one file."""
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.25)
    paths = []
    for host in ("node-a.cluster.local", "node b/1"):
        monkeypatch.setattr("socket.gethostname", lambda host=host: host)
        paths.append(OtlpJsonLinesFile(output_dir=tmp_path).planned_path("job"))
    pid = os.getpid()
    assert [p.name for p in paths] == [
        f"job-20231114T221320Z-node-a.cluster.local-{pid}.otlp.jsonl",
        f"job-20231114T221320Z-node_b_1-{pid}.otlp.jsonl",
    ]


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
    health = ExportHealth()
    exporter = OtlpJsonFileSpanExporter(file=file, health=health)
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    for _ in range(3):
        tracer_provider.get_tracer("t").start_span("s").end()
    assert caplog.text.count("cannot write telemetry file") == 1
    assert file.lines_written == 0
    assert health.spans_dropped == {"not_written": 3}, "what was lost is counted"


def test_shared_file_closes_after_last_exporter(tmp_path: Path) -> None:
    file = OtlpJsonLinesFile(output_dir=tmp_path)
    spans = OtlpJsonFileSpanExporter(file=file)
    metrics = OtlpJsonFileMetricExporter(file=file)
    spans.shutdown()
    spans.shutdown()  # idempotent: must not release twice
    assert file.write_line('{"resourceSpans":[]}', "svc")
    metrics.shutdown()
    assert not file.write_line('{"resourceSpans":[]}', "svc")


@pytest.mark.server
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
                OtlpJsonFileSpanExporter(file=file, health=ExportHealth()),  # the process's stays clean
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


_READER_INTERVALS = """
import traintel
from traintel._sdk import otel_private
telemetry = traintel.configure()
for reader in otel_private.periodic_readers(telemetry.pipeline.meter_provider):
    print(type(reader._exporter.inner).__name__, reader._export_interval_millis)
traintel.shutdown(1)
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"OtlpJsonFileMetricExporter": 300_000.0}),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "60000"}, {"OtlpJsonFileMetricExporter": 60_000.0}),
        (
            {
                "OTEL_METRICS_EXPORTER": "otlp,traintel_file",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:9",
            },
            {"OTLPMetricExporter": 60_000.0, "OtlpJsonFileMetricExporter": 300_000.0},
        ),
    ],
)
@pytest.mark.process
def test_the_file_collects_every_five_minutes_unless_the_interval_is_set(
    tmp_path: Path, env: dict[str, str], expected: dict[str, float]
) -> None:
    """The file's metric lines are read for their last values: one every 5 minutes keeps the
    file within its volume budget; a set OTEL_METRIC_EXPORT_INTERVAL and other exporters are
    the SDK's."""
    result = run_python(_READER_INTERVALS, tmp_path, OTEL_TRACES_EXPORTER="none", **env)
    assert result.returncode == 0, result.stderr
    readers = {line.split()[0]: float(line.split()[1]) for line in result.stdout.splitlines()}
    assert readers == expected


_LIVES_ON = """
import time, traintel
from traintel.exporters.reader import iter_spans
with traintel.application(), traintel.training_loop():
    for _ in range(3):
        with traintel.training_iteration():
            pass
# the process goes on (a notebook, a script that evaluates next): the file is read meanwhile
path = traintel.get_telemetry().pipeline.output_file()
deadline = time.monotonic() + 60  # a hang guard (the batch is due in 10 minutes)
while time.monotonic() < deadline:
    names = sorted({s.name for s in iter_spans([path])}) if path.exists() else []
    if "application" in names:
        break
    time.sleep(0.05)
print(names)
"""


@pytest.mark.process
def test_an_application_s_spans_are_in_the_file_as_it_ends(tmp_path: Path) -> None:
    """The file's batch gathers spans for a long time (a minute by default; 10 minutes here):
    a process that lived on after training (a notebook, a script that evaluates or uploads
    next) read as "No spans yet" until it was due, and lost them if killed meanwhile. The
    application's end writes them, off the training thread; the network exporters keep their
    schedule."""
    result = run_python(_LIVES_ON, tmp_path, OTEL_BSP_SCHEDULE_DELAY="600000")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == str(
        ["application", "training_iteration", "training_loop", "training_window"]
    )


def test_files_are_owner_only(tmp_path: Path) -> None:
    file = OtlpJsonLinesFile(output_dir=tmp_path / "runs" / "deeper")
    assert file.write_line('{"resourceSpans":[]}', "svc")
    (written,) = (tmp_path / "runs" / "deeper").iterdir()
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "runs" / "deeper").stat().st_mode) == 0o700
    file.close()


@pytest.mark.process
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


@pytest.mark.process
def test_what_the_cli_writes_replaces_a_planted_symlink_and_is_owner_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report --html`` and ``export-trace -o`` at a path where a symbolic link points to
    another file (0644): the link is replaced by a fresh 0600 file; the file it pointed to keeps
    its content and mode. An existing 0644 file at the path is replaced by a 0600 one."""
    from traintel.cli import main

    result = run_python(
        "import traintel\nwith traintel.training_loop():\n    with traintel.training_iteration():\n"
        "        pass\n",
        tmp_path,
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    assert result.returncode == 0, result.stderr
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    victim.chmod(0o644)
    for argv, output in (
        (["report", str(tmp_path / "runs"), "--html"], tmp_path / "report.html"),
        (["export-trace", str(tmp_path / "runs"), "-o"], tmp_path / "trace.json"),
    ):
        output.symlink_to(victim)
        assert main([*argv, str(output)]) == 0, capsys.readouterr()
        assert not output.is_symlink() and output.stat().st_size > 0
        assert stat.S_IMODE(output.stat().st_mode) == 0o600
        assert victim.read_text() == "not yours" and stat.S_IMODE(victim.stat().st_mode) == 0o644
        output.chmod(0o644)  # an existing file, readable by others: replaced, owner-only
        assert main([*argv, str(output)]) == 0
        assert stat.S_IMODE(output.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


# --- the direct span encoder against the reference (SDK proto request + json_format) -----------


class _Float64(float):
    """What numpy.float64 is to the SDK: a float subclass, kept as it is in attributes."""


_EVERY_VALUE: dict[str, Any] = {
    "str": "plain",
    "str.empty": "",
    "str.non_ascii": "日本語 ✓ é ß 🚀",
    "str.escapes": 'quote" backslash\\ newline\n tab\t bell\x07 nul\x00 \u2028',
    "bool.true": True,
    "bool.false": False,
    "int.zero": 0,
    "int.negative": -17,
    "int.max": 2**63 - 1,
    "int.min": -(2**63),
    "int.beyond_double": 2**53 + 1,
    "int.enum": HTTPStatus.OK,
    "float.zero": 0.0,
    "float.negative_zero": -0.0,
    "float.plain": 1.5,
    "float.tiny": 5e-324,
    "float.small": 1e-7,
    "float.huge": 1.7976931348623157e308,
    "float.third": 1 / 3,
    "float.nan": math.nan,
    "float.inf": math.inf,
    "float.neg_inf": -math.inf,
    "float.subclass": _Float64(0.125),
    "array.str": ("a", "", "ü"),
    "array.bool": (True, False),
    "array.int": (0, 2**63 - 1, -(2**63)),
    "array.float": (0.5, math.nan, -math.inf, 1e300),
    "array.empty": (),
}


def _tracer_provider(
    exporter: InMemorySpanExporter, resource: Resource, limits: SpanLimits | None = None
) -> TracerProvider:
    provider = TracerProvider(resource=resource, span_limits=limits, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _rich_spans() -> list[ReadableSpan]:
    """Real SDK spans with everything an OTLP span can carry, over several resources and
    scopes (two equal resources in distinct objects among them), in interleaved order."""
    exporter = InMemorySpanExporter()
    main_resource = Resource(
        {"service.name": "svc-ä", "ml.training.rank": 3, "tags": ("x", "y"), "ratio": 0.25},
        "https://opentelemetry.io/schemas/1.21.0",
    )
    main = _tracer_provider(exporter, main_resource)
    other = _tracer_provider(exporter, Resource({"service.name": "other"}))
    other_twin = _tracer_provider(exporter, Resource({"service.name": "other"}))
    bare = _tracer_provider(exporter, Resource({}))
    limited = _tracer_provider(
        exporter,
        Resource({"service.name": "limited"}),
        SpanLimits(
            max_span_attributes=2, max_events=1, max_links=1, max_event_attributes=1, max_link_attributes=1
        ),
    )
    versioned = main.get_tracer(
        "scope.versioned",
        "1.2.3",
        schema_url="https://example.com/schema/2",
        attributes={"scope.attr": "s", "n": 4},
    )
    plain = main.get_tracer("scope.plain")
    nameless = bare.get_tracer("")

    remote_parent = SpanContext(
        trace_id=2**128 - 1,
        span_id=2**64 - 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1"), ("other", "x.y-z")]),
    )
    linked_to = SpanContext(
        1, 2, is_remote=True, trace_flags=TraceFlags(0), trace_state=TraceState([("k", "v")])
    )

    with versioned.start_as_current_span(
        "root ✓", kind=SpanKind.SERVER, attributes=_EVERY_VALUE, start_time=1_000
    ) as root:
        root.add_event("started", {"attempt": 1, "who": "ü", "ok": True}, timestamp=1_100)
        root.add_event("bare event", timestamp=1_200)
        root.add_event("", {"e.float": math.nan})
        root.set_status(StatusCode.ERROR, "broken: ✗")
        for kind in SpanKind:
            plain.start_span(f"kind {kind.name}", kind=kind, start_time=1_300).end(end_time=1_400)
        other.get_tracer("other.scope").start_span("other 1").end()
        child = versioned.start_span(
            "child", links=[Link(root.get_span_context(), {"link.attr": 7}), Link(linked_to)]
        )
        child.set_status(StatusCode.OK)
        child.end()
    other_twin.get_tracer("other.scope").start_span("other twin, same group").end()
    under_remote = plain.start_span(
        "under a remote parent", context=trace.set_span_in_context(NonRecordingSpan(remote_parent))
    )
    under_remote.set_status(StatusCode.ERROR)
    under_remote.end()
    nameless.start_span("", start_time=0).end(end_time=0)
    dropping = limited.get_tracer("limited").start_span(
        "over the limits",
        attributes={"a": 1, "b": 2, "c": 3, "d": 4},
        links=[Link(remote_parent), Link(linked_to, {"l1": 1, "l2": 2})],  # the oldest goes
    )
    dropping.add_event("e1")
    dropping.add_event("e2", {"x": 1, "y": 2})
    dropping.end()
    spans = list(exporter.get_finished_spans())
    # A span with no instrumentation scope at all (constructed, as a replay or a bridge may).
    spans.append(
        ReadableSpan(
            "scopeless",
            context=SpanContext(3, 4, is_remote=False),
            parent=SpanContext(3, 0, is_remote=False),
            resource=main_resource,
            instrumentation_scope=None,
            start_time=10,
            end_time=20,
        )
    )
    spans.append(
        ReadableSpan(
            "scoped twin",
            context=SpanContext(5, 6, is_remote=False),
            resource=Resource({"service.name": "other"}),
            instrumentation_scope=InstrumentationScope("other.scope"),
            start_time=30,
            end_time=40,
        )
    )
    for provider in (main, other, other_twin, bare, limited):
        provider.shutdown()
    return spans


def test_rich_spans_cover_what_the_comparison_needs() -> None:
    """Guards the fixture: a comparison over spans that lack a feature proves nothing about it."""
    spans = _rich_spans()
    tree = json.loads(proto_spans_to_json_line(spans))
    text = json.dumps(tree)
    for needle in (
        '"droppedAttributesCount": 2',
        '"droppedEventsCount": 1',
        '"droppedLinksCount": 1',
        '"traceState": "vendor=v1,other=x.y-z"',
        '"flags": 768',
        '"schemaUrl"',
        '"scope": {}',
        '"resource": {}',
        '"arrayValue": {}',
        '"NaN"',
        '"-Infinity"',
        '"intValue": "-9223372036854775808"',
        '"code": 2',
        '"message": "broken: \\u2717"',
    ):
        assert needle in text, needle
    assert len(tree["resourceSpans"]) == 4  # main, other (+ its twins), bare, limited
    (limited,) = (
        span
        for rs in tree["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
        if span.get("name") == "over the limits"
    )
    assert limited["events"][0]["droppedAttributesCount"] == 1
    assert limited["links"][0]["droppedAttributesCount"] == 1
    assert {span.kind for span in spans} == set(SpanKind)


def test_direct_span_encoding_matches_the_proto_encoding() -> None:
    spans = _rich_spans()
    new_line = spans_to_json_line(spans)
    assert new_line == spans_to_json_bytes(spans).decode()  # the fast path, not its fallback
    assert "\n" not in new_line  # one request, one line
    assert "日本語 ✓" in new_line  # UTF-8 as before (ensure_ascii=False), not escaped
    assert json.loads(new_line) == json.loads(proto_spans_to_json_line(spans))
    assert json_line_to_request(new_line) == encode_spans(spans)


def test_direct_span_encoding_matches_field_order_too() -> None:
    """Not needed by any reader, but it keeps old and new lines diffable by eye: once parsed
    and printed again (which evens out float spellings, 1e-7 against 1e-07), they are the same
    text."""
    spans = _rich_spans()
    new, old = json.loads(spans_to_json_line(spans)), json.loads(proto_spans_to_json_line(spans))
    assert json.dumps(new) == json.dumps(old)


@pytest.mark.parametrize(
    ("attributes", "why"),
    [
        ({"ok": 1, "too_big": 2**63}, "int beyond int64"),
        ({"ok": 1, "with_none": (1, None, 3)}, "None inside an array"),
        ({"ok": 1, "surrogate": "\ud800"}, "not valid Unicode"),
    ],
)
def test_values_the_fast_path_leaves_to_the_sdk_encode_as_before(
    attributes: dict[str, Any], why: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = _tracer_provider(exporter, Resource({"service.name": "edge"}))
    provider.get_tracer("t").start_span("edge", attributes=attributes).end()
    spans = exporter.get_finished_spans()
    with pytest.raises(FastPathUnsupported):
        spans_to_json_bytes(spans)
    assert spans_to_json_line(spans) == proto_spans_to_json_line(spans), why


_FULL_DISK_JOB = """
import os, resource, signal
import traintel
from opentelemetry import trace

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write over the limit fails with EFBIG instead
telemetry = traintel.configure()
tracer = trace.get_tracer("user")

def stretch(name):
    ids = []
    for i in range(200):
        with tracer.start_as_current_span(name) as span:
            ids.append(format(span.get_span_context().span_id, "016x"))
    telemetry.flush()
    with open(name + ".ids", "w") as fh:
        fh.write("\\n".join(ids))

with traintel.application():
    stretch("before")
    size = os.path.getsize(telemetry.output_file)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4000, hard))  # the disk fills mid-line
    stretch("during")
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # and frees up
    stretch("after")
print("done", flush=True)
"""


@pytest.mark.process
def test_a_line_cut_by_a_full_disk_is_truncated_counted_and_said(tmp_path: Path) -> None:
    """A real job whose file size limit (RLIMIT_FSIZE: the kernel cuts the write, as a full disk
    does) lets only 4,000 bytes of a 200-span line through, then is lifted: the cut line is
    truncated away, so the next line is whole; the 200 spans are counted and said, by the
    process's own figures; every line of the file reads back."""
    result = run_python(
        _FULL_DISK_JOB,
        tmp_path,
        OTEL_TRACES_EXPORTER="traintel_file",
        OTEL_METRICS_EXPORTER="none",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    assert result.returncode == 0, result.stderr
    ids = {name: (tmp_path / f"{name}.ids").read_text().split("\n") for name in ("before", "during", "after")}
    stats = ReadStats()
    in_file = [s.span_id for s in iter_spans(sorted((tmp_path / "runs").glob("*.otlp.jsonl")), stats)]
    assert stats.skipped == 0, stats.reasons
    assert sorted(set(in_file) & set(ids["before"] + ids["after"])) == sorted(ids["before"] + ids["after"])
    assert not set(in_file) & set(ids["during"])
    assert len(in_file) == 401  # and the application span
    assert result.stderr.count("cannot write telemetry file") == 1, result.stderr
    assert "is writable again; 1 line(s) could not be written meanwhile" in result.stderr
    assert "200 span(s) dropped (not_written 200)" in result.stderr, result.stderr
