"""The DDP communication hook that stamps when this rank arrives at the gradient all-reduce.

Why a comm hook: DDP's all-reduce runs inside ``backward()``, where no phase boundary is
visible; the hook is the one place that runs exactly when a bucket of gradients is ready to
leave this rank. The first bucket of an iteration marks the end of this rank's own compute; each bucket's
all-reduce counts in the rank's collective sequence (``collectives.py``).
Imports torch; imported only by :func:`traintel.distributed.watch_ddp`. No postponed
annotations here: DDP checks the hook's annotations at run time (``GradBucket``).
"""

from typing import Any

import torch
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, visible to mypy
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from traintel.distributed.collectives import watch_torch_collectives
from traintel.distributed.sync import mark_sync_point


def register(model: Any, hook: Any = None, state: Any = None) -> Any:
    inner = allreduce_hook if hook is None else hook

    def stamped(hook_state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        mark_sync_point()  # never raises
        return inner(hook_state, bucket)

    model.register_comm_hook(state, stamped)
    watch_torch_collectives()  # the buckets' all-reduces count in the collective sequence
    return model
