"""The configs of ``otel-dra run`` and ``otel-dra fleet``, made of their options' values: each
option group (:mod:`otel_dra.cli.pipeline_options`) becomes its component's config, built here once
for both commands; a value a config refuses is a usage error naming the flag (:mod:`otel_dra.cli.flags`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from otel_dra.cli.flags import FLAGS, usage_error
from otel_dra.cli.options import decode_limits, http_server_config
from otel_dra.config import AgentConfig, ClusterWriterConfig, FleetConfig, resolve_node_name
from otel_dra.heap import HeapTrimConfig
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.sinks.config import (
    EndpointConfig,
    K8sOutputConfig,
    KubeletConfig,
    OtlpPushConfig,
    resolve_otlp_endpoint,
    resolve_otlp_protocol,
)

if TYPE_CHECKING:
    from otel_dra.receivers.auth import ReceiverAuth
    from otel_dra.receivers.tls import TlsSettings
    from otel_dra.serve.config import HttpServerConfig

Options = Mapping[str, Any]


@contextmanager
def as_usage_errors() -> Iterator[None]:
    """A value a config refuses (``ValueError``, :class:`~otel_dra.component.ConfigError` among them) is
    a usage error, exit 2, its fields named by their flags."""
    try:
        yield
    except ValueError as exc:
        raise usage_error(exc) from exc


def http_server(o: Options) -> HttpServerConfig:
    """Every HTTP server's bounds (:func:`~otel_dra.cli.options.http_server_options`)."""
    return http_server_config(o["max_connections"], o["header_timeout"], o["body_timeout"], o["idle_timeout"])


def endpoint(o: Options, host: str) -> EndpointConfig:
    """``/metrics`` and the routes, on ``host`` (``--host`` of either command) and ``--prometheus-port``."""
    return EndpointConfig(host=host, port=o["prometheus_port"], http=http_server(o))


def agent_config(o: Options) -> AgentConfig:
    """``otel-dra run``'s config of its options' values."""
    return AgentConfig(
        node_name=resolve_node_name(o["node_name"]),
        source=o["source"],  # auto with --fault is the simulator: sources.choose says so in the log
        sysfs_root=o["sysfs_root"],
        devices=o["devices"],
        faults=o["faults"],
        interval_s=o["interval"],
        seed=o["seed"],
        load=o["load"],
        policy_path=o["policy_file"],
        health_attribute=o["health_attribute"],
        endpoint=endpoint(o, o["prometheus_host"]),
        otlp=OtlpPushConfig(
            endpoint=resolve_otlp_endpoint(o["otlp_endpoint"]),
            protocol=resolve_otlp_protocol(o["otlp_protocol"]),
            export_interval_s=o["otlp_interval"],
            queue_max_age_s=o["otlp_queue_max_age"],
            queue_max_points=o["otlp_queue_max_points"],
        ),
        kubelet=KubeletConfig(
            socket=o["kubelet_socket"],
            health_timeout_s=o["kubelet_health_timeout"],
            register_with=o["register_driver"],
            plugin_registry=o["plugin_registry"],
        ),
        k8s=K8sOutputConfig(
            output=o["k8s_output"],
            api_version=o["k8s_api_version"],
            driver=o["k8s_driver"],
            apply=o["k8s_apply"],
            attributes=o["k8s_attributes"],
        ),
        state_dir=o["state_dir"],
    )


def receiver(o: Options, tls: TlsSettings | None, auth: ReceiverAuth | None) -> ReceiverConfig:
    """The fleet's OTLP receiver: a port of 0 on the command line turns its transport off."""
    return ReceiverConfig(
        host=o["host"],
        grpc_port=o["otlp_grpc_port"] or None,
        http_port=o["otlp_http_port"] or None,
        max_request_bytes=o["max_request_bytes"],
        max_future_s=o["max_future"],
        tls=tls,
        auth=auth,
        max_pending_requests=o["max_pending_requests"],
        limits=decode_limits(
            o["max_nodes"], o["max_devices"], o["max_devices_per_node"], o["max_series"], o["max_attribute_length"]
        ),
        http=http_server(o),
    )


def cluster_writer(o: Options) -> ClusterWriterConfig | None:
    """``--k8s-apply``'s writer and its election; None without it."""
    from otel_dra.sinks.k8s.lease import LeaseConfig

    if not o["k8s_apply"]:
        if o["k8s_output"]:
            raise click.UsageError("--k8s-output needs --k8s-apply (the fleet writes files only as its writer does)")
        return None
    lease = LeaseConfig(
        name=o["leader_elect_resource_name"],
        namespace=o["leader_elect_resource_namespace"],
        lease_duration_s=o["leader_elect_lease_duration"],
        renew_deadline_s=o["leader_elect_renew_deadline"],
        retry_period_s=o["leader_elect_retry_period"],
    )
    return ClusterWriterConfig(
        api_version=o["k8s_api_version"],
        driver=o["k8s_driver"],
        output_dir=o["k8s_output"],
        leader_elect=o["leader_elect"],
        lease=lease,
        events=o["k8s_events"],
    )


def receiver_security(o: Options) -> tuple[TlsSettings | None, ReceiverAuth | None]:
    """The receiver's TLS files and client authentication, read and checked (a file a user must fix is
    one line naming its flag, exit 1)."""
    from otel_dra.receivers.auth import AuthConfigError, ReceiverAuth
    from otel_dra.receivers.tls import TlsConfigError, TlsSettings

    try:
        tls = TlsSettings.load(o["tls_cert_file"], o["tls_key_file"], o["tls_client_ca_file"])
        mutual = tls is not None and tls.mutual
        auth = ReceiverAuth.load(
            o["auth_token_file"], o["tls_client_nodes_file"], o["tls_client_node_uri"], mutual=mutual
        )
    except TlsConfigError as exc:
        raise click.ClickException(exc.named(FLAGS)) from exc
    except AuthConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    return tls, auth


def fleet_config(o: Options) -> FleetConfig:
    """``otel-dra fleet``'s config of its options' values."""
    tls, auth = receiver_security(o)
    with as_usage_errors():
        k8s = cluster_writer(o)
        return FleetConfig(
            receiver=receiver(o, tls, auth),
            endpoint=endpoint(o, o["host"]),
            max_queued_points=o["max_queued_points"],
            sample_interval_s=o["sample_interval"],
            evaluate_every_s=o["evaluate_every"],
            k8s=k8s,
            state_dir=o["state_dir"],
            heap=HeapTrimConfig(enabled=o["heap_trim"]),
            render_fork=o["render_fork"],
        )
