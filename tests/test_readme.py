"""The README and the docs tell the truth: the commands, the loop, the variables, the tests cited."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.subprocess_helpers import run_python
from traintel import environment_variables
from traintel.exporters.reader import iter_spans

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_readme_opens_with_the_two_commands() -> None:
    first_block = README.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_readme_stays_short() -> None:
    """The reference lives in the docs site; the README is the first read."""
    assert len(README.splitlines()) <= 150


def test_the_readme_links_only_to_files_that_exist() -> None:
    """Read on GitHub or in a clone, the README's links are files: the reference pages exist
    only in the built site (generated from the code), so they are named, not linked."""
    root = Path(__file__).resolve().parent.parent
    targets = re.findall(r"\]\(((?!https?:)[^)#]+)", README)
    missing = [target for target in targets if not (root / target).exists()]
    assert targets and not missing, missing


def test_every_traintel_variable_the_docs_name_exists() -> None:
    """Every variable is in the generated reference; a page that names one must not name one
    that does not exist (a renamed variable left behind)."""
    docs = Path(__file__).resolve().parent.parent / "docs"
    texts = [README, *(page.read_text() for page in docs.rglob("*.md"))]
    named = {name for text in texts for name in re.findall(r"`(TRAINTEL_[A-Z_]+)`", text)}
    assert named <= set(environment_variables.ALL), named - set(environment_variables.ALL)


@pytest.mark.process
def test_the_readme_loop_runs(tmp_path: Path) -> None:
    """The instrumented loop the README shows, run as written with a tiny model."""
    block = README.split("```python\n")[1].split("```")[0]
    script = (
        "import torch\n"
        "def build_model():\n"
        "    model = torch.nn.Linear(4, 1)\n"
        "    return (lambda batch: model(batch).pow(2).mean()), torch.optim.SGD(model.parameters(), 0.1)\n"
        "loader = [torch.randn(8, 4) for _ in range(30)]\n"
        "def save(model): pass\n" + block + "\nmain()\nprint('trained')\n"
    )
    result = run_python(script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("trained")
    names = {span.name for span in iter_spans([tmp_path / "traintel-runs"])}
    assert {"application", "model_init", "training_loop", "checkpoint_save_sync"} <= names


def test_the_configuration_table_lists_every_variable() -> None:
    """The exporters page's table is where a user looks a setting up by what it does: none left
    out (it once lacked five)."""
    page = Path(__file__).resolve().parent.parent / "docs" / "operations" / "exporters.md"
    rows = set(re.findall(r"^\| `(TRAINTEL_[A-Z_]+)` \|", page.read_text(), re.M))
    assert rows == set(environment_variables.ALL), set(environment_variables.ALL) ^ rows


def test_every_variable_constant_has_a_docstring() -> None:
    source = Path(environment_variables.__file__).read_text()
    for name in environment_variables.ALL:
        assert re.search(rf'^{name}: Final = "{name}"\n"""\n\.\. envvar:: {name}\n', source, re.M), name


def test_every_test_the_reliability_page_cites_exists() -> None:
    """The reliability page backs each guarantee with a test: a renamed or removed test must not
    leave a guarantee pointing at nothing."""
    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "reliability.md").read_text()
    cited: list[tuple[str, str]] = []
    path = ""
    for token in re.findall(r"`((?:tests/[\w/]+\.py)?::[^`]+|tests/[\w/]+\.py)`", text):
        if token.startswith("tests/"):
            path, _, name = token.partition("::")
        else:  # "`::other_test`" after a full reference: another test of the same file
            name = token.removeprefix("::")
        if name:
            cited.append((path, name))
        else:  # a whole file cited stands for all of its tests
            assert (root / path).is_file(), path
    assert len(cited) > 40
    for path, name in cited:
        source = (root / path).read_text()
        function = re.sub(r"\[.*", "", name)
        assert re.search(rf"^(async )?def {re.escape(function)}\(", source, re.M), f"{path}::{function}"


def test_the_readme_and_the_docs_home_say_the_export_policy_the_code_applies() -> None:
    """Which iterations become spans, in the shipped defaults: the routine sample is every M-th
    iteration number thinned to about one a minute (it once said "every 100th" alone, while a
    fast loop exports every 400th or fewer)."""
    from traintel._aggregation.sampling import stride_for
    from traintel.config import TrainingConfig

    settings = TrainingConfig.from_env({}, strict=True).resolve(lazy=False)
    first, every_n = settings.export_first_iterations, settings.export_every_n_iterations
    # "about one a minute" is these two defaults; new ones need new words
    assert (settings.export_every_n_seconds, settings.export_tail_per_minute) == (60, 1)
    assert stride_for(every_n, 60, 60 / every_n / 2) == 2 * every_n  # twice as fast: every 2M-th
    home = (Path(__file__).resolve().parent.parent / "docs" / "index.md").read_text()
    for text in (README, home):
        sentence = " ".join(text.split("Iterations exported as spans: ")[1].split(" ([details]")[0].split())
        assert sentence == (
            f"the first {first} of each loop; every {every_n}th, at most about one a minute (a faster "
            f"loop samples every {2 * every_n}th, {4 * every_n}th …); slow ones, at most about one a "
            "minute; and any that raised"
        )
