"""A small, real PyTorch training job instrumented with traintel (what ``make demo`` runs).

An MLP learns a synthetic classification task on the CPU: a few hundred iterations, a
validation loop every 100 iterations, a checkpoint save and a reload into a temp directory.
No collector is needed: with no ``OTEL_*`` exporter configured, telemetry goes to the
embedded default, an OTLP/JSON-lines file under ``./traintel-runs``. At the end the file is
read back and summarised. Point it at a collector instead with, for example::

    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 python examples/train_mlp.py
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

# torch built without NumPy says so on import; this job does not use NumPy
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import traintel  # noqa: E402
from traintel.analysis.summary import render, summarize  # noqa: E402


def make_data(
    train: int, validation: int, features: int, classes: int
) -> tuple[TensorDataset, TensorDataset]:
    """Noisy points around one centre per class; both splits are drawn around the same centres,
    so what the model learns on one carries over to the other."""
    generator = torch.Generator().manual_seed(1)
    centers = torch.randn(classes, features, generator=generator) * 0.5
    samples = train + validation
    labels = torch.randint(0, classes, (samples,), generator=generator)
    inputs = centers[labels] + torch.randn(samples, features, generator=generator)
    return TensorDataset(inputs[:train], labels[:train]), TensorDataset(inputs[train:], labels[train:])


def progress(done: int, total: int, loss: float, started: float) -> None:
    width = 30
    filled = width * done // total
    rate = done / max(time.perf_counter() - started, 1e-9)
    line = (
        f"\rtraining [{'#' * filled}{'.' * (width - filled)}] {done}/{total} loss {loss:.3f} {rate:.0f} it/s"
    )
    if sys.stderr.isatty():
        print(line, end="", file=sys.stderr, flush=True)
    elif done % 50 == 0 or done == total:
        print(line.strip(), file=sys.stderr, flush=True)


def forever(loader: DataLoader[tuple[torch.Tensor, ...]]):  # type: ignore[no-untyped-def]
    while True:
        yield from loader


@traintel.application()
def main(iterations: int, batch_size: int, workdir: Path, lr: float = 3e-3) -> None:
    torch.manual_seed(0)
    with traintel.data_loader_init():
        train_data, val_data = make_data(8192, 1024, features=32, classes=4)
        train_loader = DataLoader(train_data, batch_size=batch_size, shuffle=True)
        val_loader = DataLoader(val_data, batch_size=256)
    # The batch size is known only now: lazy configuration, as in the reference library.
    traintel.set_training_config(global_batch_size=batch_size)
    with traintel.model_init():
        model = nn.Sequential(
            nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4)
        )
    with traintel.optimizer_init():
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    checkpoint = workdir / "checkpoint.pt"

    batches = forever(train_loader)
    started = time.perf_counter()
    with traintel.training_loop(train_iterations_start=0, train_iterations_target=iterations):
        for step in range(1, iterations + 1):
            with traintel.training_iteration(samples=batch_size):
                with traintel.data_loading():
                    inputs, labels = next(batches)
                with traintel.model_forward():
                    loss = loss_fn(model(inputs), labels)
                with traintel.model_backward():
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                with traintel.optimizer_update():
                    optimizer.step()
                loss_value = loss.item()
                traintel.record_metrics(loss=loss_value, lr=optimizer.param_groups[0]["lr"])
            progress(step, iterations, loss_value, started)
            if step % 100 == 0 or step == iterations:
                validate(model, val_loader, loss_fn)
            if step == iterations // 2 or step == iterations:
                with traintel.checkpoint_save(strategy="sync", iteration=step, path=checkpoint):
                    torch.save(
                        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                        checkpoint,
                    )
    if sys.stderr.isatty():
        print(file=sys.stderr)

    # Reload the checkpoint into a fresh model, as a resumed job would.
    with traintel.checkpoint_load(path=checkpoint, iteration=iterations):
        state = torch.load(checkpoint, weights_only=True)
        restored = nn.Sequential(
            nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4)
        )
        restored.load_state_dict(state["model"])
    with traintel.testing_loop(), torch.no_grad():
        correct = 0
        for inputs, labels in val_loader:
            with traintel.testing_iteration(samples=len(labels)):
                correct += int((restored(inputs).argmax(dim=1) == labels).sum())
        traintel.record_metrics(accuracy=correct / len(val_loader.dataset))  # type: ignore[arg-type]
    print(f"restored model accuracy: {correct / len(val_loader.dataset):.3f}")  # type: ignore[arg-type]


def validate(model: nn.Module, loader: DataLoader[tuple[torch.Tensor, ...]], loss_fn: nn.Module) -> None:
    model.eval()
    with traintel.validation_loop(), torch.no_grad():
        total = 0.0
        for inputs, labels in loader:
            with traintel.validation_iteration(samples=len(labels)):
                total += float(loss_fn(model(inputs), labels))
        traintel.record_metrics(val_loss=total / len(loader))
    model.train()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="traintel-demo-") as tmp:
        main(args.iterations, args.batch_size, Path(tmp), args.lr)
    telemetry = traintel.get_telemetry()
    output = telemetry.output_file
    traintel.shutdown()  # flush now so the file is complete before we read it back
    if output is None:
        print("telemetry went to the configured OTLP exporter(s); no local file to summarise")
    else:
        print()
        print(render(summarize([output])))
        print()
        # `make demo` runs .venv/bin/python without activating it: then `traintel` is not on PATH
        command = "traintel" if shutil.which("traintel") else Path(sys.executable).with_name("traintel")
        print(f"telemetry file: {output}")
        print(f"summarise it again with: {command} summary {output.parent}")
        print(f"full report with charts: {command} report {output.parent} --html report.html")
