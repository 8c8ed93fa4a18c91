"""Configuration: TRAINTEL_* parsing, explicit vs implicit errors, lazy values."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from opentelemetry import trace as trace_api

import traintel
from tests.conftest import Pipeline
from tests.subprocess_helpers import run_python
from traintel._runtime import state as _state
from traintel.config import ConfigurationError, TrainingConfig
from traintel.exporters.reader import iter_spans


def test_env_values_are_parsed() -> None:
    config = TrainingConfig.from_env(
        {
            "TRAINTEL_GLOBAL_BATCH_SIZE": " 256 ",
            "TRAINTEL_SEQ_LEN": "2048",
            "TRAINTEL_FLOPS_PER_TOKEN": "6e9",
            "TRAINTEL_PEAK_FLOPS": "989e12",
            "TRAINTEL_SESSION_TAG": "pretrain-7b",
            "TRAINTEL_SHUTDOWN_TIMEOUT": "0",
        },
        strict=True,
    )
    assert config.resolve().global_batch_size == 256
    assert config.resolve().seq_len == 2048
    assert config.resolve().flops_per_token == 6e9
    assert config.resolve().peak_flops == 989e12
    assert config.resolve().session_tag == "pretrain-7b"
    assert config.resolve().shutdown_timeout == 0.0
    assert config.resolve().log_every_n_iterations == 50  # default
    assert config.resolve().output_dir == "traintel-runs"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "TRAINTEL_GLOBAL_BATCH_SIZE",
            "abc",
            "TRAINTEL_GLOBAL_BATCH_SIZE='abc': expected a positive integer",
        ),
        ("TRAINTEL_GLOBAL_BATCH_SIZE", "-4", "TRAINTEL_GLOBAL_BATCH_SIZE='-4': expected a positive integer"),
        ("TRAINTEL_SEQ_LEN", "1.5", "TRAINTEL_SEQ_LEN='1.5': expected a positive integer"),
        ("TRAINTEL_PEAK_FLOPS", "0", "TRAINTEL_PEAK_FLOPS='0': expected a positive number"),
        ("TRAINTEL_PEAK_FLOPS", "inf", "TRAINTEL_PEAK_FLOPS='inf': expected a positive number"),
        ("TRAINTEL_SHUTDOWN_TIMEOUT", "-1", "TRAINTEL_SHUTDOWN_TIMEOUT='-1': expected a non-negative number"),
        (
            "TRAINTEL_SHUTDOWN_TIMEOUT",
            "1e10",
            "TRAINTEL_SHUTDOWN_TIMEOUT='1e10': expected seconds from 0 to 86,400",
        ),
        (
            "TRAINTEL_CROSS_RANK_TIMEOUT",
            "9.3e9",
            "TRAINTEL_CROSS_RANK_TIMEOUT='9.3e9': expected seconds from above 0 to 86,400",
        ),
        (
            "TRAINTEL_LOG_EVERY_N_ITERATIONS",
            "0",
            "TRAINTEL_LOG_EVERY_N_ITERATIONS='0': expected a positive integer",
        ),
    ],
)
def test_bad_env_value_strict_names_variable_and_value(variable: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        TrainingConfig.from_env({variable: value}, strict=True)
    assert str(caught.value) == expected


def test_bad_env_value_lenient_logs_and_ignores_only_that_setting(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        config = TrainingConfig.from_env(
            {"TRAINTEL_GLOBAL_BATCH_SIZE": "abc", "TRAINTEL_SEQ_LEN": "512"}, strict=False
        )
    assert config.resolve().global_batch_size is None
    assert config.resolve().seq_len == 512
    assert "TRAINTEL_GLOBAL_BATCH_SIZE='abc': expected a positive integer" in caplog.text


def test_explicit_argument_errors_name_the_argument() -> None:
    with pytest.raises(ConfigurationError, match=r"^global_batch_size=0: expected a positive integer$"):
        traintel.configure(global_batch_size=0)
    with pytest.raises(
        ConfigurationError,
        match=r"^batch_size: unknown training config setting; did you mean global_batch_size\?",
    ):
        traintel.configure(batch_size=8)
    with pytest.raises(
        ConfigurationError, match=r"^colour: unknown training config setting \(known: session_tag, "
    ):
        traintel.configure(colour="red")
    with pytest.raises(
        ConfigurationError,
        match=r"^seq_length: unknown training config setting; did you mean seq_len\? \(known: session_tag, ",
    ):
        traintel.configure(seq_length=512)
    with pytest.raises(ConfigurationError, match=r"output_dir cannot be a callable"):
        traintel.configure(output_dir=lambda: "x")


def test_explicit_configure_fails_before_anything_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    provider_before = trace_api.get_tracer_provider()
    with pytest.raises(ConfigurationError) as caught:
        traintel.configure()
    assert str(caught.value).startswith("OTEL_EXPORTER_OTLP_PROTOCOL='carrier-pigeon': unknown OTLP protocol")
    assert trace_api.get_tracer_provider() is provider_before
    assert _state.configured() is None


def test_unknown_exporter_name_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin_v9")
    with pytest.raises(
        ConfigurationError, match=r"OTEL_TRACES_EXPORTER='zipkin_v9': unknown exporter 'zipkin_v9'"
    ) as caught:
        traintel.configure()
    # each installed name once (otlp was listed twice), and no package to suggest for this one
    installed = str(caught.value).split("(installed: ", 1)[1].removesuffix(")").split(", ")
    assert installed == sorted(set(installed)) and {"otlp", "none", "traintel_file"} <= set(installed)
    # an exporter the OpenTelemetry project ships apart, not installed: the package to install
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ConfigurationError, match=r"; pip install opentelemetry-exporter-zipkin\)$"):
        traintel.configure()


def test_lazy_values_are_resolved_when_needed() -> None:
    box = {"batch": 0}
    config = TrainingConfig({"global_batch_size": lambda: box["batch"] or None})
    assert config.is_lazy("global_batch_size")
    box["batch"] = 64
    assert config.resolve().global_batch_size == 64
    box["batch"] = 128
    assert config.resolve().global_batch_size == 128


def test_lazy_value_that_fails_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> int:
        raise RuntimeError("loader not ready")

    config = TrainingConfig({"global_batch_size": broken, "seq_len": lambda: "many"})
    with caplog.at_level(logging.WARNING):
        assert config.resolve().global_batch_size is None
        assert config.resolve().global_batch_size is None
        assert config.resolve().seq_len is None
    assert caplog.text.count("global_batch_size callable") == 1
    assert "seq_len callable gave an unusable value (expected a positive integer)" in caplog.text


def test_set_training_config_after_start(pipeline: Pipeline) -> None:
    with traintel.application():
        traintel.set_training_config(global_batch_size=lambda: 48)
        with pytest.raises(ConfigurationError, match="seq_len=-1"):
            traintel.set_training_config(seq_len=-1, flops_per_sample=5.0)
    telemetry = traintel.get_telemetry()
    assert telemetry.config.resolve().global_batch_size == 48
    assert telemetry.config.resolve().flops_per_sample is None  # the failed call changed nothing
    events = pipeline.one("application").events
    assert [e.name for e in events] == ["telemetry_initialization", "training_config_update"]


@pytest.mark.process
def test_a_huge_shutdown_timeout_is_refused_and_nothing_recorded_is_lost(tmp_path: Path) -> None:
    """Auto-configuration logs the bad value and keeps the default bound: the exit flushes
    every span instead of overflowing on the way out."""
    code = """
import traintel
with traintel.training_loop():
    for _ in range(600):
        with traintel.training_iteration():
            pass
"""
    result = run_python(
        code, tmp_path, TRAINTEL_SHUTDOWN_TIMEOUT="1e10", TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_OUTPUT_DIR="runs",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TRAINTEL_SHUTDOWN_TIMEOUT='1e10': expected seconds from 0 to 86,400" in result.stderr
    assert "OverflowError" not in result.stderr
    spans = list(iter_spans(sorted((tmp_path / "runs").glob("*.jsonl"))))
    assert sum(s.name == "training_iteration" for s in spans) == 600


@pytest.mark.process
def test_the_initialization_event_says_none_for_a_signal_that_is_off(tmp_path: Path) -> None:
    """Metrics off (``OTEL_METRICS_EXPORTER=none``) read as "(user provider)" before.

    In a fresh interpreter: with span exporters only, traintel publishes the meter provider it
    builds as the global one, which OpenTelemetry lets a process set once; a later configure in
    the same process attaches to it, and then "(user provider)" is right."""
    code = """
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from traintel import semconv

exporter = InMemorySpanExporter()
traintel.configure(span_exporters=[exporter])
with traintel.application():
    pass
traintel.shutdown(2)
(event,) = [e for s in exporter.get_finished_spans()
      for e in s.events if e.name == "telemetry_initialization"]
print(repr(event.attributes[semconv.METRICS_EXPORTERS]))
"""
    result = run_python(code, tmp_path, OTEL_METRICS_EXPORTER="none")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == repr(("none",))


@pytest.mark.process
def test_a_variable_not_read_or_a_letter_off_is_said_once_with_the_nearest(tmp_path: Path) -> None:
    """``TRAINTEL_WARMUP_ITERATION=3`` (one letter short) left the default warm-up in use,
    unsaid. Each unknown variable is said once, with the nearest known name when one is close,
    and the job runs on (an explicit ``configure()`` included). ``OTEL_TRACE_EXPORTER=otlp``
    (an ``S`` short) was ignored by the SDK, and the spans went to the local file, unsaid: an
    ``OTEL_*`` name near one of the SDK's is said once with it; names of other tools (near none)
    and the SDK's own are left alone."""
    job = run_python(
        "import traintel\ntraintel.configure()\n"
        "with traintel.training_loop():\n    with traintel.training_iteration():\n        pass\n"
        "traintel.shutdown()\n",
        tmp_path,
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        TRAINTEL_WARMUP_ITERATION="3",
        TRAINTEL_ZQX="1",
        TRAINTEL_WARMUP_ITERATIONS="2",
        OTEL_TRACE_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCAL="grpc",
        OTEL_BSP_MAX_QUEUE_SIZE="4096",
        OTEL_PYTHON_LOG_CORRELATION="true",
        OTEL_EXPORTER_PROMETHEUS_PORT="9464",
        OTEL_SEMCONV_STABILITY_OPT_IN="http",
    )
    assert job.returncode == 0, job.stderr
    said = [line for line in job.stderr.splitlines() if " is not a" in line]
    assert said == [
        "traintel: OTEL_EXPORTER_OTLP_PROTOCAL is not an OpenTelemetry variable (did you mean "
        "OTEL_EXPORTER_OTLP_PROTOCOL?); it is ignored",
        "traintel: OTEL_TRACE_EXPORTER is not an OpenTelemetry variable (did you mean "
        "OTEL_TRACES_EXPORTER?); it is ignored",
        "traintel: TRAINTEL_WARMUP_ITERATION is not a traintel variable (did you mean "
        "TRAINTEL_WARMUP_ITERATIONS?); it is ignored",
        "traintel: TRAINTEL_ZQX is not a traintel variable; it is ignored",
    ]
