"""One small job, instrumented in each of the three supported styles.

All three must give the reference span tree of NVIDIA one-logger's documentation (the table
in shared/reference/000), which ``EXPECTED_PARENTS`` spells out.
"""

from __future__ import annotations

from opentelemetry import trace

import traintel
from traintel import callbacks
from traintel.semconv import PHASE

ITERATIONS = 3


def empty_step_phases() -> None:
    """The four step phases of one iteration, each empty (the loops of many tests)."""
    with traintel.data_loading():
        pass
    with traintel.model_forward():
        pass
    with traintel.model_backward():
        pass
    with traintel.optimizer_update():
        pass


EXPECTED_PARENTS: dict[str, str | None] = {
    "application": None,
    "dist_init": "application",
    "data_loader_init": "application",
    "checkpoint_load": "application",
    "model_init": "application",
    "optimizer_init": "application",
    "training_loop": "application",
    "training_iteration": "training_loop",
    "data_loading": "training_iteration",
    "model_forward": "training_iteration",
    "model_backward": "training_iteration",
    "optimizer_update": "training_iteration",
    "checkpoint_save_sync": "training_loop",
    "validation_loop": "training_loop",
    "validation_iteration": "validation_loop",
    "testing_loop": "application",
    "testing_iteration": "testing_loop",
    # Not a phase: the window's goodput record (one window: fewer iterations than its size).
    "training_window": "training_loop",
}
#: Span names in the tree that are records, not phases (no ``ml.training.phase``).
RECORDS = frozenset({"training_window"})
EXPECTED_COUNTS = {
    **{name: 1 for name in EXPECTED_PARENTS},
    "training_iteration": ITERATIONS,
    "data_loading": ITERATIONS,
    "model_forward": ITERATIONS,
    "model_backward": ITERATIONS,
    "optimizer_update": ITERATIONS,
    "validation_iteration": 2,
    "testing_iteration": 2,
}


def with_context_managers() -> None:
    with traintel.application():
        with traintel.dist_init():
            pass
        with traintel.data_loader_init():
            pass
        with traintel.checkpoint_load():
            pass
        with traintel.model_init():
            pass
        with traintel.optimizer_init():
            pass
        with traintel.training_loop(train_iterations_start=0):
            for _ in range(ITERATIONS):
                with traintel.training_iteration():
                    empty_step_phases()
                    traintel.record_metrics(loss=1.5)
            with traintel.checkpoint_save(strategy="sync"):
                pass
            with traintel.validation_loop():
                for _ in range(2):
                    with traintel.validation_iteration():
                        pass
        with traintel.testing_loop():
            for _ in range(2):
                with traintel.testing_iteration():
                    pass


def with_callbacks() -> None:
    callbacks.on_app_start()
    callbacks.on_distributed_init_start()
    callbacks.on_distributed_init_end()
    callbacks.on_dataloader_init_start()
    callbacks.on_dataloader_init_end()
    callbacks.on_load_checkpoint_start()
    callbacks.on_load_checkpoint_end()
    callbacks.on_model_init_start()
    callbacks.on_model_init_end()
    callbacks.on_optimizer_init_start()
    callbacks.on_optimizer_init_end()
    callbacks.on_train_start(train_iterations_start=0)
    for _ in range(ITERATIONS):
        callbacks.on_training_single_iteration_start()
        callbacks.on_data_loading_start()
        callbacks.on_data_loading_end()
        callbacks.on_model_forward_start()
        callbacks.on_model_forward_end()
        callbacks.on_model_backward_start()
        callbacks.on_model_backward_end()
        callbacks.on_optimizer_update_start()
        callbacks.on_optimizer_update_end()
        traintel.record_metrics(loss=1.5)
        callbacks.on_training_single_iteration_end()
    callbacks.on_save_checkpoint_start(global_step=ITERATIONS)
    callbacks.on_save_checkpoint_success(global_step=ITERATIONS)
    callbacks.on_save_checkpoint_end()
    callbacks.on_validation_start()
    for _ in range(2):
        callbacks.on_validation_single_iteration_start()
        callbacks.on_validation_single_iteration_end()
    callbacks.on_validation_end()
    callbacks.on_train_end()
    callbacks.on_testing_start()
    for _ in range(2):
        callbacks.on_testing_single_iteration_start()
        callbacks.on_testing_single_iteration_end()
    callbacks.on_testing_end()
    callbacks.on_app_end()


def with_plain_otel(tracer: trace.Tracer) -> None:
    """No traintel API at all: spans carry ``ml.training.phase`` and the processor sees them."""

    def phase(name: str, **attributes: object) -> trace.Span:  # type: ignore[return]
        return tracer.start_as_current_span(name, attributes={PHASE: name, **attributes})  # type: ignore[return-value,arg-type]

    with phase("application"):
        for name in ("dist_init", "data_loader_init", "checkpoint_load", "model_init", "optimizer_init"):
            with phase(name):
                pass
        with phase("training_loop"):
            for i in range(ITERATIONS):
                with phase("training_iteration", **{"ml.training.iteration": i}):
                    for name in ("data_loading", "model_forward", "model_backward", "optimizer_update"):
                        with phase(name):
                            pass
                    traintel.record_metrics(loss=1.5)
            with phase("checkpoint_save_sync"):
                pass
            with phase("validation_loop"):
                for _ in range(2):
                    with phase("validation_iteration"):
                        pass
        with phase("testing_loop"):
            for _ in range(2):
                with phase("testing_iteration"):
                    pass
