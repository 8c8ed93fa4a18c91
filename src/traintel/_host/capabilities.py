"""Which training metrics can be computed with the configuration at hand, and why not.

Why a report instead of silence: the most common complaint about training telemetry is a
metric that is quietly missing or quietly wrong (MFU from a guessed peak). The
``telemetry_initialization`` event says, for every metric that is off, what would turn it on.
"""

from __future__ import annotations

import sys

from traintel import environment_variables as ev
from traintel._host.flops import current_device_name, peak_flops_for
from traintel.config import Settings


def device_description() -> str:
    """The accelerator this process trains on, as far as can be told without importing torch
    or initialising CUDA (the job does that, when it uses a GPU)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "unknown (torch not imported yet)"
    name = current_device_name()
    if name is not None:
        return name
    if getattr(getattr(torch, "version", None), "cuda", None) is not None:
        return "unknown (CUDA not initialised yet)"
    return "cpu"


def _table_peak_known(settings: Settings) -> bool:
    name = current_device_name()
    return name is not None and peak_flops_for(name, settings.dtype or "fp32").peak_flops is not None


def capability_report(settings: Settings) -> tuple[list[str], list[str]]:
    """(enabled, disabled) metric names; each disabled entry says why and how to enable it."""
    batch = settings.global_batch_size
    has_flops = settings.flops_per_sample is not None or settings.flops_per_token is not None
    peak_known = settings.peak_flops is not None or _table_peak_known(settings)
    checks = (
        (
            "sample_throughput",
            batch is not None,
            f"no global batch size (set {ev.TRAINTEL_GLOBAL_BATCH_SIZE}, "
            "global_batch_size=, or samples= on training_iteration)",
        ),
        (
            "token_throughput",
            batch is not None and settings.seq_len is not None,
            f"needs global batch size and sequence length (set {ev.TRAINTEL_SEQ_LEN}, "
            "or tokens= on training_iteration)",
        ),
        (
            "flops_throughput",
            has_flops,
            f"no model FLOPs (set {ev.TRAINTEL_FLOPS_PER_SAMPLE} or {ev.TRAINTEL_FLOPS_PER_TOKEN})",
        ),
        ("mfu", has_flops and peak_known, _why_no_mfu(peak_known)),
    )
    enabled = ["phase_duration", "iteration_count", *(name for name, on, _why in checks if on)]
    return enabled, [f"{name}: {why}" for name, on, why in checks if not on]


def _why_no_mfu(peak_known: bool) -> str:
    if peak_known:
        return "no model FLOPs (see flops_throughput)"
    return (
        f"no dense peak FLOP/s for device {device_description()!r} (set {ev.TRAINTEL_PEAK_FLOPS}; "
        "a GPU in the peak table is looked up at each window once the job has initialised CUDA)"
    )
