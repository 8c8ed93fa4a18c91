"""traintel's GPU paths on a real CUDA device, in one report.

    python benchmarks/gpu_check.py [--json results.json]

Each check is a function returning plain numbers, so ``tests/test_gpu_cuda.py`` (marked
``gpu``) asserts on the same measurements this script prints:

- **sync-free step**: a bf16 transformer step with every GPU feature on (CUDA-event timing,
  NVTX, NVML gauges, allocator gauges and window memory peaks, MFU from ``measure_flops``)
  runs under ``torch.cuda.set_sync_debug_mode("error")`` between the loop's own syncs, and
  traintel's device times are compared with CUDA events the check records itself;
- **NVML gauges** and ``hw.id`` (on the series and on the Resource);
- **peak and MFU**: the device's dense peak for the autocast dtype, whether autocast wraps the
  whole iteration or only the forward pass, and the MFU's arithmetic;
- **overhead** on a launch-bound step and on a real (~20 ms) step, with and without traintel,
  in interleaved rounds of one process;
- **energy**: ~30 s of training with every GPU feature on; the windows' energies against the
  NVML counter's delta over the loop read by the check itself, the job's against the delta over
  the job, the categories' sum, J per token, the cost of one counter read and how often the
  counter moves;
- **measured peak**: the bf16 matmul calibration three times (its spread), against the datasheet;
- **two NCCL ranks** with a straggler, when the machine has two GPUs.

Run on a machine without CUDA it says so, checks what it can without one (the calibration on
CPU, the script's own arithmetic), and exits 0. ``scripts/gpu-device-check.sh`` runs it with
the ``gpu``-marked tests and keeps everything under ``$OUT``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch import nn

import traintel
from traintel import semconv
from traintel._host.gpu import torch_uuid
from traintel.flops import peak_flops_for

W = semconv.WINDOW_PREFIX
DT = semconv.WINDOW_DEVICE_TIME_PREFIX
PHASES = ("forward", "backward", "optimizer")
GPU_GAUGES = (
    semconv.METRIC_HW_GPU_MEMORY_USAGE,
    semconv.METRIC_HW_GPU_MEMORY_LIMIT,
    semconv.METRIC_HW_GPU_UTILIZATION,
    semconv.METRIC_HW_TEMPERATURE,
    semconv.METRIC_HW_POWER,
    semconv.METRIC_HW_ENERGY,
)
#: Several series per GPU, told apart by this attribute.
GPU_SERIES = {
    semconv.METRIC_GPU_CLOCK: semconv.GPU_CLOCK_DOMAIN,
    semconv.METRIC_GPU_THROTTLE: semconv.GPU_THROTTLE_REASON,
}
ALLOCATOR_GAUGES = (
    semconv.METRIC_DEVICE_MEMORY_ALLOCATED,
    semconv.METRIC_DEVICE_MEMORY_RESERVED,
    semconv.METRIC_DEVICE_MEMORY_PEAK,
)


#: Where the models run (``--cpu-dry-run`` sets "cpu": the script's own logic, small and quick).
DEVICE = "cuda"


def cuda_available() -> bool:
    return torch.cuda.is_available()


def on_gpu() -> bool:
    return DEVICE != "cpu"


def synchronize() -> None:
    if on_gpu():
        torch.cuda.synchronize()


# --- the model -----------------------------------------------------------------------------------
class Block(nn.Module):
    """A pre-norm GPT block: causal SDPA attention and a 4x GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGpt(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@dataclass(frozen=True)
class ModelSize:
    vocab: int = 32768
    width: int = 1024
    layers: int = 8
    heads: int = 16
    seq: int = 1024
    batch: int = 8


# --- sync debug mode -----------------------------------------------------------------------------
@contextmanager
def sync_debug(mode: str) -> Iterator[None]:
    if not on_gpu():
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def sync_debug_catches_a_sync() -> bool:
    """The control: under mode "error" an implicit synchronisation does raise in this build."""
    if not on_gpu():
        return False
    probe = torch.ones(1, device="cuda")
    try:
        with sync_debug("error"):
            probe.item()
    except RuntimeError:
        return True
    return False


class LogRecorder(logging.Handler):
    """Everything traintel logs, at any level: a device hook that failed (a sync raising under
    debug mode, say) is swallowed and logged at debug level, never raised into training."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def traintel_logs() -> Iterator[LogRecorder]:
    recorder = LogRecorder()
    logger = logging.getLogger("traintel")
    level = logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.DEBUG)
    try:
        yield recorder
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(level)


# --- 1-3: the instrumented transformer loop ------------------------------------------------------
@dataclass
class TrainingCheck:
    autocast_scope: str
    steps: int
    device_name: str
    sync_debug_control: bool  # mode "error" raises on an implicit sync in this build
    sync_errors: list[str]  # raised into the loop under mode "error" (must be empty)
    traintel_log: list[str]  # what traintel logged (a swallowed failure would show here)
    traintel_device_s: dict[str, float]
    traintel_device_counts: dict[str, int]
    own_device_s: dict[str, float]
    pending_at_end: int
    dropped: int
    window_memory_peaks: list[int]
    nvml: dict[str, list[tuple[str, float]]]  # metric -> [(hw.id, value)]
    #: clocks and throttle reasons: metric -> {series (domain / reason): value} of this GPU
    nvml_series: dict[str, dict[str, float]]
    allocator: dict[str, list[tuple[str, float]]]
    torch_hw_id: str
    resource_hw_id: str | None
    model_flops_per_step: int
    windows: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)  # the training_window spans
    summary: dict[str, Any] = field(default_factory=dict)
    own_step_s: float = 0.0  # mean device time of forward + backward + optimizer, own events
    expected_peak: float | None = None
    expected_peak_source: str | None = None


def _metric_points(
    reader: InMemoryMetricReader, names: tuple[str, ...]
) -> dict[str, list[tuple[str, float]]]:
    data = reader.get_metrics_data()
    found: dict[str, list[tuple[str, float]]] = {name: [] for name in names}
    if data is None:
        return found
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name in found:
                    for point in metric.data.data_points:
                        attributes = point.attributes or {}
                        hw_id = str(attributes.get(semconv.HW_ID, ""))
                        series = GPU_SERIES.get(metric.name)
                        if series is not None:  # "<hw.id> <series>", e.g. "GPU-... sm"
                            hw_id += " " + str(attributes.get(series, ""))
                        found[metric.name].append((hw_id, float(point.value)))
    return found


def _autocast() -> Any:
    return torch.autocast("cuda" if on_gpu() else "cpu", dtype=torch.bfloat16)


class _WallEvent:
    """``torch.cuda.Event`` on CPU (the dry run): a wall-clock stamp."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: _WallEvent) -> float:
        return (end.t - self.t) * 1000.0


def _event() -> Any:
    return torch.cuda.Event(enable_timing=True) if on_gpu() else _WallEvent()


def instrumented_training(
    autocast_scope: str = "forward", steps: int = 60, sync_every: int = 20, size: ModelSize | None = None
) -> TrainingCheck:
    """Train ``steps`` steps with every GPU feature on and the sync debug mode at "error",
    except at the loop's own syncs (``loss.item()`` every ``sync_every`` steps and at the last).

    ``autocast_scope``: "iteration" wraps the whole iteration in bf16 autocast, "forward"
    only the forward phase (where most training loops put it)."""
    size = size or ModelSize()
    torch.manual_seed(0)
    device = torch.device(DEVICE)
    model = TinyGpt(size.vocab, size.width, size.layers, size.heads, size.seq).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=on_gpu())
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def loss_of(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().reshape(-1, size.vocab), targets.reshape(-1))

    # Warm-up steps without traintel: CUDA, cuBLAS and the allocator are set up, as in a job
    # that configures telemetry after building its model.
    for _ in range(3):
        with _autocast():
            loss = loss_of(model(inputs))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize()

    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    traintel.configure(
        span_exporters=[exporter],
        metric_readers=[reader],
        cuda_event_timing="on",
        nvtx="on",
        measure_peak="on",  # its one deliberate sync, at the first window close
        window_events="on",
        log_every_n_iterations=10,
        global_batch_size=size.batch,
        seq_len=size.seq,
    )
    count = traintel.measure_flops(model, inputs)  # on the meta device: nothing runs
    traintel.apply_flops(count)
    control = sync_debug_catches_a_sync()

    own: dict[str, list[tuple[Any, Any]]] = {phase: [] for phase in PHASES}

    @contextmanager
    def own_timing(phase: str) -> Iterator[None]:
        start, end = _event(), _event()
        start.record()
        yield
        end.record()
        own[phase].append((start, end))

    sync_errors: list[str] = []
    nvml: dict[str, list[tuple[str, float]]] = {}
    nvml_series: dict[str, dict[str, float]] = {}
    allocator: dict[str, list[tuple[str, float]]] = {}
    iteration_autocast = _autocast if autocast_scope == "iteration" else nullcontext
    forward_autocast = _autocast if autocast_scope == "forward" else nullcontext
    with traintel_logs() as logs:
        try:
            with sync_debug("error"), traintel.training_loop(train_iterations_target=steps):
                for step in range(1, steps + 1):
                    with traintel.training_iteration(samples=size.batch), iteration_autocast():
                        with forward_autocast(), traintel.model_forward(), own_timing("forward"):
                            loss = loss_of(model(inputs))
                        with traintel.model_backward(), own_timing("backward"):
                            loss.backward()
                        with traintel.optimizer_update(), own_timing("optimizer"):
                            optimizer.step()
                            optimizer.zero_grad(set_to_none=True)
                        if step % sync_every == 0 or step == steps:
                            with sync_debug("default"):  # the loop's own sync
                                traintel.record_metrics(loss=loss.item())
                                if step == steps:
                                    synchronize()  # every event done before the loop ends
                    if step == steps // 2:  # a collection while the GPU is busy (the reader's job)
                        points = _metric_points(reader, GPU_GAUGES + ALLOCATOR_GAUGES + tuple(GPU_SERIES))
                        nvml = {name: points[name] for name in GPU_GAUGES}
                        allocator = {name: points[name] for name in ALLOCATOR_GAUGES}
                        ours = torch_uuid(torch.cuda, torch.cuda.current_device()) if on_gpu() else "cpu"
                        nvml_series = {
                            name: {key.split(" ", 1)[1]: v for key, v in points[name] if key.startswith(ours)}
                            for name in GPU_SERIES
                        }
        except RuntimeError as exc:
            sync_errors.append(str(exc))
        traintel.shutdown(5)
    synchronize()

    windows = [
        dict(event.attributes or {})
        for span in exporter.get_finished_spans()
        for event in span.events
        if event.name == semconv.Event.TRAINING_METRICS_UPDATE.value
    ]
    loops = [s for s in exporter.get_finished_spans() if s.name == semconv.Phase.TRAINING_LOOP.value]
    resources = {
        str(s.resource.attributes.get(semconv.HW_ID)) for s in exporter.get_finished_spans() if s.resource
    }
    traintel_s = {p: sum(float(w.get(DT + p, 0.0)) for w in windows) for p in PHASES}
    traintel_n = {p: sum(int(w.get(DT + p + ".count", 0)) for w in windows) for p in PHASES}
    own_s = {p: sum(a.elapsed_time(b) for a, b in own[p]) / 1000.0 for p in PHASES}
    name = torch.cuda.get_device_name() if on_gpu() else "cpu"
    peak = peak_flops_for(name, "bf16")
    return TrainingCheck(
        autocast_scope=autocast_scope,
        steps=steps,
        device_name=name,
        sync_debug_control=control,
        sync_errors=sync_errors,
        traintel_log=logs.messages,
        traintel_device_s=traintel_s,
        traintel_device_counts=traintel_n,
        own_device_s=own_s,
        pending_at_end=int(windows[-1].get(semconv.WINDOW_DEVICE_TIME_PENDING, -1)) if windows else -1,
        dropped=sum(int(w.get(semconv.WINDOW_DEVICE_TIME_DROPPED, 0)) for w in windows),
        window_memory_peaks=[int(w.get(semconv.WINDOW_DEVICE_MEMORY_PEAK_ALLOCATED, -1)) for w in windows],
        nvml=nvml,
        nvml_series=nvml_series,
        allocator=allocator,
        torch_hw_id=torch_uuid(torch.cuda, torch.cuda.current_device()) if on_gpu() else "cpu",
        resource_hw_id=resources.pop() if len(resources) == 1 else ",".join(sorted(resources)),
        model_flops_per_step=count.model_flops,
        windows=windows,
        records=[
            dict(s.attributes or {})
            for s in exporter.get_finished_spans()
            if s.name == semconv.TRAINING_WINDOW_SPAN
        ],
        summary=dict(loops[0].attributes or {}) if loops else {},
        own_step_s=sum(own_s.values()) / steps,
        expected_peak=peak.peak_flops,
        expected_peak_source=peak.source,
    )


def window_mfu_expected(window: dict[str, Any], model_flops_per_step: int, peak: float) -> float:
    """A window's MFU from its own iteration count and mean time: FLOPs / time / peak."""
    iterations = int(window[W + "iterations"])
    seconds = float(window[W + "iteration_time.mean"]) * iterations
    return model_flops_per_step * iterations / seconds / peak


# --- 4: overhead on a launch-bound step ----------------------------------------------------------
@dataclass
class OverheadCheck:
    """Per round: the bare and instrumented mean step times (ms), wall clock and the training
    thread's CPU time; a round's ratio pairs its two runs, so slow drift cancels."""

    features: str
    steps_per_round: int
    wall_bare: list[float]
    wall_traintel: list[float]
    cpu_bare: list[float]
    cpu_traintel: list[float]

    @property
    def ratios(self) -> list[float]:
        return [t / b for t, b in zip(self.wall_traintel, self.wall_bare, strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def added_cpu_us(self) -> float:
        """Median extra CPU time of the training thread per step, µs (what traintel runs)."""
        return statistics.median(
            (t - b) * 1000.0 for t, b in zip(self.cpu_traintel, self.cpu_bare, strict=True)
        )


#: What each overhead variant turns on besides the defaults (NVML gauges and the energy counter
#: are on wherever nvidia-ml-py is installed), and its step: "small" is launch-bound (a few ms,
#: traintel's worst case), "real" a ~20 ms transformer step on an H100.
OVERHEAD_FEATURES: dict[str, dict[str, object]] = {
    "default": {},
    "gpu": {"cuda_event_timing": "on", "nvtx": "on"},
    "gpu_real_step": {"cuda_event_timing": "on", "nvtx": "on"},
}
OVERHEAD_SIZES = {
    "small": ModelSize(vocab=1024, width=256, layers=2, heads=4, seq=128, batch=8),
    "real": ModelSize(),
}
#: (rounds, steps per round) of each variant: a few seconds to a minute each on an H100.
OVERHEAD_PLAN = {"default": (15, 200), "gpu": (15, 200), "gpu_real_step": (6, 30)}


def overhead_here(features: str, rounds: int, steps: int) -> OverheadCheck:
    """Median step time of a transformer (``OVERHEAD_SIZES``), bare and instrumented, in
    alternating rounds of one run: traintel configured once, as a job does, with the embedded
    default (the file exporter) that a job with no OTEL_* settings gets."""
    torch.manual_seed(0)
    size = OVERHEAD_SIZES["real" if features.endswith("real_step") else "small"]
    if not on_gpu():
        size = ModelSize(vocab=128, width=32, layers=1, heads=2, seq=16, batch=2)
    model = TinyGpt(size.vocab, size.width, size.layers, size.heads, size.seq).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq + 1), device=DEVICE)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step_bare() -> None:
        with _autocast():
            loss = F.cross_entropy(model(inputs).float().reshape(-1, size.vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def step_traintel() -> None:
        with traintel.training_iteration(samples=size.batch):
            with _autocast(), traintel.model_forward():
                loss = F.cross_entropy(model(inputs).float().reshape(-1, size.vocab), targets.reshape(-1))
            with traintel.model_backward():
                loss.backward()
            with traintel.optimizer_update():
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    def timed(step: Callable[[], None]) -> tuple[float, float]:
        synchronize()
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            step()
        synchronize()
        return (time.perf_counter() - wall) / steps * 1000.0, (time.thread_time() - cpu) / steps * 1000.0

    check = OverheadCheck(features, steps, [], [], [], [])
    with tempfile.TemporaryDirectory(prefix="traintel-gpu-") as tmp:
        traintel.configure(output_dir=tmp, **OVERHEAD_FEATURES[features])
        with traintel.training_loop():
            timed(step_bare)  # warm-up, both
            timed(step_traintel)
            for round_ in range(rounds):
                for step in (step_bare, step_traintel) if round_ % 2 == 0 else (step_traintel, step_bare):
                    wall, cpu = timed(step)
                    if step is step_bare:
                        check.wall_bare.append(wall)
                        check.cpu_bare.append(cpu)
                    else:
                        check.wall_traintel.append(wall)
                        check.cpu_traintel.append(cpu)
        traintel.shutdown(5)
    return check


def overhead(features: str = "default", rounds: int = 15, steps: int = 200) -> OverheadCheck:
    """:func:`overhead_here` in a fresh process (no state from other checks)."""
    with tempfile.TemporaryDirectory(prefix="traintel-overhead-") as tmp:
        out = Path(tmp) / "overhead.json"
        dry = [] if on_gpu() else ["--cpu-dry-run"]
        subprocess.run(
            [sys.executable, __file__, "--overhead", features, "--rounds", str(rounds), "--steps", str(steps),
             "--json", str(out), *dry],
            check=True,
        )  # fmt: skip
        return OverheadCheck(**json.loads(out.read_text()))


# --- 5: energy -----------------------------------------------------------------------------------
@dataclass
class EnergyCheck:
    """A ~``seconds`` loop with every GPU feature on, and NVML's counter read by the check itself
    around it (``own_*``, J): the windows' energies must add up to the loop's delta and the
    job's (the application span's) to the job's, within the counter's granularity."""

    seconds: float
    steps: int = 0
    skipped: str | None = None
    window_joules: list[float] = field(default_factory=list)
    own_loop_joules: float = 0.0
    job_joules: float | None = None
    own_job_joules: float = 0.0
    categories: dict[str, float] = field(default_factory=dict)
    loop_summary: dict[str, Any] = field(default_factory=dict)
    per_token: float | None = None
    read_us: float = 0.0  # one counter read, median
    counter_step_ms: float | None = None  # the smallest interval at which the counter moved
    mfu: float | None = None
    mfu_measured: float | None = None
    measured_peak: float | None = None

    @property
    def window_error(self) -> float:
        return _relative(sum(self.window_joules), self.own_loop_joules)

    @property
    def job_error(self) -> float:
        return _relative(self.job_joules or 0.0, self.own_job_joules)

    @property
    def category_sum_error(self) -> float:
        return _relative(math.fsum(self.categories.values()), self.job_joules or 0.0)


class DryRunNvml:
    """The CPU dry run's stand-in for ``pynvml`` (hardware, not OpenTelemetry): one GPU drawing
    100 W on the wall clock, so the energy check's own arithmetic runs without a GPU."""

    @staticmethod
    def nvmlInit() -> None:
        pass

    @staticmethod
    def nvmlDeviceGetCount() -> int:
        return 1

    @staticmethod
    def nvmlDeviceGetHandleByIndex(index: int) -> int:
        return index

    @staticmethod
    def nvmlDeviceGetUUID(handle: int) -> str:
        return "GPU-dry-run"

    @staticmethod
    def nvmlDeviceGetTotalEnergyConsumption(handle: int) -> int:
        return round(time.time() * 100_000)  # mJ at 100 W


def _own_counter() -> Callable[[], float] | None:
    """NVML's energy counter of this process's GPU, in J, read by the check itself."""
    if not on_gpu():
        nvml = sys.modules.get("pynvml")
        return (lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(0) / 1000.0) if nvml is DryRunNvml else None
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(torch_uuid(torch.cuda, torch.cuda.current_device()))
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception:
        return None
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0


def _counter_step_ms(read: Callable[[], float], seconds: float = 0.5) -> float | None:
    """How often the counter moves: the shortest time between two changes, polled each 1 ms."""
    changes, last, end = [], read(), time.perf_counter() + seconds
    while time.perf_counter() < end:
        value = read()
        if value != last:
            changes.append(time.perf_counter())
            last = value
        time.sleep(0.001)
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    return min(gaps) * 1000.0 if gaps else None


def energy_check(seconds: float = 30.0, size: ModelSize | None = None) -> EnergyCheck:
    """Train for ``seconds`` (a 0.2 s data wait every 25 steps, a 1 s checkpoint save halfway)
    with every GPU feature on, windows of at most 3 s."""
    check = EnergyCheck(seconds)
    read = _own_counter()
    if read is None:
        check.skipped = "no NVML energy counter for this device"
        return check
    reads = []
    for _ in range(50):
        begin = time.perf_counter_ns()
        read()
        reads.append((time.perf_counter_ns() - begin) / 1000.0)
    check.read_us = statistics.median(reads)
    check.counter_step_ms = _counter_step_ms(read)
    size = size or ModelSize()
    torch.manual_seed(0)
    model = TinyGpt(size.vocab, size.width, size.layers, size.heads, size.seq).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=on_gpu())
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq + 1), device=DEVICE)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    synchronize()
    own_start = read()
    traintel.configure(
        span_exporters=[exporter], metric_readers=[reader], cuda_event_timing="on", nvtx="on",
        measure_peak="on", log_every_n_iterations=100_000, window_min_seconds=0, log_every_n_seconds=3,
        global_batch_size=size.batch, seq_len=size.seq, energy_price_per_kwh=0.3,
    )  # fmt: skip
    traintel.apply_flops(traintel.measure_flops(model, inputs))
    with traintel.application():
        with traintel.training_loop():
            begin = time.perf_counter()
            saved = False
            while time.perf_counter() - begin < seconds:
                check.steps += 1
                with traintel.training_iteration(samples=size.batch):
                    if check.steps % 25 == 0:
                        with traintel.data_loading():
                            time.sleep(0.2)
                    with _autocast(), traintel.model_forward():
                        loss = F.cross_entropy(
                            model(inputs).float().reshape(-1, size.vocab), targets.reshape(-1)
                        )
                    with traintel.model_backward():
                        loss.backward()
                    with traintel.optimizer_update():
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                if not saved and time.perf_counter() - begin > seconds / 2:
                    saved = True
                    synchronize()
                    with traintel.checkpoint_save():
                        time.sleep(1.0)
            synchronize()
        check.own_loop_joules = read() - own_start
    check.own_job_joules = read() - own_start
    traintel.shutdown(5)
    spans = exporter.get_finished_spans()
    check.window_joules = [
        float((s.attributes or {}).get(W + "energy", 0.0))
        for s in spans
        if s.name == semconv.TRAINING_WINDOW_SPAN
    ]
    (app,) = [dict(s.attributes or {}) for s in spans if s.name == semconv.Phase.APPLICATION.value]
    check.job_joules = app.get("ml.training.energy")
    check.per_token = app.get("ml.training.energy.per_token")
    check.categories = {
        k.removeprefix("ml.training.energy."): float(v)
        for k, v in app.items()
        if k.startswith("ml.training.energy.")
        and k.rsplit(".", 1)[-1] not in ("time", "per_token", "per_sample", "cost")
    }
    (loop,) = [dict(s.attributes or {}) for s in spans if s.name == semconv.Phase.TRAINING_LOOP.value]
    check.loop_summary = {k: v for k, v in loop.items() if "energy" in k or "mfu" in k}
    check.mfu = loop.get(semconv.SUMMARY_PREFIX + "mfu")
    check.mfu_measured = loop.get(semconv.SUMMARY_PREFIX + "mfu_measured")
    check.measured_peak = loop.get(semconv.SUMMARY_PREFIX + "mfu.measured_peak_flops")
    return check


# --- 6: the measured peak ------------------------------------------------------------------------
@dataclass
class PeakCheck:
    dtype: str
    runs: list[float]
    methods: list[str]
    seconds: list[float]
    datasheet: float | None

    @property
    def spread(self) -> float:
        """(max - min) / median of the runs: within ±2 % is max/min - 1 <= 4 %, median-centred."""
        return (max(self.runs) - min(self.runs)) / statistics.median(self.runs) if self.runs else math.inf


def peak_check(runs: int = 3, dtype: str = "bf16") -> PeakCheck:
    from traintel._host.calibration import measure_peak

    name = torch.cuda.get_device_name() if on_gpu() else "cpu"
    check = PeakCheck(dtype, [], [], [], peak_flops_for(name, dtype).peak_flops)
    for _ in range(runs):
        found = (
            measure_peak(dtype, device=DEVICE, size=None, budget_s=15.0)
            if on_gpu()
            else (measure_peak(dtype, device=DEVICE, size=64, budget_s=1.0, warm_s=0.0))
        )
        if found is not None:
            check.runs.append(found.flops_per_second)
            check.methods.append(found.method)
            check.seconds.append(found.seconds)
    return check


# --- 5: two NCCL ranks ---------------------------------------------------------------------------
RANK_JOB = """
import os, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import traintel
from traintel.distributed import watch_ddp
rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda(), device_ids=[rank])
watch_ddp(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 1024, device="cuda")
with traintel.training_loop():
    for i in range(24):
        with traintel.training_iteration():
            with traintel.model_forward():
                if rank == 1:
                    time.sleep(DELAY)
                loss = model(x).sum()
            with traintel.model_backward():
                loss.backward()
            with traintel.optimizer_update():
                optimizer.step()
                optimizer.zero_grad()
traintel.shutdown()
dist.destroy_process_group()
"""


@dataclass
class RanksCheck:
    gpus: int
    skipped: str | None = None
    returncodes: list[int] = field(default_factory=list)
    stragglers: list[int] = field(default_factory=list)
    stderr_tail: str = ""


def two_nccl_ranks(delay: float = 0.05) -> RanksCheck:
    """Two ranks on two GPUs over NCCL, rank 1 late by ``delay`` in every forward: the
    straggler events must name rank 1."""
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return RanksCheck(gpus, skipped=f"needs 2 GPUs, this machine has {gpus}")
    from traintel.exporters.reader import iter_spans

    with tempfile.TemporaryDirectory(prefix="traintel-nccl-") as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(f"DELAY = {delay}\n" + textwrap.dedent(RANK_JOB))
        procs = []
        for rank in range(2):
            out = Path(tmp) / f"rank{rank}"
            out.mkdir()
            env = {
                **os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "TRAINTEL_OUTPUT_DIR": str(out),
                "TRAINTEL_LOG_EVERY_N_ITERATIONS": "8", "TORCHELASTIC_RUN_ID": "gpu-check",
            }  # fmt: skip
            procs.append(
                subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True)
            )
        check = RanksCheck(gpus)
        for proc in procs:
            _, err = proc.communicate(timeout=240)
            check.returncodes.append(proc.returncode)
            check.stderr_tail += err[-2000:]
        spans = list(iter_spans(sorted((Path(tmp) / "rank0").glob("*.jsonl"))))
        check.stragglers = [
            int(e.attributes[semconv.STRAGGLER_RANK])
            for s in spans
            for e in s.events
            if e.name == semconv.Event.STRAGGLER.value
        ]
    return check


# --- the report ----------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if on_gpu() else "cpu (dry run)",
        "capability": ".".join(map(str, torch.cuda.get_device_capability())) if on_gpu() else None,
        "gpus": torch.cuda.device_count() if on_gpu() else 0,
        "traintel": traintel.__version__,
        "python": sys.version.split()[0],
    }
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]

        pynvml.nvmlInit()
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as exc:
        info["driver"] = f"(no NVML: {exc})"
    return info


def _relative(a: float, b: float) -> float:
    return abs(a - b) / b if b else math.inf


def report_training(check: TrainingCheck) -> list[str]:
    lines = [
        f"autocast around the {check.autocast_scope}: {check.steps} steps",
        f"  sync debug mode catches an implicit sync (control): {check.sync_debug_control}",
        f"  syncs raised into the loop: {len(check.sync_errors)} {check.sync_errors[:1]}",
        f"  traintel log lines: {len(check.traintel_log)} {check.traintel_log[:3]}",
    ]
    for phase in PHASES:
        ours, own = check.traintel_device_s[phase], check.own_device_s[phase]
        lines.append(
            f"  device time {phase:9s} traintel {ours * 1000:9.2f} ms "
            f"({check.traintel_device_counts[phase]}) own events {own * 1000:9.2f} ms: "
            f"{_relative(ours, own) * 100:.2f} % apart"
        )
    lines.append(f"  pending at the end {check.pending_at_end}, dropped {check.dropped}")
    lines.append(f"  window peak allocated (MB): {[round(v / 2**20) for v in check.window_memory_peaks]}")
    for name, points in {**check.nvml, **check.allocator}.items():
        lines.append(f"  {name}: {[(hw[:12], round(v, 3)) for hw, v in points]}")
    for name, values in check.nvml_series.items():
        lines.append(f"  {name}: {values}")
    lines.append(f"  hw.id torch {check.torch_hw_id} resource {check.resource_hw_id}")
    last = check.windows[-1] if check.windows else {}
    mfu = last.get(W + "mfu")
    lines.append(
        f"  peak {last.get(semconv.MFU_DENOMINATOR)} ({last.get(semconv.MFU_PEAK_SOURCE)}), "
        f"expected {check.expected_peak} ({check.expected_peak_source})"
    )
    if mfu is not None and check.expected_peak:
        expected = window_mfu_expected(last, check.model_flops_per_step, check.expected_peak)
        own = check.model_flops_per_step / check.own_step_s / check.expected_peak
        lines.append(
            f"  MFU last window {mfu:.4f}; from its count and mean time {expected:.4f}; "
            f"from own device events {own:.4f}; model FLOPs/step {check.model_flops_per_step:.3e}; "
            f"summary {check.summary.get(semconv.SUMMARY_PREFIX + 'mfu')}"
        )
    else:
        lines.append(f"  no MFU in the last window: {sorted(k for k in last if 'mfu' in k or 'flops' in k)}")
    return lines


def report_energy(check: EnergyCheck) -> list[str]:
    if check.skipped:
        return [f"energy: skipped ({check.skipped})"]
    total = check.job_joules or 0.0
    shares = ", ".join(f"{k} {v / total:.1%}" for k, v in check.categories.items() if total)
    return [
        f"energy: {check.steps} steps in {check.seconds:.0f} s, {len(check.window_joules)} windows; "
        f"one counter read {check.read_us:.1f} us; the counter moved at least every "
        f"{check.counter_step_ms} ms",
        f"  windows {sum(check.window_joules):,.1f} J vs NVML delta over the loop "
        f"{check.own_loop_joules:,.1f} J: {check.window_error:.3%} apart",
        f"  job {total:,.1f} J vs NVML delta over the job {check.own_job_joules:,.1f} J: "
        f"{check.job_error:.3%} apart; categories sum to "
        f"{math.fsum(check.categories.values()):,.3f} J ({shares})",
        f"  {check.per_token} J/token; MFU {check.mfu} against the datasheet, {check.mfu_measured} against "
        f"the measured peak {check.measured_peak}",
    ]


def report_peak(check: PeakCheck) -> list[str]:
    runs = ", ".join(f"{r / 1e12:.1f}" for r in check.runs)
    ratio = (
        f"{statistics.median(check.runs) / check.datasheet:.1%} of it"
        if check.runs and check.datasheet
        else ""
    )
    return [
        f"measured {check.dtype} matmul peak, {len(check.runs)} runs: {runs} TFLOP/s; spread "
        f"{check.spread:.2%} of the median; datasheet {check.datasheet} ({ratio}); "
        f"{[round(s, 1) for s in check.seconds]} s each; {check.methods[:1]}"
    ]


def verdicts(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's device figures, each with its target and whether it was met."""
    out: dict[str, Any] = {}
    energy = results.get("energy")
    if isinstance(energy, dict) and not energy.get("skipped"):
        window = _relative(sum(energy["window_joules"]), energy["own_loop_joules"])
        out["window_energy_vs_nvml_delta"] = {"relative_error": window, "target": 0.01, "met": window <= 0.01}
        job = _relative(energy["job_joules"] or 0.0, energy["own_job_joules"])
        out["job_energy_vs_nvml_delta"] = {"relative_error": job, "target": 0.01, "met": job <= 0.01}
    peak = results.get("peak")
    if isinstance(peak, dict) and peak["runs"]:
        runs, middle = peak["runs"], statistics.median(peak["runs"])
        worst = max(abs(r / middle - 1) for r in runs)
        out["measured_peak_reproducible"] = {"runs": runs, "worst_from_median": worst, "target": 0.02,
                                             "met": worst <= 0.02}  # fmt: skip
    for scope in ("forward", "iteration"):
        training = results.get(f"training_{scope}")
        if isinstance(training, dict):
            out[f"no_hidden_sync_{scope}"] = {
                "control": training["sync_debug_control"], "errors": training["sync_errors"],
                "met": training["sync_debug_control"] and not training["sync_errors"],
            }  # fmt: skip
    for features in OVERHEAD_FEATURES:
        cost = results.get(f"overhead_{features}")
        if isinstance(cost, dict):
            rounds = [t / b for t, b in zip(cost["wall_traintel"], cost["wall_bare"], strict=True)]
            out[f"overhead_{features}"] = {"ratio": cost["ratio"], "rounds": rounds}
    return out


def dry_run_setup() -> None:
    """CPU only: the models run on CPU, and NVML is :class:`DryRunNvml`."""
    global DEVICE
    DEVICE = "cpu"
    sys.modules["pynvml"] = DryRunNvml  # type: ignore[assignment]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--steps", type=int, help="training steps per check (default 60; overhead 200)")
    parser.add_argument("--rounds", type=int, default=15, help="overhead rounds")
    parser.add_argument("--overhead", choices=list(OVERHEAD_FEATURES), help="only this overhead variant")
    parser.add_argument("--energy-seconds", type=float, default=30.0, help="length of the energy loop")
    parser.add_argument("--peak-runs", type=int, default=3, help="matmul peak calibrations")
    parser.add_argument("--cpu-dry-run", action="store_true", help="the script's own logic on CPU, small")
    args = parser.parse_args()
    dry = args.cpu_dry_run or not cuda_available()
    if dry:
        if not args.cpu_dry_run:
            print("gpu_check: no CUDA device here: a CPU dry run of the checks' own logic instead")
        dry_run_setup()
    if args.overhead:
        cost = overhead_here(args.overhead, args.rounds, args.steps or 200)
        if args.json:
            args.json.write_text(json.dumps(asdict(cost)))
        return 0
    small = ModelSize(vocab=128, width=32, layers=1, heads=2, seq=16, batch=2)
    results: dict[str, Any] = {"environment": environment(), "dry_run": dry}
    print("environment:", json.dumps(results["environment"]))

    def run(key: str, work: Callable[[], Any], report: Callable[[Any], list[str]]) -> None:
        began = time.perf_counter()
        try:
            check = work()
            results[key] = asdict(check)
            if isinstance(check, OverheadCheck):
                results[key]["ratio"] = check.ratio
            print("\n".join(report(check)))
        except Exception as exc:
            results[key] = repr(exc)
            print(f"{key} failed: {exc!r}")
        print(f"  ({key}: {time.perf_counter() - began:.1f} s)", flush=True)

    for scope in ("forward", "iteration"):
        run(
            f"training_{scope}",
            lambda scope=scope: instrumented_training(
                scope, steps=args.steps or (12 if dry else 60), sync_every=5 if dry else 20,
                size=small if dry else None,
            ),
            report_training,
        )  # fmt: skip
    run("peak", lambda: peak_check(args.peak_runs, "fp32" if dry else "bf16"), report_peak)
    run(
        "energy",
        lambda: energy_check(3.0 if dry else args.energy_seconds, small if dry else None),
        report_energy,
    )
    for features in OVERHEAD_FEATURES:
        rounds, steps = (2, 5) if dry else OVERHEAD_PLAN[features]

        def overhead_lines(cost: OverheadCheck, features: str = features) -> list[str]:
            bare, instrumented = statistics.median(cost.wall_bare), statistics.median(cost.wall_traintel)
            return [
                f"overhead ({features}), {len(cost.ratios)} alternating rounds of {cost.steps_per_round} "
                f"steps in a fresh process: bare {bare:.3f} ms, traintel {instrumented:.3f} ms; paired "
                f"ratio median {cost.ratio:.3f} (rounds {min(cost.ratios):.3f}-{max(cost.ratios):.3f}); "
                f"training thread CPU +{cost.added_cpu_us:.1f} us/step"
            ]

        run(f"overhead_{features}", lambda f=features, r=rounds, n=steps: overhead(f, r, n), overhead_lines)
    if not dry:
        ranks = two_nccl_ranks()
        results["ranks"] = asdict(ranks)
        print(
            f"two NCCL ranks: {ranks.skipped or f'exit {ranks.returncodes}, stragglers {ranks.stragglers}'}"
        )
    results["verdicts"] = verdicts(results)
    print("issue 38 figures:", json.dumps(results["verdicts"], indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "gpu-check"
    sys.exit(main())
