"""The public surface is explicit and pinned: adding or removing a name is a decision."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import traintel

EXPECTED = {
    "AsyncCheckpointCompletion", "FlopCount", "IterationSpan", "apply_flops", "checkpoint_stage",
    "measure_flops", "peak_flops_for", "record_batch", "SessionGoodput", "session_goodput",
    "ConfigurationError", "ContextThreadPoolExecutor", "Event", "Phase", "PhaseSpan", "Telemetry",
    "TrainingConfig", "__version__", "application", "checkpoint_load", "checkpoint_save", "configure",
    "data_loader_init", "data_loading", "dist_init", "get_telemetry", "model_backward", "model_forward",
    "model_init", "on_app_end", "on_app_start", "on_data_loading_end", "on_data_loading_start",
    "on_dataloader_init_end", "on_dataloader_init_start", "on_distributed_init_end",
    "on_distributed_init_start", "on_load_checkpoint_end", "on_load_checkpoint_start",
    "on_model_backward_end", "on_model_backward_start", "on_model_forward_end", "on_model_forward_start",
    "on_model_init_end", "on_model_init_start", "on_optimizer_init_end", "on_optimizer_init_start",
    "on_optimizer_update_end", "on_optimizer_update_start", "on_save_checkpoint_end",
    "on_save_checkpoint_start", "on_save_checkpoint_success", "on_testing_end",
    "on_testing_single_iteration_end", "on_testing_single_iteration_start", "on_testing_start",
    "on_train_end", "on_train_start", "on_training_single_iteration_end",
    "on_training_single_iteration_start", "on_validation_end", "on_validation_single_iteration_end",
    "on_validation_single_iteration_start", "on_validation_start", "optimizer_init", "optimizer_update",
    "record_metrics", "set_training_config", "shutdown", "submit_with_context", "testing_iteration",
    "testing_loop", "timed_span", "training_iteration", "training_loop", "validation_iteration",
    "validation_loop", "wrap_with_context", "mark_sync_point", "watch_ddp",
}  # fmt: skip


def test_all_is_pinned() -> None:
    assert set(traintel.__all__) == EXPECTED
    assert len(traintel.__all__) == len(EXPECTED), "no duplicates in __all__"
    for name in traintel.__all__:
        assert hasattr(traintel, name), name


def test_typed_package_and_version() -> None:
    assert (Path(traintel.__file__).parent / "py.typed").is_file()
    assert importlib.metadata.version("traintel") == traintel.__version__


def test_entry_points_are_registered() -> None:
    eps = importlib.metadata.entry_points()
    traces = {ep.name: ep.value for ep in eps.select(group="opentelemetry_traces_exporter")}
    metrics = {ep.name: ep.value for ep in eps.select(group="opentelemetry_metrics_exporter")}
    instrumentors = {ep.name: ep.value for ep in eps.select(group="opentelemetry_instrumentor")}
    assert traces["traintel_file"] == "traintel.exporters.file:OtlpJsonFileSpanExporter"
    assert metrics["traintel_file"] == "traintel.exporters.file:OtlpJsonFileMetricExporter"
    assert instrumentors["traintel"] == "traintel.instrumentation:TraintelInstrumentor"
    for group in (traces, metrics, instrumentors):
        for value in group.values():
            if value.startswith("traintel"):
                module, _, attr = value.partition(":")
                assert getattr(importlib.import_module(module), attr)


def test_callback_names_match_the_reference_library() -> None:
    # the one-logger callbacks its users know; ours keep these exact names
    reference = [
        "on_app_start", "on_app_end", "on_distributed_init_start", "on_distributed_init_end",
        "on_model_init_start", "on_model_init_end", "on_dataloader_init_start", "on_dataloader_init_end",
        "on_load_checkpoint_start", "on_load_checkpoint_end", "on_optimizer_init_start",
        "on_optimizer_init_end", "on_train_start", "on_train_end", "on_training_single_iteration_start",
        "on_training_single_iteration_end", "on_validation_start", "on_validation_end",
        "on_validation_single_iteration_start", "on_validation_single_iteration_end", "on_testing_start",
        "on_testing_end", "on_save_checkpoint_start", "on_save_checkpoint_success", "on_save_checkpoint_end",
    ]  # fmt: skip
    assert set(reference) <= set(traintel.__all__)
