"""The ``opentelemetry_instrumentor`` entry point: ``opentelemetry-instrument python train.py``.

Why: a job already launched under ``opentelemetry-instrument`` has its providers configured by
the OTel distro from ``OTEL_*``; this instrumentor makes traintel attach to them (adding its
processor) with no configuration code in the script, and, when the script imports torch,
patches it for zero-code phase spans (see :mod:`traintel.integrations.torch_patches`). ``instrument(torch=
False)`` attaches without patching.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from traintel._runtime import state as _state


class TraintelInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Attaches traintel to the providers ``opentelemetry-instrument`` configured and patches
    torch's optimizer steps, DataLoader iterators and checkpoint calls."""

    _patcher: Any = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        if _state.configured() is None:
            _state.current()  # lenient: a bad TRAINTEL_* value is logged, never fatal here
        if kwargs.get("torch", True) and importlib.util.find_spec("torch") is not None:
            from traintel.integrations.torch_patches import TorchPatcher

            try:
                patcher = type(self)._patcher = TorchPatcher()
                patcher.arm()  # patches when the script imports torch
            except Exception:
                _state.current().warn_once("instrumentor", "could not patch torch; phases are not traced")

    def _uninstrument(self, **kwargs: Any) -> None:
        patcher, type(self)._patcher = type(self)._patcher, None
        if patcher is not None:
            patcher.uninstall()
        _state.shutdown()
