"""Live goodput of the running job, and the compact per-window records the offline analysis
reads.

Why per-window records: iteration spans are tail-sampled, so a file holds ~1 % of them; the
analysis across restarts (``traintel goodput``) needs each window's iteration range and
where its time went. They leave as small ``training_window`` spans (``_sdk/window_spans.py``).

Accounting rules (the README states them; ``analysis/goodput.py`` applies the same ones to
files): every instant of a job's wall time belongs to the innermost categorised phase covering
it (``semconv.BADPUT_CATEGORY_OF_PHASE``); an iteration's own time is productive except its
data-loading wait and the categorised phases nested in it; the first iteration's excess over the
typical iteration (the median of the others in the first window) is ``program_startup``; what
no rule claims is ``other``. Memory is constant: sums, and one held window at most.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from itertools import zip_longest

from traintel import semconv
from traintel._aggregation.aggregator import WINDOW_KEYS, WindowReport, WindowSums
from traintel._aggregation.stats import QuantileSketch, percentile
from traintel._aggregation.window_record import compact

#: The categories the live ledger can see (wasted progress and recovery need later jobs).
LIVE_CATEGORIES = tuple(
    c for c in semconv.BADPUT_CATEGORIES if c not in ("wasted_progress", "infrastructure_recovery", "other")
)


_DEVIATION_P50, _DEVIATION_P90, _DEVIATION_P99 = (
    semconv.STEP_TIME_DEVIATION_PREFIX + q for q in ("p50", "p90", "p99")
)

#: The attributes every goodput record has, in the order ``WindowGoodput.attributes`` gives them.
_RECORD_KEYS = tuple(
    WINDOW_KEYS[name]
    for name in (
        "index", "first_iteration", "last_iteration", "iterations", "iteration_time.total",
        "productive_time", "data_loading_time", "nested_badput_time", "program_startup_time",
        "iteration_time.p50", "iteration_time.p90", "iteration_time.p99", "iteration_time.max",
    )
)  # fmt: skip
_SLOWEST, _FLOPS = WINDOW_KEYS["slowest_iteration"], WINDOW_KEYS["flops"]
_MERGED, _COMPUTE = WINDOW_KEYS["merged_windows"], WINDOW_KEYS["compute_time"]

#: Once the step sketch has left its exact range, the ideal step time is recomputed every this
#: many windows (its bucket walk costs more than the rest of a window close).
IDEAL_REFRESH_WINDOWS = 16


def startup_seconds(steps: list[float], room: float) -> float:
    """A job's program startup: its first iteration's excess over the median of the ones after
    it, at most ``room`` (what that iteration's window books as nothing else). ``steps``: the
    iterations' seconds without their data-loading waits, the first one first (a first step
    slow because its batch was slow is data loading, not startup); under two, there is no
    typical step to compare with. One rule for the live account and the offline reader."""
    if len(steps) < 2:
        return 0.0
    return max(0.0, min(steps[0] - percentile(sorted(steps[1:]), 50), room))


@dataclass
class WindowGoodput:
    """One window's goodput record: what a ``training_window`` span carries."""

    index: int
    first_iteration: int
    last_iteration: int
    iterations: int
    start_ns: int
    end_ns: int
    iteration_time_s: float
    data_loading_s: float
    nested_badput_s: float
    program_startup_s: float = 0.0
    flops: float = 0.0
    peak_flops: float | None = None
    p50_s: float = 0.0
    p90_s: float = 0.0
    p99_s: float = 0.0
    max_s: float = 0.0
    slowest_iteration: int | None = None
    ideal_step_time_s: float | None = None
    #: The window's metrics (``training_metrics_update``'s attributes) when the record carries
    #: them: see ``window_record``.
    metrics: dict[str, float | int | str] | None = None
    #: What consumers of the released record add to it (its energy: ``traintel._host.energy``).
    annotations: dict[str, float | int | str] | None = None
    #: The window's sums, and how many windows in a row the record holds (``window_merge``).
    sums: WindowSums | None = None
    windows: int = 1
    #: Compute time before the synchronisation point (``traintel.distributed``), summed over
    #: the iterations that marked it, and how many did: what tells a straggler under DDP, whose
    #: all-reduce makes every rank's iteration time the same.
    sync_compute_s: float = 0.0
    sync_marked: int = 0

    @property
    def productive_s(self) -> float:
        """Iteration time less data-loading wait, nested categorised phases and startup."""
        return max(
            0.0, self.iteration_time_s - self.data_loading_s - self.nested_badput_s - self.program_startup_s
        )

    def attributes(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = dict(
            zip(
                _RECORD_KEYS,
                (
                    self.index, self.first_iteration, self.last_iteration, self.iterations,
                    self.iteration_time_s, self.productive_s, self.data_loading_s,
                    self.nested_badput_s, self.program_startup_s, self.p50_s, self.p90_s,
                    self.p99_s, self.max_s,
                ),
                strict=True,
            )
        )  # fmt: skip
        wall_s = (self.end_ns - self.start_ns) / 1e9
        if wall_s > 0:
            out[semconv.WINDOW_GOODPUT] = self.productive_s / wall_s
        if self.slowest_iteration is not None:
            out[_SLOWEST] = self.slowest_iteration
        if self.windows > 1:
            out[_MERGED] = self.windows
        if self.sync_marked:
            out[_COMPUTE] = self.sync_compute_s / self.sync_marked
        if self.flops:
            out[_FLOPS] = self.flops
        if self.peak_flops:
            out[semconv.MFU_DENOMINATOR] = self.peak_flops
        out.update(self._deviations())
        if self.annotations:
            out.update(self.annotations)
        return out if self.metrics is None else compact(out, self.metrics)

    def _deviations(self) -> dict[str, float]:
        """The ideal step time and the window's percentiles against it, where it is known."""
        ideal = self.ideal_step_time_s
        if ideal is None:
            return {}
        return {
            semconv.STEP_TIME_IDEAL: ideal,
            _DEVIATION_P50: self.p50_s / ideal - 1,
            _DEVIATION_P90: self.p90_s / ideal - 1,
            _DEVIATION_P99: self.p99_s / ideal - 1,
        }


@dataclass
class GoodputSnapshot:
    """The job's goodput at one moment: seconds by category over ``total_s``."""

    total_s: float
    productive_s: float
    badput_s: dict[str, float] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.total_s if self.total_s > 0 else 0.0

    def badput(self, category: str) -> float:
        return self.badput_s.get(category, 0.0) / self.total_s if self.total_s > 0 else 0.0

    def attributes(self, prefix: str = "ml.training.") -> dict[str, float]:
        """Ratios and seconds: ``<prefix>goodput``, ``<prefix>badput.<category>`` (ratio) and
        ``..._time`` (seconds)."""
        out = {
            prefix + "goodput": self.goodput,
            prefix + "goodput.productive_time": self.productive_s,
            prefix + "goodput.total_time": self.total_s,
        }
        for category, seconds in self.badput_s.items():
            out[prefix + "badput." + category] = self.badput(category)
            out[prefix + "badput." + category + "_time"] = seconds
        return out


class GoodputLedger:
    """The current job's productive and badput time, fed by the engine and the processor."""

    def __init__(self) -> None:
        #: Taken by the threads that book phases, never by a reader: a reader copies (a dict's
        #: copy is one C call, which neither another thread nor a signal handler, run between
        #: bytecodes, can cut), so a training thread stopped by a signal while it books cannot
        #: keep the preemption report from reading the ledger.
        self.lock = threading.Lock()
        #: How long a booking waits for the lock: without bound, but while the preemption report
        #: ends the open phases (:meth:`interrupted`).
        self._lock_wait_s = -1.0
        #: Bookings given up for the lock while interrupted (their spans still carry the time).
        self.bookings_lost = 0
        self.job_start_ns: int | None = None
        self.job_end_ns: int | None = None
        #: Written by the window pipeline alone, as are the two below.
        self.productive_s = 0.0
        self._window_data_loading_s = 0.0
        self._startup_s = 0.0
        self._phase_s = dict.fromkeys(LIVE_CATEGORIES, 0.0)  # categorised phases, under the lock
        self._nested: dict[int, int] = {}  # open categorised span id -> categorised time inside it
        self._held: WindowGoodput | None = None  # the first window, until startup is known
        self._first_iteration_s: float | None = None
        self._startup_decided = False
        self.steps = QuantileSketch(0.01, exact_limit=256)  # the loop's; the ideal is recomputed every window
        self.ideal_step_time_s: float | None = None
        self._windows_seen = 0
        self.last_window: WindowGoodput | None = None

    # --- time that is not an iteration's -------------------------------------------------------
    def started(self, start_ns: int) -> None:
        if self.job_start_ns is None or start_ns < self.job_start_ns:
            self.job_start_ns = start_ns

    def ended(self, end_ns: int) -> None:
        """The job's outermost span ended: the snapshot stops growing."""
        self.job_end_ns = end_ns

    def _booking(self) -> bool:
        """The lock taken for a booking; False (counted) where it could not be (see :attr:`lock`)."""
        if self.lock.acquire(timeout=self._lock_wait_s):
            return True
        self.bookings_lost += 1
        return False

    def phase_ended(self, category: str, span_id: int, duration_ns: int) -> None:
        """A categorised phase ended: its time less the categorised phases inside it."""
        if not self._booking():
            return
        try:
            inner = self._nested.pop(span_id, 0)
            exclusive = max(0, duration_ns - inner)
            self._phase_s[category] = self._phase_s.get(category, 0.0) + exclusive / 1e9
        finally:
            self.lock.release()

    def nested_in_phase(self, parent_span_id: int, duration_ns: int) -> None:
        if not self._booking():
            return
        try:
            self._nested[parent_span_id] = self._nested.get(parent_span_id, 0) + duration_ns
        finally:
            self.lock.release()

    def interrupted(self, wait_s: float) -> None:
        """The preemption report ends the open phases on a helper thread while the training
        thread, stopped by the signal, may hold the lock for good: bookings wait ``wait_s`` at
        most, then are given up and counted (:attr:`bookings_lost`)."""
        self._lock_wait_s = wait_s

    def booked(self) -> dict[str, float]:
        """Badput seconds by live category so far, read without the lock (see :attr:`lock`)."""
        booked = self._phase_s.copy()
        booked["data_loading"] += self._window_data_loading_s
        booked["program_startup"] += self._startup_s
        return booked

    # --- windows -------------------------------------------------------------------------------
    def close_window(
        self,
        report: WindowReport,
        peak_flops: float | None,
        final: bool,
        metrics: dict[str, float | int | str] | None = None,
    ) -> list[WindowGoodput]:
        """Account a closed window; returns the records ready to export (the first window is
        held until the typical iteration is known, i.e. until a second iteration exists).
        ``metrics``: the window's numbers, for the compact record to carry too."""
        durations = report.durations
        p50, p90, p99, max_s = report.quantiles  # the aggregator sorted the window already
        slowest = None
        if durations and report.last_iteration - report.first_iteration + 1 == len(durations):
            slowest = report.first_iteration + durations.index(max_s)
        window = WindowGoodput(  # positional: a type call with keywords builds a dict first
            report.index,
            report.first_iteration,
            report.last_iteration,
            len(durations),
            report.start_ns,
            report.end_ns,
            report.duration_s,
            report.data_loading_s,
            report.nested_badput_s,
            0.0,  # program_startup_s: decided below for the job's first window
            report.flops,
            peak_flops,
            p50,
            p90,
            p99,
            max_s,
            slowest,
        )
        window.sync_compute_s, window.sync_marked = report.sync_compute_ns / 1e9, report.sync_marked
        self.steps.add_many(report.batch if report.batch is not None else durations)
        self._windows_seen += 1
        if self.steps.is_exact or self._windows_seen == 1 or self._windows_seen % IDEAL_REFRESH_WINDOWS == 0:
            # exact (and cheap) for the first steps; then from the sketch, every few windows (and
            # at once where a loop's first window held more steps than the exact range)
            self.ideal_step_time_s = self.steps.robust_mean()
        window.ideal_step_time_s = self.ideal_step_time_s
        window.sums = report.sums
        if metrics is not None:
            window.metrics = metrics
        return self._book([window] if self._startup_decided else self._startup(window, report, final))

    def _startup(self, window: WindowGoodput, report: WindowReport, final: bool) -> list[WindowGoodput]:
        """Until the first iteration's startup share is decided: the windows it decides. An
        iteration's time here is without its data-loading wait: a first step slow because its
        batch was slow is data loading, not startup."""
        steps = [
            duration - (wait or 0) / 1e9
            for duration, wait in zip_longest(
                report.durations, report.data_loading_column[: len(report.durations)]
            )
        ]
        held = self._held
        if held is not None:  # the held first window, decided against this one's iterations
            self._decide_startup(held, [self._first_iteration_s or 0.0, *steps])
            self._held = None
            return [held, window]
        self._first_iteration_s = steps[0] if steps else None  # the job's first window
        if len(steps) >= 2:
            self._decide_startup(window, steps)
        elif final:  # a job of one iteration: no typical step to compare with
            self._startup_decided = True
        else:
            self._held = window
            return []
        return [window]

    def _book(self, ready: list[WindowGoodput]) -> list[WindowGoodput]:
        """Count windows whose startup share is decided, and return them for export."""
        if ready:
            self.last_window = ready[-1]
        for record in ready:
            self.productive_s += record.productive_s
            self._window_data_loading_s += record.data_loading_s
            self._startup_s += record.program_startup_s
        return ready

    def _decide_startup(self, window: WindowGoodput, steps: list[float]) -> None:
        """The first window's startup share, at most what it does not already book as
        data-loading wait or nested phases: every second in exactly one category."""
        room = window.iteration_time_s - window.data_loading_s - window.nested_badput_s
        window.program_startup_s = startup_seconds(steps, room)
        self._startup_decided = True

    def loop_ended(self) -> None:
        """The next loop (a later stage, another model) steps at a pace of its own: its ideal
        step time is its own steps'."""
        self.steps, self._windows_seen = QuantileSketch(0.01, exact_limit=256), 0

    def flush_held(self) -> list[WindowGoodput]:
        """The loop ended with only the first iteration's window held: export it as it is."""
        if self._held is None:
            return []
        window, self._held = self._held, None
        self._startup_decided = True
        return self._book([window])

    def snapshot(self, now_ns: int) -> GoodputSnapshot:
        if self.job_end_ns is not None:
            now_ns = min(now_ns, self.job_end_ns)
        start = self.job_start_ns if self.job_start_ns is not None else now_ns
        total = max(0.0, (now_ns - start) / 1e9)
        badput = self.booked()
        productive = self.productive_s  # read once: the window pipeline's worker adds to it
        badput["other"] = max(0.0, total - productive - sum(badput.values()))
        return GoodputSnapshot(total, productive, badput)
