"""What the collector answered each trace export: spans it refused inside an accepted request
counted, and "slow down" told from "never".

Why: the OTLP exporters report success or failure and nothing else, and traintel's export path
needs two things they drop.

- **Partial success.** A collector may accept a request and report in its answer that it
  rejected some of its spans (``partial_success.rejected_spans``, with a message). The
  exporters discard the answer, so such spans were lost unsaid (3,756 of 15,026 in one run).
  Here they are counted in ``traintel.spans.dropped{traintel.drop.reason=collector_rejected}``,
  said once with the collector's message, and at exit.
- **Throttling.** HTTP 429 (with ``Retry-After``), 502, 503 and 504, and gRPC's retryable codes
  (``RESOURCE_EXHAUSTED`` with its ``RetryInfo``, ``UNAVAILABLE``, ...) ask the sender to try
  again later: the OTLP specification calls them retryable. The spool must then wait and keep
  the batch, never set it aside as refused (a throttled collector takes an empty request, which
  is how a refused batch is otherwise told from an outage).

The answers are seen where the exporters receive them, through the public hooks of their
clients (a ``requests`` response hook; a wrapper of the gRPC stub's ``Export``), installed by
:func:`traintel._sdk.otel_private.watch_collector_answers`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from traintel.exporters import health as health_module
from traintel.exporters.health import HEALTH, ExportHealth

_logger = logging.getLogger(__name__)

#: HTTP statuses the OTLP specification makes retryable.
_RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
#: gRPC status codes the OTLP specification makes retryable.
_RETRYABLE_GRPC = frozenset(
    {
        "CANCELLED",
        "DEADLINE_EXCEEDED",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNAVAILABLE",
        "DATA_LOSS",
        "RESOURCE_EXHAUSTED",
    }
)
#: The longest wait a collector's ``Retry-After`` is taken for (a day-long one is a mistake).
_MAX_RETRY_AFTER_S = 3600.0


@dataclass(frozen=True)
class Answer:
    """A failed export's answer: whether the collector asked to try again later, and when."""

    what: str
    retryable: bool
    retry_after_s: float | None = None

    @property
    def throttled(self) -> bool:
        """The collector asked to slow down (429, RESOURCE_EXHAUSTED, a Retry-After), not a
        moment's unavailability (503, UNAVAILABLE: an outage, said as one)."""
        return self.retry_after_s is not None or self.what in ("HTTP 429", "gRPC RESOURCE_EXHAUSTED")

    def __str__(self) -> str:
        """The answer as said to the user: ``HTTP 429, retry after 30s``."""
        return self.what + (f", retry after {self.retry_after_s:g}s" if self.retry_after_s else "")


def _retry_after(value: str | None) -> float | None:
    """``Retry-After``: seconds, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value) if value.isdigit() else parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError, OverflowError):
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


def _grpc_retry_delay(error: Any) -> float | None:
    try:
        from google.rpc.error_details_pb2 import RetryInfo  # type: ignore[import-untyped]

        raw = dict(error.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")
        if raw is None:
            return None
        info = RetryInfo.FromString(raw)
        delay = float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
        return min(max(delay, 0.0), _MAX_RETRY_AFTER_S)
    except Exception:
        return None


class CollectorAnswers:
    """The answers of one trace exporter's collector: the last failure's, and partial successes
    counted in ``health``. Written and read on the thread that exports."""

    def __init__(self, health: ExportHealth = HEALTH, *, say: bool = True) -> None:
        self._health = health
        self._local = threading.local()
        self._said_partial = not say
        #: The collector's message with the first partial success that rejected spans.
        self.partial_message: str | None = None

    @property
    def last_failure(self) -> Answer | None:
        """The failed answer of the current thread's last export, if it got one."""
        return getattr(self._local, "answer", None)

    def asked_to_wait(self) -> Answer | None:
        """The last export's answer if it was "try again later" (HTTP 429, 502-504; gRPC
        RESOURCE_EXHAUSTED, UNAVAILABLE, ...): the batch is not refused, it waits."""
        answer = self.last_failure
        return answer if answer is not None and answer.retryable else None

    def forget(self) -> None:
        """Before an export: what the previous one was answered no longer applies."""
        self._local.answer = None

    # --- what the collector said ---------------------------------------------------------------
    def _accepted(self, response: ExportTraceServiceResponse) -> None:
        partial = response.partial_success
        if partial.rejected_spans <= 0:
            return
        self._health.drop_spans(health_module.COLLECTOR_REJECTED, partial.rejected_spans)
        if self.partial_message is None:
            self.partial_message = partial.error_message or "no reason given"
        if not self._said_partial:
            self._said_partial = True
            _logger.warning(
                "traintel: the collector accepted a request but rejected %d of its spans (%s); "
                "counted in traintel.spans.dropped{collector_rejected} (its log says more)",
                partial.rejected_spans,
                self.partial_message,
            )

    # --- the hooks ---------------------------------------------------------------------------
    def http_response(self, response: Any, *args: Any, **kwargs: Any) -> None:
        """A ``requests`` response hook on the OTLP/HTTP trace exporter's session."""
        try:
            status = int(response.status_code)
            if 200 <= status < 300:  # a body that is no OTLP answer (a proxy's page) raises: ignored
                self._accepted(ExportTraceServiceResponse.FromString(response.content))
            else:
                after = _retry_after(response.headers.get("Retry-After"))
                self._local.answer = Answer(f"HTTP {status}", status in _RETRYABLE_HTTP, after)
        except Exception:  # a hook must never break the export
            pass

    def grpc_stub(self, stub: Any) -> Any:
        """The OTLP/gRPC trace exporter's stub, seeing what each ``Export`` is answered."""
        return _WatchedStub(stub, self)

    def grpc_answer(self, response: Any = None, error: Any = None) -> None:
        try:
            if error is None:
                self._accepted(response)
                return
            code = error.code().name
            self._local.answer = Answer(f"gRPC {code}", code in _RETRYABLE_GRPC, _grpc_retry_delay(error))
        except Exception:
            pass


class _WatchedStub:
    def __init__(self, stub: Any, answers: CollectorAnswers) -> None:
        self._stub = stub
        self._answers = answers

    def Export(self, *args: Any, **kwargs: Any) -> Any:  # the stub's method name
        try:
            response = self._stub.Export(*args, **kwargs)
        except Exception as error:
            if hasattr(error, "code"):
                self._answers.grpc_answer(error=error)
            raise
        self._answers.grpc_answer(response)
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)
