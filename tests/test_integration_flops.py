"""The Lightning and Hugging Face integrations count a small GPT's FLOPs on CPU as the analytic
formula does: 6N + 12·L·d·S per token, attention included although torch's FLOP counter has no
formula for CPU attention (the integrations add the term from the calls' shapes and say so)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traintel
from tests.integration_helpers import Captured, capture
from tests.test_flops import TinyLM

pytestmark = [pytest.mark.framework]  # the suite's tiers: tests/tiers.py

pl = pytest.importorskip("lightning.pytorch")
transformers = pytest.importorskip("transformers")
from traintel.integrations.lightning import TraintelTrainer  # noqa: E402
from traintel.integrations.transformers import instrument_trainer  # noqa: E402

VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 64, 32, 4, 2, 16, 2


class TinyGpt(pl.LightningModule):  # type: ignore[misc]
    """test_flops' transformer (attention by ``scaled_dot_product_attention``) in a module."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = TinyLM(vocab=VOCAB, dim=WIDTH, heads=HEADS, layers=LAYERS)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        return F.cross_entropy(self.net(ids).flatten(0, 1), ids.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        ids = torch.randint(0, VOCAB, (4 * BATCH, SEQ), generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(ids), batch_size=BATCH)


def analytic_flops_per_sample(matmul_parameters: int, layers: int, width: int, seq: int) -> int:
    """(6N + 12·L·d·S) per token, S tokens per sample (PaLM, appendix B)."""
    return (6 * matmul_parameters + 12 * layers * width * seq) * seq


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Captured]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    yield capture()
    traintel.shutdown(2)


def test_lightning_counts_6n_plus_attention_on_cpu(
    captured: Captured, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    model = TinyGpt()
    trainer = TraintelTrainer(
        max_steps=2, accelerator="cpu", devices=1, default_root_dir=str(tmp_path), logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="traintel"):
        trainer.fit(model)
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    config = traintel.get_telemetry().config
    assert config.resolve().flops_per_sample == analytic_flops_per_sample(n, LAYERS, WIDTH, SEQ)
    assert config.resolve().flops_method == "counter+attention"
    said = [r.getMessage() for r in caplog.records if "no formula for attention" in r.getMessage()]
    assert len(said) == 1 and f"{LAYERS} scaled_dot_product_attention call(s)" in said[0]


class Ids(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        self.ids = torch.randint(0, VOCAB, (8, SEQ), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def test_transformers_counts_6n_plus_attention_on_cpu(captured: Captured, tmp_path: Any) -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=SEQ,
        bos_token_id=0, eos_token_id=0, attn_implementation="sdpa", attn_pdrop=0.0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)  # no attention dropout: CPU's fused kernel runs
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=BATCH, report_to=[],
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, save_strategy="no", seed=0,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Ids())
    instrument_trainer(trainer)
    trainer.train()
    # N: the matmul weights (Conv1D blocks and the head, tied to the token embedding but a
    # matmul all the same); embeddings and norms are lookups and elementwise work.
    conv1d = transformers.pytorch_utils.Conv1D
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, conv1d)) + VOCAB * WIDTH
    got = traintel.get_telemetry().config
    assert got.resolve().flops_per_sample == analytic_flops_per_sample(n, LAYERS, WIDTH, SEQ)
    assert got.resolve().flops_method == "counter+attention"
