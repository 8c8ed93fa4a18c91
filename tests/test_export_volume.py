"""The volume budget: what one rank exports per hour, and that nothing the readers use is lost.

* The compact window record gives back, to the digit, every number of the full
  ``training_metrics_update`` event and of the goodput record (the same job run both ways).
* The every-M-th stride follows the pace; slow and non-finite exports draw on a time bucket.
* A simulated stretch of a job on a counter clock (a real interpreter, the embedded default)
  stays inside the per-hour budget at 10 and 1,000 steps/s (the whole file, metric lines
  too), and ``traintel summary`` / ``traintel goodput`` read exact totals back from those files.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from tests.subprocess_helpers import run_python
from tests.volume_job import VOLUME_JOB
from traintel import callbacks, cli, semconv
from traintel._aggregation.sampling import IterationSampler, stride_for
from traintel._aggregation.window_record import MARKER, expand, loop_attributes
from traintel._recorder import windows as windows_module
from traintel.analysis.summary import render, summarize
from traintel.exporters.file import FILE_METRIC_EXPORT_INTERVAL_MILLIS
from traintel.exporters.reader import iter_spans

W = semconv.WINDOW_PREFIX
RSS = W + "process.memory.peak_rss_since_start"
T0 = 1_700_000_000_000  # ms


def _job(monkeypatch: pytest.MonkeyPatch, window_events: str) -> InMemorySpanExporter:
    """12 iterations at exact times (data loading, forward, backward, optimizer; a NaN loss at
    7; 10 is slow), 2 ranks' worth of throughput, a known peak: windows of 4."""
    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", window_events)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    exporter = InMemorySpanExporter()
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], log_every_n_iterations=4, warmup_iterations=1,
        peak_flops=1e15, flops_per_sample=3e11, executed_flops_per_sample=4e11,
        cross_rank="off", export_first_iterations=1, export_every_n_iterations=5,
    )  # fmt: skip
    callbacks.on_app_start(start_time_msec=T0)
    callbacks.on_train_start(start_time_msec=T0)
    t = T0
    for i in range(12):
        step = 700 if i == 10 else 100 + (i % 3) * 7
        callbacks.on_training_single_iteration_start(start_time_msec=t)
        traintel.record_batch(samples=8, tokens=1000 + i, padding_tokens=24)
        phase_start = t
        for start, end, length in (
            (callbacks.on_data_loading_start, callbacks.on_data_loading_end, 5 + i),
            (callbacks.on_model_forward_start, callbacks.on_model_forward_end, 30),
            (callbacks.on_model_backward_start, callbacks.on_model_backward_end, 50),
            (callbacks.on_optimizer_update_start, callbacks.on_optimizer_update_end, 10),
        ):
            start(start_time_msec=phase_start)
            end(finish_time_msec=phase_start + length)
            phase_start += length
        traintel.record_metrics(loss=float("nan") if i == 7 else 2.0 / (i + 1), lr=0.1)
        callbacks.on_training_single_iteration_end(finish_time_msec=t + step)
        t += step + 3
    callbacks.on_train_end(finish_time_msec=t)
    callbacks.on_app_end(finish_time_msec=t + 10)
    traintel.shutdown(60)
    return exporter


def test_the_compact_record_gives_back_every_number_of_the_full_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = _job(monkeypatch, "on").get_finished_spans()
    compact = _job(monkeypatch, "off").get_finished_spans()
    (full_loop,) = [s for s in full if s.name == "training_loop"]
    events = [dict(e.attributes or {}) for e in full_loop.events if e.name == "training_metrics_update"]
    goodput = [dict(s.attributes or {}) for s in full if s.name == "training_window"]
    records = [dict(s.attributes or {}) for s in compact if s.name == "training_window"]
    assert len(events) == len(goodput) == len(records) == 3
    (compact_loop,) = [s for s in compact if s.name == "training_loop"]
    assert not [e for e in compact_loop.events if e.name == "training_metrics_update"]
    for event, goodput_record, record in zip(events, goodput, records, strict=True):
        assert MARKER in record and MARKER not in goodput_record
        assert len(record) < len(event) + len(goodput_record) - 25  # the point of it
        restored = expand(record, world_size=3)
        on_the_loop = loop_attributes(event)
        assert on_the_loop  # the MFU provenance and the totals
        for key, value in {**event, **goodput_record}.items():
            if key in on_the_loop or key == RSS:  # (the only number not from the clock)
                continue
            assert key in restored, key
            assert restored[key] == value or (math.isnan(value) and math.isnan(restored[key])), key
    # The loop segment holds what is the same for every window, as of the last one.
    loop = dict(compact_loop.attributes or {})
    for key, value in loop_attributes(events[-1]).items():
        assert loop[key] == value, key
    # Nothing the readers need was left out: non-zero counts and the HFU are in the record.
    assert records[1][W + "nonfinite_iterations"] == 1
    assert records[2][W + "slow_iterations"] == 1
    assert W + "hfu" in records[0] and W + "padding_tokens" in records[0]


def test_the_every_m_th_stride_doubles_with_the_pace() -> None:
    assert stride_for(100, 60.0, 0.1) == 800  # 100 x 2^3 iterations span >= 60 s at 10 steps/s
    assert stride_for(100, 60.0, 0.001) == 102_400
    assert stride_for(100, 60.0, 1.0) == 100  # already 100 s apart
    assert stride_for(100, 0.0, 0.001) == 100  # no floor in time: by count
    assert stride_for(0, 60.0, 0.001) == 0  # every-M-th off stays off
    sampler = IterationSampler(every_n=100, every_s=60.0)
    sampler.set_pace(0.01)
    assert sampler.every_n == 6400 and sampler.every_n % sampler.every_n_configured == 0


def test_slow_and_non_finite_exports_draw_on_a_bucket_refilled_by_time() -> None:
    sampler = IterationSampler(tail_per_minute=1.0)
    minute = 60 * 10**9
    # a burst of two minutes' allowance, then one per minute; errors always go out
    decisions = [sampler.tail(None, True, False, False, end_ns=minute + i) for i in range(5)]
    assert decisions == ["slow", "slow", None, None, None]
    assert sampler.tail(None, False, True, False, end_ns=minute + 5) == "error"
    assert sampler.tail(None, False, False, True, end_ns=minute + minute // 2) is None
    assert sampler.tail(None, False, False, True, end_ns=2 * minute + 10) == "nonfinite"
    assert sampler.tail("every_n", True, False, False, end_ns=2 * minute + 11) == "every_n"
    assert IterationSampler().tail(None, True, False, False) == "slow"  # no bucket by default


def _merging_job(
    monkeypatch: pytest.MonkeyPatch, floor_s: float, open_loop: bool = False
) -> list[dict[str, object]]:
    """22 iterations at exact times whose windows close at their row bound (4 rows, as 10,000
    do at 100,000 steps/s) long before a ``floor_s`` floor: a NaN loss at 7, 10 and 17 slow,
    tokens and FLOPs per step. The ``training_window`` records' attributes, expanded, and their
    span's ``start`` and ``end``."""
    monkeypatch.setattr(windows_module, "MAX_WINDOW_ITERATIONS", 4)
    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "off")
    exporter = InMemorySpanExporter()
    traintel.configure(
        span_exporters=[exporter], metric_readers=[], log_every_n_iterations=4, warmup_iterations=1,
        window_min_seconds=floor_s, peak_flops=1e15, flops_per_sample=3e11, cross_rank="off",
    )  # fmt: skip
    callbacks.on_app_start(start_time_msec=T0)
    callbacks.on_train_start(start_time_msec=T0)
    t = T0
    for i in range(22):
        step = 400 if i == 0 else 700 if i in (10, 17) else 100 + (i % 3) * 7
        callbacks.on_training_single_iteration_start(start_time_msec=t)
        traintel.record_batch(samples=8, tokens=1000 + i, padding_tokens=24)
        callbacks.on_data_loading_start(start_time_msec=t)
        callbacks.on_data_loading_end(finish_time_msec=t + 5 + i)
        traintel.record_metrics(loss=float("nan") if i == 7 else 2.0 / (i + 1), lr=0.1)
        callbacks.on_training_single_iteration_end(finish_time_msec=t + step)
        t += step + 3
    if not open_loop:
        callbacks.on_train_end(finish_time_msec=t)
        callbacks.on_app_end(finish_time_msec=t + 10)
    traintel.shutdown(60)
    return [
        {"start": s.start_time, "end": s.end_time, **expand(dict(s.attributes or {}))}
        for s in exporter.get_finished_spans()
        if s.name == "training_window"
    ]


def test_windows_shorter_than_the_floor_leave_as_one_record_with_exact_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parts = _merging_job(monkeypatch, floor_s=0)  # no floor: each window its own record
    (merged,) = _merging_job(monkeypatch, floor_s=1000)  # the loop ends before 1,000 s
    assert len(parts) == 6 and merged[W + "merged_windows"] == 6  # (22 rows, 4 a window)
    assert W + "merged_windows" not in parts[0]
    total, samples = merged[W + "iteration_time.total"], merged[W + "samples"]
    for key in (
        "iterations", "iteration_time.total", "data_loading_time", "samples",
        "tokens", "padding_tokens", "nonfinite_iterations", "slow_iterations", "program_startup_time",
        "time.data_loading",
    ):  # fmt: skip
        assert merged[W + key] == sum(p[W + key] for p in parts), key  # added in window order: exact
    # productive time is the record's own seconds less its badput, as for any window: the
    # parts' sum to the last bit of a double
    productive = merged[W + "productive_time"]
    assert productive == total - merged[W + "data_loading_time"] - merged[W + "program_startup_time"]
    assert productive == pytest.approx(sum(p[W + "productive_time"] for p in parts), rel=1e-15, abs=0)
    assert merged[W + "iterations"] == 22 and merged[W + "nonfinite_iterations"] == 1
    assert merged[W + "program_startup_time"] > 0  # the first window's, decided before merging
    assert (merged[W + "first_iteration"], merged[W + "last_iteration"]) == (0, 21)
    assert merged[W + "index"] == 0
    assert merged[W + "iteration_time.min"] == min(p[W + "iteration_time.min"] for p in parts)
    assert merged[W + "iteration_time.max"] == max(p[W + "iteration_time.max"] for p in parts) == 0.7
    assert merged[W + "slowest_iteration"] == 10  # the first of the two slowest, as in one window
    assert merged[W + "iteration_time.mean"] == total / 22
    assert merged[W + "samples_per_second_per_device"] == samples / total
    assert merged[W + "tokens_per_second_per_device"] == merged[W + "tokens"] / total
    flops = 3e11 * samples
    assert merged[W + "flops_per_second_per_device"] == flops / total
    assert merged[W + "mfu"] == flops / total / 1e15
    assert merged[W + "goodput"] == merged[W + "productive_time"] / (
        (parts[-1]["end"] - parts[0]["start"]) / 1e9
    )
    durations = [0.4 if i == 0 else 0.7 if i in (10, 17) else (100 + (i % 3) * 7) / 1000 for i in range(22)]
    assert merged[W + "iteration_time.stddev"] == pytest.approx(statistics.pstdev(durations), rel=1e-12)
    ordered = sorted(durations)
    for q in (50, 90, 99):  # from the sketch: within 1 % of the step time of that rank of all 22
        at_rank = ordered[math.floor(q / 100 * 21)]
        assert abs(merged[W + f"iteration_time.p{q}"] / at_rank - 1) <= 0.01, q
    # the loss: its last value the last window's, its mean over every finite value (7 is NaN)
    assert merged[W + "metric.loss.last"] == parts[-1][W + "metric.loss.last"] == 2.0 / 22
    losses = [2.0 / (i + 1) for i in range(22) if i != 7]
    assert merged[W + "metric.loss.mean"] == pytest.approx(sum(losses) / 21, rel=1e-15)


def test_records_held_for_the_floor_leave_when_shutdown_ends_an_open_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (record,) = _merging_job(monkeypatch, floor_s=1000, open_loop=True)
    assert record[W + "iterations"] == 22 and record[W + "merged_windows"] == 6


def test_records_held_for_the_floor_leave_at_shutdown_with_a_loop_never_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain OpenTelemetry loop span the job never ends: the windows that closed (their
    records held for the floor) still leave when telemetry shuts down, and so does the open
    window's iterations, closed then (they were lost)."""
    monkeypatch.setattr(windows_module, "MAX_WINDOW_ITERATIONS", 4)
    exporter = InMemorySpanExporter()
    telemetry = traintel.configure(
        span_exporters=[exporter], metric_readers=[], log_every_n_iterations=4, warmup_iterations=0,
        window_min_seconds=1000, cross_rank="off",
    )  # fmt: skip
    assert telemetry.pipeline is not None
    tracer = telemetry.pipeline.tracer_provider.get_tracer("user-code")
    start = T0 * 10**6
    loop = tracer.start_span("training_loop", attributes={semconv.PHASE: "training_loop"}, start_time=start)
    context = trace.set_span_in_context(loop)
    for number in range(10):
        iteration = tracer.start_span(
            "training_iteration", context=context, start_time=start + number * 10**8,
            attributes={semconv.PHASE: "training_iteration", semconv.ITERATION: number},
        )  # fmt: skip
        iteration.end(end_time=start + (number + 1) * 10**8)
    traintel.shutdown(10)
    records = [s.attributes or {} for s in exporter.get_finished_spans() if s.name == "training_window"]
    # two windows of 4 closed, and the open one's 2 rows at shutdown: one record of all three
    assert [(r[W + "iterations"], r[W + "merged_windows"]) for r in records] == [(10, 3)]


def _metric_lines(runs: Path) -> Iterator[bytes]:
    for path in runs.rglob("*.jsonl"):
        yield from (line for line in path.open("rb") if b'"resourceMetrics"' in line[:40])


def _span_bytes(runs: Path) -> tuple[int, int]:
    """Bytes of the span lines and of the metric lines in the job's files."""
    total = sum(path.stat().st_size for path in runs.rglob("*.jsonl"))
    metrics = sum(len(line) for line in _metric_lines(runs))
    return total - metrics, metrics


#: The windows of 100,000 steps/s: ten a second, each closed by its row bound long before the
#: 30 s floor. An hour of them is 360 million real iterations, so the bound is 10 rows at 100
#: steps/s: the same closes, records and bytes per simulated second, in 360,000 iterations.
HUNDRED_THOUSAND_STEPS_PER_SECOND = 10


@pytest.mark.parametrize(
    ("rate", "minutes", "budget_mb", "row_bound"),
    [(10, 60, 1.0, None), (1000, 6, 2.0, None), (100, 60, 1.0, HUNDRED_THOUSAND_STEPS_PER_SECOND)],
    ids=["10/s", "1000/s", "100000/s-closes"],
)
@pytest.mark.process
def test_a_job_stays_within_the_hourly_budget_and_reads_back_exactly(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    rate: int,
    minutes: float,
    budget_mb: float,
    row_bound: int | None,
) -> None:
    runs = tmp_path / "runs"
    bound = {}
    prefix = f"RATE = {rate}\nMINUTES = {minutes}\n"
    if row_bound is not None:
        prefix += "import traintel._recorder.windows as recorder_windows\n"
        prefix += f"recorder_windows.MAX_WINDOW_ITERATIONS = {row_bound}\n"
        bound["TRAINTEL_LOG_EVERY_N_ITERATIONS"] = str(row_bound)
    result = run_python(
        prefix + VOLUME_JOB,
        tmp_path,
        timeout=300,
        TRAINTEL_OUTPUT_DIR=str(runs),
        **bound,
        # the defaults in time, as a job gets them (the suite's own environment turns them off)
        TRAINTEL_WINDOW_MIN_SECONDS="30",
        TRAINTEL_EXPORT_EVERY_N_SECONDS="60",
        TRAINTEL_EXPORT_TAIL_PER_MINUTE="1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # a clean job writes no hang record, though its clock runs far faster than the watcher's
    # wakes (a simulated or stepped wall clock is not C code holding the GIL)
    assert [
        line for path in runs.rglob("*.jsonl") for line in path.open("rb") if b'"resourceLogs"' in line[:40]
    ] == []
    spans, metric_lines = _span_bytes(runs)
    # the whole file, metric lines included. At 10 steps/s the job runs a whole simulated hour
    # (the start's fixed costs, some 30 kB, counted once as in a real hour); at 1,000 steps/s six
    # minutes scaled up, which counts them ten times over: an over-estimate.
    per_hour = (spans + metric_lines) * 60 / minutes / 1e6
    assert per_hour <= budget_mb, f"{per_hour:.3f} MB per hour ({metric_lines} B of metric lines)"
    # one metric line per collection (every 5 minutes in the file) and one at exit
    assert len(list(_metric_lines(runs))) == 1 + minutes * 60_000 // FILE_METRIC_EXPORT_INTERVAL_MILLIS
    iterations = int(60 * minutes * rate)
    records = [s for s in iter_spans([runs]) if s.name == "training_window"]
    assert sum(int(s.attributes[W + "iterations"]) for s in records) == iterations
    assert all(MARKER in s.attributes for s in records)
    if row_bound is not None:  # every window accounted, ten a second, in a record a floor long
        merged = [int(s.attributes.get(W + "merged_windows", 1)) for s in records]
        assert sum(merged) == iterations // row_bound
        assert len(records) <= 60 * minutes * 60 // 30 + 1
    exported = [s for s in iter_spans([runs]) if s.name == "training_iteration"]
    every_n = sorted(
        int(s.attributes[semconv.ITERATION])
        for s in exported
        if s.attributes[semconv.SAMPLING_REASON] == "every_n"
    )
    assert len(every_n) >= 2 and all(i % 100 == 0 for i in every_n)
    assert all((b - a) / rate >= 60 for a, b in itertools.pairwise(every_n))

    training = sum(float(s.attributes[W + "iteration_time.total"]) for s in records)
    summary = summarize([runs])
    assert summary.window_iterations == iterations  # from the records, read as window events
    assert summary.summary_value("iterations") == iterations
    assert summary.summary_value("samples_per_second") == pytest.approx(32 * iterations / training, rel=1e-9)
    assert summary.window_metrics()["loss"]["last"] == pytest.approx(1.0 / iterations)
    assert "training_loop" in render(summary)
    assert cli.main(["goodput", str(runs), "--json"]) == 0
    (session,) = json.loads(capsys.readouterr().out)["sessions"]
    # every iteration's time is productive but its 5 % data wait (the slow ones alike)
    assert session["badput_seconds"]["data_loading"] == pytest.approx(0.05 * training, rel=1e-6)
    assert session["productive_seconds"] == pytest.approx(0.95 * training, rel=1e-6)
    assert session["badput_seconds"]["initialization"] == 5.0
    assert session["last_iteration"] == iterations - 1
