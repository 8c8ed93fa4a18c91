"""Multi-rank telemetry: cross-rank window statistics, stragglers, the synchronisation point.

Importing this package does not import torch: the exchange (``exchange.py``) is imported when
the first window closes with ``torch.distributed`` initialised, the DDP hook (``ddp.py``) when
:func:`watch_ddp` is called.
"""

from __future__ import annotations

from typing import Any

from traintel.distributed.sync import mark_sync_point

__all__ = ["mark_sync_point", "watch_ddp"]


def watch_ddp(model: Any, hook: Any = None, state: Any = None) -> Any:
    """Register a DDP communication hook that marks the synchronisation point.

    The hook runs when the first gradient bucket is ready, i.e. when this rank arrives at the
    all-reduce, then hands the bucket to ``hook`` (default: DDP's plain all-reduce, with
    ``state`` as its process group, None for the default group). Pass your own hook (e.g.
    fp16 compression) and its state to keep it. Call before the first backward; DDP accepts
    one comm hook per model. Returns ``model``.
    """
    from traintel.distributed.ddp import register

    return register(model, hook, state)
