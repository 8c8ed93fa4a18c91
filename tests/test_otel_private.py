"""Every fast path over OpenTelemetry's internals (``traintel._sdk.otel_private``) does what the
public API does, on behaviour: the context the API sees and propagates, and the exported OTLP
bytes. Each also has a public fallback, checked to give the same results."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import pytest
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from traintel._sdk import otel_private as private
from traintel._sdk.ids import ForcingIdGenerator

WINDOW: dict[str, AttributeValue] = {
    **{f"ml.training.window.value{i}": i / 7 for i in range(50)},
    "ml.training.window.iterations": 50,
    "ml.training.window.final": True,
    "ml.training.throughput.aggregation": "rank x world_size (1)",
}


# --- context -------------------------------------------------------------------------------------
def test_the_default_runtime_context_takes_the_fast_path() -> None:
    assert private.CONTEXT_FAST  # what these tests, and every default job, run on


def test_with_span_and_current_span_match_the_api() -> None:
    span = NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(1)))
    base = context_api.set_value("user-key", "value", Context())
    ours = private.with_span(span, base)
    theirs = trace.set_span_in_context(span, base)
    assert ours == theirs and type(ours) is type(theirs)
    assert base == {"user-key": "value"}  # the base context is not mutated
    assert private.current_span(ours) is trace.get_current_span(theirs) is span
    assert private.current_span(Context()) is trace.get_current_span(Context()) is INVALID_SPAN


@pytest.fixture
def propagated() -> Iterator[dict[str, str]]:
    """What the W3C propagator injects while a span attached through the fast path is current."""
    span = NonRecordingSpan(SpanContext(0xABC, 0xDEF, True, TraceFlags(0x03), trace.TraceState([("v", "1")])))
    token = private.attach(private.with_span(span, private.get_current()))
    carrier: dict[str, str] = {}
    try:
        assert trace.get_current_span() is span
        assert private.get_current() is context_api.get_current()
        api_token = context_api.attach(context_api.set_value("k", 1))  # nesting with the API works
        assert trace.get_current_span() is span
        TraceContextTextMapPropagator().inject(carrier)
        context_api.detach(api_token)
    finally:
        private.detach(token)
    yield carrier


def test_a_context_attached_through_the_fast_path_is_what_the_api_propagates(
    propagated: dict[str, str],
) -> None:
    assert propagated == {
        "traceparent": "00-00000000000000000000000000000abc-0000000000000def-03",
        "tracestate": "v=1",
    }
    assert trace.get_current_span() is INVALID_SPAN  # detached: the context before is back


# --- SDK span storage ----------------------------------------------------------------------------
def _two_spans(limits: SpanLimits | None = None) -> tuple[ReadableSpan, ReadableSpan]:
    """The same event and attributes through the public API and through the fast path, with the
    same ids and times."""
    exporter = InMemorySpanExporter()
    ids = ForcingIdGenerator()
    provider = TracerProvider(span_limits=limits, id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for fast in (False, True):
        ids.force(0x1234, 0x5678)
        span = tracer.start_span("window", start_time=1)
        if fast:
            private.add_clean_event(span, "training_metrics_update", WINDOW, timestamp=5)
            private.set_clean_attributes(span, WINDOW)
        else:
            span.add_event("training_metrics_update", WINDOW, timestamp=5)
            span.set_attributes(WINDOW)
        span.end(end_time=9)
    public, fast_span = exporter.get_finished_spans()
    return public, fast_span


def _same(public: ReadableSpan, fast: ReadableSpan) -> None:
    assert encode_spans([fast]).SerializeToString() == encode_spans([public]).SerializeToString()
    assert fast.dropped_attributes == public.dropped_attributes
    ours, theirs = fast.events[0], public.events[0]
    assert type(ours.attributes) is type(theirs.attributes)
    assert ours.dropped_attributes == theirs.dropped_attributes
    with pytest.raises(TypeError):  # event attributes stay immutable, as the SDK makes them
        ours.attributes["x"] = 1  # type: ignore[index]


def test_clean_attributes_and_events_export_the_same_bytes_as_the_public_api() -> None:
    assert private.STORAGE_FAST  # this SDK's layout is the one the fast path was checked against
    public, fast = _two_spans()
    _same(public, fast)
    assert len(fast.attributes or {}) == len(WINDOW)


@pytest.mark.parametrize(
    "limits",
    [
        SpanLimits(max_event_attributes=10, max_span_attributes=12),  # fewer than the window has
        SpanLimits(max_attribute_length=5),  # the aggregation string is longer
        SpanLimits(max_span_attribute_length=5),  # span values only: events keep theirs whole
    ],
)
def test_over_the_span_limits_the_public_api_applies_them(limits: SpanLimits) -> None:
    public, fast = _two_spans(limits)
    _same(public, fast)
    assert (
        public.dropped_attributes
        or public.events[0].dropped_attributes
        or any(isinstance(v, str) and len(v) == 5 for v in (public.attributes or {}).values())
    )


def test_with_the_fast_path_off_the_public_api_gives_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    fast_public, fast = _two_spans()
    monkeypatch.setattr(private, "STORAGE_FAST", False)
    public, fallback = _two_spans()
    assert encode_spans([fallback]).SerializeToString() == encode_spans([fast]).SerializeToString()
    assert encode_spans([public]).SerializeToString() == encode_spans([fast_public]).SerializeToString()


def test_values_that_need_cleaning_take_the_public_api() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("test").start_span("s")
    private.add_clean_event(span, "e", {"list": [1, 2], "n": 1})  # type: ignore[dict-item]
    private.set_clean_attributes(span, {"list": [3, 4]})  # type: ignore[dict-item]
    span.end()
    (finished,) = exporter.get_finished_spans()
    assert finished.events[0].attributes == {"list": (1, 2), "n": 1}  # cleaned to a tuple
    assert finished.attributes == {"list": (3, 4)}


def test_a_span_that_is_not_the_sdks_takes_the_public_api() -> None:
    span = NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(1)))
    private.add_clean_event(span, "e", {"a": 1})  # a no-op span: nothing to store, no error
    private.set_clean_attributes(span, {"a": 1})


def test_an_ended_span_is_not_changed() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("test").start_span("s")
    span.end()
    private.add_clean_event(span, "late", {"a": 1})
    private.set_clean_attributes(span, {"a": 1})
    (finished,) = exporter.get_finished_spans()
    assert not finished.events and not finished.attributes


def test_the_layout_check_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job run with OTEL_TRACES_SAMPLER=always_off or tight OTEL_*_LIMIT settings still gets
    the fast path (which applies the limits of each span it writes to)."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    monkeypatch.setenv("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "1")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "0")
    assert private._storage_agrees()


# --- processors, queues, exporters, ids ----------------------------------------------------------
class _Ending(SpanProcessor):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def _on_ending(self, span: SdkSpan) -> None:
        self.seen.append(span.name)


def test_a_wrapper_passes_the_on_ending_hook_to_the_processors_that_have_one() -> None:
    inner = _Ending()

    class Wrapper(SpanProcessor):
        pass

    wrapper = Wrapper()
    private.forward_on_ending(wrapper, [inner, SimpleSpanProcessor(InMemorySpanExporter())])
    provider = TracerProvider()
    provider.add_span_processor(wrapper)
    provider.get_tracer("test").start_span("ending").end()
    assert inner.seen == (["ending"] if hasattr(SpanProcessor, "_on_ending") else [])


def test_the_batch_queue_is_the_sdks() -> None:
    processor = BatchSpanProcessor(
        InMemorySpanExporter(), max_queue_size=7, max_export_batch_size=7, schedule_delay_millis=60_000
    )
    try:
        queue, bound = private.batch_queue(processor)
        assert isinstance(queue, deque) and bound == 7
        span = TracerProvider().get_tracer("test").start_span("queued")
        span.end()
        processor.on_end(span)  # type: ignore[arg-type]
        assert len(queue) == 1
    finally:
        processor.shutdown()
    assert private.batch_queue(object()) == (None, 0)


def test_a_meter_providers_readers_are_found_and_their_exporters_wrapped() -> None:
    """The readers of a provider someone else built (the distro's), on this release: found
    (1.45 no longer lists them in the provider's configuration) and their exporters wrapped."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    periodic = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=10**9)
    in_memory = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[periodic, in_memory], shutdown_on_exit=False)
    try:
        expected = [periodic, in_memory]
        if hasattr(provider, "add_metric_reader"):
            added = InMemoryMetricReader()
            provider.add_metric_reader(added)
            expected.append(added)
        assert private.periodic_readers(provider) == expected
        wrapped: list[object] = []
        assert private.replace_reader_exporter(periodic, lambda inner: wrapped.append(inner) or inner)
        assert len(wrapped) == 1 and isinstance(wrapped[0], ConsoleMetricExporter)
        assert not private.replace_reader_exporter(in_memory, lambda inner: inner)  # no exporter
    finally:
        provider.shutdown()
    assert private.periodic_readers(object()) is None  # not found: said by the caller
    assert private.span_processors(object()) is None


def test_a_resource_added_to_built_providers_is_what_their_telemetry_carries() -> None:
    """What the public API shows after ``add_resource``: spans of a tracer made after it (and,
    where the SDK keeps its tracers, before it) and a metric collection carry the added
    attributes, the providers' own winning where both have one."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    exporter = InMemorySpanExporter()
    tracers = TracerProvider(
        resource=Resource({"service.name": "distro", "k": "theirs"}), shutdown_on_exit=False
    )
    tracers.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(
        metric_readers=[reader], resource=Resource({"service.name": "distro"}), shutdown_on_exit=False
    )
    early = tracers.get_tracer("early")
    added = Resource({"ml.training.rank": 3, "k": "ours", "service.name": "traintel"})
    assert private.add_resource(tracers, meters, added)
    tracers.get_tracer("late").start_span("late").end()
    early.start_span("early").end()
    meters.get_meter("m").create_counter("c").add(1)
    expected = {"service.name": "distro", "k": "theirs", "ml.training.rank": 3}
    spans = {span.name: dict(span.resource.attributes) for span in exporter.get_finished_spans()}
    assert spans["late"].items() >= expected.items()
    if hasattr(tracers, "_update_resource"):  # (1.40 keeps no tracers: those made before keep theirs)
        assert spans["early"].items() >= expected.items()
    assert dict(tracers.resource.attributes).items() >= expected.items()
    data = reader.get_metrics_data()
    assert data is not None
    assert dict(data.resource_metrics[0].resource.attributes) == {
        "service.name": "distro",
        "ml.training.rank": 3,
        "k": "ours",
    }
    meters.shutdown()
    assert not private.add_resource(object(), None, added)  # not found: said by the caller


def test_a_metric_exporters_preferences_are_what_it_declared() -> None:
    from opentelemetry.sdk.metrics import Histogram
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

    aggregation = ExplicitBucketHistogramAggregation((1.0, 2.0))
    exporter = ConsoleMetricExporter(
        preferred_temporality={Histogram: AggregationTemporality.DELTA},
        preferred_aggregation={Histogram: aggregation},
    )
    preferences = private.metric_exporter_preferences(exporter)
    assert preferences["preferred_temporality"][Histogram] is AggregationTemporality.DELTA
    assert preferences["preferred_aggregation"][Histogram] is aggregation
    assert InMemoryMetricReader  # the reader path needs no preferences


def test_only_traintels_tracer_gets_the_forcing_generator() -> None:
    provider = TracerProvider(id_generator=RandomIdGenerator())
    ours, theirs = provider.get_tracer("traintel-test"), provider.get_tracer("user")
    generator = private.tracer_id_generator(ours)
    assert isinstance(generator, RandomIdGenerator)
    forcing = ForcingIdGenerator(generator)
    private.set_tracer_id_generator(ours, forcing)
    forcing.force(0xAB)
    assert ours.start_span("forced").get_span_context().span_id == 0xAB
    forcing.force(0xCD)
    assert theirs.start_span("not forced").get_span_context().span_id != 0xCD
    assert private.tracer_id_generator(trace.NoOpTracer()) is None


def test_both_otlp_trace_exporters_let_the_collectors_answers_be_seen() -> None:
    """On this release the answers of both OTLP trace exporters are reachable (the behaviour they
    feed is tested against real receivers in tests/test_collector_answers.py); anything else is
    left alone."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    from traintel.exporters.collector_answers import CollectorAnswers

    answers = CollectorAnswers()
    for exporter in (GrpcExporter(endpoint="http://127.0.0.1:9", insecure=True), HttpExporter()):
        assert private.watch_collector_answers(exporter, answers), type(exporter).__module__
        exporter.shutdown()
    assert not private.watch_collector_answers(InMemorySpanExporter(), answers)


def _histogram_points(reader: InMemoryMetricReader) -> dict[str, list[tuple[object, ...]]]:
    data = reader.get_metrics_data()
    if data is None:  # delta, nothing recorded since the last collection
        return {}
    return {
        metric.name: [
            (p.count, tuple(p.bucket_counts), round(p.sum, 9), p.min, p.max)  # type: ignore[union-attr]
            for p in metric.data.data_points
        ]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }


@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_a_windows_values_added_as_bucket_counts_export_what_recording_each_exports(
    temporality: AggregationTemporality,
) -> None:
    """``record_sorted`` against one ``record`` per value, windows of values with collections
    between them (delta releases the aggregation at each): the same points, to the count,
    bucket, minimum and maximum; a value on a boundary is in the bucket it closes."""
    from opentelemetry.sdk.metrics import Histogram, MeterProvider

    reader = InMemoryMetricReader(preferred_temporality={Histogram: temporality})
    meter = MeterProvider(metric_readers=[reader], shutdown_on_exit=False).get_meter("check")
    bounds = (0.01, 0.1, 1.0)
    public = meter.create_histogram("public", explicit_bucket_boundaries_advisory=list(bounds))
    merged = meter.create_histogram("merged", explicit_bucket_boundaries_advisory=list(bounds))
    for window in ([0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0], [0.2], [], [0.01, 0.01, 3.0]):
        for value in window:
            public.record(value)
        private.record_sorted(merged, sorted(window), bounds)
        points = _histogram_points(reader)
        assert points.get("merged") == points.get("public")
    assert private._HISTOGRAM_FAST == [True]  # the bucket counts were added, not recorded one by one


def test_where_a_view_changed_the_buckets_every_value_is_recorded() -> None:
    """The user's View decides the buckets: the counts cannot be added to them, so every value
    goes through the public API, and all of them are in the export."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.view import View

    reader = InMemoryMetricReader()
    view = View(instrument_name="merged", aggregation=ExplicitBucketHistogramAggregation([0.5, 5.0]))
    meter = MeterProvider(metric_readers=[reader], views=[view], shutdown_on_exit=False).get_meter("check")
    merged = meter.create_histogram("merged", explicit_bucket_boundaries_advisory=[0.01, 0.1, 1.0])
    private.record_sorted(merged, [0.1 * i for i in range(1, 1002)], (0.01, 0.1, 1.0))
    [(count, buckets, _, low, high)] = _histogram_points(reader)["merged"]
    assert (count, buckets, low, high) == (1001, (5, 45, 951), 0.1, 100.10000000000001)
