"""The OTLP exporters' failure lines, once per signal and outage instead of at every retry.

Why: with the collector down, the spool retries its oldest batch every few seconds and each
attempt makes the exporters log one to three lines ("Transient error ... retrying", "Failed to
export ..."), for as long as the outage lasts: hundreds of identical lines in a job's log, which
bury its own. traintel counts every failure (``traintel.export.failures``), spools what was not
delivered and says at exit what is left, so after the first attempt's lines the rest add
nothing. This filter, on the exporters' loggers, lets the lines through until an attempt of the
same signal has failed in full (its "Failed to export" line), then drops that signal's lines
and says so once, until a delivery after the outage (:func:`delivered`) opens it again.
"""

from __future__ import annotations

import logging
import threading

from traintel.exporters.tls_errors import ATTEMPT_LINE, attach_to_exporter_loggers, signal_of

_logger = logging.getLogger("traintel")

_FAILED = "Failed to export"


class RepeatedFailureFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        #: Signals whose failure lines are held back, and whether that was said.
        self._quiet: set[str] = set()
        self._said = False
        #: Lines left out since the process started.
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            if not ATTEMPT_LINE.match(message):
                return True
            signal = signal_of(message) or "traces"
            with self._lock:
                if signal in self._quiet:
                    first_drop, self._said = not self._said, True
                    self.dropped += 1
                else:
                    if message.startswith(_FAILED):
                        self._quiet.add(signal)
                    return True
            if first_drop:
                _logger.warning(
                    "traintel: the collector still does not take %s; the exporters' further retry "
                    "lines are left out until it does (every failure is counted in "
                    "traintel.export.failures and the exit says what was not delivered)",
                    signal,
                )
        except Exception:  # a filter must never break the exporter that logs
            return True
        return False

    def delivered(self) -> None:
        with self._lock:
            self._quiet.clear()
            self._said = False


_filter = RepeatedFailureFilter()


def install() -> RepeatedFailureFilter:
    """Attach the filter to the exporters' loggers (call after their modules are imported)."""
    attach_to_exporter_loggers(_filter)
    return _filter


def delivered() -> None:
    """A delivery after failures: the next outage's first lines are shown again."""
    _filter.delivered()


__all__ = ["RepeatedFailureFilter", "delivered", "install"]
