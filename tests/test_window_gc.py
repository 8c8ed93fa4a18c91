"""Windows make no garbage-collector work: the rows the training thread appends stop being
tracked at the collector's first pass (a row holding its step phases as a tuple of its own
escaped that often enough that ~660 rows per 10,000-iteration window reached the oldest
generation, a full collection of the process every ~150,000 iterations), and a 10,000-row
window is read as columns without one tracked object per row (``zip(*rows)`` made 10,000
iterators at once). The longest training-thread pauses of a 10-minute run at 1 ms steps were
those full collections.

The oracles are the collector's own: its count of collections (``gc.callbacks``) and whether it
tracks an object (``gc.is_tracked``), not a time."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import traintel
from tests.reference_job import empty_step_phases
from tests.subprocess_helpers import run_python
from traintel._aggregation.aggregator import RateInputs, TrainingAggregator
from traintel._aggregation.window import ClosedWindow, RawRow, columns

N = 10_000


def _rows(counted_every: int) -> list[RawRow]:
    """``N`` rows; samples on every ``counted_every``-th (1: all), phases timed on all."""
    return [
        (1_000_000 + i, 8.0 if i % counted_every == 0 else None, None, None, None, 1, 2, 3, 4, i, i * 10)
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


def test_the_rows_the_training_thread_appends_are_untracked_after_one_collection(owned: Any) -> None:
    """Rows as the engine appends them (step phases timed, work counted): after the collector's
    first pass none of them is tracked, so none can reach the oldest generation."""
    owned(log_every_n_iterations=100_000, export_iterations="none")
    telemetry = traintel.get_telemetry()
    with traintel.training_loop():
        for _ in range(3_000):
            with traintel.training_iteration():
                empty_step_phases()
                traintel.record_batch(samples=8, tokens=512)
        engine = telemetry.engine
        assert engine is not None
        rows = list(engine.rows)
        gc.collect()
        assert len(rows) == 3_000
        assert sum(map(gc.is_tracked, rows)) == 0


@pytest.mark.process
def test_a_fresh_job_s_first_60000_iterations_make_no_full_collection(tmp_path: Path) -> None:
    """The shipped default in a fresh process: what the imports and the pipeline's setup left
    for the collector is collected at configuration, and the loop's own promotions (flat rows)
    stay far below what sets off a full collection. Without the collection at configuration
    the first one came at about iteration 17,000; with nested rows, one every ~150,000."""
    done = run_python(
        """
        import gc, itertools, time
        from collections import Counter

        # a counter clock (3 us a reading): the loop's windows and sampled spans are the same
        # however loaded the machine is (a loaded one took over the 30 s window floor)
        readings = itertools.count(time.time_ns(), 3_000)
        time.time_ns = time.monotonic_ns = lambda: next(readings)
        import traintel

        traintel.configure()
        full = []
        before = {id(o) for o in gc.get_objects(2)}

        def count(phase, info):
            if phase == "start" and info["generation"] == 2:  # what the loop promoted, by type
                promoted = [type(o).__name__ for o in gc.get_objects(2) if id(o) not in before]
                full.append((len(promoted), Counter(promoted).most_common(6)))

        gc.callbacks.append(count)
        with traintel.training_loop():
            for _ in range(60_000):
                with traintel.training_iteration():
                    with traintel.model_forward():
                        pass
                    with traintel.optimizer_update():
                        pass
        print("full collections", len(full), full)
        traintel.shutdown()
        """,
        tmp_path,
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        TRAINTEL_WINDOW_MIN_SECONDS="30",  # the defaults (the suite closes windows every N)
        TRAINTEL_EXPORT_EVERY_N_SECONDS="60",
    )
    assert done.returncode == 0, done.stderr
    assert "full collections 0 []" in done.stdout, done.stdout  # else: what was promoted, by type
