"""The run summary, read back from a file written by the real API at exact timestamps."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import traintel
from traintel import callbacks, semconv
from traintel._aggregation.stats import percentile
from traintel.analysis.goodput import load_jobs
from traintel.analysis.goodput.process import ran
from traintel.analysis.summary import fmt_seconds, phase_rows, render, summarize
from traintel.cli import main
from traintel.exporters.file import OtlpJsonFileSpanExporter, OtlpJsonLinesFile
from traintel.exporters.reader import iter_spans

T0 = 1_700_000_000_000  # ms


@contextlib.contextmanager
def _recorded(directory: Path, resource: dict[str, Any], **training: Any) -> Iterator[OtlpJsonLinesFile]:
    """traintel on a tracer provider of the test's own (``resource``) that writes ``directory``'s
    file; as the block ends, the job is shut down and the provider's spans are written."""
    file = OtlpJsonLinesFile(output_dir=directory)
    provider = TracerProvider(resource=Resource(resource), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileSpanExporter(file=file)))
    traintel.configure(tracer_provider=provider, **training)
    try:
        yield file
    finally:
        traintel.shutdown(1)
        provider.shutdown()


def _write_run(directory: Path) -> Path:
    """A job driven by callbacks with explicit times: iterations of 4, 1, 1, 2 s."""
    with _recorded(
        directory,
        {"service.name": "exact", semconv.RANK: 0, semconv.RUN_ID: "r1"},
        log_every_n_iterations=2,
        global_batch_size=10,
        warmup_iterations=1,
        flops_per_sample=1e6,
        peak_flops=1e7,  # a small model on a CPU: 7.5e-6 TFLOP/s
    ) as file:
        callbacks.on_app_start(start_time_msec=T0)
        callbacks.on_model_init_start(start_time_msec=T0)
        callbacks.on_model_init_end(finish_time_msec=T0 + 2000)
        callbacks.on_train_start(train_iterations_start=0, start_time_msec=T0 + 2000)
        for start, duration in ((2, 4), (6, 1), (7, 1), (8, 2)):
            callbacks.on_training_single_iteration_start(start_time_msec=T0 + start * 1000)
            if start == 8:
                traintel.record_metrics(loss=0.5)
            callbacks.on_training_single_iteration_end(finish_time_msec=T0 + (start + duration) * 1000)
        callbacks.on_save_checkpoint_start(global_step=4, start_time_msec=T0 + 10_000, size_bytes=3_000_000)
        callbacks.on_save_checkpoint_end(finish_time_msec=T0 + 12_000)
        callbacks.on_train_end(finish_time_msec=T0 + 12_000)
        callbacks.on_app_end(finish_time_msec=T0 + 20_000)
    assert file.path is not None
    return file.path


def test_summary_numbers_are_exact(tmp_path: Path) -> None:
    path = _write_run(tmp_path)
    summary = summarize([path])
    assert summary.application_s == 20.0
    assert summary.phases["model_init"].total_s == 2.0
    assert summary.phases["training_loop"].total_s == 10.0
    assert summary.windows == 2
    assert summary.window_iterations == 4
    assert summary.window_iteration_s == 8.0
    assert summary.window_iteration_max_s == 4.0
    value = summary.summary_value
    assert value("iterations") == 4
    assert value("first_iteration_time") == 4.0
    assert value("train_time") == 10.0
    assert value("iteration_time.mean") == pytest.approx(4 / 3)  # after the 1 warm-up iteration
    assert value("iteration_time.p50") == 1.0  # exact for short runs (a sketch past 2048 iterations)
    assert value("iteration_time.p90") == pytest.approx(1.8)
    assert value("samples_per_second") == 30 / 4  # 3 post-warm-up iterations x 10 samples / 4 s
    assert value("checkpoint.saves") == 1
    assert value("checkpoint.save_time.total") == 2.0
    assert value("checkpoint.bytes.total") == 3_000_000
    assert summary.exported_iterations == {"first": 4}
    text = render(summary)
    assert "\ntraining_iteration           4     8.00 s     2.00 s     4.00 s   40.0%\n" in text
    assert "\nmodel_init                   1     2.00 s     2.00 s     2.00 s   10.0%\n" in text
    assert max(len(line) for line in text.splitlines()[:10]) <= 80  # the phase table fits 80 columns
    assert "First iteration: 4.00 s" in text
    assert "Throughput: 7.5 samples/s (job)" in text
    assert "Compute: 0.0000075 TFLOP/s per device, MFU 75.0%" in text  # (it read 0.000 TFLOP/s)
    assert "Checkpoints: 1 save, 2.00 s blocking in total, mean 2.00 s, max 2.00 s, 3.00 MB" in text
    assert "Model metrics, last window (iterations 2-3): loss 0.5\n" in text  # its mean reads the same
    assert "Iterations: 4 (mean and percentiles after warm-up)\n" in text  # 4 counted, 3 timed
    assert "\n  mean 1.33 s  p50 1.00 s  p90 1.80 s  p99 1.98 s\n" in text
    assert "Iterations exported as spans: 4 (first 4)" in text


def test_two_applications_of_one_process_are_not_read_as_a_run_still_going(tmp_path: Path) -> None:
    """A notebook cell run twice: two applications, 100 s apart, in one process. The shares are
    of their 20 s, not of the 120 s from the first record to the last, and the run ended."""
    with _recorded(tmp_path, {semconv.RUN_ID: "twice"}):
        for start in (0, 110_000):
            callbacks.on_app_start(start_time_msec=T0 + start)
            callbacks.on_model_init_start(start_time_msec=T0 + start)
            callbacks.on_model_init_end(finish_time_msec=T0 + start + 2000)
            callbacks.on_app_end(finish_time_msec=T0 + start + 10_000)
    summary = summarize([tmp_path])
    assert summary.wall_s == 20.0 and not summary.open_at_end
    assert "\nmodel_init                   2     4.00 s     2.00 s     2.00 s   20.0%" in render(summary)


def test_evaluation_iterations_are_rows_of_the_phase_table(tmp_path: Path) -> None:
    """Two validation loops (iterations of 1 s and 3 s, then one of 2 s) and an evaluation-only
    testing loop: their iterations were no row at all (only the sampled spans exist of them);
    they are now counted from their loops, every one, as the windows count training's."""
    with _recorded(tmp_path, {semconv.RUN_ID: "eval"}, export_iterations="none"):
        callbacks.on_app_start(start_time_msec=T0)
        for start, durations in ((0, (1, 3)), (10, (2,))):
            callbacks.on_validation_start(start_time_msec=T0 + start * 1000)
            t = start
            for duration in durations:
                callbacks.on_validation_single_iteration_start(start_time_msec=T0 + t * 1000)
                callbacks.on_validation_single_iteration_end(finish_time_msec=T0 + (t + duration) * 1000)
                t += duration
            callbacks.on_validation_end(finish_time_msec=T0 + t * 1000)
        callbacks.on_testing_start(start_time_msec=T0 + 12_000)
        callbacks.on_testing_single_iteration_start(start_time_msec=T0 + 12_000)
        traintel.record_metrics(acc=0.5)
        callbacks.on_testing_single_iteration_end(finish_time_msec=T0 + 17_000)
        callbacks.on_testing_end(finish_time_msec=T0 + 17_000)
        callbacks.on_app_end(finish_time_msec=T0 + 20_000)
    summary = summarize([tmp_path])
    rows = {row.phase: row for row in phase_rows(summary)}
    assert "   25.0%\n\nModel metrics, last testing loop: acc 0.5" in render(summary)  # apart from the table
    validation, testing = rows["validation_iteration"], rows["testing_iteration"]
    assert (validation.count, validation.total_s, validation.mean_s, validation.max_s) == (3, 6.0, 2.0, 3.0)
    assert validation.share == 6.0 / 20
    assert (testing.count, testing.total_s, testing.max_s, testing.share) == (1, 5.0, 5.0, 5.0 / 20)


def test_a_run_without_an_application_has_shares_of_its_records_time(tmp_path: Path) -> None:
    """Loops run without ``application()``: the share column was empty. The shares are of the
    time from the process's first record to its last (20 s here), and no "killed" line."""
    with _recorded(tmp_path, {semconv.RUN_ID: "loops"}):
        callbacks.on_train_start(start_time_msec=T0)
        callbacks.on_training_single_iteration_start(start_time_msec=T0)
        callbacks.on_training_single_iteration_end(finish_time_msec=T0 + 5000)
        callbacks.on_train_end(finish_time_msec=T0 + 10_000)
        callbacks.on_validation_start(start_time_msec=T0 + 12_000)
        callbacks.on_validation_end(finish_time_msec=T0 + 20_000)
    summary = summarize([tmp_path])
    assert summary.wall_s == 20.0 and not summary.open_at_end
    rows = {row.phase: row.share for row in phase_rows(summary)}
    assert (rows["training_loop"], rows["training_iteration"], rows["validation_loop"]) == (0.5, 0.25, 0.4)
    assert "still running, or killed" not in render(summary)


def test_metrics_given_to_the_training_loop_between_iterations_are_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A per-epoch accuracy recorded between the epoch's iterations goes on the training loop
    span, a final one after the loop on the application's; no summary or report showed them."""
    with _recorded(tmp_path, {semconv.RUN_ID: "epochs"}):
        with traintel.application():
            with traintel.training_loop():
                for accuracy in (0.6, 0.7):
                    for _ in range(3):
                        with traintel.training_iteration():
                            traintel.record_metrics(loss=1.0)
                    traintel.record_metrics(epoch_acc=accuracy)
            traintel.record_metrics(test_acc=0.65)  # after the loop: on the application
    text = render(summarize([tmp_path]))
    window, loop = "last window (iterations 0-5): loss 1", "last training loop: epoch_acc 0.7"
    application = "last application: test_acc 0.65"
    assert f"Model metrics, {window}\nModel metrics, {application}\nModel metrics, {loop}\n" in text
    assert main(["report", "--json", str(tmp_path)]) == 0
    by_phase = {"application": {"test_acc": 0.65}, "training_loop": {"epoch_acc": 0.7}}
    assert json.loads(capsys.readouterr().out)["model_metrics_evaluation"] == by_phase


def test_the_checkpoint_line_counts_the_save_after_the_loop(tmp_path: Path) -> None:
    """The final checkpoint, saved after the training loop ended (as most loops do), is one of
    the job's saves: 2 saves, 2 + 3 s, 3 + 5 MB (the loop's own summary holds only the first)."""
    with _recorded(
        tmp_path, {semconv.RANK: 0, semconv.RUN_ID: "r1"}, global_batch_size=10, warmup_iterations=0
    ) as file:
        callbacks.on_app_start(start_time_msec=T0)
        callbacks.on_train_start(train_iterations_start=0, start_time_msec=T0)
        callbacks.on_training_single_iteration_start(start_time_msec=T0)
        callbacks.on_training_single_iteration_end(finish_time_msec=T0 + 1000)
        callbacks.on_save_checkpoint_start(global_step=1, start_time_msec=T0 + 1000, size_bytes=3_000_000)
        callbacks.on_save_checkpoint_end(finish_time_msec=T0 + 3000)
        callbacks.on_train_end(finish_time_msec=T0 + 3000)
        callbacks.on_save_checkpoint_start(global_step=1, start_time_msec=T0 + 3000, size_bytes=5_000_000)
        callbacks.on_save_checkpoint_end(finish_time_msec=T0 + 6000)
        callbacks.on_app_end(finish_time_msec=T0 + 6000)
    assert file.path is not None
    summary = summarize([file.path])
    assert summary.summary_value("checkpoint.saves") == 1  # the loop's, at its end
    text = render(summary)
    assert "Checkpoints: 2 saves, 5.00 s blocking in total, mean 2.50 s, max 3.00 s, 8.00 MB" in text
    assert (summary.checkpoint_value("saves"), summary.checkpoint_value("bytes.total")) == (2, 8_000_000)


def test_a_loop_all_in_its_warm_up_says_so_not_that_it_is_still_running(tmp_path: Path) -> None:
    with _recorded(
        tmp_path, {semconv.RANK: 0, semconv.RUN_ID: "r1"}, global_batch_size=4, warmup_iterations=5
    ) as file:
        callbacks.on_train_start(train_iterations_start=0, start_time_msec=T0)
        for start, end in ((0, 2000), (2000, 3000), (3000, 4000)):
            callbacks.on_training_single_iteration_start(start_time_msec=T0 + start)
            callbacks.on_training_single_iteration_end(finish_time_msec=T0 + end)
        callbacks.on_train_end(finish_time_msec=T0 + 4000)
    assert file.path is not None
    text = render(summarize([file.path])).replace("\n  ", " ")
    assert (
        "Iterations: 3 in 1 window(s) (all in the warm-up, TRAINTEL_WARMUP_ITERATIONS: no percentiles" in text
    )
    assert "so far" not in text and "mean 1.33 s  max 2.00 s" in text


def test_percentile_interpolates() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 100) == 4.0
    assert percentile(values, 90) == pytest.approx(3.7)


def test_cli_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_run(tmp_path)
    assert main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Run: service exact | run r1 | ranks [0]" in out
    assert main(["summary", str(tmp_path / "empty")]) == 2


KILLED_OR_DONE = """
import os, sys, time, traintel
start, stop, kill = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "kill"
with traintel.application():
    with traintel.training_loop(train_iterations_start=start):
        for i in range(start, stop):
            with traintel.training_iteration(samples=4):
                time.sleep(0.002 if kill else 0)
            if kill and i == 120:  # windows 0-49 and 50-99 written, 100-120 in the progress mark
                traintel.get_telemetry().flush()
                os.kill(os.getpid(), 9)
"""


@pytest.mark.process
def test_a_job_killed_before_its_application_ended_counts_in_the_shares(tmp_path: Path) -> None:
    """A job killed mid-window before its first application segment ended, then resumed in the
    same session: the killed job's phases are in the table, so its time is in what the shares
    are of (before, only the resumed job's application was: the iterations showed over 1,000 %),
    and the summary says which job its loop numbers are of and where the killed job's last
    iterations are."""
    import signal

    from tests.subprocess_helpers import run_python

    env = {"TRAINTEL_OUTPUT_DIR": str(tmp_path / "runs"), "TRAINTEL_SESSION_TAG": "one-task"}
    windows = {"TRAINTEL_LOG_EVERY_N_ITERATIONS": "50", "TRAINTEL_WINDOW_MIN_SECONDS": "0"}
    for argv, code in ((["0", "200", "kill"], -signal.SIGKILL), (["100", "110", "done"], 0)):
        script = KILLED_OR_DONE.replace("sys.argv[1]", argv[0]).replace("sys.argv[2]", argv[1])
        done = run_python(script.replace("sys.argv[3]", repr(argv[2])), tmp_path, **env, **windows)
        assert done.returncode == code, done.stderr
    summary = summarize([tmp_path / "runs"])
    rows = {row.phase: row for row in phase_rows(summary)}
    assert rows["training_loop"].count == 1 and rows["training_iteration"].count == 110
    shares = [row.share for row in rows.values() if row.share is not None]
    assert shares and all(0 < share <= 1 for share in shares), rows
    text = render(summary)
    assert summary.open_at_end and "still running, or killed" in text
    assert "Iterations: 10 (the latest job's loop; mean and percentiles after warm-up)" in text
    assert "  and 21 of a job after its last window record, to iteration 120, in its" in text
    (run,) = summary.runs.newest_first()  # `traintel runs`: 0-120 by the mark, then 100-109
    assert run.iterations == 121 + 10


#: A small real torch loop; a script adds ``train(first, stop)``. Ranks all-reduce their gradients.
TORCH_JOB = """
import io, torch, traintel
import torch.distributed as dist

def train(first, stop):
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    with traintel.application():
        with traintel.training_loop(train_iterations_start=first):
            for i in range(first, stop):
                with traintel.training_iteration(samples=16):
                    model(torch.randn(16, 8)).pow(2).mean().backward()
                    for p in model.parameters() if dist.is_initialized() else ():
                        dist.all_reduce(p.grad)
                    optimizer.step()
                    optimizer.zero_grad()
            with traintel.checkpoint_save(iteration=stop):
                torch.save(model.state_dict(), io.BytesIO())
"""


@pytest.mark.process
@pytest.mark.parametrize("restart_counts", [(0, 1), (0, 0)], ids=["restarted", "launched-again"])
def test_restarts_under_one_run_id_say_their_loop_figures_are_the_latest_job_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restart_counts: tuple[int, int]
) -> None:
    """torchrun (or a Slurm requeue) restarts a job under the same run id, its restart count
    told apart, or the same launch is started again (same id, same count: each rank is then
    written by two processes): the loop's figures are the latest job's, and the summary and
    the report say so (before, only jobs with different run ids got the wording: the summary
    read "Iterations: 10" under a table counting 40)."""
    from tests.subprocess_helpers import run_python

    env = {"TRAINTEL_OUTPUT_DIR": str(tmp_path / "runs"), "TORCHELASTIC_RUN_ID": "job-42"}
    for restart, (first, stop) in zip(restart_counts, ((0, 30), (20, 30)), strict=True):
        done = run_python(
            f"{TORCH_JOB}\ntrain({first}, {stop})\n", tmp_path, TORCHELASTIC_RESTART_COUNT=str(restart), **env
        )
        assert done.returncode == 0, done.stderr
    summary = summarize([tmp_path / "runs"])
    assert summary.run_ids == {"job-42"} and summary.jobs == 2
    text = render(summary)
    assert {row.phase: row.count for row in phase_rows(summary)}["training_iteration"] == 40
    assert "Wall time by phase, summed over the 2 jobs:" in text
    assert "Iterations: 10 (the latest job's loop; mean and percentiles after warm-up)" in text
    assert "Checkpoints of the latest job: 1 save" in text
    # iteration numbers repeat after a resume: each slowest exported iteration names its job,
    # and the phase table's max is never below it
    for slow in sorted(summary.slowest, reverse=True)[:3]:
        assert f"slowest exported: iteration {slow.iteration} of job job-42, restart {slow.restart} " in text
    rows = {row.phase: row for row in phase_rows(summary)}
    assert rows["training_iteration"].max_s == max(
        [summary.window_iteration_max_s, *(slow.seconds for slow in summary.slowest)]
    )
    assert main(["report", str(tmp_path / "runs")]) == 0
    report = " ".join(capsys.readouterr().out.split())
    assert "Iterations and throughput (the latest of 2 jobs; times and rates after warm-up)" in report
    # the report's checkpoint table counts both jobs' saves, and says so
    assert "Checkpoints (blocking time), summed over the 2 jobs saves 2 " in report
    # goodput counts both launches too (launched again, the second once took the first's place)
    jobs = sorted(load_jobs([tmp_path / "runs"]), key=lambda job: job.ranks[0].start_ns)
    assert [(job.restart, ran(job.ranks[0])) for job in jobs] == [
        (restart_counts[0], (0, 29)),
        (restart_counts[1], (20, 29)),
    ]


@pytest.mark.process
def test_two_ranks_exported_iterations_say_they_are_summed_over_the_ranks(tmp_path: Path) -> None:
    """Every rank exports its own spans of the same sampled iterations: two real gloo ranks
    running 25 iterations each export 12 (the first 10, then 10 and 20), and the summary says
    the 24 it counts are summed over the ranks (before: "Iterations exported as spans: 24"
    beside "Iterations: 25")."""
    from tests.rank_helpers import run_ranks

    ranks = run_ranks(
        f"{TORCH_JOB}\ntrain(0, 25)\n",
        tmp_path,
        TRAINTEL_EXPORT_EVERY_N_ITERATIONS="10",
        TRAINTEL_SLOW_ITERATION_FACTOR="1e6",
    )
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr for r in ranks]
    summary = summarize([r.out_dir for r in ranks])
    assert summary.summary_value("iterations") == 25
    text = " ".join(render(summary).split())
    assert "Iterations exported as spans, summed over the 2 ranks: 24 (every_n 4, first 20)" in text
    # each slowest exported iteration says whose it is: the ranks export the same iterations
    slowest = sorted(summary.slowest, reverse=True)[:3]
    assert {slow.rank for slow in summary.slowest} == {0, 1}
    for slow in slowest:
        assert f"slowest exported: iteration {slow.iteration} on rank {slow.rank} " in text
    from traintel.analysis.report import build_report

    report = build_report([r.out_dir for r in ranks])
    listed = [(s["iteration"], s["rank"]) for s in report.as_dict()["slowest_iterations"]]
    assert listed == [(slow.iteration, slow.rank) for slow in sorted(report.summary.slowest, reverse=True)]
    assert {rank for _iteration, rank in listed} == {0, 1}


FAILING_STEP = """
import traintel
with traintel.application():
    with traintel.training_loop(train_iterations_start=0):
        for i in range(20):
            with traintel.training_iteration(samples=4):
                with traintel.model_forward():
                    if i == 12:
                        raise RuntimeError("boom at 12")
"""


@pytest.mark.process
def test_a_failed_iteration_and_its_failed_step_count_in_the_errors_column(tmp_path: Path) -> None:
    """A job whose iteration 12 raises in its forward pass: the iteration and the forward step
    are exported with ERROR status, and the phase table counts them in their rows' errors
    (before, per-step rows were counted from the window events only and showed no error,
    while the application and the loop above them did). The count is of the 12 iterations that
    completed: one that raised did no work that stays."""
    from tests.subprocess_helpers import run_python

    # (no slow iteration exported: a microsecond step that a loaded machine delays is one)
    runs = str(tmp_path / "runs")
    done = run_python(FAILING_STEP, tmp_path, TRAINTEL_OUTPUT_DIR=runs, TRAINTEL_EXPORT_TAIL_PER_MINUTE="0")
    assert done.returncode == 1 and "boom at 12" in done.stderr
    summary = summarize([tmp_path / "runs"])
    rows = {row.phase: (row.count, row.errors) for row in phase_rows(summary)}
    assert rows["application"] == (1, 1) and rows["training_loop"] == (1, 1)
    assert rows["training_iteration"] == (12, 1)
    assert rows["model_forward"] == (12, 1)
    (line,) = [line for line in render(summary).splitlines() if line.startswith("training_iteration")]
    assert line.endswith("%       1"), line  # the errors column
    assert summary.exported_iterations == {"first": 10, "error": 1}


@pytest.mark.process
@pytest.mark.parametrize("window_events", ["off", "on"])
def test_plain_opentelemetry_iterations_are_numbered_and_their_loop_is_named(
    tmp_path: Path, window_events: str
) -> None:
    """The documented plain OpenTelemetry loop (spans carrying ``ml.training.phase`` alone):
    its iteration spans get their numbers, as the windows count them (before: every slowest
    exported iteration was -1), and the summary says why its loop has no percentiles rather
    than "so far" for a loop that ended. With the full window events asked for, the window
    that closes with the loop has no open loop to carry its event: its numbers ride on its
    record (before: the summary had no iterations at all)."""
    from tests.subprocess_helpers import run_python

    done = run_python(
        """
        from opentelemetry import trace
        import traintel

        traintel.configure()
        tracer = trace.get_tracer("my-trainer")
        loop = {"ml.training.phase": "training_loop"}
        with tracer.start_as_current_span("training_loop", attributes=loop):
            for step in range(10):
                phase = {"ml.training.phase": "training_iteration"}
                with tracer.start_as_current_span("training_iteration", attributes=phase):
                    traintel.record_metrics(loss=0.3)
        traintel.shutdown()
        """,
        tmp_path,
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        TRAINTEL_WINDOW_EVENTS=window_events,
    )
    assert done.returncode == 0, done.stderr
    spans = [s for s in iter_spans([tmp_path / "runs"]) if s.name == "training_iteration"]
    assert sorted(s.attributes[semconv.ITERATION] for s in spans) == list(range(10))
    summary = summarize([tmp_path / "runs"])
    assert {slow.iteration for slow in summary.slowest} <= set(range(10)) and len(summary.slowest) == 5
    text = " ".join(render(summary).split())
    assert "Iterations: 10 in 1 window(s) (its loop span is not traintel's" in text and "so far" not in text
    assert next(r for r in phase_rows(summary) if r.phase == "training_iteration").count == 10


@pytest.mark.parametrize(
    ("line", "wrapped"),
    [
        (
            "Checkpoints: 2 saves, 5.58 ms blocking in total, mean 2.79 ms, max 3.65 ms, 0.53 MB",
            ["Checkpoints: 2 saves, 5.58 ms blocking in total, mean 2.79 ms, max 3.65 ms,", "  0.53 MB"],
        ),
        (
            "Model metrics, last window (iterations 0-299): loss 0.0602 (mean 0.2289), lr 0.003",
            ["Model metrics, last window (iterations 0-299): loss 0.0602 (mean 0.2289),", "  lr 0.003"],
        ),
        ("  a path /" + "x" * 90, ["  a path", "    /" + "x" * 90]),  # a word is never broken
    ],
)
def test_a_wrapped_line_keeps_numbers_with_their_units_and_names(line: str, wrapped: list[str]) -> None:
    """The summary wraps at 80 columns (the demo's checkpoint line read "0.53" with "MB" alone on
    the next line, and "lr" apart from its 0.003)."""
    from traintel.analysis.summary import _fit

    assert _fit(line) == wrapped


_UNEVEN_RANK = """
import os, time
S = 10**9
NOW = [1_700_000_000 * S]
time.time_ns = lambda: NOW[0]
time.monotonic_ns = time.time_ns
import traintel
rank = int(os.environ["RANK"])
traintel.configure(warmup_iterations=0, log_every_n_iterations=5)
with traintel.application(), traintel.training_loop(train_iterations_start=0):
    for i in range(10):
        with traintel.training_iteration(samples=8 if rank == 0 else 4, tokens=80 if rank == 0 else 20):
            NOW[0] += S
traintel.shutdown()
"""


@pytest.mark.process
def test_the_job_s_throughput_sums_its_ranks_when_every_rank_was_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three ranks of 1 s steps with 8, 4 and 4 samples (80, 20, 20 tokens): the job did 16
    samples/s and 120 tokens/s; each rank's own figure is its rate times the world size (24
    and 12 samples/s). With every rank's file read the summary and report give the job's; with a
    rank missing, rank 0's figure (balanced ranks assumed)."""
    from tests.subprocess_helpers import run_python

    for rank in range(3):
        directory = tmp_path / f"rank{rank}"
        directory.mkdir()
        env = {"RANK": str(rank), "WORLD_SIZE": "3", "TRAINTEL_RUN_ID": "uneven"}
        result = run_python(_UNEVEN_RANK, directory, TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), **env)
        assert result.returncode == 0, result.stderr
    summary = summarize([tmp_path / "runs"])
    rates = [summary.summary_value(f"{what}_per_second") for what in ("samples", "tokens")]
    assert rates == [16, 120]
    assert main(["report", "--json", str(tmp_path / "runs")]) == 0
    assert '"samples_per_second": 16.0' in capsys.readouterr().out
    (tmp_path / "two").mkdir()
    for path in sorted((tmp_path / "runs").glob("*.otlp.jsonl")):
        if next(iter_spans([path])).resource[semconv.RANK] != 2:
            path.rename(tmp_path / "two" / path.name)
    assert summarize([tmp_path / "two"]).summary_value("samples_per_second") == 24


def test_a_duration_reads_in_the_unit_that_keeps_it_short_and_zero_as_zero() -> None:
    """A zero (a run with no iteration: its productive time) is no measurement of microseconds."""
    assert [fmt_seconds(s) for s in (0, 0.0, 2e-4, 0.25, 3, 600, 7200, None, math.nan)] == [
        "0 s", "0 s", "200.0 µs", "250.00 ms", "3.00 s", "10.0 min", "2.0 h", "-", "-"
    ]  # fmt: skip


def test_ranks_known_from_their_marks_alone_count_the_run_s_iterations_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ranks killed in their first minute (each file created, no span in it yet): the run
    ran 3 iterations, which each rank's mark counts; not 6, their sum."""
    from traintel.exporters.progress_mark import MARK_KEY, mark_path

    s = 10**9
    for rank in (0, 1):
        file = tmp_path / f"job-{rank}.otlp.jsonl"
        file.touch()
        resource = {
            semconv.SERVICE_NAME: "job", semconv.SERVICE_INSTANCE_ID: f"i{rank}", semconv.RUN_ID: "r",
            semconv.SESSION_TAG: "r", semconv.RESTART_COUNT: 0, semconv.RANK: rank,
        }  # fmt: skip
        progress = {"first_iteration": 0, "last_iteration": 2, "iterations": 3, "productive_s": 3.0}
        mark = {"resource": resource, "start_unix_nano": 100 * s, "time_unix_nano": 130 * s}
        mark["progress"] = progress
        mark_path(file).write_text(json.dumps({MARK_KEY: mark}))
    assert main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ranks [0, 1]" in out and "No spans yet" in out, out
    assert "Iterations: 3, to iteration 2, in the progress mark" in out, out  # (before: 6)
    assert main(["runs", str(tmp_path)]) == 0
    # duration, ranks, iterations, files
    assert "30.00 s      2           3      2" in capsys.readouterr().out


def test_the_errors_spans_ended_with_are_shown_where_each_first_happened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job that crashed: the summary and the report showed an error count per phase and
    never the error. Each distinct error is shown with the innermost span it ended (the
    iteration, not the loop and application around it, which end with the same error), when,
    its trace, and how many spans ended with it."""
    file = OtlpJsonLinesFile(output_dir=tmp_path)
    traintel.configure(span_exporters=[OtlpJsonFileSpanExporter(file=file)], metric_readers=[])
    try:
        with traintel.application(), traintel.training_loop():
            for number in range(5):
                if number == 0:  # an async save whose writer fails after the training resumed
                    save = traintel.checkpoint_save(strategy="async", iteration=number)
                    with save:
                        completion = save.completion()
                    completion.finish(error=OSError(5, "Input/output error"))
                try:
                    with traintel.checkpoint_save(iteration=number):
                        if number == 1:
                            raise OSError(28, "No space left on device")
                        if number == 2:
                            raise TimeoutError  # no message: its span's status reads "TimeoutError: "
                except OSError:
                    pass  # the job goes on without that checkpoint
                with traintel.training_iteration():
                    if number == 3:
                        raise RuntimeError("CUDA out of memory")
    except RuntimeError:
        pass
    finally:
        traintel.shutdown(5)
    spans = list(iter_spans([tmp_path]))
    failed = next(s for s in spans if s.name == "training_iteration" and s.is_error)
    saved, timed_out = [s for s in spans if s.name == "checkpoint_save_sync" and s.is_error]
    written = next(s for s in spans if s.name == "checkpoint_finalize")
    summary = summarize([tmp_path])
    assert [f.as_dict() for f in summary.failures.values()] == [
        {"message": "OSError: [Errno 5] Input/output error", "span": "checkpoint_finalize",
         "iteration": 0, "rank": 0, "end_ns": written.end_ns, "trace_id": written.trace_id,
         "span_id": written.span_id, "spans": 1},
        {"message": "OSError: [Errno 28] No space left on device", "span": "checkpoint_save_sync",
         "iteration": 1, "rank": 0, "end_ns": saved.end_ns, "trace_id": saved.trace_id,
         "span_id": saved.span_id, "spans": 1},
        {"message": "TimeoutError", "span": "checkpoint_save_sync", "iteration": 2, "rank": 0,
         "end_ns": timed_out.end_ns, "trace_id": timed_out.trace_id, "span_id": timed_out.span_id,
         "spans": 1},
        {"message": "RuntimeError: CUDA out of memory", "span": "training_iteration", "iteration": 3,
         "rank": 0, "end_ns": failed.end_ns, "trace_id": failed.trace_id, "span_id": failed.span_id,
         "spans": 3},
    ]  # fmt: skip
    text = render(summary)
    assert "Errors: 6 span(s) ended with one, earliest first, each where it first happened" in text
    assert "  TimeoutError\n    in checkpoint_save_sync of iteration 2 at " in text
    assert "  RuntimeError: CUDA out of memory\n    in training_iteration 3 at " in text
    assert f"and 2 span(s) around it\n    trace {failed.trace_id} span {failed.span_id}" in text
    assert main(["report", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["errors"], report["other_errors"]) == ([f.as_dict() for f in summary.failures.values()], 0)
    checkpoints = report["checkpoints"]  # 4 sync saves (two raised) and an async one (its writer failed)
    assert (checkpoints["saves"], checkpoints["failed_saves"], checkpoints["failed_loads"]) == (5, 3, 0)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\n saves +5 \(3 failed\) *\n", out)
    assert (
        "Errors, earliest first, each where it first happened" in out
        and f"trace {failed.trace_id} span" in out
    )
    html = tmp_path / "report.html"
    assert main(["report", str(tmp_path), "--html", str(html)]) == 0
    page = html.read_text()
    row = '<td class="warn">RuntimeError: CUDA out of memory</td><td>training_iteration 3</td>'
    assert row in page and f"<code>{failed.trace_id}</code>" in page


def test_errors_are_bounded_and_merged_across_files_earliest_first() -> None:
    """Per file read apart, then merged: the same error adds up and keeps its earliest span
    (wherever its file comes); the five earliest distinct errors are kept, earliest first (a
    crashed rank's error before the "peer closed" of the ranks after it, whatever the ranks'
    file order), the rest are counted."""
    from traintel.analysis.summary import MAX_FAILURES, RunSummary
    from traintel.exporters.records import SpanRecord

    def failed(message: str, span_id: str, end_ns: int) -> SpanRecord:
        return SpanRecord("step", "ab" * 16, span_id, None, end_ns - 5, end_ns, {}, (), (), 2, message,
                          {semconv.RANK: 0}, "s")  # fmt: skip

    first, later = RunSummary(), RunSummary()
    first.add(failed("E0", "01" * 8, 10))
    first.add(failed("peer closed", "04" * 8, 30))
    later.add(failed("E0", "02" * 8, 5))  # earlier in time, later in the files: kept
    for n in range(1, MAX_FAILURES + 2):
        later.add(failed(f"E{n}", "03" * 8, 20 - n))
    first.merge(later)
    kept = [(message, f.span_id, f.spans) for message, f in first.failures.items()]
    assert kept == [("E0", "02" * 8, 2), *[(f"E{n}", "03" * 8, 1) for n in range(MAX_FAILURES + 1, 2, -1)]]
    assert first.other_failures == 3  # E2 (18 ns), E1 (19), peer closed (30)


@pytest.mark.process
def test_a_run_whose_spans_were_lost_before_its_file_had_any_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A disk that filled while a short job ran: its span lines failed (counted, "not_written"),
    its smaller metric lines were written. The summary said the job "stopped, or is still
    running" and that its mark says it ran no iteration, of a job that completed 300; it now
    says how many spans were lost and where the job said why. (The file: a real job's, its span
    lines taken out and the loss its metric line counts set as the full disk left it.)"""
    from tests.subprocess_helpers import run_python

    runs = tmp_path / "runs"
    done = run_python(KILLED_OR_DONE.replace("sys.argv[1]", "0").replace("sys.argv[2]", "300")
                      .replace("sys.argv[3]", "'done'"), tmp_path, TRAINTEL_OUTPUT_DIR=str(runs))  # fmt: skip
    assert done.returncode == 0, done.stderr
    (path,) = runs.glob("*.otlp.jsonl")
    lines = [line for line in path.read_text().splitlines() if not line.startswith('{"resourceSpans"')]
    full_disk = (
        '"asInt":"6009","attributes":[{"key":"traintel.drop.reason","value":{"stringValue":"not_written"}}]'
    )
    kept = '"asInt":"0","attributes":[{"key":"traintel.drop.reason","value":{"stringValue":"queue_full"}}]'
    assert kept in lines[-1]
    path.write_text("\n".join([*lines[:-1], lines[-1].replace(kept, full_disk)]) + "\n")
    assert main(["summary", str(runs)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (
        "No spans in its file: 6,009 were lost before they were written (the file could not be written"
        in said
    )
    assert "stopped, or is still running" not in said
    assert "Telemetry losses: traintel.spans.dropped 6,009" in said


@pytest.mark.process
def test_a_run_whose_trace_its_sampler_dropped_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job run with ``OTEL_TRACES_SAMPLER=always_off`` completed 300 iterations: the summary
    said it "stopped, or is still running" and that it ran no iteration."""
    from tests.subprocess_helpers import run_python

    runs = tmp_path / "runs"
    done = run_python(KILLED_OR_DONE.replace("sys.argv[1]", "0").replace("sys.argv[2]", "300")
                      .replace("sys.argv[3]", "'done'"), tmp_path, TRAINTEL_OUTPUT_DIR=str(runs),
                      OTEL_TRACES_SAMPLER="always_off")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert main(["summary", str(runs)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (
        "No spans in its file, though its metrics count 300 iterations: the job's trace was dropped "
        "by its sampler" in said
    )
    assert "still running" not in said and "no iteration" not in said


CUSTOM_PHASES = """
import traintel
with traintel.application():
    with traintel.timed_span("load_tokenizer", phase="load_tokenizer"):
        pass
    with traintel.training_loop(train_iterations_start=0):
        for i in range(50):
            with traintel.training_iteration(samples=2):
                with traintel.timed_span("grad_clip", phase="grad_clip"):
                    pass
            if i % 10 == 9:
                with traintel.timed_span("generate", phase="generate"):
                    pass
"""


@pytest.mark.process
@pytest.mark.parametrize("export", ["sampled", "all"])
def test_a_phase_of_the_user_s_own_inside_iterations_is_said_to_be_counted_as_exported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], export: str
) -> None:
    """``timed_span("grad_clip", phase="grad_clip")`` in each of 50 iterations: its spans are
    exported with their iterations only, and the table read "grad_clip 10", as if it ran ten
    times. Its spans now carry their iteration's number; a row counted from the exported
    iterations alone is marked and says so. Phases outside iterations are whole; exporting every
    iteration counts every one."""
    from tests.subprocess_helpers import run_python

    runs = tmp_path / "runs"
    done = run_python(
        CUSTOM_PHASES, tmp_path, TRAINTEL_OUTPUT_DIR=str(runs), TRAINTEL_EXPORT_ITERATIONS=export
    )
    assert done.returncode == 0, done.stderr
    clips = [s for s in iter_spans([runs]) if s.name == "grad_clip"]
    parents = {s.span_id: s for s in iter_spans([runs]) if s.name == "training_iteration"}
    assert clips and all(
        c.attributes[semconv.ITERATION] == parents[str(c.parent_span_id)].attributes[semconv.ITERATION]
        for c in clips
    )
    summary = summarize([runs])
    rows = {row.phase: row for row in phase_rows(summary)}
    exported = sum(summary.exported_iterations.values())  # the first 10, and any slow one
    assert (exported < 50) is (export == "sampled")
    counts = {
        name: (rows[name].count, rows[name].sampled) for name in ("load_tokenizer", "grad_clip", "generate")
    }
    assert counts == {
        "load_tokenizer": (1, False),
        "grad_clip": (exported, exported < 50),
        "generate": (5, False),
    }
    assert main(["summary", str(runs)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    said = f"* inside iterations: counted in the exported ones only ({exported} of 50); the metric"
    assert (said in text and f"grad_clip* {exported}" in text) is (export == "sampled"), text
