"""The runs in a set of telemetry files, told apart, so that a command reports on one at a time.

Why: a directory such as ``./traintel-runs`` collects every run started from it, and added
together two runs read as one that never happened (their phase times summed, the iteration
lines of one of them). A run is what :func:`~traintel.analysis.run_info.run_key` says.

Finding the runs means reading every file. ``summary`` and ``report`` note the runs in the same
read as everything else (:class:`~traintel.analysis.run_info.RunsSeen`), and read twice only
when the files hold several runs: first to find them (:func:`scan_runs`), then the one shown.
:func:`single_run` tells the usual case from the first line of each file.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterable

from traintel.analysis.parallel import map_files
from traintel.analysis.run_info import RunInfo, RunsSeen, run_key, runs_in_file
from traintel.analysis.summary import fmt_seconds, plain_number
from traintel.exporters.reader import (
    MAX_LINE_BYTES,
    DecodeError,
    analysis_files,
    decode_line,
    open_telemetry_file,
)

#: Ids up to this long are shown whole; longer ones (uuids) by a unique prefix of at least
#: ``_SHORT_ID`` characters, which ``--run`` accepts.
_WHOLE_ID = 16
_SHORT_ID = 12
#: Other runs named in the note under a report; the rest are counted.
_NAMED_OTHERS = 5


class RunNotFound(ValueError):
    """``--run`` matched no run, or more than one."""


def scan_runs(
    paths: Iterable[str | os.PathLike[str]],
    progress: Callable[[int], None] | None = None,
    workers: int = 1,
) -> list[RunInfo]:
    """The runs with spans in the files or directories, newest (latest start) first; the
    files are read in ``workers`` processes when more than one. Lines that cannot be read are
    left to the full read, which counts and names them."""
    files = [str(path) for path in analysis_files(paths)]
    seen = RunsSeen()
    for part in map_files(runs_in_file, files, workers, progress):
        seen.merge(part)
    return seen.newest_first()


def single_run(files: Iterable[str]) -> str | None:
    """The run every file's first line belongs to, if they all name the same one and only it:
    then one read of every file is very likely all a command needs (it still notes every run
    it meets, and the command reads again if another turns up). None when they differ, or a
    first line cannot be read."""
    found: set[str] = set()
    for path in files:
        try:
            with open_telemetry_file(path) as fh:
                line = fh.readline(MAX_LINE_BYTES + 1)
                while line and not line.strip():
                    line = fh.readline(MAX_LINE_BYTES + 1)
        except (OSError, EOFError):  # (EOFError: a compressed file cut short)
            return None
        if not line.strip():
            continue  # an empty file holds no run
        try:
            records = decode_line(line.strip())
        except (UnicodeDecodeError, DecodeError):
            return None
        found.update(run_key(record.resource) for record in records)
        if len(found) > 1:
            return None
    return found.pop() if len(found) == 1 else None


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
    restarted = any(run.restarts for run in runs)
    header = ["run", "service", "started (UTC)", "duration", "ranks"]
    header += ["restarts"] if restarted else []
    header += ["iterations", "files"]
    rows = [header]
    for run in runs:
        row = [ids[run.id], ", ".join(sorted(run.services)) or "-", run.started]
        row += [fmt_seconds(run.duration_s), plain_number(len(run.ranks))]
        row += [plain_number(run.restarts)] if restarted else []
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
