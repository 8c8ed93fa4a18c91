"""Whole-process behaviour: disabled SDK, coexisting providers, bounded exit, auto-config,
and ``opentelemetry-instrument``. Each runs in a fresh interpreter because it involves the
global providers or process exit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.otlp_receiver import GrpcReceiver
from tests.subprocess_helpers import BlackHole, exit_seconds, run_python, with_exit_clock
from traintel.exporters.reader import MetricsRecord, iter_records, iter_spans

pytestmark = [pytest.mark.process, pytest.mark.server]  # the suite's tiers: tests/tiers.py

USER_JOB = """
import traintel
from traintel import callbacks

@traintel.application()
def main():
    total = 0
    with traintel.training_loop():
        for i in range(5):
            with traintel.training_iteration() as span:
                total += i
                traintel.record_metrics(loss=1.0 / (i + 1))
    print("result", total, type(span).__name__)
    return total

main()
"""


def test_sdk_disabled_records_nothing_and_user_code_runs_unchanged(tmp_path: Path) -> None:
    with GrpcReceiver() as receiver:
        disabled = run_python(
            USER_JOB,
            tmp_path,
            OTEL_SDK_DISABLED="true",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_INSECURE="true",
        )
    assert disabled.returncode == 0, disabled.stderr
    assert disabled.stdout == "result 10 NonRecordingSpan\n"
    assert disabled.stderr == ""
    assert not receiver.received.traces and not receiver.received.metrics
    assert not (tmp_path / "traintel-runs").exists()
    enabled = run_python(USER_JOB, tmp_path, OTEL_SDK_DISABLED="1")  # only "true" turns it off
    assert enabled.returncode == 0, enabled.stderr
    assert enabled.stdout == "result 10 IterationRecord\n"
    assert len(list((tmp_path / "traintel-runs").glob("*.otlp.jsonl"))) == 1
    assert enabled.stderr == (
        "traintel: OTEL_SDK_DISABLED='1' is not true or false: telemetry stays on (only true turns it off)\n"
    )


def test_existing_global_provider_is_kept(tmp_path: Path) -> None:
    code = """
    import json
    from opentelemetry import trace, metrics
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)

    import traintel
    with traintel.application():
        with traintel.model_init():
            pass
    telemetry = traintel.get_telemetry()
    # (some SDK releases add their own otel.sdk.* self-metrics to the user's provider)
    names = [m.name for rm in reader.get_metrics_data().resource_metrics
             for sm in rm.scope_metrics for m in sm.metrics if not m.name.startswith("otel.sdk.")]
    print(json.dumps({
        "same_provider": trace.get_tracer_provider() is provider,
        "same_meter_provider": metrics.get_meter_provider() is meter_provider,
        "owns": [telemetry.pipeline.owns_tracer_provider, telemetry.pipeline.owns_meter_provider],
        "spans": [s.name for s in exporter.get_finished_spans()],
        "metrics": names,
        "file": str(telemetry.output_file),
    }))
    """
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {
        "same_provider": True,
        "same_meter_provider": True,
        "owns": [False, False],
        "spans": ["model_init", "application"],
        "metrics": [
            "ml.training.phase.duration",
            "traintel.iterations.exported",
            "ml.training.goodput",
            "ml.training.badput",
            "ml.training.goodput.time",
            "ml.training.job.time",
            "ml.training.job.start_time",  # no window closed: no job.last_progress_time
            "ml.training.heartbeat.time_since_progress",
            "ml.training.heartbeat.phase",  # no iteration ran: no heartbeat.iteration
            "process.cpu.utilization",
            "process.memory.usage",
        ],
        "file": "None",
    }
    assert "Overriding of current" not in result.stderr
    assert not (tmp_path / "traintel-runs").exists()


def test_exit_is_bounded_when_collector_is_blackholed(tmp_path: Path) -> None:
    send = 30.0
    with BlackHole() as hole:
        result = run_python(
            with_exit_clock(USER_JOB),
            tmp_path,
            timeout=120,
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{hole.port}",
            OTEL_EXPORTER_OTLP_INSECURE="true",
            OTEL_EXPORTER_OTLP_TIMEOUT=str(send),
            TRAINTEL_SHUTDOWN_TIMEOUT="1",
        )
        exit_s = exit_seconds(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "result 10 IterationRecord\n"
    # The exporter stops waiting at the bound (0.8 of it); what it held is kept in the spool.
    assert "not delivered, kept in" in result.stderr
    # The exporter alone would wait 30 s per attempt: the exit ends before one attempt could have.
    assert exit_s < send, result.stderr


def test_exit_flushes_everything_when_collector_is_healthy(tmp_path: Path) -> None:
    with GrpcReceiver() as receiver:
        result = run_python(
            USER_JOB,
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            OTEL_BSP_SCHEDULE_DELAY="60000",  # nothing leaves before exit: the exit flush must send it
            OTEL_METRIC_EXPORT_INTERVAL="60000",
        )
    assert result.returncode == 0, result.stderr
    assert len(list(receiver.received.spans())) == 8  # 7 phases and the window record
    # (some SDK releases add their own otel.sdk.* self-metrics, sent through the same provider)
    assert {n for n in receiver.received.metric_names() if not n.startswith("otel.sdk.")} == {
        "ml.training.phase.duration",
        "ml.training.iteration.duration",
        "ml.training.iteration.phase_time",
        "traintel.iterations.exported",
        "ml.training.goodput",
        "ml.training.badput",
        "ml.training.goodput.time",
        "ml.training.job.time",
        "ml.training.job.start_time",
        "ml.training.job.last_progress_time",
        "ml.training.step_time.ideal",
        "ml.training.step_time.deviation",
        "ml.training.heartbeat.time_since_progress",
        "ml.training.heartbeat.iteration",
        "ml.training.heartbeat.phase",
        "process.cpu.utilization",
        "process.memory.usage",
        "traintel.spans.dropped",
        "traintel.events.dropped",
        "traintel.export.failures",
        "traintel.export.batches.split",
        "traintel.queue.depth",
        "traintel.spool.size",
        "traintel.spool.dropped",
        "traintel.spool.quarantined",
    }


def test_implicit_configuration_survives_bad_env(tmp_path: Path) -> None:
    result = run_python(
        USER_JOB + "\nprint(traintel.get_telemetry().settings.seq_len)\n",
        tmp_path,
        TRAINTEL_GLOBAL_BATCH_SIZE="lots",
        TRAINTEL_SEQ_LEN="128",
        OTEL_EXPORTER_OTLP_PROTOCOL="carrier-pigeon",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "out"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["result 10 IterationRecord", "128"]
    assert "TRAINTEL_GLOBAL_BATCH_SIZE='lots': expected a positive integer" in result.stderr
    assert result.stderr.count("TRAINTEL_GLOBAL_BATCH_SIZE") == 1
    files = list((tmp_path / "out").glob("*.otlp.jsonl"))
    assert len(files) == 1
    assert len(list(iter_spans(files))) == 8  # 7 phases and the window record


def test_callbacks_left_open_are_ended_at_exit(tmp_path: Path) -> None:
    code = """
    from traintel import callbacks
    callbacks.on_app_start()
    callbacks.on_train_start()
    callbacks.on_training_single_iteration_start()
    print("exiting without end callbacks")
    """
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    spans = {s.name: s for s in iter_spans([tmp_path / "traintel-runs"])}
    assert set(spans) == {"application", "training_loop", "training_iteration", "training_window"}
    assert spans["training_iteration"].attributes["traintel.end_reason"] == "telemetry shutdown"
    assert spans["training_loop"].parent_span_id == spans["application"].span_id


@pytest.mark.parametrize("detectors", [None, "traintel", "otel"])
def test_opentelemetry_instrument_picks_traintel_up(tmp_path: Path, detectors: str | None) -> None:
    """Unless the user names the resource detectors, the distro's resource gains traintel's
    (run, rank, host); named, they are what applies ("otel": the SDK's alone)."""
    code = """
    from opentelemetry import trace
    import traintel
    with traintel.application():
        with traintel.model_init():
            pass
    telemetry = traintel.get_telemetry()
    print(type(trace.get_tracer_provider()).__qualname__, telemetry.pipeline.owns_tracer_provider)
    """
    instrument = str(Path(sys.executable).parent / "opentelemetry-instrument")
    named = {"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": detectors} if detectors is not None else {}
    result = run_python(
        code,
        tmp_path,
        argv=[instrument, sys.executable],
        OTEL_TRACES_EXPORTER="traintel_file",
        OTEL_METRICS_EXPORTER="traintel_file",
        OTEL_LOGS_EXPORTER="none",
        OTEL_SERVICE_NAME="instrumented",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "out"),
        TRAINTEL_SESSION_TAG="via-distro",
        RANK="3",
        WORLD_SIZE="4",
        **named,
    )
    assert result.returncode == 0, result.stderr
    assert "traintel:" not in result.stderr.replace("traintel: telemetry of this run", "")  # no warning
    # the distro configured the SDK provider; traintel attached to it instead of building one,
    # and releases it at exit within its bound (the distro's providers have no owner in the script)
    assert result.stdout.strip() == "TracerProvider True"
    spans = list(iter_spans([tmp_path / "out"]))
    assert sorted(s.name for s in spans) == ["application", "model_init"]
    metrics = [r for r in iter_records([tmp_path / "out"]) if isinstance(r, MetricsRecord)]
    assert metrics, "the distro's metric reader exported"
    for resource in [spans[0].resource, metrics[-1].resource]:
        assert resource["service.name"] == "instrumented"  # the distro's own attributes
        if detectors == "otel":  # the user's choice: the SDK's detectors only
            assert "ml.training.rank" not in resource and "host.name" not in resource
            continue
        # the run identity: traintel's detectors, by its entry point or added to the distro's resource
        assert resource["ml.training.session_tag"] == "via-distro"
        assert (resource["ml.training.rank"], resource["ml.training.world_size"]) == (3, 4)
        assert resource["ml.training.run_id"] and resource["host.name"]


def test_sampler_from_env_drops_spans_without_false_warnings(tmp_path: Path) -> None:
    result = run_python(USER_JOB, tmp_path, OTEL_TRACES_SAMPLER="always_off")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "result 10 IterationRecord\n"  # iterations are still counted in metrics
    # a sampled-out loop is not misuse: the one line says what the sampler costs the metrics
    [line] = result.stderr.splitlines()
    assert line.startswith("traintel: OTEL_TRACES_SAMPLER='always_off' drops traces"), result.stderr
    assert [s.name for s in iter_spans([tmp_path / "traintel-runs"])] == []


def test_trace_id_ratio_sampler_is_read_by_the_sdk(tmp_path: Path) -> None:
    code = (
        USER_JOB
        + "\nfrom opentelemetry import trace\nprint(trace.get_tracer_provider().sampler.get_description())\n"
    )
    result = run_python(
        code, tmp_path, OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0.25"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("ParentBased{root:TraceIdRatioBased{0.25},")
