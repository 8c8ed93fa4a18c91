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
import gc
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Span

from traintel import semconv
from traintel._aggregation.aggregator import TrainingAggregator
from traintel._aggregation.export_policy import RankExportPolicy
from traintel._host.device import AutocastProbe, device_hooks
from traintel._host.energy import EnergyAccounting, EnergyInstruments
from traintel._host.gil_watch import GilWatch
from traintel._host.gpu import GpuInstruments
from traintel._host.heartbeat import Heartbeat, HeartbeatInstruments
from traintel._host.stall import WAKE_S, StallWatcher
from traintel._host.system_metrics import SystemInstruments
from traintel._recorder import active, clock
from traintel._recorder.engine import EngineHooks, SpanOutlet, TrainingEngine
from traintel._runtime import gil_helper, hang_records, preemption, state
from traintel._runtime.farewell import greeting, say
from traintel._runtime.pipeline import (
    FILE_EXPORTER,
    Pipeline,
    PipelineOptions,
    build_pipeline,
    prometheus_address,
)
from traintel._runtime.progress import ProgressMarks
from traintel._runtime.state import Telemetry, Warnings
from traintel._runtime.window_consumers import PeakFlops, WindowConsumers
from traintel._runtime.window_pipeline import WindowPipeline
from traintel._sdk.export_filter import TraceBudget
from traintel._sdk.ids import ForcingIdGenerator
from traintel._sdk.instruments import TrainingInstruments
from traintel._sdk.open_spans import OpenSpans
from traintel._sdk.otel_private import set_tracer_id_generator, tracer_id_generator
from traintel._sdk.processor import TrainingMetricsProcessor
from traintel._sdk.window_spans import WindowSpans
from traintel.config import ConfigurationError, Settings, TrainingConfig
from traintel.distributed.collectives import SEQUENCE, watch_torch_collectives
from traintel.distributed.cross_rank import CrossRank, CrossRankInstruments
from traintel.exporters.health import HEALTH, register_instruments
from traintel.exporters.otlp_env import warn_once
from traintel.resource_detectors import distributed_identity, process_group
from traintel.version import __version__

_logger = logging.getLogger(__name__)

#: A pipeline built and not yet published (``None``: OTEL_SDK_DISABLED), and how to publish it.
_Prepared = tuple[Pipeline, Callable[[], None]] | None


def configure(options: PipelineOptions, training: Mapping[str, object] | None = None) -> Telemetry:
    """Explicit configuration: validates everything first and raises ConfigurationError."""
    config = TrainingConfig.from_env(overrides=training, strict=True)
    global _deferred
    if state.importing_main_in_child():  # a spawn/forkserver child: a DataLoader worker, maybe
        _deferred = functools.partial(configure, options, training)
        return Telemetry(TrainingConfig())
    with active.lock:
        previous = state.configured()
        same_providers = replace(options, service_name=None) == PipelineOptions()
        if previous is not None and previous.pipeline is not None and same_providers:
            _say_name_kept(previous, options.service_name)
            previous.close_open_callbacks("traintel reconfigured")
            previous.update_config(**dict(training or {}))
            return previous
        # Built while the previous job still runs: if this raises, that job goes on untouched.
        prepared = _prepare(config, options, strict=True)
        if previous is not None:
            previous.shutdown()
        return _install(config, prepared)


def _say_name_kept(job: Telemetry, name: str | None) -> None:
    """``configure(service_name=...)`` on a running job keeps its providers and so its resource:
    a different name is said, not dropped in silence."""
    running = job.resource.attributes.get(semconv.SERVICE_NAME)
    if name is not None and name != running:
        _logger.warning(
            "traintel: configure(service_name=%r): the running job keeps its name %r (its resource "
            "is fixed); call traintel.shutdown() first to start a job of that name",
            name,
            running,
        )


def _auto_configure() -> Telemetry:
    config = TrainingConfig.from_env(strict=False)
    try:
        return _install(config, _prepare(config, PipelineOptions(), strict=False))
    except ConfigurationError as exc:  # never into user code; nothing half-built is left
        _logger.error("traintel: %s (telemetry is off for this process)", exc)
        return active.set_current(Telemetry(config))


def _prepare(config: TrainingConfig, options: PipelineOptions, *, strict: bool) -> _Prepared:
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip()
    if disabled.lower() == "true":
        return None
    if disabled.lower() not in ("", "false"):  # ``1`` or ``yes`` did not turn it off, silently
        said = "is not true or false: telemetry stays on (only true turns it off)"
        warn_once(f"OTEL_SDK_DISABLED={disabled!r} {said}")
    return build_pipeline(config, options, strict=strict)


def _install(config: TrainingConfig, prepared: _Prepared) -> Telemetry:
    """Build the job around its pipeline, then publish both: the global providers last."""
    if prepared is None:
        return active.set_current(Telemetry(config))
    pipeline, publish = prepared
    try:
        built = _build(config, pipeline)
    except BaseException:
        pipeline.shutdown(config.resolve().shutdown_timeout)  # its threads must not outlive it
        raise
    publish()
    telemetry = active.set_current(built)
    _collect_setup_garbage()
    preemption.install()
    if telemetry.stall_watcher is not None:
        telemetry.stall_watcher.start()
    scraped = None
    if "prometheus" in pipeline.metric_exporters:  # served where the reader started it
        host, port = prometheus_address(os.environ, distributed_identity()[1])
        scraped = f"http://{host}:{port}/metrics"
    rank = telemetry.resource.attributes.get(semconv.RANK)
    say(greeting(pipeline.run_file(), pipeline.trace_exporters, rank, scraped=scraped))
    return telemetry


@functools.cache
def _collect_setup_garbage() -> None:
    """One full collection, at the process's first configuration: what importing and building
    the pipeline left in the collector's oldest generation is otherwise collected by the first
    full collection the training loop's own allocations set off, a pause of the whole process
    (~25 ms) around its 20,000th iteration (measured 2026-11-27, 1 ms steps, the shipped
    default). Here it is paid once, before training."""
    gc.collect()


def _build(config: TrainingConfig, pipeline: Pipeline) -> Telemetry:
    """Everything a job records with, around its pipeline."""
    # In the user's own pipeline there is no export filter: the processor counts the trace budget.
    budget = pipeline.export_filter.budget if pipeline.export_filter is not None else TraceBudget()
    tracer, ids = _tracer_for(pipeline)
    meters = pipeline.meter_provider
    warned = Warnings()
    open_spans = OpenSpans()
    settings = config.resolve()
    aggregator = TrainingAggregator(settings.warmup_iterations)
    device = device_hooks(settings, warned.warn_once)
    probing = _probes_autocast(settings)
    peak = PeakFlops(
        _world_size(pipeline.resource),
        warned.warn_once,
        (lambda: engine.set_device(device)) if probing else None,
    )
    windows = WindowPipeline(aggregator, peak, warned.warn_once, before_handover=peak.measure_if_asked)
    direct = pipeline.direct_spans(tracer)
    energy: EnergyAccounting | None = None

    def application_ended(span: Span, exc: BaseException | None) -> None:
        if energy is not None:
            energy.application_ended(span)
        preemption.report_pending(telemetry, span, exc)

    engine = TrainingEngine(
        config,
        SpanOutlet(
            tracer,
            budget,
            ids,
            pipeline.export_filter,
            direct,
            pipeline.tracer_provider.get_tracer(semconv.USER_SPANS_SCOPE, __version__),
        ),
        EngineHooks(
            warned.warn_once,
            on_application_start=lambda span: _application_started(telemetry, span),
            on_application_end=application_ended,
            world_size=_world_follower(peak, warned.warn_once),
            # the file's spans written now, on the window worker, behind the windows
            after_application_end=lambda: windows.then(
                lambda: pipeline.flush_file_spans(telemetry.settings.shutdown_timeout)  # (as set now)
            ),
        ),
        windows,
        open_spans,
    )
    engine.set_device(AutocastProbe(device, peak.dtype_found) if probing else device)
    instruments = engine.metrics = TrainingInstruments(meters, engine, aggregator, clock.time_ns)
    if pipeline.export_filter is not None:
        pipeline.export_filter.active_iteration = lambda: engine.active
        pipeline.export_filter.before_flush = windows.flush
    processor = TrainingMetricsProcessor(
        engine,
        open_spans,
        instruments,
        budget=None if pipeline.export_filter is not None else budget,
        on_error=lambda kind: warned.warn_once(kind, "could not aggregate a %s", kind),
    )
    pipeline.add_span_processor(processor)
    apply_rank_export = _rank_export(engine, instruments)
    energy = _Last.energy = EnergyAccounting(engine.goodput, engine, settings.energy_price_per_kwh)
    cross_rank = _Last.cross_rank = CrossRank(engine, apply_rank_export)
    cross_rank.count_straggler = CrossRankInstruments(meters, lambda: _Last.cross_rank).count
    windows.agreed_size = cross_rank.window_size_for
    consumers = WindowConsumers(
        engine, WindowSpans(tracer, direct, engine.materializing), peak, warned.warn_once, energy.released
    )
    _register(windows, consumers, instruments, cross_rank)
    telemetry = Telemetry(config, pipeline, engine, processor, open_spans, warned, windows)
    telemetry.heartbeat = Heartbeat(engine, open_spans, SEQUENCE, clock.time_ns)
    telemetry.cross_rank = cross_rank
    telemetry.stall_watcher = _stall_watcher(settings, pipeline, engine, telemetry.heartbeat)
    # Sampled by the metric reader's thread only: hang localisation and process/device gauges.
    HeartbeatInstruments(meters, _current_heartbeat)
    SystemInstruments(meters)
    GpuInstruments(meters)
    EnergyInstruments(meters, lambda: _Last.energy)
    if pipeline.owns_tracer_provider:  # traintel's own export path: its losses and health
        register_instruments(meters)
    _decide_rank_export(apply_rank_export, settings, pipeline.resource)
    telemetry.progress = _progress_marks(pipeline, engine, windows)
    return telemetry


def _progress_marks(
    pipeline: Pipeline, engine: TrainingEngine, windows: WindowPipeline
) -> ProgressMarks | None:
    """Where the run's spans go to the embedded file, a killed job's progress beside it, fed the
    closed windows. (Spans sent elsewhere, the file holds hang records at most: no window record
    would ever supersede the mark, which would then say the job stopped where it was last written.)"""
    if FILE_EXPORTER not in (pipeline.trace_exporters or ()):
        return None
    marks = ProgressMarks(engine, pipeline.output_file, pipeline.resource.attributes, windows.flush)
    windows.register("the progress mark", lambda event: marks.window_closed(event.report, event.window))
    marks.start()
    return marks


def _rank_export(
    engine: TrainingEngine, instruments: TrainingInstruments
) -> Callable[[RankExportPolicy], None]:
    """How what this rank exports is applied, decided once per job: its sampling, its window
    series and its self-telemetry (only what went wrong, on a rank that reports its anomalies
    only)."""
    HEALTH.report_zeros = True  # until a scale-mode decision says otherwise

    def apply(policy: RankExportPolicy) -> None:
        if engine.rank_export is not None:
            return
        engine.set_rank_export(policy)
        if policy.anomalies_only:
            instruments.stop_window_series()
        HEALTH.report_zeros = not policy.anomalies_only

    return apply


def _register(
    windows: WindowPipeline,
    consumers: WindowConsumers,
    instruments: TrainingInstruments,
    cross_rank: CrossRank,
) -> None:
    """What a closed window is made into, in this order: the device's part of the report is
    carried by the record and the loop."""
    windows.register("the device annotation", consumers.annotate_device)
    # The exchange decides at the first window what a rank exports (scale mode): before the
    # instruments record that window's values.
    windows.register(
        "the cross-rank exchange", lambda event: cross_rank.window_closed(event.report, event.window.final)
    )
    windows.register("the metric instruments", lambda event: instruments.window_closed(event.report))
    windows.register("the goodput record", consumers.book_goodput)
    windows.at_close(consumers.release_held)
    windows.register("the wall clock's step", consumers.say_wall_clock_step)
    windows.register("the counts against the global batch", consumers.say_counts_over_the_batch)
    windows.register("the loop span", consumers.update_loop)


def _probes_autocast(settings: Settings) -> bool:
    """Until the compute dtype is known, phase starts look at autocast (a CUDA or ROCm build of
    torch imported, no dtype or peak configured): see ``AutocastProbe``."""
    version = getattr(sys.modules.get("torch"), "version", None)
    gpu_build = getattr(version, "cuda", None) or getattr(version, "hip", None)
    return gpu_build is not None and settings.dtype is None and settings.peak_flops is None


def _stall_watcher(
    settings: Settings, pipeline: Pipeline, engine: TrainingEngine, heartbeat: Heartbeat
) -> StallWatcher | None:
    """The hang reporter (off with ``TRAINTEL_STALL_SECONDS=0``). The collective functions are
    wrapped here, at the same point of the program on every rank, so their counts agree."""
    threshold = settings.stall_seconds
    watch_torch_collectives()
    if threshold <= 0:
        return None
    rank = _rank(pipeline.resource)
    helper = Path(gil_helper.__file__)
    silence = threshold + WAKE_S  # the watcher's own wait is no stall
    gil_watch = GilWatch(silence, rank, pipeline.resource.attributes, pipeline.output_file(), helper)
    send = functools.partial(hang_records.emit, pipeline.logs.logger)
    return StallWatcher(heartbeat, engine, send, threshold, rank, gil_watch=gil_watch, clock=clock.time_ns)


def _application_started(telemetry: Telemetry, span: Span) -> None:
    telemetry.config_event(span, semconv.Event.TELEMETRY_INITIALIZATION)
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
    try:
        return int(str(resource.attributes.get(semconv.WORLD_SIZE)))
    except (TypeError, ValueError):
        return distributed_identity()[2]


def _world_follower(peak: PeakFlops, warn_once: Callable[..., None]) -> Callable[[], int]:
    """The job's world size as the engine asks for it (at the configuration, a training loop's
    start, each window's end): the Resource's, or where that says a single process, the size of
    a process group initialised since (``torch.multiprocessing.spawn`` starts ranks without the
    launcher's variables, and the job's first phase may open before ``init_process_group``).
    Each rank's share of the global batch and the job's rates then count every rank, instead of
    counting the whole batch on each; the Resource, already exported, cannot follow: said once,
    with what names the ranks."""

    def world_size() -> int:
        if peak.world_size == 1:
            group = process_group()
            if group is not None and group[1] > 1:
                peak.world_size = group[1]
                warn_once("late_world", _LATE_WORLD, *group, group[1])
        return peak.world_size

    return world_size


_LATE_WORLD = (
    "torch.distributed makes this process rank %d of %d, but its telemetry started before "
    "init_process_group: its records name it rank 0 of 1, so they do not tell its ranks apart "
    "(each rank's share of the global batch now counts 1/%d of it). "
    "Set RANK, LOCAL_RANK and WORLD_SIZE in each process before its first traintel call, and "
    "TRAINTEL_RUN_ID (the same for all) before starting them, or launch with torchrun"
)


def _rank(resource: Resource) -> int:
    """The Resource's rank; a user's provider without one: the launcher's (as _world_size)."""
    value = resource.attributes.get(semconv.RANK)
    if value is None:
        return distributed_identity()[0]
    try:
        return int(str(value))
    except ValueError:
        return -1


def _decide_rank_export(
    apply: Callable[[RankExportPolicy], None], settings: Settings, resource: Resource
) -> None:
    """Scale mode from the Resource's rank and world size when the launcher gave them (torchrun,
    Slurm): decided before the first iteration, so a reduced rank exports none of its routine
    telemetry. Otherwise the first window boundary decides (CrossRank)."""
    world = _world_size(resource)
    rank = _rank(resource)
    if world > 1 and 0 <= rank < world:
        apply(RankExportPolicy(rank, world, settings.cross_rank_scale_world_size))


def _current_heartbeat() -> Heartbeat | None:
    """The running job's heartbeat: the gauges outlive a reconfiguration (the SDK keeps the
    first registration of each), and after an explicit shutdown() its final export still
    reports the job."""
    telemetry = state.running()
    return None if telemetry is None else telemetry.heartbeat


class _Last:
    """The parts of the job installed last that its gauges read: after an explicit shutdown()
    its final export still reports it."""

    cross_rank: CrossRank | None = None
    energy: EnergyAccounting | None = None


#: An explicit configure() made while a spawn child imported the main module (see ``configure``),
#: applied at the child's first use of traintel, unless that is in a DataLoader worker (a process
#: started to train, as ``torch.multiprocessing.spawn`` starts ranks, is configured as asked).
_deferred: Callable[[], Telemetry] | None = None


def _first_use() -> Telemetry:
    """The job a phase used before any ``configure()`` records into: the one a spawn child's
    main module asked for, or configured from the environment, or off (in a DataLoader worker,
    which imports traintel afresh; or if that fails), never an exception into the training loop."""
    global _deferred
    if state.in_dataloader_worker():
        return Telemetry(TrainingConfig())
    deferred, _deferred = _deferred, None
    try:
        return (deferred or _auto_configure)()
    except Exception:
        _logger.exception("traintel: auto-configuration failed; telemetry is off for this process")
        return Telemetry(TrainingConfig())


active.set_first_use(_first_use)
