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

Prints, per step rate, the file's bytes per hour against the budget, the spans' (what a trace
backend holds) and the metric lines' (a fixed cost per collection, whatever the step rate), and
the bytes of each kind of record. Bar for the whole file: <= 1 MB per hour at 10 steps/s and
<= 2 MB per hour at 1,000 steps/s.

Run: ``python benchmarks/bench_export_volume.py [--rates 10 1000] [--minutes 60]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.volume_job import VOLUME_JOB  # noqa: E402

_STEP_PHASES = {"data_loading", "model_forward", "model_backward", "optimizer_update", "training_iteration"}


def _kind(span: dict[str, object]) -> str:
    name = str(span["name"])
    if name in _STEP_PHASES:
        return "iteration trees (5 spans each)"
    if name == "training_window":
        return "window records"
    if name in ("training_loop", "application"):
        return "loop/application segments"
    return "other spans"


def measure(rate: float, minutes: float) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """Run one job; return the file's bytes and the bytes and count of each kind of record."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(f"RATE = {rate}\nMINUTES = {minutes}\n" + VOLUME_JOB)
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
                for resource in record.get("resourceSpans", []):
                    for scope in resource["scopeSpans"]:
                        for span in scope["spans"]:
                            size = len(json.dumps(span, separators=(",", ":")))
                            overhead -= size
                            sizes[_kind(span)] += size
                            counts[_kind(span)] += 1
                sizes["line overhead (resource, scope)"] += overhead
        return total, sizes, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[10.0, 1000.0], help="steps per second")
    parser.add_argument("--minutes", type=float, default=60.0, help="simulated minutes per job")
    args = parser.parse_args(argv)
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
