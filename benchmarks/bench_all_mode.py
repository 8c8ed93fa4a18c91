"""Export policy "all" against the bare OpenTelemetry SDK, measured as a job lives it.

Every iteration exported as four spans (``training_iteration`` and its three step phases)
against the same four spans made with the SDK alone (``start_as_current_span``, nested),
each in a fresh process, rounds interleaved. Each run is continuous: ``--iterations``
iterations, then a flush, all inside the timed region, with the SDK's default batch processor
and a discarding exporter on both sides. So the export thread's work, the queue's drops and
traintel's own records (windows, segments) are paid where they happen, as in a real job.

Printed per round: microseconds per iteration and the share of step spans each side lost (the
discarding exporters count what reaches them: a full queue drops the rest), with the SDK's
default queue (2,048 spans) on both sides. ``bench_phase_overhead.py`` measures "all" in shorter
rounds with a queue large enough never to drop; this one is the ratio of a continuous run.

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

PHASES = {"training_iteration", "model_forward", "model_backward", "optimizer_update"}

class Drop(SpanExporter):
    received = 0
    def export(self, spans):
        Drop.received += sum(1 for span in spans if span.name in PHASES)
        return SpanExportResult.SUCCESS

variant, n, pace_ns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def pace(due):  # spin (holding the GIL, as a step's Python code would) until the next iteration is due
    due += pace_ns
    while time.perf_counter_ns() < due:
        pass
    return due
if variant.startswith("bare"):
    if variant == "bare-quiet":  # the SDK's warning for every span a full queue drops, silenced
        import logging
        logging.getLogger("opentelemetry.sdk._shared_internal").disabled = True
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    tracer = provider.get_tracer("bench")
    P = "ml.training.phase"
    def run(count):
        due = time.perf_counter_ns()
        for i in range(count):
            attributes = {P: "training_iteration", "ml.training.iteration": i}
            with tracer.start_as_current_span("training_iteration", attributes=attributes):
                with tracer.start_as_current_span("model_forward", attributes={P: "model_forward"}):
                    pass
                with tracer.start_as_current_span("model_backward", attributes={P: "model_backward"}):
                    pass
                with tracer.start_as_current_span("optimizer_update", attributes={P: "optimizer_update"}):
                    pass
            if pace_ns:
                due = pace(due)
    flush = provider.force_flush
else:
    import traintel
    traintel.configure(span_exporters=[Drop()], metric_readers=[], export_iterations="all")
    def run(count):
        due = time.perf_counter_ns()
        with traintel.training_loop():
            for _ in range(count):
                with traintel.training_iteration():
                    with traintel.model_forward():
                        pass
                    with traintel.model_backward():
                        pass
                    with traintel.optimizer_update():
                        pass
                if pace_ns:
                    due = pace(due)
    flush = lambda: traintel.get_telemetry().flush(60)
run(2000)  # warm-up
flush()
start = time.perf_counter()
run(n)
flush()
elapsed = time.perf_counter() - start
lost = 4 * (2000 + n) - Drop.received  # the step spans the exporter never saw (queue overflow)
print(json.dumps({"us": elapsed / n * 1e6, "lost": lost / (4 * (2000 + n))}))
"""


def one(variant: str, iterations: int, pace_ns: int = 0) -> tuple[float, float]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), variant, str(iterations), str(pace_ns)],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["us"]), float(result["lost"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bare: list[float] = []
    ours: list[float] = []
    lost: dict[str, list[float]] = {"bare": [], "all": []}
    for round_ in range(args.rounds):
        order = ("bare", "all") if round_ % 2 == 0 else ("all", "bare")
        for variant in order:
            us, share = one(variant, args.iterations)
            (bare if variant == "bare" else ours).append(us)
            lost[variant].append(share)
        print(
            f"round {round_ + 1}: bare {bare[-1]:.2f} us ({lost['bare'][-1]:.2%} of spans lost), "
            f"traintel 'all' {ours[-1]:.2f} us ({lost['all'][-1]:.2%} lost)",
            flush=True,
        )
    ratios = [o / b for o, b in zip(ours, bare, strict=True)]
    print(
        f"'all' vs the bare SDK, {args.iterations:,} iterations per fresh process, {args.rounds} interleaved "
        f"rounds: bare {statistics.median(bare):.2f} us, traintel {statistics.median(ours):.2f} us, "
        f"ratio median {statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}); step "
        f"spans lost: bare {max(lost['bare']):.2%} at most, traintel {max(lost['all']):.2%} at most"
    )


if __name__ == "__main__":
    main()
