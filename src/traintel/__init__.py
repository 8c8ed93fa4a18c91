"""traintel: OpenTelemetry-native training telemetry for PyTorch.

Training phases become real OpenTelemetry spans in the current context; a span processor turns
them into training metrics; everything leaves through the standard OTLP exporters, or the
embedded OTLP/JSON-lines file when nothing else is configured.

The phases and the few functions a training loop calls are here; the rest lives in modules:
``traintel.callbacks`` (the one-logger callbacks), ``traintel.flops`` (FLOPs and peaks),
``traintel.threads`` (context across threads), ``traintel.distributed`` (ranks and
stragglers), ``traintel.analysis`` (reading exported files), ``traintel.semconv`` (every span,
attribute and metric name), ``traintel.config`` (the configuration), ``traintel.integrations``
(Lightning, Hugging Face, torch).

Why the names are loaded on first use: ``import traintel`` (and so every ``traintel.*`` module,
the ``traintel`` command included) would otherwise build the whole recorder and import the
OpenTelemetry SDK, about 0.3 s, which the offline tools pay once per worker process and never
use. A name, once loaded, is an ordinary module attribute: the training loop pays nothing.
"""

from typing import TYPE_CHECKING, Any

from traintel.version import __version__

__all__ = [
    "AsyncCheckpointCompletion",
    "ConfigurationError",
    "Telemetry",
    "__version__",
    "application",
    "apply_flops",
    "checkpoint_load",
    "checkpoint_save",
    "checkpoint_stage",
    "configure",
    "data_loader_init",
    "data_loading",
    "dist_init",
    "get_telemetry",
    "measure_flops",
    "model_backward",
    "model_forward",
    "model_init",
    "optimizer_init",
    "optimizer_update",
    "record_batch",
    "record_metrics",
    "set_training_config",
    "shutdown",
    "testing_iteration",
    "testing_loop",
    "timed_span",
    "training_iteration",
    "training_loop",
    "validation_iteration",
    "validation_loop",
]

if TYPE_CHECKING:
    from traintel._api.configuration import configure, get_telemetry, set_training_config, shutdown
    from traintel._api.model_metrics import record_batch, record_metrics
    from traintel._api.phases import (
        application,
        checkpoint_load,
        checkpoint_save,
        checkpoint_stage,
        data_loader_init,
        data_loading,
        dist_init,
        model_backward,
        model_forward,
        model_init,
        optimizer_init,
        optimizer_update,
        testing_iteration,
        testing_loop,
        timed_span,
        training_iteration,
        training_loop,
        validation_iteration,
        validation_loop,
    )
    from traintel._recorder.checkpoints import AsyncCheckpointCompletion
    from traintel._runtime.state import Telemetry
    from traintel.config import ConfigurationError
    from traintel.flops import apply_flops, measure_flops

#: Where each public name lives, loaded on first use (the same as the ``TYPE_CHECKING`` imports);
#: every other name of ``__all__`` is a phase factory of ``traintel._api.phases``.
_PUBLIC = {
    "AsyncCheckpointCompletion": "traintel._recorder.checkpoints",
    "ConfigurationError": "traintel.config",
    "Telemetry": "traintel._runtime.state",
    "apply_flops": "traintel.flops",
    "measure_flops": "traintel.flops",
    **dict.fromkeys(
        ("configure", "get_telemetry", "set_training_config", "shutdown"), "traintel._api.configuration"
    ),
    **dict.fromkeys(("record_batch", "record_metrics"), "traintel._api.model_metrics"),
}

#: Names that were at ``traintel.*`` before they moved to their modules: still found there,
#: with a DeprecationWarning naming the new place.
_MOVED = {
    "Event": "traintel.semconv",
    "Phase": "traintel.semconv",
    "TrainingConfig": "traintel.config",
    "FlopCount": "traintel.flops",
    "peak_flops_for": "traintel.flops",
    "ContextThreadPoolExecutor": "traintel.threads",
    "submit_with_context": "traintel.threads",
    "wrap_with_context": "traintel.threads",
    "mark_sync_point": "traintel.distributed",
    "watch_ddp": "traintel.distributed",
    "SessionGoodput": "traintel.analysis",
    "session_goodput": "traintel.analysis",
}


def __getattr__(name: str) -> Any:
    import importlib

    public = _PUBLIC.get(name) or ("traintel._api.phases" if name in __all__ else None)
    if public is not None:
        # the runtime first: it registers how the recorder configures a job on first use
        importlib.import_module("traintel._runtime.bootstrap")
        found = globals()[name] = getattr(importlib.import_module(public), name)
        return found
    import warnings

    module = _MOVED.get(name) or ("traintel.callbacks" if name.startswith("on_") else None)
    if module is None:
        raise AttributeError(f"module 'traintel' has no attribute {name!r}")
    found = getattr(importlib.import_module(module), name)  # AttributeError for an unknown on_*
    warnings.warn(f"traintel.{name} moved to {module}.{name}", DeprecationWarning, stacklevel=2)
    return found
