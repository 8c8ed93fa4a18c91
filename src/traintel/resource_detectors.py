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


def _set(attributes: dict[str, AttributeValue], key: str, value: AttributeValue | None) -> None:
    if value is not None and value != "":
        attributes[key] = value


class ProcessIdentityDetector(ResourceDetector):
    """``service.instance.id`` (unique per process, as OTel requires), host name and pid."""

    def detect(self) -> Resource:
        return Resource(
            {
                semconv.SERVICE_INSTANCE_ID: str(uuid.uuid4()),
                semconv.HOST_NAME: socket.gethostname(),
                semconv.PROCESS_PID: os.getpid(),
            }
        )


def distributed_identity(environ: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, local_rank, world_size): from ``torch.distributed`` when it is initialised,
    else torchrun's RANK / LOCAL_RANK / WORLD_SIZE, else Slurm's task ids, else a single process.
    """
    environ = os.environ if environ is None else environ
    rank = _int_env(environ, "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
    local_rank = _int_env(environ, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
    world_size = _int_env(environ, "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    group = _process_group()
    if group is not None:
        rank, world_size = group
    return (rank or 0, local_rank if local_rank is not None else (rank or 0), world_size or 1)


def _process_group() -> tuple[int, int] | None:
    """(rank, world size) of the initialised ``torch.distributed`` process group, if any."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a half-torn-down process group must not stop identity detection
        pass
    return None


class _EnvDetector(ResourceDetector):
    """A detector reading the environment it is given (tests), else the process's."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._environ = environ

    @property
    def environ(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ


class DistributedDetector(_EnvDetector):
    """``ml.training.rank`` / ``local_rank`` / ``world_size``."""

    def detect(self) -> Resource:
        rank, local_rank, world_size = distributed_identity(self._environ)
        return Resource({semconv.RANK: rank, semconv.LOCAL_RANK: local_rank, semconv.WORLD_SIZE: world_size})


class TorchElasticDetector(_EnvDetector):
    """What torchrun / torch.distributed.elastic exports to its workers."""

    def detect(self) -> Resource:
        environ = self.environ
        attributes: dict[str, AttributeValue] = {}
        _set(attributes, semconv.TORCHELASTIC_RUN_ID, environ.get("TORCHELASTIC_RUN_ID"))
        _set(attributes, semconv.TORCHELASTIC_RESTART_COUNT, _int_env(environ, "TORCHELASTIC_RESTART_COUNT"))
        _set(attributes, semconv.TORCHELASTIC_MAX_RESTARTS, _int_env(environ, "TORCHELASTIC_MAX_RESTARTS"))
        _set(attributes, semconv.TORCHELASTIC_GROUP_RANK, _int_env(environ, "GROUP_RANK"))
        return Resource(attributes)


class SlurmDetector(_EnvDetector):
    """Slurm job, step, node and requeue count."""

    def detect(self) -> Resource:
        environ = self.environ
        attributes: dict[str, AttributeValue] = {}
        _set(attributes, semconv.SLURM_JOB_ID, _first(environ, "SLURM_JOB_ID", "SLURM_JOBID"))
        _set(attributes, semconv.SLURM_STEP_ID, _first(environ, "SLURM_STEP_ID", "SLURM_STEPID"))
        _set(attributes, semconv.SLURM_NODE_ID, _int_env(environ, "SLURM_NODEID"))
        _set(attributes, semconv.SLURM_RESTART_COUNT, _int_env(environ, "SLURM_RESTART_COUNT"))
        _set(attributes, semconv.SLURM_ARRAY_JOB_ID, environ.get("SLURM_ARRAY_JOB_ID"))
        _set(attributes, semconv.SLURM_ARRAY_TASK_ID, environ.get("SLURM_ARRAY_TASK_ID"))
        return Resource(attributes)


class KubernetesDetector(_EnvDetector):
    """Pod, namespace and node from the downward-API variables a pod spec usually maps
    (POD_NAME, POD_NAMESPACE, POD_UID, NODE_NAME) and the service-account namespace file."""

    def __init__(self, environ: Mapping[str, str] | None = None, namespace_file: str | None = None) -> None:
        super().__init__(environ)
        self._namespace_file = namespace_file or _K8S_NAMESPACE_FILE

    def detect(self) -> Resource:
        environ = self.environ
        if "KUBERNETES_SERVICE_HOST" not in environ and "POD_NAME" not in environ:
            return Resource.get_empty()
        attributes: dict[str, AttributeValue] = {}
        _set(attributes, semconv.K8S_POD_NAME, _first(environ, "POD_NAME", "K8S_POD_NAME", "HOSTNAME"))
        _set(attributes, semconv.K8S_POD_UID, _first(environ, "POD_UID", "K8S_POD_UID"))
        namespace = _first(environ, "POD_NAMESPACE", "K8S_NAMESPACE") or self._file_namespace()
        _set(attributes, semconv.K8S_NAMESPACE_NAME, namespace)
        _set(attributes, semconv.K8S_NODE_NAME, _first(environ, "NODE_NAME", "K8S_NODE_NAME"))
        return Resource(attributes)

    def _file_namespace(self) -> str | None:
        try:
            with open(self._namespace_file, encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError:
            return None


class GpuDetector(_EnvDetector):
    """``hw.id``: the UUID of the GPU this process trains on, so its series join dcgm-exporter's
    (see :func:`traintel.gpu.gpu_in_use` for when it is known)."""

    def __init__(self, environ: Mapping[str, str] | None = None, nvml: object | None = None) -> None:
        super().__init__(environ)
        self._nvml = nvml

    def detect(self) -> Resource:
        hw_id = gpu_in_use(self.environ, self._nvml)
        return Resource({semconv.HW_ID: hw_id}) if hw_id else Resource.get_empty()


def default_run_id(environ: Mapping[str, str] | None = None) -> str:
    """One id for all ranks of a job: the launcher's id where one exists, else a fresh uuid."""
    environ = os.environ if environ is None else environ
    elastic = environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return elastic
    slurm_job = _first(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    if slurm_job:
        step = _first(environ, "SLURM_STEP_ID", "SLURM_STEPID")
        return f"slurm-{slurm_job}" + (f".{step}" if step else "")
    return uuid.uuid4().hex


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times the launcher restarted this job (torchrun or Slurm requeue), else 0."""
    environ = os.environ if environ is None else environ
    return _int_env(environ, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT") or 0


def default_detectors(environ: Mapping[str, str] | None = None) -> list[ResourceDetector]:
    return [
        ProcessIdentityDetector(),
        DistributedDetector(environ),
        TorchElasticDetector(environ),
        SlurmDetector(environ),
        KubernetesDetector(environ),
        GpuDetector(environ),
    ]


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
        attributes: dict[str, AttributeValue] = {}
        for detector in default_detectors(self._environ):
            try:
                attributes.update(detector.detect().attributes)
            except Exception as exc:  # one broken detector must not lose the others
                _logger.warning("traintel: resource detector %s failed: %s", type(detector).__name__, exc)
        settings = config.resolve(lazy=False)  # a lazy perf_tag is not known yet: left out
        run_id = settings.run_id or default_run_id(self._environ)
        attributes[semconv.RUN_ID] = run_id
        attributes[semconv.SESSION_TAG] = settings.session_tag or run_id
        _set(attributes, semconv.PERF_TAG, settings.perf_tag)
        attributes[semconv.RESTART_COUNT] = restart_count(self._environ)
        return Resource(attributes)
