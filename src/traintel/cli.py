"""The ``traintel`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from traintel.analysis.summary import render, summarize
from traintel.exporters.reader import expand_paths


def _summary(args: argparse.Namespace) -> int:
    files = [path for path in expand_paths(args.paths) if path.is_file()]
    if not files:
        print(f"traintel: no telemetry files found in {', '.join(args.paths)}", file=sys.stderr)
        return 2
    print(render(summarize(files)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traintel", description="OpenTelemetry-native training telemetry.")
    sub = parser.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary", help="a short summary of a run from its OTLP/JSON-lines files")
    summary.add_argument("paths", nargs="+", help="files or directories (e.g. ./traintel-runs)")
    summary.set_defaults(func=_summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
