"""A closed window's iteration durations into the SDK histogram: traintel's one call per window
(bucket counts added to the SDK's aggregation) against one ``Histogram.record`` per value.

Why it matters: the window worker records every iteration's duration off the training thread,
but it holds the interpreter lock while it does, so at 10,000 iterations per window a slow
path is a pause the training thread waits through. Both ways record into the same kind of
histogram (real SDK, traintel's bucket boundaries, an in-memory reader); the run stops unless the
two histograms' points agree (count, buckets, minimum and maximum identical; the sum to 1e-12
relative: traintel adds each window's correctly rounded sum, one-by-one addition rounds at every
value), then prints the time per window of each and their ratio, measured in the same run (best
of ``--rounds``).

    python benchmarks/bench_window_histograms.py [--values 10000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

from traintel._sdk.instruments import DURATION_BUCKETS_S
from traintel._sdk.otel_private import record_sorted


def _points(reader: InMemoryMetricReader) -> dict[str, HistogramDataPoint]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
        if isinstance(point, HistogramDataPoint)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", type=int, default=10_000, help="iterations in one window")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(0)
    windows = [sorted(rng.lognormvariate(-3, 0.5) for _ in range(args.values)) for _ in range(args.rounds)]
    bounds = ExplicitBucketHistogramAggregation(list(DURATION_BUCKETS_S))
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=[View(instrument_name="*", aggregation=bounds)])
    meter = provider.get_meter("bench")
    per_window, per_value = meter.create_histogram("per_window"), meter.create_histogram("per_value")
    best = {"per_window": float("inf"), "per_value": float("inf")}
    for values in windows:
        start = time.perf_counter()
        record_sorted(per_window, values, DURATION_BUCKETS_S)
        best["per_window"] = min(best["per_window"], time.perf_counter() - start)
        start = time.perf_counter()
        for value in values:
            per_value.record(value)
        best["per_value"] = min(best["per_value"], time.perf_counter() - start)
    points = _points(reader)
    window, each = points["per_window"], points["per_value"]
    same = (window.count, window.bucket_counts, window.min, window.max) == (
        each.count, each.bucket_counts, each.min, each.max
    )  # fmt: skip
    if not same or not math.isclose(window.sum, each.sum, rel_tol=1e-12):
        raise SystemExit(f"the two ways disagree: {window} {each}")
    provider.shutdown()
    print(f"{args.values:,} values per window, {args.rounds} windows, the same points "
          f"(count {window.count:,}; sums {window.sum!r} and {each.sum!r})")  # fmt: skip
    print(f"one call per window (traintel): {best['per_window'] * 1e3:8.3f} ms")
    print(f"one record per value:           {best['per_value'] * 1e3:8.3f} ms")
    print(f"ratio: {best['per_value'] / best['per_window']:.0f}x")


if __name__ == "__main__":
    main()
