"""Per-iteration overhead of traintel's phase spans, against the bare OTel SDK, in one run.

Prints medians of several rounds and ratios measured side by side (absolute times on these
shared 2-core machines mean little). Each iteration is the hot path of a training step:
``training_iteration`` containing ``model_forward``, ``model_backward``, ``optimizer_update``.

Run: ``make bench`` or ``python benchmarks/bench_phase_overhead.py [--iterations N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import traintel
from traintel import semconv


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

    def run(n: int) -> None:
        for i in range(n):
            with tracer.start_as_current_span(
                "training_iteration", attributes={semconv.PHASE: "training_iteration", semconv.ITERATION: i}
            ):
                with tracer.start_as_current_span(
                    "model_forward", attributes={semconv.PHASE: "model_forward"}
                ):
                    pass
                with tracer.start_as_current_span(
                    "model_backward", attributes={semconv.PHASE: "model_backward"}
                ):
                    pass
                with tracer.start_as_current_span(
                    "optimizer_update", attributes={semconv.PHASE: "optimizer_update"}
                ):
                    pass

    return run


def with_traintel(n: int) -> None:
    with traintel.training_loop():
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    sdk_provider = TracerProvider(shutdown_on_exit=False)
    sdk_provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=1 << 20))
    ours_provider = TracerProvider(shutdown_on_exit=False)
    ours_provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=1 << 20))
    traintel.configure(tracer_provider=ours_provider)

    bare = bare_sdk(sdk_provider)
    for fn in (floor, bare, with_traintel):  # warm up
        fn(500)
    results = {
        "floor (4 perf_counter_ns pairs)": measure(floor, args.iterations, args.rounds),
        "bare OTel SDK spans": measure(bare, args.iterations, args.rounds),
        "traintel phase spans": measure(with_traintel, args.iterations, args.rounds),
    }
    print(f"per-iteration cost, median of {args.rounds} rounds x {args.iterations} iterations (4 spans each)")
    for name, micros in results.items():
        print(f"  {name:<34} {micros:8.2f} µs")
    ratio = results["traintel phase spans"] / results["bare OTel SDK spans"]
    print(f"ratio traintel / bare SDK: {ratio:.2f}x")
    traintel.shutdown(2)


if __name__ == "__main__":
    main()
