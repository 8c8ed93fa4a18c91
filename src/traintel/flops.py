"""Model FLOPs and device peaks: the two halves of MFU.

``measure_flops`` counts one training step on the meta device (nothing runs, the real model is
untouched); ``apply_flops`` makes traintel use the count for MFU and HFU from then on;
``peak_flops_for`` is the table of dense peak FLOP/s the MFU denominator comes from, and
``transformer_flops_per_token`` the analytic formula for a transformer.
"""

from __future__ import annotations

from traintel._host.flops import (
    FlopCount,
    PeakLookup,
    measure_flops,
    peak_flops_for,
    transformer_flops_per_token,
)
from traintel._runtime import state

__all__ = [
    "FlopCount",
    "PeakLookup",
    "apply_flops",
    "measure_flops",
    "peak_flops_for",
    "transformer_flops_per_token",
]


def apply_flops(count: FlopCount, method: str = "counter") -> None:
    """Use a :func:`measure_flops` result for MFU (and HFU) from now on: sets
    ``flops_per_sample``, ``executed_flops_per_sample`` and ``flops_method`` (``"counter"``)."""
    state.current().update_config(
        flops_per_sample=count.model_flops_per_sample,
        executed_flops_per_sample=count.executed_flops_per_sample,
        flops_method=method,
    )
