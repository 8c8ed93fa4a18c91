"""What a user runs, in instructions per iteration (valgrind's callgrind), every thread and the exit
included: the shipped default against the recorder alone, measured in one run.

Wall-clock figures on shared 2-core machines swing by 30 % between runs; callgrind counts the
instructions a process executes, on every thread, which repeat to within a fraction of a percent
and do not change when the machine is loaded. Each variant runs in a fresh interpreter under
callgrind: set-up, ``--warmup`` iterations, ``--iterations`` iterations, then a flush and the
interpreter's exit (traintel's exit hook: the final window, the last spans, the final metric
collection). A baseline run of the same variant does everything but the ``--iterations``
iterations; the difference divided by ``--iterations`` is the cost per iteration, whatever
thread paid it and whenever (at a window close, a metric collection or the exit).

Variants (an iteration is ``training_iteration`` around ``model_forward``, ``model_backward``
and ``optimizer_update``, nothing inside):

* ``shipped``: nothing configured - the embedded file exporter and its metric reader, as a user
  who only imports traintel gets them (the file written to a scratch directory);
* ``recorder``: the recorder alone - a discarding span exporter and no metric reader;
* ``floor`` (four ``perf_counter_ns`` pairs), ``bare_sdk`` (four nested SDK spans through a
  batch processor and a discarding exporter), ``all`` (every iteration exported as four spans,
  discarding exporter, no reader): for scale, with ``--variants``.

Printed: instructions per iteration of each variant and the ratio shipped / recorder (the
target is at most 1.5). ``--profiles DIR`` keeps each run's callgrind file for
``callgrind_annotate``. Threads, caches and the GIL are not modelled, and the windows close by
the wall clock as well as by count, so under callgrind's slowdown a window holds fewer
iterations than at full speed (more closes per iteration than a real run; both variants alike).

Run: ``python benchmarks/bench_instructions.py [--iterations 20000] [--warmup 2000]`` (needs
``valgrind``: ``apt-get install valgrind``; about two minutes of CPU per variant).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

_CHILD = """
import sys, time
variant, warmup, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if variant == "floor":
    def steps(count):
        clock = time.perf_counter_ns
        for _ in range(count):
            for _phase in range(4):
                clock()
                clock()
    for count in (warmup, n):
        steps(count)
    sys.exit(0)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

class Drop(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

if variant == "bare_sdk":
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    tracer, P = provider.get_tracer("bench"), "ml.training.phase"
    def steps(count):
        for i in range(count):
            attributes = {P: "training_iteration", "ml.training.iteration": i}
            with tracer.start_as_current_span("training_iteration", attributes=attributes):
                with tracer.start_as_current_span("model_forward", attributes={P: "model_forward"}):
                    pass
                with tracer.start_as_current_span("model_backward", attributes={P: "model_backward"}):
                    pass
                with tracer.start_as_current_span("optimizer_update", attributes={P: "optimizer_update"}):
                    pass
    for count in (warmup, n):
        steps(count)
    provider.force_flush()
    sys.exit(0)
import traintel
if variant == "recorder":
    traintel.configure(span_exporters=[Drop()], metric_readers=[])
elif variant == "all":
    traintel.configure(span_exporters=[Drop()], metric_readers=[], export_iterations="all")
# "shipped": nothing configured, the first phase configures from the (clean) environment
with traintel.application(), traintel.training_loop():
    for count in (warmup, n):
        for _ in range(count):
            with traintel.training_iteration():
                with traintel.model_forward():
                    pass
                with traintel.model_backward():
                    pass
                with traintel.optimizer_update():
                    pass
traintel.get_telemetry().flush(60)
# the interpreter's exit runs traintel's exit hook: the final metric collection and the last spans
"""

VARIANTS = ("floor", "bare_sdk", "recorder", "shipped", "all")


def instructions(script: Path, variant: str, warmup: int, n: int, profile: Path | None) -> int:
    """Instructions of one fresh interpreter under callgrind, all its threads together."""
    with tempfile.TemporaryDirectory(prefix="traintel-instructions-") as scratch:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINTEL_"))}
        env.update(PYTHONHASHSEED="0", TRAINTEL_OUTPUT_DIR=scratch)
        out = str(profile) if profile is not None else "/dev/null"
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
        result = subprocess.run(
            [*command, str(script), variant, str(warmup), str(n)],
            capture_output=True, text=True, env=env, check=False, timeout=3600, cwd=scratch,
        )  # fmt: skip
    match = re.search(r"Collected : (\d+)", result.stderr)
    if match is None or result.returncode != 0:
        raise RuntimeError(f"callgrind failed for {variant}: {result.stderr[-800:]}")
    if "Traceback" in result.stderr or "timed out" in result.stderr:
        print(f"  note: {variant} wrote to stderr: {result.stderr.strip().splitlines()[-1][:200]}")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["recorder", "shipped"])
    parser.add_argument("--profiles", type=Path, default=None, help="keep callgrind files in this folder")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind); nothing measured")
        return
    if args.profiles is not None:
        args.profiles.mkdir(parents=True, exist_ok=True)
    script = HERE / ".instructions_child.py"
    script.write_text(_CHILD)
    per_iteration: dict[str, float] = {}
    try:
        for variant in args.variants:
            counts = []
            for label, n in (("baseline", 0), ("run", args.iterations)):
                profile = None if args.profiles is None else args.profiles / f"callgrind.{variant}.{label}"
                counts.append(instructions(script, variant, args.warmup, n, profile))
            per_iteration[variant] = (counts[1] - counts[0]) / args.iterations
            print(
                f"  {variant:<9} run {counts[1]:>15,}  baseline {counts[0]:>15,}  "
                f"per iteration {per_iteration[variant]:>10,.0f}",
                flush=True,
            )
    finally:
        script.unlink(missing_ok=True)
    print(
        f"instructions per iteration (callgrind, all threads and the exit, {args.iterations:,} iterations "
        f"after {args.warmup:,} warm-up, the same run without them subtracted)"
    )
    for variant, count in per_iteration.items():
        print(f"  {variant:<9} {count:12,.0f}")
    if "shipped" in per_iteration and "recorder" in per_iteration:
        ratio = per_iteration["shipped"] / per_iteration["recorder"]
        print(f"ratio shipped default / recorder alone: {ratio:.2f}x (target <= 1.5x)")
    if "all" in per_iteration and "bare_sdk" in per_iteration:
        print(f"ratio 'all' / bare SDK spans: {per_iteration['all'] / per_iteration['bare_sdk']:.2f}x")


if __name__ == "__main__":
    main()
