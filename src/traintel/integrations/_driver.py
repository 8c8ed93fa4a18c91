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
    """Opens phases under keys and remembers which ones it opened, innermost last.

    Loops, iterations and the application go through traintel's callback registry, so they
    pair with the public ``on_*`` callbacks and are closed at shutdown. Step phases (data
    loading, forward, backward, optimizer) run many times per iteration and are driven
    directly: the registry's lock and scan would cost more than the phase itself.
    """

    __slots__ = ("_integration", "_keys", "_open")

    def __init__(self, integration: str) -> None:
        self._integration = integration
        self._open: list[tuple[str, phases.PhaseSpan | None]] = []
        self._keys: set[str] = set()

    def is_open(self, key: str) -> bool:
        return key in self._keys

    def open(self, key: str, template: phases.PhaseSpan, start_ns: int | None = None) -> None:
        if key in self._keys:
            return
        try:
            telemetry = _runtime._telemetry or _runtime.current()
            if not telemetry.enabled or telemetry.closed:
                return
            if key in _STEP_KEYS:
                template._open(telemetry, start_ns)
                self._open.append((key, template))
            else:
                span = telemetry.callback_start(key, template, start_ns)
                if span.is_recording():
                    span.set_attribute(semconv.INTEGRATION, self._integration)
                self._open.append((key, None))
            self._keys.add(key)
        except Exception:
            _runtime.current().warn_once(
                f"{self._integration}:open:{key}", "%s: could not open %r", self._integration, key
            )

    def close(self, key: str, end_ns: int | None = None, exc: BaseException | None = None) -> None:
        """Close ``key``, and first anything opened inside it (ended early, not failed)."""
        if key not in self._keys:
            return
        stack = self._open
        if stack[-1][0] == key:  # the common case: the innermost phase
            entries = [stack.pop()]
            self._keys.discard(key)
        else:
            index = next(i for i, entry in enumerate(stack) if entry[0] == key)
            entries = stack[index:]
            del stack[index:]
            self._keys.difference_update(entry[0] for entry in entries)
        try:
            telemetry = _runtime._telemetry or _runtime.current()
            if telemetry.closed:
                return
            for inner, template in reversed(entries):
                error = exc if inner == key else None
                reason = None if inner == key else f"parent {key} ended first"
                if template is not None:
                    template._close(telemetry, error, end_ns, reason)
                else:
                    telemetry.callback_end(inner, end_ns, error)
        except Exception:
            _runtime.current().warn_once(
                f"{self._integration}:close:{key}", "%s: could not close %r", self._integration, key
            )

    def fail(self, exc: BaseException) -> None:
        """Close everything this driver opened, innermost first, each marked ERROR by ``exc``."""
        for key, _template in reversed(list(self._open)):
            self.close(key, None, exc)

    def close_all(self) -> None:
        for key, _template in reversed(list(self._open)):
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
