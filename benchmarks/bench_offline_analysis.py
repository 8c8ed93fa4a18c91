"""``traintel summary``, ``goodput`` and ``report`` over a many-rank job in the collector's layout.

The job: real fake-clock training jobs (traintel's API and embedded file exporter with its
default settings, 0.1 s iterations with four step phases, a loss, 16 samples each, a 3 s
checkpoint every 10,000 iterations, a metric collection every simulated minute as the periodic
reader makes), one process for rank 0 and seven more for the other ranks (in a job this large
only rank 0 exports sampled iterations, the others their window records and phases). Each real
job's lines are copied to its ranks with the resource's rank, instance id and host rewritten,
and the ranks' lines are interleaved into one file per node, as a collector's file exporter
gathering every node writes them. Before timing, ``report --json`` must give the generated
totals exactly (iterations, samples, checkpoint saves, productive time), or the run stops.

Each command runs in a fresh process (``python -m traintel.cli``, byte-compiled), as a user runs it, with the
default worker count (one process per CPU up to one per file); the numbers are its input
bytes over its CPU seconds (user + system, workers included: MB/s per core), over its wall
time, its speed as a multiple of a plain orjson parse of every line of the same files measured
in the same round (``x orjson``: the orjson process's CPU seconds over the command's), and the
peak RSS of the largest process (``getrusage(RUSAGE_CHILDREN)``): the medians of ``--rounds``
interleaved rounds, with the range of MB/s per core. ``--old`` also runs the
committed version (``git archive HEAD``, or the commit given: ``--old REV``) on the smallest size.

Run: ``python benchmarks/bench_offline_analysis.py [--ranks 64] [--iterations 1000000 ...]
[--nodes 8] [--dir DIR] [--rounds 3] [--old [REV]]`` (several ``--iterations`` show how the figures
scale).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
REAL_JOBS = 8
SAMPLES, STEP_S, CHECKPOINT_EVERY, CHECKPOINT_S = 16, 0.1, 10_000, 3
JOB = """
import sys, threading, time
S = 10**9
NOW = [1_700_000_000 * S]
time.time_ns = lambda: NOW[0]
time.monotonic_ns = time.time_ns  # traintel times with both: one simulated timeline
def tick(seconds):
    NOW[0] += round(seconds * S)
import traintel
meters = traintel.configure(warmup_iterations=0).pipeline.meter_provider
next_collect = NOW[0] + 60 * S
with traintel.application():
    with traintel.model_init():
        tick(5)
    with traintel.training_loop(train_iterations_start=0):
        for i in range(int(sys.argv[1])):
            with traintel.training_iteration(samples=SAMPLES):
                with traintel.data_loading():
                    tick(STEP_S * 0.01)
                with traintel.model_forward():
                    tick(STEP_S * 0.4)
                with traintel.model_backward():
                    tick(STEP_S * 0.5)
                with traintel.optimizer_update():
                    tick(STEP_S * 0.09)
                traintel.record_metrics(loss=1.0 / (i + 1))
            if (i + 1) % CHECKPOINT_EVERY == 0:
                with traintel.checkpoint_save(iteration=i + 1):
                    tick(CHECKPOINT_S)
            if NOW[0] >= next_collect:  # the periodic reader's collection, on its own thread
                collect = threading.Thread(target=meters.force_flush)
                collect.start()
                collect.join()
                next_collect += 60 * S
traintel.shutdown()
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINTEL_"))}
    env["PYTHONPATH"] = str(REPO / "src")
    env.update(extra)
    return env


def real_job(work: Path, rank: int, ranks: int, iterations: int) -> Path:
    out = work / f"real-{rank}"
    env = _env(
        TRAINTEL_OUTPUT_DIR=str(out), TRAINTEL_RUN_ID="bench-job", TRAINTEL_CROSS_RANK="off",
        RANK=str(rank), LOCAL_RANK=str(rank % 8), WORLD_SIZE=str(ranks),
    )  # fmt: skip
    constants = f"SAMPLES, STEP_S, CHECKPOINT_EVERY = {SAMPLES}, {STEP_S}, {CHECKPOINT_EVERY}\n"
    constants += f"CHECKPOINT_S = {CHECKPOINT_S}\n"
    subprocess.run([sys.executable, "-c", constants + JOB, str(iterations)], env=env, check=True)
    (path,) = out.glob("*.otlp.jsonl")  # (the progress mark beside it is not copied)
    return path


def _resource_swaps(lines: list[bytes], rank: int, nodes: int, ranks: int) -> dict[bytes, bytes]:
    """Each resource's JSON as written, and the same resource as ``rank``'s."""
    swaps: dict[bytes, bytes] = {}
    for line in lines[:4]:
        tree = orjson.loads(line)
        for group in tree.get("resourceSpans", []) + tree.get("resourceMetrics", []):
            attributes = group["resource"]["attributes"]
            old = orjson.dumps(attributes)
            for kv in attributes:
                key, value = kv["key"], kv["value"]
                if key == "ml.training.rank":
                    value["intValue"] = str(rank)
                elif key == "service.instance.id":
                    value["stringValue"] = f"instance-{rank:03d}"
                elif key == "host.name":
                    value["stringValue"] = f"node-{rank * nodes // ranks}"
            swaps[old] = orjson.dumps(attributes)
    return swaps


def as_rank(lines: list[bytes], rank: int, nodes: int, ranks: int) -> list[bytes]:
    swaps = _resource_swaps(lines, rank, nodes, ranks)
    out = []
    for line in lines:
        swapped = line
        for old, new in swaps.items():
            swapped = swapped.replace(old, new)
        out.append(swapped)
    return out


def generate(directory: Path, ranks: int, nodes: int, iterations: int) -> list[Path]:
    """The job's node files under ``directory`` (reused when there)."""
    layout = directory / f"r{ranks}-n{nodes}-i{iterations}"
    done = layout / "DONE"
    if done.exists():
        return sorted(layout.glob("*.otlp.jsonl"))
    layout.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(dir=directory) as scratch,
        ThreadPoolExecutor(os.cpu_count() or 2) as pool,
    ):
        real = list(pool.map(lambda r: real_job(Path(scratch), r, ranks, iterations), range(REAL_JOBS)))
        lines = [[line for line in path.read_bytes().splitlines() if line.strip()] for path in real]
        per_node = ranks // nodes
        files = []
        for node in range(nodes):
            members = range(node * per_node, (node + 1) * per_node)
            copies = [
                as_rank(lines[0 if r == 0 else 1 + (r - 1) % (REAL_JOBS - 1)], r, nodes, ranks)
                for r in members
            ]
            path = layout / f"node-{node}.otlp.jsonl"
            with open(path, "wb") as out:
                for group in itertools.zip_longest(*copies):
                    out.writelines(line + b"\n" for line in group if line is not None)
            files.append(path)
    done.touch()
    return files


#: Runs one command and prints its CPU seconds and peak RSS: RUSAGE_CHILDREN of a fresh parent
#: covers the command and its workers, and its maxrss is the largest of them.
WRAPPER = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime, r.ru_maxrss * 1024)
"""


#: The floor the commands are held to: a plain orjson parse of every line of the same files, in
#: a fresh process of its own (what "N x orjson" compares with).
ORJSON = """
import sys, orjson
for path in sys.argv[1:]:
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                orjson.loads(line)
"""


def measure(command: str, target: Path, src: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS bytes) of one command in a fresh process
    (``orjson``: the plain parse of the same files)."""
    start = time.perf_counter()
    if command == "orjson":
        run = [sys.executable, "-c", ORJSON, *map(str, sorted(target.glob("*.otlp.jsonl")))]
    else:
        run = [sys.executable, "-m", "traintel.cli", command, str(target)]
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, *run], env=_env(PYTHONPATH=str(src)), capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    cpu, rss = done.stdout.split()
    return wall, float(cpu), int(rss)


def check_totals(target: Path, ranks: int, iterations: int) -> None:
    """``report --json`` against what was generated: stops the run on any difference."""
    done = subprocess.run(
        [sys.executable, "-m", "traintel.cli", "report", "--json", str(target)],
        env=_env(), capture_output=True, check=True,
    )  # fmt: skip
    data = orjson.loads(done.stdout)
    saves = iterations // CHECKPOINT_EVERY
    (goodput,) = data["goodput"]
    badput = goodput["badput_seconds"]
    expected = {
        "iterations": (data["iterations"]["count"], iterations),
        "samples/s (job)": (data["throughput"]["samples_per_second"], SAMPLES / STEP_S * ranks),
        "checkpoint saves": (data["checkpoints"]["saves"], ranks * saves),
        "checkpoint seconds": (data["checkpoints"]["save_time_total_s"], ranks * saves * CHECKPOINT_S),
        "ranks": (len(data["identity"]["ranks"]), ranks),
        "job seconds": (goodput["total_seconds"], 5 + iterations * STEP_S + saves * CHECKPOINT_S),
        "productive seconds": (goodput["productive_seconds"], iterations * STEP_S * 0.99),
        "data loading seconds": (badput["data_loading"], iterations * STEP_S * 0.01),
        "checkpoint badput seconds": (badput["checkpoint_save"], saves * CHECKPOINT_S),
        "init seconds": (badput["initialization"], 5),
        "last iteration": (goodput["last_iteration"], iterations - 1),
    }
    wrong = {k: v for k, v in expected.items() if not math.isclose(v[0], v[1], rel_tol=1e-9)}
    if wrong or data["skipped_lines"]:
        raise SystemExit(f"totals differ (read, generated): {wrong}; skipped lines {data['skipped_lines']}")
    print(f"totals exact: {', '.join(f'{k} {v[0]:,.6g}' for k, v in expected.items())}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--iterations", type=int, action="append", help="per rank (repeatable)")
    parser.add_argument("--dir", type=Path, help="where the generated job is kept (reused)")
    parser.add_argument(
        "--old",
        nargs="?",
        const="HEAD",
        metavar="REV",
        help="also this commit's version (default HEAD), smallest size",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are printed")
    args = parser.parse_args()
    sizes = sorted(args.iterations or [1_000_000])
    directory = args.dir or Path(tempfile.gettempdir()) / "traintel-bench-offline"
    directory.mkdir(parents=True, exist_ok=True)
    old_src = None
    if args.old:
        old_src = Path(tempfile.mkdtemp(dir=directory)) / "old"
        old_src.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.old, "src"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(old_src)], input=archive.stdout, check=True)
    print(f"{'ranks':>5} {'iters/rank':>11} {'MB':>8} {'command':<8} {'wall s':>8} {'MB/s':>7} "
          f"{'MB/s/core':>9} {'(rounds)':>11} {'x orjson':>8} {'peak RSS MB':>11}  version")  # fmt: skip
    for n, iterations in enumerate(sizes):
        files = generate(directory, args.ranks, args.nodes, iterations)
        megabytes = sum(path.stat().st_size for path in files) / 1e6
        check_totals(files[0].parent, args.ranks, iterations)
        versions = [("new", REPO / "src")] + ([("old", old_src / "src")] if old_src and n == 0 else [])
        for _version, src in versions:  # byte-compiled, as an installed package is (even where
            # PYTHONDONTWRITEBYTECODE is set: each command process would compile ~40 modules)
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True)
        runs: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
        for _round in range(args.rounds):  # interleaved: a slow spell of the machine hits all alike
            runs.setdefault(("orjson", "-"), []).append(measure("orjson", files[0].parent, REPO / "src"))
            for command in ("summary", "goodput", "report"):
                for version, src in versions:
                    runs.setdefault((command, version), []).append(measure(command, files[0].parent, src))
        # each round's command against that round's orjson parse: a slow spell hits both alike
        floor = [m[1] for m in runs[("orjson", "-")]]
        for (command, version), measured in runs.items():
            wall = statistics.median(m[0] for m in measured)
            cpus = sorted(m[1] for m in measured)
            rss = max(m[2] for m in measured)
            spread = f"{megabytes / cpus[-1]:.1f}-{megabytes / cpus[0]:.1f}"
            ratio = statistics.median(f / m[1] for f, m in zip(floor, measured, strict=True))
            print(
                f"{args.ranks:>5} {iterations:>11,} {megabytes:>8,.0f} {command:<8} {wall:>8.1f} "
                f"{megabytes / wall:>7.1f} {megabytes / statistics.median(cpus):>9.1f} {spread:>11} "
                f"{ratio:>8.2f} {rss / 1e6:>11.0f}  {version}",
                flush=True,
            )


if __name__ == "__main__":
    main()
