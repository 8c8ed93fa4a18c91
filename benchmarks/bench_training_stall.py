"""The worst training-thread stall traintel causes, in a loop of 1 ms steps, as shipped.

Each iteration is ``training_iteration`` around four step phases, the step itself a 1 ms
``time.sleep`` (the GIL released, as a GPU step's wait releases it); the job is the shipped
default (the embedded file exporter and its metric reader, default windows and sampling), so
window closes, segment rotations, exports and the window pipeline's worker all happen as they
do in a real run. Two figures per iteration, both on the training thread:

* traintel's own time: the iteration's wall time less the step's, i.e. everything traintel did
  around the step (phase entries and exits, the window close, a segment rotation, an export
  decision), waits for the GIL included;
* the step's own excess over what the same sleep takes without traintel (measured in the same
  run, before traintel is configured): where another thread of traintel held the GIL when the
  step wanted it back.

Printed: the maximum and high percentiles of both, and the slowest iterations' numbers. The
default runs 30 s; ``--minutes 10`` is the 10-minute figure.

Run: ``python benchmarks/bench_training_stall.py [--minutes 10]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

STEP_S = 0.001


def _percentiles(values: list[float]) -> str:
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

    clock = time.perf_counter
    own: list[float] = []
    excess: list[float] = []
    slowest: list[tuple[float, int]] = []
    end = clock() + args.minutes * 60
    with traintel.application(), traintel.training_loop():
        iteration = 0
        while clock() < end:
            begin = clock()
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
            own.append(wall - step)
            excess.append(max(0.0, step - typical_step))
            slowest.append((wall - step, iteration))
            iteration += 1
    exit_start = clock()
    traintel.shutdown()
    exit_s = clock() - exit_start
    slowest.sort(reverse=True)
    print(f"{len(own):,} iterations of 1 ms steps over {args.minutes:g} min (shipped default: file + reader)")
    print(f"bare 1 ms sleep: {_percentiles(baseline)}")
    print(f"traintel's own time per iteration: {_percentiles(own)}")
    print(f"step excess over the bare sleep's median: {_percentiles(excess)}")
    print(
        "slowest iterations (traintel's own ms, iteration):", [(round(s * 1e3, 3), i) for s, i in slowest[:5]]
    )
    print(f"exit (shutdown) {exit_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
