"""Which dtype the model's matmuls actually run in: the column of the peak table MFU divides by.

Why it matters: on an H100 the fp32 peak is 67 TFLOP/s, TF32's 494.5 and bf16's 989.5, so the
wrong column makes MFU wrong by up to 15x with nothing to show for it. What runs is decided by
several switches, in this order (the first that applies wins):

1. ``TRAINTEL_DTYPE`` (or ``dtype=``): the user said so.
2. CUDA autocast, as seen at a phase start in the first window: autocast casts the matmuls.
3. The model's parameters (seen by ``measure_flops`` and the framework integrations): weights
   cast to bf16 or fp16 without autocast run their matmuls in that dtype.
4. fp32 matmuls with TF32 allowed (``torch.set_float32_matmul_precision("high")`` or
   ``torch.backends.cuda.matmul.allow_tf32`` / ``fp32_precision = "tf32"``) run on the TF32
   tensor cores.
5. Otherwise fp32.

Where the choice rests on a guess (nothing seen at all, parameters of mixed dtypes, the
"medium" precision that may use bf16 inside), it says so once, and the reason is published
next to MFU (``ml.training.mfu.dtype_reason``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: torch dtype names (``str(torch.bfloat16)`` without the ``torch.``) to peak-table columns.
_COLUMN = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
}


@dataclass(frozen=True)
class DtypeChoice:
    """The peak column chosen, why, and what was guessed (None when nothing was)."""

    dtype: str
    reason: str
    guess: str | None = None


@dataclass(frozen=True)
class ParameterDtype:
    """The dtype holding most of a model's parameter elements, and its share of them."""

    dtype: str
    share: float


def parameter_dtype(parameters: Iterable[Any]) -> ParameterDtype | None:
    """The dominant floating dtype of ``parameters`` (by element count), None if none is float."""
    counts: dict[str, int] = {}
    for parameter in parameters:
        column = _COLUMN.get(str(parameter.dtype).removeprefix("torch."))
        if column is not None:
            counts[column] = counts.get(column, 0) + int(parameter.numel())
    total = sum(counts.values())
    if not total:
        return None
    dtype = max(counts, key=counts.__getitem__)
    return ParameterDtype(dtype, counts[dtype] / total)


#: The parameters of the model traintel saw last (``note_model``): one training process trains
#: one model, and the integrations see it before the first window closes.
_seen: list[ParameterDtype | None] = [None]


def note_model(model: Any) -> None:
    """Remember ``model``'s parameter dtype for the MFU divisor (never raises)."""
    with contextlib.suppress(Exception):
        _seen[0] = parameter_dtype(model.parameters())


def seen_parameters() -> ParameterDtype | None:
    return _seen[0]


def forget_model() -> None:
    _seen[0] = None


def tf32_matmuls(torch: Any) -> str | None:
    """How fp32 matmuls are told to use TF32, or None if they are not: the global precision
    (which tells "high" from "medium"), else the per-backend flags."""
    matmul = getattr(getattr(getattr(torch, "backends", None), "cuda", None), "matmul", None)
    with contextlib.suppress(Exception):  # torch >= 2.9 refuses when the old and new APIs were both used
        level = torch.get_float32_matmul_precision()
        if level in ("high", "medium"):
            return f"torch.get_float32_matmul_precision()={level!r}"
        return None
    with contextlib.suppress(Exception):
        precision = getattr(matmul, "fp32_precision", None)
        if precision == "tf32":
            return "torch.backends.cuda.matmul.fp32_precision='tf32'"
        if precision == "ieee":
            return None
    with contextlib.suppress(Exception):
        if matmul is not None and matmul.allow_tf32:
            return "torch.backends.cuda.matmul.allow_tf32=True"
    return None


def _mixed_guess(parameters: ParameterDtype | None) -> str | None:
    if parameters is None or parameters.share >= 1.0:
        return None
    return (
        f"parameters of mixed dtypes, {parameters.share:.0%} {parameters.dtype}: the peak is "
        f"{parameters.dtype}'s; set TRAINTEL_DTYPE if the matmuls run in another dtype"
    )


def _medium_guess(tf32: str) -> str | None:
    if "medium" not in tf32:
        return None
    return (
        "float32 matmul precision 'medium' may compute in bf16 where a kernel allows it: "
        "the peak is tf32's; set TRAINTEL_DTYPE to choose"
    )


def choose_dtype(
    configured: str | None,
    autocast: str | None,
    parameters: ParameterDtype | None,
    torch: Any | None = None,
) -> DtypeChoice:
    """The peak column for what runs, by the rules in the module's docstring."""
    if configured is not None:
        return DtypeChoice(configured, "TRAINTEL_DTYPE")
    if autocast is not None:
        return DtypeChoice(autocast, "autocast")
    guess = _mixed_guess(parameters)
    if parameters is not None and parameters.dtype != "fp32":
        return DtypeChoice(parameters.dtype, "parameters", guess)
    tf32 = tf32_matmuls(sys.modules.get("torch") if torch is None else torch)  # (None: no torch, no TF32)
    if tf32 is not None:
        return DtypeChoice("tf32", "fp32 matmuls on TF32 (" + tf32 + ")", _medium_guess(tf32) or guess)
    if parameters is not None:
        return DtypeChoice("fp32", "parameters", guess)
    return DtypeChoice(
        "fp32",
        "assumed",
        "the peak is fp32's: no autocast was seen at an iteration or step-phase start and the "
        "model's parameters are unknown; set TRAINTEL_DTYPE, e.g. bf16, if the model computes "
        "in another dtype",
    )
