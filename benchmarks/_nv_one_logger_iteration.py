"""Runs inside a separate virtualenv with nv-one-logger-training-telemetry installed.

Prints JSON: microseconds per ``with training_iteration():`` (nothing inside), median of
rounds, at the start of a run and again after ``--later`` iterations. Exporter: the library's
FileExporter writing to a temporary file, as in its own example.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from nv_one_logger.api.config import OneLoggerConfig
from nv_one_logger.exporter.file_exporter import FileExporter
from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
from nv_one_logger.training_telemetry.api.context import application, training_iteration, training_loop
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider


def rounds(n: int, count: int) -> float:
    samples = []
    for _ in range(count):
        start = time.perf_counter_ns()
        for _ in range(n):
            with training_iteration():
                pass
        samples.append((time.perf_counter_ns() - start) / n / 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--later", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = OneLoggerConfig(application_name="bench", world_size_or_fn=1, session_tag_or_fn="bench")
        training = TrainingTelemetryConfig(
            perf_tag_or_fn="bench", global_batch_size_or_fn=32, log_every_n_train_iterations=50
        )
        provider = TrainingTelemetryProvider.instance()
        exporter = FileExporter(file_path=Path(tmp) / "t.json")
        provider.with_base_config(base).with_exporter(exporter).configure_provider()
        with application():
            provider.set_training_telemetry_config(training)
            with training_loop(train_iterations_start=0):
                rounds(200, 1)  # warm-up
                start = rounds(args.iterations, args.rounds)
                done = 200 + args.iterations * args.rounds
                filler = max(0, args.later - done)
                for _ in range(filler):
                    with training_iteration():
                        pass
                later = rounds(args.iterations, args.rounds)
    print(json.dumps({"start_us": start, "later_us": later, "later_at": args.later}))


if __name__ == "__main__":
    main()
