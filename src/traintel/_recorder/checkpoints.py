"""Checkpoint phases: saves (their blocking part, and an async save's background half),
loads and marked stages, with the sizes and times the checkpoint metrics are made of."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from opentelemetry.trace import Link, Span, SpanContext, set_span_in_context
from opentelemetry.util.types import AttributeValue

from traintel import semconv
from traintel._recorder import active, clock
from traintel._recorder.engine import ResumePoint, TrainingEngine
from traintel._recorder.forwarding_span import ForwardingSpan
from traintel._recorder.phases import PhaseSpan, phase_attributes
from traintel._recorder.record import number
from traintel.semconv import Phase

_time_ns = clock.time_ns


def directory_size(path: str | os.PathLike[str]) -> int:
    """Bytes in a file, or in all files under a directory (checkpoints are often directories)."""
    root = Path(path)
    if root.is_file():
        return root.stat().st_size
    if not root.exists():
        raise FileNotFoundError(os.fspath(path))
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name), follow_symlinks=False).st_size
            except OSError:
                continue
    return total


class AsyncCheckpointCompletion:
    """The background half of an async save: call :meth:`finish` from the writer thread.

    It records a ``checkpoint_finalize`` span from the moment control returned to training
    until ``finish()``, parented to the training loop's current segment and linked to the
    ``checkpoint_save_async`` span (which carries the iteration it captured) and to the
    iteration that started the save: the enclosing iteration when the save ran inside one (that
    iteration is then exported), else the iteration just completed if it was exported. Its time
    is background time, not training time. Idempotent and thread-safe; never raises.
    """

    def __init__(
        self,
        save_context: SpanContext,
        iteration: int,
        parent: Span | None,
        iteration_context: SpanContext | None = None,
    ) -> None:
        self._save_context = save_context
        self._iteration_context = iteration_context
        self._iteration = iteration
        self._parent = parent
        self._start_ns = 0  # set by the save phase as it ends: when control returned to training
        #: The size the save's blocking part counted (given to ``checkpoint_save``), set as it
        #: ends: a checkpoint's bytes count once, where they are first known.
        self._counted_size: int | None = None
        #: The job's resume point before the save's blocking part, and the one it made: a write
        #: that fails takes its own back (unless a later save has made another since).
        self._resume_points: tuple[ResumePoint, ResumePoint] = (None, None)
        self._done = False
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self._done

    def finish(
        self,
        size_bytes: int | None = None,
        path: str | os.PathLike[str] | None = None,
        error: BaseException | None = None,
    ) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        engine = active.current_engine()
        if engine is None or engine.closed:
            return
        try:
            call = "AsyncCheckpointCompletion.finish"
            self._record(engine, _checked_size(engine, call, size_bytes), checked_path(call, path), error)
        except Exception:
            engine.warn_once("ckpt_finish", "could not record the async checkpoint completion")

    def _record(
        self,
        engine: TrainingEngine,
        size_bytes: int | None,
        path: str | os.PathLike[str] | None,
        error: BaseException | None,
    ) -> None:
        """The ``checkpoint_finalize`` span, from the save's end to now, and the totals. The
        size counts here unless the save counted it already (the bytes are one checkpoint's)."""
        end = _time_ns()
        start = self._start_ns or end
        new_bytes, written = self._sizes(engine, size_bytes, path)
        span = self._finalize_span(engine, start, new_bytes)
        seconds = (end - start) / 1e9
        totals = engine.checkpoint_background_done(seconds, new_bytes, failed=error is not None)
        if written is not None and end > start:
            totals[semconv.CHECKPOINT_BYTES_PER_SECOND] = written / seconds
        before, made = self._resume_points
        if error is None:
            span.add_event(
                semconv.Event.SAVE_CHECKPOINT_SUCCESS.value, {semconv.CHECKPOINT_ITERATION: self._iteration}
            )
        else:
            engine.checkpoint_unwritten(made, before)
        span.add_event(semconv.Event.CHECKPOINT_METRICS_UPDATE.value, totals)
        engine.end_span(span, error, end)

    def _sizes(
        self, engine: TrainingEngine, size_bytes: int | None, path: str | os.PathLike[str] | None
    ) -> tuple[int | None, int | None]:
        """The bytes this completion counts (none where the save counted them), and the
        checkpoint's size (given here, measured at ``path``, else the save's)."""
        counted = self._counted_size
        if size_bytes is None and path is not None and counted is None:
            size_bytes = _measured_size(engine, path)
        return (size_bytes if counted is None else None), (counted if size_bytes is None else size_bytes)

    def _finalize_span(self, engine: TrainingEngine, start: int, size_bytes: int | None) -> Span:
        """Under the training loop (else the save's), linked to the save and its iteration."""
        attributes: dict[str, AttributeValue] = {
            semconv.PHASE: Phase.CHECKPOINT_FINALIZE.value,
            semconv.CHECKPOINT_STRATEGY: "async",
            semconv.CHECKPOINT_ITERATION: self._iteration,
        }
        if size_bytes is not None:
            attributes[semconv.CHECKPOINT_SIZE] = size_bytes
        parent = engine.loop if engine.loop is not None else self._parent
        links = [
            Link(c) for c in (self._save_context, self._iteration_context) if c is not None and c.is_valid
        ]
        return engine.tracer.start_span(
            Phase.CHECKPOINT_FINALIZE.value,
            context=set_span_in_context(parent) if parent is not None else None,
            attributes=engine.thread_attributes(attributes),
            links=links,
            start_time=start,
        )


class CheckpointSavePhase(PhaseSpan):
    def __init__(
        self,
        strategy: str,
        iteration: int | None,
        size_bytes: int | None,
        path: str | os.PathLike[str] | None,
        attributes: Mapping[str, AttributeValue] | None,
    ) -> None:
        phase = semconv.CHECKPOINT_SAVE_PHASE_OF.get(strategy, Phase.CHECKPOINT_SAVE_SYNC)
        extra: dict[str, AttributeValue | None] = {
            semconv.CHECKPOINT_STRATEGY: strategy,
            semconv.CHECKPOINT_SIZE: size_bytes,
            semconv.CHECKPOINT_PATH: checked_path("checkpoint_save", path),
        }
        extra.update(attributes or {})
        super().__init__(phase.value, phase_attributes(phase, extra))
        self._strategy = strategy
        self._iteration = iteration
        self._size_bytes = size_bytes
        self._path = path if extra[semconv.CHECKPOINT_PATH] is not None else None
        self._completion: AsyncCheckpointCompletion | None = None

    def _start_attributes(self, engine: TrainingEngine) -> Mapping[str, AttributeValue] | None:
        attributes = dict(self._attributes or {})
        if self._iteration is None:
            self._iteration = engine.next_train_iteration
        attributes[semconv.CHECKPOINT_ITERATION] = self._iteration
        return attributes

    def __enter__(self) -> CheckpointSaveSpan:
        return CheckpointSaveSpan(super().__enter__(), self)

    def completion(self) -> AsyncCheckpointCompletion:
        """The handle the background writer finishes (async saves); call inside the ``with``."""
        if self._completion is None:
            span = self._span
            engine = active.current_engine()
            parent = engine.loop if engine is not None else None
            started_by = engine.iteration_starting_checkpoint() if engine is not None else None
            self._completion = AsyncCheckpointCompletion(
                span.get_span_context(),
                self._iteration if self._iteration is not None else 0,
                parent,
                started_by,
            )
        return self._completion

    def _before_end(self, engine: TrainingEngine, span: Span, exc: BaseException | None, end_ns: int) -> None:
        size = self._size_bytes
        if self._completion is not None:
            self._completion._start_ns = end_ns
            self._completion._counted_size = size if span.is_recording() else None
        if size is None and self._path is not None and exc is None and self._completion is None:
            # (an async save's writer has not written the file yet: its finish measures it)
            size = _measured_size(engine, self._path)
        if not span.is_recording():
            return
        if size is not None:
            span.set_attribute(semconv.CHECKPOINT_SIZE, size)
        if exc is None:
            self._success_event(span)
        duration = (end_ns - self._start_ns) / 1e9
        before = engine.last_checkpoint
        attributes = engine.checkpoint_saved(
            duration, size, self._strategy, span, self._iteration, failed=exc is not None
        )
        if self._completion is not None:
            self._completion._resume_points = (before, engine.last_checkpoint)
        rate = attributes.get(semconv.CHECKPOINT_BYTES_PER_SECOND)
        if rate is not None:
            span.set_attribute(semconv.CHECKPOINT_BYTES_PER_SECOND, rate)

    def _success_event(self, span: Span) -> None:
        """Once: on_save_checkpoint_success() may have added it already (with its own attributes)."""
        success = semconv.Event.SAVE_CHECKPOINT_SUCCESS.value
        if not any(e.name == success for e in getattr(span, "events", ())):
            span.add_event(success, {semconv.CHECKPOINT_ITERATION: self._iteration or 0})


class CheckpointSaveSpan(ForwardingSpan):
    """What ``with checkpoint_save(...) as save`` binds: the save's span, with the save's
    :meth:`completion` (``save.completion()`` is the natural spelling; a bare span raised
    AttributeError into the training code)."""

    def __init__(self, span: Span, phase: CheckpointSavePhase) -> None:
        super().__init__(span)
        self._phase = phase

    def completion(self) -> AsyncCheckpointCompletion:
        """See :meth:`CheckpointSavePhase.completion`."""
        return self._phase.completion()


def _checked_size(engine: TrainingEngine, call: str, size_bytes: object) -> int | None:
    """A size given as a finite non-negative number, as an int; else None, said once naming the
    call and the value (-5 made a negative bytes per second; a string lost the completion)."""
    size = number(size_bytes) if size_bytes is not None else None
    if size is None and size_bytes is not None:
        why = "%s(size_bytes=%r): expected a finite non-negative number; recording no size"
        engine.warn_once("bad_size:" + call, why, call, size_bytes)
    return None if size is None else int(size)


def _measured_size(engine: TrainingEngine, path: str | os.PathLike[str]) -> int | None:
    try:
        return directory_size(path)
    except OSError:
        engine.warn_once("ckpt_size", "could not measure checkpoint size at %s", os.fspath(path))
        return None


class CheckpointLoadPhase(PhaseSpan):
    def _before_end(self, engine: TrainingEngine, span: Span, exc: BaseException | None, end_ns: int) -> None:
        if span.is_recording():
            engine.checkpoint_loaded((end_ns - self._start_ns) / 1e9, end_ns, failed=exc is not None)


class CheckpointStagePhase(PhaseSpan):
    def __init__(self, stage: str, attributes: Mapping[str, AttributeValue] | None) -> None:
        phase = semconv.CHECKPOINT_STAGES[stage]
        super().__init__(
            phase.value, phase_attributes(phase, {semconv.CHECKPOINT_STAGE: stage, **(attributes or {})})
        )
        self._stage = stage

    def _before_end(self, engine: TrainingEngine, span: Span, exc: BaseException | None, end_ns: int) -> None:
        if span.is_recording():
            engine.checkpoint_stage_done(self._stage, (end_ns - self._start_ns) / 1e9)


def checked_strategy(strategy: object) -> str:
    """``strategy`` if it is one traintel knows; else "sync", said once."""
    if strategy in ("sync", "async"):
        return str(strategy)
    engine = active.current_engine()
    if engine is not None:
        engine.warn_once(
            "bad_strategy",
            "checkpoint_save(strategy=%r): expected 'sync' or 'async'; recording it as 'sync'",
            strategy,
        )
    return "sync"


def checked_path(call: str, path: object) -> str | None:
    """``path`` as a string (a ``str`` or ``os.PathLike``); ``None`` for none, and for anything
    else, said once naming the call and the value (``os.fspath`` would raise into the
    training code that opened the phase)."""
    try:
        return os.fspath(path) if path is not None else None  # type: ignore[call-overload]
    except TypeError:
        engine = active.current_engine()
        if engine is not None:
            why = "%s(path=%r): expected a str or os.PathLike; recording no path"
            engine.warn_once("bad_path:" + call, why, call, path)
        return None
