"""The ``traintel`` command."""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from traintel.analysis.goodput import SessionGoodput, compute_goodput, load_jobs, parse_time, render_goodput
from traintel.analysis.goodput.process import Job
from traintel.analysis.goodput.text import ranks_text
from traintel.analysis.links import TraceLinks
from traintel.analysis.parallel import auto_workers, input_bytes
from traintel.analysis.run_info import RunInfo, RunsSeen, utc_text
from traintel.analysis.runs import (
    RunNotFound,
    find_run,
    note_on_others,
    render_runs,
    scan_runs,
    section_title,
    short_ids,
    single_run,
)
from traintel.analysis.summary import render, summarize
from traintel.environment_variables import TRAINTEL_OUTPUT_DIR
from traintel.exporters.private_files import open_private
from traintel.exporters.progress_mark import mark_path, read_mark
from traintel.exporters.reader import ReadStats, analysis_files, last_line_read, never_written
from traintel.terminal_text import SafeStream
from traintel.version import __version__

if TYPE_CHECKING:
    from traintel.analysis.compare import Comparison
    from traintel.analysis.report import Report

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Build(Protocol[T_co]):
    """How a command reads its files (``build_report``, ``summarize``)."""

    def __call__(
        self, paths: list[str], *, run: str | None, workers: int, progress: Callable[[int], None] | None
    ) -> T_co: ...


#: Inputs at least this large get a progress bar (when stderr is a terminal).
PROGRESS_BYTES = 16 * 1024 * 1024
#: Characters of a run id not kept in the name of its HTML page (a session tag is free text).
_UNSAFE_IN_NAME = re.compile(r"[^\w.-]")


def _files(paths: Sequence[str]) -> list[str]:
    """The files the commands read of ``paths`` (:func:`analysis_files`), none where a path does
    not exist (a mistyped rank's file left out would make a report of the others, said nowhere:
    :func:`_no_files` names it); a progress mark without its file is said (below)."""
    if not all(os.path.lexists(path) or never_written(Path(path)) for path in paths):
        return []
    files = analysis_files(paths)
    _say_marks_without_file([path for path in files if never_written(path)])
    return [str(path) for path in files]


def _say_marks_without_file(lone: list[Path]) -> None:
    """A job killed before its first spans left the process (the embedded file gathers them for
    a minute) has a progress mark and no file: said, so that it is not silently absent."""
    for file in lone:
        last = ((read_mark(file) or {}).get("progress") or {}).get("last_iteration")
        where = "with no iteration" if last is None else f"at iteration {last}"
        print(
            f"traintel: {mark_path(file)}: a job {where} by its progress mark has no spans written "
            "(killed in its first minute, or still in it: the file gathers spans for 60 s; "
            "OTEL_BSP_SCHEDULE_DELAY=5000 writes every 5 s); its time and iterations are counted "
            "from the mark",
            file=sys.stderr,
        )


def _no_files(paths: Sequence[str]) -> int:
    missing = [path for path in paths if not (os.path.lexists(path) or never_written(Path(path)))]
    if missing:
        print(f"traintel: no such file or directory: {', '.join(missing)}", file=sys.stderr)
    else:
        print(f"traintel: no telemetry files found in {', '.join(paths)}", file=sys.stderr)
    return 2


def _inputs(args: argparse.Namespace) -> tuple[list[str], TraceLinks] | int:
    """The files of ``args.paths`` and the trace links; an exit code (said) without files or
    links."""
    files = _files(args.paths)
    if not files:
        return _no_files(args.paths)
    links = _links()
    return 2 if links is None else (files, links)


def _with_progress(files: list[str], work: Callable[[Callable[[int], None] | None], T]) -> T:
    """Run ``work`` with a byte-progress callback when the input is large and stderr is a tty."""
    total = input_bytes(files)
    if total < PROGRESS_BYTES or not sys.stderr.isatty():
        return work(None)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress(
        "reading",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(file=getattr(sys.stderr, "stream", sys.stderr)),  # its cursor codes, numbers
        transient=True,
    ) as bar:
        task = bar.add_task("read", total=total)
        return work(lambda n: bar.advance(task, n))


def _workers(args: argparse.Namespace, files: Sequence[str]) -> int:
    """``--workers``, else one process per CPU up to one per file for a large input."""
    if args.workers is not None:
        return int(args.workers)
    return auto_workers(list(files))


def _no_spans(paths: Sequence[str], stats: ReadStats) -> int:
    """Files found but no span in them: say why (a report of nothing would look like success)."""
    why = f": {stats.skipped} unreadable line(s), e.g. {stats.reasons[0]}" if stats.skipped else ""
    if stats.lines and not why:  # the job's spans went elsewhere: the file has its metrics
        why = (
            f": {stats.lines} line(s) of metrics or logs only (the job's spans were exported "
            "elsewhere: OTEL_TRACES_EXPORTER, or the job's own tracer provider)"
        )
    print(f"traintel: no readable spans in {', '.join(paths)}{why}", file=sys.stderr)
    return 1


def _where(paths: Sequence[str]) -> str:
    """The inputs as the user would type them again (quoted where needed)."""
    return " ".join(shlex.quote(path) for path in paths)


@dataclass
class _Choice:
    """The runs a command shows, out of those in its files."""

    shown: list[RunInfo]  # empty: the files name no run; everything is read as one
    found: list[RunInfo]
    note: str | None = None  # said with the output when runs were left out

    def others(self) -> list[str]:
        return [run.id for run in self.found if run not in self.shown]


def _choice_of(args: argparse.Namespace, found: list[RunInfo]) -> _Choice | int:
    """``--run ID``, ``--all``, or by default the newest run with a note naming the others: two
    runs added together would read as one that never happened. An exit code on a bad ``--run``."""
    if not found:
        return _Choice([], [])
    if args.all:
        return _Choice(found, found)
    if args.run is not None:
        try:
            return _Choice([find_run(found, args.run)], found)
        except RunNotFound as exc:
            print(f"traintel: {exc}", file=sys.stderr)
            return 2
    note = note_on_others(found[0], found, _where(args.paths)) if len(found) > 1 else None
    return _Choice([found[0]], found, note)


def _read_runs(
    args: argparse.Namespace,
    files: list[str],
    build: _Build[T],
    runs_of: Callable[[T], RunsSeen],
) -> tuple[_Choice, list[tuple[RunInfo | None, T]]] | int:
    """Each run shown, read: ``build(its files, run=its run key, workers=, progress=)``, in
    ``--workers`` processes and with a progress bar.

    When every file starts with the same run (one job's files, a collector's node files), its
    files are read once, and what that read saw of the runs settles the choice; another run met
    on the way that is newer is read after it. Otherwise (several runs, ``--run``, ``--all``)
    the runs are found first, then each shown is read from its own files.
    """

    def read(run_files: list[str], run: str | None) -> T:
        workers = _workers(args, run_files)
        return _with_progress(run_files, lambda p: build(run_files, run=run, workers=workers, progress=p))

    hint = None if args.all or args.run is not None else single_run(files)
    if hint is None:
        scan = functools.partial(scan_runs, files, workers=_workers(args, files))
        return _read_each(_choice_of(args, _with_progress(files, scan)), files, read)
    result = read(files, hint)
    found = runs_of(result).newest_first()
    choice = _choice_of(args, found)
    if isinstance(choice, int) or (found and found[0].id != hint):  # a newer run, met on the way
        return _read_each(choice, files, read)
    return choice, [(choice.shown[0] if choice.shown else None, result)]  # the run read is the one shown


def _read_each(
    choice: _Choice | int, files: list[str], read: Callable[[list[str], str | None], T]
) -> tuple[_Choice, list[tuple[RunInfo | None, T]]] | int:
    """Each run shown, read from its own files (an exit code passes through)."""
    if isinstance(choice, int):
        return choice
    targets: list[tuple[RunInfo | None, list[str]]] = [(run, run.files) for run in choice.shown]
    targets = targets or [(None, files)]  # the files name no run: all of them, as one
    return choice, [(run, read(run_files, run.id if run else None)) for run, run_files in targets]


def _add_run_choice(
    parser: argparse.ArgumentParser, every: str = "every run, one after the other, newest first"
) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--run",
        metavar="ID",
        help="the run to show: its id or a unique prefix (traintel runs lists them); default: the newest",
    )
    group.add_argument("--all", action="store_true", help=every)


def _report(args: argparse.Namespace) -> int:
    from traintel.analysis.report import build_report

    inputs = _inputs(args)
    if isinstance(inputs, int):
        return inputs
    files, links = inputs
    done = _read_runs(args, files, build_report, lambda report: report.summary.runs)
    if isinstance(done, int):
        return done
    choice, reports = done
    for _run, report in reports:
        if not report.read_anything:
            return _no_spans(args.paths, report.stats)
    pages = _write_html(args.html, reports, choice, links)
    if pages is None:
        return 2
    if args.json:
        _print_report_json(reports, choice, args.all)
    elif pages:  # the page is what was asked for: say where it is, not the whole report again
        _say_pages(choice, pages)
    else:
        _print_report_text(reports, choice, links)
    return 0


def _say_pages(choice: _Choice, pages: list[str]) -> None:
    if choice.note:
        print(choice.note + "\n")
    for page in pages:
        print(f"HTML report: {page}")


def _write_html(
    target: str | None, reports: list[tuple[RunInfo | None, Report]], choice: _Choice, links: TraceLinks
) -> list[str] | None:
    """One self-contained page per run shown (``OUT-<run>.html`` for several); None on failure."""
    if not target:
        return []
    from traintel.analysis.report_html import render_html

    ids = short_ids(choice.found)
    pages = []
    for run, report in reports:
        page = target
        if len(reports) > 1 and run is not None:
            name, tag = Path(target), _UNSAFE_IN_NAME.sub("_", ids[run.id])
            page = str(name.with_name(f"{name.stem}-{tag}{name.suffix}"))
        if not _write_page(page, render_html(report, links)):
            return None
        pages.append(page)
    return pages


def _print_report_json(reports: list[tuple[RunInfo | None, Report]], choice: _Choice, every: bool) -> None:
    """One report object; ``{"runs": [...]}`` with ``--all``. A note goes to stderr, so that
    stdout stays one JSON document."""
    if every:
        print(json.dumps({"runs": [report.as_dict() for _, report in reports]}, indent=2, default=str))
        return
    data = reports[0][1].as_dict()
    data["other_runs"] = choice.others()
    print(json.dumps(data, indent=2, default=str))
    if choice.note:
        print(choice.note, file=sys.stderr)


def _print_report_text(
    reports: list[tuple[RunInfo | None, Report]], choice: _Choice, links: TraceLinks
) -> None:
    from rich.console import Console, Group

    from traintel.analysis.report_text import renderables, trace_links

    console = Console()
    if choice.note:
        console.print(choice.note + "\n", markup=False, highlight=False)
    for n, (run, report) in enumerate(reports, 1):
        if len(reports) > 1 and run is not None:  # a rule, then the title: a rule would cut it
            console.rule()
            console.print(
                section_title(run, n, len(reports)) + "\n", style="bold", markup=False, highlight=False
            )
        console.print(Group(*renderables(report, console.width)))
        for line in trace_links(report, links):
            print(line)


def _runs(args: argparse.Namespace) -> int:
    files = _files(args.paths)
    if not files:
        return _no_files(args.paths)
    found = _with_progress(files, functools.partial(scan_runs, files, workers=auto_workers(files)))
    if not found:
        print(f"traintel: no runs in {', '.join(args.paths)}: no readable spans", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"runs": [run.as_dict() for run in found]}, indent=2))
    else:
        print(render_runs(found, _where(args.paths)))
    return 0


def _export_trace(args: argparse.Namespace) -> int:
    files = _files(args.paths)
    if not files:
        return _no_files(args.paths)
    chosen = _trace_choice(args, files)
    if isinstance(chosen, int):
        return chosen
    files, run, note = chosen
    stats = ReadStats()
    said = sys.stderr if args.output == "-" else sys.stdout  # stdout: the trace itself, with "-"
    if note:
        print(note, file=said)
    events = _write_trace(args.output, files, stats, run)
    if events is None:
        return 2
    if not events:  # an empty trace written with exit 0 looked like success, as a report would
        return _no_spans(args.paths, stats)
    where = "standard output" if args.output == "-" else args.output
    print(
        f"wrote {events:,} trace events to {where} (open in https://ui.perfetto.dev or chrome://tracing)",
        file=said,
    )
    if stats.skipped:
        print(f"skipped {stats.skipped} unreadable line(s): {'; '.join(stats.reasons[:3])}", file=said)
    return 0


def _write_trace(output: str, files: list[str], stats: ReadStats, run: str | None) -> int | None:
    """The trace of ``run`` (None: all) written to ``output`` ("-": standard output); its
    event count, or None where it could not be written (said)."""
    from traintel.analysis.chrome_trace import export_chrome_trace

    try:
        with contextlib.nullcontext(sys.stdout) if output == "-" else open_private(output) as out:
            return _with_progress(
                files, lambda progress: export_chrome_trace(files, out, stats, progress, run)
            )
    except OSError as exc:
        print(f"traintel: cannot write -o {output}: {exc.strerror or exc}", file=sys.stderr)
        return None


def _trace_choice(
    args: argparse.Namespace, files: list[str]
) -> tuple[list[str], str | None, str | None] | int:
    """The files, run and note of the run a trace shows, chosen as the other commands choose it
    (``--all``: every run, in one trace): a directory that keeps every run made from it would
    otherwise give them all. An exit code on a bad ``--run``."""
    if args.all:
        return files, None, None
    scan = functools.partial(scan_runs, files, workers=auto_workers(files))
    choice = _choice_of(args, _with_progress(files, scan))
    if isinstance(choice, int) or len(choice.shown) != 1:
        return choice if isinstance(choice, int) else (files, None, choice.note)
    return choice.shown[0].files, choice.shown[0].id, choice.note


def _compare(args: argparse.Namespace) -> int:
    from traintel.analysis.compare import compare_runs

    links = _links()
    if links is None:
        return 2
    picked = _compare_runs(args)
    if isinstance(picked, int):
        return picked
    reports = _compared_reports(args.runs, picked)
    if isinstance(reports, int):
        return reports
    result = compare_runs(reports, args.threshold)
    names = _run_names(args.runs, picked)
    if args.html:
        from traintel.analysis.compare_html import render_compare_html

        if not _write_page(args.html, render_compare_html(reports, names, result, links)):
            return 2
    _print_comparison(args, result, names, picked)
    return 1 if args.fail_on_regression and result.regressions else 0


def _compared_reports(paths: list[str], picked: list[tuple[RunInfo | None, list[str]]]) -> list[Report] | int:
    """Each run's report; one without a readable span is an error naming its path (compared as
    all "-", it would pass --fail-on-regression)."""
    reports = [_build_report(files, run) for run, files in picked]
    for path, report in zip(paths, reports, strict=True):
        if not report.summary.spans:
            return _no_spans([path], report.stats)
    return reports


def _build_report(files: list[str], run: RunInfo | None) -> Report:
    from traintel.analysis.report import build_report

    return _with_progress(files, functools.partial(build_report, files, run=run.id if run else None))


def _run_names(paths: list[str], picked: list[tuple[RunInfo | None, list[str]]]) -> list[str]:
    return [
        path + (f" (run {run.id})" if run is not None else "")
        for path, (run, _) in zip(paths, picked, strict=True)
    ]


def _print_comparison(
    args: argparse.Namespace,
    result: Comparison,
    names: list[str],
    picked: list[tuple[RunInfo | None, list[str]]],
) -> None:
    """The comparison as JSON, the page written, or tables; on stderr, the regressions that
    ``--fail-on-regression`` fails for."""
    if args.json:
        data = result.as_dict()
        ids = [run.id if run else None for run, _ in picked]
        data["runs"] = {"a": ids[0], "b": ids[1], **({"all": ids} if len(ids) > 2 else {})}
        print(json.dumps(data, indent=2))
    elif args.html:
        print(f"HTML comparison: {args.html}")
    else:
        from rich.console import Console, Group

        from traintel.analysis.compare import render_comparison

        Console().print(Group(*render_comparison(result, names)))
    if args.fail_on_regression and result.regressions:  # why the step fails, whatever was printed
        worse = ", ".join(d.metric for d in result.regressions)
        print(f"traintel: --fail-on-regression: worse than A: {worse}", file=sys.stderr)


def _write_page(page: str, text: str) -> bool:
    try:
        with open_private(page) as out:
            out.write(text)
    except OSError as exc:
        print(f"traintel: cannot write --html {page}: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True


def _links() -> TraceLinks | None:
    """``TRAINTEL_TRACE_URL`` as trace links; None (said on stderr) when it is malformed."""
    try:
        return TraceLinks.from_env()
    except ValueError as exc:
        print(f"traintel: {exc}", file=sys.stderr)
        return None


def _compare_runs(args: argparse.Namespace) -> list[tuple[RunInfo | None, list[str]]] | int:
    """The run of each path: ``--run-a``/``--run-b`` for the first two, else the newest in its
    path; a path given k times (and without an id) stands for its k newest runs, oldest first
    (the same directory twice: its previous run (A) against its newest (B)). A path given once
    stands for two, never for one run twice (it holds one, or the ids name one: an error)."""
    one_path = len(args.runs) == 1
    args.runs *= 2 if one_path else 1
    picked = _picked_runs(args)
    if isinstance(picked, int) or not one_path:
        return picked
    (a, _), (b, _) = picked
    if a is not None and a == b:
        print(
            f"traintel: compare: A and B would both be run {a.id} of {args.runs[0]}: "
            "give a second path, or --run-a and --run-b naming two different runs",
            file=sys.stderr,
        )
        return 2
    return picked


def _picked_runs(args: argparse.Namespace) -> list[tuple[RunInfo | None, list[str]]] | int:
    scanned = _scan_each(args.runs)
    if isinstance(scanned, int):
        return scanned
    wanted = [args.run_a_id, args.run_b_id] + [None] * (len(args.runs) - 2)
    newest = _newest_runs(scanned, [path for path, run in zip(args.runs, wanted, strict=True) if run is None])
    picked: list[tuple[RunInfo | None, list[str]]] = []
    for n, (path, run_id) in enumerate(zip(args.runs, wanted, strict=True)):
        files, found = scanned[path]
        if not found:
            picked.append((None, files))
            continue
        try:
            run = find_run(found, run_id) if run_id is not None else newest[path].pop(0)
        except RunNotFound as exc:
            print(f"traintel: {'AB'[n]}: {exc}", file=sys.stderr)
            return 2
        picked.append((run, run.files))
    return picked


def _newest_runs(
    scanned: dict[str, tuple[list[str], list[RunInfo]]], unnamed: list[str]
) -> dict[str, list[RunInfo]]:
    """The runs the occurrences of each path given without an id take, in order: its k newest,
    oldest first, for k occurrences (its newest for each, where it holds fewer than k)."""
    counts = collections.Counter(unnamed)
    return {
        path: found[:k][::-1] if k <= len(found) else [found[0]] * k
        for path, k in counts.items()
        if (found := scanned[path][1])
    }


def _scan_each(paths: list[str]) -> dict[str, tuple[list[str], list[RunInfo]]] | int:
    """The files and runs of each path (once each); an exit code for a path without files."""
    scanned: dict[str, tuple[list[str], list[RunInfo]]] = {}
    for path in dict.fromkeys(paths):
        files = _files([path])
        if not files:
            return _no_files([path])
        scanned[path] = (files, _with_progress(files, functools.partial(scan_runs, files)))
    return scanned


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:  # inf would flag nothing: a --fail-on-regression that never fails
        raise argparse.ArgumentTypeError(
            f"must be a finite number > 0 (a fraction: 0.05 is 5%), got {text!r}"
        )
    return value


def _summary(args: argparse.Namespace) -> int:
    inputs = _inputs(args)
    if isinstance(inputs, int):
        return inputs
    files, links = inputs
    done = _read_runs(args, files, summarize, lambda summary: summary.runs)
    if isinstance(done, int):
        return done
    choice, summaries = done
    if choice.note:
        print(choice.note + "\n")
    for n, (run, summary) in enumerate(summaries, 1):
        if not summary.run_keys:  # no span of a run, nor a run known from its mark alone
            return _no_spans(args.paths, summary.stats)
        if len(summaries) > 1 and run is not None:
            print(("\n" if n > 1 else "") + f"=== {section_title(run, n, len(summaries))} ===")
        print(render(summary, links))
    return 0


def _time(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _goodput(args: argparse.Namespace) -> int:
    inputs = _inputs(args)
    if isinstance(inputs, int):
        return inputs
    if not _interval_ok(args):
        return 2
    names, links = inputs
    stats = ReadStats()
    work = functools.partial(load_jobs, names, stats, _workers(args, names))
    jobs = _with_progress(names, lambda progress: work(progress=progress))
    if not jobs:
        return _no_spans(args.paths, stats)
    results = compute_goodput(jobs, args.start, args.end, args.rank, args.by_perf_tag)
    if args.session is not None:
        results = [r for r in results if r.session == args.session]
    if not results:  # (an interval or a session none of the files has: said, not "none found")
        return _nothing_selected(args, jobs)
    if not _rank_found(args.rank, results):
        return 2
    _print_goodput(args, results, stats, links)
    return 0


def _nothing_selected(args: argparse.Namespace, jobs: list[Job]) -> int:
    """``--session`` naming none of the files' sessions, or ``--start``/``--end`` outside all
    of them: an error saying what there is."""
    if args.session is not None and all(job.session != args.session for job in jobs):
        sessions = ", ".join(sorted({job.session for job in jobs}))
        said = f"--session {args.session}: no such session in these files ({sessions})"
    else:
        said = f"no session in these files overlaps --start/--end: they run from {_covered(jobs)} UTC"
    print(f"traintel: {said}", file=sys.stderr)
    return 2


def _covered(jobs: list[Job]) -> str:
    """The time the jobs' processes cover, from the first start to the last end."""
    processes = [process for job in jobs for process in job.ranks.values()]
    first = min(process.start_ns for process in processes)
    return f"{utc_text(first)} to {utc_text(max(process.stop_ns for process in processes))}"


def _rank_found(rank: int | None, results: list[SessionGoodput]) -> bool:
    """``--rank N`` names a rank of at least one job shown (where some jobs lack it, their
    lowest rank counts and the output says so); else an error naming the ranks there are."""
    jobs = [job for result in results for job in result.jobs]
    if rank is None or not jobs or any(job.rank_missing is None for job in jobs):
        return True
    ranks = ranks_text(sorted({r for job in jobs for r in job.ranks}))
    print(f"traintel: --rank {rank}: no job in these files has rank {rank} (ranks: {ranks})", file=sys.stderr)
    return False


def _print_goodput(
    args: argparse.Namespace, results: list[SessionGoodput], stats: ReadStats, links: TraceLinks
) -> None:
    if args.json:
        print(
            json.dumps({"sessions": [r.as_dict() for r in results], "skipped_lines": stats.skipped}, indent=2)
        )
        return
    print(render_goodput(results, links))
    if stats.skipped:
        print(f"skipped {stats.skipped} unreadable line(s): {'; '.join(stats.reasons[:3])}")


def _interval_ok(args: argparse.Namespace) -> bool:
    if args.start is not None and args.end is not None and args.end <= args.start:
        print(f"traintel: --end must be after --start (got {args.start} and {args.end} ns)", file=sys.stderr)
        return False
    return True


def _replay(args: argparse.Namespace) -> int:
    from traintel.config import ConfigurationError
    from traintel.exporters.replay import endpoint_key, otlp_span_exporter, render, replay, replay_files

    files = replay_files(args.paths)
    if not files:
        return _no_files(args.paths)
    try:
        exporter = otlp_span_exporter(args.endpoint, args.protocol)
        key = endpoint_key(args.endpoint, args.protocol)
    except ConfigurationError as exc:
        print(f"traintel: {exc}", file=sys.stderr)
        return 2
    try:
        result = replay(files, exporter, delete_sent=args.delete_sent, target=key)
    finally:
        exporter.shutdown()
    print(render(result, key.split(" ", 1)[1]))
    return 0 if result.ok else 1


def _processes(text: str) -> int:
    """``--workers``: a whole number of processes, 1 or more (0 ran one, said nowhere)."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a number of processes, 1 or more: {text!r}")
    return number


def _add_workers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=_processes,
        metavar="N",
        help="processes reading the files (default: one per CPU, up to one per file, for inputs over 64 MiB)",
    )


_PATHS_HELP = (
    "files or directories of one or more jobs (default: $TRAINTEL_OUTPUT_DIR, else ./traintel-runs, "
    "where a job run from here writes)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traintel", description="OpenTelemetry-native training telemetry.")
    parser.add_argument("--version", action="version", version=f"traintel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    runs = sub.add_parser("runs", help="the runs in the files, newest first (ids for --run)")
    runs.add_argument("paths", nargs="*", help=_PATHS_HELP)
    runs.add_argument("--json", action="store_true", help="machine-readable output")
    runs.set_defaults(func=_runs)
    summary = sub.add_parser("summary", help="a short summary of a run from its OTLP/JSON-lines files")
    summary.add_argument("paths", nargs="*", help=_PATHS_HELP)
    _add_run_choice(summary)
    _add_workers(summary)
    summary.set_defaults(func=_summary)
    goodput = sub.add_parser(
        "goodput", help="goodput and badput of each training session (across restarts and ranks)"
    )
    goodput.add_argument("paths", nargs="*", help=_PATHS_HELP)
    goodput.add_argument(
        "--start", type=_time, help="interval start: ISO 8601 (UTC by default) or Unix seconds"
    )
    goodput.add_argument("--end", type=_time, help="interval end: ISO 8601 (UTC by default) or Unix seconds")
    goodput.add_argument("--json", action="store_true", help="machine-readable output")
    goodput.add_argument("--session", help="only this session_tag")
    goodput.add_argument("--by-perf-tag", action="store_true", help="split sessions by perf_tag too")
    goodput.add_argument("--rank", type=int, help="the rank whose timeline counts (default: the lowest)")
    _add_workers(goodput)
    goodput.set_defaults(func=_goodput)
    report = sub.add_parser(
        "report", help="the full report of one or more jobs/ranks: tables, --json, or an --html page"
    )
    report.add_argument("paths", nargs="*", help=_PATHS_HELP)
    report.add_argument("--json", action="store_true", help="machine-readable output")
    report.add_argument(
        "--html", metavar="OUT.html", help="also write a self-contained HTML report (with --all: one per run)"
    )
    _add_run_choice(report)
    _add_workers(report)
    report.set_defaults(func=_report)
    trace = sub.add_parser(
        "export-trace", help="a Chrome trace event file (Perfetto, chrome://tracing), one track per rank"
    )
    trace.add_argument("paths", nargs="*", help=_PATHS_HELP)
    trace.add_argument(
        "-o",
        "--output",
        required=True,
        help="the trace file to write (e.g. trace.json; - for standard output)",
    )
    _add_run_choice(trace, "every run, in one trace")
    trace.set_defaults(func=_export_trace)
    comp = sub.add_parser(
        "compare",
        help="runs side by side against the first: differences flagged, --html overlays their curves",
    )
    comp.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="two or more runs (files or directories; the newest run of each, the first is the baseline A); "
        "a directory given k times stands for its k newest runs, oldest first; given once, for its two "
        "newest (or the two --run-a and --run-b name)",
    )
    comp.add_argument("--run-a", dest="run_a_id", metavar="ID", help="the baseline's run id (or a prefix)")
    comp.add_argument("--run-b", dest="run_b_id", metavar="ID", help="the compared run's id (or a prefix)")
    comp.add_argument(
        "--threshold", type=_threshold, default=0.05, help="relative change to flag (default 0.05 = 5%%)"
    )
    comp.add_argument("--json", action="store_true", help="machine-readable output")
    comp.add_argument(
        "--html", metavar="OUT.html", help="write a self-contained page: overlaid curves, run table, configs"
    )
    comp.add_argument("--fail-on-regression", action="store_true", help="exit 1 if anything got worse")
    comp.set_defaults(func=_compare)
    rep = sub.add_parser(
        "replay", help="send a spool or embedded-default files to an OTLP endpoint (spans, in order)"
    )
    rep.add_argument("paths", nargs="+", help="spool directories, files or directories of files")
    rep.add_argument("--endpoint", help="OTLP endpoint (default: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)")
    rep.add_argument(
        "--protocol",
        choices=("grpc", "http/protobuf"),
        help="default: OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, else grpc",
    )
    rep.add_argument(
        "--delete-sent",
        action="store_true",
        help="remove the files all of whose spans were delivered (not when the replay stopped)",
    )
    rep.set_defaults(func=_replay)
    return parser


def default_output_dir() -> str:
    """Where a job's embedded default writes: ``TRAINTEL_OUTPUT_DIR``, else ``traintel-runs``."""
    return os.environ.get(TRAINTEL_OUTPUT_DIR) or "traintel-runs"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "paths", None) == []:  # what a job run from here wrote, by default
        args.paths = [default_output_dir()]
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``| head``): the rest of the output is not wanted. Point stdout
        # at /dev/null so the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # a record the command cannot use (or a bug): one line, no traceback
        print(
            f"traintel {args.command}: stopped at {last_line_read() or 'the input'} "
            f"({type(exc).__name__}: {str(exc)[:200]}): a damaged or hand-made record, or a bug; "
            "please report it with that line",
            file=sys.stderr,
        )
        return 3
    finally:
        sys.stdout, sys.stderr = streams
    return code


if __name__ == "__main__":
    sys.exit(main())
