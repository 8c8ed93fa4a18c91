"""The process-wide telemetry state: configuration, providers, tracer, engine, open callbacks.

Why one object: the API is module-level functions and context managers (as in the reference
library), so something must hold the tracer and the training config they use. Everything
that can fail here is caught and reported once; nothing escapes into the training loop.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._aggregation.export_policy import RankExportPolicy
from traintel._host.capabilities import capability_report
from traintel._host.gpu import GpuInstruments
from traintel._host.heartbeat import Heartbeat, HeartbeatInstruments
from traintel._host.system_metrics import SystemInstruments
from traintel._recorder.engine import TrainingEngine
from traintel._sdk.export_filter import TraceBudget
from traintel._sdk.ids import ForcingIdGenerator
from traintel._sdk.instruments import TrainingInstruments
from traintel._sdk.processor import TrainingMetricsProcessor
from traintel._sdk.providers import Pipeline, build_pipeline
from traintel.config import TrainingConfig
from traintel.distributed.cross_rank import CrossRank, CrossRankInstruments
from traintel.exporters.health import register_instruments
from traintel.version import __version__

_logger = logging.getLogger("traintel")


def sdk_disabled(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


class PhaseTemplate(Protocol):
    """What the callbacks drive: a phase context manager's open/close protocol."""

    _name: str

    def _open(self, telemetry: Telemetry, start_ns: int | None = None) -> Span: ...

    def _close(
        self,
        telemetry: Telemetry,
        exc: BaseException | None,
        end_ns: int | None = None,
        reason: str | None = None,
    ) -> None: ...


@dataclass
class _OpenCallback:
    key: str
    span: Span
    template: PhaseTemplate


class Telemetry:
    """traintel's live state for this process. Get it from :func:`traintel.configure`."""

    def __init__(
        self,
        config: TrainingConfig,
        pipeline: Pipeline | None,
        processor: TrainingMetricsProcessor | None,
        engine: TrainingEngine | None = None,
        tracer: trace_api.Tracer | None = None,
    ) -> None:
        self.config = config
        self.pipeline = pipeline
        self.processor = processor
        self.engine = engine
        self.enabled = pipeline is not None
        self.tracer: trace_api.Tracer = tracer if tracer is not None else trace_api.NoOpTracer()
        self._warned: set[str] = set()
        self._lock = threading.RLock()
        self._callbacks: list[_OpenCallback] = []
        # Iteration numbering: the training loop sets the start, each iteration takes the next.
        self.next_train_iteration = 0
        self.next_eval_iteration: dict[str, int] = {}
        # Loops opened through traintel's API and not yet closed, by phase name.
        self.open_loops: dict[str, int] = {}
        self.closed = False
        self.heartbeat: Heartbeat | None = None
        self.cross_rank: CrossRank | None = None

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
            if exc is not None:
                span.record_exception(exc, timestamp=end_time, escaped=True)
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
        if self.processor is None:
            return None
        current = trace_api.get_current_span()
        found = self.processor.enclosing(current.get_span_context().span_id, (phase,))
        if found is not None:
            return found
        return self.callback_span(phase)

    # --- callbacks: pair by identity, idempotent, closed in order -----------------------------
    def callback_start(self, key: str, template: PhaseTemplate, start_time: int | None = None) -> Span:
        with self._lock:
            for entry in self._callbacks:
                if entry.key == key:
                    self.warn_once(
                        f"double_start:{key}", "start callback for %r fired twice; ignoring the second", key
                    )
                    return entry.span
            span = template._open(self, start_time)
            self._callbacks.append(_OpenCallback(key, span, template))
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
                entry.template._close(self, None, None, f"parent {key} ended first")
            self._callbacks[index].template._close(self, exc, end_time)
            del self._callbacks[index:]

    def close_open_callbacks(self, reason: str) -> None:
        """End every callback-opened span, innermost first (at exit or reconfiguration)."""
        with self._lock:
            entries, self._callbacks = self._callbacks, []
        for entry in reversed(entries):
            try:
                entry.template._close(self, None, None, reason)
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
        return ok


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
        if in_dataloader_worker():  # spawn/forkserver workers import traintel afresh
            return _install_disabled(TrainingConfig())
        try:
            return _install(TrainingConfig.from_env(strict=False), strict=False)
        except Exception:
            _logger.exception("traintel: auto-configuration failed; telemetry is off for this process")
            return _install_disabled(TrainingConfig())


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
    global _state_lock
    _state_lock = threading.RLock()  # another thread may have held it at the fork
    telemetry = _telemetry
    if telemetry is not None:
        telemetry.closed = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def configured() -> Telemetry | None:
    return _telemetry


def configure(
    *,
    tracer_provider: trace_api.TracerProvider | None = None,
    meter_provider: metrics_api.MeterProvider | None = None,
    service_name: str | None = None,
    training: Mapping[str, object] | None = None,
    span_exporters: Sequence[SpanExporter] | None = None,
    metric_readers: Sequence[MetricReader] | None = None,
) -> Telemetry:
    """Explicit configuration: validates everything first and raises ConfigurationError."""
    config = TrainingConfig.from_env(overrides=training, strict=True)
    with _state_lock:
        previous = _telemetry
        if previous is not None:
            reuse = (
                tracer_provider is None
                and meter_provider is None
                and span_exporters is None
                and metric_readers is None
                and previous.pipeline is not None
            )
            if reuse:
                previous.close_open_callbacks("traintel reconfigured")
                previous.update_config(**{k: v for k, v in (training or {}).items()})
                return previous
            previous.shutdown()
        return _install(
            config,
            strict=True,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            service_name=service_name,
            span_exporters=span_exporters,
            metric_readers=metric_readers,
        )


def _tracer_for(pipeline: Pipeline) -> tuple[trace_api.Tracer, ForcingIdGenerator | None]:
    """Our tracer, with an id generator we can steer (see ``traintel._ids``).

    Only our own tracer's generator is wrapped (delegating to the provider's): other tracers of
    a user's provider are untouched. The wrapper is reused if the provider handed out the same
    tracer before (it caches tracers by scope).
    """
    provider = pipeline.tracer_provider
    tracer = provider.get_tracer(semconv.INSTRUMENTATION_SCOPE, __version__)
    generator = getattr(tracer, "id_generator", None)
    if isinstance(generator, ForcingIdGenerator):
        return tracer, generator
    if generator is None:
        return tracer, None
    ids = ForcingIdGenerator(generator)
    tracer.id_generator = ids  # type: ignore[attr-defined]
    return tracer, ids


def _world_size(resource: Resource) -> int:
    value = resource.attributes.get(semconv.WORLD_SIZE)
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except (TypeError, ValueError):
        from traintel.resource_detectors import distributed_identity

        return distributed_identity()[2]


def _rank(resource: Resource) -> int:
    """The Resource's rank; a user's provider without one: the launcher's (as _world_size)."""
    value = resource.attributes.get(semconv.RANK)
    if value is None:
        from traintel.resource_detectors import distributed_identity

        return distributed_identity()[0]
    try:
        return int(str(value))
    except ValueError:
        return -1


def _decide_rank_export(engine: TrainingEngine, config: TrainingConfig, resource: Resource) -> None:
    """Scale mode from the Resource's rank and world size when the launcher gave them (torchrun,
    Slurm): decided before the first iteration, so a reduced rank exports none of its routine
    telemetry. Otherwise the first window boundary decides (CrossRank)."""
    world = _world_size(resource)
    rank = _rank(resource)
    if world > 1 and 0 <= rank < world:
        threshold = int(config.get("cross_rank_scale_world_size"))
        engine.set_rank_export(RankExportPolicy.decide(rank, world, threshold))


def _install(
    config: TrainingConfig,
    *,
    strict: bool,
    tracer_provider: trace_api.TracerProvider | None = None,
    meter_provider: metrics_api.MeterProvider | None = None,
    service_name: str | None = None,
    span_exporters: Sequence[SpanExporter] | None = None,
    metric_readers: Sequence[MetricReader] | None = None,
) -> Telemetry:
    if sdk_disabled():
        return _install_disabled(config)
    pipeline = build_pipeline(
        config,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        service_name=service_name,
        strict=strict,
        span_exporters=span_exporters,
        metric_readers=metric_readers,
    )
    # In the user's pipeline there is no export filter: count the trace budget at on_end.
    budget = pipeline.export_filter._budget if pipeline.export_filter is not None else TraceBudget()
    tracer, ids = _tracer_for(pipeline)
    telemetry = Telemetry(config, pipeline, None, tracer=tracer)
    engine = TrainingEngine(
        config,
        tracer,
        ids,
        pipeline.export_filter,
        budget,
        None,
        _world_size(pipeline.resource),
        telemetry.warn_once,
    )
    # The instruments read the engine's last window and totals when a reader collects.
    engine.instruments = instruments = TrainingInstruments(
        pipeline.meter_provider,
        last_window=lambda: engine.aggregator.last_window,
        totals=lambda: (engine.samples_total, engine.tokens_total),
        goodput=lambda: engine.goodput.snapshot(time.time_ns()),
        step_time=lambda: (engine.goodput.ideal_step_time_s, engine.goodput.last_window),
        iterations=lambda: engine.aggregator.iterations_seen,
    )
    processor = TrainingMetricsProcessor(
        instruments, budget=None if pipeline.export_filter is not None else budget
    )
    processor.engine = engine
    processor.on_error = lambda kind: telemetry.warn_once(kind, "could not aggregate a %s", kind)
    pipeline.add_span_processor(processor)
    # Sampled by the metric reader's thread only: hang localisation and process/device gauges.
    telemetry.heartbeat = Heartbeat(engine, processor)
    HeartbeatInstruments(pipeline.meter_provider, _current_heartbeat)
    # Cross-rank statistics: the exchange starts at a window end once torch.distributed is up.
    global _last_cross_rank
    telemetry.cross_rank = _last_cross_rank = cross_rank = CrossRank(engine)
    engine.window_hook = cross_rank.window_closed
    cross_rank.count_straggler = CrossRankInstruments(pipeline.meter_provider, _current_cross_rank).count
    _decide_rank_export(engine, config, pipeline.resource)
    SystemInstruments(pipeline.meter_provider)
    GpuInstruments(pipeline.meter_provider)
    if pipeline.owns_tracer_provider:  # traintel's own export path: its losses and health
        register_instruments(pipeline.meter_provider)
    telemetry.processor = processor
    telemetry.engine = engine
    _set(telemetry)
    from traintel._runtime import preemption

    preemption.install()
    return telemetry


#: The job an explicit shutdown() is closing: no longer current, still reported until it is shut.
_closing: Telemetry | None = None


def _current_heartbeat() -> Heartbeat | None:
    """The running job's heartbeat (the gauges outlive a reconfiguration; see HeartbeatInstruments)."""
    # closed, or being shut down, it still reports its last state in the final export
    telemetry = _telemetry or _closing
    return None if telemetry is None else telemetry.heartbeat


_last_cross_rank: CrossRank | None = None


def _current_cross_rank() -> CrossRank | None:
    """The job installed last: after an explicit shutdown() its final export still reports it."""
    return _last_cross_rank


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
    global _telemetry, _closing
    with _state_lock:
        telemetry, _telemetry = _telemetry, None
    if telemetry is None:
        return True
    _closing = telemetry  # its final metric export still reports the job (_current_heartbeat)
    try:
        return telemetry.shutdown(timeout_s)
    finally:
        _closing = None
