"""Public configuration entry points: ``configure``, ``set_training_config``, ``shutdown``."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace.export import SpanExporter

from traintel._recorder import active
from traintel._runtime import bootstrap
from traintel._runtime import state as _state
from traintel._runtime.pipeline import PipelineOptions
from traintel._runtime.state import Telemetry


def configure(
    *,
    tracer_provider: trace_api.TracerProvider | None = None,
    meter_provider: metrics_api.MeterProvider | None = None,
    service_name: str | None = None,
    span_exporters: Sequence[SpanExporter] | None = None,
    metric_readers: Sequence[MetricReader] | None = None,
    **training: object,
) -> Telemetry:
    """Configure traintel explicitly and return its handle.

    Training facts (``global_batch_size=``, ``seq_len=``, ``flops_per_sample=``, ``session_tag=``
    ...) override the ``TRAINTEL_*`` variables and may be zero-argument callables resolved when
    needed. Providers default to the global ones when the user set them, else are built from
    ``OTEL_*``. ``span_exporters=`` / ``metric_readers=`` build private providers around exactly
    those (with traintel's batching and export filter), leaving global providers alone.
    Every value is validated before anything is built: a bad one raises
    :class:`~traintel.ConfigurationError` naming the variable or argument and the value.
    """
    options = PipelineOptions(tracer_provider, meter_provider, service_name, span_exporters, metric_readers)
    return bootstrap.configure(options, training)


def set_training_config(**changes: object) -> None:
    """Supply or change training facts after start (e.g. the batch size once the data loader
    exists); they apply from now on. Raises :class:`~traintel.ConfigurationError` on a bad
    value, leaving the previous configuration in force."""
    _state.current().update_config(**changes)


def get_telemetry() -> Telemetry:
    """The current telemetry handle (configuring from the environment if needed)."""
    return _state.current()


def shutdown(timeout_s: float | None = None) -> bool:
    """End open callback spans and flush within ``timeout_s`` (default ``TRAINTEL_SHUTDOWN_TIMEOUT``).
    Returns whether everything was flushed in time. Called automatically at exit."""
    return active.shutdown(timeout_s)
