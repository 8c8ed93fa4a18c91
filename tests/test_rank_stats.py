"""Cross-rank statistics with exact numbers, and what each rank exports (in-process; the real
exchange between processes is in test_ranks.py)."""

from __future__ import annotations

from typing import Any

import pytest

import traintel
from tests.conftest import Pipeline
from tests.test_heartbeat import points
from traintel import distributed, semconv
from traintel._aggregation.aggregator import WindowReport
from traintel._aggregation.export_policy import RankExportPolicy
from traintel.distributed.stats import EWMA_ALPHA, RankTracker, RankWindow

R = semconv.RANKS_PREFIX


def rows(window: int, compute: list[float], iteration: float = 1.0, data: float = 0.0) -> list[RankWindow]:
    return [
        RankWindow(rank, window, 10, iteration, data, c, True, iteration) for rank, c in enumerate(compute)
    ]


def test_statistics_across_ranks_are_exact() -> None:
    tracker = RankTracker(top_k=2, factor=1.25)
    compute = [0.10, 0.30, 0.20, 0.40, 0.15]
    window = tracker.update(
        [RankWindow(r, 0, 10, 1.0 + r / 10, 0.01 * r, c, True, 1.0 + r / 10) for r, c in enumerate(compute)]
    )
    assert window is not None
    # Sorted: .10 .15 .20 .30 .40 -> median .20; p99 = .30 + (.40 - .30) * 0.96 (linear, numpy's).
    assert (window.compute.min, window.compute.median, window.compute.max) == (0.10, 0.20, 0.40)
    assert window.compute.p99 == pytest.approx(0.30 + 0.10 * 0.96, abs=1e-15)
    assert (window.iteration.min, window.iteration.median, window.iteration.max) == (1.0, 1.2, 1.4)
    assert window.data_loading.max == 0.04
    assert window.top_k == (3, 1) and window.top_k_compute == (0.40, 0.30)
    assert window.compute_mode == "sync_point"
    # Rank 3 lags the other ranks' median (.10 .15 .20 .30 -> .175) by 0.40 / 0.175.
    straggler = window.straggler
    assert straggler is not None and straggler.rank == 3
    assert straggler.others_median_s == pytest.approx(0.175)
    assert straggler.factor == pytest.approx(0.40 / 0.175)
    attributes = window.attributes()
    assert attributes[R + "compute_time.median"] == 0.20 and attributes[R + "top_k"] == [3, 1]
    assert attributes[semconv.STRAGGLER_RANK] == 3


def test_a_window_holding_warm_up_names_no_straggler_and_seeds_no_ewma() -> None:
    """Rank 1 compiles for longer in its first iteration (three times the others' compute over
    window 0): no straggler, and the EWMAs start from the first window after the warm-up (before:
    rank 1 named in window 0, and its EWMA seeded with the compile, chronic for windows after)."""
    tracker = RankTracker(factor=1.25)
    compute = [0.1, 0.3]
    warm = [RankWindow(r, 0, 10, 1.0, 0.0, c, True, 1.0, warm_up=r == 0) for r, c in enumerate(compute)]
    window = tracker.update(warm)
    assert window is not None and window.straggler is None and window.ewma == ()
    assert (window.compute.min, window.compute.max, window.top_k) == (0.1, 0.3, (1, 0))  # still reported
    steady = tracker.update(rows(1, [0.10, 0.11]))
    assert steady is not None and steady.straggler is None
    assert steady.ewma == (0.10, 0.11) and not tracker.chronic(1)


def test_ewma_tells_a_one_off_stall_from_a_chronic_lag() -> None:
    tracker = RankTracker(factor=1.25)
    for index in range(3):
        window = tracker.update(rows(index, [0.10, 0.10, 0.10]))
        assert window is not None and window.straggler is None
    stalled = tracker.update(rows(3, [0.10, 0.30, 0.10]))  # one slow window of rank 1
    assert stalled is not None and stalled.straggler is not None and stalled.straggler.rank == 1
    assert EWMA_ALPHA == 0.1
    assert stalled.ewma[1] == pytest.approx(0.1 * 0.30 + 0.9 * 0.10)  # 0.12 < 1.25 x 0.10
    assert stalled.straggler.chronic is False and not tracker.chronic(1)
    lagging = tracker.update(rows(4, [0.10, 0.20, 0.10]))  # the lag goes on
    assert lagging is not None and lagging.straggler is not None
    assert lagging.ewma[1] == pytest.approx(0.1 * 0.20 + 0.9 * 0.12)  # 0.128 > 0.125
    assert lagging.straggler.chronic is True and tracker.chronic(1) and not tracker.chronic(0)
    recovered = tracker.update(rows(5, [0.10, 0.10, 0.10]))
    assert recovered is not None and recovered.straggler is None
    assert recovered.ewma[1] == pytest.approx(0.1 * 0.10 + 0.9 * 0.128)  # 0.1252: still lagging
    assert tracker.update(rows(6, [0.10, 0.10, 0.10])) is not None and not tracker.chronic(1)  # 0.12268


def test_no_straggler_below_the_factor_or_the_noise_floor() -> None:
    assert RankTracker(factor=1.25).update(rows(0, [0.10, 0.12, 0.11])).straggler is None
    # Twice as slow but only 2 ms later: timer noise on a tiny step.
    assert RankTracker().update(rows(0, [0.002, 0.004])).straggler is None
    assert RankTracker().update(rows(0, [0.5])).straggler is None


def test_without_a_sync_point_the_rank_that_waited_in_the_collective_is_not_blamed() -> None:
    """DDP without a sync mark: rank 1's data comes 12 ms late, rank 0 waits for it in the
    all-reduce; both steps take 18 ms. The step less the data wait (18 ms against 6 ms) named
    rank 0 a straggler at 3x."""
    synchronised = [RankWindow(0, 0, 10, 0.018, 0.0, 0.018, False, 0.018),
                    RankWindow(1, 0, 10, 0.018, 0.012, 0.006, False, 0.018)]  # fmt: skip
    window = RankTracker().update(synchronised)
    assert window is not None and window.compute_mode == "step" and window.straggler is None
    assert window.top_k == (0, 1)  # (the spread is still shown, as measured)
    # Ranks that do not wait for each other: the slow one's step is slower too, and it is named.
    independent = [RankWindow(0, 0, 10, 0.010, 0.0, 0.010, False, 0.010),
                   RankWindow(1, 0, 10, 0.022, 0.0, 0.022, False, 0.022)]  # fmt: skip
    window = RankTracker().update(independent)
    assert window is not None and window.straggler is not None
    assert (window.straggler.rank, window.straggler.factor) == (1, 0.022 / 0.010)
    # Its step lagging by less than half its compute lag (3 ms of 12 ms): most of it was waiting.
    waited = [RankWindow(0, 0, 10, 0.021, 0.0, 0.021, False, 0.021),
              RankWindow(1, 0, 10, 0.018, 0.009, 0.009, False, 0.018)]  # fmt: skip
    assert RankTracker().update(waited).straggler is None  # type: ignore[union-attr]
    # Measured at the sync point, compute time alone decides (equal steps, as DDP makes them).
    marked = [RankWindow(0, 0, 10, 0.018, 0.0, 0.006, True, 0.018),
              RankWindow(1, 0, 10, 0.018, 0.0, 0.018, True, 0.018)]  # fmt: skip
    window = RankTracker().update(marked)
    assert window is not None and window.straggler is not None and window.straggler.rank == 1


def test_rows_of_different_windows_are_not_combined() -> None:
    tracker = RankTracker()
    assert (
        tracker.update(
            [RankWindow(0, 3, 10, 1.0, 0.0, 0.1, True, 1.0), RankWindow(1, 4, 10, 1.0, 0.0, 0.1, True, 1.0)]
        )
        is None
    )
    assert tracker.update([]) is None


def test_the_row_round_trips_the_exchange_vector() -> None:
    row = RankWindow(5, 7, 50, 0.25, 0.01, 0.2, False, 0.3)
    assert RankWindow.from_vector(5, row.vector()) == row


def test_without_a_sync_point_compute_is_the_step_minus_the_data_wait(pipeline: Pipeline) -> None:
    cross_rank = traintel.get_telemetry().cross_rank
    assert cross_rank is not None
    report = WindowReport(
        0,
        0,
        3,
        {},
        [],
        durations=[0.5] * 4,
        duration_s=2.0,
        data_loading_s=0.4,
        start_ns=10**9,
        end_ns=3 * 10**9,
    )
    row = cross_rank._row(report)
    assert (row.iteration_s, row.data_loading_s, row.compute_s, row.sync_marked) == (0.5, 0.1, 0.4, False)
    assert row.pace_s == 0.5  # 2 s from the first start to the last end over 4 iterations


def test_sync_point_marks_compute_once_per_iteration(pipeline: Pipeline) -> None:
    telemetry = traintel.get_telemetry()
    cross_rank, engine = telemetry.cross_rank, telemetry.engine
    assert cross_rank is not None and engine is not None
    with traintel.training_loop():
        with traintel.training_iteration():
            record = engine.active
            assert record is not None
            record.phase_ns[0] = 10_000_000  # 10 ms of data wait before the collective
            engine.mark_sync_point(record.start_ns + 30_000_000)
            engine.mark_sync_point(record.start_ns + 90_000_000)  # a later bucket: ignored
        window = engine.window
        assert (window.sync_compute_ns, window.sync_marked) == (20_000_000, 1)
        distributed.mark_sync_point()  # outside an iteration: nothing
        assert window.sync_marked == 1
    assert cross_rank.exchange is None  # not distributed: no exchange


def _emit(pipeline: Pipeline, rank: int, world: int, scale_world: int) -> tuple[list[Any], dict[str, Any]]:
    telemetry = traintel.get_telemetry()
    cross_rank, engine = telemetry.cross_rank, telemetry.engine
    assert cross_rank is not None and engine is not None
    engine.set_rank_export(RankExportPolicy(rank, world, scale_world))
    cross_rank.rank, cross_rank.world = rank, world
    with traintel.training_loop():
        cross_rank._window_ends[0] = window_end = 1_700_000_000_000_000_000
        cross_rank._gathered([r.vector() for r in rows(0, [0.1, 0.1, 0.5, 0.1][:world])])
    events = [(e.name, dict(e.attributes or {})) for e in pipeline.one("training_loop").events]
    timed = [
        e.timestamp
        for e in pipeline.one("training_loop").events
        if e.name in ("ranks_metrics_update", "straggler")
    ]
    assert timed == [window_end] * len(timed)  # at the window's end, not when the gather returned
    metrics = {
        name: points(pipeline, name)
        for name in (
            semconv.METRIC_RANKS_COMPUTE_DURATION,
            semconv.METRIC_RANK_COMPUTE_EWMA,
            semconv.METRIC_STRAGGLERS,
        )
    }
    return events, metrics


def test_below_the_scale_world_size_every_rank_exports_the_job_view(pipeline: Pipeline) -> None:
    events, metrics = _emit(pipeline, rank=1, world=4, scale_world=64)
    names = [name for name, _ in events]
    assert names.count("ranks_metrics_update") == 1 and names.count("straggler") == 1
    assert {p.attributes[semconv.STATISTIC]: p.value for p in metrics[semconv.METRIC_RANKS_COMPUTE_DURATION]}[
        "max"
    ] == 0.5
    assert [p.value for p in metrics[semconv.METRIC_RANK_COMPUTE_EWMA]] == [0.1]  # its own, no rank label
    assert metrics[semconv.METRIC_STRAGGLERS] == []  # counted by rank 0 only


def test_scale_mode_a_normal_rank_exports_nothing(pipeline: Pipeline) -> None:
    events, metrics = _emit(pipeline, rank=1, world=4, scale_world=4)
    assert [name for name, _ in events if name in ("ranks_metrics_update", "straggler")] == []
    assert all(not values for values in metrics.values())


def test_scale_mode_the_straggler_reports_itself(pipeline: Pipeline) -> None:
    events, metrics = _emit(pipeline, rank=2, world=4, scale_world=4)
    assert [a[semconv.STRAGGLER_RANK] for name, a in events if name == "straggler"] == [2]
    assert "ranks_metrics_update" not in [name for name, _ in events]
    assert [p.value for p in metrics[semconv.METRIC_RANK_COMPUTE_EWMA]] == [0.5]


def test_scale_mode_rank_0_exports_the_job_view_and_counts(pipeline: Pipeline) -> None:
    events, metrics = _emit(pipeline, rank=0, world=4, scale_world=4)
    update = next(a for name, a in events if name == "ranks_metrics_update")
    assert update[R + "top_k"] == (2, 0, 1) and update[semconv.STRAGGLER_RANK] == 2
    (counted,) = metrics[semconv.METRIC_STRAGGLERS]
    assert counted.value == 1 and dict(counted.attributes) == {semconv.STRAGGLER_RANK: 2}


def test_the_reports_name_a_straggler_with_its_factor_when_it_is_finite() -> None:
    from traintel.analysis.ranks import straggler_text

    def row(rank: int | None, factor: float | None) -> dict[str, Any]:
        return {"straggler_rank": rank, "straggler_factor": factor}

    assert straggler_text(row(3, 2.44)) == "rank 3 (2.4x)"
    assert straggler_text(row(1, float("inf"))) == "rank 1"  # the others computed nothing
    assert straggler_text(row(1, None)) == "rank 1" and straggler_text(row(None, None)) == ""
