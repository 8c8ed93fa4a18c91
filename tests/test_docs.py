"""The documentation site builds strict, and its generated reference documents the whole surface.

The site is built once (``mkdocs build --strict``, a few seconds) into a temporary directory; each
test then reads the built HTML. The test extra installs the docs toolchain, so CI runs these.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path

import pytest

from tests.test_public_api import MODULES
from traintel import environment_variables, semconv
from traintel.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
MISSING = [
    name
    for name in ("mkdocs", "mkdocstrings_handlers.python", "material")
    if not importlib.util.find_spec(name)
]
pytestmark = [
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"the docs toolchain is not installed ({', '.join(MISSING)}): pip install -e '.[docs]'",
    ),
    pytest.mark.docs,  # the suite's tiers: tests/tiers.py
    pytest.mark.process,
]

#: Public modules whose frameworks may be absent: their ``__all__`` is read from the source.
INTEGRATIONS = ("lightning", "pytorch_lightning", "transformers", "torch_monitor")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    warnings = "\n".join(line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{warnings or done.stderr[-4000:]}"
    return out


def _page(site: Path, name: str) -> str:
    return (site / "reference" / name / "index.html").read_text()


def _ids(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


def _integration_exports(name: str) -> list[str]:
    source = (ROOT / "src" / "traintel" / "integrations" / f"{name}.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"traintel.integrations.{name} has no literal __all__")


def _public_names() -> Iterator[str]:
    import traintel

    yield from (f"traintel.{name}" for name in traintel.__all__)
    for module_name in (*MODULES, "traintel.exporters"):
        module = importlib.import_module(module_name)
        yield from (f"{module_name}.{name}" for name in module.__all__)
    for name in INTEGRATIONS:
        yield from (f"traintel.integrations.{name}.{export}" for export in _integration_exports(name))


def test_every_public_name_has_an_entry_in_the_api_reference(site: Path) -> None:
    ids = _ids(_page(site, "api"))
    names = list(_public_names())
    assert "traintel.configure" in names and "traintel.callbacks.on_train_start" in names
    missing = [name for name in names if name not in ids]
    assert not missing, f"not in reference/api: {missing}"


def test_every_environment_variable_has_an_entry_with_its_text(site: Path) -> None:
    html = _page(site, "environment")
    ids = _ids(html)
    text = " ".join(re.sub(r"<[^>]+>", "", html).split())
    source = Path(environment_variables.__file__).read_text()
    for name in environment_variables.ALL:
        assert name in ids, f"{name} has no entry in reference/environment"
        # the first words of its docstring's text are on the page
        doc = source.split(f".. envvar:: {name}\n", 1)[1].split('"""', 1)[0]
        first_words = " ".join(re.sub(r"``|:envvar:`|`", "", doc).split()[:4])
        assert first_words in text, (name, first_words)


def test_every_semantic_convention_name_is_in_the_reference(site: Path) -> None:
    html = _page(site, "semantic-conventions")
    codes = set(re.findall(r"<code>([^<]+)</code>", html))
    values: set[str] = set()
    for constant, value in vars(semconv).items():
        if constant.isupper() and isinstance(value, str) and not isinstance(value, Enum):
            values.add(value)
            assert constant in codes, f"semconv.{constant} is not in reference/semantic-conventions"
    values |= {member.value for enum in (semconv.Phase, semconv.Event) for member in enum}
    missing = sorted(values - codes)
    assert not missing, f"not in reference/semantic-conventions: {missing}"


def test_every_cli_subcommand_and_option_is_in_the_reference(site: Path) -> None:
    import argparse

    html = _page(site, "cli")
    ids = _ids(html)
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subparsers.choices) >= 5
    for name, sub in subparsers.choices.items():
        assert f"traintel-{name}" in ids, f"traintel {name} has no section in reference/cli"
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert option in html, f"traintel {name} {option} is not in reference/cli"
            if action.help and not action.option_strings:
                assert action.dest in html, f"traintel {name}: argument {action.dest}"


def test_nothing_under_docs_reference_is_written_by_hand() -> None:
    """The reference pages are generated at build time; a committed copy would drift."""
    written = [path for path in (ROOT / "docs" / "reference").rglob("*") if path.is_file()]
    assert not written, f"generated at build time, remove: {written}"
