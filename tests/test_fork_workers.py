"""DataLoader workers under fork, spawn and forkserver, inside a traced training loop.

A fresh interpreter trains a small model on CPU with ``DataLoader(num_workers=2,
multiprocessing_context=...)``, persistent workers that live across two epochs, and a dataset
that calls traintel *and* a plain OTel tracer in the worker. Export intervals are short, so a
forked child whose copies of the exporter threads still ran would export within its lifetime.
Expected: only the main process exports (one file set, one pid), no worker-side span anywhere,
exact span counts with unique ids, no hang at worker exit, the job exits 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.subprocess_helpers import run_python
from traintel.exporters.reader import iter_spans

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

JOB = """
import json, os, time
import torch
from opentelemetry import trace
from torch.utils.data import DataLoader, Dataset
import traintel

class Numbers(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, index):
        with traintel.timed_span("worker_side_read", attributes={"index": index}):
            with trace.get_tracer("user").start_as_current_span("user_worker_span"):
                time.sleep(0.01)
                return torch.full((4,), float(index)), torch.tensor([float(index)])

def main():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    loader = DataLoader(
        Numbers(), batch_size=4, num_workers=2, persistent_workers=True,
        multiprocessing_context=os.environ["MP_METHOD"],
    )
    step = 0
    with traintel.application():
        with traintel.training_loop():
            for epoch in range(2):
                batches = iter(loader)
                for _ in range(len(loader)):
                    with traintel.training_iteration(step, samples=4):
                        with traintel.data_loading():
                            x, y = next(batches)
                        with traintel.model_forward():
                            loss = torch.nn.functional.mse_loss(model(x), y)
                        with traintel.model_backward():
                            loss.backward()
                        with traintel.optimizer_update():
                            optimizer.step()
                            optimizer.zero_grad()
                    step += 1
                time.sleep(0.3)  # the workers live on, past several export intervals
    del loader  # persistent workers shut down here
    print(json.dumps({"pid": os.getpid(), "steps": step}), flush=True)

if __name__ == "__main__":
    main()
"""

STEPS = 16  # 2 epochs x 8 batches


@pytest.mark.parametrize(
    ("method", "configure"),
    [
        ("fork", "automatic"),
        ("spawn", "automatic"),
        ("forkserver", "automatic"),
        ("spawn", "module_level"),
        ("forkserver", "module_level"),
    ],
)
def test_dataloader_workers_do_not_export(tmp_path: Path, method: str, configure: str) -> None:
    """``module_level``: ``traintel.configure()`` right after the import, which a spawn or
    forkserver worker runs again when it imports the main module."""
    runs = tmp_path / "runs"
    job = JOB.replace("import traintel\n", "import traintel\ntraintel.configure()\n", 1)
    result = run_python(
        job if configure == "module_level" else JOB,
        tmp_path,
        timeout=180,  # a deadlock at worker exit fails here instead of hanging the suite
        MP_METHOD=method,
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_OUTPUT_DIR=str(runs),
        OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_METRIC_EXPORT_INTERVAL="100",
        TRAINTEL_SHUTDOWN_TIMEOUT="5",
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == STEPS
    files = sorted(p.name for p in runs.rglob("*") if p.is_file())
    assert files and all(f"{summary['pid']}" in name for name in files), files  # main process only
    spans = list(iter_spans([runs]))
    names = [s.name for s in spans]
    assert "worker_side_read" not in names and "user_worker_span" not in names
    assert names.count("training_iteration") == STEPS
    assert names.count("data_loading") == STEPS
    assert names.count("application") == 1
    assert len({s.span_id for s in spans}) == len(spans)  # nothing duplicated
    by_id = {s.span_id: s for s in spans}
    for span in spans:
        if span.name == "data_loading":  # the wait for the worker is measured in the main process
            assert by_id[span.parent_span_id].name == "training_iteration"


RANKS_JOB = """
import multiprocessing, os
import traintel
traintel.configure()  # run again by each spawned child as it imports this module

def rank(n):
    with traintel.application():
        with traintel.training_loop():
            for i in range(3):
                with traintel.training_iteration():
                    pass
    traintel.shutdown()

if __name__ == "__main__":
    context = multiprocessing.get_context(os.environ["MP_METHOD"])
    children = [context.Process(target=rank, args=(n,)) for n in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join()
    print(os.getpid(), *[child.pid for child in children], flush=True)
"""


def test_a_spawned_child_that_trains_exports_its_own_run(tmp_path: Path) -> None:
    """A process started to train (as torch.multiprocessing.spawn starts ranks) is not a worker:
    the module-level configure() it ran while importing the main module applies once it trains."""
    result = run_python(
        RANKS_JOB, tmp_path, MP_METHOD="spawn", TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), timeout=120
    )
    assert result.returncode == 0, result.stderr
    parent, *children = result.stdout.split()
    for child in children:
        [file] = (tmp_path / "runs").glob(f"*-{child}.otlp.jsonl")
        assert [s.name for s in iter_spans([file])].count("training_iteration") == 3
    trained_here = [s for s in iter_spans(list((tmp_path / "runs").glob(f"*-{parent}.otlp.jsonl")))]
    assert not [s for s in trained_here if s.name == "training_iteration"], "the parent did not train"


SWEEP_JOB = """
import multiprocessing, os
import traintel

def train(point):
    with traintel.application():
        with traintel.training_loop():
            for i in range(5):
                with traintel.training_iteration():
                    pass
    return os.getpid()

if __name__ == "__main__":
    with traintel.model_init():  # the parent configured first: a forked worker inherits its job
        pass
    with multiprocessing.get_context(os.environ["MP_METHOD"]).Pool(2) as pool:
        workers = set(pool.map(train, range(2), chunksize=1))
    print(os.getpid(), *workers, flush=True)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_each_worker_of_a_pool_that_trains_exports_its_own_run(tmp_path: Path, method: str) -> None:
    """A sweep in a ``multiprocessing.Pool``, left by its ``with`` (which terminates the workers
    as they exit). Forked, a worker recorded nothing: the parent's job, closed in the child, made
    the API a no-op. Either way, a worker that had trained exited by its finalizers (no exit
    hooks run) as the parent's SIGTERM came: its file was never written. Each worker now
    records into a job of its own, shut down by the finalizers, the signal waiting for it."""
    result = run_python(
        SWEEP_JOB, tmp_path, MP_METHOD=method, TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), timeout=120
    )
    assert result.returncode == 0, result.stderr
    parent, *workers = result.stdout.split()
    trained = 0  # (a worker may have run both points)
    for worker in workers:
        [file] = (tmp_path / "runs").glob(f"*-{worker}.otlp.jsonl")
        trained += [s.name for s in iter_spans([file])].count("training_iteration")
    assert trained == 10, result.stderr
    [file] = (tmp_path / "runs").glob(f"*-{parent}.otlp.jsonl")
    assert [s.name for s in iter_spans([file])] == ["model_init"]


BLOCKED_CHILD_JOB = """
import multiprocessing, os, signal, time
import traintel

def child(ready):
    with traintel.application():  # a job of its own, with its threads
        with traintel.training_loop():
            with traintel.training_iteration():
                pass
    # The main thread waits in C (as a Pool worker for its next task) and the signal goes to one
    # of the job's threads: the kernel picks any thread that does not block it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    ready.put(os.getpid())
    lock = multiprocessing.Lock()
    lock.acquire()
    lock.acquire()

if __name__ == "__main__":
    with traintel.model_init():  # the parent configured first: its signal watch is its own
        pass
    context = multiprocessing.get_context("fork")
    ready = context.SimpleQueue()
    process = context.Process(target=child, args=(ready,))
    process.start()
    ready.get()
    process.terminate()
    process.join(20)
    print(process.exitcode, flush=True)
    if process.exitcode is None:
        process.kill()
"""


def test_a_forked_child_that_trains_dies_by_sigterm_while_its_main_thread_waits_in_c(tmp_path: Path) -> None:
    """A forked child with a job of its own, its main thread blocked in C, SIGTERM delivered to
    one of its other threads: it dies by the signal, as without traintel (before: it lived on,
    as a ``Pool`` worker waiting for its next task did under load, and the pool's exit waited
    for it forever; the child had its parent's handler but no signal watch of its own)."""
    result = run_python(BLOCKED_CHILD_JOB, tmp_path, TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(-15)], result.stderr
