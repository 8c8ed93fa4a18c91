"""``OTEL_METRICS_EXPORTER=prometheus``: the entry point gives a pull reader (a /metrics endpoint
the backend scrapes), registered as it is. A real job serves it; the test scrapes it over HTTP
and parses it with prometheus_client's own parser, as Prometheus would."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.subprocess_helpers import clean_env, wait_for

pytestmark = [pytest.mark.process, pytest.mark.server]  # the suite's tiers: tests/tiers.py

pytest.importorskip("opentelemetry.exporter.prometheus")
parser = pytest.importorskip("prometheus_client.parser")

#: 120 iterations of 8 samples, then it waits to be scraped (windows of 50: 2 closed).
JOB = """
import pathlib, sys, time
import traintel
if sys.argv[1] == "explicit":
    traintel.configure()
with traintel.application():
    with traintel.training_loop():
        for i in range(120):
            with traintel.training_iteration(samples=8):
                with traintel.model_forward():
                    pass
            traintel.record_metrics(loss=0.5)
        pathlib.Path("ready").touch()
        while not pathlib.Path("go").exists():
            time.sleep(0.05)
print("trained", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


@pytest.mark.parametrize("how", ["automatic", "explicit"])
def test_a_running_job_is_scraped_with_traintels_metrics(tmp_path: Path, how: str) -> None:
    port = _free_port()
    (tmp_path / "job.py").write_text(JOB)
    job = subprocess.Popen(
        [sys.executable, "job.py", how],
        cwd=tmp_path,
        env=clean_env(
            OTEL_METRICS_EXPORTER="prometheus,traintel_file",
            OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
            OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
            TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: (tmp_path / "ready").exists() or job.poll() is not None, 60)
        metrics = _scrape(port)
    finally:
        (tmp_path / "ready").touch()
        (tmp_path / "go").touch()
        stdout, stderr = job.communicate(timeout=60)
    assert job.returncode == 0, stderr
    assert stdout == "trained\n" and "Traceback" not in stderr, stderr

    def value(name: str, **labels: str) -> float:
        [found] = [v for lbl, v in metrics[name] if labels.items() <= lbl.items()]
        return found

    assert value("ml_training_samples_total") == 960.0  # 120 iterations x 8
    assert value("ml_training_iteration_duration_seconds_count") == 100.0  # 2 closed windows of 50
    assert value("ml_training_heartbeat_iteration") == 119.0
    assert value("traintel_iterations_exported_total", traintel_exported="true") >= 10.0
    assert value("traintel_spans_dropped_total", traintel_drop_reason="queue_full") == 0.0
    # Traces still went to the embedded default: a pull reader does not replace them.
    assert list((tmp_path / "runs").glob("*.otlp.jsonl"))


def _free_port_pair() -> int:
    """A port whose next one is free too (the two ranks of a host)."""
    for _ in range(50):
        port = _free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def test_the_ranks_of_one_host_each_serve_their_metrics(tmp_path: Path) -> None:
    """torchrun's two ranks on one host, one ``OTEL_EXPORTER_PROMETHEUS_PORT``: the second
    rank's exporter could not start (the port was the first's), and its metrics went to the file
    alone. Each rank now serves on the port plus its local rank, and the job's first line says
    where."""
    port = _free_port_pair()
    (tmp_path / "job.py").write_text(JOB)
    for local_rank in (0, 1):
        (tmp_path / str(local_rank)).mkdir()
    jobs = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "job.py"), "automatic"],
            cwd=tmp_path / str(local_rank),
            env=clean_env(
                OTEL_METRICS_EXPORTER="prometheus",
                OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
                OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                LOCAL_RANK=str(local_rank),
                TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
                TRAINTEL_QUIET="0",  # the job's first line is part of the test
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for local_rank in (0, 1)
    ]
    try:
        for local_rank, job in enumerate(jobs):
            ready = tmp_path / str(local_rank) / "ready"
            assert wait_for(lambda: ready.exists() or job.poll() is not None, 60)  # noqa: B023
        scraped = [_scrape(port + local_rank) for local_rank in (0, 1)]
    finally:
        for local_rank in (0, 1):
            (tmp_path / str(local_rank) / "go").touch()
        ended = [job.communicate(timeout=60) for job in jobs]
    for job, (_, stderr) in zip(jobs, ended, strict=True):
        assert job.returncode == 0 and "could not start" not in stderr, stderr
    for local_rank, (_, stderr) in enumerate(ended):  # each job's first line says where to scrape
        assert f"http://127.0.0.1:{port + local_rank}/metrics (metrics, for Prometheus to scrape)" in stderr
    for metrics in scraped:
        assert [v for _, v in metrics["ml_training_samples_total"]] == [960.0]  # each its own job's
    served = [metrics["target_info"][0][0]["ml_training_local_rank"] for metrics in scraped]
    assert served == ["0", "1"]


def test_a_metrics_exporter_that_cannot_start_leaves_the_rest_running(tmp_path: Path) -> None:
    """The prometheus port is taken: that exporter is left out, with one line naming it and the
    port taken (before: "[Errno 98] Address already in use", no port); the file exporter and the
    traces go on (automatic configuration never turns everything off)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        (tmp_path / "go").touch()
        (tmp_path / "job.py").write_text(JOB)
        result = subprocess.run(
            [sys.executable, "job.py", "automatic"],
            cwd=tmp_path,
            env=clean_env(
                OTEL_METRICS_EXPORTER="prometheus,traintel_file",
                OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
                OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "prometheus" in line]
    assert len(lines) == 1 and "metrics exporter 'prometheus' could not start" in lines[0], result.stderr
    assert "going on without it" in lines[0]
    assert (
        f"Address already in use on 127.0.0.1:{port} (OTEL_EXPORTER_PROMETHEUS_PORT {port} + local rank 0)"
        in lines[0]
    )
    [file] = (tmp_path / "runs").glob("*.otlp.jsonl")
    text = file.read_text()
    assert '"resourceMetrics"' in text and '"training_iteration"' in text
