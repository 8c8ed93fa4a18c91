"""An exception a signal handler raises while traintel's own code runs is the job's, not a
telemetry failure: traintel's guards raise it on instead of containing it.

The case that matters: ``kill -TERM`` to a job's process group kills its DataLoader workers,
and torch's SIGCHLD handler raises "DataLoader worker ... killed by signal" wherever the main
thread stands, often inside a phase's exit. Contained there, the job went on as if nothing had
happened and exited 0 where it exits 1 without traintel. Here a real handler for SIGUSR1
raises from inside the iteration's end bookkeeping, deterministically.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import traintel
from tests.conftest import Pipeline
from traintel import semconv
from traintel._host.device import DeviceHooks
from traintel._host.signal_raised import raised_by_signal_handler
from traintel._runtime import state


class WorkerKilled(RuntimeError):
    pass


def _raising_handler(signum: int, frame: object) -> None:
    raise WorkerKilled("DataLoader worker (pid 1234) is killed by signal: Terminated.")


@pytest.fixture
def usr1_raises() -> Iterator[None]:
    previous = signal.signal(signal.SIGUSR1, _raising_handler)
    yield
    signal.signal(signal.SIGUSR1, previous)


def _inside_iteration_end(at: int, action: Callable[[], None]) -> None:
    """Run ``action`` inside traintel's bookkeeping of iteration ``at``'s end."""
    telemetry = state.configured()
    assert telemetry is not None and telemetry.engine is not None
    engine: Any = telemetry.engine
    add_row = engine._completed

    def add_row_then(record: Any, duration_ns: int, end_ns: int) -> None:
        add_row(record, duration_ns, end_ns)
        if record.iteration == at:
            action()

    engine._completed = add_row_then


def _train(iterations: range, done: list[int]) -> None:
    with traintel.training_loop():
        for n in iterations:
            with traintel.training_iteration(n, samples=8):
                with traintel.model_forward():
                    pass
            done.append(n)


def test_a_signal_handlers_exception_inside_traintels_code_reaches_the_job(
    pipeline: Pipeline, usr1_raises: None, caplog: pytest.LogCaptureFixture
) -> None:
    _inside_iteration_end(3, lambda: signal.raise_signal(signal.SIGUSR1))
    done: list[int] = []
    with caplog.at_level(logging.WARNING), traintel.application():
        with pytest.raises(WorkerKilled, match="DataLoader worker"):
            _train(range(6), done)
        assert done == [0, 1, 2]  # raised out of iteration 3, as without traintel
        _train(range(10, 13), done)  # a job that catches it and goes on is recorded as before
    assert "could not end phase" not in caplog.text  # not contained as a telemetry failure
    failed, resumed = sorted(pipeline.by_name("training_loop"), key=lambda span: span.start_time or 0)
    assert failed.status.status_code is StatusCode.ERROR
    assert "DataLoader worker" in (failed.status.description or "")
    assert resumed.status.status_code is StatusCode.UNSET
    iterations = {
        (span.attributes or {})[semconv.ITERATION] for span in pipeline.by_name("training_iteration")
    }
    assert {0, 1, 2, 10, 11, 12} <= iterations


def test_a_failure_of_traintels_own_code_is_still_contained(
    pipeline: Pipeline, usr1_raises: None, caplog: pytest.LogCaptureFixture
) -> None:
    def fail() -> None:
        raise RuntimeError("a bug in telemetry")

    _inside_iteration_end(3, fail)
    done: list[int] = []
    with caplog.at_level(logging.WARNING), traintel.application():
        _train(range(6), done)
    assert done == list(range(6))
    assert caplog.text.count("could not end phase 'training_iteration' (reported once)") == 1
    (loop,) = pipeline.by_name("training_loop")
    assert loop.status.status_code is StatusCode.UNSET


class DeviceLoss:
    """A tensor whose ``.item()`` waits for the device, as a CUDA loss does: the workers die
    meanwhile."""

    def item(self) -> float:
        signal.raise_signal(signal.SIGUSR1)
        return 0.5


def test_a_signal_handlers_exception_while_record_metrics_reads_a_tensor_reaches_the_job(
    pipeline: Pipeline, usr1_raises: None
) -> None:
    with traintel.application(), traintel.training_loop():
        with traintel.training_iteration(0):
            traintel.record_metrics(loss=0.25)
            with pytest.raises(WorkerKilled):
                traintel.record_metrics(loss=DeviceLoss())
    (iteration,) = pipeline.by_name("training_iteration")
    assert (iteration.attributes or {})[semconv.METRIC_PREFIX + "loss"] == 0.25


class SyncingTimer:
    """A device timer whose event records wait on the device: a signal lands in them."""

    def __init__(self, fails: Callable[[], None]) -> None:
        self.fails = fails

    def started(self, phase: str) -> None:
        self.fails()

    def ended(self, phase: str) -> None:
        self.fails()


@pytest.mark.parametrize("where", ["started", "ended"])
def test_device_hooks_raise_a_signal_handlers_exception_and_contain_their_own(
    usr1_raises: None, where: str
) -> None:
    hooks = DeviceHooks(SyncingTimer(lambda: signal.raise_signal(signal.SIGUSR1)), None)  # type: ignore[arg-type]
    call = hooks.started if where == "started" else hooks.ended
    with pytest.raises(WorkerKilled):
        call("model_forward")

    def bug() -> None:
        raise RuntimeError("a bug in telemetry")

    failing = DeviceHooks(SyncingTimer(bug), None)  # type: ignore[arg-type]
    (failing.started if where == "started" else failing.ended)("model_forward")  # contained


def test_a_phase_whose_end_a_signal_handlers_exception_interrupts_still_ends(
    pipeline: Pipeline, usr1_raises: None
) -> None:
    """Raised in the device hook at a checkpoint save's end: the save's span is still ended
    and exported, and the exception reaches the job."""
    telemetry = state.configured()
    assert telemetry is not None and telemetry.engine is not None

    class SaveEndRaises(SyncingTimer):
        def started(self, phase: str) -> None:
            pass

        def ended(self, phase: str) -> None:
            if phase == "checkpoint_save_sync":
                self.fails()

    hooks = DeviceHooks(SaveEndRaises(lambda: signal.raise_signal(signal.SIGUSR1)), None)  # type: ignore[arg-type]
    telemetry.engine.set_device(hooks)
    outside = trace.get_current_span()
    with pytest.raises(WorkerKilled), traintel.application(), traintel.checkpoint_save(iteration=7):
        pass
    assert trace.get_current_span() is outside  # the context is back where it was
    (save,) = pipeline.by_name("checkpoint_save_sync")
    assert (
        save.end_time is not None and save.status.status_code is StatusCode.UNSET
    )  # the save itself went well
    (app,) = pipeline.by_name("application")
    assert app.status.status_code is StatusCode.ERROR


def test_what_the_users_own_code_caught_is_left_to_it(usr1_raises: None) -> None:
    """Handled in the user's ``except`` block (which may call traintel), the handler's
    exception is theirs: a warning traintel says there does not raise it again."""
    try:
        signal.raise_signal(signal.SIGUSR1)
    except WorkerKilled as caught:
        assert not raised_by_signal_handler(caught)
        state.Warnings().warn_once("test", "said inside the user's handler")
    else:
        raise AssertionError("the handler did not raise")
