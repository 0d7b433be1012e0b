"""Sink: the HTTP endpoint of the agent and the fleet: ``/metrics`` for Prometheus, ``/healthz``
for probes, ``/v1/devices`` for people and scripts, and ``/`` a small HTML page linking to each
(as node_exporter's does), for whoever opens the port in a browser.

Served by the bounded :class:`~otel_dra.serve.http.HttpServer` (the OTLP/HTTP receiver's): scrapes
never wait on each other or on sampling, and a client holding connections or trickling headers
can't lock Prometheus out. ``/metrics`` serves the :class:`~otel_dra.sinks.exposition.ExpositionCache`
rendered after each sample; the other routes render on the server's worker thread.
:class:`PrometheusEndpoint` is the whole scrape side as one component, built the same way by
the agent and the fleet.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable, Iterable

from aiohttp import web
from opentelemetry.sdk.metrics.export import MetricReader
from prometheus_client import CollectorRegistry, ProcessCollector

from otel_dra import __version__
from otel_dra.serve.config import HttpServerConfig
from otel_dra.serve.http import HttpServer
from otel_dra.sinks import provider
from otel_dra.sinks.config import EndpointConfig
from otel_dra.sinks.exposition import ExpositionCache, Extra, Renderer

log = logging.getLogger(__name__)

#: A route handler returns (HTTP status line, content type, body).
Route = Callable[[], tuple[str, str, bytes]]

#: The landing page's line saying what is serving, when the caller names nothing better.
DEFAULT_DESCRIPTION = "Accelerator health for Kubernetes DRA, as OpenTelemetry hw.* metrics."

#: What each well-known path is, on the landing page.
_ABOUT = {
    "/metrics": "the hw.* metrics and verdicts, for Prometheus",
    "/v1/devices": "every device's verdict as JSON, with what it is about (scope, group), for people and scripts "
    "(otel-dra status)",
    "/healthz": "liveness, for probes",
}


def landing_page(description: str, paths: Iterable[str]) -> bytes:
    """The HTML page at ``/``: the program and version as its title, ``description`` (what this
    is: the agent on node X, the fleet) and a link to each path. Links are relative, so the page
    still works behind a proxy that serves the endpoint under a path prefix."""
    title = f"otel-dra {__version__}"
    items = "".join(
        f'<li><a href="{html.escape(p.lstrip("/"))}">{html.escape(p)}</a>'
        + (f" &mdash; {html.escape(_ABOUT[p])}" if p in _ABOUT else "")
        + "</li>\n"
        for p in paths
    )
    page = (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>\n'
        f"<body>\n<h1>{html.escape(title)}</h1>\n<p>{html.escape(description)}</p>\n<ul>\n{items}</ul>\n"
        "</body></html>\n"
    )
    return page.encode()


class HttpEndpoint:
    """Serves ``/metrics`` from ``exposition``, extra routes (``/healthz``, ...) and at ``/`` a
    landing page linking to them, saying ``description``, on one port (bound when built). A route
    for ``/`` in ``routes`` replaces the landing page."""

    def __init__(
        self,
        host: str,
        port: int,
        exposition: ExpositionCache,
        routes: dict[str, Route],
        config: HttpServerConfig | None = None,
        description: str = DEFAULT_DESCRIPTION,
    ) -> None:
        self._exposition = exposition
        self._routes = routes
        self._landing = landing_page(description, ["/metrics", *(p for p in routes if p not in ("/", "/metrics"))])
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
            # (a large rendering is kept compressed: decompressing it for a scraper without gzip is CPU work, and
            # so is rendering one that nobody asked for while it went stale: both on a worker thread)
            quick = gz and self._exposition.ready()
            body = self._exposition.body(gz) if quick else await self._server.offload(self._exposition.body, gz)
            if body is None:
                return self._reply("503 Service Unavailable", "text/plain", b"no sample yet\n")
            reply = self._reply("200 OK", self._exposition.content_type, body)
            if gz:
                reply.headers["Content-Encoding"] = "gzip"
            return reply
        if path == "/":
            return self._reply("200 OK", "text/html; charset=utf-8", self._landing)
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

    Binds its port when built, so a port in use fails before anything starts. ``description`` is
    the landing page's line saying what this is (the agent on node X, the fleet)."""

    def __init__(
        self,
        config: EndpointConfig,
        max_age_s: float,
        routes: dict[str, Route],
        extra: Callable[[], Extra] | None = None,
        description: str = DEFAULT_DESCRIPTION,
        extra_version: Callable[[], int] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.cache = ExpositionCache(self.registry, max_age_s, extra=extra, extra_version=extra_version)
        self._renderer = Renderer(self.cache)
        self._http = HttpEndpoint(config.host, config.port, self.cache, routes, config.http, description)

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
