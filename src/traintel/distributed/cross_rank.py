"""Cross-rank statistics and stragglers at window boundaries: the coordinator.

The training thread pays one timestamp per iteration at the synchronisation point (stamped on
the iteration by ``mark_sync_point``, called by the DDP comm hook or by the user); the window
pipeline builds each window's eight-number row from its report and hands it to the exchange
thread. Everything else (the gather, the statistics, events and metrics) happens on the
exchange thread; the gauges are read on the metric reader's thread. torch is imported only when
the exchange starts.

What each rank exports: below ``TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE`` every rank adds the
job's ``ranks_metrics_update`` event and ``straggler`` events to its own loop segment (each
rank's trace stands alone) and reports the ``ml.training.ranks.*`` gauges and its own compute
EWMA. From that world size on, only rank 0 exports the job-level statistics; the other ranks
export only their own anomalies (the ``straggler`` event when they are it, their EWMA gauge
while chronically lagging): the engine's :class:`RankExportPolicy`, decided here at the first
window boundary if the Resource did not know the world size at configure. The
``ml.training.stragglers`` counter is always rank 0's, so summing it over ranks counts each
straggler once.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics as metrics_api
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span

from traintel import semconv
from traintel._aggregation.aggregator import WindowReport
from traintel._aggregation.export_policy import RankExportPolicy
from traintel.distributed.stats import (
    AGREEMENT_LAG,
    MAX_PENDING_WINDOWS,
    CrossRankWindow,
    RankTracker,
    RankWindow,
    Straggler,
    agreed_pace,
    agreed_window_size,
)
from traintel.resource_detectors import process_group
from traintel.semconv import Event
from traintel.version import __version__

if TYPE_CHECKING:
    from traintel._recorder.engine import TrainingEngine
    from traintel.distributed.exchange import Exchange

_logger = logging.getLogger("traintel")
#: The longest a window's start waits for the gather that sizes it; past it, the ranks stop
#: exchanging (the cross-rank timeout, if shorter).
AGREEMENT_WAIT_S = 2.0


class CrossRank:
    """One job's cross-rank state; the engine calls :meth:`window_closed` at every window end."""

    def __init__(self, engine: TrainingEngine, apply_rank_export: Callable[[RankExportPolicy], None]) -> None:
        self.engine = engine  # its settings are the job's current ones (set_training_config included)
        #: Applies this rank's export policy to the job (the engine, the instruments, health).
        self.apply_rank_export = apply_rank_export
        self.failed = False
        self.timeout_s = 0.0
        self.tracker = RankTracker()
        self.exchange: Exchange | None = None
        self.rank = 0
        self.world = 1
        self.latest: CrossRankWindow | None = None
        self.count_straggler: Callable[[int], None] | None = None
        self._lock = threading.Lock()  # the tracker and latest window, read by the metric reader
        self._window_ends: dict[int, int] = {}  # window index -> end (ns), for the events' times
        #: window index -> its iterations and the pace (s per iteration) the ranks agreed on
        self._agreed: dict[int, tuple[int, float]] = {}
        self._first_exchanged: int | None = None  # the index of the first window exchanged
        self._mismatch_warned = False

    @property
    def job_level(self) -> bool:
        """This rank exports the job-level statistics (below the scale world size, or rank 0)."""
        policy = self.engine.rank_export
        return policy is None or not policy.anomalies_only

    # --- the window boundary (window pipeline) --------------------------------------------------
    def window_closed(self, report: WindowReport | None, final: bool) -> None:
        """Hand this window's row to the exchange; at the loop's end, wait (bounded) for it."""
        try:
            if self.engine.rank_export is None:
                self._decide_rank_export()
            exchange = self._live_exchange()
            if exchange is None or (final and self._loop_failed()):
                return  # (a failed loop: the other ranks wait in the collective this rank left)
            if report is not None:
                self._submit(exchange, report)
            if final:
                # The loop span ends right after: its events must be in first. Bounded.
                exchange.wait_idle(self.timeout_s)
        except Exception:
            self.failed = True
            _logger.exception("traintel: cross-rank statistics disabled after an error")

    def _live_exchange(self) -> Exchange | None:
        """The exchange (started on the training thread: ``window_size_for``), unless it failed
        or cross-rank statistics are off."""
        off = self.failed or self.engine.settings.cross_rank == "off"
        return None if off else self.exchange

    def _loop_failed(self) -> bool:
        """The loop ends with an exception on the training thread: a rank that crashes must die
        now, not after the cross-rank timeout spent waiting for a gather the others, left in
        their collective, never join (its death is what frees them)."""
        thread = self.engine.active_thread or threading.main_thread().ident or 0
        error = sys._current_exceptions().get(thread)
        return (error[1] if isinstance(error, tuple) else error) is not None

    def _submit(self, exchange: Exchange, report: WindowReport) -> None:
        """The window's row to the exchange, its end kept for the events' times."""
        ends = self._window_ends
        if len(ends) > 2 * MAX_PENDING_WINDOWS:  # windows the exchange never answered
            ends.clear()
        ends[report.index] = report.end_ns
        if self._first_exchanged is None:
            self._first_exchanged = report.index
        exchange.submit(self._row(report).vector())

    def window_size_for(self, index: int) -> tuple[int, float] | None:
        """Iterations of window ``index`` in a job of several ranks and the pace the ranks
        agreed on (0.0 when none is agreed yet); None: one process, whose windows close on its
        own clock.

        The ranks' windows must cover the same iterations, so no rank reads its own clock: the
        first windows are ``log_every_n_iterations`` long, and each later one takes the size
        every rank computed from the rows gathered AGREEMENT_LAG windows earlier (waiting for
        that gather if it is late: at most AGREEMENT_WAIT_S, which only a rank two windows
        ahead of another waits in full, as ranks in step gather within milliseconds). Without an
        exchange, every window is N long.
        """
        fewest = self.engine.settings.log_every_n_iterations
        exchange = self.exchange if self.exchange is not None else self._start_here()
        if exchange is None:
            return (fewest, 0.0) if self._several_ranks() else None
        first = self._first_exchanged
        if self.failed or exchange.failed is not None or first is None or index - AGREEMENT_LAG < first:
            return fewest, 0.0
        return self._agreed_size(exchange, index, first, fewest)

    def _agreed_size(self, exchange: Exchange, index: int, first: int, fewest: int) -> tuple[int, float]:
        """The size agreed for window ``index`` (gathered AGREEMENT_LAG windows before it)."""
        wait_s = min(self.timeout_s, AGREEMENT_WAIT_S)
        if index not in self._agreed and not exchange.wait_done(index - AGREEMENT_LAG - first + 1, wait_s):
            # the ranks can no longer be sure to agree: the exchange stops, windows are N long
            exchange.abandon(f"window {index - AGREEMENT_LAG} not gathered in {wait_s:g} s")
        agreed = self._agreed.pop(index, None)
        return (fewest, 0.0) if agreed is None else agreed

    def _several_ranks(self) -> bool:
        """A job of several ranks, exchanging or not."""
        return self.world > 1 or _torch_world() is not None

    def _row(self, report: WindowReport) -> RankWindow:
        n = len(report.durations) or 1
        marked, compute_ns = report.sync_marked, report.sync_compute_ns
        if marked:
            compute = compute_ns / marked / 1e9
        else:  # no synchronisation point: the whole step but the data wait is this rank's own
            compute = (report.duration_s - report.data_loading_s) / n
        return RankWindow(
            self.rank,
            report.index,
            n,
            report.duration_s / n,
            report.data_loading_s / n,
            compute,
            marked > 0,
            (report.end_ns - report.start_ns) / 1e9 / n,
            report.warm > 0,
        )

    def _decide_rank_export(self) -> None:
        """The first window boundary: the world size is torch.distributed's, if initialised
        (else a single process: everything is exported). Decided once for the job."""
        try:
            world = _torch_world()
        except Exception:  # a half-torn-down group: as not distributed, decided all the same
            world = None
        rank, size = world if world is not None else (0, 1)
        threshold = self.engine.settings.cross_rank_scale_world_size
        self.apply_rank_export(RankExportPolicy(rank, size, threshold))

    def _start_here(self) -> Exchange | None:
        """Start the exchange where a window opens: on the training thread, where every rank
        reaches it at the same point (making the group is collective); never raises."""
        if self.failed or self.engine.settings.cross_rank == "off":
            return None
        try:
            return self._start()
        except Exception:
            self.failed = True
            _logger.exception("traintel: cross-rank statistics disabled after an error")
            return None

    def _start(self) -> Exchange | None:
        """The exchange, once torch.distributed is up with more than one rank and every rank is
        there: a rank that died before the group exists costs the others PRESENCE_WAIT_S (at
        most the exchange timeout), once, and the job goes on without the statistics."""
        world = _torch_world()
        if world is None:
            return None
        from traintel.distributed.exchange import PRESENCE_WAIT_S, Exchange, missing_ranks, store_prefix

        self.rank, self.world = world
        settings = self.engine.settings
        self.timeout_s = settings.cross_rank_timeout
        prefix = store_prefix()
        missing, waited = missing_ranks(prefix, self.rank, self.world, min(self.timeout_s, PRESENCE_WAIT_S))
        if missing:
            self.failed = True
            _logger.warning(
                "traintel: cross-rank statistics off on rank %d: rank(s) %s not there when the "
                "statistics group was to be made (waited %.2f s of TRAINTEL_CROSS_RANK_TIMEOUT=%g); "
                "training goes on",
                self.rank, ", ".join(map(str, missing)), waited, self.timeout_s,
            )  # fmt: skip
            return None
        self.tracker = RankTracker(settings.cross_rank_top_k, settings.straggler_factor)
        self.exchange = Exchange(prefix, self.timeout_s, self._gathered)
        return self.exchange

    # --- results (exchange thread) --------------------------------------------------------------
    def _gathered(self, rows: list[list[float]]) -> None:
        windows = [RankWindow.from_vector(rank, row) for rank, row in enumerate(rows)]
        with self._lock:
            window = self.tracker.update(windows)
            if window is not None:
                self.latest = window
        if window is None:
            if not self._mismatch_warned:
                self._mismatch_warned = True
                _logger.warning(
                    "traintel: ranks sent different windows; skipping their cross-rank statistics"
                )
            return
        self._agree_size(windows, window.window_index)
        self._add_events(window)

    def _agree_size(self, windows: list[RankWindow], index: int) -> None:
        """The size of window ``index + AGREEMENT_LAG``, computed alike on every rank."""
        settings = self.engine.settings
        if len(self._agreed) > 2 * MAX_PENDING_WINDOWS:  # sizes no window asked for
            self._agreed.clear()
        floor, ceiling = settings.window_seconds
        self._agreed[index + AGREEMENT_LAG] = (
            agreed_window_size(windows, settings.log_every_n_iterations, floor, ceiling),
            agreed_pace(windows),
        )

    def _add_events(self, window: CrossRankWindow) -> None:
        """The job's window on the loop, and its straggler (counted on rank 0)."""
        end_ns = self._window_ends.pop(window.window_index, None)
        job_level = self.job_level
        loop = self.engine.loop_span()
        if loop is not None and job_level and self.engine.allow_event("ranks"):
            loop.add_event(Event.RANKS_METRICS_UPDATE.value, window.attributes(), timestamp=end_ns)
        if window.straggler is not None:
            self._straggler_found(window.straggler, window.window_index, loop, job_level, end_ns)

    def _straggler_found(
        self, straggler: Straggler, index: int, loop: Span | None, job_level: bool, end_ns: int | None
    ) -> None:
        """Counted on rank 0; its event on the loop of a rank that exports the job's view, or
        of the straggler itself."""
        if self.rank == 0 and self.count_straggler is not None:
            self.count_straggler(straggler.rank)
        if loop is None or not (job_level or straggler.rank == self.rank):
            return
        if self.engine.allow_event("straggler"):
            loop.add_event(Event.STRAGGLER.value, straggler.attributes(index), timestamp=end_ns)

    # --- what the gauges read (metric reader's thread) ------------------------------------------
    def gauges(self) -> tuple[CrossRankWindow | None, float | None]:
        """The job-level window to report (None: not this rank's to report) and this rank's EWMA."""
        job_level = self.job_level
        with self._lock:
            window = self.latest
            if window is None:
                return None, None
            ewma = window.ewma[self.rank] if self.rank < len(window.ewma) else None
            if not job_level and not self.tracker.chronic(self.rank):
                ewma = None
        return (window if job_level else None), ewma

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.close()


def _torch_world() -> tuple[int, int] | None:
    """torch.distributed's rank and world size once it is up with several ranks."""
    group = process_group()
    return group if group is not None and group[1] > 1 else None


class CrossRankInstruments:
    """The cross-rank gauges and the straggler counter.

    ``source`` gives the running job's :class:`CrossRank` at every collection (configured again
    on the same meter provider, the SDK keeps the first registration; see HeartbeatInstruments).
    """

    def __init__(
        self, meter_provider: metrics_api.MeterProvider, source: Callable[[], CrossRank | None]
    ) -> None:
        meter = meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE, __version__)
        self._source = source
        for name, pick, what in (
            (semconv.METRIC_RANKS_ITERATION_DURATION, "iteration", "iteration time"),
            (
                semconv.METRIC_RANKS_COMPUTE_DURATION,
                "compute",
                "compute time before the synchronisation point",
            ),
            (semconv.METRIC_RANKS_DATA_LOADING_DURATION, "data_loading", "data-loading wait"),
        ):
            meter.create_observable_gauge(
                name,
                [self._statistics(pick)],
                unit="s",
                description=f"Last window's mean {what} per iteration: min/median/max/p99 across ranks",
            )
        meter.create_observable_gauge(
            semconv.METRIC_RANK_COMPUTE_EWMA,
            [self._ewma],
            unit="s",
            description="This rank's compute time before the synchronisation point, smoothed over windows",
        )
        self._counter = meter.create_counter(
            semconv.METRIC_STRAGGLERS,
            unit="{straggler}",
            description="Windows whose slowest rank (compute before the collective) was a straggler",
        )

    def count(self, rank: int) -> None:
        self._counter.add(1, {semconv.STRAGGLER_RANK: rank})

    def _statistics(self, pick: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            cross_rank = self._source()
            window = cross_rank.gauges()[0] if cross_rank is not None else None
            if window is None:
                return []
            summary: Any = getattr(window, pick)
            return [Observation(value, {semconv.STATISTIC: name}) for name, value in summary.items()]

        return observe

    def _ewma(self, options: CallbackOptions) -> Iterable[Observation]:
        cross_rank = self._source()
        ewma = cross_rank.gauges()[1] if cross_rank is not None else None
        return [] if ewma is None else [Observation(ewma)]
