"""traintel's GPU paths on a real CUDA device (marked ``gpu``; skipped without one).

The measurements come from ``benchmarks/gpu_check.py``, which prints the same checks as one
report: a bf16 transformer step with every GPU feature on, under the CUDA sync debug mode, with
CUDA events of the test's own next to traintel's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from benchmarks.gpu_check import (
    ALLOCATOR_GAUGES,
    GPU_GAUGES,
    PHASES,
    EnergyCheck,
    TrainingCheck,
    energy_check,
    instrumented_training,
    peak_check,
    two_nccl_ranks,
    window_mfu_expected,
)

from traintel import semconv
from traintel._host.flops import peak_flops_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)"),
]

W = semconv.WINDOW_PREFIX


@pytest.fixture(scope="module", params=["forward", "iteration"])
def training(request: pytest.FixtureRequest) -> Iterator[TrainingCheck]:
    """One instrumented run per autocast placement: around the forward pass only (where most
    loops put it) and around the whole iteration."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(("OTEL_", "TRAINTEL_")):
                patch.delenv(name)
        yield instrumented_training(request.param, steps=60)


def test_traintel_adds_no_synchronisation_to_the_step(training: TrainingCheck) -> None:
    assert training.sync_debug_control, "the sync debug mode must catch an implicit sync in this build"
    assert training.sync_errors == []
    # A device hook that raised (a sync refused under the debug mode) is logged, never raised.
    assert not [m for m in training.traintel_log if "fail" in m or "synchron" in m], training.traintel_log


def test_cuda_event_times_match_the_tests_own_events(training: TrainingCheck) -> None:
    for phase in PHASES:
        assert training.traintel_device_counts[phase] == training.steps
        ours, own = training.traintel_device_s[phase], training.own_device_s[phase]
        assert own > 0 and abs(ours - own) <= 0.05 * own, (phase, ours, own)
    assert training.pending_at_end == 0 and training.dropped == 0


def test_memory_peaks_and_allocator_gauges_are_real(training: TrainingCheck) -> None:
    assert training.window_memory_peaks and min(training.window_memory_peaks) > 100 * 2**20
    for name in ALLOCATOR_GAUGES:
        ((hw_id, value),) = training.allocator[name]
        assert hw_id == training.torch_hw_id and value > 0, name


def test_nvml_gauges_have_real_values_keyed_by_the_gpus_uuid(training: TrainingCheck) -> None:
    assert training.torch_hw_id.startswith("GPU-")
    assert training.resource_hw_id == training.torch_hw_id
    readings = {}
    for name in GPU_GAUGES:
        ids = {hw_id for hw_id, _ in training.nvml[name]}
        assert training.torch_hw_id in ids, (name, ids)
        readings[name] = dict(training.nvml[name])[training.torch_hw_id]
    limit = readings[semconv.METRIC_HW_GPU_MEMORY_LIMIT]
    assert limit == torch.cuda.get_device_properties(0).total_memory or limit > 8 * 2**30
    assert 2**20 < readings[semconv.METRIC_HW_GPU_MEMORY_USAGE] <= limit
    assert 0.0 < readings[semconv.METRIC_HW_GPU_UTILIZATION] <= 1.0  # sampled mid-training
    assert 10.0 <= readings[semconv.METRIC_HW_TEMPERATURE] <= 100.0
    assert 20.0 <= readings[semconv.METRIC_HW_POWER] <= 1500.0
    assert readings[semconv.METRIC_HW_ENERGY] > 0  # J since the driver loaded
    clocks = training.nvml_series[semconv.METRIC_GPU_CLOCK]
    assert 100e6 <= clocks["sm"] <= 3e9 and 100e6 <= clocks["memory"] <= 4e9, clocks  # Hz
    reasons = training.nvml_series[semconv.METRIC_GPU_THROTTLE]
    assert len(reasons) == 9 and set(reasons.values()) <= {0.0, 1.0}, reasons
    assert reasons["gpu_idle"] == 0.0  # sampled mid-training


def test_peak_comes_from_the_device_and_the_autocast_dtype(training: TrainingCheck) -> None:
    last = training.windows[-1]
    assert training.expected_peak is not None, f"{training.device_name} is not in the peak table"
    assert last[semconv.MFU_DENOMINATOR] == training.expected_peak
    assert last[semconv.MFU_PEAK_SOURCE] == training.expected_peak_source
    assert training.expected_peak_source is not None and training.expected_peak_source.endswith("bf16 dense")


def test_mfu_is_model_flops_over_step_time_over_the_peak(training: TrainingCheck) -> None:
    assert training.expected_peak is not None
    for window in training.windows:
        if W + "mfu" in window:
            expected = window_mfu_expected(window, training.model_flops_per_step, training.expected_peak)
            assert window[W + "mfu"] == pytest.approx(expected, rel=1e-9)
    summary = training.summary[semconv.SUMMARY_PREFIX + "mfu"]
    own = training.model_flops_per_step / training.own_step_s / training.expected_peak
    assert 0.05 < own < 0.9 and 0.05 < summary < 0.9
    # Wall-clock steps of an asynchronous loop against the device's own time: close, not equal.
    assert abs(summary - own) <= 0.25 * own, (summary, own)


def test_mfu_against_the_measured_peak_too(training: TrainingCheck) -> None:
    """TRAINTEL_MEASURE_PEAK=on in the same run (its syncs are deliberate: the sync test above
    passes with it on): the measured bf16 peak is below the datasheet's, MFU against it above."""
    last = training.windows[-1]
    measured = last[semconv.MFU_MEASURED_PEAK]
    assert 0.5 * training.expected_peak < measured < training.expected_peak  # type: ignore[operator]
    assert last[W + "mfu_measured"] == pytest.approx(last[W + "mfu"] * training.expected_peak / measured)


@pytest.fixture(scope="module")
def energy() -> Iterator[EnergyCheck]:
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(("OTEL_", "TRAINTEL_")):
                patch.delenv(name)
        yield energy_check(seconds=20.0)  # the counter moves in steps: a longer loop, a finer ratio


def test_window_energies_add_up_to_the_counters_delta(energy: EnergyCheck) -> None:
    assert energy.skipped is None, energy.skipped
    assert len(energy.window_joules) >= 4  # windows of at most 3 s
    assert energy.window_error <= 0.01, (sum(energy.window_joules), energy.own_loop_joules)
    assert energy.job_error <= 0.01, (energy.job_joules, energy.own_job_joules)


def test_energy_by_category_sums_to_the_jobs(energy: EnergyCheck) -> None:
    assert energy.category_sum_error <= 1e-9, energy.categories
    assert energy.categories["productive"] > energy.categories["checkpoint_save"] > 0
    assert energy.categories.get("data_loading", 0.0) > 0
    assert energy.per_token is not None and energy.per_token > 0


def test_the_measured_peak_is_reproducible_within_2_percent() -> None:
    check = peak_check(3)
    assert len(check.runs) == 3
    middle = sorted(check.runs)[1]
    assert max(abs(run / middle - 1) for run in check.runs) <= 0.02, check.runs
    assert check.datasheet is not None and max(check.runs) < check.datasheet
    assert max(check.seconds) <= 15.0


def test_this_devices_name_is_in_the_table() -> None:
    name = torch.cuda.get_device_name()
    assert peak_flops_for(name, "bf16").peak_flops is not None, name


CPU_JOB = """
import torch, traintel
traintel.configure(log_every_n_iterations=5, global_batch_size=4, flops_per_sample=1e6)
x = torch.randn(4, 16)
with traintel.application():
    with traintel.training_loop():
        for _ in range(12):
            with traintel.training_iteration():
                with traintel.model_forward():
                    (x @ x.T).sum()
traintel.shutdown()
print("cuda initialised:", torch.cuda.is_initialized())
"""


@pytest.mark.process
def test_a_cpu_job_on_a_gpu_machine_never_initialises_cuda(tmp_path: Path) -> None:
    """Asking the device's name or current device initialises CUDA (a context of hundreds of
    MB on the GPU); traintel waits until the job has done it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINTEL_"))}
    env["TRAINTEL_OUTPUT_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CPU_JOB)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "cuda initialised: False" in done.stdout


def test_two_nccl_ranks_name_the_straggler() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs; this machine has {torch.cuda.device_count()}")
    check = two_nccl_ranks()
    assert check.returncodes == [0, 0], check.stderr_tail
    assert check.stragglers and set(check.stragglers) == {1}
