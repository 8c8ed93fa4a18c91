"""Per-iteration cost and delivery under collector faults, as ratios to a healthy collector
measured in one run.

Each scenario runs the same job in a fresh interpreter for a fixed time, exporting over real
OTLP/gRPC on loopback, with the embedded file as a second exporter (it never fails, so it is
the record of what the run produced):

* healthy: a receiver that answers at once.
* down at start: nothing listens on the port.
* killed + restarted: the receiver is stopped ``--kill-at`` s after launch and a new one starts
  on the same port ``--restart-at`` s after launch (its received spans are pooled).
* blackholed: a socket that accepts connections and never reads or answers.
* slow: a receiver that takes ``--slow`` s to answer every trace export.

Per scenario (medians of ``--rounds``): iterations per second inside the loop (wall time) and
CPU microseconds per iteration of the training thread and of the whole process (export threads
included; CPU time is far less disturbed by other jobs on a shared machine than wall time),
each with its ratio to healthy; spans produced (the file), received live, recovered afterwards
by ``traintel replay`` of the spool, duplicates by span id, and the time from the loop's end to
process exit.

Run: ``python benchmarks/bench_export_faults.py [--seconds 4] [--rounds 3] [--export all]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.otlp_receiver import GrpcReceiver, Received  # noqa: E402
from tests.subprocess_helpers import BlackHole, clean_env  # noqa: E402

from traintel.exporters.reader import iter_spans  # noqa: E402
from traintel.exporters.replay import otlp_span_exporter, replay  # noqa: E402

JOB = """
import json, sys, time
import traintel

seconds = float(sys.argv[1])

def work():
    total = 0
    for i in range(2000):
        total += i
    return total

with traintel.application():
    with traintel.training_loop():
        started = time.perf_counter()
        thread_cpu, process_cpu = time.thread_time(), time.process_time()
        iterations = 0
        while time.perf_counter() - started < seconds:
            with traintel.training_iteration():
                with traintel.model_forward():
                    work()
                with traintel.model_backward():
                    work()
                with traintel.optimizer_update():
                    pass
            iterations += 1
        elapsed = time.perf_counter() - started
        thread_cpu, process_cpu = time.thread_time() - thread_cpu, time.process_time() - process_cpu
print(json.dumps({"iterations": iterations, "elapsed": elapsed, "loop_end": time.time(),
                  "thread_cpu": thread_cpu, "process_cpu": process_cpu}), flush=True)
"""

SCENARIOS = ("healthy", "down at start", "killed + restarted", "blackholed", "slow")


@dataclass
class Outcome:
    rates: list[float] = field(default_factory=list)
    #: CPU microseconds per iteration: the training thread's, and the whole process's (export
    #: threads included). Less sensitive than wall time to other jobs on a shared machine.
    thread_us: list[float] = field(default_factory=list)
    process_us: list[float] = field(default_factory=list)
    produced: list[int] = field(default_factory=list)
    live: list[int] = field(default_factory=list)
    replayed: list[int] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)
    #: Spans the job itself reported as dropped at exit (``traintel.spans.dropped``).
    counted: list[int] = field(default_factory=list)
    exit_s: list[float] = field(default_factory=list)


@contextmanager
def collector(scenario: str, args: argparse.Namespace, received: Received) -> Iterator[int]:
    """The fault, as a port the job exports to."""
    if scenario == "down at start":
        with GrpcReceiver() as closed:
            port = closed.port
        yield port
    elif scenario == "blackholed":
        with BlackHole() as hole:
            yield hole.port
    elif scenario == "slow":
        with GrpcReceiver(received=received, delay_s=args.slow) as slow:
            yield slow.port
    elif scenario == "killed + restarted":
        first = GrpcReceiver(received=received)
        first.__enter__()
        port = first.port
        restarted: list[GrpcReceiver] = []

        def cycle() -> None:
            time.sleep(args.kill_at)
            first.__exit__()
            time.sleep(args.restart_at - args.kill_at)
            second = GrpcReceiver(port=port, received=received)
            second.__enter__()
            restarted.append(second)

        thread = threading.Thread(target=cycle, daemon=True)
        thread.start()
        try:
            yield port
        finally:
            thread.join()
            for second in restarted:
                second.__exit__()
    else:
        with GrpcReceiver(received=received) as healthy:
            yield healthy.port


def run_once(scenario: str, args: argparse.Namespace, outcome: Outcome) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        received = Received()
        env = clean_env(
            OTEL_TRACES_EXPORTER="otlp,traintel_file",
            OTEL_METRICS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_EXPORTER_OTLP_INSECURE="true",
            OTEL_EXPORTER_OTLP_TIMEOUT=str(args.exporter_timeout),
            TRAINTEL_EXPORT_ITERATIONS=args.export,
            TRAINTEL_SPOOL_RETRY_INTERVAL="1",
            TRAINTEL_OUTPUT_DIR=str(cwd / "runs"),
        )
        with collector(scenario, args, received) as port:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
            result = subprocess.run(
                [sys.executable, "-c", JOB, str(args.seconds)],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=args.seconds + 120,
                check=False,
            )
            ended = time.time()
        if result.returncode != 0:
            raise SystemExit(f"{scenario}: the job failed:\n{result.stderr}")
        report = json.loads(result.stdout)
        outcome.rates.append(report["iterations"] / report["elapsed"])
        outcome.thread_us.append(report["thread_cpu"] / report["iterations"] * 1e6)
        outcome.process_us.append(report["process_cpu"] / report["iterations"] * 1e6)
        outcome.exit_s.append(ended - report["loop_end"])
        produced = [s.span_id for s in iter_spans(sorted((cwd / "runs").glob("*.otlp.jsonl")))]
        live = [span.span_id.hex() for _, span in received.spans()]
        recovered = Received()
        spool = cwd / "runs" / "spool"
        if spool.exists():
            with GrpcReceiver(received=recovered) as target:
                exporter = otlp_span_exporter(target.endpoint, "grpc")
                replay([spool], exporter)
                exporter.shutdown()
        again = [span.span_id.hex() for _, span in recovered.spans()]
        counts = collections.Counter(live + again)
        assert set(counts) <= set(produced), f"{scenario}: a span arrived that the run never produced"
        outcome.produced.append(len(produced))
        outcome.live.append(len(set(live)))
        outcome.replayed.append(len(set(again) - set(live)))
        outcome.duplicates.append(sum(n - 1 for n in counts.values()))
        reported = re.search(r"telemetry export: (\d+) span\(s\) dropped", result.stderr)
        outcome.counted.append(int(reported.group(1)) if reported else 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="training loop length per job")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--export", choices=("sampled", "all"), default="sampled")
    parser.add_argument("--exporter-timeout", type=float, default=2.0, help="OTEL_EXPORTER_OTLP_TIMEOUT")
    parser.add_argument("--kill-at", type=float, default=1.0)
    parser.add_argument("--restart-at", type=float, default=3.0)
    parser.add_argument("--slow", type=float, default=0.5, help="seconds the slow receiver takes")
    args = parser.parse_args(argv)
    outcomes = {scenario: Outcome() for scenario in SCENARIOS}
    for round_ in range(args.rounds):  # interleaved: machine noise hits every scenario alike
        for scenario in SCENARIOS:
            run_once(scenario, args, outcomes[scenario])
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    median: Callable[[list[float]], float] = statistics.median
    healthy = median(outcomes["healthy"].rates)
    print(
        f"traintel export under collector faults: {args.seconds:g} s loop, export={args.export}, "
        f"OTEL_EXPORTER_OTLP_TIMEOUT={args.exporter_timeout:g}, TRAINTEL_SHUTDOWN_TIMEOUT=5 (default), "
        f"{args.rounds} rounds, medians"
    )
    header = (
        f"{'scenario':<20}{'it/s':>8}{'ratio':>7}{'thr CPU':>9}{'ratio':>7}{'proc CPU':>10}{'ratio':>7}"
        f"{'produced':>10}{'live':>7}{'replayed':>10}{'dups':>6}{'exit s':>8}"
    )
    print(header)
    print("-" * len(header))
    healthy_thread = median(outcomes["healthy"].thread_us)
    healthy_process = median(outcomes["healthy"].process_us)
    for scenario, o in outcomes.items():
        rate, thread, process = median(o.rates), median(o.thread_us), median(o.process_us)
        print(
            f"{scenario:<20}{rate:>8.0f}{rate / healthy:>7.3f}{thread:>9.1f}{thread / healthy_thread:>7.3f}"
            f"{process:>10.1f}{process / healthy_process:>7.3f}{median(o.produced):>10.0f}"
            f"{median(o.live):>7.0f}{median(o.replayed):>10.0f}{max(o.duplicates):>6}"
            f"{median(o.exit_s):>8.2f}"
        )
    lost = {
        s: [p - lv - r for p, lv, r in zip(o.produced, o.live, o.replayed, strict=True)]
        for s, o in outcomes.items()
    }
    print("spans lost per round (produced - live - replayed): " + json.dumps(lost))
    print(
        "spans the job reported dropped per round: " + json.dumps({s: o.counted for s, o in outcomes.items()})
    )


if __name__ == "__main__":
    main()
