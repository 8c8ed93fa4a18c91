"""Export policy "all" against the bare OpenTelemetry SDK, measured as a job lives it.

Every iteration exported as four spans (``training_iteration`` and its three step phases)
against the same four spans made with the SDK alone (``start_as_current_span``, nested),
each in a fresh process, rounds interleaved. Each run is continuous: ``--iterations``
iterations, then a flush, all inside the timed region, with the SDK's default batch processor
and a discarding exporter on both sides. So the export thread's work, the queue's drops and
traintel's own records (windows, segments) are paid where they happen, as in a real job.

Why not ``bench_phase_overhead.py``'s figure: that benchmark times short rounds and lets the
batch processors drain between them outside the timed region (``settle``), with a queue large
enough never to drop; it measures the training thread's share only. Both are printed in the
README's performance table; this one is the honest ratio for "all".

Run: ``python benchmarks/bench_all_mode.py [--iterations 1000000] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap

CHILD = """
import json, sys, time
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

class Drop(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

variant, n = sys.argv[1], int(sys.argv[2])
if variant == "bare":
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    tracer = provider.get_tracer("bench")
    P = "ml.training.phase"
    def run(count):
        for i in range(count):
            attributes = {P: "training_iteration", "ml.training.iteration": i}
            with tracer.start_as_current_span("training_iteration", attributes=attributes):
                with tracer.start_as_current_span("model_forward", attributes={P: "model_forward"}):
                    pass
                with tracer.start_as_current_span("model_backward", attributes={P: "model_backward"}):
                    pass
                with tracer.start_as_current_span("optimizer_update", attributes={P: "optimizer_update"}):
                    pass
    flush = provider.force_flush
else:
    import traintel
    traintel.configure(span_exporters=[Drop()], metric_readers=[], export_iterations="all")
    def run(count):
        with traintel.training_loop():
            for _ in range(count):
                with traintel.training_iteration():
                    with traintel.model_forward():
                        pass
                    with traintel.model_backward():
                        pass
                    with traintel.optimizer_update():
                        pass
    flush = lambda: traintel.get_telemetry().flush(60)
run(2000)  # warm-up
flush()
start = time.perf_counter()
run(n)
flush()
print(json.dumps({"us": (time.perf_counter() - start) / n * 1e6}))
"""


def one(variant: str, iterations: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), variant, str(iterations)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bare: list[float] = []
    ours: list[float] = []
    for round_ in range(args.rounds):
        order = ("bare", "all") if round_ % 2 == 0 else ("all", "bare")
        for variant in order:
            (bare if variant == "bare" else ours).append(one(variant, args.iterations))
        print(f"round {round_ + 1}: bare {bare[-1]:.2f} us, traintel 'all' {ours[-1]:.2f} us", flush=True)
    ratios = [o / b for o, b in zip(ours, bare, strict=True)]
    print(
        f"'all' vs the bare SDK, {args.iterations:,} iterations per fresh process, {args.rounds} interleaved "
        f"rounds: bare {statistics.median(bare):.2f} us, traintel {statistics.median(ours):.2f} us, "
        f"ratio median {statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
