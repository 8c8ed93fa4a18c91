"""Griffe extension: traintel's reST-flavoured docstrings as Markdown with checked cross-references.

The docstrings are written for Python readers and Sphinx habits: ``literal`` (already a Markdown
code span), ``:func:`name```-style roles, ``:envvar:`TRAINTEL_X```, and ``Usage::`` before an
indented example. mkdocstrings renders docstrings as Markdown, so, once the package is loaded,
every docstring is rewritten:

- ``:func:/:class:/:meth:/:mod:/:data:/:attr:/:exc:/:obj:`` roles become mkdocs-autorefs
  cross-references to the object's full path, resolved in the docstring's own scope the way
  Python resolves the name (``~`` shows the last component only, as in Sphinx). A target that
  exists in the code links to its entry when the reference renders it (under any public name)
  and stays code when it is an implementation detail the reference leaves out. A target that
  does not exist (a typo, a renamed or removed object) becomes a required reference, so a
  rendered docstring naming it fails ``mkdocs build --strict``. Roles naming a builtin, the
  standard library or another package (``ValueError``, ``torch.save``) stay code.
- ``:envvar:`NAME``` and a ````TRAINTEL_NAME```` literal link to the variable's entry in the
  generated environment reference (required: a variable that does not exist fails the build).
- ``text::`` before a literal block becomes ``text:`` (the block is already indented code).
"""

from __future__ import annotations

import builtins
import re
import sys
from typing import Any

import griffe

_ROLE = re.compile(r":(?P<role>func|class|meth|mod|data|attr|exc|obj|envvar):`(?P<target>[^`]+)`")
#: Packages whose names a docstring may mention in a role without the site documenting them.
_EXTERNAL = ("torch", "opentelemetry", "lightning", "pytorch_lightning", "transformers", "accelerate")


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The full path ``target`` names from ``obj``'s scope, or None when it names nothing."""
    if target.startswith("."):  # relative to the enclosing package, as in an import
        module = obj if obj.is_module else obj.module
        package = module if module.is_package else module.parent
        level = len(target) - len(target.lstrip("."))
        for _ in range(level - 1):
            package = package.parent if package is not None else None
        return f"{package.path}.{target.lstrip('.')}" if package is not None else None
    head, _, rest = target.partition(".")
    if head == "traintel":
        return target
    try:
        path = obj.resolve(head)
    except griffe.NameResolutionError:
        return None
    return f"{path}.{rest}" if rest else path


def _crossref(obj: griffe.Object, match: re.Match[str]) -> str:
    role, target = match["role"], match["target"].strip()
    if role == "envvar":
        return f"[`{target}`][{target}]"
    short = target.startswith("~")
    target = target.lstrip("~")
    shown = target.rsplit(".", 1)[-1] if short else target
    path = _resolve(obj, target)
    if path is not None and _exists(obj, path):
        return f'<autoref identifier="{path}" optional>`{shown}`</autoref>'
    head = target.split(".", 1)[0]
    if head in _EXTERNAL or head in sys.stdlib_module_names or hasattr(builtins, head):
        return f"`{shown}`"
    return f"[`{shown}`][{path or target}]"  # required: the strict build names what is missing


def _exists(obj: griffe.Object, path: str) -> bool:
    try:
        obj.modules_collection[path]
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True


def _markdown(obj: griffe.Object, text: str) -> str:
    text = _ROLE.sub(lambda match: _crossref(obj, match), text)
    text = re.sub(r"``(TRAINTEL_[A-Z0-9_]+)``", r"[`\1`][\1]", text)
    # reST literal blocks: "Usage::" -> "Usage:", a lone "::" line disappears.
    text = re.sub(r"(?m)(\S)::$", r"\1:", text)
    return re.sub(r"(?m)^\s*::$", "", text)


def _walk(obj: griffe.Object, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if obj.docstring is not None:
        obj.docstring.value = _markdown(obj, obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _walk(member, seen)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of a loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name == "traintel":  # not the packages its aliases lead to
            _walk(pkg, set())
