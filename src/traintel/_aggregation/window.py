"""The open window on the training thread, and what it hands over when it closes.

Why a handover: the training thread only appends one row per iteration and decides *when* a
window closes; everything else (the statistics, the metric instruments, the goodput record, the
loop span's attributes, the cross-rank row) is computed from the closed window off that thread.
So the open window keeps exactly what the iterations of the window produce — their rows and
the few counts an iteration adds to (flags, model metrics, nested badput, synchronisation-point
compute) — and :meth:`OpenWindow.take` hands it over whole and starts an empty one, in O(1).

Pure: no OpenTelemetry, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final, NamedTuple

#: One iteration as its window keeps it until the window closes (the fields of :class:`Row`).
#: A flat tuple of numbers (None where not measured): the garbage collector stops tracking it
#: after its first pass. Not a NamedTuple instance, and nothing nested: a row holding its step
#: phases as a tuple of their own escaped that untracking often enough (the collector visits
#: the inner tuple after the row) that ~660 rows per 10,000-iteration window reached the
#: oldest generation, setting off a full collection of the whole process every ~150,000
#: iterations (~20 ms at a time); flat, 27 objects per window do (tests/test_window_gc.py).
RawRow = tuple[
    int, float | None, float | None, float | None, float | None,
    int | None, int | None, int | None, int | None, int, int,
]  # fmt: skip


class Row(NamedTuple):
    """A row read by its field names: ``Row._make(raw_row)``."""

    duration_ns: int
    samples: float | None
    tokens: float | None
    padding: float | None
    flops: float | None
    #: The four step-phase times (ns) if the iteration timed them, else None.
    data_loading_ns: int | None
    forward_ns: int | None
    backward_ns: int | None
    optimizer_ns: int | None
    iteration: int
    end_ns: int

    @property
    def start_ns(self) -> int:
        """When the iteration began (its end less its duration)."""
        return self.end_ns - self.duration_ns


#: Where a row's end is.
END: Final = 10
_FIELDS = tuple(map(itemgetter, range(len(Row._fields))))


def columns(rows: list[RawRow]) -> tuple[tuple[Any, ...], ...]:
    """The rows' fields as columns, one tuple per field. Not ``zip(*rows)``: that makes one
    tracked iterator per row at once, and a 10,000-row window's worth of them survive to the
    older generations and set off a full collection every few windows (measured: 8 full
    collections in 200k iterations with it, 2 without)."""
    return tuple(tuple(map(field, rows)) for field in _FIELDS)


class ModelMetric:
    """Last value and mean of a model metric; non-finite values are last but not averaged."""

    __slots__ = ("count", "last", "sum")

    def __init__(self) -> None:
        self.sum = 0.0
        self.count = 0
        self.last = math.nan

    def add(self, value: float) -> None:
        self.last = value
        if math.isfinite(value):
            self.sum += value
            self.count += 1


def add_metrics(metrics: dict[str, ModelMetric], values: Mapping[str, float]) -> None:
    """Each of ``values`` into its model metric, created on its first value."""
    for name, value in values.items():
        metric = metrics.get(name)
        if metric is None:
            metric = metrics[name] = ModelMetric()
        metric.add(value)


@dataclass(frozen=True, slots=True)
class ClosedWindow:
    """A window as the training thread hands it over."""

    #: Its position in the job (0, 1, ...) and the iterations of the job before it.
    index: int
    seen_before: int
    rows: list[RawRow]
    #: Its iterations that were non-finite, slow, exported.
    nonfinite_iterations: int
    slow_iterations: int
    exported_iterations: int
    metrics: dict[str, ModelMetric]
    #: Categorised phases (a checkpoint save, say) inside its iterations, in seconds.
    nested_s: float
    #: Compute time before the synchronisation point, summed over the iterations that marked it.
    sync_compute_ns: int
    sync_marked: int
    #: The loop ended with it.
    final: bool


class OpenWindow:
    """The training thread's open window: appended to per iteration, taken when it closes."""

    __slots__ = ("current", "exported_iterations", "index", "metrics", "nested", "nonfinite_iterations",
                 "rows", "slow_iterations", "sync_compute_ns", "sync_marked")  # fmt: skip

    def __init__(self) -> None:
        self.rows: list[RawRow] = []
        self.index = 0  # windows handed over so far
        #: The open rows and the iterations handed over before them, as one value: another
        #: thread reads the pair in one step, never a window's rows with the next one's count.
        self.current: tuple[list[RawRow], int] = (self.rows, 0)
        self._reset()

    def _reset(self) -> None:
        self.nonfinite_iterations = self.slow_iterations = self.exported_iterations = 0
        self.metrics: dict[str, ModelMetric] = {}
        #: The categorised phases nested in its iterations (ns), as one value: (the row of the
        #: iteration the last one ended in, their time in the rows before it, their time in all).
        #: Another thread reads it with the rows, which lack the running iteration's until it ends.
        self.nested = (0, 0, 0)
        self.sync_compute_ns = self.sync_marked = 0

    @property
    def iterations_seen(self) -> int:
        """Never less than a moment before, read from any thread (a counter's observation)."""
        rows, before = self.current
        return before + len(rows)

    def nested_in_running(self, duration_ns: int) -> None:
        """A categorised phase (a checkpoint save, say) ended inside the running iteration."""
        row, before, total = self.nested
        running = len(self.rows)
        self.nested = (running, before if row == running else total, total + duration_ns)

    def take(self, final: bool) -> ClosedWindow:
        """The window as it is, handed over; an empty one is open from now on."""
        rows, before = self.current
        closed = ClosedWindow(
            self.index, before, rows, self.nonfinite_iterations, self.slow_iterations,
            self.exported_iterations, self.metrics,
            self.nested[2] / 1e9, self.sync_compute_ns, self.sync_marked, final,
        )  # fmt: skip
        self.rows = []
        self.current = (self.rows, before + len(rows))
        if rows:
            self.index += 1
        self._reset()
        return closed
