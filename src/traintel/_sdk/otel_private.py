"""Every use of OpenTelemetry's private internals, in one module.

Why any at all: a training step is a few microseconds of Python, and the public API costs a
few microseconds per call in the places listed below. Why here: each use is checked once, at
import, against what the public API does on this installed release (same context seen by the
API, same stored span); where the check fails or the internal is missing, the public API is
used instead, with the same results and its own cost. ``tests/test_otel_private.py`` compares
every fast path with the public one on behaviour: context propagation and exported OTLP bytes.

What is used, and why:

* **Context** (``opentelemetry.context._RUNTIME_CONTEXT``): with the default ContextVar runtime
  context, ``attach`` / ``detach`` / ``get_current`` act on that variable directly, and a span
  is put into a Context with one dict copy under the API's own key (found by asking the API,
  not imported). The iteration and its step phases need these on every step.
* **SDK span storage** (``Span._attributes``, ``Span._add_event``, ``BoundedAttributes._dict``,
  ``Span._lock``, ``Span._end_time``, ``Span._limits``): traintel's window events carry ~60
  numbers it computed itself; the SDK's per-value cleaning of them was most of a window close.
  Values that are not plain ``str`` / ``bool`` / ``int`` / ``float``, or that a limit would
  cut, go through the public API.
* **``SpanProcessor._on_ending``**: the SDK's hook between a span's end and its freezing; the
  export filter wraps the batch processors and must pass the hook on to them.
* **The batch processor's queue** (``BatchSpanProcessor._batch_processor._queue``): the SDK drops
  a span when its queue is full with one log line; reading the queue's length lets traintel
  count every drop (and spill what is queued at a stuck exit).
* **A metric exporter's preferences** (``_preferred_temporality``, ``_preferred_aggregation``):
  a wrapper must declare the same ones as the exporter it wraps.
* **Exporters inside providers someone else built** (``TracerProvider._active_span_processor.
  _span_processors``, ``BatchSpanProcessor._batch_processor._exporter``,
  ``MeterProvider._measurement_consumer._reader_storages``, ``PeriodicExportingMetricReader._exporter``):
  under ``opentelemetry-instrument`` the distro builds the providers before traintel runs, and
  the public API cannot reach their exporters; traintel puts its spool and loss counting in
  front of them. Where a release keeps them elsewhere, they are left as they are (and said).
  A periodic reader's thread (``_daemon_thread``): a bounded exit asks whether the last
  collection is still under way, which the reader's shutdown does not say.
* **A tracer's id generator** (``Tracer.id_generator``): traintel's own tracer gets one that can
  hand out an id chosen in advance (``traintel._sdk.ids`` says why).
* **The OTLP trace exporters' clients** (the HTTP exporter's ``requests`` session,
  ``_client._transport._session`` from 1.45 and ``_session`` before; the gRPC exporter's stub
  factory ``_stub`` and the stub it made, ``_client``): the exporters discard what the collector
  answers, and traintel needs it (partial success, throttling: see
  ``exporters/collector_answers``). A hook is added through the clients' own public interfaces.
* **Histogram aggregations** (``MeterProvider._measurement_consumer._reader_storages``, each
  storage's ``_instrument_view_instrument_matches``, a match's ``_attributes_aggregation`` and
  ``_lock``, the explicit-bucket aggregation's ``_value`` / ``_sum`` / ``_min`` / ``_max``): a
  window's iteration times are added as one count per bucket (``record_sorted``).
* **Finished spans written directly** (``ReadableSpan``, which the SDK asks users not to build,
  and the tracer's ``_instrumentation_scope`` / ``_span_limits``): see ``SpanWriter``.
* **The logs signal** (``opentelemetry._logs``, ``opentelemetry.sdk._logs``, the OTLP encoder's
  ``_log_encoder``): OpenTelemetry's documented way to send log records, private by name while
  the Python logs SDK is not declared stable. traintel sends its hang records through it; the
  names are imported on first use (below), so a job that never reports a hang never loads them.
"""

from __future__ import annotations

import logging
import math
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from time import time_ns
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from traintel._sdk import ids as _ids

_logger = logging.getLogger("traintel")

# --- context -------------------------------------------------------------------------------------


def _find_span_key() -> str:
    """The key under which the API stores the current span (asked of the API, not imported)."""
    marker = NonRecordingSpan(trace_api.INVALID_SPAN_CONTEXT)
    keys = [key for key, value in trace_api.set_span_in_context(marker, Context()).items() if value is marker]
    if len(keys) != 1:
        raise RuntimeError("cannot find the span key of the OpenTelemetry context")
    return keys[0]


SPAN_KEY = _find_span_key()
_dict_setitem = dict.__setitem__


def _runtime_variable() -> ContextVar[Context] | None:
    runtime = getattr(context_api, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    if isinstance(variable, ContextVar) and isinstance(variable.get(), Context):
        return variable
    return None


def _fast_with_span(span: Span, context: Context) -> Context:
    new = Context(context)  # a fresh copy is not shared yet: storing into it is safe
    _dict_setitem(new, SPAN_KEY, span)
    return new


def _fast_current_span(context: Context) -> Span:
    span: Span | None = context.get(SPAN_KEY)  # type: ignore[assignment]
    return INVALID_SPAN if span is None else span


def _context_path_agrees(variable: ContextVar[Context]) -> bool:
    """Attaching through the variable is what the API sees, and the fast Context equals the
    API's; on any difference the public API is used."""
    try:
        span = NonRecordingSpan(trace_api.SpanContext(1, 2, False))
        base = context_api.set_value("traintel.check", 1, Context())
        ours, theirs = _fast_with_span(span, base), trace_api.set_span_in_context(span, base)
        if ours != theirs or type(ours) is not type(theirs) or base != {"traintel.check": 1}:
            return False
        token = variable.set(ours)
        try:
            seen = context_api.get_current() is ours and trace_api.get_current_span() is span
        finally:
            variable.reset(token)
        return seen and _fast_current_span(ours) is trace_api.get_current_span(theirs) is span
    except Exception:
        return False


_VARIABLE = _runtime_variable()
#: True when the context operations below act on the runtime ContextVar directly.
CONTEXT_FAST = _VARIABLE is not None and _context_path_agrees(_VARIABLE)

get_current: Callable[[], Context]
attach: Callable[[Context], Any]
detach: Callable[[Any], None]
with_span: Callable[[Span, Context], Context]
current_span: Callable[[Context], Span]
if CONTEXT_FAST and _VARIABLE is not None:
    get_current, attach, detach = _VARIABLE.get, _VARIABLE.set, _VARIABLE.reset
    with_span, current_span = _fast_with_span, _fast_current_span
else:  # another OTEL_PYTHON_CONTEXT, or an API release that stores context elsewhere
    get_current, attach = context_api.get_current, context_api.attach
    detach = context_api.detach
    with_span, current_span = trace_api.set_span_in_context, trace_api.get_current_span


# --- ids ---------------------------------------------------------------------------------------------
#: The W3C random-trace-id flag, where this OpenTelemetry release knows it (from 1.42): a span
#: keeps its parent's, as the SDK's spans do; any other parent flag is not carried.
RANDOM_TRACE_ID: Final = 0x02 if hasattr(trace_api.TraceFlags, "RANDOM_TRACE_ID") else 0
#: Ids from traintel's own generator (see ``traintel._sdk.ids``), for the recorder.
new_span_id, new_trace_id = _ids.new_span_id, _ids.new_trace_id
#: The self-checks' providers' resource: not the job's (a default one would read the ``OTEL_*``
#: variables again, and say each bad ``OTEL_RESOURCE_ATTRIBUTES`` pair once more per check).
_NO_RESOURCE = Resource.get_empty()


# --- SDK span storage ----------------------------------------------------------------------------
_PLAIN = frozenset((str, bool, int, float))
_IS_STR = str.__instancecheck__


def _clean_enough(
    attributes: Mapping[str, AttributeValue], maxlen: int | None, max_value_len: int | None
) -> bool:
    """True when the SDK's cleaning would keep ``attributes`` exactly as they are."""
    if maxlen is not None and len(attributes) > maxlen:
        return False
    values = attributes.values()
    if not set(map(type, values)) <= _PLAIN:
        return False
    if max_value_len is not None:
        strings: list[str] = list(filter(_IS_STR, values))  # type: ignore[arg-type]
        return all(len(v) <= max_value_len for v in strings)
    return True


def _bounded(
    attributes: Mapping[str, AttributeValue], maxlen: int | None, max_value_len: int | None, immutable: bool
) -> BoundedAttributes:
    """A ``BoundedAttributes`` holding ``attributes`` as given (as the SDK's own copy does)."""
    bounded = BoundedAttributes(maxlen, None, immutable=immutable, max_value_len=max_value_len)
    bounded._dict = dict(attributes)
    return bounded


def _fast_add_event(
    span: SdkSpan, name: str, attributes: Mapping[str, AttributeValue], timestamp: int | None
) -> None:
    limits = span._limits
    bounded = _bounded(attributes, limits.max_event_attributes, limits.max_attribute_length, True)
    span._add_event(Event(name, bounded, timestamp))


def _storage_agrees() -> bool:
    """An event and attributes stored directly equal what the public API stores, on this SDK
    release. Checked with a sampler and limits of its own: the environment's say nothing about
    the layout."""
    try:
        limits = SpanLimits(
            max_span_attributes=128,
            max_event_attributes=128,
            max_events=128,
            max_attribute_length=SpanLimits.UNSET,
            max_span_attribute_length=SpanLimits.UNSET,
        )
        provider = TracerProvider(
            sampler=ALWAYS_ON, span_limits=limits, resource=_NO_RESOURCE, shutdown_on_exit=False
        )
        span = provider.get_tracer("traintel.check").start_span("check")
        if not isinstance(span, SdkSpan):
            return False
        attributes: dict[str, AttributeValue] = {"a": 1.5, "b": "x", "c": True, "d": 2}
        span.add_event("public", attributes, 7)
        _fast_add_event(span, "fast", attributes, 7)
        public, fast = span.events
        same_event = (
            dict(public.attributes or {}) == dict(fast.attributes or {})
            and public.timestamp == fast.timestamp
            and type(public.attributes) is type(fast.attributes)
            and public.dropped_attributes == fast.dropped_attributes
        )
        own = span._attributes
        return (
            same_event
            and hasattr(span, "_lock")
            and hasattr(span, "_end_time")
            and isinstance(own, BoundedAttributes)
            and isinstance(getattr(own, "_dict", None), dict)
            and hasattr(own, "_immutable")
        )
    except Exception:
        return False


#: True when traintel's own numbers are stored without the SDK's per-value cleaning.
STORAGE_FAST = _storage_agrees()


def add_clean_event(
    span: Span, name: str, attributes: Mapping[str, AttributeValue], timestamp: int | None = None
) -> None:
    """``span.add_event(name, attributes, timestamp)`` without re-cleaning clean values."""
    if STORAGE_FAST and isinstance(span, SdkSpan):
        limits = span._limits
        if _clean_enough(attributes, limits.max_event_attributes, limits.max_attribute_length):
            _fast_add_event(span, name, attributes, timestamp)
            return
    span.add_event(name, attributes, timestamp)


def set_clean_attributes(span: Span, attributes: Mapping[str, AttributeValue]) -> None:
    """``span.set_attributes(attributes)`` without re-cleaning clean values (new keys only when
    they all fit under the span's attribute count limit). Under the span's lock, as the SDK's
    own setter: an ended span is left as it is either way."""
    if STORAGE_FAST and isinstance(span, SdkSpan):
        own: Any = span._attributes
        maxlen = own.maxlen
        if _clean_enough(attributes, None, own.max_value_len):
            with span._lock:
                if (
                    span._end_time is None
                    and not own._immutable
                    and (maxlen is None or len(own) + len(attributes) <= maxlen)
                ):
                    own._dict.update(attributes)
                    return
    span.set_attributes(attributes)


# --- span processors -----------------------------------------------------------------------------
def forward_on_ending(wrapper: SpanProcessor, processors: Sequence[SpanProcessor]) -> None:
    """Let ``wrapper`` pass the SDK's ``_on_ending`` hook on to the processors it wraps that
    implement it (none of the SDK's own do)."""
    base = SpanProcessor._on_ending
    ending = [p for p in processors if getattr(type(p), "_on_ending", base) is not base]
    if not ending:
        return

    def on_ending(span: SdkSpan) -> None:
        for processor in ending:
            processor._on_ending(span)

    wrapper._on_ending = on_ending  # type: ignore[method-assign]


def batch_queue(processor: Any) -> tuple[deque[Any] | None, int]:
    """The SDK batch processor's span queue and its bound, or (None, 0) where this release
    keeps it elsewhere (drops are then not counted: the caller says so once)."""
    batch = getattr(processor, "_batch_processor", None)
    queue = getattr(batch, "_queue", None)
    if not isinstance(queue, deque):
        return None, 0
    return queue, int(getattr(batch, "_max_queue_size", 0) or 0)


def span_processors(provider: Any) -> tuple[SpanProcessor, ...] | None:
    """The span processors added to an SDK tracer provider (None where not found)."""
    processors = getattr(getattr(provider, "_active_span_processor", None), "_span_processors", None)
    return tuple(processors) if isinstance(processors, tuple) else None


def batch_exporter(processor: Any) -> Any:
    """The exporter inside an SDK batch span processor, or None where it is kept elsewhere."""
    return getattr(getattr(processor, "_batch_processor", None), "_exporter", None)


def replace_batch_exporter(processor: Any, exporter: Any) -> bool:
    """Put ``exporter`` in place of the batch processor's own (False: not found, untouched)."""
    batch: Any = getattr(processor, "_batch_processor", None)
    if getattr(batch, "_exporter", None) is None:
        return False
    batch._exporter = exporter
    return True


def periodic_readers(provider: Any) -> list[Any] | None:
    """The metric readers of an SDK meter provider (None where not found): those its
    measurement consumer collects for, which include any added after it was built (where
    ``add_metric_reader`` exists); 1.40's configuration also lists them, 1.45's does not."""
    storages = getattr(getattr(provider, "_measurement_consumer", None), "_reader_storages", None)
    if isinstance(storages, Mapping):
        return list(storages)
    readers = getattr(getattr(provider, "_sdk_config", None), "metric_readers", None)
    return list(readers) if isinstance(readers, list | tuple) else None


def collecting_threads(provider: Any) -> list[threading.Thread]:
    """The periodic readers' own threads (``_daemon_thread``) alive now: one still running after
    a bounded shutdown has not written its last collection (the reader's shutdown stops waiting
    for it at the bound and shuts its exporter down)."""
    threads = (getattr(reader, "_daemon_thread", None) for reader in periodic_readers(provider) or ())
    return [thread for thread in threads if isinstance(thread, threading.Thread) and thread.is_alive()]


def replace_reader_exporter(reader: Any, wrap: Callable[[Any], Any]) -> bool:
    """Wrap a periodic reader's exporter in place (False: not one, or not found)."""
    exporter = getattr(reader, "_exporter", None)
    if exporter is None:
        return False
    reader._exporter = wrap(exporter)
    return True


def add_resource(
    tracer_provider: Any, meter_provider: Any, resource: Resource, tracers: Iterable[Any] = ()
) -> bool:
    """Add ``resource``'s attributes under what the providers' own resources say (theirs win),
    for the tracers and meters made from now on, and for those made already: all of them where
    the SDK keeps its tracers (1.45), else (1.40) the ``tracers`` named. False where a provider
    keeps its resource elsewhere (nothing is changed then).

    Why: ``opentelemetry-instrument`` builds the providers, with their resources, before any
    instrumentor runs, and applies only the detectors ``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS``
    names. The SDK itself updates its tracers' resource this way after a fork
    (``_update_resource``); a meter provider's collections read the resource from its
    configuration each time.
    """
    current = getattr(tracer_provider, "_resource", None)
    config = getattr(meter_provider, "_sdk_config", None) if meter_provider is not None else None
    if not isinstance(current, Resource):
        return False
    if meter_provider is not None and not isinstance(getattr(config, "resource", None), Resource):
        return False
    update = getattr(tracer_provider, "_update_resource", None)
    if callable(update):
        update(resource.merge(current))  # merged onto the current resource: the result, with its own on top
    else:  # (1.40: tracers are not kept; each took the provider's resource when made)
        tracer_provider._resource = resource.merge(current)
        for tracer in tracers:
            if isinstance(getattr(tracer, "resource", None), Resource):
                tracer.resource = resource.merge(tracer.resource)
    if config is not None:
        config.resource = resource.merge(config.resource)
    return True


def metric_exporter_preferences(exporter: Any) -> dict[str, Any]:
    """The temporality and aggregation an exporter asked for, to declare on a wrapper."""
    return {
        "preferred_temporality": getattr(exporter, "_preferred_temporality", None),
        "preferred_aggregation": getattr(exporter, "_preferred_aggregation", None),
    }


# --- what the collector answers the OTLP trace exporters ------------------------------------------
def _http_session(exporter: Any) -> Any:
    client = getattr(exporter, "_client", None)
    transport = getattr(client, "_transport", None)
    return getattr(transport, "_session", None) or getattr(exporter, "_session", None)


def watch_collector_answers(exporter: Any, answers: Any) -> bool:
    """Let ``answers`` (a ``CollectorAnswers``) see what the collector answers each request of
    an OTLP trace exporter: a response hook on the HTTP exporter's ``requests`` session, or the
    gRPC exporter's stub wrapped (the one it has, and each it makes after a reconnect). False
    for any other exporter, or an SDK release that keeps these elsewhere."""
    session = _http_session(exporter)
    hooks = getattr(session, "hooks", None)
    if isinstance(hooks, dict) and isinstance(hooks.get("response"), list):
        hooks["response"].append(answers.http_response)
        return True
    stub_factory = getattr(exporter, "_stub", None)
    if callable(stub_factory) and hasattr(exporter, "_client"):
        exporter._stub = lambda channel: answers.grpc_stub(stub_factory(channel))
        if exporter._client is not None:
            exporter._client = answers.grpc_stub(exporter._client)
        return True
    return False


# --- span limits ---------------------------------------------------------------------------------
def attribute_limits(tracer: Any) -> tuple[int | None, int | None]:
    """The attribute count limits (span, event) of an SDK tracer's spans (``_span_limits``,
    the provider's); for any other tracer, what the environment gives the SDK's defaults."""
    limits = getattr(tracer, "_span_limits", None)
    if not isinstance(limits, SpanLimits):
        limits = SpanLimits()
    return limits.max_span_attributes, limits.max_event_attributes


# --- ids -----------------------------------------------------------------------------------------
def tracer_id_generator(tracer: trace_api.Tracer) -> IdGenerator | None:
    """The id generator an SDK tracer draws its span ids from (None: not an SDK tracer)."""
    generator = getattr(tracer, "id_generator", None)
    return generator if isinstance(generator, IdGenerator) else None


def set_tracer_id_generator(tracer: trace_api.Tracer, generator: IdGenerator) -> None:
    """Only this tracer's generator is replaced: the provider's other tracers keep theirs."""
    tracer.id_generator = generator  # type: ignore[attr-defined]


# --- finished spans written directly -------------------------------------------------------------
class SpanWriter:
    """Finished spans for traintel's own records, built as the SDK would build them and handed
    straight to the export path.

    Why: an exported iteration (every one, in "all" mode) and a window's goodput record are
    spans whose every field traintel knows when it creates them; the SDK's start / end path
    (sampler, span object, locks, every processor's hooks) costs ~15 µs a span, several times
    what building the finished span costs. Used only where the result is the same: traintel's
    own provider with its default ParentBased(ALWAYS_ON) sampler, no processor added beside
    traintel's, the tracer enabled and the SDK's self-metrics off; and only for spans with plain
    attributes (no events, status or links). ``span_writer`` checks the rest on this release,
    exported bytes included.
    """

    def __init__(self, tracer: Any) -> None:
        self._resource = tracer.resource
        self._scope = tracer._instrumentation_scope
        self._info = tracer.instrumentation_info
        self._limits: SpanLimits = tracer._span_limits

    def span(
        self,
        name: str,
        context: trace_api.SpanContext,
        parent: trace_api.SpanContext | None,
        attributes: Mapping[str, AttributeValue],
        start_ns: int,
        end_ns: int,
    ) -> ReadableSpan:
        limits = self._limits
        maxlen, max_value_len = limits.max_span_attributes, limits.max_span_attribute_length
        if STORAGE_FAST and _clean_enough(attributes, maxlen, max_value_len):  # traintel's own numbers
            bounded = _bounded(attributes, maxlen, max_value_len, True)
        else:
            bounded = BoundedAttributes(maxlen, attributes, immutable=True, max_value_len=max_value_len)
        return ReadableSpan(
            name=name,
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=bounded,  # events and links: the defaults, none (as the SDK's span without any)
            kind=trace_api.SpanKind.INTERNAL,
            status=_UNSET_STATUS,
            start_time=start_ns,
            end_time=end_ns,
            instrumentation_info=self._info,
            instrumentation_scope=self._scope,
        )


_UNSET_STATUS = Status(StatusCode.UNSET)


def _writer_eligible(tracer: Any) -> bool:
    """The tracer builds spans the way SpanWriter does: default sampler, enabled, no SDK
    self-metrics (their live-span counter would miss ours), the fields it reads present."""
    sampler = getattr(tracer, "sampler", None)
    if not (isinstance(sampler, ParentBased) and getattr(sampler, "_root", None) is ALWAYS_ON):
        return False
    if not all(hasattr(tracer, name) for name in ("resource", "_instrumentation_scope", "_span_limits")):
        return False
    enabled = getattr(tracer, "_is_enabled", None)
    if enabled is not None and not enabled():
        return False
    metrics = getattr(tracer, "_tracer_metrics", None)
    return metrics is None or type(metrics).__name__ == "NoOpTracerMetrics"


def _writer_agrees() -> bool:
    """A span written directly exports the same bytes as the same span through the tracer."""
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        from traintel._sdk.ids import ForcingIdGenerator

        ids = ForcingIdGenerator()
        provider = TracerProvider(id_generator=ids, resource=_NO_RESOURCE, shutdown_on_exit=False)
        captured: list[ReadableSpan] = []

        class Capture(SpanProcessor):
            def on_end(self, span: ReadableSpan) -> None:
                captured.append(span)

        provider.add_span_processor(Capture())
        tracer = provider.get_tracer("traintel.check", "1")
        parent = trace_api.SpanContext(
            7, 8, True, trace_api.TraceFlags(0x03), trace_api.TraceState([("v", "1")])
        )
        attributes: dict[str, AttributeValue] = {"a": 1, "b": "x", "c": 2.5, "d": True}
        ids.force(9)
        span = tracer.start_span(
            "check", context=trace_api.set_span_in_context(NonRecordingSpan(parent)), attributes=attributes,
            start_time=10,
        )  # fmt: skip
        span.end(end_time=20)
        context = trace_api.SpanContext(7, 9, False, parent.trace_flags, parent.trace_state)
        written = SpanWriter(tracer).span("check", context, parent, attributes, 10, 20)
        return _writer_eligible(tracer) and (
            encode_spans([written]).SerializeToString() == encode_spans(captured).SerializeToString()
        )
    except Exception:
        return False


#: True when traintel may write its own finished spans directly (see SpanWriter).
WRITER_FAST = _writer_agrees()


def span_writer(tracer: trace_api.Tracer) -> SpanWriter | None:
    """A writer for ``tracer``'s spans where that gives what the tracer gives, else None."""
    if not WRITER_FAST or not _writer_eligible(tracer):
        return None
    return SpanWriter(tracer)


# --- histograms: a window's values added as bucket counts ----------------------------------------
def _bucket_counts(ordered: Sequence[float], start: int, boundaries: tuple[float, ...]) -> list[int]:
    """How many of ``ordered[start:]`` (ascending) fall in each bucket, as the SDK counts them
    (``bisect_left``: a value equal to a boundary is in the bucket that boundary closes)."""
    ends = [bisect_right(ordered, bound, start) for bound in boundaries]
    ends.append(len(ordered))
    return [end - begin for begin, end in zip([start, *ends[:-1]], ends, strict=True)]


def _matches(histogram: Any) -> list[Any] | None:
    """Every view's match of ``histogram`` in every reader's storage (None: not found)."""
    storages = getattr(getattr(histogram, "_measurement_consumer", None), "_reader_storages", None)
    if not isinstance(storages, Mapping):
        return None
    found: list[Any] = []
    for storage in storages.values():
        matches = getattr(storage, "_instrument_view_instrument_matches", {}).get(histogram)
        if not isinstance(matches, list):
            return None
        found.extend(matches)
    if not all(isinstance(getattr(m, "_attributes_aggregation", None), dict) for m in found):
        return None
    return found


def _mergeable(aggregations: dict[Any, Any], boundaries: tuple[float, ...]) -> bool | None:
    """A match holding our one series: True when it is the SDK's explicit-bucket aggregation
    with ``boundaries``, False when the view drops it (nothing to add), None otherwise (a View
    changed the buckets or the aggregation: the values go through the public API)."""
    from opentelemetry.sdk.metrics._internal import aggregation as sdk_aggregation

    if len(aggregations) != 1:
        return None
    (found,) = aggregations.values()
    if isinstance(found, sdk_aggregation._DropAggregation):
        return False
    explicit = sdk_aggregation._ExplicitBucketHistogramAggregation
    if type(found) is explicit and getattr(found, "_boundaries", None) == boundaries:
        return True
    return None


def _add_counts(found: Any, counts: list[int], total: float, low: float, high: float) -> None:
    """What ``aggregate`` does for each value, done for all of them at once."""
    with found._lock:
        if found._value is None:
            found._value = [0] * len(counts)
        found._value = [a + b for a, b in zip(found._value, counts, strict=True)]
        found._sum += total
        if found._record_min_max:
            found._min = min(found._min, low)
            found._max = max(found._max, high)


def _add_sorted_fast(histogram: Any, ordered: Sequence[float], boundaries: tuple[float, ...]) -> bool:
    """Add ``ordered[1:]`` to every aggregation of ``histogram`` (the first value was recorded
    through the public API, which made them); False with nothing added where not possible."""
    matches = _matches(histogram)
    if matches is None or any(_mergeable(m._attributes_aggregation, boundaries) is None for m in matches):
        return False
    counts = _bucket_counts(ordered, 1, boundaries)
    total, low, high = math.fsum(ordered[1:]), ordered[1], ordered[-1]
    for match in matches:
        with match._lock:  # a delta collection may replace the aggregations meanwhile
            mergeable = _mergeable(match._attributes_aggregation, boundaries)
            if mergeable:
                (found,) = match._attributes_aggregation.values()
                _add_counts(found, counts, total, low, high)
        if mergeable is None:  # collected (and released) since the first value: one by one, here only
            for value in ordered[1:]:
                match.consume_measurement(_measurement(value, histogram), False)
    return True


def _measurement(value: float, histogram: Any) -> Any:
    from opentelemetry.sdk.metrics._internal.measurement import Measurement

    return Measurement(value=value, time_unix_nano=time_ns(), instrument=histogram, context=Context())


def _histogram_point(point: Any) -> tuple[object, ...]:
    return (point.count, tuple(point.bucket_counts), point.sum, point.min, point.max)


def _histogram_merge_agrees() -> bool:
    """Bucket counts added to one histogram export what recording the same values into another
    exports, cumulative and delta (the delta reader collecting between the two halves)."""
    try:
        from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

        readers = [
            InMemoryMetricReader(),
            InMemoryMetricReader(preferred_temporality={HistogramInstrument: AggregationTemporality.DELTA}),
        ]
        meter = MeterProvider(
            metric_readers=readers, resource=_NO_RESOURCE, shutdown_on_exit=False
        ).get_meter("traintel.check")
        bounds = (1.0, 2.0)
        public = meter.create_histogram("public", explicit_bucket_boundaries_advisory=list(bounds))
        merged = meter.create_histogram("merged", explicit_bucket_boundaries_advisory=list(bounds))
        points: list[list[tuple[object, ...]]] = []
        for values in ([0.5, 1.0, 1.5, 2.0, 3.0], [0.25, 2.5]):
            for value in values:
                public.record(value)
            merged.record(values[0])
            if not _add_sorted_fast(merged, values, bounds):
                return False
            for reader in readers:
                data = reader.get_metrics_data()
                by_name = {
                    m.name: [_histogram_point(p) for p in m.data.data_points]
                    for rm in (data.resource_metrics if data else [])
                    for sm in rm.scope_metrics
                    for m in sm.metrics
                }
                points.append([by_name.get("public"), by_name.get("merged")])  # type: ignore[list-item]
        return all(
            public_points == merged_points and public_points for public_points, merged_points in points
        )
    except Exception:
        return False


_HISTOGRAM_FAST: list[bool] = []  # checked on first use (it builds a meter provider)


def record_sorted(histogram: Any, ordered: Sequence[float], boundaries: tuple[float, ...]) -> None:
    """Record ``ordered`` (ascending) into ``histogram`` as one ``record`` per value would: the
    same count, buckets, minimum and maximum; the sum of the window correctly rounded
    (``math.fsum``), which one-by-one addition can miss in the last bits. The first value goes
    through the public API (which makes the SDK's aggregation for every reader); the rest are
    added to each aggregation as one count per bucket, with their sum, minimum and maximum: a
    window's values cost one call, not one per iteration. Where a
    View changed the buckets or the aggregation, or this SDK release keeps its aggregations
    elsewhere, every value goes through the public API. (No exemplars are offered for the added
    values: they are recorded off the training thread, outside any sampled span.)"""
    if not ordered:
        return
    record = histogram.record
    record(ordered[0])
    if len(ordered) == 1:
        return
    if not _HISTOGRAM_FAST:
        _HISTOGRAM_FAST.append(_histogram_merge_agrees())
    if _HISTOGRAM_FAST[0] and _add_sorted_fast(histogram, ordered, boundaries):
        return
    for value in ordered[1:]:
        record(value)


# --- logs ----------------------------------------------------------------------------------------
if TYPE_CHECKING:  # the names below, as mypy sees them (``X as X``: re-exported)
    from opentelemetry._logs import Logger as Logger  # noqa: PLC0414
    from opentelemetry._logs import LoggerProvider as _ApiLoggerProvider
    from opentelemetry._logs import SeverityNumber as SeverityNumber  # noqa: PLC0414
    from opentelemetry._logs import get_logger_provider as get_logger_provider  # noqa: PLC0414
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs as encode_logs  # noqa: PLC0414
    from opentelemetry.sdk._logs import LoggerProvider as LoggerProvider  # noqa: PLC0414
    from opentelemetry.sdk._logs import ReadableLogRecord as ReadableLogRecord  # noqa: PLC0414
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor as BatchLogRecordProcessor  # noqa: PLC0414
    from opentelemetry.sdk._logs.export import LogRecordExportResult as LogRecordExportResult  # noqa: PLC0414

    ApiLoggerProvider = _ApiLoggerProvider
#: The logs names this module hands out, and the module each comes from (imported on first use).
_LOGS_NAMES = {
    "Logger": "opentelemetry._logs",
    "SeverityNumber": "opentelemetry._logs",
    "get_logger_provider": "opentelemetry._logs",
    "ApiLoggerProvider": "opentelemetry._logs:LoggerProvider",
    "encode_logs": "opentelemetry.exporter.otlp.proto.common._log_encoder",
    "LoggerProvider": "opentelemetry.sdk._logs",
    "ReadableLogRecord": "opentelemetry.sdk._logs",
    "BatchLogRecordProcessor": "opentelemetry.sdk._logs.export",
    "LogRecordExportResult": "opentelemetry.sdk._logs.export",
}


def __getattr__(name: str) -> Any:
    where = _LOGS_NAMES.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, _, attribute = where.partition(":")
    value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value
    return value


def global_logger_provider_set() -> bool:
    """Whether someone set the global LoggerProvider: until then the API hands out a proxy
    (``opentelemetry.sdk._logs`` is never imported to tell)."""
    from opentelemetry import _logs

    return type(_logs.get_logger_provider()).__name__ not in ("ProxyLoggerProvider", "NoOpLoggerProvider")
