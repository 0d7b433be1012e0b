"""The OTLP receiver's factory, as the Collector's ``otlpreceiver/factory.go``: its default config and
its constructors. The fleet makes its receiver of a checked :class:`ReceiverConfig`
(:func:`create_receiver`); tests and benches name endpoints instead (:func:`new_receiver`), whose
options are made into the same config and checked there."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from opentelemetry.metrics import Meter

from otel_dra.decode.limits import DecodeLimits
from otel_dra.frame import Frame, Schema
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.receivers.otlp import OtlpReceiver
from otel_dra.serve.config import HttpServerConfig

if TYPE_CHECKING:
    from otel_dra.receivers.auth import ReceiverAuth
    from otel_dra.receivers.tls import TlsSettings

DEFAULT_GRPC_ENDPOINT: Final = ReceiverConfig().grpc_endpoint
DEFAULT_HTTP_ENDPOINT: Final = ReceiverConfig().http_endpoint


def create_default_config() -> ReceiverConfig:
    """The receiver's defaults: OTLP's ports on the loopback (``ReceiverConfig``'s fields say each)."""
    return ReceiverConfig()


def create_receiver(
    config: ReceiverConfig,
    schema: Schema,
    on_frames: Callable[[list[Frame]], None],
    meter: Meter | None = None,
    backlog: Callable[[], float | None] | None = None,
) -> OtlpReceiver:
    """The receiver ``config`` describes, handing frames to ``on_frames`` (see :class:`OtlpReceiver`)."""
    return OtlpReceiver(config, schema, on_frames, meter, backlog)


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as (host, port); ValueError with a one-line reason."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def new_receiver(
    schema: Schema,
    on_frames: Callable[[list[Frame]], None],
    grpc_endpoint: str | None = DEFAULT_GRPC_ENDPOINT,
    http_endpoint: str | None = DEFAULT_HTTP_ENDPOINT,
    max_request_bytes: int = ReceiverConfig.max_request_bytes,
    meter: Meter | None = None,
    *,
    tls: TlsSettings | None = None,
    max_future_s: float | None = ReceiverConfig.max_future_s,
    limits: DecodeLimits | None = None,
    http: HttpServerConfig | None = None,
    backlog: Callable[[], float | None] | None = None,
    max_pending: int = ReceiverConfig.max_pending_requests,
    auth: ReceiverAuth | None = None,
) -> OtlpReceiver:
    """A receiver on ``host:port`` endpoints (port 0: any free one; None: that transport off; both on one
    host), the rest as :class:`ReceiverConfig` names it (``max_future_s`` None: no bound)."""
    grpc = parse_endpoint(grpc_endpoint) if grpc_endpoint is not None else None
    web = parse_endpoint(http_endpoint) if http_endpoint is not None else None
    hosts = {addr[0] for addr in (grpc, web) if addr is not None}
    if len(hosts) > 1:
        raise ValueError(f"the receiver listens on one host, not on each of {sorted(hosts)}")
    config = ReceiverConfig(
        host=hosts.pop() if hosts else ReceiverConfig.host,
        grpc_port=grpc[1] if grpc is not None else None,
        http_port=web[1] if web is not None else None,
        max_request_bytes=max_request_bytes,
        max_future_s=max_future_s or 0.0,
        tls=tls,
        auth=auth,
        max_pending_requests=max_pending,
        limits=limits or DecodeLimits(),
        http=http or HttpServerConfig(),
    )
    return create_receiver(config, schema, on_frames, meter, backlog)
