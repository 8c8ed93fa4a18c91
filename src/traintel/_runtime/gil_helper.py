"""The helper process of ``traintel._host.gil_watch`` (which says why and how), run as a script.
Its hang record goes through a logs pipeline built from the ``OTEL_*`` environment it inherited
(the embedded file: one of its own beside the rank's, ``-gil`` before the suffix).

Why here, in the runtime: the report is a stall record (``_host.stall``) sent through a logs
pipeline assembled from the environment (``_runtime.pipeline``); the rank's side in ``_host``
only starts this script, by the path the bootstrap gives it.
"""

from __future__ import annotations

import json
import os
import re
import select
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any

#: A thread's header in a ``faulthandler`` dump, and one of its frames (most recent first).
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
#: How long the helper waits for the rest of a dump after its last bytes.
_DUMP_QUIET_S = 0.3


def held_stack(dump: str, thread: int) -> tuple[str, str]:
    """The stack of ``thread`` in a ``faulthandler`` dump, as Python prints a traceback (most
    recent call last, with the source lines), and its top frame; empty when the dump lacks it."""
    stacks: dict[int, list[tuple[str, int, str]]] = {}
    frames: list[tuple[str, int, str]] | None = None
    for line in dump.splitlines():
        header = _THREAD.match(line)
        if header is not None:
            frames = stacks.setdefault(int(header.group(1), 16), [])
            continue
        frame = _FRAME.match(line)
        if frame is not None and frames is not None:
            frames.append((frame.group(1), int(frame.group(2)), frame.group(3)))
    found = stacks.get(thread)
    if not found:
        return "", ""
    summary = traceback.StackSummary.from_list([(*frame, None) for frame in reversed(found)])
    top = summary[-1]
    return "".join(summary.format()), f"{top.name} ({top.filename}:{top.lineno})"


def _report(setup: Mapping[str, Any], state: Mapping[str, Any], dump: str) -> None:
    """Send the hang record of a rank whose GIL is held (imports traintel: only now)."""
    sys.path.insert(0, setup["path"])
    from opentelemetry.sdk.resources import Resource

    from traintel import semconv
    from traintel._host import stall
    from traintel._runtime.hang_records import emit
    from traintel._runtime.pipeline import environment_log_pipeline

    now = time.time_ns()
    thread = int(state.get("thread") or 0)
    stack, top = held_stack(dump, thread)
    report = stall.StallReport(
        rank=int(setup["rank"]),
        phase=str(state.get("phase", "")),
        iteration=state.get("iteration"),
        entered=int(state.get("entered", 0)),
        completed=int(state.get("completed", 0)),
        waiting_in=state.get("waiting_in"),
        threads=tuple(state.get("threads") or ()),
        stalled_s=(now - int(state.get("progress_ns", now))) / 1e9,
        python=semconv.PYTHON_HOLDING_GIL,
        stack=stack,
        top_frame=top,
        thread_id=thread,
    )
    logs = environment_log_pipeline(Resource(setup["resource"]), setup.get("file"))
    link = stall.span_context(int(state.get("trace_id") or 0), int(state.get("span_id") or 0))
    # the watcher's last look came at most a second before C code took the GIL: a fast loop may
    # have gone a few iterations further since
    body = report.describe() + " (phase, iteration and collectives as last seen, up to a second before)"
    emit(logs.logger, semconv.EVENT_HANG_SUSPECT, report, link, now, body)
    logs.shutdown(10_000)


def main(argv: list[str]) -> None:
    """Wait for a dump (or the end of the rank); report each dump with the latest state."""
    state_fd, dump_fd, setup = int(argv[1]), int(argv[2]), json.loads(argv[3])
    state: dict[str, Any] = {}
    pending, dump = b"", b""
    while True:
        readable, _, _ = select.select([state_fd, dump_fd], [], [], _DUMP_QUIET_S if dump else None)
        if not readable and dump:  # the dump is complete
            _report(setup, state, dump.decode("utf-8", "replace"))
            dump = b""
            continue
        for fd in readable:
            data = os.read(fd, 1 << 16)
            if not data:  # the rank closed its end, or died
                if dump:
                    _report(setup, state, dump.decode("utf-8", "replace"))
                return
            if fd == dump_fd:
                dump += data
            else:
                pending, state = _latest_state(pending + data, state)


def _latest_state(buffer: bytes, state: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The last complete state line in ``buffer`` (else ``state``), and what follows it."""
    *lines, pending = buffer.split(b"\n")
    return pending, json.loads(lines[-1]) if lines else state


if __name__ == "__main__":
    del sys.path[0]  # this script's folder: its modules are not top-level ones
    main(sys.argv)
