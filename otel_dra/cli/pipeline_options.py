"""The option groups of the two long-running commands, each declared once: the push, kubelet and
DeviceTaintRule options of ``otel-dra run``, the receiver, TLS/auth and cluster-writer options of
``otel-dra fleet``, and what both share (the HTTP servers' bounds, the state directory, logging).
:mod:`otel_dra.cli.pipeline_configs` makes the configs of their values."""

from __future__ import annotations

import click

from otel_dra.cli.options import Seconds, k8s_driver_option, log_options, options
from otel_dra.cli.state_dir import state_dir_option
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.sinks.config import OTLP_PROTOCOLS, K8sOutputConfig, KubeletConfig, OtlpPushConfig
from otel_dra.sinks.k8s.lease import LeaseConfig
from otel_dra.sinks.k8s.versions import API_VERSIONS, AUTO_API_VERSION

#: What every long-running command ends with: the state directory and logging.
service_options = options(state_dir_option, log_options)

#: ``otel-dra run``'s OTLP push (:class:`~otel_dra.sinks.config.OtlpPushConfig`).
otlp_push_options = options(
    click.option(
        "--otlp-endpoint",
        default=None,
        help="Push metrics over OTLP to this collector, e.g. http://localhost:4317. Default: "
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT; push is off when none is set. "
        "No scheme means plaintext; use https:// for TLS.",
    ),
    click.option(
        "--otlp-protocol",
        type=click.Choice(OTLP_PROTOCOLS),
        default=None,
        help="OTLP transport. Default: OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL, else grpc.",
    ),
    click.option(
        "--otlp-interval",
        type=Seconds(),
        default=None,
        help="Seconds between OTLP pushes. Default: OTEL_METRIC_EXPORT_INTERVAL (ms) if set, else --interval.",
    ),
    click.option(
        "--otlp-queue-max-age",
        type=Seconds(zero_ok=True),
        default=OtlpPushConfig.queue_max_age_s,
        show_default=True,
        envvar="OTEL_DRA_OTLP_QUEUE_MAX_AGE",
        help="Seconds a push the collector could not take is kept and retried, oldest first, so an outage "
        "leaves no gap once it ends (the Collector's retry_on_failure.max_elapsed_time); 0: no queue, one try. "
        "[env: OTEL_DRA_OTLP_QUEUE_MAX_AGE]",
    ),
    click.option(
        "--otlp-queue-max-points",
        type=click.IntRange(min=1),
        default=OtlpPushConfig.queue_max_points,
        show_default=True,
        envvar="OTEL_DRA_OTLP_QUEUE_MAX_POINTS",
        help="Data points the push queue holds at most (about 210 bytes each); past it the oldest are dropped "
        "and counted in otel_dra.push.points{outcome=dropped}. [env: OTEL_DRA_OTLP_QUEUE_MAX_POINTS]",
    ),
)


#: ``otel-dra run``'s kubelet health stream (:class:`~otel_dra.sinks.config.KubeletConfig`).
kubelet_options = options(
    click.option(
        "--kubelet-socket",
        default=None,
        help="Serve the kubelet's DRAResourceHealth stream (v1alpha1 and v1) on this unix socket, for the "
        "node's DRA driver to relay to the kubelet, e.g. /var/lib/kubelet/plugins/otel-dra/health.sock (never a "
        "driver's dra.sock). Default: off, or /var/lib/kubelet/plugins/<driver>/dra.sock for --register-with-kubelet.",
    ),
    click.option(
        "--kubelet-health-timeout",
        type=Seconds(),
        default=KubeletConfig.health_timeout_s,
        show_default=True,
        help="health_check_timeout_seconds sent to the kubelet (used from kubelet 1.35; 1.34 always uses 30 s); "
        "the full list is resent every third of it, and at least every 10 s.",
    ),
    click.option(
        "--register-with-kubelet",
        "register_driver",
        default=None,
        metavar="DRIVER_NAME",
        help="Announce the health socket to the kubelet's plugin watcher as this DRA driver. Only for a DRA "
        "driver built on otel-dra that also serves v1.DRAPlugin: kubelets 1.34+ refuse a plugin listing no "
        'DRAPlugin service ("none of services supported by the plugin [...] are supported by the kubelet"), '
        "so otel-dra alone is refused; relay its stream through the DRA driver instead. Default: off.",
    ),
    click.option(
        "--plugin-registry",
        default=KubeletConfig.plugin_registry,
        show_default=True,
        help="The kubelet's plugin registration directory (used with --register-with-kubelet).",
    ),
)


#: ``otel-dra run``'s DeviceTaintRule files (:class:`~otel_dra.sinks.config.K8sOutputConfig`).
k8s_output_options = options(
    click.option(
        "--k8s-output",
        default=None,
        metavar="DIR",
        help="Write DRA DeviceTaintRules for the current verdicts here (opt-in; taint effects come from the "
        "policy's kubernetes section, None by default).",
    ),
    click.option(
        "--k8s-attributes",
        is_flag=True,
        help="EXPERIMENTAL: also write ResourceSlice health attributes (resourceslice-attributes.yaml) to "
        "--k8s-output, for a DRA driver to publish. KEP-5283, which would define device health in "
        "ResourceSlices, is provisional: the names may change.",
    ),
    click.option(
        "--k8s-api-version",
        type=click.Choice(list(API_VERSIONS)),
        default=K8sOutputConfig.api_version,
        show_default=True,
        help="resource.k8s.io version of the DeviceTaintRules: v1 (Kubernetes 1.37+), v1beta2 (1.36, behind the "
        "DRADeviceTaintRules gate), v1alpha3 (1.33-1.35).",
    ),
    k8s_driver_option,
    click.option(
        "--k8s-apply",
        is_flag=True,
        help="Also create, update and delete this node's DeviceTaintRules in the cluster (needs --k8s-output and "
        "deploy/kubernetes/taints/rbac.yaml). For a single node; in a cluster, `otel-dra fleet --k8s-apply` is the "
        "one writer, from every node's view.",
    ),
)


#: ``otel-dra fleet``'s OTLP ports (:class:`~otel_dra.receivers.config.ReceiverConfig`).
receiver_port_options = options(
    click.option(
        "--otlp-grpc-port",
        type=click.IntRange(0, 65535),
        default=ReceiverConfig.grpc_port,
        show_default=True,
        help="OTLP/gRPC metrics receiver port (0: off).",
    ),
    click.option(
        "--otlp-http-port",
        type=click.IntRange(0, 65535),
        default=ReceiverConfig.http_port,
        show_default=True,
        help="OTLP/HTTP metrics receiver port, POST /v1/metrics (0: off).",
    ),
)


#: ``otel-dra fleet``'s bounds on requests (:class:`~otel_dra.receivers.config.ReceiverConfig`).
receiver_bound_options = options(
    click.option(
        "--max-request-bytes",
        type=click.IntRange(min=1024),
        default=ReceiverConfig.max_request_bytes,
        show_default=True,
        help="Largest OTLP request accepted (bigger ones get RESOURCE_EXHAUSTED / 413).",
    ),
    click.option(
        "--max-future",
        type=Seconds(zero_ok=True),
        default=ReceiverConfig.max_future_s,
        show_default=True,
        help="Reject data points more than this many seconds ahead of the fleet's clock (counted, reported as "
        "partial success, the node's clock named in a warning). Time order is kept per series: a point stamped "
        "ahead holds back only its own series, until its own time; one more than a minute behind its series is "
        "taken as a clock that jumped back. Default: two sampling intervals. 0: no bound.",
    ),
    click.option(
        "--max-pending-requests",
        type=click.IntRange(min=1),
        default=ReceiverConfig.max_pending_requests,
        show_default=True,
        help="Requests at most being read or waiting to be decoded; past it clients are told to retry later "
        "(UNAVAILABLE / 503 with Retry-After), as the Collector's memory limiter does.",
    ),
)


#: ``otel-dra fleet``'s TLS and client authentication (:mod:`~otel_dra.receivers.tls`, :mod:`~otel_dra.receivers.auth`).
tls_auth_options = options(
    click.option(
        "--tls-cert-file",
        default=None,
        envvar="OTEL_DRA_TLS_CERT_FILE",
        help="Serve both OTLP receivers over TLS with this PEM certificate (chain); needs --tls-key-file. "
        "Agents then push to https://HOST:PORT with OTEL_EXPORTER_OTLP_CERTIFICATE set to its CA. "
        "[env: OTEL_DRA_TLS_CERT_FILE]",
    ),
    click.option(
        "--tls-key-file",
        default=None,
        envvar="OTEL_DRA_TLS_KEY_FILE",
        help="The PEM private key of --tls-cert-file. [env: OTEL_DRA_TLS_KEY_FILE]",
    ),
    click.option(
        "--tls-client-ca-file",
        default=None,
        envvar="OTEL_DRA_TLS_CLIENT_CA_FILE",
        help="Mutual TLS: refuse OTLP clients without a certificate from this PEM CA (agents set "
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY). A certificate may then report only "
        "for the node it names: a DNS name in its subject alternative names equal to k8s.node.name (or see "
        "--tls-client-node-uri, --tls-client-nodes-file). [env: OTEL_DRA_TLS_CLIENT_CA_FILE]",
    ),
    click.option(
        "--tls-client-node-uri",
        default=None,
        metavar="URI",
        envvar="OTEL_DRA_TLS_CLIENT_NODE_URI",
        help="With mutual TLS, a certificate also speaks for the node a URI in its subject alternative names names "
        "in this form, {node} where the node's name is, e.g. spiffe://example.org/node/{node}. "
        "[env: OTEL_DRA_TLS_CLIENT_NODE_URI]",
    ),
    click.option(
        "--tls-client-nodes-file",
        default=None,
        metavar="FILE",
        envvar="OTEL_DRA_TLS_CLIENT_NODES_FILE",
        help="With mutual TLS, YAML mapping a certificate identity (a DNS or URI name of its subject alternative "
        'names; "*": every certificate from the CA) to the nodes it may report for as well (a list; "*": every '
        "node), so a Collector's certificate forwards for many. Read again when it changes. "
        "[env: OTEL_DRA_TLS_CLIENT_NODES_FILE]",
    ),
    click.option(
        "--auth-token-file",
        default=None,
        metavar="FILE",
        envvar="OTEL_DRA_AUTH_TOKEN_FILE",
        help="Refuse OTLP requests without this bearer token (the file's one line; two during a rotation), as the "
        "Collector's bearertokenauth: 401 / UNAUTHENTICATED. Agents send it with "
        "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<token>. Read again when it changes. "
        "[env: OTEL_DRA_AUTH_TOKEN_FILE]",
    ),
)


#: ``otel-dra fleet --k8s-apply``: the cluster's DeviceTaintRule writer (:class:`~otel_dra.config.ClusterWriterConfig`).
cluster_writer_options = options(
    click.option(
        "--k8s-apply",
        is_flag=True,
        envvar="OTEL_DRA_K8S_APPLY",
        help="Reconcile the cluster's DeviceTaintRules from the whole fleet's verdicts (one rule per device and "
        "reason; a device several nodes report gets one, per the policy's shared_devices.combine). Needs a "
        "kubeconfig or a pod's service account, with the RBAC in deploy/kubernetes/fleet. [env: OTEL_DRA_K8S_APPLY]",
    ),
    click.option(
        "--k8s-api-version",
        type=click.Choice([AUTO_API_VERSION, *API_VERSIONS]),
        default=AUTO_API_VERSION,
        show_default=True,
        help="resource.k8s.io version of the DeviceTaintRules; auto: the newest the API server serves (v1 on "
        "Kubernetes 1.37+, v1beta2 on 1.36 behind the DRADeviceTaintRules gate, v1alpha3 on 1.33-1.35).",
    ),
    k8s_driver_option,
    click.option(
        "--k8s-output",
        default=None,
        metavar="DIR",
        help="With --k8s-apply, also write the rendered DeviceTaintRules here (devicetaintrules.yaml).",
    ),
    click.option(
        "--k8s-events/--no-k8s-events",
        default=True,
        show_default=True,
        help="With --k8s-apply, record a Kubernetes Event (events.k8s.io/v1) for every DeviceTaintRule created, "
        "changed or deleted (the device, the reason, the evidence and the remediation: `kubectl get events -n "
        "default`) and for the brake on mass quarantine; rate-limited as client-go's recorder is. Needs create "
        "and patch on events (deploy/kubernetes/fleet).",
    ),
    click.option(
        "--leader-elect/--no-leader-elect",
        default=True,
        show_default=True,
        help="With --k8s-apply, elect one writer among the fleet's replicas through a coordination.k8s.io/v1 "
        "Lease; only the holder writes. Off: this process writes (run one replica only).",
    ),
    click.option(
        "--leader-elect-lease-duration",
        type=Seconds(),
        default=LeaseConfig.lease_duration_s,
        show_default=True,
        help="How long a standby waits, after the leader's last renewal, before taking the Lease over: a dead "
        "leader is replaced within this.",
    ),
    click.option(
        "--leader-elect-renew-deadline",
        type=Seconds(),
        default=LeaseConfig.renew_deadline_s,
        show_default=True,
        help="The leader stops writing once this long has passed without a renewal; less than the lease "
        "duration minus 1.2 x the retry period.",
    ),
    click.option(
        "--leader-elect-retry-period",
        type=Seconds(),
        default=LeaseConfig.retry_period_s,
        show_default=True,
        help="How often the leader renews, and a standby tries to acquire (jittered up to 1.2x).",
    ),
    click.option("--leader-elect-resource-name", default=LeaseConfig.name, show_default=True, help="The Lease's name."),
    click.option(
        "--leader-elect-resource-namespace",
        default="",
        help="The Lease's namespace. Default: $POD_NAMESPACE, else the pod's service-account namespace, else "
        "otel-dra. The candidate's identity is $POD_NAME, else <hostname>_<uuid>.",
    ),
)
