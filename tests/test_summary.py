"""The run summary, from a file of spans built at exact timestamps."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import set_span_in_context

from traintel import semconv
from traintel.analysis.summary import percentile, render, summarize
from traintel.cli import main
from traintel.exporters.file import OtlpJsonFileSpanExporter, OtlpJsonLinesFile

S = 1_000_000_000  # ns per second


def _write_run(directory: Path) -> Path:
    file = OtlpJsonLinesFile(output_dir=directory)
    provider = TracerProvider(
        resource=Resource({"service.name": "exact", semconv.RANK: 0, semconv.RUN_ID: "r1"}),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileSpanExporter(file=file)))
    tracer = provider.get_tracer("t")

    def span(name: str, start: float, end: float, parent: object = None, **attributes: object) -> object:
        context = set_span_in_context(parent) if parent is not None else None  # type: ignore[arg-type]
        s = tracer.start_span(
            name,
            context=context,
            attributes={semconv.PHASE: name, **attributes},  # type: ignore[arg-type]
            start_time=int(start * S),
        )
        s.end(end_time=int(end * S))
        return s

    app = tracer.start_span("application", attributes={semconv.PHASE: "application"}, start_time=0)
    span("model_init", 0, 2, app)
    loop = tracer.start_span(
        "training_loop",
        context=set_span_in_context(app),
        attributes={semconv.PHASE: "training_loop"},
        start_time=2 * S,
    )
    # iteration durations 4, 1, 1, 2 s; 10 samples each; the last has a loss
    starts = [2, 6, 7, 8]
    durations = [4, 1, 1, 2]
    for i, (start, duration) in enumerate(zip(starts, durations, strict=True)):
        extra = {semconv.METRIC_PREFIX + "loss": 0.5} if i == 3 else {}
        span(
            "training_iteration",
            start,
            start + duration,
            loop,
            **{semconv.SAMPLES: 10, semconv.ITERATION: i},
            **extra,
        )
    span("checkpoint_save_sync", 10, 12, loop, **{semconv.CHECKPOINT_SIZE: 3_000_000})
    loop.end(end_time=12 * S)
    app.end(end_time=20 * S)
    provider.shutdown()
    assert file.path is not None
    return file.path


def test_summary_numbers_are_exact(tmp_path: Path) -> None:
    path = _write_run(tmp_path)
    summary = summarize([path])
    assert summary.spans == 8
    assert summary.application_s == 20.0
    assert summary.phases["training_iteration"].count == 4
    assert summary.phases["training_iteration"].total_s == 8.0
    assert summary.phases["training_iteration"].max_s == 4.0
    assert summary.phases["model_init"].total_s == 2.0
    assert summary.first_iteration_s == 4.0
    assert summary.sample_throughput == 40 / 8  # 40 samples over 8 s of iterations
    assert summary.checkpoint_bytes == 3_000_000
    assert summary.last_metrics == {"loss": 0.5}
    text = render(summary)
    assert "training_iteration           4      8.00 s      2.00 s      4.00 s   40.0%" in text
    assert "Iterations: 4  mean 2.00 s  p50 1.50 s  p90 3.40 s  p99 3.94 s  max 4.00 s" in text
    assert "First iteration: 4.00 s" in text
    assert "Throughput: 5.0 samples/s" in text
    assert "Checkpoints written: 3.00 MB" in text


def test_percentile_interpolates() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 100) == 4.0
    assert percentile(values, 90) == pytest.approx(3.7)


def test_cli_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_run(tmp_path)
    assert main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Run: service exact | run r1 | ranks [0]" in out
    assert main(["summary", str(tmp_path / "empty")]) == 2
