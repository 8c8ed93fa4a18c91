"""Misuse and user exceptions: never an exception into user code, one warning per kind."""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import traintel
from tests.conftest import Pipeline, parent_name
from traintel import callbacks, semconv


class Boom(RuntimeError):
    pass


def test_user_exception_marks_error_and_propagates_unchanged(pipeline: Pipeline) -> None:
    original = Boom("bad batch")
    with pytest.raises(Boom) as caught, traintel.training_loop(), traintel.training_iteration():
        with traintel.model_forward():
            raise original
    assert caught.value is original
    # the traceback still points at the raise inside the user's block
    frames = []
    tb = caught.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert frames[-1] == "test_user_exception_marks_error_and_propagates_unchanged"
    for name in ("model_forward", "training_iteration", "training_loop"):
        span = pipeline.one(name)
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "Boom: bad batch"
        assert span.events[-1].name == "exception"
        assert span.events[-1].attributes["exception.type"] == f"{Boom.__module__}.Boom"  # type: ignore[index]


def test_decorated_function_exception_propagates(pipeline: Pipeline) -> None:
    @traintel.validation_loop()
    def evaluate() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        evaluate()
    assert pipeline.one("validation_loop").status.status_code is StatusCode.ERROR


def test_clean_system_exit_is_not_an_error(pipeline: Pipeline) -> None:
    with pytest.raises(SystemExit), traintel.application():
        sys.exit(0)
    assert pipeline.one("application").status.status_code is StatusCode.UNSET


def test_iteration_outside_loop_warns_once_and_still_records(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="traintel"):
        for _ in range(5):
            with traintel.training_iteration():
                pass
    warnings = [r for r in caplog.records if "outside any training_loop" in r.getMessage()]
    assert len(warnings) == 1
    assert len(pipeline.by_name("training_iteration")) == 5


def test_iterations_outside_any_loop_close_their_last_window_at_shutdown(pipeline: Pipeline) -> None:
    """A loop closes its last window as it ends; iterations run outside any training_loop had
    nothing to close theirs: a run shorter than a window (the default's first 30 s) left no
    window record at all, and a longer one lost its last window. Shutdown closes it."""
    for samples in (4, 4, 4, 4, 4, 4, 8):
        with traintel.training_iteration(samples=samples):
            pass
    assert pipeline.by_name("training_window") == []  # still open: no window closed yet
    traintel.shutdown(1.0)
    (record,) = [s.attributes or {} for s in pipeline.by_name("training_window")]
    assert record[semconv.WINDOW_PREFIX + "iterations"] == 7
    assert (
        record[semconv.WINDOW_PREFIX + "first_iteration"],
        record[semconv.WINDOW_PREFIX + "last_iteration"],
    ) == (0, 6)


def test_callback_double_start_is_idempotent(pipeline: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="traintel"):
        first = callbacks.on_train_start()
        second = callbacks.on_train_start()
        callbacks.on_train_start()
        callbacks.on_train_end()
    assert first is second
    assert len(pipeline.by_name("training_loop")) == 1
    assert sum("fired twice" in r.getMessage() for r in caplog.records) == 1


def test_end_without_start_and_double_end(pipeline: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="traintel"):
        callbacks.on_validation_end()
        callbacks.on_app_start()
        callbacks.on_app_end()
        callbacks.on_app_end()
        callbacks.on_app_end()
        callbacks.on_save_checkpoint_success(global_step=3)
    assert len(pipeline.by_name("application")) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'validation_loop' without a matching start" in m for m in messages) == 1
    assert sum("'application' without a matching start" in m for m in messages) == 1
    assert sum("on_save_checkpoint_success without an open save" in m for m in messages) == 1


def test_wrong_nesting_closes_children_in_order(pipeline: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="traintel"):
        callbacks.on_app_start()
        callbacks.on_train_start()
        callbacks.on_training_single_iteration_start()
        callbacks.on_model_forward_start()
        callbacks.on_app_end()  # everything else still open
    spans = [s for s in pipeline.spans() if s.name != "training_window"]
    assert [s.name for s in spans] == ["model_forward", "training_iteration", "training_loop", "application"]
    for span in spans[1:-1]:
        assert span.attributes[semconv.END_REASON] == "parent application ended first"  # type: ignore[index]
    assert parent_name(pipeline.one("model_forward"), spans) == "training_iteration"
    assert parent_name(pipeline.one("training_iteration"), spans) == "training_loop"
    assert sum("still open" in r.getMessage() for r in caplog.records) == 1
    # the context is back to empty: a new span is a root
    callbacks.on_app_start()
    callbacks.on_app_end()
    assert pipeline.by_name("application")[1].parent is None


def test_callbacks_from_another_thread(pipeline: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    callbacks.on_app_start()
    callbacks.on_train_start()

    def end_elsewhere() -> None:
        callbacks.on_train_end()

    with caplog.at_level(logging.WARNING, logger="traintel"):
        thread = threading.Thread(target=end_elsewhere)
        thread.start()
        thread.join()
    callbacks.on_app_end()
    spans = pipeline.spans()
    assert [s.name for s in spans] == ["training_loop", "application"]
    assert parent_name(spans[0], spans) == "application"
    assert sum("different threads" in r.getMessage() for r in caplog.records) == 1


def test_callbacks_explicit_times_are_exact(pipeline: Pipeline) -> None:
    callbacks.on_app_start(start_time_msec=1_700_000_000_000.0)
    callbacks.on_model_init_start(start_time_msec=1_700_000_000_250.5)
    callbacks.on_model_init_end(finish_time_msec=1_700_000_001_000.0)
    callbacks.on_app_end(finish_time_msec=1_700_000_002_000.0)
    model_init = pipeline.one("model_init")
    assert model_init.start_time == 1_700_000_000_250_500_000
    assert model_init.end_time == 1_700_000_001_000_000_000
    assert pipeline.one("application").start_time == 1_700_000_000_000_000_000


def test_bad_arguments_never_raise(pipeline: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="traintel"):
        with traintel.training_loop(), traintel.training_iteration():
            traintel.record_metrics(loss=float("nan"), note="text", nested={"a": 1})
        with traintel.checkpoint_save(strategy="sometimes"):  # type: ignore[arg-type]
            pass
        with traintel.checkpoint_save(path="/nonexistent/ckpt"):
            pass
    iteration = pipeline.one("training_iteration")
    loss = iteration.attributes[semconv.METRIC_PREFIX + "loss"]  # type: ignore[index]
    assert math.isnan(loss)  # type: ignore[arg-type]  # NaN kept: a NaN loss is what the user needs to see
    assert semconv.METRIC_PREFIX + "note" not in iteration.attributes  # type: ignore[operator]
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "record_metrics(note='str'): not a number" in messages
    assert "checkpoint_save(strategy='sometimes')" in messages
    assert len(pipeline.by_name("checkpoint_save_sync")) == 2


def test_record_metrics_outside_any_loop_goes_on_the_application_else_is_ignored(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """A final test accuracy recorded after the loops, inside the application, was ignored."""
    with caplog.at_level(logging.WARNING, logger="traintel"):
        traintel.record_metrics(loss=1.0)
        with traintel.application():
            with traintel.validation_loop():
                traintel.record_metrics(val_loss=0.5)
            traintel.record_metrics(final_acc=0.99)
    assert pipeline.one("validation_loop").attributes[semconv.METRIC_PREFIX + "val_loss"] == 0.5  # type: ignore[index]
    assert pipeline.one("application").attributes[semconv.METRIC_PREFIX + "final_acc"] == 0.99  # type: ignore[index]
    outside = "outside any application, loop or iteration; ignored"
    assert sum(outside in r.getMessage() for r in caplog.records) == 1


def test_record_metrics_converts_tensors(pipeline: Pipeline) -> None:
    torch = pytest.importorskip("torch")
    with traintel.training_loop(), traintel.training_iteration():
        traintel.record_metrics({"loss": torch.tensor(0.25)}, grad_norm=torch.tensor(3))
    attributes = pipeline.one("training_iteration").attributes
    assert attributes[semconv.METRIC_PREFIX + "loss"] == 0.25  # type: ignore[index]
    assert attributes[semconv.METRIC_PREFIX + "grad_norm"] == 3  # type: ignore[index]


def test_a_step_phase_object_exited_twice_or_nested_in_itself_raises_nothing() -> None:
    """A step object entered on the fast path and exited again, or nested in itself, never
    raises into the training loop."""
    traintel.configure(span_exporters=[InMemorySpanExporter()], metric_readers=[])
    try:
        forward = traintel.model_forward()
        with traintel.training_loop(), traintel.training_iteration():
            with forward:
                with forward:
                    pass
            backward = traintel.model_backward()
            backward.__enter__()
            backward.__exit__(None, None, None)
            backward.__exit__(None, None, None)
    finally:
        traintel.shutdown(2)


@pytest.mark.parametrize("call", ["checkpoint_save", "checkpoint_load"])
def test_a_checkpoint_path_that_is_no_path_is_said_never_raised(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture, call: str
) -> None:
    """``path=step`` (an int) raised TypeError from ``os.fspath`` into the training code; the
    phase is recorded without a path instead, said once naming the call and the value."""
    phase = getattr(traintel, call)
    with caplog.at_level(logging.WARNING, logger="traintel"):
        for _ in range(2):
            with phase(path=1000):
                pass
    spans = pipeline.by_name("checkpoint_save_sync" if call == "checkpoint_save" else call)
    assert len(spans) == 2
    assert all(semconv.CHECKPOINT_PATH not in (span.attributes or {}) for span in spans)
    said = [r.getMessage() for r in caplog.records]
    assert sum(f"{call}(path=1000): expected a str or os.PathLike" in m for m in said) == 1


def test_an_iteration_number_that_is_no_count_is_said_and_numbered_from_the_loop(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """``iteration="7"`` lost the whole iteration ("could not start phase"), ``-5`` and ``3.5``
    were kept as the iteration's and the window's numbers; each is now numbered from the
    loop's running count, said once naming the call and the value."""
    with (
        caplog.at_level(logging.WARNING, logger="traintel"),
        traintel.training_loop(train_iterations_start=0),
    ):
        for given in ("7", -5, 3.5, None):
            with traintel.training_iteration(iteration=given):  # type: ignore[arg-type]
                pass
        with traintel.validation_loop(), traintel.validation_iteration(iteration=-1):
            pass
        with traintel.checkpoint_save(iteration="x"):  # type: ignore[arg-type]
            pass
    numbers = [(s.attributes or {})[semconv.ITERATION] for s in pipeline.by_name("training_iteration")]
    assert numbers == [0, 1, 2, 3]
    assert [(s.attributes or {})[semconv.ITERATION] for s in pipeline.by_name("validation_iteration")] == [0]
    said = [r.getMessage() for r in caplog.records]
    assert sum("training_iteration(iteration='7'): expected a non-negative int" in m for m in said) == 1
    assert sum("validation_iteration(iteration=-1): expected a non-negative int" in m for m in said) == 1
    assert not any("could not start" in m for m in said)
    save = pipeline.one("checkpoint_save_sync").attributes or {}
    assert save[semconv.CHECKPOINT_ITERATION] == 4  # the iterations completed, as when none is given


def test_a_negative_or_nan_checkpoint_size_is_said_and_left_out(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """``size_bytes=-5`` gave the save a negative size and bytes per second (NaN gave NaN);
    the size is left out (measured from ``path`` where given), said once naming the value."""
    with caplog.at_level(logging.WARNING, logger="traintel"), traintel.training_loop():
        for size in (-5, math.nan, 4096):
            with traintel.checkpoint_save(size_bytes=size):  # type: ignore[arg-type]
                pass
    saves = [s.attributes or {} for s in pipeline.by_name("checkpoint_save_sync")]
    assert [save.get(semconv.CHECKPOINT_SIZE) for save in saves] == [None, None, 4096]
    said = [r.getMessage() for r in caplog.records]
    assert (
        sum("checkpoint_save(size_bytes=-5): expected a finite non-negative number" in m for m in said) == 1
    )


def test_a_span_name_that_is_no_str_is_kept_as_its_text_and_said(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """``timed_span(123)`` lost its span where it ended (the SDK refuses the name) with only
    "could not end a span"; it is recorded as ``"123"``, said once naming the call and the value."""
    with caplog.at_level(logging.WARNING, logger="traintel"):
        for name in (123, 123, "mine"):
            with traintel.timed_span(name, attributes={"k": 1}):  # type: ignore[arg-type]
                pass
    assert [span.name for span in pipeline.spans()] == ["123", "123", "mine"]
    assert all((span.attributes or {}).get("k") == 1 for span in pipeline.spans())
    said = [r.getMessage() for r in caplog.records]
    assert sum("timed_span(name=123): expected a str; the span is named '123'" in m for m in said) == 1
    assert not any("could not" in m for m in said)


class _CountedTensor:
    """A one-element tensor's face, counting the reads of its value (on a CUDA tensor each
    ``.item()`` waits for the device)."""

    def __init__(self, value: float) -> None:
        self.value, self.items = value, 0

    def numel(self) -> int:
        return 1

    def item(self) -> float:
        self.items += 1
        return self.value


def test_an_iteration_s_counts_given_as_tensors_are_read_once(pipeline: Pipeline) -> None:
    """``training_iteration(samples=tensor)`` read the tensor's value twice (a check, then the
    number), a second device synchronisation per step; a bad one is still left out."""
    samples, tokens = _CountedTensor(32.0), _CountedTensor(-1.0)
    with traintel.training_loop(), traintel.training_iteration(samples=samples, tokens=tokens) as span:  # type: ignore[arg-type]
        span.set_attribute("exported", True)
    assert (samples.items, tokens.items) == (1, 1)


def test_an_async_completion_given_a_bad_size_or_path_is_recorded_without_it(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """``finish(size_bytes=-5)`` gave a negative size and bytes per second; ``"4096"`` or
    ``path=1000`` lost the whole completion ("could not record"). The completion is recorded
    without them, each said once naming the value."""
    with caplog.at_level(logging.WARNING, logger="traintel"), traintel.training_loop():
        for size, path in ((-5, None), ("4096", None), (None, 1000), (2048, None)):
            save = traintel.checkpoint_save(strategy="async")
            with save:
                completion = save.completion()
            completion.finish(size_bytes=size, path=path)  # type: ignore[arg-type]
    finalizes = pipeline.by_name("checkpoint_finalize")
    assert [(s.attributes or {}).get(semconv.CHECKPOINT_SIZE) for s in finalizes] == [None, None, None, 2048]
    totals = [dict(s.events[-1].attributes or {}) for s in finalizes]
    assert [t.get(semconv.CHECKPOINT_PREFIX + "bytes.total") for t in totals] == [None, None, None, 2048]
    said = [r.getMessage() for r in caplog.records]
    for expected in (
        "AsyncCheckpointCompletion.finish(size_bytes=-5): expected a finite non-negative number",
        "AsyncCheckpointCompletion.finish(path=1000): expected a str or os.PathLike",
    ):
        assert sum(expected in m for m in said) == 1
    assert not any("could not record" in m for m in said)


def test_phases_open_at_an_explicit_shutdown_end_with_it_and_are_exported(
    owned: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``traintel.shutdown()`` inside the application (a ``finally`` in ``main``, say): the
    application span, the job's goodput on it, ended after its job had released the exporters,
    and was lost; a loop open there lost its summary. Now the phases still open end at the
    shutdown, innermost first, with its reason, and their ``with`` blocks then only put the
    context back: no span is ended twice."""
    job = owned()
    with traintel.application():
        with traintel.training_loop(train_iterations_start=0):
            for _ in range(3):
                with traintel.training_iteration(samples=2):
                    pass
            with traintel.checkpoint_save(iteration=2):
                traintel.shutdown(5)
                shut_down = time.time_ns()
            assert trace.get_current_span().name == "training_loop"  # the context is the user's
    assert not trace.get_current_span().get_span_context().is_valid
    spans = {s.name: s for s in job.exporter.get_finished_spans()}
    ended = ["checkpoint_save_sync", "training_loop", "application"]
    for name in ended:
        assert spans[name].attributes[semconv.END_REASON] == "telemetry shutdown"
        assert spans[name].status.status_code is StatusCode.UNSET
        assert spans[name].end_time <= shut_down
    assert [spans[n].end_time for n in ended] == sorted(spans[n].end_time for n in ended)  # innermost first
    assert spans["training_loop"].attributes[semconv.SUMMARY_PREFIX + "iterations"] == 3
    save = spans["checkpoint_save_sync"]  # the job's goodput, on its application span
    booked = spans["application"].attributes["ml.training.badput.checkpoint_save_time"]
    assert booked == pytest.approx((save.end_time - save.start_time) / 1e9, rel=1e-12)
    assert parent_name(spans["training_loop"], list(spans.values())) == "application"
    assert "ended span" not in caplog.text  # the SDK's "Calling end() on an ended span"


def test_an_iteration_the_shutdown_is_called_in_is_counted_and_its_context_goes_back(owned: Any) -> None:
    """An early stop inside the step (``if done: traintel.shutdown()``): that iteration was not
    counted (2 of 3 in the loop's summary and its window) and its ``with`` left its own context
    attached. It now ends at the shutdown, counted, as the loop around it does."""
    job = owned(export_iterations="none")
    with traintel.application(), traintel.training_loop(train_iterations_start=0):
        for step in range(3):
            with traintel.training_iteration(samples=2):
                if step == 2:
                    with traintel.model_forward():
                        traintel.shutdown(5)
            assert trace.get_current_span().name == "training_loop"  # the context is the user's
    spans = {s.name: s for s in job.exporter.get_finished_spans()}  # (job.spans() would flush a new job)
    assert spans["training_loop"].attributes[semconv.SUMMARY_PREFIX + "iterations"] == 3
    (window,) = [e.attributes for e in spans["training_loop"].events if e.name == "training_metrics_update"]
    assert window[semconv.WINDOW_PREFIX + "samples"] == 6


def test_the_batch_itself_given_as_a_count_is_named_by_its_shape(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """``training_iteration(samples=batch)``: the warning printed the whole batch (torch's
    repr, one line per row, 1,000 values before it elides); it names its type and shape."""
    torch = pytest.importorskip("torch")
    with traintel.training_loop(), traintel.training_iteration(samples=torch.zeros(64, 2048)):  # type: ignore[arg-type]
        traintel.record_batch(tokens=torch.zeros(3, 100))  # type: ignore[arg-type]
    said = [r.getMessage() for r in caplog.records if "expected a finite" in r.getMessage()]
    assert said == [
        "traintel: training_iteration(samples=<Tensor of shape (64, 2048)>): expected a finite "
        "non-negative number (a count such as len(batch)); ignored (reported once)",
        "traintel: record_batch(tokens=<Tensor of shape (3, 100)>): expected a finite "
        "non-negative number (a count such as len(batch)); ignored (reported once)",
    ]
