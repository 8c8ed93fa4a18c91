"""Cross-rank statistics in a job that torchrun restarts: 2 real ranks over gloo, two attempts.

torchrun's agent serves one store for every attempt of a job (``TORCHELASTIC_USE_AGENT_STORE``:
the workers connect to it as clients), so what the first attempt wrote there (the ranks'
presence, the verdict, the addresses of the statistics group's members) is still there when the
restarted ranks come up. Here the test serves that store, as the agent does, and starts the two
attempts itself. Between them it removes what torch's own default group wrote: in this torch
torchrun's restarted ranks often fail to make their default group from the dead ranks' addresses
(torch's own keys outlive the attempt the same way), and torchrun then restarts again, which
would make a torchrun-run test depend on torch's luck rather than on traintel.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.rank_helpers import run_ranks
from traintel import semconv

pytestmark = [pytest.mark.process, pytest.mark.xdist_group("ranks")]  # the suite's tiers: tests/tiers.py

dist = pytest.importorskip("torch.distributed")

# Attempt 0 lists the default group's own keys (before traintel writes any), for the test to
# remove. In attempt 1, rank 1 comes late, so rank 0 is first at the statistics group.
JOB = """
ATTEMPT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if ATTEMPT == 0:
    dist.barrier()
    if RANK == 0:
        raw = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        with open(os.environ["DEFAULT_KEYS"], "w") as out:
            json.dump(raw.list_keys(), out)
elif RANK == 1:
    time.sleep(1.0)
with traintel.application():
    with traintel.training_loop():
        for i in range(8):
            with traintel.training_iteration():
                time.sleep(0.01)
traintel.shutdown()
"""


def test_a_restarted_job_makes_its_statistics_group_from_its_own_ranks(tmp_path: Path) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the agent's
    default_keys = tmp_path / "default_keys.json"
    attempts = []
    for attempt in range(2):
        out = tmp_path / f"attempt{attempt}"
        out.mkdir()
        ranks = run_ranks(
            "import json\n" + JOB, out, port=store.port, timeout=60, TORCHELASTIC_RESTART_COUNT=str(attempt),
            TORCHELASTIC_USE_AGENT_STORE="True", DEFAULT_KEYS=str(default_keys),
            TRAINTEL_LOG_EVERY_N_ITERATIONS="4",
        )  # fmt: skip
        for rank in ranks:
            assert rank.returncode == 0, rank.stderr[-3000:]
            for failure in ("statistics disabled", "statistics off", "exchange stopped"):
                assert failure not in rank.stderr, rank.stderr[-3000:]
        attempts.append(ranks)
        for key in json.loads(default_keys.read_text()):  # torch's default group came up again
            store.delete_key(key)
    assert any("traintel" in key for key in store.list_keys())  # attempt 0's are still there
    for rank in attempts[1]:
        compared = [
            event.attributes[semconv.RANKS_PREFIX + "window.index"]
            for span in rank.spans()
            for event in span.events
            if event.name == semconv.Event.RANKS_METRICS_UPDATE
        ]
        assert compared == [0, 1], rank.rank
