"""Hugging Face ``transformers.Trainer``: a ``TrainerCallback`` plus the wrappers it needs.

Usage::

    from traintel.integrations.transformers import instrument_trainer
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    instrument_trainer(trainer)
    trainer.train()

Why wrappers as well as a callback: ``TrainerCallback`` events carry no batch, no loss tensor,
no timing of the forward pass and no exception, and the Trainer prefetches a whole accumulation
window of batches before ``on_step_begin``. So :func:`instrument_trainer` adds the callback and
wraps a few methods *on that trainer instance* (never the class): ``train`` (the
``application`` span and ERROR on an exception, which propagates unchanged),
``get_batch_samples`` (``data_loading``; it opens the iteration), ``compute_loss``
(``model_forward``), ``training_step`` (``model_backward`` is the rest of it; samples and tokens
per micro-batch; the loss), ``prediction_step`` (evaluation iterations), ``evaluate``/
``predict`` (``validation_loop``/``testing_loop``, inside an ``application`` of their own when
called outside ``train``; the metrics ``on_evaluate``/``on_predict`` receive, ``eval_loss``
first, go on that loop and its ``validation_metrics_update``/``testing_metrics_update``
event), ``_save_checkpoint``, and ``_load_from_checkpoint`` and ``_load_optimizer_and_scheduler``
(checkpoint spans: a resume reads the weights, then the optimizer state, often the larger part).

An iteration is one optimizer step (``on_step_end``), however many micro-batches it
accumulates. FLOPs are counted by traintel on the first micro-batch (``FlopCounterMode`` around
the real step: the forward inside ``compute_loss`` for model FLOPs, the whole step for executed
FLOPs; whatever wrappers DDP/FSDP/``torch.compile`` put around the model, the counter sees the
operations that run; if nothing was counted, 6 x non-embedding parameters of the unwrapped model
per token), never read from ``state.total_flos``, which is zero or wrong behind those wrappers.
Configured ``flops_per_sample``/``flops_per_token`` win.
Requires ``traintel[transformers]``.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"traintel.integrations.transformers needs transformers: pip install 'traintel[transformers]' ({exc})"
    ) from exc

from traintel import semconv
from traintel._api import phases
from traintel._api.model_metrics import record_batch, record_metrics
from traintel._host.flops import unwrap
from traintel._recorder.clock import time_ns as now_ns  # the phases' timeline
from traintel._recorder.phases import PhaseSpan
from traintel._runtime import state as _state
from traintel.integrations._driver import Key, PhaseDriver, batch_size, patch_instance
from traintel.integrations._flops import FirstStepFlops


def _tokens(inputs: Any) -> Any:
    """Non-padding tokens of a micro-batch: the attention mask's sum (a tensor, still on the
    device: reading it is left to the step's end, one device sync per step instead of one per
    micro-batch), else ``input_ids``' size; None if neither is there."""
    if not isinstance(inputs, dict):
        return None
    mask = inputs.get("attention_mask")
    if mask is not None and hasattr(mask, "sum"):
        return mask.sum()
    ids = inputs.get("input_ids")
    return int(ids.numel()) if ids is not None and hasattr(ids, "numel") else None


class TraintelCallback(TrainerCallback):
    """Loop, iteration and optimizer phases from ``TrainerCallback`` events; see the module
    docstring for what :func:`instrument_trainer` adds."""

    def __init__(self, count_flops: bool = True, record_loss: bool = True) -> None:
        self.driver = PhaseDriver(semconv.INTEGRATION_TRANSFORMERS)
        self.record_loss = record_loss
        self.flops = FirstStepFlops(count_flops)
        self.training = False  # between on_train_begin and the end of train(): batches are steps'
        # Per-micro-batch tokens and losses, read once at the step's end (see _tokens).
        self.pending_tokens: list[Any] = []
        self.pending_losses: list[Any] = []
        self.instrumented = False  # instrument_trainer wrapped the trainer's methods

    def open_iteration(self, start_ns: int | None = None) -> None:
        if not self.driver.is_open(Key.ITERATION):
            self.pending_tokens.clear()
            self.pending_losses.clear()
            self.driver.open(Key.ITERATION, phases.training_iteration(), start_ns)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.training = True
        self.driver.open_loop(int(state.global_step), state.max_steps)
        if not self.instrumented:  # the events carry no batch: no samples, no throughput, no MFU
            _state.current().warn_once(
                "transformers:callback_alone",
                "transformers: TraintelCallback alone sees no batch, so the run has no samples, "
                "tokens, throughput, FLOPs or forward/backward split: use instrument_trainer(trainer) "
                "instead (it adds the callback and wraps that trainer's methods)",
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.training = False
        self.driver.close(Key.LOOP)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.open_iteration()  # without the wrappers, the iteration starts here

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.open(Key.OPTIMIZER, phases.optimizer_update())

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.close(Key.OPTIMIZER)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.driver.is_open(Key.ITERATION):
            try:
                if self.pending_tokens:
                    record_batch(tokens=sum(int(t) for t in self.pending_tokens))
                if self.record_loss and self.pending_losses:
                    # training_step returns each micro-batch's loss scaled for accumulation:
                    # their sum is the step's loss, added in the losses' own dtype as the
                    # Trainer adds them (so it equals the loss the Trainer logs for the step)
                    record_metrics(loss=float(functools.reduce(operator.add, self.pending_losses)))
            except Exception:
                _state.current().warn_once("transformers:step_end", "transformers: could not read the step")
            self.pending_tokens.clear()
            self.pending_losses.clear()
        self.driver.close(Key.ITERATION)

    # --- evaluation -------------------------------------------------------------------------------
    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self.record_eval_metrics(Key.VALIDATION, metrics)

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self.record_eval_metrics(Key.TESTING, metrics)

    def record_eval_metrics(self, key: str, metrics: Any) -> None:
        """The evaluation's metrics (``eval_loss``, ``compute_metrics``' results, speed) on its
        loop, so its ``*_metrics_update`` event carries them; only while the loop traintel opened
        around ``evaluate``/``predict`` (:func:`instrument_trainer`) is still open."""
        if not self.driver.is_open(key) or not isinstance(metrics, dict):
            return
        numbers = {
            name: value
            for name, value in metrics.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
        if numbers:
            record_metrics(numbers)

    # --- FLOPs ---------------------------------------------------------------------------------
    def formula_flops(self, model: Any, inputs: Any) -> None:
        """6 x non-embedding parameters per token, when nothing was counted."""
        telemetry = _state.current()
        try:
            tokens, samples = _tokens(inputs), batch_size(inputs)
            tokens = int(tokens) if tokens is not None else None
            parameters = int(unwrap(model).num_parameters(exclude_embeddings=True))
            if tokens and samples:
                telemetry.update_config(
                    flops_per_sample=6.0 * parameters * tokens / samples, flops_method="formula"
                )
        except Exception:
            telemetry.warn_once("transformers:flops", "transformers: could not count model FLOPs")


class _TrainerWrappers:
    """What ``instrument_trainer`` wraps a trainer's methods with: each method takes the
    original and returns its wrapper."""

    def __init__(self, trainer: Any, cb: TraintelCallback) -> None:
        self.trainer = trainer
        self.cb = cb
        self.driver = cb.driver

    def train(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.driver.open_application()
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                self.cb.training = False
                self.driver.close_all(exc)
                raise
            self.driver.close_all()
            return result

        return wrapper

    def get_batch_samples(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = now_ns()
            result = original(*args, **kwargs)
            if self.cb.training:  # in the Trainer's loop (traintel's training_loop or the script's)
                self.cb.open_iteration(start)
                self.driver.open(Key.DATA, phases.data_loading(), start)
                self.driver.close(Key.DATA)
            return result

        return wrapper

    def compute_loss(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.driver.is_open(Key.ITERATION):  # evaluation also computes losses
                return original(*args, **kwargs)
            self.driver.open(Key.FORWARD, phases.model_forward())
            result = original(*args, **kwargs)
            self.cb.flops.forward_done()
            self.driver.close(Key.FORWARD)
            self.driver.open(Key.BACKWARD, phases.model_backward())  # ends with training_step
            return result

        return wrapper

    def training_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.driver.is_open(Key.ITERATION):
                return original(model, inputs, *args, **kwargs)
            try:
                record_batch(samples=batch_size(inputs))
                tokens = _tokens(inputs)
                if tokens is not None:
                    self.cb.pending_tokens.append(tokens)
            except Exception:
                _state.current().warn_once("transformers:batch", "transformers: could not count a batch")
            counting = self.cb.flops.start(model)
            try:
                loss = original(model, inputs, *args, **kwargs)
            except BaseException:
                self.cb.flops.abort()  # nothing to leave unless counting
                raise
            if counting and not self.cb.flops.finish(batch_size(inputs)):
                self.cb.formula_flops(model, inputs)
            self.driver.close(Key.BACKWARD)
            if self.cb.record_loss and loss is not None:
                self.cb.pending_losses.append(loss.detach() if hasattr(loss, "detach") else loss)
            return loss

        return wrapper

    def eval_loop(self, key: str, template: Callable[[], PhaseSpan]) -> Callable[..., Any]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if self.driver.is_open(Key.VALIDATION) or self.driver.is_open(Key.TESTING):
                    return original(*args, **kwargs)
                # a standalone evaluate/predict is an application of its own, as Lightning's
                # self.trainer.validate/test are; inside train() it is part of train's
                own_application = self.driver.open_application()
                self.driver.open(key, template())
                try:
                    result = original(*args, **kwargs)
                except BaseException as exc:
                    self.driver.close(key, None, exc)
                    if own_application:
                        self.driver.close(Key.APP, None, exc)
                    raise
                self.driver.close(key)
                if own_application:
                    self.driver.close(Key.APP)
                return result

            return wrapper

        return make

    def prediction_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if self.driver.is_open(Key.TESTING):
                iteration = phases.testing_iteration(samples=batch_size(inputs))
            else:
                iteration = phases.validation_iteration(samples=batch_size(inputs))
            with iteration:
                return original(model, inputs, *args, **kwargs)

        return wrapper

    def checkpoint_path(self, model: Any, trial: Any = None, *args: Any, **kwargs: Any) -> str | None:
        """Where ``_save_checkpoint`` writes (as the trainer names it)."""
        try:
            output = self.trainer._get_output_dir(trial=trial)
            return os.path.join(output, f"checkpoint-{self.trainer.state.global_step}")
        except Exception:
            return None


def instrument_trainer(trainer: Any, callback: TraintelCallback | None = None) -> TraintelCallback:
    """Add a :class:`TraintelCallback` to ``trainer`` and wrap its methods (instance only).
    Returns the callback. Calling it twice on one trainer does nothing the second time."""
    existing = getattr(trainer, "_traintel_callback", None)
    if isinstance(existing, TraintelCallback):
        return existing
    cb = callback or TraintelCallback()
    trainer.add_callback(cb)
    trainer._traintel_callback = cb
    cb.instrumented = True
    wrap = _TrainerWrappers(trainer, cb)
    _wrap = patch_instance  # this trainer's methods only; not undone (the trainer is the user's)
    _wrap(trainer, "train", wrap.train)
    _wrap(trainer, "get_batch_samples", wrap.get_batch_samples)
    _wrap(trainer, "compute_loss", wrap.compute_loss)
    _wrap(trainer, "training_step", wrap.training_step)
    _wrap(trainer, "prediction_step", wrap.prediction_step)
    _wrap(trainer, "evaluate", wrap.eval_loop(Key.VALIDATION, phases.validation_loop))
    _wrap(trainer, "predict", wrap.eval_loop(Key.TESTING, phases.testing_loop))
    trace = cb.driver.traced_checkpoint
    _wrap(trainer, "_save_checkpoint", trace(True, wrap.checkpoint_path))
    load = trace(False, lambda *args, **kwargs: args[0] if args else next(iter(kwargs.values()), None))
    _wrap(trainer, "_load_from_checkpoint", load)  # the model's weights
    _wrap(trainer, "_load_optimizer_and_scheduler", load)  # their state: twice the weights with Adam
    return cb


__all__ = ["TraintelCallback", "instrument_trainer"]
