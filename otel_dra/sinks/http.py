"""Sink: the HTTP endpoint of the agent and the fleet: ``/metrics`` for Prometheus, ``/healthz``
for probes, ``/v1/devices`` for people and scripts.

A small WSGI dispatcher, served by ``prometheus_client``'s threading WSGI server, so
scrapes never wait on each other or on sampling. ``/metrics`` serves the
:class:`~otel_dra.sinks.exposition.ExpositionCache` rendered after each sample.
:class:`PrometheusEndpoint` is the whole scrape side as one component, built the same way by
the agent and the fleet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from opentelemetry.sdk.metrics.export import MetricReader
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import ThreadingWSGIServer

from otel_dra.sinks import provider
from otel_dra.sinks.config import EndpointConfig
from otel_dra.sinks.exposition import ExpositionCache, Renderer

log = logging.getLogger(__name__)

#: A route handler returns (HTTP status line, content type, body).
Route = Callable[[], tuple[str, str, bytes]]


class _QuietHandler(WSGIRequestHandler):
    """Access logs off: a scrape every few seconds is not an event worth a line."""

    def log_message(self, format: str, *args: Any) -> None:
        return


class HttpEndpoint:
    """Serves ``/metrics`` from ``exposition`` and extra routes (``/healthz``, ...) on one port."""

    def __init__(self, host: str, port: int, exposition: ExpositionCache, routes: dict[str, Route]) -> None:
        self._exposition = exposition
        self._routes = routes
        self._server = make_server(host, port, self._app, ThreadingWSGIServer, handler_class=_QuietHandler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        route = self._routes.get(path)
        if route is not None:
            return self._reply(start_response, *route())
        if path == "/metrics":
            gz = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
            body = self._exposition.body(gz)
            if body is None:
                return self._reply(start_response, "503 Service Unavailable", "text/plain", b"no sample yet\n")
            headers = [("Content-Encoding", "gzip")] if gz else []
            return self._reply(start_response, "200 OK", self._exposition.content_type, body, headers)
        body = b"not found: try /metrics or " + b", ".join(r.encode() for r in self._routes) + b"\n"
        return self._reply(start_response, "404 Not Found", "text/plain", body)

    @staticmethod
    def _reply(
        start_response: Callable[..., Any],
        status: str,
        content_type: str,
        body: bytes,
        headers: list[tuple[str, str]] | None = None,
    ) -> list[bytes]:
        start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))), *(headers or [])])
        return [body]

    def start(self) -> None:
        self._thread.start()
        log.info("serving /metrics and %s on %s:%d", ", ".join(self._routes), *self._server.server_address[:2])

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop serving (the serve loop notices within its 0.5 s poll) and close the socket."""
        self._server.shutdown()
        self._server.server_close()


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
        self._http = HttpEndpoint(config.host, config.port, self.cache, routes)

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
