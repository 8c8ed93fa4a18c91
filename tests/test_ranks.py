"""Cross-rank statistics and stragglers with 2 real processes (gloo on 127.0.0.1, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rank_helpers import RankResult, run_ranks
from traintel import semconv

pytest.importorskip("torch.distributed")

R = semconv.RANKS_PREFIX
DELAY = 0.1  # seconds rank 1 sleeps inside each forward

DDP_JOB = """
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
from traintel.distributed import watch_ddp
watch_ddp(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
with traintel.training_loop():
    for i in range(12):
        with traintel.training_iteration():
            with traintel.model_forward():
                if RANK == 1:
                    time.sleep(DELAY)
                loss = model(x).sum()
            with traintel.model_backward():
                loss.backward()
            with traintel.optimizer_update():
                optimizer.step()
                optimizer.zero_grad()
traintel.shutdown()
dist.destroy_process_group()
"""


def ok(results: list[RankResult]) -> list[RankResult]:
    for result in results:
        assert result.returncode == 0, f"rank {result.rank}:\n{result.stderr[-3000:]}"
    return results


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> list[RankResult]:
    tmp = tmp_path_factory.mktemp("ddp")
    return ok(run_ranks(f"DELAY = {DELAY}\n" + DDP_JOB, tmp, TRAINTEL_LOG_EVERY_N_ITERATIONS="4"))


def test_ddp_equalises_iteration_times_but_the_straggler_is_rank_1(ddp: list[RankResult]) -> None:
    for result in ddp:
        updates = result.events(semconv.Event.RANKS_METRICS_UPDATE.value)
        assert [u[R + "window.index"] for u in updates] == [0, 1, 2]
        for update in updates:
            assert update[R + "count"] == 2
            assert update[R + "compute_mode"] == "sync_point"
            assert update[R + "top_k"] == [1, 0]
            assert update[semconv.STRAGGLER_RANK] == 1
        for update in updates[1:]:  # window 0 holds the first iteration's one-off set-up costs
            # The all-reduce makes rank 0 wait for rank 1: iteration times come out equal...
            assert update[R + "iteration_time.max"] - update[R + "iteration_time.min"] < 0.3 * DELAY
            assert update[R + "iteration_time.min"] >= DELAY
            # ...but compute before the collective differs by the injected delay.
            assert update[R + "compute_time.max"] >= DELAY
            assert update[R + "compute_time.min"] < 0.01
            spread = update[R + "compute_time.max"] - update[R + "compute_time.min"]
            assert DELAY - 0.01 < spread < DELAY + 0.01
            assert update[R + "top_k.compute_time"] == [
                update[R + "compute_time.max"],
                update[R + "compute_time.min"],
            ]
        stragglers = result.events(semconv.Event.STRAGGLER.value)
        assert [s[semconv.STRAGGLER_RANK] for s in stragglers] == [1, 1, 1]
        assert all(s[semconv.STRAGGLER_COMPUTE_TIME] >= DELAY for s in stragglers)
        assert all(s[semconv.STRAGGLER_CHRONIC] for s in stragglers)


def test_each_ranks_own_window_shows_equal_iteration_times(ddp: list[RankResult]) -> None:
    """The per-rank view (the window event) cannot tell the ranks apart: why compute is needed."""
    means = []
    for result in ddp:
        windows = result.events(semconv.Event.TRAINING_METRICS_UPDATE.value)
        means.append(windows[-1][semconv.WINDOW_PREFIX + "iteration_time.mean"])
    assert abs(means[0] - means[1]) < 0.3 * DELAY


def test_job_level_metrics(ddp: list[RankResult]) -> None:
    rank0, rank1 = ddp
    counted = rank0.metric_points(semconv.METRIC_STRAGGLERS)
    assert counted and counted[-1][1] == {semconv.STRAGGLER_RANK: 1} and counted[-1][2] == 3
    assert not rank1.metric_points(semconv.METRIC_STRAGGLERS)  # the counter is rank 0's alone
    compute = {
        a[semconv.STATISTIC]: v for _, a, v in rank0.metric_points(semconv.METRIC_RANKS_COMPUTE_DURATION)
    }
    assert set(compute) == {"min", "median", "max", "p99"} and compute["max"] >= DELAY
    ewma = [v for _, _, v in rank1.metric_points(semconv.METRIC_RANK_COMPUTE_EWMA)]
    assert ewma and ewma[-1] >= DELAY


KILLED_JOB = """
traintel.configure()
x = torch.randn(64, 64)
with traintel.training_loop():
    for i in range(40):
        with traintel.training_iteration():
            with traintel.model_forward():
                (x @ x).sum()
                time.sleep(0.02)
            if RANK == 1 and i == 10:
                os.kill(os.getpid(), 9)
loop_done = time.monotonic()
traintel.shutdown()
print("SURVIVED", flush=True)
os._exit(0)  # the default group's teardown would wait for the dead rank
"""


def test_a_killed_rank_does_not_hang_the_survivor(tmp_path: Path) -> None:
    timeout = 3.0
    rank0, rank1 = run_ranks(
        KILLED_JOB, tmp_path, timeout=60, TRAINTEL_LOG_EVERY_N_ITERATIONS="2",
        TRAINTEL_CROSS_RANK_TIMEOUT=str(timeout),
    )  # fmt: skip
    assert rank1.returncode == -9
    assert rank0.returncode == 0, rank0.stderr[-3000:]
    assert "SURVIVED" in rank0.stdout
    assert "cross-rank exchange stopped on rank 0" in rank0.stderr
    loop = next(s for s in rank0.spans() if s.name == semconv.Phase.TRAINING_LOOP.value)
    assert loop.duration_s < 40 * 0.02 + timeout  # 40 iterations of ~20 ms, never blocked for long
    updates = rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert updates and all(u[R + "window.index"] <= 5 for u in updates)
    windows = rank0.events(semconv.Event.TRAINING_METRICS_UPDATE.value)
    assert windows[-1][semconv.WINDOW_PREFIX + "last_iteration"] == 39  # its own telemetry goes on


HUNG_JOB = """
traintel.configure()
x = torch.randn(64, 64)
with traintel.training_loop():
    for i in range(30):
        with traintel.training_iteration():
            with traintel.model_forward():
                (x @ x).sum()
                time.sleep(0.02)
                if RANK == 1 and i == 10:
                    time.sleep(HANG)  # hung, not dead: its exchange never joins in time
started = time.monotonic()
traintel.shutdown()
print(f"SHUTDOWN {time.monotonic() - started:.3f}", flush=True)
os._exit(0)
"""


def test_a_hung_rank_times_the_exchange_out_and_training_goes_on(tmp_path: Path) -> None:
    timeout, hang = 1.0, 4.0
    rank0, rank1 = run_ranks(
        f"HANG = {hang}\n" + HUNG_JOB, tmp_path, timeout=60, TRAINTEL_LOG_EVERY_N_ITERATIONS="10",
        TRAINTEL_CROSS_RANK_TIMEOUT=str(timeout),
    )  # fmt: skip
    assert rank0.returncode == 0 and rank1.returncode == 0, rank0.stderr[-2000:] + rank1.stderr[-2000:]
    # Window 0 was exchanged; window 1's gather waited for the hung rank and timed out.
    (stopped,) = [
        line for line in rank0.stderr.splitlines() if "cross-rank exchange stopped on rank 0" in line
    ]
    assert "timed out" in stopped.lower(), stopped
    assert [u[R + "window.index"] for u in rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)] == [0]
    loop = next(s for s in rank0.spans() if s.name == semconv.Phase.TRAINING_LOOP.value)
    # Rank 0 never waited for the hung rank beyond the exchange timeout (its own work: ~0.6 s).
    assert loop.duration_s < 30 * 0.02 + timeout + 1.0 < hang


BLOCKED_JOB = """
from torch.nn.parallel import DistributedDataParallel as DDP
traintel.configure()
model = DDP(torch.nn.Linear(16, 4))
x = torch.randn(8, 16)
with traintel.training_loop():
    for i in range(6):
        with traintel.training_iteration():
            with traintel.model_forward():
                if RANK == 1 and i == 3:
                    print(f"BLOCKED {time.time_ns()}", flush=True)
                    time.sleep(BLOCK)  # rank 0 meanwhile waits in backward's all-reduce
                loss = model(x).sum()
            with traintel.model_backward():
                loss.backward()
traintel.shutdown()
dist.destroy_process_group()
"""


def test_a_blocked_rank_is_named_by_its_heartbeat_within_the_reader_interval(tmp_path: Path) -> None:
    interval, block = 0.5, 2.0
    results = ok(
        run_ranks(
            f"BLOCK = {block}\n" + BLOCKED_JOB,
            tmp_path,
            OTEL_METRIC_EXPORT_INTERVAL=str(int(interval * 1000)),
        )
    )
    blocked_at = int(
        next(line for line in results[1].stdout.splitlines() if line.startswith("BLOCKED")).split()[1]
    )
    # Inside an iteration the gauge names it and its last completed step phase: rank 1 none yet
    # (stuck in forward), rank 0 forward (stuck in backward, i.e. in the all-reduce).
    for result, after in ((results[1], None), (results[0], "model_forward")):
        seconds = result.metric_points(semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS)
        phases = {t: a for t, a, _ in result.metric_points(semconv.METRIC_HEARTBEAT_PHASE)}
        during = [(t, v) for t, _, v in seconds if blocked_at < t < blocked_at + block * 1e9]
        assert during, f"rank {result.rank}: no heartbeat while blocked"
        # The first collection after the block began already shows where the rank is stuck...
        first_t, _ = during[0]
        assert first_t - blocked_at <= (interval + 0.5) * 1e9
        assert phases[first_t][semconv.PHASE] == "training_iteration"
        assert phases[first_t].get(semconv.HEARTBEAT_AFTER) == after
        iterations = {t: v for t, _, v in result.metric_points(semconv.METRIC_HEARTBEAT_ITERATION)}
        assert iterations[first_t] == 2
        # ...and the gauge keeps growing with the time stuck.
        last_t, last_v = during[-1]
        assert last_v >= (last_t - blocked_at) / 1e9 - 0.1
        assert last_v > block / 2


SCALE_JOB = """
from traintel.distributed import mark_sync_point
traintel.configure()
x = torch.randn(64, 64)
with traintel.training_loop():
    for i in range(12):
        with traintel.training_iteration():
            with traintel.data_loading():
                time.sleep(0.01)
            with traintel.model_forward():
                (x @ x).sum()
                if RANK == 1:
                    time.sleep(DELAY)
            mark_sync_point()  # no DDP: the user's own collective follows
            dist.all_reduce(torch.ones(4))
            if RANK == 1 and i == 9:
                traintel.record_metrics(loss=float("nan"))
            if RANK == 1 and i == 11:
                time.sleep(SLOW)  # after the collective: slow on rank 1 alone
        if i == 5:
            with traintel.checkpoint_save(size_bytes=1000):
                time.sleep(0.01)
traintel.shutdown()
dist.destroy_process_group()
"""

#: What rank 0 exports of SCALE_JOB and a rank reduced to its anomalies does not.
WINDOW_SERIES = {
    semconv.METRIC_ITERATION_DURATION,
    semconv.METRIC_DATA_LOADING_DURATION,
    semconv.METRIC_PHASE_DURATION,
    semconv.METRIC_CHECKPOINT_SAVE_DURATION,
    semconv.METRIC_CHECKPOINT_SIZE,
    semconv.METRIC_STEP_PHASE_TIME,
    semconv.METRIC_GOODPUT,
    semconv.METRIC_BADPUT,
    semconv.METRIC_STEP_TIME_IDEAL,
    semconv.METRIC_STEP_TIME_DEVIATION,
}


def exported_iterations(result: RankResult) -> dict[int, str]:
    return {
        s.attributes[semconv.ITERATION]: s.attributes[semconv.SAMPLING_REASON]
        for s in result.spans()
        if s.name == semconv.Phase.TRAINING_ITERATION.value
    }


def test_scale_mode_rank_0_exports_the_job_the_other_ranks_their_anomalies(tmp_path: Path) -> None:
    delay = 0.05
    rank0, rank1 = ok(
        run_ranks(
            f"DELAY = {delay}\nSLOW = 0.6\n" + SCALE_JOB, tmp_path, TRAINTEL_LOG_EVERY_N_ITERATIONS="4",
            TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE="1", TRAINTEL_SLOW_ITERATION_FACTOR="5",
            OTEL_METRIC_EXPORT_INTERVAL="300",  # collections during the run too (the heartbeat's)
        )
    )  # fmt: skip
    updates = rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert [u[R + "window.index"] for u in updates] == [0, 1, 2]
    last = updates[-1]
    assert last[R + "top_k"] == [1, 0] and last[R + "compute_mode"] == "sync_point"
    # The explicit sync point: compute excludes the data wait, the all-reduce and what follows.
    assert 0.01 <= last[R + "data_loading_time.min"] < 0.02
    assert delay <= last[R + "compute_time.max"] < delay + 0.01
    assert last[R + "compute_time.min"] < 0.01
    assert [s[semconv.STRAGGLER_RANK] for s in rank0.events(semconv.Event.STRAGGLER.value)] == [1, 1, 1]
    assert rank0.metric_points(semconv.METRIC_RANKS_COMPUTE_DURATION)
    # Rank 0 is unchanged: its first 10 iterations, its window events and window series.
    assert {i: r for i, r in exported_iterations(rank0).items() if r == "first"} == dict.fromkeys(
        range(10), "first"
    )
    assert len(rank0.events(semconv.Event.TRAINING_METRICS_UPDATE.value)) == 3
    assert rank0.metric_names() >= WINDOW_SERIES, WINDOW_SERIES - rank0.metric_names()
    (loop0,) = [s for s in rank0.spans() if s.name == semconv.Phase.TRAINING_LOOP.value]
    assert semconv.SUMMARY_RANK_EXPORT not in loop0.attributes
    # Rank 1 exports only its anomalies: the non-finite and the slow iteration (whole), its
    # straggler events and lagging EWMA, the loop they hang from, its checkpoint, its goodput
    # records (training_window), its heartbeat; no window events, no window series.
    assert exported_iterations(rank1) == {9: "nonfinite", 11: "slow"}
    spans = rank1.spans()
    assert sorted({s.name for s in spans}) == [
        "checkpoint_save_sync", "data_loading", "model_forward", "training_iteration", "training_loop",
        "training_window",
    ]  # fmt: skip
    assert len([s for s in spans if s.name == "training_window"]) == 3
    (loop1,) = [s for s in spans if s.name == semconv.Phase.TRAINING_LOOP.value]
    assert sorted(e.name for e in loop1.events) == [
        "nonfinite_metric", "slow_iteration", "straggler", "straggler", "straggler"
    ]  # fmt: skip
    assert [s[semconv.STRAGGLER_RANK] for s in rank1.events(semconv.Event.STRAGGLER.value)] == [1, 1, 1]
    assert loop1.attributes[semconv.SUMMARY_RANK_EXPORT] == semconv.RANK_EXPORT_ANOMALIES_ONLY
    assert loop1.attributes[semconv.SUMMARY_PREFIX + "iterations"] == 12  # the summary stays
    (checkpoint,) = [s for s in spans if s.name == "checkpoint_save_sync"]
    assert [e.name for e in checkpoint.events] == ["save_checkpoint_success", "checkpoint_metrics_update"]
    assert {n for n in rank1.metric_names() if n.startswith("ml.training.")} == {
        semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS,
        semconv.METRIC_HEARTBEAT_ITERATION,
        semconv.METRIC_HEARTBEAT_PHASE,
        semconv.METRIC_RANK_COMPUTE_EWMA,
    }
    assert rank1.metric_points(semconv.METRIC_RANK_COMPUTE_EWMA)[-1][2] >= delay
    # Offline, the report takes the job's statistics from rank 0's live events.
    from traintel.analysis.ranks import CrossRankTable

    table = CrossRankTable()
    for result in (rank0, rank1):
        for span in result.spans():
            for event in span.events:
                table.add_event("job", result.rank, event.name, event.attributes)
    rows = table.rows()
    assert [(w["window"], w["first_iteration"], w["last_iteration"], w["ranks"]) for w in rows] == [
        (0, 0, 3, 2), (1, 4, 7, 2), (2, 8, 11, 2)
    ]  # fmt: skip
    assert rows[-1]["iteration_time"] == {
        s: last[f"{R}iteration_time.{s}"] for s in ("min", "median", "max", "p99")
    }


SPAWNED_JOB = """
traintel.configure()  # before the process group, no RANK in the environment: world unknown
dist.init_process_group("gloo", init_method=INIT, rank=RANK, world_size=2)
x = torch.randn(64, 64)
with traintel.training_loop():
    for i in range(8):
        with traintel.training_iteration():
            with traintel.model_forward():
                (x @ x).sum()
            dist.all_reduce(torch.ones(4))
traintel.shutdown()
dist.destroy_process_group()
"""


def test_scale_mode_is_decided_from_torch_distributed_at_the_first_window(tmp_path: Path) -> None:
    rank0, rank1 = ok(
        run_ranks(
            SPAWNED_JOB, tmp_path, spawn=True, TRAINTEL_LOG_EVERY_N_ITERATIONS="4",
            TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE="2", TRAINTEL_EXPORT_FIRST_ITERATIONS="2",
        )
    )  # fmt: skip
    for result in (rank0, rank1):
        assert exported_iterations(result) == {0: "first", 1: "first"}  # before anyone knew
    assert len(rank0.events(semconv.Event.TRAINING_METRICS_UPDATE.value)) == 2
    assert len(rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)) == 2
    assert semconv.METRIC_ITERATION_DURATION in rank0.metric_names()
    # Rank 1 learnt its rank at the first window boundary: that window's event is already cut,
    # and so are the per-iteration values buffered before it (no collection ran meanwhile).
    assert not rank1.events(semconv.Event.TRAINING_METRICS_UPDATE.value)
    assert not rank1.events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert not {n for n in rank1.metric_names() if n.startswith("ml.training.")} - {
        semconv.METRIC_RANK_COMPUTE_EWMA,
        *(n for n in rank0.metric_names() if ".heartbeat." in n),
    }
    (loop,) = [s for s in rank1.spans() if s.name == semconv.Phase.TRAINING_LOOP.value]
    assert loop.attributes[semconv.SUMMARY_RANK_EXPORT] == semconv.RANK_EXPORT_ANOMALIES_ONLY


def test_the_report_merges_the_rank_files_into_cross_rank_statistics(
    ddp: list[RankResult], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from traintel import cli

    dirs = [str(result.out_dir) for result in ddp]
    assert cli.main(["report", *dirs, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["cross_rank"]
    windows = data["windows"]
    assert [(w["window"], w["first_iteration"], w["last_iteration"], w["ranks"]) for w in windows] == [
        (0, 0, 3, 2), (1, 4, 7, 2), (2, 8, 11, 2)
    ]  # fmt: skip
    # Recomputed from each rank's own window events: the same per-rank means as the live view.
    per_rank = [
        [e[semconv.WINDOW_PREFIX + "iteration_time.mean"] for e in r.events("training_metrics_update")]
        for r in ddp
    ]
    for window, a, b in zip(windows, *per_rank, strict=True):
        assert window["iteration_time"]["min"] == min(a, b) and window["iteration_time"]["max"] == max(a, b)
        assert window["iteration_time"]["median"] == pytest.approx((a + b) / 2)
        assert window["compute_time"]["max"] >= DELAY and window["straggler_rank"] == 1
        assert window["top_k"] == [1, 0]
    # Both ranks carried the same straggler events: counted once per window.
    assert [(s["window"], s["rank"]) for s in data["stragglers"]] == [(0, 1), (1, 1), (2, 1)]
    assert cli.main(["report", *dirs]) == 0
    text = capsys.readouterr().out
    assert "Across ranks, per window" in text and "rank 1" in text
