"""Async checkpoint writers ending their spans concurrently with the training loop.

300 iterations; every 10th starts an async save whose completion is finished later by one of
three writer threads (so several saves overlap, and they finish while the loop is ending its own
spans on the main thread). Asserted: no deadlock (every thread ends within a bound), exact
counts, unique span ids, every ``checkpoint_finalize`` parented to the training loop and linked
to its own ``checkpoint_save_async`` span and to the iteration that started it, background time
totals that add up to the finalize spans' durations, and the spans the writers made (a stage,
the finalize) named with their thread, what trained with none.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import traintel
from traintel import semconv

ITERATIONS = 300
EVERY = 10
WRITERS = 3


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    traintel.configure(
        span_exporters=[exporter],
        metric_readers=[InMemoryMetricReader()],
        export_iterations="all",
        log_every_n_iterations=50,
    )
    yield exporter
    traintel.shutdown(2)


def _writer(jobs: queue.Queue[Any], finished: list[int]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        iteration, completion = job
        with traintel.checkpoint_stage("write"):  # a stage marked beside training
            time.sleep(0.002 * (iteration % 7))  # uneven: saves finish out of order, overlapping
        completion.finish(size_bytes=1000 + iteration)
        finished.append(iteration)


def test_overlapping_async_saves_finished_by_writer_threads(exporter: InMemorySpanExporter) -> None:
    jobs: queue.Queue[Any] = queue.Queue()
    finished: list[int] = []
    writers = [
        threading.Thread(target=_writer, args=(jobs, finished), name=f"writer-{n}") for n in range(WRITERS)
    ]
    for writer in writers:
        writer.start()
    with traintel.application(), traintel.training_loop():
        for i in range(ITERATIONS):
            with traintel.training_iteration(i, samples=4):
                with traintel.model_forward():
                    pass
                if i % EVERY == 0:
                    save = traintel.checkpoint_save(strategy="async", iteration=i)
                    with save:
                        jobs.put((i, save.completion()))
        for _ in writers:
            jobs.put(None)
        for writer in writers:
            writer.join(30)
    assert not any(writer.is_alive() for writer in writers), "a writer thread deadlocked"
    assert sorted(finished) == list(range(0, ITERATIONS, EVERY))
    assert traintel.get_telemetry().flush(60)  # the batch processor holds the last spans

    spans: list[ReadableSpan] = list(exporter.get_finished_spans())
    assert len({s.context.span_id for s in spans}) == len(spans)  # nothing duplicated
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    saves = ITERATIONS // EVERY
    assert len(named["training_iteration"]) == ITERATIONS
    assert len(named["model_forward"]) == ITERATIONS
    assert len(named["checkpoint_save_async"]) == saves
    assert len(named["checkpoint_finalize"]) == saves
    # What ran beside training says on which thread; what trained says nothing.
    threads = {(s.attributes or {}).get(semconv.THREAD_NAME) for s in spans if s.name != "checkpoint_write"}
    assert None in threads and set() < threads - {None} <= {f"writer-{n}" for n in range(WRITERS)}
    writes = named["checkpoint_write"]
    assert len(writes) == saves and all(
        str((s.attributes or {})[semconv.THREAD_NAME]).startswith("writer-") for s in writes
    )
    assert all(
        semconv.THREAD_NAME not in (s.attributes or {})
        for s in spans
        if s.name in ("training_iteration", "model_forward", "checkpoint_save_async", "training_loop")
    )
    (loop,) = named["training_loop"]
    iterations = {s.attributes[semconv.ITERATION]: s for s in named["training_iteration"]}  # type: ignore[index]
    blocking = {s.attributes[semconv.CHECKPOINT_ITERATION]: s for s in named["checkpoint_save_async"]}  # type: ignore[index]
    backgrounds = 0.0
    for finalize in named["checkpoint_finalize"]:
        attributes = finalize.attributes or {}
        it = attributes[semconv.CHECKPOINT_ITERATION]
        assert attributes[semconv.CHECKPOINT_SIZE] == 1000 + it  # type: ignore[operator]
        assert finalize.parent is not None and finalize.parent.span_id == loop.context.span_id
        save = blocking[it]
        assert save.parent is not None and save.parent.span_id == iterations[it].context.span_id
        assert [link.context.span_id for link in finalize.links] == [
            save.context.span_id,
            iterations[it].context.span_id,  # the iteration that started it
        ]
        assert finalize.start_time == save.end_time
        assert finalize.end_time is not None and finalize.start_time is not None
        assert finalize.end_time >= finalize.start_time
        assert finalize.status.is_ok
        backgrounds += (finalize.end_time - finalize.start_time) / 1e9
    # The running totals each finish reports are cumulative: the largest is all of them.
    totals = [
        dict(e.attributes or {})
        for f in named["checkpoint_finalize"]
        for e in f.events
        if e.name == semconv.Event.CHECKPOINT_METRICS_UPDATE.value
    ]
    C = semconv.CHECKPOINT_PREFIX
    assert max(t[C + "background_time.total"] for t in totals) == pytest.approx(backgrounds)  # type: ignore[type-var]
    assert max(t[C + "bytes.total"] for t in totals) == sum(1000 + i for i in range(0, ITERATIONS, EVERY))  # type: ignore[type-var]


def test_a_job_configured_on_the_main_thread_that_trains_in_another_is_not_beside_itself(
    exporter: InMemorySpanExporter,
) -> None:
    """Configured on the main thread (the fixture), trained in a thread of its own (as a
    framework that runs the training function in a worker thread does): its phases are the
    training's, initialization included; only its writer's stage ran beside it."""

    def train() -> None:
        with traintel.application():
            with traintel.model_init():
                pass
            with traintel.training_loop():
                with traintel.training_iteration(0):
                    pass
                with traintel.checkpoint_save(strategy="async") as save:
                    writer = threading.Thread(target=_stage_then_finish, args=(save.completion(),), name="w")
                    writer.start()
                    writer.join(30)

    trainer = threading.Thread(target=train, name="trainer")
    trainer.start()
    trainer.join(30)
    assert traintel.get_telemetry().flush(30)
    threads = {s.name: (s.attributes or {}).get(semconv.THREAD_NAME) for s in exporter.get_finished_spans()}
    assert threads["checkpoint_write"] == threads["checkpoint_finalize"] == "w"
    training = ("application", "model_init", "training_loop", "checkpoint_save_async")
    assert {threads[name] for name in training} == {None}
    ledger = traintel.get_telemetry().engine.goodput  # type: ignore[union-attr]
    assert ledger.booked()["initialization"] > 0


def _stage_then_finish(completion: Any) -> None:
    with traintel.checkpoint_stage("write"):
        pass
    completion.finish(size_bytes=1)
