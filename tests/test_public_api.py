"""The public surface is explicit and pinned: adding or removing a name is a decision."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import pytest

import traintel

EXPECTED = {
    "AsyncCheckpointCompletion", "ConfigurationError", "Telemetry", "__version__",
    "configure", "get_telemetry", "set_training_config", "shutdown",
    "application", "dist_init", "data_loader_init", "model_init", "optimizer_init", "checkpoint_load",
    "training_loop", "training_iteration", "data_loading", "model_forward", "model_backward",
    "optimizer_update", "checkpoint_save", "checkpoint_stage", "validation_loop", "validation_iteration",
    "testing_loop", "testing_iteration", "timed_span", "record_batch", "record_metrics",
    "measure_flops", "apply_flops",
}  # fmt: skip
#: Public modules and what each offers (the rest of the surface).
MODULES = {
    "traintel.callbacks": None,  # the one-logger callbacks: every on_* name
    "traintel.flops": {"FlopCount", "PeakLookup", "apply_flops", "measure_flops", "peak_flops_for",
                       "transformer_flops_per_token"},
    "traintel.threads": {"ContextThreadPoolExecutor", "submit_with_context", "wrap_with_context"},
    "traintel.distributed": {"mark_sync_point", "watch_ddp"},
    "traintel.analysis": {"SessionGoodput", "render", "session_goodput", "summarize"},
}  # fmt: skip


def test_all_is_pinned() -> None:
    assert set(traintel.__all__) == EXPECTED
    assert len(traintel.__all__) == len(EXPECTED), "no duplicates in __all__"
    for name in traintel.__all__:
        assert hasattr(traintel, name), name


def test_every_public_name_is_documented() -> None:
    for name in traintel.__all__:
        obj = getattr(traintel, name)
        if name != "__version__":
            assert (obj.__doc__ or "").strip(), f"traintel.{name} has no docstring"
    for module_name, names in MODULES.items():
        module = importlib.import_module(module_name)
        assert (module.__doc__ or "").strip(), module_name
        exported = set(module.__all__)
        if names is not None:
            assert exported == names, module_name
        for name in exported:
            assert (getattr(module, name).__doc__ or "").strip(), f"{module_name}.{name} has no docstring"


def test_names_that_moved_still_resolve_with_a_warning_naming_their_module() -> None:
    from traintel import callbacks, semconv, threads

    for name, module in (("on_train_start", callbacks), ("Phase", semconv), ("wrap_with_context", threads)):
        with pytest.warns(DeprecationWarning, match=f"traintel.{name} moved to {module.__name__}.{name}"):
            assert getattr(traintel, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="no attribute 'on_nothing'"):
        _ = traintel.on_nothing
    with pytest.raises(AttributeError, match="no attribute 'IterationSpan'"):
        _ = traintel.IterationSpan


@pytest.mark.process
def test_importing_traintel_imports_no_torch_rich_grpc_or_msgspec() -> None:
    import subprocess
    import sys

    wanted = "('torch', 'rich', 'grpc', 'msgspec')"
    code = f"import sys, traintel; print(sorted(m for m in {wanted} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.process
def test_the_offline_tools_import_neither_the_recorder_nor_the_sdk() -> None:
    """``import traintel`` loads its names on first use, and the reader finds what it needs
    without the exporters: the ``traintel`` command and its worker processes start without the
    OpenTelemetry SDK or the recorder (about 0.3 s of CPU each), and the names still resolve."""
    import subprocess
    import sys

    unwanted = (
        "('opentelemetry.sdk.trace', 'opentelemetry.sdk.metrics', 'traintel._recorder', 'traintel._runtime')"
    )
    code = (
        "import sys, traintel.cli, traintel.analysis.report, traintel.analysis.goodput\n"
        f"print(sorted(m for m in {unwanted} if m in sys.modules))\n"
        "from traintel import training_iteration\n"
        "print(training_iteration.__module__, 'traintel._runtime.bootstrap' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["[]", "traintel._api.phases True"]


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
    from traintel import callbacks

    assert set(reference) <= set(callbacks.__all__)
    assert all(name.startswith("on_") for name in callbacks.__all__)
