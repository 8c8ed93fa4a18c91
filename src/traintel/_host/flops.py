"""Model FLOPs and device peaks: the two halves of MFU.

Why a table of *dense* peaks: NVIDIA's datasheets print tensor-core figures "with sparsity"
(2:4 structured sparsity) next to, or instead of, dense ones; several public tables copied the
sparse numbers and report MFU off by 2x. Every entry below is the dense figure for one GPU.
Unknown device: no MFU and one clear warning, never a guess.

Why count FLOPs on the meta device: ``FlopCounterMode`` on real CPU tensors misses the
scaled-dot-product-attention FLOPs (the CPU SDPA path decomposes below the counter's
dispatch), and counting on the real device would also run the step. On meta tensors nothing
runs and SDPA is counted through its registered formula.

torch is imported only inside the functions: the package core never needs it.
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# (pattern on the lower-cased device name, display name, {dtype: dense peak FLOP/s}).
# Order matters: specific names before the families they contain ("h100 nvl" before "h100",
# "l40s" before "l40"); word boundaries keep "l4" from matching "l40s" and "a10" from "a100".
_PEAKS: tuple[tuple[str, str, dict[str, float]], ...] = (
    # H100 NVL, per GPU (NVIDIA H100 datasheet, 2024: 1,671 TF BF16 with sparsity per GPU).
    (r"\bh100\b.*\bnvl\b", "NVIDIA H100 NVL",
     {"bf16": 835.5e12, "fp16": 835.5e12, "fp8": 1670.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    # H100 PCIe (datasheet: 1,513 TF BF16 with sparsity).
    (r"\bh100\b.*(pcie|hbm2e)", "NVIDIA H100 PCIe",
     {"bf16": 756.5e12, "fp16": 756.5e12, "fp8": 1513e12, "tf32": 378e12, "fp32": 51.2e12}),
    # H200 and GH200 share H100 SXM's compute (datasheet: 1,979 TF BF16 with sparsity).
    (r"\bg?h200\b", "NVIDIA H200",
     {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12}),
    # H100 SXM5 ("NVIDIA H100 80GB HBM3"): 1,979 TF BF16 with sparsity.
    (r"\bh100\b", "NVIDIA H100 SXM",
     {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12}),
    # B200 (HGX B200 datasheet, per GPU: 4.5 PF FP16/BF16 and 9 PF FP8 with sparsity).
    (r"\bb200\b", "NVIDIA B200",
     {"bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15, "tf32": 1.1e15, "fp32": 75e12}),
    # A100 SXM and PCIe, 40 and 80 GB (A100 datasheet: 312 TF BF16 dense, 624 sparse).
    (r"\ba100\b", "NVIDIA A100",
     {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    # A10G (AWS): the A10 datasheet's figures, 125 TF BF16 dense (250 sparse).
    (r"\ba10g\b", "NVIDIA A10G",
     {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    (r"\ba10\b", "NVIDIA A10",
     {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    # L40S (datasheet: 733 TF BF16 / 1,466 TF FP8 with sparsity).
    (r"\bl40s\b", "NVIDIA L40S",
     {"bf16": 362.05e12, "fp16": 362.05e12, "fp8": 733e12, "tf32": 183e12, "fp32": 91.6e12}),
    # L40 (datasheet: 362.1 TF BF16 with sparsity).
    (r"\bl40\b", "NVIDIA L40",
     {"bf16": 181.05e12, "fp16": 181.05e12, "fp8": 362e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    # L4 (datasheet: 242 TF BF16 / 485 TF FP8 with sparsity).
    (r"\bl4\b", "NVIDIA L4",
     {"bf16": 121e12, "fp16": 121e12, "fp8": 242.5e12, "tf32": 60e12, "fp32": 30.3e12}),
    # V100 SXM2 (datasheet: 125 TF FP16 tensor; no BF16).
    (r"\bv100\b", "NVIDIA V100",
     {"fp16": 125e12, "fp32": 15.7e12}),
    # T4 (datasheet: 65 TF FP16 tensor; no BF16).
    (r"\bt4\b", "NVIDIA T4",
     {"fp16": 65e12, "fp32": 8.1e12}),
)  # fmt: skip

_COMPILED = tuple((re.compile(pattern), name, peaks) for pattern, name, peaks in _PEAKS)


@dataclass(frozen=True)
class PeakLookup:
    """The outcome of looking a device up: a peak, or why there is none."""

    peak_flops: float | None
    source: str
    reason: str | None = None


def peak_flops_for(device_name: str, dtype: str) -> PeakLookup:
    """Dense peak FLOP/s of ``device_name`` (as ``torch.cuda.get_device_name`` prints it)."""
    lowered = device_name.lower()
    for pattern, name, peaks in _COMPILED:
        if pattern.search(lowered):
            peak = peaks.get(dtype)
            if peak is None:
                return PeakLookup(
                    None, name, f"{name} has no {dtype} peak in the table: set TRAINTEL_PEAK_FLOPS"
                )
            return PeakLookup(peak, f"table: {name} {dtype} dense")
    return PeakLookup(
        None,
        device_name,
        f"device {device_name!r} is not in the peak FLOP/s table: set TRAINTEL_PEAK_FLOPS",
    )


def current_device_name() -> str | None:
    """The CUDA device this process trains on, or None while that is not known.

    Known once the job itself has initialised CUDA: asking earlier (``get_device_name`` or
    ``current_device``) would initialise it here, creating a context of several hundred MB on
    the GPU of a job that may never use one. Never imports torch either."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            return str(cuda.get_device_name(cuda.current_device()))
    except Exception:
        return None
    return None


def autocast_dtype() -> str | None:
    """The autocast dtype in effect on the calling thread, as a table key."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.is_autocast_enabled("cuda"):
            dtype = torch.get_autocast_dtype("cuda")
            return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    except Exception:
        return None
    return None


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one training step on one example batch.

    ``model_flops`` is what MFU counts: 3 x forward (forward + a backward of twice the
    forward, the convention behind "6N per token"). ``executed_flops`` is what the counter saw
    for forward and backward, recomputation included: HFU's numerator.
    """

    forward: int
    backward: int
    samples: int

    @property
    def model_flops(self) -> int:
        return 3 * self.forward

    @property
    def executed_flops(self) -> int:
        return self.forward + self.backward

    @property
    def model_flops_per_sample(self) -> float:
        return self.model_flops / self.samples

    @property
    def executed_flops_per_sample(self) -> float:
        return self.executed_flops / self.samples


def _to_meta(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device="meta")
    if isinstance(value, tuple | list):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    return value


def first_dim(value: Any) -> int | None:
    import torch

    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() > 0 else None
    if isinstance(value, tuple | list):
        for item in value:
            found = first_dim(item)
            if found is not None:
                return found
    if isinstance(value, dict):
        for item in value.values():
            found = first_dim(item)
            if found is not None:
                return found
    return None


def unwrap(model: Any) -> Any:
    """The user's module behind DDP / FSDP / DataParallel / torch.compile wrappers."""
    seen = 0
    while seen < 8:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or inner is model:
            return model
        model = inner
        seen += 1
    return model


def measure_flops(
    model: Any,
    example_batch: Any,
    loss_fn: Callable[..., Any] | None = None,
    *,
    targets: Any = None,
    samples: int | None = None,
) -> FlopCount:
    """Count one training step's FLOPs with ``torch.utils.flop_counter.FlopCounterMode``.

    ``example_batch`` is what ``model(...)`` takes (a tensor, or a tuple/list of positional
    arguments, or a dict of keyword arguments); ``loss_fn`` maps the output to a scalar (default:
    ``output.sum()``), called as ``loss_fn(output, targets)`` when ``targets`` is given. The
    model, the batch and the targets are copied to the meta device, so nothing runs and the
    real model is untouched; for that reason a loss must take its targets as ``targets=``
    rather than capture real tensors. Wrappers (DDP, FSDP, ``torch.compile``) are unwrapped
    first. ``samples`` defaults to the batch's first dimension.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    module = unwrap(model)
    # A structural copy whose parameters and buffers are meta stand-ins: pre-seeding deepcopy's
    # memo means the real weights are never copied (no second copy of a large model in memory),
    # and code that runs later (activation-checkpoint recomputation in backward) sees them too.
    memo: dict[int, Any] = {}
    for parameter in module.parameters():
        memo[id(parameter)] = torch.nn.Parameter(
            torch.empty_like(parameter, device="meta"), requires_grad=parameter.requires_grad
        )
    for buffer in module.buffers():
        memo[id(buffer)] = torch.empty_like(buffer, device="meta")
    meta_model = copy.deepcopy(module, memo)
    meta_model.train()
    batch = _to_meta(example_batch)
    meta_targets = _to_meta(targets)
    count = samples if samples is not None else first_dim(example_batch)
    if not count:
        raise ValueError("measure_flops: cannot tell the batch size; pass samples=")

    def run_forward() -> Any:
        if isinstance(batch, dict):
            return meta_model(**batch)
        if isinstance(batch, tuple | list):
            return meta_model(*batch)
        return meta_model(batch)

    def run_loss(output: Any) -> Any:
        if loss_fn is None:
            return output.sum()
        return loss_fn(output) if targets is None else loss_fn(output, meta_targets)

    try:
        counter = FlopCounterMode(display=False)
        with counter:
            output = run_forward()
        forward = int(counter.get_total_flops())
    except RuntimeError as exc:
        raise RuntimeError(_MODEL_NOT_ON_META.format(exc)) from exc
    try:
        loss = run_loss(output)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise RuntimeError(_LOSS_NOT_ON_META.format(exc)) from exc
    try:
        counter = FlopCounterMode(display=False)
        with counter:
            loss.backward()
        backward = int(counter.get_total_flops())
    except RuntimeError as exc:
        raise RuntimeError(_MODEL_NOT_ON_META.format(exc)) from exc
    return FlopCount(forward=forward, backward=backward, samples=int(count))


_MODEL_NOT_ON_META = (
    "measure_flops: the model does not run on the meta device ({}). A common cause is a tensor "
    "created on a fixed device inside forward; use transformer_flops_per_token() and "
    "flops_per_token= instead."
)
_LOSS_NOT_ON_META = (
    "measure_flops: loss_fn failed on the model's output, which is on the meta device ({}). A loss "
    "that uses tensors of its own (the labels, say) cannot mix them with meta tensors: pass them "
    "as targets= (loss_fn is then called as loss_fn(output, targets), on the meta device), or "
    "leave loss_fn out (output.sum() is used; the model's backward FLOPs are the same)."
)


def transformer_flops_per_token(
    parameters: int, layers: int, hidden: int, seq_len: int, *, causal: bool = False
) -> float:
    """The analytic formula: 6N + 12·L·H·S per token for training (PaLM appendix B);
    the attention term halves for causal attention when the kernel skips masked blocks."""
    attention = 12 * layers * hidden * seq_len
    return 6 * parameters + (attention / 2 if causal else attention)
