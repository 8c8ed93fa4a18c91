"""The runs in a set of telemetry files, told apart, so that a command reports on one at a time.

Why: a directory such as ``./traintel-runs`` collects every run started from it, and added
together two runs read as one that never happened (their phase times summed, the iteration
lines of one of them). A run is what :func:`~traintel.analysis.summary.run_key` says: the ranks
of a job share a run id and the jobs of a restarted session share a session tag, so neither is
split apart.

Why a scan of its own, on plain JSON (orjson, the standard parser for what orjson refuses):
finding the runs means reading every file before the chosen run is read in full, and the scan
reads only a run's identity, times, iterations and files. Lines the scan cannot read are left to
the full read, which counts and names them.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from traintel import semconv
from traintel.analysis.summary import fmt_seconds, plain_number, run_key
from traintel.exporters.reader import MAX_LINE_BYTES, expand_paths, gc_paused

__all__ = [
    "RunInfo",
    "RunNotFound",
    "find_run",
    "note_on_others",
    "render_runs",
    "scan_runs",
    "section_title",
    "short_ids",
]

_W = semconv.WINDOW_PREFIX
_WINDOW_EVENT = semconv.Event.TRAINING_METRICS_UPDATE.value
#: Identity attributes the scan keeps from a resource (the rest is not needed to list runs).
_IDENTITY = frozenset(
    {
        semconv.SESSION_TAG,
        semconv.RUN_ID,
        semconv.SERVICE_INSTANCE_ID,
        semconv.SERVICE_NAME,
        semconv.HOST_NAME,
        semconv.RANK,
        semconv.RESTART_COUNT,
    }
)
#: Ids up to this long are shown whole; longer ones (uuids) by a unique prefix of at least
#: ``_SHORT_ID`` characters, which ``--run`` accepts.
_WHOLE_ID = 16
_SHORT_ID = 12
#: Other runs named in the note under a report; the rest are counted.
_NAMED_OTHERS = 5

#: A process of a run: (run id, restart count, rank).
_Process = tuple[str, int, int]


class RunNotFound(ValueError):
    """``--run`` matched no run, or more than one."""


@dataclass
class RunInfo:
    """One run in the files: who it was, when, how big, and which files hold it."""

    id: str
    run_ids: set[str] = field(default_factory=set)
    services: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    #: Launches of the run (a restarted job has several): (run id, restart count).
    jobs: set[tuple[str, int]] = field(default_factory=set)
    start_ns: int = 0
    end_ns: int = 0
    spans: int = 0
    #: The files holding the run, in the order read (a dict keeps order and drops repeats).
    file_set: dict[str, None] = field(default_factory=dict)
    #: Per process, iterations counted from its window spans and from its window events.
    window_iterations: dict[_Process, list[int]] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        return list(self.file_set)

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    @property
    def started(self) -> str:
        """The start in UTC, to the second (the file names' clock, whatever the local zone)."""
        moment = datetime.fromtimestamp(self.start_ns / 1e9, tz=timezone.utc)
        return moment.strftime("%Y-%m-%d %H:%M:%S")

    @property
    def iterations(self) -> int:
        """Training iterations run: per launch the most any of its ranks ran (every rank runs
        them all), summed over launches (iterations a restart ran again count again). Window
        spans are preferred: every window is exported as one, whereas a plain OpenTelemetry
        loop span keeps only its newest window events."""
        per_job: dict[tuple[str, int], int] = {}
        for (run_id, restart, _rank), (from_spans, from_events) in self.window_iterations.items():
            counted = from_spans or from_events
            per_job[(run_id, restart)] = max(per_job.get((run_id, restart), 0), counted)
        return sum(per_job.values())

    def see(self, resource: dict[str, Any], path: str) -> _Process:
        """A resource of this run in ``path``; returns its process."""
        self.file_set.setdefault(path, None)
        run_id = str(resource.get(semconv.RUN_ID) or resource.get(semconv.SERVICE_INSTANCE_ID) or self.id)
        restart = _int(resource.get(semconv.RESTART_COUNT))
        rank = _int(resource.get(semconv.RANK))
        self.run_ids.add(run_id)
        self.jobs.add((run_id, restart))
        self.ranks.add(rank)
        for key, target in ((semconv.SERVICE_NAME, self.services), (semconv.HOST_NAME, self.hosts)):
            if resource.get(key):
                target.add(str(resource[key]))
        return (run_id, restart, rank)

    def add_span(self, process: _Process, span: dict[str, Any]) -> None:
        start = _int(_get(span, "startTimeUnixNano", "start_time_unix_nano"))
        end = _int(_get(span, "endTimeUnixNano", "end_time_unix_nano"))
        self.spans += 1
        if start and (not self.start_ns or start < self.start_ns):
            self.start_ns = start
        self.end_ns = max(self.end_ns, end, start)
        counts = self.window_iterations.setdefault(process, [0, 0])
        if span.get("name") == semconv.TRAINING_WINDOW_SPAN:
            counts[0] += _window_size(span)
        for event in _list(span, "events"):
            if isinstance(event, dict) and event.get("name") == _WINDOW_EVENT:
                counts[1] += _window_size(event)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_ids": sorted(self.run_ids),
            "services": sorted(self.services),
            "hosts": sorted(self.hosts),
            "ranks": sorted(self.ranks),
            "restarts": len(self.jobs) - 1,
            "start_unix_nano": self.start_ns,
            "start_utc": self.started,
            "duration_s": self.duration_s,
            "iterations": self.iterations,
            "spans": self.spans,
            "files": self.files,
        }


def scan_runs(
    paths: Iterable[str | os.PathLike[str]], progress: Callable[[int], None] | None = None
) -> list[RunInfo]:
    """The runs with spans in the files or directories, newest (latest start) first."""
    runs: dict[str, RunInfo] = {}
    with gc_paused():  # no cycles among parsed lines: see gc_paused
        for path in expand_paths(paths):
            for request in _json_lines(path, progress):
                _scan_request(request, str(path), runs)
    found = [run for run in runs.values() if run.spans]
    return sorted(found, key=lambda run: (run.start_ns, run.id), reverse=True)


def _json_lines(path: Path, progress: Callable[[int], None] | None) -> Iterator[dict[str, Any]]:
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, generator-friendly
    except OSError:
        return  # the full read names it
    with fh:
        while raw := fh.readline(MAX_LINE_BYTES + 1):
            if progress is not None:
                progress(len(raw))
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # skip the rest of an oversized line
                    raw = fh.readline(MAX_LINE_BYTES + 1)
                continue
            try:
                tree = orjson.loads(raw)
            except orjson.JSONDecodeError:  # what orjson refuses, the standard parser may take
                try:
                    tree = json.loads(raw)
                except (ValueError, RecursionError):
                    continue
            if isinstance(tree, dict):
                yield tree


def _scan_request(tree: dict[str, Any], path: str, runs: dict[str, RunInfo]) -> None:
    """One OTLP/JSON request: its spans into their runs; a metrics request only names its file
    (a run's metrics may sit in a file of their own)."""
    for resource_spans in _list(tree, "resourceSpans", "resource_spans"):
        resource = _resource(resource_spans)
        run = runs.setdefault(run_key(resource), RunInfo(run_key(resource)))
        process = run.see(resource, path)
        for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans"):
            for span in _list(scope_spans, "spans"):
                if isinstance(span, dict):
                    run.add_span(process, span)
    for resource_metrics in _list(tree, "resourceMetrics", "resource_metrics"):
        resource = _resource(resource_metrics)
        runs.setdefault(run_key(resource), RunInfo(run_key(resource))).see(resource, path)


def _get(tree: dict[str, Any], *names: str) -> Any:
    """A field by its OTLP/JSON name or its proto name (both are valid OTLP/JSON)."""
    for name in names:
        if name in tree:
            return tree[name]
    return None


def _list(tree: Any, *names: str) -> list[Any]:
    value = _get(tree, *names) if isinstance(tree, dict) else None
    return value if isinstance(value, list) else []


def _value(value: Any) -> Any:
    """A scalar OTLP/JSON ``AnyValue`` (64-bit integers arrive as strings)."""
    if not isinstance(value, dict):
        return None
    for name in ("stringValue", "string_value", "boolValue", "bool_value", "doubleValue", "double_value"):
        if name in value:
            return value[name]
    raw = _get(value, "intValue", "int_value")
    return _int(raw) if raw is not None else None


def _resource(tree: dict[str, Any]) -> dict[str, Any]:
    resource = tree.get("resource")
    attributes = _list(resource, "attributes")
    return {
        kv["key"]: _value(kv.get("value"))
        for kv in attributes
        if isinstance(kv, dict) and kv.get("key") in _IDENTITY
    }


def _window_size(record: dict[str, Any]) -> int:
    for kv in _list(record, "attributes"):
        if isinstance(kv, dict) and kv.get("key") == _W + "iterations":
            return max(0, _int(_value(kv.get("value"))))
    return 0


def _int(value: Any) -> int:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        return 0


# --- choosing a run ------------------------------------------------------------------------------
def find_run(runs: list[RunInfo], wanted: str) -> RunInfo:
    """The run ``--run`` names: by its id or one of its run ids, whole or a unique prefix."""
    exact = [run for run in runs if wanted == run.id or wanted in run.run_ids]
    if len(exact) == 1:
        return exact[0]
    matches = exact or [
        run for run in runs if any(name.startswith(wanted) for name in (run.id, *run.run_ids))
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(short_ids(runs).values())
        raise RunNotFound(f"no run {wanted!r} in these files; the runs are: {known}")
    names = ", ".join(run.id for run in matches)
    raise RunNotFound(f"{wanted!r} names {len(matches)} runs ({names}): give more of the id")


def short_ids(runs: list[RunInfo]) -> dict[str, str]:
    """Each run's id as shown in lists: whole when short, else its shortest prefix of at least
    ``_SHORT_ID`` characters that names no other run (what ``--run`` takes)."""
    shown = {}
    for run in runs:
        others = [name for other in runs if other is not run for name in (other.id, *other.run_ids)]
        length = len(run.id) if len(run.id) <= _WHOLE_ID else _SHORT_ID
        while length < len(run.id) and any(name.startswith(run.id[:length]) for name in others):
            length += 1
        shown[run.id] = run.id[:length]
    return shown


# --- text --------------------------------------------------------------------------------------
def render_runs(runs: list[RunInfo], where: str) -> str:
    """``traintel runs``: one line per run, newest first, in 80 columns for usual names."""
    if not runs:
        return f"no runs in {where}"
    ids = short_ids(runs)
    restarted = any(len(run.jobs) > 1 for run in runs)
    header = ["run", "service", "started (UTC)", "duration", "ranks"]
    header += ["restarts"] if restarted else []
    header += ["iterations", "files"]
    rows = [header]
    for run in runs:
        row = [ids[run.id], ", ".join(sorted(run.services)) or "-", run.started]
        row += [fmt_seconds(run.duration_s), plain_number(len(run.ranks))]
        row += [plain_number(len(run.jobs) - 1)] if restarted else []
        row += [plain_number(run.iterations), plain_number(len(run.file_set))]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(width) if i < 3 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    title = f"{len(runs)} run{'s' if len(runs) > 1 else ''} in {where}, newest first:"
    hint = [
        *_wrap(f"Show one with: traintel report {where} --run ID (a prefix will do)"),
        "or each of them, one after the other, with --all.",
    ]
    return "\n".join([title, "", *lines, "", *hint])


def note_on_others(shown: RunInfo, runs: list[RunInfo], where: str) -> str:
    """What a report of the newest run says when the files hold others: that they are there,
    and how to get at them (a report of one run must not pass for all of the input)."""
    ids = short_ids(runs)
    others = [ids[run.id] for run in runs if run is not shown]
    named = ", ".join(others[:_NAMED_OTHERS]) + (
        f" and {len(others) - _NAMED_OTHERS} more" if len(others) > _NAMED_OTHERS else ""
    )
    text = (
        f"Showing the newest of {len(runs)} runs in {where}: {ids[shown.id]}, started "
        f"{shown.started} UTC. Other runs: {named}. Pick one with --run ID, show each with --all, "
        f"list them with: traintel runs {where}"
    )
    return "\n".join(_wrap(text))


def _wrap(text: str) -> list[str]:
    """80 columns, never breaking a path, an id or a flag (they are copied and pasted)."""
    return textwrap.wrap(text, 80, break_long_words=False, break_on_hyphens=False)


def section_title(run: RunInfo, index: int, total: int) -> str:
    """The heading of one run's section under ``--all``."""
    services = ", ".join(sorted(run.services)) or "-"
    return f"Run {index} of {total}: {run.id} ({services}, started {run.started} UTC)"
