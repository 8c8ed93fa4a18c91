"""What one rank exports: everything, or at scale (ranks other than 0) only its anomalies.

Why: at 1,000+ ranks every rank's per-window series (throughput, MFU, iteration-time
histograms, phase and checkpoint times) are a thousand copies of nearly the same numbers, and a
thousand times the series a Prometheus must hold. The job's view is rank 0's: its own series and
the cross-rank summaries it computes from every rank's row (min / median / max / p99, the top-k
rank ids). What only one rank can tell stays on that rank whatever the world size: that one of
its iterations was slow, failed or went non-finite, that it is the straggler, that it is stuck
(heartbeat), how long its checkpoint took, how its loop ended.

Decided once per job, as soon as the world size is known (the Resource's rank and world size at
configure, from torchrun or Slurm; else ``torch.distributed`` at the first window boundary),
and never revisited. Applying it costs nothing per iteration: the engine reads it at
window boundaries, the instruments at collection, and the sampler's routine reasons are
switched off once. No torch and no OpenTelemetry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankExportPolicy:
    """The decision for one rank; README "Multi-rank training" has the table it implements."""

    rank: int
    world_size: int
    scale_world_size: int

    def __post_init__(self) -> None:
        if self.rank < 0 or self.world_size < 1 or self.rank >= self.world_size:
            raise ValueError(f"rank={self.rank} with world_size={self.world_size}: not a rank of that world")
        if self.scale_world_size < 1:
            raise ValueError(f"scale_world_size={self.scale_world_size}: must be a positive integer")

    @property
    def scale_mode(self) -> bool:
        """The job reduces its telemetry (``TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE`` reached)."""
        return self.world_size >= self.scale_world_size

    @property
    def anomalies_only(self) -> bool:
        """This rank exports only what is anomalous: scale mode, and not rank 0. It then leaves
        out the per-window, per-iteration and per-phase ``ml.training.*`` metric points (the
        window series: throughput, MFU/HFU, step phase times, goodput/badput, step-time
        deviation, the iteration / data-loading / phase / checkpoint histograms, the samples and
        tokens counters); ``training_metrics_update`` and ``metric_out_of_range`` on the loop
        segment; iterations exported for a head reason (the first K, every M-th, ``all``: the
        tail reasons and a checkpoint's iteration are always exported); and the job statistics
        (``ranks_metrics_update``, the ``ml.training.ranks.*`` gauges and every straggler's
        event: it reports only itself as straggler, and its compute EWMA only while chronically
        lagging)."""
        return self.scale_mode and self.rank != 0
