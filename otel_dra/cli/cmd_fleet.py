"""``otel-dra fleet``: every node's telemetry in over OTLP, one classifier, the fleet's verdicts out."""

from __future__ import annotations

import click

from otel_dra.cli import common
from otel_dra.cli.common import load_policy
from otel_dra.cli.options import (
    Seconds,
    decode_limits,
    http_server_config,
    http_server_options,
    k8s_driver_option,
    limit_options,
    log_options,
    policy_option,
    start_logging,
)
from otel_dra.cli.state_dir import state_dir_option
from otel_dra.config import ClusterWriterConfig, FleetConfig
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.sinks.config import EndpointConfig
from otel_dra.sinks.k8s.lease import LeaseConfig
from otel_dra.sinks.k8s.versions import API_VERSIONS, AUTO_API_VERSION


@click.command()
@click.option(
    "--host",
    default=ReceiverConfig.host,
    show_default=True,
    help="Address every port binds to (the agent's --host names the same). The loopback by default, as the "
    "Collector's receivers: give 0.0.0.0 (or the pod's IP) where agents, a Collector or Prometheus must reach it.",
)
@click.option(
    "--otlp-grpc-port",
    type=click.IntRange(0, 65535),
    default=ReceiverConfig.grpc_port,
    show_default=True,
    help="OTLP/gRPC metrics receiver port (0: off).",
)
@click.option(
    "--otlp-http-port",
    type=click.IntRange(0, 65535),
    default=ReceiverConfig.http_port,
    show_default=True,
    help="OTLP/HTTP metrics receiver port, POST /v1/metrics (0: off).",
)
@click.option(
    "--prometheus-port",
    type=click.IntRange(0, 65535),
    default=EndpointConfig.port,
    show_default=True,
    help="Port for /metrics (the fleet's verdicts), /v1/devices and /healthz (0: off).",
)
@policy_option("Health policy YAML merged over the default.")
@click.option(
    "--sample-interval",
    type=Seconds(),
    default=FleetConfig.sample_interval_s,
    show_default=True,
    help="How often the agents push (their OTEL_METRIC_EXPORT_INTERVAL): sizes each device's window.",
)
@click.option(
    "--evaluate-every",
    type=Seconds(),
    default=FleetConfig.evaluate_every_s,
    show_default=True,
    help="Seconds between evaluations of the whole fleet.",
)
@click.option(
    "--max-request-bytes",
    type=click.IntRange(min=1024),
    default=ReceiverConfig.max_request_bytes,
    show_default=True,
    help="Largest OTLP request accepted (bigger ones get RESOURCE_EXHAUSTED / 413).",
)
@click.option(
    "--max-future",
    type=Seconds(zero_ok=True),
    default=ReceiverConfig.max_future_s,
    show_default=True,
    help="Reject data points more than this many seconds ahead of the fleet's clock (counted, reported as "
    "partial success, the node's clock named in a warning). Time order is kept per series: a point stamped "
    "ahead holds back only its own series, until its own time; one more than a minute behind its series is "
    "taken as a clock that jumped back. Default: two sampling intervals. 0: no bound.",
)
@click.option(
    "--max-pending-requests",
    type=click.IntRange(min=1),
    default=ReceiverConfig.max_pending_requests,
    show_default=True,
    help="Requests at most being read or waiting to be decoded; past it clients are told to retry later "
    "(UNAVAILABLE / 503 with Retry-After), as the Collector's memory limiter does.",
)
@click.option(
    "--max-queued-points",
    type=click.IntRange(min=1),
    default=FleetConfig.max_queued_points,
    show_default=True,
    help="Values decoded but not yet evaluated at most (about 8 bytes each); past it clients are told to retry "
    "after the next evaluation.",
)
@limit_options
@http_server_options
@click.option(
    "--tls-cert-file",
    default=None,
    envvar="OTEL_DRA_TLS_CERT_FILE",
    help="Serve both OTLP receivers over TLS with this PEM certificate (chain); needs --tls-key-file. "
    "Agents then push to https://HOST:PORT with OTEL_EXPORTER_OTLP_CERTIFICATE set to its CA. "
    "[env: OTEL_DRA_TLS_CERT_FILE]",
)
@click.option(
    "--tls-key-file",
    default=None,
    envvar="OTEL_DRA_TLS_KEY_FILE",
    help="The PEM private key of --tls-cert-file. [env: OTEL_DRA_TLS_KEY_FILE]",
)
@click.option(
    "--tls-client-ca-file",
    default=None,
    envvar="OTEL_DRA_TLS_CLIENT_CA_FILE",
    help="Mutual TLS: refuse OTLP clients without a certificate from this PEM CA (agents set "
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY). A certificate may then report only "
    "for the node it names: a DNS name in its subject alternative names equal to k8s.node.name (or see "
    "--tls-client-node-uri, --tls-client-nodes-file). [env: OTEL_DRA_TLS_CLIENT_CA_FILE]",
)
@click.option(
    "--tls-client-node-uri",
    default=None,
    metavar="URI",
    envvar="OTEL_DRA_TLS_CLIENT_NODE_URI",
    help="With mutual TLS, a certificate also speaks for the node a URI in its subject alternative names names "
    "in this form, {node} where the node's name is, e.g. spiffe://example.org/node/{node}. "
    "[env: OTEL_DRA_TLS_CLIENT_NODE_URI]",
)
@click.option(
    "--tls-client-nodes-file",
    default=None,
    metavar="FILE",
    envvar="OTEL_DRA_TLS_CLIENT_NODES_FILE",
    help="With mutual TLS, YAML mapping a certificate identity (a DNS or URI name of its subject alternative "
    'names; "*": every certificate from the CA) to the nodes it may report for as well (a list; "*": every '
    "node), so a Collector's certificate forwards for many. Read again when it changes. "
    "[env: OTEL_DRA_TLS_CLIENT_NODES_FILE]",
)
@click.option(
    "--auth-token-file",
    default=None,
    metavar="FILE",
    envvar="OTEL_DRA_AUTH_TOKEN_FILE",
    help="Refuse OTLP requests without this bearer token (the file's one line; two during a rotation), as the "
    "Collector's bearertokenauth: 401 / UNAUTHENTICATED. Agents send it with "
    "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<token>. Read again when it changes. "
    "[env: OTEL_DRA_AUTH_TOKEN_FILE]",
)
@click.option(
    "--k8s-apply",
    is_flag=True,
    envvar="OTEL_DRA_K8S_APPLY",
    help="Reconcile the cluster's DeviceTaintRules from the whole fleet's verdicts (one rule per device and "
    "reason; a device several nodes report gets one, per the policy's shared_devices.combine). Needs a "
    "kubeconfig or a pod's service account, with the RBAC in deploy/kubernetes/fleet. [env: OTEL_DRA_K8S_APPLY]",
)
@click.option(
    "--k8s-api-version",
    type=click.Choice([AUTO_API_VERSION, *API_VERSIONS]),
    default=AUTO_API_VERSION,
    show_default=True,
    help="resource.k8s.io version of the DeviceTaintRules; auto: the newest the API server serves (v1 on "
    "Kubernetes 1.37+, v1beta2 on 1.36 behind the DRADeviceTaintRules gate, v1alpha3 on 1.33-1.35).",
)
@k8s_driver_option
@click.option(
    "--k8s-output",
    default=None,
    metavar="DIR",
    help="With --k8s-apply, also write the rendered DeviceTaintRules here (devicetaintrules.yaml).",
)
@click.option(
    "--k8s-events/--no-k8s-events",
    default=True,
    show_default=True,
    help="With --k8s-apply, record a Kubernetes Event (events.k8s.io/v1) for every DeviceTaintRule created, "
    "changed or deleted (the device, the reason, the evidence and the remediation: `kubectl get events -n "
    "default`) and for the brake on mass quarantine; rate-limited as client-go's recorder is. Needs create "
    "and patch on events (deploy/kubernetes/fleet).",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=True,
    show_default=True,
    help="With --k8s-apply, elect one writer among the fleet's replicas through a coordination.k8s.io/v1 "
    "Lease; only the holder writes. Off: this process writes (run one replica only).",
)
@click.option(
    "--leader-elect-lease-duration",
    type=Seconds(),
    default=LeaseConfig.lease_duration_s,
    show_default=True,
    help="How long a standby waits, after the leader's last renewal, before taking the Lease over: a dead "
    "leader is replaced within this.",
)
@click.option(
    "--leader-elect-renew-deadline",
    type=Seconds(),
    default=LeaseConfig.renew_deadline_s,
    show_default=True,
    help="The leader stops writing once this long has passed without a renewal; less than the lease "
    "duration minus 1.2 x the retry period.",
)
@click.option(
    "--leader-elect-retry-period",
    type=Seconds(),
    default=LeaseConfig.retry_period_s,
    show_default=True,
    help="How often the leader renews, and a standby tries to acquire (jittered up to 1.2x).",
)
@click.option("--leader-elect-resource-name", default=LeaseConfig.name, show_default=True, help="The Lease's name.")
@click.option(
    "--leader-elect-resource-namespace",
    default="",
    help="The Lease's namespace. Default: $POD_NAMESPACE, else the pod's service-account namespace, else "
    "otel-dra. The candidate's identity is $POD_NAME, else <hostname>_<uuid>.",
)
@state_dir_option
@log_options
def fleet(
    host: str,
    otlp_grpc_port: int,
    otlp_http_port: int,
    prometheus_port: int,
    policy_file: str | None,
    sample_interval: float,
    evaluate_every: float,
    max_request_bytes: int,
    max_future: float,
    max_pending_requests: int,
    max_queued_points: int,
    max_nodes: int,
    max_devices: int,
    max_devices_per_node: int,
    max_series: int,
    max_attribute_length: int,
    max_connections: int | None,
    header_timeout: float,
    body_timeout: float,
    idle_timeout: float,
    tls_cert_file: str | None,
    tls_key_file: str | None,
    tls_client_ca_file: str | None,
    tls_client_node_uri: str | None,
    tls_client_nodes_file: str | None,
    auth_token_file: str | None,
    k8s_apply: bool,
    k8s_api_version: str,
    k8s_driver: str | None,
    k8s_output: str | None,
    k8s_events: bool,
    leader_elect: bool,
    leader_elect_lease_duration: float,
    leader_elect_renew_deadline: float,
    leader_elect_retry_period: float,
    leader_elect_resource_name: str,
    leader_elect_resource_namespace: str,
    state_dir: str | None,
    log_level: str | None,
    log_format: str,
) -> None:
    """Classify a whole fleet: receive every node's hw.* telemetry over OTLP (from the agents,
    usually through an OpenTelemetry Collector) and serve the verdicts like an agent does.

    Point a Collector's otlp exporter (or agents' OTEL_EXPORTER_OTLP_ENDPOINT) at the gRPC or
    HTTP port; scrape /metrics for hw_status and dra_device_health of every device.

    With --k8s-apply it is also the cluster's one DeviceTaintRule writer: run two or more replicas,
    each fed every node's telemetry, and the Lease holder writes (deploy/kubernetes/fleet).
    """
    from otel_dra.fleet import Fleet
    from otel_dra.receivers.auth import AuthConfigError, ReceiverAuth
    from otel_dra.receivers.tls import TlsConfigError, TlsSettings
    from otel_dra.sinks.k8s.apply import K8sApplyError
    from otel_dra.sinks.k8s.validation import K8sValidationError

    start_logging(log_level, log_format)
    policy = load_policy(policy_file)
    try:
        tls = TlsSettings.load(tls_cert_file, tls_key_file, tls_client_ca_file)
        auth = ReceiverAuth.load(
            auth_token_file, tls_client_nodes_file, tls_client_node_uri, mutual=tls is not None and tls.mutual
        )
    except (TlsConfigError, AuthConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    k8s: ClusterWriterConfig | None = None
    if not k8s_apply and k8s_output:
        raise click.UsageError("--k8s-output needs --k8s-apply (the fleet writes files only as its writer does)")
    try:
        if k8s_apply:
            lease = LeaseConfig(
                name=leader_elect_resource_name,
                namespace=leader_elect_resource_namespace,
                lease_duration_s=leader_elect_lease_duration,
                renew_deadline_s=leader_elect_renew_deadline,
                retry_period_s=leader_elect_retry_period,
            )
            k8s = ClusterWriterConfig(
                api_version=k8s_api_version,
                driver=k8s_driver,
                output_dir=k8s_output,
                leader_elect=leader_elect,
                lease=lease,
                events=k8s_events,
            )
        http = http_server_config(max_connections, header_timeout, body_timeout, idle_timeout)
        limits = decode_limits(max_nodes, max_devices, max_devices_per_node, max_series, max_attribute_length)
        config = FleetConfig(
            receiver=ReceiverConfig(
                host=host,
                grpc_port=otlp_grpc_port,
                http_port=otlp_http_port,
                max_request_bytes=max_request_bytes,
                max_future_s=max_future,
                tls=tls,
                auth=auth,
                max_pending_requests=max_pending_requests,
                limits=limits,
                http=http,
            ),
            endpoint=EndpointConfig(host=host, port=prometheus_port, http=http),
            max_queued_points=max_queued_points,
            sample_interval_s=sample_interval,
            evaluate_every_s=evaluate_every,
            k8s=k8s,
            state_dir=state_dir,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    # gRPC's own error says only "Failed to bind" (and its C core logs a line of its own first): a
    # taken gRPC port is told before it tries. The HTTP servers say "in use" themselves.
    common.check_ports_free(host, {"--otlp-grpc-port": otlp_grpc_port})
    runner = Fleet(config, policy)

    common.stop_on_signals(runner.stop)
    try:
        runner.run()
    except (K8sApplyError, K8sValidationError) as exc:
        raise click.ClickException(f"--k8s-apply: {exc}") from exc
    except OSError as exc:
        flags = {"OTLP/gRPC": "--otlp-grpc-port", "OTLP/HTTP": "--otlp-http-port", "HTTP endpoint": "--prometheus-port"}
        raise click.ClickException(common.listen_error(exc, flags)) from exc
