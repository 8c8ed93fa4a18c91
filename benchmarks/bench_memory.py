"""Is memory flat? The shipped default over millions of iterations: what Python holds, and RSS.

The job is what a user runs with nothing configured: the embedded file exporter and its metric
reader, default windows and sampling (export every 100th iteration, the first 10, slow ones),
an iteration of four step phases with nothing inside.

Resident memory alone cannot say whether anything grows: the allocator keeps freed arenas and
pages, so RSS moves in steps both ways whatever the program holds. So at each checkpoint (every
``--every`` iterations after a warm-up, half-way through a 10,000-iteration window, after a flush
of the telemetry so that no batch is half-queued and no window is in flight, and a full garbage
collection) three figures are read:

* the Python memory blocks allocated (``sys.getallocatedblocks``) and the objects the garbage
  collector tracks (``gc.get_objects``): every Python object anyone holds, traintel's, the SDK's
  or the interpreter's; flat means flat to within the noise of a few hundred blocks;
* ``VmRSS``, with the growth from the first reading to the last and the least-squares slope in MB
  per million iterations, for comparison.

Then a second process runs the same job and, in ``--stretches`` stretches of ``2 × --traced``
iterations spread over it, ``tracemalloc`` traces every allocation made in files of traintel and
OpenTelemetry (it slows an iteration about ten times, hence stretches rather than the whole run;
and a process of its own, because tracemalloc's tables would show in the first one's RSS).
Objects allocated in a stretch and still alive at its middle and at its end are the same steady
state (the open window's rows, the batch queue, the sampler's recent durations) unless something
accumulates: the difference between the two is what traintel and the SDK keep per ``--traced``
iterations, and the lines that hold most of it are printed. Flat: the same to within a few kB in
every stretch.

Run: ``python benchmarks/bench_memory.py [--iterations 5000000]`` (Linux: reads /proc; about two
minutes on an idle core, two processes one after the other).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import NamedTuple

#: Windows of a fast loop close every 10,000 iterations; a checkpoint half-way through one sees
#: the same open window every time (5,000 rows) and no window in flight.
_WINDOW = 10_000
_TRACED_FILES = (tracemalloc.Filter(True, "*/traintel/*"), tracemalloc.Filter(True, "*/opentelemetry/*"))


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
        )
    ]


def malloc_mb() -> tuple[float, float] | None:
    """C heap (glibc ``mallinfo2``, every thread's arena): bytes in use, and bytes it holds from the
    system, in MB; None where there is no ``mallinfo2`` (not glibc, or older than 2.33)."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20, (info.arena + info.hblkhd) / 2**20


def pymalloc_mb() -> tuple[float, float] | None:
    """Python's small-object allocator: bytes in allocated blocks, and its arenas' bytes, in MB
    (from ``sys._debugmallocstats``, which writes to the process's stderr); None if unreadable."""
    figures: dict[str, float] = {}
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        for line in captured.read().decode(errors="replace").splitlines():
            name, _, value = line.partition("=")
            name = "arenas" if "bytes/arena" in name else name.strip()
            if name in ("# bytes in allocated blocks", "arenas"):
                figures[name] = int(value.strip().replace(",", "")) / 2**20
    if len(figures) != 2:
        return None
    return figures["# bytes in allocated blocks"], figures["arenas"]


def traced() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces(_TRACED_FILES)


def traced_bytes(snapshot: tracemalloc.Snapshot) -> int:
    return sum(stat.size for stat in snapshot.statistics("filename"))


class Reading(NamedTuple):
    iteration: int
    blocks: int  # Python memory blocks allocated
    pymalloc: tuple[float, float] | None  # Python's small-object allocator: in use, held (MB)
    objects: int  # objects the garbage collector tracks
    rss: float  # MB
    malloc: tuple[float, float] | None  # C heap in use, held (MB)


class Checkpoints:
    """What is read where: the Python heap and RSS at checkpoints (untraced process), or
    tracemalloc in stretches (traced process)."""

    def __init__(self, args: argparse.Namespace, flush: Callable[[], object]) -> None:
        self.flush = flush
        self.readings: list[Reading] = []
        self.stretches: list[tuple[int, int, int, list[str]]] = []  # start, middle/end bytes, top
        first = at_half_window(args.warmup + _WINDOW // 2)
        self.checkpoints = set() if args.traced_run else set(range(first, args.iterations + 1, args.every))
        self.traces: dict[int, str] = {}
        # Whole windows, at least two before the middle: a structure replaced once per window is
        # traced in both snapshots then (the first one's predecessor was allocated before tracing).
        self.traced = max(2, args.traced // _WINDOW) * _WINDOW
        length = 2 * self.traced
        spacing = (args.iterations - first - length) // max(1, args.stretches - 1)
        for k in range(args.stretches if args.traced_run else 0):
            begin = at_half_window(args.iterations - length - k * spacing)
            self.traces.update({begin: "start", begin + self.traced: "middle", begin + length: "end"})
        self._middle: tracemalloc.Snapshot | None = None
        self._start = 0

    def settle(self) -> None:
        self.flush()
        gc.collect()

    def at(self, done: int) -> None:
        if done in self.checkpoints:
            self.settle()
            blocks = sys.getallocatedblocks()
            objects = len(gc.get_objects())
            self.readings.append(Reading(done, blocks, pymalloc_mb(), objects, rss_mb(), malloc_mb()))
        what = self.traces.get(done)
        if what == "start":
            self.settle()
            self._start = done
            tracemalloc.start()
        elif what == "middle":
            self.settle()
            self._middle = traced()
        elif what == "end" and self._middle is not None:
            self.settle()
            end = traced()
            tracemalloc.stop()
            top = [
                f"{stat.size_diff:+,} B {stat.count_diff:+,} blocks {stat.traceback.format()[-1].strip()}"
                for stat in end.compare_to(self._middle, "lineno")[:3]
            ]
            self.stretches.append((self._start, traced_bytes(self._middle), traced_bytes(end), top))
            self._middle = None


def at_half_window(iteration: int) -> int:
    """The nearest iteration at or before ``iteration`` half-way through a window."""
    return (iteration - _WINDOW // 2) // _WINDOW * _WINDOW + _WINDOW // 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=5_000_000)
    parser.add_argument("--every", type=int, default=500_000)
    parser.add_argument("--warmup", type=int, default=100_000)
    parser.add_argument("--traced", type=int, default=50_000, help="iterations per half of a traced stretch")
    parser.add_argument("--stretches", type=int, default=3, help="0: no traced process")
    parser.add_argument("--traced-run", action="store_true", help=argparse.SUPPRESS)  # the second process
    args = parser.parse_args()
    os.environ.setdefault("TRAINTEL_OUTPUT_DIR", tempfile.mkdtemp(prefix="traintel-memory-"))
    points, elapsed = run(args)
    if args.traced_run:
        report_stretches(points)
        return
    report_heap(args, points, elapsed)
    if args.stretches > 0:
        sys.stdout.flush()
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--traced-run"], check=True)


def run(args: argparse.Namespace) -> tuple[Checkpoints, float]:
    import traintel

    telemetry = traintel.get_telemetry()
    points = Checkpoints(args, lambda: telemetry.flush(60))
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
            points.at(i + 1)
    elapsed = time.perf_counter() - start
    traintel.shutdown()
    return points, elapsed


def report_heap(args: argparse.Namespace, points: Checkpoints, elapsed: float) -> None:
    print(f"{args.iterations:,} iterations in {elapsed:.0f} s (shipped default: file exporter and reader)")
    readings = points.readings
    for r in readings:
        print(
            f"  after {r.iteration:>10,}: {r.blocks:>9,} Python blocks{in_use(r.pymalloc)}, "
            f"{r.objects:>7,} gc objects; C heap{in_use(r.malloc)}; RSS {r.rss:6.2f} MB"
        )
    first, last = readings[0], readings[-1]
    print(
        f"{first.iteration:,} -> {last.iteration:,}: Python blocks {last.blocks - first.blocks:+,} (range "
        f"{min(r.blocks for r in readings):,}-{max(r.blocks for r in readings):,}), gc objects "
        f"{last.objects - first.objects:+,}; in use: Python {growth(readings, 0, 0)}, C heap "
        f"{growth(readings, 1, 0)}; held: Python's arenas {growth(readings, 0, 1)}, C heap "
        f"{growth(readings, 1, 1)}; RSS {last.rss - first.rss:+.2f} MB, slope "
        f"{slope_per_million([(r.iteration, r.rss) for r in readings]):+.3f} MB per million iterations",
        flush=True,
    )


def in_use(figures: tuple[float, float] | None) -> str:
    return f" {figures[0]:6.2f} MB in use of {figures[1]:6.2f}" if figures else " (unread)"


def growth(readings: list[Reading], allocator: int, which: int) -> str:
    """First to last reading of an allocator's (0: Python's, 1: the C heap) bytes in use (0) or
    held (1), in MB, and their range."""
    values = [pair[which] for r in readings if (pair := (r.pymalloc, r.malloc)[allocator]) is not None]
    if len(values) != len(readings):
        return "unread"
    return f"{values[-1] - values[0]:+.2f} MB ({min(values):.2f}-{max(values):.2f})"


def report_stretches(points: Checkpoints) -> None:
    for begin, middle, end, top in sorted(points.stretches):
        print(
            f"traced {begin:,} -> {begin + 2 * points.traced:,} (traintel and OpenTelemetry files): "
            f"{middle / 1024:,.1f} kB alive at its middle, {end / 1024:,.1f} kB at its end: "
            f"{end - middle:+,} B per {points.traced:,} iterations"
        )
        for line in top:
            print(f"    {line}")


def slope_per_million(readings: list[tuple[int, float]]) -> float:
    """Least-squares slope of RSS over iterations, MB per million iterations."""
    xs, ys = [done / 1e6 for done, _ in readings], [mb for _, mb in readings]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0


if __name__ == "__main__":
    main()
