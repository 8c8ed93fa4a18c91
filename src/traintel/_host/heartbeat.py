"""Hang localisation: where the training thread is, and how long since it moved.

Why sampled on the metric reader's thread from state the training thread already keeps: a rank
stuck in a collective or a kernel has a blocked training thread, so anything it would have to
push never arrives. The reader's thread still runs, reads the engine's open iteration (its
start, its completed step phases) and the processor's registry of open phase spans, and reports
seconds since the last progress, the phase the rank is in and the last iteration it completed.
The NCCL watchdog takes 10-30 minutes and names no rank; these gauges name it at the next
collection. The training thread pays nothing but one timestamp store per completed iteration.
The rank's collective sequence (``traintel.distributed.collectives``) rides along: across ranks,
the one whose count is behind the others' has not joined the collective they wait in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import metrics as metrics_api
from opentelemetry.metrics import CallbackOptions, Observation

from traintel import semconv
from traintel.version import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Span


class OpenSpans(Protocol):
    """What the heartbeat reads of the open-span registry."""

    last_end_ns: int

    def spans(self) -> list[Any]: ...


class Collectives(Protocol):
    """What the heartbeat reads of the rank's collective sequence (``distributed.collectives``)."""

    def snapshot(self) -> tuple[int, int, str]: ...

    def threads_in_flight(self) -> tuple[str, ...]: ...


class RunningIteration(Protocol):
    """What the heartbeat reads of the engine's running iteration."""

    phase: str
    start_ns: int
    children: list[tuple[str, int, int, Any, Any]]
    open_step: Any  # the step phase entered last (``open_name``: its phase while open)


class Progress(Protocol):
    """What the heartbeat reads of the engine (it never writes to it)."""

    iteration_end_ns: int  # when an iteration of any loop last ended
    last_iteration: int | None  # the last training iteration completed
    open_step: Any  # a step open before the next iteration (``open_name``, ``open_since_ns``)

    @property
    def active(self) -> RunningIteration | None: ...

    @property
    def prelude(self) -> Sequence[Any]:
        """The steps done before the next iteration: ((name, start, end, ...), ...)."""


IDLE = "idle"
_Callback = Callable[[CallbackOptions], Iterable[Observation]]


@dataclass(frozen=True)
class HeartbeatSample:
    seconds_since_progress: float
    iteration: int | None  # the last completed training iteration
    phase: str  # the innermost phase open now (IDLE outside any)
    after: str | None  # inside an iteration: its last completed step phase
    collectives_entered: int = 0
    collectives_completed: int = 0
    progress_ns: int = 0  # when (traintel's clock, Unix ns) the rank last made progress
    step: str | None = None  # inside an iteration: the step phase open now, if any
    waiting_in: str | None = None  # the collective entered and not completed, if any
    waiting_threads: tuple[str, ...] = ()  # then: the threads with a collective in flight


class Heartbeat:
    """Reads the engine and the open-span registry; never writes to them."""

    def __init__(
        self, engine: Progress, open_spans: OpenSpans, collectives: Collectives, now_ns: Callable[[], int]
    ) -> None:
        self._engine = engine
        self._open_spans = open_spans
        self._collectives = collectives
        self._now_ns = now_ns  # the recorder's timeline, which the progress it reads is on
        self._started_ns = now_ns()

    def sample(self, now_ns: int | None = None) -> HeartbeatSample:
        now = self._now_ns() if now_ns is None else now_ns
        engine = self._engine
        # The running iteration first, then the last end: the training thread stamps an end
        # before the iteration stops being active, so no iteration ends unseen between the two.
        record = engine.active  # read once: the training thread may replace it meanwhile
        progress = max(self._started_ns, engine.iteration_end_ns, self._open_spans.last_end_ns)
        phase, after, step = IDLE, None, None
        if record is not None:
            phase = record.phase
            step = getattr(record.open_step, "open_name", None)
            progress = max(progress, record.start_ns)
            children = record.children
            if children:
                name, _start, end, _error, _extras = children[-1]
                after = name
                progress = max(progress, end)
        else:
            phase, progress = self._between_iterations(progress)
        entered, completed, name = self._collectives.snapshot()
        seconds = max(0.0, (now - progress) / 1e9)
        waiting_in = name if entered > completed else None
        threads = self._collectives.threads_in_flight() if waiting_in is not None else ()
        last = engine.last_iteration
        return HeartbeatSample(
            seconds, last, phase, after, entered, completed, progress, step, waiting_in, threads
        )

    def _between_iterations(self, progress: int) -> tuple[str, int]:
        """Where the rank is outside any iteration, and its progress: a step before the next
        iteration (loading its batch; the ones done count), else the innermost open phase."""
        engine = self._engine
        before, prelude = engine.open_step, engine.prelude
        if prelude:
            progress = max(progress, prelude[-1][0][2])
        if getattr(before, "open_name", None) is not None:
            return before.open_name, max(progress, before.open_since_ns)
        innermost = self.innermost_open_span()
        if innermost is None:
            return IDLE, progress
        return str((innermost.attributes or {})[semconv.PHASE]), max(progress, innermost.start_time or 0)

    def innermost_open_span(self) -> Span | None:
        """The open phase span started last (spans nest, so it is the innermost one)."""
        try:
            spans = self._open_spans.spans()
        except RuntimeError:  # the registry changed size while copied: no phase this time
            return None
        best = max(spans, key=_phase_start, default=None)  # the first of the latest
        return best if best is not None and _phase_start(best) > 0 else None


def _phase_start(span: Span) -> int:
    """When a phase's span started; 0 for a span of no phase, and for one that runs beside
    training on a thread of its own (an async writer's stage is not where training is)."""
    attributes = span.attributes or {}
    if attributes.get(semconv.PHASE) is None or semconv.THREAD_NAME in attributes:
        return 0
    return span.start_time or 0


class HeartbeatInstruments:
    """The heartbeat gauges; their callbacks run on the metric reader's thread.

    ``source`` is asked for the current heartbeat at every collection (``None``: report
    nothing) rather than holding one: configured again on the same meter provider, the SDK keeps
    the first registration of each gauge, which must then follow the new engine.
    """

    def __init__(
        self, meter_provider: metrics_api.MeterProvider, source: Callable[[], Heartbeat | None]
    ) -> None:
        meter = meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE, __version__)
        self._source = source
        self._sample: HeartbeatSample | None = None
        for name, callback, unit, description in (
            (semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS, self._seconds, "s",
             "Seconds since this rank last made progress (an iteration or phase began or ended)"),
            (semconv.METRIC_HEARTBEAT_ITERATION, self._read(lambda s: s.iteration), "{iteration}",
             "The last training iteration this rank completed"),
            (semconv.METRIC_HEARTBEAT_PHASE, self._phase, "1",
             "1 for the phase this rank is in now, with its last completed step phase"),
            # none before a collective: a process alone has no sequence
            (semconv.METRIC_HEARTBEAT_COLLECTIVES_ENTERED,
             self._read(lambda s: s.collectives_entered or None), "{collective}",
             "Collectives this rank entered; behind the other ranks': it never joined theirs"),
            (semconv.METRIC_HEARTBEAT_COLLECTIVES_COMPLETED,
             self._read(lambda s: s.collectives_completed if s.collectives_entered else None), "{collective}",
             "Collectives this rank entered that completed; one short of entered: it waits in one"),
        ):  # fmt: skip
            meter.create_observable_gauge(name, [callback], unit=unit, description=description)

    def _seconds(self, options: CallbackOptions) -> Iterable[Observation]:
        # The first callback of a collection samples; the others reuse it, so the gauges
        # describe one moment.
        heartbeat = self._source()
        self._sample = sample = heartbeat.sample() if heartbeat is not None else None
        return [] if sample is None else [Observation(sample.seconds_since_progress)]

    def _read(self, value: Callable[[HeartbeatSample], int | None]) -> _Callback:
        """A gauge of one value of the collection's sample (none where ``value`` gives None)."""

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            sample = self._sample
            found = None if sample is None else value(sample)
            return [] if found is None else [Observation(found)]

        return observe

    def _phase(self, options: CallbackOptions) -> Iterable[Observation]:
        sample = self._sample
        if sample is None:
            return []
        attributes = {semconv.PHASE: sample.phase}
        if sample.after is not None:
            attributes[semconv.HEARTBEAT_AFTER] = sample.after
        return [Observation(1, attributes)]
