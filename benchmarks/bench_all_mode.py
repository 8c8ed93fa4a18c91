"""Export policy "all" against the bare OpenTelemetry SDK, measured as a job lives it.

Every iteration exported as four spans (``training_iteration`` and its three step phases)
against the same four spans made with the SDK alone (``start_as_current_span``, nested),
each in a fresh process, rounds interleaved. Each run is continuous: ``--iterations``
iterations, then a flush, all inside the timed region, with the SDK's default batch processor
and a discarding exporter on both sides. So the export thread's work, the queue's drops and
traintel's own records (windows, segments) are paid where they happen, as in a real job.

Printed per round: microseconds per iteration, the share of step spans each side lost (the
discarding exporters count what reaches them: a full queue drops the rest), with the SDK's
default queue (2,048 spans) on both sides, and the export thread's CPU time per span (is one
side's export path slower?). Then paced rounds (``--pace-us``): both sides spin out every
iteration to the same length, so their losses compare at the same span rate (traintel makes its
spans in about 0.6x the bare SDK's time, and a faster producer overflows a queue sooner).
``bench_phase_overhead.py`` measures "all" in shorter rounds with a queue large enough never to
drop; this one is the ratio of a continuous run.

Run: ``python benchmarks/bench_all_mode.py [--iterations 1000000] [--rounds 5] [--pace-us 0]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from typing import NamedTuple

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
import os, threading

def export_thread_cpu_s():  # the batch processor's thread: its CPU time (utime + stime), from /proc
    ticks = 0
    for thread in threading.enumerate():
        if thread.name.startswith("OtelBatch") and thread.native_id is not None:
            with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")

run(2000)  # warm-up
flush()
received, export_cpu = Drop.received, export_thread_cpu_s()
process_cpu, training_cpu = time.process_time(), time.thread_time()
start = time.perf_counter()
run(n)
flush()
elapsed = time.perf_counter() - start
export_cpu = export_thread_cpu_s() - export_cpu
process_cpu, training_cpu = time.process_time() - process_cpu, time.thread_time() - training_cpu
lost = 4 * (2000 + n) - Drop.received  # the step spans the exporter never saw (queue overflow)
exported = Drop.received - received
print(json.dumps({
    "us": elapsed / n * 1e6,
    "lost": lost / (4 * (2000 + n)),
    "export_us_per_span": export_cpu / max(1, exported) * 1e6,
    "training_us": training_cpu / n * 1e6,  # the training thread's CPU per iteration
    "others_us": (process_cpu - training_cpu - export_cpu) / n * 1e6,  # every other thread's
}))
"""


class Run(NamedTuple):
    us: float  # wall time per iteration
    lost: float  # share of step spans the exporter never saw
    export_us_per_span: float  # the batch processor's thread: CPU per exported span
    training_us: float  # the training thread's CPU per iteration
    others_us: float  # every other thread's CPU per iteration (traintel's workers, say)


def one(variant: str, iterations: int, pace_ns: int = 0) -> Run:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), variant, str(iterations), str(pace_ns)],
        capture_output=True,
        text=True,
        check=True,
    )
    return Run(**json.loads(done.stdout.strip().splitlines()[-1]))


def rounds(iterations: int, count: int, pace_ns: int) -> dict[str, list[Run]]:
    """``count`` interleaved rounds of a fresh process per side; each round printed."""
    runs: dict[str, list[Run]] = {"bare": [], "all": []}
    for round_ in range(count):
        for variant in ("bare", "all") if round_ % 2 == 0 else ("all", "bare"):
            runs[variant].append(one(variant, iterations, pace_ns))
        bare, ours = runs["bare"][-1], runs["all"][-1]
        print(
            f"round {round_ + 1}{f' (paced at {pace_ns / 1000:.0f} us)' if pace_ns else ''}: "
            f"bare {bare.us:.2f} us ({bare.lost:.3%} of spans lost, export thread "
            f"{bare.export_us_per_span:.2f} us per span), traintel 'all' {ours.us:.2f} us ({ours.lost:.3%} "
            f"lost, export thread {ours.export_us_per_span:.2f} us per span, its other threads "
            f"{ours.others_us:.2f} us per iteration)",
            flush=True,
        )
    return runs


def median(runs: list[Run], field: str) -> float:
    return statistics.median(getattr(run, field) for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--pace-us", type=float, default=None,
        help="paced rounds at this many us per iteration (default: 1.2x the bare SDK's median; 0: none)",
    )  # fmt: skip
    args = parser.parse_args()
    free = rounds(args.iterations, args.rounds, 0)
    bare, ours = free["bare"], free["all"]
    ratios = [o.us / b.us for o, b in zip(ours, bare, strict=True)]
    print(
        f"'all' vs the bare SDK, {args.iterations:,} iterations per fresh process, {args.rounds} interleaved "
        f"rounds: bare {median(bare, 'us'):.2f} us, traintel {median(ours, 'us'):.2f} us, ratio median "
        f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}); step spans lost: "
        f"bare {max(r.lost for r in bare):.3%} at most, traintel {max(r.lost for r in ours):.3%} at most; "
        f"export thread CPU per span: bare {median(bare, 'export_us_per_span'):.2f} us, traintel "
        f"{median(ours, 'export_us_per_span'):.2f} us",
        flush=True,
    )
    pace_us = 1.2 * median(bare, "us") if args.pace_us is None else args.pace_us
    if pace_us <= 0:
        return
    paced = rounds(args.iterations, args.rounds, int(pace_us * 1000))
    bare, ours = paced["bare"], paced["all"]
    print(
        f"at the same rate ({pace_us:.0f} us per iteration, both sides spinning out the rest of it): bare "
        f"{median(bare, 'us'):.2f} us, traintel {median(ours, 'us'):.2f} us; step spans lost: bare "
        f"{max(r.lost for r in bare):.3%} at most (median {median(bare, 'lost'):.3%}), traintel "
        f"{max(r.lost for r in ours):.3%} at most (median {median(ours, 'lost'):.3%})"
    )


if __name__ == "__main__":
    main()
