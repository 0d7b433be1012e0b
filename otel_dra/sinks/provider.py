"""Sink wiring: the OpenTelemetry MeterProvider with its resource, readers and views.

Readers: the Prometheus reader (pull, served by :mod:`otel_dra.sinks.endpoint`) and,
when an endpoint is configured, a periodic OTLP exporter (push, gRPC or
HTTP/protobuf) behind a bounded sending queue (:mod:`otel_dra.sinks.sending_queue`).
A view sizes the cardinality limit to the fleet, because the SDK otherwise folds
every series past 2,000 per instrument into one overflow series without a word.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from prometheus_client import CollectorRegistry

from otel_dra import __version__
from otel_dra import conventions as cv
from otel_dra.component import Components, OnShutdown
from otel_dra.sinks.sending_queue import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    DEFAULT_MAX_AGE_S,
    DEFAULT_MAX_POINTS,
    SendingQueue,
)

log = logging.getLogger(__name__)

#: The SDK's default per-instrument limit; we never go below it.
SDK_DEFAULT_CARDINALITY_LIMIT = 2000


def build_resource(node_name: str, source: str | None = None) -> Resource:
    """``service.name`` and ``k8s.node.name``, overridable by ``OTEL_RESOURCE_ATTRIBUTES`` /
    ``OTEL_SERVICE_NAME`` (the SDK's own detector), except that ``--node-name`` wins; an agent's
    ``source`` as ``otel_dra.source``, which nothing overrides (simulated devices must say so)."""
    defaults = Resource({cv.SERVICE_NAME_ATTR: "otel-dra", "service.version": __version__})
    env = OTELResourceDetector().detect()
    ours: dict[str, str] = {cv.K8S_NODE_NAME_ATTR: node_name}
    if source is not None:
        ours[cv.OTEL_DRA_SOURCE] = source
    return Resource.create({}).merge(defaults).merge(env).merge(Resource(ours))


def cardinality_limit(devices: int, series_per_device: int) -> int:
    """Per-instrument series limit sized to the fleet: never the SDK's silent overflow."""
    return max(SDK_DEFAULT_CARDINALITY_LIMIT, devices * series_per_device)


def otlp_exporter(endpoint: str, protocol: str) -> MetricExporter:
    """The SDK's OTLP exporter for ``endpoint`` over ``protocol`` (``grpc`` or ``http/protobuf``).

    An endpoint without a scheme is plaintext (``http://``); give ``https://`` for TLS.
    The exporter reads the rest of ``OTEL_EXPORTER_OTLP_*`` itself (headers,
    certificates, client certificates, compression, timeout).
    """
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc

        return Grpc(endpoint=url)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http

    session = None if os.environ.get(_HTTP_SESSION_PROVIDER) else _certificate_first_session()
    return Http(endpoint=_http_metrics_url(url), session=session)


#: The SDK's (experimental) variable naming a requests.Session provider: when set, its session is used as is.
_HTTP_SESSION_PROVIDER = "OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER"


def _certificate_first_session() -> Any:
    """A requests session for the OTLP/HTTP exporter in which the CA it was given
    (``OTEL_EXPORTER_OTLP_CERTIFICATE``) wins over ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``.

    requests lets those variables override a session's ``verify`` (psf/requests#3829), so on a
    machine that sets them the exporter silently verified the collector against the wrong CA and
    every TLS push failed. Proxies and the rest of the environment still apply.
    """
    import requests

    class CertificateFirstSession(requests.Session):
        def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
            if verify is None and isinstance(self.verify, str):
                verify = self.verify
            return super().merge_environment_settings(url, proxies, stream, verify, cert)

    return CertificateFirstSession()


def otlp_reader(
    endpoint: str,
    protocol: str,
    interval_s: float | None,
    queue_max_age_s: float = DEFAULT_MAX_AGE_S,
    queue_max_points: int = DEFAULT_MAX_POINTS,
) -> tuple[MetricReader, SendingQueue | None]:
    """A periodic OTLP push to ``endpoint`` every ``interval_s`` (None: ``OTEL_METRIC_EXPORT_INTERVAL``),
    through a :class:`SendingQueue` keeping what the collector could not take for up to
    ``queue_max_age_s`` seconds and ``queue_max_points`` points (age 0: no queue, the SDK's one try)."""
    exporter = otlp_exporter(endpoint, protocol)
    # Retries at least twice an interval: after an outage (the fleet paused longer than the exporter's timeout)
    # a node is heard again within half an interval of the collector coming back, well inside the one interval
    # a paused fleet gives it before calling it stale, not a whole backoff cap (15 s) later.
    cap = BACKOFF_MAX_S if interval_s is None else max(BACKOFF_FIRST_S, min(BACKOFF_MAX_S, interval_s / 2))
    queue = (
        SendingQueue(exporter, queue_max_age_s, queue_max_points, backoff_s=(BACKOFF_FIRST_S, cap))
        if queue_max_age_s > 0
        else None
    )
    millis = None if interval_s is None else interval_s * 1000.0
    return PeriodicExportingMetricReader(queue if queue is not None else exporter, export_interval_millis=millis), queue


def _http_metrics_url(endpoint: str) -> str:
    """OTLP/HTTP signal URL: a base endpoint gets ``/v1/metrics``, as the spec says for
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; a URL with a path is used as given."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/v1/metrics")
    return urlunsplit(parts)


def build_meter_provider(
    node_name: str,
    readers: list[MetricReader],
    limit: int,
    source: str | None = None,
) -> MeterProvider:
    """The provider every instrument of the agent hangs off (``source``: the agent's, on its resource)."""
    view = View(instrument_name="*", aggregation_cardinality_limit=limit)
    return MeterProvider(resource=build_resource(node_name, source), metric_readers=readers, views=[view])


def prometheus_reader(registry: CollectorRegistry) -> MetricReader:
    """The pull reader; ``k8s.node.name`` is copied onto every series as ``k8s_node_name``,
    so fleet queries group by node without a join on ``target_info``."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    return PrometheusMetricReader(
        registry=registry,
        resource_attribute_filter=lambda key: key == cv.K8S_NODE_NAME_ATTR,
    )


def start_meter_provider(
    components: Components,
    node_name: str,
    readers: list[MetricReader],
    limit: int,
    scope: str,
    source: str | None = None,
) -> Meter:
    """The provider of every instrument, as a component (started with the others, shut down, so
    flushed, after every sink that reads through it), and its meter for ``scope``; an agent names
    its ``source`` (the fleet has none)."""
    meter_provider = build_meter_provider(node_name, readers, limit, source)
    components.start("meter provider", OnShutdown(lambda t: meter_provider.shutdown(timeout_millis=t * 1000)))
    return meter_provider.get_meter(scope, __version__)
