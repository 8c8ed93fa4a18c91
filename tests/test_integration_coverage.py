"""What the framework tests leave out: a real fit in the ``pytorch_lightning`` namespace with
``samples_fn``/``tokens_fn``, and the Hugging Face ``predict`` path (testing loop)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traintel
from tests.conftest import parent_name
from tests.integration_helpers import Captured, attr, capture, children, window_updates
from traintel import semconv

pytestmark = [pytest.mark.framework]  # the suite's tiers: tests/tiers.py

BATCH = 4
ACCUMULATE = 2


@pytest.fixture
def captured() -> Iterator[Captured]:
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    yield capture()
    traintel.shutdown(2)


def test_pytorch_lightning_fit_counts_samples_and_tokens_from_the_batch(
    captured: Captured, tmp_path: Path
) -> None:
    legacy = pytest.importorskip("pytorch_lightning")
    from traintel.integrations.pytorch_lightning import TraintelCallback, TraintelTrainer

    class Module(legacy.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(6, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def train_dataloader(self) -> DataLoader[Any]:
            x = torch.randn(BATCH * ACCUMULATE * 4, 6, generator=torch.Generator().manual_seed(0))
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)

    callback = TraintelCallback(
        samples_fn=lambda batch: 3 * len(batch[0]),  # e.g. each row holds three packed samples
        tokens_fn=lambda batch: 10 * len(batch[0]),
    )
    trainer = TraintelTrainer(
        max_epochs=1, accelerator="cpu", devices=1, accumulate_grad_batches=ACCUMULATE,
        default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, callbacks=[callback],
    )  # fmt: skip
    assert [c for c in trainer.callbacks if isinstance(c, TraintelCallback)] == [callback]
    trainer.fit(Module())
    spans = captured.spans()
    iterations = captured.named("training_iteration")
    assert [attr(s, semconv.ITERATION) for s in iterations] == [0, 1, 2, 3]
    assert {parent_name(s, spans) for s in iterations} == {"training_loop"}
    for span in iterations:
        assert children(span, spans) == {
            "data_loading": ACCUMULATE,
            "model_forward": ACCUMULATE,
            "model_backward": ACCUMULATE,
            "optimizer_update": 1,
        }
        assert attr(span, semconv.SAMPLES) == 3 * BATCH * ACCUMULATE
        assert attr(span, semconv.TOKENS) == 10 * BATCH * ACCUMULATE
    updates = window_updates(captured)
    assert sum(u[semconv.WINDOW_PREFIX + "samples"] for u in updates) == 4 * 3 * BATCH * ACCUMULATE
    assert sum(u[semconv.WINDOW_PREFIX + "tokens"] for u in updates) == 4 * 10 * BATCH * ACCUMULATE


def test_hugging_face_predict_is_a_testing_loop(
    captured: Captured, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    from traintel.integrations.transformers import instrument_trainer

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=8)
    ids = torch.randint(0, 64, (10, 8), generator=torch.Generator().manual_seed(1))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to=[], use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args)
    instrument_trainer(trainer)
    output = trainer.predict(dataset)
    assert output.predictions.shape[0] == 10
    spans = captured.spans()
    (testing,) = captured.named("testing_loop")
    assert children(testing, spans) == {"testing_iteration": 3}  # 10 samples in batches of 4
    assert [attr(s, semconv.SAMPLES) for s in captured.named("testing_iteration")] == [4, 4, 2]
    (update,) = [e for e in testing.events if e.name == semconv.Event.TESTING_METRICS_UPDATE.value]
    assert (update.attributes or {})[semconv.EVAL_PREFIX + "iterations"] == 3
    assert (update.attributes or {})[semconv.EVAL_PREFIX + "samples"] == 10
    assert not captured.named("validation_loop") and not captured.named("training_iteration")
