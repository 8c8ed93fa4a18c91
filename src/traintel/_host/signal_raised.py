"""Which exceptions traintel's guards must not contain: those a signal handler raised.

traintel's phase code catches what fails inside it, so that telemetry never breaks training.
But a Python signal handler runs wherever the main thread stands, and what it raises is the
job's, not telemetry's: torch's SIGCHLD handler raising "DataLoader worker ... killed by
signal" after a ``kill -TERM`` to the process group, a user's SIGTERM handler raising their
own preemption exception. When that lands inside traintel's code, containing it would change
how the job stops (it would go on as if nothing happened); it is raised on instead, as it
would have been a few bytecodes later without traintel.
"""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path
from types import CodeType, TracebackType

import opentelemetry

#: Directories as the import system named them, as code objects' file names are (not resolved).
_PACKAGE = os.path.join(str(Path(__file__).parent.parent), "")
#: Code that is never a signal handler here: traintel's (its own handler raises nothing but
#: what it hands over from another) and OpenTelemetry's.
_NOT_HANDLERS = (_PACKAGE, *(os.path.join(path, "") for path in opentelemetry.__path__))


def raised_by_signal_handler(exc: BaseException) -> bool:
    """Whether ``exc`` was caught by traintel's code and raised by a signal handler installed
    now (its frames are on the exception's traceback).

    A failure of traintel's own code (a guard's usual catch) has only traintel's and
    OpenTelemetry's frames on its traceback and is answered without looking at the handlers,
    which costs tens of microseconds: a failure that repeats every step stays cheap."""
    traceback = exc.__traceback__
    if traceback is None or not traceback.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        return False  # caught by the user's code: theirs to handle, not a guard's
    candidates = _foreign_codes(traceback)
    return bool(candidates) and not candidates.isdisjoint(_handler_codes())


def _foreign_codes(traceback: TracebackType | None) -> set[CodeType]:
    """The code of each frame on the traceback that is neither traintel's nor OpenTelemetry's."""
    codes = set()
    while traceback is not None:
        code = traceback.tb_frame.f_code
        if not code.co_filename.startswith(_NOT_HANDLERS):
            codes.add(code)
        traceback = traceback.tb_next
    return codes


def _handler_codes() -> set[CodeType]:
    """The code of each Python-level signal handler now installed."""
    codes = set()
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
        code = _code_of(handler)
        if code is not None:
            codes.add(code)
    return codes


def _code_of(handler: object) -> CodeType | None:
    while isinstance(handler, functools.partial):
        handler = handler.func
    function = getattr(handler, "__func__", handler)  # a bound method's function
    code = getattr(function, "__code__", None)
    if code is None and callable(handler):  # an object with __call__: the code of that method
        code = getattr(getattr(type(handler), "__call__", None), "__code__", None)  # noqa: B004
    return code if isinstance(code, CodeType) else None
