"""When windows close: N iterations, a floor and a ceiling in time, and ranks that agree.

Single-process cases use plain OpenTelemetry iterations at exact timestamps, so each window's
iterations are known to the one; the multi-rank case runs 2 real gloo processes whose paces
differ and checks that both ranks' windows cover the same iterations, sized by the formula.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from tests.rank_helpers import RankResult, run_ranks
from traintel import semconv
from traintel._aggregation.aggregator import MAX_WINDOW_ITERATIONS
from traintel.config import ConfigurationError
from traintel.distributed.stats import RankWindow, agreed_window_size

T0 = 1_700_000_000 * 10**9
S = 10**9
W = semconv.WINDOW_PREFIX


def windows_of(
    durations: list[float], gaps: dict[int, float] | None = None, **config: object
) -> list[tuple[int, int]]:
    """(first, last) iteration of every ``training_window`` record of a loop whose iterations
    last ``durations`` seconds, back to back but for ``gaps`` (seconds before iteration i)."""
    return [
        (int(a[W + "first_iteration"]), int(a[W + "last_iteration"]))
        for a in records_of(durations, gaps, **config)
    ]


def records_of(
    durations: list[float], gaps: dict[int, float] | None = None, **config: object
) -> list[dict[str, object]]:
    """The attributes of every ``training_window`` record of that loop (see ``windows_of``)."""
    exporter = InMemorySpanExporter()
    telemetry = traintel.configure(
        span_exporters=[exporter], metric_readers=[], warmup_iterations=0, **config
    )
    assert telemetry.pipeline is not None
    tracer = telemetry.pipeline.tracer_provider.get_tracer("user-code")
    now = 0.0
    loop = tracer.start_span("training_loop", attributes={semconv.PHASE: "training_loop"}, start_time=T0)
    context = trace.set_span_in_context(loop)
    for number, duration in enumerate(durations):
        now += (gaps or {}).get(number, 0.0)
        span = tracer.start_span(
            "training_iteration",
            context=context,
            attributes={semconv.PHASE: "training_iteration", semconv.ITERATION: number},
            start_time=T0 + round(now * S),
        )
        now += duration
        span.end(end_time=T0 + round(now * S))
    loop.end(end_time=T0 + round(now * S))
    traintel.shutdown(5)
    records = [s for s in exporter.get_finished_spans() if s.name == semconv.TRAINING_WINDOW_SPAN]
    assert records, "no window record"
    attributes = [dict(r.attributes or {}) for r in records]
    # a record holds one window, or several in a row (merged_windows): indices without a gap
    merged = [int(a.get(W + "merged_windows", 1)) for a in attributes]
    assert [a[W + "index"] for a in attributes] == [sum(merged[:i]) for i in range(len(records))]
    return attributes


def test_a_fast_loop_s_windows_grow_to_the_floor_in_time() -> None:
    # 3 s iterations, N = 2, floor 10 s: 2 iterations are 6 s, 4 are 12 s, so windows of 4.
    assert windows_of([3.0] * 10, log_every_n_iterations=2, window_min_seconds=10) == [(0, 3), (4, 7), (8, 9)]


def test_without_a_floor_windows_are_n_iterations() -> None:
    assert windows_of([3.0] * 5, log_every_n_iterations=2, window_min_seconds=0) == [(0, 1), (2, 3), (4, 4)]


def test_a_slow_loop_s_window_closes_at_the_ceiling_before_n_iterations() -> None:
    # 25 s iterations, N = 50, ceiling 60 s: the third iteration ends at 75 s.
    windows = windows_of([25.0] * 7, log_every_n_iterations=50, log_every_n_seconds=60)
    assert windows == [(0, 2), (3, 5), (6, 6)]


def test_time_between_iterations_counts_toward_the_ceiling() -> None:
    # A 70 s pause (validation, say) before iteration 2: the window spans 72 s at its end.
    windows = windows_of([1.0] * 5, gaps={2: 70.0}, log_every_n_iterations=50, log_every_n_seconds=60)
    assert windows == [(0, 2), (3, 4)]


def test_the_ceiling_wins_over_a_longer_floor() -> None:
    windows = windows_of([10.0] * 8, log_every_n_iterations=2, window_min_seconds=100, log_every_n_seconds=30)
    assert windows == [(0, 2), (3, 5), (6, 7)]


@pytest.mark.slow  # seconds: ten thousand iterations and more through the real recorder
def test_a_window_holds_at_most_ten_thousand_iterations_whatever_its_floor() -> None:
    # 1 ms iterations under a 1,000 s floor: memory, not the clock, closes these windows; their
    # record waits for the floor (or the loop's end), so the three leave as one.
    (record,) = records_of([0.001] * 20_001, log_every_n_iterations=2, window_min_seconds=1000)
    assert (record[W + "first_iteration"], record[W + "last_iteration"]) == (0, 20_000)
    assert record[W + "merged_windows"] == 3 and record[W + "iterations"] == 20_001
    # ... unless N itself asks for more (under a 10 s floor, which 10,000 of them reach).
    windows = windows_of([0.001] * 12_001, log_every_n_iterations=12_000, window_min_seconds=10)
    assert windows == [(0, 11_999), (12_000, 12_000)]


def test_an_explicit_window_size_wins_over_the_floor_s_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 s steps, 25 of them: the 30 s floor's default would make one window of all 25.
    monkeypatch.delenv("TRAINTEL_WINDOW_MIN_SECONDS")
    assert windows_of([1.0] * 25) == [(0, 24)]
    assert windows_of([1.0] * 25, log_every_n_iterations=10) == [(0, 9), (10, 19), (20, 24)]
    monkeypatch.setenv("TRAINTEL_LOG_EVERY_N_ITERATIONS", "10")
    assert windows_of([1.0] * 25) == [(0, 9), (10, 19), (20, 24)]
    # the floor set too: it applies
    assert windows_of([1.0] * 25, window_min_seconds=15) == [(0, 14), (15, 24)]
    monkeypatch.setenv("TRAINTEL_WINDOW_MIN_SECONDS", "15")
    assert windows_of([1.0] * 25) == [(0, 14), (15, 24)]


def test_the_defaults_and_bad_values_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINTEL_WINDOW_MIN_SECONDS")
    telemetry = traintel.configure(span_exporters=[InMemorySpanExporter()], metric_readers=[])
    assert telemetry.settings.window_min_seconds == 30.0
    assert telemetry.settings.log_every_n_seconds == 60.0
    traintel.shutdown(1)
    with pytest.raises(ConfigurationError, match=r"log_every_n_seconds=0"):
        traintel.configure(span_exporters=[InMemorySpanExporter()], log_every_n_seconds=0)
    monkeypatch.setenv("TRAINTEL_WINDOW_MIN_SECONDS", "-1")
    with pytest.raises(ConfigurationError, match=r"TRAINTEL_WINDOW_MIN_SECONDS='-1'"):
        traintel.configure(span_exporters=[InMemorySpanExporter()])


def rows(*paces: float) -> list[RankWindow]:
    return [RankWindow(rank, 0, 50, pace / 2, 0.0, pace / 2, False, pace) for rank, pace in enumerate(paces)]


def test_the_agreed_size_follows_the_slowest_rank() -> None:
    assert agreed_window_size(rows(0.01, 0.04), 50, 10.0, 60.0) == 250  # 10 s at 40 ms
    assert agreed_window_size(rows(0.5, 0.1), 50, 10.0, 60.0) == 50  # N already spans 25 s
    assert agreed_window_size(rows(2.0, 2.0), 50, 10.0, 60.0) == 30  # 100 s > 60 s: the ceiling
    assert agreed_window_size(rows(90.0), 50, 10.0, 60.0) == 1  # never less than one iteration
    assert agreed_window_size(rows(0.0, 0.0), 50, 10.0, 60.0) == 50  # no pace: N
    assert agreed_window_size(rows(0.003), 7, 0.0, 60.0) == 7
    assert agreed_window_size(rows(0.003), 7, 1.0, 60.0) == math.ceil(1.0 / 0.003)
    assert agreed_window_size(rows(1e-6), 50, 10.0, 60.0) == MAX_WINDOW_ITERATIONS  # memory
    assert agreed_window_size(rows(1e-6), 20_000, 10.0, 60.0) == 20_000


#: Rank 1 is slower; no DDP, so the ranks drift apart in time: only agreement keeps their
#: windows on the same iterations. Pace: ~20 ms (rank 1) against ~5 ms, floor 0.2 s, N = 4.
AGREEING_JOB = """
with traintel.training_loop():
    for i in range(60):
        with traintel.training_iteration():
            time.sleep(0.02 if RANK == 1 else 0.005)
traintel.shutdown()
dist.destroy_process_group()
"""


def window_ranges(result: RankResult) -> list[tuple[int, int]]:
    spans = sorted(
        (s for s in result.spans() if s.name == semconv.TRAINING_WINDOW_SPAN),
        key=lambda s: int(s.attributes[W + "index"]),
    )
    return [
        (int(s.attributes[W + "first_iteration"]), int(s.attributes[W + "last_iteration"])) for s in spans
    ]


def agreeing_ranks(job: str, tmp_path: Path, floor_s: float) -> list[RankResult]:
    """Two gloo ranks of ``job`` with windows of at least 4 iterations and ``floor_s``, which
    ran to the end exchanging every window."""
    pytest.importorskip("torch.distributed")
    results = run_ranks(
        job,
        tmp_path,
        TRAINTEL_LOG_EVERY_N_ITERATIONS="4",
        TRAINTEL_WINDOW_MIN_SECONDS=str(floor_s),
        TRAINTEL_WARMUP_ITERATIONS="0",
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "different windows" not in result.stderr and "exchange stopped" not in result.stderr
    return results


def window_paces(result: RankResult) -> list[float]:
    """Each window's pace on this rank, as its cross-rank row has it: from its record's times."""
    spans = sorted(
        (s for s in result.spans() if s.name == semconv.TRAINING_WINDOW_SPAN),
        key=lambda s: int(s.attributes[W + "index"]),
    )
    return [(s.end_ns - s.start_ns) / 1e9 / int(s.attributes[W + "iterations"]) for s in spans]


@pytest.mark.process
@pytest.mark.xdist_group("ranks")
def test_ranks_agree_on_window_sizes_from_the_slowest_pace(tmp_path: Path) -> None:
    results = agreeing_ranks(AGREEING_JOB, tmp_path, floor_s=0.2)
    rank0, rank1 = (window_ranges(result) for result in results)
    assert rank0 == rank1
    sizes = [last - first + 1 for first, last in rank0]
    assert sum(sizes) == 60
    updates = results[0].events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert [e[semconv.RANKS_PREFIX + "window.index"] for e in updates] == list(range(len(sizes)))
    # The first two windows are N; each later one is 0.2 s (never fewer than N) at the pace the
    # ranks measured two windows before, the slower rank's (first start to last end per
    # iteration): the job's own figures, whatever the machine's load made of the sleeps. The
    # loop's end may cut the last one short.
    own_paces = [window_paces(result) for result in results]
    assert sizes[:2] == [4, 4]
    for index, size in enumerate(sizes[2:], start=2):
        pace = updates[index - 2][semconv.RANKS_PREFIX + "pace"]
        assert pace == max(own[index - 2] for own in own_paces)
        agreed = agreed_window_size([RankWindow(0, index - 2, 4, 0.0, 0.0, 0.0, False, pace)], 4, 0.2, 60.0)
        assert agreed == max(4, math.ceil(0.2 / pace))
        assert size == agreed or (index == len(sizes) - 1 and size < agreed), (index, sizes, pace)


#: Windows bounded at 4 rows (the memory bound, lowered) on a floor of 0.4 s: at rank 1's ~20 ms
#: pace a window is ~0.08 s, so records hold several windows, grouped alike on both ranks. Nine
#: windows: each one's ``ranks_metrics_update`` fits in the loop's event budget.
MERGING_JOB = """
import traintel._recorder.windows as recorder_windows
import traintel.distributed.stats as rank_stats
recorder_windows.MAX_WINDOW_ITERATIONS = rank_stats.MAX_WINDOW_ITERATIONS = 4
with traintel.training_loop():
    for i in range(36):
        with traintel.training_iteration():
            time.sleep(0.02 if RANK == 1 else 0.005)
traintel.shutdown()
dist.destroy_process_group()
"""


def expected_records(sizes_and_paces: list[tuple[int, float]], floor_s: float) -> list[tuple[int, int]]:
    """(first, last) iteration of each record: windows held until their agreed lengths (size
    times pace; none agreed: each alone) reach the floor, the rest at the loop's end."""
    records, first, held_s, iteration = [], 0, 0.0, 0
    for size, pace in sizes_and_paces:
        iteration += size
        held_s += round(size * pace * 1e9) / 1e9 if pace else floor_s
        if held_s >= floor_s:
            records.append((first, iteration - 1))
            first, held_s = iteration, 0.0
    return records + ([(first, iteration - 1)] if first < iteration else [])


@pytest.mark.process
@pytest.mark.xdist_group("ranks")
def test_ranks_merge_the_same_windows_into_each_record_at_a_high_step_rate(tmp_path: Path) -> None:
    """Windows closed by their row bound leave as one record a floor long on every rank, and
    each rank's records hold the same windows: the agreed lengths, not each rank's clock."""
    results = agreeing_ranks(MERGING_JOB, tmp_path, floor_s=0.4)
    rank0, rank1 = (window_ranges(result) for result in results)
    assert rank0 == rank1
    # every window is 4 rows; the pace agreed for window i is the slower rank's mean two before
    updates = results[0].events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert [u[semconv.RANKS_PREFIX + "window.index"] for u in updates] == list(range(9))
    paces = [0.0, 0.0] + [u[semconv.RANKS_PREFIX + "pace"] for u in updates[:-2]]
    assert rank0 == expected_records([(4, pace) for pace in paces], 0.4)
    merged = [
        int(s.attributes.get(W + "merged_windows", 1))
        for s in results[0].spans()
        if s.name == semconv.TRAINING_WINDOW_SPAN
    ]
    assert sum(merged) == 9 and max(merged) > 1  # the first two alone, the later ones merged
