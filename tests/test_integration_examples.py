"""Each integration's example runs as shipped and writes the span tree it promises."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.subprocess_helpers import REPO, clean_env
from traintel.exporters.reader import iter_spans

pytestmark = [pytest.mark.process, pytest.mark.framework]  # the suite's tiers: tests/tiers.py


@pytest.mark.parametrize(
    ("example", "framework", "expected"),
    [
        ("lightning_train.py", "lightning", {"training_iteration", "model_forward", "checkpoint_save_sync"}),
        ("hf_trainer.py", "transformers", {"training_iteration", "validation_loop", "checkpoint_save_sync"}),
        ("torch_monitor_bridge.py", "torch", {"training_iteration", "training_loop"}),
    ],
)
def test_example_runs_and_writes_spans(
    tmp_path: Path, example: str, framework: str, expected: set[str]
) -> None:
    pytest.importorskip(framework)
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / example)],
        cwd=tmp_path,
        env=clean_env(HF_HUB_OFFLINE="1", TRAINTEL_OUTPUT_DIR=str(tmp_path / "out")),
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard: a framework example on a busy machine takes minutes
        check=False,
    )
    assert result.returncode == 0, result.stderr
    spans = list(iter_spans([tmp_path / "out"]))
    names = Counter(s.name for s in spans)
    assert expected <= set(names), names
    assert names["application"] == 1
    if example == "torch_monitor_bridge.py":
        assert any(e.name == "torch.monitor.Stat" for s in spans for e in s.events)
