"""The phase bookkeeping every integration shares: open and close phases from hooks.

Why a driver and not ``with`` blocks: framework hooks start a phase in one call and end it in
another. The driver keeps the phases it opened (by key, innermost last) on top of traintel's
callback registry, so hooks that fire twice or out of order are harmless, an exception can
mark every phase it opened ERROR innermost first, and nothing here ever raises into the
framework.
"""

from __future__ import annotations

import time
from typing import Any

from traintel import _runtime, semconv
from traintel.api import phases
from traintel.flops import _first_dim

#: Step phases are timed into their iteration's record: their handle is the iteration itself.
_STEP_KEYS = frozenset(phase.value for phase in semconv.STEP_PHASES)


class PhaseDriver:
    """Opens phases under callback keys and remembers which ones it opened."""

    __slots__ = ("_integration", "_open")

    def __init__(self, integration: str) -> None:
        self._integration = integration
        self._open: list[str] = []

    def is_open(self, key: str) -> bool:
        return key in self._open

    def open(self, key: str, template: phases.PhaseSpan, start_ns: int | None = None) -> None:
        if key in self._open:
            return
        try:
            telemetry = _runtime.current()
            if not telemetry.enabled or telemetry.closed:
                return
            span = telemetry.callback_start(key, template, start_ns)
            if key not in _STEP_KEYS and span.is_recording():
                span.set_attribute(semconv.INTEGRATION, self._integration)
            self._open.append(key)
        except Exception:
            _runtime.current().warn_once(
                f"{self._integration}:open:{key}", "%s: could not open %r", self._integration, key
            )

    def close(self, key: str, end_ns: int | None = None, exc: BaseException | None = None) -> None:
        """Close ``key`` (and, as the registry does, anything opened inside it)."""
        if key not in self._open:
            return
        index = self._open.index(key)
        del self._open[index:]
        try:
            telemetry = _runtime.current()
            if not telemetry.closed:
                telemetry.callback_end(key, end_ns, exc)
        except Exception:
            _runtime.current().warn_once(
                f"{self._integration}:close:{key}", "%s: could not close %r", self._integration, key
            )

    def fail(self, exc: BaseException) -> None:
        """Close everything this driver opened, innermost first, each marked ERROR by ``exc``."""
        for key in reversed(list(self._open)):
            self.close(key, None, exc)

    def close_all(self) -> None:
        for key in reversed(list(self._open)):
            self.close(key)


def now_ns() -> int:
    return time.time_ns()


def batch_size(batch: Any) -> int | None:
    """The leading dimension of the first tensor in a batch (tensor, sequence or mapping)."""
    try:
        return _first_dim(batch)
    except Exception:
        return None


def loss_value(outputs: Any) -> float | None:
    """The loss in a training step's output (a tensor, or a mapping / object with ``loss``)."""
    loss = outputs
    if isinstance(outputs, dict):
        loss = outputs.get("loss")
    elif outputs is not None and hasattr(outputs, "loss"):
        loss = outputs.loss
    if loss is None:
        return None
    try:
        return float(loss.detach()) if hasattr(loss, "detach") else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None
