"""Every ``TRAINTEL_*`` environment variable, documented beside its constant.

Everything OpenTelemetry owns (service name, resource attributes, exporters, endpoints,
protocols, headers, TLS, sampler, batch-processor and metric-reader settings,
``OTEL_SDK_DISABLED``) is configured with the standard ``OTEL_*`` variables and read by the
OpenTelemetry SDK itself. The ``OTEL_`` prefix is reserved to OpenTelemetry, so training facts
use ``TRAINTEL_``. The README's table is checked against this module by a test.
"""

from __future__ import annotations

from typing import Final

TRAINTEL_SESSION_TAG: Final = "TRAINTEL_SESSION_TAG"
"""
.. envvar:: TRAINTEL_SESSION_TAG

Identifies the jobs that together make one logical training task (a job and the jobs that
resume it from its checkpoints). Exported as the ``ml.training.session_tag`` resource
attribute. Default: the run id, i.e. every job is its own session.
"""

TRAINTEL_PERF_TAG: Final = "TRAINTEL_PERF_TAG"
"""
.. envvar:: TRAINTEL_PERF_TAG

Identifies jobs that are expected to perform alike (same code, config and hardware), so their
numbers can be compared. Exported as ``ml.training.perf_tag``. Default: unset.
"""

TRAINTEL_HYPERPARAMETERS: Final = "TRAINTEL_HYPERPARAMETERS"
"""
.. envvar:: TRAINTEL_HYPERPARAMETERS

The run's hyper-parameters as a JSON object of names to numbers, strings or booleans, e.g.
``{"lr": 0.0003, "optimizer": "adamw"}`` (in code: ``hyperparameters={...}`` to ``configure()``
or ``set_training_config()``, which replaces the whole set). Recorded with the configuration,
shown in the report's configuration panel and compared by ``traintel compare``. Default: unset.
"""

TRAINTEL_RUN_ID: Final = "TRAINTEL_RUN_ID"
"""
.. envvar:: TRAINTEL_RUN_ID

The id shared by every process (rank) of one job, exported as ``ml.training.run_id``.
Default: ``TORCHELASTIC_RUN_ID`` under torchrun (without ``--rdzv-id`` torchrun sets it to
``none``: then an id of the launch, shared by its ranks on one node and by its restarts; on
several nodes pass ``--rdzv-id`` or set this), else the Slurm job id (with step), else a random
id per process.
"""

TRAINTEL_GLOBAL_BATCH_SIZE: Final = "TRAINTEL_GLOBAL_BATCH_SIZE"
"""
.. envvar:: TRAINTEL_GLOBAL_BATCH_SIZE

Samples per optimizer step across all ranks (positive integer). Needed for sample throughput
when iterations do not report their own sample counts.
"""

TRAINTEL_SEQ_LEN: Final = "TRAINTEL_SEQ_LEN"
"""
.. envvar:: TRAINTEL_SEQ_LEN

Tokens per sample (positive integer). Needed for token throughput when iterations do not
report their own token counts.
"""

TRAINTEL_FLOPS_PER_SAMPLE: Final = "TRAINTEL_FLOPS_PER_SAMPLE"
"""
.. envvar:: TRAINTEL_FLOPS_PER_SAMPLE

Model FLOPs for one training sample, forward and backward (positive number). Used for TFLOP/s
and MFU.
"""

TRAINTEL_FLOPS_PER_TOKEN: Final = "TRAINTEL_FLOPS_PER_TOKEN"
"""
.. envvar:: TRAINTEL_FLOPS_PER_TOKEN

Model FLOPs for one training token, forward and backward (positive number), e.g. ``6 * N``
for a dense transformer of N parameters plus the attention term. Alternative to
``TRAINTEL_FLOPS_PER_SAMPLE``.
"""

TRAINTEL_EXECUTED_FLOPS_PER_SAMPLE: Final = "TRAINTEL_EXECUTED_FLOPS_PER_SAMPLE"
"""
.. envvar:: TRAINTEL_EXECUTED_FLOPS_PER_SAMPLE

FLOPs the hardware executes per sample, activation recomputation included (positive number).
With it, HFU is reported next to MFU. ``traintel.apply_flops(measure_flops(...))`` sets it.
"""

TRAINTEL_PEAK_FLOPS: Final = "TRAINTEL_PEAK_FLOPS"
"""
.. envvar:: TRAINTEL_PEAK_FLOPS

Dense peak FLOP/s of one device for the training dtype (positive number, e.g. ``989e12``).
Overrides the built-in device table; required for MFU on devices the table does not know.
"""

TRAINTEL_LOG_EVERY_N_ITERATIONS: Final = "TRAINTEL_LOG_EVERY_N_ITERATIONS"
"""
.. envvar:: TRAINTEL_LOG_EVERY_N_ITERATIONS

The fewest training iterations in a window (positive integer): a window closes, with its
``training_metrics_update`` event and its goodput record, after this many iterations once it
also spans :envvar:`TRAINTEL_WINDOW_MIN_SECONDS`, or after
:envvar:`TRAINTEL_LOG_EVERY_N_SECONDS` whatever its count. Set explicitly, it wins over the floor's
default: windows close every N iterations unless :envvar:`TRAINTEL_WINDOW_MIN_SECONDS` is set too.
Default: 50.
"""

TRAINTEL_WINDOW_MIN_SECONDS: Final = "TRAINTEL_WINDOW_MIN_SECONDS"
"""
.. envvar:: TRAINTEL_WINDOW_MIN_SECONDS

The shortest window in seconds (non-negative number; at most
:envvar:`TRAINTEL_LOG_EVERY_N_SECONDS`): a fast loop's windows grow past
:envvar:`TRAINTEL_LOG_EVERY_N_ITERATIONS` until they span this long, which bounds the records
exported per hour and the time spent closing windows. ``0`` closes every N iterations. In a job
of several ranks the ranks agree on each window's iterations from the slowest rank's pace two
windows earlier (needs the cross-rank exchange; with ``TRAINTEL_CROSS_RANK=off`` windows are N
iterations). Applies when :envvar:`TRAINTEL_LOG_EVERY_N_ITERATIONS` is not set, or when this is
set too. Default: 30.
"""

TRAINTEL_LOG_EVERY_N_SECONDS: Final = "TRAINTEL_LOG_EVERY_N_SECONDS"
"""
.. envvar:: TRAINTEL_LOG_EVERY_N_SECONDS

The longest window in seconds (positive number): a window closes once its iterations span this
long, even before :envvar:`TRAINTEL_LOG_EVERY_N_ITERATIONS` of them. In a backend, a killed job's
accounting loses at most this much training time plus the export delay of its last window record
(on one process; in a job of several ranks the agreed size is predicted from the pace two windows
earlier); with the embedded file, the progress mark beside it bounds the loss to 5 s. Default: 60.
"""

TRAINTEL_OUTPUT_DIR: Final = "TRAINTEL_OUTPUT_DIR"
"""
.. envvar:: TRAINTEL_OUTPUT_DIR

Directory of the embedded default exporter's OTLP-JSON-lines files. Default:
``./traintel-runs``.
"""

TRAINTEL_SHUTDOWN_TIMEOUT: Final = "TRAINTEL_SHUTDOWN_TIMEOUT"
"""
.. envvar:: TRAINTEL_SHUTDOWN_TIMEOUT

Seconds the process may spend flushing telemetry at exit (0 to 86400). Bounds exit even when
the collector is down or black-holed. Default: 5.
"""

TRAINTEL_STALL_SECONDS: Final = "TRAINTEL_STALL_SECONDS"
"""
.. envvar:: TRAINTEL_STALL_SECONDS

Seconds a rank may make no progress before it reports a hang suspect: an OpenTelemetry log
record with the training thread's Python stack, its collective sequence numbers and whether its
Python is running, blocked in C, or held by C code holding the GIL (0 to 86400; 0 turns the
watcher off). Progress is an iteration or phase that starts or ends, or a collective that is
entered or completes. Watched: a rank waiting in a collective, and once the first training
iteration completed, a rank inside any phase below ``application``. Default: 30, a twentieth of
NCCL's 10-minute collective timeout (gloo's is 30 minutes), and longer than a healthy step or a
typical checkpoint save; a first compiled step or a very large synchronous save can take
longer, and then reports one suspect and its recovery (raise it for such jobs).
"""

TRAINTEL_WARMUP_ITERATIONS: Final = "TRAINTEL_WARMUP_ITERATIONS"
"""
.. envvar:: TRAINTEL_WARMUP_ITERATIONS

Iterations at the start of each job left out of the cumulative statistics (non-negative
integer): the first step compiles kernels and warms caches. Windows include them. Default: 1.
"""

TRAINTEL_DTYPE: Final = "TRAINTEL_DTYPE"
"""
.. envvar:: TRAINTEL_DTYPE

The compute dtype that selects the peak FLOP/s column: ``bf16``, ``fp16``, ``fp32``, ``tf32``
or ``fp8``; it overrides what traintel sees. Default, in this order: the CUDA autocast dtype when
autocast is active at the start of an iteration or step phase in the first window (``with
torch.autocast(...)`` around the iteration or around ``model_forward()``; entered inside the
phase, traintel cannot see it); the dtype of most of the model's parameters where traintel saw
the model (``measure_flops``, the Lightning and Hugging Face integrations); ``tf32`` when fp32
matmuls may use TF32 (``torch.set_float32_matmul_precision("high")``); else ``fp32``, with a
warning that it was assumed. The choice and its reason are on every MFU value
(``ml.training.mfu.dtype``, ``ml.training.mfu.dtype_reason``).
"""

TRAINTEL_FLOPS_METHOD: Final = "TRAINTEL_FLOPS_METHOD"
"""
.. envvar:: TRAINTEL_FLOPS_METHOD

How ``TRAINTEL_FLOPS_PER_*`` was obtained, published next to every MFU value: ``config``
(a number you worked out), ``formula`` (an analytic formula such as 6N), ``counter``
(``traintel.measure_flops``, or the integrations' count of their first step), ``counter+attention``
(that count plus the attention term torch's counter has no formula for on CPU) or ``callable``.
Default: ``config`` (``callable`` for callables).
"""

TRAINTEL_EXPORT_ITERATIONS: Final = "TRAINTEL_EXPORT_ITERATIONS"
"""
.. envvar:: TRAINTEL_EXPORT_ITERATIONS

Which iterations are exported as spans: ``sampled`` (the first K, every M-th, slow ones and
those with errors or non-finite metrics), ``all``, or ``none`` (metrics only). Every iteration
is counted in the metrics whatever the policy. Default: ``sampled``.
"""

TRAINTEL_EXPORT_FIRST_ITERATIONS: Final = "TRAINTEL_EXPORT_FIRST_ITERATIONS"
"""
.. envvar:: TRAINTEL_EXPORT_FIRST_ITERATIONS

K: the first K iterations of each loop are exported (non-negative integer). Default: 10.
"""

TRAINTEL_EXPORT_EVERY_N_ITERATIONS: Final = "TRAINTEL_EXPORT_EVERY_N_ITERATIONS"
"""
.. envvar:: TRAINTEL_EXPORT_EVERY_N_ITERATIONS

M: every M-th iteration is exported (non-negative integer; 0 turns it off). Default: 100.
"""

TRAINTEL_EXPORT_EVERY_N_SECONDS: Final = "TRAINTEL_EXPORT_EVERY_N_SECONDS"
"""
.. envvar:: TRAINTEL_EXPORT_EVERY_N_SECONDS

Ties every-M-th to time (non-negative number of seconds): the stride doubles (M, 2M, 4M ...)
until the sampled iterations are at least this far apart at the loop's pace (in a job of
several ranks, the slowest rank's pace, agreed through the cross-rank exchange, so every rank
samples the same iteration numbers). A loop of any speed then exports about one routine
iteration per this many seconds. ``0`` samples every M-th whatever the pace. Default: 60.
"""

TRAINTEL_EXPORT_TAIL_PER_MINUTE: Final = "TRAINTEL_EXPORT_TAIL_PER_MINUTE"
"""
.. envvar:: TRAINTEL_EXPORT_TAIL_PER_MINUTE

How many iterations per minute, on average, are exported for being slow or non-finite
(non-negative number): a noisy or diverging loop can be slow or NaN at every step. Bursts of up
to two minutes' allowance go out whole; beyond it such iterations are counted (the window
record's ``slow_iterations`` / ``nonfinite_iterations``, ``traintel.iterations.exported``) but
not exported. Iterations that raised are always exported. Default: 1.
"""

TRAINTEL_WINDOW_EVENTS: Final = "TRAINTEL_WINDOW_EVENTS"
"""
.. envvar:: TRAINTEL_WINDOW_EVENTS

``on`` also puts each window's full ``training_metrics_update`` event (about 40 attributes, the
shape NVIDIA one-logger users know) on the training loop span; the ``training_window`` span then
carries the goodput record alone. ``off`` exports each window once, as its compact
``training_window`` span: the same numbers without those another one gives exactly, which the
report commands restore. Default: ``off``.
"""

TRAINTEL_SLOW_ITERATION_FACTOR: Final = "TRAINTEL_SLOW_ITERATION_FACTOR"
"""
.. envvar:: TRAINTEL_SLOW_ITERATION_FACTOR

k: an iteration slower than k times the rolling median of the last 101 iterations is slow:
it is exported and a ``slow_iteration`` event names it (number greater than 1). Default: 3.
"""

TRAINTEL_SEGMENT_ITERATIONS: Final = "TRAINTEL_SEGMENT_ITERATIONS"
"""
.. envvar:: TRAINTEL_SEGMENT_ITERATIONS

A long run is cut into traces ("segments") of at most this many training iterations
(positive integer). Not set by default: segments are cut by time (below) and by their span and
byte budgets, because a count of iterations is a different length of time at every step rate
(at 100,000 steps per second a million iterations are 10 s: 360 traces an hour).
"""

TRAINTEL_SEGMENT_SECONDS: Final = "TRAINTEL_SEGMENT_SECONDS"
"""
.. envvar:: TRAINTEL_SEGMENT_SECONDS

... or of at most this many seconds, whichever comes first (positive number). Default: 600.
"""

TRAINTEL_MAX_SPANS_PER_TRACE: Final = "TRAINTEL_MAX_SPANS_PER_TRACE"
"""
.. envvar:: TRAINTEL_MAX_SPANS_PER_TRACE

Span budget of one trace; a segment is closed early before it is exceeded (positive
integer). Default: 2000, where Jaeger's UI is still comfortable.
"""

TRAINTEL_MAX_BYTES_PER_TRACE: Final = "TRAINTEL_MAX_BYTES_PER_TRACE"
"""
.. envvar:: TRAINTEL_MAX_BYTES_PER_TRACE

Estimated OTLP bytes budget of one trace (positive integer). Default: 4,000,000, under
Tempo's default 5 MB ``max_bytes_per_trace``.
"""
TRAINTEL_CROSS_RANK: Final = "TRAINTEL_CROSS_RANK"
"""
.. envvar:: TRAINTEL_CROSS_RANK

``auto`` or ``off``. With ``auto``, when ``torch.distributed`` is initialised with more than one
rank, every window's per-rank iteration, data-loading and compute times are exchanged over a
gloo group of traintel's own (off the training thread) for cross-rank statistics and
straggler detection. Default: ``auto``.
"""

TRAINTEL_CROSS_RANK_TIMEOUT: Final = "TRAINTEL_CROSS_RANK_TIMEOUT"
"""
.. envvar:: TRAINTEL_CROSS_RANK_TIMEOUT

Seconds (above 0, at most 86400) an exchange may wait for the other ranks (the gloo group's timeout,
and the bound on the wait at the end of the training loop). A rank that is dead or hung makes
the exchange time out and stop; training goes on. A rank already dead when the group is to be
made costs the others at most 5 s (or this, if shorter), once. Default: 30.
"""

TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE: Final = "TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE"
"""
.. envvar:: TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE

World size (positive integer) from which the job reduces its telemetry: rank 0 exports
everything plus the job-level statistics (with the top-k rank ids); the other ranks export only
their own anomalies (slow, failed or non-finite iterations, straggler events, a chronically
lagging compute EWMA) and what only they can tell (heartbeat, checkpoint and phase spans), no
window series or window events. Decided once per job. Default: 64.
"""

TRAINTEL_CROSS_RANK_TOP_K: Final = "TRAINTEL_CROSS_RANK_TOP_K"
"""
.. envvar:: TRAINTEL_CROSS_RANK_TOP_K

How many of the slowest ranks (by compute time before the synchronisation point) each window
names (positive integer). Default: 3.
"""

TRAINTEL_STRAGGLER_FACTOR: Final = "TRAINTEL_STRAGGLER_FACTOR"
"""
.. envvar:: TRAINTEL_STRAGGLER_FACTOR

k: the slowest rank of a window is a straggler when its compute time before the
synchronisation point exceeds k times the median of the other ranks' (and by at least 5 ms);
its EWMA above k times theirs makes the lag chronic (number greater than 1). Default: 1.25.
"""


TRAINTEL_CUDA_EVENT_TIMING: Final = "TRAINTEL_CUDA_EVENT_TIMING"
"""
.. envvar:: TRAINTEL_CUDA_EVENT_TIMING

``on`` or ``off`` (default). On, forward / backward / optimizer GPU time is measured with CUDA
events recorded at the phase boundaries and resolved later without synchronising; it lands in
``training_metrics_update`` as ``ml.training.window.device_time.*``. Needs CUDA: without it the
setting is refused with one warning.
"""

TRAINTEL_NVTX: Final = "TRAINTEL_NVTX"
"""
.. envvar:: TRAINTEL_NVTX

``on`` or ``off`` (default). On, every phase span also pushes an NVTX range named after the
phase (and the iteration number), so an Nsight Systems timeline lines up with the traces.
Needs CUDA: without it the setting is refused with one warning.
"""

TRAINTEL_MEASURE_PEAK: Final = "TRAINTEL_MEASURE_PEAK"
"""
.. envvar:: TRAINTEL_MEASURE_PEAK

``on`` or ``off`` (default). On, a dense matmul in the run's compute dtype is timed once on the
GPU when the first window closes (at most 15 s; training waits), and MFU is also reported
against that measured peak (``ml.training.mfu.measured``, ``ml.training.window.mfu_measured``,
``ml.training.mfu.measured_peak_flops``) next to the datasheet's. Needs CUDA.
"""

TRAINTEL_ENERGY_PRICE_PER_KWH: Final = "TRAINTEL_ENERGY_PRICE_PER_KWH"
"""
.. envvar:: TRAINTEL_ENERGY_PRICE_PER_KWH

Price of one kWh of GPU energy (positive number, in any currency). Set, the energy the job's
GPUs drew (NVML's energy counter) also gives its cost: ``ml.training.energy.cost`` and
``ml.training.summary.energy.cost``, in that currency. Unset: no cost.
"""

TRAINTEL_SPOOL_DIR: Final = "TRAINTEL_SPOOL_DIR"
"""
.. envvar:: TRAINTEL_SPOOL_DIR

Directory of the export spool: span batches the collector did not take are kept here (one
subdirectory per process, 0700; files 0600) and re-sent when it is back, or later with
``traintel replay DIR``. Default: ``spool`` under :envvar:`TRAINTEL_OUTPUT_DIR`. Nothing is
created unless an export fails.
"""

TRAINTEL_SPOOL_MAX_BYTES: Final = "TRAINTEL_SPOOL_MAX_BYTES"
"""
.. envvar:: TRAINTEL_SPOOL_MAX_BYTES

Bound of each process's export spool on disk, in bytes (non-negative integer; 0 turns the
spool off, failed batches are then dropped and counted). When full, the oldest batches are
dropped and counted in ``traintel.spool.dropped`` and ``traintel.spans.dropped``
(``traintel.drop.reason=spool_full``). Default: 268435456 (256 MiB).
"""

TRAINTEL_SPOOL_RETRY_INTERVAL: Final = "TRAINTEL_SPOOL_RETRY_INTERVAL"
"""
.. envvar:: TRAINTEL_SPOOL_RETRY_INTERVAL

Seconds between attempts to re-send the oldest spooled batch while the collector is failing
(positive number). Once one goes through, the rest follow at once. Default: 5.
"""

TRAINTEL_TRACE_URL: Final = "TRAINTEL_TRACE_URL"
"""
.. envvar:: TRAINTEL_TRACE_URL

Read by the ``traintel`` command, not by training: a URL template that turns every trace id in
``summary``, ``goodput``, ``report`` (terminal and HTML) and ``compare`` into a link to your trace
backend. ``{trace_id}`` is replaced by the 32-hex-digit trace id, ``{span_id}`` (optional) by the
span's id. Jaeger: ``http://localhost:16686/trace/{trace_id}``. Tempo in Grafana:
``http://localhost:3000/explore?left={"datasource":"tempo","queries":[{"query":"{trace_id}"}]}``.
Default: unset (ids are shown as plain text).
"""

TRAINTEL_QUIET: Final = "TRAINTEL_QUIET"
"""
.. envvar:: TRAINTEL_QUIET

``1`` (or ``true``) silences the lines traintel writes to standard error when a job's telemetry
starts and ends, saying where it goes (the file, and at the end the command that reads it, or
the OTLP endpoint).
Default: ``0``.
"""

#: Every variable above, in order, for documentation checks and the capability report.
ALL: Final[tuple[str, ...]] = tuple(
    value for name, value in dict(globals()).items() if name.startswith("TRAINTEL_")
)
