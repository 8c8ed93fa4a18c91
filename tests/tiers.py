"""The suite's tiers, kept true by the suite itself (hooks imported by ``conftest.py``).

``make test-fast`` (``pytest --fast``) runs the inner loop: every test that starts no process,
no network server, uses no framework (Lightning, transformers), builds no documentation and is
not marked slow. A test that does one of these carries the marker; a module whose tests all do
says it once (``pytestmark``). The markers are checked while the tests run, in every tier: a
test that starts a process or a server, or imports a framework, without its marker fails and
says which marker it needs, so the fast tier never silently grows slow again.

``--fast`` also leaves out of collection the modules that import a framework at import time
(``FRAMEWORK_MODULES``): collecting them alone would cost the inner loop seconds.
"""

from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

#: Markers a ``--fast`` run leaves out (registered with their meaning in pyproject.toml).
SLOW_TIERS = ("process", "server", "framework", "docs", "slow")
#: Test modules that import Lightning or transformers when imported: ``--fast`` does not collect them.
FRAMEWORK_MODULES = frozenset({"test_integration_flops.py", "test_lightning.py", "test_transformers.py"})
#: Top-level packages a test may import only under the ``framework`` marker.
FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers")

#: What the running test has started so far (this process's counts; xdist workers keep their own).
_started = {"process": 0, "server": 0, "docs": 0}


def _counting(kind: str, original: Callable[..., Any], docs_if: Callable[..., bool] | None = None) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _started[kind] += 1
        if docs_if is not None and docs_if(*args, **kwargs):
            _started["docs"] += 1
        return original(*args, **kwargs)

    return wrapper


def _runs_mkdocs(_self: Any, args: Any, *rest: Any, **kwargs: Any) -> bool:
    return "mkdocs" in (args if isinstance(args, str) else " ".join(map(str, args)))


def _watch() -> None:
    """Count child processes (subprocess, multiprocessing, fork) and listening sockets."""
    subprocess.Popen.__init__ = _counting(  # type: ignore[method-assign]
        "process", subprocess.Popen.__init__, _runs_mkdocs
    )
    multiprocessing.process.BaseProcess.start = _counting(  # type: ignore[method-assign]
        "process", multiprocessing.process.BaseProcess.start
    )
    os.register_at_fork(before=lambda: _started.__setitem__("process", _started["process"] + 1))
    socket.socket.listen = _counting("server", socket.socket.listen)  # type: ignore[method-assign]
    try:
        import grpc
    except ImportError:
        return
    grpc.server = _counting("server", grpc.server)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help=f"the inner loop: leave out the tests marked {', '.join(SLOW_TIERS)} "
        "(and do not collect the modules that import a framework)",
    )


def pytest_configure(config: pytest.Config) -> None:
    _watch()
    if config.getoption("fast"):
        fast = "not (" + " or ".join(SLOW_TIERS) + ")"
        chosen = config.option.markexpr
        config.option.markexpr = f"({chosen}) and {fast}" if chosen else fast


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("fast") and collection_path.name in FRAMEWORK_MODULES:
        return True
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    named = {Path(arg.split("::")[0]).name for arg in session.config.args}  # collected as asked
    if session.config.getoption("fast") and not named & FRAMEWORK_MODULES:
        imported = [name for name in FRAMEWORKS if name in sys.modules]
        assert not imported, (
            f"collecting the fast tier imported {imported}: add the test module that imports it at "
            "import time to tests/tiers.py FRAMEWORK_MODULES"
        )


_BEFORE = pytest.StashKey[tuple[dict[str, int], set[str]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Snapshot before the test's set-up; checked after its teardown (module-scoped fixtures that
    start processes count for the first test that uses them)."""
    item.stash[_BEFORE] = (dict(_started), {name for name in FRAMEWORKS if name in sys.modules})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    result = yield
    before, frameworks_before = item.stash[_BEFORE]
    missing = [
        f"{kind} ({_started[kind] - before[kind]} started)"
        for kind in ("process", "server", "docs")
        if _started[kind] > before[kind] and item.get_closest_marker(kind) is None
    ]
    imported = sorted({name for name in FRAMEWORKS if name in sys.modules} - frameworks_before)
    if imported and item.get_closest_marker("framework") is None:
        missing.append(f"framework (imported {', '.join(imported)})")
    if missing:
        pytest.fail(
            f"{item.nodeid} needs the marker(s) {'; '.join(missing)}: add them (tests/tiers.py says why)",
            pytrace=False,
        )
    return result
