"""Per-iteration overhead of traintel against the bare OTel SDK and nv-one-logger, in one run.

Prints medians of several rounds and ratios measured side by side (absolute times on these
shared 2-core machines mean little). The iteration measured is a training step's telemetry:
``training_iteration`` containing ``model_forward``, ``model_backward`` and ``optimizer_update``,
with nothing inside, so the figure is pure overhead.

* floor: four ``perf_counter_ns`` pairs.
* bare SDK: the same four spans as nested ``start_as_current_span`` with a BatchSpanProcessor.
* traintel (default policy): the fast path; ~1 % of iterations are exported.
* traintel "all": every iteration exported as four real SDK spans, same processor and exporter.
* nv-one-logger: its ``training_iteration`` alone (nothing nested), at the start of a run and
  later, in a separate virtualenv (``.venv-bench-nv``, created on first use) because it pins its
  own dependencies.
* flatness: traintel at iteration ~1,000 and again after ``--long`` iterations.
* memory: RSS growth over ``--long`` iterations.

Run: ``make bench`` or ``python benchmarks/bench_phase_overhead.py [--long 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import traintel
from traintel import semconv

HERE = Path(__file__).resolve().parent
NV_VENV = HERE.parent / ".venv-bench-nv"


class DropExporter(SpanExporter):
    """Accepts and discards: we measure the training thread, not serialisation."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def floor(n: int) -> None:
    clock = time.perf_counter_ns
    for _ in range(n):
        for _phase in range(4):
            clock()
            clock()


def bare_sdk(tracer_provider: TracerProvider) -> Callable[[int], None]:
    tracer = tracer_provider.get_tracer("bench")
    phase = semconv.PHASE

    def run(n: int) -> None:
        for i in range(n):
            with tracer.start_as_current_span(
                "training_iteration", attributes={phase: "training_iteration", semconv.ITERATION: i}
            ):
                with tracer.start_as_current_span("model_forward", attributes={phase: "model_forward"}):
                    pass
                with tracer.start_as_current_span("model_backward", attributes={phase: "model_backward"}):
                    pass
                with tracer.start_as_current_span("optimizer_update", attributes={phase: "optimizer_update"}):
                    pass

    return run


def traintel_steps(n: int) -> None:
    for _ in range(n):
        with traintel.training_iteration():
            with traintel.model_forward():
                pass
            with traintel.model_backward():
                pass
            with traintel.optimizer_update():
                pass


def measure(fn: Callable[[int], None], n: int, rounds: int) -> float:
    """Median microseconds per iteration over ``rounds`` runs of ``n`` iterations."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        fn(n)
        samples.append((time.perf_counter_ns() - start) / n / 1000)
    return statistics.median(samples)


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def nv_one_logger(iterations: int, rounds: int, later: int) -> dict[str, float] | str:
    """Run the nv-one-logger half in its own virtualenv; a string says why it could not."""
    python = NV_VENV / "bin" / "python"
    if not python.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(NV_VENV)], check=True, capture_output=True)
            subprocess.run(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "nv-one-logger-training-telemetry",
                    "pyyaml",
                ],
                check=True,
                capture_output=True,
                timeout=600,
            )
        except (subprocess.SubprocessError, OSError) as exc:
            return f"unavailable ({exc})"
    result = subprocess.run(
        [
            str(python), str(HERE / "_nv_one_logger_iteration.py"), "--iterations", str(iterations),
            "--rounds", str(rounds), "--later", str(later),
        ],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        return f"failed: {result.stderr.strip().splitlines()[-1:]}"
    parsed: dict[str, float] = json.loads(result.stdout)
    return parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--long", type=int, default=1_000_000, help="iterations for flatness and memory")
    parser.add_argument("--skip-nv", action="store_true", help="do not run nv-one-logger")
    args = parser.parse_args()

    sdk_provider = TracerProvider(shutdown_on_exit=False)
    sdk_provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=1 << 16))
    bare = bare_sdk(sdk_provider)

    # traintel with its own pipeline around the same kind of exporter, default sampling policy
    traintel.configure(span_exporters=[DropExporter()], metric_readers=[], slow_iteration_factor=1e9)
    with traintel.training_loop():
        for fn in (floor, bare, traintel_steps):  # warm up
            fn(1000)
        results = {
            "floor (4 perf_counter_ns pairs)": measure(floor, args.iterations, args.rounds),
            "bare OTel SDK, 4 spans": measure(bare, args.iterations, args.rounds),
            "traintel, default policy": measure(traintel_steps, args.iterations, args.rounds),
        }
    traintel.configure(span_exporters=[DropExporter()], metric_readers=[], export_iterations="all")
    with traintel.training_loop():
        traintel_steps(1000)
        results["traintel, export all (4 spans)"] = measure(traintel_steps, args.iterations, args.rounds)
        results["bare OTel SDK, 4 spans (again)"] = measure(bare, args.iterations, args.rounds)

    # flatness and memory over a long run, default policy
    traintel.configure(span_exporters=[DropExporter()], metric_readers=[], slow_iteration_factor=1e9)
    with traintel.training_loop():
        traintel_steps(1000)
        early = measure(traintel_steps, args.iterations, args.rounds)
        rss_before = rss_bytes()
        remaining = max(0, args.long - 1000 - args.iterations * args.rounds)
        traintel_steps(remaining)
        late = measure(traintel_steps, args.iterations, args.rounds)
        rss_after = rss_bytes()
    traintel.shutdown(5)

    nv = None if args.skip_nv else nv_one_logger(2000, 5, 20_000)

    print(f"per-iteration cost, median of {args.rounds} rounds x {args.iterations} iterations")
    for name, micros in results.items():
        print(f"  {name:<36} {micros:9.2f} µs")
    ours = results["traintel, default policy"]
    sdk = statistics.mean([results["bare OTel SDK, 4 spans"], results["bare OTel SDK, 4 spans (again)"]])
    print(f"ratio traintel default / bare SDK:       {ours / sdk:.3f}x")
    print(f"ratio traintel 'all' / bare SDK spans:   {results['traintel, export all (4 spans)'] / sdk:.2f}x")
    if isinstance(nv, dict):
        print(f"  nv-one-logger training_iteration alone: {nv['start_us']:.2f} µs at the start, "
              f"{nv['later_us']:.2f} µs at iteration {int(nv['later_at'])}")  # fmt: skip
        print(f"ratio nv-one-logger (start) / traintel:  {nv['start_us'] / ours:.1f}x")
    else:
        print(f"  nv-one-logger: {nv or 'skipped'}")
    print(f"flatness: {early:.2f} µs near iteration 1,000 vs {late:.2f} µs after {args.long:,} "
          f"({late / early:.2f}x)")  # fmt: skip
    print(f"RSS growth over {args.long:,} iterations: {(rss_after - rss_before) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
