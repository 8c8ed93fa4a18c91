"""The Hugging Face integration with a real ``Trainer`` on CPU and a tiny randomly initialised
GPT-2 built from a config (no downloads), 48 optimizer steps: span tree, gradient
accumulation, evaluation, checkpoint save and resume, FLOPs counted by traintel, and a failing
step."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from opentelemetry import trace

pytestmark = [pytest.mark.framework]  # the suite's tiers: tests/tiers.py

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

import traintel  # noqa: E402
from tests.conftest import parent_name  # noqa: E402
from tests.integration_helpers import Captured, attr, capture, children, window_updates  # noqa: E402
from traintel import semconv  # noqa: E402
from traintel.integrations.transformers import TraintelCallback, instrument_trainer  # noqa: E402

BATCH = 4
ACCUMULATE = 2
SEQ = 16
STEPS = 48
PADDING = 4


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Captured]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    yield capture()
    traintel.shutdown(2)


def _model() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=SEQ, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, size: int) -> None:
        self.ids = torch.randint(0, 128, (size, SEQ), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        mask = torch.ones(SEQ, dtype=torch.long)
        mask[SEQ - PADDING :] = 0  # right padding: not counted as tokens
        return {"input_ids": self.ids[index], "labels": self.ids[index], "attention_mask": mask}


def _trainer(
    output: Path, max_steps: int, logging_steps: int = 1000, trainer_class: Any = None, **kwargs: Any
) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(output),
        max_steps=max_steps,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE,
        eval_strategy="steps",
        eval_steps=STEPS // 2,
        save_strategy="steps",
        save_steps=STEPS,
        logging_steps=logging_steps,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    return (trainer_class or transformers.Trainer)(
        model=_model(), args=args, train_dataset=Tokens(64), eval_dataset=Tokens(8), **kwargs
    )


class _SeesItsOptimizerLoad(transformers.Trainer):  # type: ignore[misc]
    """Notes the span its optimizer state is read in."""

    optimizer_load_span = 0

    def _load_optimizer_and_scheduler(self, checkpoint: Any) -> None:
        self.optimizer_load_span = trace.get_current_span().get_span_context().span_id
        super()._load_optimizer_and_scheduler(checkpoint)


def _eval_update(loop: Any) -> dict[str, Any]:
    """The attributes of the ``validation_metrics_update``/``testing_metrics_update`` event."""
    (event,) = (e for e in loop.events if e.name.endswith("_metrics_update"))
    return dict(event.attributes or {})


def _metric(update: dict[str, Any], name: str, stat: str) -> Any:
    return update.get(semconv.EVAL_PREFIX + "metric." + name + "." + stat)


def test_train_evaluate_checkpoint_resume_and_flops(captured: Captured, tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, STEPS, logging_steps=1)
    callback = instrument_trainer(trainer)
    assert instrument_trainer(trainer) is callback, "idempotent"
    trainer.train()

    spans = captured.spans()
    counts = captured.counts()
    assert counts["application"] == 1
    assert counts["training_loop"] == 1
    assert counts["training_iteration"] == STEPS, "one iteration per optimizer step"
    assert counts["validation_loop"] == 2  # every STEPS // 2 steps
    assert counts["validation_iteration"] == 4  # 8 eval samples / 4 per batch, twice
    assert counts["checkpoint_save_sync"] == 1
    for name, parent in {
        "training_loop": "application",
        "training_iteration": "training_loop",
        "validation_loop": "training_loop",
        "validation_iteration": "validation_loop",
        "checkpoint_save_sync": "training_loop",
    }.items():
        assert {parent_name(s, spans) for s in captured.named(name)} == {parent}, name
    iterations = captured.named("training_iteration")
    assert [attr(s, semconv.ITERATION) for s in iterations] == list(range(STEPS))
    for span in iterations:
        assert children(span, spans) == {
            "data_loading": 1,  # the Trainer prefetches the whole accumulation window at once
            "model_forward": ACCUMULATE,
            "model_backward": ACCUMULATE,
            "optimizer_update": 1,
        }
        assert attr(span, semconv.SAMPLES) == BATCH * ACCUMULATE
        assert attr(span, semconv.TOKENS) == BATCH * ACCUMULATE * (SEQ - PADDING)
        assert attr(span, semconv.INTEGRATION) == "transformers"
    # the loss on each iteration is the one the Trainer logged for that step (logging_steps=1)
    logged = {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}
    assert len(logged) == STEPS
    assert [attr(s, semconv.METRIC_PREFIX + "loss") for s in iterations] == [
        logged[step] for step in range(1, STEPS + 1)
    ]
    # each evaluation's metrics reach its loop's validation_metrics_update event
    evaluated = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    assert [entry["step"] for entry in evaluated] == [STEPS // 2, STEPS]
    for loop, entry in zip(captured.named("validation_loop"), evaluated, strict=True):
        update = _eval_update(loop)
        assert _metric(update, "eval_loss", "last") == entry["eval_loss"]
        assert _metric(update, "eval_loss", "mean") == entry["eval_loss"]
        assert _metric(update, "eval_runtime", "last") == entry["eval_runtime"]
    save = captured.named("checkpoint_save_sync")[0]
    path = Path(str(attr(save, semconv.CHECKPOINT_PATH)))
    assert path == tmp_path / f"checkpoint-{STEPS}"
    assert attr(save, semconv.CHECKPOINT_SIZE) == sum(
        p.stat().st_size for p in path.rglob("*") if p.is_file()
    )

    # FLOPs: traintel's own count of the unwrapped model on one micro-batch, not total_flos
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    expected = traintel.measure_flops(_model(), {"input_ids": ids, "labels": ids}, lambda o: o.loss)
    config = traintel.get_telemetry().config
    assert config.resolve().flops_per_sample == expected.model_flops_per_sample
    assert config.resolve().flops_method == "counter"
    updates = window_updates(captured)
    assert sum(u[semconv.WINDOW_PREFIX + "samples"] for u in updates) == STEPS * BATCH * ACCUMULATE
    tokens = STEPS * BATCH * ACCUMULATE * (SEQ - PADDING)
    assert sum(u[semconv.WINDOW_PREFIX + "tokens"] for u in updates) == tokens
    assert captured.metric_sum(semconv.METRIC_SAMPLES) == STEPS * BATCH * ACCUMULATE

    # resume: the load is traced (the weights, then the optimizer and scheduler state, read
    # inside the training loop's setup), numbering continues from the checkpoint's global step
    resumed = _trainer(tmp_path / "resumed", STEPS + 4, trainer_class=_SeesItsOptimizerLoad)
    instrument_trainer(resumed)
    resumed.train(resume_from_checkpoint=str(path))
    spans = captured.spans()
    load = captured.named("checkpoint_load")
    assert [attr(s, semconv.CHECKPOINT_PATH) for s in load] == [str(path)] * 2
    assert resumed.optimizer_load_span == load[1].context.span_id
    assert attr(load[0], semconv.INTEGRATION) == attr(save, semconv.INTEGRATION) == "transformers"
    loops = captured.named("training_loop")
    assert attr(loops[-1], semconv.TRAIN_ITERATIONS_START) == STEPS
    resumed_iterations = [s for s in captured.named("training_iteration") if s.parent == loops[-1].context]
    assert [attr(s, semconv.ITERATION) for s in resumed_iterations] == list(range(STEPS, STEPS + 4))


def test_a_failing_step_marks_spans_error_and_propagates(captured: Captured, tmp_path: Path) -> None:
    calls = 0

    def failing_loss(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
        nonlocal calls
        calls += 1
        if calls == 7:  # the first micro-batch of the fourth optimizer step
            raise RuntimeError("loss exploded")
        return outputs.logits.float().mean()

    trainer = _trainer(tmp_path, 8, compute_loss_func=failing_loss)
    instrument_trainer(trainer, TraintelCallback(count_flops=False))
    with pytest.raises(RuntimeError, match="loss exploded") as raised:
        trainer.train()
    assert type(raised.value) is RuntimeError
    errors = {s.name for s in captured.spans() if not s.status.is_ok}
    assert errors == {"application", "training_loop", "training_iteration", "model_forward"}
    failed = next(s for s in captured.named("training_iteration") if not s.status.is_ok)
    assert attr(failed, semconv.ITERATION) == 3


def test_formula_fallback_counts_the_model_behind_its_wrapper(captured: Captured) -> None:
    model = _model()
    wrapped = torch.nn.DataParallel(model)  # a wrapper with .module, like DDP (no GPU needed)
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    TraintelCallback().formula_flops(wrapped, {"input_ids": ids, "labels": ids})
    config = traintel.get_telemetry().config
    assert config.resolve().flops_per_sample == 6 * model.num_parameters(exclude_embeddings=True) * SEQ
    assert config.resolve().flops_method == "formula"


def test_the_callback_alone_still_gives_one_iteration_per_optimizer_step(
    captured: Captured, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """And says once what it cannot see (the run had no samples nor throughput, silently)."""
    caplog.set_level(logging.WARNING)
    trainer = _trainer(tmp_path, 4, callbacks=[TraintelCallback(count_flops=False)])
    trainer.train()
    said = [r.getMessage() for r in caplog.records if "TraintelCallback alone" in r.getMessage()]
    assert len(said) == 1 and "use instrument_trainer(trainer) instead" in said[0]
    spans = captured.spans()
    iterations = captured.named("training_iteration")
    assert [attr(s, semconv.ITERATION) for s in iterations] == [0, 1, 2, 3]
    assert all(children(s, spans) == {"optimizer_update": 1} for s in iterations)
    assert {parent_name(s, spans) for s in iterations} == {"training_loop"}


def test_compiled_model_flops_are_counted_not_taken_from_total_flos(
    captured: Captured, tmp_path: Path
) -> None:
    """``torch_compile=True`` wraps the model in an ``OptimizedModule`` (``aot_eager``: no C++
    toolchain needed); the counter still sees every operation of the first micro-batch, so the
    FLOPs equal the eager count of the unwrapped model, whatever ``total_flos`` says."""
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE,
        save_strategy="no",
        logging_steps=1000,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        torch_compile=True,
        torch_compile_backend="aot_eager",
    )
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=Tokens(64))
    instrument_trainer(trainer)
    trainer.train()
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule"
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    expected = traintel.measure_flops(_model(), {"input_ids": ids, "labels": ids}, lambda o: o.loss)
    config = traintel.get_telemetry().config
    assert config.resolve().flops_per_sample == expected.model_flops_per_sample
    assert config.resolve().flops_method == "counter"
    iterations = captured.named("training_iteration")
    assert [attr(s, semconv.ITERATION) for s in iterations] == [0, 1, 2, 3]
    spans = captured.spans()
    assert all(children(s, spans)["model_forward"] == ACCUMULATE for s in iterations)
    assert all(attr(s, semconv.METRIC_PREFIX + "loss") > 0 for s in iterations)


def test_standalone_evaluate_and_predict_are_applications_with_their_metrics(
    captured: Captured, tmp_path: Path
) -> None:
    """Without ``train()``, ``evaluate()`` and ``predict()`` each get an ``application`` (as
    Lightning's ``trainer.test`` does), and their loops' update events carry the metrics they
    return, to the digit."""
    trainer = _trainer(tmp_path, 4)
    instrument_trainer(trainer, TraintelCallback(count_flops=False))
    metrics = trainer.evaluate()
    predicted = trainer.predict(Tokens(8))

    spans = captured.spans()
    applications = captured.named("application")
    assert len(applications) == 2
    assert all(s.parent is None for s in applications)
    (validation,) = captured.named("validation_loop")
    (testing,) = captured.named("testing_loop")
    assert validation.parent == applications[0].context
    assert testing.parent == applications[1].context
    assert children(validation, spans) == {"validation_iteration": 2}
    assert children(testing, spans) == {"testing_iteration": 2}
    assert "training_loop" not in captured.counts()

    update = _eval_update(validation)
    assert _metric(update, "eval_loss", "last") == metrics["eval_loss"]
    assert _metric(update, "eval_loss", "mean") == metrics["eval_loss"]
    assert _metric(update, "eval_samples_per_second", "last") == metrics["eval_samples_per_second"]
    assert update[semconv.EVAL_PREFIX + "iterations"] == 2
    update = _eval_update(testing)
    assert _metric(update, "test_loss", "last") == predicted.metrics["test_loss"]
    assert _metric(update, "test_loss", "mean") == predicted.metrics["test_loss"]


def test_a_failing_standalone_evaluate_marks_its_application_error(
    captured: Captured, tmp_path: Path
) -> None:
    def failing_metrics(prediction: Any) -> dict[str, float]:
        raise ValueError("bad metric")

    trainer = _trainer(tmp_path, 4, compute_metrics=failing_metrics)
    instrument_trainer(trainer, TraintelCallback(count_flops=False))
    with pytest.raises(ValueError, match="bad metric") as raised:
        trainer.evaluate()
    assert type(raised.value) is ValueError
    errors = {s.name for s in captured.spans() if not s.status.is_ok}
    assert errors == {"application", "validation_loop"}
    (application,) = captured.named("application")
    assert "bad metric" in (application.status.description or "")


def test_inside_the_scripts_own_training_loop_nothing_is_doubled_or_lost(
    captured: Captured, tmp_path: Path
) -> None:
    trainer = _trainer(tmp_path, 4)
    instrument_trainer(trainer)
    with traintel.application(), traintel.training_loop(train_iterations_start=0):
        trainer.train()
    spans = captured.spans()
    assert captured.counts()["training_loop"] == 1
    iterations = captured.named("training_iteration")
    assert [attr(s, semconv.ITERATION) for s in iterations] == [0, 1, 2, 3]
    assert {parent_name(s, spans) for s in iterations} == {"training_loop"}
    for span in iterations:  # the batches' wait too, as in the Trainer's own loop
        assert children(span, spans)["data_loading"] == 1
        assert attr(span, semconv.SAMPLES) == BATCH * ACCUMULATE
