"""GPU identity and NVML gauges (``hw.gpu.*``), sampled by the metric reader — never by training.

Why NVML and not torch: utilisation, temperature and power are not visible to PyTorch, and the
same readings are what dcgm-exporter publishes, so using the OTel ``hw.*`` names keyed by
``hw.id`` = the GPU UUID lets a dashboard join traintel's series with the node's. NVML comes
from ``nvidia-ml-py`` (``pip install traintel[gpu]``); without it, without a driver or without a
GPU, the instruments are simply not registered (one debug log, nothing per step).

Which GPUs: those this process can see — ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs) when
it is set, else every GPU NVML lists. Indices are taken in NVML's (PCI bus) order, which is
CUDA's too when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and on nodes of identical GPUs.

Clocks and clock-limiting ("throttle") reasons have no OTel convention for GPUs yet, hence
``traintel.gpu.clock`` / ``traintel.gpu.throttle``; the energy counter is the conventions'
``hw.energy``. The memory, utilisation, temperature and power gauges ran on an H100
(2026-11-24); the clock, throttle and energy readings are nvidia-ml-py's documented calls, not
yet run on a GPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry.metrics import CallbackOptions, Observation

from traintel import semconv
from traintel.version import __version__

_logger = logging.getLogger(__name__)

#: NVML's clock domains by the name the gauge gives them.
_CLOCKS = (("sm", "NVML_CLOCK_SM"), ("memory", "NVML_CLOCK_MEM"))
#: NVML's clock event ("throttle") reasons, bit by bit (nvmlClocksEventReason*).
THROTTLE_REASONS = (
    ("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8), ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40), ("hw_power_brake_slowdown", 0x80), ("display_clock_setting", 0x100),
)  # fmt: skip


def load_nvml() -> Any | None:
    """The ``pynvml`` module (nvidia-ml-py) if it is installed, else None."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return pynvml


def initialised_cuda() -> Any | None:
    """``torch.cuda`` once the job itself has initialised CUDA, else None. Never initialises it
    (that would create a context of several hundred MB on the GPU of a job that may never use
    one), nor imports torch."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def torch_uuid(cuda: Any, index: int) -> str:
    """``hw.id`` of a torch CUDA device: ``GPU-<uuid>`` as NVML and dcgm-exporter spell it."""
    uuid = getattr(cuda.get_device_properties(index), "uuid", None)
    if uuid is None:
        return f"cuda:{index}"
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def visible_entries(environ: Mapping[str, str]) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as a list (None when unset). As CUDA does, the list stops at
    the first entry that is neither an index nor a UUID."""
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    entries = []
    for entry in (part.strip() for part in raw.split(",")):
        if not (entry.isdigit() or entry.startswith("GPU-")):
            break
        entries.append(entry)
    return entries


def _handle(nvml: Any, entry: str) -> Any:
    if entry.startswith("GPU-"):
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    return nvml.nvmlDeviceGetHandleByIndex(int(entry))


def nvml_devices(nvml: Any, environ: Mapping[str, str]) -> list[tuple[str, Any]]:
    """(hw.id, NVML handle) of each GPU visible to this process; NVML must be initialised."""
    entries = visible_entries(environ)
    if entries is None:
        entries = [str(index) for index in range(int(nvml.nvmlDeviceGetCount()))]
    devices = []
    for entry in entries:
        try:
            handle = _handle(nvml, entry)
            devices.append((_text(nvml.nvmlDeviceGetUUID(handle)), handle))
        except Exception as exc:  # an index past the last GPU, a MIG instance...
            _logger.debug("traintel: NVML cannot read GPU %s: %s", entry, exc)
    return devices


def _pinned_entry(environ: Mapping[str, str]) -> str | None:
    """This local rank's ``CUDA_VISIBLE_DEVICES`` entry: the only one, or the LOCAL_RANK-th."""
    entries = visible_entries(environ) or []
    local = environ.get("LOCAL_RANK", "0").strip()
    index = int(local) if local.isdigit() and len(entries) > 1 else 0
    return entries[index] if index < len(entries) else None


def gpu_in_use(environ: Mapping[str, str], nvml: Any | None = None) -> str | None:
    """``hw.id`` of the GPU this process trains on, or None when that is not known.

    Exact when the job has already initialised CUDA (the current device). Before that, only
    what the scheduler pinned: the ``CUDA_VISIBLE_DEVICES`` entry of this local rank (its only
    entry, or the LOCAL_RANK-th), as a UUID directly or an index resolved through NVML. No
    ``CUDA_VISIBLE_DEVICES`` and no CUDA yet: None, rather than a guess on a CPU-only job.
    """
    cuda = initialised_cuda()
    with contextlib.suppress(Exception):
        if cuda is not None:
            return torch_uuid(cuda, cuda.current_device())
    entry = _pinned_entry(environ)
    if entry is None or entry.startswith("GPU-"):
        return entry
    nvml = load_nvml() if nvml is None else nvml
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
        return _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(int(entry))))
    except Exception as exc:
        _logger.debug("traintel: no GPU UUID from NVML: %s", exc)
        return None


_Series = Callable[[Any, Any], list[tuple[float, dict[str, str]]]]


def _one(read: Callable[[Any, Any], float]) -> _Series:
    """A reading of one value per GPU, as a series of one without attributes of its own."""
    return lambda nvml, handle: [(read(nvml, handle), {})]


def _clocks(nvml: Any, handle: Any) -> list[tuple[float, dict[str, str]]]:
    return [  # NVML: MHz
        (
            float(nvml.nvmlDeviceGetClockInfo(handle, getattr(nvml, constant))) * 1e6,
            {semconv.GPU_CLOCK_DOMAIN: name},
        )
        for name, constant in _CLOCKS
    ]


def _throttle(nvml: Any, handle: Any) -> list[tuple[float, dict[str, str]]]:
    mask = int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))  # nvidia-ml-py >= 12.535
    return [(float(bool(mask & bit)), {semconv.GPU_THROTTLE_REASON: name}) for name, bit in THROTTLE_REASONS]


#: (metric, unit, the series read from (nvml, handle), description, counter or gauge). NVML's
#: units converted to UCUM.
_SERIES: tuple[tuple[str, str, _Series, str, bool], ...] = (
    (semconv.METRIC_HW_GPU_MEMORY_USAGE, "By",
     _one(lambda nvml, handle: float(nvml.nvmlDeviceGetMemoryInfo(handle).used)),
     "GPU memory in use (all processes, NVML)", False),
    (semconv.METRIC_HW_GPU_MEMORY_LIMIT, "By",
     _one(lambda nvml, handle: float(nvml.nvmlDeviceGetMemoryInfo(handle).total)),
     "GPU memory size (NVML)", False),
    (semconv.METRIC_HW_GPU_UTILIZATION, "1",
     _one(lambda nvml, handle: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0),  # NVML: percent
     "Fraction of time a kernel ran (NVML)", False),
    (semconv.METRIC_HW_TEMPERATURE, "Cel",
     _one(lambda nvml, handle: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
     "GPU die temperature (NVML)", False),
    (semconv.METRIC_HW_POWER, "W",
     _one(lambda nvml, handle: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),  # NVML: milliwatts
     "GPU power draw (NVML)", False),
    (semconv.METRIC_GPU_CLOCK, "Hz", _clocks, "GPU clock by domain, sm or memory (NVML)", False),
    (semconv.METRIC_GPU_THROTTLE, "1", _throttle,
     "1 for each reason now holding the GPU's clocks below their maximum (NVML)", False),
    (semconv.METRIC_HW_ENERGY, "J",
     _one(lambda nvml, handle: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0),  # NVML: mJ
     "GPU energy since the driver loaded (NVML counter)", True),
)  # fmt: skip


class GpuInstruments:
    """Registers the NVML gauges when NVML sees a GPU; their callbacks run on the reader's thread."""

    def __init__(
        self,
        meter_provider: metrics_api.MeterProvider,
        nvml: Any | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.devices: list[tuple[str, Any]] = []
        self._nvml = load_nvml() if nvml is None else nvml
        if self._nvml is None:
            _logger.debug("traintel: no GPU gauges (no nvidia-ml-py: pip install 'traintel[gpu]')")
            return
        try:
            self._nvml.nvmlInit()
            self.devices = nvml_devices(self._nvml, os.environ if environ is None else environ)
        except Exception as exc:  # no driver, no GPU
            _logger.debug("traintel: no GPU gauges (NVML: %s)", exc)
            return
        if not self.devices:
            _logger.debug("traintel: no GPU gauges (NVML lists no GPU visible to this process)")
            return
        meter = meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE, __version__)
        for name, unit, series, description, counter in _SERIES:
            create = meter.create_observable_counter if counter else meter.create_observable_gauge
            create(name, [self._series_callback(series)], unit=unit, description=description)

    def _series_callback(self, read: _Series) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            observations: list[Observation] = []
            for hw_id, handle in self.devices:
                try:  # a reading a GPU does not support (power on some boards) is left out
                    series = read(self._nvml, handle)
                except Exception:
                    continue
                key = {semconv.HW_ID: hw_id, semconv.HW_TYPE: "gpu"}
                observations.extend(Observation(value, {**key, **extra}) for value, extra in series)
            return observations

        return callback
