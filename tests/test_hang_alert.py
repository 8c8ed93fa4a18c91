"""The stalled-wavefront alert (deploy/prometheus/rules/traintel-alerts.yml), evaluated by
Prometheus' own rule engine (``promtool test rules``) on four ranks' heartbeat series: it fires
for the rank that stays behind the others' collective count without progress, with the number of
collectives it is behind, and not for a rank that is one collective behind for a scrape while
the job runs, nor for the ranks waiting at the wavefront. The series are named and labelled as a
direct scrape gives them (tests/test_deploy.py checks those names against what traintel emits)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.test_deploy import RULE_FILES

PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.process,  # promtool; the suite's tiers: tests/tiers.py
    pytest.mark.skipif(
        PROMTOOL is None, reason="no promtool here (CI installs Debian's prometheus package: .ci/run)"
    ),
]
ALERTS = next(p for p in RULE_FILES if p.name == "traintel-alerts.yml")
SCRAPE_S = 15
IDENTITY = 'ml_training_run_id="run-1", ml_training_rank="{rank}", host_name="node{node}"'

#: Per rank, per scrape (15 s apart): collectives entered and seconds since progress. Healthy for
#: five scrapes (rank 2 one collective behind at the third, as a scrape between two ranks' calls
#: catches it), then ranks 0, 1 and 3 enter collective 50 and wait; rank 2 stays at 49.
HEALTHY = [(10, 0.4), (20, 0.3), (30, 0.5), (40, 0.2), (49, 0.4)]
WAITING = [(50, 15.0), (50, 30.0), (50, 45.0), (50, 60.0), (50, 75.0), (50, 90.0), (50, 105.0)]
STUCK = [(49, 15.4), (49, 30.4), (49, 45.4), (49, 60.4), (49, 75.4), (49, 90.4), (49, 105.4)]


def _series(rank: int) -> list[dict[str, str]]:
    points = HEALTHY + (STUCK if rank == 2 else WAITING)
    if rank == 2:
        points[2] = (29, 0.1)  # behind for one scrape, but moving
    target = f'job="train", instance="rank{rank}"'
    return [
        {
            "series": f"ml_training_heartbeat_collectives_entered{{{target}}}",
            "values": " ".join(str(p[0]) for p in points),
        },
        {
            "series": f"ml_training_heartbeat_time_since_progress_seconds{{{target}}}",
            "values": " ".join(str(p[1]) for p in points),
        },
        {
            "series": f"target_info{{{target}, {IDENTITY.format(rank=rank, node=rank // 2)}}}",
            "values": f"1x{len(points)}",
        },
    ]


def _alert(eval_s: int, *alerts: dict[str, object]) -> dict[str, object]:
    return {"eval_time": f"{eval_s}s", "alertname": "TraintelStalledWavefront", "exp_alerts": list(alerts)}


def test_the_alert_names_the_rank_behind_the_wavefront(tmp_path: Path) -> None:
    fired = {
        "exp_labels": {
            "severity": "critical", "ml_training_run_id": "run-1", "ml_training_rank": "2",
            "host_name": "node1",
        },
        "exp_annotations": {
            "summary": "Run run-1: rank 2 never joined the collective the other ranks wait in",
            "description": (
                "Rank 2 on node1 is 1 collective(s) behind the furthest rank and has made no progress for "
                "over 30 s. Its ml.training.hang_suspect log record names its phase, its Python stack and "
                "whether its Python runs."
            ),
        },
    }  # fmt: skip
    stall_starts = len(HEALTHY) * SCRAPE_S
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": f"{SCRAPE_S}s",
        "tests": [
            {
                "interval": f"{SCRAPE_S}s",
                "input_series": [series for rank in range(4) for series in _series(rank)],
                "alert_rule_test": [
                    _alert(2 * SCRAPE_S),  # one collective behind while moving: no alert
                    _alert(stall_starts + 2 * SCRAPE_S),  # stalled 30 s: not yet over the threshold
                    _alert(stall_starts + 5 * SCRAPE_S, fired),  # over 30 s for 30 s: fired, for rank 2 only
                ],
            }
        ],
    }
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
