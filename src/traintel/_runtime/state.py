"""The process-wide telemetry state: the running job's configuration, pipeline, engine and the
phases callbacks keep open.

Why one object: the API is module-level functions and context managers (as in the reference
library), so something must hold what they record into. It is built by ``bootstrap.py``; this
module holds it and hands it out (configuring from the environment on first use). Everything
that can fail here is caught and reported once; nothing escapes into the training loop.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._host.capabilities import capability_report
from traintel._host.compute_dtype import forget_model
from traintel._host.signal_raised import raised_by_signal_handler
from traintel._recorder import active
from traintel._recorder.engine import TrainingEngine
from traintel._runtime.farewell import say_farewell
from traintel._sdk.instruments import DEFERRED_CAPACITY
from traintel._sdk.open_spans import OpenSpans
from traintel._sdk.processor import TrainingMetricsProcessor
from traintel.config import TrainingConfig
from traintel.version import __version__

if TYPE_CHECKING:
    from traintel._host.heartbeat import Heartbeat
    from traintel._sdk.providers import Pipeline
    from traintel.distributed.cross_rank import CrossRank

_logger = logging.getLogger("traintel")


class PhaseTemplate(Protocol):
    """What the callbacks drive: a phase's open/close protocol."""

    _name: str

    def _open(self, engine: TrainingEngine, start_ns: int | None = None) -> Span: ...

    def _close(
        self,
        engine: TrainingEngine,
        exc: BaseException | None,
        end_ns: int | None = None,
        reason: str | None = None,
    ) -> None: ...


@dataclass
class _OpenCallback:
    key: str
    span: Span
    template: PhaseTemplate


class Warnings:
    """One warning per kind of misuse: a loop that misuses an API a million times must not
    produce a million log lines."""

    def __init__(self) -> None:
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def warn_once(self, kind: str, message: str, *args: object) -> None:
        """Say ``message`` once per ``kind``. Called from a guard's ``except`` block (where
        traintel contains its own failures), an exception a signal handler raised inside
        traintel's code is raised on instead: it is the job's (see ``traintel._host.signal_raised``)."""
        handling = sys.exc_info()[1]
        if handling is not None and raised_by_signal_handler(handling):
            raise handling
        if kind in self._warned:
            return
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        _logger.warning("traintel: " + message + " (reported once)", *args)


class Telemetry:
    """traintel's live state for this process: what :func:`traintel.configure` returns."""

    def __init__(
        self,
        config: TrainingConfig,
        pipeline: Pipeline | None = None,
        engine: TrainingEngine | None = None,
        processor: TrainingMetricsProcessor | None = None,
        open_spans: OpenSpans | None = None,
        warnings: Warnings | None = None,
    ) -> None:
        self.config = config
        self.pipeline = pipeline
        self.engine = engine
        self.processor = processor
        self.open_spans = open_spans
        self.enabled = pipeline is not None and engine is not None
        self.tracer: trace_api.Tracer = engine.tracer if engine is not None else trace_api.NoOpTracer()
        self.heartbeat: Heartbeat | None = None
        self.cross_rank: CrossRank | None = None
        self.warnings = warnings or Warnings()
        self._lock = threading.RLock()
        self._callbacks: list[_OpenCallback] = []
        self._closed = False

    @property
    def closed(self) -> bool:
        """Shut down, or a forked copy: the phase API records nothing more."""
        return self._closed

    @closed.setter
    def closed(self, value: bool) -> None:
        self._closed = value
        if self.engine is not None:
            self.engine.closed = value

    # --- reporting ---------------------------------------------------------------------------
    def warn_once(self, kind: str, message: str, *args: object) -> None:
        self.warnings.warn_once(kind, message, *args)

    # --- identity ----------------------------------------------------------------------------
    @property
    def resource(self) -> Resource:
        return self.pipeline.resource if self.pipeline is not None else Resource.get_empty()

    @property
    def output_file(self) -> Path | None:
        """The embedded default's file, if the file exporter is in use."""
        return self.pipeline.output_file() if self.pipeline is not None else None

    @property
    def meter_provider(self) -> metrics_api.MeterProvider | None:
        return self.pipeline.meter_provider if self.pipeline is not None else None

    # --- configuration events ------------------------------------------------------------------
    def initialization_event(self, span: Span) -> None:
        """``telemetry_initialization`` on the application span: configuration and what it allows."""
        try:
            span.add_event(semconv.Event.TELEMETRY_INITIALIZATION.value, self.config_attributes())
        except Exception:
            self.warn_once("init_event", "could not record telemetry_initialization")

    def config_attributes(self) -> dict[str, AttributeValue]:
        enabled, disabled = capability_report(self.config)
        attributes: dict[str, AttributeValue] = {
            semconv.TRAINTEL_VERSION: __version__,
            semconv.METRICS_ENABLED: enabled,
            semconv.METRICS_DISABLED: disabled,
        }
        for key, value in self.config.describe().items():
            attributes[semconv.CONFIG_PREFIX + key] = value
        if self.pipeline is not None:
            # none built: "none" where traintel built the provider (the signal is off), else the user's
            pipeline = self.pipeline
            attributes[semconv.TRACES_EXPORTERS] = pipeline.trace_exporters or [
                "none" if pipeline.owns_tracer_provider else "(user provider)"
            ]
            attributes[semconv.METRICS_EXPORTERS] = pipeline.metric_exporters or [
                "none" if pipeline.owns_meter_provider else "(user provider)"
            ]
            output = self.output_file
            if output is not None:
                attributes[semconv.OUTPUT_FILE] = str(output)
        return attributes

    def update_config(self, **changes: object) -> None:
        """Apply ``set_training_config``; the application span gets a ``training_config_update``."""
        new_config = self.config.updated(**changes)  # raises before anything changes
        self.config = new_config
        if self.engine is not None:
            self.engine.apply_config(new_config)
        app: Span | None = self.engine.app if self.engine is not None else None
        if app is None:
            app = self.find_open_phase(semconv.Phase.APPLICATION)
        if app is not None:
            try:
                app.add_event(semconv.Event.TRAINING_CONFIG_UPDATE.value, self.config_attributes())
            except Exception:
                self.warn_once("config_event", "could not record training_config_update")

    def find_open_phase(self, phase: str) -> Span | None:
        """The open span of ``phase`` enclosing the current context, if any."""
        if self.open_spans is None:
            return None
        current = trace_api.get_current_span()
        found = self.open_spans.enclosing(current.get_span_context().span_id, (phase,))
        if found is not None:
            return found
        return self.callback_span(phase)

    # --- callbacks: pair by identity, idempotent, closed in order -----------------------------
    def callback_start(self, key: str, template: PhaseTemplate, start_time: int | None = None) -> Span:
        engine = self.engine
        if engine is None or engine.closed:
            return trace_api.INVALID_SPAN
        with self._lock:
            for entry in self._callbacks:
                if entry.key == key:
                    self.warn_once(
                        f"double_start:{key}", "start callback for %r fired twice; ignoring the second", key
                    )
                    return entry.span
            span = template._open(engine, start_time)
            self._callbacks.append(_OpenCallback(key, span, template))
            return span

    def callback_span(self, key: str) -> Span | None:
        with self._lock:
            for entry in reversed(self._callbacks):
                if entry.key == key:
                    return entry.span
        return None

    def callback_end(self, key: str, end_time: int | None = None, exc: BaseException | None = None) -> None:
        engine = self.engine
        if engine is None:
            return
        with self._lock:
            index = next(
                (i for i in range(len(self._callbacks) - 1, -1, -1) if self._callbacks[i].key == key), None
            )
            if index is None:
                self.warn_once(
                    f"end_without_start:{key}", "end callback for %r without a matching start; ignored", key
                )
                return
            above = self._callbacks[index + 1 :]
            if above:
                self.warn_once(
                    f"out_of_order:{key}",
                    "%r ended while %s still open; closing those first",
                    key,
                    [e.key for e in above],
                )
            for entry in reversed(above):
                entry.template._close(engine, None, None, f"parent {key} ended first")
            self._callbacks[index].template._close(engine, exc, end_time)
            del self._callbacks[index:]

    def close_open_callbacks(self, reason: str) -> None:
        """End every callback-opened span, innermost first (at exit or reconfiguration)."""
        with self._lock:
            entries, self._callbacks = self._callbacks, []
        engine = self.engine
        if engine is None:
            return
        for entry in reversed(entries):
            try:
                entry.template._close(engine, None, None, reason)
            except Exception:
                self.warn_once("close_callback", "could not close %r", entry.key)

    # --- lifecycle ---------------------------------------------------------------------------
    def flush(self, timeout_s: float = 5.0) -> bool:
        """Export what is buffered now (bounded; never raises)."""
        return self.pipeline.flush(timeout_s) if self.pipeline is not None else True

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """End open callback spans, flush and release owned providers within the bound."""
        if self.closed:
            return True
        self.close_open_callbacks("telemetry shutdown")
        self.closed = True
        if self.pipeline is None:
            return True
        timeout = float(self.config.get("shutdown_timeout")) if timeout_s is None else timeout_s
        if self.cross_rank is not None:
            self.cross_rank.close()
        ok = self.pipeline.shutdown(timeout)
        if self.processor is not None:
            self.processor.disable()
        self._say_unrecorded_measurements()
        say_farewell(
            self.output_file, self.pipeline.trace_exporters, self.resource.attributes.get(semconv.RANK)
        )
        return ok

    def _say_unrecorded_measurements(self) -> None:
        """Per-iteration values the metric reader did not collect in time are counted
        (``traintel.measurements.dropped``); the exit says so too: a silent loss is a bug."""
        instruments = self.engine.instruments if self.engine is not None else None
        dropped = instruments.dropped if instruments is not None else 0
        if dropped:
            _logger.warning(
                "traintel: %d per-iteration measurement(s) were not recorded into the iteration-"
                "time histograms: the metric reader collected less often than %d values "
                "accumulated, and no exporter traintel built was there to add the rest (a "
                "reader of your own: collect more often); window statistics, spans and the "
                "report are complete",
                dropped,
                DEFERRED_CAPACITY,
            )


# --- the process-wide instance ----------------------------------------------------------------
_telemetry: Telemetry | None = None
#: The job an explicit shutdown() is closing: no longer current, still reported until it is shut.
_closing: Telemetry | None = None
_lock = threading.RLock()
_atexit_registered = False
#: How to configure from the environment on first use (registered by ``bootstrap``).
_auto_configure: Callable[[], Telemetry] | None = None
#: An explicit configure() deferred from a spawn child's bootstrap (see ``defer_configure``).
_deferred: Callable[[], Telemetry] | None = None


def set_auto_configure(configure: Callable[[], Telemetry]) -> None:
    global _auto_configure
    _auto_configure = configure
    active.on_first_use(lambda: current().engine)


def current() -> Telemetry:
    """The configured telemetry, auto-configuring from the environment on first use."""
    telemetry = _telemetry
    if telemetry is not None:
        return telemetry
    with _lock:
        if _telemetry is not None:
            return _telemetry
        if in_dataloader_worker() or _auto_configure is None:  # workers import traintel afresh
            return set_current(Telemetry(TrainingConfig()))
        global _deferred
        deferred, _deferred = _deferred, None
        try:
            return (deferred or _auto_configure)()
        except Exception:
            _logger.exception("traintel: auto-configuration failed; telemetry is off for this process")
            return set_current(Telemetry(TrainingConfig()))


def importing_main_in_child() -> bool:
    """True while a spawn or forkserver child imports the parent's main module (multiprocessing
    marks its bootstrap with ``_inheriting``): a ``configure()`` at module level runs then in
    every DataLoader worker, which must not export (48,128 spans from two workers, once)."""
    process = sys.modules.get("multiprocessing.process")
    return bool(process is not None and getattr(process.current_process(), "_inheriting", False))


def defer_configure(configure: Callable[[], Telemetry]) -> None:
    """A ``configure()`` made while importing the main module in a child: applied at the
    child's first use of traintel, unless that is in a DataLoader worker (a process started
    to train, as ``torch.multiprocessing.spawn`` starts ranks, is configured as asked)."""
    global _deferred
    _deferred = configure


def configured() -> Telemetry | None:
    return _telemetry


def running() -> Telemetry | None:
    """The job being reported: the current one, or the one an explicit shutdown is closing (its
    final metric export still reports it)."""
    return _telemetry or _closing


def set_current(telemetry: Telemetry) -> Telemetry:
    global _telemetry, _atexit_registered
    _telemetry = telemetry
    active.set_engine(telemetry.engine)
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(_at_exit)
    return telemetry


def in_dataloader_worker() -> bool:
    """True inside a ``torch.utils.data`` worker process (without importing torch).

    Workers do not record by default: their spans would be exported by N extra processes under
    the job's identity, and the time the training loop waits for a batch - what data loading
    costs training - is measured in the main process by ``data_loading``.
    """
    worker = sys.modules.get("torch.utils.data._utils.worker")
    try:
        return worker is not None and worker.get_worker_info() is not None
    except Exception:
        return False


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker, say) stops recording into the parent's copy.

    Its exporters are process-bound (``traintel.exporters.process_bound``), so nothing it holds
    is sent twice; closing it also makes the API a no-op there and skips any flush at exit.
    """
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork
    telemetry = _telemetry
    if telemetry is not None:
        telemetry.closed = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _at_exit() -> None:
    telemetry = _telemetry
    if telemetry is not None:
        try:
            telemetry.shutdown()
        except Exception:
            _logger.exception("traintel: shutdown at exit failed")


def shutdown(timeout_s: float | None = None) -> bool:
    """Flush and stop telemetry now (bounded); the next API call auto-configures afresh."""
    global _telemetry, _closing
    with _lock:
        telemetry, _telemetry = _telemetry, None
        active.reset()
        forget_model()  # the next job's MFU divisor does not inherit this one's model dtype
    if telemetry is None:
        return True
    _closing = telemetry
    try:
        return telemetry.shutdown(timeout_s)
    finally:
        _closing = None
