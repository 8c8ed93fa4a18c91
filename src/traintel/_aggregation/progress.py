"""The job's progress so far, to the last iteration: what a killed job's accounting needs of
the iterations its window records on disk do not hold.

Why: a window closes after N iterations spanning at least the floor (30 s by default) or after
the ceiling (60 s), and its record reaches the file some seconds later (the batch span
processor's delay). A job killed before that loses the window: which iterations ran (a later
job that redoes them wastes them) and where their time went. The progress mark
(``_runtime.progress``) therefore writes, every few seconds, the job's account from its first
iteration to its last: the closed windows' sums (added by the window pipeline's worker) and the
open window's (read from its rows). The analysis subtracts the records it has; what is left is
the tail, whichever windows' records were lost.

The open window is read from another thread than the one appending its rows: a row is a tuple
appended whole and the list is read by slices (atomic under the GIL). Incremental: each call
reads only the rows added since the last one, but for the job's first window, whose startup
share needs the median of its iterations (the ledger's rule, ``_aggregation.goodput``), bounded
by the window's size.

Pure: no OpenTelemetry, no threads.
"""

from __future__ import annotations

from dataclasses import dataclass

from traintel._aggregation.aggregator import seconds_of
from traintel._aggregation.goodput import startup_seconds
from traintel._aggregation.stats import robust_mean
from traintel._aggregation.window import RawRow, Row


@dataclass(frozen=True)
class JobProgress:
    """The job's iterations so far, accounted by the ledger's rules (what the mark holds)."""

    first_iteration: int
    last_iteration: int
    iterations: int
    start_ns: int  # the first iteration's start
    end_ns: int  # the last iteration's end
    productive_s: float
    data_loading_s: float
    program_startup_s: float
    #: The open window's slowest iteration, and the job's ideal step time so far (the ledger's,
    #: else the first window's own): the step-time view of a killed job's last iterations.
    max_s: float
    slowest_iteration: int | None
    ideal_step_time_s: float | None


@dataclass
class Account:
    """Consecutive iterations, first to last: their number, times and sums (s)."""

    first_iteration: int = 0
    last_iteration: int = -1
    iterations: int = 0
    start_ns: int = 0
    end_ns: int = 0
    busy_s: float = 0.0  # iteration time less the categorised phases nested in it
    data_loading_s: float = 0.0

    def add(self, other: Account) -> None:
        if not other.iterations:
            return
        if not self.iterations:
            self.first_iteration, self.start_ns = other.first_iteration, other.start_ns
        self.last_iteration, self.end_ns = other.last_iteration, other.end_ns
        self.iterations += other.iterations
        self.busy_s += other.busy_s
        self.data_loading_s += other.data_loading_s


class OpenWindowProgress:
    """Running sums over one open window's rows; starts over when the window is replaced."""

    def __init__(self) -> None:
        self._rows: list[RawRow] | None = None
        self._read = 0
        self._total_ns = self._data_ns = self._max_ns = 0
        self._slowest = 0

    def update(
        self, rows: list[RawRow], nested: tuple[int, int, int], first_window: bool
    ) -> tuple[Account, float, float | None]:
        """The open window as of its rows now, its startup share (``first_window``: no window of
        the job closed before it, so startup is decided here) and, then, its own ideal step time.
        ``nested``: the window's (read before its rows: see ``OpenWindow.nested``)."""
        if rows is not self._rows:
            self._rows, self._read = rows, 0
            self._total_ns = self._data_ns = self._max_ns = 0
        self._read_new(rows[self._read :])  # one slice: rows appended meanwhile wait for the next call
        if not self._read:
            return Account(), 0.0, None
        row, before, total = nested
        nested_ns = total if self._read > row else before  # that row's not read: its phases neither
        first, last = Row._make(rows[0]), Row._make(rows[self._read - 1])
        total_s, data_s = self._total_ns / 1e9, self._data_ns / 1e9
        busy_s = total_s - nested_ns / 1e9
        span = Account(
            first.iteration, last.iteration, self._read, first.start_ns, last.end_ns, busy_s, data_s
        )
        if not first_window or self._read < 2:
            return span, 0.0, None
        durations = seconds_of(row[0] for row in rows[: self._read])
        # compared without their data-loading wait: a first batch that was slow is data loading
        steps = seconds_of(row[0] - (row[5] or 0) for row in rows[: self._read])
        return span, startup_seconds(steps, busy_s - data_s), robust_mean(sorted(durations))

    def _read_new(self, new: list[RawRow]) -> None:
        for duration_ns, _samples, _tokens, _padding, _flops, data_ns, _f, _b, _o, iteration, _end in new:
            self._total_ns += duration_ns
            if data_ns:
                self._data_ns += data_ns
            if duration_ns > self._max_ns or not self._read:
                self._max_ns, self._slowest = duration_ns, iteration
            self._read += 1

    @property
    def slowest(self) -> tuple[float, int | None]:
        """The open window's longest iteration so far (s) and its number."""
        return (self._max_ns / 1e9, self._slowest) if self._read else (0.0, None)


def job_progress(
    closed: Account,
    open_window: Account,
    startup_s: float,
    slowest: tuple[float, int | None],
    ideal_s: float | None,
) -> JobProgress | None:
    """The job's account: its closed windows then its open one (None: no iteration yet)."""
    job = Account()
    job.add(closed)
    job.add(open_window)
    if not job.iterations:
        return None
    productive = max(0.0, job.busy_s - job.data_loading_s - startup_s)
    return JobProgress(
        job.first_iteration, job.last_iteration, job.iterations, job.start_ns, job.end_ns, productive,
        job.data_loading_s, startup_s, slowest[0], slowest[1], ideal_s,
    )  # fmt: skip
