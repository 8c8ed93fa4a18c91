"""The Lightning callback's cost: the same ``Trainer.fit`` with and without ``TraintelCallback``.

Rounds alternate between the two variants in one process (so machine noise hits both alike)
and the script prints the median time per optimizer step of each and their ratio. The model is
deliberately tiny (a 16x16 linear layer on CPU, batch 8, two accumulated micro-batches per step)
so that the step itself is cheap and the callback's share is as visible as it can be; with a
real model the ratio is closer to 1. Telemetry is traintel's default policy (iterations
tail-sampled, metrics aggregated) with spans exported to a no-op exporter.

Run: ``python benchmarks/bench_lightning_callback.py [--steps 400] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traintel
from traintel.integrations.lightning import TraintelCallback

ACCUMULATE = 2


class DropExporter(SpanExporter):  # type: ignore[misc]
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class Tiny(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(16, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_seconds_per_step(steps: int, with_callback: bool) -> float:
    x = torch.randn(steps * ACCUMULATE * 8, 16)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    trainer = pl.Trainer(
        max_steps=steps,
        accumulate_grad_batches=ACCUMULATE,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[TraintelCallback()] if with_callback else [],
    )
    started = time.perf_counter()
    trainer.fit(Tiny(), data)
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    traintel.configure(span_exporters=[DropExporter()], metric_readers=[])
    fit_seconds_per_step(20, True)  # warm up imports and allocators for both variants
    fit_seconds_per_step(20, False)
    plain: list[float] = []
    traced: list[float] = []
    for _ in range(args.rounds):
        plain.append(fit_seconds_per_step(args.steps, False))
        traced.append(fit_seconds_per_step(args.steps, True))
    base, with_cb = statistics.median(plain), statistics.median(traced)
    print(f"Trainer.fit: {args.steps} optimizer steps x {ACCUMULATE} micro-batches, {args.rounds} rounds")
    print(f"  without callback: {base * 1e6:9.1f} us/step (median)")
    print(f"  with TraintelCallback: {with_cb * 1e6:9.1f} us/step (median)")
    added = (with_cb - base) * 1e6
    print(f"  ratio with/without: {with_cb / base:.3f}  (+{added:.1f} us per optimizer step)")


if __name__ == "__main__":
    main()
