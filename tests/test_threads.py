"""Context across threads: async checkpoint writers and pools keep the right parent."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import traintel
from tests.conftest import Pipeline, parent_name
from traintel import threads


def _write_shard(index: int) -> int:
    with traintel.timed_span("write_shard", attributes={"shard": index}):
        return index


def test_context_thread_pool_executor_keeps_parent(pipeline: Pipeline) -> None:
    with (
        traintel.training_loop(),
        traintel.checkpoint_save(strategy="async"),
        threads.ContextThreadPoolExecutor(max_workers=2) as pool,
    ):
        results = list(pool.map(_write_shard, range(4)))  # map goes through submit
    assert results == [0, 1, 2, 3]
    spans = pipeline.spans()
    shards = pipeline.by_name("write_shard")
    assert len(shards) == 4
    assert {parent_name(s, spans) for s in shards} == {"checkpoint_save_async"}


def test_submit_with_context_on_a_foreign_executor(pipeline: Pipeline) -> None:
    with ThreadPoolExecutor(max_workers=1) as pool, traintel.validation_loop():
        threads.submit_with_context(pool, _write_shard, 7).result()
        pool.submit(_write_shard, 8).result()  # a plain submit loses the context: a root span
    spans = pipeline.spans()
    by_shard = {s.attributes["shard"]: s for s in pipeline.by_name("write_shard")}  # type: ignore[index]
    assert parent_name(by_shard[7], spans) == "validation_loop"
    assert by_shard[8].parent is None


def test_wrap_with_context_for_threads(pipeline: Pipeline) -> None:
    with traintel.training_loop(), traintel.checkpoint_save(strategy="async"):
        thread = threading.Thread(target=threads.wrap_with_context(_write_shard), args=(1,))
        thread.start()
    thread.join()
    spans = pipeline.spans()
    assert parent_name(pipeline.one("write_shard"), spans) == "checkpoint_save_async"
