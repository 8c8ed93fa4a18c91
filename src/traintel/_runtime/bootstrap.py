"""Configuration: the one place where a job's telemetry is built and wired.

``install`` builds the pipeline (providers, export filter, exporters) from ``OTEL_*`` and the
arguments, then the engine, the span processor, the instruments, the heartbeat and the
cross-rank exchange, each given what it uses in its constructor, and makes the result current.
Explicit ``configure()`` validates everything first and raises ``ConfigurationError``; the
automatic configuration on first use reports a problem and records what it can. Either way a
configuration that fails is atomic: the new pipeline is built in full before the previous job
is shut down and before any global provider is set, so a failure leaves the process as it was.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Span

from traintel import semconv
from traintel._aggregation.aggregator import WindowReport
from traintel._aggregation.export_policy import RankExportPolicy
from traintel._aggregation.goodput import WindowGoodput
from traintel._host.energy import Booked, EnergyAccounting, EnergyInstruments
from traintel._host.gpu import GpuInstruments
from traintel._host.heartbeat import Heartbeat, HeartbeatInstruments
from traintel._host.system_metrics import SystemInstruments
from traintel._recorder.engine import EngineHooks, SpanOutlet, TrainingEngine
from traintel._runtime import preemption, state
from traintel._runtime.state import Telemetry, Warnings
from traintel._sdk.export_filter import TraceBudget
from traintel._sdk.ids import ForcingIdGenerator
from traintel._sdk.open_spans import OpenSpans
from traintel._sdk.otel_private import set_tracer_id_generator, tracer_id_generator
from traintel._sdk.processor import TrainingMetricsProcessor
from traintel._sdk.providers import Pipeline, build_pipeline
from traintel.config import ConfigurationError, TrainingConfig
from traintel.distributed.cross_rank import CrossRank, CrossRankInstruments
from traintel.exporters.health import register_instruments
from traintel.resource_detectors import distributed_identity
from traintel.version import __version__

_logger = logging.getLogger(__name__)

#: A pipeline built and not yet published (``None``: OTEL_SDK_DISABLED), and how to publish it.
_Prepared = tuple[Pipeline, Callable[[], None]] | None


def sdk_disabled(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


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
    if state.importing_main_in_child():  # a spawn/forkserver child: a DataLoader worker, maybe
        again = functools.partial(
            configure,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            service_name=service_name,
            training=training,
            span_exporters=span_exporters,
            metric_readers=metric_readers,
        )
        state.defer_configure(again)
        return Telemetry(TrainingConfig())
    with state._lock:
        previous = state.configured()
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
                previous.update_config(**dict(training or {}))
                return previous
        # Built while the previous job still runs: if this raises, that job goes on untouched.
        prepared = _prepare(
            config,
            strict=True,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            service_name=service_name,
            span_exporters=span_exporters,
            metric_readers=metric_readers,
        )
        if previous is not None:
            previous.shutdown()
        return _install(config, prepared)


def _auto_configure() -> Telemetry:
    config = TrainingConfig.from_env(strict=False)
    try:
        return install(config, strict=False)
    except ConfigurationError as exc:  # never into user code; nothing half-built is left
        _logger.error("traintel: %s (telemetry is off for this process)", exc)
        return state.set_current(Telemetry(config))


def install(
    config: TrainingConfig,
    *,
    strict: bool,
    tracer_provider: trace_api.TracerProvider | None = None,
    meter_provider: metrics_api.MeterProvider | None = None,
    service_name: str | None = None,
    span_exporters: Sequence[SpanExporter] | None = None,
    metric_readers: Sequence[MetricReader] | None = None,
) -> Telemetry:
    prepared = _prepare(
        config,
        strict=strict,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        service_name=service_name,
        span_exporters=span_exporters,
        metric_readers=metric_readers,
    )
    return _install(config, prepared)


def _prepare(
    config: TrainingConfig,
    *,
    strict: bool,
    tracer_provider: trace_api.TracerProvider | None,
    meter_provider: metrics_api.MeterProvider | None,
    service_name: str | None,
    span_exporters: Sequence[SpanExporter] | None,
    metric_readers: Sequence[MetricReader] | None,
) -> _Prepared:
    if sdk_disabled():
        return None
    return build_pipeline(
        config,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        service_name=service_name,
        strict=strict,
        span_exporters=span_exporters,
        metric_readers=metric_readers,
    )


def _install(config: TrainingConfig, prepared: _Prepared) -> Telemetry:
    """Build the job around its pipeline, then publish both: the global providers last."""
    if prepared is None:
        return state.set_current(Telemetry(config))
    pipeline, publish = prepared
    try:
        built = _build(config, pipeline)
    except BaseException:
        pipeline.shutdown(float(config.get("shutdown_timeout")))  # its threads must not outlive it
        raise
    publish()
    telemetry = state.set_current(built)
    preemption.install()
    return telemetry


def _build(config: TrainingConfig, pipeline: Pipeline) -> Telemetry:
    """Everything a job records with, around its pipeline."""
    # In the user's own pipeline there is no export filter: the processor counts the trace budget.
    budget = pipeline.export_filter.budget if pipeline.export_filter is not None else TraceBudget()
    tracer, ids = _tracer_for(pipeline)
    meters = pipeline.meter_provider
    warned = Warnings()
    open_spans = OpenSpans()
    cross_rank: CrossRank | None = None
    energy: EnergyAccounting | None = None

    def window_closed(report: WindowReport | None, final: bool) -> None:
        if cross_rank is not None:
            cross_rank.window_closed(report, final)

    def sync_point(now_ns: int) -> None:
        if cross_rank is not None:
            cross_rank.mark_sync_point(now_ns)

    def window_size_for(index: int) -> tuple[int, float] | None:
        return cross_rank.window_size_for(index) if cross_rank is not None else None

    def goodput_records(records: list[WindowGoodput], final: bool) -> None:
        if energy is not None:
            energy.released(records, engine.loop_span() if final else None)

    def application_ended(span: Span, exc: BaseException | None) -> None:
        if energy is not None:
            energy.application_ended(span)
        preemption.report_pending(telemetry, span, exc)

    engine = TrainingEngine(
        config,
        SpanOutlet(tracer, budget, ids, pipeline.export_filter, pipeline.direct_spans(tracer)),
        EngineHooks(
            warned.warn_once,
            on_application_start=lambda span: _application_started(telemetry, span),
            on_application_end=application_ended,
            window_hook=window_closed,
            goodput_records=goodput_records,
            on_sync_point=sync_point,
            window_size_for=window_size_for,
        ),
        meters,
        open_spans,
        _world_size(pipeline.resource),
    )
    processor = TrainingMetricsProcessor(
        engine,
        open_spans,
        engine.instruments,
        budget=None if pipeline.export_filter is not None else budget,
        on_error=lambda kind: warned.warn_once(kind, "could not aggregate a %s", kind),
    )
    pipeline.add_span_processor(processor)
    global _last_cross_rank, _last_energy
    price = config.get("energy_price_per_kwh")
    energy = _last_energy = EnergyAccounting(Booked(engine.goodput, engine), price)
    cross_rank = _last_cross_rank = CrossRank(engine)
    cross_rank.count_straggler = CrossRankInstruments(meters, _current_cross_rank).count
    telemetry = Telemetry(config, pipeline, engine, processor, open_spans, warned)
    telemetry.heartbeat = Heartbeat(engine, open_spans)
    telemetry.cross_rank = cross_rank
    # Sampled by the metric reader's thread only: hang localisation and process/device gauges.
    HeartbeatInstruments(meters, _current_heartbeat)
    SystemInstruments(meters)
    GpuInstruments(meters)
    EnergyInstruments(meters, _current_energy)
    if pipeline.owns_tracer_provider:  # traintel's own export path: its losses and health
        register_instruments(meters)
    _decide_rank_export(engine, config, pipeline.resource)
    return telemetry


def _application_started(telemetry: Telemetry, span: Span) -> None:
    telemetry.initialization_event(span)
    preemption.chain_later_handlers()


def _tracer_for(pipeline: Pipeline) -> tuple[trace_api.Tracer, ForcingIdGenerator | None]:
    """Our tracer, with an id generator we can steer (see ``traintel._sdk.ids``).

    Only our own tracer's generator is wrapped (delegating to the provider's): other tracers of
    a user's provider are untouched. The wrapper is reused if the provider handed out the same
    tracer before (it caches tracers by scope)."""
    tracer = pipeline.tracer_provider.get_tracer(semconv.INSTRUMENTATION_SCOPE, __version__)
    generator = tracer_id_generator(tracer)
    if generator is None or isinstance(generator, ForcingIdGenerator):
        return tracer, generator
    ids = ForcingIdGenerator(generator)
    set_tracer_id_generator(tracer, ids)
    return tracer, ids


def _world_size(resource: Resource) -> int:
    value = resource.attributes.get(semconv.WORLD_SIZE)
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return distributed_identity()[2]


def _rank(resource: Resource) -> int:
    """The Resource's rank; a user's provider without one: the launcher's (as _world_size)."""
    value = resource.attributes.get(semconv.RANK)
    if value is None:
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


def _current_heartbeat() -> Heartbeat | None:
    """The running job's heartbeat: the gauges outlive a reconfiguration (the SDK keeps the
    first registration of each), and after an explicit shutdown() its final export still
    reports the job."""
    telemetry = state.running()
    return None if telemetry is None else telemetry.heartbeat


#: The job installed last: after an explicit shutdown() its final export still reports it.
_last_cross_rank: CrossRank | None = None


def _current_cross_rank() -> CrossRank | None:
    return _last_cross_rank


_last_energy: EnergyAccounting | None = None


def _current_energy() -> EnergyAccounting | None:
    return _last_energy


state.set_auto_configure(_auto_configure)
