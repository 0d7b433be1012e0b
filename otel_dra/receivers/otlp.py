"""The fleet's OTLP metrics receiver: ``MetricsService/Export`` over gRPC and ``POST /v1/metrics``
over HTTP, decoded into Frames and handed to a callback.

Agents (or a collector in front of them) push ``ExportMetricsServiceRequest`` messages; each one
is decoded by :class:`~otel_dra.decode.otlp_proto.OtlpProtoDecoder` (JSON bodies by the replay
decoder) and its frames go to ``on_frames`` on the request's thread. Decoding and the callback run
under one lock: the decoder keeps per-node time order, so two requests of a node must reach the
callback in the order they were decoded, and the classifier is single-threaded anyway.

Answers follow the OTLP specification: success, or partial success with the number of rejected
points and a one-line message (points past a cap of :class:`~otel_dra.decode.limits.DecodeLimits`
among them, counted by reason); bytes that don't parse are INVALID_ARGUMENT (HTTP 400 with a
``google.rpc.Status`` body); a request over ``max_request_bytes`` is RESOURCE_EXHAUSTED (HTTP 413).
Neither is retryable by the client, and neither stops the receiver. When the fleet falls behind
(its queue of frames is full, or too many requests wait to be decoded) the answer is backpressure,
as the Collector's memory limiter gives it: UNAVAILABLE with ``RetryInfo`` / HTTP 503 with
``Retry-After``, which the OTLP exporters (and the agent's sending queue behind them) retry.

HTTP is served by :class:`~otel_dra.serve.http.HttpServer` (asyncio, bounded connections and
timeouts); decoding runs on its one worker thread, off the event loop.

gRPC takes the request as bytes (a generic handler for the generated service's method) rather
than through the generated servicer registration: that one parses with ``FromString`` first, which
answers INTERNAL instead of INVALID_ARGUMENT for garbage and would parse each request twice. It takes
them as a stream of one (``stream_unary``, the same bytes on the wire), so that a call can be refused
before its request is read (:mod:`~otel_dra.serve.grpc_pool`). gRPC is served behind
:class:`~otel_dra.serve.grpc_front.GrpcFront`, which holds its connections as the HTTP side holds its own.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import grpc
from aiohttp import web
from google.protobuf import any_pb2
from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToJson
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceResponse,
)

from otel_dra import conventions as cv
from otel_dra.decode.core import CLOCK_JUMP_NS, DecodeResult
from otel_dra.decode.limits import LIMIT_REASONS, DecodeLimits
from otel_dra.decode.otlp_json import OtlpJsonDecoder
from otel_dra.decode.otlp_proto import MalformedRequest, OtlpProtoDecoder
from otel_dra.frame import Frame, Schema
from otel_dra.receivers import auth as authn
from otel_dra.receivers.auth import ClientNodes, ReceiverAuth, Speaker
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.receivers.tls import CertificateReloader, TlsSettings, describe
from otel_dra.serve.config import HttpServerConfig, ListenError
from otel_dra.serve.grpc_front import UNKNOWN_PEER, GrpcFront
from otel_dra.serve.grpc_pool import ReadDeadlines, ShedPool, shedding
from otel_dra.serve.http import BodyError, HttpServer, gunzip, read_body

log = logging.getLogger(__name__)

#: Observable counters of the receiver (project extensions, registered in semconv/registry.yaml).
REQUESTS: Final = cv.OTEL_DRA_RECEIVER_REQUESTS
POINTS: Final = cv.OTEL_DRA_RECEIVER_POINTS
REFUSED: Final = cv.OTEL_DRA_RECEIVER_REFUSED
CLOCK_SKEW: Final = cv.OTEL_DRA_RECEIVER_CLOCK_SKEW
#: ``ahead``: points past --max-future ahead of this clock (refused); ``behind``: points more than a minute behind
#: what was read for their series (a clock that jumped back: taken, the series restarted).
CLOCK_DIRECTIONS: Final = ("ahead", "behind")
CONNECTIONS: Final = cv.OTEL_DRA_RECEIVER_CONNECTIONS
ATTRIBUTES_IGNORED: Final = cv.OTEL_DRA_RECEIVER_ATTRIBUTES_IGNORED
TRANSPORTS: Final = ("grpc", "http")
#: ``error``: the frames' consumer (``on_frames``) failed; the client gets INTERNAL / HTTP 500.
#: ``overloaded``: refused for now (backpressure); the client gets UNAVAILABLE / HTTP 503 and retries.
#: ``unauthenticated``: no bearer token, or a wrong one (``--auth-token-file``); UNAUTHENTICATED / HTTP 401.
OUTCOMES: Final = ("ok", "partial", "invalid", "too_large", "error", "overloaded", "unauthenticated")
#: ``ignored``: otel-dra's own telemetry in an agent's push (its verdicts, its queue's metrics), taken and set
#: aside: neither input nor a rejection, so it never makes a request partial.
POINT_OUTCOMES: Final = ("accepted", "rejected", "ignored")

DEFAULT_GRPC_ENDPOINT: Final = ReceiverConfig().grpc_endpoint
DEFAULT_HTTP_ENDPOINT: Final = ReceiverConfig().http_endpoint
DEFAULT_MAX_REQUEST_BYTES: Final = ReceiverConfig.max_request_bytes
DEFAULT_MAX_FUTURE_S: Final = ReceiverConfig.max_future_s  # see ReceiverConfig
HTTP_PATH: Final = "/v1/metrics"
#: gRPC refuses, by itself and uncounted, messages over this many times ``max_request_bytes``; between
#: the two the receiver refuses them itself, counted (gRPC gives the application no word of its own refusals).
GRPC_HARD_LIMIT_FACTOR: Final = 2
#: Requests one gRPC connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; Go's
#: HTTP/2 server allows 250, an OTLP exporter uses one or a few).
GRPC_STREAMS_PER_CONNECTION: Final = 100

_SERVICE = metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"]
GRPC_SERVICE: Final = _SERVICE.full_name
GRPC_METHOD: Final = _SERVICE.methods_by_name["Export"].name
_PROTOBUF, _JSON = "application/x-protobuf", "application/json"
#: An HTTP request body smaller than this is decoded on the event loop's thread when the decoder is free (a
#: typical agent request, about 100 kB, takes a fraction of a millisecond); a larger one, or one arriving
#: while another is decoded, on the worker, so the loop never waits.
INLINE_BYTES: Final = 256 << 10
_CONSUMER_FAILED: Final = "the receiver failed to take the request; see its log"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as (host, port); ValueError with a one-line reason."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class _Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    """The generated service's ``Export``, taking the request's bytes as a stream of one (see the module
    docstring)."""

    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        return self._receiver._grpc_export(request, context)


class Overloaded(Exception):
    """The fleet can't take more now: the client should retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OtlpReceiver:
    """Receives OTLP metrics over gRPC and/or HTTP and hands each request's frames to ``on_frames``.

    ``grpc_endpoint`` / ``http_endpoint``: ``host:port`` to listen on, port 0 for any free one,
    None to leave that transport off. ``meter``: where the request and point counters go.
    ``tls``: serve both over TLS. ``max_future_s``: reject points further ahead of this clock.
    ``limits``: the caps on nodes, devices, series and attribute length. ``http``: the HTTP
    server's connection cap and timeouts. ``backlog``: asked before each request is decoded; a
    number of seconds means the consumer is behind, and the request is refused with that retry
    delay. ``max_pending``: requests at most being read or waiting to be decoded (each may hold
    ``max_request_bytes``); past it, new ones are refused the same way. ``auth``: the bearer token to
    ask for, and which nodes a client certificate may speak for (with mutual TLS, a certificate speaks
    for the node it names even without it; :mod:`~otel_dra.receivers.auth`).
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
        limits: DecodeLimits | None = None,
        http: HttpServerConfig | None = None,
        backlog: Callable[[], float | None] | None = None,
        max_pending: int = ReceiverConfig.max_pending_requests,
        auth: ReceiverAuth | None = None,
    ) -> None:
        if grpc_endpoint is None and http_endpoint is None:
            raise ValueError("OtlpReceiver needs at least one of grpc_endpoint and http_endpoint")
        if max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {max_request_bytes}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._grpc_addr = parse_endpoint(grpc_endpoint) if grpc_endpoint is not None else None
        self._http_addr = parse_endpoint(http_endpoint) if http_endpoint is not None else None
        self.schema = schema
        self.max_request_bytes = max_request_bytes
        self.max_workers = max_workers
        self.tls = tls
        self.http_config = http or HttpServerConfig()
        self.limits = limits or DecodeLimits()
        self.max_pending = max_pending
        self._backlog = backlog
        self._pending = 0  # requests being read or decoded (both transports)
        self._certs: CertificateReloader | None = None  # made at start: both transports ask it per connection
        self.auth = auth
        #: With mutual TLS, which nodes a client certificate may report for.
        self._client_nodes = auth.nodes if auth is not None else ClientNodes()
        self._on_frames = on_frames
        if max_future_s is not None and not max_future_s > 0:
            raise ValueError(f"max_future_s must be positive (or None: no bound), got {max_future_s}")
        future_ns = None if max_future_s is None else int(max_future_s * 1e9)
        # Live input: a point far behind its series is a node's clock that jumped back, taken (CLOCK_JUMP_NS).
        jump = CLOCK_JUMP_NS
        self._decoder = OtlpProtoDecoder(schema, max_future_ns=future_ns, limits=self.limits, clock_jump_ns=jump)
        self._json_decoder = OtlpJsonDecoder(schema, max_future_ns=future_ns, limits=self.limits, clock_jump_ns=jump)
        # One request decoded and handed on at a time (see the module docstring); reentrant, as the HTTP side
        # takes it before decoding on the event loop's thread (``_http_export``).
        self._lock = threading.RLock()
        self._stats_lock = threading.Lock()
        self._requests = {(t, o): 0 for t in TRANSPORTS for o in OUTCOMES}
        self._points = dict.fromkeys(POINT_OUTCOMES, 0)
        self._refused = dict.fromkeys(LIMIT_REASONS, 0)
        self._clock_skew = dict.fromkeys(CLOCK_DIRECTIONS, 0)  # points of nodes whose clock jumped
        self._stray = 0  # points taken with attributes not read (told once in the log, counted always)
        self._grpc_server: grpc.Server | None = None
        self._front: GrpcFront | None = None
        self._grpc_pool: ShedPool | None = None
        self._reads: ReadDeadlines | None = None
        self._http: HttpServer | None = None
        if meter is not None:
            meter.create_observable_counter(
                REQUESTS.name, callbacks=[self._observe_requests], unit=REQUESTS.unit, description=REQUESTS.description
            )
            meter.create_observable_counter(
                POINTS.name, callbacks=[self._observe_points], unit=POINTS.unit, description=POINTS.description
            )
            meter.create_observable_counter(
                REFUSED.name, callbacks=[self._observe_refused], unit=REFUSED.unit, description=REFUSED.description
            )
            meter.create_observable_counter(
                CLOCK_SKEW.name,
                callbacks=[self._observe_clock],
                unit=CLOCK_SKEW.unit,
                description=CLOCK_SKEW.description,
            )
            meter.create_observable_counter(
                ATTRIBUTES_IGNORED.name,
                callbacks=[self._observe_stray],
                unit=ATTRIBUTES_IGNORED.unit,
                description=ATTRIBUTES_IGNORED.description,
            )
            meter.create_observable_gauge(
                CONNECTIONS.name,
                callbacks=[self._observe_connections],
                unit=CONNECTIONS.unit,
                description=CONNECTIONS.description,
            )

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Listen on the configured endpoints; raises OSError (one line) when one can't be bound."""
        if self._grpc_server is not None or self._http is not None:
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
        where = [f"gRPC on {self._grpc_addr[0]}:{self.grpc_port}"] if self._grpc_addr else []
        if self._http_addr:
            where.append(f"HTTP on {self._http_addr[0]}:{self.http_port}{HTTP_PATH}")
        caps = [f"{s.max_connections} {t}" for t, s in (("gRPC", self._front), ("HTTP", self._http)) if s is not None]
        log.info(
            "receiving OTLP metrics: %s (%s, clients need %s; requests up to %d bytes; connections at most: %s)",
            " and ".join(where),
            describe(self.tls),
            authn.describe(self.auth, self.mutual),
            self.max_request_bytes,
            ", ".join(caps),
        )

    def _start_grpc(self, host: str, port: int) -> None:
        cfg = self.http_config
        tls = self._certs.h2_context if self._certs is not None else None
        front = GrpcFront("OTLP/gRPC", host, port, cfg, tls=tls, max_streams=GRPC_STREAMS_PER_CONNECTION)
        self._front = front  # (so that a failure below lets go of its port)
        method = grpc.stream_unary_rpc_method_handler(_Servicer(self).Export)  # bytes in, bytes out
        pool = ShedPool(self.max_workers, self.max_pending)
        server = grpc.server(
            pool,
            handlers=[grpc.method_handlers_generic_handler(GRPC_SERVICE, {GRPC_METHOD: method})],
            # Past the pool's bound, calls are answered "retry later" by the handler (ShedPool); gRPC's own
            # refusal, which clients must not retry, is only for a flood far past what the cap lets in.
            maximum_concurrent_rpcs=front.max_servers * GRPC_STREAMS_PER_CONNECTION,
            options=[
                ("grpc.max_receive_message_length", self.max_request_bytes * GRPC_HARD_LIMIT_FACTOR),
                ("grpc.max_concurrent_streams", GRPC_STREAMS_PER_CONNECTION),
                # The front holds the cap; gRPC's, above it (closed connections leave its count a little
                # late), only guards against a leak.
                ("grpc.max_allowed_incoming_connections", 2 * front.max_servers + 16),
                # The HTTP/2 preface and settings within the header timeout; idle connections closed with a
                # GOAWAY; keepalive as Go's gRPC server and the Collector's configgrpc enforce it by default.
                ("grpc.server_handshake_timeout_ms", int(cfg.header_timeout_s * 1000)),
                ("grpc.max_connection_idle_ms", int(cfg.idle_timeout_s * 1000)),
                ("grpc.keepalive_time_ms", 2 * 3600 * 1000),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 5 * 60 * 1000),
                ("grpc.keepalive_permit_without_calls", 0),
                ("grpc.http2.max_ping_strikes", 2),
            ],
        )
        try:
            bound = server.add_insecure_port(front.inner_address)  # the front's private socket; TLS is the front's
        except RuntimeError as exc:  # gRPC's core says only "Failed to bind", never why
            raise ListenError("OTLP/gRPC", host, port, str(exc)) from None
        if not bound:
            raise ListenError("OTLP/gRPC", host, port, "the gRPC server could not listen behind its front")
        self._reads = ReadDeadlines(cfg.body_timeout_s, on_late=self._read_late)
        self._reads.start()
        server.start()
        front.start()
        self._grpc_server, self._grpc_pool = server, pool

    def _start_http(self, host: str, port: int) -> None:
        tls = self._certs.ssl_context if self._certs is not None else None
        cfg, limit = self.http_config, self.max_request_bytes
        self._http = HttpServer("OTLP/HTTP", host, port, self._http_request, cfg, tls=tls, max_body_bytes=limit)
        self._http.start()

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop listening; requests in flight get most of ``timeout_s`` to finish."""
        grace_s = timeout_s / 2  # half for work in flight, the rest for closing
        grpc_server, self._grpc_server = self._grpc_server, None
        front, self._front = self._front, None
        http, self._http = self._http, None
        if grpc_server is not None:  # first, while the front still carries the answers in flight
            grpc_server.stop(grace_s).wait(grace_s + 1.0)
        if front is not None:
            front.shutdown(grace_s)
        if self._reads is not None:
            self._reads.stop()
        if self._grpc_pool is not None:
            self._grpc_pool.shutdown(wait=False, cancel_futures=True)
        if http is not None:
            http.shutdown(timeout_s)
        if grpc_server is not None or http is not None:
            log.info("OTLP metrics receiver stopped")

    @property
    def mutual(self) -> bool:
        """Whether clients present certificates (mutual TLS): then each speaks only for the nodes it may."""
        return self.tls is not None and self.tls.mutual

    @property
    def grpc_port(self) -> int | None:
        """The bound gRPC port (the real one when 0 was asked for); None when not listening."""
        return self._front.port if self._grpc_server is not None and self._front is not None else None

    @property
    def http_port(self) -> int | None:
        """The bound HTTP port; None when not listening."""
        return self._http.port if self._http is not None else None

    def stats(self) -> dict[str, dict[Any, Any]]:
        """Counters so far: ``requests`` by (transport, outcome), ``points`` by outcome (accepted, rejected,
        ignored), ``refused`` points by cap reason, ``clock_skew`` points by direction (ahead, behind),
        ``attributes_ignored`` (points with attributes not read) and ``connections``: each transport's server's
        counters, by transport."""
        with self._stats_lock:
            counts: dict[str, dict[Any, Any]] = {
                "requests": dict(self._requests),
                "points": dict(self._points),
                "refused": dict(self._refused),
                "clock_skew": dict(self._clock_skew),
                "attributes_ignored": {"points": self._stray},
            }
        servers = (("grpc", self._front if self._grpc_server is not None else None), ("http", self._http))
        counts["connections"] = {t: server.stats() for t, server in servers if server is not None}
        return counts

    # -- the request -------------------------------------------------------------------------
    def _count(self, transport: str, outcome: str, accepted: int = 0, rejected: int = 0, ignored: int = 0) -> None:
        with self._stats_lock:
            self._requests[(transport, outcome)] += 1
            self._points["accepted"] += accepted
            self._points["rejected"] += rejected
            self._points["ignored"] += ignored

    def _admit(self, transport: str, shed: bool = False) -> None:
        """Take a pending slot, or raise :class:`Overloaded` (counted) when the fleet is behind; ``shed``:
        the call is past the gRPC workers' bound (:class:`~otel_dra.serve.grpc_pool.ShedPool`).
        The retry delay is spread over a second, so a refused burst does not come back as one."""
        retry_s = self._backlog() if self._backlog is not None else None
        with self._stats_lock:
            if shed:
                retry_s = 1.0 + random.random()
                why = f"more than {self._grpc_pool.bound if self._grpc_pool else 0} calls are waiting for a worker"
            elif retry_s is None and self._pending >= self.max_pending:
                retry_s = 1.0 + random.random()
                why = f"{self._pending} requests are already waiting to be decoded"
            else:
                why = "the fleet's queue of frames is full"
            if retry_s is None:
                self._pending += 1
                return
            self._requests[(transport, "overloaded")] += 1
        log.warning("OTLP/%s: overloaded, a request was refused for now: %s", transport, why)
        raise Overloaded(f"overloaded: {why}; retry in {round(retry_s, 1):g} s", retry_s)

    def _release(self) -> None:
        with self._stats_lock:
            self._pending -= 1

    def _unauthenticated(self, transport: str, header: str | None, peer: str) -> str | None:
        """Why a request's ``Authorization`` is refused (counted, one log line), or None to go on."""
        if self.auth is None:
            return None
        problem = self.auth.token_problem(header)
        if problem is None:
            return None
        self._count(transport, "unauthenticated")
        log.warning("OTLP/%s: unauthenticated request from %s refused: %s", transport, peer, problem)
        return f"unauthenticated: {problem}; send authorization: {authn.SCHEME} <token>"

    def _take(
        self, transport: str, decode: Callable[[], DecodeResult], speaker: Speaker | None = None
    ) -> ExportMetricsServiceResponse:
        """Decode one request and hand its frames on, under the lock; count the outcome. Raises
        MalformedRequest (the client's fault), or whatever decoding or ``on_frames`` raised (ours)."""
        with self._lock:
            try:
                result = decode()
            except MalformedRequest as exc:
                self._count(transport, "invalid")
                log.warning("OTLP/%s: invalid request refused: %s", transport, exc)
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
        return self._respond(transport, result, speaker)

    def export_protobuf(
        self, data: bytes, transport: str, speaker: Speaker | None = None
    ) -> ExportMetricsServiceResponse:
        """One serialized ``ExportMetricsServiceRequest`` (see :meth:`_take` for what it raises);
        ``speaker``: the nodes its client may report for (None: any)."""

        return self._take(transport, lambda: self._decoder.decode(data, speaker=speaker), speaker)

    def export_json(self, data: bytes, speaker: Speaker | None = None) -> ExportMetricsServiceResponse:
        """A request in the JSON mapping (OTLP/HTTP ``application/json``), read by the replay decoder;
        a request it can't use as a whole (not JSON, a resource without ``k8s.node.name``) is refused
        as invalid."""

        def decode() -> DecodeResult:
            result = self._json_decoder.decode(data, self._json_decoder.lines + 1, speaker=speaker)
            if result.invalid is not None:
                raise MalformedRequest(result.invalid)
            return result

        return self._take("http", decode, speaker)

    def _respond(
        self, transport: str, result: DecodeResult, speaker: Speaker | None = None
    ) -> ExportMetricsServiceResponse:
        """Success, or partial success read off the decoder's result as it is (ignored points are neither)."""
        rejected = result.rejected
        self._count(transport, "partial" if rejected else "ok", result.accepted, rejected, result.ignored)
        if result.stray:
            with self._stats_lock:
                first, self._stray = self._stray == 0, self._stray + result.stray
            if first:
                log.info(
                    "OTLP/%s: %d points carried attributes otel-dra does not read: taken, those attributes ignored "
                    "(they make no series; counted in %s)",
                    transport,
                    result.stray,
                    ATTRIBUTES_IGNORED.name,
                )
        if result.clock_jumps:  # (each already told in a warning by the decoder)
            with self._stats_lock:
                for jump in result.clock_jumps:
                    self._clock_skew[jump.direction] += jump.points
        if result.limited:
            with self._stats_lock:
                for reason, n in result.limited.items():
                    self._refused[reason] = self._refused.get(reason, 0) + n
            if speaker is not None and speaker.refused:
                named = ", ".join(speaker.refused)
                more = speaker.refused_count - len(speaker.refused)
                log.warning(
                    "OTLP/%s: a client whose certificate names %s may not report for node %s%s: %s",
                    transport,
                    speaker.who,
                    named,
                    f" and {more:,} more" if more > 0 else "",
                    result.message,
                )
            else:
                log.warning("OTLP/%s: points refused past a limit: %s", transport, result.message)
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
        log.warning("OTLP/%s: %s; refused", transport, message)
        return message

    # -- gRPC --------------------------------------------------------------------------------
    def _grpc_export(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        peer = self._front.peer(context.peer()) if self._front is not None else UNKNOWN_PEER
        if self.auth is not None and self.auth.token:
            header = next((str(v) for k, v in context.invocation_metadata() if k == "authorization"), None)
            refused = self._unauthenticated("grpc", header, peer.address)
            if refused is not None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
        speaker = self._client_nodes.cert_speaker(peer.peercert) if self.mutual else None
        try:
            self._admit("grpc", shed=shedding())
        except Overloaded as exc:  # answered before the request is read: a refusal costs no more than this
            context.set_trailing_metadata(_retry_metadata(str(exc), exc.retry_after_s))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        try:
            request = self._read_request(requests, context)  # (a call cancelled while read raises grpc.RpcError)
            if len(request) > self.max_request_bytes:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._too_large("grpc", f"{len(request):,}"))
            try:
                response = self.export_protobuf(request, "grpc", speaker)
            except MalformedRequest as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except Exception:
                context.abort(grpc.StatusCode.INTERNAL, _CONSUMER_FAILED)
        finally:
            self._release()
        return response.SerializeToString()

    def _read_request(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """The call's one message, read within the body timeout (:class:`ReadDeadlines`)."""
        token = self._reads.watch(context) if self._reads is not None else None
        try:
            request = next(requests, None)
        finally:
            if token is not None and self._reads is not None:
                self._reads.done(token)
        if request is None:
            self._count("grpc", "invalid")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no ExportMetricsServiceRequest message")
        return request

    def _read_late(self) -> None:
        self._count("grpc", "invalid")
        log.warning(
            "OTLP/gRPC: a request was not received within %g s of being read (--body-timeout); call cancelled",
            self.http_config.body_timeout_s,
        )

    # -- HTTP --------------------------------------------------------------------------------
    async def _http_request(self, request: web.BaseRequest) -> web.Response:
        """``POST /v1/metrics``: read the body (bounded in size and time), decode it on the worker."""
        if request.method != "POST":
            return _status(405, code_pb2.UNIMPLEMENTED, f"method not allowed: OTLP metrics go to POST {HTTP_PATH}")
        if request.path != HTTP_PATH:
            return _status(404, code_pb2.NOT_FOUND, f"not found: OTLP metrics go to POST {HTTP_PATH}")
        ctype = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        as_json = ctype == _JSON
        refused = self._unauthenticated("http", request.headers.get("Authorization"), request.remote or "?")
        if refused is not None:
            reply = _status(401, code_pb2.UNAUTHENTICATED, refused, as_json, close=True)
            reply.headers["WWW-Authenticate"] = f'{authn.SCHEME} realm="otel-dra"'
            return reply
        if ctype not in (_PROTOBUF, _JSON):
            self._count("http", "invalid")
            return _status(415, code_pb2.INVALID_ARGUMENT, f"unsupported Content-Type {ctype[:60]!r}: use {_PROTOBUF}")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", ""):
            self._count("http", "invalid")
            return _status(415, code_pb2.INVALID_ARGUMENT, f"unsupported Content-Encoding {encoding[:40]!r}", as_json)
        try:
            self._admit("http")
        except Overloaded as exc:
            reply = _status(503, code_pb2.UNAVAILABLE, str(exc), as_json, close=True)
            reply.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
            return reply
        try:
            return await self._http_export(request, as_json, encoding == "gzip")
        finally:
            self._release()

    async def _http_export(self, request: web.BaseRequest, as_json: bool, gz: bool) -> web.Response:
        assert self._http is not None
        speaker = None
        if self.mutual:
            transport = request.transport
            speaker = self._client_nodes.cert_speaker(transport.get_extra_info("peercert") if transport else None)
        try:
            body = await read_body(request, self.max_request_bytes, self.http_config.body_timeout_s)
        except BodyError as exc:
            return self._body_error("http", exc, as_json)

        def export() -> ExportMetricsServiceResponse:
            data = gunzip(body, self.max_request_bytes) if gz else body
            return self.export_json(data, speaker) if as_json else self.export_protobuf(data, "http", speaker)

        try:
            if not gz and len(body) < INLINE_BYTES and self._lock.acquire(blocking=False):
                try:  # the decoder is free and the body small: no thread hop
                    response = export()
                finally:
                    self._lock.release()
            else:  # a large or gzip body, or a gRPC request decoding: the loop must not wait on the lock
                response = await self._http.offload(export)
        except BodyError as exc:
            return self._body_error("http", exc, as_json)
        except MalformedRequest as exc:
            return _status(400, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
        except Exception:
            return _status(500, code_pb2.INTERNAL, _CONSUMER_FAILED, as_json)
        if as_json:
            return web.Response(body=MessageToJson(response, indent=None).encode(), content_type=_JSON)
        return web.Response(body=response.SerializeToString(), content_type=_PROTOBUF)

    def _body_error(self, transport: str, exc: BodyError, as_json: bool) -> web.Response:
        """A body refused: too large (RESOURCE_EXHAUSTED), too slow or unreadable (INVALID_ARGUMENT)."""
        if exc.status == 413:
            return _status(413, code_pb2.RESOURCE_EXHAUSTED, self._too_large(transport, str(exc)), as_json, close=True)
        self._count(transport, "invalid")
        log.warning("OTLP/%s: unreadable body refused: %s", transport, exc)
        return _status(exc.status, code_pb2.INVALID_ARGUMENT, str(exc), as_json, close=True)

    # -- metrics -----------------------------------------------------------------------------
    def _observe_requests(self, _: CallbackOptions) -> Iterable[Observation]:
        transports = [t for t, on in zip(TRANSPORTS, (self._grpc_addr, self._http_addr), strict=True) if on]
        counts = self.stats()["requests"]
        return [Observation(counts[(t, o)], {"transport": t, "outcome": o}) for t in transports for o in OUTCOMES]

    def _observe_points(self, _: CallbackOptions) -> Iterable[Observation]:
        counts = self.stats()["points"]
        return [Observation(counts[o], {"outcome": o}) for o in POINT_OUTCOMES]

    def _observe_clock(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"direction": d}) for d, n in self.stats()["clock_skew"].items()]

    def _observe_stray(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.stats()["attributes_ignored"]["points"])]

    def _observe_refused(self, _: CallbackOptions) -> Iterable[Observation]:
        counts = self.stats()["refused"]
        return [Observation(n, {"reason": reason}) for reason, n in counts.items()]

    def _observe_connections(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(counts["open"], {"transport": t}) for t, counts in self.stats()["connections"].items()]


def _retry_metadata(message: str, retry_after_s: float) -> tuple[tuple[str, bytes], ...]:
    """gRPC trailers that say when to retry: ``RetryInfo`` as the OpenTelemetry Python exporter reads it
    (``google.rpc.retryinfo-bin``) and inside the rich status the Go exporter reads (``grpc-status-details-bin``)."""
    delay = Duration(seconds=int(retry_after_s), nanos=int((retry_after_s % 1) * 1e9))
    info = error_details_pb2.RetryInfo(retry_delay=delay)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message, details=[detail])
    return (
        ("google.rpc.retryinfo-bin", info.SerializeToString()),
        ("grpc-status-details-bin", status.SerializeToString()),
    )


def _status(status: int, code: int, message: str, as_json: bool = False, close: bool = False) -> web.Response:
    """An error as OTLP/HTTP wants it: a ``google.rpc.Status`` in the request's encoding."""
    if as_json:
        body = json.dumps({"code": code, "message": message}).encode()
        reply = web.Response(status=status, body=body, content_type=_JSON)
    else:
        body = status_pb2.Status(code=code, message=message).SerializeToString()
        reply = web.Response(status=status, body=body, content_type=_PROTOBUF)
    if close:
        reply.force_close()
    return reply
