"""The matmul peak measured at start (TRAINTEL_MEASURE_PEAK=on) and MFU against it: the timing
loop on CPU with an injected clock, and the window path with the device name patched."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from tests.test_metrics import run_loop
from traintel import semconv
from traintel._host import calibration
from traintel._host.calibration import MeasuredPeak, matrix_size, measure_peak
from traintel._runtime import window_consumers

pytest.importorskip("torch")
W = semconv.WINDOW_PREFIX
S = semconv.SUMMARY_PREFIX


class Ticks:
    """A clock that moves ``step`` seconds at each reading."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_the_peak_is_the_settled_batches_median_and_the_budget_holds() -> None:
    found = measure_peak("fp32", device="cpu", size=32, warm_s=0.0)
    assert found is not None and 1 <= len(found.batches) <= calibration.BATCHES
    assert found.flops_per_second == statistics.median(found.batches) > 0
    assert found.discarded == 0
    assert found.method.startswith(f"32x32x32 fp32 matmul, median of {len(found.batches)} batches of up to ")
    assert found.method.endswith("after 0 s warm-up")
    # a clock that moves 0.25 s at every reading: each batch "takes" 0.5 s of wall time
    slow = measure_peak("bf16", device="cpu", size=32, budget_s=3.0, clock=Ticks(0.25), warm_s=0.0)
    assert slow is not None and 1 <= len(slow.batches) < calibration.BATCHES
    assert slow.seconds <= 3.0  # no batch started that would not end within the budget


def test_batches_that_end_inside_the_warm_up_are_not_kept() -> None:
    # A cool card boosts above what it holds once settled: the first seconds' batches are
    # discarded. With 0.25 s per reading (three readings a batch), the warm-up ends at 3.0 and
    # batches end at 2.0, 2.75, 3.5, ...: the first two are thrown away, the next ten kept.
    found = measure_peak("fp32", device="cpu", size=32, budget_s=100.0, clock=Ticks(0.25), warm_s=2.0)
    assert found is not None
    assert found.discarded == 2
    assert len(found.batches) == calibration.BATCHES
    assert found.method.endswith("after 2 s warm-up")
    assert measure_peak("fp8", device="cpu", size=32) is None  # scaled matmuls: not calibrated


def test_matrix_size_fits_a_tenth_of_free_memory() -> None:
    assert matrix_size(80 * 2**30, 2) == 8192
    assert matrix_size(2 * 2**30, 2) == 4096
    assert matrix_size(None, 4) == 8192


@pytest.fixture
def calibrated(owned: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    calls: list[str] = []

    def stand_in(dtype: str) -> MeasuredPeak:  # what an H100 measures in bf16 (2026-11-13)
        calls.append(dtype)
        return MeasuredPeak(
            798e12,
            "8192x8192x8192 bf16 matmul, median of 10 batches of up to 120 after 3 s warm-up",
            (798e12,),
            2.5,
        )

    monkeypatch.setattr(window_consumers, "current_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(window_consumers, "measure_peak", stand_in)
    return owned, calls


def test_mfu_against_both_peaks_on_windows_summary_and_metrics(calibrated: Any) -> None:
    owned, calls = calibrated
    run = owned(
        log_every_n_iterations=2, global_batch_size=2, flops_per_sample=399e12, dtype="bf16",
        measure_peak="on", window_events="on",
    )  # fmt: skip
    run_loop([1, 1, 1, 1], phases=False)
    assert calls == ["bf16"]  # once, in the run's dtype
    windows = run.events("training_metrics_update")
    for window in windows:
        assert window[W + "mfu"] == 798e12 / 989.5e12
        assert window[W + "mfu_measured"] == 1.0  # 2 x 399e12 FLOP/s against 798e12
        assert window[semconv.MFU_MEASURED_PEAK] == 798e12
        assert window[semconv.MFU_MEASURED_PEAK_METHOD].startswith("8192x8192x8192 bf16")
    summary = run.named("training_loop")[0].attributes
    assert summary[S + "mfu_measured"] == 1.0 and summary[S + "mfu.measured_peak_flops"] == 798e12
    (point,) = run.metric_points(semconv.METRIC_MFU_MEASURED)
    assert point.value == 1.0


def test_off_by_default_and_never_without_a_gpu(calibrated: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    owned, calls = calibrated
    run = owned(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=1e12, dtype="bf16")
    run_loop([1, 1], phases=False)
    assert calls == []
    assert W + "mfu_measured" not in run.events("training_metrics_update")[0]
    monkeypatch.setattr(window_consumers, "current_device_name", lambda device=None: None)
    owned(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=1e12, measure_peak="on")
    run_loop([1, 1], phases=False)
    assert calls == []
