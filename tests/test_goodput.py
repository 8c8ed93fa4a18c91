"""Goodput and badput: crafted jobs with exact timestamps, written through traintel's real
pipeline (its processor computes the window records) into the embedded default's file format,
then read back by the analysis. Every bucket is asserted, and the sum against the total.

Jobs use plain OpenTelemetry spans with ``ml.training.phase`` and explicit start/end times (the
path any instrumentation can take), so the numbers are exact; the live ledger of the same job
is checked against the file analysis.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
from opentelemetry.trace import Span

import traintel
from tests.conftest import Pipeline, parent_name
from traintel import cli, semconv
from traintel._aggregation.goodput import GoodputLedger, WindowGoodput
from traintel.analysis.goodput import SessionGoodput, compute_goodput, load_jobs, render_goodput
from traintel.analysis.summary import phase_rows, summarize
from traintel.exporters.file import OtlpJsonFileSpanExporter
from traintel.exporters.reader import iter_spans
from traintel.semconv import BADPUT_CATEGORIES

T0 = 1_700_000_000 * 10**9
S = 10**9


def at(seconds: float) -> int:
    return T0 + round(seconds * S)


class Job:
    """Spans of one process at exact times (seconds after T0)."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def open(self, name: str, start: float, parent: Span | None = None, **attributes: Any) -> Span:
        context = trace.set_span_in_context(parent) if parent is not None else None
        attributes.setdefault(semconv.PHASE, name)
        if attributes[semconv.PHASE] is None:
            del attributes[semconv.PHASE]
        return self.tracer.start_span(name, context=context, attributes=attributes, start_time=at(start))

    def span(
        self, name: str, start: float, end: float, parent: Span | None = None, **attributes: Any
    ) -> Span:
        span = self.open(name, start, parent, **attributes)
        span.end(end_time=at(end))
        return span

    def iteration(
        self, loop: Span, number: int, start: float, end: float, data: float = 0.0, **attributes: Any
    ) -> Span:
        span = self.open("training_iteration", start, loop, **{semconv.ITERATION: number, **attributes})
        if data:
            self.span("data_loading", start, start + data, span)
        return span


def run_job(
    directory: Path,
    monkeypatch: pytest.MonkeyPatch,
    build: Callable[[Job], None],
    session: str = "s1",
    run_id: str = "job-a",
    restart: int = 0,
    rank: int = 0,
    window: int = 2,
    metric_readers: list[MetricReader] | None = None,
) -> GoodputLedger:
    """Run ``build`` under a traintel pipeline writing ``directory/<run>-<restart>-<rank>``;
    returns the job's live goodput ledger."""
    with monkeypatch.context() as env:
        env.setenv("TRAINTEL_SESSION_TAG", session)
        env.setenv("TRAINTEL_RUN_ID", run_id)
        env.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
        env.setenv("RANK", str(rank))
        env.setenv("WORLD_SIZE", "2")
        path = directory / f"{run_id}-{restart}-{rank}.otlp.jsonl"
        telemetry = traintel.configure(
            span_exporters=[OtlpJsonFileSpanExporter(path)],
            metric_readers=metric_readers or [],
            log_every_n_iterations=window,
            warmup_iterations=0,
        )
        assert telemetry.engine is not None and telemetry.pipeline is not None
        build(Job(telemetry.pipeline.tracer_provider.get_tracer("user-code")))
        ledger = telemetry.engine.goodput
        for reader in metric_readers or []:
            reader.collect()  # before shutdown: what the last export before the job's end holds
        traintel.shutdown(60)
    return ledger


def clean_job(job: Job, offset: float = 0.0) -> None:
    """100 s: init 10, load 5, 6 iterations in 3 windows, a save, validation, testing."""
    o = offset
    app = job.open("application", o + 0)
    job.span("model_init", o + 0, o + 10, app)
    job.span("checkpoint_load", o + 10, o + 15, app)
    loop = job.open("training_loop", o + 20, app)
    for number, (start, end, data) in enumerate([(20, 30, 2), (30, 34, 0), (34, 38, 1), (40, 44, 0)]):
        job.iteration(loop, number, o + start, o + end, data).end(end_time=at(o + end))
    job.span("checkpoint_save_sync", o + 44, o + 50, loop)
    validation = job.open("validation_loop", o + 50, loop)
    job.span("validation_iteration", o + 51, o + 59, validation)
    validation.end(end_time=at(o + 60))
    for number, start in ((4, 60), (5, 64)):
        job.iteration(loop, number, o + start, o + start + 4).end(end_time=at(o + start + 4))
    loop.end(end_time=at(o + 80))
    job.span("testing_loop", o + 85, o + 90, app)
    app.end(end_time=at(o + 100))


def assert_sums(result: SessionGoodput) -> None:
    total = result.productive_s + sum(result.badput_s[c] for c in BADPUT_CATEGORIES)
    assert total == pytest.approx(result.total_s, abs=1e-9)
    shares = result.goodput + sum(result.badput(c) for c in BADPUT_CATEGORIES)
    assert shares == pytest.approx(1.0, abs=1e-12)


def expect(result: SessionGoodput, productive: float, **badput: float) -> None:
    assert result.productive_s == pytest.approx(productive, abs=1e-9)
    for category in BADPUT_CATEGORIES:
        assert result.badput_s[category] == pytest.approx(badput.get(category, 0.0), abs=1e-9), category
    assert_sums(result)


def one_session(directory: Path, **kwargs: Any) -> SessionGoodput:
    results = compute_goodput(load_jobs([directory]), **kwargs)
    assert len(results) == 1
    return results[0]


def test_clean_run_every_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = run_job(tmp_path, monkeypatch, clean_job)
    result = one_session(tmp_path)
    assert result.total_s == 100
    # windows: [10, 4] s with 2 s data wait (the first's), startup (10 - 2) - 4 = 4, productive
    # 14 - 2 - 4 = 8; [4, 4] with 1 s data, productive 7 (2 s between iterations: other); [4, 4]
    # productive 8
    expect(
        result, 23, initialization=10, checkpoint_load=5, checkpoint_save=6, data_loading=3,
        evaluation=15, program_startup=4, other=34,
    )  # fmt: skip
    assert result.disruptions == 0
    assert result.last_iteration == 5
    assert [j.status for j in result.jobs] == ["completed"]
    assert result.jobs[0].goodput == pytest.approx(0.23)
    # the live ledger of the same job agrees
    snapshot = ledger.snapshot(at(100))
    assert snapshot.total_s == 100
    assert snapshot.productive_s == pytest.approx(23)
    for category in ("initialization", "checkpoint_load", "checkpoint_save", "data_loading", "evaluation"):
        assert snapshot.badput_s[category] == pytest.approx(result.badput_s[category]), category
    assert snapshot.badput_s["program_startup"] == pytest.approx(4)
    assert snapshot.badput_s["other"] == pytest.approx(34)


def beside_training_job(job: Job) -> None:
    """20 s: 4 iterations of 4 s (0.5 s waiting for each batch) while a prefetcher thread decodes
    the next batch (2 s each) and a writer thread saves (3 s), both beside training."""
    app = job.open("application", 0)
    loop = job.open("training_loop", 2, app)
    for number in range(4):
        start = 2 + 4 * number
        job.span("data_loading", start, start + 2, loop, **{semconv.THREAD_NAME: "prefetcher"})
        job.iteration(loop, number, start, start + 4, data=0.5).end(end_time=at(start + 4))
    job.span("checkpoint_save_sync", 12, 15, loop, **{semconv.THREAD_NAME: "writer"})
    loop.end(end_time=at(18))
    app.end(end_time=at(20))


def test_phases_run_beside_training_are_not_badput(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefetcher thread's data loading (ML Goodput's "async data loading") and a writer
    thread's save, overlapping the iterations, held nothing up: not badput, offline nor live.
    Before: 8 s of data loading and 3 s of saving booked beside the productive iterations of a
    20 s job (the shares summed past 100 % with a negative `other`; live, `other` clamped at 0)."""
    ledger = run_job(tmp_path, monkeypatch, beside_training_job)
    result = one_session(tmp_path)
    # 4 iterations of 4 s, each with a 0.5 s wait for its batch: 14 s productive, 2 s waiting
    expect(result, 14, data_loading=2, other=4)
    live = ledger.snapshot(at(20))
    assert live.productive_s == pytest.approx(14)
    assert (live.badput_s["data_loading"], live.badput_s["checkpoint_save"]) == (pytest.approx(2), 0)
    assert live.badput_s["other"] == pytest.approx(4)
    # the tables show the prefetcher's loading on a row of its own, without a share
    rows = {row.phase: row for row in phase_rows(summarize([tmp_path]))}
    beside = rows["data_loading (beside training)"]
    assert (beside.count, beside.total_s, beside.share) == (4, pytest.approx(8), None)
    assert rows["data_loading"].total_s == pytest.approx(2)


def two_stages_killed(job: Job) -> None:
    """No application: a pre-training loop that ends, then a fine-tuning loop killed after its
    window record (its loop span never ends)."""
    first = job.open("training_loop", 0)
    for number in range(2):
        job.iteration(first, number, 4 * number, 4 * number + 4).end(end_time=at(4 * number + 4))
    first.end(end_time=at(8))
    second = job.open("training_loop", 10)  # never ends: the node went
    for number in range(2, 4):
        start = 10 + 4 * (number - 2)
        job.iteration(second, number, start, start + 4).end(end_time=at(start + 4))


def test_a_job_of_loops_killed_in_its_second_loop_has_no_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "completed" (the first loop's end was the job's: a job resuming it would not
    have counted a disruption, nor the gap as recovery)."""
    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "off")  # (a plain OpenTelemetry loop)
    run_job(tmp_path, monkeypatch, two_stages_killed)
    (job,) = one_session(tmp_path).jobs
    assert (job.status, job.last_iteration) == ("no end exported", 3)


def test_step_time_deviation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_job(tmp_path, monkeypatch, clean_job)
    result = one_session(tmp_path)
    # steps 10, 4, 4, 4, 4, 4: median 4, MAD 0, so the 10 s step is dropped: ideal 4 s
    assert result.ideal_step_time_s == pytest.approx(4)
    assert result.recent_deviation[-1] == {
        "first_iteration": 4, "last_iteration": 5, "p50": 0.0, "p90": 0.0, "p99": 0.0
    }  # fmt: skip
    worst = result.most_deviating[0]
    assert (worst["iteration"], worst["seconds"], worst["deviation"]) == (0, 10, 1.5)
    assert "trace_id" in worst and "span_id" in worst  # the first iterations are exported


def test_each_job_s_step_time_deviation_is_from_its_own_ideal_and_its_own_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose resumed job steps 4 times faster (another node, another config): each
    job's iterations deviate from its own ideal step time, and the most deviating iteration's
    span is its own job's, though both jobs ran an iteration 5 (before: every job's from the
    last job's 1 s, job 1's 6 s iteration 5 at +500 % first, and both iteration 5 entries
    pointing at the span read last, job 2's)."""
    spans: dict[int, str] = {}

    def steps(durations: list[float], first: int, start: float) -> Callable[[Job], None]:
        def build(job: Job) -> None:
            app = job.open("application", start)
            loop = job.open("training_loop", start, app, **{semconv.TRAIN_ITERATIONS_START: first})
            t = start
            for number, seconds in enumerate(durations, first):
                span = job.iteration(loop, number, t, t + seconds)
                span.end(end_time=at(t + seconds))
                if number == 5:
                    spans[len(spans)] = format(span.get_span_context().span_id, "016x")
                t += seconds
            loop.end(end_time=at(t))
            app.end(end_time=at(t))

        return build

    run_job(tmp_path, monkeypatch, steps([4, 4, 4, 4, 4, 6], 0, 0), restart=0)  # ideal 4 s
    run_job(tmp_path, monkeypatch, steps([1, 2, 1, 1, 1, 1], 4, 50), restart=1)  # ideal 1 s
    result = one_session(tmp_path)
    assert result.ideal_step_time_s == 1  # the latest job's
    first, second = result.most_deviating[:2]
    listed = [(e["iteration"], e["seconds"], e["deviation"]) for e in (first, second)]
    assert listed == [(5, 2, 1), (5, 6, 0.5)]
    assert (second["span_id"], first["span_id"]) == (spans[0], spans[1])
    assert [(e["restart"], e["ideal_seconds"]) for e in (first, second)] == [(1, 1), (0, 4)]
    assert all(entry["deviation"] == 0 for entry in result.most_deviating[2:])
    assert all(window["p50"] == 0 for window in result.recent_deviation if window["first_iteration"] != 4)
    text = render_goodput([result])
    assert "    iteration 5 in job job-a, 1: 2.00 s (+100%)\n" in text  # whose, as numbers repeat
    assert "    iteration 5 in job job-a, 0: 6.00 s (+50% over its loop's ideal 4.00 s)\n" in text


def test_each_loop_of_a_process_has_its_own_ideal_step_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pre-training at 4 s a step, then fine-tuning at 1 s in the same process: each loop's
    windows deviate from its own ideal, live and in the files (before: one ideal, 4 s, for
    both; the fine-tuning's last window read -75 %)."""

    def two_stages(job: Job) -> None:
        app = job.open("application", 0)
        t, number = 0.0, 0
        for durations in ([4, 4, 4, 4, 4, 6], [1, 2, 1, 1, 1, 1]):
            loop = job.open("training_loop", t, app)
            for seconds in durations:
                job.iteration(loop, number, t, t + seconds).end(end_time=at(t + seconds))
                t, number = t + seconds, number + 1
            loop.end(end_time=at(t))
        app.end(end_time=at(t))

    ledger = run_job(tmp_path, monkeypatch, two_stages)
    assert ledger.ideal_step_time_s == 1
    last = ledger.last_window
    assert last is not None and last.attributes()[semconv.STEP_TIME_IDEAL] == 1
    result = one_session(tmp_path)
    assert result.ideal_step_time_s == 1
    listed = [
        (e["iteration"], e["seconds"], e["deviation"], e["ideal_seconds"]) for e in result.most_deviating
    ]
    assert listed[:2] == [(7, 2, 1, 1), (5, 6, 0.5, 4)]
    assert all(entry["deviation"] == 0 for entry in result.most_deviating[2:])
    # windows of 2: [4, 4], [4, 4], [4, 6] over 4 s; [1, 2], [1, 1], [1, 1] over 1 s
    assert [w["p50"] for w in result.recent_deviation] == [0, 0, 0.25, 0.5, 0, 0]


def crashed_then_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second_restart: int = 1) -> None:
    def first(job: Job) -> None:  # killed at 45 s: application and loop never end
        app = job.open("application", 0)
        job.span("model_init", 0, 10, app)
        loop = job.open("training_loop", 10, app)
        for number in range(4):
            start = 10 + 5 * number
            job.iteration(loop, number, start, start + 5).end(end_time=at(start + 5))
        job.span("checkpoint_save_sync", 30, 32, loop, **{semconv.CHECKPOINT_ITERATION: 4})
        for number, start in ((4, 32), (5, 37)):
            job.iteration(loop, number, start, start + 5).end(end_time=at(start + 5))
        job.span("my_work", 42, 45, loop, **{semconv.PHASE: None})  # the last exported activity

    def second(job: Job) -> None:  # resumes from the checkpoint of iteration 4
        app = job.open("application", 60)
        job.span("checkpoint_load", 60, 64, app, **{semconv.CHECKPOINT_ITERATION: 4})
        loop = job.open("training_loop", 64, app, **{semconv.TRAIN_ITERATIONS_START: 4})
        for number in range(4, 8):
            start = 64 + 5 * (number - 4)
            job.iteration(loop, number, start, start + 5).end(end_time=at(start + 5))
        loop.end(end_time=at(95))
        app.end(end_time=at(100))

    run_job(tmp_path, monkeypatch, first, restart=0)
    run_job(tmp_path, monkeypatch, second, restart=second_restart)


def launched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same crash and resume, the resume launched again under the same run id and restart
    count (torchrun rerun with its ``--rdzv-id``): its own job all the same."""
    crashed_then_resumed(tmp_path, monkeypatch, second_restart=0)


@pytest.mark.parametrize("build", [crashed_then_resumed, launched_again], ids=["restarted", "launched-again"])
def test_crash_after_checkpoint_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build: Callable[[Path, pytest.MonkeyPatch], None]
) -> None:
    build(tmp_path, monkeypatch)
    result = one_session(tmp_path)
    assert result.total_s == 100
    # iterations 4-5 of the first job (window [32, 42], 10 s) were run again: wasted progress;
    # 45 -> 60 s (last activity of the killed job -> next start): infrastructure recovery
    expect(
        result, 40, initialization=10, checkpoint_save=2, checkpoint_load=4, wasted_progress=10,
        infrastructure_recovery=15, other=19,
    )  # fmt: skip
    assert result.disruptions == 1
    assert result.last_iteration == 7
    killed, resumed = result.jobs
    assert (killed.status, killed.end_ns, killed.last_iteration) == ("no end exported", at(45), 5)
    assert (resumed.status, resumed.resumed_from, resumed.first_iteration) == ("completed", 4, 4)
    assert result.layers()["infrastructure"]["infrastructure_recovery"] == pytest.approx(0.15)


def test_interval_clips_phases_exactly_and_windows_in_proportion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_job(tmp_path, monkeypatch, clean_job)
    result = one_session(tmp_path, start_ns=at(25), end_ns=at(60))
    assert result.total_s == 35
    # [25, 34] cuts window 0 ([20, 34], 14 s uncovered): 9/14 of its productive 8, data 2 and
    # startup 4; window 1 whole; the save and the validation loop exactly
    share = 9 / 14
    expect(
        result, 8 * share + 7, data_loading=2 * share + 1, program_startup=4 * share, checkpoint_save=6,
        evaluation=10, other=2,
    )  # fmt: skip
    # an interval across the crash gap
    crash_dir = tmp_path / "crash"
    crash_dir.mkdir()
    crashed_then_resumed(crash_dir, monkeypatch)
    across = one_session(crash_dir, start_ns=at(40), end_ns=at(66))
    # [40, 42] of the redone window (wasted 2), [42, 45] other, 15 s recovery, 4 s load, and
    # [64, 66] of a 10 s window holding 10 s of productive time
    expect(across, 2, wasted_progress=2, other=3, infrastructure_recovery=15, checkpoint_load=4)


def test_two_sessions_interleaved_in_one_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_job(tmp_path, monkeypatch, clean_job, session="alpha", run_id="a1")
    run_job(tmp_path, monkeypatch, lambda job: clean_job(job, offset=50), session="beta", run_id="b1")
    results = {r.session: r for r in compute_goodput(load_jobs([tmp_path]))}
    assert set(results) == {"alpha", "beta"}
    for name, offset in (("alpha", 0), ("beta", 50)):
        result = results[name]
        assert (result.start_ns, result.end_ns) == (at(offset), at(offset + 100))
        expect(
            result, 23, initialization=10, checkpoint_load=5, checkpoint_save=6, data_loading=3,
            evaluation=15, program_startup=4, other=34,
        )  # fmt: skip


def slower_rank(job: Job) -> None:
    """``clean_job``'s job as another rank sees it: it loads its checkpoint 5 s longer."""
    app = job.open("application", 0)
    job.span("model_init", 0, 10, app)
    job.span("checkpoint_load", 10, 20, app)
    loop = job.open("training_loop", 20, app)
    for number, (start, end, data) in enumerate([(20, 30, 2), (30, 34, 0), (34, 38, 1), (40, 44, 0)]):
        job.iteration(loop, number, start, end, data).end(end_time=at(end))
    loop.end(end_time=at(80))
    app.end(end_time=at(100))


def test_two_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_job(tmp_path, monkeypatch, clean_job, rank=0)
    run_job(tmp_path, monkeypatch, slower_rank, rank=1)
    result = one_session(tmp_path)
    (job,) = result.jobs
    assert job.ranks == [0, 1] and job.rank_used == 0
    assert job.goodput_by_rank == {0: pytest.approx(0.23), 1: pytest.approx(0.15)}
    expect(
        result, 23, initialization=10, checkpoint_load=5, checkpoint_save=6, data_loading=3,
        evaluation=15, program_startup=4, other=34,
    )  # fmt: skip
    rank1 = one_session(tmp_path, rank=1)
    expect(rank1, 15, initialization=10, checkpoint_load=10, data_loading=3, program_startup=4, other=58)


def test_a_rank_a_job_does_not_have_is_named_with_the_ranks_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``goodput --rank 1`` on a session whose resumed job ran rank 0 alone counts that job's
    rank 0, and says so above the figures, naming the option, its value and the job's ranks
    (before: rank 0's figures with nothing said; only ``--json`` had ``rank_used``). A rank no
    job has is an error naming the ranks there are, with no figures (before: exit 0, and
    every job's lowest rank's figures)."""
    run_job(tmp_path, monkeypatch, clean_job, rank=0)
    run_job(tmp_path, monkeypatch, slower_rank, rank=1)
    run_job(tmp_path, monkeypatch, functools.partial(clean_job, offset=200), restart=1, rank=0)
    assert cli.main(["goodput", str(tmp_path), "--rank", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3:5] == [
        "  --rank 1: no rank 1 in job job-a, 1",
        "    (its ranks: 0); its rank 0 is counted instead",
    ]
    assert cli.main(["goodput", str(tmp_path), "--rank", "1", "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)["sessions"][0]["jobs"]
    assert [(j["ranks"], j["rank_used"], j["rank_missing"]) for j in jobs] == [([0, 1], 1, None), ([0], 0, 1)]
    for extra in ([], ["--json"]):
        assert cli.main(["goodput", str(tmp_path), "--rank", "5", *extra]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err == "traintel: --rank 5: no job in these files has rank 5 (ranks: 0, 1)\n"


def test_a_session_or_an_interval_none_of_the_files_has_is_an_error_saying_what_they_have(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--session`` misspelt, or ``--start``/``--end`` outside the run: "no training sessions
    found" with exit 0 read as a job that recorded nothing. Now an error naming the sessions
    there are, or the time the files cover."""
    from traintel.analysis.goodput import load_jobs
    from traintel.analysis.run_info import utc_text

    run_job(tmp_path, monkeypatch, clean_job)
    assert cli.main(["goodput", str(tmp_path), "--session", "s2"]) == 2
    assert capsys.readouterr() == ("", "traintel: --session s2: no such session in these files (s1)\n")
    (process,) = [p for job in load_jobs([tmp_path]) for p in job.ranks.values()]
    assert process.end_ns is not None
    covered = f"they run from {utc_text(process.start_ns)} to {utc_text(process.end_ns)} UTC\n"
    for interval in (["--end", "2001-01-01"], ["--start", str(process.end_ns // 10**9 + 60)]):
        assert cli.main(["goodput", str(tmp_path), *interval]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"traintel: no session in these files overlaps --start/--end: {covered}"
    assert cli.main(["goodput", str(tmp_path), "--session", "s1"]) == 0  # (the one there is)


def job_with_async_save(job: Job) -> None:
    """Four 4 s iterations around an async save that blocks 1 s and finalizes in the background."""
    app = job.open("application", 0)
    loop = job.open("training_loop", 0, app)
    for number in range(2):
        job.iteration(loop, number, 4 * number, 4 * number + 4).end(end_time=at(4 * number + 4))
    save = job.span("checkpoint_save_async", 8, 9, loop)  # blocking: 1 s
    # the background write overlaps the next iterations: not badput
    job.span("checkpoint_finalize", 9, 17, save)
    for number in range(2, 4):
        start = 9 + 4 * (number - 2)
        job.iteration(loop, number, start, start + 4).end(end_time=at(start + 4))
    loop.end(end_time=at(17))
    app.end(end_time=at(17))


def test_an_iteration_that_raised_is_neither_counted_nor_productive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four 4 s iterations of 8 samples; the third runs out of memory and the loop skips it. It
    did no work that stays, yet its 4 s were productive, its 8 samples in the throughput and it
    counted as completed (the job's last completed iteration, had it crashed there)."""

    def skipped_step(job: Job) -> None:
        app = job.open("application", 0)
        loop = job.open("training_loop", 0, app)
        for number, start in enumerate((0, 4, 8, 12)):
            span = job.iteration(loop, number, start, start + 4, **{semconv.SAMPLES: 8})
            if number == 2:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "OutOfMemoryError"))
            span.end(end_time=at(start + 4))
        loop.end(end_time=at(16))
        app.end(end_time=at(16))

    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "off")  # the shipped default: windows as spans
    ledger = run_job(tmp_path, monkeypatch, skipped_step)
    result = one_session(tmp_path)
    expect(result, 12, other=4)
    assert ledger.snapshot(at(16)).productive_s == pytest.approx(12, abs=1e-9)  # live, alike
    summary = summarize([tmp_path])
    assert (summary.window_iterations, summary.window_iteration_s) == (3, 12.0)
    windows = [s.attributes for s in iter_spans([tmp_path]) if s.name == semconv.TRAINING_WINDOW_SPAN]
    assert [
        (w[semconv.WINDOW_PREFIX + "first_iteration"], w[semconv.WINDOW_PREFIX + "samples"]) for w in windows
    ] == [
        (0, 16.0),
        (3, 8.0),
    ]


def test_async_checkpoint_counts_only_its_blocking_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_job(tmp_path, monkeypatch, job_with_async_save)
    result = one_session(tmp_path)
    expect(result, 16, checkpoint_save=1)


def test_cli_table_and_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed_then_resumed(tmp_path, monkeypatch)
    assert cli.main(["goodput", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (session,) = data["sessions"]
    assert session["goodput"] == pytest.approx(0.40)
    assert session["badput"]["wasted_progress"] == pytest.approx(0.10)
    assert session["disruptions"] == 1
    assert math.isclose(session["goodput"] + sum(session["badput"].values()), 1.0)
    assert [j["status"] for j in session["jobs"]] == ["no end exported", "completed"]
    assert cli.main(["goodput", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "session s1" in text and "badput infrastructure_recovery" in text and "15.00%" in text
    start = "2023-11-14T22:13:40Z"  # T0 + 20 s
    assert (
        cli.main(["goodput", str(tmp_path), "--json", "--start", start, "--end", str(1_700_000_000 + 30)])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["sessions"][0]["total_seconds"] == pytest.approx(10)


def test_cli_text_of_a_job_without_training_iterations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An evaluation-only job read "last iteration None"."""

    def evaluation_only(job: Job) -> None:
        app = job.open("application", 0)
        job.span("testing_loop", 1, 9, app)
        app.end(end_time=at(10))

    run_job(tmp_path, monkeypatch, evaluation_only)
    assert cli.main(["goodput", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "  1 job(s), 0 disruption(s), no training iteration\n" in text and "None" not in text


def two_stages(job: Job, application: bool) -> None:
    """Two training loops (pre-training, then fine-tuning; or a notebook cell run again) of two
    5 s iterations each, 20 s apart, then a 5 s validation: in one application, or in none."""
    app = job.open("application", 0) if application else None
    for offset in (0, 30):
        loop = job.open("training_loop", offset, app)
        for number, start in enumerate((offset, offset + 5)):
            job.iteration(loop, number, start, start + 5).end(end_time=at(start + 5))
        loop.end(end_time=at(offset + 10))
    job.span("validation_loop", 45, 50, app)
    if app is not None:
        app.end(end_time=at(50))


@pytest.mark.parametrize("application", [True, False])
def test_loops_run_without_an_application_count_to_the_process_s_last_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, application: bool
) -> None:
    """Without ``application()`` the job's account ended with its first loop: the second
    loop's and the validation's 40 s were left out (10 s total, 100 % goodput)."""
    # (the full window event on the loop is stamped when it is added, on this test's real clock)
    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "off")
    run_job(tmp_path, monkeypatch, lambda job: two_stages(job, application))
    result = one_session(tmp_path)
    assert result.total_s == 50
    expect(result, 20, evaluation=5, other=25)
    assert [job.status for job in result.jobs] == ["completed"]


@pytest.mark.process
def test_cli_rejects_bad_times_by_name(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "traintel.cli", "goodput", str(tmp_path), "--start", "yesterday"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--start" in result.stderr and "'yesterday'" in result.stderr


def test_live_goodput_on_the_application_span_and_as_gauges(pipeline: Pipeline) -> None:
    with traintel.application():
        with traintel.model_init():
            time.sleep(0.05)
        with traintel.training_loop():
            for _ in range(3):
                with traintel.training_iteration():
                    with traintel.data_loading():
                        time.sleep(0.01)
    app = pipeline.one("application").attributes
    assert app is not None
    categories = ("initialization", "checkpoint_load", "checkpoint_save", "data_loading", "evaluation",
                  "program_startup", "other")  # fmt: skip
    shares = app[semconv.GOODPUT] + sum(app[semconv.BADPUT_PREFIX + c] for c in categories)  # type: ignore[operator]
    assert shares == pytest.approx(1.0)
    assert app[semconv.BADPUT_PREFIX + "initialization_time"] >= 0.05  # type: ignore[operator]
    assert app[semconv.BADPUT_PREFIX + "data_loading_time"] >= 0.03  # type: ignore[operator]
    loop = pipeline.one("training_loop").attributes
    assert loop is not None and semconv.SUMMARY_PREFIX + "goodput" in loop
    window = pipeline.one("training_window")
    assert window.attributes is not None and window.attributes[semconv.WINDOW_PREFIX + "iterations"] == 3
    assert parent_name(window, pipeline.spans()) == "training_loop"
    data = pipeline.reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points[metric.name] = list(metric.data.data_points)  # type: ignore[union-attr]
    (goodput,) = points[semconv.METRIC_GOODPUT]
    assert goodput.value == pytest.approx(app[semconv.GOODPUT])
    badput = {p.attributes[semconv.BADPUT_CATEGORY]: p.value for p in points[semconv.METRIC_BADPUT]}
    assert set(badput) == set(categories)
    assert goodput.value + sum(badput.values()) == pytest.approx(1.0)


def first_step_waits_for_its_batch(job: Job) -> None:
    """Three iterations (one window of 3): the first 10 s with 9 s of data wait, then 1 s ones."""
    app = job.open("application", 0)
    loop = job.open("training_loop", 0, app)
    for number, (start, end, data) in enumerate([(0, 10, 9), (10, 11, 0.5), (11, 12, 0.5)]):
        job.iteration(loop, number, start, end, data).end(end_time=at(end))
    loop.end(end_time=at(12))
    app.end(end_time=at(12))


def test_a_first_step_slow_from_its_batch_is_data_loading_not_startup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first iteration takes 10 s, 9 of them waiting for its batch; the others 1 s (0.5 s
    data). Its excess over the typical step (9 s) is mostly data loading, booked as such: startup
    is only its compute's excess, 1 - 0.5 s, and the other steps' compute stays productive."""
    ledger = run_job(tmp_path, monkeypatch, first_step_waits_for_its_batch, window=3)
    live = ledger.snapshot(at(12))
    assert live.badput_s["data_loading"] == pytest.approx(10.0, abs=1e-9)
    assert live.badput_s["program_startup"] == pytest.approx(0.5, abs=1e-9)  # not 9: 10 - 1
    assert live.productive_s == pytest.approx(1.5, abs=1e-9)  # 3 steps' compute, less 0.5 s
    assert live.goodput + sum(live.badput(c) for c in live.badput_s) == pytest.approx(1.0, abs=1e-12)
    expect(one_session(tmp_path), 1.5, data_loading=10.0, program_startup=0.5)


def first_step_then_uneven_ones(job: Job) -> None:
    """Four iterations (one window of 4), no data wait: 10 s, then 1, 2 and 4 s."""
    app = job.open("application", 0)
    loop = job.open("training_loop", 0, app)
    for number, (start, end) in enumerate([(0, 10), (10, 11), (11, 13), (13, 17)]):
        job.iteration(loop, number, start, end, 0).end(end_time=at(end))
    loop.end(end_time=at(17))
    app.end(end_time=at(17))


def test_startup_is_the_first_step_s_excess_over_the_median_of_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10 s against 1, 2 and 4 s: the median is 2 (the mean 2.33, the 40th percentile 1.8), so
    startup is 8 s, live and read back from the files alike."""
    ledger = run_job(tmp_path, monkeypatch, first_step_then_uneven_ones, window=4)
    live = ledger.snapshot(at(17))
    assert live.badput_s["program_startup"] == pytest.approx(8.0, abs=1e-9)
    assert live.productive_s == pytest.approx(9.0, abs=1e-9)
    expect(one_session(tmp_path), 9.0, program_startup=8.0)


def test_each_window_span_carries_its_productive_time_and_goodput(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a trace backend cannot derive (TraceQL metrics neither subtract nor divide
    attributes) is on the exported span itself, as the backend receives it."""
    from traintel.exporters.reader import iter_spans

    run_job(tmp_path, monkeypatch, clean_job)
    windows = [s.attributes for s in iter_spans([tmp_path]) if s.name == semconv.TRAINING_WINDOW_SPAN]
    # [20, 34]: 14 s of wall time, 8 productive; [34, 44]: 10 s, 7; [60, 68]: 8 s, 8
    assert [w[semconv.WINDOW_PRODUCTIVE_TIME] for w in windows] == pytest.approx([8, 7, 8], abs=1e-9)
    assert [w[semconv.WINDOW_GOODPUT] for w in windows] == pytest.approx([8 / 14, 7 / 10, 1.0], abs=1e-9)


def test_seconds_counters_per_goodput_category_equal_the_cli_job_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The monotonic counters a backend adds jobs up with hold the job's buckets as
    ``traintel goodput`` computes them from the files (``other`` is left to the backend: the job's
    time less the counted seconds), the job's wall time, its start and its last progress."""
    reader = InMemoryMetricReader()
    run_job(tmp_path, monkeypatch, clean_job, metric_readers=[reader])
    points: dict[str, list[tuple[dict[str, Any], float]]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if hasattr(point, "value"):  # counters and gauges
                        points.setdefault(metric.name, []).append((dict(point.attributes or {}), point.value))
    by_category = {a[semconv.GOODPUT_CATEGORY]: v for a, v in points[semconv.METRIC_GOODPUT_TIME]}
    (job,) = one_session(tmp_path).jobs
    assert by_category.pop("productive") == pytest.approx(job.productive_s, abs=1e-9)
    assert by_category == pytest.approx({c: job.badput_s.get(c, 0.0) for c in by_category}, abs=1e-9)
    assert set(by_category) == set(BADPUT_CATEGORIES) - {
        "wasted_progress",
        "infrastructure_recovery",
        "other",
    }
    ((_, total),) = points[semconv.METRIC_JOB_TIME]
    assert total == pytest.approx(job.total_s, abs=1e-9) == 100
    assert total - job.productive_s - sum(by_category.values()) == pytest.approx(
        job.badput_s["other"], abs=1e-9
    )
    ((_, start),) = points[semconv.METRIC_JOB_START_TIME]
    ((_, progress),) = points[semconv.METRIC_JOB_LAST_PROGRESS_TIME]
    assert (start, progress) == (
        pytest.approx(at(0) / 1e9),
        pytest.approx(at(68) / 1e9),
    )  # the last window ends at 68 s


def test_a_snapshot_taken_as_a_window_is_booked_sums_to_the_job_s_time() -> None:
    """The metric reader snapshots the ledger while the window pipeline's worker books a window
    (forced here between the snapshot's reads of the productive seconds). The snapshot read them
    twice: "other" was the time less the productive seconds before the window, the productive
    figure those after it, so goodput and badput summed to 13 s of a 10 s job (1.3)."""

    class BookedAsRead(GoodputLedger):
        """A ledger whose productive seconds, read once, are added to by a window right after."""

        book: WindowGoodput | None = None

        @property
        def productive_s(self) -> float:
            value: float = self.__dict__["productive"]
            window, self.book = self.book, None
            if window is not None:
                self._book([window])
            return value

        @productive_s.setter
        def productive_s(self, value: float) -> None:
            self.__dict__["productive"] = value

    def window(index: int, start_s: int) -> WindowGoodput:  # 4 iterations of 1 s, 0.25 s loading each
        return WindowGoodput(index, 4 * index, 4 * index + 3, 4, start_s * 10**9, (start_s + 4) * 10**9,
                             4.0, 1.0, 0.0)  # fmt: skip

    ledger = BookedAsRead()
    ledger.started(0)
    ledger._startup_decided = True
    ledger._book([window(0, 0)])
    ledger.book = window(1, 4)
    live = ledger.snapshot(10 * 10**9)
    assert live.total_s == 10.0
    assert (live.productive_s, live.badput_s["data_loading"], live.badput_s["other"]) == (3.0, 1.0, 6.0)
    assert live.productive_s + sum(live.badput_s.values()) == live.total_s
    assert ledger.snapshot(10 * 10**9).badput_s["other"] == 10 - 6 - 2  # the window booked


def test_the_step_time_deviation_gauge_is_one_window_s_over_its_own_ideal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The metric reader collects as the window pipeline's worker closes a window in the
    ledger: the job's ideal step time already includes the new window's 2 s steps (1.5 s), the
    last window is still the one before (1 s steps). The gauge divided the one by the other:
    -1/3, which neither window's record says (0.0, then 1/3)."""
    from opentelemetry.sdk.metrics import MeterProvider

    from traintel._aggregation.aggregator import RateInputs, TrainingAggregator
    from traintel._aggregation.window import ClosedWindow
    from traintel._sdk.instruments import TrainingInstruments

    ledger, aggregator, reader = GoodputLedger(), TrainingAggregator(0), InMemoryMetricReader()
    source = SimpleNamespace(
        goodput=ledger, samples_total=0.0, tokens_total=0.0, exported_iterations=0, unexported_iterations=0
    )
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    TrainingInstruments(provider, source, aggregator, lambda: 10**12)

    def deviation() -> dict[str, float]:
        data = reader.get_metrics_data()
        points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                  if m.name == semconv.METRIC_STEP_TIME_DEVIATION for p in m.data.data_points]  # fmt: skip
        return {p.attributes[semconv.STEP_TIME_QUANTILE]: p.value for p in points}

    def close(index: int, step_s: int) -> list[Any]:  # 100 steps of step_s (the ideal: exact)
        end = (index + 1) * 100 * step_s * 10**9
        rows: list[Any] = [
            (step_s * 10**9, None, None, None, None, None, None, None, None, 100 * index + i,
             end - (99 - i) * step_s * 10**9)
            for i in range(100)
        ]  # fmt: skip
        window = ClosedWindow(index, 100 * index, rows, 0, 0, 0, {}, 0.0, 0, 0, False)
        report = aggregator.close_window(window, RateInputs())
        assert report is not None
        return ledger.close_window(report, None, False)

    (first,) = close(0, 1)
    assert deviation()["p50"] == first.attributes()[semconv.STEP_TIME_DEVIATION_PREFIX + "p50"] == 0.0
    book = ledger._book
    seen: list[dict[str, float]] = []

    def collected_then_booked(ready: list[Any]) -> list[Any]:
        seen.append(deviation())
        return book(ready)

    monkeypatch.setattr(ledger, "_book", collected_then_booked)
    (second,) = close(1, 2)
    assert ledger.ideal_step_time_s == 1.5  # the mean of 100 steps of 1 s and 100 of 2 s
    assert seen == [{"p50": 0.0, "p90": 0.0, "p99": 0.0}]  # the first window's, over its own ideal
    p50 = second.attributes()[semconv.STEP_TIME_DEVIATION_PREFIX + "p50"]
    assert deviation()["p50"] == p50 == 2 / 1.5 - 1
    provider.shutdown()


def long_first_window(job: Job) -> None:
    """One window of 300 iterations in 40 s: the first 10 s, the others 0.1 s."""
    app = job.open("application", 0)
    loop = job.open("training_loop", 0, app)
    for number in range(300):
        start, end = (0.0, 10.0) if number == 0 else (9.9 + number / 10, 10.0 + number / 10)
        job.iteration(loop, number, start, end).end(end_time=at(end))
    loop.end(end_time=at(40))
    app.end(end_time=at(40))


def test_a_first_window_past_the_exact_range_has_its_ideal_step_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past 256 steps the ideal is recomputed from the sketch every 16 windows; a job whose
    first windows hold more than 256 steps (a fast loop: 30 s of 60 ms steps) had none until its
    16th window, so the step-time view of a short run was empty."""
    from traintel.exporters.reader import iter_spans

    run_job(tmp_path, monkeypatch, long_first_window, window=300)
    (window,) = [s.attributes for s in iter_spans([tmp_path]) if s.name == semconv.TRAINING_WINDOW_SPAN]
    assert window[semconv.WINDOW_PREFIX + "iterations"] == 300
    assert window[semconv.STEP_TIME_IDEAL] == pytest.approx(0.1, rel=0.01)  # the sketch's accuracy
    assert one_session(tmp_path).ideal_step_time_s == pytest.approx(0.1, rel=0.01)
