"""The synchronisation point: where this rank stops computing and waits for the others.

A module of its own so that the DDP hook (``ddp.py``) and the package both reach it without
importing each other.
"""

from __future__ import annotations

from traintel._recorder import active, clock


def mark_sync_point() -> None:
    """This rank has finished its own work of the iteration and now waits for the others.

    Call it right before the first collective of each training iteration when not using
    :func:`watch_ddp` (e.g. your own all-reduce of the gradients). Only the first
    call of an iteration counts; outside a training iteration, or before traintel is
    configured, it does nothing. Never raises.
    """
    try:
        engine = active.engine
        if engine is not None:
            engine.mark_sync_point(clock.time_ns())
    except Exception:  # telemetry never breaks training
        pass
