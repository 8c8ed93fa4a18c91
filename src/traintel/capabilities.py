"""Which training metrics can be computed with the configuration at hand, and why not.

Why a report instead of silence: the most common complaint about training telemetry is a
metric that is quietly missing or quietly wrong (MFU from a guessed peak). The
``telemetry_initialization`` event says, for every metric that is off, what would turn it on.
"""

from __future__ import annotations

import sys

from traintel import environment_variables as ev
from traintel.config import TrainingConfig


def device_description() -> str:
    """The accelerator this process trains on, as far as can be told without importing torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "unknown (torch not imported yet)"
    try:
        if torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
    except Exception:  # a broken driver must not stop the report
        return "cuda (unavailable: driver error)"
    return "cpu"


def capability_report(config: TrainingConfig) -> tuple[list[str], list[str]]:
    """(enabled, disabled) metric names; each disabled entry says why and how to enable it."""
    enabled = ["phase_duration", "iteration_count"]
    disabled: list[str] = []
    batch = config.get("global_batch_size")
    seq_len = config.get("seq_len")
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
    has_flops = config.get("flops_per_sample") is not None or config.get("flops_per_token") is not None
    if has_flops:
        enabled.append("flops_throughput")
    else:
        disabled.append(
            "flops_throughput: no model FLOPs "
            f"(set {ev.TRAINTEL_FLOPS_PER_SAMPLE} or {ev.TRAINTEL_FLOPS_PER_TOKEN})"
        )
    peak = config.get("peak_flops")
    if has_flops and peak is not None:
        enabled.append("mfu")
    elif peak is None:
        disabled.append(
            f"mfu: no dense peak FLOP/s for device {device_description()!r} (set {ev.TRAINTEL_PEAK_FLOPS})"
        )
    else:
        disabled.append("mfu: no model FLOPs (see flops_throughput)")
    return enabled, disabled
