"""Hyper-parameters: recorded by real jobs, shown in the report and told apart by ``compare``.

Two real jobs (traintel's API, the embedded file exporter) differ only in their learning rate:
run A gives it to ``configure()``, run B to ``set_training_config()`` inside its loop (the
later value wins). The comparison must name the learning rate as what differs (beside each job's own run id
and directory), in the terminal, the JSON and the HTML page, and keep the optimizer, the same in
both, out of the differences.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.subprocess_helpers import run_python
from traintel import cli
from traintel.analysis.report import build_report
from traintel.config import ConfigurationError, TrainingConfig

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

JOB = """
import traintel
late = {late}
given = {{"lr": 0.0003, "optimizer": "adamw"}}
traintel.configure(warmup_iterations=0, hyperparameters=None if late else given)
with traintel.application():
    with traintel.training_loop(train_iterations_start=0):
        for i in range(4):
            with traintel.training_iteration(samples=8):
                pass
            if late and i == 1:
                traintel.set_training_config(hyperparameters={{"lr": {lr}, "optimizer": "adamw"}})
traintel.shutdown()
"""


def run(tmp_path: Path, name: str, how: str, lr: float) -> Path:
    work = tmp_path / name
    work.mkdir()
    result = run_python(
        JOB.format(lr=lr, late=how == "late"),
        work,
        argv=None,
        TRAINTEL_OUTPUT_DIR=str(work / "runs"),
        TRAINTEL_RUN_ID=f"run-{name}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return work / "runs"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(list(args)) == 0
    return capsys.readouterr().out


def test_two_runs_differing_only_in_learning_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = run(tmp_path, "a", "configure", 0.0003)
    b = run(tmp_path, "b", "late", 0.001)
    assert build_report([a]).config["hyperparameters.lr"] == 0.0003
    assert build_report([b]).config["hyperparameters.lr"] == 0.001  # the later value
    data = json.loads(run_cli(capsys, "compare", str(a), str(b), "--json"))
    differences = data["config_differences"]
    assert differences["hyperparameters.lr"] == [0.0003, 0.001]
    assert "hyperparameters.optimizer" not in differences  # the same in both
    assert set(differences) == {"hyperparameters.lr", "run_id", "output_dir"}  # (each job's own)
    text = run_cli(capsys, "compare", str(a), str(b))
    assert "hyperparameters.lr differs" in text
    page = tmp_path / "compare.html"
    run_cli(capsys, "compare", str(a), str(b), "--html", str(page))
    html = page.read_text()
    assert re.search(r"<tr class=diff><td>hyperparameters\.lr</td><td>0\.0003</td><td>0\.001</td></tr>", html)
    assert "<tr><td>hyperparameters.optimizer</td><td>adamw</td><td>adamw</td></tr>" in html
    rows = re.findall(r"<tr><td class=\"name\">(.*?)</tr>", html)
    assert [re.search(r"hyperparameters\.lr = [\d.]+", row)[0] for row in rows] == [  # type: ignore[index]
        "hyperparameters.lr = 0.0003",
        "hyperparameters.lr = 0.001",
    ]
    single = tmp_path / "b.html"
    run_cli(capsys, "report", str(b), "--html", str(single))
    assert "<td>hyperparameters.lr</td><td>0.001</td>" in single.read_text()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"lr": {0.1}}, r"hyperparameters=\{'lr': \{0.1\}\}: hyper-parameter lr=\{0.1\} is not a number"),
        (
            {"opt": {"betas": [[0.9]]}},
            r"hyper-parameter opt.betas=\[\[0.9\]\] is not a number, string, boolean",
        ),
        ({"": 1}, "hyper-parameter name '' is not a non-empty string"),
        ("lr=0.1", "expected a JSON object"),
        ([("lr", 0.1)], "expected a mapping"),
    ],
)
def test_a_bad_hyperparameter_is_named(given: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        TrainingConfig({"hyperparameters": given})


def test_a_nested_configuration_is_flattened_to_dotted_names() -> None:
    """A Hydra or YAML configuration, as a job has it: sections and lists were refused, and the
    job stopped at ``set_training_config``."""
    given = {"lr": 3e-4, "optimizer": {"name": "adamw", "betas": [0.9, 0.95], "eps": {"value": 1e-8}}}
    assert dict(TrainingConfig({"hyperparameters": given}).resolve().hyperparameters or ()) == {
        "lr": 3e-4, "optimizer.name": "adamw", "optimizer.betas": "[0.9, 0.95]", "optimizer.eps.value": 1e-8,
    }  # fmt: skip


def test_a_script_s_arguments_or_dataclass_are_taken_as_they_are() -> None:
    """``vars(args)`` was needed, and an option left out (None) stopped the job."""
    import argparse
    import dataclasses

    @dataclasses.dataclass
    class Optimizer:
        name: str = "adamw"
        betas: tuple[float, float] = (0.9, 0.95)

    args = argparse.Namespace(lr=0.1, resume=None, optimizer={"name": "sgd"})
    assert dict(TrainingConfig({"hyperparameters": args}).resolve().hyperparameters or ()) == {
        "lr": 0.1, "optimizer.name": "sgd",
    }  # fmt: skip
    assert dict(TrainingConfig({"hyperparameters": Optimizer()}).resolve().hyperparameters or ()) == {
        "name": "adamw", "betas": "[0.9, 0.95]",
    }  # fmt: skip


def test_hyperparameters_from_the_environment() -> None:
    config = TrainingConfig.from_env({"TRAINTEL_HYPERPARAMETERS": '{"lr": 0.5, "warmup": true}'}, strict=True)
    described = config.describe()
    assert (described["hyperparameters.lr"], described["hyperparameters.warmup"]) == (0.5, True)
    with pytest.raises(ConfigurationError, match="TRAINTEL_HYPERPARAMETERS='lr=1': expected a JSON object"):
        TrainingConfig.from_env({"TRAINTEL_HYPERPARAMETERS": "lr=1"}, strict=True)
