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

from traintel._host.compute_dtype import note_model
from traintel._host.gpu import initialised_cuda

# (pattern on the lower-cased device name, display name, {dtype: dense peak FLOP/s}).
# Names are matched as torch reports them (``torch.cuda.get_device_name``: CUDA, and ROCm, where
# torch.cuda is HIP). Order matters: specific names before the families they contain ("h100 nvl"
# before "h100", "gb200" before "b200", "l40s" before "l40"); word boundaries keep "l4" from
# matching "l40s", "a10" from "a100" and "h20" from "h200".
# Every figure is dense (no 2:4 sparsity). Where a datasheet prints only "with sparsity" figures
# (marked * there), the entry is half of it. fp32 is the non-tensor (CUDA core / vector) rate.
_PEAKS: tuple[tuple[str, str, dict[str, float]], ...] = (
    # H100 NVL, per GPU (NVIDIA H100 datasheet, 2024: BF16 1,671 TF*, FP8 3,341 TF*, TF32 835 TF*,
    # FP32 60 TF).
    (r"\bh100\b.*\bnvl\b", "NVIDIA H100 NVL",
     {"bf16": 835.5e12, "fp16": 835.5e12, "fp8": 1670.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    # H100 PCIe (datasheet: BF16 1,513 TF*, FP8 3,026 TF*, TF32 756 TF*, FP32 51 TF).
    (r"\bh100\b.*(pcie|hbm2e)", "NVIDIA H100 PCIe",
     {"bf16": 756.5e12, "fp16": 756.5e12, "fp8": 1513e12, "tf32": 378e12, "fp32": 51.2e12}),
    # H200 NVL, per GPU (NVIDIA H200 datasheet, 2024: BF16 1,671 TF*, FP8 3,341 TF*, TF32 835 TF*,
    # FP32 60 TF): the H100 NVL's compute, not the SXM's.
    (r"\bh200\b.*\bnvl\b", "NVIDIA H200 NVL",
     {"bf16": 835.5e12, "fp16": 835.5e12, "fp8": 1670.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    # H200 SXM and GH200 share H100 SXM's compute (H200 datasheet: BF16 1,979 TF*, FP8 3,958 TF*,
    # TF32 989 TF*, FP32 67 TF).
    (r"\bg?h200\b", "NVIDIA H200",
     {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12}),
    # H800 PCIe: H100 PCIe's compute (NVIDIA H800 PCIe product brief: BF16 1,513 TF*, FP32 51 TF).
    (r"\bh800\b.*pcie", "NVIDIA H800 PCIe",
     {"bf16": 756.5e12, "fp16": 756.5e12, "fp8": 1513e12, "tf32": 378e12, "fp32": 51.2e12}),
    # H800 SXM: H100 SXM's compute with fewer NVLink links (H800 datasheet: BF16 1,979 TF*).
    (r"\bh800\b", "NVIDIA H800",
     {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12}),
    # H20 (NVIDIA H20 datasheet, dense figures: BF16/FP16 148 TF, FP8 296 TF, TF32 74 TF, FP32 44 TF).
    (r"\bh20\b", "NVIDIA H20",
     {"bf16": 148e12, "fp16": 148e12, "fp8": 296e12, "tf32": 74e12, "fp32": 44e12}),
    # H100 SXM5 ("NVIDIA H100 80GB HBM3"): BF16 1,979 TF*, FP8 3,958 TF*, TF32 989 TF*, FP32 67 TF.
    (r"\bh100\b", "NVIDIA H100 SXM",
     {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12}),
    # GB200, per GPU (GB200 NVL72 datasheet, per GPU: FP16/BF16 5 PF*, FP8 10 PF*, TF32 2.5 PF*,
    # FP32 80 TF).
    (r"\bgb200\b", "NVIDIA GB200",
     {"bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5e15, "tf32": 1.25e15, "fp32": 80e12}),
    # B200 (HGX B200 datasheet, per GPU: FP16/BF16 4.5 PF*, FP8 9 PF*, TF32 2.2 PF*, FP32 75 TF).
    (r"\bb200\b", "NVIDIA B200",
     {"bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15, "tf32": 1.1e15, "fp32": 75e12}),
    # B300 / Blackwell Ultra (HGX B300 datasheet, 8 GPUs: FP16/BF16 36 PF*, FP8 72 PF*, TF32 18 PF*,
    # FP32 600 TF; per GPU the eighth).
    (r"\bb300\b", "NVIDIA B300",
     {"bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15, "tf32": 1.125e15, "fp32": 75e12}),
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
    # V100S PCIe (V100 datasheet: 130 TF FP16 tensor, FP32 16.4 TF; no BF16).
    (r"\bv100s\b", "NVIDIA V100S PCIe",
     {"fp16": 130e12, "fp32": 16.4e12}),
    # V100 PCIe ("Tesla V100-PCIE-32GB"; V100 datasheet: 112 TF FP16 tensor, FP32 14 TF).
    (r"\bv100\b.*pcie", "NVIDIA V100 PCIe",
     {"fp16": 112e12, "fp32": 14e12}),
    # V100 SXM2 (V100 datasheet: 125 TF FP16 tensor, FP32 15.7 TF; no BF16).
    (r"\bv100\b", "NVIDIA V100 SXM2",
     {"fp16": 125e12, "fp32": 15.7e12}),
    # T4 (datasheet: 65 TF FP16 tensor; no BF16).
    (r"\bt4\b", "NVIDIA T4",
     {"fp16": 65e12, "fp32": 8.1e12}),
    # AMD Instinct (ROCm reports "AMD Instinct MI300X"). MI300X and MI325X have the same compute
    # (AMD product pages / CDNA 3 white paper, dense: FP16/BF16 1,307.4 TF, FP8 2,614.9 TF,
    # TF32 653.7 TF, FP32 163.4 TF).
    (r"\bmi300x\b", "AMD Instinct MI300X",
     {"bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12, "tf32": 653.7e12, "fp32": 163.4e12}),
    (r"\bmi325x\b", "AMD Instinct MI325X",
     {"bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12, "tf32": 653.7e12, "fp32": 163.4e12}),
    # MI355X (AMD product page / CDNA 4 white paper, dense: FP16/BF16 2,516.6 TF, FP8 5,033.2 TF,
    # FP32 157.3 TF; CDNA 4 has no TF32 matrix unit, hence no tf32 entry).
    (r"\bmi355x\b", "AMD Instinct MI355X",
     {"bf16": 2516.6e12, "fp16": 2516.6e12, "fp8": 5033.2e12, "fp32": 157.3e12}),
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


def current_device_name(device: int | None = None) -> str | None:
    """The CUDA device this process trains on (``device``, else the calling thread's current
    one), or None until the job itself has initialised CUDA (see ``initialised_cuda``)."""
    cuda = initialised_cuda()
    if cuda is None:
        return None
    try:
        return str(cuda.get_device_name(cuda.current_device() if device is None else device))
    except Exception:
        return None


def current_cuda_device() -> int | None:
    """The calling thread's CUDA device, once the job has initialised CUDA (never before)."""
    cuda = initialised_cuda()
    try:
        return int(cuda.current_device()) if cuda is not None else None
    except Exception:
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
    items = value.values() if isinstance(value, dict) else value if isinstance(value, tuple | list) else ()
    return next((found for found in map(first_dim, items) if found is not None), None)


def unwrap(model: Any) -> Any:
    """The user's module behind DDP / FSDP / DataParallel / torch.compile wrappers."""
    for _ in range(8):
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or inner is model:
            return model
        model = inner
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
    first; a model sharded by ``fully_shard`` (FSDP2) is counted whole, as each rank runs it.
    ``samples`` defaults to the batch's first dimension.
    """
    from torch.utils.flop_counter import FlopCounterMode

    module = unwrap(model)
    note_model(module)
    meta_model = _meta_copy(module)
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

    def counted(work: Callable[[], Any]) -> tuple[Any, int]:
        try:
            with FlopCounterMode(display=False) as counter:
                result = work()
            return result, int(counter.get_total_flops())
        except RuntimeError as exc:
            raise RuntimeError(_MODEL_NOT_ON_META.format(exc)) from exc

    output, forward = counted(run_forward)
    try:
        loss = run_loss(output)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise RuntimeError(_LOSS_NOT_ON_META.format(exc)) from exc
    _, backward = counted(loss.backward)
    return FlopCount(forward=forward, backward=backward, samples=int(count))


def _meta_copy(module: Any) -> Any:
    """A structural copy of ``module`` whose parameters and buffers are meta stand-ins.

    Pre-seeding deepcopy's memo means the real weights are never copied (no second copy of a
    large model in memory), and code that runs later (activation-checkpoint recomputation in
    backward) sees them too. The stand-ins have the full shape: a parameter that FSDP2
    (``fully_shard``) holds as a shard reports its whole shape, and each rank runs the whole
    model on its own batch. Such a module refuses deepcopy and carries the hooks that gather its
    shards, so its copy is made from the module's own class, without that state and those hooks
    (children first: a parent's copy finds them in the memo).
    """
    import torch

    memo: dict[int, Any] = {}
    for parameter in module.parameters():
        memo[id(parameter)] = torch.nn.Parameter(
            torch.empty(parameter.shape, dtype=parameter.dtype, device="meta"),
            requires_grad=parameter.requires_grad,
        )
    for buffer in module.buffers():
        memo[id(buffer)] = torch.empty(buffer.shape, dtype=buffer.dtype, device="meta")
    for sub in reversed(list(module.modules())):
        own_class = _fully_sharded_own_class(type(sub))
        if own_class is not None:
            state = {
                name: type(value)() if "_hooks" in name and isinstance(value, dict) else value
                for name, value in vars(sub).items()
                if not name.startswith("__composable_api")  # the FSDP state and its registry
            }
            plain: Any = object.__new__(own_class)
            plain.__dict__.update(copy.deepcopy(state, memo))
            memo[id(sub)] = plain
    return copy.deepcopy(module, memo)


def _fully_sharded_own_class(cls: type) -> type | None:
    """The class a module had before ``fully_shard`` made it a subclass of ``FSDPModule``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2, or without torch.distributed
        return None
    if not issubclass(cls, FSDPModule):
        return None
    return next(base for base in cls.__bases__ if base is not FSDPModule)


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
