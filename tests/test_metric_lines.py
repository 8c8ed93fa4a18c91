"""Metric lines read by the offline tools' fast decoder: the same records as the proto path for
every metric kind the SDK writes, the reference path for any other spelling, and what it reads
checked (see ``traintel.exporters.json_records``).

The lines are real: a MeterProvider with an InMemoryMetricReader records a counter, an
up-down counter, a gauge, an explicit-bucket histogram (with exemplars from a recording span)
and an exponential histogram, and traintel's writer prints them as the file exporter does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from tests.subprocess_helpers import run_python
from traintel.exporters import reader
from traintel.exporters.json_records import decode
from traintel.exporters.otlp_json import DecodeError, json_line_to_request, metrics_to_json_line
from traintel.exporters.reader import MetricSeries, MetricsRecord, SpanRecord
from traintel.exporters.records import NotCanonical
from traintel.terminal_text import displayable_line


@pytest.fixture(scope="module")
def line() -> bytes:
    metrics = InMemoryMetricReader()
    provider = MeterProvider(
        resource=Resource.create({"service.name": "lines", "ml.training.rank": 3}),
        metric_readers=[metrics],
        views=[View(instrument_name="exp.*", aggregation=ExponentialBucketHistogramAggregation())],
    )
    meter = provider.get_meter("traintel")
    meter.create_counter("traintel.spans.dropped").add(7, {"reason": "queue_full"})
    meter.create_counter("traintel.spans.dropped").add(2, {"reason": "budget"})
    exported = meter.create_counter("traintel.iterations.exported")
    exported.add(3, {"traintel.exported": True, "b": 1})
    exported.add(997, {"traintel.exported": False, "b": 1})
    meter.create_up_down_counter("traintel.queue.depth").add(-3)
    meter.create_gauge("ml.training.goodput").set(0.875)
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("iteration"):  # exemplars: a trace and span id each
        for value in (0.02, 0.2, 2.0):
            meter.create_histogram("ml.training.iteration.duration", unit="s").record(value)
    for value in (0.5, 1.5, 4.0):
        meter.create_histogram("exp.duration").record(value)
    data = metrics.get_metrics_data()
    assert data is not None
    provider.shutdown()
    return metrics_to_json_line(data).encode()


def _proto_records(text: bytes) -> list[Any]:
    return reader.metrics_records(json_line_to_request(text.decode()))  # type: ignore[arg-type]


def _proto_spans(text: bytes) -> list[Any]:
    return list(reader.spans_in(json_line_to_request(text.decode())))  # type: ignore[arg-type]


def _answer(read: Any, text: bytes) -> object:
    """What ``read`` makes of ``text``: its records, or the type of the error it skips it with."""
    try:
        return read(text)
    except DecodeError as exc:
        return type(exc)


def _fast_records(text: bytes) -> list[Any]:
    kind, records = decode(text)
    assert kind == "metrics"
    return records


def _series(text: bytes) -> dict[str, MetricSeries]:
    (record,) = _fast_records(text)
    return {series.name: series for series in record.metrics}


def test_every_kind_reads_as_the_proto_path_reads_it(line: bytes) -> None:
    tree = orjson.loads(line)
    kinds = {
        next(key for key in metric if key in ("sum", "gauge", "histogram", "exponentialHistogram"))
        for scope in tree["resourceMetrics"][0]["scopeMetrics"]
        for metric in scope["metrics"]
    }
    assert kinds == {"sum", "gauge", "histogram", "exponentialHistogram"}
    assert "exemplars" in line.decode() and "bucketCounts" in line.decode()
    assert _fast_records(line) == _proto_records(line)
    series = _series(line)
    assert series["traintel.spans.dropped"].total == 9.0 and series["traintel.spans.dropped"].kind == "sum"
    assert sorted(series["traintel.iterations.exported"].labelled()) == [  # each attribute set apart
        ("traintel.iterations.exported", 1000.0),
        ("traintel.iterations.exported{b=1,traintel.exported=false}", 997.0),
        ("traintel.iterations.exported{b=1,traintel.exported=true}", 3.0),
    ]
    assert series["traintel.queue.depth"].labelled() == [("traintel.queue.depth", -3.0)]
    assert series["traintel.queue.depth"].total == -3.0
    assert series["ml.training.goodput"].total == 0.875 and series["ml.training.goodput"].kind == "gauge"
    assert series["ml.training.iteration.duration"].kind == "histogram"
    assert series["exp.duration"].kind == "exponential_histogram"
    times = {s.last_time_ns for s in series.values()}
    assert len(times) == 1 and times.pop() > 0  # one collection: every point at its time


def _edited(line: bytes, edit: Any) -> bytes:
    tree = orjson.loads(line)
    for scope in tree["resourceMetrics"][0]["scopeMetrics"]:
        for metric in scope["metrics"]:
            edit(metric)
    return orjson.dumps(tree)


def _first_point(metric: dict[str, Any], kind: str) -> dict[str, Any] | None:
    if kind not in metric:
        return None
    return metric[kind]["dataPoints"][0]  # type: ignore[no-any-return]


def _rename(metric: dict[str, Any]) -> None:
    for kind in ("sum", "gauge"):
        if kind in metric:
            metric[kind]["data_points"] = metric[kind].pop("dataPoints")


def _both_values(metric: dict[str, Any]) -> None:
    point = _first_point(metric, "sum")
    if point is not None:
        point["asInt"] = "1"
        point["asDouble"] = 1.0


def _bad_time(metric: dict[str, Any]) -> None:
    point = _first_point(metric, "gauge")
    if point is not None:
        point["timeUnixNano"] = "soon"


def _two_kinds(metric: dict[str, Any]) -> None:
    if "sum" in metric:
        metric["gauge"] = {"dataPoints": metric["sum"]["dataPoints"]}


def _unknown_field(metric: dict[str, Any]) -> None:
    metric["colour"] = "blue"


@pytest.mark.parametrize(
    "edit",
    [_rename, _both_values, _bad_time, _two_kinds, _unknown_field],
    ids=["snake_case alias", "two value members", "time not a number", "two data members", "unknown field"],
)
def test_any_other_spelling_gets_the_proto_paths_answer(line: bytes, edit: Any) -> None:
    """An alias must not read as "no points", nor two members as one: the fast path declines,
    and the line gets what the proto path gives (records, or a skip with its reason)."""
    edited = _edited(line, edit)
    got = _answer(reader.decode_line, edited)
    assert got == _answer(_proto_records, edited)
    if edit is _rename:  # the alias is valid OTLP/JSON: read, points and all
        assert _series(line)["traintel.spans.dropped"].total == 9.0
        assert got == _proto_records(line)


def test_values_no_analysis_reads_are_not_checked(line: bytes) -> None:
    """Damage in a bucket count, an exemplar or a point attribute is not read: the records are
    those of the undamaged line (the proto path would skip the whole line)."""

    def damage(metric: dict[str, Any]) -> None:
        point = _first_point(metric, "histogram")
        if point is not None:
            point["bucketCounts"][0] = "many"
            point["exemplars"][0]["spanId"] = "NOT-HEX"
            point["attributes"] = [{"key": "x", "value": {"intValue": "one"}}]

    damaged = _edited(line, damage)
    with pytest.raises(DecodeError):
        json_line_to_request(damaged.decode())
    assert reader.decode_line(damaged) == _proto_records(line)


def test_read_for_times_alone_a_line_gives_its_latest_time_and_checks_only_what_it_reads(line: bytes) -> None:
    """Goodput reads metrics lines for their points' times: each record is the full read's
    resource and latest time without series; a spelling the full read declines for a data
    member or a time is declined too (the proto path decides), a damaged value is not read."""
    (full,) = _fast_records(line)
    assert full.last_time_ns == max(s.last_time_ns for s in full.metrics) > 0
    times = [MetricsRecord(full.resource, (), full.last_time_ns)]
    assert decode(line, metric_names=None) == ("metrics", times)
    assert reader.decode_line(line, metric_names=None) == times
    for edit in (_rename, _bad_time, _two_kinds, _unknown_field):
        with pytest.raises(NotCanonical):
            decode(_edited(line, edit), metric_names=None)
    assert decode(_edited(line, _both_values), metric_names=None) == ("metrics", times)
    with pytest.raises(NotCanonical):
        decode(_edited(line, _both_values))


def _gauge_with_two_values(metric: dict[str, Any]) -> None:
    point = _first_point(metric, "gauge")
    if point is not None:
        point["asInt"] = "1"


def test_read_for_named_series_a_line_keeps_them_and_its_latest_time(line: bytes) -> None:
    """The analysis reads traintel's own series alone: the record keeps the series whose names
    start with the prefix, and the latest time of every metric; the proto path (for a line the
    fast path declines) gives the same; a damaged value of another metric is not read."""
    (full,) = _fast_records(line)
    named = MetricsRecord(
        full.resource, tuple(s for s in full.metrics if s.name.startswith("traintel.")), full.last_time_ns
    )
    assert [s.name for s in named.metrics] == [
        "traintel.spans.dropped",
        "traintel.iterations.exported",
        "traintel.queue.depth",
    ]
    assert decode(line, metric_names="traintel.") == ("metrics", [named])
    assert reader.metrics_records(json_line_to_request(line.decode()), "traintel.") == [named]  # type: ignore[arg-type]
    aliased = _edited(line, _rename)  # valid OTLP/JSON the fast path declines: the proto path reads it
    with pytest.raises(NotCanonical):
        decode(aliased, metric_names="traintel.")
    assert reader.decode_line(aliased, metric_names="traintel.") == [named]
    damaged = _edited(line, _gauge_with_two_values)  # ml.training.goodput: not a named series
    with pytest.raises(NotCanonical):
        decode(damaged)
    assert decode(damaged, metric_names="traintel.") == ("metrics", [named])


@pytest.fixture(scope="module")
def span_line() -> bytes:
    """A real span line: a parent and a child with a link, as traintel's writer prints it."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Link

    from traintel.exporters.otlp_json import spans_to_json_line

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = provider.get_tracer("traintel")
    with tracer.start_as_current_span("outer") as outer:
        with tracer.start_as_current_span("inner", links=[Link(outer.get_span_context())]):
            pass
    provider.shutdown()
    return spans_to_json_line(spans.get_finished_spans()).encode()


def _span_edited(line: bytes, edit: Any) -> bytes:
    tree = orjson.loads(line)
    for scope in tree["resourceSpans"][0]["scopeSpans"]:
        for span in scope["spans"]:
            edit(span)
    return orjson.dumps(tree)


def _upper_trace_id(span: dict[str, Any]) -> None:
    span["traceId"] = span["traceId"].upper()


def _odd_span_id(span: dict[str, Any]) -> None:
    span["spanId"] = span["spanId"][:-1]


def _not_hex_parent(span: dict[str, Any]) -> None:
    if "parentSpanId" in span:
        span["parentSpanId"] = "zz" + span["parentSpanId"][2:]


def _upper_link(span: dict[str, Any]) -> None:
    for link in span.get("links", []):
        link["spanId"] = link["spanId"].upper()


@pytest.mark.parametrize(
    "edit",
    [_upper_trace_id, _odd_span_id, _not_hex_parent, _upper_link],
    ids=["uppercase trace id", "odd-length span id", "parent id not hex", "uppercase link id"],
)
def test_ids_of_any_other_spelling_get_the_proto_paths_answer(span_line: bytes, edit: Any) -> None:
    """Ids the fast path does not take as they are (lowercase hex of whole bytes) are left to
    the proto path: its records (ids lowercased) or its skip, never the id as spelled."""
    kind, records = decode(span_line)  # the line as written: the fast path's
    assert kind == "spans" and records == list(reader.spans_in(json_line_to_request(span_line.decode())))
    assert any(span.links for span in records)
    edited = _span_edited(span_line, edit)
    got = _answer(reader.decode_line, edited)
    assert got == _answer(_proto_spans, edited)
    if edit in (_upper_trace_id, _upper_link):  # read, lowercased
        assert isinstance(got, list) and all(span.trace_id.islower() for span in got)
        assert all(link[1].islower() for span in got for link in span.links)


#: A run with what the file holds in a real job: segments linked to each other (links), a
#: checkpoint, an evaluation, a slow iteration and an exception (events), model metrics, metric
#: lines, and its hang watcher's log line none (a clean job).
RUN = """
import time
import traintel
traintel.configure(segment_iterations=20, log_every_n_iterations=10, slow_iteration_factor=2.0)
with traintel.application():
    with traintel.training_loop():
        for i in range(60):
            with traintel.training_iteration(samples=8, tokens=64):
                with traintel.model_forward():
                    time.sleep(0.03 if i == 33 else 0.001)
                traintel.record_metrics(loss=1.0 / (i + 1))
            if i == 40:
                with traintel.checkpoint_save(iteration=i):
                    pass
        with traintel.validation_loop():
            with traintel.validation_iteration():
                pass
    try:
        with traintel.testing_loop():
            raise ValueError("boom")
    except ValueError:
        pass
traintel.shutdown()
"""


@pytest.mark.process
def test_every_line_a_real_run_writes_takes_the_fast_path(tmp_path: Path) -> None:
    """The fast decoder hands a line it does not take to the proto path silently (same records,
    several times slower): a helper missing from it once sent every span line with links there
    with no output changing. Every line traintel writes must be one it takes."""
    result = run_python(RUN, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    lines = [line for path in (tmp_path / "out").glob("*.jsonl") for line in path.read_bytes().splitlines()]
    kinds = [decode(displayable_line(line))[0] for line in lines]  # raises if not
    assert set(kinds) == {"spans", "metrics"}
    spans = [s for line in lines for s in decode(displayable_line(line))[1]
             if isinstance(s, SpanRecord)]  # fmt: skip
    assert any(s.links for s in spans) and any(s.events for s in spans)
    assert {"checkpoint_save_sync", "validation_loop", "testing_loop"} <= {s.name for s in spans}
