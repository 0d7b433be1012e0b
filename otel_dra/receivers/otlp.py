"""The fleet's OTLP metrics receiver, the component: ``MetricsService/Export`` over gRPC and ``POST
/v1/metrics`` over HTTP, decoded into Frames and handed to a callback; it takes its
:class:`~otel_dra.receivers.config.ReceiverConfig` whole (as the Collector's ``otlpreceiver``:
``config.py``, ``factory.py``, and the component here, ``Start``/``Shutdown``).

Agents (or a collector in front of them) push ``ExportMetricsServiceRequest`` messages; each one is
decoded (:mod:`~otel_dra.receivers.handlers`) and its frames go to ``on_frames`` on the request's
thread. Decoding and the callback run under one lock: the decoder keeps per-node time order, so two
requests of a node must reach the callback in the order they were decoded, and the classifier is
single-threaded anyway.

HTTP is served by :class:`~otel_dra.serve.http.HttpServer` (asyncio, bounded connections and
timeouts); decoding runs on its one worker thread, off the event loop. gRPC is served behind
:class:`~otel_dra.serve.grpc_front.GrpcFront`, which holds its connections as the HTTP side holds its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final

import grpc
from opentelemetry.metrics import Meter

from otel_dra.decode.core import CLOCK_JUMP_NS
from otel_dra.decode.otlp_json import OtlpJsonDecoder
from otel_dra.decode.otlp_proto import OtlpProtoDecoder
from otel_dra.frame import Frame, Schema
from otel_dra.receivers import auth as authn
from otel_dra.receivers.auth import ClientNodes
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.receivers.handlers import GRPC_METHOD, GRPC_SERVICE, HTTP_PATH, RequestPath, Servicer
from otel_dra.receivers.telemetry import TRANSPORTS, Counts, Stats, instrument
from otel_dra.receivers.tls import CertificateReloader, describe
from otel_dra.serve.config import ListenError
from otel_dra.serve.grpc_front import GrpcFront
from otel_dra.serve.grpc_pool import ReadDeadlines, ShedPool
from otel_dra.serve.http import HttpServer

log = logging.getLogger(__name__)

#: gRPC refuses, by itself and uncounted, messages over this many times ``max_request_bytes``; between
#: the two the receiver refuses them itself, counted (gRPC gives the application no word of its own refusals).
GRPC_HARD_LIMIT_FACTOR: Final = 2
#: Requests one gRPC connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; Go's
#: HTTP/2 server allows 250, an OTLP exporter uses one or a few).
GRPC_STREAMS_PER_CONNECTION: Final = 100
#: Threads decoding gRPC requests (one decodes at a time, under the lock; the others read).
GRPC_WORKERS: Final = 8


class OtlpReceiver(RequestPath):
    """Receives OTLP metrics over gRPC and/or HTTP, as ``config`` says, and hands each request's frames to
    ``on_frames``. ``meter``: where the request and point counters go. ``backlog``: asked before each
    request is decoded; a number of seconds means the consumer is behind, and the request is refused with
    that retry delay (as it is past ``config.max_pending_requests``)."""

    def __init__(
        self,
        config: ReceiverConfig,
        schema: Schema,
        on_frames: Callable[[list[Frame]], None],
        meter: Meter | None = None,
        backlog: Callable[[], float | None] | None = None,
    ) -> None:
        if config.grpc_endpoint is None and config.http_endpoint is None:
            raise ValueError("OtlpReceiver needs at least one of grpc_endpoint and http_endpoint")
        self.config = config
        self.schema = schema
        self._grpc_addr = (config.host, config.grpc_port) if config.grpc_port is not None else None
        self._http_addr = (config.host, config.http_port) if config.http_port is not None else None
        self._on_frames = on_frames
        self._backlog = backlog
        self.counts = Counts()
        self._certs: CertificateReloader | None = None  # made at start: both transports ask it per connection
        #: With mutual TLS, which nodes a client certificate may report for.
        self._client_nodes = config.auth.nodes if config.auth is not None else ClientNodes()
        future_ns = int(config.max_future_s * 1e9) if config.max_future_s > 0 else None
        # Live input: a point far behind its series is a node's clock that jumped back, taken (CLOCK_JUMP_NS).
        limits, jump = config.limits, CLOCK_JUMP_NS
        self._decoder = OtlpProtoDecoder(schema, max_future_ns=future_ns, limits=limits, clock_jump_ns=jump)
        self._json_decoder = OtlpJsonDecoder(schema, max_future_ns=future_ns, limits=limits, clock_jump_ns=jump)
        # One request decoded and handed on at a time (see the module docstring); reentrant, as the HTTP side
        # takes it before decoding on the event loop's thread (``_http_export``).
        self._lock = threading.RLock()
        self._grpc_server: grpc.Server | None = None
        self._front: GrpcFront | None = None
        self._grpc_pool: ShedPool | None = None
        self._reads: ReadDeadlines | None = None
        self._http: HttpServer | None = None
        if meter is not None:
            instrument(meter, self.stats, self._transports)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Listen on the configured endpoints; raises OSError (one line) when one can't be bound."""
        if self._grpc_server is not None or self._http is not None:
            raise RuntimeError("OtlpReceiver already started")
        if self.config.tls is not None:
            self._certs = CertificateReloader(self.config.tls)
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
            describe(self.config.tls),
            authn.describe(self.auth, self.mutual),
            self.max_request_bytes,
            ", ".join(caps),
        )

    def _start_grpc(self, host: str, port: int) -> None:
        cfg = self.config.http
        tls = self._certs.h2_context if self._certs is not None else None
        front = GrpcFront("OTLP/gRPC", host, port, cfg, tls=tls, max_streams=GRPC_STREAMS_PER_CONNECTION)
        self._front = front  # (so that a failure below lets go of its port)
        method = grpc.stream_unary_rpc_method_handler(Servicer(self).Export)  # bytes in, bytes out
        pool = ShedPool(GRPC_WORKERS, self.config.max_pending_requests)
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
        cfg, limit = self.config.http, self.max_request_bytes
        self._http = HttpServer(
            "OTLP/HTTP", host, port, self._http_request, cfg, tls=tls, max_body_bytes=limit, quick=self._http_quick
        )
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
    def grpc_port(self) -> int | None:
        """The bound gRPC port (the real one when 0 was asked for); None when not listening."""
        return self._front.port if self._grpc_server is not None and self._front is not None else None

    @property
    def http_port(self) -> int | None:
        """The bound HTTP port; None when not listening."""
        return self._http.port if self._http is not None else None

    def stats(self) -> Stats:
        """Counters so far: ``requests`` by (transport, outcome), ``points`` by outcome (accepted, rejected,
        ignored), ``refused`` points by cap reason, ``clock_skew`` points by direction (ahead, behind),
        ``attributes_ignored`` (points with attributes not read) and ``connections``: each transport's server's
        counters, by transport."""
        counts = self.counts.snapshot()
        servers = (("grpc", self._front if self._grpc_server is not None else None), ("http", self._http))
        counts["connections"] = {t: server.stats() for t, server in servers if server is not None}
        return counts

    def _transports(self) -> list[str]:
        return [t for t, on in zip(TRANSPORTS, (self._grpc_addr, self._http_addr), strict=True) if on]
