"""The phase bookkeeping every integration shares: open and close phases from hooks.

Why a driver and not ``with`` blocks: framework hooks start a phase in one call and end it in
another. The driver keeps the phases it opened (by key, innermost last) on top of traintel's
callback registry, so hooks that fire twice or out of order are harmless, an exception can
mark every phase it opened ERROR innermost first, and nothing here ever raises into the
framework.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from traintel import semconv
from traintel._api import phases
from traintel._host.flops import first_dim
from traintel._recorder.checkpoints import AsyncCheckpointCompletion
from traintel._recorder.phases import PhaseSpan
from traintel._runtime import state as _state
from traintel.semconv import Phase


class Key:
    """The keys the integrations drive phases under: each phase's span name."""

    APP = Phase.APPLICATION.value
    LOOP = Phase.TRAINING_LOOP.value
    ITERATION = Phase.TRAINING_ITERATION.value
    DATA = Phase.DATA_LOADING.value
    FORWARD = Phase.MODEL_FORWARD.value
    BACKWARD = Phase.MODEL_BACKWARD.value
    OPTIMIZER = Phase.OPTIMIZER_UPDATE.value
    VALIDATION = Phase.VALIDATION_LOOP.value
    TESTING = Phase.TESTING_LOOP.value


#: Phases that run every step are driven directly, not through the callback registry: their
#: handle is the iteration's record (or, for the iteration, the record itself).
_STEP_KEYS = frozenset(phase.value for phase in semconv.STEP_PHASES)
_DIRECT_KEYS = _STEP_KEYS | {Key.ITERATION}


class PhaseDriver:
    """Opens phases under keys and remembers which ones it opened, innermost last.

    Loops, evaluation and the application go through traintel's callback registry, so they
    pair with the public ``on_*`` callbacks and are closed at shutdown. The training iteration
    and its step phases (data loading, forward, backward, optimizer) run every step and are
    driven directly: the registry's lock and scan would cost more than the phase itself. They
    are still closed on failure and teardown (:meth:`close_all`), and a job killed
    mid-iteration has the engine end it (preemption).
    """

    __slots__ = ("_integration", "_open")

    def __init__(self, integration: str) -> None:
        self._integration = integration
        #: key -> the template driven directly, or None for a registry entry; insertion order
        #: is opening order, so the last key is the innermost phase.
        self._open: dict[str, PhaseSpan | None] = {}

    def is_open(self, key: str) -> bool:
        return key in self._open

    def open(self, key: str, template: PhaseSpan, start_ns: int | None = None) -> None:
        if key in self._open:
            return
        try:
            telemetry = _state.current()
            engine = telemetry.engine
            if engine is None or engine.closed:
                return
            if key in _DIRECT_KEYS:
                span = template._open(engine, start_ns)
                self._open[key] = template
                if key in _STEP_KEYS:  # their handle is the iteration: already marked
                    return
            else:
                span = telemetry.callback_start(key, template, start_ns)
                self._open[key] = None
            if span.is_recording():
                span.set_attribute(semconv.INTEGRATION, self._integration)
        except Exception:
            self._failed("open", key)

    def open_once(self, key: str, template: Callable[[], PhaseSpan], start_ns: int | None = None) -> bool:
        """Open ``key`` unless one is open (this driver's, the script's own or a callback's:
        nothing is nested twice); whether this call opened it."""
        if self.is_open(key):
            return False
        telemetry = _state.current()
        if not telemetry.enabled or telemetry.find_open_phase(key) is not None:
            return False
        self.open(key, template(), start_ns)
        return self.is_open(key)

    def open_application(self, start_ns: int | None = None) -> bool:
        """Open an ``application`` unless one is open; whether this call opened it."""
        return self.open_once(Key.APP, phases.application, start_ns)

    def open_loop(self, done: object, max_steps: object) -> None:
        """Open a trainer's ``training_loop`` unless the script opened its own, numbered from the
        steps already ``done`` (a resumed run continues its iteration count), toward
        ``max_steps`` where that is positive."""
        target = max_steps if isinstance(max_steps, int) and max_steps > 0 else None
        start = done if isinstance(done, int) else 0
        self.open_once(Key.LOOP, lambda: phases.training_loop(start, train_iterations_target=target))

    def close(self, key: str, end_ns: int | None = None, exc: BaseException | None = None) -> None:
        """Close ``key``, and first anything opened inside it (ended early, not failed)."""
        opened = self._open
        if key not in opened:
            return
        template = opened[key]
        if template is not None and next(reversed(opened)) == key:  # every step: direct, innermost
            del opened[key]
            try:
                engine = _state.current().engine
                if engine is not None and not engine.closed:
                    template._close(engine, exc, end_ns)
            except Exception:
                self._failed("close", key)
            return
        self._close_nested(key, end_ns, exc)

    def _close_nested(self, key: str, end_ns: int | None, exc: BaseException | None) -> None:
        """Close ``key`` and what was opened inside it, innermost first."""
        keys = list(self._open)  # taken off the open set: key and what was opened after it
        entries = [(inner, self._open.pop(inner)) for inner in keys[keys.index(key) :]]
        try:
            telemetry = _state.current()
            engine = telemetry.engine
            if engine is None or engine.closed:
                return
            for inner, template in reversed(entries):
                error, reason = (exc, None) if inner == key else (None, f"parent {key} ended first")
                if template is not None:
                    template._close(engine, error, end_ns, reason)
                else:
                    telemetry.callback_end(inner, end_ns, error)
        except Exception:
            self._failed("close", key)

    def _failed(self, action: str, key: str) -> None:
        _state.current().warn_once(
            f"{self._integration}:{action}:{key}", "%s: could not %s %r", self._integration, action, key
        )

    def traced_checkpoint(
        self, save: bool, path_of: Callable[..., Any], writes: AsyncWrites | None = None
    ) -> Wrapper:
        """A framework's checkpoint save (or load) method as a ``checkpoint_save`` (or
        ``checkpoint_load``) span of this integration, unless the call runs inside an open
        checkpoint span (the script's own ``traintel.checkpoint_save`` around it: counted once).
        ``path_of`` takes the call's arguments. With ``writes`` (the framework writes in a thread
        of its own), a save is async: its background half ends when that write does."""
        integration = self._integration
        phase = phases.checkpoint_save if save else phases.checkpoint_load

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if in_checkpoint():
                    return original(*args, **kwargs)
                path = _path_of(path_of, args, kwargs)
                attributes = {semconv.INTEGRATION: integration}
                if writes is None:
                    with phase(path=path, attributes=attributes):
                        return original(*args, **kwargs)
                with phases.checkpoint_save(strategy="async", path=path, attributes=attributes) as span:
                    writes.expect(path, span.completion())
                    return original(*args, **kwargs)

            return wrapper

        return make

    def close_all(self, exc: BaseException | None = None) -> None:
        """Close everything this driver opened, innermost first (each marked ERROR by ``exc``)."""
        for key in reversed(list(self._open)):
            self.close(key, None, exc)


_CHECKPOINT_PHASES = (*(phase.value for phase in semconv.CHECKPOINT_SAVE_PHASES), Phase.CHECKPOINT_LOAD.value)


def in_checkpoint() -> bool:
    """Whether a checkpoint save or load span is open in the current context (a framework's,
    the script's own): a checkpoint call inside it is part of it, not one more checkpoint."""
    try:
        telemetry = _state.current()
        return any(telemetry.find_open_phase(phase) is not None for phase in _CHECKPOINT_PHASES)
    except Exception:
        return False


def batch_size(batch: Any) -> int | None:
    """The leading dimension of the first tensor in a batch (tensor, sequence or mapping)."""
    try:
        return first_dim(batch)
    except Exception:
        return None


def loss_value(outputs: Any) -> float | None:
    """The loss in a training step's output (a tensor, or a mapping / object with ``loss``)."""
    loss = outputs
    if isinstance(outputs, dict):
        loss = outputs.get("loss")
    elif outputs is not None and hasattr(outputs, "loss"):
        loss = outputs.loss
    if loss is None:
        return None
    try:
        return float(loss.detach()) if hasattr(loss, "detach") else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None


#: Makes a framework method's replacement from the method (see :func:`patch_instance`).
Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]


def _path_of(path_of: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The path a framework's checkpoint call was given; None for a call it will refuse itself
    (it says why)."""
    try:
        return path_of(*args, **kwargs)
    except Exception:
        return None


class AsyncWrites:
    """A framework's checkpoint writes that run in a thread of its own (Lightning's
    ``AsyncCheckpointIO``): each finishes the async save that handed it over, found by the path
    both were given (in order, for a path saved again before its last write ended)."""

    def __init__(self) -> None:
        self._pending: dict[str, deque[AsyncCheckpointCompletion]] = {}
        self._lock = threading.Lock()

    #: Saves waiting for their write at most: a rank whose strategy writes nothing (only rank 0
    #: does under DDP) hands over saves no write will finish; the oldest are let go.
    MAX_PENDING = 64

    def expect(self, path: object, completion: AsyncCheckpointCompletion) -> None:
        with self._lock:
            self._pending.setdefault(str(path), deque()).append(completion)
            if len(self._pending) > self.MAX_PENDING:
                del self._pending[next(iter(self._pending))]

    def _take(self, path: object) -> AsyncCheckpointCompletion | None:
        with self._lock:
            waiting = self._pending.get(str(path))
            if not waiting:
                return None
            completion = waiting.popleft()
            if not waiting:
                del self._pending[str(path)]
            return completion

    def finishing(self, path_of: Callable[..., Any]) -> Wrapper:
        """The writer's own save method (``path_of`` takes its arguments), finishing its save."""

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                path = _path_of(path_of, args, kwargs)
                completion = self._take(path) if path is not None else None
                try:
                    result = original(*args, **kwargs)
                except BaseException as exc:
                    if completion is not None:
                        completion.finish(error=exc)
                    raise
                if completion is not None:
                    completion.finish(path=path)
                return result

            return wrapper

        return make


def patch_instance(owner: object, name: str, make: Wrapper) -> bool:
    """Replace ``owner.name`` (a framework object's own method: one trainer, one module) with
    ``make(original)``; undone by deleting the instance attribute (:func:`unpatch_instance`).
    Not over an attribute the instance already has (ours, or the user's), not a missing one.

    Why not ``wrapt`` here, as for the zero-code torch patches: these patch one object, not a
    module or class, and Lightning's ``log`` tap must pickle and deep-copy with the module, which
    a ``wrapt`` proxy refuses to do."""
    original = getattr(owner, name, None)
    if original is None or name in vars(owner):
        return False
    setattr(owner, name, make(original))
    return True


def unpatch_instance(owner: object, name: str) -> None:
    vars(owner).pop(name, None)
