"""What the recorder needs of everything around it, named as protocols.

Why: the recorder is the per-step hot path and imports only aggregation, the configuration
and the OpenTelemetry internals module. What it uses of the SDK side is given to the engine
through its constructor, by the runtime's bootstrap; these protocols say exactly what that is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from opentelemetry.trace import Span, SpanContext
from opentelemetry.util.types import AttributeValue

from traintel._aggregation.window import ClosedWindow
from traintel.config import Settings, TrainingConfig


class TraceBudget(Protocol):
    """Spans and estimated bytes exported so far per trace (counted by the export filter)."""

    def usage(self, trace_id: int) -> tuple[int, int]: ...


class IdSteering(Protocol):
    """The tracer's id generator, steered so an exported iteration keeps the id drawn for it."""

    def force(self, span_id: int, trace_id: int | None = None) -> None: ...

    def clear(self) -> None: ...

    def is_trace_id_random(self) -> bool: ...


class HeldSpans(Protocol):
    """The export filter: spans started inside an undecided iteration wait there."""

    def close_iteration(self, span_id: int, export: bool) -> None: ...


class DirectWriter(Protocol):
    """Writes traintel's own finished spans straight to the export path, while nothing but the
    exporters would see them (see ``SpanWriter`` in the OpenTelemetry internals module)."""

    def usable(self) -> bool: ...

    def write(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: Mapping[str, AttributeValue],
        start_ns: int,
        end_ns: int,
    ) -> None: ...


class WindowSink(Protocol):
    """The window pipeline: what the engine hands closed windows to, and asks about them."""

    def submit(
        self,
        window: ClosedWindow,
        config: TrainingConfig,
        settings: Settings,
        loop: Span | None,
        ended_loop: Span | None,
    ) -> None: ...

    def then(self, task: Callable[[], None]) -> None:
        """Run ``task`` once the windows handed over so far are processed."""
        ...

    def flush(self, timeout_s: float | None = ...) -> bool: ...

    def summary(self, train_time_s: float | None) -> dict[str, float | int | str]:
        """The loop's at-a-glance numbers: the totals of all its windows."""
        ...

    def window_size_for(self, index: int) -> tuple[int, float] | None:
        """The iterations of window ``index`` and the pace (s per iteration, 0.0 if none yet)
        the ranks of a multi-rank job agreed on (None: one process, whose windows close on its
        own clock)."""
        ...


class CheckpointMetrics(Protocol):
    """The checkpoint histograms and failure counter (the metric instruments)."""

    def checkpoint_saved(self, duration_s: float, size_bytes: int | None, strategy: str) -> None: ...

    def checkpoint_loaded(self, duration_s: float) -> None: ...

    def checkpoint_failed(self, phase: str) -> None: ...

    def background_written(self, size_bytes: int | None) -> None: ...


class PhaseHooks(Protocol):
    """Called at each phase's start and end when a device feature is on."""

    def started(self, phase: str, iteration: int | None = None) -> None: ...

    def ended(self, phase: str) -> None: ...


class OpenPhases(Protocol):
    """The registry of open spans: is a plain OpenTelemetry span of this phase open?"""

    def is_open(self, phase: str) -> bool: ...
