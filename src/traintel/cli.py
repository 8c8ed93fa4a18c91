"""The ``traintel`` command."""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from traintel.analysis.goodput import compute_goodput, load_jobs, parse_time, render_goodput
from traintel.analysis.summary import render, summarize
from traintel.exporters.private_files import open_private
from traintel.exporters.reader import ReadStats, expand_paths
from traintel.version import __version__

T = TypeVar("T")

#: Inputs at least this large get a progress bar (when stderr is a terminal).
PROGRESS_BYTES = 16 * 1024 * 1024


def _files(paths: Sequence[str]) -> list[str]:
    return [str(path) for path in expand_paths(paths) if path.is_file()]


def _with_progress(files: list[str], work: Callable[[Callable[[int], None] | None], T]) -> T:
    """Run ``work`` with a byte-progress callback when the input is large and stderr is a tty."""
    total = sum(os.path.getsize(f) for f in files)
    if total < PROGRESS_BYTES or not sys.stderr.isatty():
        return work(None)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress(
        "reading",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("read", total=total)
        return work(lambda n: bar.advance(task, n))


def _no_spans(paths: Sequence[str], stats: ReadStats) -> int:
    """Files found but no span in them: say why (a report of nothing would look like success)."""
    why = f": {stats.skipped} unreadable line(s), e.g. {stats.reasons[0]}" if stats.skipped else ""
    print(f"traintel: no readable spans in {', '.join(paths)}{why}", file=sys.stderr)
    return 1


def _report(args: argparse.Namespace) -> int:
    from traintel.analysis.report import build_report

    files = _files(args.paths)
    if not files:
        print(f"traintel: no telemetry files found in {', '.join(args.paths)}", file=sys.stderr)
        return 2
    report = _with_progress(files, lambda progress: build_report(files, progress))
    if not report.summary.spans:
        return _no_spans(args.paths, report.stats)
    if args.html:
        from traintel.analysis.report_html import render_html

        try:
            with open_private(args.html) as out:
                out.write(render_html(report))
        except OSError as exc:
            print(f"traintel: cannot write --html {args.html}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        from rich.console import Console, Group

        from traintel.analysis.report_text import renderables

        Console().print(Group(*renderables(report)))
        if args.html:
            print(f"HTML report: {args.html}")
    return 0


def _export_trace(args: argparse.Namespace) -> int:
    from traintel.analysis.chrome_trace import export_chrome_trace

    files = _files(args.paths)
    if not files:
        print(f"traintel: no telemetry files found in {', '.join(args.paths)}", file=sys.stderr)
        return 2
    stats = ReadStats()
    try:
        with open_private(args.output) as out:
            events = _with_progress(files, lambda progress: export_chrome_trace(files, out, stats, progress))
    except OSError as exc:
        print(f"traintel: cannot write -o {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {events:,} trace events to {args.output} (open in https://ui.perfetto.dev or chrome://tracing)"
    )
    if stats.skipped:
        print(f"skipped {stats.skipped} unreadable line(s): {'; '.join(stats.reasons[:3])}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from traintel.analysis.compare import compare, render_comparison
    from traintel.analysis.report import build_report

    reports = []
    for path in (args.run_a, args.run_b):
        files = _files([path])
        if not files:
            print(f"traintel: no telemetry files found in {path}", file=sys.stderr)
            return 2
        reports.append(_with_progress(files, functools.partial(build_report, files)))
    result = compare(reports[0], reports[1], args.threshold)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        from rich.console import Console, Group

        Console().print(Group(*render_comparison(result, args.run_a, args.run_b)))
    return 1 if args.fail_on_regression and result.regressions else 0


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0 (a fraction: 0.05 is 5%), got {text!r}")
    return value


def _summary(args: argparse.Namespace) -> int:
    files = [path for path in expand_paths(args.paths) if path.is_file()]
    if not files:
        print(f"traintel: no telemetry files found in {', '.join(args.paths)}", file=sys.stderr)
        return 2
    summary = summarize(files)
    if not summary.spans:
        return _no_spans(args.paths, summary.stats)
    print(render(summary))
    return 0


def _time(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _goodput(args: argparse.Namespace) -> int:
    files = [path for path in expand_paths(args.paths) if path.is_file()]
    if not files:
        print(f"traintel: no telemetry files found in {', '.join(args.paths)}", file=sys.stderr)
        return 2
    if args.start is not None and args.end is not None and args.end <= args.start:
        print(f"traintel: --end must be after --start (got {args.start} and {args.end} ns)", file=sys.stderr)
        return 2
    stats = ReadStats()
    jobs = load_jobs(files, stats)
    if not jobs:
        return _no_spans(args.paths, stats)
    results = compute_goodput(jobs, args.start, args.end, args.rank, args.by_perf_tag)
    if args.session is not None:
        results = [r for r in results if r.session == args.session]
    if args.json:
        print(
            json.dumps({"sessions": [r.as_dict() for r in results], "skipped_lines": stats.skipped}, indent=2)
        )
    else:
        print(render_goodput(results))
        if stats.skipped:
            print(f"skipped {stats.skipped} unreadable line(s): {'; '.join(stats.reasons[:3])}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from traintel.config import ConfigurationError
    from traintel.exporters.replay import endpoint_key, otlp_span_exporter, render, replay, replay_files

    files = replay_files(args.paths)
    if not files:
        print(f"traintel: no telemetry files found in {', '.join(args.paths)}", file=sys.stderr)
        return 2
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traintel", description="OpenTelemetry-native training telemetry.")
    parser.add_argument("--version", action="version", version=f"traintel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary", help="a short summary of a run from its OTLP/JSON-lines files")
    summary.add_argument("paths", nargs="+", help="files or directories (e.g. ./traintel-runs)")
    summary.set_defaults(func=_summary)
    goodput = sub.add_parser(
        "goodput", help="goodput and badput of each training session (across restarts and ranks)"
    )
    goodput.add_argument("paths", nargs="+", help="files or directories of one or more jobs")
    goodput.add_argument(
        "--start", type=_time, help="interval start: ISO 8601 (UTC by default) or Unix seconds"
    )
    goodput.add_argument("--end", type=_time, help="interval end: ISO 8601 (UTC by default) or Unix seconds")
    goodput.add_argument("--json", action="store_true", help="machine-readable output")
    goodput.add_argument("--session", help="only this session_tag")
    goodput.add_argument("--by-perf-tag", action="store_true", help="split sessions by perf_tag too")
    goodput.add_argument("--rank", type=int, help="the rank whose timeline counts (default: the lowest)")
    goodput.set_defaults(func=_goodput)
    report = sub.add_parser(
        "report", help="the full report of one or more jobs/ranks: tables, --json, or an --html page"
    )
    report.add_argument("paths", nargs="+", help="files or directories of the embedded default")
    report.add_argument("--json", action="store_true", help="machine-readable output")
    report.add_argument("--html", metavar="OUT.html", help="also write a self-contained HTML report")
    report.set_defaults(func=_report)
    trace = sub.add_parser(
        "export-trace", help="a Chrome trace event file (Perfetto, chrome://tracing), one track per rank"
    )
    trace.add_argument("paths", nargs="+", help="files or directories of the embedded default")
    trace.add_argument("-o", "--output", required=True, help="the trace file to write (e.g. trace.json)")
    trace.set_defaults(func=_export_trace)
    comp = sub.add_parser("compare", help="two runs side by side, significant differences flagged")
    comp.add_argument("run_a", help="the baseline run (file or directory)")
    comp.add_argument("run_b", help="the run compared with it")
    comp.add_argument(
        "--threshold", type=_threshold, default=0.05, help="relative change to flag (default 0.05 = 5%%)"
    )
    comp.add_argument("--json", action="store_true", help="machine-readable output")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``| head``): the rest of the output is not wanted. Point stdout
        # at /dev/null so the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
