"""MFU divides by the peak of the dtype the matmuls actually run in (device name patched: no GPU
here): TF32 matmul precision, parameters cast without autocast, TRAINTEL_DTYPE over everything;
the chosen column and its reason ride next to MFU, and a guess is said once."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

import traintel
from tests.test_metrics import run_loop
from traintel import semconv
from traintel._host.compute_dtype import note_model
from traintel._host.device import AutocastProbe
from traintel._runtime import window_consumers

torch = pytest.importorskip("torch")
W = semconv.WINDOW_PREFIX
S = semconv.SUMMARY_PREFIX
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def h100(owned: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(window_consumers, "current_device_name", lambda device=None: H100)
    yield owned
    torch.set_float32_matmul_precision("highest")


def one_window(run: Any) -> dict[str, Any]:
    (window,) = run.events("training_metrics_update")
    return dict(window)


def test_tf32_matmul_precision_picks_the_tf32_peak(h100: Any) -> None:
    """The issue's case: fp32 weights, precision "high" (TF32): MFU against 494.5 TFLOP/s, not
    fp32's 67 (which read 0.489 where the truth was 0.066)."""
    torch.set_float32_matmul_precision("high")
    run = h100(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=494.5e12 / 8)
    run_loop([1, 1], phases=False)
    window = one_window(run)
    assert window[semconv.MFU_DENOMINATOR] == 494.5e12
    assert window[W + "mfu"] == 0.25
    assert window[semconv.MFU_DTYPE] == "tf32"
    assert window[semconv.MFU_DTYPE_REASON] == (
        "fp32 matmuls on TF32 (torch.get_float32_matmul_precision()='high')"
    )
    summary = run.named("training_loop")[0].attributes
    assert summary[S + "mfu.dtype"] == "tf32"


def test_bf16_parameters_without_autocast_pick_the_bf16_peak(h100: Any) -> None:
    model = torch.nn.Linear(8, 8, bias=False).to(torch.bfloat16)
    traintel.measure_flops(model, torch.zeros(2, 8, dtype=torch.bfloat16))
    run = h100(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=989.5e12 / 8)
    run_loop([1, 1], phases=False)
    window = one_window(run)
    assert window[semconv.MFU_DENOMINATOR] == 989.5e12
    assert (window[semconv.MFU_DTYPE], window[semconv.MFU_DTYPE_REASON]) == ("bf16", "parameters")


def test_traintel_dtype_overrides_precision_and_parameters(h100: Any) -> None:
    torch.set_float32_matmul_precision("high")
    traintel.measure_flops(torch.nn.Linear(8, 8).to(torch.bfloat16), torch.zeros(2, 8, dtype=torch.bfloat16))
    run = h100(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=1e12, dtype="fp16")
    run_loop([1, 1], phases=False)
    window = one_window(run)
    assert window[semconv.MFU_PEAK_SOURCE] == "table: NVIDIA H100 SXM fp16 dense"
    assert (window[semconv.MFU_DTYPE], window[semconv.MFU_DTYPE_REASON]) == ("fp16", "TRAINTEL_DTYPE")


@pytest.mark.parametrize(
    ("setup", "dtype", "reason", "said"),
    [
        ("nothing", "fp32", "assumed", "no autocast was seen"),
        ("medium", "tf32", "fp32 matmuls on TF32 (torch.get_float32_matmul_precision()='medium')",
         "'medium' may compute in bf16"),
        ("mixed", "bf16", "parameters", "parameters of mixed dtypes, 80% bf16"),
    ],
)  # fmt: skip
def test_a_guessed_dtype_is_said_once_and_published(
    h100: Any, caplog: pytest.LogCaptureFixture, setup: str, dtype: str, reason: str, said: str
) -> None:
    if setup == "medium":
        torch.set_float32_matmul_precision("medium")
    if setup == "mixed":  # 64 bf16 weights, 16 fp32 ones (as the integrations see a model)
        bf16 = torch.nn.Linear(8, 8, bias=False).to(torch.bfloat16)
        note_model(torch.nn.Sequential(bf16, torch.nn.Linear(8, 2, bias=False)))
    run = h100(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=1e9)
    with caplog.at_level(logging.WARNING, logger="traintel"):
        run_loop([1, 1, 1, 1, 1, 1], phases=False)
    windows = run.events("training_metrics_update")
    assert len(windows) == 3
    assert {(w[semconv.MFU_DTYPE], w[semconv.MFU_DTYPE_REASON]) for w in windows} == {(dtype, reason)}
    assert sum(said in r.getMessage() for r in caplog.records) == 1


def test_a_rocm_build_looks_at_autocast_too(owned: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """ROCm's torch has no CUDA version but runs torch.cuda (HIP): the AMD rows of the peak
    table need the autocast dtype as much as NVIDIA's."""
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    owned(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=1e9)
    engine = traintel.get_telemetry().engine
    assert engine is not None and isinstance(engine.device, AutocastProbe)  # autocast is looked at
