"""Training metrics with exact numbers: windows, totals, throughput, MFU, checkpoints, eval.

Iterations are driven through the callbacks with explicit millisecond timestamps, so every
duration is exact and every formula can be asserted to the digit.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import Span, StatusCode

import traintel
from traintel import callbacks, semconv
from traintel._recorder import active
from traintel._runtime import window_consumers
from traintel._sdk.processor import MAX_OWN_PHASES

T0 = 1_700_000_000_000  # ms since the epoch
W = semconv.WINDOW_PREFIX
TOT = semconv.TOTAL_PREFIX


def ms(seconds: float) -> float:
    return T0 + seconds * 1000


def step(start: float, duration: float, *, phases: bool = True, loss: float | None = None) -> None:
    """One training iteration [start, start + duration) s with data 1/16, forward 1/4 and
    backward 1/8 of its length (binary fractions: the sums are exact)."""
    callbacks.on_training_single_iteration_start(start_time_msec=ms(start))
    if phases:
        t = start
        for start_cb, end_cb, share in (
            (callbacks.on_data_loading_start, callbacks.on_data_loading_end, 1 / 16),
            (callbacks.on_model_forward_start, callbacks.on_model_forward_end, 1 / 4),
            (callbacks.on_model_backward_start, callbacks.on_model_backward_end, 1 / 8),
        ):
            start_cb(start_time_msec=ms(t))
            t += duration * share
            end_cb(finish_time_msec=ms(t))
    if loss is not None:
        traintel.record_metrics(loss=loss)
    callbacks.on_training_single_iteration_end(finish_time_msec=ms(start + duration))


def run_loop(durations: list[float], **kwargs: Any) -> float:
    callbacks.on_train_start(train_iterations_start=0, start_time_msec=ms(0))
    t = 0.0
    for i, duration in enumerate(durations):
        step(t, duration, loss=float(i), **kwargs)
        t += duration
    callbacks.on_train_end(finish_time_msec=ms(t))
    return t


def test_window_and_total_numbers_are_exact(owned: Any) -> None:
    job = owned(
        log_every_n_iterations=4, warmup_iterations=1, global_batch_size=8, seq_len=4,
        flops_per_token=10, peak_flops=1000, export_iterations="none",
    )  # fmt: skip
    run_loop([2, 1, 1, 2, 1, 1, 1, 1, 3])
    windows = job.events("training_metrics_update")
    assert [w[W + "iterations"] for w in windows] == [4, 4, 1]  # the last, partial, at loop end
    first = windows[0]
    assert (first[W + "index"], first[W + "first_iteration"], first[W + "last_iteration"]) == (0, 0, 3)
    assert first[W + "iteration_time.min"] == 1.0
    assert first[W + "iteration_time.max"] == 2.0
    assert first[W + "iteration_time.mean"] == 1.5
    assert first[W + "iteration_time.p50"] == 1.5
    assert first[W + "iteration_time.p90"] == 2.0
    assert first[W + "iteration_time.stddev"] == 0.5
    assert first[W + "samples"] == 32.0  # 4 steps x 8 samples (global batch / world size 1)
    assert first[W + "tokens"] == 128.0
    assert first[W + "samples_per_second_per_device"] == 32 / 6
    assert first[W + "samples_per_second"] == 32 / 6
    assert first[W + "tokens_per_second"] == 128 / 6
    assert first[W + "flops_per_second_per_device"] == 1280 / 6
    assert first[W + "tflops_per_device"] == 1280 / 6 / 1e12
    assert first[W + "mfu"] == 1280 / 6 / 1000
    assert first[semconv.MFU_NUMERATOR] == 1280 / 6
    assert first[semconv.MFU_DENOMINATOR] == 1000
    assert first[semconv.MFU_FLOPS_METHOD] == "config"
    assert first[semconv.MFU_TIMING_MODE] == "wall_clock"
    assert first[semconv.MFU_PEAK_SOURCE] == "config (TRAINTEL_PEAK_FLOPS)"
    assert first[W + "time.data_loading"] == 6 / 16
    assert first[W + "time.forward"] == 6 / 4
    assert first[W + "time.backward"] == 6 / 8
    assert first[W + "time.optimizer"] == 0.0
    assert first[W + "data_loading_fraction"] == (6 / 16) / 6
    assert first[W + "metric.loss.last"] == 3.0
    assert first[W + "metric.loss.mean"] == 1.5
    # totals leave out the 1 warm-up iteration: [1, 1, 2] so far
    assert first[TOT + "iterations"] == 4
    assert first[TOT + "iteration_time.mean"] == 4 / 3
    assert first[TOT + "iteration_time.p50"] == 1.0
    assert first[TOT + "samples_per_second"] == 24 / 4
    assert first[TOT + "flops_per_second_per_device"] == 24 * 4 * 10 / 4  # the total MFU's numerator
    assert first[TOT + "mfu"] == first[TOT + "flops_per_second_per_device"] / 1000
    second = windows[1]
    assert second[W + "iteration_time.mean"] == 1.0
    assert second[W + "iteration_time.stddev"] == 0.0
    assert second[TOT + "iteration_time.mean"] == 8 / 7
    loop = job.named("training_loop")[0].attributes
    S = semconv.SUMMARY_PREFIX
    assert loop[S + "iterations"] == 9
    assert loop[S + "train_time"] == 13.0
    assert loop[S + "first_iteration_time"] == 2.0
    assert loop[S + "iteration_time.mean"] == 11 / 8
    assert loop[S + "samples_per_second"] == 64 / 11
    assert loop[S + "mfu"] == 64 * 40 / 11 / 1000
    # next to the run's MFU, what it was computed from
    assert loop[S + "flops_per_second_per_device"] == 64 * 40 / 11
    assert loop[S + "mfu.numerator_flops_per_second"] == 64 * 40 / 11
    assert loop[S + "mfu.denominator_peak_flops"] == 1000
    assert loop[S + "mfu.flops_method"] == "config"
    assert loop[S + "mfu.timing_mode"] == "wall_clock"
    assert loop[S + "mfu.peak_source"] == "config (TRAINTEL_PEAK_FLOPS)"


@pytest.mark.parametrize(("iterations", "events"), [(3, [3]), (4, [4]), (5, [4, 1])])
def test_window_boundaries(owned: Any, iterations: int, events: list[int]) -> None:
    job = owned(log_every_n_iterations=4, export_iterations="none")
    run_loop([1.0] * iterations, phases=False)
    assert [w[W + "iterations"] for w in job.events("training_metrics_update")] == events


def test_lazy_batch_size_arriving_mid_run(owned: Any) -> None:
    job = owned(log_every_n_iterations=4, export_iterations="none")
    callbacks.on_train_start(start_time_msec=ms(0))
    step(0, 1, phases=False)
    step(1, 1, phases=False)
    traintel.set_training_config(global_batch_size=lambda: 16)
    step(2, 2, phases=False)
    step(4, 2, phases=False)
    callbacks.on_train_end(finish_time_msec=ms(6))
    (window,) = job.events("training_metrics_update")
    assert window[W + "samples"] == 32.0  # only the two steps after the batch size was known
    assert window[W + "samples_per_second"] == 32 / 4  # over those steps' time


def test_micro_batches_are_summed_per_step(owned: Any) -> None:
    job = owned(log_every_n_iterations=2, export_iterations="all", global_batch_size=999)
    callbacks.on_train_start(start_time_msec=ms(0))
    for i in range(2):
        callbacks.on_training_single_iteration_start(start_time_msec=ms(i))
        for _ in range(4):  # gradient accumulation: 4 micro-batches, one optimizer step
            traintel.record_batch(samples=2, tokens=20, padding_tokens=4)
        callbacks.on_training_single_iteration_end(finish_time_msec=ms(i + 1))
    callbacks.on_train_end(finish_time_msec=ms(2))
    (window,) = job.events("training_metrics_update")
    assert window[W + "samples"] == 16.0  # 2 steps x 8, not 8 x per-micro-batch time
    assert window[W + "tokens"] == 160.0
    assert window[W + "padding_tokens"] == 32.0
    assert window[W + "padding_fraction"] == 32 / 192
    assert window[W + "samples_per_second"] == 8.0
    spans = job.named("training_iteration")
    assert [s.attributes[semconv.SAMPLES] for s in spans] == [8, 8]
    assert [s.attributes[semconv.MICRO_BATCHES] for s in spans] == [4, 4]


def test_a_count_given_to_the_iteration_and_to_record_batch_is_said(
    owned: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``training_iteration(samples=8)`` and the same step's two ``record_batch(samples=4)``
    count 16 samples a step (the two add up, as they always did): every rate twice what the
    user meant, and nothing said. Now said once, naming the count; one given in one place
    (tokens here, padding) is not."""
    job = owned(log_every_n_iterations=2, export_iterations="all")
    with caplog.at_level(logging.WARNING, logger="traintel"), traintel.training_loop():
        for _ in range(2):
            with traintel.training_iteration(samples=8, tokens=100):
                traintel.record_batch(samples=4)
                traintel.record_batch(samples=4, padding_tokens=2)
    (window,) = job.events("training_metrics_update")
    assert (window[W + "samples"], window[W + "tokens"], window[W + "padding_tokens"]) == (32.0, 200.0, 4.0)
    said = [r.getMessage() for r in caplog.records if "add up" in r.getMessage()]
    assert said == [
        "traintel: record_batch(samples) on iteration 0, which was given it already (training_iteration(...) "
        "or its attributes): the two add up; give each count in one place (reported once)"
    ]


def test_mfu_above_one_is_an_error_event_not_a_metric(owned: Any, caplog: pytest.LogCaptureFixture) -> None:
    job = owned(log_every_n_iterations=2, global_batch_size=1, flops_per_sample=5e3, peak_flops=1e3)
    with caplog.at_level(logging.WARNING):
        run_loop([1, 1], phases=False)
    (window,) = job.events("training_metrics_update")
    assert W + "mfu" not in window
    assert window[W + "flops_per_second_per_device"] == 5e3
    (error,) = job.events("metric_out_of_range")
    assert error[semconv.ERROR_REASON] == "mfu 5.000 > 1"
    assert error[semconv.MFU_NUMERATOR] == 5e3
    assert error[semconv.MFU_DENOMINATOR] == 1e3
    assert caplog.text.count("mfu 5.000 > 1") == 1


def test_no_peak_on_cpu_means_no_mfu_and_one_warning(
    owned: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        window_consumers, "current_device_name", lambda device=None: None
    )  # no GPU in use, on any machine
    job = owned(log_every_n_iterations=1, global_batch_size=1, flops_per_sample=10)
    with caplog.at_level(logging.WARNING):
        run_loop([1, 1, 1], phases=False)
    windows = job.events("training_metrics_update")
    assert all(W + "mfu" not in w and w[W + "flops_per_second_per_device"] == 10 for w in windows)
    assert caplog.text.count("no MFU: no GPU: set TRAINTEL_PEAK_FLOPS") == 1


@pytest.mark.parametrize(
    ("samples", "tokens", "said"),
    [(64, None, "samples"), (32, 8192, "tokens"), (32, 4096, ""), (8, 1024, ""), (None, None, "")],
)
def test_more_samples_or_tokens_per_iteration_than_the_global_batch_is_said_once(
    owned: Any, caplog: pytest.LogCaptureFixture, samples: int | None, tokens: int | None, said: str
) -> None:
    """``samples=`` and ``tokens=`` are each rank's: 64 samples per iteration with
    ``global_batch_size=32`` (the batch given twice over, or each rank's samples given the global
    batch), or 8,192 tokens with 32 x 128 per step, make every samples/s (tokens/s) 2x too high.
    The batch itself, a micro-batch of a step accumulated over four iterations, and no counts
    (each iteration counts the global batch's share) are not said."""
    job = owned(log_every_n_iterations=2, global_batch_size=32, seq_len=128, export_iterations="none")
    with caplog.at_level(logging.WARNING):
        callbacks.on_train_start(train_iterations_start=0, start_time_msec=ms(0))
        for i in range(6):
            callbacks.on_training_single_iteration_start(
                start_time_msec=ms(i), samples=samples, tokens=tokens
            )
            callbacks.on_training_single_iteration_end(finish_time_msec=ms(i + 1))
        callbacks.on_train_end(finish_time_msec=ms(6))
    windows = job.events("training_metrics_update")
    assert [w[W + "samples"] for w in windows] == [2 * (samples or 32)] * 3  # the counts as given
    assert [w[W + "tokens"] for w in windows] == [2 * (tokens or (samples or 32) * 128)] * 3
    expected = {
        "samples": "samples= counts 64 per iteration on each of 1 rank(s), 64 per step, more than "
        "global_batch_size=32: samples= is each rank's share, and the job's samples/s multiplies "
        "it by the world size (throughput is 2x the global batch's)",
        "tokens": "tokens= counts 8192 per iteration on each of 1 rank(s), 8192 per step, more than "
        "global_batch_size x seq_len=32 x 128: tokens= is each rank's share, and the job's tokens/s "
        "multiplies it by the world size (throughput is 2x the global batch's)",
    }
    for what, line in expected.items():
        assert caplog.text.count(line) == (what == said), caplog.text
    assert said or "global_batch_size" not in caplog.text


def test_checkpoint_metrics(owned: Any) -> None:
    job = owned(export_iterations="none")
    pipeline = traintel.get_telemetry().pipeline
    assert pipeline is not None
    tracer = pipeline.tracer_provider.get_tracer("user-checkpointer")
    callbacks.on_train_start(start_time_msec=ms(0))
    callbacks.on_save_checkpoint_start(global_step=10, start_time_msec=ms(1), size_bytes=100)
    callbacks.on_save_checkpoint_end(finish_time_msec=ms(3))
    save = callbacks.on_save_checkpoint_start(global_step=20, start_time_msec=ms(5), size_bytes=300)
    # plain OTel stage spans inside our save, at exact times
    from opentelemetry import trace

    for stage, begin, end in (("staging", 5, 5.5), ("write", 5.5, 8.5), ("barrier", 8.5, 9)):
        span = tracer.start_span(
            "checkpoint_" + stage, context=trace.set_span_in_context(save),
            attributes={semconv.PHASE: "checkpoint_" + stage}, start_time=int(ms(begin) * 1e6),
        )  # fmt: skip
        span.end(end_time=int(ms(end) * 1e6))
    callbacks.on_save_checkpoint_end(finish_time_msec=ms(9))
    callbacks.on_train_end(finish_time_msec=ms(10))
    first, second = job.named("checkpoint_save_sync")
    assert first.attributes[semconv.CHECKPOINT_ITERATION] == 10
    assert second.attributes[semconv.CHECKPOINT_BYTES_PER_SECOND] == 75.0
    assert [e.name for e in second.events] == ["save_checkpoint_success", "checkpoint_metrics_update"]
    update = dict(second.events[1].attributes or {})
    C = semconv.CHECKPOINT_PREFIX
    assert update[C + "saves"] == 2
    assert (update[C + "save_time.first"], update[C + "save_time.last"]) == (2.0, 4.0)
    assert (update[C + "save_time.min"], update[C + "save_time.max"]) == (2.0, 4.0)
    assert (update[C + "save_time.mean"], update[C + "save_time.total"]) == (3.0, 6.0)
    assert update[C + "bytes.total"] == 400
    assert update[C + "stage.staging.time_total"] == 0.5
    assert update[C + "stage.write.time_total"] == 3.0
    assert update[C + "stage.barrier.time_total"] == 0.5
    points = job.metric_points(semconv.METRIC_CHECKPOINT_SAVE_DURATION)
    assert [(p.count, p.sum) for p in points] == [(2, 6.0)]
    assert points[0].attributes == {semconv.CHECKPOINT_STRATEGY: "sync"}


def test_failed_checkpoints_are_counted_by_phase(owned: Any) -> None:
    """A save that raised, an async save whose writer finished with an error, a load that raised
    and a plain OpenTelemetry save span ended with ERROR: each counted once by its phase, so a
    backend sees that the job's checkpoints stopped working (the durations alone do not say)."""
    job = owned(export_iterations="none")
    pipeline = traintel.get_telemetry().pipeline
    assert pipeline is not None
    tracer = pipeline.tracer_provider.get_tracer("user-checkpointer")
    with traintel.application(), traintel.training_loop():
        for failing in (traintel.checkpoint_save(), traintel.checkpoint_load()):
            with contextlib.suppress(OSError), failing:
                raise OSError(28, "No space left on device")
        with traintel.checkpoint_save(iteration=1):  # a save that worked: not counted
            pass
        save = traintel.checkpoint_save(strategy="async")
        with save:
            completion = save.completion()
        completion.finish(error=OSError(5, "Input/output error"))
        span = tracer.start_span("save", attributes={semconv.PHASE: "checkpoint_save_async"})
        span.set_status(StatusCode.ERROR, "writer died")
        span.end()
    points = job.metric_points(semconv.METRIC_CHECKPOINT_FAILURES)
    assert sorted((p.attributes[semconv.PHASE], p.value) for p in points) == [
        ("checkpoint_finalize", 1), ("checkpoint_load", 1),
        ("checkpoint_save_async", 1), ("checkpoint_save_sync", 1),
    ]  # fmt: skip


def test_phases_of_the_user_s_own_past_the_cap_count_as_other_in_the_metric(
    owned: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``timed_span(..., phase=f"layer_{i}")`` for 70 layers: one histogram series per value in
    every backend. The metric keeps the first 64 apart and counts the rest as ``other``, said
    once; traintel's own phases are never folded, and every span keeps its phase."""
    job = owned(export_iterations="none")
    with traintel.application(), traintel.training_loop():
        for i in range(70):
            with traintel.timed_span(f"layer {i}", phase=f"layer_{i}"):
                pass
        with traintel.checkpoint_save(iteration=1):
            pass
    counts = {p.attributes[semconv.PHASE]: p.count for p in job.metric_points(semconv.METRIC_PHASE_DURATION)}
    assert {f"layer_{i}" for i in range(MAX_OWN_PHASES)} <= set(counts)
    assert counts["other"] == 70 - MAX_OWN_PHASES and counts["checkpoint_save_sync"] == 1
    assert not {f"layer_{i}" for i in range(MAX_OWN_PHASES, 70)} & set(counts)
    said = [r.getMessage() for r in caplog.records if "phases of your own" in r.getMessage()]
    assert len(said) == 1 and "'layer_64'" in said[0], said
    assert {s.attributes[semconv.PHASE] for s in job.named("layer 69")} == {"layer_69"}


def test_an_async_save_whose_write_failed_is_no_resume_point(owned: Any) -> None:
    """Where a preemption says a resume starts: the last save that did not raise, an async one
    from its blocking part; once its writer fails, the save before it again, unless a later save
    has been made since."""
    import signal

    from traintel._runtime.preemption import preemption_attributes

    owned(export_iterations="none")
    telemetry = traintel.get_telemetry()

    def resume_point() -> object:
        at = preemption_attributes(telemetry, signal.SIGTERM, 0, 9)
        return at[semconv.PREEMPTION_CHECKPOINT_ITERATION], at[semconv.PREEMPTION_ITERATIONS_LOST]

    completions = {}
    with traintel.application(), traintel.training_loop(train_iterations_start=0):
        for i in range(10):
            with traintel.training_iteration():
                pass
            if i == 3:
                with traintel.checkpoint_save(iteration=4):
                    pass
            if i in (5, 7, 9):
                save = traintel.checkpoint_save(strategy="async", iteration=i + 1)
                with save:
                    completions[i + 1] = save.completion()
        assert resume_point() == (10, 0)
        completions[10].finish(error=OSError(5, "Input/output error"))
        assert resume_point() == (8, 2)  # the one before it (its writer still busy)
        completions[6].finish(error=OSError(5, "Input/output error"))
        assert resume_point() == (8, 2)  # a later save was made since: it stands
        completions[8].finish()
        assert resume_point() == (8, 2)


def test_async_checkpoint_blocking_and_background(owned: Any) -> None:
    job = owned(log_every_n_iterations=100)
    done = threading.Event()
    with traintel.application(), traintel.training_loop():
        for i in range(3):
            with traintel.training_iteration():
                pass
            if i == 0:
                # ``as``: the save's span, with its completion (the docs' spelling binds the
                # phase first: ``save = checkpoint_save(...)``, ``with save:``; both work)
                with traintel.checkpoint_save(strategy="async", size_bytes=1000) as save:
                    assert isinstance(save, Span)
                    save.set_attribute("writer", "thread")
                    completion = save.completion()

                    def write(completion: traintel.AsyncCheckpointCompletion = completion) -> None:
                        done.wait(5)
                        completion.finish()
                        completion.finish()  # idempotent

                    writer = threading.Thread(target=write)
                    writer.start()
        done.set()  # the write overlapped two more iterations
        writer.join()
    (blocking,) = job.named("checkpoint_save_async")
    (finalize,) = job.named("checkpoint_finalize")
    assert blocking.context.span_id == save.get_span_context().span_id
    assert blocking.attributes["writer"] == "thread"
    assert finalize.start_time == blocking.end_time  # background time starts when training resumes
    first_iteration = next(s for s in job.named("training_iteration") if s.attributes[semconv.ITERATION] == 0)
    # linked to its save and to the iteration that was just completed (exported: it was the first)
    assert [link.context.span_id for link in finalize.links] == [
        blocking.context.span_id,
        first_iteration.context.span_id,
    ]
    loop = job.named("training_loop")[0]
    assert finalize.parent is not None and finalize.parent.span_id == loop.context.span_id
    assert finalize.attributes[semconv.CHECKPOINT_ITERATION] == 1
    assert [e.name for e in finalize.events] == ["save_checkpoint_success", "checkpoint_metrics_update"]
    update = dict(finalize.events[1].attributes or {})
    C = semconv.CHECKPOINT_PREFIX
    blocking_s = (blocking.end_time - blocking.start_time) / 1e9  # type: ignore[operator]
    background_s = (finalize.end_time - finalize.start_time) / 1e9  # type: ignore[operator]
    assert update[C + "save_time.total"] == pytest.approx(blocking_s)  # only the blocking part
    assert update[C + "background_time.total"] == pytest.approx(background_s)
    assert update[C + "bytes.total"] == 1000
    summary = loop.attributes
    assert summary[semconv.SUMMARY_PREFIX + "checkpoint.save_time.total"] == pytest.approx(blocking_s)


@pytest.mark.parametrize("at_finish", [1000, None])
def test_an_async_save_s_size_counts_once(owned: Any, at_finish: int | None) -> None:
    """A size given to the save and again to its writer's ``finish`` is one checkpoint's: the
    totals, the size histogram and the spans (what the report adds up) have it once; the write
    rate is still the background write's."""
    job = owned(log_every_n_iterations=100)
    with traintel.training_loop():
        with traintel.training_iteration():
            pass
        save = traintel.checkpoint_save(strategy="async", size_bytes=1000)
        with save:
            completion = save.completion()
        completion.finish(size_bytes=at_finish)
    (blocking,) = job.named("checkpoint_save_async")
    (finalize,) = job.named("checkpoint_finalize")
    sizes = [s.attributes.get(semconv.CHECKPOINT_SIZE) for s in (blocking, finalize)]
    assert sizes == [1000, None]
    update = dict(finalize.events[-1].attributes or {})
    assert update[semconv.CHECKPOINT_PREFIX + "bytes.total"] == 1000
    background_s = (finalize.end_time - finalize.start_time) / 1e9  # type: ignore[operator]
    assert update[semconv.CHECKPOINT_BYTES_PER_SECOND] == pytest.approx(1000 / background_s)
    assert [(p.count, p.sum) for p in job.metric_points(semconv.METRIC_CHECKPOINT_SIZE)] == [(1, 1000)]


def test_an_async_save_given_a_path_is_measured_when_its_writer_finishes(
    owned: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The file does not exist when the blocking part ends (the writer has not written it yet):
    it is measured at the completion, not at the blocking end, which warned "could not measure
    checkpoint size" for every async save given a path."""
    job = owned(log_every_n_iterations=100)
    path = tmp_path / "ckpt.pt"
    with caplog.at_level(logging.WARNING, logger="traintel"), traintel.training_loop():
        with traintel.training_iteration():
            pass
        save = traintel.checkpoint_save(strategy="async", path=path)
        with save:
            completion = save.completion()
        path.write_bytes(b"x" * 1234)  # the background write
        completion.finish(path=path)
    assert "could not measure" not in caplog.text
    (blocking,) = job.named("checkpoint_save_async")
    (finalize,) = job.named("checkpoint_finalize")
    assert semconv.CHECKPOINT_SIZE not in blocking.attributes
    assert finalize.attributes[semconv.CHECKPOINT_SIZE] == 1234


def test_an_evaluation_inside_a_training_step_gives_the_step_back(owned: Any) -> None:
    """Validation run within a training step (the loop's body under one iteration): after its
    iterations the training step is the running one again, so its later work counts and its
    nested phases are taken from its productive time, once (the categories sum to the job)."""
    job = owned(warmup_iterations=0)
    callbacks.on_app_start(start_time_msec=ms(0))
    callbacks.on_train_start(train_iterations_start=0, start_time_msec=ms(0))
    callbacks.on_training_single_iteration_start(start_time_msec=ms(0))
    callbacks.on_data_loading_start(start_time_msec=ms(0))
    callbacks.on_data_loading_end(finish_time_msec=ms(0.5))
    callbacks.on_validation_start(start_time_msec=ms(1))
    callbacks.on_validation_single_iteration_start(start_time_msec=ms(1))
    callbacks.on_validation_single_iteration_end(finish_time_msec=ms(2))
    callbacks.on_validation_end(finish_time_msec=ms(2))
    traintel.record_batch(samples=3)
    callbacks.on_save_checkpoint_start(global_step=1, start_time_msec=ms(2))
    callbacks.on_save_checkpoint_end(finish_time_msec=ms(3))
    callbacks.on_training_single_iteration_end(finish_time_msec=ms(4))
    callbacks.on_train_end(finish_time_msec=ms(4))
    callbacks.on_app_end(finish_time_msec=ms(4))
    (window,) = job.named("training_window")
    attributes = window.attributes or {}
    (metrics,) = job.events("training_metrics_update")
    assert metrics[W + "samples"] == 3  # recorded after the validation iteration ended
    assert attributes[W + "nested_badput_time"] == 2.0  # the validation loop and the save
    assert attributes[W + "productive_time"] == 1.5  # 4 s less 0.5 s data loading, 2 s nested
    seconds = {
        p.attributes[semconv.GOODPUT_CATEGORY]: p.value
        for p in job.metric_points(semconv.METRIC_GOODPUT_TIME)
    }
    assert seconds == {"productive": 1.5, "data_loading": 0.5, "evaluation": 1.0, "checkpoint_save": 1.0}


def test_a_checkpoint_inside_an_iteration_counts_when_no_iteration_is_exported(owned: Any) -> None:
    """``TRAINTEL_EXPORT_ITERATIONS=none`` exports no iteration, yet a save inside one is a save:
    timed, counted and booked as checkpoint badput, not productive time (the SDK dropped its span
    with the unsampled iteration)."""
    job = owned(warmup_iterations=0, export_iterations="none")
    callbacks.on_train_start(train_iterations_start=0, start_time_msec=ms(0))
    callbacks.on_training_single_iteration_start(start_time_msec=ms(0))
    callbacks.on_save_checkpoint_start(global_step=1, start_time_msec=ms(2), size_bytes=100)
    callbacks.on_save_checkpoint_end(finish_time_msec=ms(3))
    callbacks.on_training_single_iteration_end(finish_time_msec=ms(4))
    callbacks.on_train_end(finish_time_msec=ms(4))
    (window,) = job.named("training_window")
    attributes = window.attributes or {}
    assert (attributes[W + "productive_time"], attributes[W + "nested_badput_time"]) == (3.0, 1.0)
    (save,) = job.metric_points(semconv.METRIC_CHECKPOINT_SAVE_DURATION)
    assert (save.count, save.sum) == (1, 1.0)
    seconds = {
        p.attributes[semconv.GOODPUT_CATEGORY]: p.value
        for p in job.metric_points(semconv.METRIC_GOODPUT_TIME)
    }
    assert seconds == {"productive": 3.0, "checkpoint_save": 1.0}


def test_a_checkpoint_timed_with_timed_span_counts_as_one(owned: Any) -> None:
    """``timed_span("save_to_s3", phase="checkpoint_save_sync")``: its span was in traintel's
    scope, which the processor takes for one the engine counted, and the engine did not: no
    save in the checkpoint totals or histograms (a plain OpenTelemetry span counted). Inside an
    iteration no policy exports, its span went with the iteration too. Now it counts as the
    user's own span with that phase does."""
    job = owned(warmup_iterations=0, export_iterations="none")
    with traintel.training_loop():
        with traintel.training_iteration():
            with traintel.timed_span("save_to_s3", phase=semconv.Phase.CHECKPOINT_SAVE_SYNC):
                pass
        with traintel.timed_span("restore", phase="checkpoint_load"):
            pass
    (save,) = job.named("save_to_s3")
    assert save.instrumentation_scope is not None and save.instrumentation_scope.name == "traintel.timed_span"
    (duration,) = job.metric_points(semconv.METRIC_CHECKPOINT_SAVE_DURATION)
    assert (duration.count, duration.sum) == (1, ((save.end_time or 0) - (save.start_time or 0)) / 1e9)
    (load,) = job.metric_points(semconv.METRIC_CHECKPOINT_LOAD_DURATION)
    assert load.count == 1
    (loop,) = job.named("training_loop")
    assert (loop.attributes or {})[semconv.SUMMARY_PREFIX + "checkpoint.saves"] == 1


def test_a_loop_and_iterations_timed_with_timed_span_are_counted(owned: Any) -> None:
    """A loop and iterations given as ``timed_span``s count as the user's own OpenTelemetry
    spans with those phases do; in traintel's scope they counted as nothing (no iteration in
    any window, each exported one numbered -1)."""
    job = owned(log_every_n_iterations=100)
    with traintel.timed_span("epoch", phase="training_loop"):
        for _ in range(4):
            with traintel.timed_span("step", phase="training_iteration", attributes={semconv.SAMPLES: 2}):
                pass
    (record,) = job.named("training_window")
    assert (record.attributes or {})[W + "iterations"] == 4
    assert [point.value for point in job.metric_points(semconv.METRIC_SAMPLES)] == [8]
    assert sorted(s.attributes[semconv.ITERATION] for s in job.named("step")) == [0, 1, 2, 3]


def test_async_checkpoint_inside_an_iteration_exports_and_links_it(owned: Any) -> None:
    job = owned(export_first_iterations=0, export_every_n_iterations=0)
    with traintel.training_loop():
        for i in range(4):
            with traintel.training_iteration():
                if i == 2:
                    save = traintel.checkpoint_save(strategy="async")
                    with save:
                        completion = save.completion()
                    completion.finish(size_bytes=5)
    (iteration,) = job.named("training_iteration")
    assert iteration.attributes[semconv.ITERATION] == 2
    assert iteration.attributes[semconv.SAMPLING_REASON] == "checkpoint"
    (finalize,) = job.named("checkpoint_finalize")
    assert finalize.links[1].context.span_id == iteration.context.span_id
    (blocking,) = job.named("checkpoint_save_async")
    assert blocking.parent is not None and blocking.parent.span_id == iteration.context.span_id


def test_validation_metrics_update(owned: Any) -> None:
    job = owned(export_iterations="none")
    callbacks.on_train_start(start_time_msec=ms(0))
    callbacks.on_validation_start(start_time_msec=ms(10))
    for i, loss in enumerate((0.5, 0.7, 0.9)):
        callbacks.on_validation_single_iteration_start(start_time_msec=ms(10 + i))
        traintel.record_metrics(val_loss=loss)
        callbacks.on_validation_single_iteration_end(finish_time_msec=ms(11 + i))
    callbacks.on_validation_end(finish_time_msec=ms(13.5))
    callbacks.on_train_end(finish_time_msec=ms(14))
    (update,) = job.events("validation_metrics_update")
    E = semconv.EVAL_PREFIX
    assert update[E + "iterations"] == 3
    assert update[E + "duration"] == 3.5
    assert update[E + "iteration_time.mean"] == 1.0
    assert update[E + "metric.val_loss.mean"] == pytest.approx(0.7)
    assert update[E + "metric.val_loss.last"] == 0.9
    assert job.named("validation_loop")[0].attributes[E + "iterations"] == 3


def test_metrics_recorded_on_a_validation_loop_inside_a_training_step_go_on_that_loop(
    owned: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Validation every N steps, run inside the step's ``with``: a value recorded on the loop
    after its iterations (``val_loss``) went on the training iteration around it, into the
    training window's model metrics, and the loop's update never had it. It now goes on the
    loop, as outside a step; the step's own values before and after the loop stay the step's.
    The validation's work given to ``record_batch`` there is no training work: it was added to
    the step's samples (the training throughput), and is now left out, said once."""
    caplog.set_level(logging.WARNING)
    job = owned(export_iterations="none", log_every_n_iterations=2, window_min_seconds=0)
    with traintel.training_loop(train_iterations_start=0):
        for step in range(2):
            with traintel.training_iteration():
                traintel.record_metrics(loss=1.0 + step)
                traintel.record_batch(samples=4)
                if step == 1:
                    with traintel.validation_loop():
                        with traintel.validation_iteration():
                            traintel.record_metrics(val_acc=0.25)
                        traintel.record_metrics(val_loss=0.5)
                        traintel.record_batch(samples=100)
                    traintel.record_metrics(lr=0.1)
    (window,) = job.events("training_metrics_update")
    W, E = semconv.WINDOW_PREFIX, semconv.EVAL_PREFIX
    assert window[W + "samples"] == 8
    said = [r.getMessage() for r in caplog.records]
    assert (
        said.count(
            "traintel: record_batch called in a loop run inside a training iteration; ignored (reported once)"
        )
        == 1
    )
    assert {key for key in window if key.startswith(W + "metric.")} == {
        W + "metric.loss.last",
        W + "metric.loss.mean",
        W + "metric.lr.last",
        W + "metric.lr.mean",
    }
    (update,) = job.events("validation_metrics_update")
    assert (update[E + "metric.val_loss.last"], update[E + "metric.val_acc.last"]) == (0.5, 0.25)


def test_metrics_recorded_on_an_eval_loop_count_toward_its_update(owned: Any) -> None:
    """A value recorded inside the loop but after its iterations (an epoch-level accuracy, a
    framework's eval_loss) is one more value of the update's last and mean; the next loop
    starts afresh."""
    job = owned(export_iterations="none")
    callbacks.on_testing_start(start_time_msec=ms(0))
    for i, loss in enumerate((0.5, 1.5)):
        callbacks.on_testing_single_iteration_start(start_time_msec=ms(i))
        traintel.record_metrics(loss=loss)
        callbacks.on_testing_single_iteration_end(finish_time_msec=ms(i + 1))
    traintel.record_metrics(loss=4.0, accuracy=0.75)
    callbacks.on_testing_end(finish_time_msec=ms(3))
    callbacks.on_testing_start(start_time_msec=ms(4))
    callbacks.on_testing_end(finish_time_msec=ms(5))
    first, second = job.events("testing_metrics_update")
    E = semconv.EVAL_PREFIX
    assert first[E + "iterations"] == 2
    assert first[E + "metric.loss.last"] == 4.0
    assert first[E + "metric.loss.mean"] == 2.0
    assert first[E + "metric.accuracy.last"] == 0.75
    assert first[E + "metric.accuracy.mean"] == 0.75
    assert not [key for key in second if key.startswith(E + "metric.")]


def test_nonfinite_metric_event_and_export(owned: Any) -> None:
    job = owned(export_first_iterations=0, export_every_n_iterations=0)
    callbacks.on_train_start(start_time_msec=ms(0))
    for i in range(6):
        callbacks.on_training_single_iteration_start(start_time_msec=ms(i))
        traintel.record_metrics(loss=math.nan if i == 4 else 1.0)
        callbacks.on_training_single_iteration_end(finish_time_msec=ms(i + 1))
    callbacks.on_train_end(finish_time_msec=ms(6))
    (exported,) = job.named("training_iteration")
    assert exported.attributes[semconv.ITERATION] == 4
    assert exported.attributes[semconv.SAMPLING_REASON] == "nonfinite"
    assert math.isnan(exported.attributes[semconv.METRIC_PREFIX + "loss"])  # type: ignore[arg-type]
    (event,) = job.events("nonfinite_metric")
    assert event[semconv.ITERATION] == 4
    assert event[semconv.METRIC_NAME] == "loss"
    assert event[semconv.METRIC_VALUE] == "nan"
    assert event[semconv.EXPORTED_SPAN_ID] == format(exported.context.span_id, "016x")
    (window,) = job.events("training_metrics_update")
    assert window[W + "nonfinite_iterations"] == 1
    assert window[W + "metric.loss.mean"] == 1.0  # NaN kept out of the mean, counted


def test_iteration_duration_histogram_and_gauges(owned: Any) -> None:
    job = owned(log_every_n_iterations=3, global_batch_size=4, flops_per_sample=100, peak_flops=2000)
    run_loop([1, 2, 1], phases=True)
    (histogram,) = job.metric_points(semconv.METRIC_ITERATION_DURATION)
    assert (histogram.count, histogram.sum, histogram.min, histogram.max) == (3, 4.0, 1.0, 2.0)
    (waits,) = job.metric_points(semconv.METRIC_DATA_LOADING_DURATION)
    assert (waits.count, waits.sum) == (3, 4 / 16)
    (samples,) = job.metric_points(semconv.METRIC_SAMPLES)
    assert samples.value == 12
    throughput = {
        p.attributes[semconv.THROUGHPUT_SCOPE]: p.value
        for p in job.metric_points(semconv.METRIC_SAMPLE_THROUGHPUT)
    }
    assert throughput == {"job": 3.0, "device": 3.0}
    (mfu,) = job.metric_points(semconv.METRIC_MFU)
    assert mfu.value == 300 / 2000
    phase_time = {
        p.attributes[semconv.PHASE]: p.value for p in job.metric_points(semconv.METRIC_STEP_PHASE_TIME)
    }
    assert phase_time["forward"] == 4 / 4 / 3


@pytest.mark.parametrize(
    ("policy", "exported", "not_exported"),
    [("all", [0, 1, 2, 3, 4, 5, 6], [0] * 7), ("sampled", [0, 1, 2, 3], [0, 0, 3, 3])],
)
def test_the_iterations_exported_and_not_only_grow(
    owned: Any, monkeypatch: pytest.MonkeyPatch, policy: str, exported: list[int], not_exported: list[int]
) -> None:
    """The reader collects as each exported iteration is written: the iteration has ended (its
    row is in) and its export is not counted yet. The iterations not exported were the ones seen
    less the ones exported: 1 there, 0 once the export counted, a counter going back (Prometheus
    takes it for a reset and adds the whole count again)."""
    job = owned(export_iterations=policy, export_first_iterations=2, export_every_n_iterations=5)
    engine = active.engine
    assert engine is not None
    seen: list[dict[bool, float]] = []

    def collect() -> None:
        points = job.metric_points(semconv.METRIC_ITERATIONS_EXPORTED)
        seen.append({p.attributes["traintel.exported"]: p.value for p in points})

    materialize = engine._materialize

    def collected_as_written(*args: Any) -> Any:
        collect()
        return materialize(*args)

    monkeypatch.setattr(engine, "_materialize", collected_as_written)
    run_loop([1.0] * 6, phases=False)  # sampled: 0 and 1 (the first), 5 (every fifth)
    collect()
    assert [c[True] for c in seen] == exported
    assert [c[False] for c in seen] == not_exported  # before: 1 more at each write ("all": 1, 0)


def test_plain_otel_iterations_are_aggregated(pipeline: Any) -> None:
    traintel.configure(
        tracer_provider=pipeline.tracer_provider, meter_provider=pipeline.meter_provider,
        log_every_n_iterations=2, warmup_iterations=0,
    )  # fmt: skip
    tracer = pipeline.tracer_provider.get_tracer("user-trainer")
    from opentelemetry import trace

    loop = tracer.start_span("training_loop", attributes={semconv.PHASE: "training_loop"}, start_time=0)
    context = trace.set_span_in_context(loop)
    for i, (start, end) in enumerate(((0, 2), (2, 3))):
        it = tracer.start_span(
            "training_iteration", context=context, start_time=start * 10**9,
            attributes={semconv.PHASE: "training_iteration", semconv.ITERATION: i, semconv.SAMPLES: 6},
        )  # fmt: skip
        forward = tracer.start_span(
            "model_forward", context=trace.set_span_in_context(it), start_time=start * 10**9,
            attributes={semconv.PHASE: "model_forward"},
        )  # fmt: skip
        forward.end(end_time=start * 10**9 + 500_000_000)
        it.set_attribute(semconv.METRIC_PREFIX + "loss", 2.0 - i)
        it.end(end_time=end * 10**9)
    loop.end(end_time=3 * 10**9)
    (update,) = [e for e in pipeline.one("training_loop").events if e.name == "training_metrics_update"]
    assert update.attributes[W + "iterations"] == 2
    assert update.attributes[W + "iteration_time.mean"] == 1.5
    assert update.attributes[W + "samples_per_second"] == 12 / 3
    assert update.attributes[W + "time.forward"] == 1.0
    assert update.attributes[W + "metric.loss.mean"] == 1.5


def test_state_stays_bounded(owned: Any) -> None:
    owned(log_every_n_iterations=50)
    telemetry = traintel.get_telemetry()
    tracer = telemetry.tracer
    with traintel.training_loop():
        for _ in range(20_000):
            with traintel.training_iteration(), traintel.model_forward():
                with tracer.start_as_current_span("user_work"):
                    pass
    engine = telemetry.engine
    assert engine is not None and telemetry.processor is not None and telemetry.pipeline is not None
    assert telemetry.open_spans is not None and not telemetry.open_spans.spans()
    assert telemetry.pipeline.export_filter is not None
    assert not telemetry.pipeline.export_filter._pending
    assert telemetry.windows is not None
    assert len(engine.rows) < 50
    assert len(telemetry.windows.aggregator._total_sketch.bucket_counts()) < 1500
    assert len(engine.sampler.recent) <= 101


def test_a_window_whose_report_fails_is_still_emptied(
    owned: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the window statistics costs that window's report, not the run: the window is
    emptied anyway, so memory stays bounded and later windows are reported again."""
    from traintel._aggregation import aggregator

    real_percentile = aggregator.percentile
    failing = {"on": True}

    def percentile(values: list[float], q: float) -> float:
        if failing["on"]:
            raise ZeroDivisionError("injected")
        return real_percentile(values, q)

    monkeypatch.setattr(aggregator, "percentile", percentile)
    owned(log_every_n_iterations=10)
    telemetry = traintel.get_telemetry()
    engine, windows = telemetry.engine, telemetry.windows
    assert engine is not None and windows is not None
    aggregator = windows.aggregator
    with caplog.at_level(logging.WARNING, logger="traintel"), traintel.training_loop():
        for _ in range(95):  # nine windows fail
            with traintel.training_iteration():
                pass
        assert len(engine.rows) == 5  # emptied at each boundary, failed or not
        assert engine.window.iterations_seen == 95 and aggregator.windows_closed == 0
        assert len(engine.sampler.recent) == 90  # the failed windows' durations still set the slow threshold
        failing["on"] = False
        for _ in range(5):
            with traintel.training_iteration():
                pass
    assert aggregator.windows_closed == 1  # the tenth: nothing was left for the loop end
    assert engine.window.iterations_seen == 100 and aggregator.iterations_seen == 100
    assert aggregator.last_window is not None
    assert aggregator.last_window.first_iteration == 90
    assert any("could not report a window" in r.getMessage() for r in caplog.records)


def test_a_reader_that_collects_late_still_gets_every_value(
    owned: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window's values are in the histograms once it closes, however long the reader
    waits: nothing is buffered for it (a small buffer used to lose what it could not hold)."""
    from traintel._sdk import instruments

    monkeypatch.setattr(instruments, "DEFERRED_CAPACITY", 5, raising=False)  # the old buffer's limit
    job = owned(log_every_n_iterations=100)
    run_loop([1.0] * 8, phases=False)
    (histogram,) = job.metric_points(semconv.METRIC_ITERATION_DURATION)
    assert (histogram.count, histogram.sum) == (8, 8.0)
    run_loop([1.0] * 2, phases=False)
    (histogram,) = job.metric_points(semconv.METRIC_ITERATION_DURATION)
    assert histogram.count == 10
    assert not job.metric_points("traintel.measurements.dropped")  # nothing can be lost: no such counter


def test_a_view_that_changes_the_iteration_buckets_gets_every_iteration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The user's View re-buckets the iteration histogram: the window's values cannot be added
    to buckets traintel does not know, so each is recorded, and the export counts all 1,001
    (with the overflow buffer it showed 1 of 1,001: the rest were added to buckets the View
    had replaced, i.e. to nothing)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from traintel._sdk import instruments

    monkeypatch.setattr(instruments, "DEFERRED_CAPACITY", 1, raising=False)  # the old buffer, full at once
    reader = InMemoryMetricReader()
    view = View(
        instrument_name=semconv.METRIC_ITERATION_DURATION,
        aggregation=ExplicitBucketHistogramAggregation([0.5, 1.5]),
    )
    meters = MeterProvider(metric_readers=[reader], views=[view], shutdown_on_exit=False)
    traintel.configure(
        span_exporters=[InMemorySpanExporter()], meter_provider=meters, log_every_n_iterations=100
    )
    run_loop([1.0] * 1000 + [2.0], phases=False)
    data = reader.get_metrics_data()
    assert data is not None
    [point] = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == semconv.METRIC_ITERATION_DURATION
        for p in m.data.data_points
    ]
    assert (point.count, tuple(point.bucket_counts), point.sum) == (1001, (0, 1000, 1), 1002.0)


def test_work_set_as_attributes_on_the_iteration_counts(owned: Any) -> None:
    """span.set_attribute("ml.training.samples", n) on traintel's iteration counts the work, as
    the same attribute on a plain OpenTelemetry iteration span does."""
    job = owned(log_every_n_iterations=2, export_iterations="none")
    with traintel.training_loop():
        for _ in range(2):
            with traintel.training_iteration() as span:
                span.set_attribute(semconv.SAMPLES, 8)
                span.set_attributes({semconv.TOKENS: 64, semconv.FLOPS: 100.0})
    (window,) = job.events("training_metrics_update")
    assert window[W + "samples"] == 16.0
    assert window[W + "tokens"] == 128.0
