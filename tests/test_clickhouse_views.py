"""The ClickHouse views (deploy/clickhouse/traintel_views.sql) give `traintel goodput --json`'s
numbers: one definition, two engines.

Every goodput session the suite builds (tests/test_goodput.py: crafted spans at exact times;
tests/test_goodput_crash.py: real interpreters killed with SIGKILL on a counter clock) is written
by traintel's real pipeline to its files, loaded into the Collector `clickhouse` exporter's tables
in an embedded ClickHouse (chdb) row for row as the exporter writes them (tests/clickhouse_otel.py),
and the views are compared with the CLI on the same files: every bucket of every session and job
within 1 ms, and the counts and statuses exactly. A disagreement names the session and the bucket.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from tests import clickhouse_otel
from tests import test_goodput as crafted
from tests import test_goodput_crash as killed
from traintel import cli
from traintel.semconv import BADPUT_CATEGORIES

chdb_session = pytest.importorskip("chdb.session", reason="chdb (the test extra) is not installed")

VIEWS = Path(__file__).resolve().parent.parent / "deploy" / "clickhouse" / "traintel_views.sql"
TABLES = ("otel_traces", "otel_metrics_gauge", "otel_metrics_sum", "otel_metrics_histogram")
#: |Δ| allowed per bucket, in seconds.
TOLERANCE_S = 1e-3


@pytest.fixture(scope="module")
def clickhouse() -> Iterator[Any]:
    """One embedded ClickHouse for the module: the exporter's tables and traintel's views."""
    session = chdb_session.Session()
    for ddl in clickhouse_otel.DDL:
        session.query(ddl)
    for statement in clickhouse_otel.statements(VIEWS.read_text()):
        session.query(statement)
    yield session
    session.close()


# --- the sessions ---------------------------------------------------------------------------------
Builder = Callable[[Path, pytest.MonkeyPatch], None]


def _crafted(*jobs: tuple[Callable[..., None], dict[str, Any]]) -> Builder:
    def build(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        for job, options in jobs:
            crafted.run_job(directory, monkeypatch, job, **options)

    return build


def _killed(*jobs: tuple[str, str, int, float, dict[str, str]]) -> Builder:
    def build(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        for body, style, restart, start_s, env in jobs:
            killed.run_job(directory, body, style, restart, start_s, **env)
        # A backend holds what the collector got: the progress mark stays beside the file (the
        # backends' bound is the metric export interval of the seconds counters).
        killed.drop_marks(directory / "runs")

    return build


def _two_stages(application: bool) -> Builder:
    def build(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "off")  # (see the crafted test)
        crafted.run_job(directory, monkeypatch, lambda job: crafted.two_stages(job, application))

    return build


def _two_stages_killed(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "off")  # (see the crafted test)
    crafted.run_job(directory, monkeypatch, crafted.two_stages_killed)


def _killed_after_a_step_that_raised(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three 4 s iterations, then a fourth that raised; the job dies there (no end exported).
    The step that raised is no progress: not in the inferred tail, its time not productive."""

    def body(job: crafted.Job) -> None:
        loop = job.open("training_loop", 0, job.open("application", 0))
        for number, start in enumerate((0, 4, 8, 12)):
            span = job.iteration(loop, number, start, start + 4)
            if number == 3:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "OutOfMemoryError"))
            span.end(end_time=crafted.at(start + 4))

    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "off")  # (see the crafted test)
    crafted.run_job(directory, monkeypatch, body, window=3)


SESSIONS: dict[str, Builder] = {
    "clean": _crafted((crafted.clean_job, {})),
    "two loops and a validation, no application": _two_stages(False),
    "two loops and a validation in an application": _two_stages(True),
    "killed mid-window after a checkpoint, resumed": crafted.crashed_then_resumed,
    "killed mid-window after a checkpoint, launched again (same restart count)": crafted.launched_again,
    "several ranks": _crafted((crafted.clean_job, {"rank": 0}), (crafted.slower_rank, {"rank": 1})),
    "two sessions in one directory": _crafted(
        (crafted.clean_job, {"session": "alpha", "run_id": "a1"}),
        (lambda job: crafted.clean_job(job, offset=50), {"session": "beta", "run_id": "b1"}),
    ),
    "async checkpoint": _crafted((crafted.job_with_async_save, {})),
    "phases beside training": _crafted((crafted.beside_training_job, {})),
    "loops without an application, killed in the second": _two_stages_killed,
    "killed after a step that raised": _killed_after_a_step_that_raised,
    "first step waits for its batch": _crafted((crafted.first_step_waits_for_its_batch, {"window": 3})),
    "killed in its first window, resumed (traintel API)": _killed(
        (killed.KILLED_IN_FIRST_WINDOW, "traintel", 0, 0, {}), (killed.RESUMED, "traintel", 1, 80, {})
    ),
    "killed in its first window, resumed (plain OpenTelemetry)": _killed(
        (killed.KILLED_IN_FIRST_WINDOW, "otel", 0, 0, {}), (killed.RESUMED, "otel", 1, 80, {})
    ),
    "killed long after its last window, tail sampled": _killed(
        (killed.KILLED_LONG_AFTER_A_WINDOW, "traintel", 0, 0, {"TRAINTEL_WINDOW_MIN_SECONDS": "10"})
    ),
    "killed long after its last window, tail not exported": _killed(
        (
            killed.KILLED_LONG_AFTER_A_WINDOW,
            "traintel",
            0,
            0,
            {"TRAINTEL_WINDOW_MIN_SECONDS": "10", "TRAINTEL_EXPORT_ITERATIONS": "none"},
        )
    ),
    "killed with a sampled tail": _killed(
        (
            killed.KILLED_WITH_A_SAMPLED_TAIL,
            "traintel",
            0,
            0,
            {"TRAINTEL_WINDOW_MIN_SECONDS": "10", "TRAINTEL_LOG_EVERY_N_ITERATIONS": "8"},
        )
    ),
    "late exit flush": _killed(
        (killed.LATE_END, "otel", 0, 0, {}), (killed.RESUMED_UNTIL_150, "otel", 1, 100, {})
    ),
    "restarted in its process from a checkpoint": _killed(
        (killed.NUMBERED + killed.RESTARTED_IN_PROCESS, "traintel", 0, 0, {})
    ),
    "rolled back in its loop to a checkpoint": _killed(
        (killed.NUMBERED + killed.ROLLED_BACK_IN_ITS_LOOP, "otel", 0, 0, {})
    ),
    "numbered per epoch": _killed(
        (
            killed.NUMBERED + killed.NUMBERED_PER_EPOCH,
            "traintel",
            0,
            0,
            {"TRAINTEL_LOG_EVERY_N_ITERATIONS": "6"},
        ),
    ),
}


def cli_goodput(directory: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert cli.main(["goodput", str(directory), "--json"]) == 0
    sessions: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["sessions"]
    return sessions


def rows(clickhouse: Any, query: str) -> list[dict[str, Any]]:
    text = clickhouse.query(query, "JSONEachRow").bytes().decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load(clickhouse: Any, directory: Path) -> dict[str, int]:
    for table in TABLES:
        clickhouse.query(f"TRUNCATE TABLE {table}")
    return clickhouse_otel.load(clickhouse, [directory])


# --- the comparison -------------------------------------------------------------------------------
def disagreements(where: str, cli: dict[str, Any], sql: dict[str, Any]) -> list[str]:
    """Every figure of one session or job on which the engines differ, named."""
    out = []
    expected = {
        "total_seconds": cli["total_seconds"],
        "productive_seconds": cli["productive_seconds"],
        **{f"{c}_seconds": cli["badput_seconds"].get(c, 0.0) for c in BADPUT_CATEGORIES},
    }
    for name, value in expected.items():
        if abs(float(sql[name]) - value) > TOLERANCE_S:
            out.append(f"{where}: {name} is {sql[name]} in ClickHouse, {value} in `traintel goodput`")
    if abs(float(sql["goodput"]) - cli["goodput"]) > TOLERANCE_S / max(cli["total_seconds"], 1.0):
        out.append(
            f"{where}: goodput is {sql['goodput']} in ClickHouse, {cli['goodput']} in `traintel goodput`"
        )
    for name in ("start_unix_nano", "end_unix_nano", "last_iteration"):
        if (None if sql[name] is None else int(sql[name])) != cli[name]:
            out.append(f"{where}: {name} is {sql[name]} in ClickHouse, {cli[name]} in `traintel goodput`")
    return out


def session_disagreements(cli: dict[str, Any], sql: dict[str, Any]) -> list[str]:
    where = f"session {cli['session']!r}"
    out = disagreements(where, cli, sql)
    for name in ("scheduling_gap_seconds",):
        if abs(float(sql[name]) - cli[name]) > TOLERANCE_S:
            out.append(f"{where}: {name} is {sql[name]} in ClickHouse, {cli[name]} in `traintel goodput`")
    for name in ("disruptions",):
        if int(sql[name]) != cli[name]:
            out.append(f"{where}: {name} is {sql[name]} in ClickHouse, {cli[name]} in `traintel goodput`")
    if int(sql["jobs"]) != len(cli["jobs"]):
        out.append(f"{where}: {sql['jobs']} jobs in ClickHouse, {len(cli['jobs'])} in `traintel goodput`")
    return out


def job_disagreements(session: str, cli: dict[str, Any], sql: dict[str, Any]) -> list[str]:
    where = f"session {session!r}, job {cli['run_id']!r} restart {cli['restart']}"
    out = disagreements(where, cli, sql)
    tail = cli["inferred_tail"] or {"exported_iterations": 0, "missing_iterations": 0}
    exact = {
        "status": cli["status"],
        "first_iteration": cli["first_iteration"],
        "resumed_from": cli["resumed_from"],
        "ranks": sorted(cli["ranks"]),
        "rank_used": cli["rank_used"],
        "inferred_tail_exported_iterations": tail["exported_iterations"],
        "inferred_tail_missing_iterations": tail["missing_iterations"],
    }
    got = {**sql, "ranks": sorted(sql["ranks"])}
    out += [
        f"{where}: {name} is {got[name]!r} in ClickHouse, {value!r} in `traintel goodput`"
        for name, value in exact.items()
        if got[name] != value
    ]
    return out


@pytest.mark.parametrize("name", list(SESSIONS))
@pytest.mark.process
def test_views_equal_the_cli_on_every_bucket(
    name: str,
    clickhouse: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    SESSIONS[name](tmp_path, monkeypatch)
    directory = tmp_path / "runs" if (tmp_path / "runs").is_dir() else tmp_path
    loaded = load(clickhouse, directory)
    assert loaded["otel_traces"] > 0
    expected = {s["session"]: s for s in cli_goodput(directory, capsys)}
    sessions = {r["session"]: r for r in rows(clickhouse, "SELECT * FROM traintel_session_goodput")}
    jobs = rows(clickhouse, "SELECT * FROM traintel_job_goodput ORDER BY session, position")
    assert set(sessions) == set(expected), name
    problems: list[str] = []
    for session, cli_session in expected.items():
        problems += session_disagreements(cli_session, sessions[session])

        # (a job launched again has the run id and restart count of the first: its start tells it)
        def job_key(job: dict[str, Any]) -> tuple[Any, ...]:
            return job["run_id"], job["restart"], job["start_unix_nano"]

        sql_jobs = {job_key(j): j for j in jobs if j["session"] == session}
        for cli_job in cli_session["jobs"]:
            sql_job = sql_jobs.get(job_key(cli_job))
            if sql_job is None:
                problems.append(f"session {session!r}: job {cli_job['run_id']!r} missing in ClickHouse")
                continue
            problems += job_disagreements(session, cli_job, sql_job)
    assert not problems, f"{name}:\n" + "\n".join(problems)


# --- stragglers and checkpoints, against `traintel report` ---------------------------------------
def slow_rank(job: crafted.Job) -> None:
    """``clean_job``'s timeline with every iteration 50 % longer than on the other ranks."""
    app = job.open("application", 0)
    loop = job.open("training_loop", 20, app)
    for number, (start, end) in enumerate([(20, 35), (35, 41), (41, 47), (47, 53), (60, 66), (66, 72)]):
        job.iteration(loop, number, start, end).end(end_time=crafted.at(end))
    loop.end(end_time=crafted.at(80))
    app.end(end_time=crafted.at(100))


def report(directory: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert cli.main(["report", str(directory), "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_stragglers_view_names_the_ranks_the_report_names(
    clickhouse: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank, job in ((0, crafted.clean_job), (1, slow_rank), (2, crafted.slower_rank)):
        crafted.run_job(tmp_path, monkeypatch, job, rank=rank)
    load(clickhouse, tmp_path)
    expected = report(tmp_path, capsys)["cross_rank"]["windows"]
    got = rows(clickhouse, "SELECT * FROM traintel_stragglers ORDER BY run_id, restart, window_index")
    assert [r["ranks"] for r in got] == [3, 3, 2]  # the third rank ran 4 iterations, not 6
    assert [(f"{r['run_id']}/{r['restart']}", r["window_index"]) for r in got] == [
        (w["job"], w["window"]) for w in expected
    ]
    for row, window in zip(got, expected, strict=True):
        assert row["slowest_rank"] == window["slowest_rank"] == 1
        assert row["ranks"] == window["ranks"]
        assert row["median_seconds"] == pytest.approx(window["iteration_time"]["median"], abs=1e-9)
        assert row["slowest_seconds"] == pytest.approx(window["iteration_time"]["max"], abs=1e-9)
        assert row["lag_ratio"] == pytest.approx(
            window["iteration_time"]["max"] / window["iteration_time"]["median"], abs=1e-9
        )


@pytest.mark.process
def test_stragglers_view_finds_the_rank_ddp_waits_for(clickhouse: Any, tmp_path: Path) -> None:
    """Two real ranks under DDP over gloo, rank 1 slower before the all-reduce (tests/test_ranks.py):
    their iteration times come out equal, so the view compares the compute time each rank spent
    before the collective, as the live exchange does, and names rank 1 in every window with the
    exchange's own figures. The job is launched twice under the same run id and restart count:
    each launch's windows stay its own, as its job does in traintel_job_goodput."""
    from tests.rank_helpers import run_ranks
    from tests.test_ranks import DDP_JOB, DELAY, R, ok
    from traintel import semconv

    updates = []
    for launch in ("first", "again"):
        (tmp_path / launch).mkdir()
        ranks = ok(
            run_ranks(
                f"DELAY = {DELAY}\n" + DDP_JOB, tmp_path / launch, TRAINTEL_LOG_EVERY_N_ITERATIONS="4",
                TRAINTEL_RUN_ID="ddp-run", TRAINTEL_WARMUP_ITERATIONS="0",  # (slow from its first step)
            )
        )  # fmt: skip
        updates += ranks[0].events(semconv.Event.RANKS_METRICS_UPDATE.value)
    for table in TABLES:
        clickhouse.query(f"TRUNCATE TABLE {table}")
    clickhouse_otel.load(clickhouse, [tmp_path / "first", tmp_path / "again"])
    got = rows(clickhouse, "SELECT * FROM traintel_stragglers ORDER BY launch, window_index")
    assert [(r["launch"], r["window_index"]) for r in got] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert [u[R + "window.index"] for u in updates] == [0, 1, 2, 0, 1, 2]
    for row, update in zip(got, updates, strict=True):
        assert (row["run_id"], row["restart"], row["ranks"], row["measure"]) == ("ddp-run", 0, 2, "compute")
        assert row["slowest_rank"] == update[semconv.STRAGGLER_RANK] == 1
        assert row["slowest_seconds"] == pytest.approx(update[R + "compute_time.max"], rel=1e-9)
        assert row["fastest_seconds"] == pytest.approx(update[R + "compute_time.min"], rel=1e-9)
        assert row["median_seconds"] == pytest.approx(update[R + "compute_time.median"], rel=1e-9)


@pytest.mark.process
def test_the_benchmark_times_views_that_agree_with_the_cli() -> None:
    """benchmarks/bench_backend_views.py, small: its generated session reads the same in both."""
    import subprocess
    import sys

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_backend_views.py"
    result = subprocess.run(
        [sys.executable, str(bench), "--ranks", "2", "--windows", "20"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "largest bucket difference 0.000 ms" in result.stdout


def test_checkpoints_view_sums_to_the_reports_checkpoint_figures(
    clickhouse: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    crafted.run_job(tmp_path, monkeypatch, crafted.clean_job, rank=0)
    crafted.run_job(tmp_path, monkeypatch, crafted.job_with_async_save, run_id="job-b")
    load(clickhouse, tmp_path)
    expected = report(tmp_path, capsys)
    checkpoints = expected["checkpoints"]
    saves = rows(
        clickhouse, "SELECT * FROM traintel_checkpoints WHERE operation = 'save' ORDER BY start_unix_nano"
    )
    loads = rows(clickhouse, "SELECT * FROM traintel_checkpoints WHERE operation = 'load'")
    assert len(saves) == checkpoints["saves"] == 2 and len(loads) == checkpoints["loads"] == 1
    assert sum(s["seconds"] for s in saves) == pytest.approx(checkpoints["save_time_total_s"], abs=1e-9)
    assert max(s["seconds"] for s in saves) == pytest.approx(checkpoints["save_time_max_s"], abs=1e-9)
    assert sorted(s["seconds"] for s in saves) == [1.0, 6.0]
    stages: dict[str, float] = {}
    for save in saves:
        for stage, seconds in save["stages"]:
            stages[stage] = stages.get(stage, 0.0) + seconds
    assert stages == checkpoints["stages_s"] == {"finalize": 8.0}
    assert loads[0]["seconds"] == 5.0


ASYNC_SAVES = """
import threading, time, traintel
with traintel.application():
    with traintel.training_loop(train_iterations_start=0):
        for i in range(6):
            with traintel.training_iteration(samples=4):
                time.sleep(0.002)
            if i in (1, 3):
                save = traintel.checkpoint_save(strategy="async", iteration=i)
                with save:
                    completion = save.completion()
                error = None if i == 1 else OSError(28, "No space left on device")
                writer = threading.Thread(target=lambda c=completion, e=error: (time.sleep(0.01),
                                          c.finish(size_bytes=4096, error=e)))
                writer.start()
                writer.join()
"""


@pytest.mark.process
def test_an_async_save_s_write_is_its_stage_and_its_failure_in_the_checkpoints_view(
    clickhouse: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """traintel's own async saves, in a training loop: the finalize span (the background write)
    is parented on the loop and linked to its save. The view joined stages by parent only, so
    the write was no stage of its save, and a save whose write failed read ``failed = false``;
    both now agree with the report (its ``failed_saves`` and ``stages_s``)."""
    from tests.subprocess_helpers import run_python

    done = run_python(ASYNC_SAVES, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr
    load(clickhouse, tmp_path / "runs")
    expected = report(tmp_path / "runs", capsys)["checkpoints"]
    saves = rows(clickhouse, "SELECT * FROM traintel_checkpoints ORDER BY start_unix_nano")
    assert [(s["iteration"], s["failed"]) for s in saves] == [(1, 0), (3, 1)]
    assert sum(s["failed"] for s in saves) == expected["failed_saves"] == 1
    assert [[stage for stage, _ in s["stages"]] for s in saves] == [["finalize"], ["finalize"]]
    written = sum(seconds for s in saves for _, seconds in s["stages"])
    assert written == pytest.approx(expected["stages_s"]["finalize"], abs=1e-9)
