"""The exit and flushes under a slow part, for real: the message names what was slow (the
telemetry file, the metric reader's own collection), never a collector that is not there; a
metric collection that times out leaves no traceback, is counted and said once; a flush never
raises.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.subprocess_helpers import run_python

pytestmark = [pytest.mark.process]

SLOW_COLLECTION_JOB = """
import time
import traintel
from opentelemetry import metrics

telemetry = traintel.configure()

def slow(options):
    time.sleep(float(__import__("os").environ["CALLBACK_S"]))  # a user's gauge on a busy machine
    return []

meter = metrics.get_meter("user")
meter.create_observable_gauge("slow_gauge", [slow])
meter.create_observable_gauge("next_gauge", [slow])  # the SDK checks its deadline between gauges
with traintel.application():
    with traintel.training_loop():
        for i in range(4):
            with traintel.training_iteration():
                time.sleep(0.25)
        if __import__("os").environ.get("FLUSH"):
            print("flushed", telemetry.flush(2), flush=True)
print("trained", flush=True)
"""


def test_metric_collections_that_time_out_leave_no_traceback_and_are_counted(tmp_path: Path) -> None:
    """Collections every 100 ms with a 50 ms timeout, a callback of 100 ms: every periodic
    collection times out, and so does the explicit flush."""
    result = run_python(
        SLOW_COLLECTION_JOB,
        tmp_path,
        CALLBACK_S="0.1",
        FLUSH="1",
        OTEL_METRIC_EXPORT_INTERVAL="100",
        OTEL_METRIC_EXPORT_TIMEOUT="50",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("flushed") and result.stdout.endswith("trained\n"), result.stdout
    assert "Traceback" not in result.stderr and "MetricsTimeoutError" not in result.stderr, result.stderr
    assert "force_flush failed" not in result.stderr, result.stderr
    assert result.stderr.count("a metric collection timed out") == 1, result.stderr
    counted = re.search(r"(\d+) metric collection\(s\) timed out", result.stderr)
    assert counted is not None and int(counted.group(1)) >= 2, result.stderr


FIFO_JOB = """
import os
import traintel
from traintel.exporters import OtlpJsonFileSpanExporter

os.mkfifo("telemetry.otlp.jsonl")  # a file nobody reads: writing waits, as on a hung mount
traintel.configure(span_exporters=[OtlpJsonFileSpanExporter("telemetry.otlp.jsonl")], metric_readers=[])
with traintel.application():
    with traintel.training_loop():
        for i in range(3):
            with traintel.training_iteration():
                pass
print("trained", flush=True)
"""


@pytest.mark.parametrize("slow", ["file", "collection"])
def test_a_bounded_exit_names_what_was_slow(tmp_path: Path, slow: str) -> None:
    """Only the local file in use, no collector: the exit's bound runs out waiting for the file
    writer, or for the metric reader's last collection; the line names it."""
    if slow == "file":
        result = run_python(FIFO_JOB, tmp_path, TRAINTEL_SHUTDOWN_TIMEOUT="1", timeout=60)
        expected = "still waiting for the telemetry file writer"
    else:
        result = run_python(
            SLOW_COLLECTION_JOB,
            tmp_path,
            CALLBACK_S="3",
            TRAINTEL_SHUTDOWN_TIMEOUT="1",
            TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
            timeout=60,
        )
        expected = "still waiting for the metric reader's collection (the last metric line is not written)"
    assert result.returncode == 0, result.stderr
    assert f"did not finish within 1.0s, {expected}" in result.stderr, result.stderr
    assert "collector" not in result.stderr, result.stderr
