"""The ``opentelemetry_instrumentor`` entry point: ``opentelemetry-instrument python train.py``.

Why: a job already launched under ``opentelemetry-instrument`` has its providers configured by
the OTel distro from ``OTEL_*``; this instrumentor makes traintel attach to them (adding its
processor) with no configuration code in the script. Patching torch for zero-code phase spans
builds on this class.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from traintel import _runtime


class TraintelInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Attaches traintel to the providers ``opentelemetry-instrument`` configured."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        if _runtime.configured() is None:
            _runtime.current()  # lenient: a bad TRAINTEL_* value is logged, never fatal here

    def _uninstrument(self, **kwargs: Any) -> None:
        _runtime.shutdown()
