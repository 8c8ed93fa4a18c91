"""FSDP2 (``fully_shard``) on 2 real ranks over gloo: its collectives are counted (the hang
wavefront reads those counts), and ``measure_flops`` counts the sharded model as the whole one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.rank_helpers import run_ranks

pytestmark = [pytest.mark.process, pytest.mark.xdist_group("ranks")]  # the suite's tiers: tests/tiers.py

pytest.importorskip("torch.distributed.fsdp", reason="FSDP2 needs torch.distributed")

JOB = """
import json
from torch.distributed.fsdp import fully_shard
from traintel.distributed.collectives import SEQUENCE
traintel.configure()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
whole = traintel.measure_flops(model, torch.randn(4, 8))
fully_shard(model[0])
fully_shard(model)
sharded = traintel.measure_flops(model, torch.randn(4, 8))
before = SEQUENCE.snapshot()
model(torch.randn(4, 8)).sum().backward()
after = SEQUENCE.snapshot()
print(json.dumps({
    "whole": [whole.forward, whole.backward, whole.samples],
    "sharded": [sharded.forward, sharded.backward, sharded.samples],
    "entered": after[0] - before[0], "completed": after[1] - before[1], "last": after[2],
}))
traintel.shutdown()
dist.destroy_process_group()
"""


def test_fsdp2_collectives_count_and_its_model_s_flops_are_the_whole_model_s(tmp_path: Path) -> None:
    """Before: FSDP2's all-gathers and reduce-scatters (``all_gather_single``,
    ``reduce_scatter_single`` in newer torch) were not counted, so a rank hung in one looked
    like it waited in none; and ``measure_flops`` raised FSDP's "does not support deepcopy"
    into the training script."""
    results = run_ranks(JOB, tmp_path)
    for result in results:
        assert result.returncode == 0, f"rank {result.rank}:\n{result.stderr[-3000:]}"
    seen = [json.loads(result.stdout.strip().splitlines()[-1]) for result in results]
    # 4 samples through 8 -> 16 -> 2: forward 2*4*(8*16 + 16*2) = 1280; backward: the weights'
    # gradients (1280) and the hidden layer's input gradient (2*4*16*2 = 256), not the batch's
    assert [s["whole"] for s in seen] == [[1280, 1536, 4]] * 2
    assert [s["sharded"] for s in seen] == [[1280, 1536, 4]] * 2
    # the parameters gathered in forward (and again in backward) and the gradients reduce-scattered:
    # counted alike on both ranks, every one completed
    assert seen[0]["entered"] == seen[1]["entered"] >= 3
    assert [s["completed"] for s in seen] == [s["entered"] for s in seen]
    assert seen[0]["last"] in {"reduce_scatter_single", "reduce_scatter_tensor"}
