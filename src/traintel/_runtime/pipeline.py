"""Tracer and meter providers: attach to the user's, or build them from ``OTEL_*``.

Rules (DESIGN rule 2): a provider the user (or ``opentelemetry-instrument``) already set is
never replaced; traintel adds its span processor to it. Only when nothing is configured does
traintel build providers, and then through the SDK's own machinery: ``Resource.create`` reads
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, ``TracerProvider`` reads
``OTEL_TRACES_SAMPLER(_ARG)``, ``BatchSpanProcessor`` reads ``OTEL_BSP_*``,
``PeriodicExportingMetricReader`` reads ``OTEL_METRIC_EXPORT_*``, and each OTLP exporter reads
its endpoint, headers, timeout, compression, certificate and insecure settings itself. What
traintel decides is only *which* exporters: ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``
through the standard entry points, ``otlp`` resolved by ``OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)PROTOCOL``,
and the embedded file when no exporter and no OTLP endpoint is configured.

Why our own bounded shutdown: the SDK's atexit hook joins its export thread without a bound,
so a dead collector can hold a finished job for minutes.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple, NoReturn
from urllib.parse import urlsplit

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision

from traintel import semconv
from traintel._sdk import otel_private
from traintel._sdk.export_filter import IterationExportFilter, TraceBudget
from traintel._sdk.ids import ForcingIdGenerator
from traintel._sdk.otel_private import span_writer
from traintel._sdk.providers import (
    DirectSpans,
    OwnedTracerProvider,
    _is_unset_meter_provider,
    build_resource,
)
from traintel.config import ConfigurationError, TrainingConfig
from traintel.exporters import redaction as _redaction
from traintel.exporters import retry_lines, tls_errors
from traintel.exporters.file import (
    FILE_METRIC_EXPORT_INTERVAL_MILLIS,
    FILE_SPAN_EXPORT_DELAY_MILLIS,
    OtlpJsonFileLogExporter,
    OtlpJsonFileMetricExporter,
    OtlpJsonFileSpanExporter,
    OtlpJsonLinesFile,
    _file_name,
    made_default_file,
)
from traintel.exporters.health import EXIT_TIMEOUT, HEALTH
from traintel.exporters.http_session import CertificateSession, needs_certificate_session
from traintel.exporters.metric_counting import CountingMetricExporter
from traintel.exporters.otlp_env import PROTOCOLS, SIGNAL_VARS, otlp_protocol, otlp_timeout, report, warn_once
from traintel.exporters.process_bound import ProcessBoundMetricExporter, ProcessBoundSpanExporter
from traintel.exporters.records import FILE_SUFFIX
from traintel.exporters.spool import Spool
from traintel.exporters.spooling import (
    CountingBatchSpanProcessor,
    QueueGuard,
    SpoolingSpanExporter,
    guard_queue,
)
from traintel.resource_detectors import TrainingResourceDetector, distributed_identity
from traintel.version import __version__

_logger = logging.getLogger(__name__)

FILE_EXPORTER = "traintel_file"
#: The embedded file's exporter of each signal.
_FILE_EXPORTERS: dict[str, Callable[..., Any]] = {
    "traces": OtlpJsonFileSpanExporter,
    "metrics": OtlpJsonFileMetricExporter,
    "logs": OtlpJsonFileLogExporter,
}

#: What a build step reads from the environment, with the words its errors use for each
#: variable: the SDK's errors rarely name the variable, and do not always quote the value.
_Settings = Mapping[str, tuple[str, ...]]
_OTLP_SETTINGS: _Settings = {
    "ENDPOINT": ("url", "endpoint", "port", "host"),
    "TIMEOUT": ("timeout",),
    "COMPRESSION": ("compression",),
    "HEADERS": ("header",),
    "CERTIFICATE": ("certificate",),
    "CLIENT_KEY": ("private key", "client key"),
    "CLIENT_CERTIFICATE": ("client certificate",),
    "INSECURE": ("insecure",),
}
_BSP_SETTINGS: _Settings = {
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": ("max_export_batch_size",),  # first: its error names the queue too
    "OTEL_BSP_MAX_QUEUE_SIZE": ("max_queue_size",),
    "OTEL_BSP_SCHEDULE_DELAY": ("schedule_delay",),
    "OTEL_BSP_EXPORT_TIMEOUT": ("export_timeout",),
}
_READER_SETTINGS: _Settings = {
    "OTEL_METRIC_EXPORT_INTERVAL": ("interval",),
    "OTEL_METRIC_EXPORT_TIMEOUT": ("timeout",),
}
#: The span limits' errors name their variable themselves.
_TRACER_PROVIDER_SETTINGS: _Settings = {
    "OTEL_TRACES_SAMPLER_ARG": ("ratio", "probability"),
    "OTEL_TRACES_SAMPLER": ("sampler",),
}
_METER_PROVIDER_SETTINGS: _Settings = {"OTEL_METRICS_EXEMPLAR_FILTER": ("exemplar",)}


def _otlp_settings(signal: str) -> _Settings:
    """The OTLP exporters' variables for ``signal``, the per-signal ones first (they win)."""
    per_signal = {f"OTEL_EXPORTER_OTLP_{signal.upper()}_{s}": w for s, w in _OTLP_SETTINGS.items()}
    return per_signal | {f"OTEL_EXPORTER_OTLP_{s}": w for s, w in _OTLP_SETTINGS.items()}


def _bad_variable(detail: str, settings: _Settings, environ: Mapping[str, str]) -> str | None:
    """The variable an SDK error is about: a set ``OTEL_*`` variable it names, else one of the
    step's ``settings`` whose value it quotes, else one whose words it uses."""
    present = {k: v for k, v in environ.items() if k.startswith("OTEL_") and v.strip()}
    candidates = {name: present[name] for name in settings if name in present}
    return _named(detail, present) or _quoted(detail, candidates) or _worded(detail, candidates, settings)


def _named(detail: str, present: Mapping[str, str]) -> str | None:
    return next((name for name in present if re.search(rf"\b{re.escape(name)}\b", detail)), None)


def _quoted(detail: str, candidates: Mapping[str, str]) -> str | None:
    return next((n for n, v in candidates.items() if repr(v) in detail or f'"{v}"' in detail), None)


def _worded(detail: str, candidates: Mapping[str, str], settings: _Settings) -> str | None:
    lowered = detail.lower()
    return next((name for name in candidates if any(w in lowered for w in settings[name])), None)


def _sdk_error(
    what: str, exc: Exception, settings: _Settings, environ: Mapping[str, str]
) -> ConfigurationError:
    """``exc``, raised while ``what``, as one error naming the variable and its value where they
    can be found; credentials are named, never shown."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    variable = _bad_variable(detail, settings, environ)
    if variable is None:
        message = f"{what}: {type(exc).__name__}: {detail}"
    elif _not_shown(variable, environ[variable]):
        message = f"{variable} (value not shown): {what}: {detail}"
    else:
        message = f"{variable}={environ[variable]!r}: {what}: {detail}"
    return ConfigurationError(_redaction.redact(message, _redaction.header_secrets(environ)))


def _not_shown(variable: str, value: str) -> bool:
    """Header values are credentials; so may be an endpoint's userinfo and query, which are
    redacted only where the URL parses: an endpoint with either that does not is not shown."""
    if variable in _redaction.HEADER_VARIABLES:
        return True
    if variable not in _redaction.ENDPOINT_VARIABLES or not ("@" in value or "?" in value):
        return False
    try:
        urlsplit(value.strip())
    except ValueError:
        return True
    return False


def _raise(what: str, exc: Exception, settings: _Settings, environ: Mapping[str, str]) -> NoReturn:
    error = _sdk_error(what, exc, settings, environ)
    # A cause that quotes a credential would print it with the traceback: then it is left out.
    leaks = _redaction.redact(str(exc), _redaction.header_secrets(environ)) != str(exc)
    raise error from (None if leaks else exc)


def _exporter_failed(
    signal: str,
    name: str,
    exc: Exception,
    environ: Mapping[str, str],
    strict: bool,
    settings: _Settings | None = None,
    what: str = "",
) -> None:
    """Explicit configuration fails; the automatic one says so and goes on without that exporter
    (one bad exporter never turns the others, or the other signal, off)."""
    what = what or f"{signal} exporter {name!r} could not start"
    settings = _otlp_settings(signal) if settings is None else settings
    if strict:
        _raise(what, exc, settings, environ)
    _logger.error("traintel: %s (going on without it)", _sdk_error(what, exc, settings, environ))


def _undo(steps: list[Callable[[], None]]) -> None:
    """Stop, newest first, what a failed build started: its threads must not outlive it."""
    for step in reversed(steps):
        try:
            step()
        except Exception:
            _logger.debug("traintel: stopping a half-built pipeline", exc_info=True)


def _check_endpoint_scheme(signal: str, protocol: str, environ: Mapping[str, str], strict: bool) -> None:
    """An endpoint written ``collector:4317`` has no scheme: HTTP cannot send to it at all, and
    the gRPC exporter then speaks TLS unless ``OTEL_EXPORTER_OTLP_(SIGNAL_)INSECURE`` is ``true``
    (the signal's own wins), so a plaintext collector never answers. Either way the fix is one
    word; say it up front."""
    insecure = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_INSECURE") or environ.get(
        "OTEL_EXPORTER_OTLP_INSECURE", ""
    )
    for variable in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        value = environ.get(variable, "").strip()
        if not value:
            continue
        if "://" not in value:
            fix = f"write http://{value} (plaintext) or https://{value} (TLS)"
            if protocol == "http/protobuf":
                report(ConfigurationError(f"{variable}={value!r} has no scheme: {fix}"), strict)
            elif insecure.strip().lower() != "true":
                warn_once(f"{variable}={value!r} has no scheme, so gRPC uses TLS to reach it: {fix}")
        else:
            _check_endpoint_port(signal, variable, value, protocol)
        return  # the signal's own variable wins: the general one is not read


#: The collector's OTLP ports by protocol, as its default configuration opens them.
_OTLP_PORTS: Final = {"grpc": 4317, "http/protobuf": 4318}


def _check_endpoint_port(signal: str, variable: str, value: str, protocol: str) -> None:
    """The two mistakes that send nothing with no word but a retry line: the other protocol's
    port (gRPC to 4318 answers "Failed parsing HTTP/2"), and a signal's own HTTP endpoint
    without its path (used as given, so the collector answers 404)."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:  # not a URL: the exporter says so
        return
    shown = _redaction.redact(value, _redaction.url_secrets(value))
    other = next((name for name, number in _OTLP_PORTS.items() if number == port), protocol)
    if other != protocol:
        warn_once(
            f"{variable}={shown!r} is the collector's OTLP {other} port, and the protocol is {protocol}: "
            f"set OTEL_EXPORTER_OTLP_PROTOCOL={other}, or use its {protocol} port ({_OTLP_PORTS[protocol]})"
        )
    if protocol == "http/protobuf" and variable != "OTEL_EXPORTER_OTLP_ENDPOINT" and parts.path in ("", "/"):
        warn_once(
            f"{variable}={shown!r} is used as given, without the path the collector takes {signal} "
            f"on: write {shown.rstrip('/')}/v1/{signal} (or set OTEL_EXPORTER_OTLP_ENDPOINT, to "
            "which the path is added)"
        )


def exporter_names(signal: str, environ: Mapping[str, str]) -> list[str]:
    """Exporter names for ``signal`` as the user asked, or the embedded default.

    An OTLP endpoint without an exporter list means "send OTLP there"; nothing at all means
    the local file, so a fresh machine never retries against a collector that is not there.
    """
    exporter_var, endpoint_var, _ = SIGNAL_VARS[signal]
    raw = environ.get(exporter_var, "").strip()
    if raw:
        names = [n.strip() for n in raw.split(",") if n.strip()]
        return [] if "none" in names else names
    if environ.get(endpoint_var, "").strip() or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        return ["otlp"]
    return [FILE_EXPORTER]


@dataclass
class _ExporterPlan:
    name: str
    factory: Callable[[], Any]
    #: The caller's own exporter (``span_exporters=``): a failed build hands it back open.
    lent: bool = False
    #: Built and exporting: what the job's first and last lines and its configuration event
    #: name (an exporter left out for a bad setting receives nothing).
    started: bool = False


#: Exporters the OpenTelemetry Python project ships apart, by the name that selects them.
_EXPORTER_PACKAGES: Final = {
    "prometheus": "opentelemetry-exporter-prometheus",
    "zipkin": "opentelemetry-exporter-zipkin",
}


def _plan_exporters(
    signal: str, environ: Mapping[str, str], file: OtlpJsonLinesFile, strict: bool
) -> list[_ExporterPlan]:
    """Resolve every exporter name to a factory, validating all before building any."""
    exporter_var = SIGNAL_VARS[signal][0]
    plans: list[_ExporterPlan] = []
    for name in exporter_names(signal, environ):
        if name == FILE_EXPORTER:
            plans.append(_ExporterPlan(name, functools.partial(_FILE_EXPORTERS[signal], file=file)))
            continue
        ep_name, timeout = _otlp_choice(signal, environ, strict) if name == "otlp" else (name, None)
        found = list(entry_points(group=f"opentelemetry_{signal}_exporter", name=ep_name))
        if not found:
            report(_unknown_exporter(signal, name, environ.get(exporter_var, name)), strict)
            continue
        try:
            cls = found[0].load()
        except Exception as exc:
            report(ConfigurationError(f"{exporter_var}: exporter {name!r} failed to load: {exc}"), strict)
            continue
        if name == "prometheus":
            local_rank = distributed_identity(environ)[1]
            plans.append(_ExporterPlan(name, functools.partial(_prometheus_reader, environ, local_rank)))
            continue
        certificate = ep_name == PROTOCOLS["http/protobuf"] and needs_certificate_session(signal, environ)
        plans.append(_ExporterPlan(name, _factory(cls, certificate, timeout)))
    return plans


def _unknown_exporter(signal: str, name: str, setting: str) -> ConfigurationError:
    """The error for an exporter name no entry point has: the installed ones, and the package
    to install where the OpenTelemetry project ships that exporter apart."""
    exporter_var = SIGNAL_VARS[signal][0]
    known = {ep.name for ep in entry_points(group=f"opentelemetry_{signal}_exporter")}
    package = _EXPORTER_PACKAGES.get(name)
    install = f"; pip install {package}" if package else ""
    return ConfigurationError(
        f"{exporter_var}={setting!r}: unknown exporter {name!r} "
        f"(installed: {', '.join(sorted(known | {'otlp', 'none'}))}{install})"
    )


def prometheus_address(environ: Mapping[str, str], local_rank: int) -> tuple[str, int]:
    """Where a rank serves its metrics for scraping: ``OTEL_EXPORTER_PROMETHEUS_HOST``
    (localhost) and ``OTEL_EXPORTER_PROMETHEUS_PORT`` (9464) plus its local rank."""
    host = environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
    return host, int(environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")) + local_rank


def _prometheus_reader(environ: Mapping[str, str], local_rank: int) -> Any:
    """The Prometheus exporter's reader, serving on ``OTEL_EXPORTER_PROMETHEUS_PORT`` (9464) plus
    the process's local rank: the ranks of one host each serve their own metrics. (On the one
    port, every rank but the first failed to start it, and its metrics went elsewhere.) A port
    taken is said with the port and where it comes from."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    host, port = prometheus_address(environ, local_rank)
    try:
        start_http_server(port=port, addr=host)
    except OSError as exc:  # the port taken: say which, and where it comes from
        raise OSError(
            f"{exc.strerror or exc} on {host}:{port} (OTEL_EXPORTER_PROMETHEUS_PORT "
            f"{port - local_rank} + local rank {local_rank})"
        ) from exc
    return PrometheusMetricReader()


def _otlp_choice(signal: str, environ: Mapping[str, str], strict: bool) -> tuple[str, float | None]:
    """The OTLP exporter's entry point (by protocol), and a timeout to give it (None: its own)."""
    protocol = otlp_protocol(signal, environ, strict)
    _check_endpoint_scheme(signal, protocol, environ, strict)
    return PROTOCOLS[protocol], otlp_timeout(signal, environ, strict)


def _factory(cls: Any, certificate: bool, timeout: float | None) -> Callable[[], Any]:
    """The exporter's constructor with what traintel gives it: an HTTP session holding the
    client certificate, a timeout (see :func:`otlp_timeout`)."""
    given: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if certificate:
        return lambda: cls(session=CertificateSession(), **given)
    return functools.partial(cls, **given)


def _spooling(
    exporter: SpanExporter, name: str, config: TrainingConfig, resource: Resource | None, hint: str = ""
) -> SpoolingSpanExporter:
    """``exporter`` behind the spool: one directory per process and exporter (ranks never share)."""
    settings = config.resolve(lazy=False)  # what shapes files and exit is never lazy
    max_bytes = settings.spool_max_bytes
    spool = None
    if max_bytes > 0:
        base = settings.spool_dir or Path(settings.output_dir) / "spool"
        service = str((resource or Resource.get_empty()).attributes.get(semconv.SERVICE_NAME, "traintel"))
        process = _file_name(service, time.time(), os.getpid()).removesuffix(FILE_SUFFIX)
        safe_name = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
        spool = Spool(Path(str(base)) / f"{process}-{safe_name}", max_bytes)
    return SpoolingSpanExporter(
        exporter,
        spool,
        retry_interval_s=settings.spool_retry_interval,
        drain_timeout_s=0.8 * settings.shutdown_timeout,
        hint=hint,
    )


class LogPipeline:
    """Where traintel's log records (its hang reports) go.

    Rule 2: a LoggerProvider someone set globally (the user, ``opentelemetry-instrument``) is
    used as it is, and so is the global one (a proxy until someone sets it) when the caller gave
    traintel its own providers or exporters. Otherwise traintel builds one from
    ``OTEL_LOGS_EXPORTER`` (the embedded file by default, like the other signals), on the first
    record: a job that never reports a hang starts no thread and loads no logs code for it.
    """

    def __init__(self, plans: list[_ExporterPlan] | None, resource: Resource | None) -> None:
        self._plans = plans  # None: the global provider
        self._resource = resource
        self._lock = threading.Lock()
        self._provider: Any = None  # built by traintel, so shut down by it
        self._logger: otel_private.Logger | None = None

    def logger(self) -> otel_private.Logger:
        """traintel's logger (built on first use, from any thread)."""
        with self._lock:
            if self._logger is None:
                self._logger = self._built().get_logger(semconv.INSTRUMENTATION_SCOPE, __version__)
            return self._logger

    def _built(self) -> otel_private.ApiLoggerProvider:
        if self._plans is None:
            return otel_private.get_logger_provider()
        provider = self._provider = otel_private.LoggerProvider(
            resource=self._resource, shutdown_on_exit=False
        )
        for plan in self._plans:
            try:
                exporter = plan.factory()
                provider.add_log_record_processor(otel_private.BatchLogRecordProcessor(exporter))
            except Exception as exc:  # checked at configure; what fails now is said, never raised
                _exporter_failed("logs", plan.name, exc, os.environ, strict=False)
        return provider

    def flush(self, millis: int) -> None:
        with self._lock:
            provider = self._provider
        if provider is None and self._plans is None and self._logger is not None:
            provider = otel_private.get_logger_provider()  # the user's: flushed, not shut down
        if provider is not None:
            _call(provider, "force_flush", millis)

    def shutdown(self, millis: int) -> None:
        with self._lock:
            provider, self._provider = self._provider, None
            self._plans = [] if self._plans is not None else None  # a late record builds nothing
        if provider is not None:
            _call(provider, "force_flush", millis)
            _call(provider, "shutdown")
        elif self._logger is not None:
            self.flush(millis)


def environment_log_pipeline(resource: Resource, path: str | None) -> LogPipeline:
    """A logs pipeline from ``OTEL_*`` alone, its embedded file at ``path`` (the helper process
    of ``traintel._runtime.gil_helper``, which cannot reach the rank's own)."""
    file = OtlpJsonLinesFile(path=path) if path else OtlpJsonLinesFile()
    return LogPipeline(_plan_exporters("logs", os.environ, file, strict=False), resource)


#: The queue guard of a batch processor (traintel's, or one the distro built) and its spool, if any.
ExportPath = tuple[QueueGuard, SpoolingSpanExporter | None]


@dataclass
class Pipeline:
    """The providers traintel records into, and whether it owns (and so shuts down) them."""

    tracer_provider: trace_api.TracerProvider
    meter_provider: metrics_api.MeterProvider
    owns_tracer_provider: bool
    owns_meter_provider: bool
    #: The span exporters traintel started; None where it did not build the tracer provider.
    trace_exporters: list[str] | None = None
    metric_exporters: list[str] = field(default_factory=list)
    file: OtlpJsonLinesFile | None = None
    #: Owned providers: the filter in front of the exporting processors.
    export_filter: IterationExportFilter | None = None
    #: Owned providers: each exporting batch processor with its spooling wrapper (if any).
    export_paths: list[ExportPath] = field(default_factory=list)
    #: Owned providers: the embedded file's batch span processor, if spans go to the file.
    file_spans: BatchSpanProcessor | None = None
    #: Where traintel's log records go (built on the first one).
    logs: LogPipeline = field(default_factory=lambda: LogPipeline(None, None))
    #: The resource of the providers traintel built (None: it built none).
    built_resource: Resource | None = None
    _shut_down: bool = False

    @property
    def resource(self) -> Resource:
        """The job's resource: the one traintel built its providers with, else the user's tracer
        provider's. Why not always the tracer provider's: beside a user's own tracer provider,
        the meters traintel builds carry the run's identity, rank and service name (the embedded
        file is named after it), which the user's resource may lack."""
        if self.built_resource is not None:
            return self.built_resource
        return getattr(self.tracer_provider, "resource", None) or Resource.get_empty()

    def output_file(self) -> Path | None:
        return self._path_of(self.file)

    def _path_of(self, file: OtlpJsonLinesFile | None) -> Path | None:
        """Where ``file`` is, or will be at its first write for this job's service."""
        if file is None:
            return None
        service = str(self.resource.attributes.get(semconv.SERVICE_NAME, "traintel"))
        return file.path or file.planned_path(service)

    def run_file(self) -> Path | None:
        """The embedded file if the run's spans or metrics go to it: what the job's first and
        last lines name. (Where the OTLP exporters alone export them, the file holds at most
        hang records: named, it was a file that did not exist, or held no span.) Under
        providers traintel did not build (``opentelemetry-instrument``'s), the file their
        ``traintel_file`` exporters share, if ``OTEL_TRACES_EXPORTER`` or ``OTEL_METRICS_EXPORTER``
        made them."""
        exporters = [*(self.trace_exporters or []), *self.metric_exporters]
        if FILE_EXPORTER in exporters:
            return self.output_file()
        return self._path_of(made_default_file() if self.trace_exporters is None else None)

    def add_span_processor(self, processor: SpanProcessor) -> None:
        provider = self.tracer_provider
        if isinstance(provider, OwnedTracerProvider):
            provider.add_traintel_processor(processor)
        else:
            provider.add_span_processor(processor)  # type: ignore[attr-defined]

    def direct_spans(self, tracer: trace_api.Tracer) -> DirectSpans | None:
        """How traintel's own finished spans can skip the tracer, if they can (see SpanWriter)."""
        provider, export_filter = self.tracer_provider, self.export_filter
        if not isinstance(provider, OwnedTracerProvider) or export_filter is None:
            return None
        writer = span_writer(tracer)
        return DirectSpans(writer, export_filter.forward, provider) if writer is not None else None

    def flush_file_spans(self, timeout_s: float) -> None:
        """Write the spans the embedded file gathers now, not when its batch is due (a minute:
        see ``FILE_SPAN_EXPORT_DELAY_MILLIS``). For the end of an application: a process that
        lives on after training (a notebook, a script that goes on to evaluate or upload) read
        as "no spans yet" until then. The network exporters keep their own schedule."""
        if self.file_spans is not None:
            _call(self.file_spans, "force_flush", int(timeout_s * 1000))

    def flush(self, timeout_s: float) -> bool:
        """Export what is buffered, waiting at most ``timeout_s``; never raises."""
        millis = int(timeout_s * 1000)

        def flush_traces() -> None:
            _call(self.tracer_provider, "force_flush", millis)
            for _processor, spooler in self.export_paths:  # sent, or safe in the spool
                if spooler is not None:
                    _call(spooler, "force_flush", millis)

        return _bounded(
            [
                ("spans", flush_traces),
                ("metrics", lambda: _call(self.meter_provider, "force_flush", millis)),
                ("logs", lambda: self.logs.flush(millis)),
            ],
            timeout_s,
            "flush",
        )

    def shutdown(self, timeout_s: float) -> bool:
        """Flush and release everything traintel owns within ``timeout_s``; never raises.

        Providers the user owns are flushed, not shut down: their lifecycle is theirs.
        """
        if self._shut_down:
            return True
        self._shut_down = True
        millis = int(timeout_s * 1000)
        tasks: list[tuple[str, Callable[[], None]]] = [
            ("spans", lambda: self._end_traces(millis)),
            ("metrics", lambda: self._end_metrics(millis)),
            ("logs", lambda: self.logs.shutdown(millis)),
        ]
        done = _bounded(tasks, timeout_s, "shutdown")
        if not done:
            self._spill()
        for line in HEALTH.new_report_lines():
            _logger.warning("traintel: telemetry export: %s", line)
        return done

    def _end_traces(self, millis: int) -> None:
        _call(self.tracer_provider, "force_flush", millis)
        if self.owns_tracer_provider:
            _call(self.tracer_provider, "shutdown")

    def _end_metrics(self, millis: int) -> None:
        if not self.owns_meter_provider:
            _call(self.meter_provider, "force_flush", millis)
            return
        readers = otel_private.collecting_threads(self.meter_provider)  # before: 1.40 forgets them
        _call(self.meter_provider, "shutdown", millis)
        for thread in readers:  # each one's last collection (the last metric line): this
            thread.join()  # task waits for it, and the bound says so if it runs out first

    def _spill(self) -> None:
        """The exit bound was reached: what is queued or in flight goes to the spool, not away."""
        for guard, spooler in self.export_paths:
            try:
                queued = guard.take_queued()
                if spooler is not None:
                    spooler.spill(queued)
                elif queued:
                    HEALTH.drop_spans(EXIT_TIMEOUT, len(queued))
            except Exception:
                _logger.exception("traintel: could not spool the spans left at exit")


#: Said once with the first failed export of providers the distro built with no endpoint set.
_DISTRO_DEFAULT_HINT = (
    "No OTLP endpoint is set, so opentelemetry-instrument exports to localhost (4317 gRPC, 4318 "
    "HTTP): point OTEL_EXPORTER_OTLP_ENDPOINT at your collector, or keep telemetry in a local file "
    "with OTEL_TRACES_EXPORTER=traintel_file OTEL_METRICS_EXPORTER=traintel_file"
)


def adopt_instrumented_providers(
    pipeline: Pipeline, config: TrainingConfig, tracers: Iterable[Any] = ()
) -> int:
    """Under ``opentelemetry-instrument``: give the providers the distro built what traintel's
    own have. Their resource gains the run's identity (unless the user named the detectors),
    their span exporters go behind the spool, their queues' drops and their metric
    exports are counted, and their exit is bounded by ``TRAINTEL_SHUTDOWN_TIMEOUT`` (traintel
    shuts them down; the SDK's own unbounded exit hooks are removed). Returns how many span
    exporters were put behind the spool.

    Why only here: providers a user's own code built are theirs to run; the distro's are built
    from ``OTEL_*`` alone, as traintel's would be, and without this a job whose collector is
    not there retries at exit for the exporters' whole timeout and loses what it held, uncounted.
    """
    tracer_provider, meter_provider = pipeline.tracer_provider, pipeline.meter_provider
    if pipeline.owns_tracer_provider or not isinstance(tracer_provider, TracerProvider):
        return 0
    _add_training_resource(tracer_provider, meter_provider, config, tracers)
    processors = otel_private.span_processors(tracer_provider)
    unreached = [] if processors is not None else ["span processors"]
    _count_metric_exports(meter_provider, unreached)
    adopted = _spool_batch_exporters(pipeline, processors or (), config, unreached)
    if unreached:
        _logger.warning(
            "traintel: this OpenTelemetry SDK release keeps its %s where traintel does not find "
            "them: the exporters opentelemetry-instrument built are used as they are, without "
            "traintel's spool and loss counting",
            " and ".join(dict.fromkeys(unreached)),
        )
    retry_lines.install()
    for provider in (tracer_provider, meter_provider):
        if hasattr(provider, "shutdown"):
            atexit.unregister(provider.shutdown)
    pipeline.owns_tracer_provider = True
    pipeline.owns_meter_provider = isinstance(meter_provider, MeterProvider)
    return adopted


def _spool_batch_exporters(
    pipeline: Pipeline, processors: Iterable[SpanProcessor], config: TrainingConfig, unreached: list[str]
) -> int:
    """Put the exporters of the distro's batch processors behind the spool; how many were."""
    endpoint_set = any(
        os.environ.get(variable, "").strip()
        for variable in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    adopted = 0
    for candidate in processors:
        adoptable = _adoptable(candidate, unreached)
        if adoptable is None:
            continue
        processor, exporter = adoptable
        hint = "" if endpoint_set or adopted else _DISTRO_DEFAULT_HINT
        spooler = _spooling(exporter, type(exporter).__name__, config, pipeline.resource, hint)
        if otel_private.replace_batch_exporter(processor, spooler):
            pipeline.export_paths.append((guard_queue(processor), spooler))
            adopted += 1
    return adopted


def _count_metric_exports(meter_provider: object, unreached: list[str]) -> None:
    """The distro's periodic readers export through a counting exporter."""
    readers = otel_private.periodic_readers(meter_provider)
    if readers is None and isinstance(meter_provider, MeterProvider):
        unreached.append("metric readers")
    for reader in readers or ():
        otel_private.replace_reader_exporter(reader, CountingMetricExporter)


def _adoptable(processor: SpanProcessor, unreached: list[str]) -> tuple[BatchSpanProcessor, Any] | None:
    """A distro's batch processor and its exporter, if that is not behind traintel's parts yet."""
    if not isinstance(processor, BatchSpanProcessor) or isinstance(processor, CountingBatchSpanProcessor):
        return None
    exporter = otel_private.batch_exporter(processor)
    if exporter is None:
        unreached.append("batch span processors' exporters")
        return None
    if isinstance(exporter, SpoolingSpanExporter | OtlpJsonFileSpanExporter | ProcessBoundSpanExporter):
        return None
    return processor, exporter


#: The SDK's variable naming the resource detectors its providers apply (the distro reads it).
_RESOURCE_DETECTORS = "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"


def _add_training_resource(
    tracer_provider: Any, meter_provider: Any, config: TrainingConfig, tracers: Iterable[Any]
) -> None:
    """The run identity, ranks and host (traintel's detectors) added to the resource the distro
    built, where the user named no detectors: without them a run read back has no run, rank or
    host. The distro's own attributes win (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``)."""
    if os.environ.get(_RESOURCE_DETECTORS, "").strip():
        return  # the detectors the user named are what applies
    try:
        detected = TrainingResourceDetector(config).detect()
        meters = meter_provider if isinstance(meter_provider, MeterProvider) else None
        added = otel_private.add_resource(tracer_provider, meters, detected, tracers)
    except Exception:  # a detector must never fail a job
        _logger.warning("traintel: could not add the run's identity to the distro's resource", exc_info=True)
        return
    if not added:
        _logger.warning(
            "traintel: this OpenTelemetry SDK release keeps its providers' resource where traintel does not "
            "find it: set %s=traintel for the run's identity on its telemetry",
            _RESOURCE_DETECTORS,
        )


def _call(target: object, method: str, *args: Any) -> None:
    fn = getattr(target, method, None)
    if fn is None:
        return
    try:
        fn(*args)
    except Exception as exc:
        if "MetricsTimeoutError" in f"{type(exc).__name__} {exc}":  # the SDK wraps it in a plain one
            retry_lines.collection_timed_out()  # counted, said once: the next collection has the totals
            return
        _logger.exception("traintel: %s.%s failed", type(target).__name__, method)


#: What a signal's task of a bounded flush or exit waits on when no export is under way.
_OWN_WORK = {
    "spans": "the batch span processor",
    "metrics": "the metric reader's collection (the last metric line is not written)",
    "logs": "the log record processor (hang records)",
}


def _bounded(tasks: list[tuple[str, Callable[[], None]]], timeout_s: float, what: str) -> bool:
    """Run tasks (one per signal) in parallel daemon threads and wait for them at
    most ``timeout_s`` in total; if that runs out, say what they were waiting on: the
    telemetry file, a collector, or their own work (a collection short of CPU).

    Daemon threads: if an exporter is stuck on a black-holed socket, the interpreter may still
    exit when the bound is reached.
    """
    threads = [(name, threading.Thread(target=t, name=f"traintel-{what}", daemon=True)) for name, t in tasks]
    for _name, thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for _name, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [name for name, thread in threads if thread.is_alive()]
    if stuck:
        _logger.warning(
            "traintel: telemetry %s did not finish within %.1fs, still waiting for %s; going on without it",
            what,
            timeout_s,
            " and ".join(_waited_for(stuck)),
        )
    return not stuck


def _waited_for(stuck: list[str]) -> list[str]:
    """What the stuck tasks wait on: an export under way, else their own work."""
    waiting = HEALTH.busy_now()
    for name in stuck:
        if not any(name[:-1] in label or "file" in label for label in waiting):
            waiting.append(_OWN_WORK[name])
    return waiting


@dataclass
class _OwnedBuild:
    """traintel's own providers, built around the planned exporters: what each step reads, and
    ``undo``, how to stop what was started (a failed build stops it, newest first). An exporter
    that cannot start fails explicit configuration; the automatic one says so and leaves it out."""

    config: TrainingConfig
    resource: Resource | None
    strict: bool
    environ: Mapping[str, str]
    #: The embedded file, where a signal goes when none of its exporters could start.
    file: OtlpJsonLinesFile | None = None
    undo: list[Callable[[], None]] = field(default_factory=list)
    #: The embedded file's batch span processor, once built.
    file_spans: BatchSpanProcessor | None = None

    def _planned(self, signal: str, plans: list[_ExporterPlan]) -> Iterator[_ExporterPlan]:
        """Each plan; then, where the automatic configuration started none of the exporters
        named (a bad compression value, say), the embedded file, said: the run is kept rather
        than recorded into nothing."""
        yield from plans
        if self.strict or self.file is None or not plans or any(p.started or p.lent for p in plans):
            return
        _logger.error(
            "traintel: no %s exporter could start: the run's %s go to the embedded file instead",
            signal,
            signal,
        )
        plans.append(_ExporterPlan(FILE_EXPORTER, functools.partial(_FILE_EXPORTERS[signal], file=self.file)))
        yield plans[-1]

    def tracer_provider(
        self, plans: list[_ExporterPlan], spool: bool
    ) -> tuple[OwnedTracerProvider, IterationExportFilter, list[ExportPath]]:
        """traintel's tracer provider: export filter, batching and spooling in front of ``plans``."""
        try:
            provider = OwnedTracerProvider(
                resource=self.resource,
                shutdown_on_exit=False,
                id_generator=ForcingIdGenerator(),
                meter_provider=_sdk_metrics_provider(),
            )
        except Exception as exc:
            _raise("the tracer provider could not be built", exc, _TRACER_PROVIDER_SETTINGS, self.environ)
        _check_sampler(provider, self.environ)
        export_paths = self.export_paths(plans, spool)
        export_filter = IterationExportFilter([batcher for batcher, _ in export_paths], TraceBudget())
        provider.add_traintel_processor(export_filter)
        return provider, export_filter, [(batcher.guard, spooler) for batcher, spooler in export_paths]

    def export_paths(
        self, plans: list[_ExporterPlan], spool: bool
    ) -> list[tuple[CountingBatchSpanProcessor, SpoolingSpanExporter | None]]:
        """A batch processor per span exporter, each behind a spool (network exporters built
        from ``OTEL_*``, when ``spool``)."""
        paths: list[tuple[CountingBatchSpanProcessor, SpoolingSpanExporter | None]] = []
        batching = _batch_settings(self.environ, self.strict) if plans else {}
        # The embedded file's processor gathers spans longer, unless OTEL_BSP_SCHEDULE_DELAY says.
        by_name: dict[str, dict[str, float]] = {}
        if not self.environ.get("OTEL_BSP_SCHEDULE_DELAY", "").strip():
            by_name[FILE_EXPORTER] = {**batching, "schedule_delay_millis": FILE_SPAN_EXPORT_DELAY_MILLIS}
        for plan in self._planned("traces", plans):
            path = self._span_path(plan, spool, by_name.get(plan.name, batching))
            if path is not None:
                paths.append(path)
                plan.started = True
                if plan.name == FILE_EXPORTER:
                    self.file_spans = path[0]
        return paths

    def _span_path(
        self, plan: _ExporterPlan, spool: bool, settings: dict[str, float]
    ) -> tuple[CountingBatchSpanProcessor, SpoolingSpanExporter | None] | None:
        """One exporter's batch processor, behind its spool; None (said) where it cannot start."""
        try:
            exporter: SpanExporter = plan.factory()
        except Exception as exc:
            _exporter_failed("traces", plan.name, exc, self.environ, self.strict)
            return None
        spooler = None
        if spool and plan.name != FILE_EXPORTER:
            exporter = spooler = _spooling(exporter, plan.name, self.config, self.resource)
        bound = ProcessBoundSpanExporter(exporter)
        try:
            processor = CountingBatchSpanProcessor(bound, health=HEALTH, **settings)
        except Exception as exc:
            if not plan.lent:
                self.undo.append(exporter.shutdown)
            what = f"the batch span processor of exporter {plan.name!r} could not start"
            _exporter_failed("traces", plan.name, exc, self.environ, self.strict, _BSP_SETTINGS, what)
            return None
        self.undo.append(functools.partial(_stop, processor, bound, plan.lent))
        return processor, spooler

    def meter_provider(
        self, plans: list[_ExporterPlan], callers_readers: Sequence[MetricReader]
    ) -> MeterProvider:
        """traintel's meter provider: a periodic reader per planned exporter, and the caller's own.

        Built last: once the caller's readers are registered on it, undoing would shut them down."""
        readers = self.periodic_readers(plans)
        try:
            return MeterProvider(
                metric_readers=[*callers_readers, *readers], resource=self.resource, shutdown_on_exit=False
            )
        except Exception as exc:
            _raise("the meter provider could not be built", exc, _METER_PROVIDER_SETTINGS, self.environ)

    def periodic_readers(self, plans: list[_ExporterPlan]) -> list[MetricReader]:
        """A periodic reader per metric exporter; network exporters' failures are counted (and
        said at exit)."""
        readers: list[MetricReader] = []
        given = _sdk_settings(self.environ, self.strict, _READER_DEFAULTS)
        for plan in self._planned("metrics", plans):
            try:
                built: MetricExporter | MetricReader = plan.factory()
            except Exception as exc:
                _exporter_failed("metrics", plan.name, exc, self.environ, self.strict)
                continue
            if isinstance(built, MetricReader):  # a pull endpoint (prometheus): its own reader
                self.undo.append(built.shutdown)
                readers.append(built)
                plan.started = True
                continue
            interval = given.get("export_interval_millis")  # None: the SDK reads the variable
            if plan.name == FILE_EXPORTER:
                bound: MetricExporter = ProcessBoundMetricExporter(built)
                if not self.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip():
                    interval = FILE_METRIC_EXPORT_INTERVAL_MILLIS  # unset: the file's own
            else:
                bound = CountingMetricExporter(built)
            try:
                reader = PeriodicExportingMetricReader(
                    bound,
                    export_interval_millis=interval,
                    export_timeout_millis=given.get("export_timeout_millis"),
                )
            except Exception as exc:
                self.undo.append(bound.shutdown)
                what = f"the periodic metric reader of exporter {plan.name!r} could not start"
                _exporter_failed("metrics", plan.name, exc, self.environ, self.strict, _READER_SETTINGS, what)
                continue
            self.undo.append(reader.shutdown)
            readers.append(reader)
            plan.started = True
        return readers


def _check_sampler(provider: TracerProvider, environ: Mapping[str, str]) -> None:
    """Say once that ``OTEL_TRACES_SAMPLER`` drops traces: traintel measures training from its
    spans, so a dropped trace is missing from its metrics (throughput, goodput, MFU) and
    records, not only from export (``always_off`` left a run with no duration, throughput or
    goodput metric and no readable span). Asked of the sampler itself: a root span of the
    highest trace id is dropped by every sampler that drops any."""
    try:
        decision = provider.sampler.should_sample(None, (1 << 128) - 1, "training_iteration").decision
    except Exception:  # a sampler of someone else's: what it does is not ours to judge
        return
    if decision is Decision.RECORD_AND_SAMPLE:
        return
    arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    given = f"OTEL_TRACES_SAMPLER={environ.get('OTEL_TRACES_SAMPLER', '').strip()!r}"
    warn_once(
        f"{given}{f' (OTEL_TRACES_SAMPLER_ARG={arg!r})' if arg else ''} drops traces, and traintel "
        "measures training from its spans: the iterations, windows and checkpoints of a dropped "
        "trace are missing from its metrics (throughput, goodput, MFU), summary and reports. "
        "traintel chooses the spans it exports itself (TRAINTEL_EXPORT_ITERATIONS): unset the sampler"
    )


#: What the SDK's batch span processor and periodic metric reader read from ``OTEL_*``: the
#: variable, their keyword, the SDK's default (an integer where the SDK wants one) and the
#: value it must be above.
_BATCH_DEFAULTS = (
    ("OTEL_BSP_MAX_QUEUE_SIZE", "max_queue_size", 2048, 0),
    ("OTEL_BSP_SCHEDULE_DELAY", "schedule_delay_millis", 5000, 0),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "max_export_batch_size", 512, 0),
    ("OTEL_BSP_EXPORT_TIMEOUT", "export_timeout_millis", 30000, -1),
)
_READER_DEFAULTS = (
    ("OTEL_METRIC_EXPORT_INTERVAL", "export_interval_millis", 60_000.0, 0),
    ("OTEL_METRIC_EXPORT_TIMEOUT", "export_timeout_millis", 30_000.0, 0),
)


def _sdk_settings(
    environ: Mapping[str, str], strict: bool, table: Sequence[tuple[str, str, float, int]]
) -> dict[str, float]:
    """The arguments ``table``'s variables give: each value set, a bad one (text, or not above
    its bound) replaced by the SDK's default and said. Why: the SDK refuses a non-positive value
    outright, and the automatic configuration lost the whole trace (``OTEL_BSP_SCHEDULE_DELAY=-5``)
    or every metric (``OTEL_METRIC_EXPORT_INTERVAL=0``); text it replaces with a traceback or a
    line naming neither variable nor value. Explicit configuration leaves them to the SDK, whose
    refusal it reports."""
    settings: dict[str, float] = {}
    for variable, keyword, default, above in table:
        raw = environ.get(variable, "").strip()
        if strict or not raw:
            continue
        try:
            value = type(default)(raw)
        except ValueError:
            value = math.nan
        if not above < value < math.inf:
            kind = "integer" if isinstance(default, int) else "number of milliseconds"
            sign = "positive" if above == 0 else "non-negative"
            _logger.warning(
                "traintel: %s=%r is not a %s %s; using the SDK's default %g",
                variable,
                raw,
                sign,
                kind,
                default,
            )
            value = default
        settings[keyword] = value
    return settings


def _batch_settings(environ: Mapping[str, str], strict: bool) -> dict[str, float]:
    """The batch span processors' arguments (see :func:`_sdk_settings`); a batch larger than the
    queue, which the SDK refuses too, is the queue's size."""
    settings = _sdk_settings(environ, strict, _BATCH_DEFAULTS)
    queue, batch = settings.get("max_queue_size", 2048), settings.get("max_export_batch_size", 512)
    if batch > queue:
        said = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=%d is over the queue's %d (OTEL_BSP_MAX_QUEUE_SIZE); using %d"
        _logger.warning(f"traintel: {said}", batch, queue, queue)
        settings["max_export_batch_size"] = queue
    return settings


def _stop(processor: CountingBatchSpanProcessor, bound: ProcessBoundSpanExporter, lent: bool) -> None:
    """Stop a processor of a failed build; the caller's exporter goes back open, as it was
    given, so that the corrected call can use it."""
    if lent:
        bound.inner = SpanExporter()  # the processor's shutdown reaches this stand-in, not theirs
    _call(processor, "shutdown")


@dataclass(frozen=True)
class PipelineOptions:
    """What ``configure()`` was given besides the training facts: providers to attach to, or
    exporters and readers to build private providers around, and the service name."""

    tracer_provider: trace_api.TracerProvider | None = None
    meter_provider: metrics_api.MeterProvider | None = None
    service_name: str | None = None
    span_exporters: Sequence[SpanExporter] | None = None
    metric_readers: Sequence[MetricReader] | None = None


@dataclass(frozen=True)
class _Choice:
    """Which providers are the user's (attached to) and which traintel builds and publishes."""

    tracer_provider: trace_api.TracerProvider
    meter_provider: metrics_api.MeterProvider
    build_tp: bool
    build_mp: bool
    set_global_tp: bool
    set_global_mp: bool


#: The providers traintel built, one job's each. A job's stays the global provider after the
#: job ends (OpenTelemetry sets the global once), and a job ends with its providers: the next
#: one (after ``shutdown()``, or a ``configure()`` that replaces the job) builds its own beside
#: it rather than attach to it and record into nothing.
_BUILT: weakref.WeakSet[object] = weakref.WeakSet()


def _choose(options: PipelineOptions) -> _Choice:
    """The user's providers where set (the global ones included), else traintel's own."""
    _check_exclusive(options)
    tp = options.tracer_provider or trace_api.get_tracer_provider()
    mp = options.meter_provider or metrics_api.get_meter_provider()
    private = options.span_exporters is not None
    attach_tp = not private and _attachable(tp, given=options.tracer_provider is not None)
    unset_mp = options.meter_provider is None and (_is_unset_meter_provider(mp) or mp in _BUILT)
    return _Choice(
        tp,
        mp,
        build_tp=not attach_tp,
        build_mp=options.metric_readers is not None or unset_mp,
        set_global_tp=not private and isinstance(tp, trace_api.ProxyTracerProvider),
        set_global_mp=options.metric_readers is None and mp not in _BUILT,
    )


def _sdk_metrics_provider() -> metrics_api.MeterProvider | None:
    """Where the SDK's own tracer metrics go: the global meter provider (None: the SDK's
    default), unless it is an earlier job's of traintel's, shut down with that job (the SDK
    said "A shutdown MeterProvider can not provide a Meter" for every tracer)."""
    return metrics_api.NoOpMeterProvider() if metrics_api.get_meter_provider() in _BUILT else None


def _attachable(tp: trace_api.TracerProvider, given: bool) -> bool:
    """Whether traintel records into ``tp``: an SDK provider of the user's, not an earlier
    job's of traintel's; anything else is said (see :func:`_not_an_sdk_provider`)."""
    if tp in _BUILT:
        return False
    if isinstance(tp, TracerProvider):
        return True
    _not_an_sdk_provider(tp, given)
    return False


def _check_exclusive(options: PipelineOptions) -> None:
    if options.span_exporters is not None and options.tracer_provider is not None:
        raise ConfigurationError("span_exporters= and tracer_provider= exclude each other")
    if options.metric_readers is not None and options.meter_provider is not None:
        raise ConfigurationError("metric_readers= and meter_provider= exclude each other")


def _not_an_sdk_provider(tp: trace_api.TracerProvider, given: bool) -> None:
    """A tracer provider traintel cannot add its processor to: refused where given, else
    recorded around (a private provider) with a warning, unless it is the unset proxy."""
    if given:
        raise ConfigurationError(
            f"tracer_provider={tp!r}: traintel needs an opentelemetry.sdk.trace.TracerProvider"
        )
    if not isinstance(tp, trace_api.ProxyTracerProvider):
        _logger.warning(
            "traintel: the global tracer provider is %s, not an SDK TracerProvider; traintel "
            "records into a private provider and leaves the global one alone",
            type(tp).__name__,
        )


def build_pipeline(
    config: TrainingConfig,
    options: PipelineOptions,
    *,
    strict: bool,
    environ: Mapping[str, str] | None = None,
) -> tuple[Pipeline, Callable[[], None]]:
    """The providers to record into: the user's where set, else built from ``OTEL_*``; and how
    to publish them (set the global providers), to be called once everything is built.

    ``span_exporters`` / ``metric_readers`` ask for private providers that traintel builds
    (with its export filter and batching) around exactly those, never set globally.

    What can be is validated before anything is built; what only the SDK can judge (its
    constructors read ``OTEL_*`` themselves) raises a ``ConfigurationError`` naming the
    variable, after stopping whatever was started. Nothing is registered until ``publish``,
    so a strict call that raises leaves the process exactly as it was.
    """
    environ = os.environ if environ is None else environ
    _redaction.install(environ)  # the SDK logs malformed header entries while exporters are built
    choice = _choose(options)
    file = OtlpJsonLinesFile(output_dir=config.resolve(lazy=False).output_dir)
    plans = _plan_all(options, choice, environ, file, strict)
    build_any = choice.build_tp or choice.build_mp
    resource = build_resource(config, options.service_name) if build_any else None
    pipeline = Pipeline(
        tracer_provider=choice.tracer_provider,
        meter_provider=choice.meter_provider,
        owns_tracer_provider=choice.build_tp,
        owns_meter_provider=choice.build_mp,
        logs=LogPipeline(plans.logs, resource),
        built_resource=resource,
    )
    _build_owned(pipeline, choice, options, _OwnedBuild(config, resource, strict, environ, file), plans)
    pipeline.file = file if FILE_EXPORTER in plans.names() else None  # (the fallback's included)
    pipeline.trace_exporters = plans.started("traces") if choice.build_tp else None
    pipeline.metric_exporters = plans.started("metrics")
    _redaction.install(environ)  # the exporters' loggers exist now
    tls_errors.install(environ)
    retry_lines.install()
    return pipeline, lambda: _publish(pipeline, choice)


class _Plans(NamedTuple):
    traces: list[_ExporterPlan]
    metrics: list[_ExporterPlan]
    logs: list[_ExporterPlan] | None  # None: the global logger provider's

    def names(self) -> set[str]:
        return {plan.name for plan in (*self.traces, *self.metrics, *(self.logs or ()))}

    def started(self, signal: Literal["traces", "metrics"]) -> list[str]:
        """The exporters of ``signal`` that started (an exporter left out for a bad setting
        receives nothing: the job's first and last lines must not name it)."""
        return [plan.name for plan in getattr(self, signal) if plan.started]


def _plan_all(
    options: PipelineOptions,
    choice: _Choice,
    environ: Mapping[str, str],
    file: OtlpJsonLinesFile,
    strict: bool,
) -> _Plans:
    """The exporters of each signal traintel builds itself (checked before anything is built).
    The caller's own span exporters are used as they are (no spool); logs as
    :class:`LogPipeline` says (None: the global logger provider)."""
    if options.span_exporters is not None:
        traces = [_ExporterPlan(type(e).__name__, lambda e=e: e, lent=True) for e in options.span_exporters]  # type: ignore[misc]
    else:
        traces = _plan_exporters("traces", environ, file, strict) if choice.build_tp else []
    own_readers = choice.build_mp and options.metric_readers is None
    own_logs = choice.build_tp and options.span_exporters is None
    return _Plans(
        traces,
        _plan_exporters("metrics", environ, file, strict) if own_readers else [],
        None
        if not own_logs or otel_private.global_logger_provider_set()
        else _plan_exporters("logs", environ, file, strict),
    )


def _build_owned(
    pipeline: Pipeline, choice: _Choice, options: PipelineOptions, build: _OwnedBuild, plans: _Plans
) -> None:
    """The providers traintel builds itself, into ``pipeline``; a failure stops what was
    started and publishes nothing."""
    try:
        if choice.build_tp:
            spool = options.span_exporters is None
            tp, pipeline.export_filter, paths = build.tracer_provider(plans.traces, spool)
            pipeline.tracer_provider, pipeline.export_paths = tp, paths
            pipeline.file_spans = build.file_spans
            _BUILT.add(tp)
        if choice.build_mp:
            pipeline.meter_provider = build.meter_provider(plans.metrics, options.metric_readers or [])
            _BUILT.add(pipeline.meter_provider)
    except BaseException as exc:
        _undo(build.undo)
        if isinstance(exc, ConfigurationError) or not isinstance(exc, Exception):
            raise
        _raise("the telemetry pipeline could not be built", exc, {}, build.environ)


def _publish(pipeline: Pipeline, choice: _Choice) -> None:
    if choice.set_global_tp:
        trace_api.set_tracer_provider(pipeline.tracer_provider)
    if choice.build_mp and choice.set_global_mp:
        metrics_api.set_meter_provider(pipeline.meter_provider)
