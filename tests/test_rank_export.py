"""Scale mode in one process: the policy, and exactly what a rank other than 0 exports.

The rank and world size come from the launcher's environment (RANK / WORLD_SIZE, as torchrun
sets them), so the decision is taken at configure and no process group is needed; the two-process
gloo test in test_ranks.py covers the decision taken from torch.distributed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from traintel import callbacks, semconv
from traintel._aggregation.export_policy import RankExportPolicy
from traintel._sdk.instruments import TrainingInstruments

T0 = 1_700_000_000_000  # ms


def test_the_policy_reduces_only_ranks_other_than_0_from_the_scale_world_size() -> None:
    for rank, world, threshold, scale, reduced in (
        (1, 2, 3, False, False),  # below the threshold: nothing changes
        (1, 63, 64, False, False),
        (0, 64, 64, True, False),  # rank 0 exports everything, plus the job-level summaries
        (1, 64, 64, True, True),
        (1023, 1024, 64, True, True),
        (0, 1, 1, True, False),  # a single process is rank 0
    ):
        policy = RankExportPolicy(rank, world, threshold)
        assert (policy.scale_mode, policy.anomalies_only) == (scale, reduced), (rank, world, threshold)


@pytest.mark.parametrize(
    ("rank", "world", "threshold", "message"),
    [
        (2, 2, 64, "rank=2 with world_size=2"),
        (-1, 2, 64, "rank=-1 with world_size=2"),
        (0, 0, 64, "rank=0 with world_size=0"),
        (0, 2, 0, "scale_world_size=0"),
    ],
)
def test_the_policy_names_bad_input(rank: int, world: int, threshold: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RankExportPolicy(rank, world, threshold)


@dataclass
class Exported:
    spans: list[ReadableSpan]
    metrics: dict[str, list[Any]]  # name -> data points of the final collection

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.named(name)
        return span

    def iterations(self) -> dict[int, str]:
        """Exported training iterations -> sampling reason."""
        return {
            int(s.attributes[semconv.ITERATION]): str(s.attributes[semconv.SAMPLING_REASON])  # type: ignore[index]
            for s in self.named("training_iteration")
        }

    def events(self, span: str) -> list[str]:
        return [e.name for s in self.named(span) for e in s.events]


@pytest.fixture
def clean_exit() -> Iterator[None]:
    yield
    traintel.shutdown(2)


def run_job(monkeypatch: pytest.MonkeyPatch, rank: int, threshold: int, policy: str = "sampled") -> Exported:
    """20 iterations of 1 s at exact times (12 is slow, 14 has a NaN loss), a checkpoint after 7,
    a validation loop of 3 iterations after 9; windows of 4, the first 2 and every 5th exported."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    traintel.configure(
        span_exporters=[exporter], metric_readers=[reader], export_iterations=policy,
        export_first_iterations=2, export_every_n_iterations=5, log_every_n_iterations=4,
        slow_iteration_factor=3, cross_rank_scale_world_size=threshold, global_batch_size=8,
    )  # fmt: skip
    callbacks.on_app_start(start_time_msec=T0)
    callbacks.on_train_start(start_time_msec=T0)
    t = T0
    for i in range(20):
        duration = 5000 if i == 12 else 1000
        callbacks.on_training_single_iteration_start(start_time_msec=t)
        callbacks.on_model_forward_start(start_time_msec=t)
        callbacks.on_model_forward_end(finish_time_msec=t + duration / 2)
        if i == 14:
            traintel.record_metrics(loss=float("nan"))
        callbacks.on_training_single_iteration_end(finish_time_msec=t + duration)
        t += duration
        if i == 7:
            callbacks.on_save_checkpoint_start(start_time_msec=t, size_bytes=1000)
            callbacks.on_save_checkpoint_end(finish_time_msec=t + 200)
            t += 200
        if i == 9:
            callbacks.on_validation_start(start_time_msec=t)
            for _ in range(3):
                callbacks.on_validation_single_iteration_start(start_time_msec=t)
                callbacks.on_validation_single_iteration_end(finish_time_msec=t + 100)
                t += 100
            callbacks.on_validation_end(finish_time_msec=t)
    callbacks.on_train_end(finish_time_msec=t + 1)
    callbacks.on_app_end(finish_time_msec=t + 2)
    telemetry = traintel.get_telemetry()
    telemetry.flush(60)
    data = reader.get_metrics_data()
    metrics: dict[str, list[Any]] = {}
    for rm in data.resource_metrics if data is not None else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                metrics.setdefault(metric.name, []).extend(metric.data.data_points)
    return Exported(list(exporter.get_finished_spans()), metrics)


#: What rank 0 (and every rank below the threshold) reports of this job and a reduced rank not.
WINDOW_SERIES = {
    semconv.METRIC_ITERATION_DURATION,
    semconv.METRIC_PHASE_DURATION,
    semconv.METRIC_CHECKPOINT_SAVE_DURATION,
    semconv.METRIC_CHECKPOINT_SIZE,
    semconv.METRIC_SAMPLES,
    semconv.METRIC_SAMPLE_THROUGHPUT,
    semconv.METRIC_STEP_PHASE_TIME,
    semconv.METRIC_GOODPUT,
    semconv.METRIC_BADPUT,
    semconv.METRIC_STEP_TIME_IDEAL,
    semconv.METRIC_STEP_TIME_DEVIATION,
}


def test_a_reduced_rank_exports_only_its_anomalies(monkeypatch: pytest.MonkeyPatch, clean_exit: None) -> None:
    rank1 = run_job(monkeypatch, rank=1, threshold=2)
    # Iterations: only the slow and the non-finite one (no first K, no every M-th), whole.
    assert rank1.iterations() == {12: "slow", 14: "nonfinite"}
    assert len(rank1.named("model_forward")) == 2
    assert rank1.named("validation_iteration") == []
    # The spans anomalies hang from, the checkpoint, the validation loop and the goodput
    # records; nothing else.
    assert sorted({s.name for s in rank1.spans}) == [
        "application", "checkpoint_save_sync", "model_forward", "training_iteration", "training_loop",
        "training_window", "validation_loop",
    ]  # fmt: skip
    assert len(rank1.named("training_window")) == 5
    assert rank1.events("training_loop") == ["slow_iteration", "nonfinite_metric"]
    assert rank1.events("checkpoint_save_sync") == ["save_checkpoint_success", "checkpoint_metrics_update"]
    assert rank1.events("validation_loop") == ["validation_metrics_update"]
    loop = rank1.one("training_loop").attributes or {}
    assert loop[semconv.SUMMARY_RANK_EXPORT] == semconv.RANK_EXPORT_ANOMALIES_ONLY
    assert loop[semconv.SUMMARY_PREFIX + "exported_iterations"] == 2
    # Metrics: no ml.training.* series but the heartbeat; traintel's own counters stay.
    training = {name for name in rank1.metrics if name.startswith("ml.training.")}
    assert training == {
        semconv.METRIC_HEARTBEAT_SECONDS_SINCE_PROGRESS,
        semconv.METRIC_HEARTBEAT_ITERATION,
        semconv.METRIC_HEARTBEAT_PHASE,
    }
    exported = {
        p.attributes["traintel.exported"]: p.value for p in rank1.metrics[semconv.METRIC_ITERATIONS_EXPORTED]
    }
    assert exported == {True: 2, False: 18}
    # traintel's own health: only what is not zero (nothing went wrong here: no series at all)
    assert {name for name in rank1.metrics if name.startswith("traintel.")} == {
        semconv.METRIC_ITERATIONS_EXPORTED
    }


def test_rank_0_and_ranks_below_the_threshold_export_everything(
    monkeypatch: pytest.MonkeyPatch, clean_exit: None
) -> None:
    outputs = []
    for rank, threshold in ((0, 2), (1, 3)):
        out = run_job(monkeypatch, rank, threshold)
        traintel.shutdown(60)
        assert out.iterations() == {
            0: "first", 1: "first", 5: "every_n", 10: "every_n", 12: "slow", 14: "nonfinite", 15: "every_n"
        }  # fmt: skip
        assert len(out.named("validation_iteration")) == 2
        assert out.events("training_loop").count("training_metrics_update") == 5
        assert semconv.SUMMARY_RANK_EXPORT not in (out.one("training_loop").attributes or {})
        assert set(out.metrics) >= WINDOW_SERIES, WINDOW_SERIES - set(out.metrics)
        outputs.append(out)
    rank0, below = outputs
    assert sorted(s.name for s in rank0.spans) == sorted(s.name for s in below.spans)
    assert set(rank0.metrics) == set(below.metrics)


def test_the_all_policy_is_reduced_to_the_anomalies_too(
    monkeypatch: pytest.MonkeyPatch, clean_exit: None
) -> None:
    rank1 = run_job(monkeypatch, rank=1, threshold=2, policy="all")
    assert rank1.iterations() == {12: "slow", 14: "nonfinite"}
    # ...and setting the config again (it re-reads the sampling knobs) does not undo it.
    traintel.set_training_config(export_iterations="all", export_first_iterations=5)
    engine = traintel.get_telemetry().engine
    assert engine is not None
    assert (engine.sampler.policy, engine.sampler.first, engine.sampler.every_n, engine.export_all) == (
        "sampled", 0, 0, False
    )  # fmt: skip
    engine.set_rank_export(RankExportPolicy(0, 2, 2))  # decided once: ignored
    assert engine.rank_export == RankExportPolicy(1, 2, 2)


def test_without_a_known_world_the_first_window_decides(
    monkeypatch: pytest.MonkeyPatch, clean_exit: None
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    traintel.configure(span_exporters=[InMemorySpanExporter()], metric_readers=[], log_every_n_iterations=2)
    engine = traintel.get_telemetry().engine
    assert engine is not None and engine.rank_export is None  # not known at configure
    with traintel.training_loop():
        for i in range(2):
            with traintel.training_iteration():
                pass
            # not distributed at the boundary: a single process, everything exported
            assert engine.rank_export == (None if i == 0 else RankExportPolicy(0, 1, 64))
    instruments = engine.metrics
    assert engine.window_events and isinstance(instruments, TrainingInstruments) and instruments.window_series
