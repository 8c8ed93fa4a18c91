"""When a window closes, and the handover of its rows to the window pipeline.

The engine appends one row per iteration. A window closes after ``log_every_n_iterations``
iterations once it also spans ``window_min_seconds`` (the floor bounds what a fast loop
exports and spends on closes) or holds MAX_WINDOW_ITERATIONS (memory), and after
``log_every_n_seconds`` whatever its count (the ceiling bounds what a killed job's accounting
can lose), or when the loop ends. In a job of several ranks the windows must stay the same
iterations on every rank (their statistics are gathered per window), so there the size in
iterations is agreed through the cross-rank exchange from the slowest rank's pace, instead of
read from each rank's own clock.

Closed here, on the training thread: only what the next iterations need — the slow-iteration
threshold (the median of the last 101 durations) and the sampling stride (the loop's pace) —
from the rows themselves. The rows then go, whole, to the window pipeline (the engine's
``window_sink``), which turns them into the window's report and everything made of it off
this thread.
"""

from __future__ import annotations

import operator
import sys
from typing import Final, Protocol

from opentelemetry.trace import Span

from traintel._aggregation.aggregator import MAX_WINDOW_ITERATIONS, seconds_of
from traintel._aggregation.sampling import MEDIAN_MIN_SAMPLES, MEDIAN_WINDOW, IterationSampler
from traintel._aggregation.window import END, OpenWindow, RawRow
from traintel._recorder.ports import WindowSink
from traintel.config import Settings, TrainingConfig

#: A mark that is never reached: no row count (or time) to look again at.
NEVER: Final = sys.maxsize
_DURATION = operator.itemgetter(0)


def _start_ns(row: RawRow) -> int:
    """When the row's iteration began (its end less its duration)."""
    return row[END] - row[0]


class WindowOwner(Protocol):
    """What the window bookkeeping reads of the engine that owns it (and the rows it swaps)."""

    rows: list[RawRow]
    window: OpenWindow
    sampler: IterationSampler
    settings: Settings
    config: TrainingConfig
    window_sink: WindowSink

    def apply_config(self, config: TrainingConfig) -> None: ...

    def loop_span(self) -> Span | None: ...


class Windows:
    """The open window's bookkeeping and its close."""

    def __init__(self, engine: WindowOwner) -> None:
        self._engine = engine
        self._median_rows = 0  # rows of the open window already in the slow threshold's sample
        #: end_iteration calls close_if_due once the window has this many rows or an
        #: iteration ends at due_ns (the first row of a window, to learn its start, at the latest).
        self.rows_mark = 1
        self.due_ns = NEVER
        self._size = 0  # the window's iterations (the fewest, on this process's own clock)
        self._floor_ns = self._ceiling_ns = 0
        self._agreed = False  # ranks agreed on the size: no clock involved
        self._opened = False  # the open window's size is decided (at its first row)

    def configure(self, settings: Settings) -> None:
        floor, ceiling = settings.window_seconds
        self._floor_ns, self._ceiling_ns = int(floor * 1e9), int(ceiling * 1e9)
        if not self._agreed:
            self._size = settings.log_every_n_iterations
        self._set_marks()

    # --- when the window closes -----------------------------------------------------------------------
    def _set_marks(self) -> None:
        """When end_iteration next calls in: at the window's first row (its start is that row's),
        at its size, at its floor or ceiling in time; sooner while the slow threshold still waits
        for its first MEDIAN_MIN_SAMPLES durations."""
        rows = self._engine.rows
        if not rows or not self._opened:
            mark, due = 1, NEVER
        elif self._agreed:
            mark, due = self._size, NEVER
        else:
            start = _start_ns(rows[0])
            if len(rows) < self._size:
                mark, due = self._size, start + self._ceiling_ns
            else:  # bounded in rows too: the floor may be a million iterations away
                mark, due = max(self._size, MAX_WINDOW_ITERATIONS), start + self._floor_ns
        missing = MEDIAN_MIN_SAMPLES - len(self._engine.sampler.recent)
        if missing > 0:
            mark = min(mark, self._median_rows + missing)
        self.rows_mark, self.due_ns = mark, due

    def close_if_due(self, end_ns: int) -> None:
        """Close the window if it is complete at ``end_ns`` (its last row's end), else say when
        to look again."""
        rows = self._engine.rows
        if not rows:
            return
        if not self._opened:
            self._open_window()
        if self._agreed:
            due = len(rows) >= self._size
        else:
            elapsed = end_ns - _start_ns(rows[0])
            count = len(rows)
            due = (
                elapsed >= self._ceiling_ns
                or (count >= self._size and elapsed >= self._floor_ns)
                or count >= max(self._size, MAX_WINDOW_ITERATIONS)
            )
        if due:
            self.close()
        else:
            self._set_marks()

    def _open_window(self) -> None:
        """The open window's size: agreed by the ranks of a multi-rank job, else this process's
        own count and clock."""
        engine = self._engine
        self._opened = True
        agreed = engine.window_sink.window_size_for(engine.window.index)
        self._agreed = agreed is not None
        if agreed is None:
            self._size = engine.settings.log_every_n_iterations
        else:  # every rank samples the same iteration numbers: the stride follows the agreed pace
            self._size, pace = agreed
            if pace:
                engine.sampler.set_pace(pace)

    # --- the slow threshold's first durations -------------------------------------------------------
    def catch_up_median(self) -> None:
        """Add the open window's durations not yet in the slow threshold's recent ones."""
        engine = self._engine
        rows = engine.rows
        if len(rows) > self._median_rows:
            engine.sampler.recent.extend(seconds_of(map(_DURATION, rows[self._median_rows :])))
            self._median_rows = len(rows)

    def start_threshold_if_due(self) -> None:
        """The job's first durations for the slow threshold ended inside the open window: it
        starts from them now (the window close adds the rest of the window's)."""
        sampler = self._engine.sampler
        if len(sampler.recent) < MEDIAN_MIN_SAMPLES:
            self.catch_up_median()
            sampler.refresh()
            if sampler.median and not self._agreed:  # the stride, without waiting for a window
                sampler.set_pace(sampler.median)
            self._set_marks()

    # --- the close ----------------------------------------------------------------------------------
    def close(self, final: bool = False, ended_loop: Span | None = None) -> None:
        """Hand the open window over. What the next iterations need is updated here: the slow
        threshold from the window's last durations (the median of the last 101), the stride
        from its pace on this process's own clock (the ranks' agreed pace otherwise): the time
        from its first iteration's start to its last one's end per iteration, which is how far
        apart iterations end, the time between them included."""
        engine = self._engine
        rows = engine.rows
        closed = engine.window.take(final)
        engine.rows = engine.window.rows
        sampler = engine.sampler
        if rows:
            start = max(self._median_rows, len(rows) - MEDIAN_WINDOW)  # the deque keeps the last 101
            sampler.recent.extend(seconds_of(map(_DURATION, rows[start:])))
            if not self._agreed:  # from the ends, not a sum over the rows: O(1) on this thread
                sampler.set_pace((rows[-1][END] - _start_ns(rows[0])) / 1e9 / len(rows))
        self._median_rows = 0
        self._opened = False
        self._set_marks()
        sampler.refresh()
        if engine.config.has_lazy:
            engine.apply_config(engine.config)  # lazy values are re-resolved once per window
        engine.window_sink.submit(closed, engine.config, engine.settings, engine.loop_span(), ended_loop)
