"""The stall watcher, one wake at a time: a real job (traintel's engine, heartbeat and collective
sequence), a real training thread that blocks or spins, the SDK's logs pipeline with an in-memory
exporter; the watcher's clock is injected, so a stall of seconds takes milliseconds and the
records' numbers are exact. The multi-rank behaviour, with the helper process and real time, is
in tests/test_hang_ranks.py."""

from __future__ import annotations

import faulthandler
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import traintel
from traintel import semconv
from traintel._host import stall
from traintel._host.heartbeat import Heartbeat
from traintel._host.stall import StallWatcher
from traintel._recorder import clock
from traintel._recorder.engine import TrainingEngine
from traintel._runtime import hang_records
from traintel._runtime.gil_helper import held_stack
from traintel.config import ConfigurationError
from traintel.distributed.collectives import CollectiveSequence

SECOND = 1_000_000_000
THRESHOLD = 3.0
GUARD_S = 30.0  # hang guards only: the oracle is the records


@dataclass
class Job:
    telemetry: Any
    exporter: InMemoryLogRecordExporter
    sequence: CollectiveSequence
    watcher: StallWatcher

    def records(self, event: str | None = None) -> list[Any]:
        found = [r.log_record for r in self.exporter.get_finished_logs()]
        return [r for r in found if event is None or r.event_name == event]

    def suspects(self) -> list[Any]:
        return self.records(semconv.EVENT_HANG_SUSPECT)

    def recovered(self) -> list[Any]:
        return self.records(semconv.EVENT_HANG_RECOVERED)


@pytest.fixture
def job() -> Iterator[Job]:
    """A configured job whose own watcher is off: the test drives one of its own."""
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()], shutdown_on_exit=False)
    telemetry = traintel.configure(
        tracer_provider=tracer_provider, meter_provider=meter_provider, stall_seconds=0
    )
    assert telemetry.stall_watcher is None
    exporter = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider(shutdown_on_exit=False)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    sequence = CollectiveSequence()
    watcher = StallWatcher(
        Heartbeat(telemetry.engine, telemetry.open_spans, sequence, clock.time_ns),
        telemetry.engine,
        functools.partial(hang_records.emit, lambda: logger_provider.get_logger("test")),
        THRESHOLD,
        rank=5,
    )
    yield Job(telemetry, exporter, sequence, watcher)
    traintel.shutdown(1.0)
    logger_provider.shutdown()
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def blocked_in_c(lock: threading.Lock) -> None:
    lock.acquire()  # a C call that releases the GIL, as a collective or a read does


def spinning_in_python(stop: list[bool]) -> None:
    count = 0
    while not stop[0]:
        count += 1


class Driver:
    """Wakes the watcher from another thread while the main thread (the training thread) is
    stuck, at injected times ``start + k`` seconds; between two wakes it lets real time pass
    until the main thread has run a pending call, or for a short while when it cannot."""

    def __init__(self, job: Job, stuck: threading.Event, wakes: int, release: Callable[[], None]) -> None:
        self.job, self.stuck, self.wakes, self.release = job, stuck, wakes, release
        self.start_ns = 0
        self.per_wake: list[int] = []  # suspects seen after each wake
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._drive, daemon=True)

    def _drive(self) -> None:
        try:
            assert self.stuck.wait(GUARD_S)
            self.start_ns = time.time_ns()
            for k in range(1, self.wakes + 1):
                probe = stall._main_thread_probe()
                runs = probe.runs
                self.job.watcher.check(self.start_ns + k * SECOND)
                self.per_wake.append(len(self.job.suspects()))
                deadline = time.monotonic() + 0.3  # a main thread that runs Python runs the call
                while probe.runs == runs and time.monotonic() < deadline:
                    time.sleep(0.005)
        except BaseException as exc:
            self.error = exc
        finally:
            self.release()


def _train_then_stick(job: Job, stick: Callable[[], None], driver: Driver) -> dict[str, Any]:
    """Two iterations, then the third sticks in ``stick`` on this (the main) thread while the
    driver wakes the watcher; what the test needs to check the records exactly."""
    seen: dict[str, Any] = {}
    driver.thread.start()
    with traintel.training_loop():
        for number in range(3):
            seen["before_iteration_ns"] = time.time_ns()  # the third's is kept
            with traintel.training_iteration(number, samples=1) as span:
                if number == 2:
                    seen["context"] = span.get_span_context()
                    driver.stuck.set()
                    stick()
    driver.thread.join(GUARD_S)
    assert driver.error is None, driver.error
    return seen


def test_a_thread_blocked_in_c_is_reported_once_with_its_stack_and_recovers(job: Job) -> None:
    lock = threading.Lock()
    lock.acquire()
    driver = Driver(job, threading.Event(), wakes=6, release=lock.release)
    seen = _train_then_stick(job, lambda: blocked_in_c(lock), driver)
    # nothing before the threshold, one record at it, and no second one for the same stall
    assert driver.per_wake == [0, 0, 1, 1, 1, 1]
    (record,) = job.suspects()
    attributes = dict(record.attributes)
    stalled = attributes.pop(semconv.HANG_STALLED_SECONDS)
    # the stall began when the third iteration did: after the test read the clock before entering
    # it and before the driver read it (the thread may be descheduled anywhere in between)
    assert 3.0 <= stalled <= 3.0 + (driver.start_ns - seen["before_iteration_ns"]) / SECOND + 0.001
    stack = attributes.pop(semconv.CODE_STACKTRACE)
    top = attributes.pop(semconv.HANG_TOP_FRAME)
    assert top.startswith(f"blocked_in_c ({__file__}:")
    assert stack.rstrip().endswith(
        "lock.acquire()  # a C call that releases the GIL, as a collective or a read does"
    )
    assert "in _train_then_stick" in stack
    assert attributes == {
        semconv.RANK: 5,
        semconv.PHASE: "training_iteration",
        semconv.ITERATION: 1,  # the last completed
        semconv.HANG_PYTHON: semconv.PYTHON_BLOCKED,
        semconv.COLLECTIVES_ENTERED: 0,
        semconv.COLLECTIVES_COMPLETED: 0,
        semconv.THREAD_ID: threading.main_thread().ident,
    }
    assert record.severity_text == "WARN" and record.body.startswith("rank 5: no progress for 3.0 s")
    # linked to the stalled iteration's trace and span
    assert (record.trace_id, record.span_id) == (seen["context"].trace_id, seen["context"].span_id)
    assert job.recovered() == []
    # the iteration ended: progress (the next injected second: a wake read off the real clock
    # would see a gap above the threshold on a loaded machine, as if the GIL had been held)
    job.watcher.check(driver.start_ns + (driver.wakes + 1) * SECOND)
    (recovered,) = job.recovered()
    assert recovered.attributes[semconv.HANG_PYTHON] == semconv.PYTHON_BLOCKED
    assert recovered.severity_text == "INFO"
    assert len(job.suspects()) == 1


def test_a_thread_running_python_is_reported_running(job: Job) -> None:
    stop = [False]
    driver = Driver(job, threading.Event(), wakes=4, release=lambda: stop.__setitem__(0, True))

    def in_data_loading() -> None:
        with traintel.data_loading():
            spinning_in_python(stop)

    _train_then_stick(job, in_data_loading, driver)
    (record,) = job.suspects()
    assert record.attributes[semconv.HANG_PYTHON] == semconv.PYTHON_RUNNING
    assert record.attributes[semconv.HANG_TOP_FRAME].startswith("spinning_in_python (")
    assert record.attributes[semconv.PHASE] == "data_loading"  # the step phase it is stuck in


def test_a_rank_waiting_in_a_collective_is_watched_before_any_iteration(job: Job) -> None:
    start = time.time_ns()
    job.sequence.enter("all_reduce")
    job.sequence.enter("all_reduce")
    job.sequence.complete()
    for k in range(4):  # the wake at +0 s sees the counts move
        job.watcher.check(start + k * SECOND)
    (record,) = job.suspects()
    assert record.attributes[semconv.HANG_WAITING_IN] == "all_reduce"
    assert record.attributes[semconv.COLLECTIVES_ENTERED] == 2
    assert record.attributes[semconv.COLLECTIVES_COMPLETED] == 1
    assert record.attributes[semconv.PHASE] == "idle"
    assert semconv.ITERATION not in record.attributes
    assert "waits in collective #2 (all_reduce)" in record.body
    job.sequence.complete()  # the collective completes: progress
    job.watcher.check(start + 4 * SECOND)
    (recovered,) = job.recovered()
    assert (
        recovered.attributes[semconv.HANG_STALLED_SECONDS] == 4.0
    )  # seen entered at +0 s, completed at +4 s
    assert semconv.HANG_WAITING_IN not in recovered.attributes


def test_collectives_in_flight_from_two_threads_are_named(job: Job) -> None:
    """A writer thread's collective and the training thread's, both in flight: the record names
    both threads (two threads on one process group can deadlock the ranks)."""
    start = time.time_ns()
    writer = threading.Thread(target=job.sequence.enter, args=("scatter",), name="checkpoint-writer")
    writer.start()
    writer.join()
    job.sequence.enter("all_reduce")
    for k in range(4):
        job.watcher.check(start + k * SECOND)
    (record,) = job.suspects()
    assert tuple(record.attributes[semconv.HANG_COLLECTIVE_THREADS]) == ("MainThread", "checkpoint-writer")
    assert (
        "#2 (all_reduce), with collectives in flight from threads MainThread, checkpoint-writer;"
        in record.body
    )
    job.sequence.complete("checkpoint-writer")
    assert job.sequence.threads_in_flight() == ("MainThread",)
    job.sequence.complete()
    assert job.sequence.threads_in_flight() == ()


def test_long_phases_before_the_first_iteration_and_after_the_loop_are_not_stalls(job: Job) -> None:
    with traintel.model_init():  # loading a model or compiling for minutes is normal
        start = time.time_ns()
        for k in range(1, 11):
            job.watcher.check(start + k * SECOND)
    with traintel.training_loop():
        with traintel.training_iteration(0):
            pass
    start = time.time_ns()  # the loop ended: the job no longer trains (idle)
    for k in range(1, 11):
        job.watcher.check(start + k * SECOND)
    assert job.records() == []


def test_a_rank_loading_the_next_batch_is_said_to_be_loading_it(job: Job) -> None:
    """Between iterations, in the loop's body, the next batch being loaded (timed without a span
    of its own, as the next iteration's first step): the rank is in `data_loading` since it
    began, as when that wait was a span."""
    heartbeat = Heartbeat(job.telemetry.engine, job.telemetry.open_spans, job.sequence, clock.time_ns)
    with traintel.training_loop():
        with traintel.training_iteration(0):
            pass
        loading = clock.time_ns()
        with traintel.data_loading():
            sample = heartbeat.sample()
        after = heartbeat.sample()
        with traintel.training_iteration(1):
            pass
    assert (sample.phase, after.phase) == ("data_loading", "training_loop")
    assert loading <= sample.progress_ns <= after.progress_ns


def test_a_writer_thread_s_open_stage_is_not_where_training_is(job: Job) -> None:
    """Between iterations the training thread is in an async save's blocking part while the
    writer of the save before it marks its `write` stage. Before: the phase open last, the
    writer's, was said to be the rank's (a hang there named `checkpoint_write`), and its start
    counted as the rank's progress."""
    heartbeat = Heartbeat(job.telemetry.engine, job.telemetry.open_spans, job.sequence, clock.time_ns)
    started, release = threading.Event(), threading.Event()
    writer_entered: list[int] = []

    def write() -> None:
        writer_entered.append(clock.time_ns())
        with traintel.checkpoint_stage("write"):
            started.set()
            release.wait(GUARD_S)

    with traintel.training_loop():
        with traintel.training_iteration(0):
            pass
        saving = clock.time_ns()
        with traintel.checkpoint_save(strategy="async"):
            writer = threading.Thread(target=write, name="writer")
            writer.start()
            assert started.wait(GUARD_S)
            sample = heartbeat.sample()
            release.set()
            writer.join(GUARD_S)
    assert sample.phase == "checkpoint_save_async"
    assert saving <= sample.progress_ns < writer_entered[0]


def test_a_writer_thread_s_stage_ending_is_not_the_rank_s_progress(job: Job) -> None:
    """The training thread waits between iterations (no phase) while a writer thread ends its
    `write` stage: before, that end was the rank's last progress, and a hang of the training
    thread there was seen that much later."""
    heartbeat = Heartbeat(job.telemetry.engine, job.telemetry.open_spans, job.sequence, clock.time_ns)
    with traintel.training_loop():
        with traintel.training_iteration(0):
            pass
        last_end = heartbeat.sample().progress_ns

        def write() -> None:
            with traintel.checkpoint_stage("write"):
                pass

        writer = threading.Thread(target=write, name="writer")
        writer.start()
        writer.join(GUARD_S)
        sample = heartbeat.sample()
        with traintel.training_iteration(1):
            pass
    assert sample.progress_ns == last_end


def test_a_watcher_kept_from_running_reports_the_held_gil_when_it_runs_again(job: Job) -> None:
    """Without the helper process (a process alone): the gap between two wakes is the time C
    code held the GIL; said when the watcher runs again, and recovered at the next progress."""
    start = time.time_ns()
    with traintel.training_loop():
        with traintel.training_iteration(0):
            pass
        with traintel.training_iteration(1):
            job.watcher.check(start + SECOND)
            job.watcher.check(start + 6 * SECOND)  # five seconds without a wake
            (record,) = job.suspects()
            assert record.attributes[semconv.HANG_PYTHON] == semconv.PYTHON_HOLDING_GIL
            assert record.attributes[semconv.HANG_STALLED_SECONDS] == 5.0
            job.watcher.check(start + 7 * SECOND)
            assert job.recovered() == []  # no progress yet
    job.watcher.check(start + 8 * SECOND)
    (recovered,) = job.recovered()
    assert recovered.attributes[semconv.HANG_STALLED_SECONDS] == 5.0
    assert recovered.attributes[semconv.HANG_PYTHON] == semconv.PYTHON_HOLDING_GIL


def test_a_wake_one_period_after_the_last_is_on_time_even_at_a_threshold_of_one_period(job: Job) -> None:
    """The watcher sleeps a wake period between two wakes: only the time past it is time it was
    kept from running. At a threshold of one period, every wake on time was taken for a held GIL."""
    job.watcher.threshold_s = stall.WAKE_S
    start = time.time_ns()
    with traintel.training_loop():
        with traintel.training_iteration(0):
            pass
        with traintel.training_iteration(1):
            for k in range(1, 4):
                job.watcher.check(start + k * SECOND)  # one period apart
            (record,) = job.suspects()
            assert record.attributes[semconv.HANG_PYTHON] != semconv.PYTHON_HOLDING_GIL
            assert record.attributes[semconv.HANG_STALLED_SECONDS] >= stall.WAKE_S


def test_a_stall_that_ends_with_the_loop_is_recovered_at_shutdown(job: Job) -> None:
    start = time.time_ns()
    with traintel.training_loop():
        with traintel.training_iteration(0):
            pass
        with traintel.training_iteration(1):
            for k in range(1, 5):
                job.watcher.check(start + k * SECOND)
            assert len(job.suspects()) == 1
    job.watcher.stop()  # the last look: the loop is over
    assert len(job.recovered()) == 1


@pytest.fixture
def wait(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """traintel's timeline on a counter: ``wait(seconds)`` is the only thing that moves it."""
    now = [time.monotonic_ns()]
    monkeypatch.setattr(clock, "_monotonic_ns", lambda: now[0])
    return lambda seconds: now.__setitem__(0, now[0] + round(seconds * SECOND))


def test_evaluation_iterations_are_progress(job: Job, wait: Callable[[float], None]) -> None:
    """A validation loop longer than the threshold, its iterations a second apart with the next
    batch loaded between two of them. Before, only a training iteration's end was progress:
    between two evaluation iterations the rank looked stuck since the loop began (1.0 s, 2.0 s,
    ... after its first ones), and a wake there reported a hang."""
    heartbeat = Heartbeat(job.telemetry.engine, job.telemetry.open_spans, job.sequence, clock.time_ns)
    since_progress = []
    with traintel.training_loop():
        with traintel.training_iteration(0):
            pass
        with traintel.validation_loop():
            for _ in range(2 * round(THRESHOLD)):
                wait(0.5)  # the next batch, loaded outside the iteration
                with traintel.validation_iteration():
                    wait(0.5)
                since_progress.append(heartbeat.sample().seconds_since_progress)
                job.watcher.check(clock.time_ns())
    assert since_progress == [0.0] * 2 * round(THRESHOLD)
    assert job.suspects() == []


def test_no_iteration_ends_unseen_by_the_heartbeat(
    job: Job, wait: Callable[[float], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iterations longer than the threshold, their steps shorter, seen by the heartbeat as they
    end. The training thread stamps an iteration's end and stops it being the running one in
    two steps, and the heartbeat reads the two: a sample that saw neither took the previous
    iteration's end for the rank's last progress (4.0 s ago: a hang for the watcher). Forced
    both ways: a sample taken between the training thread's two steps (as the running iteration
    is cleared), and the training thread's steps taken between the heartbeat's two reads."""
    engine, open_spans = job.telemetry.engine, job.telemetry.open_spans
    seen: list[float] = []

    class EndsTheIterationAsItIsRead:
        """The registry, but reading its last end first ends the iteration (once)."""

        end: Callable[[], None] | None = None

        @property
        def last_end_ns(self) -> int:
            end, self.end = self.end, None
            if end is not None:
                end()
            return open_spans.last_end_ns

        def spans(self) -> list[Any]:
            return open_spans.spans()

    registry = EndsTheIterationAsItIsRead()
    heartbeat = Heartbeat(engine, registry, job.sequence, clock.time_ns)

    class SampledAsTheIterationIsCleared(TrainingEngine):
        @property
        def active(self) -> Any:
            return self.__dict__["active"]

        @active.setter
        def active(self, record: Any) -> None:
            self.__dict__["active"] = record
            if record is None:
                seen.append(heartbeat.sample().seconds_since_progress)

    monkeypatch.setattr(engine, "__class__", SampledAsTheIterationIsCleared)
    traintel.set_training_config(export_first_iterations=0)  # steps timed on the fast path, no spans
    with traintel.training_loop():
        with traintel.training_iteration(0):
            pass
        for number in (1, 2):
            iteration = traintel.training_iteration(number)
            iteration.__enter__()
            for step in (traintel.model_forward, traintel.model_backward):
                with step():
                    wait(THRESHOLD * 2 / 3)
            if number == 1:
                iteration.__exit__(None, None, None)
            else:  # the heartbeat reads, the iteration ends, the heartbeat reads on
                registry.end = functools.partial(iteration.__exit__, None, None, None)
                seen.append(heartbeat.sample().seconds_since_progress)
    # as iterations 0, 1 and 2 (inside the heartbeat's read) were cleared, and that read
    assert seen == [0.0, 0.0, 0.0, 0.0]


def test_held_stack_reads_the_thread_of_a_faulthandler_dump(tmp_path: Path) -> None:
    lock = threading.Lock()
    lock.acquire()
    thread = threading.Thread(target=blocked_in_c, args=(lock,), daemon=True)
    thread.start()
    _until(lambda: "blocked_in_c" in str(held_stack(_dump(tmp_path), thread.ident or 0)), "the thread")
    stack, top = held_stack(_dump(tmp_path), thread.ident or 0)
    lock.release()
    thread.join(GUARD_S)
    assert top.startswith(f"blocked_in_c ({__file__}:")
    lines = stack.splitlines()
    assert lines[-2].startswith(f'  File "{__file__}", line ') and lines[-2].endswith(", in blocked_in_c")
    assert lines[-1] == "    lock.acquire()  # a C call that releases the GIL, as a collective or a read does"
    assert "threading.py" in lines[0]  # most recent call last, as Python prints a traceback
    assert held_stack(_dump(tmp_path), 12345) == ("", "")


def _dump(tmp_path: Path) -> str:
    path = tmp_path / "dump.txt"
    with open(path, "w") as fh:
        faulthandler.dump_traceback(fh, all_threads=True)
    return path.read_text()


def test_configure_starts_a_watcher_with_the_threshold_and_none_with_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINTEL_STALL_SECONDS", "12.5")
    telemetry = traintel.configure(span_exporters=[], metric_readers=[])
    assert telemetry.stall_watcher is not None and telemetry.stall_watcher.threshold_s == 12.5
    traintel.shutdown(1.0)
    monkeypatch.setenv("TRAINTEL_STALL_SECONDS", "0")
    assert traintel.configure(span_exporters=[], metric_readers=[]).stall_watcher is None
    traintel.shutdown(1.0)
    monkeypatch.setenv("TRAINTEL_STALL_SECONDS", "-1")
    with pytest.raises(ConfigurationError, match="TRAINTEL_STALL_SECONDS='-1'"):
        traintel.configure(span_exporters=[], metric_readers=[])
