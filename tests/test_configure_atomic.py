"""A configuration the OpenTelemetry SDK rejects: one error naming the variable, nothing left behind.

The SDK's own constructors read many ``OTEL_*`` variables and raise a bare ``ValueError`` that
seldom names the variable. Explicit ``configure()`` must turn that into a ``ConfigurationError``
naming the variable and its value, and be atomic: no global provider set, no thread left from a
half-built processor or reader, the running job untouched, so that a corrected call in the same
process gets fresh providers. Global providers can be set once per process, hence the fresh
interpreters.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from tests.subprocess_helpers import run_python
from traintel._runtime import pipeline as providers
from traintel._runtime import state as _state
from traintel.config import ConfigurationError
from traintel.exporters import otlp_env
from traintel.exporters.reader import iter_spans

#: Tries ``configure()`` with the bad value, reports what it left, then configures again without it.
EXPLICIT_JOB = """
import json, os, threading
from opentelemetry import metrics, trace
import traintel
from traintel._runtime import state

variable, value = os.environ.pop("BAD_VARIABLE"), os.environ.pop("BAD_VALUE")
before = {t.ident for t in threading.enumerate()}
os.environ[variable] = value
report = {}
try:
    traintel.configure()
except ValueError as exc:  # what the SDK raised before, and ConfigurationError's base
    report["error_type"] = type(exc).__name__
    report["error"] = str(exc)
    report["cause"] = type(exc.__cause__).__name__
report["tracer_provider"] = type(trace.get_tracer_provider()).__name__
report["meter_provider"] = type(metrics.get_meter_provider()).__name__
report["configured"] = state.configured() is not None
report["new_threads"] = sorted(t.name for t in threading.enumerate() if t.ident not in before)

del os.environ[variable]
for name in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"):
    os.environ.pop(name, None)  # the embedded file: what reached the exporters can be read back
telemetry = traintel.configure()
report["owns_providers"] = [telemetry.pipeline.owns_tracer_provider, telemetry.pipeline.owns_meter_provider]
report["fresh_tracer_provider"] = trace.get_tracer_provider() is telemetry.pipeline.tracer_provider
report["fresh_meter_provider"] = metrics.get_meter_provider() is telemetry.pipeline.meter_provider
with traintel.training_loop():
    with traintel.training_iteration():
        with trace.get_tracer("user").start_as_current_span("user_span"):
            pass
traintel.shutdown(5)
print("REPORT" + json.dumps(report))
"""


#: The embedded default, named.
FILE = "traintel_file"


def _report(stdout: str) -> dict[str, object]:
    line = next(line for line in stdout.splitlines() if line.startswith("REPORT"))
    return dict(json.loads(line.removeprefix("REPORT")))


@pytest.mark.parametrize(
    ("variable", "value", "exporters", "message"),
    [
        # gRPC exporters parse their timeout and compression themselves, and raise.
        (
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "abc",
            ("otlp", "otlp"),
            "OTEL_EXPORTER_OTLP_TIMEOUT='abc': traces exporter 'otlp' could not start: "
            "could not convert string to float: 'abc'",
        ),
        (
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "zip",
            ("otlp", FILE),
            "OTEL_EXPORTER_OTLP_COMPRESSION='zip': traces exporter 'otlp' could not start: ",
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://[::1",
            (FILE, "otlp"),
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT='http://[::1': metrics exporter 'otlp' could not start: "
            "Invalid IPv6 URL",
        ),
        # The batch span processor, after its exporter was built.
        (
            "OTEL_BSP_SCHEDULE_DELAY",
            "-5",
            (FILE, FILE),
            "OTEL_BSP_SCHEDULE_DELAY='-5': the batch span processor of exporter 'traintel_file' "
            "could not start: schedule_delay_millis must be positive.",
        ),
        (
            "OTEL_BSP_MAX_QUEUE_SIZE",
            "0",
            (FILE, FILE),
            "OTEL_BSP_MAX_QUEUE_SIZE='0': the batch span processor of exporter 'traintel_file' "
            "could not start: ",
        ),
        # The periodic reader and the meter provider, after the whole trace side was built.
        (
            "OTEL_METRIC_EXPORT_INTERVAL",
            "0",
            (FILE, FILE),
            "OTEL_METRIC_EXPORT_INTERVAL='0': the periodic metric reader of exporter 'traintel_file' "
            "could not start: interval value 0.0 is invalid and needs to be larger than zero.",
        ),
        (
            "OTEL_METRICS_EXEMPLAR_FILTER",
            "bogus",
            (FILE, FILE),
            "OTEL_METRICS_EXEMPLAR_FILTER='bogus': the meter provider could not be built: ",
        ),
        (
            "OTEL_ATTRIBUTE_COUNT_LIMIT",
            "-3",
            (FILE, FILE),
            "OTEL_ATTRIBUTE_COUNT_LIMIT='-3': the tracer provider could not be built: ",
        ),
    ],
)
@pytest.mark.process
def test_a_value_the_sdk_rejects_fails_configure_atomically(
    tmp_path: Path, variable: str, value: str, exporters: tuple[str, str], message: str
) -> None:
    result = run_python(
        EXPLICIT_JOB,
        tmp_path,
        BAD_VARIABLE=variable,
        BAD_VALUE=value,
        OTEL_TRACES_EXPORTER=exporters[0],
        OTEL_METRICS_EXPORTER=exporters[1],
        TRAINTEL_OUTPUT_DIR="runs",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = _report(result.stdout)
    assert report.get("error_type") == "ConfigurationError", report.get("error")
    assert str(report["error"]).startswith(message), report["error"]
    assert report["cause"] != "NoneType"  # chained: the SDK's own error stays reachable
    # Nothing of the failed call is left: no global provider, no thread, no traintel state.
    assert report["tracer_provider"] == "ProxyTracerProvider"
    assert report["meter_provider"] == "_ProxyMeterProvider"
    assert report["configured"] is False
    assert report["new_threads"] == []
    # The corrected call builds and publishes fresh providers, and spans reach its exporters.
    assert report["owns_providers"] == [True, True]
    assert report["fresh_tracer_provider"] is True
    assert report["fresh_meter_provider"] is True
    names = [s.name for s in iter_spans(sorted((tmp_path / "runs").glob("*.jsonl")))]
    assert "training_iteration" in names
    assert "user_span" in names


AUTO_JOB = """
import json, os, threading
from opentelemetry import metrics, trace
import traintel

if "BAD_VARIABLE" in os.environ:  # read on first use, below
    os.environ[os.environ.pop("BAD_VARIABLE")] = os.environ.pop("BAD_VALUE")

with traintel.training_loop():
    with traintel.training_iteration():
        pass
print("REPORT" + json.dumps({
    "enabled": traintel.get_telemetry().enabled,
    "tracer_provider": type(trace.get_tracer_provider()).__name__,
    "meter_provider": type(metrics.get_meter_provider()).__name__,
    "threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
}))
"""


@pytest.mark.parametrize(
    ("variable", "value", "logged"),
    [
        (
            "OTEL_METRICS_EXEMPLAR_FILTER",
            "bogus",
            "OTEL_METRICS_EXEMPLAR_FILTER='bogus': the meter provider could not be built",
        ),
    ],
)
@pytest.mark.process
def test_automatic_configuration_says_which_value_and_leaves_nothing_half_built(
    tmp_path: Path, variable: str, value: str, logged: str
) -> None:
    result = run_python(AUTO_JOB, tmp_path, BAD_VARIABLE=variable, BAD_VALUE=value)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"traintel: {logged}" in result.stderr
    assert "telemetry is off for this process" in result.stderr
    assert "Traceback" not in result.stderr
    report = _report(result.stdout)
    assert report == {
        "enabled": False,
        "tracer_provider": "ProxyTracerProvider",
        "meter_provider": "_ProxyMeterProvider",
        "threads": [],
    }


@pytest.mark.process
def test_automatic_configuration_keeps_every_signal_when_the_interval_is_bad(tmp_path: Path) -> None:
    """Every periodic reader would refuse the interval (which lost the run's metrics): it gets
    the default instead, one line says so, and traces and metrics both go on."""
    result = run_python(AUTO_JOB, tmp_path, BAD_VARIABLE="OTEL_METRIC_EXPORT_INTERVAL", BAD_VALUE="0")
    assert result.returncode == 0, result.stderr[-3000:]
    said = "OTEL_METRIC_EXPORT_INTERVAL='0' is not a positive number of milliseconds; using the SDK's default"
    assert result.stderr.count(f"traintel: {said}") == 1, result.stderr
    assert "could not start" not in result.stderr and "Traceback" not in result.stderr
    report = _report(result.stdout)
    assert report["enabled"] is True and report["tracer_provider"] == "OwnedTracerProvider"
    [file] = (tmp_path / "traintel-runs").glob("*.otlp.jsonl")
    text = file.read_text()
    assert ('"training_iteration"' in text or '"training_loop"' in text) and '"resourceMetrics"' in text


@pytest.mark.process
def test_automatic_configuration_names_the_value_an_exporter_rejected(tmp_path: Path) -> None:
    """An exporter that cannot start is left out, as before; the line now says which value,
    and the job's first and last lines do not claim the telemetry goes (went) to OTLP. With
    none of a signal's exporters started, the signal goes to the embedded file, said (before:
    the run was recorded into nothing)."""
    result = run_python(
        AUTO_JOB,
        tmp_path,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_EXPORTER_OTLP_TIMEOUT="abc",
        TRAINTEL_QUIET="0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for signal in ("traces", "metrics"):
        assert (
            f"traintel: OTEL_EXPORTER_OTLP_TIMEOUT='abc': {signal} exporter 'otlp' could not start: "
            "could not convert string to float: 'abc' (going on without it)"
        ) in result.stderr
        said = (
            f"traintel: no {signal} exporter could start: the run's {signal} go to the embedded file instead"
        )
        assert result.stderr.count(said) == 1, result.stderr
    assert "(OTLP)" not in result.stderr, result.stderr
    assert _report(result.stdout)["enabled"] is True
    [file] = (tmp_path / "traintel-runs").glob("*.otlp.jsonl")
    text = file.read_text()
    assert '"training_iteration"' in text and '"resourceMetrics"' in text
    assert f"telemetry of this run is in {file}" in result.stderr


# --- in this process: private providers only, so nothing global is involved -----------------


def _new_threads(before: set[int | None]) -> list[str]:
    return [t.name for t in threading.enumerate() if t.ident not in before]


def test_a_failed_reconfiguration_leaves_the_running_job_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    first = InMemorySpanExporter()
    running = traintel.configure(span_exporters=[first], metric_readers=[])
    before = {t.ident for t in threading.enumerate()}
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "-5")
    with pytest.raises(ConfigurationError, match=r"^OTEL_BSP_SCHEDULE_DELAY='-5': the batch span processor"):
        traintel.configure(span_exporters=[InMemorySpanExporter()], metric_readers=[])
    assert _new_threads(before) == []
    assert traintel.get_telemetry() is running
    assert not running.closed
    with traintel.training_loop(), traintel.training_iteration():
        pass
    running.flush(60)
    assert "training_iteration" in [s.name for s in first.get_finished_spans()]


def test_the_callers_exporter_and_reader_are_handed_back_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The meter provider fails after the span side started: its threads stop, but the caller's
    exporter is not shut down, and their reader is not registered, so both work in the next call."""
    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    before = {t.ident for t in threading.enumerate()}
    monkeypatch.setenv("OTEL_METRICS_EXEMPLAR_FILTER", "bogus")
    with pytest.raises(
        ConfigurationError, match=r"^OTEL_METRICS_EXEMPLAR_FILTER='bogus': the meter provider"
    ):
        traintel.configure(span_exporters=[exporter], metric_readers=[reader])
    assert _new_threads(before) == []
    assert _state.configured() is None

    monkeypatch.delenv("OTEL_METRICS_EXEMPLAR_FILTER")
    telemetry = traintel.configure(span_exporters=[exporter], metric_readers=[reader])
    with traintel.training_loop(), traintel.training_iteration():
        pass
    telemetry.flush(60)
    assert "training_iteration" in [s.name for s in exporter.get_finished_spans()]
    assert reader.get_metrics_data() is not None


def test_a_failure_without_a_variable_names_the_step_and_the_error() -> None:
    """A reader already registered elsewhere: no variable to blame, so the step and the SDK's
    error are named; what the call had started is stopped."""
    reader = InMemoryMetricReader()
    other = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    before = {t.ident for t in threading.enumerate()}
    try:
        with pytest.raises(ConfigurationError) as caught:
            traintel.configure(span_exporters=[InMemorySpanExporter()], metric_readers=[reader])
    finally:
        other.shutdown()
    assert str(caught.value).startswith("the meter provider could not be built: Exception: MetricReader"), (
        caught.value
    )
    assert "registered already" in str(caught.value)
    assert caught.value.__cause__ is not None
    assert _new_threads(before) == []
    assert _state.configured() is None


def test_credentials_in_a_rejected_endpoint_are_not_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://ci:s3cr3t-pass@[::1")
    with pytest.raises(ConfigurationError) as caught:
        traintel.configure(metric_readers=[])
    assert str(caught.value) == (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (value not shown): traces exporter 'otlp' could not start: "
        "Invalid IPv6 URL"
    )


def test_a_header_variable_is_named_without_its_value(caplog: pytest.LogCaptureFixture) -> None:
    """This SDK only warns on malformed headers; an error that quoted one must still not show it."""
    environ = {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20s3cr3t-token"}
    quoting = ValueError("bad header 'authorization=Bearer%20s3cr3t-token'")
    what, settings = "traces exporter 'otlp' could not start", providers._otlp_settings("traces")
    error = providers._sdk_error(what, quoting, settings, environ)
    assert str(error).startswith("OTEL_EXPORTER_OTLP_HEADERS (value not shown): traces exporter 'otlp'")
    assert "s3cr3t" not in str(error)
    with pytest.raises(ConfigurationError) as caught:
        providers._raise(what, quoting, settings, environ)
    assert caught.value.__cause__ is None  # the cause quotes the secret: not chained
    with caplog.at_level(logging.ERROR):
        providers._exporter_failed("traces", "otlp", quoting, environ, strict=False)
    assert "OTEL_EXPORTER_OTLP_HEADERS (value not shown)" in caplog.text
    assert "s3cr3t" not in caplog.text


_DEFAULT_USED = "is not a positive integer; using the SDK's default"
SIX_ITERATIONS = """
import traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(6):
            with traintel.training_iteration():
                pass
"""
_BATCH = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"


@pytest.mark.process
@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("OTEL_BSP_SCHEDULE_DELAY", "-5", f"OTEL_BSP_SCHEDULE_DELAY='-5' {_DEFAULT_USED} 5000"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0", f"OTEL_BSP_MAX_QUEUE_SIZE='0' {_DEFAULT_USED} 2048"),
        (
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            "abc",
            f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE='abc' {_DEFAULT_USED} 512",
        ),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=512 is over the queue's 100"),
    ],
)
def test_a_bad_batch_processor_value_falls_back_to_the_default_and_loses_nothing(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    """The automatic configuration: the SDK's default for the one bad value, said once naming
    the variable; the whole trace in the file (OTEL_BSP_SCHEDULE_DELAY=-5 gave 0 spans)."""
    result = run_python(
        SIX_ITERATIONS,
        tmp_path,
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
        **{variable: value},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(said) == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    names = [s.name for s in iter_spans([tmp_path / "runs"])]
    assert names.count("training_iteration") == 6 and "application" in names


@pytest.mark.process
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_METRIC_EXPORT_INTERVAL", "-1000"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "abc"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "0"),
    ],
)
def test_a_bad_metric_reader_value_falls_back_to_the_default_and_keeps_the_metrics(
    tmp_path: Path, variable: str, value: str
) -> None:
    """The automatic configuration: a bad interval or timeout is said once, naming the variable
    and its value, and the run keeps its metrics (a negative interval lost them all, "abc" was
    replaced by the SDK with a line that named neither)."""
    result = run_python(
        SIX_ITERATIONS, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), **{variable: value}
    )
    assert result.returncode == 0, result.stderr
    said = f"{variable}={value!r} is not a positive number of milliseconds; using the SDK's default"
    assert result.stderr.count(said) == 1 and "invalid" not in result.stderr, result.stderr
    (path,) = (tmp_path / "runs").glob("*.otlp.jsonl")
    assert any(line.startswith(b'{"resourceMetrics"') for line in path.open("rb"))


@pytest.mark.process
@pytest.mark.parametrize(("delay", "lines"), [(None, 1), ("300", 2)])
def test_the_embedded_file_gathers_spans_for_a_minute_unless_told(
    tmp_path: Path, delay: str | None, lines: int
) -> None:
    """Each batch is a line repeating the resource: the embedded file's processor waits 60 s by
    default (the SDK's 5 s put a real hour at 10 steps/s over its volume budget), the user's
    ``OTEL_BSP_SCHEDULE_DELAY`` otherwise. Spans end 0, 2 and 4 s into a 5 s job: one line (the
    exit's flush) against at least two."""
    job = """
import time, traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(3):
            with traintel.training_iteration():
                pass
            time.sleep(2 if i < 2 else 1)
"""
    env = {} if delay is None else {"OTEL_BSP_SCHEDULE_DELAY": delay}
    result = run_python(
        job, tmp_path, TRAINTEL_EXPORT_ITERATIONS="all", TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), **env
    )
    assert result.returncode == 0, result.stderr
    (path,) = (tmp_path / "runs").glob("*.otlp.jsonl")
    span_lines = [line for line in path.open("rb") if line.startswith(b'{"resourceSpans"')]
    assert len(span_lines) == lines if delay is None else len(span_lines) >= lines
    names = [s.name for s in iter_spans([tmp_path / "runs"])]
    assert names.count("training_iteration") == 3 and "application" in names


@pytest.mark.parametrize(
    ("sampler", "arg", "said"),
    [("always_off", "", True), ("traceidratio", "0.5", True), ("traceidratio", "1", False), ("", "", False)],
)
def test_a_sampler_that_drops_traces_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, sampler: str, arg: str, said: bool
) -> None:
    """traintel measures from its spans: a dropped trace is missing from the metrics too (with
    ``always_off`` the run had no duration, throughput or goodput metric at all)."""
    monkeypatch.setattr(otlp_env, "said", set())
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    reader = InMemoryMetricReader()
    with caplog.at_level(logging.WARNING):
        telemetry = traintel.configure(span_exporters=[InMemorySpanExporter()], metric_readers=[reader])
        traintel.configure(span_exporters=[InMemorySpanExporter()], metric_readers=[InMemoryMetricReader()])
    lines = [r.getMessage() for r in caplog.records if "drops traces" in r.getMessage()]
    if said:
        given = f"OTEL_TRACES_SAMPLER={sampler!r}" + (f" (OTEL_TRACES_SAMPLER_ARG={arg!r})" if arg else "")
        assert lines == [
            f"traintel: {given} drops traces, and traintel measures training from its spans: the "
            "iterations, windows and checkpoints of a dropped trace are missing from its metrics "
            "(throughput, goodput, MFU), summary and reports. traintel chooses the spans it "
            "exports itself (TRAINTEL_EXPORT_ITERATIONS): unset the sampler"
        ]
    else:
        assert lines == []
    assert telemetry.closed  # replaced by the second configuration


#: Two jobs in one process: each shut down explicitly (a notebook's cells, say), or the second
#: replacing the first by a ``configure()`` with other providers.
TWO_JOBS = """
import os
import traintel
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
for job in range(2):
    if os.environ["HOW"] == "reconfigured":
        traintel.configure(**({"metric_readers": [InMemoryMetricReader()]} if job else {}))
    with traintel.training_loop():
        for i in range(3):
            with traintel.training_iteration(samples=4):
                pass
    if os.environ["HOW"] == "shut down":
        traintel.shutdown()
"""


@pytest.mark.process
@pytest.mark.parametrize("how", ["shut down", "reconfigured"])
def test_a_job_after_another_records_into_providers_of_its_own(tmp_path: Path, how: str) -> None:
    """After ``shutdown()`` the next API call configures a new job; a ``configure()`` with other
    providers replaces the running job. Either way the new job attached to the first job's
    providers, still the global ones (OpenTelemetry sets them once) and shut down with that job:
    its spans and metrics went nowhere ("Shutdown called, ignoring Span", "A shutdown
    MeterProvider can not provide a Meter"). It builds its own now; both jobs are in the file."""
    result = run_python(TWO_JOBS, tmp_path, HOW=how)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "shutdown `MeterProvider`" not in result.stderr and "ignoring Span" not in result.stderr
    assert "could not be written" not in result.stderr
    spans = list(iter_spans([tmp_path / "traintel-runs"]))
    runs = {str(s.resource["ml.training.run_id"]) for s in spans}
    iterations = [s for s in spans if s.name == "training_iteration"]
    windows = [s.attributes["ml.training.window.iterations"] for s in spans if s.name == "training_window"]
    assert (len(runs), len(iterations), windows) == (2, 6, [3, 3])


@pytest.mark.process
def test_a_new_service_name_for_the_running_job_is_said_not_dropped(tmp_path: Path) -> None:
    """``configure(service_name="b")`` on a running job keeps the job (and its name): said."""
    code = "import traintel\ntraintel.configure(service_name='a')\ntraintel.configure(service_name='b')\n"
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    said = "configure(service_name='b'): the running job keeps its name 'a'"
    assert result.stderr.count(said) == 1, result.stderr
