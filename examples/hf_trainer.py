"""A Hugging Face ``Trainer`` job traced by traintel: one call, ``instrument_trainer(trainer)``.

    pip install 'traintel[transformers]'
    HF_HUB_OFFLINE=1 python examples/hf_trainer.py

The model is a tiny GPT-2 built from a config (nothing is downloaded). traintel counts its
FLOPs on the first step itself (``state.total_flos`` is zero or wrong behind DDP/FSDP/compile
wrappers), counts samples and non-padding tokens per micro-batch and reports them per optimizer
step. Set ``TRAINTEL_PEAK_FLOPS`` (or run on a GPU in the peak table) to get MFU.
"""

from __future__ import annotations

import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from traintel.integrations.transformers import instrument_trainer

SEQ = 32


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, size: int) -> None:
        self.ids = torch.randint(0, 256, (size, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=SEQ, bos_token_id=0, eos_token_id=0
    )
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=40,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        eval_strategy="steps",
        eval_steps=20,
        save_steps=40,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=RandomTokens(512),
        eval_dataset=RandomTokens(32),
    )
    instrument_trainer(trainer)
    trainer.train()


if __name__ == "__main__":
    main()
