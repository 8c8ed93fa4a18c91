"""The ``opentelemetry_instrumentor`` entry point: ``opentelemetry-instrument python train.py``.

Why: a job already launched under ``opentelemetry-instrument`` has its providers configured by
the OTel distro from ``OTEL_*``; this instrumentor makes traintel attach to them (adding its
processor) with no configuration code in the script, and, when the script imports torch,
patches it for zero-code phase spans (see :mod:`traintel.integrations.torch_patches`). ``instrument(torch=
False)`` attaches without patching.

Launched by ``opentelemetry-instrument``, the providers are the distro's, built from ``OTEL_*``
alone: traintel then gives their exporters its spool, loss counting and bounded exit, as its own
providers have (see :func:`~traintel._runtime.pipeline.adopt_instrumented_providers`). Providers a
script built itself are left as they are.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from traintel._recorder import active
from traintel._runtime import state as _state

#: Imported by ``opentelemetry-instrument`` (and by ``auto_instrumentation.initialize()``)
#: before it configures the providers and loads the instrumentors.
_AUTO_INSTRUMENTATION = "opentelemetry.instrumentation.auto_instrumentation"


class TraintelInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Attaches traintel to the providers ``opentelemetry-instrument`` configured and patches
    torch's optimizer steps, DataLoader iterators and checkpoint calls."""

    _patcher: Any = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        telemetry = _state.current()  # lenient: a bad TRAINTEL_* value is logged, never fatal here
        if _AUTO_INSTRUMENTATION in sys.modules and telemetry.pipeline is not None:
            from traintel._runtime.pipeline import adopt_instrumented_providers

            try:
                engine = telemetry.engine  # its tracers are made already
                ours = () if engine is None else (engine.tracer, engine.user_tracer)
                adopt_instrumented_providers(telemetry.pipeline, telemetry.config, ours)
            except Exception:
                telemetry.warn_once("adopt", "could not put the distro's exporters behind the spool")
        if kwargs.get("torch", True) and importlib.util.find_spec("torch") is not None:
            from traintel.integrations.torch_patches import TorchPatcher

            try:
                patcher = type(self)._patcher = TorchPatcher()
                patcher.arm()  # patches when the script imports torch
            except Exception:
                telemetry.warn_once("instrumentor", "could not patch torch; phases are not traced")

    def _uninstrument(self, **kwargs: Any) -> None:
        patcher, type(self)._patcher = type(self)._patcher, None
        if patcher is not None:
            patcher.uninstall()
        active.shutdown()
