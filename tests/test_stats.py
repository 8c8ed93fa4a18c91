"""Streaming statistics: exact where promised, within 1 % where a sketch stands in."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from traintel._aggregation.stats import IndexedBatch, QuantileSketch, RunningStats, percentile


def test_sketch_is_exact_for_short_runs_then_within_one_percent() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(-4, 0.5) for _ in range(50_000)]
    sketch = QuantileSketch(0.01, exact_limit=2048)
    for start in range(0, 2000, 50):  # windows of 50, as the aggregator adds them
        sketch.add_many(values[start : start + 50])
    assert sketch.is_exact
    ordered = sorted(values[:2000])
    for q in (0.5, 0.9, 0.99):
        assert sketch.quantile(q) == percentile(ordered, q * 100)
    for start in range(2000, len(values), 50):
        sketch.add_many(values[start : start + 50])
    assert not sketch.is_exact
    assert sketch.count == len(values)
    assert len(sketch.bucket_counts()) < 400  # memory follows the value range, not the count
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99):
        exact = ordered[round(q * (len(ordered) - 1))]
        assert sketch.quantile(q) == pytest.approx(exact, rel=0.0101)


@pytest.mark.parametrize("zeros", [0, 30, 999])
def test_sketched_quantiles_in_one_walk_are_the_bucket_of_the_ranked_value(zeros: int) -> None:
    rng = random.Random(zeros)
    values = [0.0] * zeros + [rng.lognormvariate(-4, 1.0) for _ in range(1000 - zeros)]
    rng.shuffle(values)
    sketch = QuantileSketch(0.01, exact_limit=8)
    sketch.add_many(values)
    assert not sketch.is_exact
    ordered = sorted(values)
    gamma = (1 + 0.01) / (1 - 0.01)
    qs = (0.0, 0.25, 0.5, 0.9, 0.99, 1.0)

    def expected(q: float) -> float:  # the representative of the bucket holding the ranked value
        value = ordered[math.floor(q * (len(ordered) - 1))]
        if value <= 0:
            return 0.0
        representative = 2 * gamma ** math.ceil(math.log2(value) / math.log2(gamma)) / (gamma + 1)
        return min(max(representative, ordered[0]), ordered[-1])  # never outside what was seen

    assert sketch.quantiles(qs) == [expected(q) for q in qs]
    assert [sketch.quantile(q) for q in qs] == [expected(q) for q in qs]


@pytest.mark.parametrize("step", [0.1, 0.0375, 2.5])
def test_steps_that_all_take_the_same_time_get_it_back_exactly(step: float) -> None:
    """Past the exact limit a quantile is its bucket's representative (0.0992 s for 0.1 s steps,
    +0.76 % of deviation where there is none); clamped to the values seen, it is the step."""
    sketch = QuantileSketch(0.01, exact_limit=256)
    for _ in range(20):
        sketch.add_many([step] * 300)
    assert not sketch.is_exact
    assert sketch.quantiles((0.5, 0.9, 0.99)) == [step, step, step]
    assert sketch.robust_mean() == step


def test_running_stats_batches_equal_one_pass() -> None:
    rng = random.Random(3)
    values = [rng.uniform(0.001, 2.0) for _ in range(1000)]
    batched = RunningStats()
    for start in range(0, 1000, 50):
        batched.merge(values[start : start + 50])
    single = RunningStats()
    for value in values:
        single.add(value)
    assert batched.count == single.count == 1000
    assert batched.mean == pytest.approx(statistics.fmean(values), rel=1e-12)
    assert batched.stddev == pytest.approx(statistics.pstdev(values), rel=1e-9)
    assert single.stddev == pytest.approx(statistics.pstdev(values), rel=1e-9)
    assert (batched.min, batched.max) == (min(values), max(values))


def test_percentile_matches_numpy_linear_definition() -> None:
    values = sorted([3.0, 1.0, 4.0, 1.5, 9.0])
    assert percentile(values, 25) == 1.5
    assert percentile(values, 75) == 4.0
    assert math.isnan(percentile([], 50))


def test_a_shared_indexed_batch_gives_each_sketch_what_its_own_values_give() -> None:
    rng = random.Random(11)
    windows = [[0.0] * (i % 3) + [rng.lognormvariate(-5, 0.7) for _ in range(50)] for i in range(80)]
    shared_a, shared_b = QuantileSketch(0.01, exact_limit=2048), QuantileSketch(0.01, exact_limit=256)
    own_a, own_b = QuantileSketch(0.01, exact_limit=2048), QuantileSketch(0.01, exact_limit=256)
    for values in windows:
        batch = IndexedBatch(values)  # bucketed once, whichever sketch asks first
        shared_a.add_many(batch)
        shared_b.add_many(batch)
        own_a.add_many(list(values))
        own_b.add_many(list(values))
    assert not shared_a.is_exact and not shared_b.is_exact
    qs = (0.0, 0.5, 0.9, 0.99, 1.0)
    for shared, own in ((shared_a, own_a), (shared_b, own_b)):
        assert (shared.count, shared.zeros) == (own.count, own.zeros)
        assert shared.bucket_counts() == own.bucket_counts()
        assert shared.quantiles(qs) == own.quantiles(qs)
        assert shared.robust_mean() == own.robust_mean()


def test_merging_moments_equals_merging_the_values() -> None:
    rng = random.Random(5)
    by_values, by_moments = RunningStats(), RunningStats()
    for _ in range(20):
        values = [rng.uniform(0.01, 3.0) for _ in range(50)]
        by_values.merge(values)
        total = math.fsum(values)
        mean = total / len(values)
        m2 = math.fsum((v - mean) ** 2 for v in values)
        by_moments.merge_moments(len(values), total, mean, m2, min(values), max(values))
    for name in ("count", "sum", "min", "max", "mean", "stddev"):
        assert getattr(by_moments, name) == pytest.approx(getattr(by_values, name), rel=1e-12)
    assert by_moments.count == 1000


def _reference_robust_mean(sketch: QuantileSketch, k: float = 3.0) -> float:
    """The bucket sketch's robust mean written out plainly (pairs, loops): the definition the
    C-level passes of QuantileSketch.robust_mean must reproduce to the last bit."""
    gamma = (1 + sketch.relative_accuracy) / (1 - sketch.relative_accuracy)
    points = [(2 * gamma**index / (gamma + 1), n) for index, n in sketch.bucket_counts()]
    if sketch.zeros:
        points.insert(0, (0.0, sketch.zeros))

    def weighted_median(pairs: list[tuple[float, int]]) -> float:
        total, seen = sum(n for _, n in pairs), 0
        for value, n in pairs:
            seen += n
            if 2 * seen >= total:
                return value
        return pairs[-1][0]

    median = weighted_median(points)
    limit = median + k * weighted_median(sorted((abs(value - median), n) for value, n in points))
    kept = [(value, n) for value, n in points if value <= limit]
    return sum(value * n for value, n in kept) / sum(n for _, n in kept)


@pytest.mark.parametrize("seed", range(6))
def test_sketched_robust_mean_equals_its_plain_definition(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(-4, 0.3) for _ in range(3000)]
    values += [rng.uniform(0.5, 5.0) for _ in range(seed * 20)]  # slow outliers, dropped
    values += [0.0] * (seed % 3) * 7
    rng.shuffle(values)
    sketch = QuantileSketch(0.01, exact_limit=64)
    for start in range(0, len(values), 50):
        sketch.add_many(values[start : start + 50])
    assert not sketch.is_exact
    assert sketch.robust_mean() == _reference_robust_mean(sketch)
    assert sketch.robust_mean(1.0) == _reference_robust_mean(sketch, 1.0)
