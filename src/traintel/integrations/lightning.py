"""Lightning (``lightning.pytorch``): a callback, and a Trainer that installs it.

Usage::

    from traintel.integrations.lightning import TraintelTrainer
    trainer = TraintelTrainer(max_steps=1000)  # a lightning.pytorch.Trainer with the callback
    trainer.fit(model, datamodule)

or ``Trainer(callbacks=[TraintelCallback()])``. Requires ``traintel[lightning]``. The phase
mapping is described in :mod:`traintel.integrations._lightning_hooks`.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch import Callback, Trainer
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"traintel.integrations.lightning needs lightning: pip install 'traintel[lightning]' ({exc})"
    ) from exc

from traintel.integrations._lightning_hooks import LightningHooks, with_callback


class TraintelCallback(LightningHooks, Callback):
    """Training phases of a ``lightning.pytorch.Trainer`` as traintel spans and metrics."""


class TraintelTrainer(Trainer):
    """A ``Trainer`` with a :class:`TraintelCallback` added (unless one is given), in the spirit
    of one-logger's ``OneLoggerPTLTrainer``: swap the class, keep every argument."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **with_callback(kwargs, TraintelCallback))


__all__ = ["TraintelCallback", "TraintelTrainer"]
