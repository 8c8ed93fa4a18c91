"""Hang localisation and process gauges, read by a real metric reader from another thread while
a real training thread is blocked (as a rank stuck in a collective would be)."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import traintel
from tests.conftest import Pipeline
from traintel import semconv


def points(pipeline: Pipeline, name: str) -> list[Any]:
    data = pipeline.reader.get_metrics_data()
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    return list(metric.data.data_points)
    return []


def one_value(pipeline: Pipeline, name: str) -> Any:
    (point,) = points(pipeline, name)
    return point


class Stuck:
    """A training thread that runs ``before`` completed iterations, then blocks in ``where``."""

    def __init__(self, before: int, where: str) -> None:
        self.blocked = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._train, args=(before, where), daemon=True)

    def _train(self, before: int, where: str) -> None:
        with traintel.training_loop():
            for number in range(before + 1):
                stuck = number == before
                if stuck and where == "checkpoint":
                    with traintel.checkpoint_save(iteration=number):
                        self._block()
                    return
                with traintel.training_iteration(number, samples=8):
                    with traintel.model_forward():
                        pass
                    with traintel.model_backward():
                        if stuck:
                            self._block()
                    with traintel.optimizer_update():
                        pass

    def _block(self) -> None:
        self.blocked.set()
        assert self.release.wait(30)

    def __enter__(self) -> Stuck:
        self.thread.start()
        assert self.blocked.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(30)


def test_a_rank_stuck_in_backward_is_named_while_its_thread_is_blocked(pipeline: Pipeline) -> None:
    started_ns = time.time_ns()
    with Stuck(before=3, where="backward"):
        time.sleep(0.3)
        waited = one_value(pipeline, semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS).value
        # at least the sleep; at most since the thread started (its progress came after)
        assert 0.3 <= waited <= (time.time_ns() - started_ns) / 1e9
        assert one_value(pipeline, semconv.METRIC_HEARTBEAT_ITERATION).value == 2  # the last completed
        phase = one_value(pipeline, semconv.METRIC_HEARTBEAT_PHASE)
        assert dict(phase.attributes) == {
            semconv.PHASE: "training_iteration",
            semconv.HEARTBEAT_AFTER: "model_forward",  # stopped inside backward
        }
        time.sleep(0.2)  # no progress: the gauge keeps growing
        assert one_value(pipeline, semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS).value >= waited + 0.2
        released_ns = time.time_ns()
    # released: iteration 3 completes and the loop ends, progress after the release
    assert one_value(pipeline, semconv.METRIC_HEARTBEAT_ITERATION).value == 3
    since = one_value(pipeline, semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS).value
    assert since <= (time.time_ns() - released_ns) / 1e9
    assert dict(one_value(pipeline, semconv.METRIC_HEARTBEAT_PHASE).attributes) == {semconv.PHASE: "idle"}


def test_a_rank_stuck_in_a_checkpoint_save_is_named(pipeline: Pipeline) -> None:
    with Stuck(before=2, where="checkpoint"):
        time.sleep(0.2)
        assert dict(one_value(pipeline, semconv.METRIC_HEARTBEAT_PHASE).attributes) == {
            semconv.PHASE: "checkpoint_save_sync"
        }
        assert one_value(pipeline, semconv.METRIC_HEARTBEAT_ITERATION).value == 1
        assert one_value(pipeline, semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS).value >= 0.2


def test_before_any_iteration_there_is_no_iteration_gauge(pipeline: Pipeline) -> None:
    with traintel.model_init():
        assert points(pipeline, semconv.METRIC_HEARTBEAT_ITERATION) == []
        assert dict(one_value(pipeline, semconv.METRIC_HEARTBEAT_PHASE).attributes) == {
            semconv.PHASE: "model_init"
        }


def _cpu_utilization_within_bounds(pipeline: Pipeline, activity: Callable[[], None]) -> float:
    """The gauge over one collection interval in which ``activity`` runs, asserted to lie within
    what this process' own CPU clock, read around each collection, allows."""
    cpus = len(os.sched_getaffinity(0))
    tick = 1 / os.sysconf("SC_CLK_TCK")  # os.times() resolution: the gauge's CPU time is in ticks
    cpu_0, wall_0 = time.process_time(), time.monotonic()
    one_value(pipeline, semconv.METRIC_PROCESS_CPU_UTILIZATION)  # start a measurement interval
    cpu_1, wall_1 = time.process_time(), time.monotonic()
    activity()
    cpu_2, wall_2 = time.process_time(), time.monotonic()
    value = float(one_value(pipeline, semconv.METRIC_PROCESS_CPU_UTILIZATION).value)
    cpu_3, wall_3 = time.process_time(), time.monotonic()
    # The gauge's interval lies between the two collections: it contains [wall_1, wall_2] and is
    # contained in [wall_0, wall_3]; so does its CPU time, give or take a clock tick at each end.
    lowest = (cpu_2 - cpu_1 - 2 * tick) / (wall_3 - wall_0) / cpus
    highest = (cpu_3 - cpu_0 + 2 * tick) / (wall_2 - wall_1) / cpus
    assert lowest <= value <= highest
    return value


def test_process_cpu_and_memory(pipeline: Pipeline) -> None:
    """CPU utilisation = this process' CPU time / wall time between two collections / the CPUs
    it may run on. Checked against the process' own CPU clock, not a fixed share of a core (on
    a loaded machine a busy thread gets what the scheduler gives it), so it holds under any load
    and still catches a wrong formula: the idle interval catches wall time taken for CPU time
    and the busy one a missing division by the CPUs or an interval that does not restart."""

    def idle() -> None:
        time.sleep(0.3)

    def busy() -> None:  # one thread busy until it got a quarter of a CPU second, however long
        start = time.process_time()
        while time.process_time() - start < 0.25:
            pass

    assert _cpu_utilization_within_bounds(pipeline, idle) < 0.5 / len(os.sched_getaffinity(0))
    assert _cpu_utilization_within_bounds(pipeline, busy) <= 1.0
    rss = one_value(pipeline, semconv.METRIC_PROCESS_MEMORY_USAGE).value
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert 10 * 2**20 < rss <= 1.1 * peak  # the kernel updates its high-water mark lazily


def test_no_cuda_means_no_device_series(pipeline: Pipeline) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("this process has initialised CUDA (tests/test_gpu_cuda.py checks the series there)")
    for name in (
        semconv.METRIC_DEVICE_MEMORY_ALLOCATED, semconv.METRIC_DEVICE_MEMORY_RESERVED,
        semconv.METRIC_DEVICE_MEMORY_PEAK, semconv.METRIC_DEVICE_MEMORY_ALLOC_RETRIES,
        semconv.METRIC_DEVICE_MEMORY_OOMS,
    ):  # fmt: skip
        assert points(pipeline, name) == [], name


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))


def test_the_gauges_follow_a_reconfiguration_on_the_same_provider() -> None:
    """The SDK keeps the first registration of a gauge: it must read the current job, not the
    first one traintel was configured for."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    traintel.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)
    traintel.shutdown(1)
    traintel.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)
    with traintel.training_loop():
        for number in (40, 41):
            with traintel.training_iteration(number):
                pass
    data = reader.get_metrics_data()
    assert data is not None
    values = {
        metric.name: [getattr(p, "value", None) for p in metric.data.data_points]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    assert values[semconv.METRIC_HEARTBEAT_ITERATION] == [41]
    traintel.shutdown(1)
    meter_provider.shutdown()


def test_an_explicit_shutdown_still_reports_the_last_state_in_the_final_export() -> None:
    """traintel.shutdown() shuts the providers down after it has forgotten the job; the final
    metric export (the reader's last collection) must still see the job's heartbeat."""
    from collections.abc import Sequence

    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        MetricsData,
        PeriodicExportingMetricReader,
    )

    class Collecting(MetricExporter):
        def __init__(self) -> None:
            super().__init__()
            self.exports: list[MetricsData] = []

        def export(
            self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
        ) -> MetricExportResult:
            self.exports.append(metrics_data)
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    exporter = Collecting()
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    traintel.configure(span_exporters=[], metric_readers=[reader])
    with traintel.training_loop():
        for number in (7, 8):
            with traintel.training_iteration(number):
                pass
    traintel.shutdown(60)
    final: Sequence[Any] = [
        point.value
        for rm in exporter.exports[-1].resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == semconv.METRIC_HEARTBEAT_ITERATION
        for point in metric.data.data_points
    ]
    assert final == [8]
