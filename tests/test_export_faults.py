"""Collector faults injected for real: a job in a fresh interpreter exports to a real OTLP
receiver on loopback that this test stops and restarts on the same port (gRPC and HTTP).

What must hold: training continues, every span and event the run produced arrives exactly
once after the collector returns (asserted by span id against the embedded file, which never
fails), the spool on disk is owner-only and holds no header values, and the losses and
resends are reported.
"""

from __future__ import annotations

import collections
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.otlp_receiver import GrpcReceiver, HttpReceiver, Received, has_span_named
from tests.subprocess_helpers import BlackHole, clean_env, exit_seconds, wait_for, with_exit_clock
from traintel.cli import main
from traintel.exporters.reader import iter_spans
from traintel.exporters.spool import read_batch

pytestmark = [pytest.mark.process, pytest.mark.server]  # the suite's tiers: tests/tiers.py

SECRET = "planted-s3cr3t-token"

#: The job runs three stretches of iterations, announcing each stop in ``ctl/`` and waiting
#: for the test's go-ahead: healthy, collector stopped, collector restarted.
STAGED_JOB = """
import pathlib, sys, time
import traintel

ctl = pathlib.Path("ctl")

def wait(name):
    deadline = time.monotonic() + 60
    while not (ctl / name).exists():
        if time.monotonic() > deadline:
            sys.exit("test never said " + name)
        time.sleep(0.02)

def iterations(n):
    for _ in range(n):
        with traintel.training_iteration():
            with traintel.model_forward():
                pass
            traintel.record_metrics(loss=0.5)

with traintel.application():
    with traintel.training_loop():
        iterations(4)
        traintel.get_telemetry().flush()
        (ctl / "healthy").touch()
        wait("stopped")
        iterations(4)
        traintel.get_telemetry().flush()
        (ctl / "failed").touch()
        wait("restarted")
        iterations(4)
print("trained", flush=True)
"""


def _env(endpoint: str, protocol: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    settings = dict(
        OTEL_TRACES_EXPORTER="otlp,traintel_file",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_EXPORTER_OTLP_TIMEOUT="2",
        OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{SECRET}",
        OTEL_BSP_SCHEDULE_DELAY="100",
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_SPOOL_RETRY_INTERVAL="0.3",
        TRAINTEL_SHUTDOWN_TIMEOUT="10",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    return clean_env(**(settings | extra))


def received_spans(received: Received) -> list[tuple[str, list[tuple[str, int]]]]:
    return [
        (span.span_id.hex(), [(e.name, e.time_unix_nano) for e in span.events])
        for _, span in received.spans()
    ]


def produced_spans(runs: Path) -> list[tuple[str, list[tuple[str, int]]]]:
    files = sorted(runs.glob("*.otlp.jsonl"))  # the embedded file, not the spool below it
    return [(s.span_id, [(e.name, e.time_ns) for e in s.events]) for s in iter_spans(files)]


Receiver = Callable[..., GrpcReceiver | HttpReceiver]


@pytest.mark.parametrize(
    ("protocol", "receiver_class"), [("grpc", GrpcReceiver), ("http/protobuf", HttpReceiver)]
)
def test_collector_stopped_mid_run_nothing_lost_nothing_twice(
    tmp_path: Path, protocol: str, receiver_class: Receiver
) -> None:
    (tmp_path / "ctl").mkdir()
    (tmp_path / "job.py").write_text(STAGED_JOB)
    ctl = tmp_path / "ctl"
    first = receiver_class()
    received = first.received
    port = first.port
    first.__enter__()
    second: GrpcReceiver | HttpReceiver | None = None
    job = subprocess.Popen(
        [sys.executable, "job.py"],
        cwd=tmp_path,
        env=_env(f"http://127.0.0.1:{port}", protocol, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: (ctl / "healthy").exists() or job.poll() is not None, 60)
        healthy = len(list(received.spans()))
        assert healthy > 0, "the healthy stretch was exported directly"
        first.__exit__()  # the collector goes away
        (ctl / "stopped").touch()
        assert wait_for(lambda: (ctl / "failed").exists() or job.poll() is not None, 60)
        # The failed batches wait on disk, owner-only, without the header values.
        spool_root = tmp_path / "runs" / "spool"
        spool_files = [p for p in spool_root.rglob("*") if p.is_file()]
        assert spool_files, "failed batches were spooled"
        for path in [spool_root, *spool_root.rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes()
        assert len(list(received.spans())) == healthy
        second = receiver_class(port=port, received=received)  # restarted, same port
        second.__enter__()
        (ctl / "restarted").touch()
        stdout, stderr = job.communicate(timeout=90)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
        if second is not None:
            second.__exit__()
    assert job.returncode == 0, stderr
    assert stdout == "trained\n"
    produced = produced_spans(tmp_path / "runs")
    arrived = received_spans(received)
    counts = collections.Counter(span_id for span_id, _ in arrived)
    assert len(produced) == 27  # application, loop, window record, 12 x (iteration, forward)
    assert sum(len(events) for _, events in produced) >= 1  # telemetry_initialization, at least
    assert not [span_id for span_id, n in counts.items() if n > 1], "a span arrived twice"
    assert sorted(produced) == sorted(arrived), "every span and event arrived, exactly once"
    assert "export attempt(s) failed" in stderr and "re-sent" in stderr
    assert SECRET not in stderr
    # Fully delivered: the process's spool directory is gone, nothing waits for a replay.
    assert not list((tmp_path / "runs" / "spool").iterdir())


PLAIN_JOB = """
import time
import traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(8):
            with traintel.training_iteration():
                with traintel.model_forward():
                    time.sleep(0.05)
                traintel.record_metrics(loss=0.5)
print("trained", flush=True)
"""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("exporter_timeout", ["1", "30"])
def test_blackholed_collector_bounded_exit_everything_spooled_then_replayed(
    tmp_path: Path, protocol: str, exporter_timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exporter timeout 1 s: the batches fail and are spooled before the 2 s exit bound.
    30 s: the bound is reached with a batch in flight and spans queued; they are spilled."""
    bound = 2.0
    with BlackHole() as hole:
        result = subprocess.run(
            [sys.executable, "-c", with_exit_clock(PLAIN_JOB)],
            cwd=tmp_path,
            env=_env(
                f"http://127.0.0.1:{hole.port}",
                protocol,
                tmp_path,
                OTEL_EXPORTER_OTLP_TIMEOUT=exporter_timeout,
                TRAINTEL_SHUTDOWN_TIMEOUT=str(bound),
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        exit_s = exit_seconds(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    if float(exporter_timeout) > bound:  # the exit never waits the send to the black hole out
        assert exit_s < float(exporter_timeout), result.stderr
    # (sends shorter than the bound cannot tell a bounded exit from one that waited for them by
    # its length: what they could not deliver is in the spool, asserted below)
    assert SECRET not in result.stderr
    [spool] = (tmp_path / "runs" / "spool").iterdir()
    produced = produced_spans(tmp_path / "runs")
    assert len(produced) == 19  # application, loop, window record, 8 x (iteration, forward)
    receiver_class = GrpcReceiver if protocol == "grpc" else HttpReceiver
    with receiver_class() as receiver:
        assert main(["replay", str(spool), "--endpoint", receiver.endpoint, "--protocol", protocol]) == 0
    arrived = received_spans(receiver.received)
    assert sorted(arrived) == sorted(produced), "the black hole took nothing; the spool kept it all"
    assert "replayed 19 span(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("protocol", "receiver_class"), [("grpc", GrpcReceiver), ("http/protobuf", HttpReceiver)]
)
def test_slow_collector_gets_everything_once(tmp_path: Path, protocol: str, receiver_class: Receiver) -> None:
    with receiver_class(delay_s=0.5) as receiver:
        result = subprocess.run(
            [sys.executable, "-c", PLAIN_JOB],
            cwd=tmp_path,
            # slow, not failed: the exporter's timeout is a hang guard, not 2 s a busy machine can
            # need for a 0.5 s answer
            env=_env(receiver.endpoint, protocol, tmp_path, OTEL_EXPORTER_OTLP_TIMEOUT="120"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    produced = produced_spans(tmp_path / "runs")
    assert len(produced) == 19  # application, loop, window record, 8 x (iteration, forward)
    assert sorted(received_spans(receiver.received)) == sorted(produced)
    assert len(receiver.received.traces) >= 2, "several slow requests, not one at exit"
    assert "export attempt(s) failed" not in result.stderr  # slow is not failed
    assert "spooled spans delivered" not in result.stderr, "nothing was wrong: nothing to say"
    # Batches that came while a send was under way waited on disk; all were delivered.
    spool = tmp_path / "runs" / "spool"
    assert not spool.exists() or not list(spool.iterdir())


#: Iterations go on until the test sends SIGTERM; one exported span batch is already in flight
#: to the collector (announced by ``ready``) when the signal comes.
PREEMPTED_JOB = """
import pathlib, time
import traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(100000):
            with traintel.training_iteration():
                with traintel.model_forward():
                    time.sleep(0.01)
            if i == 20:
                pathlib.Path("ready").touch()
"""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_sigterm_with_a_batch_in_flight_to_an_unresponsive_collector_spools_it(
    tmp_path: Path, protocol: str
) -> None:
    """The preemption path releases the export path as an exit does: the batch stuck in a send
    and everything queued go to the spool, and a replay delivers every span the job wrote."""
    with BlackHole() as hole:
        job = subprocess.Popen(
            [sys.executable, "-c", PREEMPTED_JOB],
            cwd=tmp_path,
            env=_env(
                f"http://127.0.0.1:{hole.port}",
                protocol,
                tmp_path,
                OTEL_EXPORTER_OTLP_TIMEOUT="30",
                TRAINTEL_SHUTDOWN_TIMEOUT="2",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert wait_for(lambda: (tmp_path / "ready").exists() or job.poll() is not None, 60)
            # a batch has left for the black hole and waits for its answer
            assert wait_for(lambda: hole.has_bytes() or job.poll() is not None, 60)
            assert job.poll() is None, job.communicate()
            job.send_signal(signal.SIGTERM)
            _, stderr = job.communicate(timeout=30)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
    assert job.returncode == -signal.SIGTERM, stderr
    produced = produced_spans(tmp_path / "runs")
    assert len(produced) > 40
    [spool] = (tmp_path / "runs" / "spool").iterdir()
    receiver_class = GrpcReceiver if protocol == "grpc" else HttpReceiver
    with receiver_class() as receiver:
        assert main(["replay", str(spool), "--endpoint", receiver.endpoint, "--protocol", protocol]) == 0
    assert sorted(received_spans(receiver.received)) == sorted(produced), "nothing lost at SIGTERM"


#: A span the collector refuses (the receiver rejects any request holding it), in the middle
#: of a run whose batches leave every 100 ms.
POISONED_JOB = """
import time
import traintel
from opentelemetry import trace
with traintel.application():
    with traintel.training_loop():
        for i in range(30):
            with traintel.training_iteration():
                with traintel.model_forward():
                    time.sleep(0.02)
                if i == 10:
                    trace.get_tracer("user").start_span("poison").end()
print("trained", flush=True)
"""


@pytest.mark.parametrize(
    ("protocol", "receiver_class"), [("grpc", GrpcReceiver), ("http/protobuf", HttpReceiver)]
)
def test_a_batch_the_collector_rejects_is_set_aside_and_the_rest_delivered(
    tmp_path: Path, protocol: str, receiver_class: Receiver
) -> None:
    with receiver_class(reject=has_span_named("poison")) as receiver:
        result = subprocess.run(
            [sys.executable, "-c", POISONED_JOB],
            cwd=tmp_path,
            env=_env(receiver.endpoint, protocol, tmp_path, TRAINTEL_SHUTDOWN_TIMEOUT="10"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    produced = produced_spans(tmp_path / "runs")
    arrived = received_spans(receiver.received)
    [quarantined] = (tmp_path / "runs" / "spool").glob("*/quarantine/*.otlp.pb")
    set_aside = [
        (s.span_id.hex(), [(e.name, e.time_unix_nano) for e in s.events]) for s in _spans(quarantined)
    ]
    assert "poison" in {s.name for s in _spans(quarantined)}
    assert receiver.received.rejected >= 2, "refused, and refused again before it was set aside"
    assert len(arrived) == len({span_id for span_id, _ in arrived}), "nothing twice"
    assert sorted(arrived + set_aside) == sorted(produced), "everything else was delivered"
    assert f"{len(set_aside)} span(s) set aside" in result.stderr
    assert str(quarantined.parent) in result.stderr


def _spans(path: Path) -> list[Any]:
    request = read_batch(path)
    return [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]


@pytest.mark.parametrize(
    ("protocol", "receiver_class"), [("grpc", GrpcReceiver), ("http/protobuf", HttpReceiver)]
)
def test_a_collector_slower_than_the_exit_bound_gets_each_span_once_with_the_replay(
    tmp_path: Path, protocol: str, receiver_class: Receiver
) -> None:
    """2 s a request, 3 s to exit: the send under way at the exit is waited for (its outcome
    known), and no send is started that the exit would cut off with its outcome unknown; what
    is left waits in the spool, and live delivery plus the replay gives every span once."""
    bound, send = 3.0, 10.0  # the exporter's timeout bounds one send
    with receiver_class(delay_s=2.0) as receiver:
        result = subprocess.run(
            [sys.executable, "-c", with_exit_clock(PLAIN_JOB)],
            cwd=tmp_path,
            env=_env(
                receiver.endpoint,
                protocol,
                tmp_path,
                TRAINTEL_SHUTDOWN_TIMEOUT=str(bound),
                OTEL_EXPORTER_OTLP_TIMEOUT=str(send),  # slow, not failed: it answers within this
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        exit_s = exit_seconds(tmp_path)
        assert result.returncode == 0, result.stderr
        live = len(received_spans(receiver.received))
        time.sleep(2.5)  # a request the exit cut off would still land now
        assert len(received_spans(receiver.received)) == live, "no send was cut off by the exit"
        receiver.set_delay(0.0)
        [spool] = (tmp_path / "runs" / "spool").iterdir()
        assert main(["replay", str(spool), "--endpoint", receiver.endpoint, "--protocol", protocol]) == 0
    produced = produced_spans(tmp_path / "runs")
    arrived = received_spans(receiver.received)
    assert 0 < live < len(produced)
    assert len(arrived) == len({span_id for span_id, _ in arrived}), "nothing twice"
    assert sorted(arrived) == sorted(produced)
    # the exit waited at most its bound and the one send under way
    assert exit_s < bound + send, result.stderr
