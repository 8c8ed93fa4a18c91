"""Chrome trace event format (Perfetto, chrome://tracing) from a run's files.

Why this format: it opens without a backend, and one file holds every rank side by side.
Each process (a rank of a job) is a track group; phases are complete events ("X") on its main
thread so they nest by time; background work (async checkpoint finalize) gets a thread of its
own, since it overlaps the loop and would break the nesting; span events are instant events.
Written while reading: memory does not grow with the input.
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

_MAIN_THREAD = 1
_BACKGROUND_THREAD = 2
_BACKGROUND_PHASES = {Phase.CHECKPOINT_FINALIZE.value}


def _scalar_args(attributes: dict[str, Any]) -> dict[str, Any]:
    """Scalars only, a non-finite float as text: a diverged loss written as ``NaN`` is not JSON,
    and the viewers refuse the whole file for it."""
    return {
        k: json_number(v) if isinstance(v, float) else v
        for k, v in attributes.items()
        if isinstance(v, str | int | float | bool)
    }


class ChromeTraceWriter:
    """Streams trace events into an open text file as one JSON object."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._pids: dict[str, int] = {}
        self.events = 0
        out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')

    def _emit(self, event: dict[str, Any]) -> None:
        self._out.write((",\n" if self.events else "") + json.dumps(event, separators=(",", ":")))
        self.events += 1

    def _pid(self, resource: dict[str, Any]) -> int:
        key, rank, label = process_identity(resource)
        pid = self._pids.get(key)
        if pid is None:
            pid = self._pids[key] = len(self._pids) + 1
            host = resource.get(semconv.HOST_NAME)
            name = label + (f" · {host}" if host else "")
            self._emit({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
            self._emit({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": rank}})
            for tid, thread in ((_MAIN_THREAD, "training"), (_BACKGROUND_THREAD, "background")):
                self._emit(
                    {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}}
                )
        return pid

    def add(self, span: SpanRecord) -> None:
        pid = self._pid(span.resource)
        phase = span.attributes.get(semconv.PHASE)
        tid = _BACKGROUND_THREAD if phase in _BACKGROUND_PHASES else _MAIN_THREAD
        args = _scalar_args(span.attributes)
        args["trace_id"], args["span_id"] = span.trace_id, span.span_id
        if span.is_error:
            args["error"] = span.status_message or "ERROR"
        self._emit(
            {
                "ph": "X",
                "name": span.name,
                "cat": str(phase) if phase is not None else "user",
                "pid": pid,
                "tid": tid,
                "ts": span.start_ns / 1000,
                "dur": max(0, span.end_ns - span.start_ns) / 1000,
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
                    "ts": event.time_ns / 1000,
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
