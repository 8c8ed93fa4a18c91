"""Device-side timing, NVTX ranges and per-window memory peaks, on CPU.

The deferred CUDA-event resolution takes "event-like" objects: here a fake GPU whose events
complete a fixed number of records behind the CPU and whose clock the test advances, so GPU
times differ from wall times and the values are exact. NVTX push/pop go to a recorder. Both run
through the real phase API, engine and SDK (no OTel stand-ins)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from traintel import callbacks, semconv
from traintel._host.device import (
    PEAK_RSS_REFRESH_NS,
    DeviceHooks,
    EventTimer,
    NvtxRanges,
    PendingTimings,
    annotate_window,
    device_hooks,
    peak_rss_bytes,
    recent_peak_rss_bytes,
)
from traintel._runtime import state as _state

DT = semconv.WINDOW_DEVICE_TIME_PREFIX


class FakeGpu:
    """Events are stamped with the GPU clock when recorded; one completes once ``lag`` more
    events have been recorded after it."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.recorded = 0
        self.clock_ms = 0.0
        self.created = 0

    def event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)

    def run(self, ms: float) -> None:
        self.clock_ms += ms


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.seq = -1
        self.t = 0.0

    def record(self) -> None:
        self.seq, self.t = self.gpu.recorded, self.gpu.clock_ms
        self.gpu.recorded += 1

    def query(self) -> bool:
        return 0 <= self.seq < self.gpu.recorded - self.gpu.lag

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time on an incomplete event would synchronise"
        return end.t - self.t


def pair(gpu: FakeGpu, ms: float) -> tuple[FakeEvent, FakeEvent]:
    start, end = gpu.event(), gpu.event()
    start.record()
    gpu.run(ms)
    end.record()
    return start, end


def test_pairs_resolve_in_order_once_complete_and_never_wait() -> None:
    gpu = FakeGpu(lag=3)
    timings = PendingTimings()
    timings.add("forward", *pair(gpu, 2.0))
    timings.add("backward", *pair(gpu, 4.0))
    timings.poll()  # 4 recorded, lag 3: only event 0 complete, the first pair's end is not
    assert (timings.seconds, timings.pending) == ({}, 2)
    timings.add("forward", *pair(gpu, 8.0))
    timings.poll()  # 6 recorded: events 0-2 complete -> the first pair only
    assert (timings.seconds, timings.counts, timings.pending) == ({"forward": 0.002}, {"forward": 1}, 2)
    out: dict[str, float | int | str] = {}
    gpu.recorded += 3  # the device catches up
    timings.window_attributes(out)
    assert out == {
        semconv.WINDOW_DEVICE_TIMING_MODE: "cuda_event",
        DT + "forward": 0.002 + 0.008,
        DT + "forward.count": 2,
        DT + "backward": 0.004,
        DT + "backward.count": 1,
        semconv.WINDOW_DEVICE_TIME_PENDING: 0,
        semconv.WINDOW_DEVICE_TIME_DROPPED: 0,
    }
    out = {}
    timings.window_attributes(out)  # the next window starts from zero
    assert out[semconv.WINDOW_DEVICE_TIME_PENDING] == 0 and DT + "forward" not in out


def test_the_queue_is_bounded_and_counts_what_it_drops() -> None:
    gpu = FakeGpu(lag=10**9)  # a device that never finishes
    timings = PendingTimings(capacity=4)
    for _ in range(10):
        timings.add("forward", *pair(gpu, 1.0))
        timings.poll()
    out: dict[str, float | int | str] = {}
    timings.window_attributes(out)
    assert out[semconv.WINDOW_DEVICE_TIME_PENDING] == 4
    assert out[semconv.WINDOW_DEVICE_TIME_DROPPED] == 6
    assert DT + "forward" not in out


def test_events_are_reused_once_resolved() -> None:
    gpu = FakeGpu(lag=0)
    timer = EventTimer(gpu.event)
    for _ in range(100):
        for phase in ("model_forward", "model_backward", "optimizer_update", "data_loading"):
            timer.started(phase)
            gpu.run(1.0)
            timer.ended(phase)
    assert gpu.created == 2  # one pair, recycled: data loading is not timed on the device
    assert timer.timings.counts == {"forward": 100, "backward": 100, "optimizer": 100}


@pytest.fixture
def job() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    traintel.configure(span_exporters=[exporter], log_every_n_iterations=2, export_iterations="none")
    yield exporter
    traintel.shutdown(1.0)


def engine() -> Any:
    current = _state.current().engine
    assert current is not None
    return current


def window_events(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    traintel.shutdown(60)
    return [
        dict(event.attributes or {})
        for span in exporter.get_finished_spans()
        for event in span.events
        if event.name == semconv.Event.TRAINING_METRICS_UPDATE.value
    ]


GPU_MS = {"model_forward": 2.0, "model_backward": 4.0, "optimizer_update": 0.5}


def train_with_context_managers(gpu: FakeGpu, iterations: int) -> None:
    with traintel.training_loop():
        for _ in range(iterations):
            with traintel.training_iteration():
                with traintel.data_loading():
                    gpu.run(100.0)  # not timed on the device
                for phase, factory in (
                    ("model_forward", traintel.model_forward),
                    ("model_backward", traintel.model_backward),
                    ("optimizer_update", traintel.optimizer_update),
                ):
                    with factory():
                        gpu.run(GPU_MS[phase])


def train_with_callbacks(gpu: FakeGpu, iterations: int) -> None:
    callbacks.on_train_start(train_iterations_start=0)
    for _ in range(iterations):
        callbacks.on_training_single_iteration_start()
        for phase, start, end in (
            ("model_forward", callbacks.on_model_forward_start, callbacks.on_model_forward_end),
            ("model_backward", callbacks.on_model_backward_start, callbacks.on_model_backward_end),
            ("optimizer_update", callbacks.on_optimizer_update_start, callbacks.on_optimizer_update_end),
        ):
            start()
            gpu.run(GPU_MS[phase])
            end()
        callbacks.on_training_single_iteration_end()
    callbacks.on_train_end()


@pytest.mark.parametrize("train", [train_with_context_managers, train_with_callbacks])
def test_device_times_land_in_the_window_events(job: InMemorySpanExporter, train: Any) -> None:
    """A GPU two events behind: each pair resolves at the next timed phase end, so a window
    holds its own forward and backward times and the previous window's last optimizer time;
    the last optimizer pair is still in flight when the window closes."""
    gpu = FakeGpu(lag=2)
    engine().set_device(DeviceHooks(EventTimer(gpu.event), None))
    train(gpu, 4)
    first, second = window_events(job)
    forward, backward, optimizer = 0.002, 0.004, 0.0005
    for window, optimizers in ((first, 1), (second, 2)):
        assert window[semconv.WINDOW_TIMING_MODE] == "wall_clock"
        assert window[semconv.WINDOW_DEVICE_TIMING_MODE] == "cuda_event"
        assert window[DT + "forward"] == forward + forward
        assert window[DT + "backward"] == backward + backward
        assert window[DT + "forward.count"] == window[DT + "backward.count"] == 2
        assert window[DT + "optimizer"] == sum([optimizer] * optimizers)
        assert window[DT + "optimizer.count"] == optimizers
        assert window[semconv.WINDOW_DEVICE_TIME_PENDING] == 1
        assert window[semconv.WINDOW_DEVICE_TIME_DROPPED] == 0


class NvtxRecorder:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.depth = 0

    def push(self, name: str) -> None:
        self.calls.append(" " * self.depth + name)
        self.depth += 1

    def pop(self) -> None:
        assert self.depth > 0, "pop without push"
        self.depth -= 1


@pytest.mark.parametrize("export", ["none", "all"])  # fast-path records, or real spans throughout
def test_nvtx_ranges_follow_the_phase_spans(export: str) -> None:
    traintel.configure(span_exporters=[InMemorySpanExporter()], export_iterations=export)
    nvtx = NvtxRecorder()
    engine().set_device(DeviceHooks(None, NvtxRanges(nvtx.push, nvtx.pop)))
    with traintel.application():
        with traintel.model_init():
            pass
        with traintel.training_loop():
            for _ in range(2):
                with traintel.training_iteration():
                    with traintel.model_forward():
                        pass
                    callbacks.on_model_backward_start()
                    callbacks.on_model_backward_end()
            with traintel.checkpoint_save(iteration=2):
                pass
    assert nvtx.depth == 0
    assert nvtx.calls == [
        "application",
        " model_init",
        " training_loop",
        "  training_iteration 0",
        "   model_forward 0",
        "   model_backward 0",
        "  training_iteration 1",
        "   model_forward 1",
        "   model_backward 1",
        "  checkpoint_save_sync",
    ]


def test_without_cuda_the_features_are_refused_once_and_training_is_unchanged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a machine without CUDA is what this tests (tests/test_gpu_cuda.py runs on a GPU)")
    monkeypatch.setenv("TRAINTEL_NVTX", "on")
    monkeypatch.setenv("TRAINTEL_CUDA_EVENT_TIMING", "ON")
    exporter = InMemorySpanExporter()
    with caplog.at_level(logging.WARNING):
        traintel.configure(span_exporters=[exporter], log_every_n_iterations=2)
    assert engine().device is None
    refusals = [r.getMessage() for r in caplog.records if "no CUDA device" in r.getMessage()]
    assert refusals == [
        "traintel: TRAINTEL_CUDA_EVENT_TIMING=on and TRAINTEL_NVTX=on ignored: no CUDA device (reported once)"
    ]
    train_with_context_managers(FakeGpu(lag=0), 2)
    (window,) = window_events(exporter)
    assert window[semconv.WINDOW_TIMING_MODE] == "wall_clock"
    assert not [key for key in window if key.startswith(DT)]


def test_off_by_default_and_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from traintel.config import ConfigurationError, TrainingConfig

    assert device_hooks(TrainingConfig.from_env({}, strict=True).resolve(), print) is None
    monkeypatch.setenv("TRAINTEL_NVTX", "yes")
    with pytest.raises(ConfigurationError, match="TRAINTEL_NVTX='yes'"):
        traintel.configure(span_exporters=[InMemorySpanExporter()])


def test_window_memory_on_cpu_is_the_process_peak_rss(
    job: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    from traintel._host import device

    monkeypatch.setattr(device, "initialised_cuda", lambda: None)  # a job without CUDA, on any machine
    train_with_context_managers(FakeGpu(lag=0), 2)
    (window,) = window_events(job)
    # Read at most once a second: a high-water mark at most that old, never above the true one.
    assert 0 < window[semconv.WINDOW_PROCESS_PEAK_RSS_SINCE_START] <= peak_rss_bytes()
    assert semconv.WINDOW_DEVICE_MEMORY_PEAK_ALLOCATED not in window


def test_peak_rss_is_read_at_most_once_per_interval() -> None:
    from traintel._host import device

    now = time.monotonic_ns() + 10 * PEAK_RSS_REFRESH_NS  # past any earlier read
    reads = device._peak_rss[2]
    first = recent_peak_rss_bytes(now)
    assert 0 < first <= peak_rss_bytes() and device._peak_rss[2] == reads + 1
    assert recent_peak_rss_bytes(now + PEAK_RSS_REFRESH_NS - 1) == first  # cached: no system call
    assert device._peak_rss[2] == reads + 1
    assert recent_peak_rss_bytes(now + PEAK_RSS_REFRESH_NS) <= peak_rss_bytes()  # read again
    assert device._peak_rss[2] == reads + 2


class FakeCudaMemory:
    """torch.cuda's peak-memory calls (a stand-in: no CUDA here)."""

    def __init__(self) -> None:
        self.peaks = [(300, 512), (200, 512)]
        self.resets = 0

    def max_memory_allocated(self, device: int | None = None) -> int:
        return self.peaks[self.resets][0]

    def max_memory_reserved(self, device: int | None = None) -> int:
        return self.peaks[self.resets][1]

    def reset_peak_memory_stats(self, device: int | None = None) -> None:
        self.resets += 1


def test_window_memory_on_cuda_is_the_peak_since_the_last_window(monkeypatch: pytest.MonkeyPatch) -> None:
    from traintel._host import device

    cuda = FakeCudaMemory()
    monkeypatch.setattr(device, "initialised_cuda", lambda: cuda)
    windows: list[dict[str, float | int | str]] = [{}, {}]
    for out in windows:
        annotate_window(out, None)
    assert [w[semconv.WINDOW_DEVICE_MEMORY_PEAK_ALLOCATED] for w in windows] == [300, 200]
    assert [w[semconv.WINDOW_DEVICE_MEMORY_PEAK_RESERVED] for w in windows] == [512, 512]
    assert cuda.resets == 2
