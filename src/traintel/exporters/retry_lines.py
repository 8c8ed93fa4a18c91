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

from traintel.exporters.health import HEALTH
from traintel.exporters.tls_errors import ATTEMPT_LINE, LOGGER_FAMILY, attach_filter, signal_of

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


class CollectionTimeoutFilter(logging.Filter):
    """The SDK's periodic metric reader logs each collection that times out (under CPU pressure,
    say) as a warning with a ``MetricsTimeoutError`` traceback, on the job's stderr. The next
    collection carries the cumulative totals, so one counted line says all of it: each timeout
    is counted (said at exit) and the first said once, without a traceback."""

    def __init__(self) -> None:
        super().__init__()
        self._said = False

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if not record.getMessage().startswith("Metric collection timed out"):
                return True
            self.timed_out()
        except Exception:  # a filter must never break the reader that logs
            return True
        return False

    def timed_out(self) -> None:
        """One collection that timed out (seen in the reader's log, or raised by a flush)."""
        HEALTH.add("metric_collection_timeouts")
        if not self._said:
            self._said = True
            _logger.warning(
                "traintel: a metric collection timed out (the process is short of CPU?); the next one "
                "carries the cumulative totals (each is counted and the exit says how many)"
            )


_filter = RepeatedFailureFilter()
_timeouts = CollectionTimeoutFilter()
#: Where the SDK's periodic metric reader logs.
_READER_LOGGER = "opentelemetry.sdk.metrics._internal.export"


def install() -> RepeatedFailureFilter:
    """Attach the filters to the exporters' and the metric reader's loggers (call after their
    modules are imported)."""
    attach_filter(_filter, LOGGER_FAMILY)
    attach_filter(_timeouts, _READER_LOGGER)
    return _filter


def collection_timed_out() -> None:
    """A metric collection a flush gave up on: counted, and said once, without a traceback."""
    _timeouts.timed_out()


def delivered() -> None:
    """A delivery after failures: the next outage's first lines are shown again."""
    _filter.delivered()
