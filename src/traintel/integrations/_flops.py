"""Model FLOPs from the framework's own first training step, for MFU without configuration.

Why the real step and not :func:`traintel.measure_flops` on the meta device: a framework's step
is not ``model(batch)`` (Lightning runs ``training_step``, Hugging Face ``compute_loss`` with
its own input handling), and some model code calls ``.item()``, which the meta device refuses.
Counting the first micro-batch that really runs costs one slower step instead of an extra one,
and sees the operations that execute whatever DDP/FSDP wrappers sit around the module.

The counters are entered and left from separate hooks (forward start, end of forward, end of
backward), always on the training thread and in stack order; :meth:`abort` unwinds them when
the step raises. Configured ``flops_per_sample`` / ``flops_per_token`` always win.
"""

from __future__ import annotations

from typing import Any

from traintel._runtime import state as _state
from traintel.flops import FlopCount, apply_flops


class FirstStepFlops:
    """Counts one step: the forward part for model FLOPs, the whole step for executed FLOPs."""

    __slots__ = ("_enabled", "_forward", "_forward_open", "_total", "decided")

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._total: Any = None
        self._forward: Any = None
        self._forward_open = False
        self.decided = False

    def start(self) -> bool:
        """Begin counting, once per run, unless FLOPs are configured; True if counting."""
        if self.decided or not self._enabled:
            return False
        self.decided = True
        config = _state.current().config
        if config.get("flops_per_sample") is not None or config.get("flops_per_token") is not None:
            return False
        try:
            from torch.utils.flop_counter import FlopCounterMode

            total: Any = FlopCounterMode(display=False)
            forward: Any = FlopCounterMode(display=False)
            total.__enter__()
            self._total = total
            forward.__enter__()
            self._forward, self._forward_open = forward, True
            return True
        except Exception:
            self.abort()
            _state.current().warn_once("flops:start", "could not count the first step's FLOPs")
            return False

    @property
    def counting(self) -> bool:
        return self._total is not None

    def forward_done(self) -> None:
        if self._forward_open:
            self._forward_open = False
            self._forward.__exit__(None, None, None)

    def finish(self, samples: int | None) -> bool:
        """Stop counting and apply the count; False if nothing usable was counted."""
        if self._total is None:
            return False
        try:
            self.forward_done()
            self._total.__exit__(None, None, None)
            forward = int(self._forward.get_total_flops())
            executed = int(self._total.get_total_flops())
        except Exception:
            _state.current().warn_once("flops:finish", "could not count the first step's FLOPs")
            return False
        finally:
            self._total = self._forward = None
        if not forward or not samples:
            return False
        apply_flops(FlopCount(forward=forward, backward=executed - forward, samples=samples))
        return True

    def abort(self) -> None:
        """Leave the counters (innermost first) without applying anything."""
        try:
            self.forward_done()
            if self._total is not None:
                self._total.__exit__(None, None, None)
        except Exception:
            pass
        finally:
            self._total = self._forward = None
