"""Sink: the HTTP endpoint of the agent and the fleet: ``/metrics`` for Prometheus, ``/healthz``
for probes, ``/v1/devices`` for people and scripts.

Served by the bounded :class:`~otel_dra.serve.http.HttpServer` (the OTLP/HTTP receiver's): scrapes
never wait on each other or on sampling, and a client holding connections or trickling headers
can't lock Prometheus out. ``/metrics`` serves the :class:`~otel_dra.sinks.exposition.ExpositionCache`
rendered after each sample; the other routes render on the server's worker thread.
:class:`PrometheusEndpoint` is the whole scrape side as one component, built the same way by
the agent and the fleet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from opentelemetry.sdk.metrics.export import MetricReader
from prometheus_client import CollectorRegistry, ProcessCollector

from otel_dra.serve.config import HttpServerConfig
from otel_dra.serve.http import HttpServer
from otel_dra.sinks import provider
from otel_dra.sinks.config import EndpointConfig
from otel_dra.sinks.exposition import ExpositionCache, Renderer

log = logging.getLogger(__name__)

#: A route handler returns (HTTP status line, content type, body).
Route = Callable[[], tuple[str, str, bytes]]


class HttpEndpoint:
    """Serves ``/metrics`` from ``exposition`` and extra routes (``/healthz``, ...) on one port
    (bound when built)."""

    def __init__(
        self,
        host: str,
        port: int,
        exposition: ExpositionCache,
        routes: dict[str, Route],
        config: HttpServerConfig | None = None,
    ) -> None:
        self._exposition = exposition
        self._routes = routes
        self._server = HttpServer("HTTP endpoint", host, port, self._handle, config)

    @property
    def port(self) -> int:
        return self._server.port

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        path = request.path
        route = self._routes.get(path)
        if route is not None:
            return self._reply(*await self._server.offload(route))
        if path == "/metrics":
            gz = "gzip" in request.headers.get("Accept-Encoding", "")
            body = self._exposition.body(gz)
            if body is None:
                return self._reply("503 Service Unavailable", "text/plain", b"no sample yet\n")
            reply = self._reply("200 OK", self._exposition.content_type, body)
            if gz:
                reply.headers["Content-Encoding"] = "gzip"
            return reply
        body = b"not found: try /metrics or " + b", ".join(r.encode() for r in self._routes) + b"\n"
        return self._reply("404 Not Found", "text/plain", body)

    @staticmethod
    def _reply(status: str, content_type: str, body: bytes) -> web.Response:
        code, _, reason = status.partition(" ")
        return web.Response(status=int(code), reason=reason or None, body=body, headers={"Content-Type": content_type})

    def start(self) -> None:
        self._server.start()
        log.info(
            "serving /metrics and %s on %s:%d (%d connections at most)",
            ", ".join(self._routes),
            self._server.host,
            self.port,
            self._server.max_connections,
        )

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown(timeout_s)


class PrometheusEndpoint:
    """The scrape side as one component: a registry with the process's own CPU and memory beside
    what it reports, the SDK's Prometheus reader over it (:meth:`reader`, for the meter
    provider), the rendered-exposition cache with its renderer thread, and the HTTP server.

    Binds its port when built, so a port in use fails before anything starts."""

    def __init__(
        self,
        config: EndpointConfig,
        max_age_s: float,
        routes: dict[str, Route],
        extra: Callable[[], bytes] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.cache = ExpositionCache(self.registry, max_age_s, extra=extra)
        self._renderer = Renderer(self.cache)
        self._http = HttpEndpoint(config.host, config.port, self.cache, routes, config.http)

    @property
    def port(self) -> int:
        return self._http.port

    def reader(self) -> MetricReader:
        """The pull reader the meter provider exports through."""
        return provider.prometheus_reader(self.registry)

    def sampled(self) -> None:
        """New data is in: render ``/metrics`` again (on the renderer's thread)."""
        self._renderer.sampled()

    def start(self) -> None:
        self._renderer.start()
        self._http.start()

    def shutdown(self, timeout_s: float = 1.0) -> None:
        self._http.shutdown(timeout_s)
        self._renderer.shutdown(timeout_s)
