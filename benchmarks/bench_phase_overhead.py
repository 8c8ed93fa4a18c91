"""Per-iteration overhead of traintel against the bare OTel SDK and nv-one-logger, in one run.

Prints medians of several rounds and ratios measured side by side (absolute times on these
shared 2-core machines mean little). The iteration measured is a training step's telemetry:
``training_iteration`` containing ``model_forward``, ``model_backward`` and ``optimizer_update``,
with nothing inside, so the figure is pure overhead.

traintel runs as shipped: nothing configured, so the embedded file exporter (to a scratch
directory) and its metric reader. Each round of a variant is ``--iterations`` iterations (20,000
by default: a window holds at most 10,000, so every round closes windows) followed by a flush of
its own pipeline, both timed: the export threads, the window pipeline's worker and a metric
collection are paid inside the round, not between rounds (a collection per round is more than
a real run's one per 5 minutes; it is billed anyway). ``bench_instructions.py`` counts the same
in instructions, every thread and the exit included.

* floor: four ``perf_counter_ns`` pairs.
* bare SDK: the same four spans as nested ``start_as_current_span`` with a BatchSpanProcessor
  writing the same OTLP/JSON-lines file format as traintel's default (a file of its own), so
  "all" is compared like with like.
* traintel (not exported): the fast path for an iteration the policy does not export - the
  issue's target (<= 10 µs, >= 10x less than nv-one-logger).
* traintel (default policy): the same with every 100th iteration exported (~1 %), billed too.
* traintel "all": every iteration exported as four real SDK spans, same processor and exporter.
* nv-one-logger: its ``training_iteration`` alone (nothing nested), at the start of a run and
  later, in a separate virtualenv (``.venv-bench-nv``, created on first use) because it pins its
  own dependencies; rounds timed with the garbage collector off, as ``timeit`` does (see
  ``_nv_one_logger_iteration.py``); ``--nv-throughput`` has both compute throughput.
* flatness: traintel at iteration ~1,000 and again after ``--long`` iterations, in the process's
  CPU time (every thread: the window pipeline's worker and the exporter included), which the
  neighbours of a shared machine disturb far less than wall time.
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
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import traintel
from traintel import semconv
from traintel.exporters.file import OtlpJsonFileSpanExporter

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


def nv_one_logger(
    iterations: int, rounds: int, later: int, throughput: bool = False
) -> dict[str, float] | str:
    """Run the nv-one-logger half in its own virtualenv; a string says why it could not."""
    python = NV_VENV / "bin" / "python"
    # Probed with this checkout's traintel, as it runs: a dependency it gained since the
    # virtualenv was made (orjson, say) triggers the install below instead of a failed run.
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    probe = [str(python), "-c", "import nv_one_logger, traintel"]
    ready = python.exists()
    if ready:
        ready = subprocess.run(probe, capture_output=True, check=False, env=env).returncode == 0
    if not ready:  # both libraries in one virtualenv: nv-one-logger's pins, traintel's base deps
        try:
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(NV_VENV)], check=True, capture_output=True)
            subprocess.run(
                [
                    str(python), "-m", "pip", "install", "--quiet",
                    "nv-one-logger-training-telemetry", "pyyaml", str(HERE.parent),
                ],
                check=True, capture_output=True, timeout=900,
            )  # fmt: skip
        except (subprocess.SubprocessError, OSError) as exc:
            return f"unavailable ({exc})"
    with tempfile.TemporaryDirectory() as scratch:  # nv-one-logger writes its logs to the cwd
        result = subprocess.run(
            [
                str(python), str(HERE / "_nv_one_logger_iteration.py"), "--iterations", str(iterations),
                "--rounds", str(rounds), "--later", str(later), *(["--throughput"] if throughput else []),
            ],
            capture_output=True, text=True, timeout=1800, check=False, cwd=scratch,
            env=env,  # this checkout's traintel
        )  # fmt: skip
    if result.returncode != 0:
        return f"failed: {result.stderr.strip().splitlines()[-1:]}"
    parsed: dict[str, float] = json.loads(result.stdout)
    return parsed


def interleaved(
    variants: dict[str, Callable[[int], None]],
    n: int,
    rounds: int,
    settle: Callable[[str], None] = lambda name: None,
) -> dict[str, list[float]]:
    """Microseconds per iteration of every variant, one run of each per round, so the noise of
    these shared machines hits all variants alike; ratios are then taken per round. ``settle``
    runs after each variant (given its name), inside its timing: the export threads finish that
    variant's backlog there, billed to it, instead of competing for the GIL with the next one."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter_ns()
            fn(n)
            settle(name)
            times[name].append((time.perf_counter_ns() - start) / n / 1000)
    return times


def cpu_per_iteration(fn: Callable[[int], None], n: int, rounds: int) -> list[float]:
    """The process's CPU microseconds per iteration (every thread), each round flushed inside."""
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        fn(n)
        traintel.get_telemetry().flush(10)
        samples.append((time.process_time() - start) / n * 1e6)
    return samples


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--long", type=int, default=1_000_000, help="iterations for flatness and memory")
    parser.add_argument("--skip-nv", action="store_true", help="do not run nv-one-logger")
    parser.add_argument(
        "--nv-throughput", action="store_true", help="both libraries compute throughput and TFLOP/s"
    )
    args = parser.parse_args()

    # traintel as shipped: nothing configured (the first call builds the file exporter and its
    # metric reader from the clean environment); the file goes to a scratch directory. The same
    # batch processor settings for the bare SDK and traintel (a queue large enough that neither
    # drops spans under this synthetic load, "all" included).
    for name in [name for name in os.environ if name.startswith(("OTEL_", "TRAINTEL_"))]:
        del os.environ[name]
    os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(1 << 16)
    os.environ["TRAINTEL_OUTPUT_DIR"] = tempfile.mkdtemp(prefix="traintel-overhead-")
    sdk_provider = TracerProvider(shutdown_on_exit=False)
    bare_file = Path(os.environ["TRAINTEL_OUTPUT_DIR"]) / "bare-sdk.otlp.jsonl"
    sdk_provider.add_span_processor(BatchSpanProcessor(OtlpJsonFileSpanExporter(bare_file)))
    bare = bare_sdk(sdk_provider)

    def not_exported(n: int) -> None:
        # The figure: iterations the policy does not export (no every-M-th sample).
        traintel.set_training_config(export_iterations="sampled", export_every_n_iterations=0)
        traintel_steps(n)

    def default_policy(n: int) -> None:
        # Also billed: the default's every-100th iteration, materialised as SDK spans.
        traintel.set_training_config(export_iterations="sampled", export_every_n_iterations=100)
        traintel_steps(n)

    def export_all(n: int) -> None:
        traintel.set_training_config(export_iterations="all")
        traintel_steps(n)

    bare_name = "bare OTel SDK, 4 spans"
    variants = {
        "floor (4 perf_counter_ns pairs)": floor,
        bare_name: bare,
        "traintel, not exported": not_exported,
        "traintel, default policy": default_policy,
        "traintel, export all (4 spans)": export_all,
    }

    def settle(name: str) -> None:  # each flushes its own pipeline; the floor has none
        if name == bare_name:
            sdk_provider.force_flush()
        elif name.startswith("traintel"):
            traintel.get_telemetry().flush(10)

    with traintel.training_loop():
        for fn in variants.values():  # warm up
            fn(1000)
        times = interleaved(variants, args.iterations, args.rounds, settle)
    traintel.set_training_config(export_iterations="sampled")

    # flatness and memory over a long run, default policy
    with traintel.training_loop():
        traintel_steps(1000)
        early = cpu_per_iteration(traintel_steps, args.iterations, args.rounds)
        rss_before = rss_bytes()
        traintel_steps(max(0, args.long - 1000 - args.iterations * args.rounds))
        late = cpu_per_iteration(traintel_steps, args.iterations, args.rounds)
        rss_after = rss_bytes()
    traintel.shutdown(5)

    nv = None if args.skip_nv else nv_one_logger(1000, args.rounds, 20_000, args.nv_throughput)

    quiet, default, everything, sdk = (
        "traintel, not exported",
        "traintel, default policy",
        "traintel, export all (4 spans)",
        "bare OTel SDK, 4 spans",
    )
    print(f"per-iteration cost: median of {args.rounds} interleaved rounds x {args.iterations} iterations")
    for name, values in times.items():
        print(f"  {name:<36} {statistics.median(values):9.2f} µs")
    print(f"ratio traintel not exported / bare SDK:  {ratio(times, quiet, sdk):.3f}x")
    print(f"ratio traintel default / bare SDK:       {ratio(times, default, sdk):.3f}x")
    print(f"ratio traintel 'all' / bare SDK spans:   {ratio(times, everything, sdk):.2f}x")
    if isinstance(nv, dict):
        print("nv-one-logger (training_iteration alone) vs traintel (4 phases), one process, interleaved:")
        for label, nv_key, ours_key, ratio_key in (
            ("at the start", "nv_start", "traintel", "ratio_start"),
            (f"after {int(nv['later_at']):,} iterations", "nv_later", "traintel_later", "ratio_later"),
        ):
            print(
                f"  {label:<26} nv {nv[nv_key]:8.2f} µs   traintel {nv[ours_key]:7.2f} µs   "
                f"ratio {nv[ratio_key]:.1f}x"
            )
    else:
        print(f"nv-one-logger: {nv or 'skipped'}")
    early_us, late_us = statistics.median(early), statistics.median(late)
    print(
        f"flatness (process CPU): {early_us:.2f} µs near iteration 1,000 vs {late_us:.2f} µs after "
        f"{args.long:,} ({late_us / early_us:.2f}x)"
    )
    print(f"RSS growth over {args.long:,} iterations: {(rss_after - rss_before) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
