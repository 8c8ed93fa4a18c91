"""Callbacks for the same phases, named as in NVIDIA's one-logger so its users recognise them.

Why callbacks at all: they let a framework hook or a trainer class keep every telemetry call
in one place instead of wrapping model code in ``with`` blocks. They produce the same span
tree as the context managers.

Callbacks pair by identity (one open span per phase), are idempotent (a second start returns
the open span, an end without start is ignored), close anything still open inside a phase
before ending it, and never raise: each kind of misuse is reported once. ``*_time_msec``
arguments take milliseconds since the epoch, as in the reference library.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from decimal import Decimal

from opentelemetry import trace as trace_api
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._api import phases
from traintel._recorder.phases import PhaseSpan
from traintel._runtime import state as _state
from traintel.semconv import Phase

_CHECKPOINT_SAVE = "checkpoint_save"


def _ns(time_msec: float | None) -> int | None:
    """Milliseconds to integer nanoseconds without float rounding (1.7e12 ms * 1e6 exceeds
    a double's exact integer range): go through the decimal text of the float."""
    if time_msec is None:
        return None
    if isinstance(time_msec, int):
        return time_msec * 1_000_000
    return int(Decimal(repr(float(time_msec))) * 1_000_000)


def _start(template: PhaseSpan, key: str, start_time_msec: float | None) -> Span:
    """Open the phase ``template`` describes, under the key that pairs it with its end."""
    try:  # without telemetry the registry opens nothing: the invalid span
        return _state.current().callback_start(key, template, _ns(start_time_msec))
    except Exception:
        _state.current().warn_once("callback_start:" + key, "start callback for %r failed", key)
        return trace_api.INVALID_SPAN


def _end(key: str, finish_time_msec: float | None) -> None:
    try:
        _state.current().callback_end(key, _ns(finish_time_msec))
    except Exception:
        _state.current().warn_once("callback_end:" + key, "end callback for %r failed", key)


def on_app_start(start_time_msec: float | None = None) -> Span:
    """The job starts: opens the ``application`` span (its ``telemetry_initialization`` event
    says what is measured)."""
    return _start(phases.application(), Phase.APPLICATION.value, start_time_msec)


def on_app_end(finish_time_msec: float | None = None) -> None:
    """The job ends: closes the ``application`` span with the job's goodput."""
    _end(Phase.APPLICATION.value, finish_time_msec)


def on_distributed_init_start(start_time_msec: float | None = None) -> Span:
    """Process-group initialisation starts (``dist_init``)."""
    return _start(phases.dist_init(), Phase.DIST_INIT.value, start_time_msec)


def on_distributed_init_end(finish_time_msec: float | None = None) -> None:
    """Process-group initialisation ends."""
    _end(Phase.DIST_INIT.value, finish_time_msec)


def on_dataloader_init_start(start_time_msec: float | None = None) -> Span:
    """Building the data loaders starts (``data_loader_init``)."""
    return _start(phases.data_loader_init(), Phase.DATA_LOADER_INIT.value, start_time_msec)


def on_dataloader_init_end(finish_time_msec: float | None = None) -> None:
    """Building the data loaders ends."""
    _end(Phase.DATA_LOADER_INIT.value, finish_time_msec)


def on_load_checkpoint_start(
    start_time_msec: float | None = None,
    path: str | os.PathLike[str] | None = None,
    iteration: int | None = None,
) -> Span:
    """Loading a checkpoint starts (``checkpoint_load``); ``iteration`` is the one it resumes from."""
    return _start(
        phases.checkpoint_load(path=path, iteration=iteration), Phase.CHECKPOINT_LOAD.value, start_time_msec
    )


def on_load_checkpoint_end(finish_time_msec: float | None = None) -> None:
    """Loading the checkpoint ends."""
    _end(Phase.CHECKPOINT_LOAD.value, finish_time_msec)


def on_model_init_start(start_time_msec: float | None = None) -> Span:
    """Building the model starts (``model_init``)."""
    return _start(phases.model_init(), Phase.MODEL_INIT.value, start_time_msec)


def on_model_init_end(finish_time_msec: float | None = None) -> None:
    """Building the model ends."""
    _end(Phase.MODEL_INIT.value, finish_time_msec)


def on_optimizer_init_start(start_time_msec: float | None = None) -> Span:
    """Building the optimizer starts (``optimizer_init``)."""
    return _start(phases.optimizer_init(), Phase.OPTIMIZER_INIT.value, start_time_msec)


def on_optimizer_init_end(finish_time_msec: float | None = None) -> None:
    """Building the optimizer ends."""
    _end(Phase.OPTIMIZER_INIT.value, finish_time_msec)


def on_train_start(
    train_iterations_start: int = 0,
    train_samples_start: int | None = None,
    train_iterations_target: int | None = None,
    train_samples_target: int | None = None,
    start_time_msec: float | None = None,
) -> Span:
    """The training loop starts (``training_loop``); ``train_iterations_start`` numbers its
    first iteration."""
    template = phases.training_loop(
        train_iterations_start, train_samples_start, train_iterations_target, train_samples_target
    )
    return _start(template, Phase.TRAINING_LOOP.value, start_time_msec)


def on_train_end(finish_time_msec: float | None = None) -> None:
    """The training loop ends: its last window and its summary."""
    _end(Phase.TRAINING_LOOP.value, finish_time_msec)


def on_training_single_iteration_start(
    start_time_msec: float | None = None,
    iteration: int | None = None,
    samples: int | None = None,
    tokens: int | None = None,
) -> Span:
    """A training iteration (one optimizer step) starts; ``samples`` / ``tokens`` are its work."""
    template = phases.training_iteration(iteration=iteration, samples=samples, tokens=tokens)
    return _start(template, Phase.TRAINING_ITERATION.value, start_time_msec)


def on_training_single_iteration_end(finish_time_msec: float | None = None) -> None:
    """The training iteration ends: counted, and exported if the sampling policy keeps it."""
    _end(Phase.TRAINING_ITERATION.value, finish_time_msec)


def on_data_loading_start(start_time_msec: float | None = None) -> Span:
    """Waiting for the next batch starts (``data_loading``)."""
    return _start(phases.data_loading(), Phase.DATA_LOADING.value, start_time_msec)


def on_data_loading_end(finish_time_msec: float | None = None) -> None:
    """The batch is there."""
    _end(Phase.DATA_LOADING.value, finish_time_msec)


def on_model_forward_start(start_time_msec: float | None = None) -> Span:
    """The forward pass starts (``model_forward``)."""
    return _start(phases.model_forward(), Phase.MODEL_FORWARD.value, start_time_msec)


def on_model_forward_end(finish_time_msec: float | None = None) -> None:
    """The forward pass ends."""
    _end(Phase.MODEL_FORWARD.value, finish_time_msec)


def on_model_backward_start(start_time_msec: float | None = None) -> Span:
    """The backward pass starts (``model_backward``)."""
    return _start(phases.model_backward(), Phase.MODEL_BACKWARD.value, start_time_msec)


def on_model_backward_end(finish_time_msec: float | None = None) -> None:
    """The backward pass ends."""
    _end(Phase.MODEL_BACKWARD.value, finish_time_msec)


def on_optimizer_update_start(start_time_msec: float | None = None) -> Span:
    """The optimizer step starts (``optimizer_update``)."""
    return _start(phases.optimizer_update(), Phase.OPTIMIZER_UPDATE.value, start_time_msec)


def on_optimizer_update_end(finish_time_msec: float | None = None) -> None:
    """The optimizer step ends."""
    _end(Phase.OPTIMIZER_UPDATE.value, finish_time_msec)


def on_validation_start(start_time_msec: float | None = None) -> Span:
    """A validation loop starts (``validation_loop``)."""
    return _start(phases.validation_loop(), Phase.VALIDATION_LOOP.value, start_time_msec)


def on_validation_end(finish_time_msec: float | None = None) -> None:
    """The validation loop ends with its ``validation_metrics_update`` event."""
    _end(Phase.VALIDATION_LOOP.value, finish_time_msec)


def on_validation_single_iteration_start(start_time_msec: float | None = None) -> Span:
    """A validation batch starts (``validation_iteration``)."""
    return _start(phases.validation_iteration(), Phase.VALIDATION_ITERATION.value, start_time_msec)


def on_validation_single_iteration_end(finish_time_msec: float | None = None) -> None:
    """The validation batch ends."""
    _end(Phase.VALIDATION_ITERATION.value, finish_time_msec)


def on_testing_start(start_time_msec: float | None = None) -> Span:
    """A test loop starts (``testing_loop``)."""
    return _start(phases.testing_loop(), Phase.TESTING_LOOP.value, start_time_msec)


def on_testing_end(finish_time_msec: float | None = None) -> None:
    """The test loop ends with its ``testing_metrics_update`` event."""
    _end(Phase.TESTING_LOOP.value, finish_time_msec)


def on_testing_single_iteration_start(start_time_msec: float | None = None) -> Span:
    """A test batch starts (``testing_iteration``)."""
    return _start(phases.testing_iteration(), Phase.TESTING_ITERATION.value, start_time_msec)


def on_testing_single_iteration_end(finish_time_msec: float | None = None) -> None:
    """The test batch ends."""
    _end(Phase.TESTING_ITERATION.value, finish_time_msec)


def on_save_checkpoint_start(
    global_step: int | None = None,
    start_time_msec: float | None = None,
    strategy: str = "sync",
    size_bytes: int | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Span:
    """``global_step`` is the iteration the checkpoint captures (default: iterations done)."""
    template = phases.checkpoint_save(
        strategy=strategy, iteration=global_step, size_bytes=size_bytes, path=path
    )
    return _start(template, _CHECKPOINT_SAVE, start_time_msec)


def on_save_checkpoint_success(
    global_step: int | None = None,
    time_msec: float | None = None,
    size_bytes: int | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> None:
    """A ``save_checkpoint_success`` event on the open checkpoint span."""
    try:
        telemetry = _state.current()
        span = telemetry.callback_span(_CHECKPOINT_SAVE) if telemetry.enabled else None
        if span is None:
            if telemetry.enabled:
                telemetry.warn_once(
                    "ckpt_success_without_start", "on_save_checkpoint_success without an open save"
                )
            return
        event: dict[str, AttributeValue] = dict(attributes or {})
        if global_step is not None:
            event[semconv.CHECKPOINT_ITERATION] = global_step
        if size_bytes is not None:
            event[semconv.CHECKPOINT_SIZE] = size_bytes
            span.set_attribute(semconv.CHECKPOINT_SIZE, size_bytes)
        span.add_event(semconv.Event.SAVE_CHECKPOINT_SUCCESS.value, event, timestamp=_ns(time_msec))
    except Exception:
        _state.current().warn_once("ckpt_success", "on_save_checkpoint_success failed")


def on_save_checkpoint_end(finish_time_msec: float | None = None) -> None:
    """The blocking part of the checkpoint save ends (control returns to training)."""
    _end(_CHECKPOINT_SAVE, finish_time_msec)


__all__ = [name for name in dir() if name.startswith("on_")]
