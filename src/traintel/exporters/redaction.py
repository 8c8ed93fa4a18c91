"""Keep OTLP credentials (header values, passwords and tokens in endpoint URLs) out of every log line.

Why this exists: the values of ``OTEL_EXPORTER_OTLP_HEADERS`` and its per-signal variants are
credentials, yet the SDK logs a malformed entry verbatim ("Header format invalid! ...: <entry>")
and exporters log exceptions whose text may quote the request metadata. An endpoint such as
``https://user:PASS@host:4318/?token=...`` carries them in its userinfo and query, and both the
exporters' retry lines and traintel's own errors name the endpoint. Job logs end up in
shared places (Slurm output, CI artefacts), so every record from the loggers that can see a
header - the OpenTelemetry SDK and exporters, grpc, urllib3/requests and traintel - passes a
filter that replaces each header value (and each malformed entry) with ``[REDACTED]``.

Logger filters only see records created on their own logger, not on children, so the filter is
attached to every existing logger of those families; :func:`install` is called before and after
the exporters are built, when all their modules (and loggers) exist.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from traintel.exporters.tls_errors import attach_filter

#: Each variable in its general and its per-signal forms.
_FORMS = (
    "OTEL_EXPORTER_OTLP_",
    "OTEL_EXPORTER_OTLP_TRACES_",
    "OTEL_EXPORTER_OTLP_METRICS_",
    "OTEL_EXPORTER_OTLP_LOGS_",
)
HEADER_VARIABLES = tuple(form + "HEADERS" for form in _FORMS)
ENDPOINT_VARIABLES = tuple(form + "ENDPOINT" for form in _FORMS)
_LOGGER_FAMILIES = ("opentelemetry", "grpc", "urllib3", "requests", "traintel")
REDACTED = "[REDACTED]"
#: Shorter values are not secrets, and replacing them would garble unrelated text.
_MIN_SECRET_LENGTH = 4


def header_secrets(environ: Mapping[str, str]) -> frozenset[str]:
    """Every value (raw and URL-decoded) and every malformed entry of the header variables, and
    the password and query values of the endpoint variables."""
    found: set[str] = set()
    for variable in ENDPOINT_VARIABLES:
        found.update(url_secrets(environ.get(variable, "")))
    for variable in HEADER_VARIABLES:
        raw = environ.get(variable, "")
        for raw_entry in raw.split(","):
            entry = raw_entry.strip()
            _, has_value, value = entry.partition("=")
            candidates = [value.strip(), unquote(value).strip()] if has_value else [entry]
            found.update(c for c in candidates if len(c) >= _MIN_SECRET_LENGTH)
    return frozenset(found)


def url_secrets(url: str) -> set[str]:
    """A URL's password (raw and decoded) and query values: what must not be printed of it."""
    try:
        parts = urlsplit(url.strip())
        password = parts.password
        query = parse_qsl(parts.query, keep_blank_values=False)
    except ValueError:  # not a URL (a port out of range, a bad IPv6 literal): nothing to parse
        return set()
    candidates: set[str] = set()
    if password:
        raw = parts.netloc.rpartition("@")[0].partition(":")[2]
        candidates.update((raw, unquote(raw), password))
    candidates.update(value for _, value in query)  # decoded
    candidates.update(part.partition("=")[2] for part in parts.query.split("&") if "=" in part)  # raw
    return {c for c in candidates if len(c) >= _MIN_SECRET_LENGTH}


def redact(text: str, secrets: Iterable[str]) -> str:
    # Longest first: a value that contains another one is replaced whole.
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


class SecretFilter(logging.Filter):
    """Rewrites a record whose message or traceback contains a secret; never drops a record."""

    def __init__(self, secrets: frozenset[str]) -> None:
        super().__init__("traintel.redaction")
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        try:
            message = record.getMessage()
            cleaned = redact(message, self.secrets)
            if cleaned != message:
                record.msg, record.args = cleaned, None
            if record.exc_info and record.exc_info[1] is not None:
                text = record.exc_text or "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
                cleaned = redact(text, self.secrets)
                if cleaned != text:  # the formatter uses exc_text as is once it is set
                    record.exc_text = cleaned
            if record.stack_info:
                record.stack_info = redact(record.stack_info, self.secrets)
        except Exception:  # an exception here would reach the caller: withhold the whole text
            record.msg, record.args, record.exc_info, record.exc_text = REDACTED, None, None, None
        return True


_filter = SecretFilter(frozenset())


def install(environ: Mapping[str, str]) -> SecretFilter:
    """Attach the filter (with the current header values) to every logger that may see them."""
    _filter.secrets = header_secrets(environ)
    if not _filter.secrets:
        return _filter
    attach_filter(_filter, *_LOGGER_FAMILIES, "opentelemetry.util.re")
    return _filter
