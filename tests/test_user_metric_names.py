"""Many ``record_metrics`` names (one gradient norm per layer) never push traintel's own numbers
out of a span: past the attribute limit the user's names are left out (the last first), said
once with the count, and goodput stays right.

Real jobs record 1, 100 and 130 names per iteration; their files are read line by line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.subprocess_helpers import run_python
from traintel.cli import main

pytestmark = [pytest.mark.process]

JOB = """
import sys
import traintel
names = [f"grad_norm.layer{i:03d}" for i in range(int(sys.argv[1]))]
with traintel.application():
    with traintel.training_loop():
        for i in range(20):
            with traintel.training_iteration():
                with traintel.model_forward():
                    pass
                traintel.record_metrics({name: 0.1 * i for name in names})
"""

_USER = "ml.training.window.metric."


def _run(tmp_path: Path, names: int) -> tuple[list[dict[str, Any]], str, Path]:
    directory = tmp_path / str(names)
    directory.mkdir()
    (directory / "job.py").write_text(JOB)
    result = run_python(
        JOB,
        directory,
        argv=[__import__("sys").executable, str(directory / "job.py"), str(names)],
        TRAINTEL_LOG_EVERY_N_ITERATIONS="5",
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_OUTPUT_DIR=str(directory / "runs"),
    )
    assert result.returncode == 0, result.stderr
    spans = [
        span
        for line in next((directory / "runs").glob("*.otlp.jsonl")).read_text().splitlines()
        for rs in json.loads(line).get("resourceSpans", [])
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    return spans, result.stderr, directory / "runs"


def _keys(span: dict[str, Any]) -> list[str]:
    return [kv["key"] for kv in span.get("attributes", [])]


def _productive_seconds(runs: Path, capsys: Any) -> float:
    capsys.readouterr()
    assert main(["goodput", str(runs), "--json"]) == 0
    return float(json.loads(capsys.readouterr().out)["sessions"][0]["productive_seconds"])


def _number(span: dict[str, Any], key: str) -> float:
    for kv in span.get("attributes", []):
        if kv["key"] == key:
            value = kv["value"]
            return float(value.get("doubleValue", value.get("intValue", 0)))
    return 0.0  # a zero is left out of the record


def _windows_productive(windows: list[dict[str, Any]]) -> float:
    """What the window records say was productive: iteration time less data loading, nested
    badput and startup (as the goodput analysis reads them)."""
    w = "ml.training.window."
    return sum(
        _number(s, w + "iteration_time.total")
        - _number(s, w + "data_loading_time")
        - _number(s, w + "nested_badput_time")
        - _number(s, w + "program_startup_time")
        for s in windows
    )


def test_traintels_window_numbers_are_kept_whatever_the_number_of_names(tmp_path: Path, capsys: Any) -> None:
    one, stderr_one, runs_one = _run(tmp_path, 1)
    many, stderr, runs = _run(tmp_path, 100)
    windows_one = [s for s in one if s["name"] == "training_window"]
    windows = [s for s in many if s["name"] == "training_window"]
    assert len(windows) == len(windows_one) == 4
    # traintel's numbers every window has (some others are left out when zero: a slow iteration's count)
    own = set.intersection(*({k for k in _keys(w) if not k.startswith(_USER)} for w in windows_one))
    assert {"ml.training.window.iteration_time.total", "ml.training.window.productive_time"} & own
    for window in windows:
        keys = _keys(window)
        assert own <= set(keys), f"traintel's own numbers all kept: {sorted(own - set(keys))} missing"
        own_here = [k for k in keys if not k.startswith(_USER)]
        assert "droppedAttributesCount" not in window, "the SDK dropped nothing"
        user = [k for k in keys if k.startswith(_USER)]
        assert len(user) == 2 * ((128 - len(own_here)) // 2), "as many names (two numbers each) as fit"
        kept = sorted({k[len(_USER) :].rsplit(".", 1)[0] for k in user})
        assert kept == [f"grad_norm.layer{i:03d}" for i in range(len(kept))], "the first names kept"
    assert stderr.count("record_metrics names do not fit in a training_window span") == 1, stderr
    assert "100 record_metrics names do not fit" in stderr and "are left out of it" in stderr
    # which ones: the last recorded first (a loss recorded after 100 norms was left out, unnamed)
    assert "left out of it (grad_norm.layer099, grad_norm.layer098, grad_norm.layer097, ...)" in stderr
    assert "Attributes dict is full" not in stderr and "Attributes dict is full" not in stderr_one
    for run, records in ((runs, windows), (runs_one, windows_one)):
        productive = _windows_productive(records)
        assert productive > 0 and abs(_productive_seconds(run, capsys) - productive) <= 1e-9 * productive


def test_an_iteration_span_keeps_its_phase_and_number_past_the_limit(tmp_path: Path) -> None:
    spans, stderr, _runs = _run(tmp_path, 130)
    iterations = [s for s in spans if s["name"] == "training_iteration"]
    assert len(iterations) == 20
    for span in iterations:
        keys = _keys(span)
        assert "ml.training.phase" in keys and "ml.training.iteration" in keys
        assert "droppedAttributesCount" not in span and len(keys) <= 128
    assert stderr.count("do not fit in a training_iteration span") == 1, stderr
    assert "Attributes dict is full" not in stderr
