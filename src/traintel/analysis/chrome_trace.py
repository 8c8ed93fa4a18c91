"""Chrome trace event format (Perfetto, chrome://tracing) from a run's files.

Why this format: it opens without a backend, and one file holds every rank side by side.
Each process (a rank of a job) is a track group; phases are complete events ("X"), which the
viewers require to nest on a track (Perfetto drops a slice that overlaps another without
nesting in it). So the training thread's phases, which nest by construction, have a track;
what overlaps them has its own: the windows (a window runs across the loop's segments), each
thread that ran phases beside training (an async writer's stages, named by the span's
``thread.name``), and async saves' background halves, in as many lanes as overlap (saves queued
behind one writer). Times are whole microseconds, each end rounded down as its start is: a
fraction at today's epoch times is not exact in a double, and rounding start and length apart
let a child end past its parent. Span events are instant events. Written while reading: memory
does not grow with the input (but for one end time per background lane).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import IO, Any

from traintel import semconv
from traintel.analysis.report import json_number, process_identity
from traintel.analysis.run_info import run_key
from traintel.exporters.reader import ReadStats, SpanRecord, expand_paths, gc_paused, iter_records
from traintel.semconv import Phase

_TRAINING = 1


def _scalar_args(attributes: dict[str, Any]) -> dict[str, Any]:
    """Scalars only, a non-finite float as text: a diverged loss written as ``NaN`` is not JSON,
    and the viewers refuse the whole file for it."""
    return {
        k: json_number(v) if isinstance(v, float) else v
        for k, v in attributes.items()
        if isinstance(v, str | int | float | bool)
    }


class _Tracks:
    """One process's tracks: training, windows, a thread's, or a background lane (by end time)."""

    def __init__(self, pid: int, emit: Callable[[dict[str, Any]], None]) -> None:
        self.pid = pid
        self._emit = emit
        self._tids: dict[str, int] = {}
        self._lanes: list[tuple[int, int]] = []  # (tid, the end of its last span)
        self.named("training")

    def named(self, name: str) -> int:
        tid = self._tids.get(name)
        if tid is None:
            tid = self._tids[name] = len(self._tids) + 1
            for key, value in (("thread_name", {"name": name}), ("thread_sort_index", {"sort_index": tid})):
                self._emit({"ph": "M", "name": key, "pid": self.pid, "tid": tid, "args": value})
        return tid

    def lane(self, start_ns: int, end_ns: int) -> int:
        """The first background lane free from ``start_ns`` (a lane's spans follow each other)."""
        for index, (tid, free_from) in enumerate(self._lanes):
            if free_from <= start_ns:
                self._lanes[index] = (tid, end_ns)
                return tid
        tid = self.named("background" + (f" {len(self._lanes) + 1}" if self._lanes else ""))
        self._lanes.append((tid, end_ns))
        return tid


class ChromeTraceWriter:
    """Streams trace events into an open text file as one JSON object."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._processes: dict[str, _Tracks] = {}
        self.events = 0
        out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')

    def _emit(self, event: dict[str, Any]) -> None:
        self._out.write((",\n" if self.events else "") + json.dumps(event, separators=(",", ":")))
        self.events += 1

    def _process(self, resource: dict[str, Any]) -> _Tracks:
        key, rank, label = process_identity(resource)
        tracks = self._processes.get(key)
        if tracks is None:
            pid = len(self._processes) + 1
            host = resource.get(semconv.HOST_NAME)
            name = label + (f" · {host}" if host else "")
            self._emit({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
            self._emit({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": rank}})
            tracks = self._processes[key] = _Tracks(pid, self._emit)
        return tracks

    def _track(self, tracks: _Tracks, span: SpanRecord) -> int:
        phase = span.attributes.get(semconv.PHASE)
        if phase == Phase.CHECKPOINT_FINALIZE.value:
            return tracks.lane(span.start_ns, span.end_ns)
        if span.name == semconv.TRAINING_WINDOW_SPAN:
            return tracks.named("windows")
        thread = span.attributes.get(semconv.THREAD_NAME)
        return _TRAINING if thread is None else tracks.named(f"thread {thread}")

    def add(self, span: SpanRecord) -> None:
        tracks = self._process(span.resource)
        pid, tid = tracks.pid, self._track(tracks, span)
        phase = span.attributes.get(semconv.PHASE)
        args = _scalar_args(span.attributes)
        args["trace_id"], args["span_id"] = span.trace_id, span.span_id
        if span.is_error:
            args["error"] = span.status_message or "ERROR"
        start_us = span.start_ns // 1000
        self._emit(
            {
                "ph": "X",
                "name": span.name,
                "cat": str(phase) if phase is not None else "user",
                "pid": pid,
                "tid": tid,
                "ts": start_us,
                "dur": max(0, span.end_ns // 1000 - start_us),
                "args": args,
            }
        )
        for event in span.events:
            self._emit(
                {
                    "ph": "i",
                    "s": "t",
                    "name": event.name,
                    "pid": pid,
                    "tid": tid,
                    "ts": event.time_ns // 1000,
                    "args": _scalar_args(event.attributes),
                }
            )

    def close(self) -> None:
        self._out.write("\n]}\n")


def export_chrome_trace(
    paths: Iterable[str | os.PathLike[str]],
    out: IO[str],
    stats: ReadStats | None = None,
    progress: Callable[[int], None] | None = None,
    run: str | None = None,
) -> int:
    """Write the exported spans of the files as a Chrome trace: of the one run ``run`` (a
    :func:`~traintel.analysis.run_info.run_key`) when given, else all; returns the event count."""
    writer = ChromeTraceWriter(out)
    files = [p for p in expand_paths(paths) if p.is_file()]
    with gc_paused():
        for record in iter_records(files, stats, progress):
            if isinstance(record, SpanRecord) and (run is None or run_key(record.resource) == run):
                writer.add(record)
    writer.close()
    return writer.events
