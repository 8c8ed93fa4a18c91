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
traintel.watch_ddp(model)
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
    # 40 iterations of >= 20 ms plus start-up; never blocked past the exchange timeout.
    assert rank0.seconds < 40 * 0.02 + timeout + 20
    updates = rank0.events(semconv.Event.RANKS_METRICS_UPDATE.value)
    assert updates and all(u[R + "window.index"] <= 5 for u in updates)
    windows = rank0.events(semconv.Event.TRAINING_METRICS_UPDATE.value)
    assert windows[-1][semconv.WINDOW_PREFIX + "last_iteration"] == 39  # its own telemetry goes on
