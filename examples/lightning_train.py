"""A Lightning job traced by traintel: swap ``Trainer`` for ``TraintelTrainer``, nothing else.

    pip install 'traintel[lightning]'
    python examples/lightning_train.py

Every optimizer step is a ``training_iteration`` (here with two accumulated micro-batches, each
with ``data_loading``, ``model_forward`` and ``model_backward`` children), validation runs are
``validation_loop`` spans, ModelCheckpoint writes are ``checkpoint_save_sync`` spans, and the
processor turns them into throughput and goodput. Spans go to ``./traintel-runs`` unless an
``OTEL_*`` exporter is configured.
"""

from __future__ import annotations

import tempfile
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from traintel.integrations.lightning import TraintelTrainer


class Regressor(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def loader(samples: int, seed: int) -> DataLoader[Any]:
    x = torch.randn(samples, 16, generator=torch.Generator().manual_seed(seed))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def main() -> None:
    trainer = TraintelTrainer(
        max_epochs=3,
        accumulate_grad_batches=2,
        accelerator="cpu",
        default_root_dir=tempfile.mkdtemp(),
        logger=False,
        enable_progress_bar=False,
    )
    trainer.fit(Regressor(), loader(256, 0), loader(64, 1))
    print("optimizer steps:", trainer.global_step)


if __name__ == "__main__":
    main()
