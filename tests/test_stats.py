"""Streaming statistics: exact where promised, within 1 % where a sketch stands in."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from traintel.processor.stats import QuantileSketch, RunningStats, percentile


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
    assert sketch.buckets < 400  # memory follows the value range, not the count
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
        return 2 * gamma ** math.ceil(math.log(value) / math.log(gamma)) / (gamma + 1)

    assert sketch.quantiles(qs) == [expected(q) for q in qs]
    assert [sketch.quantile(q) for q in qs] == [expected(q) for q in qs]


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
