"""Self-telemetry of the export path, with the real SDK and exact counts: queue-overflow drops,
the event cap, batches split by bytes (over a real gRPC socket), the spool's bound, and the
``traintel.*`` instruments that report them."""

from __future__ import annotations

import re
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.otlp_receiver import GrpcReceiver
from tests.subprocess_helpers import run_python
from traintel import semconv
from traintel.analysis.report import build_report
from traintel.analysis.summary import render, summarize
from traintel.exporters.health import ExportHealth, describe, register_instruments
from traintel.exporters.metric_counting import CountingMetricExporter
from traintel.exporters.reader import attributes_dict, iter_metric_requests, spans_in
from traintel.exporters.spool import Spool, read_batch, spooled_requests
from traintel.exporters.spooling import (
    CountingBatchSpanProcessor,
    QueueGuard,
    SpoolingSpanExporter,
    split_by_bytes,
)


class GatedExporter(SpanExporter):
    """Holds the export thread until released: the queue behind it fills up."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.gate.wait(10)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


class FailingExporter(SpanExporter):
    def __init__(self) -> None:
        self.fail = True
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.fail:
            return SpanExportResult.FAILURE
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def _metrics(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], float]]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: [(dict(p.attributes or {}), p.value) for p in metric.data.data_points]  # type: ignore[union-attr]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }


def _instruments(health: ExportHealth) -> InMemoryMetricReader:
    reader = InMemoryMetricReader()
    register_instruments(MeterProvider(metric_readers=[reader]), health)
    return reader


def test_queue_overflow_drops_are_counted_exactly() -> None:
    health = ExportHealth()
    exporter = GatedExporter()
    processor = CountingBatchSpanProcessor(
        exporter, health=health, max_queue_size=4, max_export_batch_size=1, schedule_delay_millis=1
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    tracer.start_span("first").end()
    assert exporter.entered.wait(60)  # the export thread is now stuck on "first"
    for i in range(20):
        tracer.start_span(f"s{i}").end()
    reader = _instruments(health)
    assert _metrics(reader)[semconv.METRIC_QUEUE_DEPTH] == [({}, 4)]
    exporter.gate.set()
    provider.force_flush()
    provider.shutdown()
    assert health.spans_dropped == {"queue_full": 16}
    assert len(exporter.spans) == 5  # "first" and the 4 the queue held: 21 = 5 + 16
    dropped = dict((a[semconv.DROP_REASON], v) for a, v in _metrics(reader)[semconv.METRIC_SPANS_DROPPED])
    assert dropped["queue_full"] == 16
    assert describe(health.snapshot())[0] == "16 span(s) dropped (queue_full 16)"


def test_a_producer_hands_the_interpreter_to_the_export_thread_past_three_quarters_of_the_queue() -> None:
    """Past three-quarters of the queue the export thread is behind: each span handed over then
    yields the interpreter once (so the export thread, woken a batch earlier, drains the queue
    instead of the producer overflowing it); below the mark nothing is called, and a full queue
    drops and counts the span without yielding."""
    health = ExportHealth()
    exporter = GatedExporter()
    processor = BatchSpanProcessor(
        exporter, max_queue_size=8, max_export_batch_size=1, schedule_delay_millis=1
    )
    yields: list[float] = []
    guard = QueueGuard(processor, processor.on_end, health, hand_over=yields.append)
    tracer = TracerProvider().get_tracer("t")

    def end_one() -> None:
        span = tracer.start_span("s")
        span.end()
        guard.on_end(span)  # type: ignore[arg-type]

    end_one()
    assert exporter.entered.wait(60)  # the export thread now holds "s" 1: the queue only fills
    depths: list[tuple[int, int]] = []
    for _ in range(10):
        depth = guard.depth()
        end_one()
        depths.append((depth, len(yields)))
    assert depths == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 1), (7, 2), (8, 2), (8, 2)]
    assert yields == [0, 0]
    assert health.spans_dropped == {"queue_full": 2}
    exporter.gate.set()
    processor.shutdown()


class CountingExporter(SpanExporter):
    """Counts what it got; its first export waits until ``overflowed()`` says the producers have
    overflowed the queue (whatever the machine's load does to their pace), then each export
    takes a little time, so producers and the export thread go on racing for the queue."""

    def __init__(self, overflowed: Callable[[], bool]) -> None:
        self.exported = 0
        self.overflowed = overflowed

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        while not self.overflowed():
            time.sleep(0.001)
        self.exported += len(spans)  # one export thread: no race
        time.sleep(0.0005)
        return SpanExportResult.SUCCESS


def test_queue_overflow_count_is_exact_with_four_producing_threads() -> None:
    """Producers race each other and the export thread for the queue's last places: every span
    is exported or counted as dropped, none twice (produced = exported + dropped)."""
    health = ExportHealth()
    threads: list[threading.Thread] = []
    exporter = CountingExporter(
        lambda: health.spans_dropped.get("queue_full", 0) > 1000 or not any(t.is_alive() for t in threads)
    )
    processor = CountingBatchSpanProcessor(
        exporter, health=health, max_queue_size=64, max_export_batch_size=16, schedule_delay_millis=1
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    per_thread = 20_000

    def produce() -> None:
        for _ in range(per_thread):
            tracer.start_span("s").end()

    threads.extend(threading.Thread(target=produce) for _ in range(4))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    provider.shutdown()
    dropped = health.spans_dropped.get("queue_full", 0)
    assert dropped > 1000, "the queue overflowed"
    assert exporter.exported + dropped == 4 * per_thread


def test_events_over_the_cap_are_counted() -> None:
    health = ExportHealth()
    memory = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=128))
    provider.add_span_processor(CountingBatchSpanProcessor(memory, health=health))
    with provider.get_tracer("t").start_as_current_span("chatty") as span:
        for i in range(131):
            span.add_event(f"e{i}")
    provider.shutdown()
    assert len(memory.get_finished_spans()[0].events) == 128
    assert health.events_dropped == 3
    assert _metrics(_instruments(health))[semconv.METRIC_EVENTS_DROPPED] == [({}, 3)]


def _big_spans(count: int, value_bytes: int) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(count):
        tracer.start_span(f"big{i}", attributes={"blob": "x" * value_bytes}).end()
    return list(memory.get_finished_spans())


@pytest.mark.server
def test_a_batch_over_grpc_limit_is_split_and_delivered_over_a_real_socket() -> None:
    spans = _big_spans(60, 100_000)  # ~6 MB: one request would exceed gRPC's 4 MiB limit
    health = ExportHealth()
    with GrpcReceiver() as receiver:
        unsplit = OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True, timeout=1)
        assert unsplit.export(spans) == SpanExportResult.FAILURE  # what happens without splitting
        unsplit.shutdown()
        wrapped = SpoolingSpanExporter(
            OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True, timeout=60), None, health=health
        )
        assert wrapped.export(spans) == SpanExportResult.SUCCESS
        wrapped.shutdown()
    arrived = [span.name for _, span in receiver.received.spans()]
    assert sorted(arrived) == sorted(s.name for s in spans)
    assert len(receiver.received.traces) == 2
    assert health.batches_split == 1
    assert health.export_failures == 0 and not health.spans_dropped


def test_split_parts_are_in_order_and_under_the_limit() -> None:
    spans = _big_spans(9, 1000)
    parts = split_by_bytes(spans, 3000)
    assert [s for part, _ in parts for s in part] == spans
    assert all(encode_spans(part).ByteSize() <= 3000 for part, _ in parts)
    # ~1.1 kB per span: halving 9 gives parts of two (the odd middle part is split 1 + 2).
    assert [len(part) for part, _ in parts] == [2, 2, 2, 1, 2]
    # A single span over the limit stays alone, for the caller to refuse and count.
    assert len(split_by_bytes(spans[:1], 10)) == 1


def test_spool_bound_drops_oldest_and_counts(tmp_path: Path) -> None:
    health = ExportHealth()
    spool = Spool(tmp_path / "a" / "spool", max_bytes=3 * 12_000)
    failing = FailingExporter()
    exporter = SpoolingSpanExporter(failing, spool, retry_interval_s=0.05, health=health)
    batches = [_big_spans(1, 10_000) for _ in range(5)]
    for batch in batches:
        assert exporter.export(batch) == SpanExportResult.SUCCESS  # handed over or kept on disk
        assert exporter.force_flush(60_000)  # out of memory: the first after its failed send
    assert len(spool) == 3 and spool.dropped_batches == 2 and spool.dropped_spans == 2
    for path in [tmp_path / "a", tmp_path / "a" / "spool", *spool.directory.iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600)
    # What is kept: the three newest batches, as the requests a collector would have received.
    kept = [s.span_id for request in spooled_requests([spool.directory]) for s in spans_in(request)]
    assert kept == [f"{b[0].context.span_id:016x}" for b in batches[2:]]
    metrics = _metrics(_instruments(health))
    assert metrics[semconv.METRIC_SPOOL_DROPPED] == [({}, 2)]
    assert metrics[semconv.METRIC_SPOOL_SIZE] == [({}, spool.size_bytes)]
    dropped = dict((a[semconv.DROP_REASON], v) for a, v in metrics[semconv.METRIC_SPANS_DROPPED])
    assert dropped["spool_full"] == 2
    # The collector comes back: the kept batches are re-sent, oldest first, exactly once.
    failing.fail = False
    assert exporter.drain(5)
    assert [s.context.span_id for s in failing.spans] == [b[0].context.span_id for b in batches[2:]]
    assert health.spans_resent == 3
    exporter.shutdown()
    assert not spool.directory.exists()  # delivered: nothing left behind
    assert health.export_failures >= 1


def test_a_spooled_batch_that_decodes_but_is_invalid_is_set_aside_and_the_rest_sent(tmp_path: Path) -> None:
    """One flipped bit can leave a batch that parses with a status code outside 0-2: it cannot
    become spans again. It is moved to the quarantine directory, counted and named, and every
    batch behind it is delivered."""
    health = ExportHealth()
    spool = Spool(tmp_path / "spool", max_bytes=10_000_000)
    failing = FailingExporter()
    exporter = SpoolingSpanExporter(failing, spool, retry_interval_s=0.05, health=health)
    batches = [_big_spans(1, 100) for _ in range(3)]
    for batch in batches:
        exporter.export(batch)
        assert exporter.force_flush(60_000)
    first = spool.entries()[0]
    request = read_batch(first.path)
    request.resource_spans[0].scope_spans[0].spans[0].status.code = 7  # type: ignore[assignment]
    first.path.write_bytes(request.SerializeToString())
    failing.fail = False
    assert exporter.drain(5)
    assert [s.context.span_id for s in failing.spans] == [b[0].context.span_id for b in batches[1:]]
    moved = spool.quarantine_directory / first.path.name
    assert moved.is_file() and stat.S_IMODE(moved.stat().st_mode) == 0o600
    assert (health.snapshot().spans_quarantined, health.snapshot().spans_resent) == (1, 2)
    assert _metrics(_instruments(health))[semconv.METRIC_SPOOL_QUARANTINED] == [({}, 1)]
    assert describe(health.snapshot())[-1] == (
        "1 span(s) set aside, rejected by the collector or unreadable (the collector's log says why), "
        f"kept in {spool.quarantine_directory}"
    )
    exporter.shutdown()
    assert moved.is_file(), "kept for the user to inspect or replay"


def test_an_emptied_spooled_batch_is_set_aside_not_deleted_as_delivered(tmp_path: Path) -> None:
    """A spooled file emptied on disk (0 bytes parse as a request with no span): it holds none
    of the spans it was written with, so it is set aside and counted, never deleted as sent."""
    health = ExportHealth()
    spool = Spool(tmp_path / "spool", max_bytes=10_000_000)
    failing = FailingExporter()
    exporter = SpoolingSpanExporter(failing, spool, retry_interval_s=0.05, health=health)
    batches = [_big_spans(4, 100) for _ in range(3)]
    for batch in batches:
        exporter.export(batch)
        assert exporter.force_flush(5000)
    emptied = spool.entries()[1]
    emptied.path.write_bytes(b"")
    failing.fail = False
    assert exporter.drain(5)
    sent = [s.context.span_id for s in failing.spans]
    assert sent == [s.context.span_id for s in (*batches[0], *batches[2])]
    moved = spool.quarantine_directory / emptied.path.name
    assert moved.is_file(), "kept, not deleted as delivered"
    assert (health.snapshot().spans_quarantined, health.snapshot().spans_resent) == (4, 8)
    exporter.shutdown()


@pytest.mark.process
def test_losses_reach_the_exit_line_the_summary_and_the_report(tmp_path: Path) -> None:
    """A span over OTEL_SPAN_EVENT_COUNT_LIMIT in a real run with the embedded default: the
    application span has telemetry_initialization and 5 notes, 2 kept, 4 dropped."""
    code = """
    import traintel
    from opentelemetry import trace
    with traintel.application():
        span = trace.get_current_span()
        for i in range(5):
            span.add_event(f"note{i}")
    """
    result = run_python(code, tmp_path, OTEL_SPAN_EVENT_COUNT_LIMIT="2")
    assert result.returncode == 0, result.stderr
    assert "telemetry export: 4 span event(s) dropped over OTEL_SPAN_EVENT_COUNT_LIMIT" in result.stderr
    runs = tmp_path / "traintel-runs"
    assert "Telemetry losses: traintel.events.dropped 4" in render(summarize([runs]))
    report = build_report([runs])
    assert report.summary.self_telemetry[semconv.METRIC_EVENTS_DROPPED] == 4
    assert report.summary.self_telemetry[semconv.METRIC_SPANS_DROPPED] == 0


@pytest.mark.process
def test_a_forked_child_spools_into_its_own_directory(tmp_path: Path) -> None:
    import multiprocessing

    health = ExportHealth()
    spool = Spool(tmp_path / "spool" / "job-otlp", max_bytes=1_000_000)
    exporter = SpoolingSpanExporter(
        FailingExporter(), spool, retry_interval_s=60, drain_timeout_s=0, health=health
    )
    assert exporter.export(_big_spans(1, 10)) == SpanExportResult.SUCCESS  # spooled by the parent

    def child() -> None:
        exporter.export(_big_spans(2, 10))
        exporter.shutdown()

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(30)
    assert process.exitcode == 0
    exporter.shutdown()
    assert [len(list(spans_in(r))) for r in spooled_requests([spool.directory])] == [1]
    [forked] = [d for d in (tmp_path / "spool").iterdir() if d.name == f"job-otlp-fork{process.pid}"]
    assert [len(list(spans_in(r))) for r in spooled_requests([forked])] == [2]


def test_without_a_spool_a_failed_batch_is_dropped_and_counted() -> None:
    health = ExportHealth()
    failing = FailingExporter()
    exporter = SpoolingSpanExporter(failing, None, health=health)  # TRAINTEL_SPOOL_MAX_BYTES=0
    assert exporter.export(_big_spans(3, 10)) == SpanExportResult.FAILURE
    assert health.spans_dropped == {"not_spooled": 3} and health.export_failures == 1
    failing.fail = False
    assert exporter.export(_big_spans(2, 10)) == SpanExportResult.SUCCESS
    assert len(failing.spans) == 2
    exporter.shutdown()
    assert describe(health.snapshot())[0] == "3 span(s) dropped (not_spooled 3)"


class SwitchableMetricExporter(MetricExporter):
    """A metric exporter whose collector is down until ``up`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.up = False
        self.delivered = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if not self.up:
            return MetricExportResult.FAILURE
        self.delivered += 1
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def test_failed_metric_exports_are_counted_by_signal_and_the_exit_line_says_what_was_lost() -> None:
    health = ExportHealth()
    inner = SwitchableMetricExporter()
    reader = PeriodicExportingMetricReader(
        CountingMetricExporter(inner, health), export_interval_millis=10**9
    )
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("job").create_counter("samples").add(8)
    for _ in range(3):
        provider.force_flush()  # the collector is down: three exports fail
    snapshot = health.snapshot()
    assert (snapshot.metric_export_failures, snapshot.metric_exports_delivered) == (3, 0)
    assert snapshot.export_failures == 0  # span failures are counted apart
    assert describe(snapshot) == [
        "3 metric export(s) failed, none delivered: this run's metrics were not delivered "
        "(metrics are not spooled)"
    ]
    failures = _metrics(_instruments(health))[semconv.METRIC_EXPORT_FAILURES]
    assert sorted((p[semconv.EXPORT_SIGNAL], v) for p, v in failures) == [("metrics", 3), ("traces", 0)]
    inner.up = True
    provider.force_flush()  # back: this export carries the cumulative totals
    assert describe(health.snapshot()) == [
        "3 metric export(s) failed; a later export delivered the cumulative totals"
    ]
    inner.up = False
    provider.shutdown()  # down again at exit: the final export fails
    assert inner.delivered == 1
    assert describe(health.snapshot()) == [
        "4 metric export(s) failed, the last one too: the metrics since the last delivered export "
        "were not delivered (metrics are not spooled)"
    ]


def test_a_metric_export_still_waiting_at_exit_is_said_as_undelivered() -> None:
    """A collector that accepts and never answers: the exit's bounded shutdown gives up on the
    final export, which neither failed nor was delivered; the exit line must still say it."""
    health = ExportHealth()
    inner = SwitchableMetricExporter()
    inner.up = True
    release = threading.Event()
    original = inner.export

    def hanging(
        metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if inner.delivered:  # the first export goes through, the next waits
            release.wait(60)  # released by the test: the bound is a hang guard
        return original(metrics_data, timeout_millis, **kwargs)

    inner.export = hanging  # type: ignore[method-assign]
    reader = PeriodicExportingMetricReader(
        CountingMetricExporter(inner, health), export_interval_millis=10**9
    )
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    provider.get_meter("job").create_counter("samples").add(8)
    provider.force_flush()
    waiting = threading.Thread(target=provider.force_flush)
    waiting.start()
    try:
        while not health.snapshot().metric_export_unfinished:
            time.sleep(0.01)
        assert describe(health.snapshot()) == [
            "the last metric export had not finished at exit: the metrics since the last delivered "
            "export were not delivered (metrics are not spooled)"
        ]
    finally:
        release.set()
        waiting.join()
        provider.shutdown()
    assert describe(health.snapshot()) == []  # it finished, delivered: nothing was lost


def test_a_metric_export_waiting_at_exit_with_none_delivered_says_so() -> None:
    health = ExportHealth()
    health.metric_export_started()
    assert describe(health.snapshot()) == [
        "the last metric export had not finished at exit, none delivered: this run's metrics were "
        "not delivered (metrics are not spooled)"
    ]
    health.metric_export_done(False)
    assert describe(health.snapshot()) == [
        "1 metric export(s) failed, none delivered: this run's metrics were not delivered "
        "(metrics are not spooled)"
    ]


@pytest.mark.process
def test_a_job_whose_collector_is_down_counts_its_metric_failures_and_says_so(tmp_path: Path) -> None:
    """Real OTLP/gRPC metric export to a port where nothing listens, next to the embedded file."""
    code = """
    import time
    import traintel
    with traintel.application():
        with traintel.training_loop():
            for _ in range(10):
                with traintel.training_iteration(samples=8):
                    time.sleep(0.1)
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_python(
        code,
        tmp_path,
        OTEL_TRACES_EXPORTER="traintel_file",
        OTEL_METRICS_EXPORTER="otlp,traintel_file",
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        OTEL_METRIC_EXPORT_INTERVAL="300",
        TRAINTEL_SHUTDOWN_TIMEOUT="3",
    )
    assert result.returncode == 0, result.stderr
    exit_lines = [line for line in result.stderr.splitlines() if "metric export(s) failed" in line]
    assert len(exit_lines) == 1, result.stderr
    match = re.search(r"telemetry export: (\d+) metric export\(s\) failed, none delivered", exit_lines[0])
    assert match, exit_lines[0]
    assert "this run's metrics were not delivered (metrics are not spooled)" in exit_lines[0]
    # The embedded file got traintel.export.failures by signal; its last point (collected while
    # the OTLP reader's final export may still be failing) is at most what the exit line says.
    last: dict[str, float] = {}
    for request in iter_metric_requests([tmp_path / "traintel-runs"]):
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == semconv.METRIC_EXPORT_FAILURES:
                        for point in metric.sum.data_points:
                            last[attributes_dict(point.attributes)[semconv.EXPORT_SIGNAL]] = point.as_int
    assert last["traces"] == 0
    assert 1 <= last["metrics"] <= int(match.group(1))


@pytest.mark.process
def test_a_reader_of_the_users_that_never_collects_during_the_run_gets_every_iteration(
    tmp_path: Path,
) -> None:
    """Only the user's own reader, which collects after the run: every one of the 150,000
    iterations is in its histogram (a buffer of 100,000 values used to lose the other 50,000
    here, counted and said at exit)."""
    job = """
import traintel
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
reader = InMemoryMetricReader()
traintel.configure(span_exporters=[InMemorySpanExporter()], metric_readers=[reader])
with traintel.application():
    with traintel.training_loop():
        for i in range(150_000):
            with traintel.training_iteration():
                pass
[count] = [p.count for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
           for m in sm.metrics if m.name == "ml.training.iteration.duration" for p in m.data.data_points]
print("histogram", count)
"""
    result = run_python(job, tmp_path, TRAINTEL_EXPORT_ITERATIONS="none", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "histogram 150000" in result.stdout
    assert "were not recorded" not in result.stderr


def _histogram_counts(requests: Iterable[Any], name: str) -> list[tuple[int, int, float]]:
    """(count, sum of bucket counts, sum) of every point of histogram ``name``, in order."""
    return [
        (point.count, sum(point.bucket_counts), point.sum)
        for request in requests
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in metric.histogram.data_points
    ]


FAST_JOB = """
import traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(300_000):
            with traintel.training_iteration():
                pass
print("trained")
"""


@pytest.mark.process
def test_a_job_faster_than_the_reader_loses_no_iteration_from_its_histograms(tmp_path: Path) -> None:
    """300,000 iterations (> 100,000 iterations/s here) and a 60 s reader that collects once, at
    exit: each closed window's values are in the histogram, whatever the step rate. The
    histogram counts every iteration; nothing is dropped or said."""
    result = run_python(FAST_JOB, tmp_path, TRAINTEL_EXPORT_ITERATIONS="none", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "were not recorded" not in result.stderr
    requests = list(iter_metric_requests([tmp_path / "traintel-runs"]))
    [(count, in_buckets, total_s)] = _histogram_counts(requests, semconv.METRIC_ITERATION_DURATION)
    assert count == in_buckets == 300_000
    assert total_s > 0


@pytest.mark.process
@pytest.mark.server
def test_with_delta_temporality_each_export_adds_only_its_own_share(tmp_path: Path) -> None:
    """A real OTLP receiver and delta temporality: the points of all exports add up to every
    iteration, each value sent once."""
    with GrpcReceiver() as receiver:
        result = run_python(
            FAST_JOB.replace("print(", "traintel.get_telemetry().flush(10)\nprint("),
            tmp_path,
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta",
            TRAINTEL_EXPORT_ITERATIONS="none",
            timeout=300,
        )
    assert result.returncode == 0, result.stderr
    points = _histogram_counts(receiver.received.metrics, semconv.METRIC_ITERATION_DURATION)
    assert len(points) >= 1
    assert sum(count for count, _, _ in points) == 300_000
    assert all(count == in_buckets for count, in_buckets, _ in points)


def test_the_hint_is_said_once_when_the_exit_bound_spills_before_the_exporter_s_shutdown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Under load the exit bound can end the process while the first send is still retrying:
    the spill at the bound says what to set, and the exporter's own shutdown does not again."""
    spool = Spool(tmp_path / "spool", max_bytes=1_000_000)
    exporter = SpoolingSpanExporter(
        FailingExporter(),
        spool,
        retry_interval_s=60,
        drain_timeout_s=0.0,
        health=ExportHealth(),
        hint="SET X",
    )
    with caplog.at_level("WARNING", logger="traintel"):
        assert exporter.spill(_big_spans(2, 100)) == 2  # the bound reached: nothing was sent yet
        said = [r.getMessage() for r in caplog.records if "SET X" in r.getMessage()]
        assert said == ["traintel: span export did not complete before exit. SET X"]
        exporter.shutdown()  # (when the process lives on long enough to get here)
    assert len([r for r in caplog.records if "SET X" in r.getMessage()]) == 1


def test_the_replay_hint_runs_as_pasted_without_traintel_on_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job run with a virtual environment's Python, not activated (as ``make demo`` does):
    ``traintel`` alone is not found, the console script beside the interpreter is."""
    import dataclasses
    import shlex
    import sys

    snapshot = dataclasses.replace(
        ExportHealth().snapshot(), spool_batches=1, spool_spans=2, spool_bytes=10, spool_dirs=["/spool dir"]
    )
    script = Path(sys.executable).with_name("traintel")
    monkeypatch.setenv("PATH", str(script.parent))
    assert describe(snapshot)[-1].endswith("send them with: traintel replay '/spool dir'")
    monkeypatch.setenv("PATH", "")
    hint = describe(snapshot)[-1].split("send them with: ", 1)[1]
    assert shlex.split(hint) == [str(script), "replay", "/spool dir"]
