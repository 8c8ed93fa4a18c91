"""GPU energy from NVML's energy counter, on CPU: a stand-in ``pynvml`` module (hardware, not
OpenTelemetry) whose counter follows an injected clock, so every figure is exact: window
energies and the tail add up to the job's counter delta, category energies to the job's energy,
price to cost, and the counter is read only at boundaries."""

from __future__ import annotations

import math
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import traintel
from tests.test_metrics import ms, step
from traintel import callbacks, semconv
from traintel._host import energy
from traintel._host.energy import EnergyLedger, split_energy
from traintel.analysis.goodput import compute_goodput, load_jobs, render_goodput
from traintel.analysis.report import build_report
from traintel.analysis.summary import render, summarize
from traintel.exporters.file import OtlpJsonFileSpanExporter, OtlpJsonLinesFile

T0_NS = int(ms(0) * 1e6)
W = semconv.WINDOW_PREFIX
S = semconv.SUMMARY_PREFIX


class Clock:
    def __init__(self) -> None:
        self.t = 0.0  # seconds after ms(0)

    def ns(self) -> int:
        return T0_NS + round(self.t * 1e9)


class CounterNvml:
    """One GPU whose energy counter grows at ``watts`` on ``clock`` (millijoules, as NVML)."""

    def __init__(self, clock: Clock, watts: int = 250, base_mj: int = 7_000_000) -> None:
        self.clock, self.watts, self.base_mj = clock, watts, base_mj
        self.reads: list[float] = []
        self.threads: list[str] = []

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return "GPU-energy-0"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self.reads.append(self.clock.t)
        self.threads.append(threading.current_thread().name)
        return self.base_mj + round(self.watts * 1000 * self.clock.t)


def test_split_is_by_booked_seconds_and_sums_to_the_interval() -> None:
    assert split_energy(100.0, 10.0, {"productive": 6.0, "checkpoint_save": 2.0}) == {
        "productive": 60.0, "checkpoint_save": 20.0, "other": 20.0,
    }  # fmt: skip
    # booked late (a phase begun in an earlier interval): over the booked seconds, no "other"
    parts = split_energy(100.0, 10.0, {"productive": 8.0, "data_loading": 4.0, "evaluation": 0.0})
    assert set(parts) == {"productive", "data_loading"}
    assert parts["productive"] == 100.0 * 8 / 12
    assert math.fsum(parts.values()) == 100.0
    assert split_energy(0.0, 0.0, {}) == {}


def test_ledger_intervals_telescope_to_the_job_delta_to_the_digit() -> None:
    ledger = EnergyLedger(price_per_kwh=0.25)
    reads = [  # (s, counter mJ, booked productive / data_loading / checkpoint_save, tokens)
        (0.0, 5_000_000, (0.0, 0.0, 0.0), 0),
        (2.0, 5_600_000, (1.5, 0.5, 0.0), 64),
        (6.0, 6_400_000, (3.5, 1.0, 0.5), 128),
        (7.0, 6_500_000, (3.5, 1.0, 0.5), 128),
    ]
    intervals = []
    for t, mj, (productive, loading, save), tokens in reads:
        booked = {"productive": productive, "data_loading": loading, "checkpoint_save": save}
        interval = ledger.read(T0_NS + int(t * 1e9), mj, booked, tokens, tokens / 4)
        if interval is not None:
            intervals.append(interval)
    assert [i.joules for i in intervals] == [600.0, 800.0, 100.0]
    assert sum(i.millijoules for i in intervals) == 6_500_000 - 5_000_000
    assert ledger.joules == 1500.0
    assert intervals[0].by_category == {"productive": 450.0, "data_loading": 150.0}
    # 4 s: 2 productive, 0.5 data loading, 0.5 checkpoint, 1 booked by nobody
    assert intervals[1].by_category == {
        "productive": 400.0, "data_loading": 100.0, "checkpoint_save": 100.0, "other": 200.0,
    }  # fmt: skip
    assert intervals[2].by_category == {"other": 100.0}
    assert math.fsum(ledger.by_category.values()) == ledger.joules
    summary = ledger.attributes(S)
    assert summary[S + "energy"] == 1500.0
    assert summary[S + "energy.time"] == 7.0
    assert summary[S + "energy.other"] == 300.0
    assert summary[S + "energy.per_token"] == 1500.0 / 128
    assert summary[S + "energy.per_sample"] == 1500.0 / 32
    assert summary[S + "energy.cost"] == 1500.0 / 3.6e6 * 0.25


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> tuple[Clock, CounterNvml]:
    clock = Clock()
    nvml = CounterNvml(clock)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(energy, "clock_ns", clock.ns)
    return clock, nvml


def scripted_job(clock: Clock) -> None:
    """250 W for 5 s: iterations 0-1 (window 0), a 0.5 s checkpoint save, iterations 2-3
    (window 1), the loop ends at 4.5 s, the application at 5 s."""
    callbacks.on_app_start(start_time_msec=ms(0))
    callbacks.on_train_start(train_iterations_start=0, start_time_msec=ms(0))
    for start in (0.0, 1.0):
        clock.t = start + 1
        step(start, 1.0, phases=False)
    callbacks.on_save_checkpoint_start(global_step=2, start_time_msec=ms(2.0))
    clock.t = 2.5
    callbacks.on_save_checkpoint_end(finish_time_msec=ms(2.5))
    for start in (2.5, 3.5):
        clock.t = start + 1
        step(start, 1.0, phases=False)
    callbacks.on_train_end(finish_time_msec=ms(4.5))
    clock.t = 5.0
    callbacks.on_app_end(finish_time_msec=ms(5.0))


def test_a_job_energy_by_window_category_and_tail(owned: Any, gpu: tuple[Clock, CounterNvml]) -> None:
    clock, nvml = gpu
    job = owned(log_every_n_iterations=2, global_batch_size=2, seq_len=8, energy_price_per_kwh=0.3)
    scripted_job(clock)
    assert nvml.reads == [0.0, 2.0, 4.5, 5.0]  # start, two window boundaries, the end: no sampling
    windows = [s.attributes or {} for s in job.named(semconv.TRAINING_WINDOW_SPAN)]
    assert [w[W + "energy"] for w in windows] == [500.0, 625.0]
    assert [w[W + "energy.productive"] for w in windows] == [500.0, 500.0]
    assert windows[1][W + "energy.checkpoint_save"] == 125.0
    (loop,) = job.named("training_loop")
    assert loop.attributes[S + "energy"] == 1125.0  # up to the last window
    (app,) = job.named("application")
    job_energy = app.attributes["ml.training.energy"]
    assert job_energy == (nvml.base_mj + 250_000 * 5 - nvml.base_mj) / 1000 == 1250.0
    assert sum(w[W + "energy"] for w in windows) + 125.0 == job_energy  # the tail after the loop
    categories = {
        c: app.attributes["ml.training.energy." + c] for c in ("productive", "checkpoint_save", "other")
    }
    assert categories == {"productive": 1000.0, "checkpoint_save": 125.0, "other": 125.0}
    assert sum(categories.values()) / job_energy == 1.0
    assert app.attributes["ml.training.energy.per_token"] == 1250.0 / 64
    assert app.attributes["ml.training.energy.cost"] == 1250.0 / 3.6e6 * 0.3
    points = {
        p.attributes[semconv.ENERGY_CATEGORY]: p.value for p in job.metric_points(semconv.METRIC_ENERGY)
    }
    assert points == categories
    (cost,) = job.metric_points(semconv.METRIC_ENERGY_COST)
    assert cost.value == 1250.0 / 3.6e6 * 0.3
    (per_token,) = job.metric_points(semconv.METRIC_ENERGY_PER_TOKEN)
    assert per_token.value == 625.0 / 32  # the last window's (the tail after the loop had no work)


def test_window_boundary_reads_run_on_the_window_worker_not_the_training_thread(
    owned: Any, gpu: tuple[Clock, CounterNvml], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One counter read took 3.2 ms on an H100: at a window boundary it must not be the training
    thread's. The suite processes windows synchronously; here they go to the worker, as in a job."""
    from traintel._runtime import window_pipeline

    monkeypatch.setattr(window_pipeline, "SYNCHRONOUS", False)
    clock, nvml = gpu
    owned(log_every_n_iterations=2, global_batch_size=2, seq_len=8)
    scripted_job(clock)
    traintel.shutdown(10)
    training = threading.current_thread().name
    # the job's first read (configure) and its last (the application's end) are the caller's,
    # once each; the two window boundaries are the worker's
    assert nvml.threads[0] == nvml.threads[-1] == training
    assert nvml.threads[1:-1] == ["traintel-windows"] * 2


def test_records_released_together_share_the_interval_by_their_time(
    owned: Any, gpu: tuple[Clock, CounterNvml]
) -> None:
    """A first window of one iteration waits for the second (its startup share needs a typical
    step): one read covers both, each record gets the part of its own time."""
    clock, nvml = gpu
    job = owned(log_every_n_iterations=1, global_batch_size=1)
    callbacks.on_train_start(train_iterations_start=0, start_time_msec=ms(0))
    for start in (0.0, 1.0, 2.0):
        clock.t = start + 1
        step(start, 1.0, phases=False)
    callbacks.on_train_end(finish_time_msec=ms(3.0))
    assert nvml.reads == [0.0, 2.0, 3.0]
    windows = [s.attributes or {} for s in job.named(semconv.TRAINING_WINDOW_SPAN)]
    assert [w[W + "energy"] for w in windows] == [250.0, 250.0, 250.0]


def test_several_gpus_and_none_known_as_ours_means_no_energy_until_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class TwoGpus(CounterNvml):
        def nvmlDeviceGetCount(self) -> int:
            return 2

        def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
            return index

        def nvmlDeviceGetUUID(self, handle: int) -> str:
            return f"GPU-energy-{handle}"

    monkeypatch.setitem(sys.modules, "torch", None)  # no CUDA initialised: torch not even imported
    nvml = TwoGpus(Clock())
    assert energy.open_counter(nvml, {}) == (None, True)  # ask again: the job may pin one later
    counter, again = energy.open_counter(nvml, {"CUDA_VISIBLE_DEVICES": "1"})
    assert counter is not None and not again
    assert counter() == nvml.base_mj


def test_no_nvml_means_no_energy_and_no_error(owned: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    job = owned(log_every_n_iterations=2, global_batch_size=1)
    callbacks.on_app_start(start_time_msec=ms(0))
    callbacks.on_train_start(train_iterations_start=0, start_time_msec=ms(0))
    for start in (0.0, 1.0):
        step(start, 1.0, phases=False)
    callbacks.on_train_end(finish_time_msec=ms(2.0))
    callbacks.on_app_end(finish_time_msec=ms(2.0))
    (app,) = job.named("application")
    assert not [k for k in (app.attributes or {}) if "energy" in k]
    assert not [
        k for s in job.named(semconv.TRAINING_WINDOW_SPAN) for k in (s.attributes or {}) if "energy" in k
    ]
    assert job.metric_points(semconv.METRIC_ENERGY) == []


def test_summary_report_and_goodput_read_the_energy_back(
    tmp_path: Path, gpu: tuple[Clock, CounterNvml]
) -> None:
    clock, _ = gpu
    file = OtlpJsonLinesFile(output_dir=tmp_path)
    provider = TracerProvider(resource=Resource({semconv.RUN_ID: "e1"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileSpanExporter(file=file)))
    traintel.configure(
        tracer_provider=provider, log_every_n_iterations=2, global_batch_size=2, seq_len=8,
        energy_price_per_kwh=0.3,
    )  # fmt: skip
    scripted_job(clock)
    traintel.shutdown(1)
    provider.shutdown()
    assert file.path is not None
    text = " ".join(render(summarize([file.path])).split())  # (a long line continues on the next)
    # the loop's summary: up to its last window (1125 J over 4.5 s, 64 tokens)
    assert f"GPU energy: 1.12 kJ ({1125 / 64:,.3g} J/token, {1125 / 8:,.3g} J/sample), cost" in text
    assert "productive 89%, checkpoint_save 11%" in text
    energy = build_report([file.path]).as_dict()["energy"]
    assert energy["joules"] == 1125.0
    assert energy["by_category"] == {"productive": 1000.0, "checkpoint_save": 125.0}
    assert energy["cost"] == 1125.0 / 3.6e6 * 0.3
    (session,) = compute_goodput(load_jobs([file.path]))
    # the job's own: the tail after the loop included, from the application span
    assert session.energy_j == {
        "total": 1250.0,
        "productive": 1000.0,
        "checkpoint_save": 125.0,
        "other": 125.0,
    }
    assert session.as_dict()["energy_joules"]["total"] == 1250.0
    assert "GPU energy 1.2 kJ (all ranks): productive 80.0%, checkpoint_save 10.0%, other 10.0%" in (
        render_goodput([session])
    )
