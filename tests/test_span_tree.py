"""The span tree of a full instrumented run, for all three integration styles."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from opentelemetry.trace import SpanKind

import traintel
from tests import reference_job
from tests.conftest import Pipeline, parent_name
from tests.integration_helpers import metric_points
from traintel import callbacks, semconv


def _assert_reference_tree(pipeline: Pipeline) -> None:
    spans = pipeline.spans()
    assert Counter(s.name for s in spans) == reference_job.EXPECTED_COUNTS
    for span in spans:
        assert parent_name(span, spans) == reference_job.EXPECTED_PARENTS[span.name], span.name
        assert span.attributes is not None
        assert span.attributes.get(semconv.PHASE) == (
            None if span.name in reference_job.RECORDS else span.name
        )
        assert span.kind is SpanKind.INTERNAL
    assert len({s.context.trace_id for s in spans}) == 1, "one job, one trace"
    iterations = sorted(s.attributes[semconv.ITERATION] for s in pipeline.by_name("training_iteration"))  # type: ignore[index]
    assert iterations == list(range(reference_job.ITERATIONS))
    for span in pipeline.by_name("training_iteration"):
        assert span.attributes[semconv.METRIC_PREFIX + "loss"] == 1.5  # type: ignore[index]
    # children lie within their parents in time
    by_id = {s.context.span_id: s for s in spans}
    for span in spans:
        if span.parent is not None:
            parent = by_id[span.parent.span_id]
            assert parent.start_time <= span.start_time <= span.end_time <= parent.end_time  # type: ignore[operator]


@pytest.mark.parametrize("style", ["context_managers", "callbacks"])
def test_reference_tree(pipeline: Pipeline, style: str) -> None:
    run: Callable[[], None] = getattr(reference_job, "with_" + style)
    run()
    _assert_reference_tree(pipeline)


def test_reference_tree_plain_otel(pipeline: Pipeline) -> None:
    reference_job.with_plain_otel(pipeline.tracer_provider.get_tracer("user-code"))
    _assert_reference_tree(pipeline)


def test_user_spans_nest_both_ways(pipeline: Pipeline) -> None:
    tracer = pipeline.tracer_provider.get_tracer("user-code")
    with tracer.start_as_current_span("my_job"), traintel.training_loop(), traintel.training_iteration():
        with tracer.start_as_current_span("my_kernel"):
            with traintel.model_forward():
                pass
    spans = pipeline.spans()
    assert parent_name(pipeline.one("training_loop"), spans) == "my_job"
    assert parent_name(pipeline.one("my_kernel"), spans) == "training_iteration"
    assert parent_name(pipeline.one("model_forward"), spans) == "my_kernel"


def test_context_manager_yields_the_span_and_works_as_decorator(pipeline: Pipeline) -> None:
    @traintel.training_iteration()
    def step(x: int) -> int:
        return x * 2

    with traintel.training_loop(train_iterations_start=10) as loop_span:
        loop_span.set_attribute("custom", "yes")
        assert step(2) == 4
        assert step(3) == 6
        with traintel.timed_span("my_phase", phase="custom_phase", attributes={"k": 1}) as mine:
            assert mine.is_recording()
    loop = pipeline.one("training_loop")
    assert loop.attributes["custom"] == "yes"  # type: ignore[index]
    assert loop.attributes[semconv.TRAIN_ITERATIONS_START] == 10  # type: ignore[index]
    iterations = pipeline.by_name("training_iteration")
    assert [s.attributes[semconv.ITERATION] for s in iterations] == [10, 11]  # type: ignore[index]
    mine_span = pipeline.one("my_phase")
    assert mine_span.attributes == {"k": 1, semconv.PHASE: "custom_phase"}


def test_async_function_decorator(pipeline: Pipeline) -> None:
    import asyncio

    @traintel.validation_loop()
    async def evaluate() -> str:
        await asyncio.sleep(0)
        return "done"

    assert asyncio.run(evaluate()) == "done"
    assert pipeline.one("validation_loop").end_time is not None


def test_telemetry_initialization_event_reports_config_and_capabilities(pipeline: Pipeline) -> None:
    traintel.configure(
        tracer_provider=pipeline.tracer_provider,
        meter_provider=pipeline.meter_provider,
        global_batch_size=32,
        session_tag="sess",
    )
    with traintel.application():
        traintel.set_training_config(seq_len=128, flops_per_token=6e6)
    app = pipeline.one("application")
    init, update = app.events
    assert init.name == "telemetry_initialization"
    assert init.attributes["traintel.config.global_batch_size"] == 32  # type: ignore[index]
    assert "sample_throughput" in init.attributes[semconv.METRICS_ENABLED]  # type: ignore[index,operator]
    disabled = init.attributes[semconv.METRICS_DISABLED]  # type: ignore[index]
    assert any(d.startswith("token_throughput:") and "TRAINTEL_SEQ_LEN" in d for d in disabled)  # type: ignore[union-attr]
    assert any(d.startswith("mfu:") and "TRAINTEL_PEAK_FLOPS" in d for d in disabled)  # type: ignore[union-attr]
    assert update.name == "training_config_update"
    assert update.attributes["traintel.config.seq_len"] == 128  # type: ignore[index]
    assert "token_throughput" in update.attributes[semconv.METRICS_ENABLED]  # type: ignore[index,operator]
    assert "flops_throughput" in update.attributes[semconv.METRICS_ENABLED]  # type: ignore[index,operator]


def test_checkpoint_save_attributes_and_measured_size(pipeline: Pipeline, tmp_path: object) -> None:
    from pathlib import Path

    directory = Path(str(tmp_path)) / "ckpt"
    directory.mkdir()
    (directory / "a.bin").write_bytes(b"x" * 1000)
    (directory / "b.bin").write_bytes(b"y" * 24)
    with traintel.training_loop(train_iterations_start=5):
        with traintel.training_iteration():
            pass
        with traintel.checkpoint_save(strategy="async", path=directory):
            pass
        with traintel.checkpoint_save(iteration=99, size_bytes=7):
            pass
    async_save = pipeline.one("checkpoint_save_async")
    assert async_save.attributes[semconv.CHECKPOINT_SIZE] == 1024  # type: ignore[index]
    assert async_save.attributes[semconv.CHECKPOINT_ITERATION] == 6  # type: ignore[index]
    assert async_save.attributes[semconv.CHECKPOINT_STRATEGY] == "async"  # type: ignore[index]
    sync_save = pipeline.one("checkpoint_save_sync")
    assert sync_save.attributes[semconv.CHECKPOINT_SIZE] == 7  # type: ignore[index]
    assert sync_save.attributes[semconv.CHECKPOINT_ITERATION] == 99  # type: ignore[index]


def test_phase_duration_metric_in_seconds(pipeline: Pipeline) -> None:
    tracer = pipeline.tracer_provider.get_tracer("user-code")
    span = tracer.start_span("x", attributes={semconv.PHASE: "model_init"}, start_time=1_000_000_000)
    span.end(end_time=3_500_000_000)
    span = tracer.start_span("y", attributes={semconv.PHASE: "model_init"}, start_time=4_000_000_000)
    span.end(end_time=4_000_250_000)
    points = metric_points(pipeline.reader, semconv.METRIC_PHASE_DURATION)
    assert len(points) == 1
    assert points[0].attributes == {semconv.PHASE: "model_init"}
    assert points[0].count == 2
    assert points[0].sum == pytest.approx(2.50025, abs=1e-12)
    assert (points[0].min, points[0].max) == (0.00025, 2.5)
    # seconds buckets: 0.25 ms lands in the first bucket (<= 1 ms), 2.5 s in the (1, 2.5] bucket
    bounds = list(points[0].explicit_bounds)
    assert bounds[0] == 0.001 and bounds[-1] == 7200.0
    assert points[0].bucket_counts[0] == 1
    assert points[0].bucket_counts[bounds.index(2.5)] == 1


def test_one_success_event_when_the_callback_reports_it_too(pipeline: Pipeline) -> None:
    callbacks.on_train_start()
    callbacks.on_save_checkpoint_start(global_step=12)
    callbacks.on_save_checkpoint_success(global_step=12, attributes={"note": "user"})
    callbacks.on_save_checkpoint_end()
    callbacks.on_save_checkpoint_start(global_step=13)
    callbacks.on_save_checkpoint_end()  # no callback: traintel reports the success itself
    callbacks.on_train_end()
    first, second = pipeline.by_name("checkpoint_save_sync")
    successes = [e for e in first.events if e.name == "save_checkpoint_success"]
    assert len(successes) == 1 and successes[0].attributes["note"] == "user"  # type: ignore[index]
    assert [e.name for e in second.events].count("save_checkpoint_success") == 1


def test_iteration_ids_are_drawn_when_first_asked_and_kept(pipeline: Pipeline) -> None:
    """The fast path draws an iteration's span id only when something needs it; whatever asked
    first (a user span, get_span_context, the export) fixes the ids the exported span carries."""
    tracer = pipeline.tracer_provider.get_tracer("user-code")
    handed_out = []
    with traintel.training_loop() as loop:
        for i in range(3):  # the first 10 are exported: each iteration ends as an SDK span
            with traintel.training_iteration() as span:
                assert span.span_id == 0  # type: ignore[attr-defined]  # not drawn yet
                if i == 0:
                    with tracer.start_as_current_span("my_kernel"):
                        pass
                elif i == 1:
                    handed_out.append(span.get_span_context())
                    assert span.get_span_context() is handed_out[-1]  # built once
    loop_context = loop.get_span_context()
    iterations = sorted(pipeline.by_name("training_iteration"), key=lambda s: s.start_time or 0)
    assert len(iterations) == 3
    kernel = pipeline.one("my_kernel")
    assert kernel.parent is not None and kernel.parent.span_id == iterations[0].context.span_id
    assert iterations[1].context.span_id == handed_out[0].span_id
    assert iterations[1].context.trace_id == handed_out[0].trace_id == loop_context.trace_id
    for iteration in iterations:  # drawn at export for the one nobody asked about
        assert iteration.context.span_id != 0 and iteration.context.trace_id == loop_context.trace_id
        assert iteration.parent is not None and iteration.parent.span_id == loop_context.span_id
    assert len({s.context.span_id for s in iterations}) == 3
