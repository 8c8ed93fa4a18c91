"""MkDocs hook: the four reference pages, generated from the code at every build.

Nothing under ``docs/reference/`` is written by hand or committed: each page is added to the
build as a generated file, so it cannot drift from the code it describes.

- ``reference/api.md``: mkdocstrings directives for ``traintel.__all__`` (grouped below; a name
  no group lists lands in "Other", so a new public name is never left out) and for every public
  module's ``__all__``. mkdocstrings renders them from the docstrings.
- ``reference/environment.md``: every variable of ``environment_variables.ALL`` with the text of
  its ``.. envvar::`` docstring and its default.
- ``reference/semantic-conventions.md``: every name ``traintel.semconv`` defines, grouped (span
  names, events, resource attributes, attributes, metric instruments, values), with its ``#:``
  comment.
- ``reference/cli.md``: every subcommand of ``traintel.cli.build_parser()``, its usage and
  arguments.

A problem found while generating (a group naming a name that is not public, a variable without
its docstring) is logged as a warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import itertools
import logging
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.traintel_reference")

SRC = Path(__file__).resolve().parents[2] / "src" / "traintel"

# --------------------------------------------------------------------------------------------
# API

#: ``traintel.__all__`` in reading order. Names here that are not in ``__all__`` fail the build;
#: names in ``__all__`` that are not here are rendered under "Other".
API_GROUPS: dict[str, list[str]] = {
    "Configuration": [
        "configure",
        "get_telemetry",
        "set_training_config",
        "shutdown",
        "Telemetry",
        "ConfigurationError",
        "__version__",
    ],
    "Phases": [
        "application",
        "dist_init",
        "data_loader_init",
        "model_init",
        "optimizer_init",
        "checkpoint_load",
        "training_loop",
        "training_iteration",
        "data_loading",
        "model_forward",
        "model_backward",
        "optimizer_update",
        "checkpoint_save",
        "checkpoint_stage",
        "AsyncCheckpointCompletion",
        "validation_loop",
        "validation_iteration",
        "testing_loop",
        "testing_iteration",
        "timed_span",
    ],
    "Model metrics": ["record_batch", "record_metrics"],
    "FLOPs": ["measure_flops", "apply_flops"],
}

#: Public modules, rendered with every name of their ``__all__`` (title, module, members; None:
#: read ``__all__``).
API_MODULES: list[tuple[str, list[tuple[str, list[str] | None]]]] = [
    (
        "Modules",
        [
            ("traintel.callbacks", None),
            ("traintel.flops", None),
            ("traintel.threads", None),
            ("traintel.distributed", None),
            ("traintel.analysis", None),
            ("traintel.config", ["TrainingConfig"]),
        ],
    ),
    (
        "Framework integrations",
        [
            ("traintel.integrations", []),
            ("traintel.integrations.lightning", None),
            ("traintel.integrations.pytorch_lightning", None),
            ("traintel.integrations.transformers", None),
            ("traintel.integrations.torch_monitor", None),
            ("traintel.integrations.torch_patches", []),
        ],
    ),
    (
        "Exporters and entry points",
        [
            ("traintel.exporters", None),
            ("traintel.instrumentation", ["TraintelInstrumentor"]),
            ("traintel.resource_detectors", ["TrainingResourceDetector"]),
        ],
    ),
]


def module_exports(module: str) -> list[str]:
    """A module's ``__all__``, read from its source (so that an integration's framework need not
    be installed), or by importing it when ``__all__`` is computed."""
    relative = Path(*module.split(".")[1:])
    path = SRC / relative / "__init__.py" if (SRC / relative).is_dir() else SRC / f"{relative}.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                return list(importlib.import_module(module).__all__)
    return []


def _directive(identifier: str, **options: Any) -> str:
    lines = [f"::: {identifier}"]
    if options:
        lines.append("    options:")
        for key, value in options.items():
            rendered = "[" + ", ".join(f'"{v}"' for v in value) + "]" if isinstance(value, list) else value
            lines.append(f"      {key}: {str(rendered).lower() if isinstance(value, bool) else rendered}")
    return "\n".join(lines) + "\n"


def api_page() -> str:
    import traintel

    public = list(traintel.__all__)
    out = [
        "# Python API\n",
        "Generated from the docstrings. `import traintel` gives the names below (its `__all__`); "
        "the rest of the public surface lives in the modules further down. Environment variables, "
        "the span, attribute and metric names, and the `traintel` command have pages of their own: "
        "[environment variables](environment.md), [semantic conventions](semantic-conventions.md), "
        "[command line](cli.md).\n",
    ]
    grouped = [name for names in API_GROUPS.values() for name in names]
    for name in grouped:
        if name not in public:
            log.warning("reference/api.md: API_GROUPS lists %r, which is not in traintel.__all__", name)
    groups = dict(API_GROUPS)
    other = [name for name in public if name not in grouped]
    if other:
        groups["Other"] = other
    for title, names in groups.items():
        out.append(f"## {title}\n")
        out.extend(_directive(f"traintel.{name}") for name in names if name in public)
    for title, modules in API_MODULES:
        out.append(f"## {title}\n")
        for module, members in modules:
            exports = module_exports(module) if members is None else members
            out.append(
                _directive(
                    module, heading_level=3, members=exports or False, members_order=["__all__", "source"]
                )
            )
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Environment variables


@dataclass
class EnvVar:
    name: str
    text: str
    default: str | None
    keyword: str | None  # the same setting as a keyword of configure()


_DEFAULT_SENTENCE = re.compile(r"(?:^|(?<=\s))Default:\s*(?P<value>.+?)(?:\.(?=\s+[A-Z(`])|\.?\s*$)", re.S)
_DEFAULT_MARK = re.compile(r"``(?P<value>[^`]+)``\s*\(default\)")


def environment_variables() -> list[EnvVar]:
    """Every variable of ``environment_variables.ALL`` with its docstring, in that order."""
    from traintel import config
    from traintel import environment_variables as ev

    docs: dict[str, str] = {}
    body = ast.parse((SRC / "environment_variables.py").read_text()).body
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = following.value.value
    found = []
    for name in ev.ALL:
        doc = textwrap.dedent(docs.get(name, "")).strip()
        head, _, text = doc.partition("\n")
        if head.strip() != f".. envvar:: {name}" or not text.strip():
            log.warning(
                "reference/environment.md: %s has no '.. envvar:: %s' docstring with text", name, name
            )
        text = " ".join(text.split())
        match = _DEFAULT_SENTENCE.search(text)
        if match:
            default: str | None = match["value"].strip()
            text = " ".join((text[: match.start()] + text[match.end() :]).split())
        else:
            mark = _DEFAULT_MARK.search(text)
            default = f"``{mark['value']}``" if mark else None
        if name in config.DEFAULTS:  # from the code, never from prose that may have drifted
            default = f"``{_plain(config.DEFAULTS[name])}``"
        keyword = name.removeprefix("TRAINTEL_").lower()
        found.append(EnvVar(name, text, default, keyword if keyword in config.FIELD_NAMES else None))
    return found


def _plain(value: object) -> str:
    """A default as a user types it: ``30`` rather than ``30.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _env_markdown(text: str) -> str:
    """Docstring text as Markdown: ``x`` is already a code span; roles become links."""
    text = re.sub(r":envvar:`([^`]+)`", r"[`\1`](#\1)", text)
    return _escape_html(_link_variables(text, ""))


def _link_variables(text: str, page: str) -> str:
    """Each ````TRAINTEL_X```` code span naming a variable links to its entry on ``page``."""
    from traintel import environment_variables as ev

    def link(match: re.Match[str]) -> str:
        name = match[1]
        return f"[`{name}`]({page}#{name})" if name in ev.ALL else match[0]

    return re.sub(r"``(TRAINTEL_[A-Z0-9_]+)``", link, text)


def environment_page() -> str:
    variables = environment_variables()
    out = [
        "# Environment variables\n",
        "Every `TRAINTEL_*` variable, generated from `traintel.environment_variables`, with its "
        "default from the code. Those with a keyword are also settings of "
        "[`traintel.configure()`][traintel.configure], whose value overrides the variable. A "
        "`TRAINTEL_*` variable not listed here (a misspelt one) is said once at start, with the "
        "nearest name listed, and ignored.\n",
        "Everything OpenTelemetry owns (service name, resource attributes, exporters, endpoints, "
        "protocols, headers, TLS, sampler, batch-processor and metric-reader settings, "
        "`OTEL_SDK_DISABLED`) is configured with the standard `OTEL_*` variables and read by the "
        "OpenTelemetry SDK itself; see [Exporters](../operations/exporters.md).\n",
        "| Variable | Keyword | Default |",
        "| --- | --- | --- |",
    ]
    for var in variables:
        default = _env_markdown(var.default) if var.default else "not set"
        keyword = f"`{var.keyword}=`" if var.keyword else ""
        out.append(f"| [`{var.name}`](#{var.name}) | {keyword} | {_cell(default)} |")
    out.append("")
    for var in variables:
        out.append(f"## `{var.name}` {{ #{var.name} }}\n")
        out.append(_env_markdown(var.text) + "\n")
        out.append(f"**Default:** {_env_markdown(var.default) if var.default else 'not set'}.\n")
        if var.keyword:
            out.append(f"**Keyword:** `{var.keyword}=` of [`traintel.configure()`][traintel.configure].\n")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Semantic conventions


@dataclass
class Name:
    constant: str  # e.g. "PHASE", "Phase.APPLICATION"
    value: Any
    comment: str
    section: str  # the "# --- ... ---" section of semconv.py it is defined in
    line: int
    run: list[Name] = field(default_factory=list)  # constants documented by this one's comment
    follows: bool = False  # documented by the comment of the constant before it (in its run)


def _comment_above(lines: list[str], lineno: int) -> str:
    """The ``#:`` comment block right above line ``lineno`` (1-based), as one paragraph."""
    block: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].strip().startswith("#:"):
        block.insert(0, lines[index].strip()[2:].strip())
        index -= 1
    return " ".join(block)


def _section_of(lines: list[str], lineno: int) -> str:
    for index in range(lineno - 2, -1, -1):
        match = re.match(r"#\s*---\s*(.+?)\s*-+\s*$", lines[index])
        if match:
            return match[1]
    return ""


def semconv_names() -> list[Name]:
    """Every ``Final`` constant and enum member of ``traintel.semconv``, in source order.

    A constant without a ``#:`` comment of its own that directly follows a commented one (no
    blank line or comment between) and shares the first or last word of its name is taken to be
    described by that comment (``SEGMENT_INDEX``, ``SEGMENT_FIRST_ITERATION``...).
    """
    from traintel import semconv

    source = (SRC / "semconv.py").read_text()
    lines = source.splitlines()
    names: list[Name] = []

    def add(constant: str, value: Any, node: ast.stmt) -> None:
        names.append(
            Name(
                constant,
                value,
                _comment_above(lines, node.lineno),
                _section_of(lines, node.lineno),
                node.lineno,
            )
        )

    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            add(node.target.id, getattr(semconv, node.target.id), node)
        elif isinstance(node, ast.ClassDef) and issubclass(getattr(semconv, node.name), Enum):
            enum = getattr(semconv, node.name)
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                    member = item.targets[0].id
                    add(f"{node.name}.{member}", enum[member].value, item)

    def words(name: Name) -> tuple[str, str]:
        parts = name.constant.split(".")[-1].removeprefix("METRIC_").split("_")
        return parts[0], parts[-1]

    leader: Name | None = None
    previous: Name | None = None
    for name in names:
        if name.comment:
            leader = name
        elif (
            leader is not None
            and previous is not None
            and name.line == previous.line + 1 + _extra_lines(lines, previous.line)
            and (words(name)[0] == words(previous)[0] or words(name)[1] == words(previous)[1])
            and _semconv_group(name) == _semconv_group(leader)
        ):
            leader.run.append(name)
            name.follows = True
        else:
            leader = None
        previous = name
    return names


def _extra_lines(lines: list[str], lineno: int) -> int:
    """Continuation lines of the statement starting at ``lineno`` (parenthesised values)."""
    extra, depth = 0, lines[lineno - 1].count("(") - lines[lineno - 1].count(")")
    while depth > 0:
        extra += 1
        line = lines[lineno - 1 + extra]
        depth += line.count("(") - line.count(")")
    return extra


def _semconv_group(name: Name) -> str:
    """Which table of the page a name belongs in (``SEMCONV_GROUPS``)."""
    constant, value = name.constant, name.value
    rules = (
        ("spans", constant.startswith("Phase.") or constant == "TRAINING_WINDOW_SPAN"),
        ("events", constant.startswith("Event.")),
        ("sets", not isinstance(value, str)),
        ("resource", "resource attributes" in name.section),
        ("metrics", "metric" in name.section and constant.startswith("METRIC_")),
        ("values", "." not in str(value) or constant.endswith("_EVENT")),
    )
    return next((group for group, matches in rules if matches), "attributes")


SEMCONV_GROUPS = {
    "spans": (
        "Span names",
        "Every phase is a span of that name, with the same value in `ml.training.phase` "
        "(`traintel.semconv.Phase`).",
    ),
    "events": ("Span events", "Event names on phase spans (`traintel.semconv.Event`)."),
    "resource": (
        "Resource attributes",
        "The run's identity, on the resource of every span and metric.",
    ),
    "attributes": (
        "Span and event attributes",
        "On phase spans and their events, and on the metrics where noted. A name ending in `.` is "
        "the prefix of a family of attributes.",
    ),
    "metrics": (
        "Metric instruments",
        "Instrument names; their units, kinds and attributes are described in "
        "[Metrics](../concepts/metrics.md).",
    ),
    "values": (
        "Values and other names",
        "Attribute values with a fixed meaning, the instrumentation scope, and other names.",
    ),
    "sets": (
        "Phase groups and goodput categories",
        "Sets of the names above that traintel's accounting uses.",
    ),
}


def _value_markdown(value: Any) -> str:
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, dict):
        return ", ".join(f"{_value_markdown(k)} → {_value_markdown(v)}" for k, v in value.items())
    if isinstance(value, (frozenset, set)):
        return ", ".join(sorted(_value_markdown(v) for v in value))
    if isinstance(value, (tuple, list)):
        return ", ".join(_value_markdown(v) for v in value)
    return f"`{value!r}`"


def semantic_conventions_page() -> str:
    from traintel import semconv

    names = semconv_names()
    intro = " ".join((semconv.__doc__ or "").split("\n\n", 1)[-1].split())
    out = [
        "# Semantic conventions\n",
        "Every span, event, attribute and metric name traintel emits, generated from "
        f"`traintel.semconv`. {_escape_html(intro)}\n",
    ]
    for group, (title, description) in SEMCONV_GROUPS.items():
        members = [name for name in names if _semconv_group(name) == group and not name.follows]
        out.append(f"## {title}\n\n{description}\n")
        head = "Values" if group == "sets" else "Name"
        out += [f"| {head} | Constant | Description |", "| --- | --- | --- |"]
        for name in members:
            rows = [name, *name.run]
            values = "<br>".join(_value_markdown(row.value) for row in rows)
            constants = "<br>".join(f"`{row.constant}`" for row in rows)
            comment = _escape_html(_link_variables(name.comment, "environment.md"))
            out.append(f"| {_cell(values)} | {constants} | {_cell(comment)} |")
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# CLI


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=100, max_help_position=40)


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    try:
        text = text % {**vars(action), "prog": prog}
    except (KeyError, TypeError, ValueError):
        pass
    return text


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    if action.nargs == 0:
        metavar = ""
    elif action.metavar is None and action.choices:
        metavar = " {" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"`{option}{metavar}`" for option in action.option_strings)


def _details(action: argparse.Action, exclusive: dict[argparse.Action, list[str]]) -> list[str]:
    details = []
    if action.nargs == "+":
        details.append("one or more")
    elif action.nargs == "*":
        details.append("any number")
    if action.required and action.option_strings:
        details.append("required")
    if action.choices:
        details.append("one of " + ", ".join(f"`{choice}`" for choice in action.choices))
    shown = action.nargs != 0 and action.default not in (None, argparse.SUPPRESS)
    if shown and action.option_strings and "default" not in (action.help or ""):
        details.append(f"default `{action.default}`")
    if action in exclusive:
        details.append("not with " + ", ".join(f"`{option}`" for option in exclusive[action]))
    return details


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _usage(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = _formatter
    if hasattr(parser, "color"):  # Python 3.14 colours help on a terminal
        parser.color = False
    return parser.format_usage().strip()


def _arguments_table(parser: argparse.ArgumentParser) -> list[str]:
    exclusive: dict[argparse.Action, list[str]] = {}
    for group in parser._mutually_exclusive_groups:
        for action in group._group_actions:
            exclusive[action] = [
                other.option_strings[-1] for other in group._group_actions if other is not action
            ]
    rows = ["| Argument | Description |", "| --- | --- |"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        details = _details(action, exclusive)
        text = _help(action, parser.prog) + (f" ({'; '.join(details)})" if details else "")
        rows.append(f"| {_argument(action)} | {_cell(_escape_html(text))} |")
    return rows


def cli_page() -> str:
    from traintel.cli import build_parser

    parser = build_parser()
    out = [
        "# Command line\n",
        f"`traintel`: {_escape_html(parser.description or '')} The command reads the files the "
        "embedded default exporter writes, and the export spool. Generated from "
        "`traintel.cli.build_parser()`; every subcommand also takes `-h`/`--help`.\n",
        f"```text\n{_usage(parser)}\n```\n",
    ]
    options = _arguments_table(parser)
    if len(options) > 2:
        out += ["| Option | Description |", "| --- | --- |", *options[2:], ""]
    out.append("| Subcommand | What it does |\n| --- | --- |")
    subcommands = list(_subcommands(parser))
    for name, help_text, _ in subcommands:
        out.append(f"| [`traintel {name}`](#traintel-{name}) | {_cell(_escape_html(help_text))} |")
    out.append("")
    for name, help_text, sub in subcommands:
        out.append(f"## `traintel {name}` {{ #traintel-{name} }}\n")
        out.append(f"{_escape_html(help_text[:1].upper() + help_text[1:])}.\n")
        out.append(f"```text\n{_usage(sub)}\n```\n")
        out += _arguments_table(sub)
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Markdown helpers and the hook


def _escape_html(text: str) -> str:
    """``<`` and ``>`` outside code spans, which Markdown would take for HTML tags."""
    parts = re.split(r"(`+[^`]*`+)", text)
    return "".join(
        part if index % 2 else part.replace("<", "&lt;").replace(">", "&gt;")
        for index, part in enumerate(parts)
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


PAGES: dict[str, Callable[[], str]] = {
    "reference/api.md": api_page,
    "reference/environment.md": environment_page,
    "reference/semantic-conventions.md": semantic_conventions_page,
    "reference/cli.md": cli_page,
}


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    # Document the tree this file is in, whatever traintel the environment has installed (as
    # mkdocstrings does with ``paths: [src]``). Not at import: MkDocs restores sys.path after
    # loading a hook.
    if str(SRC.parent) not in sys.path:
        sys.path.insert(0, str(SRC.parent))
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for uri, generate in PAGES.items():
        existing = files.get_file_from_path(uri)
        if existing is not None:
            log.warning("%s is generated: remove docs/%s (it would be replaced)", uri, uri)
            files.remove(existing)
        files.append(File.generated(config, uri, content=generate()))
    return files
