"""The worst training-thread stall traintel causes in a loop of 1 ms steps, as shipped, against
the same loop without telemetry running beside it at the same time.

Each iteration is ``training_iteration`` around four step phases, the step itself a 1 ms
``time.sleep`` (the GIL released, as a GPU step's wait releases it); the job is the shipped
default (the embedded file exporter and its metric reader, default windows and sampling, nothing
configured), so window closes, segment rotations, exports, metric collections and the window
pipeline's worker all happen as in a real run. A second process runs the same loop without
telemetry for the same minutes at the same time, so both see the same machine: what the machine
does to a sleeping loop (other jobs, the scheduler) shows in both, what traintel does only in one.

Per iteration, on the training thread:

* over the step: the iteration's wall time less the step's own (the sleep, timed around it) -
  with traintel, everything it did around the step (phase entries and exits, a window handed to
  the worker, a segment rotation, an export decision), waits for the GIL included; without, the
  loop's own clock reads and whatever the machine did between them;
* traintel's CPU time: the training thread's CPU clock over the iteration (the sleep uses none)
  - traintel's own work there, without the time the thread was descheduled or waited;
* step excess: how much longer the sleep took than the bare sleep's median - where another
  thread (traintel's worker, its exporter, its metric reader) held the GIL when the step wanted
  it back, or the machine was busy.

Printed: percentiles and maxima of each for both loops, how many iterations exceeded 1 ms and
5 ms over their step in each, the slowest iterations with the second they happened at, the full
garbage collections (a pause of the whole process, whoever allocated), and the exit (shutdown)
time. Attributed to traintel: its CPU time on the training thread (exactly its work), and the
wall figures' excess over the loop without telemetry. The measurements go to preallocated
arrays, so the benchmark allocates nothing per iteration. The default runs 30 s;
``--minutes 10`` is the 10-minute figure (about 3 % of a core per loop).

Run: ``python benchmarks/bench_training_stall.py [--minutes 10]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

STEP_S = 0.001
_SERIES = ("over", "cpu", "step")  # per iteration: over the step, CPU, the step itself (seconds)


def _percentiles(values: array[float]) -> str:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3

    return (
        f"p50 {at(0.5):7.3f}  p99 {at(0.99):7.3f}  p99.9 {at(0.999):7.3f}  p99.99 {at(0.9999):7.3f}  "
        f"max {ordered[-1] * 1e3:7.3f} ms"
    )


_Series = dict[str, "array[float]"]


def run_loop(minutes: float, telemetry: bool) -> tuple[_Series, list[tuple[int, float, bool]], float]:
    """The loop, with or without traintel; per-iteration series, full collections, exit seconds."""
    clock, cpu = time.perf_counter, time.thread_time
    room = int(minutes * 60 / STEP_S) + 1
    series = {name: array("d", bytes(8 * room)) for name in _SERIES}
    over, own_cpu, steps = series["over"], series["cpu"], series["step"]
    collections: list[tuple[int, float, bool]] = []  # (iteration, ms, on the training thread)
    started = [0.0]
    iteration = 0
    training_thread = threading.get_ident()

    def collected(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = clock()
            else:
                on_training = threading.get_ident() == training_thread
                collections.append((iteration, (clock() - started[0]) * 1e3, on_training))

    gc.callbacks.append(collected)
    end = clock() + minutes * 60
    exit_s = 0.0
    if telemetry:
        import traintel

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
                own_cpu[iteration] = cpu() - begin_cpu
                over[iteration] = clock() - begin - step
                steps[iteration] = step
                iteration += 1
        print(f"objects the garbage collector tracks at the loop's end: {len(gc.get_objects()):,}")
        exit_start = clock()
        traintel.shutdown()
        exit_s = clock() - exit_start
    else:
        while clock() < end and iteration < room:
            begin, begin_cpu = clock(), cpu()
            step_start = clock()
            time.sleep(STEP_S)
            step = clock() - step_start
            own_cpu[iteration] = cpu() - begin_cpu
            over[iteration] = clock() - begin - step
            steps[iteration] = step
            iteration += 1
    gc.callbacks.remove(collected)
    for values in series.values():
        del values[iteration:]
    return series, collections, exit_s


def _without_telemetry(minutes: float, out: Path) -> None:
    series, _, _ = run_loop(minutes, telemetry=False)
    with out.open("wb") as fh:
        for name in _SERIES:
            fh.write(len(series[name]).to_bytes(8, "little"))
            series[name].tofile(fh)


def _read(out: Path) -> dict[str, array[float]]:
    series = {}
    with out.open("rb") as fh:
        for name in _SERIES:
            values = array("d")
            values.fromfile(fh, int.from_bytes(fh.read(8), "little"))
            series[name] = values
    return series


def _report(label: str, series: dict[str, array[float]], typical_step: float) -> None:
    excess = array("d", (max(0.0, s - typical_step) for s in series["step"]))
    over = series["over"]
    print(f"{label}: {len(over):,} iterations")
    print(f"  over the step (wall)        {_percentiles(over)}")
    print(f"  CPU on the training thread  {_percentiles(series['cpu'])}")
    print(f"  step excess over its median {_percentiles(excess)}")
    print(
        f"  iterations over their step by > 1 ms: {sum(v > 1e-3 for v in over):,}, > 5 ms: "
        f"{sum(v > 5e-3 for v in over):,}; whole iteration > step median + 5 ms: "
        f"{sum(o + e > 5e-3 for o, e in zip(over, excess, strict=True)):,}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=0.5, help="how long each loop runs")
    parser.add_argument("--without-telemetry-to", type=Path, help=argparse.SUPPRESS)  # the second process
    args = parser.parse_args()
    if args.without_telemetry_to is not None:
        _without_telemetry(args.minutes, args.without_telemetry_to)
        return
    os.environ.setdefault("TRAINTEL_OUTPUT_DIR", tempfile.mkdtemp(prefix="traintel-stall-"))
    with tempfile.TemporaryDirectory(prefix="traintel-stall-off-") as scratch:
        out = Path(scratch) / "off.bin"
        beside = subprocess.Popen(
            [sys.executable, __file__, "--minutes", str(args.minutes), "--without-telemetry-to", str(out)]
        )
        series, collections, exit_s = run_loop(args.minutes, telemetry=True)
        beside.wait()
        off = _read(out)
    typical_step = sorted(off["step"])[len(off["step"]) // 2]
    print(f"1 ms steps for {args.minutes:g} min, two loops at the same time; milliseconds")
    _report("without telemetry (a second process)", off, typical_step)
    _report("traintel, shipped default (file exporter and its metric reader)", series, typical_step)
    over, cpu = series["over"], series["cpu"]
    starts = array("d", [0.0]) * len(over)
    elapsed = 0.0
    for i in range(len(over)):
        starts[i] = elapsed
        elapsed += over[i] + series["step"][i]
    collected_in = {i for i, _, _ in collections}

    def described(i: int) -> tuple[int, float, float, float, str]:
        return (
            i,
            round(starts[i], 1),
            round(over[i] * 1e3, 2),
            round(cpu[i] * 1e3, 2),
            "gc" * (i in collected_in),
        )

    print("slowest iterations with traintel (iteration, second, over the step ms, its CPU ms, full gc):")
    print("  ", [described(i) for i in sorted(range(len(over)), key=over.__getitem__, reverse=True)[:8]])
    print("most traintel CPU on the training thread (iteration, second, over the step ms, CPU ms, full gc):")
    print("  ", [described(i) for i in sorted(range(len(cpu)), key=cpu.__getitem__, reverse=True)[:8]])
    quiet = array("d", (value for i, value in enumerate(cpu) if i not in collected_in))
    print(
        f"traintel CPU on the training thread, iterations without a full collection: {_percentiles(quiet)}; "
        f"> 1 ms: {sum(v > 1e-3 for v in quiet):,}, > 5 ms: {sum(v > 5e-3 for v in quiet):,}"
    )
    print(
        "full garbage collections with traintel (iteration, ms, on the training thread):",
        [(i, round(t), here) for i, t, here in collections],
    )
    print(f"exit (shutdown) {exit_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
