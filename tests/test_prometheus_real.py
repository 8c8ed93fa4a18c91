"""Every dashboard panel, dashboard variable and alert expression, run on a real Prometheus that
scrapes a real traintel job (``OTEL_METRICS_EXPORTER=prometheus``): each returns data, except the
few listed below with the reason they cannot here.

Grafana's variables are given values of the right kind: ``$session`` the job's session tag (so a
session label missing from what a query joins fails it), ``$run`` ``.+``, ``$__rate_interval`` a
fixed range. An alert's comparison becomes a ``bool`` one, so the expression answers whenever the
series it compares exist, whether or not it would fire.

The test waits on Prometheus's own account (its targets API, then the number of scrapes it
stored), with a generous overall timeout only as a guard against a hang. Where the ``prometheus``
binary is absent it is skipped; CI installs Debian's package (.ci/run).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.subprocess_helpers import clean_env
from tests.test_deploy import DASHBOARDS, RULE_FILES, dashboard_queries, load_yaml

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="no prometheus binary here (CI installs Debian's prometheus package: .ci/run)",
    ),
    pytest.mark.process,  # the suite's tiers: tests/tiers.py
    pytest.mark.server,
]
pytest.importorskip("opentelemetry.exporter.prometheus")

SESSION = "prom-session"
#: Expressions that cannot return data from one CPU process without a collector, and why.
RANKS = "cross-rank statistics need several ranks (tests/test_ranks.py covers the instruments)"
HANG = (
    "collective counts need torch.distributed collectives, so several ranks (tests/test_hang_alert.py "
    "evaluates the alert with promtool, tests/test_hang_ranks.py counts them on four ranks)"
)
CANNOT_HERE = {
    "panel 'GPU memory by rank'": "torch.cuda allocator and NVML gauges need a GPU (tests/test_gpu*.py)",
    "panel 'Straggler heatmap: compute time by rank / median rank'": RANKS,
    "panel 'Cross-rank compute time'": RANKS,
    "alert TraintelStraggler": RANKS,
    "alert TraintelComputeSpread": RANKS,
    "alert TraintelStalledWavefront": HANG,
    "panel 'Collectives behind the wavefront (hang culprit)'": HANG,
    "panel 'Phase latency p90 with exemplars (click a dot for the trace)'": "the collector's span_metrics",
    "panel 'Exported phase spans per second'": "the collector's span_metrics",
}

#: Trains until told to stop: every step phase, data loading, a checkpoint load, a save with a
#: stage every 20 iterations (the second fails), a validation loop every 50; ``ready`` once all of
#: them happened.
JOB = """
import pathlib, time
import traintel
with traintel.application():
    with traintel.checkpoint_load(iteration=0):
        time.sleep(0.01)
    with traintel.training_loop():
        i = 0
        while not pathlib.Path("go").exists():
            with traintel.training_iteration(samples=8, tokens=64):
                with traintel.data_loading():
                    time.sleep(0.001)
                with traintel.model_forward():
                    time.sleep(0.002)
                with traintel.model_backward():
                    time.sleep(0.002)
                with traintel.optimizer_update():
                    pass
            if i % 20 == 19:
                try:
                    with traintel.checkpoint_save(iteration=i, size_bytes=4096):
                        with traintel.checkpoint_stage("write"):
                            time.sleep(0.005)
                            if i == 39:
                                raise OSError(28, "No space left on device")
                except OSError:
                    pass  # the job trains on without that checkpoint
            if i % 50 == 49:
                with traintel.validation_loop():
                    with traintel.validation_iteration():
                        time.sleep(0.002)
            if i == 60:
                pathlib.Path("ready").touch()
            i += 1
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read().decode())


def _until(condition: Callable[[], bool], what: str, guard_s: float = 120.0) -> None:
    """Poll until ``condition`` holds; the guard only stops a hang (the oracle is the condition)."""
    deadline = time.monotonic() + guard_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            answer = _get(url)
        except urllib.error.HTTPError as error:
            raise AssertionError(f"Prometheus refused {expr!r}: {error.read().decode()}") from None
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def target_up(self) -> bool:
        targets = _get(f"{self.base}/api/v1/targets")["data"]["activeTargets"]
        return any(t["labels"].get("job") == "traintel" and t["health"] == "up" for t in targets)

    def scrapes(self) -> int:
        result = self.query('count_over_time(up{job="traintel"}[10m])')
        return int(float(result[0]["value"][1])) if result else 0


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    job_port, prometheus_port = _free_port(), _free_port()
    (work / "job.py").write_text(JOB)
    job = subprocess.Popen(
        [sys.executable, "job.py"],
        cwd=work,
        env=clean_env(
            OTEL_METRICS_EXPORTER="prometheus",
            OTEL_EXPORTER_PROMETHEUS_PORT=str(job_port),
            OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
            TRAINTEL_OUTPUT_DIR=str(work / "runs"),
            TRAINTEL_SESSION_TAG=SESSION,
            TRAINTEL_RUN_ID="prom-run",
            TRAINTEL_LOG_EVERY_N_ITERATIONS="10",
            TRAINTEL_FLOPS_PER_SAMPLE="1e6",
            TRAINTEL_PEAK_FLOPS="1e12",
            RANK="0",
            WORLD_SIZE="1",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in RULE_FILES],
        "scrape_configs": [
            {"job_name": "traintel", "static_configs": [{"targets": [f"127.0.0.1:{job_port}"]}]}
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    server = subprocess.Popen(
        [
            str(PROMETHEUS), f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prometheus_port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    api = Prometheus(prometheus_port)
    try:
        _until(lambda: (work / "ready").exists() or job.poll() is not None, "the job's first saves")
        assert job.poll() is None, job.communicate()[1][-3000:]
        _until(lambda: api.ready() or server.poll() is not None, "Prometheus to start")
        assert server.poll() is None, server.communicate()[1][-3000:]
        _until(api.target_up, "Prometheus to scrape the job")
        _until(lambda: api.scrapes() >= 8, "eight scrapes stored")  # rates need several samples
        yield api
    finally:
        (work / "go").touch()
        server.terminate()
        server.wait(timeout=30)
        try:
            job.wait(timeout=60)
        finally:
            if job.poll() is None:
                job.kill()


_COMPARISON = re.compile(r"(?<![=!<>~])(>=|<=|==|!=|>|<)(?![=~])")


def concrete(expr: str, alert: bool) -> str:
    """Grafana's variables given values; an alert's comparisons made ``bool``."""
    expr = expr.replace("$__rate_interval", "30s").replace("$__range", "10m").replace("$__interval", "15s")
    expr = re.sub(r"\$\{?session(:[a-z]+)?\}?", SESSION, expr)
    expr = re.sub(r"\$\{?run(:[a-z]+)?\}?", ".+", expr)
    if alert:
        expr = _COMPARISON.sub(r"\1 bool", expr)
    return expr


def expressions() -> list[tuple[str, str, bool]]:
    """(where, PromQL, is an alert) for every Prometheus query the kit ships."""
    out = [
        (where, expr, False)
        for path in DASHBOARDS
        for where, expr in dashboard_queries(json.loads(path.read_text()))
    ]
    for path in RULE_FILES:
        for group in load_yaml(path)["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out.append((f"alert {rule['alert']}", rule["expr"], True))
                else:
                    out.append((f"recording rule {rule['record']}", rule["expr"], False))
    return out


EXPRESSIONS = expressions()


def test_the_exceptions_are_queries_the_kit_has() -> None:
    wheres = {where for where, _, _ in EXPRESSIONS}
    assert set(CANNOT_HERE) <= wheres, set(CANNOT_HERE) - wheres
    assert len(EXPRESSIONS) - sum(where in CANNOT_HERE for where, _, _ in EXPRESSIONS) >= 25


def _has_numbers(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(sample["value"][1])) for sample in result)


@pytest.mark.parametrize(("where", "expr", "alert"), EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS])
def test_every_expression_returns_data_from_a_real_scrape(
    prometheus: Prometheus, where: str, expr: str, alert: bool
) -> None:
    result = prometheus.query(concrete(expr, alert))
    if where in CANNOT_HERE:
        assert not result, f"{where} returns data here: take it off the list ({CANNOT_HERE[where]})"
        return
    assert result, f"{where}: no series for {concrete(expr, alert)}"
    assert _has_numbers(result), f"{where}: only NaN for {concrete(expr, alert)}: {result}"


def test_variables_offer_the_jobs_session_and_run(prometheus: Prometheus) -> None:
    (dashboard,) = DASHBOARDS
    variables = {v["name"]: v["definition"] for v in json.loads(dashboard.read_text())["templating"]["list"]}
    series = prometheus.query("target_info")
    assert {s["metric"].get("ml_training_session_tag") for s in series} == {SESSION}
    assert {s["metric"].get("ml_training_run_id") for s in series} == {"prom-run"}
    assert "target_info" in variables["session"] and "target_info" in variables["run"]
