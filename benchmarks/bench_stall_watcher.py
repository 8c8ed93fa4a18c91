"""What the stall watcher costs: CPU per wake, CPU share over a run, and its helper process.

The watcher wakes once a second off the training thread; the training thread pays nothing for it
(``bench_phase_overhead.py`` measures the per-iteration cost with it running). Printed here, in
one run of a training loop (5 ms steps, four phases each):

* per wake: the thread CPU time (``time.thread_time_ns``) of one wake, the median of many, for the
  watcher alone (a process on its own) and with the helper of a multi-rank job (its timer re-armed
  and the state written to its pipe at every wake);
* over the run: the watcher thread's CPU seconds from ``/proc/self/task/<tid>/stat`` (clock
  ticks) over the wall time, and the helper process's CPU and resident memory.

Run: ``python benchmarks/bench_stall_watcher.py [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import traintel
from traintel._host import gil_watch

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat_path: str) -> float:
    """utime + stime of a task or process, from its ``stat`` file."""
    with open(stat_path, encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def per_wake_us(wake: threading.Event, stop: threading.Event, check: object, samples: int) -> float:
    """Median thread CPU microseconds of ``check()`` while the loop runs on the main thread."""
    times: list[float] = []
    wake.wait()
    for _ in range(samples):
        start = time.thread_time_ns()
        check()  # type: ignore[operator]
        times.append((time.thread_time_ns() - start) / 1000)
        time.sleep(0.002)
    stop.set()
    return statistics.median(times)


def train_until(stop: threading.Event, ready: threading.Event) -> int:
    steps = 0
    with traintel.training_loop():
        while not stop.is_set():
            with traintel.training_iteration(samples=1):
                for phase in (traintel.data_loading, traintel.model_forward, traintel.model_backward):
                    with phase():
                        time.sleep(0.00125)
                with traintel.optimizer_update():
                    pass
            steps += 1
            ready.set()
    return steps


def measure(helper: bool, seconds: float, samples: int) -> None:
    gil_watch._in_a_multi_rank_job = (lambda: True) if helper else (lambda: False)  # type: ignore[assignment]
    telemetry = traintel.configure(span_exporters=[], metric_readers=[])
    watcher = telemetry.stall_watcher
    assert watcher is not None
    # 1. per wake, called from a thread of ours while the loop runs
    ready, stop = threading.Event(), threading.Event()
    sampler = threading.Thread(
        target=lambda: print(f"  per wake: {per_wake_us(ready, stop, watcher.check, samples):.1f} µs CPU")
    )
    sampler.start()
    train_until(stop, ready)
    sampler.join()
    # 2. over a run, the watcher's own thread (started by configure, waking once a second)
    thread = next(t for t in threading.enumerate() if t.name == "traintel-stall-watcher")
    task = f"/proc/self/task/{thread.native_id}/stat"
    before, wall = cpu_seconds(task), time.monotonic()
    stop.clear()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    steps = train_until(stop, threading.Event())
    used, wall = cpu_seconds(task) - before, time.monotonic() - wall
    print(
        f"  over {wall:.0f} s ({steps:,} steps): watcher thread {used * 1000:.0f} ms CPU "
        f"(clock ticks of {TICK_S * 1000:.0f} ms), {100 * used / wall:.3f} % of a core"
    )
    process = getattr(watcher._gil_watch, "_process", None)  # a benchmark looks inside
    if process is not None:
        with open(f"/proc/{process.pid}/status", encoding="ascii") as fh:
            rss_mb = int(next(line.split()[1] for line in fh if line.startswith("VmRSS"))) / 1024
        helper_ms = cpu_seconds(f"/proc/{process.pid}/stat") * 1000
        print(f"  helper process: {helper_ms:.0f} ms CPU since it started, {rss_mb:.1f} MB resident")
    traintel.shutdown(2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    print("a process on its own (the watcher thread):")
    measure(False, args.seconds, args.samples)
    print("a rank of a multi-rank job (the watcher thread and its helper process):")
    measure(True, args.seconds, args.samples)


if __name__ == "__main__":
    main()
