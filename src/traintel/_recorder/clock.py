"""traintel's clock: Unix-time timestamps that advance with the monotonic clock.

Why: spans carry Unix nanoseconds (OTLP), but a duration must not move when the wall clock
does. Stepped back an hour mid-run (NTP, a resumed VM, an operator), the application span read
−59.8 min and goodput 0.0; a day forward, goodput 0.00014 instead of 0.61. Every timestamp
traintel takes is the wall clock read once (at import) plus the monotonic time since, so its
durations are exact whatever the wall clock does. :func:`wall_step_ns` says how far the wall
clock now is from this timeline (zero unless it stepped); the window close reports a step,
since timestamps taken after it are that far off the wall clock.

The cost: one monotonic read and an addition per timestamp (the monotonic read costs what the
wall-clock read did; the Python call adds tens of nanoseconds).

Both clocks are read from the ``time`` module when traintel is imported: a simulation (the
test suite's counter-clock jobs) that replaces ``time.time_ns`` and ``time.monotonic_ns`` by
the same counter before the import drives traintel's timeline with it.
"""

from __future__ import annotations

import time

_monotonic_ns = time.monotonic_ns
#: The wall clock at the monotonic clock's zero, read once.
_OFFSET_NS = time.time_ns() - _monotonic_ns()


def time_ns() -> int:
    """Now, in Unix nanoseconds on traintel's timeline (monotonic since the import)."""
    return _OFFSET_NS + _monotonic_ns()


def wall_step_ns() -> int:
    """How far the wall clock is now from traintel's timeline: how much it stepped since the
    import (positive: forward)."""
    return time.time_ns() - time_ns()
