"""A plain PyTorch training script with no telemetry code at all.

Run it under OpenTelemetry's launcher and traintel's instrumentor traces it::

    opentelemetry-instrument python examples/zero_code_train.py

Every optimizer step becomes a ``training_iteration`` with ``data_loading`` and
``optimizer_update`` children, ``torch.save`` / ``torch.load`` become checkpoint spans, and
the processor computes throughput from the batch sizes the DataLoader yields. The launcher's
exporters are OpenTelemetry's: with the ``opentelemetry-distro`` defaults they send OTLP to
localhost (point ``OTEL_EXPORTER_OTLP_ENDPOINT`` at your collector); to keep the run in
``./traintel-runs`` (OTLP/JSON lines, what ``traintel summary`` reads) instead::

    OTEL_TRACES_EXPORTER=traintel_file OTEL_METRICS_EXPORTER=traintel_file \
        opentelemetry-instrument python examples/zero_code_train.py
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--fail-at-step", type=int, default=-1, help="raise inside a step (for tests)")
    args = parser.parse_args()

    torch.manual_seed(0)
    features = torch.randn(160, 8)
    labels = (features.sum(dim=1) > 0).long()
    train = DataLoader(TensorDataset(features[:128], labels[:128]), batch_size=16, shuffle=True)
    valid = DataLoader(TensorDataset(features[128:], labels[128:]), batch_size=16)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    for _epoch in range(args.epochs):
        model.train()
        for x, y in train:
            if step == args.fail_at_step:
                raise RuntimeError(f"failing at step {step} as asked")
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in valid)
        print(f"step {step} loss {loss.item():.4f} valid accuracy {correct / 32:.2f}")

    directory = args.checkpoint_dir or Path(tempfile.mkdtemp())
    path = directory / "model.pt"
    torch.save({"model": model.state_dict(), "step": step}, path)
    restored = torch.load(path)
    print("reloaded step", restored["step"])


if __name__ == "__main__":
    main()
