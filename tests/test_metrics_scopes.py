"""Numbers issue 3 asks for that ``test_metrics.py`` does not assert: job against per-device
scope with several ranks, variable batches and packed sequences, the window p99, the tokens,
FLOP/s, HFU and checkpoint instruments and totals, testing loops, MFU from the device table, an
MFU above 1 kept out of every total, slow-iteration counts and their event cap, and checkpoint
stages marked with the API.

Where the callbacks allow it, timestamps are explicit (milliseconds), so values are asserted
exactly; checkpoint stages have no explicit-time API and are compared with their own spans.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import traintel
from tests.test_metrics import ms, run_loop
from traintel import callbacks, semconv
from traintel._recorder import engine as _engine
from traintel._runtime import window_consumers

W = semconv.WINDOW_PREFIX
TOT = semconv.TOTAL_PREFIX
S = semconv.SUMMARY_PREFIX


@pytest.fixture
def job(owned: Any) -> Any:
    """A pipeline traintel builds itself around in-memory parts (conftest's ``owned``)."""
    return owned


def by_scope(points: list[Any]) -> dict[str, float]:
    return {p.attributes[semconv.THROUGHPUT_SCOPE]: p.value for p in points}


def test_job_throughput_is_per_device_times_world_size(job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 of 4 (from the launcher's environment): the configured global batch is split
    across ranks, per-device rates are this rank's, job rates are x 4 and say so."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    run = job(
        log_every_n_iterations=2, warmup_iterations=0, global_batch_size=32, seq_len=8,
        flops_per_sample=24, executed_flops_per_sample=48, peak_flops=1000, cross_rank="off",
    )  # fmt: skip
    run_loop([1.0, 3.0], phases=False)
    (window,) = run.events("training_metrics_update")
    assert window[W + "samples"] == 16.0  # 2 steps x 32 / 4 ranks
    assert window[W + "tokens"] == 128.0
    assert window[W + "samples_per_second_per_device"] == 16 / 4
    assert window[W + "samples_per_second"] == 16 / 4 * 4
    assert window[W + "tokens_per_second_per_device"] == 128 / 4
    assert window[W + "tokens_per_second"] == 128 / 4 * 4
    assert window[W + "flops_per_second_per_device"] == 24 * 16 / 4  # FLOP/s stay per device
    assert window[W + "mfu"] == 96 / 1000
    assert window[W + "hfu"] == 96 / 1000 * (48 / 24)  # MFU x executed / model FLOPs per sample
    assert window[semconv.THROUGHPUT_AGGREGATION] == "rank x world_size (4)"
    assert by_scope(run.metric_points(semconv.METRIC_SAMPLE_THROUGHPUT)) == {"job": 16.0, "device": 4.0}
    assert by_scope(run.metric_points(semconv.METRIC_TOKEN_THROUGHPUT)) == {"job": 128.0, "device": 32.0}
    (flops,) = run.metric_points(semconv.METRIC_FLOPS_THROUGHPUT)
    assert flops.value == 96.0
    (hfu,) = run.metric_points(semconv.METRIC_HFU)
    assert hfu.value == 96 / 1000 * 2
    (samples,) = run.metric_points(semconv.METRIC_SAMPLES)
    (tokens,) = run.metric_points(semconv.METRIC_TOKENS)
    assert (samples.value, tokens.value) == (16, 128)  # this rank's work, not the job's


def test_variable_batches_and_packed_sequences(job: Any) -> None:
    """Each step reports its own work (no fixed batch size, tokens not samples x seq_len);
    rates are work over the time of the steps that did it."""
    run = job(log_every_n_iterations=3, warmup_iterations=0, export_iterations="none")
    callbacks.on_train_start(start_time_msec=ms(0))
    # step 0: 3 samples packed into 100 tokens, given on the iteration
    callbacks.on_training_single_iteration_start(start_time_msec=ms(0))
    traintel.record_batch(samples=3, tokens=100)
    callbacks.on_training_single_iteration_end(finish_time_msec=ms(1))
    # step 1: two micro-batches of different sizes, with padding
    callbacks.on_training_single_iteration_start(start_time_msec=ms(1))
    traintel.record_batch(samples=5, tokens=70, padding_tokens=10)
    traintel.record_batch(samples=2, tokens=30, padding_tokens=30)
    callbacks.on_training_single_iteration_end(finish_time_msec=ms(3))
    # step 2: a last, short batch
    callbacks.on_training_single_iteration_start(start_time_msec=ms(3))
    traintel.record_batch(samples=1, tokens=16)
    callbacks.on_training_single_iteration_end(finish_time_msec=ms(4))
    callbacks.on_train_end(finish_time_msec=ms(4))
    (window,) = run.events("training_metrics_update")
    assert window[W + "samples"] == 11.0
    assert window[W + "tokens"] == 216.0
    assert window[W + "padding_tokens"] == 40.0
    assert window[W + "padding_fraction"] == 40 / 256
    assert window[W + "samples_per_second"] == 11 / 4
    assert window[W + "tokens_per_second"] == 216 / 4


def test_window_p99_and_total_stddev(job: Any) -> None:
    run = job(log_every_n_iterations=4, warmup_iterations=0, export_iterations="none")
    run_loop([1.0, 2.0, 4.0, 8.0], phases=False)
    (window,) = run.events("training_metrics_update")
    # linear interpolation between the 3rd and 4th of 4 sorted values: 4 + 0.97 x (8 - 4)
    assert window[W + "iteration_time.p99"] == pytest.approx(7.88, rel=1e-12)
    assert window[W + "iteration_time.p90"] == pytest.approx(6.8, rel=1e-12)
    assert window[W + "iteration_time.stddev"] == pytest.approx(2.680951323690902, rel=1e-12)
    assert window[TOT + "iteration_time.stddev"] == window[W + "iteration_time.stddev"]
    assert window[TOT + "iteration_time.p99"] == pytest.approx(7.88, rel=1e-12)  # exact while short


def test_checkpoint_load_and_size_instruments_and_totals(job: Any) -> None:
    run = job(export_iterations="none")
    callbacks.on_app_start(start_time_msec=ms(0))
    callbacks.on_load_checkpoint_start(start_time_msec=ms(0))
    callbacks.on_load_checkpoint_end(finish_time_msec=ms(2))
    callbacks.on_train_start(start_time_msec=ms(2))
    callbacks.on_load_checkpoint_start(start_time_msec=ms(2))  # e.g. reloading the best weights
    callbacks.on_load_checkpoint_end(finish_time_msec=ms(2.5))
    callbacks.on_save_checkpoint_start(global_step=1, start_time_msec=ms(3), size_bytes=100)
    callbacks.on_save_checkpoint_end(finish_time_msec=ms(4))
    callbacks.on_save_checkpoint_start(global_step=2, start_time_msec=ms(4), size_bytes=300)
    callbacks.on_save_checkpoint_end(finish_time_msec=ms(6))
    callbacks.on_train_end(finish_time_msec=ms(7))
    callbacks.on_app_end(finish_time_msec=ms(7))
    (loads,) = run.metric_points(semconv.METRIC_CHECKPOINT_LOAD_DURATION)
    assert (loads.count, loads.sum, loads.min, loads.max) == (2, 2.5, 0.5, 2.0)
    (sizes,) = run.metric_points(semconv.METRIC_CHECKPOINT_SIZE)
    assert (sizes.count, sizes.sum, sizes.min, sizes.max) == (2, 400, 100, 300)
    assert sizes.attributes == {semconv.CHECKPOINT_STRATEGY: "sync"}
    summary = run.named("training_loop")[0].attributes
    assert summary[S + "checkpoint.saves"] == 2
    assert summary[S + "checkpoint.save_time.mean"] == 1.5
    assert summary[S + "checkpoint.bytes.total"] == 400
    assert summary[S + "checkpoint.loads"] == 2
    assert summary[S + "checkpoint.load_time.total"] == 2.5
    first, second = run.named("checkpoint_save_sync")
    assert first.attributes[semconv.CHECKPOINT_BYTES_PER_SECOND] == 100.0
    assert second.attributes[semconv.CHECKPOINT_BYTES_PER_SECOND] == 150.0


def test_testing_and_validation_loop_numbers(job: Any) -> None:
    run = job(export_iterations="none")
    E = semconv.EVAL_PREFIX
    for start_loop, end_loop, start_it, end_it, name in (
        (
            callbacks.on_validation_start, callbacks.on_validation_end,
            callbacks.on_validation_single_iteration_start, callbacks.on_validation_single_iteration_end,
            "validation",
        ),
        (
            callbacks.on_testing_start, callbacks.on_testing_end,
            callbacks.on_testing_single_iteration_start, callbacks.on_testing_single_iteration_end,
            "testing",
        ),
    ):  # fmt: skip
        start_loop(start_time_msec=ms(0))
        for begin, end, samples, accuracy in ((0, 1, 4, 0.5), (1, 4, 2, 1.0)):
            start_it(start_time_msec=ms(begin))
            traintel.record_batch(samples=samples)
            traintel.record_metrics(accuracy=accuracy)
            end_it(finish_time_msec=ms(end))
        end_loop(finish_time_msec=ms(5))
        (update,) = run.events(name + "_metrics_update")
        assert update[E + "iterations"] == 2
        assert update[E + "duration"] == 5.0
        assert update[E + "iteration_time.mean"] == 2.0
        assert update[E + "iteration_time.max"] == 3.0
        assert update[E + "samples"] == 6.0
        assert update[E + "samples_per_second"] == 6 / 4
        assert update[E + "metric.accuracy.mean"] == 0.75
        assert update[E + "metric.accuracy.last"] == 1.0
        (loop,) = run.named(name + "_loop")
        assert loop.attributes[E + "samples_per_second"] == 6 / 4  # on the span too, set before it ended


def test_mfu_above_one_stays_out_of_totals_summary_and_gauge(job: Any) -> None:
    run = job(
        log_every_n_iterations=2,
        warmup_iterations=0,
        global_batch_size=1,
        flops_per_sample=5e3,
        peak_flops=1e3,
    )
    run_loop([1, 1, 1, 1], phases=False)
    windows = run.events("training_metrics_update")
    assert len(windows) == 2
    assert all(W + "mfu" not in w and TOT + "mfu" not in w for w in windows)
    assert len(run.events("metric_out_of_range")) == 2  # one per window, as an event
    summary = run.named("training_loop")[0].attributes
    assert S + "mfu" not in summary
    assert summary[S + "tflops_per_device"] == 5e3 / 1e12
    assert run.metric_points(semconv.METRIC_MFU) == []


def test_mfu_from_the_device_table_for_the_configured_dtype(
    job: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No override: the dense peak of the device's name and the configured dtype."""
    monkeypatch.setattr(window_consumers, "current_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    run = job(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=989.5e12 / 8, dtype="bf16")
    run_loop([1, 1], phases=False)
    (window,) = run.events("training_metrics_update")
    assert window[W + "mfu"] == 0.25  # 2 x 989.5e12 / 8 FLOP/s over 989.5e12
    assert window[semconv.MFU_DENOMINATOR] == 989.5e12
    assert window[semconv.MFU_PEAK_SOURCE] == "table: NVIDIA H100 SXM bf16 dense"
    traintel.shutdown(2)
    run = job(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=67e12 / 8)
    run_loop([1, 1], phases=False)
    (window,) = run.events("training_metrics_update")
    assert window[W + "mfu"] == 0.25  # no dtype configured, no autocast: fp32's 67 TFLOP/s
    assert window[semconv.MFU_PEAK_SOURCE] == "table: NVIDIA H100 SXM fp32 dense"
    traintel.shutdown(2)
    monkeypatch.setattr(
        window_consumers, "current_device_name", lambda device=None: "Intel(R) Data Center GPU Max 1550"
    )
    run = job(log_every_n_iterations=1, global_batch_size=1, flops_per_sample=10)
    with caplog.at_level(logging.WARNING):
        run_loop([1, 1, 1], phases=False)
    windows = run.events("training_metrics_update")
    assert all(W + "mfu" not in w and w[W + "flops_per_second_per_device"] == 10 for w in windows)
    warning = (
        "no MFU: device 'Intel(R) Data Center GPU Max 1550' is not in the peak FLOP/s table: "
        "set TRAINTEL_PEAK_FLOPS"
    )
    assert caplog.text.count(warning) == 1


@contextmanager
def cuda_autocast_flag(dtype: Any) -> Iterator[None]:
    """What ``torch.autocast("cuda", dtype)`` sets for the calling thread; set directly, as a
    CPU build refuses the context manager itself."""
    import torch

    torch.set_autocast_enabled("cuda", True)
    previous = torch.get_autocast_dtype("cuda")
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_dtype("cuda", previous)
        torch.set_autocast_enabled("cuda", False)


@pytest.mark.parametrize("api", ["context managers", "callbacks"])
def test_the_peak_dtype_is_autocasts_when_it_wraps_only_the_forward_phase(
    job: Any, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """Autocast entered inside the iteration, around the forward phase (where most loops put
    it), is what picks the peak column, not fp32 from the iteration's start; once seen, phase
    starts stop looking (no device hook is left on the step)."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")  # a CUDA build of torch
    monkeypatch.setattr(window_consumers, "current_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    run = job(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=1e9)
    engine = traintel.get_telemetry().engine
    assert engine is not None and engine.device is not None  # looking, until the dtype is known
    with traintel.training_loop():
        for _ in range(4):
            with traintel.training_iteration():
                assert engine.device is not None or _ > 0
                with cuda_autocast_flag(torch.float16):
                    if api == "callbacks":
                        callbacks.on_model_forward_start()
                        callbacks.on_model_forward_end()
                    else:
                        with traintel.model_forward():
                            pass
                assert engine.device is None  # seen at the forward's start
    windows = run.events("training_metrics_update")
    assert [w[semconv.MFU_PEAK_SOURCE] for w in windows] == ["table: NVIDIA H100 SXM fp16 dense"] * 2
    assert windows[0][semconv.MFU_DENOMINATOR] == 989.5e12


def test_autocast_inside_a_phase_is_not_seen_and_the_mfu_warning_says_so(
    job: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Entered inside the forward phase, autocast is active while no traintel code runs: the
    peak stays fp32's, and an MFU above 1 says what to set."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(window_consumers, "current_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    run = job(log_every_n_iterations=2, global_batch_size=1, flops_per_sample=1e12)
    callbacks.on_train_start(start_time_msec=ms(0))
    with caplog.at_level(logging.WARNING):
        for i in range(2):  # 1e12 FLOPs in 10 ms: 100 TFLOP/s, above fp32's 67
            callbacks.on_training_single_iteration_start(start_time_msec=ms(i * 0.01))
            with traintel.model_forward(), cuda_autocast_flag(torch.bfloat16):
                pass
            callbacks.on_training_single_iteration_end(finish_time_msec=ms((i + 1) * 0.01))
        callbacks.on_train_end(finish_time_msec=ms(0.02))
    (window,) = run.events("training_metrics_update")
    assert window[semconv.MFU_PEAK_SOURCE] == "table: NVIDIA H100 SXM fp32 dense"
    assert "mfu" not in {k.removeprefix(W) for k in window}
    assert "set TRAINTEL_DTYPE, e.g. bf16" in caplog.text


def test_no_autocast_in_the_first_window_means_fp32_and_the_look_stops(
    job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(window_consumers, "current_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    run = job(log_every_n_iterations=2, global_batch_size=2, flops_per_sample=1e9)
    engine = traintel.get_telemetry().engine
    assert engine is not None
    with traintel.training_loop():
        for i in range(4):
            with traintel.training_iteration(), traintel.model_forward():
                if i == 3:  # too late: the peak was looked up when the first window closed
                    assert engine.device is None
    windows = run.events("training_metrics_update")
    assert [w[semconv.MFU_PEAK_SOURCE] for w in windows] == ["table: NVIDIA H100 SXM fp32 dense"] * 2


def test_the_device_name_waits_for_the_job_to_initialise_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking torch for the device name initialises CUDA: never before the job has done so."""
    import torch

    from traintel._host.flops import current_device_name

    class Cuda:
        initialised = False

        def is_initialized(self) -> bool:
            return self.initialised

        def current_device(self) -> int:
            assert self.initialised, "current_device() would initialise CUDA"
            return 0

        def get_device_name(self, index: int) -> str:
            assert self.initialised, "get_device_name() would initialise CUDA"
            return "NVIDIA H200"

    cuda = Cuda()
    monkeypatch.setattr(torch, "cuda", cuda)
    assert current_device_name() is None
    cuda.initialised = True
    assert current_device_name() == "NVIDIA H200"


def test_a_step_phase_split_with_an_optimizer(job: Any) -> None:
    """The optimizer share of the step split, which the other exact tests leave at zero."""
    run = job(log_every_n_iterations=2, export_iterations="none")
    callbacks.on_train_start(start_time_msec=ms(0))
    for start in (0, 2):
        callbacks.on_training_single_iteration_start(start_time_msec=ms(start))
        callbacks.on_optimizer_update_start(start_time_msec=ms(start + 1.5))
        callbacks.on_optimizer_update_end(finish_time_msec=ms(start + 2))
        callbacks.on_training_single_iteration_end(finish_time_msec=ms(start + 2))
    callbacks.on_train_end(finish_time_msec=ms(4))
    (window,) = run.events("training_metrics_update")
    assert window[W + "time.optimizer"] == 1.0
    assert window[W + "data_loading_fraction"] == 0.0
    phase_time = {
        p.attributes[semconv.PHASE]: p.value for p in run.metric_points(semconv.METRIC_STEP_PHASE_TIME)
    }
    assert phase_time["optimizer"] == 0.5  # mean per step


def test_samples_set_as_an_attribute_on_the_iteration_are_counted(job: Any) -> None:
    run = job(log_every_n_iterations=2, export_iterations="all")
    with traintel.training_loop():
        for _ in range(2):
            with traintel.training_iteration() as span:
                span.set_attribute(semconv.SAMPLES, 8)
    assert [s.attributes[semconv.SAMPLES] for s in run.named("training_iteration")] == [8, 8]
    (window,) = run.events("training_metrics_update")
    assert window[W + "samples"] == 16.0


def test_slow_iterations_are_counted_exported_and_their_events_capped(job: Any) -> None:
    """Alternating 1 s and 5 s steps: every 5 s step is slow (> 3 x the median of 1 s), exported
    and counted; the loop segment carries at most 20 slow_iteration events, the windows count all."""
    run = job(
        log_every_n_iterations=10, warmup_iterations=0, export_first_iterations=0,
        export_every_n_iterations=0, slow_iteration_factor=3,
    )  # fmt: skip
    run_loop([1.0] * 10 + [1.0, 5.0] * 25, phases=False)
    windows = run.events("training_metrics_update")
    assert [w[W + "slow_iterations"] for w in windows] == [0, 5, 5, 5, 5, 5]
    assert [w[W + "exported_iterations"] for w in windows] == [0, 5, 5, 5, 5, 5]
    assert len(run.events("slow_iteration")) == _engine.MAX_EVENTS_PER_SEGMENT == 20
    exported = sorted(s.attributes[semconv.ITERATION] for s in run.named("training_iteration"))
    assert exported == list(range(11, 60, 2))
    counts = {
        p.attributes["traintel.exported"]: p.value
        for p in run.metric_points(semconv.METRIC_ITERATIONS_EXPORTED)
    }
    assert counts == {True: 25, False: 35}


def test_checkpoint_stages_marked_with_the_api_have_their_totals(job: Any) -> None:
    run = job(export_iterations="none")
    with traintel.training_loop():
        for _ in range(2):
            with traintel.checkpoint_save(size_bytes=10):
                with traintel.checkpoint_stage("staging"):
                    pass
                with traintel.checkpoint_stage("upload"):
                    pass
    stages = {name: run.named("checkpoint_" + name) for name in ("staging", "upload")}
    assert {name: len(spans) for name, spans in stages.items()} == {"staging": 2, "upload": 2}
    saves = run.named("checkpoint_save_sync")
    for spans in stages.values():
        assert [s.parent.span_id for s in spans] == [s.context.span_id for s in saves]  # type: ignore[union-attr]
    update = dict(saves[-1].events[-1].attributes or {})
    C = semconv.CHECKPOINT_PREFIX
    for name, spans in stages.items():
        seconds = sum((s.end_time or 0) - (s.start_time or 0) for s in spans) / 1e9
        assert update[C + "stage." + name + ".time_total"] == pytest.approx(seconds, rel=1e-12)
