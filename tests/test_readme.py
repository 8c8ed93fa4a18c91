"""The README tells the truth about the commands and every environment variable."""

from __future__ import annotations

import re
from pathlib import Path

from traintel import environment_variables

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_readme_opens_with_the_two_commands() -> None:
    first_block = README.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make demo", "make test"]


def test_every_traintel_variable_is_documented_and_no_other() -> None:
    documented = set(re.findall(r"`(TRAINTEL_[A-Z_]+)`", README))
    assert documented == set(environment_variables.ALL)


def test_every_variable_constant_has_a_docstring() -> None:
    source = Path(environment_variables.__file__).read_text()
    for name in environment_variables.ALL:
        assert re.search(rf'^{name}: Final = "{name}"\n"""\n\.\. envvar:: {name}\n', source, re.M), name


def test_every_test_reliability_md_cites_exists() -> None:
    """RELIABILITY.md backs each guarantee with a test: a renamed or removed test must not
    leave a guarantee pointing at nothing."""
    root = Path(__file__).resolve().parent.parent
    text = (root / "RELIABILITY.md").read_text()
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
