"""Resource detectors for a training process: identity, ranks and what the scheduler knows.

Why the Resource and not span or metric attributes: rank, host and job ids describe the
process, not an operation. On the Resource they cost nothing per span, every signal carries
them, and TraceQL / Jaeger tag search finds all of a run's traces by them without putting
per-rank labels on every metric series (the cardinality trap at 1,000+ GPUs).

Each detector reads only environment variables and files the scheduler sets; none of them
imports torch. ``torch.distributed`` is consulted only if the job already imported it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import uuid
from collections.abc import Mapping
from typing import Final

from opentelemetry.sdk.resources import Resource, ResourceDetector
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._host.gpu import gpu_in_use
from traintel.config import TrainingConfig

_logger = logging.getLogger(__name__)

_K8S_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _int_env(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        raw = environ.get(name)
        if raw is None:
            continue
        try:
            return int(raw.strip())
        except ValueError:
            continue
    return None


def _first(environ: Mapping[str, str], *names: str) -> str | None:
    """The first of ``names`` set to something."""
    return next((environ[name] for name in names if environ.get(name)), None)


def _present(attributes: Mapping[str, AttributeValue | None]) -> dict[str, AttributeValue]:
    """The attributes that are set (neither None nor empty)."""
    return {key: value for key, value in attributes.items() if value is not None and value != ""}


def process_identity_attributes(_environ: Mapping[str, str]) -> dict[str, AttributeValue]:
    """``service.instance.id`` (unique per process, as OTel requires), host name and pid."""
    return {
        semconv.SERVICE_INSTANCE_ID: str(uuid.uuid4()),
        semconv.HOST_NAME: socket.gethostname(),
        semconv.PROCESS_PID: os.getpid(),
    }


def distributed_identity(environ: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, local_rank, world_size): from ``torch.distributed`` when it is initialised,
    else torchrun's RANK / LOCAL_RANK / WORLD_SIZE, else Slurm's task ids, else a single process.
    """
    environ = os.environ if environ is None else environ
    rank = _int_env(environ, "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
    local_rank = _int_env(environ, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
    world_size = _int_env(environ, "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    group = process_group()
    if group is not None:
        rank, world_size = group
    return (rank or 0, local_rank if local_rank is not None else (rank or 0), world_size or 1)


def process_group() -> tuple[int, int] | None:
    """(rank, world size) of the initialised ``torch.distributed`` process group, if any; never
    imports torch itself (a job that never imported it is not distributed)."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a half-torn-down process group must not stop identity detection
        pass
    return None


def distributed_attributes(environ: Mapping[str, str]) -> dict[str, AttributeValue]:
    """``ml.training.rank`` / ``local_rank`` / ``world_size``."""
    rank, local_rank, world_size = distributed_identity(environ)
    return {semconv.RANK: rank, semconv.LOCAL_RANK: local_rank, semconv.WORLD_SIZE: world_size}


def torchelastic_attributes(environ: Mapping[str, str]) -> dict[str, AttributeValue]:
    """What torchrun / torch.distributed.elastic exports to its workers."""
    return _present(
        {
            semconv.TORCHELASTIC_RUN_ID: environ.get("TORCHELASTIC_RUN_ID"),
            semconv.TORCHELASTIC_RESTART_COUNT: _int_env(environ, "TORCHELASTIC_RESTART_COUNT"),
            semconv.TORCHELASTIC_MAX_RESTARTS: _int_env(environ, "TORCHELASTIC_MAX_RESTARTS"),
            semconv.TORCHELASTIC_GROUP_RANK: _int_env(environ, "GROUP_RANK"),
        }
    )


def slurm_attributes(environ: Mapping[str, str]) -> dict[str, AttributeValue]:
    """Slurm job, step, node and requeue count."""
    return _present(
        {
            semconv.SLURM_JOB_ID: _first(environ, "SLURM_JOB_ID", "SLURM_JOBID"),
            semconv.SLURM_STEP_ID: _first(environ, "SLURM_STEP_ID", "SLURM_STEPID"),
            semconv.SLURM_NODE_ID: _int_env(environ, "SLURM_NODEID"),
            semconv.SLURM_RESTART_COUNT: _int_env(environ, "SLURM_RESTART_COUNT"),
            semconv.SLURM_ARRAY_JOB_ID: environ.get("SLURM_ARRAY_JOB_ID"),
            semconv.SLURM_ARRAY_TASK_ID: environ.get("SLURM_ARRAY_TASK_ID"),
        }
    )


def kubernetes_attributes(
    environ: Mapping[str, str], namespace_file: str = _K8S_NAMESPACE_FILE
) -> dict[str, AttributeValue]:
    """Pod, namespace and node from the downward-API variables a pod spec usually maps
    (POD_NAME, POD_NAMESPACE, POD_UID, NODE_NAME) and the service-account namespace file."""
    if "KUBERNETES_SERVICE_HOST" not in environ and "POD_NAME" not in environ:
        return {}
    return _present(
        {
            semconv.K8S_POD_NAME: _first(environ, "POD_NAME", "K8S_POD_NAME", "HOSTNAME"),
            semconv.K8S_POD_UID: _first(environ, "POD_UID", "K8S_POD_UID"),
            semconv.K8S_NAMESPACE_NAME: _first(environ, "POD_NAMESPACE", "K8S_NAMESPACE")
            or _file_text(namespace_file),
            semconv.K8S_NODE_NAME: _first(environ, "NODE_NAME", "K8S_NODE_NAME"),
        }
    )


def _file_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return None


def gpu_attributes(environ: Mapping[str, str], nvml: object | None = None) -> dict[str, AttributeValue]:
    """``hw.id``: the UUID of the GPU this process trains on, so its series join dcgm-exporter's
    (see :func:`traintel.gpu.gpu_in_use` for when it is known)."""
    return _present({semconv.HW_ID: gpu_in_use(environ, nvml)})


def _torchrun_launch_id(environ: Mapping[str, str]) -> str | None:
    """torchrun without a rendezvous id (``TORCHELASTIC_RUN_ID=none``): an id of the launch's log
    directory, which its agent makes once (``<dir>/attempt_<restart>/<local rank>/error.json``)
    and shares with every worker it starts on this node, restarts included."""
    error_file = environ.get("TORCHELASTIC_ERROR_FILE")
    if environ.get("TORCHELASTIC_RUN_ID") != "none" or not error_file:
        return None
    parts = error_file.split("/")
    if len(parts) < 4 or not parts[-3].startswith("attempt_"):
        return None
    launch = f"{socket.gethostname()}:{'/'.join(parts[:-3])}"
    return uuid.uuid5(uuid.NAMESPACE_URL, launch).hex


def default_run_id(environ: Mapping[str, str] | None = None) -> str:
    """One id for all ranks of a job: the launcher's id where one exists, else a fresh uuid."""
    return launcher_run_id(os.environ if environ is None else environ) or uuid.uuid4().hex


def launcher_run_id(environ: Mapping[str, str]) -> str | None:
    """The id a launcher gives every rank of a job (torchrun, Slurm); None where there is none."""
    elastic = environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return elastic
    launch = _torchrun_launch_id(environ)
    if launch:
        return launch
    slurm_job = _first(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    if slurm_job:
        step = _first(environ, "SLURM_STEP_ID", "SLURM_STEPID")
        return f"slurm-{slurm_job}" + (f".{step}" if step else "")
    return None


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times the launcher restarted this job (torchrun or Slurm requeue), else 0."""
    environ = os.environ if environ is None else environ
    return _int_env(environ, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT") or 0


#: Each part of the resource, from the environment it is given.
_DETECTORS: Final = (
    process_identity_attributes,
    distributed_attributes,
    torchelastic_attributes,
    slurm_attributes,
    kubernetes_attributes,
    gpu_attributes,
)


class TrainingResourceDetector(ResourceDetector):
    """Everything above plus the run identity (run id, session and perf tags, restarts).

    Registered as the ``traintel`` resource detector entry point, so providers built by the
    OTel distro (``opentelemetry-instrument``) carry the same identity with
    ``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=traintel``; with that variable unset, traintel adds
    the same attributes to the distro's resource when it attaches. Without a config it reads ``TRAINTEL_*``
    leniently: a detector must never fail a job.
    """

    def __init__(
        self, config: TrainingConfig | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        super().__init__()
        self._config = config
        self._environ = environ

    def detect(self) -> Resource:
        config = (
            self._config if self._config is not None else TrainingConfig.from_env(self._environ, strict=False)
        )
        environ = os.environ if self._environ is None else self._environ
        attributes: dict[str, AttributeValue] = {}
        for detector in _DETECTORS:
            try:
                attributes.update(detector(environ))
            except Exception as exc:  # one broken detector must not lose the others
                _logger.warning("traintel: resource detector %s failed: %s", detector.__name__, exc)
        settings = config.resolve(lazy=False)  # a lazy perf_tag is not known yet: left out
        run_id = settings.run_id or default_run_id(self._environ)
        attributes[semconv.RUN_ID] = run_id
        attributes[semconv.SESSION_TAG] = settings.session_tag or run_id
        if settings.perf_tag is not None:  # validated: never empty
            attributes[semconv.PERF_TAG] = settings.perf_tag
        attributes[semconv.RESTART_COUNT] = restart_count(self._environ)
        return Resource(attributes)
