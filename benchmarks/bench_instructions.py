"""Per-iteration cost in instructions (valgrind's callgrind): the noise-free companion of
``bench_phase_overhead.py``.

Wall-clock figures on shared 2-core machines swing by 30 % between runs; callgrind counts the
instructions a run executes, which repeat to within a fraction of a percent. Each variant runs
``--iterations`` steps in a fresh interpreter under callgrind, and a baseline run (same
imports and setup, no steps) is subtracted. Instructions include the batch processor's export
thread, so exporting work is counted where it happens. Threads, caches and the GIL are not
modelled: this complements the wall-clock benchmark, it does not replace it.

Run: ``python benchmarks/bench_instructions.py`` (needs ``valgrind``: ``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_CHILD = """
import os, sys
sys.path.insert(0, {here!r})
from bench_phase_overhead import DropExporter, bare_sdk, floor, traintel_steps
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
import traintel
variant, policy, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sdk = TracerProvider(shutdown_on_exit=False)
sdk.add_span_processor(BatchSpanProcessor(DropExporter()))
telemetry = traintel.configure(
    span_exporters=[DropExporter()], metric_readers=[], export_iterations=policy, slow_iteration_factor=1e9
)
bare = bare_sdk(sdk)
run = {{"floor": floor, "bare_sdk": bare, "traintel_default": traintel_steps, "traintel_all": traintel_steps}}
with traintel.training_loop():
    for fn in run.values():
        fn(200)
    if variant != "baseline":
        run[variant](n)
    sdk.force_flush()
    telemetry.flush(30)
traintel.shutdown(5)
"""


def instructions(script: Path, variant: str, policy: str, n: int) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0", OTEL_BSP_MAX_QUEUE_SIZE=str(1 << 16))
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    result = subprocess.run(
        [*command, str(script), variant, policy, str(n)],
        capture_output=True, text=True, env=env, check=False, timeout=3600,
    )  # fmt: skip
    match = re.search(r"Collected : (\d+)", result.stderr)
    if match is None:
        raise RuntimeError(f"callgrind failed for {variant}: {result.stderr[-500:]}")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument(
        "--only", nargs="+", default=None, metavar="VARIANT", help="measure only these variants (no ratios)"
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind); nothing measured")
        return
    script = HERE / ".instructions_child.py"
    script.write_text(_CHILD.format(here=str(HERE)))
    try:
        # The baseline runs the same setup and warm-up under the same policy, without the steps.
        variants = (
            ("floor", "sampled"),
            ("bare_sdk", "sampled"),
            ("traintel_default", "sampled"),
            ("traintel_all", "all"),
        )  # fmt: skip
        variants = tuple(v for v in variants if args.only is None or v[0] in args.only)
        baselines = {
            policy: instructions(script, "baseline", policy, args.iterations)
            for policy in {policy for _, policy in variants}
        }
        per_step = {
            variant: (instructions(script, variant, policy, args.iterations) - baselines[policy])
            / args.iterations
            for variant, policy in variants
        }
    finally:
        script.unlink(missing_ok=True)
    print(f"instructions per iteration (callgrind, {args.iterations} iterations, baseline subtracted)")
    for variant, count in per_step.items():
        print(f"  {variant:<18} {count:12,.0f}")
    if args.only is not None:
        return
    print(
        f"ratio traintel default / bare SDK:      {per_step['traintel_default'] / per_step['bare_sdk']:.3f}x"
    )
    print(f"ratio traintel 'all' / bare SDK spans:  {per_step['traintel_all'] / per_step['bare_sdk']:.2f}x")


if __name__ == "__main__":
    main()
