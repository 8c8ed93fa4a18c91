"""The package's layering, checked on its source: the rules a change must keep.

* no import cycles of any kind, between modules or between packages (function-level and
  ``if TYPE_CHECKING:`` imports count);
* pure aggregation imports nothing from OpenTelemetry or torch, and nothing of traintel but the
  semantic conventions and itself;
* export and analysis never reach the recorder, the runtime or the phase API, even indirectly;
* the recorder imports aggregation, the configuration and vocabulary, the OpenTelemetry
  internals module and the attribute-value cleaning (a leaf) only: what it needs of the SDK
  side it names as protocols and is given through its constructors;
* the SDK side never imports the exporters, and the exporters reach into it only for the
  OpenTelemetry internals module;
* every private OpenTelemetry access sits in ``_sdk/otel_private.py``;
* the iteration record's fields behind ``notable`` / ``counted`` are written only by its own
  module;
* the engine is built in one place, the runtime's bootstrap.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import opentelemetry
import pytest

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "traintel"
QUARANTINE = PACKAGE / "_sdk" / "otel_private.py"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: pathlib.Path, type_checking: bool = False) -> Iterator[str]:
    """Every module ``name`` imports (absolute names), wherever in the file; under
    ``if TYPE_CHECKING:`` too with ``type_checking``."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]

    def visit(node: ast.AST) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child) and not type_checking:
                continue
            if isinstance(child, ast.Import):
                yield from (alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    module = base + ("." + child.module if child.module else "")
                else:
                    module = child.module or ""
                for alias in child.names:  # ``from traintel import semconv`` imports a module
                    full = f"{module}.{alias.name}"
                    yield full if full in MODULES else module
            yield from visit(child)

    yield from visit(ast.parse(path.read_text()))


GRAPH = {name: set(_imports(name, path)) for name, path in MODULES.items()}
#: The same with the imports made for type checking only: a cycle there is one a reader holds.
ALL_EDGES = {
    name: {t for t in _imports(name, path, type_checking=True) if t in MODULES and t != name}
    for name, path in MODULES.items()
}


def _internal(name: str) -> set[str]:
    return {target for target in GRAPH[name] if target in MODULES}


def _package(module: str) -> str:
    """A module's package under ``traintel`` (``traintel._sdk``, ``traintel.analysis`` for all of
    ``analysis/`` and its subpackages), or the module itself for a top-level module."""
    parts = module.split(".")
    if len(parts) > 2 or (PACKAGE / parts[-1] / "__init__.py").exists():
        return ".".join(parts[:2])
    return module


def _reachable(name: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for target in _internal(todo.pop()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            strong(node)
    return found


def _in(package: str) -> list[str]:
    return sorted(name for name in MODULES if name == package or name.startswith(package + "."))


def test_the_graph_sees_the_package() -> None:
    """A check over nothing passes vacuously: the graph holds the modules and their edges."""
    assert len(MODULES) > 60
    assert "traintel._recorder.engine" in _internal("traintel._recorder.phases")
    assert "traintel.semconv" in _internal("traintel._aggregation.aggregator")  # from traintel import x


def test_no_import_cycles_between_modules() -> None:
    assert _cycles(ALL_EDGES) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]  # it can fail


def test_no_import_cycles_between_packages() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in ALL_EDGES.items():
        packages.setdefault(_package(module), set()).update(_package(t) for t in targets)
    for package, targets in packages.items():
        targets.discard(package)
    assert "traintel._sdk" in packages and "traintel._sdk" in packages["traintel._runtime"]
    assert _cycles(packages) == []


#: What the recorder may import of traintel besides itself.
RECORDER_ALLOWED = {
    "traintel.semconv", "traintel.config", "traintel._sdk.otel_private", "traintel._sdk.attributes",
    *_in("traintel._aggregation"),
}  # fmt: skip


@pytest.mark.parametrize("module", _in("traintel._recorder"))
def test_the_recorder_imports_aggregation_and_the_opentelemetry_internals_only(module: str) -> None:
    found = {t for t in ALL_EDGES[module] if not t.startswith("traintel._recorder")}
    assert found <= RECORDER_ALLOWED


def test_what_the_recorder_may_import_of_the_sdk_side_is_a_leaf() -> None:
    for module in ("traintel._sdk.otel_private", "traintel._sdk.attributes"):
        assert {t for t in ALL_EDGES[module] if t.startswith("traintel.")} <= {"traintel._sdk.ids"}


@pytest.mark.parametrize("module", _in("traintel._sdk"))
def test_the_sdk_side_never_imports_the_exporters(module: str) -> None:
    assert not {t for t in ALL_EDGES[module] if t.startswith("traintel.exporters")}


@pytest.mark.parametrize("module", _in("traintel.exporters"))
def test_the_exporters_reach_into_the_sdk_side_for_its_opentelemetry_internals_only(module: str) -> None:
    assert {t for t in ALL_EDGES[module] if t.startswith("traintel._sdk")} <= {"traintel._sdk.otel_private"}


@pytest.mark.parametrize("module", _in("traintel._aggregation"))
def test_pure_aggregation_imports_no_opentelemetry_torch_or_live_state(module: str) -> None:
    external = {target.split(".")[0] for target in GRAPH[module] if not target.startswith("traintel")}
    assert not external & {"opentelemetry", "torch", "numpy"}
    allowed = {"traintel.semconv", *_in("traintel._aggregation")}
    assert _internal(module) <= allowed


@pytest.mark.parametrize("module", _in("traintel.exporters") + _in("traintel.analysis"))
def test_export_and_analysis_never_reach_the_recorder_or_the_runtime(module: str) -> None:
    live = {m for m in _reachable(module) if m.startswith(("traintel._recorder", "traintel._runtime"))}
    live |= {m for m in _reachable(module) if m.startswith("traintel._api") or m == "traintel"}
    assert live == set()


@pytest.mark.parametrize("module", _in("traintel._recorder"))
def test_the_recorder_never_imports_the_runtime(module: str) -> None:
    assert not {m for m in _reachable(module) if m.startswith("traintel._runtime")}


def _private_names(paths: list[pathlib.Path]) -> set[str]:
    """Single-underscore names the files define: attributes they store, functions, classes,
    module variables, parameters."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def _private_opentelemetry_uses(path: pathlib.Path, private: set[str]) -> list[str]:
    uses = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in private:
            uses.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in private
        ):
            uses.append(f"{path.name}:{node.lineno} {node.func.id}({node.args[1].value!r})")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
            names = [*(node.module or "").split("."), *(alias.name for alias in node.names)]
            if any(name.startswith("_") for name in names):
                uses.append(f"{path.name}:{node.lineno} from {node.module} import ...")
    return uses


def test_private_opentelemetry_access_only_in_the_quarantine_module() -> None:
    """A name OpenTelemetry defines as private (and traintel never defines itself) used outside
    ``otel_private.py``: an attribute, a ``getattr`` by name, a private module or name imported.
    The same scan over the quarantine module finds its accesses: the check can fail."""
    opentelemetry_files = [f for root in opentelemetry.__path__ for f in pathlib.Path(root).rglob("*.py")]
    ours = [path for path in MODULES.values() if path != QUARANTINE]
    private = _private_names(opentelemetry_files) - _private_names(ours)
    assert _private_opentelemetry_uses(QUARANTINE, private)  # the detector sees real accesses
    found = [use for path in ours for use in _private_opentelemetry_uses(path, private)]
    assert found == []


#: The record's fields behind ``notable`` and ``counted`` (see record.py).
_RECORD_FLAGGED = {"notable", "counted", "nonfinite", "head_reason", "holds_user_spans", "micro_batches"}
#: Names other objects use too: flagged only when written on something named like a record.
_RECORD_FIELDS = {"samples", "tokens", "padding", "flops", "metrics", "error"}


def _record_writes(path: pathlib.Path) -> list[str]:
    writes = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if not isinstance(sub, ast.Attribute):
                    continue
                owner = ast.unparse(sub.value)
                if sub.attr in _RECORD_FLAGGED or (sub.attr in _RECORD_FIELDS and "record" in owner.lower()):
                    writes.append(f"{path.name}:{node.lineno} {owner}.{sub.attr}")
    return writes


def test_the_record_invariant_fields_are_written_only_by_the_record() -> None:
    record_module = PACKAGE / "_recorder" / "record.py"
    assert _record_writes(record_module)  # the scan sees the record's own writes
    found = [w for path in MODULES.values() if path != record_module for w in _record_writes(path)]
    assert found == []


def test_the_engine_is_built_in_one_place() -> None:
    """Wiring happens in the runtime's bootstrap, through constructors."""
    builders = [
        _module_name(path)
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "TrainingEngine"
    ]
    assert builders == ["traintel._runtime.bootstrap"]
