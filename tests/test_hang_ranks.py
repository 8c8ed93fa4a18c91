"""A hung job names its culprit while it hangs: four real ranks over gloo, one of which stops
before an ``all_reduce`` - first asleep in Python, then in C code that holds the GIL - while the
three others wait in it. Each stall gets one ``hang_suspect`` record per rank (the stuck rank's
says where it is and that it entered one collective fewer, the others' that they wait in the
next one), written while the job is stuck: the test releases the rank only once the records are
in the files. Then each rank's ``hang_recovered``. And ten clean loops of the same job: none.

The oracle is the records' content and order; the waits are hang guards only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.rank_helpers import PRELUDE, free_port
from tests.subprocess_helpers import clean_env
from traintel import semconv
from traintel.analysis.stalls import find_stalls
from traintel.exporters.reader import LogEntry, iter_records, iter_spans

pytestmark = [pytest.mark.process, pytest.mark.xdist_group("ranks")]  # the suite's tiers: tests/tiers.py
WORLD = 4
STUCK = 2
THRESHOLD_S = 4.0
COLLECTION_S = 5.0  # the metric collection interval (OTEL_METRIC_EXPORT_INTERVAL)
GUARD_S = 150.0

JOB = """
import ctypes, signal

class Released(Exception):
    pass

def _release(*_):
    raise Released()

signal.signal(signal.SIGUSR1, _release)

def sleep_before_all_reduce():
    try:
        time.sleep(600)
    except Released:
        pass

def hold_gil_before_all_reduce():
    # the helper's record carries the state of the watcher's last wake (once a second): let one
    # see this iteration outside any collective, as it would in a job that does not race it
    time.sleep(1.5)
    fd = os.open(os.environ["HANG_FIFO"], os.O_RDWR)
    ctypes.PyDLL(None).read(fd, ctypes.create_string_buffer(1), 1)  # PyDLL: the GIL stays held
    os.close(fd)

def helpers():  # this rank's children running the GIL helper (Linux: /proc lists them per thread)
    found = 0
    for task in os.listdir("/proc/self/task"):
        try:  # a thread (or a child) listed may have ended since
            children = open(f"/proc/self/task/{task}/children").read().split()
        except OSError:
            continue
        for child in children:
            try:
                found += "gil_helper.py" in open(f"/proc/{child}/cmdline").read()
            except OSError:
                pass
    return found

def run(loops, iterations, stalls):
    telemetry = traintel.configure()
    tensor = torch.ones(4)
    for _ in range(loops):
        with traintel.training_loop():
            for i in range(iterations):
                with traintel.training_iteration(samples=4):
                    if RANK == 2 and i in stalls:
                        stalls[i]()
                    dist.all_reduce(tensor)
                    time.sleep(0.15)
                if i % 4 == 3:
                    with traintel.validation_loop():
                        with traintel.validation_iteration():
                            dist.all_reduce(tensor)
                    with traintel.checkpoint_save(iteration=i, size_bytes=10):
                        dist.barrier()
    print("watcher", telemetry.stall_watcher.threshold_s, "helpers", helpers(), flush=True)
    traintel.shutdown()

if os.environ["HANG_MODE"] == "hang":
    run(1, 32, {6: sleep_before_all_reduce, 20: hold_gil_before_all_reduce})
else:
    run(10, 8, {})  # ten clean loops of the same job
dist.destroy_process_group()
"""


class Ranks:
    def __init__(self, tmp_path: Path, mode: str) -> None:
        script = tmp_path / "rank.py"
        script.write_text(PRELUDE + textwrap.dedent(JOB))
        self.fifo = tmp_path / "fifo"
        os.mkfifo(self.fifo)
        port = str(free_port())
        self.dirs = [tmp_path / f"rank{rank}" for rank in range(WORLD)]
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank, out_dir in enumerate(self.dirs):
            out_dir.mkdir()
            env = clean_env(
                MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(WORLD),
                LOCAL_RANK=str(rank), TORCHELASTIC_RUN_ID=f"hang-{port}", OMP_NUM_THREADS="1",
                TRAINTEL_OUTPUT_DIR=str(out_dir), TRAINTEL_STALL_SECONDS=str(THRESHOLD_S),
                OTEL_METRIC_EXPORT_INTERVAL=str(int(COLLECTION_S * 1000)),
                HANG_MODE=mode, HANG_FIFO=str(self.fifo),
            )  # fmt: skip
            # files, not pipes: nobody reads a pipe while the job hangs, and a full one would block it
            out, err = tmp_path / f"rank{rank}.out", tmp_path / f"rank{rank}.err"
            with open(out, "w") as stdout, open(err, "w") as stderr:
                command = [sys.executable, str(script)]
                self.procs.append(
                    subprocess.Popen(command, cwd=tmp_path, env=env, stdout=stdout, stderr=stderr)
                )
        self.tmp_path = tmp_path

    def records(self, rank: int, event: str | None = None) -> list[LogEntry]:
        entries = [e for e in iter_records([self.dirs[rank]], logs=True) if isinstance(e, LogEntry)]
        return sorted((e for e in entries if event is None or e.event_name == event), key=lambda e: e.time_ns)

    def until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + GUARD_S
        while not condition():
            for proc in self.procs:
                assert proc.poll() is None, f"a rank exited while waiting for {what}: {self.output()}"
            assert time.monotonic() < deadline, f"gave up waiting for {what}: {self.output()}"
            time.sleep(0.25)

    def suspects_everywhere(self, count: int) -> Callable[[], bool]:
        return lambda: all(len(self.records(r, semconv.EVENT_HANG_SUSPECT)) >= count for r in range(WORLD))

    def wait(self) -> list[str]:
        """Each rank's standard output, once all exited (successfully)."""
        for proc in self.procs:
            try:
                proc.wait(GUARD_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
        assert [p.returncode for p in self.procs] == [0] * WORLD, self.output()
        return [(self.tmp_path / f"rank{rank}.out").read_text() for rank in range(WORLD)]

    def output(self) -> str:
        return "\n".join(
            f"rank {rank}: {(self.tmp_path / f'rank{rank}.err').read_text()[-3000:]}" for rank in range(WORLD)
        )

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Ranks:
    """The job, driven through both stalls: each rank released only once every rank's record of
    the stall is in its files."""
    ranks = Ranks(tmp_path_factory.mktemp("hung"), "hang")
    try:
        ranks.until(ranks.suspects_everywhere(1), "every rank's record of the first stall")
        ranks.procs[STUCK].send_signal(signal.SIGUSR1)  # wakes it from its sleep
        ranks.until(ranks.suspects_everywhere(2), "every rank's record of the second stall")
        with open(ranks.fifo, "wb") as fifo:
            fifo.write(b"x")  # ends the read that holds the GIL
        ranks.wait()
    finally:
        ranks.kill()
    return ranks


def _attributes(entry: LogEntry) -> dict[str, Any]:
    return entry.attributes


def _check_waiting(ranks: Ranks, stall: int) -> int:
    """The three other ranks' records of stall ``stall`` say they wait in the same collective;
    returns its sequence number."""
    waited = set()
    for rank in range(WORLD):
        if rank == STUCK:
            continue
        record = ranks.records(rank, semconv.EVENT_HANG_SUSPECT)[stall]
        attributes = _attributes(record)
        assert attributes[semconv.RANK] == rank == record.resource[semconv.RANK]
        assert attributes[semconv.HANG_WAITING_IN] == "all_reduce"
        assert attributes[semconv.COLLECTIVES_COMPLETED] == attributes[semconv.COLLECTIVES_ENTERED] - 1
        assert attributes[semconv.HANG_PYTHON] == semconv.PYTHON_BLOCKED
        assert attributes[semconv.HANG_TOP_FRAME].startswith("all_reduce (")
        assert "dist.all_reduce(tensor)" in attributes[semconv.CODE_STACKTRACE]
        # written within two collection intervals of the stall's start, by the record's own account
        assert THRESHOLD_S <= attributes[semconv.HANG_STALLED_SECONDS] < 2 * COLLECTION_S
        waited.add(attributes[semconv.COLLECTIVES_ENTERED])
    assert len(waited) == 1, waited
    return waited.pop()


def test_a_rank_asleep_in_python_is_named_with_the_collective_the_others_wait_in(hung: Ranks) -> None:
    waited = _check_waiting(hung, 0)
    record = hung.records(STUCK, semconv.EVENT_HANG_SUSPECT)[0]
    attributes = _attributes(record)
    assert attributes[semconv.RANK] == STUCK
    assert attributes[semconv.HANG_TOP_FRAME].startswith("sleep_before_all_reduce (")
    assert attributes[semconv.CODE_STACKTRACE].rstrip().endswith("time.sleep(600)")
    assert semconv.HANG_WAITING_IN not in attributes
    # one collective behind the others: the one they wait in is the next it would enter
    assert attributes[semconv.COLLECTIVES_ENTERED] == attributes[semconv.COLLECTIVES_COMPLETED] == waited - 1
    assert attributes[semconv.HANG_PYTHON] == semconv.PYTHON_BLOCKED
    assert attributes[semconv.ITERATION] == 5 and attributes[semconv.PHASE] == "training_iteration"
    assert THRESHOLD_S <= attributes[semconv.HANG_STALLED_SECONDS] < 2 * COLLECTION_S
    # the analysis of all four ranks' records names it
    (first, _second) = find_stalls([e for rank in range(WORLD) for e in hung.records(rank)])
    assert first.culprits == [STUCK] and first.wavefront == waited
    assert sorted(first.waiting) == [0, 1, 3]


def test_a_rank_whose_gil_c_code_holds_is_classified_holding_it(hung: Ranks) -> None:
    _check_waiting(hung, 1)
    record = hung.records(STUCK, semconv.EVENT_HANG_SUSPECT)[1]
    attributes = _attributes(record)
    assert attributes[semconv.HANG_PYTHON] == semconv.PYTHON_HOLDING_GIL  # not blocked
    assert attributes[semconv.HANG_TOP_FRAME].startswith("hold_gil_before_all_reduce (")
    assert "ctypes.PyDLL(None).read(" in attributes[semconv.CODE_STACKTRACE]
    assert semconv.HANG_WAITING_IN not in attributes
    (_first, second) = find_stalls([e for rank in range(WORLD) for e in hung.records(rank)])
    assert second.culprits == [STUCK]


def test_each_stall_is_reported_once_and_recovered(hung: Ranks) -> None:
    for rank in range(WORLD):
        events = [e.event_name for e in hung.records(rank)]
        suspect, recovered = semconv.EVENT_HANG_SUSPECT, semconv.EVENT_HANG_RECOVERED
        assert events == [suspect, recovered, suspect, recovered], (rank, events)


def test_ten_clean_loops_of_the_same_job_write_no_record(tmp_path: Path) -> None:
    ranks = Ranks(tmp_path, "clean")
    try:
        outputs = ranks.wait()
    finally:
        ranks.kill()
    assert [ranks.records(rank) for rank in range(WORLD)] == [[]] * WORLD
    # watched all along: by the watcher, and by the helper a held GIL would have woken
    assert [out.splitlines()[-1] for out in outputs] == [f"watcher {THRESHOLD_S} helpers 1"] * WORLD
    # the ten loops did run, with the watcher and its helper process
    loops = [sum(s.name == "training_loop" for s in iter_spans([d])) for d in ranks.dirs]
    assert loops == [10] * WORLD


def test_traintel_report_names_the_culprit_and_its_stack(hung: Ranks) -> None:
    command = [sys.executable, "-m", "traintel.cli", "report", *map(str, hung.dirs)]
    text = subprocess.run(
        command, capture_output=True, text=True, check=True, env=clean_env(COLUMNS="200")
    ).stdout
    stall_1 = text[text.index("Stall 1") : text.index("Stall 2")]
    assert "ranks 0, 1, 3 wait in collective #" in stall_1
    assert "culprit  rank 2 (entered #" in stall_1
    assert "blocked in a call that released the GIL, at sleep_before_all_reduce (" in stall_1
    assert "rank 2's stack (innermost last):" in stall_1 and stall_1.rstrip().endswith("time.sleep(600)")
    assert "C code holding the GIL, at hold_gil_before_all_reduce (" in text[text.index("Stall 2") :]
    page = hung.tmp_path / "report.html"
    subprocess.run([*command, "--html", str(page)], capture_output=True, check=True)
    html = page.read_text()
    assert "<h2>Stall 1</h2>" in html and "<h2>Stall 2</h2>" in html
    assert "<td>culprit</td><td>rank 2 (entered #" in html and "time.sleep(600)</pre>" in html
    report = json.loads(
        subprocess.run([*command, "--json"], capture_output=True, text=True, check=True).stdout
    )
    first, second = report["stalls"]
    assert (first["culprits"], first["waiting"], first["collective"]) == ([2], [0, 1, 3], "all_reduce")
    assert first["ranks"]["2"][semconv.HANG_TOP_FRAME].startswith("sleep_before_all_reduce (")
    assert second["ranks"]["2"][semconv.HANG_PYTHON] == semconv.PYTHON_HOLDING_GIL


def test_one_waiting_rank_waits_and_several_wait() -> None:
    """The stall's "waiting" line agrees with how many ranks wait (a job of 2: "rank 0 waits")."""

    def suspect(rank: int, entered: int, waiting_in: str | None) -> LogEntry:
        attributes: dict[str, Any] = {semconv.HANG_STALLED_SECONDS: 5.0, semconv.COLLECTIVES_ENTERED: entered}
        if waiting_in is not None:
            attributes[semconv.HANG_WAITING_IN] = waiting_in
        resource = {semconv.RANK: rank, semconv.WORLD_SIZE: 3, semconv.SERVICE_INSTANCE_ID: f"i{rank}"}
        return LogEntry(semconv.EVENT_HANG_SUSPECT, 10**10, 13, "", attributes, "", "", resource, "traintel")

    def waiting(entries: list[LogEntry]) -> str:
        (stall,) = find_stalls(entries)
        return dict(stall.rows())["waiting"]

    one = [suspect(0, 8, "all_reduce"), suspect(1, 7, None)]
    assert waiting(one) == "rank 0 waits in collective #8 (all_reduce)"
    two = [suspect(0, 8, "all_reduce"), suspect(2, 8, "all_reduce"), suspect(1, 7, None)]
    assert waiting(two) == "ranks 0, 2 wait in collective #8 (all_reduce)"


def test_ranks_in_different_collectives_and_collectives_of_two_threads_are_said() -> None:
    """An async checkpoint writer calling collectives on the training's process group: the ranks
    interleave them differently and deadlock. The stall said "ranks 0, 1 wait in collective #8
    (all_gather_single, broadcast)" and nothing else; it now says the ranks are out of order,
    and which threads had collectives in flight."""

    def suspect(rank: int, waiting_in: str, threads: list[str]) -> LogEntry:
        attributes: dict[str, Any] = {
            semconv.HANG_STALLED_SECONDS: 5.0, semconv.COLLECTIVES_ENTERED: 8,
            semconv.HANG_WAITING_IN: waiting_in, semconv.HANG_COLLECTIVE_THREADS: threads,
        }  # fmt: skip
        resource = {semconv.RANK: rank, semconv.WORLD_SIZE: 2, semconv.SERVICE_INSTANCE_ID: f"i{rank}"}
        return LogEntry(semconv.EVENT_HANG_SUSPECT, 10**10, 13, "", attributes, "", "", resource, "traintel")

    (stall,) = find_stalls(
        [
            suspect(0, "all_gather_single", ["MainThread"]),
            suspect(1, "broadcast", ["AsyncWriter", "MainThread"]),
        ]
    )
    rows = dict(stall.rows())
    assert rows["out of order"] == (
        "rank 0 in all_gather_single; rank 1 in broadcast: the ranks called different collectives at #8"
    )
    assert rows["threads"].startswith(
        "rank 1: collectives in flight from threads AsyncWriter, MainThread; two "
    )
    assert stall.as_dict()["out_of_order"] == {"all_gather_single": [0], "broadcast": [1]}
    (agreeing,) = find_stalls(
        [suspect(0, "all_reduce", ["MainThread"]), suspect(1, "all_reduce", ["MainThread"])]
    )
    assert {label for label, _ in agreeing.rows()} == {"started", "lasted", "waiting"}
