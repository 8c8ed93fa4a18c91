"""Per-iteration values beyond the deferred buffer: counted into fixed buckets, added at export.

Why: the iteration-time histograms are fed off the training thread, by the metric reader, from
a bounded buffer (an SDK ``record`` costs microseconds: the whole per-iteration budget). A job
faster than the buffer fills between two collections (100,000 values: 1,000 iterations/s with
a 60 s reader) used to lose the rest, and its histograms then counted fewer iterations than ran.
Recording them later would cost the reader seconds per collection, and the SDK has no way to
add a count to a bucket. So the values that do not fit are counted here, into the histogram's
own bucket boundaries (with their sum, min and max: what a histogram point holds), and every
exporter traintel builds adds them to the matching point of each export it sends: exact counts
at any step rate, for the price of a sort of each window's values.

A reader that is not one of traintel's exporters (a Prometheus endpoint, the user's in-memory
reader) cannot be reached: where none of traintel's exporters exists the values are counted as
dropped instead, and said at exit.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
)


@dataclass(frozen=True)
class Totals:
    """What was counted so far: per bucket (upper bound inclusive, as the SDK's), and overall."""

    counts: tuple[int, ...]
    total: int
    sum: float
    min: float
    max: float

    def minus(self, earlier: Totals | None) -> Totals:
        """What was counted since ``earlier`` (min and max stay the overall ones: a delta
        point's extremes may only be wider, never wrong by omission)."""
        if earlier is None:
            return self
        return Totals(
            tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True)),
            self.total - earlier.total,
            self.sum - earlier.sum,
            self.min,
            self.max,
        )


class Overflow:
    """One histogram's values that did not fit the buffer. Thread-safe (training thread adds,
    export threads read)."""

    def __init__(self, boundaries: Sequence[float]) -> None:
        self.boundaries = tuple(boundaries)
        self._lock = threading.Lock()
        self._counts = [0] * (len(self.boundaries) + 1)
        self._total = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    def add_many(self, values: Iterable[float]) -> None:
        """Sorted once (in C), then each bucket is one bisection: a window's values cost a sort,
        not a Python step each."""
        ordered = sorted(values)
        if not ordered:
            return
        # Bucket i holds boundaries[i-1] < v <= boundaries[i] (the SDK's): counts from positions.
        ends = [bisect_right(ordered, bound) for bound in self.boundaries] + [len(ordered)]
        counts = [end - start for start, end in zip([0, *ends[:-1]], ends, strict=True)]
        with self._lock:
            self._counts = [a + b for a, b in zip(self._counts, counts, strict=True)]
            self._total += len(ordered)
            self._sum += sum(ordered)
            self._min = min(self._min, ordered[0])
            self._max = max(self._max, ordered[-1])

    def totals(self) -> Totals:
        with self._lock:
            return Totals(tuple(self._counts), self._total, self._sum, self._min, self._max)


class OverflowRegistry:
    """The process's overflows by metric name, and whether any exporter will add them."""

    def __init__(self) -> None:
        self.by_name: dict[str, Overflow] = {}
        #: The exporters that add the overflows at export, while they run.
        self.mergers: weakref.WeakSet[ExportMerger] = weakref.WeakSet()

    @property
    def merged_at_export(self) -> bool:
        """Is an exporter traintel built running in this process (it adds them at export)?"""
        return any(not merger.closed for merger in list(self.mergers))

    def overflow(self, name: str, boundaries: Sequence[float]) -> Overflow:
        found = self.by_name.get(name)
        if found is None:
            found = self.by_name[name] = Overflow(boundaries)
        return found


OVERFLOW = OverflowRegistry()


class ExportMerger:
    """One exporter's view: what it already sent of each overflow (for delta temporality)."""

    def __init__(self, registry: OverflowRegistry = OVERFLOW) -> None:
        self._registry = registry
        self._sent: dict[str, Totals] = {}
        self.closed = False
        registry.mergers.add(self)

    def close(self) -> None:
        """Its exporter is shut down: values beyond the buffer from now on reach no one here."""
        self.closed = True

    def merge(self, data: MetricsData) -> MetricsData:
        """``data`` with every overflow added to its histogram's point (the same object when
        there is nothing to add)."""
        if not any(o.totals().total for o in self._registry.by_name.values()):
            return data
        resource_metrics = [
            dataclasses.replace(
                rm,
                scope_metrics=[
                    dataclasses.replace(sm, metrics=[self._metric(m) for m in sm.metrics])
                    for sm in rm.scope_metrics
                ],
            )
            for rm in data.resource_metrics
        ]
        return dataclasses.replace(data, resource_metrics=resource_metrics)

    def _metric(self, metric: Metric) -> Metric:
        overflow = self._registry.by_name.get(metric.name)
        data = metric.data
        if overflow is None or not isinstance(data, Histogram):
            return metric
        totals = overflow.totals()
        name = metric.name
        add = totals
        if data.aggregation_temporality == AggregationTemporality.DELTA:
            add = totals.minus(self._sent.get(name))
        self._sent[name] = totals
        if not add.total:
            return metric
        points = [self._point(p, add, overflow.boundaries) for p in data.data_points]
        return dataclasses.replace(metric, data=dataclasses.replace(data, data_points=points))

    @staticmethod
    def _point(point: HistogramDataPoint, add: Totals, boundaries: tuple[float, ...]) -> HistogramDataPoint:
        if point.attributes or tuple(point.explicit_bounds) != boundaries:
            return point  # a View changed the buckets, or another series: not ours to add to
        return dataclasses.replace(
            point,
            count=point.count + add.total,
            sum=point.sum + add.sum,
            bucket_counts=[a + b for a, b in zip(point.bucket_counts, add.counts, strict=True)],
            min=min(point.min, add.min),
            max=max(point.max, add.max),
        )


__all__ = ["OVERFLOW", "ExportMerger", "Overflow", "OverflowRegistry", "Totals"]
