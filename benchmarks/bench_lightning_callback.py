"""The Lightning callback's cost: the same ``Trainer.fit`` with and without ``TraintelCallback``.

Rounds alternate between three variants in one process (so machine noise hits all alike): no
callback, an empty ``Callback`` (what Lightning itself charges for dispatching hooks to any
callback), and ``TraintelCallback``. It prints the median time per optimizer step of each and
the ratios. The model is deliberately tiny (a 16x16 linear layer on CPU, batch 8, two
accumulated micro-batches per step) so that the step itself is cheap and the callback's share
is as visible as it can be; with a real model the ratio is closer to 1. Telemetry is traintel's
default policy (iterations tail-sampled, metrics aggregated), spans go to a no-op exporter.

Run: ``python benchmarks/bench_lightning_callback.py [--steps 400] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
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


def fit_seconds_per_step(steps: int, callbacks: list[Any]) -> float:
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
        callbacks=callbacks,
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
    variants: dict[str, Callable[[], list[Any]]] = {
        "no callback": list,
        "an empty Callback": lambda: [pl.Callback()],
        "TraintelCallback": lambda: [TraintelCallback()],
    }
    for make in variants.values():  # warm up imports and allocators
        fit_seconds_per_step(20, make())
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, make in variants.items():
            times[name].append(fit_seconds_per_step(args.steps, make()))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"Trainer.fit: {args.steps} optimizer steps x {ACCUMULATE} micro-batches, {args.rounds} rounds")
    for name, median in medians.items():
        print(f"  {name:20s} {median * 1e6:9.1f} us/step (median)")
    base, empty, traced = medians["no callback"], medians["an empty Callback"], medians["TraintelCallback"]
    for label, reference in (("no callback", base), ("an empty Callback", empty)):
        added = (traced - reference) * 1e6
        print(f"  TraintelCallback / {label}: {traced / reference:.3f}  (+{added:.1f} us per optimizer step)")


if __name__ == "__main__":
    main()
