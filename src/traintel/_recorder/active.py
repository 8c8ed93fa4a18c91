"""The job the phase API records into: set by the runtime when it configures or shuts down.

Why a module of its own: every phase reads it on every step, and the recorder must not import
the runtime that builds it (that would be a cycle). The runtime sets ``engine`` and registers
how to configure from the environment on first use; a phase used before any configuration
triggers that once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from traintel._recorder.engine import TrainingEngine

#: The running job's engine; None before configuration, when telemetry is off, after shutdown.
engine: TrainingEngine | None = None
#: False until the runtime has configured (or switched off) telemetry in this process.
configured = False


def _not_configured() -> TrainingEngine | None:
    return None


_first_use: Callable[[], TrainingEngine | None] = _not_configured


def set_engine(found: TrainingEngine | None) -> None:
    global engine, configured
    engine, configured = found, True


def reset() -> None:
    """After shutdown: the next API call configures afresh."""
    global engine, configured
    engine, configured = None, False


def on_first_use(configure: Callable[[], TrainingEngine | None]) -> None:
    global _first_use
    _first_use = configure


def current() -> TrainingEngine | None:
    """The running job's engine, configuring from the environment if nothing has yet."""
    found = engine
    if found is None and not configured:
        return _first_use()
    return found
