"""The lines a job writes to standard error as its telemetry starts (where it goes) and ends
(where it went, how to read it).

Why: a user's own ``train.py`` otherwise says nothing about its telemetry (W&B prints a link at
the start and at the end of a run). One line each, from rank 0 only, silenced by
``TRAINTEL_QUIET``: the file (and, at the end, the command that reads it), or the OTLP endpoint
the spans are sent to.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from traintel._runtime.pipeline import FILE_EXPORTER
from traintel.environment_variables import TRAINTEL_QUIET
from traintel.exporters.health import traintel_command
from traintel.exporters.redaction import redact, url_secrets

_OTLP_DEFAULTS = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318/v1/traces"}


def _span_exporters(trace_exporters: list[str] | None, environ: Mapping[str, str]) -> list[str]:
    """``trace_exporters``: those traintel started (none: an OTLP one that could not start sends
    nothing), or None for a provider it did not build (the distro's, or the user's own): then
    the exporters ``OTEL_TRACES_EXPORTER`` names (the distro builds those)."""
    if trace_exporters is not None:
        return trace_exporters
    return [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]


def _endpoint_used(trace_exporters: list[str] | None, environ: Mapping[str, str]) -> str | None:
    """The OTLP endpoint the spans go to, if an OTLP exporter sends them, as the ``OTEL_*``
    variables (or their defaults) say; a password or token in the URL is never printed."""
    if not any(name.startswith("otlp") for name in _span_exporters(trace_exporters, environ)):
        return None
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint:
        return redact(endpoint, url_secrets(endpoint))
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return _OTLP_DEFAULTS.get(protocol or "grpc", _OTLP_DEFAULTS["grpc"])


def _spans_in_file(trace_exporters: list[str] | None, environ: Mapping[str, str]) -> bool:
    """Whether the run's spans go to the embedded file. Where they do not (a user's own tracer
    provider, ``OTEL_TRACES_EXPORTER=console``), the file holds metrics only, and the lines say
    so instead of pointing at ``traintel summary``, which reads spans and would find none."""
    return FILE_EXPORTER in _span_exporters(trace_exporters, environ)


def _silent(rank: object, environ: Mapping[str, str]) -> bool:
    """Another rank's job (one line per job), or ``TRAINTEL_QUIET``."""
    quiet = environ.get(TRAINTEL_QUIET, "").strip().lower() in ("1", "true", "yes", "on")
    return quiet or rank not in (0, None)


def greeting(
    output: Path | None,
    trace_exporters: list[str] | None,
    rank: object,
    environ: Mapping[str, str] = os.environ,
    scraped: str | None = None,
) -> str | None:
    """The line a job writes as its telemetry starts (where it goes), or None as for
    :func:`farewell`. ``scraped``: the address its metrics are served on for Prometheus."""
    if _silent(rank, environ):
        return None
    endpoint = _endpoint_used(trace_exporters, environ)
    targets = [f"{endpoint} (OTLP)"] if endpoint else []
    if output is not None:
        in_file = _spans_in_file(trace_exporters, environ)
        targets.append(str(output) if in_file else f"{output} (metrics only)")
    if scraped is not None:
        targets.append(f"{scraped} (metrics, for Prometheus to scrape)")
    return f"traintel: telemetry of this run goes to {' and '.join(targets)}" if targets else None


def farewell(
    output: Path | None,
    trace_exporters: list[str] | None,
    rank: object,
    environ: Mapping[str, str] = os.environ,
    spooled: bool = False,
    unwritten: bool = False,
) -> str | None:
    """The line to write, or None: another rank's job, ``TRAINTEL_QUIET``, or nothing known.
    ``spooled``: spans the collector did not take are left in the spool, or were dropped
    (said just before): the line does not claim they were sent. ``unwritten``: the file could
    not be written at all (its directory is a file, or read-only): the line does not point at it."""
    if _silent(rank, environ):
        return None
    endpoint = _endpoint_used(trace_exporters, environ)
    sent = "could not all be sent to" if spooled else "was sent to"
    where = f"{sent} {endpoint} (OTLP)" if endpoint else ""
    if output is not None:
        return "traintel: telemetry of this run " + _kept(where, output, trace_exporters, environ, unwritten)
    return f"traintel: telemetry of this run {where}" if where else None


def _kept(
    sent: str, output: Path, trace_exporters: list[str] | None, environ: Mapping[str, str], unwritten: bool
) -> str:
    """Where the file is, after where the spans were ``sent`` (if anywhere), and what reads it."""
    if unwritten:
        lost = f"could not be written to {output} (said above; TRAINTEL_OUTPUT_DIR sets where it goes)"
        return f"{sent}, but {lost}" if sent else lost
    where = f"{sent} and is kept in {output}" if sent else f"is in {output}"
    if not _spans_in_file(trace_exporters, environ):
        return f"{where} (metrics only)"
    return f"{where}; read it with: {traintel_command(environ)} summary {shlex.quote(str(output.parent))}"


def say(line: str | None) -> None:
    """Write :func:`greeting`'s or :func:`farewell`'s line in one write, so the lines of processes
    sharing a terminal (``torch.multiprocessing.spawn``'s) do not run into each other; never
    raises (stderr may be closed)."""
    with contextlib.suppress(Exception):
        if line is not None:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
