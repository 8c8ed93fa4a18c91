"""``opentelemetry-instrument python train.py`` with opentelemetry-distro and no collector: the
distro builds its providers from ``OTEL_*`` (default: OTLP to localhost), and traintel gives
their exporters the spool, the loss counting and the bounded exit its own have. Real launcher,
real exporters, real sockets; what the spool kept is replayed to a real receiver."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.otlp_receiver import GrpcReceiver
from tests.subprocess_helpers import REPO, BlackHole, clean_env, exit_seconds, with_exit_clock
from traintel.cli import main
from traintel.exporters.reader import iter_spans

pytestmark = [pytest.mark.process, pytest.mark.server]  # the suite's tiers: tests/tiers.py

SCRIPT = REPO / "examples" / "zero_code_train.py"
INSTRUMENT = str(Path(sys.executable).parent / "opentelemetry-instrument")
HINT = "OTEL_TRACES_EXPORTER=traintel_file OTEL_METRICS_EXPORTER=traintel_file"
BOUND = 3.0  # traintel's exit bound (TRAINTEL_SHUTDOWN_TIMEOUT) in these runs


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _instrumented(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The example under ``opentelemetry-instrument``, run through a wrapper that says when its
    script ended (:func:`with_exit_clock`; the distro's set-up happens before, as for the script
    itself), and how long its exit took."""
    wrapper = tmp_path / SCRIPT.name
    wrapper.write_text(
        with_exit_clock(
            f"""
            import runpy, sys
            sys.argv[0] = {str(SCRIPT)!r}
            runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
            """
        )
    )
    result = subprocess.run(
        [INSTRUMENT, sys.executable, str(wrapper), "--checkpoint-dir", str(tmp_path)],
        cwd=tmp_path,
        env=clean_env(
            OTEL_LOGS_EXPORTER="none",
            TRAINTEL_OUTPUT_DIR=str(tmp_path / "out"),
            TRAINTEL_SHUTDOWN_TIMEOUT=str(BOUND),
            TRAINTEL_EXPORT_ITERATIONS="all",
            **env,
        ),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return result, exit_seconds(tmp_path)


def _replayed(spool_root: Path) -> list[str]:
    [spool] = spool_root.iterdir()
    with GrpcReceiver() as receiver:
        assert main(["replay", str(spool), "--endpoint", receiver.endpoint, "--protocol", "grpc"]) == 0
    return sorted(span.span_id.hex() for _, span in receiver.received.spans())


@pytest.mark.skipif(not _port_free(4317), reason="something listens on localhost:4317 here")
def test_the_distros_default_endpoint_with_nothing_listening(tmp_path: Path) -> None:
    """OTLP by default (the distro's), traintel_file beside it to know what was produced."""
    send = 60.0  # the exporters would retry the refused connection this long
    result, exit_s = _instrumented(
        tmp_path, OTEL_TRACES_EXPORTER="otlp,traintel_file", OTEL_EXPORTER_OTLP_TIMEOUT=str(send)
    )
    assert result.returncode == 0, result.stderr
    assert "reloaded step 16" in result.stdout
    # Bounded: 3 s to exit, not the exporters' retries (~14 s before).
    assert exit_s < send, result.stderr
    assert result.stderr.count(HINT) == 1, result.stderr  # what to set, said once
    assert "not delivered, kept in" in result.stderr and "traintel replay" in result.stderr
    produced = sorted(s.span_id for s in iter_spans(sorted((tmp_path / "out").glob("*.otlp.jsonl"))))
    assert len(produced) > 30
    assert _replayed(tmp_path / "out" / "spool") == produced, "the spool kept every span"


def test_the_file_the_distros_exporters_write_is_named_as_the_job_starts_and_ends(
    tmp_path: Path,
) -> None:
    """``OTEL_TRACES_EXPORTER=traintel_file`` under ``opentelemetry-instrument``, as the docs
    say to keep a zero-code run in a file: the job's first and last lines name it and the
    command that reads it, as they do for a run configured by traintel (they said nothing)."""
    files = {"OTEL_TRACES_EXPORTER": "traintel_file", "OTEL_METRICS_EXPORTER": "traintel_file"}
    result, _ = _instrumented(tmp_path, TRAINTEL_QUIET="0", **files)
    assert result.returncode == 0, result.stderr
    (written,) = (tmp_path / "out").glob("*.otlp.jsonl")
    said = "traintel: telemetry of this run"
    lines = [line for line in result.stderr.splitlines() if line.startswith(said)]
    assert lines[0] == f"{said} goes to {written}", result.stderr
    assert lines[1].startswith(f"{said} is in {written}; read it with: "), lines
    assert len(lines) == 2 and len(list(iter_spans([written]))) > 30


def test_a_blackholed_endpoint_is_bounded_spooled_and_counted(tmp_path: Path) -> None:
    send = 30.0
    with BlackHole() as hole:
        result, exit_s = _instrumented(
            tmp_path,
            OTEL_TRACES_EXPORTER="otlp,traintel_file",
            OTEL_METRICS_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{hole.port}",
            OTEL_EXPORTER_OTLP_INSECURE="true",
            OTEL_EXPORTER_OTLP_TIMEOUT=str(send),
        )
    assert result.returncode == 0, result.stderr
    # the exit never waited a send to the black hole out
    assert exit_s < send, result.stderr
    assert HINT not in result.stderr  # an endpoint was set: nothing to suggest
    assert "where traintel does not find them" not in result.stderr  # this SDK's layout is known
    # the distro's metric exporter is counted too: its only export, at exit, never got an answer
    # (cut by the bounded exit: cancelled, or still waiting when the exit line is written)
    assert re.search(
        r"telemetry export: (1 metric export\(s\) failed|the last metric export had not finished at exit), "
        r"none delivered: this run's metrics were not delivered",
        result.stderr,
    ), result.stderr
    produced = sorted(s.span_id for s in iter_spans(sorted((tmp_path / "out").glob("*.otlp.jsonl"))))
    assert _replayed(tmp_path / "out" / "spool") == produced


def test_an_sdk_that_keeps_its_exporters_elsewhere_is_said_and_left_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A later SDK release may move what traintel reaches into (1.45 moved the meter provider's
    readers): the distro's providers then run as they are, and the job's log says so once."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    from traintel._runtime.pipeline import Pipeline, adopt_instrumented_providers
    from traintel.config import TrainingConfig

    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=10**9)
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    monkeypatch.delattr(tracer_provider, "_active_span_processor")
    monkeypatch.delattr(meter_provider, "_measurement_consumer")
    monkeypatch.delattr(meter_provider._sdk_config, "metric_readers", raising=False)
    pipeline = Pipeline(
        tracer_provider, meter_provider, owns_tracer_provider=False, owns_meter_provider=False
    )
    try:
        assert adopt_instrumented_providers(pipeline, TrainingConfig.from_env(strict=False)) == 0
    finally:
        monkeypatch.undo()
        tracer_provider.shutdown()
        meter_provider.shutdown()
    assert (
        caplog.text.count(
            "traintel: this OpenTelemetry SDK release keeps its span processors and metric "
            "readers where traintel does not find them"
        )
        == 1
    ), caplog.text


def test_a_run_sent_to_nothing_listening_is_read_from_its_spool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The distro's default alone (OTLP, no file): what was not delivered is in the spool, and
    ``summary``/``report`` of the output directory read it there; the job's last line says
    where its spans were sent."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    result, _ = _instrumented(
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        TRAINTEL_QUIET="0",
    )
    assert result.returncode == 0, result.stderr
    # its spans are in the spool (the line before says so): not said to be sent
    assert f"telemetry of this run could not all be sent to http://127.0.0.1:{port} (OTLP)" in result.stderr
    out = tmp_path / "out"
    assert not list(out.rglob("*.otlp.jsonl")) and list(out.rglob("*.otlp.pb"))
    assert main(["report", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spans"] > 30 and data["iterations"]["count"] > 0 and data["skipped_lines"] == 0
    assert main(["summary", str(out)]) == 0 and "Spans read: " in capsys.readouterr().out
