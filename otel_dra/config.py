"""The agent's configuration: one typed object, validated on construction, with
defaults and the standard ``OTEL_*`` / ``NODE_NAME`` environment resolved in one place."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from otel_dra.faults import Fault
from otel_dra.sources import SOURCES

OTLP_PROTOCOLS = ("grpc", "http/protobuf")
HEALTH_ATTRIBUTE_MODES = ("metric", "all")
DEFAULT_PROMETHEUS_PORT = 9464  # the OpenTelemetry Prometheus exporter's default


class ConfigError(ValueError):
    """A configuration value a user must fix; the message names it and says how."""


def _parse_resource_attributes(text: str) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` as the SDK reads it: ``k=v,k2=v2``."""
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {k.strip(): v.strip() for k, v in pairs}


def resolve_node_name(flag: str | None, env: Mapping[str, str] = os.environ) -> str:
    """``--node-name``, else ``k8s.node.name`` in ``OTEL_RESOURCE_ATTRIBUTES``, else ``NODE_NAME``,
    else the host name."""
    if flag:
        return flag
    from_resource = _parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", "")).get("k8s.node.name")
    return from_resource or env.get("NODE_NAME") or socket.gethostname()


def resolve_otlp_endpoint(flag: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The OTLP push target; None (push off) without a flag or ``OTEL_EXPORTER_OTLP_*ENDPOINT``."""
    return flag or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None


def resolve_otlp_protocol(flag: str | None, env: Mapping[str, str] = os.environ) -> str:
    """``--otlp-protocol``, else ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL``;
    grpc by default."""
    protocol = (
        flag or env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    )
    if protocol not in OTLP_PROTOCOLS:
        raise ConfigError(f"OTLP protocol {protocol!r} is not supported; use one of: {', '.join(OTLP_PROTOCOLS)}")
    return protocol


@dataclass(frozen=True)
class AgentConfig:
    """Everything ``otel-dra run`` needs; invalid values raise :class:`ConfigError`."""

    node_name: str
    source: str = "auto"
    devices: int = 8
    faults: tuple[Fault, ...] = ()
    interval_s: float = 5.0
    prometheus_host: str = "0.0.0.0"
    prometheus_port: int = DEFAULT_PROMETHEUS_PORT
    otlp_endpoint: str | None = None
    otlp_protocol: str = "grpc"
    otlp_export_interval_s: float | None = None  # None: OTEL_METRIC_EXPORT_INTERVAL, else the sampling interval
    otlp_queue_max_age_s: float = 300.0  # pushes the collector could not take are retried this long (0: not at all)
    otlp_queue_max_points: int = 100_000  # ... and this many data points at most
    seed: int | None = None
    sysfs_root: str = "/sys"
    policy_path: str | None = None
    health_attribute: str = "metric"  # metric: dra.device.health only; all: also on every hw.* series
    kubelet_socket: str | None = None  # serve DRAResourceHealth here
    kubelet_health_timeout_s: float = 30.0
    register_with_kubelet: str | None = None  # DRA driver name to register the health socket under
    plugin_registry: str = "/var/lib/kubelet/plugins_registry"
    k8s_output: str | None = None  # write DeviceTaintRules (and, opted in, slice attributes) here
    k8s_api_version: str = "v1"
    k8s_driver: str | None = None
    k8s_apply: bool = False
    k8s_attributes: bool = False  # experimental: also write ResourceSlice health attributes

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"--source {self.source!r} is not known; use one of: {', '.join(SOURCES)}")
        if self.faults and self.source not in ("simulated", "auto"):
            raise ConfigError("--fault injects into the simulated source only; use --source simulated")
        if self.devices < 1:
            raise ConfigError(f"--devices must be at least 1, got {self.devices}")
        if not (self.interval_s > 0):
            raise ConfigError(f"--interval must be a positive number of seconds, got {self.interval_s}")
        if not 0 <= self.prometheus_port <= 65535:
            raise ConfigError(f"--prometheus-port must be 0 (off) or a TCP port, got {self.prometheus_port}")
        if self.otlp_protocol not in OTLP_PROTOCOLS:
            raise ConfigError(f"--otlp-protocol must be one of {', '.join(OTLP_PROTOCOLS)}")
        if self.otlp_endpoint is not None:
            parts = urlsplit(self.otlp_endpoint if "//" in self.otlp_endpoint else f"//{self.otlp_endpoint}")
            if not parts.hostname:
                raise ConfigError(f"OTLP endpoint {self.otlp_endpoint!r} has no host; give e.g. http://localhost:4317")
        if not self.otlp_queue_max_age_s >= 0:
            raise ConfigError(
                f"--otlp-queue-max-age must be 0 (no queue) or a number of seconds, got {self.otlp_queue_max_age_s}"
            )
        if self.otlp_queue_max_points < 1:
            raise ConfigError(f"--otlp-queue-max-points must be at least 1, got {self.otlp_queue_max_points}")
        if self.health_attribute not in HEALTH_ATTRIBUTE_MODES:
            raise ConfigError(f"--health-attribute must be one of {', '.join(HEALTH_ATTRIBUTE_MODES)}")
        if self.k8s_attributes and not self.k8s_output:
            raise ConfigError("--k8s-attributes needs --k8s-output DIR (the attributes file is written there)")
        if self.k8s_apply and not self.k8s_output:
            raise ConfigError("--k8s-apply needs --k8s-output DIR (the rules are written there, then applied)")
        if not self.kubelet_health_timeout_s > 0:
            raise ConfigError(
                f"--kubelet-health-timeout must be a positive number of seconds, got {self.kubelet_health_timeout_s}"
            )
        if not self.node_name:
            raise ConfigError("node name is empty; set --node-name or NODE_NAME")

    @property
    def kubelet_endpoint(self) -> str | None:
        """The health socket: ``--kubelet-socket``, else the registered driver's default path, else none."""
        if self.kubelet_socket:
            return self.kubelet_socket
        if self.register_with_kubelet:
            from otel_dra.sinks.kubelet import default_endpoint

            return default_endpoint(self.register_with_kubelet)
        return None

    @property
    def stale_after_s(self) -> float:
        """How old the newest frame may be before sinks stop exporting it (three missed passes)."""
        return 3.0 * self.interval_s
