"""The embedded default (the OTLP/JSON-lines file) against a discarding exporter, as a job lives it.

Empty four-phase iterations (``training_iteration`` with ``model_forward``, ``model_backward``,
``optimizer_update``) under the default export policy (first K, every M-th, slow ones), each
variant in a fresh process, rounds interleaved, ratios taken per round:

* discard: ``traintel.configure(span_exporters=[Discard()])``, the floor for the export path;
* file: ``traintel.configure()``, the embedded default as a job without settings gets it;
* file, proto encoder (``--no-proto`` leaves it out): the same with the file exporter writing
  through the previous encoder (``encode_spans`` + ``json_format``), for before/after figures.

Metrics go to the default file in every variant. The timed region is the loop and the flush
that follows it, so the export thread's work is billed where it competes for the GIL. Spans
the batch processor's full queue turned away are read from traintel's own counters (what its
exit report and ``traintel.spans.dropped`` show) after shutdown. The bar: file / discard
<= 1.5 with no ``queue_full`` drop.

``--policy all`` exports every iteration instead (four spans each): beyond what one export
thread sharing the GIL can write, so drops are expected there; it shows how far off that is.

Then both encoders on the same batch of 512 real traintel spans (the batch processor's batch
size), in spans per second.

Run: ``python benchmarks/bench_file_exporter.py [--iterations 200000] [--rounds 5] [--policy all]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan

CHILD = """
import json, os, sys, time
from pathlib import Path
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
import traintel
from traintel.exporters import file as file_module, otlp_json
from traintel.exporters.health import HEALTH

class Discard(SpanExporter):
    exported = 0
    def export(self, spans):
        Discard.exported += len(spans)
        return SpanExportResult.SUCCESS

variant, n = sys.argv[1], int(sys.argv[2])
if variant == "discard":
    traintel.configure(span_exporters=[Discard()])
else:
    if variant == "file-proto":
        file_module.spans_to_json_line = otlp_json.proto_spans_to_json_line
    traintel.configure()

def run(count):
    for _ in range(count):
        with traintel.training_iteration():
            with traintel.model_forward():
                pass
            with traintel.model_backward():
                pass
            with traintel.optimizer_update():
                pass

with traintel.training_loop():
    run(2000)  # warm-up
    traintel.get_telemetry().flush(60)
    start = time.perf_counter()
    run(n)
    traintel.get_telemetry().flush(60)
    elapsed = time.perf_counter() - start
traintel.shutdown(30)
if variant == "discard":
    exported = Discard.exported
else:
    exported = 0  # spans in the file's trace lines
    for path in Path(os.environ["TRAINTEL_OUTPUT_DIR"]).glob("*.otlp.jsonl"):
        for line in path.open(encoding="utf-8"):
            for resource_spans in json.loads(line).get("resourceSpans", []):
                exported += sum(len(scope["spans"]) for scope in resource_spans["scopeSpans"])
print(json.dumps({"us": elapsed / n * 1e6, "dropped": HEALTH.snapshot().spans_dropped, "exported": exported}))
"""

VARIANTS = ("discard", "file", "file-proto")


@dataclass
class Run:
    us_per_iteration: float
    queue_full: int
    exported: int


def one(variant: str, iterations: int, policy: str) -> Run:
    """One fresh process; its environment has no ``OTEL_*`` or ``TRAINTEL_*`` but its own
    output directory and the export policy, so every variant gets the same defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINTEL_"))}
    env["TRAINTEL_EXPORT_ITERATIONS"] = policy
    with tempfile.TemporaryDirectory() as out:
        env["TRAINTEL_OUTPUT_DIR"] = out
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(CHILD), variant, str(iterations)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return Run(float(result["us"]), int(result["dropped"].get("queue_full", 0)), int(result["exported"]))


def encoder_throughput(batch_size: int = 512, repeats: int = 7) -> list[tuple[str, float]]:
    """Spans per second of each encoder on one batch of real traintel spans (best of ``repeats``)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import traintel
    from traintel.exporters.otlp_json import proto_spans_to_json_line, spans_to_json_line

    memory = InMemorySpanExporter()
    traintel.configure(span_exporters=[memory], metric_readers=[], export_iterations="all")
    with traintel.training_loop():
        for _ in range(batch_size // 4 + 1):
            with traintel.training_iteration():
                with traintel.model_forward():
                    pass
                with traintel.model_backward():
                    pass
                with traintel.optimizer_update():
                    pass
    traintel.shutdown(10)
    batch = list(memory.get_finished_spans())[:batch_size]
    encoders = (
        ("proto + json_format (before)", proto_spans_to_json_line),
        ("direct + orjson (now)", spans_to_json_line),
    )
    figures = []
    for name, encode in encoders:
        encode(batch)
        best = min(_timed(encode, batch) for _ in range(repeats))
        figures.append((name, len(batch) / best))
    return figures


def _timed(encode: Callable[[Sequence[ReadableSpan]], str], batch: Sequence[ReadableSpan]) -> float:
    start = time.perf_counter()
    encode(batch)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--policy", choices=("sampled", "all"), default="sampled", help="TRAINTEL_EXPORT_ITERATIONS"
    )
    parser.add_argument("--no-proto", action="store_true", help="leave out the previous encoder's run")
    args = parser.parse_args()
    variants = [v for v in VARIANTS if not (args.no_proto and v == "file-proto")]
    runs: dict[str, list[Run]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        order = variants if round_ % 2 == 0 else variants[::-1]
        for variant in order:
            runs[variant].append(one(variant, args.iterations, args.policy))
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{v} {runs[v][-1].us_per_iteration:.2f} µs" for v in variants),
            flush=True,
        )

    def us(variant: str) -> list[float]:
        return [run.us_per_iteration for run in runs[variant]]

    print(
        f"\n{args.iterations:,} empty 4-phase iterations per fresh process, export policy "
        f"{args.policy!r}, {args.rounds} interleaved rounds (medians):"
    )
    for variant in variants:
        print(
            f"  {variant:<11} {statistics.median(us(variant)):7.2f} µs/iteration   "
            f"queue_full drops per run {[run.queue_full for run in runs[variant]]}   "
            f"spans exported ~{statistics.median(run.exported for run in runs[variant]):,.0f}"
        )
    for variant in variants[1:]:
        ratios = [f / d for f, d in zip(us(variant), us("discard"), strict=True)]
        print(
            f"ratio {variant} / discard: median {statistics.median(ratios):.2f} "
            f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
        )
    print("\nencoders on one batch of 512 traintel spans:")
    figures = encoder_throughput()
    for name, rate in figures:
        print(f"  {name:<30} {rate:12,.0f} spans/s")
    print(f"  speed-up {figures[1][1] / figures[0][1]:.1f}x")


if __name__ == "__main__":
    main()
