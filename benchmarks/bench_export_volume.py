"""Bytes one rank exports per hour under the default policy, and where they go.

A training job of one simulated hour runs in a fresh process on a counter clock
(``time.time_ns`` advanced by the loop itself, so an hour takes seconds to minutes), through
the embedded default (the OTLP/JSON-lines file) with nothing configured. Each iteration has
the four step phases, reports samples and tokens and records a loss and a learning rate. One
iteration in 200 (drawn from a fixed seed) takes 5x the others, as garbage collection, a
data-loader hiccup or a noisy neighbour make a real loop's slow steps. The metric reader is
flushed every simulated interval of the reader the job got (5 minutes for the file unless
``OTEL_METRIC_EXPORT_INTERVAL`` says otherwise), from a thread of its own as the periodic
reader's, so the file holds the metric lines a real hour holds.

A counter clock makes every export batch as large as the batch processor allows; a real hour
writes more, smaller batches (the processor also exports every 5 s of real time), and every
batch is one line repeating the resource and scope. ``--real-minutes M`` therefore also runs the
same job on the real clock (each step's phases slept to a deadline, so the rate holds) for M
minutes and scales it to an hour: what grows with time (iteration trees after the first ten,
windows, batch lines) by 60 / M; segments by their period (``TRAINTEL_SEGMENT_SECONDS``, 600 s)
and metric lines by the reader's interval (300 s), at the bytes measured per record; the
simulated job of the same minutes is measured beside it for the ratio.

Prints, per step rate, the file's bytes per hour against the budget, the spans' (what a trace
backend holds) and the metric lines' (a fixed cost per collection, whatever the step rate), the
bytes of each kind of record, and the span lines (one per export batch, each repeating the
resource). Bar for the whole file: <= 1 MB per hour at 10 steps/s and <= 2 MB per hour at 1,000
steps/s.

``--ranks-seconds S`` instead runs a job of 2 real gloo ranks, each iterating as fast as it can
(empty steps: over 100,000 a second, where a window closes at its 10,000-row bound long before
the time floor) for S seconds of the real clock, and prints per rank the step rate, the window
records and the windows they hold, whether both ranks' records hold the same iterations, and the
file's bytes scaled to an hour (everything by 3,600 / S: the start's fixed costs over-counted).

Run: ``python benchmarks/bench_export_volume.py [--rates 10 1000] [--minutes 60]
[--real-minutes 3] [--ranks-seconds 180]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.volume_job import VOLUME_JOB  # noqa: E402

#: VOLUME_JOB's loop on the real clock: each phase slept to its deadline, the periodic reader
#: left to its own schedule (the final collection at exit).
REAL_JOB = """
import random, time
import traintel
step, n = 1 / RATE, int(60 * MINUTES * RATE)
jitter = random.Random(7)
traintel.configure(warmup_iterations=0)
deadline = [time.perf_counter()]
def tick(seconds):
    deadline[0] += seconds
    wait = deadline[0] - time.perf_counter()
    if wait > 0:
        time.sleep(wait)
with traintel.application():
    with traintel.model_init():
        tick(5)
    with traintel.training_loop(train_iterations_start=0):
        begin = time.perf_counter()
        for i in range(n):
            slow = 5 if jitter.random() < 0.005 else 1
            with traintel.training_iteration(samples=32, tokens=4096):
                with traintel.data_loading():
                    tick(step * 0.05 * slow)
                with traintel.model_forward():
                    tick(step * 0.3 * slow)
                with traintel.model_backward():
                    tick(step * 0.5 * slow)
                with traintel.optimizer_update():
                    tick(step * 0.15 * slow)
                traintel.record_metrics(loss=1.0 / (i + 1), lr=1e-3)
        print(f"real clock: {n / (time.perf_counter() - begin):.0f} steps/s achieved")
traintel.shutdown()
"""

#: One rank of ``--ranks-seconds``: empty iterations as fast as they go, the shipped default.
RANKS_JOB = """
import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
import traintel
traintel.configure()
end, n = time.monotonic() + SECONDS, 0
with traintel.training_loop():
    while True:
        with traintel.training_iteration():
            pass
        n += 1
        if n % 100_000 == 0:  # both ranks stop at the same iteration
            done = torch.tensor([int(time.monotonic() > end)])
            dist.all_reduce(done)
            if done.item():
                break
print(n)
traintel.shutdown()
dist.destroy_process_group()
"""

_STEP_PHASES = {"data_loading", "model_forward", "model_backward", "optimizer_update", "training_iteration"}


_TREES, _SEGMENTS = "iteration trees (5 spans each)", "loop/application segments"
_LINES = "span lines (batches)"
_FIRST = 10  # TRAINTEL_EXPORT_FIRST_ITERATIONS: exported once per loop, whatever the length


def _iteration(span: dict[str, object]) -> int:
    for attribute in span.get("attributes", []):  # type: ignore[attr-defined]
        if attribute["key"] == "ml.training.iteration":
            return int(attribute["value"]["intValue"])
    return -1


def _kind(span: dict[str, object]) -> str:
    name = str(span["name"])
    if name in _STEP_PHASES:
        return _TREES
    if name == "training_window":
        return "window records"
    if name in ("training_loop", "application"):
        return _SEGMENTS
    return "other spans"


def measure(
    rate: float, minutes: float, job: str = VOLUME_JOB
) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """Run one job; return the file's bytes and the bytes and count of each kind of record."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(f"RATE = {rate}\nMINUTES = {minutes}\n" + job)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINTEL_"))}
        env["TRAINTEL_OUTPUT_DIR"] = str(Path(tmp) / "runs")
        subprocess.run([sys.executable, str(script)], env=env, check=True, cwd=tmp)
        sizes: collections.Counter[str] = collections.Counter()
        counts: collections.Counter[str] = collections.Counter()
        total = 0
        for path in Path(tmp, "runs").rglob("*.jsonl"):
            total += path.stat().st_size
            for line in path.open("rb"):
                record = json.loads(line)
                if "resourceMetrics" in record:
                    sizes["metric lines"] += len(line)
                    counts["metric lines"] += 1
                    continue
                overhead = len(line)
                counts["span lines (batches)"] += 1
                for resource in record.get("resourceSpans", []):
                    for scope in resource["scopeSpans"]:
                        for span in scope["spans"]:
                            size = len(json.dumps(span, separators=(",", ":")))
                            overhead -= size
                            sizes[_kind(span)] += size
                            counts[_kind(span)] += 1
                            if span["name"] == "training_iteration" and _iteration(span) < _FIRST:
                                counts["first iterations"] += 1
                sizes["line overhead (resource, scope)"] += overhead
        return total, sizes, counts


def hour_from(rate: float, minutes: float, job: str) -> tuple[float, float, float]:
    """MB per hour, span lines per hour and their resource and scope (MB per hour) of a short
    job: what grows with time scaled by 60 / minutes, the once-per-loop first iterations kept
    once, segments and metric lines at their periods (600 s and 300 s by default) at the bytes
    measured per record."""
    _, sizes, counts = measure(rate, minutes, job)
    scale = 60 / minutes
    trees = max(1, counts[_TREES] // 5)
    first = counts["first iterations"] * sizes[_TREES] / trees
    rotations = max(1, math.ceil(minutes * 60 / 600))
    per_hour = (
        (sizes[_TREES] - first + sizes["window records"] + sizes["line overhead (resource, scope)"]) * scale
        + first
        + sizes["other spans"]
        + sizes[_SEGMENTS] / rotations * 3600 / 600
        + sizes["metric lines"] / max(1, counts["metric lines"]) * (3600 / 300 + 1)
    )
    return per_hour / 1e6, counts[_LINES] * scale, sizes["line overhead (resource, scope)"] * scale / 1e6


def _records(out: Path) -> list[tuple[int, int, int]]:
    """(first iteration, last iteration, windows held) of every window record in a rank's files."""
    found = []
    for path in out.rglob("*.jsonl"):
        for line in path.open("rb"):
            for resource in json.loads(line).get("resourceSpans", []):
                for scope in resource["scopeSpans"]:
                    found += [
                        _window_range(span) for span in scope["spans"] if span["name"] == "training_window"
                    ]
    return sorted(found)


def _window_range(span: dict[str, list[dict[str, dict[str, str]]]]) -> tuple[int, int, int]:
    values = {a["key"]: a["value"] for a in span["attributes"]}  # type: ignore[index]
    merged = values.get("ml.training.window.merged_windows", {"intValue": "1"})
    first, last = (values[f"ml.training.window.{key}_iteration"] for key in ("first", "last"))
    return int(first["intValue"]), int(last["intValue"]), int(merged["intValue"])


def ranks(seconds: float) -> None:
    """Two gloo ranks flat out for ``seconds``: their records and bytes (see the docstring)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(2):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINTEL_"))}
            env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"volume-{port}", OMP_NUM_THREADS="1",
                       TRAINTEL_OUTPUT_DIR=str(Path(tmp) / f"rank{rank}"))  # fmt: skip
            job = f"SECONDS = {seconds}\n" + RANKS_JOB
            procs.append(
                subprocess.Popen([sys.executable, "-c", job], env=env, stdout=subprocess.PIPE, text=True)
            )
        iterations = [int(proc.communicate()[0]) for proc in procs]
        records = [_records(Path(tmp) / f"rank{rank}") for rank in range(2)]
        for rank in range(2):
            size = sum(path.stat().st_size for path in (Path(tmp) / f"rank{rank}").rglob("*.jsonl"))
            windows = sum(r[2] for r in records[rank])
            rate, hourly = iterations[rank] / seconds, size * 3600 / seconds / 1e6
            print(f"rank {rank}: {rate:,.0f} steps/s, {len(records[rank])} window records holding {windows} "
                  f"windows, file {hourly:.2f} MB per hour (x{3600 / seconds:g})")  # fmt: skip
        print("records hold the same iterations on both ranks:", records[0] == records[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[10.0, 1000.0], help="steps per second")
    parser.add_argument("--minutes", type=float, default=60.0, help="simulated minutes per job")
    parser.add_argument(
        "--real-minutes", type=float, default=0.0, help="also run each rate on the real clock this long"
    )
    parser.add_argument(
        "--ranks-seconds", type=float, default=0.0, help="instead: 2 gloo ranks flat out this long"
    )
    args = parser.parse_args(argv)
    if args.ranks_seconds > 0:
        ranks(args.ranks_seconds)
        return 0
    if args.real_minutes > 0:
        for rate in args.rates:
            real, simulated = (
                hour_from(rate, args.real_minutes, job) for job in (REAL_JOB, VOLUME_JOB)
            )  # fmt: skip
            print(
                f"{rate:g} steps/s, {args.real_minutes:g} minutes scaled to an hour: real clock "
                f"{real[0]:.3f} MB/h in {real[1]:,.0f} span lines ({real[2]:.3f} MB/h of resource and "
                f"scope), counter clock {simulated[0]:.3f} MB/h in {simulated[1]:,.0f} span lines "
                f"({simulated[2]:.3f} MB/h); real / simulated {real[0] / simulated[0]:.3f}",
                flush=True,
            )
        return 0
    failed = False
    hour = 60 / args.minutes / 1e6
    for rate in args.rates:
        total, sizes, counts = measure(rate, args.minutes)
        metrics = sizes["metric lines"] * hour
        spans = total * hour - metrics
        budget = 1.0 if rate <= 10 else 2.0
        verdict = "within" if total * hour <= budget else "OVER"
        failed |= total * hour > budget
        print(f"\n{rate:g} steps/s, {args.minutes:g} simulated minutes: file {total * hour:.3f} MB per hour "
              f"({verdict} the {budget:g} MB budget): spans {spans:.3f} MB, metric lines {metrics:.3f} MB "
              f"({counts['metric lines']} lines)")  # fmt: skip
        trees = counts["iteration trees (5 spans each)"] // 5
        counts["iteration trees (5 spans each)"] = trees
        for kind, size in sorted(sizes.items(), key=lambda item: -item[1]):
            shown = f"{counts[kind]:7d}" if kind in counts else "       "
            print(f"  {kind:34s} {shown} {size * 60 / args.minutes / 1e6:8.3f} MB/h")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
