"""The Python blocks of the user's pages (getting started, reports, operations) run as written,
each in a fresh process, and record what they promise: a block that cannot run on its own says
why in a ``<!-- not run: reason -->`` line right above it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.subprocess_helpers import REPO, run_python
from traintel.exporters.reader import iter_spans

PAGES = [REPO / "docs" / "getting-started.md", REPO / "docs" / "guides" / "reports.md",
         *sorted((REPO / "docs" / "operations").glob("*.md"))]  # fmt: skip
_BLOCK = re.compile(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)\n```", re.S)
_NOT_RUN = re.compile(r"<!-- not run: (?P<reason>\S.*?) -->")


def _blocks() -> list[tuple[str, str, str | None]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            line = text[: match.start("code")].count("\n")
            reason = _NOT_RUN.search(match["before"])
            name = f"{page.relative_to(REPO)}:{line}"
            found.append((name, match["code"], reason["reason"] if reason else None))
    return found


BLOCKS = _blocks()


@pytest.mark.process
@pytest.mark.parametrize(("name", "code", "not_run"), BLOCKS, ids=[name for name, _, _ in BLOCKS])
def test_a_docs_block_runs_and_records_its_phases(
    name: str, code: str, not_run: str | None, tmp_path: Path
) -> None:
    if not_run is not None:
        pytest.skip(f"{name}: {not_run}")
    done = run_python(code, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), TRAINTEL_QUIET="1")
    assert done.returncode == 0, f"{name}:\n{done.stderr}"
    phases = {span.attributes.get("ml.training.phase") for span in iter_spans([tmp_path / "runs"])}
    assert "training_iteration" in phases or "training_loop" in phases, f"{name} recorded {phases}"


def test_every_page_is_read_and_fragments_are_few() -> None:
    assert len(BLOCKS) >= 3 and sum(1 for *_, reason in BLOCKS if reason) <= 1, BLOCKS


def test_the_docs_call_only_what_exists() -> None:
    """``traintel.flush()`` was documented and never existed: every ``traintel.<name>(`` and
    ``traintel.get_telemetry().<name>(`` the pages show is a real call."""
    import traintel
    from traintel import Telemetry

    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        text = page.read_text()
        missing += [f"{page.name}: traintel.{n}()" for n in re.findall(r"\btraintel\.(\w+)\(", text)
                    if not hasattr(traintel, n)]  # fmt: skip
        handle_calls = re.findall(r"get_telemetry\(\)\.(\w+)\(", text)
        missing += [f"{page.name}: get_telemetry().{n}()" for n in handle_calls if not hasattr(Telemetry, n)]
    assert not missing, missing


def test_the_environment_page_shows_the_codes_defaults() -> None:
    """The page once said 10 for ``TRAINTEL_WINDOW_MIN_SECONDS`` (code: 30) and 1000 for
    ``TRAINTEL_SEGMENT_ITERATIONS`` (code: 1,000,000, since unset): its defaults now come from the code."""
    import importlib.util

    from traintel.config import DEFAULTS

    spec = importlib.util.spec_from_file_location(
        "reference_pages", REPO / "docs" / "_ext" / "reference_pages.py"
    )
    assert spec is not None and spec.loader is not None
    pages = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = pages  # (its dataclasses look their module up)
    spec.loader.exec_module(pages)
    shown = {var.name: var.default for var in pages.environment_variables()}
    for name, value in DEFAULTS.items():
        number = int(value) if isinstance(value, float) and value.is_integer() else value
        assert shown[name] == f"``{number}``", (name, shown[name], value)
    assert shown["TRAINTEL_WINDOW_MIN_SECONDS"] == "``30``"
    assert shown["TRAINTEL_SEGMENT_ITERATIONS"] is None  # not set: segments follow time
