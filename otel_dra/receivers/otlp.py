"""The fleet's OTLP metrics receiver: ``MetricsService/Export`` over gRPC and ``POST /v1/metrics``
over HTTP, decoded into Frames and handed to a callback.

Agents (or a collector in front of them) push ``ExportMetricsServiceRequest`` messages; each one
is decoded by :class:`~otel_dra.decode.otlp_proto.OtlpProtoDecoder` (JSON bodies by the replay
decoder) and its frames go to ``on_frames`` on the request's thread. Decoding and the callback run
under one lock: the decoder keeps per-node time order, so two requests of a node must reach the
callback in the order they were decoded, and the classifier is single-threaded anyway.

Answers follow the OTLP specification: success, or partial success with the number of rejected
points and a one-line message; bytes that don't parse are INVALID_ARGUMENT (HTTP 400 with a
``google.rpc.Status`` body); a request over ``max_request_bytes`` is RESOURCE_EXHAUSTED (HTTP 413).
Neither is retryable by the client, and neither stops the receiver.

gRPC takes the request as bytes (a generic handler for the generated service's method) rather
than through the generated servicer registration: that one parses with ``FromString`` first, which
answers INTERNAL instead of INVALID_ARGUMENT for garbage and would parse each request twice.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

import grpc
from google.protobuf.json_format import MessageToJson
from google.rpc import code_pb2, status_pb2
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceResponse,
)

from otel_dra import conventions as cv
from otel_dra.decode.core import DecodeResult
from otel_dra.decode.otlp_json import OtlpJsonDecoder
from otel_dra.decode.otlp_proto import MalformedRequest, OtlpProtoDecoder
from otel_dra.frame import Frame, Schema
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.receivers.tls import CertificateReloader, TlsSettings, describe

log = logging.getLogger(__name__)

#: Observable counters of the receiver (project extensions, registered in semconv/registry.yaml).
REQUESTS: Final = cv.OTEL_DRA_RECEIVER_REQUESTS
POINTS: Final = cv.OTEL_DRA_RECEIVER_POINTS
TRANSPORTS: Final = ("grpc", "http")
#: ``error``: the frames' consumer (``on_frames``) failed; the client gets INTERNAL / HTTP 500.
OUTCOMES: Final = ("ok", "partial", "invalid", "too_large", "error")
POINT_OUTCOMES: Final = ("accepted", "rejected")

DEFAULT_GRPC_ENDPOINT: Final = ReceiverConfig().grpc_endpoint
DEFAULT_HTTP_ENDPOINT: Final = ReceiverConfig().http_endpoint
DEFAULT_MAX_REQUEST_BYTES: Final = ReceiverConfig.max_request_bytes
DEFAULT_MAX_FUTURE_S: Final = ReceiverConfig.max_future_s  # see ReceiverConfig
HTTP_PATH: Final = "/v1/metrics"
#: gRPC refuses, by itself and uncounted, messages over this many times ``max_request_bytes``; between
#: the two the receiver refuses them itself, counted (gRPC gives the application no word of its own refusals).
GRPC_HARD_LIMIT_FACTOR: Final = 2

_SERVICE = metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"]
GRPC_SERVICE: Final = _SERVICE.full_name
GRPC_METHOD: Final = _SERVICE.methods_by_name["Export"].name
_PROTOBUF, _JSON = "application/x-protobuf", "application/json"
_LOG_EVERY_S: Final = 60.0
_CONSUMER_FAILED: Final = "the receiver failed to take the request; see its log"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as (host, port); ValueError with a one-line reason."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class _TooLarge(Exception):
    """Internal: a body over the limit (compressed or not)."""


class _EveryMinute:
    """One log line per kind of trouble per minute, with how many were not logged: a client sending
    garbage in a loop must not flood the log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -_LOG_EVERY_S) < _LOG_EVERY_S:
                self._quiet[kind] = self._quiet.get(kind, 0) + 1
                return
            self._last[kind] = now
            quiet = self._quiet.pop(kind, 0)
        suffix = f" ({quiet} more since the last such line)" if quiet else ""
        log.warning(message + suffix, *args)


class _Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    """The generated service's ``Export``, taking the request's bytes (see the module docstring)."""

    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return self._receiver._grpc_export(request, context)


class OtlpReceiver:
    """Receives OTLP metrics over gRPC and/or HTTP and hands each request's frames to ``on_frames``.

    ``grpc_endpoint`` / ``http_endpoint``: ``host:port`` to listen on, port 0 for any free one,
    None to leave that transport off. ``meter``: where the request and point counters go.
    ``tls``: serve both over TLS. ``max_future_s``: reject points further ahead of this clock.
    """

    def __init__(
        self,
        schema: Schema,
        on_frames: Callable[[list[Frame]], None],
        grpc_endpoint: str | None = DEFAULT_GRPC_ENDPOINT,
        http_endpoint: str | None = DEFAULT_HTTP_ENDPOINT,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        meter: Meter | None = None,
        *,
        max_workers: int = 8,
        tls: TlsSettings | None = None,
        max_future_s: float | None = DEFAULT_MAX_FUTURE_S,
    ) -> None:
        if grpc_endpoint is None and http_endpoint is None:
            raise ValueError("OtlpReceiver needs at least one of grpc_endpoint and http_endpoint")
        if max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {max_request_bytes}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self._grpc_addr = parse_endpoint(grpc_endpoint) if grpc_endpoint is not None else None
        self._http_addr = parse_endpoint(http_endpoint) if http_endpoint is not None else None
        self.schema = schema
        self.max_request_bytes = max_request_bytes
        self.max_workers = max_workers
        self.tls = tls
        self._certs: CertificateReloader | None = None  # made at start: both transports ask it per connection
        self._on_frames = on_frames
        if max_future_s is not None and not max_future_s > 0:
            raise ValueError(f"max_future_s must be positive (or None: no bound), got {max_future_s}")
        future_ns = None if max_future_s is None else int(max_future_s * 1e9)
        self._decoder = OtlpProtoDecoder(schema, max_future_ns=future_ns)
        self._json_decoder = OtlpJsonDecoder(schema, max_future_ns=future_ns)
        self._lock = threading.Lock()  # one request decoded and handed on at a time (see the module docstring)
        self._stats_lock = threading.Lock()
        self._requests = {(t, o): 0 for t in TRANSPORTS for o in OUTCOMES}
        self._points = dict.fromkeys(POINT_OUTCOMES, 0)
        self._grpc_server: grpc.Server | None = None
        self._grpc_port: int | None = None
        self._http_server: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._warn = _EveryMinute()
        if meter is not None:
            meter.create_observable_counter(
                REQUESTS.name, callbacks=[self._observe_requests], unit=REQUESTS.unit, description=REQUESTS.description
            )
            meter.create_observable_counter(
                POINTS.name, callbacks=[self._observe_points], unit=POINTS.unit, description=POINTS.description
            )

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Listen on the configured endpoints; raises OSError (one line) when one can't be bound."""
        if self._grpc_server is not None or self._http_server is not None:
            raise RuntimeError("OtlpReceiver already started")
        if self.tls is not None:
            self._certs = CertificateReloader(self.tls)
        try:
            if self._grpc_addr is not None:
                self._start_grpc(*self._grpc_addr)
            if self._http_addr is not None:
                self._start_http(*self._http_addr)
        except BaseException:
            self.shutdown(0)
            raise
        where = [f"gRPC on {self._grpc_addr[0]}:{self._grpc_port}"] if self._grpc_addr else []
        if self._http_addr:
            where.append(f"HTTP on {self._http_addr[0]}:{self.http_port}{HTTP_PATH}")
        log.info(
            "receiving OTLP metrics: %s (%s; requests up to %d bytes)",
            " and ".join(where),
            describe(self.tls),
            self.max_request_bytes,
        )

    def _start_grpc(self, host: str, port: int) -> None:
        limit = self.max_request_bytes * GRPC_HARD_LIMIT_FACTOR
        servicer = _Servicer(self)
        method = grpc.unary_unary_rpc_method_handler(servicer.Export)  # bytes in, bytes out
        server = grpc.server(
            ThreadPoolExecutor(self.max_workers, thread_name_prefix="otlp-grpc"),
            handlers=[grpc.method_handlers_generic_handler(GRPC_SERVICE, {GRPC_METHOD: method})],
            options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)],
        )
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if self._certs is not None:
                bound = server.add_secure_port(address, self._certs.grpc_credentials())
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen for OTLP/gRPC on {address}: {exc}") from None
        if not bound:
            raise OSError(f"cannot listen for OTLP/gRPC on {address}")
        server.start()
        self._grpc_server, self._grpc_port = server, bound

    def _start_http(self, host: str, port: int) -> None:
        handler = type("_BoundHandler", (_HttpHandler,), {"receiver": self})
        server_class = _HttpServer6 if ":" in host else _HttpServer
        try:
            server = server_class((host, port), handler)
        except OSError as exc:
            raise OSError(f"cannot listen for OTLP/HTTP on {host}:{port}: {exc.strerror or exc}") from None
        if self._certs is not None:
            # The handshake happens on the connection's own thread (at its first read), never in accept():
            # a client that stalls it holds only its own thread, for the handler's timeout at most.
            server.socket = self._certs.ssl_context().wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._http_server = server
        self._http_thread = threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True)
        self._http_thread.start()

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop listening; requests in flight get most of ``timeout_s`` to finish."""
        grace_s = timeout_s / 2  # half for work in flight, the rest for closing
        grpc_server, self._grpc_server = self._grpc_server, None
        http_server, self._http_server = self._http_server, None
        if grpc_server is not None:
            grpc_server.stop(grace_s).wait(grace_s + 1.0)
        if http_server is not None:
            http_server.shutdown()
            http_server.server_close()
            if self._http_thread is not None:
                self._http_thread.join(grace_s + 1.0)
        self._http_thread = None
        if grpc_server is not None or http_server is not None:
            log.info("OTLP metrics receiver stopped")

    @property
    def grpc_port(self) -> int | None:
        """The bound gRPC port (the real one when 0 was asked for); None when not listening."""
        return self._grpc_port if self._grpc_server is not None else None

    @property
    def http_port(self) -> int | None:
        """The bound HTTP port; None when not listening."""
        return int(self._http_server.server_address[1]) if self._http_server is not None else None

    def stats(self) -> dict[str, dict[Any, int]]:
        """Counters so far: ``requests`` by (transport, outcome), ``points`` by outcome."""
        with self._stats_lock:
            return {"requests": dict(self._requests), "points": dict(self._points)}

    # -- the request -------------------------------------------------------------------------
    def _count(self, transport: str, outcome: str, accepted: int = 0, rejected: int = 0) -> None:
        with self._stats_lock:
            self._requests[(transport, outcome)] += 1
            self._points["accepted"] += accepted
            self._points["rejected"] += rejected

    def _take(self, transport: str, decode: Callable[[], DecodeResult]) -> ExportMetricsServiceResponse:
        """Decode one request and hand its frames on, under the lock; count the outcome. Raises
        MalformedRequest (the client's fault), or whatever decoding or ``on_frames`` raised (ours)."""
        with self._lock:
            try:
                result = decode()
            except MalformedRequest as exc:
                self._count(transport, "invalid")
                self._warn.warning("invalid", "OTLP/%s: invalid request refused: %s", transport, exc)
                raise
            except Exception:
                self._count(transport, "error")
                log.exception("OTLP/%s: decoding a request failed (a bug: please report it)", transport)
                raise
            try:
                if result.frames:
                    self._on_frames(result.frames)
            except Exception:
                self._count(transport, "error")
                log.exception("OTLP/%s: the frames' consumer failed; request refused", transport)
                raise
        return self._respond(transport, result)

    def export_protobuf(self, data: bytes, transport: str) -> ExportMetricsServiceResponse:
        """One serialized ``ExportMetricsServiceRequest`` (see :meth:`_take` for what it raises)."""

        return self._take(transport, lambda: self._decoder.decode(data))

    def export_json(self, data: bytes) -> ExportMetricsServiceResponse:
        """A request in the JSON mapping (OTLP/HTTP ``application/json``), read by the replay decoder;
        a request it can't use as a whole (not JSON, a resource without ``k8s.node.name``) is refused
        as invalid."""

        def decode() -> DecodeResult:
            result = self._json_decoder.decode(data, self._json_decoder.lines + 1)
            if result.invalid is not None:
                raise MalformedRequest(result.invalid)
            return result

        return self._take("http", decode)

    def _respond(self, transport: str, result: DecodeResult) -> ExportMetricsServiceResponse:
        """Success, or partial success read off the decoder's result as it is."""
        rejected = result.rejected
        self._count(transport, "partial" if rejected else "ok", result.accepted, rejected)
        if not rejected:
            return ExportMetricsServiceResponse()
        message = result.message
        log.debug("OTLP/%s: partial success: %s", transport, message)
        return ExportMetricsServiceResponse(
            partial_success=ExportMetricsPartialSuccess(rejected_data_points=rejected, error_message=message)
        )

    def _too_large(self, transport: str, size: str) -> str:
        self._count(transport, "too_large")
        message = f"request of {size} bytes is over the limit of {self.max_request_bytes:,} bytes"
        self._warn.warning("too_large", "OTLP/%s: %s; refused", transport, message)
        return message

    # -- gRPC --------------------------------------------------------------------------------
    def _grpc_export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if len(request) > self.max_request_bytes:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._too_large("grpc", f"{len(request):,}"))
        try:
            response = self.export_protobuf(request, "grpc")
        except MalformedRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception:
            context.abort(grpc.StatusCode.INTERNAL, _CONSUMER_FAILED)
        return response.SerializeToString()

    # -- HTTP --------------------------------------------------------------------------------
    def _http_post(self, handler: _HttpHandler) -> None:
        path = handler.path.split("?", 1)[0]
        if path != HTTP_PATH:
            handler.discard_body(self.max_request_bytes)
            handler.reply_status(404, code_pb2.NOT_FOUND, f"not found: OTLP metrics go to POST {HTTP_PATH}")
            return
        ctype = handler.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        as_json = ctype == _JSON
        if ctype not in (_PROTOBUF, _JSON):
            self._count("http", "invalid")
            handler.discard_body(self.max_request_bytes)
            handler.reply_status(415, code_pb2.INVALID_ARGUMENT, f"unsupported Content-Type {ctype!r}: use {_PROTOBUF}")
            return
        encoding = handler.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", ""):
            self._count("http", "invalid")
            handler.discard_body(self.max_request_bytes)
            handler.reply_status(415, code_pb2.INVALID_ARGUMENT, f"unsupported Content-Encoding {encoding!r}", as_json)
            return
        try:
            body = handler.read_body(self.max_request_bytes)
            if body is None:
                return  # the client went away, or sent no length (answered)
            if encoding == "gzip":
                body = _gunzip(body, self.max_request_bytes)
        except _TooLarge as exc:
            message = self._too_large("http", str(exc))
            handler.reply_status(413, code_pb2.RESOURCE_EXHAUSTED, message, as_json, close=True)
            return
        except ValueError as exc:
            self._count("http", "invalid")
            self._warn.warning("invalid", "OTLP/http: unreadable body refused: %s", exc)
            handler.reply_status(400, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
            return
        try:
            response = self.export_json(body) if as_json else self.export_protobuf(body, "http")
        except MalformedRequest as exc:
            handler.reply_status(400, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
            return
        except Exception:
            handler.reply_status(500, code_pb2.INTERNAL, _CONSUMER_FAILED, as_json)
            return
        if as_json:
            handler.reply(200, _JSON, MessageToJson(response, indent=None).encode())
        else:
            handler.reply(200, _PROTOBUF, response.SerializeToString())

    # -- metrics -----------------------------------------------------------------------------
    def _observe_requests(self, _: CallbackOptions) -> Iterable[Observation]:
        transports = [t for t, on in zip(TRANSPORTS, (self._grpc_addr, self._http_addr), strict=True) if on]
        counts = self.stats()["requests"]
        return [Observation(counts[(t, o)], {"transport": t, "outcome": o}) for t in transports for o in OUTCOMES]

    def _observe_points(self, _: CallbackOptions) -> Iterable[Observation]:
        counts = self.stats()["points"]
        return [Observation(counts[o], {"outcome": o}) for o in POINT_OUTCOMES]


def _gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body (one or more members), refusing to inflate past ``limit`` bytes."""
    out: list[bytes] = []
    size = 0
    data = body
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = inflater.decompress(data, limit + 1 - size)
        except zlib.error as exc:
            raise ValueError(f"body is not valid gzip: {exc}") from None
        size += len(chunk)
        if size > limit:
            raise _TooLarge(f"more than {limit:,} (inflated)")
        if not inflater.eof:
            raise ValueError("body is not valid gzip: truncated")
        out.append(chunk)
        data = inflater.unused_data
    return b"".join(out)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that broke in a way the handler didn't expect: one debug line, not a traceback."""
        log.debug("OTLP/http: connection from %s ended with an error", client_address, exc_info=True)


class _HttpServer6(_HttpServer):
    address_family = socket.AF_INET6


class _HttpHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive (the OTLP/HTTP exporters reuse connections); quiet access log."""

    protocol_version = "HTTP/1.1"
    server_version = "otel-dra"
    #: Seconds a connection may stall (in the TLS handshake, between requests, mid-body) before it is dropped.
    timeout = 30.0
    receiver: OtlpReceiver

    def setup(self) -> None:
        super().setup()  # applies ``timeout`` to the connection, the handshake included
        self.tls_failed = False
        if isinstance(self.connection, ssl.SSLSocket):
            certs = self.receiver._certs
            try:
                if certs is not None:
                    self.connection.context = certs.ssl_context()  # the newest certificate (see tls.py)
                self.connection.do_handshake()
            except (OSError, ssl.SSLError) as exc:  # plaintext, no client certificate, a stalled client
                self.tls_failed = True
                self.receiver._warn.warning(
                    "tls", "OTLP/http: TLS handshake with %s failed: %s", self.client_address[0], exc
                )

    def handle(self) -> None:
        if self.tls_failed:
            return
        try:
            super().handle()
        except (ConnectionError, TimeoutError, ssl.SSLError):
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        try:
            self.receiver._http_post(self)
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def _not_allowed(self) -> None:
        self.discard_body(self.receiver.max_request_bytes)
        self.reply_status(405, code_pb2.UNIMPLEMENTED, f"method not allowed: OTLP metrics go to POST {HTTP_PATH}")

    do_GET = do_PUT = do_DELETE = do_PATCH = _not_allowed

    def read_body(self, limit: int) -> bytes | None:
        """The request body, up to ``limit`` bytes; raises _TooLarge (the body is left unread and the
        connection will close), ValueError for a bad length. None: answered or the client left."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(limit)
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self.reply_status(411, code_pb2.INVALID_ARGUMENT, "Content-Length required", close=True)
            return None
        if not length_text.strip().isdigit():
            self.close_connection = True
            raise ValueError(f"bad Content-Length {length_text[:40]!r}")
        length = int(length_text)
        if length > limit:
            raise _TooLarge(f"{length:,}")
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True
            return None
        return body

    def _read_chunked(self, limit: int) -> bytes | None:
        parts: list[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                n = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise ValueError("bad chunked encoding") from None
            if n == 0:
                while self.rfile.readline(1024).strip():  # trailers
                    pass
                return b"".join(parts)
            size += n
            if size > limit:
                raise _TooLarge(f"more than {limit:,}")
            chunk = self.rfile.read(n)
            self.rfile.readline(8)
            if len(chunk) < n:
                self.close_connection = True
                return None
            parts.append(chunk)

    def discard_body(self, limit: int) -> None:
        """Read and drop a body we won't use, so the connection can carry the next request."""
        length_text = self.headers.get("Content-Length", "")
        if length_text.isdigit() and int(length_text) <= limit:
            self.rfile.read(int(length_text))
        elif length_text or "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True

    def reply(self, status: int, content_type: str, body: bytes, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close or self.close_connection:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def reply_status(self, status: int, code: int, message: str, as_json: bool = False, close: bool = False) -> None:
        """An error as OTLP/HTTP wants it: a ``google.rpc.Status`` in the request's encoding."""
        if as_json:
            self.reply(status, _JSON, json.dumps({"code": code, "message": message}).encode(), close)
        else:
            self.reply(status, _PROTOBUF, status_pb2.Status(code=code, message=message).SerializeToString(), close)
