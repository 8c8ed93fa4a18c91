"""Lightning's callback hooks mapped onto traintel phases, shared by both Lightning namespaces.

Why a mixin without a Lightning import: ``lightning.pytorch`` and ``pytorch_lightning`` are the
same framework under two package names with two distinct ``Callback`` classes; each namespace
module combines this mixin with its own ``Callback`` (the mixin comes first, so its hooks
replace the base class's no-ops).

The mapping: ``setup``/``teardown`` bracket an ``application`` span unless one is already open;
``on_train_start``/``end`` the ``training_loop`` (numbered from ``trainer.global_step``, so a
resumed run continues its iteration count). An iteration is one optimizer step: it opens at
the first micro-batch of an accumulation window and closes at the end of the micro-batch whose
``on_before_optimizer_step`` fired; every micro-batch adds ``data_loading`` (from the end of the
previous batch to this batch's start: the time the loop waited for it), ``model_forward``
(batch start to ``on_before_backward``) and ``model_backward`` children, and its batch size (and
tokens, given ``tokens_fn``) to the iteration. ``trainer.save_checkpoint`` and the strategy's
``load_checkpoint`` are wrapped between ``setup`` and ``teardown`` for checkpoint spans; with
``AsyncCheckpointIO`` a save is async, its background half ended by the write in Lightning's
writer thread (the base IO's ``save_checkpoint``, wrapped too).
``on_exception`` marks every span it opened ERROR; Lightning then re-raises the exception.
What the module logs (``self.log`` / ``self.log_dict``, wrapped on the module between ``setup``
and ``teardown``) while a validation or test loop runs is recorded too, as
``traintel.record_metrics`` would be: a value logged in ``validation_step``/``test_step`` on that
batch's iteration (the loop's update event then has its last and its mean over the batches,
unweighted, where Lightning's epoch value weights by batch size), a value logged in an
epoch-end hook on the loop (it counts toward the update event as one more value). Scalars only
(numbers, one-element tensors: read with ``.item()``, a device sync); a ``torchmetrics.Metric``
object is skipped.
The first micro-batch's FLOPs are counted as it runs (forward: batch start to
``on_before_backward``; executed: to ``on_after_backward``) for MFU.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

from traintel import semconv
from traintel._api import phases
from traintel._api.model_metrics import record_batch, record_metrics
from traintel._recorder.clock import time_ns as now_ns  # the phases' timeline
from traintel._runtime import state as _state
from traintel.environment_variables import TRAINTEL_RUN_ID
from traintel.integrations._driver import (
    AsyncWrites,
    Key,
    PhaseDriver,
    Wrapper,
    batch_size,
    loss_value,
    patch_instance,
    unpatch_instance,
)
from traintel.integrations._flops import FirstStepFlops
from traintel.resource_detectors import launcher_run_id

_EVAL_PHASES = {
    "validation": (phases.validation_loop, phases.validation_iteration, Key.VALIDATION),
    "test": (phases.testing_loop, phases.testing_iteration, Key.TESTING),
}


def _async_writer(strategy: Any) -> Any:
    """The checkpoint IO that writes for Lightning's ``AsyncCheckpointIO`` (in its thread), if the
    strategy saves through one: its saves are async, done when that IO's write returns."""
    io = getattr(strategy, "checkpoint_io", None)
    if not any(cls.__name__ == "AsyncCheckpointIO" for cls in type(io).__mro__):
        return None
    return getattr(io, "checkpoint_io", None)


def _written_path(checkpoint: Any, path: Any, *_: Any, **__: Any) -> Any:
    return path


class LightningHooks:
    """The hook implementations; see the module docstring for the mapping."""

    def __init__(
        self,
        tokens_fn: Callable[[Any], int | None] | None = None,
        samples_fn: Callable[[Any], int | None] | None = None,
        record_loss: bool = True,
        count_flops: bool = True,
    ) -> None:
        """``samples_fn`` / ``tokens_fn`` map a batch to its size (default samples: the leading
        dimension of its first tensor; tokens: not counted). ``record_loss`` puts the step's
        loss on the iteration (it reads the loss tensor, a device sync on GPU). ``count_flops``
        counts the first micro-batch's FLOPs for MFU (see :mod:`traintel.integrations._flops`)
        unless ``flops_per_sample`` / ``flops_per_token`` are configured."""
        super().__init__()
        self._driver = PhaseDriver(semconv.INTEGRATION_LIGHTNING)
        self._tokens_fn = tokens_fn
        self._samples_fn = samples_fn or batch_size
        self._record_loss = record_loss
        self._flops = FirstStepFlops(count_flops)
        self._flops_samples: int | None = None
        self._batch_end_ns: int | None = None
        self._stepped = False
        self._sanity_check = False  # Lightning discards what its sanity check logs: so do we
        self._restore: list[tuple[object, str]] = []

    # --- application and checkpoints -----------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        try:
            _share_run_id(trainer)
            self._driver.open_application()
            trace = self._driver.traced_checkpoint
            writer = _async_writer(trainer.strategy)
            writes = AsyncWrites() if writer is not None else None
            save = trace(True, lambda filepath, *_, **__: filepath, writes)
            load = trace(False, lambda checkpoint_path, *_, **__: checkpoint_path)
            self._wrap(trainer, "save_checkpoint", save)
            if writes is not None:
                self._wrap(writer, "save_checkpoint", writes.finishing(_written_path))
            self._wrap(trainer.strategy, "load_checkpoint", load)
            self._wrap(pl_module, "log", lambda original: _LogTap(original, self))
        except Exception:
            _state.current().warn_once("lightning:setup", "lightning: could not set up tracing")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        for owner, name in reversed(self._restore):
            unpatch_instance(owner, name)
        self._restore.clear()
        self._flops.abort()
        self._driver.close_all()

    def _wrap(self, owner: object, name: str, make: Wrapper) -> None:
        if patch_instance(owner, name, make):
            self._restore.append((owner, name))

    def record_if_evaluating(self, name: str, value: Any) -> None:
        if self._sanity_check or not (
            self._driver.is_open(Key.VALIDATION) or self._driver.is_open(Key.TESTING)
        ):
            return
        try:
            scalar = isinstance(value, int | float) and not isinstance(value, bool)
            if scalar or (hasattr(value, "numel") and hasattr(value, "item") and value.numel() == 1):
                record_metrics({name: value})
        except Exception:
            _state.current().warn_once("lightning:log", "lightning: could not record a logged metric")

    # --- training ------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._driver.open_loop(getattr(trainer, "global_step", 0), getattr(trainer, "max_steps", -1))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._driver.close(Key.LOOP)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._batch_end_ns = now_ns()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        driver = self._driver
        start = now_ns()
        waited_from = self._batch_end_ns if self._batch_end_ns is not None else start
        if not driver.is_open(Key.ITERATION):
            self._stepped = False
            driver.open(Key.ITERATION, phases.training_iteration(), waited_from)
        driver.open(Key.DATA, phases.data_loading(), waited_from)
        driver.close(Key.DATA, start)
        samples = None
        try:
            samples = self._samples_fn(batch)
            tokens = self._tokens_fn(batch) if self._tokens_fn is not None else None
            record_batch(samples=samples, tokens=tokens)
        except Exception:
            _state.current().warn_once("lightning:batch", "lightning: could not count the batch")
        driver.open(Key.FORWARD, phases.model_forward(), start)
        if not self._flops.decided and self._flops.start(pl_module):
            self._flops_samples = samples

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._flops.forward_done()
        self._driver.close(Key.FORWARD)
        self._driver.open(Key.BACKWARD, phases.model_backward())

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._flops.finish(self._flops_samples)  # the count, if one is running
        self._driver.close(Key.BACKWARD)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._stepped = True
        self._driver.open(Key.OPTIMIZER, phases.optimizer_update())

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        driver = self._driver
        end = now_ns()
        self._flops.finish(self._flops_samples)  # if no backward hooks ran (manual optimization)
        driver.close(Key.FORWARD, end)
        driver.close(Key.OPTIMIZER, end)
        if self._record_loss and self._stepped:  # the step's last micro-batch
            loss = loss_value(outputs)
            if loss is not None:
                if getattr(pl_module, "automatic_optimization", False):
                    # Lightning hands the loss here divided by accumulate_grad_batches
                    loss *= getattr(trainer, "accumulate_grad_batches", 1)
                record_metrics(loss=loss)
        if self._stepped:
            driver.close(Key.ITERATION, end)
        self._batch_end_ns = now_ns()

    # --- validation and test -------------------------------------------------------------------
    def _eval_start(self, kind: str) -> None:
        loop, _iteration, key = _EVAL_PHASES[kind]
        self._driver.open(key, loop())

    def _eval_end(self, kind: str) -> None:
        self._driver.close(_EVAL_PHASES[kind][2])
        self._batch_end_ns = now_ns()  # the evaluation's time is not the next batch's wait

    def _eval_batch_start(self, kind: str, batch: Any) -> None:
        _loop, iteration, key = _EVAL_PHASES[kind]
        samples = None
        try:
            samples = self._samples_fn(batch)
        except Exception:
            _state.current().warn_once("lightning:eval_batch", "lightning: could not count an eval batch")
        self._driver.open(key + ":iteration", iteration(samples=samples))

    def _eval_batch_end(self, kind: str) -> None:
        self._driver.close(_EVAL_PHASES[kind][2] + ":iteration")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._sanity_check = getattr(trainer, "sanity_checking", False) is True
        self._eval_start("validation")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._eval_end("validation")

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch_start("validation", batch)

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch_end("validation")

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_start("test")

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._eval_end("test")

    def on_test_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch_start("test", batch)

    def on_test_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch_end("test")

    # --- failure -------------------------------------------------------------------------------
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._flops.abort()
        self._driver.close_all(exception)


def _share_run_id(trainer: Any) -> None:
    """Ranks Lightning starts itself (``devices=N`` without torchrun or Slurm) have no launcher's
    job id: rank 0 draws one and broadcasts it to all ranks (``setup`` runs on every rank, and
    the test of the environment gives them all the same answer), before traintel configures
    from ``TRAINTEL_RUN_ID``, so the ranks report one run (not if traintel was configured
    before the fit: set ``TRAINTEL_RUN_ID`` then)."""
    if (
        getattr(trainer, "world_size", 1) <= 1
        or os.environ.get(TRAINTEL_RUN_ID)
        or launcher_run_id(os.environ)
    ):
        return
    run_id = trainer.strategy.broadcast(uuid.uuid4().hex, 0)
    if isinstance(run_id, str):  # on every rank, so the next setup's test agrees on them all
        os.environ["TRAINTEL_RUN_ID"] = run_id


def with_callback(kwargs: dict[str, Any], callback_type: type) -> dict[str, Any]:
    """``Trainer`` keyword arguments with a ``callback_type`` instance added unless one is there."""
    given = kwargs.pop("callbacks", None)
    callbacks = list(given) if isinstance(given, list | tuple) else [] if given is None else [given]
    if not any(isinstance(callback, callback_type) for callback in callbacks):
        callbacks.append(callback_type())
    return {**kwargs, "callbacks": callbacks}


class _LogTap:
    """The module's ``log`` while traintel runs: Lightning's own, then the value recorded if an
    evaluation loop is open. Pickled or deep-copied with the module (``torch.save(model)`` in a
    callback, SWA's copy), it becomes the class's plain ``log`` of the new module: no closure
    to fail pickling, no copy reporting into this run."""

    __slots__ = ("__wrapped__", "_hooks")

    def __init__(self, original: Callable[..., Any], hooks: LightningHooks) -> None:
        self.__wrapped__ = original
        self._hooks = hooks

    def __call__(self, name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        result = self.__wrapped__(name, value, *args, **kwargs)
        self._hooks.record_if_evaluating(name, value)
        return result

    def __reduce__(self) -> tuple[Callable[[Any], Any], tuple[Any]]:
        return (_plain_log, (getattr(self.__wrapped__, "__self__", None),))


def _plain_log(module: Any) -> Any:
    """The class's ``log`` bound to ``module`` (what a pickled or copied tap becomes)."""
    return type(module).log.__get__(module)
