"""Zero-code phase spans for an unmodified PyTorch script (``opentelemetry-instrument``).

What is patched, and why each choice:

- Optimizer steps through torch's *global* step hooks (``register_optimizer_step_pre_hook`` /
  ``_post_hook``), not by replacing ``torch.optim.Optimizer.step``: every optimizer class
  overrides ``step``, so a patched base method would never run. The hooks see every optimizer,
  whatever its class, and are removed exactly by their handles.
- An iteration is one optimizer step: it starts where the previous step ended (or at the batch
  fetch that began it) and ends when the step returns. Batches fetched while gradients are
  disabled (evaluation) do not open training iterations, and evaluation or a checkpoint between
  two steps restarts the clock, so their time is not counted as training.
- ``_BaseDataLoaderIter.__next__`` (every DataLoader iterator inherits it): the wait for a
  batch is ``data_loading``, and the batch's leading dimension is counted as samples.
- ``torch.save`` / ``torch.load`` and ``torch.distributed.checkpoint`` ``save`` /
  ``async_save`` / ``load`` (DCP is patched when the script imports it, by a post-import hook:
  importing it up front would add about a second to every instrumented start): checkpoint
  spans on the thread that instrumented (the training thread); a call made inside another
  (DCP writes with ``torch.save``; so do Lightning's and Hugging Face's saves, inside their
  integrations' checkpoint spans) or by a background writer (``async_save``'s thread, whose
  time is the async save's finalize) is not counted twice.
- Only the thread that instrumented (the main thread under ``opentelemetry-instrument``) is
  traced: phases are per-thread contexts, and a script's own prefetching or writer threads are
  not its training loop.
- torch.monitor events and ``Stat`` windows are forwarded by the bridge of
  :mod:`traintel.integrations.torch_monitor`.
- ``torch.distributed``'s collective functions count in the rank's collective sequence
  (:mod:`traintel.distributed.collectives`), which says who a hung job waits for.
- Nothing is patched until the script imports torch (a post-import hook), so instrumenting a
  process that never uses torch costs nothing.
- The ``application`` and ``training_loop`` spans open lazily at the first instrumented call,
  backdated to when instrumentation started, so a script that never trains gets no spans, and
  a script that opens its own phases with traintel's API keeps them (nothing is nested twice).
  They close at exit; if the script died of an exception, every open span is marked with it.

Every wrapper is a ``wrapt`` function wrapper (undone with OpenTelemetry's ``unwrap``, as the
contrib instrumentations do): it calls the original with the same arguments and returns its
result or raises its exception unchanged; telemetry failures are contained and reported once.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import wrapt
from opentelemetry.instrumentation.utils import unwrap
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._api import phases
from traintel._api.model_metrics import record_batch
from traintel._recorder.checkpoints import CheckpointSavePhase
from traintel._recorder.clock import time_ns as now_ns  # the phases' timeline
from traintel._recorder.phases import PhaseSpan
from traintel._runtime import state as _state
from traintel.distributed.collectives import unwatch_torch_collectives, watch_torch_collectives
from traintel.integrations._driver import Key, PhaseDriver, batch_size, in_checkpoint
from traintel.integrations.torch_monitor import TorchMonitorBridge

#: A wrapt wrapper: called with the original, the instance it is bound to, args and kwargs.
_Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]


def _path_of(value: object) -> str | None:
    return os.fspath(value) if isinstance(value, str | os.PathLike) else None


class TorchPatcher:
    """Installs and removes the patches; one instance per instrumentation."""

    def __init__(self) -> None:
        self._driver = PhaseDriver(semconv.INTEGRATION_INSTRUMENTOR)
        self._patched: list[tuple[object, str]] = []
        self._hooks: list[Any] = []
        self._local = threading.local()
        self._installed_ns = 0
        self._last_step_end: int | None = None
        self._installed = False
        self._thread = 0
        self._monitor: TorchMonitorBridge | None = None
        self._dcp_patched = False
        self._armed = False
        self._armed_ns = 0

    # --- install / uninstall ---------------------------------------------------------------------
    def arm(self) -> None:
        """Install when the script imports torch (at once if it already has): an instrumented
        process that never uses torch does not pay torch's import time (over a second)."""
        self._armed = True
        self._armed_ns = now_ns()
        wrapt.register_post_import_hook(self._torch_imported, "torch")

    def _torch_imported(self, module: Any) -> None:
        if not self._armed:
            return
        try:
            self.install()
        except Exception:
            _state.current().warn_once("instrumentor", "could not patch torch; phases are not traced")

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        if self._installed:
            return
        self._installed = True
        self._installed_ns = self._armed_ns or now_ns()
        self._thread = threading.get_ident()
        self._patch(torch, "save", self._checkpoint("torch.save", "sync", self._save_path))
        self._patch(torch, "load", self._checkpoint("torch.load", "load", self._load_path))
        self._patch(_BaseDataLoaderIter, "__next__", self._next)
        self._hooks.append(register_optimizer_step_pre_hook(self._step_pre))
        self._hooks.append(register_optimizer_step_post_hook(self._step_post))
        if torch.distributed.is_available():
            # when the script imports it (now, if it already has): importing DCP costs ~1 s
            wrapt.register_post_import_hook(self._patch_dcp, "torch.distributed.checkpoint")
        self._monitor = TorchMonitorBridge().install()
        watch_torch_collectives()  # as the script imports torch: the same point on every rank
        atexit.register(self.finish)

    def uninstall(self) -> None:
        """Restore every patched attribute to the exact object it was, remove the hooks and
        close the spans this instrumentation opened."""
        self._armed = False
        if not self._installed:
            return
        self._installed = False
        atexit.unregister(self.finish)
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        for owner, name in reversed(self._patched):
            unwrap(owner, name)
        self._patched.clear()
        self._dcp_patched = False
        if self._monitor is not None:
            self._monitor.uninstall()
            self._monitor = None
        unwatch_torch_collectives()
        self._driver.close_all()

    def finish(self) -> None:
        """At exit: close what is open, marking it with the exception that ended the script."""
        error = getattr(sys, "last_value", None)
        self._driver.close_all(error if isinstance(error, BaseException) else None)

    def _patch_dcp(self, dcp: Any) -> None:
        if not self._installed or self._dcp_patched:
            return
        self._dcp_patched = True
        for name, kind in (("save", "sync"), ("async_save", "async"), ("load", "load")):
            if getattr(dcp, name, None) is not None:
                call = "torch.distributed.checkpoint." + name
                self._patch(dcp, name, self._checkpoint(call, kind, self._dcp_path))

    def _patch(self, owner: object, name: str, wrapper: _Wrapper) -> None:
        wrapt.wrap_function_wrapper(owner, name, wrapper)
        self._patched.append((owner, name))

    # --- the phase model -------------------------------------------------------------------------
    def _drives_iterations(self, telemetry: _state.Telemetry) -> bool:
        """False when the script runs its own training loop through traintel's API."""
        if self._driver.is_open(Key.LOOP):
            return True
        return telemetry.engine is not None and not telemetry.engine.open_loops.get(Key.LOOP)

    def _ensure_iteration(self, start_ns: int) -> bool:
        telemetry = _state.current()
        if not telemetry.enabled or not self._drives_iterations(telemetry):
            return False
        if self._driver.is_open(Key.ITERATION):
            return True
        self._driver.open_application(self._installed_ns)
        if not self._driver.is_open(Key.LOOP):
            self._driver.open(Key.LOOP, phases.training_loop(), start_ns)
        start = self._last_step_end if self._last_step_end is not None else start_ns
        self._driver.open(Key.ITERATION, phases.training_iteration(), start)
        return self._driver.is_open(Key.ITERATION)

    def _batch_loaded(self, batch: Any, start_ns: int, end_ns: int) -> None:
        import torch

        if not torch.is_grad_enabled():  # an evaluation batch: not training time
            self._last_step_end = None
            return
        if not self._ensure_iteration(start_ns):
            return
        self._driver.open(Key.DATA, phases.data_loading(), start_ns)
        self._driver.close(Key.DATA, end_ns)
        samples = batch_size(batch)
        if samples:
            record_batch(samples=samples)

    def _step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        try:
            start = now_ns()
            if self._ensure_iteration(start):
                self._driver.open(Key.OPTIMIZER, phases.optimizer_update(), start)
        except Exception:
            _state.current().warn_once("instrumentor:step_pre", "instrumentor: optimizer pre-hook failed")

    def _step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        try:
            end = now_ns()
            if self._driver.is_open(Key.ITERATION):
                self._driver.close(Key.OPTIMIZER, end)
                self._driver.close(Key.ITERATION, end)
                self._last_step_end = end
        except Exception:
            _state.current().warn_once("instrumentor:step_post", "instrumentor: optimizer post-hook failed")

    # --- wrappers (as wrapt calls them: the original, its instance, the call's arguments) ----------
    def _next(
        self, wrapped: Callable[[], Any], iterator: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        start = now_ns()
        batch = wrapped(*args, **kwargs)  # StopIteration and loader errors pass through untouched
        if threading.get_ident() != self._thread:
            return batch  # a prefetching thread of the script's own: not the training loop
        try:
            self._batch_loaded(batch, start, now_ns())
        except Exception:
            _state.current().warn_once("instrumentor:next", "instrumentor: batch accounting failed")
        return batch

    def _checkpoint(
        self, call: str, kind: str, path_of: Callable[[tuple[Any, ...], dict[str, Any]], str | None]
    ) -> _Wrapper:
        def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            local = self._local
            if getattr(local, "inside", False) or threading.get_ident() != self._thread or in_checkpoint():
                # DCP's own torch.save, a background writer, or a framework's (the script's) save
                return wrapped(*args, **kwargs)
            template = self._checkpoint_template(call, kind, args, kwargs, path_of)
            local.inside = True
            try:
                if template is None:
                    return wrapped(*args, **kwargs)
                with template:
                    result = wrapped(*args, **kwargs)
                    if kind == "async" and isinstance(template, CheckpointSavePhase):
                        self._finish_async(template, result, path_of(args, kwargs))
                return result
            finally:
                local.inside = False
                self._last_step_end = None  # checkpoint time is not the next iteration's

        return wrapper

    def _checkpoint_template(
        self,
        call: str,
        kind: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        path_of: Callable[[tuple[Any, ...], dict[str, Any]], str | None],
    ) -> PhaseSpan | None:
        try:
            telemetry = _state.current()
            if not telemetry.enabled:
                return None
            self._driver.open_application(self._installed_ns)
            path = path_of(args, kwargs)
            attributes: dict[str, AttributeValue] = {
                semconv.INSTRUMENTED_CALL: call,
                semconv.INTEGRATION: semconv.INTEGRATION_INSTRUMENTOR,
            }
            if kind == "load":
                return phases.checkpoint_load(path=path, attributes=attributes)
            if kind == "async":  # measured when the background write finishes, not now
                if path is not None:
                    attributes[semconv.CHECKPOINT_PATH] = path
                return phases.checkpoint_save(strategy=kind, attributes=attributes)
            return phases.checkpoint_save(strategy=kind, path=path, attributes=attributes)
        except Exception:
            _state.current().warn_once("instrumentor:" + call, "instrumentor: could not trace %s", call)
            return None

    @staticmethod
    def _finish_async(template: CheckpointSavePhase, result: Any, path: str | None) -> None:
        try:
            completion = template.completion()
            future = getattr(result, "upload_completion", result)

            def done(finished: Any) -> None:
                completion.finish(path=path, error=finished.exception())

            future.add_done_callback(done)
        except Exception:
            _state.current().warn_once("instrumentor:async", "instrumentor: cannot follow the async save")

    @staticmethod
    def _save_path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return _path_of(args[1] if len(args) > 1 else kwargs.get("f"))

    @staticmethod
    def _load_path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return _path_of(args[0] if args else kwargs.get("f"))

    @staticmethod
    def _dcp_path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return _path_of(kwargs.get("checkpoint_id"))
