"""The one table from config fields to the flags that set them: a config's error names its field
(``max_queued_points must be at least 1``), and the user sees the flag they typed
(``--max-queued-points must be at least 1``)."""

from __future__ import annotations

from typing import Final

import click

from otel_dra.component import ConfigError

#: ``Config.field`` → the flag of ``otel-dra run`` / ``otel-dra fleet`` that sets it.
FLAGS: Final = {
    "AgentConfig.source": "--source",
    "AgentConfig.faults": "--fault",
    "AgentConfig.load": "--load",
    "AgentConfig.devices": "--devices",
    "AgentConfig.interval_s": "--interval",
    "AgentConfig.health_attribute": "--health-attribute",
    "AgentConfig.node_name": "--node-name",
    "FleetConfig.sample_interval_s": "--sample-interval",
    "FleetConfig.evaluate_every_s": "--evaluate-every",
    "FleetConfig.max_queued_points": "--max-queued-points",
    "ClusterWriterConfig.api_version": "--k8s-api-version",
    "ReceiverConfig.grpc_port": "--otlp-grpc-port",
    "ReceiverConfig.http_port": "--otlp-http-port",
    "ReceiverConfig.max_request_bytes": "--max-request-bytes",
    "ReceiverConfig.max_pending_requests": "--max-pending-requests",
    "ReceiverConfig.max_future_s": "--max-future",
    "HttpServerConfig.max_connections": "--max-connections",
    "HttpServerConfig.header_timeout_s": "--header-timeout",
    "HttpServerConfig.body_timeout_s": "--body-timeout",
    "HttpServerConfig.idle_timeout_s": "--idle-timeout",
    "EndpointConfig.port": "--prometheus-port",
    "OtlpPushConfig.queue_max_age_s": "--otlp-queue-max-age",
    "OtlpPushConfig.queue_max_points": "--otlp-queue-max-points",
    "KubeletConfig.health_timeout_s": "--kubelet-health-timeout",
    "K8sOutputConfig.api_version": "--k8s-api-version",
    "K8sOutputConfig.output": "--k8s-output",
    "K8sOutputConfig.attributes": "--k8s-attributes",
    "K8sOutputConfig.apply": "--k8s-apply",
    "DecodeLimits.max_devices_per_node": "--max-devices-per-node",
    "DecodeLimits.max_nodes": "--max-nodes",
    "DecodeLimits.max_devices": "--max-devices",
    "DecodeLimits.max_series": "--max-series",
    "DecodeLimits.max_attribute_length": "--max-attribute-length",
    "TlsSettings.cert_file": "--tls-cert-file",
    "TlsSettings.key_file": "--tls-key-file",
    "TlsSettings.client_ca_file": "--tls-client-ca-file",
    "LeaseConfig.name": "--leader-elect-resource-name",
    "LeaseConfig.namespace": "--leader-elect-resource-namespace",
    "LeaseConfig.lease_duration_s": "--leader-elect-lease-duration",
    "LeaseConfig.renew_deadline_s": "--leader-elect-renew-deadline",
    "LeaseConfig.retry_period_s": "--leader-elect-retry-period",
}


def usage_error(exc: ValueError) -> click.UsageError:
    """The usage error (exit 2) of a config that refused a value: its fields named by their flags."""
    return click.UsageError(exc.named(FLAGS) if isinstance(exc, ConfigError) else str(exc))
