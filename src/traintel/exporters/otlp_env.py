"""Which OTLP protocol each signal is sent with, and how a bad setting is said.

``OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)PROTOCOL``: the per-signal variable wins over the general
one. Explicit configuration (and ``traintel replay``) raises on a bad value; the automatic
configuration says it once per process and goes on with the default.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from traintel.config import ConfigurationError

_logger = logging.getLogger("traintel")

PROTOCOLS = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
#: Each signal's exporter, endpoint and protocol variables.
SIGNAL_VARS = {
    signal: (
        f"OTEL_{signal.upper()}_EXPORTER",
        f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT",
        f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL",
    )
    for signal in ("traces", "metrics", "logs")
}

#: Bad settings already said by the automatic configuration: each once per process, however
#: many signals or rebuilds read it.
said: set[str] = set()


def report(error: ConfigurationError, strict: bool) -> None:
    if strict:
        raise error
    if str(error) not in said:
        said.add(str(error))
        _logger.error("traintel: ignoring bad setting: %s", error)


def otlp_protocol(signal: str, environ: Mapping[str, str], strict: bool) -> str:
    """The OTLP protocol for ``signal``: the per-signal variable wins over the general one."""
    _, _, signal_var = SIGNAL_VARS[signal]
    for var in (signal_var, "OTEL_EXPORTER_OTLP_PROTOCOL"):
        raw = environ.get(var, "").strip()
        if not raw:
            continue
        if raw in PROTOCOLS:
            return raw
        report(
            ConfigurationError(
                f"{var}={raw!r}: unknown OTLP protocol (supported: {', '.join(sorted(PROTOCOLS))})"
            ),
            strict,
        )
    return "grpc"
