"""Resource detection: identity, ranks, torchrun, Slurm, Kubernetes; OTEL_* precedence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.rank_helpers import free_port
from tests.subprocess_helpers import clean_env
from traintel import semconv
from traintel._sdk.providers import build_resource
from traintel.config import TrainingConfig
from traintel.resource_detectors import (
    default_run_id,
    distributed_attributes,
    distributed_identity,
    kubernetes_attributes,
    restart_count,
    slurm_attributes,
    torchelastic_attributes,
)

TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RUN_ID": "job-42",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_MAX_RESTARTS": "5",
}
SLURM = {
    "SLURM_JOB_ID": "987",
    "SLURM_STEP_ID": "0",
    "SLURM_NODEID": "4",
    "SLURM_PROCID": "17",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "32",
    "SLURM_RESTART_COUNT": "1",
}


def test_torchrun_identity() -> None:
    assert distributed_identity(TORCHRUN) == (3, 1, 8)
    assert distributed_attributes(TORCHRUN) == {
        semconv.RANK: 3,
        semconv.LOCAL_RANK: 1,
        semconv.WORLD_SIZE: 8,
    }
    assert torchelastic_attributes(TORCHRUN) == {
        semconv.TORCHELASTIC_RUN_ID: "job-42",
        semconv.TORCHELASTIC_RESTART_COUNT: 2,
        semconv.TORCHELASTIC_MAX_RESTARTS: 5,
        semconv.TORCHELASTIC_GROUP_RANK: 1,
    }
    assert default_run_id(TORCHRUN) == "job-42"
    assert restart_count(TORCHRUN) == 2


#: Each worker writes the run id and restart count it would export, and the first attempt fails.
#: A worker leaves only once every rank of its attempt has written: the launcher stops the other
#: ranks as soon as one fails, and a slower rank would otherwise never write its first file.
_WORKER = """
import glob, os, sys, time
from traintel.resource_detectors import TrainingResourceDetector
from traintel import semconv
attributes = TrainingResourceDetector().detect().attributes
restart = attributes[semconv.RESTART_COUNT]
with open(f"{os.environ['RANK']}-{restart}.tmp", "w") as out:
    out.write(f"{attributes[semconv.RUN_ID]} {attributes[semconv.SESSION_TAG]}")
os.replace(f"{os.environ['RANK']}-{restart}.tmp", f"{os.environ['RANK']}-{restart}.txt")
while len(glob.glob(f"*-{restart}.txt")) < int(os.environ["WORLD_SIZE"]):
    time.sleep(0.01)
sys.exit(1 if restart == 0 else 0)
"""


@pytest.mark.process
def test_torchrun_without_a_rendezvous_id_gives_its_ranks_one_run_id(tmp_path: Path) -> None:
    """``torchrun --nproc-per-node N`` without ``--rdzv-id`` sets ``TORCHELASTIC_RUN_ID=none``:
    every rank of a launch, and of its restarts, still shares one run id; the next launch has
    another."""
    (tmp_path / "worker.py").write_text(_WORKER)
    ids = []
    for launch in ("first", "second"):
        work = tmp_path / launch
        work.mkdir()
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
             "--master-port", str(free_port()), str(tmp_path / "worker.py")],
            cwd=work, env=clean_env(), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        written = {path.stem: path.read_text().split() for path in work.glob("*.txt")}
        assert sorted(written) == ["0-0", "0-1", "1-0", "1-1"]  # two ranks, two attempts
        assert len({run_id for run_id, _ in written.values()}) == 1, written
        assert all(session == run_id for run_id, session in written.values())
        ids.append(written["0-0"][0])
    assert ids[0] != ids[1]


def test_slurm_identity() -> None:
    assert distributed_identity(SLURM) == (17, 1, 32)
    assert slurm_attributes(SLURM) == {
        semconv.SLURM_JOB_ID: "987",
        semconv.SLURM_STEP_ID: "0",
        semconv.SLURM_NODE_ID: 4,
        semconv.SLURM_RESTART_COUNT: 1,
    }
    assert default_run_id(SLURM) == "slurm-987.0"
    assert restart_count(SLURM) == 1


def test_single_process_defaults() -> None:
    assert distributed_identity({}) == (0, 0, 1)
    assert len(default_run_id({})) == 32
    assert default_run_id({}) != default_run_id({})
    assert slurm_attributes({}) == {}
    assert kubernetes_attributes({}) == {}


def test_kubernetes_from_downward_api_and_namespace_file(tmp_path: Path) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("ml-team\n")
    env = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "HOSTNAME": "trainer-0",
        "NODE_NAME": "gpu-node-7",
        "POD_UID": "u-1",
    }
    attributes = kubernetes_attributes(env, namespace_file=str(namespace_file))
    assert attributes == {
        semconv.K8S_POD_NAME: "trainer-0",
        semconv.K8S_POD_UID: "u-1",
        semconv.K8S_NAMESPACE_NAME: "ml-team",
        semconv.K8S_NODE_NAME: "gpu-node-7",
    }


def test_resource_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in TORCHRUN.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging,ml.training.rank=99")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "llm-pretrain")
    config = TrainingConfig.from_env({"TRAINTEL_SESSION_TAG": "s1", "TRAINTEL_PERF_TAG": "p1"}, strict=True)
    attributes = build_resource(config).attributes
    assert attributes[semconv.SERVICE_NAME] == "llm-pretrain"
    assert attributes["deployment.environment"] == "staging"
    assert attributes[semconv.RANK] == "99"  # the user's explicit OTEL_RESOURCE_ATTRIBUTES wins
    assert attributes[semconv.WORLD_SIZE] == 8
    assert attributes[semconv.RUN_ID] == "job-42"
    assert attributes[semconv.SESSION_TAG] == "s1"
    assert attributes[semconv.PERF_TAG] == "p1"
    assert attributes[semconv.RESTART_COUNT] == 2
    assert attributes[semconv.HOST_NAME]
    assert len(str(attributes[semconv.SERVICE_INSTANCE_ID])) == 36
    assert attributes["telemetry.sdk.name"] == "opentelemetry"
    # an explicit service name beats the environment
    assert build_resource(config, service_name="explicit").attributes[semconv.SERVICE_NAME] == "explicit"


def test_each_process_gets_its_own_instance_id() -> None:
    config = TrainingConfig()
    first = build_resource(config).attributes[semconv.SERVICE_INSTANCE_ID]
    second = build_resource(config).attributes[semconv.SERVICE_INSTANCE_ID]
    assert first != second


def test_session_tag_defaults_to_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINTEL_RUN_ID", "run-7")
    attributes = build_resource(TrainingConfig.from_env(strict=True)).attributes
    assert attributes[semconv.RUN_ID] == "run-7"
    assert attributes[semconv.SESSION_TAG] == "run-7"


@pytest.mark.process
def test_a_bad_resource_attribute_pair_is_said_once_naming_the_variable(tmp_path: Path) -> None:
    """``OTEL_RESOURCE_ATTRIBUTES=team=ml%20infra,bad``: the good pair decoded, the bad one left
    out and said once, with the variable (the SDK said it five times, naming neither)."""
    job = "import traintel\nprint(traintel.configure().resource.attributes['team'])\ntraintel.shutdown()\n"
    done = subprocess.run(
        [sys.executable, "-c", job], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env=clean_env(OTEL_RESOURCE_ATTRIBUTES="team=ml%20infra,bad"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ml infra"
    named = [line for line in done.stderr.splitlines() if "OTEL_RESOURCE_ATTRIBUTES" in line]
    assert named == ["traintel: OTEL_RESOURCE_ATTRIBUTES: 'bad' not key=value: left out of the resource"]
    assert "bad" not in done.stderr.replace(named[0], ""), done.stderr
