"""Is memory flat? Resident memory of the shipped default over millions of iterations.

The job is what a user runs with nothing configured: the embedded file exporter and its metric
reader, default windows and sampling (export every 100th iteration, the first 10, slow ones),
an iteration of four step phases with nothing inside. Resident memory (``VmRSS``) is read every
``--every`` iterations after a warm-up; printed: the readings, the growth from the first to the
last, the growth over the second half (memory that is flat grows in neither), and the slope of
a least-squares line through the readings and through the second half's, in MB per million
iterations (flat is 0; a creep of a few bytes per iteration shows here before it shows in the
readings; the allocator grows in steps of pages, so a step early on is not a creep).

Run: ``python benchmarks/bench_memory.py [--iterations 5000000]`` (Linux: reads /proc).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=2_000_000)
    parser.add_argument("--every", type=int, default=250_000)
    parser.add_argument("--warmup", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.setdefault("TRAINTEL_OUTPUT_DIR", tempfile.mkdtemp(prefix="traintel-memory-"))
    import traintel

    readings: list[tuple[int, float]] = []
    start = time.perf_counter()
    with traintel.application(), traintel.training_loop():
        for i in range(args.iterations):
            with traintel.training_iteration():
                with traintel.data_loading():
                    pass
                with traintel.model_forward():
                    pass
                with traintel.model_backward():
                    pass
                with traintel.optimizer_update():
                    pass
            done = i + 1
            if done >= args.warmup and (done - args.warmup) % args.every == 0:
                readings.append((done, rss_mb()))
    elapsed = time.perf_counter() - start
    traintel.shutdown()
    print(f"{args.iterations:,} iterations in {elapsed:.0f} s (shipped default: file exporter and reader)")
    for done, mb in readings:
        print(f"  after {done:>10,}: RSS {mb:8.2f} MB")
    (first_at, first), (last_at, last) = readings[0], readings[-1]
    middle_at, middle = readings[len(readings) // 2]
    print(
        f"growth {first_at:,} -> {last_at:,}: {last - first:+.2f} MB; second half ({middle_at:,} ->): "
        f"{last - middle:+.2f} MB; slope {slope_per_million(readings):+.3f} MB per million iterations "
        f"({slope_per_million(readings[len(readings) // 2 :]):+.3f} over the second half)"
    )


def slope_per_million(readings: list[tuple[int, float]]) -> float:
    """Least-squares slope of RSS over iterations, MB per million iterations."""
    xs, ys = [done / 1e6 for done, _ in readings], [mb for _, mb in readings]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0


if __name__ == "__main__":
    main()
