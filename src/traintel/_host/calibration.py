"""The device's achieved matmul peak, measured once: a second MFU denominator users can trust.

Why: a datasheet peak assumes boost clocks no card holds under load (an H100 SXM's dense bf16
matmul reaches ~75-80 % of 989.5 TFLOP/s), so MFU against it mixes "how well does my model use
the GPU" with "how far is this card from its brochure". A dense matmul in the run's own dtype,
timed with CUDA events, gives what the card actually does; MFU against both is published.

How: square matrices of random values (zeros draw less power and run faster), then batches of
products between CUDA events, each batch about 0.2 s. The batches of the first ``WARM_S``
seconds are thrown away and the peak is the median of the rest: a cool card boosts above what
it holds once its power and temperature settle (on an H100 SXM the best cold batch read 737
TFLOP/s and the settled ones 684-686, 2026-11-27), and training runs settled, so the settled
median is the figure that repeats. The whole takes at most ``budget_s`` (15 s). Waiting for those events is
the calibration's one deliberate synchronisation: a job debugging its own syncs with
``torch.cuda.set_sync_debug_mode("error")`` is not stopped by it (the mode is set aside while
the calibration runs, and put back). Opt-in
(``TRAINTEL_MEASURE_PEAK=on``): it runs once, on the training thread, when the first window
closes — the device and the dtype are known then — and training waits for it.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: The most a calibration may take, all of it included.
BUDGET_S = 15.0
#: Target length of one timed batch of products.
BATCH_S = 0.2
#: Seconds of products whose batches are discarded: the card's clocks settle under load.
WARM_S = 3.0
#: Timed batches kept after the warm-up, whose median is the peak (fewer if the budget runs out).
BATCHES = 10

_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32", "fp32": "float32"}


@dataclass(frozen=True)
class MeasuredPeak:
    """A calibration's outcome: the settled batches' median FLOP/s and how it was measured
    (``batches`` are the kept ones)."""

    flops_per_second: float
    method: str
    batches: tuple[float, ...]
    seconds: float
    discarded: int = 0  # batches that ended inside the warm-up


def matrix_size(free_bytes: int | None, element_bytes: int) -> int:
    """8192 (the size datasheet-class results are quoted at), smaller where three such
    matrices would take more than a tenth of the free memory."""
    size = 8192
    while size > 1024 and free_bytes is not None and 3 * size * size * element_bytes > free_bytes / 10:
        size //= 2
    return size


def measure_peak(
    dtype: str,
    device: str = "cuda",
    budget_s: float = BUDGET_S,
    size: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    warm_s: float = WARM_S,
) -> MeasuredPeak | None:
    """Dense ``size``³ matmul FLOP/s in ``dtype`` on ``device`` (None for a dtype it cannot
    run: fp8 needs scaled matmuls the model's own kernels decide). On "cpu" (the tests), wall
    time replaces CUDA events."""
    import torch

    if _TORCH_DTYPE.get(dtype) is None:
        return None
    started = clock()
    cuda = device != "cpu"
    with _sync_debug_off(torch) if cuda else contextlib.nullcontext():
        product, size = _product(torch, getattr(torch, _TORCH_DTYPE[dtype]), device, size)
        flops = 2.0 * size**3
        timed = functools.partial(_time, torch.cuda if cuda else None, clock, product)
        per_product = max(timed(1), 1e-9)  # also picks the kernel
        # A short first batch: one product's time may be optimistic. Each next batch is sized to
        # BATCH_S from the wall time of the one before, and only starts if it fits the budget.
        repeats = max(1, int(BATCH_S / per_product) // 8)
        batch_s = repeats * per_product
        warm_until = clock() + warm_s
        discarded = 0
        batches: list[float] = []
        sizes: list[int] = []
        now = clock()
        while len(batches) < BATCHES and now - started + batch_s <= budget_s:
            seconds = timed(repeats)
            end = clock()
            wall, now = max(end - now, 1e-9), end
            if end > warm_until:  # a batch that ended inside the warm-up is not kept
                batches.append(repeats * flops / seconds if seconds > 0 else 0.0)
                sizes.append(repeats)
            else:
                discarded += 1
            per_product = wall / repeats
            repeats = max(1, min(8 * repeats, int(BATCH_S / per_product)))
            batch_s = per_product * repeats
    if not batches:
        return None
    method = (
        f"{size}x{size}x{size} {dtype} matmul, median of {len(batches)} batches of up to {max(sizes)}"
        f" after {warm_s:g} s warm-up"
    )
    return MeasuredPeak(statistics.median(batches), method, tuple(batches), now - started, discarded)


def _product(torch: Any, torch_dtype: Any, device: str, size: int | None) -> tuple[Callable[[], Any], int]:
    """One ``size``³ product of random matrices on ``device`` (the size fitted to the free
    memory when None), and its size."""
    if size is None:
        free = torch.cuda.mem_get_info()[0] if device != "cpu" else None
        size = matrix_size(free, torch.tensor([], dtype=torch_dtype).element_size())
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=torch_dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=torch_dtype, generator=generator)
    out = torch.empty(size, size, device=device, dtype=torch_dtype)
    return lambda: torch.mm(a, b, out=out), size


@contextlib.contextmanager
def _sync_debug_off(torch: Any) -> Iterator[None]:
    debug_mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(debug_mode)


def _time(cuda: Any | None, clock: Callable[[], float], work: Callable[[], Any], repeats: int) -> float:
    """Seconds ``repeats`` runs of ``work`` take: between CUDA events, or by ``clock`` on the CPU."""
    if cuda is None:
        begin = clock()
        for _ in range(repeats):
            work()
        return clock() - begin
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        work()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1000.0
