"""Model FLOPs from the framework's own first training step, for MFU without configuration.

Why the real step and not :func:`traintel.measure_flops` on the meta device: a framework's step
is not ``model(batch)`` (Lightning runs ``training_step``, Hugging Face ``compute_loss`` with
its own input handling), and some model code calls ``.item()``, which the meta device refuses.
Counting the first micro-batch that really runs costs one slower step instead of an extra one,
and sees the operations that execute whatever DDP/FSDP wrappers sit around the module.

The counters are entered and left from separate hooks (forward start, end of forward, end of
backward), always on the training thread and in stack order; :meth:`abort` unwinds them when
the step raises. Configured ``flops_per_sample`` / ``flops_per_token`` always win.

Attention: torch's counter has a formula for the fused attention kernels CUDA runs, but on CPU
``scaled_dot_product_attention`` runs an operator the counter does not know, and a transformer's
attention (a quarter of a GPT-2-small step at 2,048 tokens) went uncounted. The step's
``scaled_dot_product_attention`` calls are therefore watched too (a function mode, first step
only); where the counter saw no attention operator, the analytic term is added from each call's
shapes (forward 4·B·H·Sq·Sk·D, backward twice that) for each call the counter's total did not grow
by that much, ``flops_method`` says ``counter+attention``, and one log line says so. Attention
the counter does see (CUDA's fused kernels, a masked call decomposed into matmuls, a model whose
attention is plain matmuls) gets nothing added.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any

from traintel._host.compute_dtype import note_model
from traintel._runtime import state as _state
from traintel.flops import FlopCount, apply_flops

_logger = logging.getLogger(__name__)


def _attention_mode(counter: Any) -> Any:
    """A function mode that records the forward FLOPs (2 matmuls, 2 FLOPs per multiply-add:
    4·B·H·Sq·Sk·D) of each ``scaled_dot_product_attention`` call of the forward that ``counter``
    did not count."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class AttentionCalls(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.missing_flops = 0
            self.calls = 0
            self.in_forward = True

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is not F.scaled_dot_product_attention or not self.in_forward:
                return func(*args, **(kwargs or {}))
            before = counter.get_total_flops()
            result = func(*args, **(kwargs or {}))
            try:
                query, key, value = args[0], args[1], args[2]
                *batch, sq, d = query.shape
                heads = 1
                for size in batch:
                    heads *= int(size)
                expected = 2 * heads * int(sq) * int(key.shape[-2]) * (int(d) + int(value.shape[-1]))
                if counter.get_total_flops() - before < expected:
                    self.missing_flops += expected
                    self.calls += 1
            except Exception:
                pass
            return result

    return AttentionCalls()


class FirstStepFlops:
    """Counts one step: the forward part for model FLOPs, the whole step for executed FLOPs.
    The forward counter is on the inner exit stack, closed when the forward ends; closing a
    stack twice does nothing, so every path out may close both."""

    __slots__ = ("_attention", "_enabled", "_forward", "_inner", "_outer", "_total", "decided")

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._total: Any = None
        self._forward: Any = None
        self._attention: Any = None
        self._outer = ExitStack()
        self._inner = ExitStack()
        self.decided = False

    def start(self, model: Any) -> bool:
        """Begin counting, once per run, unless FLOPs are configured; True if counting.
        ``model`` tells the MFU divisor its parameters' dtype."""
        if self.decided or not self._enabled:
            return False
        self.decided = True
        note_model(model)  # never raises
        settings = _state.current().config.resolve()
        if settings.flops_per_sample is not None or settings.flops_per_token is not None:
            return False
        try:
            from torch.utils.flop_counter import FlopCounterMode

            self._total = self._outer.enter_context(FlopCounterMode(display=False))
            self._attention = self._outer.enter_context(_attention_mode(self._total))
            self._forward = self._inner.enter_context(FlopCounterMode(display=False))
            return True
        except Exception:
            self.abort()
            _state.current().warn_once("flops:start", "could not count the first step's FLOPs")
            return False

    def forward_done(self) -> None:
        self._inner.close()
        if self._attention is not None:  # recomputation in backward is not model FLOPs
            self._attention.in_forward = False

    def finish(self, samples: int | None) -> bool:
        """Stop counting and apply the count; False if nothing usable was counted (or nothing is
        counting: every path out of a step may call it)."""
        if self._total is None:
            return False
        attention = self._attention
        try:
            self.forward_done()
            self._outer.close()
            forward = int(self._forward.get_total_flops())
            executed = int(self._total.get_total_flops())
            added = attention.missing_flops
        except Exception:
            _state.current().warn_once("flops:finish", "could not count the first step's FLOPs")
            return False
        finally:
            self._total = self._forward = self._attention = None
        if not forward or not samples:
            return False
        # The counter missed attention: forward + a backward of twice the forward, added.
        count = FlopCount(forward=forward + added, backward=executed - forward + 2 * added, samples=samples)
        apply_flops(count, "counter+attention" if added else "counter")
        if added:
            _logger.info(
                "traintel: torch's FLOP counter has no formula for attention on this device: the "
                "attention term of %d scaled_dot_product_attention call(s), %d FLOPs forward, was "
                "added from their shapes",
                attention.calls,
                added,
            )
        return True

    def abort(self) -> None:
        """Leave the counters (innermost first) without applying anything."""
        try:
            self._inner.close()
            self._outer.close()
        except Exception:
            pass
        finally:
            self._total = self._forward = self._attention = None
