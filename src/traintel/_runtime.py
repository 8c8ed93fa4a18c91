"""The process-wide telemetry state: configuration, providers, tracer, open callback phases.

Why one object: the API is module-level functions and context managers (as in the reference
library), so something must hold the tracer and the training config they use. Everything
that can fail here is caught and reported once; nothing escapes into the training loop.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import context as context_api
from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel.capabilities import capability_report
from traintel.config import TrainingConfig
from traintel.processor.live_spans import LiveSpanProcessor
from traintel.providers import Pipeline, build_pipeline
from traintel.version import __version__

_logger = logging.getLogger("traintel")


def sdk_disabled(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


@dataclass
class _OpenCallback:
    key: str
    span: Span
    token: object | None
    thread_id: int
    template: PhaseTemplate | None = None


class PhaseTemplate(Protocol):
    """What the callbacks need from a phase context manager: its name and hooks."""

    _name: str

    def _start_attributes(self, telemetry: Telemetry) -> Mapping[str, AttributeValue] | None: ...

    def _before_end(self, telemetry: Telemetry, span: Span) -> None: ...


class Telemetry:
    """traintel's live state for this process. Get it from :func:`traintel.configure`."""

    def __init__(
        self,
        config: TrainingConfig,
        pipeline: Pipeline | None,
        processor: LiveSpanProcessor | None,
    ) -> None:
        self.config = config
        self.pipeline = pipeline
        self.processor = processor
        self.enabled = pipeline is not None
        self.tracer: trace_api.Tracer = (
            pipeline.tracer_provider.get_tracer(semconv.INSTRUMENTATION_SCOPE, __version__)
            if pipeline is not None
            else trace_api.NoOpTracer()
        )
        self._warned: set[str] = set()
        self._lock = threading.RLock()
        self._callbacks: list[_OpenCallback] = []
        # Iteration numbering: the training loop sets the start, each iteration takes the next.
        self.next_train_iteration = 0
        self.next_eval_iteration: dict[str, int] = {}
        # Loops opened through traintel's API and not yet closed, by phase name.
        self.open_loops: dict[str, int] = {}
        self.closed = False

    # --- reporting ---------------------------------------------------------------------------
    def warn_once(self, kind: str, message: str, *args: object) -> None:
        """One warning per kind of misuse: a loop that misuses an API a million times must
        not produce a million log lines."""
        if kind in self._warned:
            return
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        _logger.warning("traintel: " + message + " (reported once)", *args)

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

    # --- spans -------------------------------------------------------------------------------
    def start_span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None,
        start_time: int | None = None,
    ) -> Span:
        if not self.enabled or self.closed:
            return trace_api.INVALID_SPAN
        try:
            return self.tracer.start_span(name, attributes=attributes, start_time=start_time)
        except Exception:
            self.warn_once("start_span", "could not start span %r", name)
            return trace_api.INVALID_SPAN

    def end_span(
        self,
        span: Span,
        exc: BaseException | None = None,
        end_time: int | None = None,
        end_reason: str | None = None,
    ) -> None:
        try:
            if exc is not None and not _is_clean_exit(exc):
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            if end_reason is not None:
                span.set_attribute(semconv.END_REASON, end_reason)
            span.end(end_time=end_time)
        except Exception:
            self.warn_once("end_span", "could not end a span")

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
            attributes[semconv.TRACES_EXPORTERS] = self.pipeline.trace_exporters or ["(user provider)"]
            attributes[semconv.METRICS_EXPORTERS] = self.pipeline.metric_exporters or ["(user provider)"]
            output = self.output_file
            if output is not None:
                attributes[semconv.OUTPUT_FILE] = str(output)
        return attributes

    def update_config(self, **changes: object) -> None:
        """Apply ``set_training_config``; the application span gets a ``training_config_update``."""
        new_config = self.config.updated(**changes)  # raises before anything changes
        self.config = new_config
        if self.processor is None:
            return
        app = self.find_open_phase(semconv.Phase.APPLICATION)
        if app is not None:
            try:
                app.add_event(semconv.Event.TRAINING_CONFIG_UPDATE.value, self.config_attributes())
            except Exception:
                self.warn_once("config_event", "could not record training_config_update")

    def find_open_phase(self, phase: str) -> Span | None:
        """The open span of ``phase`` enclosing the current context, if any."""
        if self.processor is None:
            return None
        current = trace_api.get_current_span()
        found = self.processor.enclosing(current.get_span_context().span_id, (phase,))
        if found is not None:
            return found
        for entry in reversed(self._callbacks):  # a callback-opened phase in another context
            if entry.key == phase:
                return entry.span
        return None

    # --- callbacks: pair by identity, idempotent, closed in order -----------------------------
    def callback_start(self, key: str, template: PhaseTemplate, start_time: int | None = None) -> Span:
        with self._lock:
            for entry in self._callbacks:
                if entry.key == key:
                    self.warn_once(
                        f"double_start:{key}", "start callback for %r fired twice; ignoring the second", key
                    )
                    return entry.span
            span = self.start_span(template._name, template._start_attributes(self), start_time)
            token: object | None = None
            if span.is_recording():
                try:
                    token = context_api.attach(trace_api.set_span_in_context(span))
                except Exception:
                    token = None
            self._callbacks.append(_OpenCallback(key, span, token, threading.get_ident(), template))
            return span

    def callback_span(self, key: str) -> Span | None:
        with self._lock:
            for entry in reversed(self._callbacks):
                if entry.key == key:
                    return entry.span
        return None

    def callback_end(self, key: str, end_time: int | None = None, exc: BaseException | None = None) -> None:
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
                self._close_callback(entry, None, f"parent {key} ended first")
            self._close_callback(self._callbacks[index], end_time, None, exc)
            del self._callbacks[index:]

    def _close_callback(
        self, entry: _OpenCallback, end_time: int | None, reason: str | None, exc: BaseException | None = None
    ) -> None:
        if entry.template is not None:
            try:
                entry.template._before_end(self, entry.span)
            except Exception:
                self.warn_once("before_end:" + entry.key, "could not finish attributes of %r", entry.key)
        if entry.token is not None:
            if entry.thread_id == threading.get_ident():
                try:
                    context_api.detach(entry.token)  # type: ignore[arg-type]
                except Exception:
                    pass
            else:
                self.warn_once(
                    f"cross_thread:{entry.key}",
                    "%r was started and ended on different threads; its span is ended, the starting "
                    "thread's context is left as it is",
                    entry.key,
                )
        self.end_span(entry.span, exc=exc, end_time=end_time, end_reason=reason)

    def close_open_callbacks(self, reason: str) -> None:
        """End every callback-opened span, innermost first (at exit or reconfiguration)."""
        with self._lock:
            entries, self._callbacks = self._callbacks, []
        for entry in reversed(entries):
            self._close_callback(entry, None, reason)

    # --- lifecycle ---------------------------------------------------------------------------
    def shutdown(self, timeout_s: float | None = None) -> bool:
        """End open callback spans, flush and release owned providers within the bound."""
        if self.closed:
            return True
        self.close_open_callbacks("telemetry shutdown")
        self.closed = True
        if self.pipeline is None:
            return True
        timeout = float(self.config.get("shutdown_timeout")) if timeout_s is None else timeout_s
        ok = self.pipeline.shutdown(timeout)
        if self.processor is not None:
            self.processor.disable()
        return ok


def _is_clean_exit(exc: BaseException) -> bool:
    return isinstance(exc, SystemExit) and exc.code in (0, None)


# --- the process-wide instance ----------------------------------------------------------------
_telemetry: Telemetry | None = None
_state_lock = threading.RLock()
_atexit_registered = False


def current() -> Telemetry:
    """The configured telemetry, auto-configuring from the environment on first use."""
    telemetry = _telemetry
    if telemetry is not None:
        return telemetry
    with _state_lock:
        if _telemetry is not None:
            return _telemetry
        try:
            return _install(TrainingConfig.from_env(strict=False), strict=False)
        except Exception:
            _logger.exception("traintel: auto-configuration failed; telemetry is off for this process")
            return _install_disabled(TrainingConfig())


def configured() -> Telemetry | None:
    return _telemetry


def configure(
    *,
    tracer_provider: trace_api.TracerProvider | None = None,
    meter_provider: metrics_api.MeterProvider | None = None,
    service_name: str | None = None,
    training: Mapping[str, object] | None = None,
) -> Telemetry:
    """Explicit configuration: validates everything first and raises ConfigurationError."""
    config = TrainingConfig.from_env(overrides=training, strict=True)
    with _state_lock:
        previous = _telemetry
        if previous is not None:
            reuse = tracer_provider is None and meter_provider is None and previous.pipeline is not None
            if reuse:
                previous.close_open_callbacks("traintel reconfigured")
                telemetry = Telemetry(config, previous.pipeline, previous.processor)
                _set(telemetry)
                return telemetry
            previous.shutdown()
        return _install(
            config,
            strict=True,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            service_name=service_name,
        )


def _install(
    config: TrainingConfig,
    *,
    strict: bool,
    tracer_provider: trace_api.TracerProvider | None = None,
    meter_provider: metrics_api.MeterProvider | None = None,
    service_name: str | None = None,
) -> Telemetry:
    if sdk_disabled():
        return _install_disabled(config)
    pipeline = build_pipeline(
        config,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        service_name=service_name,
        strict=strict,
    )
    # Added after the pipeline exists because its duration histogram needs the final meter
    # provider, which build_pipeline may have just created.
    processor = LiveSpanProcessor(pipeline.meter_provider)
    pipeline.add_span_processor(processor)
    telemetry = Telemetry(config, pipeline, processor)
    _set(telemetry)
    return telemetry


def _install_disabled(config: TrainingConfig) -> Telemetry:
    telemetry = Telemetry(config, None, None)
    _set(telemetry)
    return telemetry


def _set(telemetry: Telemetry) -> None:
    global _telemetry, _atexit_registered
    _telemetry = telemetry
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(_at_exit)


def _at_exit() -> None:
    telemetry = _telemetry
    if telemetry is not None:
        try:
            telemetry.shutdown()
        except Exception:
            _logger.exception("traintel: shutdown at exit failed")


def shutdown(timeout_s: float | None = None) -> bool:
    """Flush and stop telemetry now (bounded); the next API call auto-configures afresh."""
    global _telemetry
    with _state_lock:
        telemetry, _telemetry = _telemetry, None
    if telemetry is None:
        return True
    return telemetry.shutdown(timeout_s)


def attributes_of(values: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """Drop ``None`` values: OTel attributes have no null."""
    return {k: v for k, v in values.items() if v is not None}
