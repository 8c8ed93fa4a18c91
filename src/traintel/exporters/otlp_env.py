"""Which OTLP protocol each signal is sent with, and how a bad setting is said.

``OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)PROTOCOL``: the per-signal variable wins over the general
one. Explicit configuration (and ``traintel replay``) raises on a bad value; the automatic
configuration says it once per process and goes on with the default.
"""

from __future__ import annotations

import logging
import math
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


def warn_once(message: str) -> None:
    """A doubtful setting, said once per process: it is used as it is."""
    if message not in said:
        said.add(message)
        _logger.warning("traintel: %s", message)


#: The OTLP exporters' timeout when their variable is not set: 10 s.
DEFAULT_TIMEOUT_S = 10.0


def otlp_timeout(signal: str, environ: Mapping[str, str], strict: bool) -> float | None:
    """A timeout in seconds to give ``signal``'s OTLP exporter instead of the one its variable
    sets, or None to let the exporter read it.

    Why: the OpenTelemetry Python exporters read ``OTEL_EXPORTER_OTLP_(TRACES_|METRICS_|LOGS_)TIMEOUT``
    in seconds, while the specification (and every other SDK) says milliseconds. The
    specification's ``10000`` then lets one export wait 2.8 h on a collector that does not
    answer, while spans pile up and are dropped; that is said. A value of 0 or below fails every
    export at once, losing the whole run: it is refused (explicit configuration) or replaced by
    the default. Text is left to the exporter, whose refusal names the variable."""
    for variable in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        raw = environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            seconds = float(raw)
        except ValueError:
            return None
        if not 0 < seconds < math.inf:
            error = f"{variable}={raw!r}: expected a positive number of seconds (every export would fail)"
            report(ConfigurationError(f"{error}; using the default, {DEFAULT_TIMEOUT_S:g}"), strict)
            return DEFAULT_TIMEOUT_S
        if seconds >= 1000:
            warn_once(
                f"{variable}={raw!r} is in seconds for the OpenTelemetry Python exporters (the "
                f"specification says milliseconds): an export may wait {seconds / 3600:.1f} h for a "
                f"collector that does not answer; for {seconds / 1000:g} s write {seconds / 1000:g}"
            )
        return None
    return None


def otlp_protocol(signal: str, environ: Mapping[str, str], strict: bool) -> str:
    """The OTLP protocol for ``signal``: the per-signal variable wins over the general one.
    ``http/json`` is sent as ``http/protobuf``: it names the collector's HTTP port and paths."""
    _, _, signal_var = SIGNAL_VARS[signal]
    for var in (signal_var, "OTEL_EXPORTER_OTLP_PROTOCOL"):
        raw = environ.get(var, "").strip()
        if not raw:
            continue
        if raw in PROTOCOLS:
            return raw
        if raw == "http/json":  # the specification's, not implemented by the Python exporters
            message = f"{var}={raw!r}: the OpenTelemetry Python exporters do not send OTLP/JSON"
            report(ConfigurationError(f"{message}; sending http/protobuf to the same endpoint"), strict)
            return "http/protobuf"  # what a collector's HTTP port takes too; gRPC there sent nothing
        report(
            ConfigurationError(
                f"{var}={raw!r}: unknown OTLP protocol (supported: {', '.join(sorted(PROTOCOLS))})"
            ),
            strict,
        )
    return "grpc"
