"""The traintel vocabulary: span, event, attribute and metric names, and their units.

One module owns every string a backend will see, so a rename happens in one place and the
tests (and the dashboards generated from this module) break loudly instead of drifting.
Span names are phase names and stay low-cardinality: iteration numbers are attributes,
never part of a name.
"""

from __future__ import annotations

from enum import Enum
from typing import Final


class Phase(str, Enum):
    """A training phase; its value is both the span name and ``ml.training.phase``."""

    APPLICATION = "application"
    DIST_INIT = "dist_init"
    DATA_LOADER_INIT = "data_loader_init"
    CHECKPOINT_LOAD = "checkpoint_load"
    MODEL_INIT = "model_init"
    OPTIMIZER_INIT = "optimizer_init"
    TRAINING_LOOP = "training_loop"
    TRAINING_ITERATION = "training_iteration"
    DATA_LOADING = "data_loading"
    MODEL_FORWARD = "model_forward"
    MODEL_BACKWARD = "model_backward"
    OPTIMIZER_UPDATE = "optimizer_update"
    CHECKPOINT_SAVE_SYNC = "checkpoint_save_sync"
    CHECKPOINT_SAVE_ASYNC = "checkpoint_save_async"
    VALIDATION_LOOP = "validation_loop"
    VALIDATION_ITERATION = "validation_iteration"
    TESTING_LOOP = "testing_loop"
    TESTING_ITERATION = "testing_iteration"
    # Checkpoint sub-phases, children of a checkpoint_save_* span (or of the loop for finalize).
    CHECKPOINT_STAGING = "checkpoint_staging"
    CHECKPOINT_WRITE = "checkpoint_write"
    CHECKPOINT_UPLOAD = "checkpoint_upload"
    CHECKPOINT_FINALIZE = "checkpoint_finalize"
    CHECKPOINT_BARRIER = "checkpoint_barrier"

    def __str__(self) -> str:
        return self.value


#: Phases that are a single step of some loop; model metrics attach to these first.
ITERATION_PHASES: Final = frozenset(
    {Phase.TRAINING_ITERATION, Phase.VALIDATION_ITERATION, Phase.TESTING_ITERATION}
)
#: Phases that contain iterations; model metrics fall back to these outside an iteration.
LOOP_PHASES: Final = frozenset({Phase.TRAINING_LOOP, Phase.VALIDATION_LOOP, Phase.TESTING_LOOP})
#: Phases timed inside an iteration (the iteration fast path records them without SDK spans).
STEP_PHASES: Final = frozenset(
    {Phase.DATA_LOADING, Phase.MODEL_FORWARD, Phase.MODEL_BACKWARD, Phase.OPTIMIZER_UPDATE}
)
#: Checkpoint save phases and the stage names ``checkpoint_stage()`` accepts.
CHECKPOINT_SAVE_PHASES: Final = frozenset({Phase.CHECKPOINT_SAVE_SYNC, Phase.CHECKPOINT_SAVE_ASYNC})
#: The save phase of each ``ml.training.checkpoint.strategy``.
CHECKPOINT_SAVE_PHASE_OF: Final = {"sync": Phase.CHECKPOINT_SAVE_SYNC, "async": Phase.CHECKPOINT_SAVE_ASYNC}
CHECKPOINT_STAGES: Final = {
    "staging": Phase.CHECKPOINT_STAGING,
    "write": Phase.CHECKPOINT_WRITE,
    "upload": Phase.CHECKPOINT_UPLOAD,
    "finalize": Phase.CHECKPOINT_FINALIZE,
    "barrier": Phase.CHECKPOINT_BARRIER,
}
#: The loop each iteration phase belongs in, for the "iteration outside its loop" check.
LOOP_OF_ITERATION: Final = {
    Phase.TRAINING_ITERATION: Phase.TRAINING_LOOP,
    Phase.VALIDATION_ITERATION: Phase.VALIDATION_LOOP,
    Phase.TESTING_ITERATION: Phase.TESTING_LOOP,
}


#: Goodput accounting: the badput category of each phase whose time is not productive. Time
#: belongs to the innermost categorised phase covering it; iterations are productive except
#: their data-loading wait and the categorised phases nested in them.
BADPUT_CATEGORY_OF_PHASE: Final = {
    Phase.DIST_INIT.value: "initialization",
    Phase.DATA_LOADER_INIT.value: "initialization",
    Phase.MODEL_INIT.value: "initialization",
    Phase.OPTIMIZER_INIT.value: "initialization",
    Phase.CHECKPOINT_LOAD.value: "checkpoint_load",
    Phase.CHECKPOINT_SAVE_SYNC.value: "checkpoint_save",
    Phase.CHECKPOINT_SAVE_ASYNC.value: "checkpoint_save",
    Phase.DATA_LOADING.value: "data_loading",
    Phase.VALIDATION_LOOP.value: "evaluation",
    Phase.TESTING_LOOP.value: "evaluation",
}
#: Every badput category, in report order; they sum with goodput to the total wall time.
BADPUT_CATEGORIES: Final = (
    "initialization",
    "checkpoint_load",
    "checkpoint_save",
    "data_loading",
    "evaluation",
    "program_startup",
    "wasted_progress",
    "infrastructure_recovery",
    "other",
)
#: The compact per-window span the goodput analysis reads (iteration spans are tail-sampled).
TRAINING_WINDOW_SPAN: Final = "training_window"


class Event(str, Enum):
    """Span event names."""

    TELEMETRY_INITIALIZATION = "telemetry_initialization"
    TRAINING_CONFIG_UPDATE = "training_config_update"
    TRAINING_METRICS_UPDATE = "training_metrics_update"
    VALIDATION_METRICS_UPDATE = "validation_metrics_update"
    TESTING_METRICS_UPDATE = "testing_metrics_update"
    SAVE_CHECKPOINT_SUCCESS = "save_checkpoint_success"
    CHECKPOINT_METRICS_UPDATE = "checkpoint_metrics_update"
    SLOW_ITERATION = "slow_iteration"
    NONFINITE_METRIC = "nonfinite_metric"
    STRAGGLER = "straggler"
    METRIC_OUT_OF_RANGE = "metric_out_of_range"
    PREEMPTION = "preemption"
    #: The job's cross-rank statistics of one window (distributed runs; see traintel.distributed).
    RANKS_METRICS_UPDATE = "ranks_metrics_update"
    #: The wall clock stepped (durations follow the monotonic clock; see ``_recorder/clock``).
    WALL_CLOCK_STEP = "wall_clock_step"

    def __str__(self) -> str:
        return self.value


# --- span attributes -------------------------------------------------------------------------
PHASE: Final = "ml.training.phase"
ITERATION: Final = "ml.training.iteration"
SAMPLES: Final = "ml.training.samples"
TOKENS: Final = "ml.training.tokens"
PADDING_TOKENS: Final = "ml.training.padding_tokens"
FLOPS: Final = "ml.training.flops"
MICRO_BATCHES: Final = "ml.training.micro_batches"
TRAIN_ITERATIONS_START: Final = "ml.training.train_iterations_start"
TRAIN_SAMPLES_START: Final = "ml.training.train_samples_start"
TRAIN_ITERATIONS_TARGET: Final = "ml.training.train_iterations_target"
TRAIN_SAMPLES_TARGET: Final = "ml.training.train_samples_target"
CHECKPOINT_STRATEGY: Final = "ml.training.checkpoint.strategy"
CHECKPOINT_SIZE: Final = "ml.training.checkpoint.size"
CHECKPOINT_ITERATION: Final = "ml.training.checkpoint.iteration"
CHECKPOINT_PATH: Final = "ml.training.checkpoint.path"
CHECKPOINT_STAGE: Final = "ml.training.checkpoint.stage"
CHECKPOINT_BYTES_PER_SECOND: Final = "ml.training.checkpoint.bytes_per_second"
#: Why an iteration was exported (first, every_n, slow, error, nonfinite, checkpoint, nested_phase,
#: all).
SAMPLING_REASON: Final = "traintel.sampling.reason"
#: Segment spans: which segment of a long run a trace holds.
SEGMENT_INDEX: Final = "ml.training.segment.index"
SEGMENT_FIRST_ITERATION: Final = "ml.training.segment.first_iteration"
SEGMENT_LAST_ITERATION: Final = "ml.training.segment.last_iteration"
SEGMENT_CONTINUES: Final = "ml.training.segment.continues"
SEGMENT_SPANS: Final = "ml.training.segment.spans"
SEGMENT_BYTES: Final = "ml.training.segment.estimated_bytes"
#: Prefixes of the window (training_metrics_update), cumulative, end-of-loop summary,
#: checkpoint (checkpoint_metrics_update) and evaluation (validation/testing) attributes.
WINDOW_PREFIX: Final = "ml.training.window."
#: On each ``training_window`` span, seconds and a ratio a backend cannot derive from the others
#: (TraceQL metrics cannot subtract one attribute from another): the window's productive time
#: (its iterations' time less data-loading wait, nested badput and program startup) and its
#: goodput (that over the window's wall time).
WINDOW_PRODUCTIVE_TIME: Final = WINDOW_PREFIX + "productive_time"
WINDOW_GOODPUT: Final = WINDOW_PREFIX + "goodput"
TOTAL_PREFIX: Final = "ml.training.total."
SUMMARY_PREFIX: Final = "ml.training.summary."
CHECKPOINT_PREFIX: Final = "ml.training.checkpoint."
EVAL_PREFIX: Final = "ml.training.eval."
#: Next to every MFU value: how it was computed, so a user can check it.
MFU_NUMERATOR: Final = "ml.training.mfu.numerator_flops_per_second"
MFU_DENOMINATOR: Final = "ml.training.mfu.denominator_peak_flops"
MFU_FLOPS_METHOD: Final = "ml.training.mfu.flops_method"
MFU_TIMING_MODE: Final = "ml.training.mfu.timing_mode"
MFU_PEAK_SOURCE: Final = "ml.training.mfu.peak_source"
#: The peak table's dtype column (bf16, tf32, ...) and why that one (``TRAINTEL_DTYPE``,
#: ``autocast``, ``parameters``, ``fp32 matmuls on TF32 (...)``, ``assumed``).
MFU_DTYPE: Final = "ml.training.mfu.dtype"
MFU_DTYPE_REASON: Final = "ml.training.mfu.dtype_reason"
#: The matmul peak measured at start (``TRAINTEL_MEASURE_PEAK=on``) and how.
MFU_MEASURED_PEAK: Final = "ml.training.mfu.measured_peak_flops"
MFU_MEASURED_PEAK_METHOD: Final = "ml.training.mfu.measured_peak_method"
THROUGHPUT_AGGREGATION: Final = "ml.training.throughput.aggregation"
THROUGHPUT_SCOPE: Final = "ml.training.throughput.scope"
SLOW_FACTOR: Final = "ml.training.slow_factor"
ITERATION_DURATION: Final = "ml.training.iteration.duration"
ITERATION_MEDIAN: Final = "ml.training.iteration.median_duration"
METRIC_NAME: Final = "ml.training.metric.name"
METRIC_VALUE: Final = "ml.training.metric.value"
EXPORTED_TRACE_ID: Final = "traintel.exported.trace_id"
EXPORTED_SPAN_ID: Final = "traintel.exported.span_id"
ERROR_REASON: Final = "traintel.error"
#: Prefix of the user's model metrics from ``record_metrics`` (``ml.training.metric.loss``).
METRIC_PREFIX: Final = "ml.training.metric."
#: Why a span was ended by traintel rather than by the user's code (exit, out-of-order end).
END_REASON: Final = "traintel.end_reason"

#: Goodput (live, per job): ratios of the job's wall time so far, and the time behind them.
GOODPUT: Final = "ml.training.goodput"
BADPUT_PREFIX: Final = "ml.training.badput."
BADPUT_CATEGORY: Final = "ml.training.badput.category"
#: Step-time deviation: the robust ideal step time and how far windows deviate from it.
STEP_TIME_IDEAL: Final = "ml.training.step_time.ideal"
STEP_TIME_DEVIATION_PREFIX: Final = "ml.training.step_time.deviation."
STEP_TIME_QUANTILE: Final = "ml.training.step_time.quantile"

#: The ``preemption`` event (on the outermost open span when a terminating signal arrives).
PREEMPTION_SIGNAL: Final = "ml.training.preemption.signal"
PREEMPTION_RECEIVED: Final = "ml.training.preemption.received_unix_nano"
PREEMPTION_LAST_ITERATION: Final = "ml.training.preemption.last_completed_iteration"
PREEMPTION_CHECKPOINT_ITERATION: Final = "ml.training.preemption.last_checkpoint_iteration"
PREEMPTION_ITERATIONS_LOST: Final = "ml.training.preemption.iterations_lost"
PREEMPTION_SAVE_AFTER_SIGNAL: Final = "ml.training.preemption.save_after_signal"
PREEMPTION_SAVE_AFTER_SIGNAL_TIME: Final = "ml.training.preemption.save_after_signal_time"
#: The ``wall_clock_step`` event: how far (s, positive: forward) the wall clock is from traintel's
#: monotonic timeline, as first seen at a window close after the step.
WALL_CLOCK_STEP: Final = "ml.training.wall_clock.step"
#: ``traintel.end_reason`` of spans a terminating signal ended (``preempted: SIGTERM``).
END_REASON_PREEMPTED: Final = "preempted"

# --- resource attributes: run identity ----------------------------------------------------------
RUN_ID: Final = "ml.training.run_id"
SESSION_TAG: Final = "ml.training.session_tag"
PERF_TAG: Final = "ml.training.perf_tag"
RANK: Final = "ml.training.rank"
LOCAL_RANK: Final = "ml.training.local_rank"
WORLD_SIZE: Final = "ml.training.world_size"
RESTART_COUNT: Final = "ml.training.restart_count"
SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
HOST_NAME: Final = "host.name"
PROCESS_PID: Final = "process.pid"
TORCHELASTIC_RUN_ID: Final = "torchelastic.run_id"
TORCHELASTIC_RESTART_COUNT: Final = "torchelastic.restart_count"
TORCHELASTIC_MAX_RESTARTS: Final = "torchelastic.max_restarts"
TORCHELASTIC_GROUP_RANK: Final = "torchelastic.group_rank"
SLURM_JOB_ID: Final = "slurm.job.id"
SLURM_STEP_ID: Final = "slurm.step.id"
SLURM_NODE_ID: Final = "slurm.node.id"
SLURM_RESTART_COUNT: Final = "slurm.restart_count"
SLURM_ARRAY_JOB_ID: Final = "slurm.array.job_id"
SLURM_ARRAY_TASK_ID: Final = "slurm.array.task_id"
K8S_POD_NAME: Final = "k8s.pod.name"
K8S_POD_UID: Final = "k8s.pod.uid"
K8S_NAMESPACE_NAME: Final = "k8s.namespace.name"
K8S_NODE_NAME: Final = "k8s.node.name"

# --- telemetry_initialization / training_config_update event attributes ------------------------
CONFIG_PREFIX: Final = "traintel.config."
METRICS_ENABLED: Final = "traintel.metrics.enabled"
METRICS_DISABLED: Final = "traintel.metrics.disabled"
TRACES_EXPORTERS: Final = "traintel.exporters.traces"
METRICS_EXPORTERS: Final = "traintel.exporters.metrics"
OUTPUT_FILE: Final = "traintel.output.file"
TRAINTEL_VERSION: Final = "traintel.version"

# --- metric instrument names (UCUM units) -----------------------------------------------------
METRIC_ITERATION_DURATION: Final = "ml.training.iteration.duration"
METRIC_SAMPLES: Final = "ml.training.samples"
METRIC_TOKENS: Final = "ml.training.tokens"
METRIC_SAMPLE_THROUGHPUT: Final = "ml.training.sample_throughput"
METRIC_TOKEN_THROUGHPUT: Final = "ml.training.token_throughput"
METRIC_FLOPS_THROUGHPUT: Final = "ml.training.flops_throughput"
METRIC_MFU: Final = "ml.training.mfu"
#: MFU against the matmul peak measured at start rather than the datasheet's.
METRIC_MFU_MEASURED: Final = "ml.training.mfu.measured"
#: GPU energy (NVML's counter, read at window boundaries): the job's joules by goodput category
#: (``ml.training.energy.category``: productive, a badput category, or other), its cost, and
#: the last window's joules per token and per sample. The same figures, in J, ride on each
#: window record (``ml.training.window.energy``, ``ml.training.window.energy.<category>``) and
#: the loop's summary (``ml.training.summary.energy...``).
METRIC_ENERGY: Final = "ml.training.energy"
METRIC_ENERGY_COST: Final = "ml.training.energy.cost"
METRIC_ENERGY_PER_TOKEN: Final = "ml.training.energy.per_token"
METRIC_ENERGY_PER_SAMPLE: Final = "ml.training.energy.per_sample"
ENERGY_CATEGORY: Final = "ml.training.energy.category"
METRIC_GOODPUT: Final = "ml.training.goodput"
METRIC_BADPUT: Final = "ml.training.badput"
#: Monotonic seconds of the job by goodput category (``GOODPUT_CATEGORY``: ``productive`` or a
#: badput category the job itself sees), the job's wall time so far, when it started and when it
#: last made progress (the end of its last closed window; Unix seconds): what PromQL needs to add
#: the jobs of a session up (a ratio per job cannot be summed across restarts).
METRIC_GOODPUT_TIME: Final = "ml.training.goodput.time"
GOODPUT_CATEGORY: Final = "ml.training.goodput.category"
METRIC_JOB_TIME: Final = "ml.training.job.time"
METRIC_JOB_START_TIME: Final = "ml.training.job.start_time"
METRIC_JOB_LAST_PROGRESS_TIME: Final = "ml.training.job.last_progress_time"
METRIC_STEP_TIME_IDEAL: Final = "ml.training.step_time.ideal"
METRIC_STEP_TIME_DEVIATION: Final = "ml.training.step_time.deviation"
METRIC_CHECKPOINT_SAVE_DURATION: Final = "ml.training.checkpoint.save.duration"
METRIC_CHECKPOINT_LOAD_DURATION: Final = "ml.training.checkpoint.load.duration"
METRIC_CHECKPOINT_SIZE: Final = "ml.training.checkpoint.size"
METRIC_CHECKPOINT_FAILURES: Final = "ml.training.checkpoint.failures"
METRIC_DATA_LOADING_DURATION: Final = "ml.training.data_loading.duration"
METRIC_PHASE_DURATION: Final = "ml.training.phase.duration"
METRIC_STEP_PHASE_TIME: Final = "ml.training.iteration.phase_time"
METRIC_HFU: Final = "ml.training.hfu"
METRIC_ITERATIONS_EXPORTED: Final = "traintel.iterations.exported"

# System and device gauges (observable, sampled on the metric reader's thread). GPU names follow
# the OTel ``hw.*`` conventions so series join with dcgm-exporter's by ``hw.id`` (the GPU UUID).
METRIC_HW_GPU_MEMORY_USAGE: Final = "hw.gpu.memory.usage"
METRIC_HW_GPU_MEMORY_LIMIT: Final = "hw.gpu.memory.limit"
METRIC_HW_GPU_UTILIZATION: Final = "hw.gpu.utilization"
METRIC_HW_TEMPERATURE: Final = "hw.temperature"
METRIC_HW_POWER: Final = "hw.power"
#: The GPU's energy counter (J since the driver loaded): the conventions' common ``hw.energy``.
METRIC_HW_ENERGY: Final = "hw.energy"
#: Clocks and clock-limiting ("throttle") reasons: the OTel conventions define neither for a
#: GPU (checked 2026-11-27; ``hw.gpu.*`` has io, memory and utilization), hence traintel's own
#: names, keyed by ``hw.id`` like the rest. ``traintel.gpu.clock.domain``: sm or memory;
#: ``traintel.gpu.throttle.reason``: one series per NVML reason, 1 while it holds the clocks.
METRIC_GPU_CLOCK: Final = "traintel.gpu.clock"
METRIC_GPU_THROTTLE: Final = "traintel.gpu.throttle"
GPU_CLOCK_DOMAIN: Final = "traintel.gpu.clock.domain"
GPU_THROTTLE_REASON: Final = "traintel.gpu.throttle.reason"
HW_ID: Final = "hw.id"
HW_TYPE: Final = "hw.type"
#: The PyTorch caching allocator of this process (``torch.cuda.memory_stats``), per device.
METRIC_DEVICE_MEMORY_ALLOCATED: Final = "ml.training.device.memory.allocated"
METRIC_DEVICE_MEMORY_RESERVED: Final = "ml.training.device.memory.reserved"
METRIC_DEVICE_MEMORY_PEAK: Final = "ml.training.device.memory.peak"
METRIC_DEVICE_MEMORY_ALLOC_RETRIES: Final = "ml.training.device.memory.alloc_retries"
METRIC_DEVICE_MEMORY_OOMS: Final = "ml.training.device.memory.ooms"
METRIC_PROCESS_CPU_UTILIZATION: Final = "process.cpu.utilization"
METRIC_PROCESS_MEMORY_USAGE: Final = "process.memory.usage"
#: Hang localisation, per rank: sampled off the training thread, so a rank blocked in a
#: collective or a kernel still reports how long it has been stuck and where.
METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS: Final = "ml.training.heartbeat.time_since_progress"
METRIC_HEARTBEAT_ITERATION: Final = "ml.training.heartbeat.iteration"
METRIC_HEARTBEAT_PHASE: Final = "ml.training.heartbeat.phase"
#: On the phase gauge: the step phase completed last in the open iteration (where it stopped).
HEARTBEAT_AFTER: Final = "ml.training.heartbeat.after"
#: This rank's collective sequence: collectives it entered, and of those the ones that completed
#: (seen without a host-device sync). Across ranks, the rank whose count is behind the furthest
#: rank's (the wavefront) has not joined the collective the others wait in.
METRIC_HEARTBEAT_COLLECTIVES_ENTERED: Final = "ml.training.heartbeat.collectives.entered"
METRIC_HEARTBEAT_COLLECTIVES_COMPLETED: Final = "ml.training.heartbeat.collectives.completed"
#: Cross-rank window statistics (``ml.training.statistic`` = min, median, max, p99) and stragglers.
METRIC_RANKS_ITERATION_DURATION: Final = "ml.training.ranks.iteration.duration"
METRIC_RANKS_COMPUTE_DURATION: Final = "ml.training.ranks.compute.duration"
METRIC_RANKS_DATA_LOADING_DURATION: Final = "ml.training.ranks.data_loading.duration"
METRIC_RANK_COMPUTE_EWMA: Final = "ml.training.rank.compute.ewma"
METRIC_STRAGGLERS: Final = "ml.training.stragglers"
STATISTIC: Final = "ml.training.statistic"
STRAGGLER_RANK: Final = "ml.training.straggler.rank"
#: On ``ranks_metrics_update`` events: the cross-rank statistics of a window, e.g.
#: ``ml.training.ranks.compute_time.median``, ``ml.training.ranks.top_k``.
RANKS_PREFIX: Final = "ml.training.ranks."
#: On ``straggler`` events: the lagging rank's compute time before the synchronisation point,
#: the median of the other ranks', their ratio, the rank's EWMA and whether the lag is chronic.
STRAGGLER_COMPUTE_TIME: Final = "ml.training.straggler.compute_time"
STRAGGLER_MEDIAN_COMPUTE_TIME: Final = "ml.training.straggler.median_compute_time"
STRAGGLER_FACTOR: Final = "ml.training.straggler.factor"
STRAGGLER_COMPUTE_EWMA: Final = "ml.training.straggler.compute_ewma"
STRAGGLER_CHRONIC: Final = "ml.training.straggler.chronic"
# Self-telemetry: traintel's own losses and health. A silent drop is a bug.
METRIC_SPANS_DROPPED: Final = "traintel.spans.dropped"
METRIC_SPANS_REPAIRED: Final = "traintel.spans.repaired"
METRIC_EVENTS_DROPPED: Final = "traintel.events.dropped"
METRIC_EXPORT_FAILURES: Final = "traintel.export.failures"
METRIC_EXPORT_BATCHES_SPLIT: Final = "traintel.export.batches.split"
METRIC_QUEUE_DEPTH: Final = "traintel.queue.depth"
METRIC_SPOOL_SIZE: Final = "traintel.spool.size"
METRIC_SPOOL_DROPPED: Final = "traintel.spool.dropped"
METRIC_SPOOL_QUARANTINED: Final = "traintel.spool.quarantined"
DROP_REASON: Final = "traintel.drop.reason"
#: On ``traintel.export.failures``: the signal whose export failed, ``traces`` or ``metrics``.
EXPORT_SIGNAL: Final = "traintel.export.signal"

#: Instrumentation scope name for every tracer and meter traintel creates.
INSTRUMENTATION_SCOPE: Final = "traintel"
#: The scope of ``timed_span``'s spans: the user's own, aggregated as any span with a phase.
USER_SPANS_SCOPE: Final = "traintel.timed_span"

# Framework integrations: which driver opened a phase span, and the torch.monitor bridge.
#: On spans opened by an integration: ``lightning``, ``transformers`` or ``instrumentor``.
INTEGRATION: Final = "traintel.integration"
INTEGRATION_LIGHTNING: Final = "lightning"
INTEGRATION_TRANSFORMERS: Final = "transformers"
INTEGRATION_INSTRUMENTOR: Final = "instrumentor"
#: The patched call behind a zero-code span (``torch.save``, ``torch.distributed.checkpoint.load``...).
INSTRUMENTED_CALL: Final = "traintel.instrumented.call"
#: One gauge for every torch.monitor ``Stat`` value, keyed by ``torch.monitor.stat`` ("<stat>.<agg>").
METRIC_TORCH_MONITOR_STAT: Final = "ml.training.torch_monitor.stat"
TORCH_MONITOR_STAT: Final = "torch.monitor.stat"
#: torch.monitor's own event name for ``Stat`` windows (``torch.monitor.STAT_EVENT``).
TORCH_MONITOR_STAT_EVENT: Final = "torch.monitor.Stat"

# Devices: per-window memory peaks and device-side timing on ``training_metrics_update``.
#: Peak bytes the CUDA caching allocator held for tensors during the window (current device;
#: ``torch.cuda.max_memory_allocated``, reset at each window boundary).
WINDOW_DEVICE_MEMORY_PEAK_ALLOCATED: Final = WINDOW_PREFIX + "device.memory.peak_allocated"
#: The same for memory reserved by the allocator (``torch.cuda.max_memory_reserved``).
WINDOW_DEVICE_MEMORY_PEAK_RESERVED: Final = WINDOW_PREFIX + "device.memory.peak_reserved"
#: The process' peak resident memory since it started (``getrusage`` ``ru_maxrss``), NOT a
#: per-window peak: the kernel keeps no cheap per-interval high-water mark.
WINDOW_PROCESS_PEAK_RSS_SINCE_START: Final = WINDOW_PREFIX + "process.memory.peak_rss_since_start"
#: How the window's iteration and step-phase times were measured (``TIMING_MODE_*``).
WINDOW_TIMING_MODE: Final = WINDOW_PREFIX + "timing_mode"
#: Prefix of the GPU time of forward / backward / optimizer ranges resolved in the window
#: (``<prefix><phase>`` seconds summed, ``<prefix><phase>.count`` ranges), with its mode.
WINDOW_DEVICE_TIME_PREFIX: Final = WINDOW_PREFIX + "device_time."
WINDOW_DEVICE_TIMING_MODE: Final = WINDOW_DEVICE_TIME_PREFIX + "timing_mode"
#: Event pairs still in flight at the window's close (their time lands in a later window), and
#: pairs dropped because the bounded queue was full.
WINDOW_DEVICE_TIME_PENDING: Final = WINDOW_DEVICE_TIME_PREFIX + "pending"
WINDOW_DEVICE_TIME_DROPPED: Final = WINDOW_DEVICE_TIME_PREFIX + "dropped"
TIMING_MODE_WALL_CLOCK: Final = "wall_clock"
TIMING_MODE_CUDA_EVENT: Final = "cuda_event"

# Scale mode.
#: On the end-of-loop summary of a rank that exported only its anomalies
#: (``TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE`` reached, not rank 0); absent otherwise.
SUMMARY_RANK_EXPORT: Final = SUMMARY_PREFIX + "rank_export"
RANK_EXPORT_ANOMALIES_ONLY: Final = "anomalies_only"

# Hangs: a log record when a rank has made no progress for ``TRAINTEL_STALL_SECONDS``, and
# another when it moves again (event names of OpenTelemetry log records, severity WARN / INFO).
EVENT_HANG_SUSPECT: Final = "ml.training.hang_suspect"
EVENT_HANG_RECOVERED: Final = "ml.training.hang_recovered"
#: Seconds since the rank's last progress when the record was written.
HANG_STALLED_SECONDS: Final = "ml.training.hang.stalled_seconds"
#: What the training thread's interpreter is doing (``PYTHON_*``).
HANG_PYTHON: Final = "ml.training.hang.python"
#: Blocked in a call that released the GIL: a collective, I/O, a lock, a sleep. The stack does
#: not move; other threads run.
PYTHON_BLOCKED: Final = "blocked"
#: C code holds the GIL: no Python runs in the process at all (reported by a helper process).
PYTHON_HOLDING_GIL: Final = "holding_gil"
#: Python runs: the training thread's stack moves between samples.
PYTHON_RUNNING: Final = "running"
#: The training thread's innermost Python frame, ``function (file:line)``.
HANG_TOP_FRAME: Final = "ml.training.hang.top_frame"
#: The collective this rank entered and has not completed (absent when it waits in none).
HANG_WAITING_IN: Final = "ml.training.hang.waiting_in"
#: Then, the threads (by name) with a collective in flight: two on one process group can deadlock.
HANG_COLLECTIVE_THREADS: Final = "ml.training.hang.collective_threads"
#: The collective sequence numbers (see ``METRIC_HEARTBEAT_COLLECTIVES_ENTERED``) on the record.
COLLECTIVES_ENTERED: Final = "ml.training.collectives.entered"
COLLECTIVES_COMPLETED: Final = "ml.training.collectives.completed"
#: The training thread's Python stack, most recent call last (OpenTelemetry's attribute).
CODE_STACKTRACE: Final = "code.stacktrace"
THREAD_ID: Final = "thread.id"
#: On a phase's span started off the training thread (an async checkpoint writer's stages, a
#: prefetcher's spans): the thread, as OpenTelemetry names it. Such a span ran beside training.
THREAD_NAME: Final = "thread.name"
