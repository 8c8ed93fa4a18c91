"""A ``torch.monitor`` event handler: code instrumented with torch.monitor lands in OTel backends.

Why a bridge and not a replacement: ``torch.monitor.Stat`` aggregates in C++ at a few
microseconds per ``add`` and many libraries already log through it (reference 002). The bridge
keeps that cost and forwards what torch.monitor emits:

- every event (``torch.monitor.log_event``) becomes a span event, with its own name, timestamp
  and data, on the span current where it was logged (an iteration, a loop, a user span);
- each ``Stat`` window (the ``torch.monitor.Stat`` event, data ``{"<stat>.<aggregation>": value}``)
  also sets one gauge, ``ml.training.torch_monitor.stat``, keyed by ``torch.monitor.stat``, so
  the aggregates become time series (one series per stat and aggregation: bounded cardinality).

Handlers run synchronously on the logging thread; this one never raises into torch.
"""

from __future__ import annotations

import datetime
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._runtime import state as _state
from traintel.version import __version__


def _epoch_ns(timestamp: datetime.datetime) -> int:
    """torch.monitor timestamps are naive local datetimes (its system clock); exact to the µs."""
    seconds = timestamp.replace(microsecond=0).timestamp()
    return int(seconds) * 1_000_000_000 + timestamp.microsecond * 1_000


class TorchMonitorBridge:
    """Registers itself with ``torch.monitor.register_event_handler``; ``with`` or
    :meth:`install` / :meth:`uninstall`."""

    def __init__(self) -> None:
        self._handle: Any = None
        self._gauge: Any = None

    def install(self) -> TorchMonitorBridge:
        import torch.monitor

        if self._handle is None:
            meter_provider = _state.current().meter_provider
            if meter_provider is not None:
                meter = meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE, __version__)
                self._gauge = meter.create_gauge(
                    semconv.METRIC_TORCH_MONITOR_STAT,
                    description="The latest window aggregate of each torch.monitor Stat",
                )
            self._handle = torch.monitor.register_event_handler(self._on_event)
        return self

    def uninstall(self) -> None:
        import torch.monitor

        handle, self._handle = self._handle, None
        if handle is not None:
            torch.monitor.unregister_event_handler(handle)

    def __enter__(self) -> TorchMonitorBridge:
        return self.install()

    def __exit__(self, *exc_info: object) -> None:
        self.uninstall()

    def _on_event(self, event: Any) -> None:
        try:
            data: dict[str, AttributeValue] = dict(event.data)
            timestamp = _epoch_ns(event.timestamp)
            span = trace_api.get_current_span()
            if span.is_recording():
                span.add_event(event.name, data, timestamp=timestamp)
            if event.name == semconv.TORCH_MONITOR_STAT_EVENT and self._gauge is not None:
                for key, value in data.items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        self._gauge.set(value, {semconv.TORCH_MONITOR_STAT: key})
        except Exception:
            _state.current().warn_once("torch_monitor", "torch.monitor bridge: could not forward an event")


def bridge_torch_monitor() -> TorchMonitorBridge:
    """Forward torch.monitor events and ``Stat`` windows from now on; returns the bridge."""
    return TorchMonitorBridge().install()


__all__ = ["TorchMonitorBridge", "bridge_torch_monitor"]
