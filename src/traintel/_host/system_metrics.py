"""Process and device gauges, sampled when a metric reader collects — never on the training thread.

Why observable instruments: the torch.monitor review (reference 002) asks for passive counters
that the collection side samples, not values the training loop pushes. A job without a reader
pays nothing; with one, the cost lands on the reader's thread once per export interval.

What is reported: the process' CPU utilisation (OTel ``process.cpu.utilization``: CPU time
since the previous collection / elapsed time / CPUs available to the process) and resident
memory (``process.memory.usage``); and, when the job itself has imported torch and initialised
CUDA, the caching allocator's allocated / reserved / peak bytes and its allocation retries and
OOMs per device (``torch.cuda.memory_stats``), keyed by ``hw.id`` (the GPU UUID, so the series
join dcgm-exporter's). traintel never imports torch or initialises CUDA for this: without a GPU
those instruments simply report nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry.metrics import CallbackOptions, Observation

from traintel import semconv
from traintel._host.gpu import initialised_cuda, torch_uuid
from traintel.version import __version__


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resident_bytes() -> int | None:
    """This process' resident set size, from /proc on Linux, else psutil if installed."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


class ProcessCpu:
    """CPU utilisation between two collections (the first one measures since the process began)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        times = os.times()
        self._cpu = times.user + times.system
        self._wall = time.monotonic()
        self._cpus = _available_cpus()

    def utilization(self) -> float:
        with self._lock:
            times = os.times()
            cpu, wall = times.user + times.system, time.monotonic()
            used, elapsed = cpu - self._cpu, wall - self._wall
            self._cpu, self._wall = cpu, wall
        return max(0.0, used / elapsed / self._cpus) if elapsed > 0 else 0.0


def _cuda_devices() -> list[tuple[int, str, Any]]:
    """(index, hw.id, torch.cuda) for each device, only when the job has already set CUDA up."""
    cuda = initialised_cuda()
    try:
        devices = range(cuda.device_count()) if cuda is not None else ()
        return [(index, torch_uuid(cuda, index), cuda) for index in devices]
    except Exception:
        return []


#: (metric, ``memory_stats`` key, unit): the byte amounts are gauges, the event counts counters.
_ALLOCATOR = (
    (semconv.METRIC_DEVICE_MEMORY_ALLOCATED, "allocated_bytes.all.current", "By"),
    (semconv.METRIC_DEVICE_MEMORY_RESERVED, "reserved_bytes.all.current", "By"),
    (semconv.METRIC_DEVICE_MEMORY_PEAK, "allocated_bytes.all.peak", "By"),
    (semconv.METRIC_DEVICE_MEMORY_ALLOC_RETRIES, "num_alloc_retries", "{retry}"),
    (semconv.METRIC_DEVICE_MEMORY_OOMS, "num_ooms", "{oom}"),
)


class SystemInstruments:
    """Registers the gauges; the callbacks run on the metric reader's thread."""

    def __init__(self, meter_provider: metrics_api.MeterProvider) -> None:
        meter = meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE, __version__)
        self._cpu = ProcessCpu()
        for name, callback, unit, description in (
            (semconv.METRIC_PROCESS_CPU_UTILIZATION, self._cpu_callback, "1",
             "CPU time of this process since the last collection / elapsed time / available CPUs"),
            (semconv.METRIC_PROCESS_MEMORY_USAGE, self._memory_callback, "By",
             "Resident memory of this process"),
        ):  # fmt: skip
            meter.create_observable_gauge(name, [callback], unit=unit, description=description)
        for name, key, unit in _ALLOCATOR:
            create = meter.create_observable_gauge if unit == "By" else meter.create_observable_counter
            create(name, [self._allocator_callback(key)], unit=unit, description=f"torch.cuda {key}")

    def _cpu_callback(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self._cpu.utilization())]

    def _memory_callback(self, options: CallbackOptions) -> Iterable[Observation]:
        rss = resident_bytes()
        return [] if rss is None else [Observation(rss)]

    @staticmethod
    def _allocator_callback(key: str) -> Any:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            observations = []
            for index, hw_id, cuda in _cuda_devices():
                try:
                    value = cuda.memory_stats(index).get(key)
                except Exception:
                    continue
                if value is not None:
                    observations.append(Observation(value, {semconv.HW_ID: hw_id}))
            return observations

        return callback
