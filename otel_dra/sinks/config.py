"""Each sink's typed config: its defaults, stated once, and its checks.

Light on purpose (no SDK, grpc or kubernetes imports): the CLI reads its option defaults from
these classes, and ``otel-dra --help`` must not pay for the sinks themselves. Errors are
:class:`~otel_dra.component.ConfigError`: one line naming the field and how to fix it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from otel_dra.component import ConfigError
from otel_dra.logs import redact
from otel_dra.serve.config import HttpServerConfig
from otel_dra.sinks.k8s.versions import API_VERSIONS, AUTO_API_VERSION, DEFAULT_API_VERSION

#: The OTLP exporters the SDK ships (``OTEL_EXPORTER_OTLP_PROTOCOL``'s values this project supports).
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
#: The kubelet's plugin watcher directory, and where it expects a DRA driver's plugin socket.
KUBELET_PLUGIN_REGISTRY = "/var/lib/kubelet/plugins_registry"
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
#: The kubelet's health timeout when it uses none of ours: always on 1.34 (``healthTimeout`` in
#: pkg/kubelet/cm/dra/healthinfo.go), and from 1.35 for a device whose health_check_timeout_seconds is 0
#: or unset (``DefaultHealthTimeout``).
KUBELET_DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class EndpointConfig:
    """Where ``/metrics`` and the routes are served. The loopback
    address unless told otherwise, as ``OTEL_EXPORTER_PROMETHEUS_HOST`` defaults to localhost in the
    OpenTelemetry specification (127.0.0.1, as the fleet's receivers: ``otel_dra.receivers.config``);
    a pod that Prometheus scrapes passes ``--host=0.0.0.0`` (the deploy manifests do)."""

    host: str = "127.0.0.1"
    port: int = 9464  # the OpenTelemetry Prometheus exporter's default; 0: off
    http: HttpServerConfig = field(default_factory=HttpServerConfig)  # connections and timeouts

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"{{EndpointConfig.port}} must be 0 (off) or a TCP port, got {self.port}")

    @property
    def enabled(self) -> bool:
        return self.port != 0


def resolve_otlp_endpoint(flag: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The OTLP push target; None (push off) without a flag or ``OTEL_EXPORTER_OTLP_*ENDPOINT``."""
    return flag or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None


def resolve_otlp_protocol(flag: str | None, env: Mapping[str, str] = os.environ) -> str:
    """``--otlp-protocol``, else ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL``;
    grpc by default, as the SDK's."""
    return (
        flag
        or env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or OtlpPushConfig.protocol
    )


@dataclass(frozen=True)
class OtlpPushConfig:
    """The agent's OTLP push (off without an endpoint) and its sending queue."""

    endpoint: str | None = None
    protocol: str = "grpc"
    export_interval_s: float | None = None  # None: OTEL_METRIC_EXPORT_INTERVAL, else the sampling interval
    #: How long a collection waits in the queue for the collector before it is dropped (one classifier
    #: window; 0: no queue, the SDK's one try).
    queue_max_age_s: float = 300.0
    #: Data points queued at most (about 21 MB at ~210 bytes each): the bound when many devices push.
    queue_max_points: int = 100_000

    def __post_init__(self) -> None:
        if self.protocol not in OTLP_PROTOCOLS:
            raise ConfigError(
                f"OTLP protocol {self.protocol!r} is not supported; use one of: {', '.join(OTLP_PROTOCOLS)}"
            )
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint if "//" in self.endpoint else f"//{self.endpoint}")
            shown = redact(self.endpoint)
            if not parts.hostname:
                raise ConfigError(f"OTLP endpoint {shown!r} has no host; give e.g. http://localhost:4317")
            if (parts.username or parts.password) and self.protocol == "grpc":
                # gRPC has no userinfo: the exporter would hand "user:password@host" to the resolver (and
                # its error to the log). Credentials go in headers there.
                raise ConfigError(
                    f"OTLP endpoint {shown!r} carries a user or password, which gRPC cannot use: put the "
                    "credentials in OTEL_EXPORTER_OTLP_HEADERS (e.g. authorization=Bearer%20TOKEN)"
                )
        if not self.queue_max_age_s >= 0:
            raise ConfigError(
                f"{{OtlpPushConfig.queue_max_age_s}} must be 0 (no queue) or a number of seconds, "
                f"got {self.queue_max_age_s}"
            )
        if self.queue_max_points < 1:
            raise ConfigError(f"{{OtlpPushConfig.queue_max_points}} must be at least 1, got {self.queue_max_points}")


def default_endpoint(driver_name: str) -> str:
    """Where the kubelet expects a DRA driver's plugin socket: ``/var/lib/kubelet/plugins/<driver>/dra.sock``."""
    return os.path.join(KUBELET_PLUGINS_DIR, driver_name, "dra.sock")


@dataclass(frozen=True)
class KubeletConfig:
    """The ``DRAResourceHealth`` stream's socket (off without one) and its registration."""

    socket: str | None = None
    health_timeout_s: float = KUBELET_DEFAULT_TIMEOUT_S
    register_with: str | None = None  # the DRA driver name to register the socket under
    plugin_registry: str = KUBELET_PLUGIN_REGISTRY

    def __post_init__(self) -> None:
        if not self.health_timeout_s > 0:
            raise ConfigError(
                f"{{KubeletConfig.health_timeout_s}} must be a positive number of seconds, got {self.health_timeout_s}"
            )

    @property
    def endpoint(self) -> str | None:
        """The health socket: ``--kubelet-socket``, else the registered driver's default path, else none."""
        if self.socket:
            return self.socket
        if self.register_with:
            return default_endpoint(self.register_with)
        return None


@dataclass(frozen=True)
class K8sOutputConfig:
    """A DeviceTaintRule writer's files (none without a directory) and whether it applies them: the agent's
    (which applies only what it writes: :class:`~otel_dra.config.AgentConfig` checks so), and the
    fleet's cluster writer's (:meth:`~otel_dra.config.ClusterWriterConfig.sink`)."""

    output: str | None = None  # write DeviceTaintRules (and, opted in, slice attributes) here
    api_version: str = DEFAULT_API_VERSION
    driver: str | None = None
    apply: bool = False
    attributes: bool = False  # experimental: also write ResourceSlice health attributes
    resync_s: float = 60.0  # reapply this often even without a change (a rule deleted by hand returns)
    retry_s: float = 10.0  # after a failed apply

    def __post_init__(self) -> None:
        if self.api_version not in API_VERSIONS and self.api_version != AUTO_API_VERSION:
            raise ConfigError(
                f"{{K8sOutputConfig.api_version}} {self.api_version!r} is not one of: {', '.join(API_VERSIONS)}"
            )
        if self.attributes and not self.output:
            raise ConfigError(
                "{K8sOutputConfig.attributes} needs {K8sOutputConfig.output} DIR (the attributes file is written there)"
            )
