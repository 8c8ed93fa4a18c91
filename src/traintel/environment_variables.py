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

TRAINTEL_RUN_ID: Final = "TRAINTEL_RUN_ID"
"""
.. envvar:: TRAINTEL_RUN_ID

The id shared by every process (rank) of one job, exported as ``ml.training.run_id``.
Default: ``TORCHELASTIC_RUN_ID`` under torchrun, else the Slurm job id (with step), else a
random id per process.
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

TRAINTEL_PEAK_FLOPS: Final = "TRAINTEL_PEAK_FLOPS"
"""
.. envvar:: TRAINTEL_PEAK_FLOPS

Dense peak FLOP/s of one device for the training dtype (positive number, e.g. ``989e12``).
Overrides the built-in device table; required for MFU on devices the table does not know.
"""

TRAINTEL_LOG_EVERY_N_ITERATIONS: Final = "TRAINTEL_LOG_EVERY_N_ITERATIONS"
"""
.. envvar:: TRAINTEL_LOG_EVERY_N_ITERATIONS

Size of the tumbling window (in training iterations) after which a
``training_metrics_update`` event is emitted (positive integer). Default: 50.
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

Seconds the process may spend flushing telemetry at exit (non-negative number). Bounds exit
even when the collector is down or black-holed. Default: 5.
"""

ALL: Final = (
    TRAINTEL_SESSION_TAG,
    TRAINTEL_PERF_TAG,
    TRAINTEL_RUN_ID,
    TRAINTEL_GLOBAL_BATCH_SIZE,
    TRAINTEL_SEQ_LEN,
    TRAINTEL_FLOPS_PER_SAMPLE,
    TRAINTEL_FLOPS_PER_TOKEN,
    TRAINTEL_PEAK_FLOPS,
    TRAINTEL_LOG_EVERY_N_ITERATIONS,
    TRAINTEL_OUTPUT_DIR,
    TRAINTEL_SHUTDOWN_TIMEOUT,
)
"""Every variable above, for documentation checks and the capability report."""
