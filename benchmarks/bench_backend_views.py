"""The ClickHouse views (deploy/clickhouse/traintel_views.sql) at scale, against the CLI on the
same data.

A generated session: every rank runs a job killed after ``--windows // 2`` windows and a job
that resumes from a checkpoint 20 % back and runs the rest (so there is wasted progress and
infrastructure recovery), with one planted straggler rank 30 % slower. Each rank's spans are
written as OTLP/JSON files (application, loop, checkpoint and ``training_window`` spans, the
compact window records traintel exports), then:

* loaded into the Collector ``clickhouse`` exporter's tables in embedded ClickHouse (chdb) row for
  row as the exporter writes them (tests/clickhouse_otel.py), rows/s reported;
* ``traintel_session_goodput`` and ``traintel_stragglers`` timed (best of 3), with windows/s;
* ``traintel goodput --json`` run on the files, timed, and every bucket compared.

    python benchmarks/bench_backend_views.py                 # 64 ranks x 600 windows (~a minute)
    python benchmarks/bench_backend_views.py --ranks 1024    # the full size (1.2 M rows at 2 jobs)

Needs chdb-core (the test extra).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import clickhouse_otel  # noqa: E402

T0 = 1_800_000_000 * 10**9
S = 10**9
ITERATIONS = 50  # per window
STEP_S = 0.1
SESSION = "bench"
QUANTILES = ("min", "p50", "p90", "p99", "max")


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in values.items()]


class Writer:
    """One rank's process: spans batched into OTLP/JSON request lines."""

    def __init__(self, path: Path, rank: int, restart: int, world: int) -> None:
        self.file = path.open("wb")
        self.resource = _attributes(
            {
                "service.name": "bench",
                "service.instance.id": f"r{rank}-j{restart}",
                "ml.training.run_id": "bench-run",
                "ml.training.session_tag": SESSION,
                "ml.training.restart_count": restart,
                "ml.training.rank": rank,
                "ml.training.world_size": world,
            }
        )
        self.spans: list[dict[str, Any]] = []
        self.trace = f"{rank:08x}{restart:08x}{0:016x}"
        self.next_id = 1

    def span(self, name: str, start: int, end: int, attributes: dict[str, Any], parent: str = "") -> str:
        span_id = f"{self.next_id:016x}"
        self.next_id += 1
        self.spans.append(
            {
                "traceId": self.trace, "spanId": span_id, "parentSpanId": parent, "name": name, "kind": 1,
                "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
                "attributes": _attributes(attributes), "status": {},
            }
        )  # fmt: skip
        if len(self.spans) >= 200:
            self.flush()
        return span_id

    def flush(self) -> None:
        if self.spans:
            request = {
                "resourceSpans": [
                    {
                        "resource": {"attributes": self.resource},
                        "scopeSpans": [{"scope": {"name": "traintel"}, "spans": self.spans}],
                    }
                ]
            }
            self.file.write(orjson.dumps(request) + b"\n")
            self.spans = []

    def close(self) -> None:
        self.flush()
        self.file.close()


def write_job(
    directory: Path, rank: int, world: int, restart: int, start: int, windows: range, slow: float, ends: bool
) -> int:
    """One rank of one job: init, (for a resumed job) a checkpoint load, the windows, a save
    every 100 windows; ``ends``: the application and loop spans are exported (else: killed)."""
    out = Writer(directory / f"rank{rank}-job{restart}.otlp.jsonl", rank, restart, world)
    at = start
    app_id = f"{10**6 + restart:016x}"  # the application's id, exported at its end
    out.span("model_init", at, at + 20 * S, {"ml.training.phase": "model_init"}, app_id)
    at += 20 * S
    if restart:
        out.span("checkpoint_load", at, at + 15 * S, {"ml.training.phase": "checkpoint_load"}, app_id)
        at += 15 * S
    loop_start = at
    step = round(STEP_S * slow * S)
    for index, window in enumerate(windows):
        first = window * ITERATIONS
        total = ITERATIONS * step / S
        data = ITERATIONS * 0.004
        end = at + ITERATIONS * step
        out.span(
            "training_window", at, end,
            {
                "ml.training.window.index": index, "ml.training.window.first_iteration": first,
                "ml.training.window.last_iteration": first + ITERATIONS - 1,
                "ml.training.window.iterations": ITERATIONS, "ml.training.window.iteration_time.total": total,
                "ml.training.window.data_loading_time": data,
                "ml.training.window.productive_time": total - data,
                **{f"ml.training.window.iteration_time.{q}": step / S for q in QUANTILES},
            },
        )  # fmt: skip
        at = end
        if window % 100 == 99:
            out.span(
                "checkpoint_save_sync", at, at + 8 * S,
                {"ml.training.phase": "checkpoint_save_sync", "ml.training.checkpoint.size": 2**30},
            )  # fmt: skip
            at += 8 * S
    loop_attributes = {
        "ml.training.phase": "training_loop",
        "ml.training.train_iterations_start": windows[0] * 50,
    }
    if ends:
        out.span("training_loop", loop_start, at, loop_attributes, app_id)
        out.spans.append(
            {
                "traceId": out.trace, "spanId": app_id, "name": "application", "kind": 1,
                "startTimeUnixNano": str(start), "endTimeUnixNano": str(at + 5 * S),
                "attributes": _attributes({"ml.training.phase": "application"}), "status": {},
            }
        )  # fmt: skip
        at += 5 * S
    out.close()
    return at


def generate(directory: Path, ranks: int, windows: int) -> int:
    """Every rank's two jobs; returns the planted straggler rank."""
    straggler = ranks // 3
    first_job = range(windows // 2)
    resumed_at = windows // 2 - windows // 10
    second_job = range(resumed_at, resumed_at + windows - len(first_job))
    for rank in range(ranks):
        slow = 1.3 if rank == straggler else 1.0
        killed_at = write_job(directory, rank, ranks, 0, T0, first_job, slow, ends=False)
        write_job(directory, rank, ranks, 1, killed_at + 120 * S, second_job, slow, ends=True)
    return straggler


def best_of(runs: int, action: Any) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(runs):
        started = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--windows", type=int, default=600, help="window records per rank, both jobs")
    args = parser.parse_args()
    from chdb import session as chdb_session

    work = Path(tempfile.mkdtemp(prefix="traintel-bench-views-"))
    try:
        started = time.perf_counter()
        straggler = generate(work, args.ranks, args.windows)
        size = sum(f.stat().st_size for f in work.glob("*.jsonl"))
        print(f"generated {args.ranks} ranks x {args.windows} windows: {size / 1e6:.1f} MB of OTLP/JSON "
              f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
        clickhouse = chdb_session.Session()
        started = time.perf_counter()
        counts = clickhouse_otel.load(clickhouse, [work], batch=50_000)
        load_s = time.perf_counter() - started
        rows = counts["otel_traces"]
        print(
            f"loaded {rows:,} otel_traces rows in {load_s:.1f} s ({rows / load_s:,.0f} rows/s, Python loader)"
        )
        for statement in clickhouse_otel.statements(
            (ROOT / "deploy/clickhouse/traintel_views.sql").read_text()
        ):
            clickhouse.query(statement)
        windows_total = args.ranks * args.windows

        def query(sql: str) -> list[dict[str, Any]]:
            text = clickhouse.query(sql, "JSONEachRow").bytes().decode()
            return [json.loads(line) for line in text.splitlines()]

        goodput_s, sessions = best_of(3, lambda: query("SELECT * FROM traintel_session_goodput"))
        stragglers_s, stragglers = best_of(3, lambda: query("SELECT * FROM traintel_stragglers"))
        found = sum(1 for r in stragglers if r["slowest_rank"] == straggler)
        print(f"traintel_session_goodput: {goodput_s:.2f} s ({windows_total / goodput_s:,.0f} windows/s)")
        rate = windows_total / stragglers_s
        print(f"traintel_stragglers:      {stragglers_s:.2f} s ({rate:,.0f} windows/s); "
              f"planted rank {straggler} is the slowest in {found} of {len(stragglers)} windows")  # fmt: skip
        started = time.perf_counter()
        cli = subprocess.run(
            [sys.executable, "-m", "traintel.cli", "goodput", str(work), "--json"],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
        cli_s = time.perf_counter() - started
        (expected,) = json.loads(cli.stdout)["sessions"]
        print(f"traintel goodput --json:  {cli_s:.2f} s ({windows_total / cli_s:,.0f} windows/s)")
        (got,) = sessions
        worst = 0.0
        for name in ["productive", *expected["badput_seconds"]]:
            cli_value = (
                expected["productive_seconds"] if name == "productive" else expected["badput_seconds"][name]
            )
            delta = abs(float(got[f"{name}_seconds"]) - cli_value)
            worst = max(worst, delta)
            print(
                f"  {name:<24} CLI {cli_value:14.3f} s   ClickHouse {float(got[f'{name}_seconds']):14.3f} s"
            )
        print(f"  goodput CLI {expected['goodput']:.6f}  ClickHouse {float(got['goodput']):.6f}; "
              f"largest bucket difference {worst * 1e3:.3f} ms")  # fmt: skip
        ratios = f"session goodput {goodput_s / cli_s:.2f}x, stragglers {stragglers_s / cli_s:.2f}x"
        print(f"views / CLI time: {ratios}")
        if worst > 1e-3:  # the views hold the CLI's definition: a timing of different answers is none
            raise SystemExit(f"the views and the CLI disagree by {worst * 1e3:.3f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
