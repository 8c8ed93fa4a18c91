"""A real OTLP receiver for tests: gRPC and HTTP/protobuf servers on loopback.

It decodes the actual Export*ServiceRequest bytes the SDK exporters send and records them
with the request headers, so tests assert on what a collector would receive.
"""

from __future__ import annotations

import gzip
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.rpc.error_details_pb2 import RetryInfo  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from traintel.exporters.reader import attributes_dict


@dataclass
class Received:
    traces: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(default_factory=list)
    logs: list[logs_service_pb2.ExportLogsServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    #: Trace requests refused by the receiver's ``reject``.
    rejected: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> Iterator[tuple[dict[str, Any], Span]]:
        with self.lock:
            requests = list(self.traces)
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = attributes_dict(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        yield resource, span

    def metric_names(self) -> set[str]:
        with self.lock:
            requests = list(self.metrics)
        return {
            metric.name
            for request in requests
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        }


#: Decides whether a receiver refuses a trace request for what it holds (HTTP 400, gRPC
#: INVALID_ARGUMENT), as a collector does with a batch it cannot accept.
Reject = Callable[[trace_service_pb2.ExportTraceServiceRequest], bool]


#: Picks the spans a receiver refuses inside a request it accepts (OTLP partial success): they
#: are left out of what it keeps, and counted in its answer.
PartialReject = Callable[[Span], bool]


@dataclass
class Throttle:
    """Answer the first ``requests`` non-empty trace requests "try again later": HTTP 429 with
    ``Retry-After``, gRPC RESOURCE_EXHAUSTED with ``RetryInfo`` (``None``: for ever)."""

    requests: int | None
    retry_after_s: int = 1
    answered: int = 0

    def now(self, request: trace_service_pb2.ExportTraceServiceRequest) -> bool:
        if not request.resource_spans or (self.requests is not None and self.answered >= self.requests):
            return False
        self.answered += 1
        return True


def _partial(
    request: trace_service_pb2.ExportTraceServiceRequest, reject: PartialReject | None
) -> tuple[trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse]:
    """What a collector keeps of ``request`` and its answer, ``reject`` picking the spans it
    refuses."""
    answer = trace_service_pb2.ExportTraceServiceResponse()
    if reject is None:
        return request, answer
    kept = trace_service_pb2.ExportTraceServiceRequest()
    kept.CopyFrom(request)
    refused = 0
    for rs in kept.resource_spans:
        for ss in rs.scope_spans:
            spans = [span for span in ss.spans if not reject(span)]
            refused += len(ss.spans) - len(spans)
            del ss.spans[:]
            ss.spans.extend(spans)
    if refused:
        answer.partial_success.rejected_spans = refused
        answer.partial_success.error_message = f"{refused} span(s) refused by the test's rule"
    return kept, answer


def has_span_named(name: str) -> Reject:
    def reject(request: trace_service_pb2.ExportTraceServiceRequest) -> bool:
        return any(
            span.name == name for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
        )

    return reject


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        received: Received,
        delay_s: float = 0.0,
        reject: Reject | None = None,
        partial: PartialReject | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.received = received
        self.delay_s = delay_s
        self.reject = reject
        self.partial = partial
        self.throttle = throttle
        #: After this many accepted trace requests, the receiver answers UNAVAILABLE (an outage).
        self.fail_after: int | None = None

    def Export(self, request: Any, context: Any) -> Any:
        if self.delay_s:
            time.sleep(self.delay_s)  # a slow collector: it answers, late
        if self.reject is not None and self.reject(request):
            with self.received.lock:
                self.received.rejected += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "this batch is refused")
        if self.fail_after is not None and len(self.received.traces) >= self.fail_after:
            context.abort(grpc.StatusCode.UNAVAILABLE, "down for maintenance")
        if self.throttle is not None and self.throttle.now(request):
            info = RetryInfo()
            info.retry_delay.seconds = self.throttle.retry_after_s
            context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down")
        kept, answer = _partial(request, self.partial)
        with self.received.lock:
            self.received.traces.append(kept)
            self.received.headers.append(dict(context.invocation_metadata()))
        return answer


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        with self.received.lock:
            self.received.metrics.append(request)
            self.received.headers.append(dict(context.invocation_metadata()))
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _LogsService(logs_service_pb2_grpc.LogsServiceServicer):  # type: ignore[misc]
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        with self.received.lock:
            self.received.logs.append(request)
        return logs_service_pb2.ExportLogsServiceResponse()


class GrpcReceiver:
    """``port`` and ``received`` let a test stop a receiver and start another in its place
    (a collector restart); ``delay_s`` makes trace exports slow; ``tls=(key_pem, cert_pem)``
    serves TLS (an ``https://`` endpoint) instead of plaintext; ``reject`` refuses the trace
    requests it selects with INVALID_ARGUMENT; ``partial`` refuses the spans it selects inside
    accepted requests (partial success); ``throttle`` asks to wait."""

    def __init__(
        self,
        port: int = 0,
        received: Received | None = None,
        delay_s: float = 0.0,
        tls: tuple[bytes, bytes] | None = None,
        reject: Reject | None = None,
        partial: PartialReject | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.received = received if received is not None else Received()
        self.scheme = "https" if tls is not None else "http"
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._traces = _TraceService(self.received, delay_s, reject, partial, throttle)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self._traces, self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _MetricsService(self.received), self.server
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_LogsService(self.received), self.server)
        if tls is None:
            self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        else:
            credentials = grpc.ssl_server_credentials([tls])
            self.port = self.server.add_secure_port(f"127.0.0.1:{port}", credentials)

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def fail_after(self, requests: int | None) -> None:
        """From the ``requests``-th accepted trace request on, answer UNAVAILABLE (None: heal)."""
        self._traces.fail_after = requests

    def set_delay(self, seconds: float) -> None:
        self._traces.delay_s = seconds

    def __enter__(self) -> GrpcReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None)


class HttpReceiver:
    """See :class:`GrpcReceiver` for ``port``, ``received``, ``delay_s`` and ``reject`` (HTTP
    400 here). ``tls=(cert_file, key_file)`` serves HTTPS; failed handshakes are counted."""

    def __init__(
        self,
        port: int = 0,
        received: Received | None = None,
        delay_s: float = 0.0,
        tls: tuple[str, str] | None = None,
        reject: Reject | None = None,
        partial: PartialReject | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.received = received = received if received is not None else Received()
        self.scheme = "https" if tls is not None else "http"
        self.failed_handshakes = 0
        self._fail_after: int | None = None
        self.delay_s = delay_s
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if receiver.delay_s and self.path == "/v1/traces":
                    time.sleep(receiver.delay_s)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                limit = receiver._fail_after
                if self.path == "/v1/traces" and limit is not None and len(received.traces) >= limit:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path == "/v1/traces" and throttle is not None:
                    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    if throttle.now(request):
                        self.send_response(429)
                        self.send_header("Retry-After", str(throttle.retry_after_s))
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                if self.path == "/v1/traces" and reject is not None:
                    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    if reject(request):
                        with received.lock:
                            received.rejected += 1
                        self.send_response(400)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                with received.lock:
                    received.headers.append(headers)
                    if self.path == "/v1/traces":
                        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                        kept, answer = _partial(request, partial)
                        received.traces.append(kept)
                        reply = answer.SerializeToString()
                    elif self.path == "/v1/metrics":
                        received.metrics.append(
                            metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                        )
                        reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                    elif self.path == "/v1/logs":
                        received.logs.append(logs_service_pb2.ExportLogsServiceRequest.FromString(body))
                        reply = logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
                    else:
                        self.send_response(404)
                        self.end_headers()
                        return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                receiver.failed_handshakes += 1  # a client that refused our certificate

        self.server = Server(("127.0.0.1", port), Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            # The handshake runs in the handler thread (not in accept), so a client that
            # rejects the certificate cannot stall the accept loop.
            original = self.server.get_request

            def get_request() -> tuple[Any, Any]:
                sock, address = original()
                return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

            self.server.get_request = get_request  # type: ignore[method-assign]
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def fail_after(self, requests: int | None) -> None:
        """From the ``requests``-th accepted trace request on, answer 503 (None: heal)."""
        self._fail_after = requests

    def set_delay(self, seconds: float) -> None:
        self.delay_s = seconds

    def __enter__(self) -> HttpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
