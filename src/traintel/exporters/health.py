"""Self-telemetry: what traintel's own export path lost, split, spooled and still holds.

Why plain counters read by observable instruments: the places that lose data are the SDK's
export threads and the batch processor's ``on_end``; calling the metrics SDK there would add
work (and a second failure mode) to the path that is already in trouble. The counters are
process-wide: every pipeline of the process adds to the same totals, which the ``traintel.*``
instruments report at each collection and the exit report prints. A silent drop is a bug.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from opentelemetry import metrics as metrics_api
from opentelemetry.metrics import CallbackOptions, Observation

from traintel import semconv
from traintel.exporters.spool import Spool
from traintel.version import __version__

_logger = logging.getLogger(__name__)

#: ``traintel.drop.reason`` values on ``traintel.spans.dropped``.
QUEUE_FULL = "queue_full"
SPOOL_FULL = "spool_full"
NOT_SPOOLED = "not_spooled"
TOO_LARGE = "too_large"
EXIT_TIMEOUT = "exit_timeout"
#: A span no encoder takes even mended (see ``span_repair``).
UNENCODABLE = "unencodable"
#: Spans a collector refused inside a request it accepted (OTLP partial success).
COLLECTOR_REJECTED = "collector_rejected"
#: Spans the embedded file could not take (a full disk, an unwritable directory).
NOT_WRITTEN = "not_written"
#: Reported as zero too (a series per reason from the start); the others once they happen, so
#: that each metric line of a healthy run stays as small as before (the volume budget).
_ALWAYS_REPORTED = (QUEUE_FULL, SPOOL_FULL, NOT_SPOOLED, TOO_LARGE, EXIT_TIMEOUT)


@dataclass(frozen=True)
class HealthSnapshot:
    spans_dropped: dict[str, int]
    events_dropped: int
    export_failures: int
    batches_split: int
    queue_depth: int
    spool_bytes: int
    spool_batches: int
    spool_spans: int
    spool_dropped_batches: int
    spans_spooled: int
    spans_resent: int
    spool_dirs: tuple[str, ...]
    metric_export_failures: int = 0
    metric_exports_delivered: int = 0
    #: The last metric export failed, or had not finished when the snapshot was taken.
    metrics_undelivered: bool = False
    #: A metric export had not finished when the snapshot was taken (at exit: one the bounded
    #: shutdown gave up on, whose totals the collector never confirmed).
    metric_export_unfinished: bool = False
    #: Spooled spans set aside (rejected by the collector, or unreadable), and where.
    spans_quarantined: int = 0
    quarantine_dirs: tuple[str, ...] = ()
    #: Spans exported with their invalid text mended (see ``span_repair``).
    spans_repaired: int = 0
    #: Metric lines the embedded file could not take.
    metric_lines_not_written: int = 0
    #: Metric collections the SDK's reader gave up on (MetricsTimeoutError).
    metric_collection_timeouts: int = 0


#: The plain counters of :class:`ExportHealth`, added to by :meth:`ExportHealth.add`.
Counter = Literal[
    "events_dropped",
    "export_failures",
    "batches_split",
    "spans_spooled",
    "spans_resent",
    "spans_repaired",
    "metric_lines_not_written",
    "metric_collection_timeouts",
]


class ExportHealth:
    """Process-wide counters of the export path, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans_dropped: dict[str, int] = {}
        self.events_dropped = 0
        self.export_failures = 0
        self.batches_split = 0
        self.spans_spooled = 0
        self.spans_resent = 0
        self.spans_repaired = 0
        self.metric_lines_not_written = 0
        self.metric_collection_timeouts = 0
        self.metric_export_failures = 0
        #: What the export path is waiting on now (a file write, a collector), with how many.
        self._busy: dict[str, int] = {}
        self.metric_exports_delivered = 0
        #: False on a rank that exports only its anomalies (scale mode): a zero is not reported,
        #: so a healthy rank adds no self-telemetry series.
        self.report_zeros = True
        self._metric_export_running = 0
        self._last_metric_export_failed = False
        self._queues: weakref.WeakSet[_Sized] = weakref.WeakSet()
        self._spools: weakref.WeakSet[Spool] = weakref.WeakSet()
        self._reported: list[str] = []

    # --- counting ----------------------------------------------------------------------------
    def drop_spans(self, reason: str, count: int) -> None:
        with self._lock:
            self.spans_dropped[reason] = self.spans_dropped.get(reason, 0) + count

    def add(self, counter: Counter, count: int = 1) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + count)

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Mark the export path as waiting on ``what`` (the telemetry file, a collector) for the
        block: a bounded exit that runs out names it instead of guessing."""
        with self._lock:
            self._busy[what] = self._busy.get(what, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._busy.pop(what) - 1
                if left:
                    self._busy[what] = left

    def busy_now(self) -> list[str]:
        with self._lock:
            return sorted(self._busy)

    def metric_export_started(self) -> None:
        with self._lock:
            self._metric_export_running += 1

    def metric_export_done(self, delivered: bool) -> None:
        with self._lock:
            self._metric_export_running = max(0, self._metric_export_running - 1)
            self._last_metric_export_failed = not delivered
            if delivered:
                self.metric_exports_delivered += 1
            else:
                self.metric_export_failures += 1

    # --- what is watched ---------------------------------------------------------------------
    def watch_queue(self, queue: _Sized) -> None:
        self._queues.add(queue)

    def watch_spool(self, spool: Spool) -> None:
        self._spools.add(spool)

    def new_report_lines(self) -> list[str]:
        """:func:`describe` of now, or nothing if that was already reported (a process that
        shuts down more than one pipeline says it once)."""
        lines = describe(self.snapshot())
        with self._lock:
            if lines == self._reported:
                return []
            self._reported = lines
        return lines

    def snapshot(self) -> HealthSnapshot:
        spools = list(self._spools)
        with self._lock:
            spans_dropped = dict(self.spans_dropped)
            for spool in spools:  # the bound's drops are counted by the spool itself
                if spool.dropped_spans:
                    spans_dropped[SPOOL_FULL] = spans_dropped.get(SPOOL_FULL, 0) + spool.dropped_spans
            return HealthSnapshot(
                spans_dropped=spans_dropped,
                **{counter: getattr(self, counter) for counter in get_args(Counter)},
                queue_depth=sum(q.depth() for q in list(self._queues)),
                **_spool_fields(spools),
                metric_export_failures=self.metric_export_failures,
                metric_exports_delivered=self.metric_exports_delivered,
                metrics_undelivered=self._metric_export_running > 0
                or (self.metric_export_failures > 0 and self._last_metric_export_failed),
                metric_export_unfinished=self._metric_export_running > 0,
            )


def _spool_fields(spools: list[Spool]) -> dict[str, Any]:
    """The snapshot's spool figures, summed over the spools; the spools that hold batches, and
    those that set some aside."""
    return {
        "spool_bytes": sum(s.size_bytes for s in spools),
        "spool_batches": sum(len(s) for s in spools),
        "spool_spans": sum(s.pending_spans for s in spools),
        "spool_dropped_batches": sum(s.dropped_batches for s in spools),
        "spans_quarantined": sum(s.quarantined_spans for s in spools),
        "spool_dirs": tuple(sorted(str(s.directory) for s in spools if len(s))),
        "quarantine_dirs": tuple(sorted(str(s.quarantine_directory) for s in spools if s.quarantined_spans)),
    }


class _Sized(Protocol):  # the queue guard (spooling.py, which imports this module)
    def depth(self) -> int: ...


#: The process's export health.
HEALTH = ExportHealth()


def _failures_by_signal(s: HealthSnapshot) -> list[Observation]:
    return [
        Observation(s.export_failures, {semconv.EXPORT_SIGNAL: "traces"}),
        Observation(s.metric_export_failures, {semconv.EXPORT_SIGNAL: "metrics"}),
    ]


def _dropped_by_reason(s: HealthSnapshot) -> list[Observation]:
    return [
        Observation(s.spans_dropped.get(reason, 0), {semconv.DROP_REASON: reason})
        for reason in sorted({*_ALWAYS_REPORTED, *s.spans_dropped})
    ]


#: (name, counter or gauge, unit, description, value(s) from a snapshot). Counters are
#: cumulative totals since the process started.
_INSTRUMENTS: tuple[tuple[str, str, str, str, Callable[[HealthSnapshot], Any]], ...] = (
    (semconv.METRIC_SPANS_DROPPED, "counter", "{span}",
     "Spans traintel could not deliver or keep, by traintel.drop.reason", _dropped_by_reason),
    (semconv.METRIC_SPANS_REPAIRED, "counter", "{span}",
     "Spans exported with their invalid text replaced (lone surrogates, integers beyond int64): "
     "as they were, no encoder takes them",
     lambda s: [Observation(s.spans_repaired)] if s.spans_repaired else []),
    (semconv.METRIC_EVENTS_DROPPED, "counter", "{event}",
     "Span events beyond OTEL_SPAN_EVENT_COUNT_LIMIT, dropped by the SDK", lambda s: s.events_dropped),
    (semconv.METRIC_EXPORT_FAILURES, "counter", "{failure}",
     "Export attempts that failed, by traintel.export.signal: span batches (first sends and "
     "resends) and metric exports", _failures_by_signal),
    (semconv.METRIC_EXPORT_BATCHES_SPLIT, "counter", "{batch}",
     "Extra batches made by splitting export batches over the gRPC message size limit",
     lambda s: s.batches_split),
    (semconv.METRIC_QUEUE_DEPTH, "gauge", "{span}",
     "Spans waiting in the batch span processors' queues", lambda s: s.queue_depth),
    (semconv.METRIC_SPOOL_SIZE, "gauge", "By",
     "Bytes of undelivered span batches in the on-disk spool", lambda s: s.spool_bytes),
    (semconv.METRIC_SPOOL_DROPPED, "counter", "{batch}",
     "Spooled batches deleted, oldest first, to stay within TRAINTEL_SPOOL_MAX_BYTES",
     lambda s: s.spool_dropped_batches),
    (semconv.METRIC_SPOOL_QUARANTINED, "counter", "{span}",
     "Spooled spans set aside in the spool's quarantine directory: rejected by the collector "
     "while it accepted other requests, or unreadable", lambda s: s.spans_quarantined),
)  # fmt: skip


def register_instruments(meter_provider: metrics_api.MeterProvider, health: ExportHealth = HEALTH) -> None:
    """The ``traintel.*`` self-telemetry instruments on ``meter_provider``, read at collection."""
    meter = meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE, __version__)

    def observe(read: Callable[[HealthSnapshot], Any]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            try:
                value = read(health.snapshot())
            except Exception:  # a broken callback must not break the collection
                _logger.exception("traintel: self-telemetry collection failed")
                return []
            observations = value if isinstance(value, list) else [Observation(value)]
            if health.report_zeros:
                return observations
            return [o for o in observations if o.value]

        return callback

    for name, kind, unit, description, read in _INSTRUMENTS:
        create = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
        create(name, [observe(read)], unit=unit, description=description)


def describe(snapshot: HealthSnapshot) -> list[str]:
    """Readable lines about losses and what is left to deliver; empty when all went well."""
    return [*_lost(snapshot), *_export_attempts(snapshot), *_left_to_deliver(snapshot)]


def _lost(snapshot: HealthSnapshot) -> Iterator[str]:
    """What was dropped, mended or never written."""
    dropped = {reason: n for reason, n in sorted(snapshot.spans_dropped.items()) if n}
    if dropped:
        yield (
            f"{sum(dropped.values())} span(s) dropped ("
            + ", ".join(f"{reason} {n}" for reason, n in dropped.items())
            + ")"
        )
    if snapshot.spans_repaired:
        yield (
            f"{snapshot.spans_repaired} span(s) exported with invalid text replaced by U+FFFD "
            "(not valid Unicode, or integers beyond int64)"
        )
    if snapshot.metric_collection_timeouts:
        yield (
            f"{snapshot.metric_collection_timeouts} metric collection(s) timed out (CPU pressure?); "
            "each later collection carried the cumulative totals"
        )
    if snapshot.metric_lines_not_written:
        yield f"{snapshot.metric_lines_not_written} metric line(s) could not be written to the telemetry file"
    if snapshot.events_dropped:
        yield f"{snapshot.events_dropped} span event(s) dropped over OTEL_SPAN_EVENT_COUNT_LIMIT"


def _export_attempts(snapshot: HealthSnapshot) -> Iterator[str]:
    """Exports that failed (spans and metrics), and batches split over the size limit."""
    if snapshot.export_failures:
        yield (
            f"{snapshot.export_failures} span export attempt(s) failed; {snapshot.spans_spooled} span(s) "
            f"spooled, {snapshot.spans_resent} re-sent"
        )
    if snapshot.metric_export_failures or snapshot.metric_export_unfinished:
        yield _metrics_line(snapshot)
    if snapshot.batches_split:
        yield f"{snapshot.batches_split} extra batch(es) from splitting over the size limit"


def traintel_command(environ: Mapping[str, str] = os.environ) -> str:
    """``traintel``, or the path of the console script beside this Python where ``traintel`` is
    not on ``PATH`` (a virtual environment used without activating it, as ``make demo`` does):
    a command the job prints must run as it is pasted."""
    beside = Path(sys.executable).with_name("traintel")
    if shutil.which("traintel", path=environ.get("PATH", "")) is None and beside.is_file():
        return shlex.quote(str(beside))
    return "traintel"


def _left_to_deliver(snapshot: HealthSnapshot) -> Iterator[str]:
    """What is kept on disk: spooled, or set aside."""
    if snapshot.spool_batches:
        yield (
            f"{snapshot.spool_spans} span(s) in {snapshot.spool_batches} batch(es) "
            f"({snapshot.spool_bytes} bytes) not delivered, kept in "
            + ", ".join(snapshot.spool_dirs)
            + "; send them with: "
            + "; ".join(f"{traintel_command()} replay {shlex.quote(d)}" for d in snapshot.spool_dirs)
        )
    if snapshot.spans_quarantined:
        yield (
            f"{snapshot.spans_quarantined} span(s) set aside, rejected by the collector or unreadable "
            "(the collector's log says why), kept in " + ", ".join(snapshot.quarantine_dirs)
        )


def _metrics_line(snapshot: HealthSnapshot) -> str:
    """Metrics are cumulative and not spooled: what a failure cost depends on the last export,
    and an export still waiting for the collector at exit is as good as failed."""
    said = []
    if snapshot.metric_export_failures:
        said.append(f"{snapshot.metric_export_failures} metric export(s) failed")
    if snapshot.metric_export_unfinished:
        said.append("the last metric export had not finished at exit")
    head = ", ".join(said)
    if not snapshot.metrics_undelivered:
        return head + "; a later export delivered the cumulative totals"
    if not snapshot.metric_exports_delivered:
        return head + ", none delivered: this run's metrics were not delivered (metrics are not spooled)"
    lost = "the metrics since the last delivered export were not delivered (metrics are not spooled)"
    return head + (": " if snapshot.metric_export_unfinished else ", the last one too: ") + lost
