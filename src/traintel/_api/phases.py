"""The public phase factories: one call, one new phase object, usable as ``with`` or decorator."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._api.model_metrics import checked_count
from traintel._recorder import active
from traintel._recorder.checkpoints import (
    CheckpointLoadPhase,
    CheckpointSavePhase,
    CheckpointStagePhase,
    checked_path,
    checked_strategy,
)
from traintel._recorder.phases import (
    DATA_LOADING,
    MODEL_BACKWARD,
    MODEL_FORWARD,
    OPTIMIZER_UPDATE,
    STEP_KINDS,
    ApplicationPhase,
    EvalLoopPhase,
    IterationPhase,
    PhaseSpan,
    StepKind,
    StepPhase,
    TrainingLoopPhase,
    UsersSpan,
    phase_attributes,
)
from traintel._sdk.attributes import as_number, clean_attributes
from traintel.semconv import Phase

_TRAINING_ITERATION: Final = Phase.TRAINING_ITERATION.value
_VALIDATION_ITERATION: Final = Phase.VALIDATION_ITERATION.value
_TESTING_ITERATION: Final = Phase.TESTING_ITERATION.value


def _simple(phase: Phase, attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    return PhaseSpan(phase.value, phase_attributes(phase, attributes))


def _iteration_attributes(
    call: str, samples: float | None, tokens: float | None, attributes: Mapping[str, AttributeValue] | None
) -> Mapping[str, AttributeValue] | None:
    if samples is None and tokens is None and not attributes:
        return None
    extra: dict[str, AttributeValue] = clean_attributes(attributes) if attributes else {}
    for key, name, value in ((semconv.SAMPLES, "samples", samples), (semconv.TOKENS, "tokens", tokens)):
        if value is None:
            continue
        found = as_number(value)  # once: a CUDA tensor's ``.item()`` waits for the device
        if checked_count(call, name, value if found is None else found) is not None:
            extra[key] = found  # a numpy count or a tensor: its number, not its str()
    return extra


def _checked_iteration(call: str, iteration: object) -> int | None:
    """The iteration number given, as an int (a numpy integer through its value); for one
    that is no non-negative integer, None (the loop's running count), said once naming the call
    and the value: ``"7"`` lost the whole iteration, ``-5`` or ``3.5`` became a window's first
    and last iteration."""
    found = as_number(iteration) if iteration is not None else None
    if iteration is None or (isinstance(found, int) and found >= 0):
        return found  # type: ignore[return-value]
    engine = active.current_engine()
    if engine is not None:
        why = "%s(iteration=%r): expected a non-negative int; numbered from the loop's count instead"
        engine.warn_once("bad_iteration:" + call, why, call, iteration)
    return None


# --- the job and its set-up ----------------------------------------------------------------------
def application(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """The whole job: its start carries the ``telemetry_initialization`` event (the configuration
    and which metrics it allows), its end the job's goodput."""
    return ApplicationPhase(Phase.APPLICATION.value, phase_attributes(Phase.APPLICATION, attributes))


def dist_init(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """Process-group initialisation (``torch.distributed.init_process_group``)."""
    return _simple(Phase.DIST_INIT, attributes)


def data_loader_init(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """Building the data loaders (initialisation badput)."""
    return _simple(Phase.DATA_LOADER_INIT, attributes)


def model_init(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """Building the model (initialisation badput)."""
    return _simple(Phase.MODEL_INIT, attributes)


def optimizer_init(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """Building the optimizer (initialisation badput)."""
    return _simple(Phase.OPTIMIZER_INIT, attributes)


def checkpoint_load(
    path: str | os.PathLike[str] | None = None,
    iteration: int | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """Loading a checkpoint; ``iteration`` is the iteration it resumes from."""
    extra: dict[str, AttributeValue | None] = {
        semconv.CHECKPOINT_PATH: checked_path("checkpoint_load", path),
        semconv.CHECKPOINT_ITERATION: iteration,
    }
    extra.update(attributes or {})
    return CheckpointLoadPhase(Phase.CHECKPOINT_LOAD.value, phase_attributes(Phase.CHECKPOINT_LOAD, extra))


# --- training --------------------------------------------------------------------------------------
def training_loop(
    train_iterations_start: int = 0,
    train_samples_start: int | None = None,
    train_iterations_target: int | None = None,
    train_samples_target: int | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """The training loop. ``train_iterations_start`` is the number of iterations already done
    (non-zero when resuming): the first iteration of this loop is numbered with it."""
    extra: dict[str, AttributeValue | None] = {
        semconv.TRAIN_ITERATIONS_START: train_iterations_start,
        semconv.TRAIN_SAMPLES_START: train_samples_start,
        semconv.TRAIN_ITERATIONS_TARGET: train_iterations_target,
        semconv.TRAIN_SAMPLES_TARGET: train_samples_target,
    }
    extra.update(attributes or {})
    return TrainingLoopPhase(phase_attributes(Phase.TRAINING_LOOP, extra), int(train_iterations_start))


def training_iteration(
    iteration: int | None = None,
    samples: float | None = None,
    tokens: float | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """One optimizer step. ``samples`` / ``tokens`` are this rank's work in the step (all
    micro-batches; or report each with :func:`record_batch`); ``iteration`` defaults to the
    loop's running count. Its handle (``as span``) is the iteration's span."""
    if iteration is not None and not (type(iteration) is int and iteration >= 0):
        iteration = _checked_iteration(_TRAINING_ITERATION, iteration)
    if samples is None and tokens is None and attributes is None:
        return IterationPhase(_TRAINING_ITERATION, iteration)  # the per-step case
    counts = _iteration_attributes(_TRAINING_ITERATION, samples, tokens, attributes)
    return IterationPhase(_TRAINING_ITERATION, iteration, counts)


def data_loading(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """Waiting for the next batch (the time the loop was blocked on data)."""
    return StepPhase(DATA_LOADING, attributes)


def model_forward(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """The forward pass (and the loss), inside a training iteration."""
    return StepPhase(MODEL_FORWARD, attributes)


def model_backward(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """The backward pass, inside a training iteration."""
    return StepPhase(MODEL_BACKWARD, attributes)


def optimizer_update(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """The optimizer step (and zeroing the gradients), inside a training iteration."""
    return StepPhase(OPTIMIZER_UPDATE, attributes)


def checkpoint_save(
    strategy: str = "sync",
    iteration: int | None = None,
    size_bytes: int | None = None,
    path: str | os.PathLike[str] | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> CheckpointSavePhase:
    """Saving a checkpoint: span ``checkpoint_save_sync`` or ``checkpoint_save_async``.

    The span covers the blocking part (until control returns to training); for an async save
    call ``save.completion()`` inside ``with checkpoint_save(...) as save`` (``save`` is the
    save's span) and ``finish()`` it from the writer.
    ``iteration`` defaults to the number of training iterations completed so far (the value
    a job resuming from this checkpoint passes as ``train_iterations_start``). Given a
    ``path`` and no ``size_bytes``, the size is measured when the span ends.
    """
    size = checked_count("checkpoint_save", "size_bytes", size_bytes)  # -5 made a negative bytes/s
    return CheckpointSavePhase(
        checked_strategy(strategy),
        _checked_iteration("checkpoint_save", iteration),
        None if size is None else int(size),
        path,
        attributes,
    )


def checkpoint_stage(stage: str, attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """A marked part of a checkpoint save: ``staging``, ``write``, ``upload``, ``finalize`` or
    ``barrier``; each stage's total time is reported in ``checkpoint_metrics_update``."""
    if stage not in semconv.CHECKPOINT_STAGES:
        engine = active.current_engine()
        if engine is not None:
            engine.warn_once(
                "bad_stage",
                "checkpoint_stage(%r): expected one of %s",
                stage,
                sorted(semconv.CHECKPOINT_STAGES),
            )
        return PhaseSpan("checkpoint_" + str(stage), attributes)
    return CheckpointStagePhase(stage, attributes)


# --- evaluation ------------------------------------------------------------------------------------
def validation_loop(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """A validation pass; its ``validation_metrics_update`` event sums its iterations."""
    return EvalLoopPhase(Phase.VALIDATION_LOOP.value, phase_attributes(Phase.VALIDATION_LOOP, attributes))


def validation_iteration(
    iteration: int | None = None,
    samples: float | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """One validation batch, numbered from 0 in its loop."""
    return IterationPhase(
        _VALIDATION_ITERATION,
        _checked_iteration(_VALIDATION_ITERATION, iteration),
        _iteration_attributes(_VALIDATION_ITERATION, samples, None, attributes),
    )


def testing_loop(attributes: Mapping[str, AttributeValue] | None = None) -> PhaseSpan:
    """A test pass; its ``testing_metrics_update`` event sums its iterations."""
    return EvalLoopPhase(Phase.TESTING_LOOP.value, phase_attributes(Phase.TESTING_LOOP, attributes))


def testing_iteration(
    iteration: int | None = None,
    samples: float | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """One test batch, numbered from 0 in its loop."""
    return IterationPhase(
        _TESTING_ITERATION,
        _checked_iteration(_TESTING_ITERATION, iteration),
        _iteration_attributes(_TESTING_ITERATION, samples, None, attributes),
    )


def _checked_name(name: object) -> str:
    """A span name that is no ``str`` (``timed_span(123)``), as its text, said once."""
    try:
        text = str(name)
    except Exception:  # (its own __str__ fails)
        text = "timed_span"
    engine = active.current_engine()
    if engine is not None:
        why = "timed_span(name=%r): expected a str; the span is named %r"
        engine.warn_once("bad_name:timed_span", why, name, text)
    return text


def timed_span(
    name: str,
    phase: str | Phase | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> PhaseSpan:
    """Any span of your own; give it a ``phase`` and the processor treats it like ours (a step
    phase's, ``model_forward`` say, inside an iteration: its time is the step's forward time)."""
    if type(name) is not str:  # the SDK refused it where the span ended: the span was lost
        name = _checked_name(name)
    merged: dict[str, AttributeValue] = dict(attributes or {})
    value = phase.value if isinstance(phase, Phase) else None if phase is None else str(phase)
    step = STEP_KINDS.get(value) if value is not None else None
    if step is not None:  # timed into the iteration as that step (it was a span the windows missed)
        # (given attributes, its phase among them, make it export as a span of its own name)
        return StepPhase(StepKind(name, step.index, value), {**(attributes or {}), semconv.PHASE: value})
    if value is not None:
        merged[semconv.PHASE] = value
    return UsersSpan(name, merged)
