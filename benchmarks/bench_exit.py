"""How long the exit takes after a long run, with the machine idle and under a CPU hog, and
whether it keeps its bound (``TRAINTEL_SHUTDOWN_TIMEOUT``, 5 s by default) with the final metric
line written.

Each run is a fresh interpreter with nothing configured (the embedded file exporter and its
metric reader): ``--iterations`` iterations of four step phases, each reporting samples and a
loss, then ``traintel.shutdown()`` timed. Under load, ``--hog`` busy processes (by default as
many as the machine has cores) run from before the job starts until it has exited. Per run:
the exit's seconds, whether it said it finished in time, whether the file holds the final
metric line (the run is shorter than the reader's 5-minute interval: the exit's collection),
and what it wrote to stderr - an overrun message, a metric collection timeout, a traceback (the
target is none, ever).

Run: ``python benchmarks/bench_exit.py [--iterations 200000] [--runs 10] [--idle-runs 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = """
import json, sys, time
import traintel
n = int(sys.argv[1])
with traintel.application(), traintel.training_loop():
    for i in range(n):
        with traintel.training_iteration(samples=32):
            with traintel.model_forward():
                pass
            with traintel.model_backward():
                pass
            with traintel.optimizer_update():
                pass
            traintel.record_metrics(loss=1.0 / (i + 1))
start = time.perf_counter()
ok = traintel.shutdown()
print(json.dumps({"exit_s": time.perf_counter() - start, "ok": ok}))
"""

_STDERR_SIGNS = {
    "overrun": "did not finish within",
    "metric timeout": "timed out",
    "traceback": "Traceback",
}


def one_run(iterations: int, hog: int) -> dict[str, object]:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hog)]
    try:
        with tempfile.TemporaryDirectory(prefix="traintel-exit-") as scratch:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINTEL_"))}
            env["TRAINTEL_OUTPUT_DIR"] = scratch
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, str(iterations)],
                capture_output=True, text=True, env=env, cwd=scratch, check=False, timeout=600,
            )  # fmt: skip
            files = Path(scratch).rglob("*.jsonl")
            lines = [line for path in files for line in path.read_bytes().splitlines()]
    finally:
        for process in hogs:
            process.kill()
            process.wait()
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    # the run is far shorter than the reader's interval: any metric line is the exit's collection
    result["final metric line"] = any(b'"resourceMetrics"' in line for line in lines)
    result["stderr"] = [sign for sign, text in _STDERR_SIGNS.items() if text in done.stderr]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=10, help="runs under the CPU hog")
    parser.add_argument("--idle-runs", type=int, default=3, help="runs without it")
    parser.add_argument("--hog", type=int, default=os.cpu_count() or 2, help="busy processes under load")
    args = parser.parse_args()
    loads = (("idle", args.idle_runs, 0), (f"{args.hog}-process CPU hog", args.runs, args.hog))
    for label, runs, hog in loads:
        if runs == 0:
            continue
        results = []
        for _ in range(runs):
            results.append(one_run(args.iterations, hog))
            print(f"  {label}: {results[-1]}", flush=True)
        seconds = [float(str(r["exit_s"])) for r in results]
        in_time = sum(r["ok"] is True for r in results)
        metric_line = sum(r["final metric line"] is True for r in results)
        signs = sum(bool(r["stderr"]) for r in results)
        print(
            f"{label}: exit after {args.iterations:,} iterations, {runs} runs: median "
            f"{statistics.median(seconds):.3f} s, max {max(seconds):.3f} s; in time {in_time}/{runs}, "
            f"final metric line {metric_line}/{runs}, runs with stderr signs {signs}/{runs}",
            flush=True,
        )


if __name__ == "__main__":
    main()
