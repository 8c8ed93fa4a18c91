"""Runs inside a separate virtualenv holding both nv-one-logger-training-telemetry and traintel.

nv-one-logger pins its own dependencies, so it gets a virtualenv of its own; traintel is
installed there too so both are measured in one process, in interleaved rounds (these machines
are noisy: interleaving exposes both to the same noise). Prints JSON with medians in
microseconds per iteration:

* ``nv_start``: nv-one-logger's ``with training_iteration():`` alone, at the start of a run;
* ``traintel``: traintel's ``training_iteration`` with ``model_forward``, ``model_backward`` and
  ``optimizer_update`` inside, iterations not exported (the issue's figure: no every-M-th
  sample; the first 10 are exported during the warm-up), in the same rounds;
* ``nv_later`` / ``traintel_later``: the same after ``--later`` iterations of each.

``--throughput`` configures both the way nv-one-logger's own README example does: throughput
logging on, a global batch size (32) and FLOPs per sample (100), so nv computes its throughput
and TFLOP/s metrics and traintel its samples/s, TFLOP/s (and MFU with a peak) for every window.
Without it both run with their defaults (nv-one-logger's throughput logging off).

Timed rounds run with the garbage collector off (as ``timeit`` does) and a collection between
rounds: nv-one-logger's heap grows with the run, and a full collection over it landing in
traintel's round (~17 ms here) is neither library's per-iteration cost.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench_phase_overhead import DropExporter, traintel_steps  # same dir: on sys.path
from nv_one_logger.api.config import OneLoggerConfig
from nv_one_logger.exporter.file_exporter import FileExporter
from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
from nv_one_logger.training_telemetry.api.context import application, training_iteration, training_loop
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

import traintel


def nv_steps(n: int) -> None:
    for _ in range(n):
        with training_iteration():
            pass


def interleaved(n: int, rounds: int) -> tuple[float, float, float]:
    """Medians of nv and traintel, and the median of per-round ratios nv / traintel."""
    nv, ours, ratios = [], [], []
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter_ns()
            nv_steps(n)
            a = (time.perf_counter_ns() - start) / n / 1000
            gc.collect()
            start = time.perf_counter_ns()
            traintel_steps(n)
            b = (time.perf_counter_ns() - start) / n / 1000
        finally:
            gc.enable()
        traintel.get_telemetry().flush(10)  # untimed: the export thread's backlog is not billed
        nv.append(a)
        ours.append(b)
        ratios.append(a / b)
    return statistics.median(nv), statistics.median(ours), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--later", type=int, default=20000)
    parser.add_argument("--throughput", action="store_true", help="both compute throughput and TFLOP/s")
    args = parser.parse_args()
    work: dict[str, int] = {"global_batch_size": 32, "flops_per_sample": 100} if args.throughput else {}
    # The comparison is for iterations the policy does not export (no every-M-th sample).
    traintel.configure(
        span_exporters=[DropExporter()],
        metric_readers=[],
        slow_iteration_factor=1e9,
        export_every_n_iterations=0,
        **work,
    )
    with tempfile.TemporaryDirectory() as tmp:
        base = OneLoggerConfig(application_name="bench", world_size_or_fn=1, session_tag_or_fn="bench")
        training = TrainingTelemetryConfig(
            perf_tag_or_fn="bench",
            global_batch_size_or_fn=32,
            log_every_n_train_iterations=50,
            is_log_throughput_enabled_or_fn=args.throughput,
            flops_per_sample_or_fn=100 if args.throughput else None,
            train_iterations_target_or_fn=10**7,  # required with throughput logging
            train_samples_target_or_fn=32 * 10**7,
        )
        provider = TrainingTelemetryProvider.instance()
        exporter = FileExporter(file_path=Path(tmp) / "t.json")
        provider.with_base_config(base).with_exporter(exporter).configure_provider()
        with application():
            provider.set_training_telemetry_config(training)
            with training_loop(train_iterations_start=0), traintel.training_loop():
                nv_steps(200)
                traintel_steps(200)
                nv_start, ours_start, ratio_start = interleaved(args.iterations, args.rounds)
                done = 200 + args.iterations * args.rounds
                filler = max(0, args.later - done)
                nv_steps(filler)
                traintel_steps(filler)
                nv_later, ours_later, ratio_later = interleaved(args.iterations, args.rounds)
    traintel.shutdown(2)
    print(
        json.dumps(
            {
                "nv_start": nv_start, "traintel": ours_start, "ratio_start": ratio_start,
                "nv_later": nv_later, "traintel_later": ours_later, "ratio_later": ratio_later,
                "later_at": args.later,
            }
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
