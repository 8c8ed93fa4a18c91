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
    enabled = ["phase_duration", "iteration_count"]
    disabled: list[str] = []
    batch = settings.global_batch_size
    seq_len = settings.seq_len
    if batch is not None:
        enabled.append("sample_throughput")
    else:
        disabled.append(
            f"sample_throughput: no global batch size (set {ev.TRAINTEL_GLOBAL_BATCH_SIZE}, "
            "global_batch_size=, or samples= on training_iteration)"
        )
    if batch is not None and seq_len is not None:
        enabled.append("token_throughput")
    else:
        disabled.append(
            f"token_throughput: needs global batch size and sequence length (set {ev.TRAINTEL_SEQ_LEN}, "
            "or tokens= on training_iteration)"
        )
    has_flops = settings.flops_per_sample is not None or settings.flops_per_token is not None
    if has_flops:
        enabled.append("flops_throughput")
    else:
        disabled.append(
            "flops_throughput: no model FLOPs "
            f"(set {ev.TRAINTEL_FLOPS_PER_SAMPLE} or {ev.TRAINTEL_FLOPS_PER_TOKEN})"
        )
    peak_known = settings.peak_flops is not None or _table_peak_known(settings)
    if has_flops and peak_known:
        enabled.append("mfu")
    elif not peak_known:
        disabled.append(
            f"mfu: no dense peak FLOP/s for device {device_description()!r} (set {ev.TRAINTEL_PEAK_FLOPS}; "
            "a GPU in the peak table is looked up at each window once the job has initialised CUDA)"
        )
    else:
        disabled.append("mfu: no model FLOPs (see flops_throughput)")
    return enabled, disabled
