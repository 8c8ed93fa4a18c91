"""The Lightning callback with a real ``Trainer`` on CPU: span tree, gradient accumulation,
validation, checkpoint save and resume, metrics, and a failing step."""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traintel
from tests.conftest import parent_name
from tests.integration_helpers import Captured, attr, capture, children, metric_points, window_updates
from tests.subprocess_helpers import REPO, SUITE_ENV
from traintel import semconv

pytestmark = [pytest.mark.framework]  # the suite's tiers: tests/tiers.py

pl = pytest.importorskip("lightning.pytorch")
from traintel.integrations.lightning import TraintelCallback, TraintelTrainer  # noqa: E402

BATCH = 4
ACCUMULATE = 2
BATCHES_PER_EPOCH = 12  # 6 optimizer steps per epoch


class TinyModule(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, fail_at_step: int = -1) -> None:
        super().__init__()
        self.net = nn.Linear(6, 1)
        self.fail_at_step = fail_at_step
        self.losses: list[float] = []
        self.eval_losses: list[float] = []  # what validation_step / test_step logged, in order

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fail_at_step:
            raise RuntimeError(f"boom at step {self.global_step}")
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.eval_losses.append(float(loss))
        self.log("val_loss", loss)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        self.log_dict({"test_marker": 7.0})  # logged once per loop, outside any iteration

    def test_dataloader(self) -> DataLoader[Any]:
        return self.val_dataloader()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> DataLoader[Any]:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(BATCH * BATCHES_PER_EPOCH, 6, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)

    def val_dataloader(self) -> DataLoader[Any]:
        x = torch.randn(2 * BATCH, 6)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)


def _trainer(root: Path, max_epochs: int, **kwargs: Any) -> Any:
    return TraintelTrainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=ACCUMULATE,
        default_root_dir=str(root),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


@pytest.fixture
def captured() -> Iterator[Captured]:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    yield capture()
    traintel.shutdown(2)


def test_fit_validate_checkpoint_and_resume(captured: Captured, tmp_path: Path) -> None:
    model = TinyModule()
    trainer = _trainer(tmp_path, max_epochs=8)
    assert sum(isinstance(c, TraintelCallback) for c in trainer.callbacks) == 1
    trainer.fit(model)
    assert trainer.global_step == 48

    spans = captured.spans()
    counts = captured.counts()
    assert counts["application"] == 1
    assert counts["training_loop"] == 1
    assert counts["training_iteration"] == 48, "an iteration is an optimizer step, not a micro-batch"
    assert counts["validation_loop"] == 8
    assert counts["validation_iteration"] == 16
    assert counts["checkpoint_save_sync"] == 8  # ModelCheckpoint, once per epoch
    for name, parent in {
        "training_loop": "application",
        "training_iteration": "training_loop",
        "validation_loop": "training_loop",
        "validation_iteration": "validation_loop",
        "checkpoint_save_sync": "training_loop",
    }.items():
        assert {parent_name(s, spans) for s in captured.named(name)} == {parent}, name
    iterations = captured.named("training_iteration")
    assert [attr(s, semconv.ITERATION) for s in iterations] == list(range(48))
    for span in iterations:
        # two micro-batches per step, each with its own data wait, forward and backward
        assert children(span, spans) == {
            "data_loading": ACCUMULATE,
            "model_forward": ACCUMULATE,
            "model_backward": ACCUMULATE,
            "optimizer_update": 1,
        }
        assert attr(span, semconv.SAMPLES) == BATCH * ACCUMULATE
        assert attr(span, semconv.INTEGRATION) == "lightning"
    # the loss on each iteration is the last micro-batch's training_step loss
    assert [attr(s, semconv.METRIC_PREFIX + "loss") for s in iterations] == model.losses[ACCUMULATE - 1 :: 2]
    # phases are in order inside each iteration
    first = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == iterations[0].context.span_id),
        key=lambda s: s.start_time or 0,
    )
    assert [s.name for s in first] == ["data_loading", "model_forward", "model_backward"] * 2 + [
        "optimizer_update"
    ]
    # FLOPs for MFU: counted by traintel on the first micro-batch as it ran (Linear(6, 1) on a
    # batch of 4: 2*4*6 forward FLOPs; model FLOPs = 3 x forward, per sample)
    config = traintel.get_telemetry().config
    assert config.resolve().flops_per_sample == 3 * (2 * BATCH * 6) / BATCH
    assert config.resolve().executed_flops_per_sample == (2 * BATCH * 6 + 2 * 6 * 1 * BATCH) / BATCH
    assert config.resolve().flops_method == "counter"
    save = captured.named("checkpoint_save_sync")[-1]
    path = Path(str(attr(save, semconv.CHECKPOINT_PATH)))
    assert path.is_file()
    assert attr(save, semconv.CHECKPOINT_SIZE) == path.stat().st_size
    # metrics: samples counted per optimizer step, throughput over the iterations' wall time
    assert captured.metric_sum(semconv.METRIC_SAMPLES) == 48 * BATCH * ACCUMULATE
    updates = window_updates(captured)
    assert sum(u[semconv.WINDOW_PREFIX + "samples"] for u in updates) == 48 * BATCH * ACCUMULATE
    last = updates[-1]
    window = [
        s for s in iterations if attr(s, semconv.ITERATION) >= last[semconv.WINDOW_PREFIX + "first_iteration"]
    ]
    wall = sum((s.end_time or 0) - (s.start_time or 0) for s in window) / 1e9
    assert last[semconv.WINDOW_PREFIX + "samples_per_second"] == pytest.approx(
        last[semconv.WINDOW_PREFIX + "samples"] / wall, rel=1e-9
    )

    # what validation_step logged: on each validation iteration, and last / mean over the
    # loop's batches on its validation_metrics_update event
    validations = captured.named("validation_loop")
    assert len(model.eval_losses) == 2 * len(validations)
    assert [attr(s, semconv.METRIC_PREFIX + "val_loss") for s in captured.named("validation_iteration")] == (
        model.eval_losses
    )
    pairs = zip(model.eval_losses[::2], model.eval_losses[1::2], strict=True)
    for loop, (first_loss, last_loss) in zip(validations, pairs, strict=True):
        update = _eval_update(loop, semconv.Event.VALIDATION_METRICS_UPDATE)
        assert update[semconv.EVAL_PREFIX + "metric.val_loss.last"] == last_loss
        assert update[semconv.EVAL_PREFIX + "metric.val_loss.mean"] == (first_loss + last_loss) / 2
    # Lightning's own epoch value (batch-size weighted, float32) agrees: equal batch sizes
    assert float(trainer.callback_metrics["val_loss"]) == pytest.approx(
        (first_loss + last_loss) / 2, rel=1e-6
    )

    # test: its own application (one per Trainer entry point), loop and iterations
    trainer.test(model, verbose=False)
    spans = captured.spans()
    (testing,) = captured.named("testing_loop")
    assert parent_name(testing, spans) == "application"
    assert children(testing, spans) == {"testing_iteration": 2}
    assert captured.counts()["application"] == 2
    update = _eval_update(testing, semconv.Event.TESTING_METRICS_UPDATE)
    first_loss, last_loss = model.eval_losses[-2:]
    assert update[semconv.EVAL_PREFIX + "metric.val_loss.last"] == last_loss
    assert update[semconv.EVAL_PREFIX + "metric.val_loss.mean"] == (first_loss + last_loss) / 2
    # logged in on_test_epoch_end (through log_dict): the loop's own value, in its update too
    assert update[semconv.EVAL_PREFIX + "metric.test_marker.last"] == 7.0
    assert update[semconv.EVAL_PREFIX + "metric.test_marker.mean"] == 7.0
    assert "log" not in vars(model), "the module's log is restored at teardown"

    # resume from the checkpoint: the load is traced and numbering continues from global_step
    resumed = _trainer(tmp_path / "resumed", max_epochs=9)
    resumed.fit(TinyModule(), ckpt_path=str(path))
    spans = captured.spans()
    load = captured.named("checkpoint_load")
    assert len(load) == 1
    assert attr(load[0], semconv.CHECKPOINT_PATH) == str(path)
    assert attr(load[0], semconv.INTEGRATION) == attr(save, semconv.INTEGRATION) == "lightning"
    assert parent_name(load[0], spans) == "application"
    loops = captured.named("training_loop")
    assert attr(loops[-1], semconv.TRAIN_ITERATIONS_START) == 48
    resumed_iterations = [s for s in captured.named("training_iteration") if s.parent == loops[-1].context]
    assert [attr(s, semconv.ITERATION) for s in resumed_iterations] == list(range(48, 54))


def _eval_update(loop: Any, event: semconv.Event) -> dict[str, Any]:
    (update,) = (e for e in loop.events if e.name == event.value)
    return dict(update.attributes or {})


def test_a_failing_step_marks_spans_error_and_propagates_unchanged(
    captured: Captured, tmp_path: Path
) -> None:
    model = TinyModule(fail_at_step=3)
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[TraintelCallback()])
    with pytest.raises(RuntimeError, match="boom at step 3") as raised:
        trainer.fit(model)
    assert type(raised.value) is RuntimeError
    errors = {s.name for s in captured.spans() if not s.status.is_ok}
    assert errors == {"application", "training_loop", "training_iteration", "model_forward"}
    failed = next(s for s in captured.named("training_iteration") if not s.status.is_ok)
    assert attr(failed, semconv.ITERATION) == 3
    assert "boom at step 3" in (failed.status.description or "")


class _SavesTheWholeModule(pl.Callback):  # type: ignore[misc]
    """What some users do mid-fit: torch.save(model) (a pickle of the module) and deepcopy."""

    def __init__(self) -> None:
        self.copies: list[Any] = []

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.copies.append(torch.load(_pickled(pl_module), weights_only=False))
        self.copies.append(copy.deepcopy(pl_module))


def _pickled(module: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return buffer


def test_the_module_pickles_and_copies_mid_fit_and_copies_report_nothing(
    captured: Captured, tmp_path: Path
) -> None:
    model = TinyModule()
    saver = _SavesTheWholeModule()
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[TraintelCallback(), saver])
    trainer.fit(model)
    assert len(saver.copies) == 2
    for clone in saver.copies:
        assert clone.log.__func__ is type(clone).log  # the class's plain log, bound to the copy
        assert clone.log.__self__ is clone
    assert "log" not in vars(model)  # restored at teardown
    (loop,) = captured.named("validation_loop")
    update = _eval_update(loop, semconv.Event.VALIDATION_METRICS_UPDATE)
    assert update[semconv.EVAL_PREFIX + "metric.val_loss.last"] == model.eval_losses[-1]


def test_the_pytorch_lightning_namespace_has_the_same_callback() -> None:
    legacy = pytest.importorskip("pytorch_lightning")
    from traintel.integrations import pytorch_lightning as integration

    assert issubclass(integration.TraintelCallback, legacy.Callback)
    trainer = integration.TraintelTrainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    assert sum(isinstance(c, integration.TraintelCallback) for c in trainer.callbacks) == 1
    # a single callback (not a list), as Lightning accepts, is kept next to ours
    other = legacy.Callback()
    trainer = integration.TraintelTrainer(callbacks=other, logger=False, enable_checkpointing=False)
    assert other in trainer.callbacks
    assert sum(isinstance(c, integration.TraintelCallback) for c in trainer.callbacks) == 1


def test_the_sanity_check_keeps_span_ids_unique_and_what_it_logs_out(
    captured: Captured, tmp_path: Path
) -> None:
    """Lightning runs its sanity check under ``isolate_rng()`` (Python's ``random`` state saved
    and restored) and users call ``seed_everything``: span ids must not come from that state."""
    pl.seed_everything(0, verbose=False)
    trainer = _trainer(tmp_path, max_epochs=1, enable_checkpointing=False)
    trainer.num_sanity_val_steps = 2
    model = TinyModule()
    trainer.fit(model)
    spans = captured.spans()
    sanity, epoch = captured.named("validation_loop")
    assert parent_name(sanity, spans) == "application"  # before the training loop
    # what the sanity check logs Lightning discards; traintel too
    metric = semconv.EVAL_PREFIX + "metric."
    assert not [
        k for k in _eval_update(sanity, semconv.Event.VALIDATION_METRICS_UPDATE) if k.startswith(metric)
    ]
    update = _eval_update(epoch, semconv.Event.VALIDATION_METRICS_UPDATE)
    assert update[metric + "val_loss.last"] == model.eval_losses[-1]
    assert update[metric + "val_loss.mean"] == sum(model.eval_losses[-2:]) / 2
    ids = [s.context.span_id for s in spans]
    assert len(ids) == len(set(ids))
    pl.seed_everything(0, verbose=False)  # the same seed again: fresh ids all the same
    with traintel.timed_span("after_reseeding"):
        pass
    (again,) = captured.named("after_reseeding")
    assert again.context.span_id not in ids and again.context.trace_id not in {
        s.context.trace_id for s in spans
    }


class _SavesUnderTheScriptsOwnSpan(pl.Callback):  # type: ignore[misc]
    """A script that also traces its own save with traintel: ``trainer.save_checkpoint`` inside
    ``traintel.checkpoint_save``, mid-fit."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        with traintel.checkpoint_save(path=str(self.path)):
            trainer.save_checkpoint(str(self.path))


def test_the_scripts_own_loop_and_checkpoint_spans_are_not_doubled(
    captured: Captured, tmp_path: Path
) -> None:
    manual = tmp_path / "manual.ckpt"
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[_SavesUnderTheScriptsOwnSpan(manual)])
    with traintel.application(), traintel.training_loop(train_iterations_start=0):
        trainer.fit(TinyModule())
    spans = captured.spans()
    (loop,) = captured.named("training_loop")
    assert {parent_name(s, spans) for s in captured.named("training_iteration")} == {"training_loop"}
    assert attr(loop, semconv.SUMMARY_PREFIX + "iterations") == BATCHES_PER_EPOCH // ACCUMULATE
    saves = captured.named("checkpoint_save_sync")
    written = [manual, *(tmp_path / "checkpoints").iterdir()]  # the script's and ModelCheckpoint's
    assert len(saves) == len(written) == 2
    assert {parent_name(s, spans) for s in saves} == {"training_loop"}
    (sizes,) = metric_points(captured.reader, semconv.METRIC_CHECKPOINT_SIZE)
    assert (sizes.count, sizes.sum) == (2, sum(p.stat().st_size for p in written))


def test_zero_code_torch_patches_do_not_count_lightnings_save_again(
    captured: Captured, tmp_path: Path
) -> None:
    """``opentelemetry-instrument`` around a script that uses the callback: Lightning's
    ``save_checkpoint`` calls ``torch.save`` inside the callback's checkpoint span."""
    from traintel.instrumentation import TraintelInstrumentor

    instrumentor = TraintelInstrumentor()
    instrumentor.instrument()
    try:
        trainer = _trainer(tmp_path, max_epochs=2)
        trainer.fit(TinyModule())
        spans = captured.spans()
    finally:
        instrumentor.uninstrument()
    written = list((tmp_path / "checkpoints").iterdir())
    saves = [s for s in spans if s.name == "checkpoint_save_sync"]
    assert len(saves) == 2 and len(written) == 1  # ModelCheckpoint each epoch, the same file
    assert {parent_name(s, spans) for s in saves} == {"training_loop"}
    assert {attr(s, semconv.INTEGRATION) for s in saves} == {"lightning"}


class _FailingSecondWrite(pl.plugins.io.TorchCheckpointIO):  # type: ignore[misc]
    """A base IO whose second write fails (a full disk), under ``AsyncCheckpointIO``."""

    writes = 0

    def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
        self.writes += 1
        if self.writes == 2:
            raise OSError(28, "No space left on device")
        super().save_checkpoint(checkpoint, path, storage_options)


def _async_fit(root: Path, base: Any = None) -> list[Path]:
    every_epoch = pl.callbacks.ModelCheckpoint(dirpath=root / "ck", save_top_k=-1)
    io = pl.plugins.io.AsyncCheckpointIO(base)
    _trainer(root, max_epochs=2, callbacks=[every_epoch], plugins=[io]).fit(TinyModule())
    return sorted((root / "ck").iterdir())


def test_async_checkpoint_io_saves_are_async_and_end_with_their_write(
    captured: Captured, tmp_path: Path
) -> None:
    """Lightning's ``AsyncCheckpointIO`` writes in a thread of its own. Before: each save was a
    blocking ``checkpoint_save_sync`` of a few milliseconds, its size not measurable yet (said
    once, no bytes), and the write itself was seen nowhere."""
    written = _async_fit(tmp_path)
    spans = captured.spans()
    saves, finalizes = captured.named("checkpoint_save_async"), captured.named("checkpoint_finalize")
    assert len(written) == len(saves) == len(finalizes) == 2 and not captured.named("checkpoint_save_sync")
    save_ids = {s.context.span_id for s in saves}
    for finalize in finalizes:
        (save_link, *_) = finalize.links
        assert save_link.context.span_id in save_ids and finalize.status.is_ok
        assert str(attr(finalize, semconv.THREAD_NAME)).startswith("ThreadPoolExecutor")
    sizes = sorted(attr(f, semconv.CHECKPOINT_SIZE) for f in finalizes)
    assert sizes == sorted(p.stat().st_size for p in written)
    assert {parent_name(s, spans) for s in saves} == {"training_loop"}
    (size_points,) = metric_points(captured.reader, semconv.METRIC_CHECKPOINT_SIZE)
    assert (size_points.count, size_points.sum) == (2, sum(sizes))


def test_an_async_checkpoint_io_write_that_fails_ends_its_save_in_error(
    captured: Captured, tmp_path: Path
) -> None:
    with pytest.raises(OSError, match="No space left"):  # Lightning re-raises at teardown
        _async_fit(tmp_path, _FailingSecondWrite())
    finalizes = captured.named("checkpoint_finalize")
    assert sorted(f.status.is_ok for f in finalizes) == [False, True]
    (failed,) = [f for f in finalizes if not f.status.is_ok]
    assert "No space left" in str(failed.status.description)


def test_validation_between_the_micro_batches_of_a_step_loses_none_of_its_work(
    captured: Captured, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``val_check_interval`` counts micro-batches: 3 with 2 per step validates mid-step."""
    model = TinyModule()
    trainer = _trainer(tmp_path, max_epochs=1, val_check_interval=3, enable_checkpointing=False)
    with caplog.at_level(logging.WARNING, logger="traintel"):
        trainer.fit(model)
    spans = captured.spans()
    iterations = captured.named("training_iteration")
    steps = BATCHES_PER_EPOCH // ACCUMULATE
    assert [attr(s, semconv.SAMPLES) for s in iterations] == [BATCH * ACCUMULATE] * steps
    assert [attr(s, semconv.METRIC_PREFIX + "loss") for s in iterations] == model.losses[ACCUMULATE - 1 :: 2]
    assert "training_iteration" in {parent_name(s, spans) for s in captured.named("validation_loop")}
    assert captured.metric_sum(semconv.METRIC_SAMPLES) == steps * BATCH * ACCUMULATE
    assert not [r for r in caplog.records if "outside a training iteration" in r.getMessage()]


_DDP_SCRIPT = """
import lightning.pytorch as pl, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from traintel.integrations.lightning import TraintelTrainer

class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(6, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

x = torch.randn(32, 6)
trainer = TraintelTrainer(
    max_steps=2, accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
    enable_model_summary=False, enable_checkpointing=False,
)
trainer.fit(Module(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
"""


@pytest.mark.process
def test_the_ranks_lightning_launches_itself_are_one_run(tmp_path: Path) -> None:
    """``devices=2`` without torchrun or Slurm: Lightning starts rank 1 itself, with no job id
    of a launcher; the ranks still report as one run (rank 0's id)."""
    script = tmp_path / "ddp_fit.py"
    script.write_text(_DDP_SCRIPT)
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("TRAINTEL_", "TORCHELASTIC_", "SLURM_"))
    }
    environ.update(SUITE_ENV, PYTHONPATH=str(REPO / "src"), TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"))
    done = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_ids: dict[int, set[str]] = {}
    for path in (tmp_path / "runs").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            for resource_spans in json.loads(line).get("resourceSpans", []):
                attributes = {
                    a["key"]: next(iter(a["value"].values()))
                    for a in resource_spans["resource"]["attributes"]
                }
                rank = int(attributes[semconv.RANK])
                run_ids.setdefault(rank, set()).add(attributes[semconv.RUN_ID])
    assert set(run_ids) == {0, 1}
    assert len(run_ids[0] | run_ids[1]) == 1


def test_saves_no_write_finishes_are_let_go_past_a_bound(captured: Captured, tmp_path: Path) -> None:
    """Under DDP only rank 0 writes: the other ranks hand over saves no write finishes. At most
    ``MAX_PENDING`` wait; the oldest are let go, and a later write still finishes its own."""
    from traintel.integrations._driver import AsyncWrites

    writes = AsyncWrites()
    with traintel.training_loop():
        for n in range(AsyncWrites.MAX_PENDING + 6):
            with traintel.checkpoint_save(strategy="async") as save:
                writes.expect(tmp_path / f"{n}.ckpt", save.completion())
    assert len(writes._pending) == AsyncWrites.MAX_PENDING
    written: list[Any] = []
    write = writes.finishing(lambda checkpoint, path: path)(lambda checkpoint, path: written.append(path))
    write({}, tmp_path / "0.ckpt")  # let go: nothing to finish
    write({}, tmp_path / f"{AsyncWrites.MAX_PENDING + 5}.ckpt")
    assert len(written) == 2 and len(captured.named("checkpoint_finalize")) == 1
