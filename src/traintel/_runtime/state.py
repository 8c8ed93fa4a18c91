"""The running job's handle: its configuration, pipeline, engine and the phases callbacks
keep open (what :func:`traintel.configure` returns).

Why one object: the API is module-level functions and context managers (as in the reference
library), so something must hold what they record into. It is built by ``bootstrap.py`` and
held by the registry (``traintel._recorder.active``); the functions at the end hand it out as
a :class:`Telemetry`. Everything that can fail here is caught and reported once; nothing
escapes into the training loop.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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
from traintel._recorder.phases import PhaseSpan, end_open_phases
from traintel._runtime.farewell import farewell, say
from traintel._sdk.open_spans import OpenSpans
from traintel._sdk.processor import TrainingMetricsProcessor
from traintel.config import TrainingConfig
from traintel.distributed.collectives import unwatch_torch_collectives
from traintel.exporters.health import HEALTH, NOT_WRITTEN
from traintel.version import __version__

if TYPE_CHECKING:
    from traintel._host.heartbeat import Heartbeat
    from traintel._host.stall import StallWatcher
    from traintel._runtime.pipeline import Pipeline
    from traintel._runtime.progress import ProgressMarks
    from traintel._runtime.window_pipeline import WindowPipeline
    from traintel.distributed.cross_rank import CrossRank

_logger = logging.getLogger("traintel")


@dataclass
class _OpenCallback:
    key: str
    span: Span
    template: PhaseSpan


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
        windows: WindowPipeline | None = None,
    ) -> None:
        self.config = config
        self.settings = config.resolve()
        self.pipeline = pipeline
        self.windows = windows
        self.engine = engine
        self.processor = processor
        self.open_spans = open_spans
        self.enabled = pipeline is not None and engine is not None
        self.tracer: trace_api.Tracer = engine.tracer if engine is not None else trace_api.NoOpTracer()
        self.heartbeat: Heartbeat | None = None
        self.progress: ProgressMarks | None = None  # the embedded file's progress mark
        self.cross_rank: CrossRank | None = None
        self.stall_watcher: StallWatcher | None = None
        self.warn_once = (warnings or Warnings()).warn_once  # the job's parts say theirs through it too
        self._lock = threading.RLock()
        self._callbacks: list[_OpenCallback] = []
        self._closed = False
        self._shutting_down_on: int | None = None  # the thread running shutdown(), meanwhile
        self._signal_after_shutdown: int | None = None

    @property
    def closed(self) -> bool:
        """Shut down, or a forked copy: the phase API records nothing more."""
        return self._closed

    @closed.setter
    def closed(self, value: bool) -> None:
        self._closed = value
        if self.engine is not None:
            self.engine.closed = value

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
    def config_event(self, span: Span, event: semconv.Event) -> None:
        """``telemetry_initialization`` or ``training_config_update`` on the application span:
        the configuration and what it allows."""
        try:
            span.add_event(event.value, self.config_attributes())
        except Exception:
            self.warn_once(event.value, "could not record %s", event.value)

    def config_attributes(self) -> dict[str, AttributeValue]:
        settings = self.engine.settings if self.engine is not None else self.settings
        enabled, disabled = capability_report(settings)
        attributes: dict[str, AttributeValue] = {
            semconv.TRAINTEL_VERSION: __version__,
            semconv.METRICS_ENABLED: enabled,
            semconv.METRICS_DISABLED: disabled,
        }
        for key, value in self.config.describe(settings).items():
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
        """Apply ``set_training_config``; the application span gets a ``training_config_update``
        (without one, the training loop's)."""
        new_config = self.config.updated(**changes)  # raises before anything changes
        self.config = new_config
        self.settings = new_config.resolve()
        engine = self.engine
        if engine is not None:
            engine.apply_config(new_config)
        app: Span | None = engine.app if engine is not None else None
        if app is None:
            app = self.find_open_phase(semconv.Phase.APPLICATION) or (
                engine.loop if engine is not None else None
            )
        if app is not None:
            self.config_event(app, semconv.Event.TRAINING_CONFIG_UPDATE)

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
    def callback_start(self, key: str, template: PhaseSpan, start_time: int | None = None) -> Span:
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
        """Export what is buffered now, the windows closed so far first (bounded; never raises)."""
        if self.pipeline is None:
            return True
        deadline = time.monotonic() + timeout_s
        windows = self.windows is None or self.windows.flush(timeout_s)
        flushed = self.pipeline.flush(max(0.0, deadline - time.monotonic())) and windows
        if self.progress is not None:
            self.progress.mark()
        return flushed

    @property
    def shutting_down(self) -> bool:
        """A thread is running :meth:`shutdown` (bounded)."""
        return self._shutting_down_on is not None

    def defer_signal(self, signum: int) -> bool:
        """A terminating signal while this thread shuts the job down (a multiprocessing worker
        exits by itself as its parent's ``terminate()`` signals it): the shutdown finishes, then
        the signal is raised again, and ends the process as it would have. Ended at once, the
        worker lost every span its file had not written yet."""
        if self._shutting_down_on != threading.get_ident():
            return False
        self._signal_after_shutdown = signum
        return True

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """End open callback spans, flush and release owned providers within the bound."""
        if self.closed:
            return True
        self._shutting_down_on = threading.get_ident()
        try:
            return self._shutdown(timeout_s)
        finally:
            self._shutting_down_on = None
            signum, self._signal_after_shutdown = self._signal_after_shutdown, None
            if signum is not None:
                signal.raise_signal(signum)

    def _shutdown(self, timeout_s: float | None) -> bool:
        self._end_open_phases("telemetry shutdown")
        self._close_last_window()
        self.closed = True
        if self.progress is not None:
            self.progress.stop()
        if self.pipeline is None:
            return True
        timeout = self.settings.shutdown_timeout if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        windows = self.windows is None or self.windows.close(timeout)  # their records go out too
        self._stop_watchers(deadline)
        ok = self.pipeline.shutdown(max(0.0, deadline - time.monotonic())) and windows
        if self.processor is not None:
            self.processor.shutdown()
        self._say_farewell(self.pipeline)
        forget_model()  # the next job's MFU divisor does not inherit this one's model dtype
        return ok

    def _say_farewell(self, pipeline: Pipeline) -> None:
        """The job's last line: where its telemetry went, and what reads it."""
        health = HEALTH.snapshot()  # spans kept in the spool, or lost (no spool): not all sent
        spooled = health.spool_batches > 0 or any(health.spans_dropped.values())
        output = pipeline.run_file()
        failed = health.spans_dropped.get(NOT_WRITTEN, 0) or health.metric_lines_not_written
        unwritten = bool(failed) and output is not None and not output.is_file()
        rank = self.resource.attributes.get(semconv.RANK)
        say(farewell(output, pipeline.trace_exporters, rank, spooled=spooled, unwritten=unwritten))

    def _end_open_phases(self, reason: str) -> None:
        """Callbacks' phases, then those of ``with`` blocks the shutdown is called inside."""
        self.close_open_callbacks(reason)
        if self.engine is not None:
            end_open_phases(self.engine, reason)

    def _close_last_window(self) -> None:
        """The open window's iterations, closed as a loop's end would (see the engine's
        ``shutting_down``)."""
        try:
            if self.engine is not None:
                self.engine.shutting_down()
        except Exception:
            self.warn_once("last_window", "could not close the last window at shutdown")

    def _stop_watchers(self, deadline: float) -> None:
        if self.cross_rank is not None:
            self.cross_rank.close()
        if self.stall_watcher is not None:  # before the logs pipeline it writes to shuts down
            self.stall_watcher.stop(min(2.0, max(0.0, deadline - time.monotonic())))
        unwatch_torch_collectives()


# --- the running job, as a Telemetry (the registry is ``traintel._recorder.active``) -----------
def current() -> Telemetry:
    """The configured telemetry, auto-configuring from the environment on first use."""
    found = active.current()
    return found if isinstance(found, Telemetry) else Telemetry(TrainingConfig())


def importing_main_in_child() -> bool:
    """True while a spawn or forkserver child imports the parent's main module (multiprocessing
    marks its bootstrap with ``_inheriting``): a ``configure()`` at module level runs then in
    every DataLoader worker, which must not export (48,128 spans from two workers, once)."""
    process = sys.modules.get("multiprocessing.process")
    return bool(process is not None and getattr(process.current_process(), "_inheriting", False))


def configured() -> Telemetry | None:
    found = active.job
    return found if isinstance(found, Telemetry) else None


def running() -> Telemetry | None:
    """The job being reported: the current one, or the one an explicit shutdown is closing (its
    final metric export still reports it)."""
    found = active.job or active.closing
    return found if isinstance(found, Telemetry) else None


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
