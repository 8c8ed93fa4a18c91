"""``make demo``'s script: a real PyTorch run on CPU whose file reads back into a summary."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.subprocess_helpers import REPO, clean_env
from traintel.exporters.reader import iter_spans

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

pytest.importorskip("torch")


def test_demo_runs_and_summarises(tmp_path: Path) -> None:
    import subprocess

    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_mlp.py"), "--iterations", "40", "--batch-size", "32"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # The demo shows a model that learns: 4 classes, so chance is 0.25.
    accuracy = float(out.split("restored model accuracy:")[1].split()[0])
    assert accuracy > 0.8, out
    assert "\ntraining_iteration          40 " in out  # from the window events, not the sampled spans
    assert "Throughput:" in out and "samples/s" in out
    files = list((tmp_path / "traintel-runs").glob("*.otlp.jsonl"))
    assert len(files) == 1
    assert f"telemetry file: {files[0]}" in out
    names = [s.name for s in iter_spans(files)]
    # tail sampling: the first 10, plus any the real clock found slow (> 3 x the median)
    exported = names.count("training_iteration")
    assert 10 <= exported <= 40
    assert re.search(rf"Iterations exported as spans: {exported} \(.*first 10", out)
    assert names.count("validation_loop") == 1
    assert names.count("checkpoint_save_sync") == 2
    assert names.count("checkpoint_load") == 1
    assert names.count("testing_iteration") == 4
    assert "Iterations: 40 " in out
