"""One clear error when the collector's TLS certificate does not verify.

Why: with ``OTEL_EXPORTER_OTLP_CERTIFICATE`` pointing at a CA that did not sign the collector's
certificate, every export attempt fails the handshake, and the OTLP exporters say so their own
way: a "Transient error ... retrying" line per retry and a "Failed to export" line per batch,
per signal, for the whole run (the gRPC one quotes the TLS error, the HTTP one's final line
does not even say why). None of them names the CA file, which is the thing to fix. A failed
verification does not heal within a run (the CA is read once, at start), so this filter, on
the exporters' loggers, turns the first such failure into one error naming the endpoint
variable, the endpoint and the CA file, and drops the exporters' repeats of it. Failures are
still counted (``traintel.export.failures``) and span batches still spooled; only the
repeated log lines go.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass

_logger = logging.getLogger("traintel")

#: How OpenSSL (HTTP, through requests) and BoringSSL (gRPC's core) spell it.
_CERTIFICATE_FAILURE = re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed", re.IGNORECASE)
_REASON = re.compile(
    r"(?:CERTIFICATE_VERIFY_FAILED|certificate verify failed):\s*([A-Za-z][A-Za-z ,-]*[A-Za-z])",
    re.IGNORECASE,
)
#: The exporters' lines about a failed attempt (gRPC and HTTP), repeated for every batch.
ATTEMPT_LINE = re.compile(r"^(?:Transient error|Failed to export|Shutdown in progress, aborting retry)")
#: How each exporter names its signal: gRPC "exporting traces to", HTTP "exporting spans batch"
#: (the URL in the quoted error may name another signal's path).
_SIGNAL_PHRASE = re.compile(r"\bexport(?:ing)? (traces|spans|metrics|logs)\b")
_SIGNAL_OF_WORD = {"traces": "traces", "spans": "traces", "metrics": "metrics", "logs": "logs"}
_SIGNALS = ("traces", "metrics", "logs")
LOGGER_FAMILY = "opentelemetry.exporter"


@dataclass(frozen=True)
class TlsTarget:
    """Where one signal is exported and which CA it trusts, as configured (variable, value)."""

    endpoint_variable: str
    endpoint: str
    certificate_variable: str | None
    certificate: str | None

    def explain(self, reason: str) -> str:
        endpoint = f"{self.endpoint_variable}={self.endpoint}" if self.endpoint else "the default endpoint"
        if self.certificate:
            trust = (
                f"the collector's certificate is not signed by the CA in {self.certificate} "
                f"({self.certificate_variable})"
            )
        else:
            trust = (
                "the collector's certificate is not trusted by this machine's CA store "
                "(set OTEL_EXPORTER_OTLP_CERTIFICATE to the CA that signed it)"
            )
        return (
            f"traintel: OTLP export to {endpoint} failed TLS certificate verification ({reason}): "
            f"{trust}. Every export to it fails this run; training continues, span batches are "
            "kept in the spool (`traintel replay` sends them once the CA is right), metric exports "
            "to it are lost"
        )


_UNKNOWN = TlsTarget("OTEL_EXPORTER_OTLP_ENDPOINT", "", None, None)


def tls_targets(environ: Mapping[str, str]) -> dict[str, TlsTarget]:
    """Each signal's endpoint and CA file: the per-signal variable wins over the general one."""
    targets: dict[str, TlsTarget] = {}
    for signal in _SIGNALS:
        upper = signal.upper()
        endpoint_variable, endpoint = _first(
            environ, f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        certificate_variable, certificate = _first(
            environ, f"OTEL_EXPORTER_OTLP_{upper}_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"
        )
        targets[signal] = TlsTarget(
            endpoint_variable, endpoint, certificate_variable if certificate else None, certificate or None
        )
    return targets


def _first(environ: Mapping[str, str], *variables: str) -> tuple[str, str]:
    for variable in variables:
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return variables[-1], ""


def signal_of(message: str) -> str | None:
    found = _SIGNAL_PHRASE.search(message)
    return _SIGNAL_OF_WORD[found.group(1)] if found else None


class CertificateFailureFilter(logging.Filter):
    """Says a certificate failure once per (endpoint, CA file); drops the exporters' repeats.

    Never drops anything else: a record that does not quote a verification failure passes,
    unless it is another failed-attempt line of a signal whose failure was already explained.
    """

    def __init__(self, targets: Mapping[str, TlsTarget]) -> None:
        super().__init__("traintel.tls_errors")
        self.targets = dict(targets)
        self._lock = threading.Lock()
        self._explained: set[tuple[str, str | None]] = set()
        self._failed_signals: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message += f" {record.exc_info[1]}"
            signal = signal_of(message)
            if _CERTIFICATE_FAILURE.search(message):
                self._explain(signal, message)
                return False
            if self._failed_signals and ATTEMPT_LINE.match(message):
                return signal is not None and signal not in self._failed_signals
        except Exception:  # a filter must never break the exporter that logs
            return True
        return True

    def _explain(self, signal: str | None, message: str) -> None:
        target = self.targets.get(signal or "traces") or _UNKNOWN
        key = (target.endpoint, target.certificate)
        with self._lock:
            if signal is not None:
                self._failed_signals.add(signal)
            first = key not in self._explained
            self._explained.add(key)
        if first:
            found = _REASON.search(message)
            _logger.error(target.explain(found.group(1).strip() if found else "verification failed"))


_filter = CertificateFailureFilter({})


def install(environ: Mapping[str, str]) -> None:
    """Attach the filter, with the endpoints and CA files configured now, to the exporters'
    loggers (see :func:`attach_filter`)."""
    _filter.targets = tls_targets(environ)
    attach_filter(_filter, LOGGER_FAMILY)


def attach_filter(log_filter: logging.Filter, *families: str) -> None:
    """Add ``log_filter`` once to each logger named in ``families`` and to every logger below
    one that exists now (a logger filter only sees records made on that logger: call after the
    modules that log are imported)."""
    below = tuple(family + "." for family in families)
    for name in {*families, *(n for n in list(logging.Logger.manager.loggerDict) if n.startswith(below))}:
        logger = logging.getLogger(name)
        if log_filter not in logger.filters:
            logger.addFilter(log_filter)
