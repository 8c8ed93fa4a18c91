"""Lightning under its older package name, ``pytorch_lightning``: the callback and Trainer of
:mod:`traintel.integrations.lightning` (same usage, same phase mapping), built on this package's
own ``Callback`` and ``Trainer``. Requires ``traintel[lightning]``.
"""

from __future__ import annotations

from typing import Any

try:
    from pytorch_lightning import Callback, Trainer
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "traintel.integrations.pytorch_lightning needs pytorch_lightning: "
        f"pip install 'traintel[lightning]' ({exc})"
    ) from exc

from traintel.integrations._lightning_hooks import LightningHooks, with_callback


class TraintelCallback(LightningHooks, Callback):
    """Training phases of a ``pytorch_lightning.Trainer`` as traintel spans and metrics."""


class TraintelTrainer(Trainer):
    """A ``Trainer`` with a :class:`TraintelCallback` added (unless one is given), in the spirit
    of one-logger's ``OneLoggerPTLTrainer``: swap the class, keep every argument."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **with_callback(kwargs, TraintelCallback))


__all__ = ["TraintelCallback", "TraintelTrainer"]
