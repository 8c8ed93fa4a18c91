"""The collective sequence on a real ``torch.distributed`` (gloo, one rank in this process): every
collective entered counts, and completes as it returns (blocking) or when its future completes
(``async_op``, DDP's buckets); the functions are put back exactly at shutdown; the heartbeat
gauges carry the counts. Several ranks: tests/test_hang_ranks.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import traintel
from traintel import semconv
from traintel.distributed import watch_ddp
from traintel.distributed.collectives import COLLECTIVE_FUNCTIONS, SEQUENCE


@pytest.fixture
def world() -> Iterator[InMemoryMetricReader]:
    """A one-rank gloo world, and traintel configured in it."""
    originals = {name: getattr(dist, name) for name in COLLECTIVE_FUNCTIONS if hasattr(dist, name)}
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    traintel.configure(tracer_provider=TracerProvider(shutdown_on_exit=False), meter_provider=meter_provider)
    try:
        yield reader
    finally:
        traintel.shutdown(1.0)
        dist.destroy_process_group()
        meter_provider.shutdown()
    # put back exactly as they were, in both modules
    assert {name: getattr(dist, name) for name in originals} == originals
    assert all(getattr(dist.distributed_c10d, name) is f for name, f in originals.items())


def _moved(before: tuple[int, int, str]) -> tuple[int, int]:
    entered, completed, _ = SEQUENCE.snapshot()
    return entered - before[0], completed - before[1]


def _completed_by(target: int) -> int:
    """The completed count once a future's callback (on gloo's thread) brought it to ``target``;
    the guard only stops a hang."""
    deadline = time.monotonic() + 30
    while SEQUENCE.completed < target and time.monotonic() < deadline:
        time.sleep(0.001)
    return SEQUENCE.completed


def test_each_collective_entered_counts_and_completes(world: InMemoryMetricReader) -> None:
    tensor = torch.ones(3)
    before = SEQUENCE.snapshot()
    dist.all_reduce(tensor)
    assert _moved(before) == (1, 1)
    assert SEQUENCE.snapshot()[2] == "all_reduce"
    dist.barrier()
    dist.broadcast(tensor, src=0)
    assert _moved(before) == (3, 3)

    before = SEQUENCE.snapshot()
    work = dist.all_reduce(tensor, async_op=True)
    assert _moved(before)[0] == 1
    work.wait()
    assert _completed_by(before[1] + 1) == before[1] + 1
    # completed on gloo's thread, for the thread that entered it
    assert SEQUENCE.threads_in_flight() == ()

    before = SEQUENCE.snapshot()
    gathered: list[Any] = [None]
    dist.all_gather_object(gathered, {"rank": 0})  # it runs two all_gathers of its own: both count
    assert _moved(before) == (3, 3)
    assert gathered == [{"rank": 0}]


def test_a_failing_collective_leaves_it(world: InMemoryMetricReader) -> None:
    before = SEQUENCE.snapshot()
    with pytest.raises(RuntimeError, match="invalid root rank"):
        dist.broadcast(torch.ones(1), src=7)  # no rank 7 here
    assert _moved(before) == (1, 1)


def test_ddp_buckets_count_through_the_comm_hook(world: InMemoryMetricReader) -> None:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    watch_ddp(model)
    before = SEQUENCE.snapshot()
    model(torch.ones(8, 4)).sum().backward()  # one bucket: one all-reduce, waited for by backward
    entered, _completed, name = SEQUENCE.snapshot()
    assert (entered - before[0], name) == (1, "all_reduce")
    assert _completed_by(before[1] + 1) == before[1] + 1


def test_watch_ddp_names_the_bad_argument(world: InMemoryMetricReader) -> None:
    plain = torch.nn.Linear(4, 2)  # not wrapped in DDP yet
    with pytest.raises(
        TypeError, match=r"watch_ddp\(model=...\): expected a DistributedDataParallel model, got Linear"
    ):
        watch_ddp(plain)
    model = torch.nn.parallel.DistributedDataParallel(plain)
    with pytest.raises(
        TypeError, match=r"watch_ddp\(hook=...\): expected a DDP comm hook \(a callable\), got 3"
    ):
        watch_ddp(model, hook=3)
    watch_ddp(model)  # nothing was registered by the refused call: DDP takes one hook
    model(torch.ones(8, 4)).sum().backward()


def test_the_heartbeat_carries_the_counts(world: InMemoryMetricReader) -> None:
    dist.all_reduce(torch.ones(1))
    work = dist.all_reduce(torch.ones(1), async_op=True)
    work.wait()
    entered, completed = SEQUENCE.entered, _completed_by(SEQUENCE.entered)
    data = world.get_metrics_data()
    assert data is not None
    values = {
        metric.name: [point.value for point in metric.data.data_points]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    assert values[semconv.METRIC_HEARTBEAT_COLLECTIVES_ENTERED] == [entered]
    assert values[semconv.METRIC_HEARTBEAT_COLLECTIVES_COMPLETED] == [completed]
