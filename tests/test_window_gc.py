"""A closed window's statistics make no garbage-collector work: a 10,000-row window is read as
columns without one tracked object per row (``zip(*rows)`` made 10,000 iterators at once, which
survived to the older generations and set off a full collection every few windows: the longest
training-thread pauses of a 10-minute run at 1 ms steps were those collections).

The oracle is the collector's own count of collections (``gc.callbacks``), not a time."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from traintel._aggregation.aggregator import RateInputs, TrainingAggregator
from traintel._aggregation.window import ClosedWindow, RawRow, columns

N = 10_000


def _rows(counted_every: int) -> list[RawRow]:
    """``N`` rows; samples on every ``counted_every``-th (1: all), phases timed on all."""
    return [
        (1_000_000 + i, 8.0 if i % counted_every == 0 else None, None, None, None, (1, 2, 3, 4), i, i * 10)
        for i in range(N)
    ]


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations of the collections that start while the test runs its code."""
    seen: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        yield seen
    finally:
        gc.callbacks.remove(count)


def test_columns_are_the_rows_fields_in_order() -> None:
    rows = _rows(3)[:5]
    assert columns(rows) == tuple(zip(*rows, strict=True))


@pytest.mark.parametrize("counted_every", [1, 3])
def test_a_10000_row_window_closes_without_a_collection(collections: list[int], counted_every: int) -> None:
    rows = _rows(counted_every)
    window = ClosedWindow(
        index=1, seen_before=N, rows=rows, nonfinite_iterations=0, slow_iterations=0,
        exported_iterations=0, metrics={}, nested_s=0.0, sync_compute_ns=0, sync_marked=0, final=False,
    )  # fmt: skip
    aggregator = TrainingAggregator(warmup_iterations=0)
    collections.clear()
    report = aggregator.close_window(window, RateInputs())
    assert report is not None
    assert collections == []
