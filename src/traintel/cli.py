"""The ``traintel`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from traintel.analysis.goodput import compute_goodput, load_jobs, parse_time, render_goodput
from traintel.analysis.summary import render, summarize
from traintel.exporters.reader import ReadStats, expand_paths


def _summary(args: argparse.Namespace) -> int:
    files = [path for path in expand_paths(args.paths) if path.is_file()]
    if not files:
        print(f"traintel: no telemetry files found in {', '.join(args.paths)}", file=sys.stderr)
        return 2
    print(render(summarize(files)))
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
    results = compute_goodput(load_jobs(files, stats), args.start, args.end, args.rank, args.by_perf_tag)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traintel", description="OpenTelemetry-native training telemetry.")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
