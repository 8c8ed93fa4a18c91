"""Cross-rank statistics and stragglers with 2 real processes (gloo on 127.0.0.1, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rank_helpers import RankResult, run_ranks
from traintel import semconv
from traintel.distributed.exchange import PRESENCE_WAIT_S

pytestmark = [pytest.mark.process, pytest.mark.xdist_group("ranks")]  # the suite's tiers: tests/tiers.py

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
    # Rank 1's delay is there from its first iteration: no warm-up (a window that holds one names
    # no straggler), so every window names it.
    job = f"DELAY = {DELAY}\n" + DDP_JOB
    return ok(run_ranks(job, tmp, TRAINTEL_LOG_EVERY_N_ITERATIONS="4", TRAINTEL_WARMUP_ITERATIONS="0"))


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
            # Rank 1 slept DELAY inside its compute, before the collective: a floor no load lowers.
            assert update[R + "compute_time.max"] >= DELAY
            # The all-reduce makes rank 0 wait for rank 1: iteration times come out closer
            # together than compute before the collective, which keeps the injected delay...
            iteration_spread = update[R + "iteration_time.max"] - update[R + "iteration_time.min"]
            spread = update[R + "compute_time.max"] - update[R + "compute_time.min"]
            assert iteration_spread < spread
            # ...and no more than it: compute is part of each rank's own iteration, so the gap is
            # at least the delay less the fast rank's compute, at most the slow rank's iteration.
            assert DELAY - update[R + "compute_time.min"] <= spread <= update[R + "iteration_time.max"]
            assert update[R + "top_k.compute_time"] == [
                update[R + "compute_time.max"],
                update[R + "compute_time.min"],
            ]
        stragglers = result.events(semconv.Event.STRAGGLER.value)
        assert [s[semconv.STRAGGLER_RANK] for s in stragglers] == [1, 1, 1]
        assert all(s[semconv.STRAGGLER_COMPUTE_TIME] >= DELAY for s in stragglers)
        assert all(s[semconv.STRAGGLER_CHRONIC] for s in stragglers)


def test_a_rank_that_compiles_longer_in_its_first_iteration_is_no_straggler(tmp_path: Path) -> None:
    """Rank 1's first iteration takes DELAY longer (a cache miss, a longer compile), then the
    ranks step alike: window 0 holds that warm-up, and no window names a straggler (before:
    rank 1, in window 0). The job's view of window 0 is still exported."""
    job = DDP_JOB.replace("if RANK == 1:", "if RANK == 1 and i == 0:")
    rank0, _rank1 = ok(run_ranks(f"DELAY = {DELAY}\n" + job, tmp_path, TRAINTEL_LOG_EVERY_N_ITERATIONS="4"))
    updates = rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert [u[R + "window.index"] for u in updates] == [0, 1, 2]
    assert updates[0][R + "compute_time.max"] >= DELAY / 4  # the first iteration's delay, in window 0
    assert rank0.events(semconv.Event.STRAGGLER.value) == []
    assert not rank0.metric_points(semconv.METRIC_STRAGGLERS)


def test_each_ranks_own_window_shows_equal_iteration_times(ddp: list[RankResult]) -> None:
    """The per-rank view (the window event) cannot tell the ranks apart: why compute is needed."""
    means = []
    for result in ddp:
        windows = result.events(semconv.Event.TRAINING_METRICS_UPDATE.value)
        means.append(windows[-1][semconv.WINDOW_PREFIX + "iteration_time.mean"])
    last = ddp[0].events(semconv.Event.RANKS_METRICS_UPDATE.value)[-1]
    # closer together than the ranks' compute, which the injected delay sets apart
    assert abs(means[0] - means[1]) < last[R + "compute_time.max"] - last[R + "compute_time.min"]


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
traintel.shutdown()
print("SURVIVED", flush=True)
os._exit(0)  # the default group's teardown would wait for the dead rank
"""


def seconds_outside_iterations(result: RankResult, iterations: int) -> float:
    """The training loop's seconds not spent in its iterations, from the rank's own spans
    (every iteration exported): where a window's start waits for the exchange's agreement and
    the loop's end for the exchange to be idle. Each wait is bounded by the exchange timeout,
    however long the iterations themselves took on a loaded machine."""
    spans = result.spans()
    (loop,) = [s for s in spans if s.name == semconv.Phase.TRAINING_LOOP.value]
    inside = [
        s.duration_s
        for s in spans
        if s.name == semconv.Phase.TRAINING_ITERATION.value and s.parent_span_id == loop.span_id
    ]
    assert len(inside) == iterations
    return loop.duration_s - sum(inside)


def test_a_killed_rank_does_not_hang_the_survivor(tmp_path: Path) -> None:
    timeout = 3.0
    rank0, rank1 = run_ranks(
        KILLED_JOB, tmp_path, timeout=60, TRAINTEL_LOG_EVERY_N_ITERATIONS="2",
        TRAINTEL_CROSS_RANK_TIMEOUT=str(timeout), TRAINTEL_EXPORT_ITERATIONS="all",
    )  # fmt: skip
    assert rank1.returncode == -9
    assert rank0.returncode == 0, rank0.stderr[-3000:]
    assert "SURVIVED" in rank0.stdout
    assert "cross-rank exchange stopped on rank 0" in rank0.stderr
    # Never blocked for long: at most one window start waited for the dead rank before the
    # exchange stopped, and the loop's end for the exchange to be idle, each within the timeout.
    assert seconds_outside_iterations(rank0, 40) <= 2 * timeout
    updates = rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert updates and all(u[R + "window.index"] <= 5 for u in updates)
    windows = rank0.events(semconv.Event.TRAINING_METRICS_UPDATE.value)
    assert windows[-1][semconv.WINDOW_PREFIX + "last_iteration"] == 39  # its own telemetry goes on


EARLY_DEAD_JOB = """
# Every rank past init_process_group first: gloo connects its mesh in the background, and a rank
# that exits as soon as its own init returns can close a connection another rank's init is
# still making ("connectFullMesh failed ... Connection closed by peer" there, not in traintel).
dist.barrier()
if RANK == 2:
    os._exit(0)  # dead before traintel's statistics group exists
traintel.configure()
with traintel.training_loop():
    for i in range(6):
        with traintel.training_iteration():
            with traintel.model_forward():
                time.sleep(0.01)
# the live ranks' own group after traintel's decision: made in the same order on both (it
# would wait for ever for a group of another name otherwise), and it works
group = dist.new_group([0, 1], backend="gloo")
total = torch.ones(1)
dist.all_reduce(total, group=group)
print("USER GROUP", total.item(), flush=True)
traintel.shutdown()
os._exit(0)
"""


def test_a_rank_dead_before_the_group_exists_costs_the_others_one_short_wait(tmp_path: Path) -> None:
    # the exchange timeout set far beyond the test's guard: waiting it out would fail the test
    timeout = 600
    rank0, rank1, rank2 = run_ranks(
        EARLY_DEAD_JOB, tmp_path, world=3, timeout=150, TRAINTEL_LOG_EVERY_N_ITERATIONS="2",
        TRAINTEL_CROSS_RANK_TIMEOUT=str(timeout), TRAINTEL_EXPORT_ITERATIONS="all",
    )  # fmt: skip
    assert rank2.returncode == 0
    waits = []
    for survivor in (rank0, rank1):
        assert survivor.returncode == 0, survivor.stderr[-3000:]
        assert "USER GROUP 2.0" in survivor.stdout, survivor.stdout
        # said once, the same decision on both live ranks, with the wait by this rank's clock
        (line,) = [line for line in survivor.stderr.splitlines() if "cross-rank statistics off" in line]
        assert f"off on rank {survivor.rank}: rank(s) 2 not there" in line, line
        waits.append(float(line.split("waited ")[1].split(" s")[0]))
        assert waits[-1] < timeout, line
        assert survivor.events(semconv.Event.RANKS_METRICS_UPDATE.value) == []
        windows = survivor.events(semconv.Event.TRAINING_METRICS_UPDATE.value)
        assert windows[-1][semconv.WINDOW_PREFIX + "last_iteration"] == 5  # its own telemetry goes on
    # the first to decide waited the presence bound; the other read its verdict (maybe sooner)
    assert max(waits) >= PRESENCE_WAIT_S, waits


HUNG_JOB = """
import pathlib
traintel.configure()
x = torch.randn(64, 64)
with traintel.training_loop():
    for i in range(30):
        with traintel.training_iteration():
            with traintel.model_forward():
                (x @ x).sum()
                time.sleep(0.02)
                if RANK == 1 and i == 10:
                    # hung, not dead: its exchange never joins in time. It hangs until rank 0 has
                    # finished its whole loop (or, if rank 0 waited for it, until the deadline).
                    deadline = time.monotonic() + HANG_DEADLINE
                    while not pathlib.Path("rank0_loop_done").exists() and time.monotonic() < deadline:
                        time.sleep(0.01)
                    print("RELEASED by", "rank 0" if pathlib.Path("rank0_loop_done").exists() else "deadline")
if RANK == 0:
    pathlib.Path("rank0_loop_done").touch()
traintel.shutdown()
os._exit(0)
"""


def test_a_hung_rank_times_the_exchange_out_and_training_goes_on(tmp_path: Path) -> None:
    timeout = 1.0
    rank0, rank1 = run_ranks(
        "HANG_DEADLINE = 60\n" + HUNG_JOB, tmp_path, timeout=120, TRAINTEL_LOG_EVERY_N_ITERATIONS="10",
        TRAINTEL_CROSS_RANK_TIMEOUT=str(timeout), TRAINTEL_EXPORT_ITERATIONS="all",
    )  # fmt: skip
    assert rank0.returncode == 0 and rank1.returncode == 0, rank0.stderr[-2000:] + rank1.stderr[-2000:]
    # Rank 0 finished its whole loop while rank 1 hung: it never waited for the hung rank.
    assert "RELEASED by rank 0" in rank1.stdout, rank1.stdout
    # Window 0 was exchanged; window 1's gather waited for the hung rank and timed out.
    (stopped,) = [
        line for line in rank0.stderr.splitlines() if "cross-rank exchange stopped on rank 0" in line
    ]
    assert "timed out" in stopped.lower(), stopped
    assert [u[R + "window.index"] for u in rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)] == [0]
    # What it waited for the exchange is bounded by the exchange timeout (a window's start, the
    # loop's end), however long its own iterations took.
    assert seconds_outside_iterations(rank0, 30) <= 2 * timeout


BLOCKED_JOB = """
import pathlib
from torch.nn.parallel import DistributedDataParallel as DDP
from traintel import semconv
from traintel.exporters.reader import iter_metric_requests
traintel.configure()
model = DDP(torch.nn.Linear(16, 4))
x = torch.randn(8, 16)


def mark(name):  # when this rank is stuck from, for the other rank and the test
    pathlib.Path(name + ".tmp").write_text(str(time.time_ns()))
    os.replace(name + ".tmp", name)


def collections_since(rank, since_ns):
    \"\"\"How many heartbeat collections rank ``rank``'s metric reader has written since then.\"\"\"
    try:
        return sum(
            1
            for request in iter_metric_requests(sorted(pathlib.Path(f"rank{rank}").glob("*.jsonl")))
            for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS
            for p in m.gauge.data_points if p.time_unix_nano > since_ns
        )
    except Exception:  # a line still being written
        return 0


def both_collected_while_stuck():
    stuck = {r: pathlib.Path(f"stuck{r}") for r in (0, 1)}
    return all(path.exists() for path in stuck.values()) and all(
        collections_since(r, int(path.read_text())) >= COLLECTIONS for r, path in stuck.items()
    )


with traintel.training_loop():
    for i in range(6):
        with traintel.training_iteration():
            with traintel.model_forward():
                if RANK == 1 and i == 3:
                    # blocked (rank 0 meanwhile waits in backward's all-reduce) until both ranks'
                    # readers have collected COLLECTIONS times since each got stuck
                    mark("stuck1")
                    deadline = time.monotonic() + 60
                    while not both_collected_while_stuck() and time.monotonic() < deadline:
                        time.sleep(0.05)
                    print("UNBLOCKED", time.time_ns(), both_collected_while_stuck(), flush=True)
                loss = model(x).sum()
            with traintel.model_backward():
                if RANK == 0 and i == 3:
                    mark("stuck0")
                loss.backward()
traintel.shutdown()
dist.destroy_process_group()
"""


def test_a_blocked_rank_is_named_by_its_heartbeat_at_the_next_collection(tmp_path: Path) -> None:
    """No fixed block length: rank 1 stays blocked until both ranks' metric readers have
    collected several times while stuck, however slowly a loaded machine runs them. Each
    collection's callback runs after the previous collection's timestamp and before the next
    one's, so the collections that count, and how much the gauge may grow between two, follow
    from the timestamps the ranks exported."""
    results = ok(
        run_ranks("COLLECTIONS = 8\n" + BLOCKED_JOB, tmp_path, timeout=120, OTEL_METRIC_EXPORT_INTERVAL="250")
    )
    stuck = {rank: int((tmp_path / f"stuck{rank}").read_text()) for rank in (0, 1)}
    (unblocked_line,) = [line for line in results[1].stdout.splitlines() if line.startswith("UNBLOCKED")]
    _, unblocked_ns, collected = unblocked_line.split()
    assert collected == "True", "the readers did not collect while the ranks were stuck"
    unblocked = int(unblocked_ns)
    # Inside an iteration the gauge names it and its last completed step phase: rank 1 none yet
    # (stuck in forward), rank 0 forward (stuck in backward, i.e. in the all-reduce).
    for result, after in ((results[1], None), (results[0], "model_forward")):
        seconds = sorted(
            (t, v) for t, _, v in result.metric_points(semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS)
        )
        times = [t for t, _ in seconds]
        phases = {t: a for t, a, _ in result.metric_points(semconv.METRIC_HEARTBEAT_PHASE)}
        iterations = {t: v for t, _, v in result.metric_points(semconv.METRIC_HEARTBEAT_ITERATION)}
        # collections certainly sampled while stuck: the one before began after the rank got
        # stuck, the one after before it was released
        during = [
            k
            for k in range(1, len(times) - 1)
            if times[k - 1] > stuck[result.rank] and times[k + 1] < unblocked
        ]
        assert len(during) >= 6, f"rank {result.rank}: {len(during)} collections while stuck"
        # The first collection that began after the rank got stuck already shows where...
        first_t = times[during[0]]
        assert phases[first_t][semconv.PHASE] == "training_iteration"
        assert phases[first_t].get(semconv.HEARTBEAT_AFTER) == after
        assert iterations[first_t] == 2
        # ...and the gauge keeps growing with the time stuck, second for second.
        values = [seconds[k][1] for k in during]
        assert values == sorted(set(values)), values
        j, k = during[0], during[-1]
        grown_ns = (values[-1] - values[0]) * 1e9  # exported in seconds: 1 ns for the rounding
        assert times[k - 1] - times[j + 1] - 1 <= grown_ns <= times[k + 1] - times[j - 1] + 1


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


SLOW = 0.6  # seconds rank 1 sleeps after the collective in the last iteration


def test_scale_mode_rank_0_exports_the_job_the_other_ranks_their_anomalies(tmp_path: Path) -> None:
    delay = 0.05
    rank0, rank1 = ok(
        run_ranks(
            f"DELAY = {delay}\nSLOW = {SLOW}\n" + SCALE_JOB, tmp_path, TRAINTEL_LOG_EVERY_N_ITERATIONS="4",
            TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE="1", TRAINTEL_SLOW_ITERATION_FACTOR="5",
            OTEL_METRIC_EXPORT_INTERVAL="300",  # collections during the run too (the heartbeat's)
            TRAINTEL_WARMUP_ITERATIONS="0",  # (as the DDP job's: rank 1 is slow from its first step)
        )
    )  # fmt: skip
    updates = rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert [u[R + "window.index"] for u in updates] == [0, 1, 2]
    last = updates[-1]
    assert last[R + "top_k"] == [1, 0] and last[R + "compute_mode"] == "sync_point"
    # The explicit sync point: compute excludes the data wait, the all-reduce and what follows.
    # Each rank slept 0.01 s loading data and rank 1 DELAY in its compute (floors no load
    # lowers); data wait and compute are disjoint parts of a rank's iteration...
    assert last[R + "data_loading_time.min"] >= 0.01
    assert last[R + "compute_time.max"] >= delay
    assert last[R + "data_loading_time.min"] + last[R + "compute_time.min"] <= last[R + "iteration_time.min"]
    # ...and rank 1's SLOW sleep after the collective, in one of the window's 4 iterations, is in
    # its iteration time, not in its compute.
    slow_share = SLOW / 4
    assert (
        last[R + "compute_time.max"] + slow_share
        <= last[R + "iteration_time.max"] - last[R + "data_loading_time.min"]
    )
    # Before that sleep, the collective equalises the ranks' iterations; compute keeps the delay.
    middle = updates[1]
    assert (
        middle[R + "iteration_time.max"] - middle[R + "iteration_time.min"]
        < middle[R + "compute_time.max"] - middle[R + "compute_time.min"]
    )
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
    assert sorted(e.name for e in loop1.events) == [  # (no application: its configuration is here)
        "nonfinite_metric", "slow_iteration", "straggler", "straggler", "straggler",
        "telemetry_initialization",
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
        semconv.METRIC_HEARTBEAT_COLLECTIVES_ENTERED,  # the hang culprit is found from every rank's
        semconv.METRIC_HEARTBEAT_COLLECTIVES_COMPLETED,
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
traintel.set_training_config(global_batch_size=64)
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
    # Each rank's share of the global batch is half of it (not the whole batch on each, as the
    # Resource's world of 1 would have it), and each rank says why its records cannot tell it.
    *_, (_time, _attributes, samples) = rank0.metric_points(semconv.METRIC_SAMPLES)
    assert samples == 8 * 64 / 2
    for result in (rank0, rank1):
        said = " ".join(result.stderr.split())
        assert f"makes this process rank {result.rank} of 2, but its telemetry started before" in said
        assert "Set RANK, LOCAL_RANK and WORLD_SIZE in each process" in said


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
    factors = [s["factor"] for s in data["stragglers"]]
    assert [w["straggler_factor"] for w in windows] == factors and all(f > 1 for f in factors)
    assert cli.main(["report", *dirs, "--json"]) == 0  # and so in the warnings (6 events, 3 windows)
    report = json.loads(capsys.readouterr().out)
    assert report["warnings"][semconv.Event.STRAGGLER.value] == 3
    # every event keeps its details, the straggler's own (rank 1's) among them
    details = [d for d in report["warning_details"] if d["event"] == semconv.Event.STRAGGLER.value]
    assert len(details) == 6 and {d[semconv.STRAGGLER_RANK] for d in details} == {1}
    html_path = ddp[0].out_dir.parent / "report.html"
    assert cli.main(["report", *dirs, "--html", str(html_path)]) == 0
    capsys.readouterr()
    assert cli.main(["report", *dirs]) == 0
    text = capsys.readouterr().out
    assert "no sync point marked" not in text  # (watch_ddp marked it)
    named = [f"rank 1 ({factor:.1f}x)" for factor in factors]  # each window's straggler, by its factor
    assert "Across ranks, per window: mean iteration time" in text and all(name in text for name in named)
    assert "Across ranks, per window: compute time before the sync point" in text
    assert "Across ranks, per window: data-loading wait" in text  # (a rank whose input lags waits there)
    page = html_path.read_text()  # the same windows in the shareable page
    assert "<h2>Across ranks, per window (compute time" in page and all(name in page for name in named)


#: DDP without watch_ddp or mark_sync_point, rank 1's data DELAY late every step: rank 0 waits
#: for it in the all-reduce inside backward.
LATE_DATA_JOB = DDP_JOB.replace("from traintel.distributed import watch_ddp\nwatch_ddp(model)\n", "")
LATE_DATA_JOB = LATE_DATA_JOB.replace(
    """            with traintel.model_forward():
                if RANK == 1:
                    time.sleep(DELAY)
""",
    """            with traintel.data_loading():
                if RANK == 1:
                    time.sleep(DELAY)
            with traintel.model_forward():
""",
)


def test_without_a_sync_mark_the_rank_waiting_for_late_data_is_not_the_straggler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The step less the data wait was rank 0's compute time, its wait for rank 1 included:
    rank 0, the healthy rank, was named the straggler in every window (3x in a run by hand).
    Now nobody is named; the late data shows in the data-loading wait, and the report says
    how compute time was measured."""
    import json

    from traintel import cli

    # Three times the other tests' delay: rank 0 is named only if its iteration time lags by
    # half its compute lag (half the delay) over a window of 4 iterations, and a stall of the
    # waiting rank on a loaded machine (it named rank 0 once in a CI run) must stay far below.
    late = 3 * DELAY
    job = f"DELAY = {late}\n" + LATE_DATA_JOB
    results = ok(run_ranks(job, tmp_path, TRAINTEL_LOG_EVERY_N_ITERATIONS="4"))
    updates = results[0].events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert [u[R + "compute_mode"] for u in updates] == ["step"] * 3
    assert all(u[R + "data_loading_time.max"] >= late for u in updates)
    assert not any(r.events(semconv.Event.STRAGGLER.value) for r in results)
    dirs = [str(result.out_dir) for result in results]
    assert cli.main(["report", *dirs, "--json"]) == 0
    windows = json.loads(capsys.readouterr().out)["cross_rank"]["windows"]
    assert [(w["straggler_rank"], w["compute_mode"]) for w in windows] == [(None, "step")] * 3
    assert cli.main(["report", *dirs]) == 0
    text = " ".join(capsys.readouterr().out.split())  # (the caption is wrapped)
    assert "no sync point marked: the step less its data wait" in text and "Warnings none" in text


CRASHED_JOB = """
traintel.configure()
model = torch.nn.Linear(8, 1)
try:
    with traintel.training_loop():
        for i in range(40):
            with traintel.training_iteration():
                with traintel.model_forward():
                    loss = model(torch.randn(4, 8)).pow(2).mean()
                    if RANK == 1 and i == 5:
                        raise RuntimeError("rank 1 broke")
                with traintel.model_backward():
                    loss.backward()
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
except RuntimeError as error:
    print("RAISED", str(error)[:40], flush=True)
traintel.shutdown()
os._exit(0)
"""


def test_a_rank_that_crashes_dies_at_once_and_frees_the_rank_waiting_in_the_collective(
    tmp_path: Path,
) -> None:
    # The exchange timeout set far beyond the test's guard: had the crashing rank waited for its
    # last window's gather (which rank 0, inside all_reduce, never joins), the test would fail.
    rank0, rank1 = run_ranks(
        CRASHED_JOB, tmp_path, timeout=60, TRAINTEL_LOG_EVERY_N_ITERATIONS="2",
        TRAINTEL_CROSS_RANK_TIMEOUT="600",
    )  # fmt: skip
    assert "RAISED rank 1 broke" in rank1.stdout, rank1.stderr[-3000:]
    # rank 0 was freed by rank 1's exit: its all_reduce failed on the closed connection
    assert "RAISED" in rank0.stdout and "RAISED rank 1" not in rank0.stdout, rank0.stderr[-3000:]
    assert rank0.returncode == rank1.returncode == 0
    # the windows before the crash were exchanged
    assert rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)
