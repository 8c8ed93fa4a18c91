"""NVML gauges and GPU identity, on CPU: a fake NVML module stands in for ``pynvml`` (not OTel),
so the mapping from NVML readings to observations, units and attributes is checked for real
through the SDK's metric pipeline."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum

from tests.test_deploy import PENDING_INSTRUMENTS
from traintel import semconv
from traintel._host.gpu import GpuInstruments, gpu_in_use, visible_entries
from traintel.resource_detectors import gpu_attributes

UUIDS = ["GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-1111", "GPU-cccccccc-2222"]
GPU_METRICS = (
    semconv.METRIC_HW_GPU_MEMORY_USAGE,
    semconv.METRIC_HW_GPU_MEMORY_LIMIT,
    semconv.METRIC_HW_GPU_UTILIZATION,
    semconv.METRIC_HW_TEMPERATURE,
    semconv.METRIC_HW_POWER,
)


class NVMLError(Exception):
    pass


class FakeNvml:
    """nvidia-ml-py's call signatures and units: bytes, percent, °C, milliwatts; UUIDs as bytes
    (older releases) for GPU 0, str for the others. Records the thread of every reading."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, count: int = 3, fail_init: bool = False, no_power: tuple[int, ...] = ()) -> None:
        self.count = count
        self.fail_init = fail_init
        self.no_power = no_power
        self.threads: set[int] = set()

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return UUIDS.index(uuid)

    def nvmlDeviceGetUUID(self, handle: int) -> str | bytes:
        return UUIDS[handle].encode() if handle == 0 else UUIDS[handle]

    def _read(self) -> None:
        self.threads.add(threading.get_ident())

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._read()
        return SimpleNamespace(used=(handle + 1) * 2**30, total=80 * 2**30, free=0)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._read()
        return SimpleNamespace(gpu=10 * (handle + 1), memory=5)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._read()
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 40 + handle

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._read()
        if handle in self.no_power:
            raise NVMLError("Not Supported")
        return 250_500 + handle  # mW

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def nvmlDeviceGetClockInfo(self, handle: int, domain: int) -> int:
        self._read()
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 2619}[domain] - handle  # MHz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        self._read()
        return [0x1, 0x4 | 0x20, 0][handle]  # idle; power cap and thermal slowdown; none

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self._read()
        return 123_456_789 + handle  # mJ


def collect(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    if data is None:
        return {}
    return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def gauges(nvml: Any, environ: dict[str, str]) -> tuple[GpuInstruments, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    instruments = GpuInstruments(MeterProvider(metric_readers=[reader]), nvml=nvml, environ=environ)
    return instruments, reader


def by_gpu(metric: Any) -> dict[str, float]:
    out = {}
    for point in metric.data.data_points:
        assert point.attributes[semconv.HW_TYPE] == "gpu"
        out[point.attributes[semconv.HW_ID]] = point.value
    return out


def test_nvml_readings_become_hw_gauges_in_ucum_units() -> None:
    nvml = FakeNvml(no_power=(1,))
    _, reader = gauges(nvml, {})
    metrics = collect(reader)
    gib = 2**30
    per_gpu = {
        semconv.METRIC_HW_GPU_MEMORY_USAGE: [gib, 2 * gib, 3 * gib],
        semconv.METRIC_HW_GPU_MEMORY_LIMIT: [80 * gib] * 3,
        semconv.METRIC_HW_GPU_UTILIZATION: [0.1, 0.2, 0.3],
        semconv.METRIC_HW_TEMPERATURE: [40, 41, 42],
    }
    for name, values in per_gpu.items():
        assert by_gpu(metrics[name]) == dict(zip(UUIDS, values, strict=True)), name
    # GPU 1 does not report power: its series is absent, the others are there.
    assert by_gpu(metrics[semconv.METRIC_HW_POWER]) == {UUIDS[0]: 250.5, UUIDS[2]: 250.502}
    for name in GPU_METRICS:  # the kinds and units the dashboards were written against
        assert isinstance(metrics[name].data, Gauge)
        assert ("gauge", metrics[name].unit) == PENDING_INSTRUMENTS[name], name


def test_clocks_throttle_reasons_and_the_energy_counter() -> None:
    _, reader = gauges(FakeNvml(), {})
    metrics = collect(reader)
    clocks = {
        (p.attributes[semconv.HW_ID], p.attributes[semconv.GPU_CLOCK_DOMAIN]): p.value
        for p in metrics[semconv.METRIC_GPU_CLOCK].data.data_points
    }
    assert clocks[(UUIDS[0], "sm")] == 1980e6 and clocks[(UUIDS[2], "memory")] == 2617e6  # Hz
    assert metrics[semconv.METRIC_GPU_CLOCK].unit == "Hz"
    held = {
        (p.attributes[semconv.HW_ID], p.attributes[semconv.GPU_THROTTLE_REASON])
        for p in metrics[semconv.METRIC_GPU_THROTTLE].data.data_points
        if p.value == 1.0
    }
    assert held == {(UUIDS[0], "gpu_idle"), (UUIDS[1], "sw_power_cap"), (UUIDS[1], "sw_thermal_slowdown")}
    assert len(metrics[semconv.METRIC_GPU_THROTTLE].data.data_points) == 3 * 9  # every reason, 0 or 1
    energy = metrics[semconv.METRIC_HW_ENERGY]
    assert isinstance(energy.data, Sum) and energy.data.is_monotonic and energy.unit == "J"
    assert by_gpu(energy) == {UUIDS[0]: 123_456.789, UUIDS[1]: 123_456.79, UUIDS[2]: 123_456.791}


def test_readings_happen_on_the_reader_thread_only() -> None:
    nvml = FakeNvml()
    _, reader = gauges(nvml, {})
    assert nvml.threads == set()  # registering reads nothing
    thread = threading.Thread(target=reader.get_metrics_data)
    thread.start()
    thread.join()
    assert nvml.threads == {thread.ident}


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("2,0", [UUIDS[2], UUIDS[0]]),
        (f"{UUIDS[1]}", [UUIDS[1]]),
        ("1,7", [UUIDS[1]]),  # index 7 does not exist: left out, not an error
        ("1,-1,0", [UUIDS[1]]),  # CUDA stops at the first invalid entry
        ("", []),
    ],
)
def test_only_the_gpus_visible_to_the_process(visible: str, expected: list[str]) -> None:
    instruments, reader = gauges(FakeNvml(), {"CUDA_VISIBLE_DEVICES": visible})
    assert [hw_id for hw_id, _ in instruments.devices] == expected
    metrics = collect(reader)
    if expected:
        assert list(by_gpu(metrics[semconv.METRIC_HW_TEMPERATURE])) == expected
    else:
        assert not set(GPU_METRICS) & set(metrics)


def test_no_driver_no_module_no_gpu_mean_no_instruments(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="traintel._host.gpu")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    for nvml in (None, FakeNvml(fail_init=True), FakeNvml(count=0)):
        caplog.clear()
        _, reader = gauges(nvml, {})
        assert not set(GPU_METRICS) & set(collect(reader))
        assert [r.levelname for r in caplog.records] == ["DEBUG"]  # one debug line, no warning


def test_visible_entries() -> None:
    assert visible_entries({}) is None
    assert visible_entries({"CUDA_VISIBLE_DEVICES": " 3, GPU-x ,MIG-1,2"}) == ["3", "GPU-x"]


def no_cuda_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that has not initialised CUDA (yet), on any machine: only the environment and
    NVML can tell which GPU it will use."""
    monkeypatch.setitem(
        sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: False))
    )


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),  # nothing says a GPU is in use: no guess
        ({"CUDA_VISIBLE_DEVICES": UUIDS[2]}, UUIDS[2]),
        ({"CUDA_VISIBLE_DEVICES": "1"}, UUIDS[1]),  # one GPU pinned, whatever the local rank
        ({"CUDA_VISIBLE_DEVICES": "1", "LOCAL_RANK": "3"}, UUIDS[1]),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2", "LOCAL_RANK": "2"}, UUIDS[2]),
        ({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "5"}, None),
        ({"CUDA_VISIBLE_DEVICES": ""}, None),
    ],
)
def test_gpu_identity_on_the_resource(
    environ: dict[str, str], expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_cuda_yet(monkeypatch)
    assert gpu_in_use(environ, FakeNvml()) == expected
    attributes = gpu_attributes(environ, FakeNvml())
    assert attributes.get(semconv.HW_ID) == expected


def test_gpu_identity_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    no_cuda_yet(monkeypatch)
    assert gpu_in_use({"CUDA_VISIBLE_DEVICES": UUIDS[0]}, FakeNvml(fail_init=True)) == UUIDS[0]
    assert gpu_in_use({"CUDA_VISIBLE_DEVICES": "0"}, FakeNvml(fail_init=True)) is None


def test_allocator_stats_become_device_series(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch.cuda.memory_stats keys map to the pinned instruments, keyed by hw.id (a
    stand-in for torch.cuda: this machine has no CUDA)."""
    from traintel._host import system_metrics

    stats = {
        "allocated_bytes.all.current": 1000,
        "reserved_bytes.all.current": 4096,
        "allocated_bytes.all.peak": 3000,
        "num_alloc_retries": 2,
        "num_ooms": 1,
    }
    cuda = SimpleNamespace(memory_stats=lambda index: stats if index == 0 else {})
    monkeypatch.setattr(system_metrics, "_cuda_devices", lambda: [(0, UUIDS[0], cuda), (1, UUIDS[1], cuda)])
    reader = InMemoryMetricReader()
    system_metrics.SystemInstruments(MeterProvider(metric_readers=[reader]))
    metrics = collect(reader)
    expected = {
        semconv.METRIC_DEVICE_MEMORY_ALLOCATED: 1000,
        semconv.METRIC_DEVICE_MEMORY_RESERVED: 4096,
        semconv.METRIC_DEVICE_MEMORY_PEAK: 3000,
        semconv.METRIC_DEVICE_MEMORY_ALLOC_RETRIES: 2,
        semconv.METRIC_DEVICE_MEMORY_OOMS: 1,
    }
    for name, value in expected.items():
        metric = metrics[name]
        assert [(dict(p.attributes), p.value) for p in metric.data.data_points] == [
            ({semconv.HW_ID: UUIDS[0]}, value)
        ]
        kind = "gauge" if isinstance(metric.data, Gauge) else "counter"
        assert (kind, metric.unit) == PENDING_INSTRUMENTS[name], name


class FakeTorchCuda:
    """torch.cuda as a job that initialised CUDA on device 1 sees it (no CUDA here)."""

    def __init__(self, uuid: str | None) -> None:
        self.uuid = uuid

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 1

    def get_device_properties(self, index: int) -> Any:
        return SimpleNamespace(uuid=self.uuid)


def test_an_initialised_cuda_device_wins_and_is_spelled_as_nvml_does(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"CUDA_VISIBLE_DEVICES": UUIDS[0]}
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=FakeTorchCuda("bbbbbbbb-1111")))
    assert gpu_in_use(environ) == UUIDS[1]  # torch's uuid has no "GPU-" prefix; NVML's has
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=FakeTorchCuda(None)))
    assert gpu_in_use(environ) == "cuda:1"
