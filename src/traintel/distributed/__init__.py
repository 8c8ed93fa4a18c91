"""Multi-rank telemetry: cross-rank window statistics, stragglers, the synchronisation point.

Importing this package does not import torch: the exchange (``exchange.py``) is imported when
the first window closes with ``torch.distributed`` initialised, DDP's default hook when
:func:`watch_ddp` is called.
"""

from __future__ import annotations

from typing import Any

from traintel._recorder import active, clock

__all__ = ["mark_sync_point", "watch_ddp"]


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


def watch_ddp(model: Any, hook: Any = None, state: Any = None) -> Any:
    """Register a DDP communication hook that marks the synchronisation point.

    The hook runs when the first gradient bucket is ready, i.e. when this rank arrives at the
    all-reduce, then hands the bucket to ``hook`` (default: DDP's plain all-reduce, with
    ``state`` as its process group, None for the default group). Pass your own hook (e.g.
    fp16 compression) and its state to keep it. Call before the first backward; DDP accepts
    one comm hook per model. Returns ``model``.

    Why a comm hook: DDP's all-reduce runs inside ``backward()``, where no phase boundary is
    visible; the hook is the one place that runs exactly when a bucket of gradients is ready to
    leave this rank. Each bucket's all-reduce also counts in the rank's collective sequence
    (``collectives.py``).
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from traintel.distributed.collectives import watch_torch_collectives

    # Checked here: a model that is not DDP (FSDP, or DDP not wrapped yet) or a hook that is not
    # callable would otherwise fail as an AttributeError naming neither, or in the first backward.
    if not callable(getattr(model, "register_comm_hook", None)):
        raise TypeError(f"watch_ddp(model=...): expected a DistributedDataParallel model, got {model!r:.80}")
    if hook is not None and not callable(hook):
        raise TypeError(f"watch_ddp(hook=...): expected a DDP comm hook (a callable), got {hook!r:.80}")
    inner = allreduce_hook if hook is None else hook
    # A lambda, unannotated: DDP checks a hook's annotations at run time, and this module's are
    # postponed (text, which it refuses). DDP also requires the parameter name ``bucket``.
    model.register_comm_hook(state, lambda hook_state, bucket: _stamped(inner, hook_state, bucket))
    watch_torch_collectives()  # the buckets' all-reduces count in the collective sequence
    return model


def _stamped(inner: Any, hook_state: Any, bucket: Any) -> Any:
    mark_sync_point()  # never raises
    return inner(hook_state, bucket)
