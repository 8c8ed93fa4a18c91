"""The worst training-thread stall traintel causes, in a loop of 1 ms steps, as shipped.

Each iteration is ``training_iteration`` around four step phases, the step itself a 1 ms
``time.sleep`` (the GIL released, as a GPU step's wait releases it); the job is the shipped
default (the embedded file exporter and its metric reader, default windows and sampling), so
window closes, segment rotations, exports and the window pipeline's worker all happen as they
do in a real run. Two figures per iteration, both on the training thread:

* traintel's own time: the iteration's wall time less the step's, i.e. everything traintel did
  around the step (phase entries and exits, the window close, a segment rotation, an export
  decision), waits for the GIL included;
* traintel's own CPU time on the training thread per iteration (the thread's CPU clock; the
  step, a sleep, uses none): the work itself, without the time the thread was descheduled or
  waited for the GIL - on a loaded machine the wall figure above also holds the neighbours';
* the step's own excess over what the same sleep takes without traintel (measured in the same
  run, before traintel is configured): where another thread of traintel held the GIL when the
  step wanted it back (or the machine was busy).

Printed: the maximum and high percentiles of each, the slowest iterations' numbers, and the
garbage collector's full collections (a pause of the whole process, whoever allocated: reported
apart). The measurements go to preallocated arrays, so the benchmark itself allocates nothing
per iteration for the collector to scan. The default runs 30 s; ``--minutes 10`` is the
10-minute figure.

Run: ``python benchmarks/bench_training_stall.py [--minutes 10]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from array import array

STEP_S = 0.001


def _percentiles(values: array[float] | list[float]) -> str:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3

    return (
        f"p50 {at(0.5):.3f} ms, p99 {at(0.99):.3f} ms, p99.9 {at(0.999):.3f} ms, "
        f"max {ordered[-1] * 1e3:.3f} ms"
    )


def bare_steps(seconds: float) -> list[float]:
    clock, steps = time.perf_counter, []
    end = clock() + seconds
    while clock() < end:
        start = clock()
        time.sleep(STEP_S)
        steps.append(clock() - start)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=0.5, help="how long traintel's loop runs")
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    args = parser.parse_args()
    os.environ.setdefault("TRAINTEL_OUTPUT_DIR", tempfile.mkdtemp(prefix="traintel-stall-"))
    baseline = bare_steps(args.baseline_seconds)
    typical_step = statistics.median(baseline)

    import traintel

    clock, cpu = time.perf_counter, time.thread_time
    room = int(args.minutes * 60 / STEP_S) + 1
    own, own_cpu, excess = (
        array("d", bytes(8 * room)),
        array("d", bytes(8 * room)),
        array("d", bytes(8 * room)),
    )
    collections: list[tuple[int, float]] = []  # (iteration, ms) of each full collection
    started = [0.0]
    iteration = 0

    def collected(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = clock()
            else:
                collections.append((iteration, (clock() - started[0]) * 1e3))

    gc.callbacks.append(collected)
    end = clock() + args.minutes * 60
    with traintel.application(), traintel.training_loop():
        while clock() < end and iteration < room:
            begin, begin_cpu = clock(), cpu()
            with traintel.training_iteration():
                with traintel.data_loading():
                    pass
                with traintel.model_forward():
                    step_start = clock()
                    time.sleep(STEP_S)
                    step = clock() - step_start
                with traintel.model_backward():
                    pass
                with traintel.optimizer_update():
                    pass
            wall = clock() - begin
            own_cpu[iteration] = cpu() - begin_cpu
            own[iteration] = wall - step
            excess[iteration] = max(0.0, step - typical_step)
            iteration += 1
    exit_start = clock()
    traintel.shutdown()
    exit_s = clock() - exit_start
    gc.callbacks.remove(collected)
    del own[iteration:], own_cpu[iteration:], excess[iteration:]
    slowest = sorted(((value, i) for i, value in enumerate(own)), reverse=True)
    print(f"{len(own):,} iterations of 1 ms steps over {args.minutes:g} min (shipped default: file + reader)")
    print(f"bare 1 ms sleep: {_percentiles(baseline)}")
    print(f"traintel's own time per iteration (wall): {_percentiles(own)}")
    print(f"traintel's own CPU time per iteration (training thread): {_percentiles(own_cpu)}")
    print(f"step excess over the bare sleep's median: {_percentiles(excess)}")
    print(
        "slowest iterations (traintel's own ms, iteration):", [(round(s * 1e3, 3), i) for s, i in slowest[:5]]
    )
    print("full garbage collections (iteration, ms):", [(i, round(ms, 1)) for i, ms in collections])
    print(f"exit (shutdown) {exit_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
