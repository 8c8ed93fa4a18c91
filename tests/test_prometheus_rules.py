"""The recording rules (deploy/prometheus/rules/traintel-goodput.yml) give `traintel goodput`'s
session figures, checked by ``promtool test rules`` on a real session.

A job is killed with SIGKILL after a checkpoint and a resumed job redoes four iterations
(tests/test_goodput_crash.py, on a counter clock, so every time is exact). Each job's metric
points, as its file exporter wrote them (the last export before the kill, the one at the end),
become promtool's input series under the names and labels Prometheus gives them through OTLP
(``target_info`` keyed by job and instance); the expected values come from
``traintel goodput --json`` on the same files, related as the rules file states: productive
counts wasted progress too, and the time between jobs is recovery plus scheduling gaps.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests import clickhouse_otel
from tests import test_goodput_crash as killed
from tests.subprocess_helpers import clean_env
from tests.test_deploy import RULE_FILES, prometheus_label, prometheus_metric_name
from traintel import semconv

PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.skipif(
        PROMTOOL is None, reason="no promtool here (CI installs Debian's prometheus package: .ci/run)"
    ),
    pytest.mark.process,  # the suite's tiers: tests/tiers.py
]
GOODPUT_RULES = next(p for p in RULE_FILES if p.name == "traintel-goodput.yml")
#: The instruments the rules read: (name, unit, kind), named as Prometheus' OTLP translation does.
INSTRUMENTS = {
    semconv.METRIC_GOODPUT_TIME: ("s", "counter"),
    semconv.METRIC_JOB_TIME: ("s", "counter"),
    semconv.METRIC_JOB_START_TIME: ("s", "gauge"),
}
#: Resource attributes on target_info that the rules join (service.instance.id is there on a
#: scrape and, with ``keep_identifying_resource_attributes``, through OTLP).
IDENTITY = (
    semconv.SESSION_TAG,
    semconv.RUN_ID,
    semconv.RESTART_COUNT,
    semconv.RANK,
    semconv.SERVICE_INSTANCE_ID,
)


def test_every_rule_file_passes_promtool_check() -> None:
    result = subprocess.run(
        [str(PROMTOOL), "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _points(directories: list[Path], t0_ns: int, scrape: bool) -> dict[str, dict[int, float | str]]:
    """promtool series selector -> {second after t0: value}, from the files' metric lines.

    Through OTLP a series' instance is the process's ``service.instance.id``; on a direct scrape
    (``scrape``) it is the scrape target, the same for every process that serves one port, and a
    process's series go stale when it stops answering."""
    series: dict[str, dict[int, float | str]] = defaultdict(dict)
    last: dict[tuple[str, str], int] = {}  # (selector, process) -> its last second
    for file in sorted(f for directory in directories for f in directory.rglob("*.jsonl")):
        for line in file.read_bytes().splitlines():
            request = orjson.loads(line)
            for resource_metrics in request.get("resourceMetrics", []):
                resource = clickhouse_otel.attributes(resource_metrics["resource"]["attributes"])
                instance = "node-1:9464" if scrape else resource["service.instance.id"]
                where = f'job="{resource["service.name"]}", instance="{instance}"'
                for scope in resource_metrics.get("scopeMetrics", []):
                    for metric in scope.get("metrics", []):
                        if metric["name"] not in INSTRUMENTS:
                            continue
                        unit, kind = INSTRUMENTS[metric["name"]]
                        name = prometheus_metric_name(metric["name"], unit, kind)
                        for point in (metric.get("sum") or metric.get("gauge") or {})["dataPoints"]:
                            labels = clickhouse_otel.attributes(point.get("attributes"))
                            matchers = "".join(
                                f', {prometheus_label(k)}="{v}"' for k, v in sorted(labels.items())
                            )
                            second = round((int(point["timeUnixNano"]) - t0_ns) / 1e9)
                            value = float(point.get("asDouble", point.get("asInt", 0)))
                            identity = "".join(f', {prometheus_label(k)}="{resource[k]}"' for k in IDENTITY)
                            for selector, v in (
                                (f"{name}{{{where}{matchers}}}", value),
                                (f"target_info{{{where}{identity}}}", 1.0),
                            ):
                                series[selector][second] = v
                                key = (selector, resource["service.instance.id"])
                                last[key] = max(last.get(key, second), second)
    if scrape:
        for (selector, _), second in last.items():
            series[selector].setdefault(second + 1, "stale")
    return series


def _values(samples: dict[int, float | str]) -> str:
    """promtool's notation: a value at each second that has one, ``_`` (no sample) between."""
    out, at = [], 0
    for second in sorted(samples):
        if second > at:
            out.append(f"_x{second - at}")
        value = samples[second]
        out.append(value if isinstance(value, str) else repr(value))
        at = second + 1
    return " ".join(out)


def _promtool_test(tmp_path: Path, test: dict[str, Any]) -> None:
    """``promtool test rules`` on ``test`` (a rule unit test file's content): every case passes."""
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(tmp_path / "test.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "scrape",
    [
        pytest.param(False, id="otlp-restarted"),
        # launched again by hand under the same run id (restart count 0 again) on the same node:
        # on a direct scrape both launches are one target, the CLI's two jobs
        pytest.param(True, id="scrape-launched-again"),
    ],
)
def test_session_rules_equal_the_cli_on_a_killed_and_resumed_session(tmp_path: Path, scrape: bool) -> None:
    # windows of 2 iterations: the killed job's last window closed before the kill
    env = {"TRAINTEL_LOG_EVERY_N_ITERATIONS": "2"}
    again = tmp_path / "again"
    again.mkdir()
    killed.run_job(tmp_path, killed.KILLED_IN_FIRST_WINDOW, "traintel", restart=0, start_s=0, **env)
    killed.run_job(
        again if scrape else tmp_path, killed.RESUMED, "traintel", restart=int(not scrape), start_s=80, **env
    )
    runs = [tmp_path / "runs", *([again / "runs"] if scrape else [])]
    capture = subprocess.run(
        [sys.executable, "-m", "traintel.cli", "goodput", *map(str, runs), "--json"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    )
    (session,) = json.loads(capture.stdout)["sessions"]
    assert [j["status"] for j in session["jobs"]] == ["no end exported", "completed"]
    tails = sum((j["inferred_tail"] or {}).get("productive_seconds", 0.0) for j in session["jobs"])
    assert tails == 0.0  # every iteration was in a closed window: the relation below is exact
    badput = session["badput_seconds"]

    series = _points(runs, session["start_unix_nano"], scrape)
    assert len({s for s in series if s.startswith("target_info")}) == 2  # two jobs, rank 0 each
    end = max(second for samples in series.values() for second in samples) + 10
    tag = f'ml_training_session_tag="{session["session"]}"'

    def sample(name: str, value: float, **labels: str) -> dict[str, Any]:
        extra = "".join(f', {k}="{v}"' for k, v in labels.items())
        return {"expr": f"{name}{{{tag}{extra}}}", "eval_time": f"{end}s",
                "exp_samples": [{"labels": f"{name}{{{tag}{extra}}}", "value": value}]}  # fmt: skip

    def absent(name: str, **labels: str) -> dict[str, Any]:
        return {**sample(name, 0.0, **labels), "exp_samples": []}

    category = prometheus_label(semconv.GOODPUT_CATEGORY)
    productive = session["productive_seconds"] + badput["wasted_progress"] - tails
    between = badput["infrastructure_recovery"] + session["scheduling_gap_seconds"]
    total = session["total_seconds"]
    counted = ("initialization", "checkpoint_load", "checkpoint_save", "data_loading", "evaluation",
               "program_startup")  # fmt: skip
    expected = [
        sample("traintel:session_time_seconds", total),
        sample("traintel:session_between_jobs_seconds", between),
        sample("traintel:session_jobs_time_seconds", total - between),
        sample("traintel:session_goodput_time_seconds", productive, **{category: "productive"}),
        *(
            sample("traintel:session_goodput_time_seconds", badput[c], **{category: c})
            for c in counted
            if badput[c]
        ),
        # a category no job had time in has no series (evaluation here)
        *(absent("traintel:session_goodput_time_seconds", **{category: c}) for c in counted if not badput[c]),
        sample("traintel:session_goodput:ratio", productive / total),
        *(
            sample("traintel:session_badput:ratio", badput[c] / total, **{category: c})
            for c in counted
            if badput[c]
        ),
        sample("traintel:session_between_jobs:ratio", between / total),
        sample("traintel:session_other:ratio", badput["other"] / total),
    ]
    # the session as the CLI sees it (105 s: 49 productive, 20 wasted, 16 recovery, ...)
    assert (total, productive, between, badput["evaluation"]) == (105.0, 69.0, 16.0, 0.0)
    test = {
        "rule_files": [str(GOODPUT_RULES)],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": [
                    {"series": name, "values": _values(s)} for name, s in sorted(series.items())
                ],
                "promql_expr_test": expected,
            }
        ],
    }
    _promtool_test(tmp_path, test)


ALERTS = next(p for p in RULE_FILES if p.name == "traintel-alerts.yml")


def _goodput_drop_series(scrape: bool) -> list[dict[str, str]]:
    """One scrape every 15 s. Process ``a`` climbs to 90% goodput and ends; ``b``, the same run
    launched again (a restart) 1 min later, climbs from 0 through its initialization for 11 min
    (below ``a``'s best all along), holds 92% and then really drops to 80% for 7.5 min. On a
    scrape both are one target, and a process's series go stale when it ends."""
    a = [min(0.9, 0.5 + 0.02 * i) for i in range(40)]
    b = [min(0.92, 0.02 * i) for i in range(56)] + [0.8] * 30
    series: dict[str, dict[int, float | str]] = defaultdict(dict)
    for process, points, at in (("a", a, 0), ("b", b, len(a) + 4)):
        target = f'job="train", instance="{"node-1:9464" if scrape else process}"'
        name = "ml_training_goodput" if scrape else "ml_training_goodput_ratio"
        identity = f'ml_training_run_id="run-1", service_instance_id="{process}"'
        for offset, value in enumerate(points):
            series[f"{name}{{{target}}}"][at + offset] = value
            series[f"target_info{{{target}, {identity}}}"][at + offset] = 1.0
        if scrape:
            for selector in (f"{name}{{{target}}}", f"target_info{{{target}, {identity}}}"):
                series[selector].setdefault(at + len(points), "stale")
    return [{"series": name, "values": _values(samples)} for name, samples in series.items()]


@pytest.mark.parametrize("scrape", [False, True], ids=["otlp", "scrape"])
def test_goodput_drop_compares_a_job_with_its_own_best_not_the_run_before_a_restart(
    tmp_path: Path, scrape: bool
) -> None:
    fired = {
        "exp_labels": {"severity": "warning", "ml_training_run_id": "run-1"},
        "exp_annotations": {
            "summary": "Run run-1: goodput fell more than 5 points below its best of the last hour"
        },
    }
    start_b = 44
    test = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": _goodput_drop_series(scrape),
                "alert_rule_test": [
                    # b still climbs, 8 and 11 min in: below a's best, but it is not a drop
                    {
                        "eval_time": f"{(start_b + 32) * 15}s",
                        "alertname": "TraintelGoodputDrop",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": f"{(start_b + 45) * 15}s",
                        "alertname": "TraintelGoodputDrop",
                        "exp_alerts": [],
                    },
                    # b's own drop, 6 min after it: fired
                    {
                        "eval_time": f"{(start_b + 80) * 15}s",
                        "alertname": "TraintelGoodputDrop",
                        "exp_alerts": [fired],
                    },
                ],
            }
        ],
    }
    _promtool_test(tmp_path, test)


#: Counters whose series appear at their first event (with 1), and their alert: the label that
#: names what happened, and what the alert says of it.
COUNTED = {
    "checkpoint failure": (
        "TraintelCheckpointFailing", "ml_training_checkpoint_failures_total",
        {"ml_training_phase": "checkpoint_save_sync"},
        {
            "summary": "Run run-1: a checkpoint_save_sync failed in the last 15 min",
            "description": (
                "The error is on the failed span (Jaeger/Tempo: ml.training.phase=checkpoint_save_sync, "
                "status ERROR), and traintel report lists it; the last good checkpoint is where a restart "
                "resumes."
            ),
        },
    ),
    "straggler": (
        "TraintelStraggler", "ml_training_stragglers_total", {"ml_training_straggler_rank": "3"},
        {
            "summary": "Run run-1: rank 3 flagged as a straggler",
            "description": (
                "traintel compares per-rank compute time before the collective (all-reduce equalises "
                "step times); see the straggler heatmap."
            ),
        },
    ),
}  # fmt: skip


@pytest.mark.parametrize("counted", list(COUNTED))
def test_a_counted_event_alerts_at_the_first_one_and_again_at_the_next(tmp_path: Path, counted: str) -> None:
    """The first event at minute 10 (the counter's series appears, with 1: increase() alone sees
    no rise there), none for 20 minutes, then a second one at minute 40."""
    alert, metric, label, annotations = COUNTED[counted]
    target = 'job="train", instance="rank0"'
    events = {4 * minute: 1.0 if minute < 40 else 2.0 for minute in range(10, 50)}  # (15 s steps)
    labels = ", ".join(f'{key}="{value}"' for key, value in label.items())
    series = {
        f"{metric}{{{target}, {labels}}}": events,
        f'target_info{{{target}, ml_training_run_id="run-1"}}': dict.fromkeys(range(4 * 50), 1.0),
    }
    fired = {
        "exp_labels": {"severity": "warning", "ml_training_run_id": "run-1", **label},
        "exp_annotations": annotations,
    }
    at = {"before": 5, "first": 11, "quiet": 30, "second": 41}
    expected = {"before": [], "first": [fired], "quiet": [], "second": [fired]}
    test = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": name, "values": _values(s)} for name, s in series.items()],
                "alert_rule_test": [
                    {"eval_time": f"{at[when]}m", "alertname": alert, "exp_alerts": alerts}
                    for when, alerts in expected.items()
                ],
            }
        ],
    }
    _promtool_test(tmp_path, test)
