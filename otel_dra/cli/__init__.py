"""The ``otel-dra`` command line.

User mistakes (a bad flag, a bad ``--fault``, a port in use) end in one line on
stderr naming what is wrong and how to fix it, with exit code 2; never a traceback.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from otel_dra import __version__
from otel_dra.cli.options import Seconds, k8s_driver_option, log_level_option, policy_option, progress_bar
from otel_dra.config import (
    HEALTH_ATTRIBUTE_MODES,
    AgentConfig,
    ClusterWriterConfig,
    ConfigError,
    FleetConfig,
    resolve_node_name,
)
from otel_dra.faults import Fault, FaultSpecError, parse_fault
from otel_dra.logs import setup_logging
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.sinks.config import (
    OTLP_PROTOCOLS,
    EndpointConfig,
    K8sOutputConfig,
    KubeletConfig,
    OtlpPushConfig,
    resolve_otlp_endpoint,
    resolve_otlp_protocol,
)
from otel_dra.sinks.k8s.lease import LeaseConfig
from otel_dra.sinks.k8s.versions import API_VERSIONS, AUTO_API_VERSION
from otel_dra.sources import SOURCES, SourceUnavailable

if TYPE_CHECKING:
    from otel_dra.policy import Policy

USAGE_ERROR = 2
log = logging.getLogger("otel_dra.cli")


def _stop_on_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and Ctrl-C ask the running loop to stop (it flushes and exits within 5 s)."""

    def on_signal(signum: int, _: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


class FaultType(click.ParamType):
    """``DEVICE:REASON[@SECONDS]`` parsed by :func:`otel_dra.faults.parse_fault`."""

    name = "DEVICE:REASON[@SECONDS]"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Fault:
        if isinstance(value, Fault):
            return value
        try:
            return parse_fault(str(value))
        except FaultSpecError as exc:
            self.fail(str(exc), param, ctx)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="otel-dra")
def cli() -> None:
    """Accelerator health for Kubernetes DRA, as OpenTelemetry hw.* metrics.

    `otel-dra run` starts the node agent: it samples devices (a simulated fleet by
    default), serves the hw.* metrics to Prometheus on /metrics and pushes them over
    OTLP when an endpoint is set.
    """


@cli.command()
@click.option(
    "--source",
    type=click.Choice(SOURCES),
    default="auto",
    show_default=True,
    help="Where samples come from: 'nvml' (NVIDIA GPUs, needs otel-dra[nvidia]), 'sysfs' (Linux hwmon, PCIe "
    "AER, amdgpu, NICs), 'simulated' (GPUs that behave like real ones; --fault works here), or 'auto': NVML "
    "if it finds GPUs, else sysfs if it finds devices, else the simulator (logged). --fault implies simulated.",
)
@click.option(
    "--sysfs-root",
    default=AgentConfig.sysfs_root,
    show_default=True,
    help="Where sysfs is mounted (a fake tree for tests, /host/sys in a container).",
)
@click.option(
    "--devices", type=click.IntRange(min=1), default=AgentConfig.devices, show_default=True, help="Simulated devices."
)
@click.option(
    "--fault",
    "faults",
    type=FaultType(),
    multiple=True,
    help="Inject a failure on a simulated device: DEVICE:REASON[@SECONDS after start], e.g. "
    "gpu-3:memory_ecc@30. Repeatable. REASON is a telemetry-contract reason (thermal, cooling, "
    "memory_ecc, power_delivery, power_throttling, memory_pressure, link, driver_errors, firmware, "
    "device_reset, device_lost, vendor_status, stale); DEVICE '*' means every device.",
)
@click.option(
    "--interval",
    type=Seconds(),
    default=AgentConfig.interval_s,
    show_default=True,
    help="Seconds between sampling passes.",
)
@click.option(
    "--prometheus-port",
    type=click.IntRange(0, 65535),
    default=EndpointConfig.port,
    show_default=True,
    envvar="OTEL_EXPORTER_PROMETHEUS_PORT",
    help="Port for /metrics and /healthz; 0 turns the endpoint off. [env: OTEL_EXPORTER_PROMETHEUS_PORT]",
)
@click.option(
    "--prometheus-host",
    default=EndpointConfig.host,
    show_default=True,
    envvar="OTEL_EXPORTER_PROMETHEUS_HOST",
    help="Address the endpoint binds to. [env: OTEL_EXPORTER_PROMETHEUS_HOST]",
)
@click.option(
    "--otlp-endpoint",
    default=None,
    help="Push metrics over OTLP to this collector, e.g. http://localhost:4317. Default: "
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT; push is off when none is set. "
    "No scheme means plaintext; use https:// for TLS.",
)
@click.option(
    "--otlp-protocol",
    type=click.Choice(OTLP_PROTOCOLS),
    default=None,
    help="OTLP transport. Default: OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL, else grpc.",
)
@click.option(
    "--otlp-interval",
    type=Seconds(),
    default=None,
    help="Seconds between OTLP pushes. Default: OTEL_METRIC_EXPORT_INTERVAL (ms) if set, else --interval.",
)
@click.option(
    "--otlp-queue-max-age",
    type=Seconds(zero_ok=True),
    default=OtlpPushConfig.queue_max_age_s,
    show_default=True,
    envvar="OTEL_DRA_OTLP_QUEUE_MAX_AGE",
    help="Seconds a push the collector could not take is kept and retried, oldest first, so an outage "
    "leaves no gap once it ends (the Collector's retry_on_failure.max_elapsed_time); 0: no queue, one try. "
    "[env: OTEL_DRA_OTLP_QUEUE_MAX_AGE]",
)
@click.option(
    "--otlp-queue-max-points",
    type=click.IntRange(min=1),
    default=OtlpPushConfig.queue_max_points,
    show_default=True,
    envvar="OTEL_DRA_OTLP_QUEUE_MAX_POINTS",
    help="Data points the push queue holds at most (about 210 bytes each); past it the oldest are dropped "
    "and counted in otel_dra.push.points{outcome=dropped}. [env: OTEL_DRA_OTLP_QUEUE_MAX_POINTS]",
)
@click.option(
    "--node-name",
    default=None,
    help="Node the devices belong to (k8s.node.name). Default: k8s.node.name in OTEL_RESOURCE_ATTRIBUTES, "
    "else NODE_NAME, else the host name.",
)
@click.option("--seed", type=int, default=None, help="Seed the simulator for a repeatable run.")
@policy_option("Health policy YAML merged over the default (see 'otel-dra policy check').")
@click.option(
    "--health-attribute",
    type=click.Choice(HEALTH_ATTRIBUTE_MODES),
    default=AgentConfig.health_attribute,
    show_default=True,
    help="'metric': the derived health is the dra.device.health metric's attribute. 'all': also stamp "
    "dra.device.health.state on every hw.* series of the device (easy panel filters; new series on each transition).",
)
@click.option(
    "--kubelet-socket",
    default=None,
    help="Serve the kubelet's DRAResourceHealth stream (v1alpha1 and v1) on this unix socket, for the "
    "node's DRA driver to relay to the kubelet, e.g. /var/lib/kubelet/plugins/otel-dra/health.sock (never a "
    "driver's dra.sock). Default: off, or /var/lib/kubelet/plugins/<driver>/dra.sock for --register-with-kubelet.",
)
@click.option(
    "--kubelet-health-timeout",
    type=Seconds(),
    default=KubeletConfig.health_timeout_s,
    show_default=True,
    help="health_check_timeout_seconds sent to the kubelet (used from kubelet 1.35; 1.34 always uses 30 s); "
    "the full list is resent every third of it, and at least every 10 s.",
)
@click.option(
    "--register-with-kubelet",
    "register_driver",
    default=None,
    metavar="DRIVER_NAME",
    help="Announce the health socket to the kubelet's plugin watcher as this DRA driver. Only for a DRA "
    "driver built on otel-dra that also serves v1.DRAPlugin: kubelets 1.34+ refuse a plugin listing no "
    'DRAPlugin service ("none of services supported by the plugin [...] are supported by the kubelet"), '
    "so otel-dra alone is refused; relay its stream through the DRA driver instead. Default: off.",
)
@click.option(
    "--plugin-registry",
    default=KubeletConfig.plugin_registry,
    show_default=True,
    help="The kubelet's plugin registration directory (used with --register-with-kubelet).",
)
@click.option(
    "--k8s-output",
    default=None,
    metavar="DIR",
    help="Write DRA DeviceTaintRules for the current verdicts here (opt-in; taint effects come from the "
    "policy's kubernetes section, None by default).",
)
@click.option(
    "--k8s-attributes",
    is_flag=True,
    help="EXPERIMENTAL: also write ResourceSlice health attributes (resourceslice-attributes.yaml) to "
    "--k8s-output, for a DRA driver to publish. KEP-5283, which would define device health in "
    "ResourceSlices, is provisional: the names may change.",
)
@click.option(
    "--k8s-api-version",
    type=click.Choice(list(API_VERSIONS)),
    default=K8sOutputConfig.api_version,
    show_default=True,
    help="resource.k8s.io version of the DeviceTaintRules: v1 (Kubernetes 1.37+), v1beta2 (1.36, behind the "
    "DRADeviceTaintRules gate), v1alpha3 (1.33-1.35).",
)
@k8s_driver_option
@click.option(
    "--k8s-apply",
    is_flag=True,
    help="Also create, update and delete this node's DeviceTaintRules in the cluster (needs --k8s-output and "
    "deploy/kubernetes/taints/rbac.yaml). For a single node; in a cluster, `otel-dra fleet --k8s-apply` is the "
    "one writer, from every node's view.",
)
@log_level_option
def run(
    source: str,
    sysfs_root: str,
    devices: int,
    faults: tuple[Fault, ...],
    interval: float,
    prometheus_port: int,
    prometheus_host: str,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    otlp_interval: float | None,
    otlp_queue_max_age: float,
    otlp_queue_max_points: int,
    node_name: str | None,
    seed: int | None,
    policy_file: str | None,
    health_attribute: str,
    kubelet_socket: str | None,
    kubelet_health_timeout: float,
    register_driver: str | None,
    plugin_registry: str,
    k8s_output: str | None,
    k8s_attributes: bool,
    k8s_api_version: str,
    k8s_driver: str | None,
    k8s_apply: bool,
    log_level: str,
) -> None:
    """Run the node agent until SIGTERM or Ctrl-C.

    Serves every hw.* signal of the telemetry contract on http://HOST:PORT/metrics
    (Prometheus) and /healthz, and pushes it over OTLP when an endpoint is set.
    Resource attributes: service.name=otel-dra and k8s.node.name, plus
    OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME.
    """
    from otel_dra.agent import Agent  # heavy imports only when running
    from otel_dra.policy import PolicyError
    from otel_dra.sinks.k8s.apply import K8sApplyError
    from otel_dra.sinks.k8s.validation import K8sValidationError
    from otel_dra.sinks.kubelet import KubeletSocketError

    setup_logging(log_level)
    try:
        config = AgentConfig(
            node_name=resolve_node_name(node_name),
            source="simulated" if faults and source == "auto" else source,
            sysfs_root=sysfs_root,
            devices=devices,
            faults=faults,
            interval_s=interval,
            seed=seed,
            policy_path=policy_file,
            health_attribute=health_attribute,
            endpoint=EndpointConfig(prometheus_host, prometheus_port),
            otlp=OtlpPushConfig(
                resolve_otlp_endpoint(otlp_endpoint),
                resolve_otlp_protocol(otlp_protocol),
                otlp_interval,
                otlp_queue_max_age,
                otlp_queue_max_points,
            ),
            kubelet=KubeletConfig(kubelet_socket, kubelet_health_timeout, register_driver, plugin_registry),
            k8s=K8sOutputConfig(k8s_output, k8s_api_version, k8s_driver, k8s_apply, k8s_attributes),
        )
        agent = Agent(config)
    except (PolicyError, SourceUnavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    except (ConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc

    _stop_on_signals(agent.stop)
    try:
        agent.run()
    except (KubeletSocketError, K8sApplyError, K8sValidationError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:  # the port is taken, the address can't be bound
        raise click.ClickException(
            f"cannot serve on {prometheus_host}:{prometheus_port}: {exc.strerror}; "
            "pick another --prometheus-port (0 turns the endpoint off)"
        ) from exc


def main(argv: list[str] | None = None) -> None:
    """Entry point: click in non-standalone mode, so every user error is one line and exit 2."""
    prog = "otel-dra"
    try:
        cli.main(args=argv, prog_name=prog, standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx is not None else prog
        click.echo(f"{cmd}: error: {exc.format_message()} (see '{cmd} --help')", err=True)
        sys.exit(USAGE_ERROR)
    except click.ClickException as exc:
        click.echo(f"{prog}: error: {exc.format_message()}", err=True)
        sys.exit(USAGE_ERROR)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


@cli.command()
@click.option("--host", default=ReceiverConfig.host, show_default=True, help="Address every port binds to.")
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
    "partial success); a node whose clock ran ahead would otherwise make its later, correct points look old. "
    "0: no bound.",
)
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
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY). [env: OTEL_DRA_TLS_CLIENT_CA_FILE]",
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
@log_level_option
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
    tls_cert_file: str | None,
    tls_key_file: str | None,
    tls_client_ca_file: str | None,
    k8s_apply: bool,
    k8s_api_version: str,
    k8s_driver: str | None,
    k8s_output: str | None,
    leader_elect: bool,
    leader_elect_lease_duration: float,
    leader_elect_renew_deadline: float,
    leader_elect_retry_period: float,
    leader_elect_resource_name: str,
    leader_elect_resource_namespace: str,
    log_level: str,
) -> None:
    """Classify a whole fleet: receive every node's hw.* telemetry over OTLP (from the agents,
    usually through an OpenTelemetry Collector) and serve the verdicts like an agent does.

    Point a Collector's otlp exporter (or agents' OTEL_EXPORTER_OTLP_ENDPOINT) at the gRPC or
    HTTP port; scrape /metrics for hw_status and dra_device_health of every device.

    With --k8s-apply it is also the cluster's one DeviceTaintRule writer: run two or more replicas,
    each fed every node's telemetry, and the Lease holder writes (deploy/kubernetes/fleet).
    """
    from otel_dra.fleet import Fleet
    from otel_dra.receivers.tls import TlsConfigError, TlsSettings
    from otel_dra.sinks.k8s.apply import K8sApplyError
    from otel_dra.sinks.k8s.validation import K8sValidationError

    setup_logging(log_level)
    policy = _load_policy(policy_file)
    try:
        tls = TlsSettings.load(tls_cert_file, tls_key_file, tls_client_ca_file)
    except TlsConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    k8s: ClusterWriterConfig | None = None
    if not k8s_apply and k8s_output:
        raise click.UsageError("--k8s-output needs --k8s-apply (the fleet writes files only as its writer does)")
    try:
        if k8s_apply:
            lease = LeaseConfig(
                leader_elect_resource_name,
                leader_elect_resource_namespace,
                "",
                leader_elect_lease_duration,
                leader_elect_renew_deadline,
                leader_elect_retry_period,
            )
            k8s = ClusterWriterConfig(k8s_api_version, k8s_driver, k8s_output, leader_elect, lease)
        config = FleetConfig(
            receiver=ReceiverConfig(host, otlp_grpc_port, otlp_http_port, max_request_bytes, max_future, tls),
            endpoint=EndpointConfig(host, prometheus_port),
            sample_interval_s=sample_interval,
            evaluate_every_s=evaluate_every,
            k8s=k8s,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    runner = Fleet(config, policy)

    _stop_on_signals(runner.stop)
    try:
        runner.run()
    except (K8sApplyError, K8sValidationError) as exc:
        raise click.ClickException(f"--k8s-apply: {exc}") from exc
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}: {exc.strerror or exc}; pick other ports") from exc


def _load_policy(path: str | None) -> Policy:
    from otel_dra.policy import PolicyError, load

    try:
        return load(path)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from exc


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", default="-", show_default=True, help="Verdict lines go here ('-': stdout).")
@click.option("--policy", "policy_file", default=None, help="Policy YAML merged over the default (see 'policy check').")
@click.option(
    "--strict", is_flag=True, help="Any bad input line is an error (exit code 2); by default bad lines are skipped."
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also draw a state timeline per device to this PNG (needs matplotlib: pip install 'otel-dra[plot]').",
)
@click.option(
    "--evaluate-every",
    type=Seconds(),
    default=FleetConfig.evaluate_every_s,
    show_default=True,
    help="Judge the fleet every this much of the recording's time (as 'otel-dra fleet' does live).",
)
def replay(
    files: tuple[Path, ...],
    output: str,
    policy_file: str | None,
    strict: bool,
    plot: Path | None,
    evaluate_every: float,
) -> None:
    """Replay recorded telemetry (OTLP JSON lines, gzip too) through the classifier.

    Streams the files, judges the fleet every --evaluate-every of the recording's own time
    (the nodes' clocks with their offsets taken out, so a node whose clock is off neither
    looks silent nor makes others look so) and writes one verdict line per change (telemetry.md section 3),
    stamped with the device's node's time. Bad lines and points are skipped and counted; the
    first few are shown on stderr with their line numbers. Exit code 0 when valid data was
    replayed, 2 when nothing could be used (or, with --strict, when any line was bad).
    """
    from rich.console import Console
    from rich.table import Table

    from otel_dra.decode.otlp_json import InputFileError
    from otel_dra.replay import plot_timeline, summary_rows
    from otel_dra.replay import replay as run_replay

    policy = _load_policy(policy_file)
    err = Console(stderr=True)
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.ClickException("--plot needs matplotlib: pip install 'otel-dra[plot]'") from None
        folder = plot.parent if str(plot.parent) else Path(".")
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise click.ClickException(f"cannot write --plot {plot}: {folder} is not a folder this user can write to")
    total = sum(map(_size_or_zero, files))
    progress = progress_bar(err)
    out = sys.stdout if output == "-" else None
    try:
        out = out or open(output, "w")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror}") from exc
    try:
        with progress:
            reading = progress.add_task("replaying", total=total or None)
            result = run_replay(list(files), policy, out, lambda n: progress.advance(reading, n), evaluate_every)
    except InputFileError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if out is not sys.stdout:
            out.close()
    for error in result.errors:
        err.print(f"warning: {error}", highlight=False, markup=False)
    if result.error_count > len(result.errors):
        err.print(f"warning: ... and {result.error_count - len(result.errors)} more", highlight=False)
    table = Table(title=f"replayed {result.lines} lines, {result.points} points, {result.evaluations} evaluations")
    for col in ("health", "hw.state", "devices"):
        table.add_column(col)
    for health, state, n in summary_rows(result):
        table.add_row(health, state, str(n))
    err.print(table)
    err.print(
        f"skipped: {result.lines_skipped} lines, {result.points_skipped} points; "
        f"wrote {result.verdict_lines} verdict lines to {output}",
        highlight=False,
    )
    if plot is not None and result.usable:
        try:
            plot_timeline(result, plot)
        except OSError as exc:
            raise click.ClickException(f"cannot write --plot {plot}: {exc.strerror or exc}") from exc
        err.print(f"timeline: {plot}", highlight=False)
    if not result.usable:
        raise click.ClickException(f"nothing in {', '.join(map(str, files))} could be used (see the warnings above)")
    if strict and result.error_count:
        raise click.ClickException(f"--strict: {result.error_count} bad input problems (see the warnings above)")


def _size_or_zero(path: Path) -> int:
    """For the progress bar only: a file that can't be read is reported, with its reason, by the decoder."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


@cli.group()
def policy() -> None:
    """Health policy files: validate and show the effective policy."""


@policy.command("check")
@click.argument("file", required=False)
def policy_check(file: str | None) -> None:
    """Validate FILE (merged over the default) and print the effective policy as YAML.

    Without FILE, prints the default policy. An unknown key, a wrong type or a bad value is
    one error line naming the file position and key, with exit code 2.
    """
    click.echo(_load_policy(file).to_yaml(), nl=False)


@cli.command()
@click.argument("url", default="http://localhost:9464", required=False)
@click.option("--timeout", type=Seconds(), default=5.0, show_default=True, help="Seconds to wait for the agent.")
def status(url: str, timeout: float) -> None:
    """Show every device's verdict from a running agent or fleet (URL/v1/devices).

    Unhealthy devices first, then Unknown, then the rest; with the reasons, the
    remediation and how long the verdict has stood.
    """
    import json
    import time
    import urllib.error
    import urllib.request

    from rich.console import Console
    from rich.table import Table

    from otel_dra.classifier.verdicts import human_duration

    endpoint = url.rstrip("/") + ("" if url.rstrip("/").endswith("/v1/devices") else "/v1/devices")
    try:
        with urllib.request.urlopen(endpoint, timeout=timeout) as resp:
            devices = json.load(resp)["devices"]
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise click.ClickException(f"cannot read {endpoint}: {reason}; is 'otel-dra run' serving there?") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"{endpoint} did not answer with otel-dra's device list ({exc})") from exc
    now = time.time_ns()
    colors = {"Unhealthy": "red", "Unknown": "yellow", "Healthy": "green"}
    table = Table(title=f"{len(devices)} devices at {url}")
    for col in ("node", "device", "health", "hw.state", "reasons", "remediation", "since", "evidence"):
        table.add_column(col, overflow="fold")
    for d in devices:
        health = d.get("health", "?")
        age = human_duration(max(0.0, (now - int(d.get("last_transition_time", now))) / 1e9))
        table.add_row(
            d.get("k8s.node.name", ""),
            d.get("dra.device.name") or d.get("hw.id", ""),
            f"[{colors.get(health, 'white')}]{health}[/]",
            d.get("hw.state") or "-",
            ", ".join(d.get("reasons", [])) or "-",
            d.get("remediation", ""),
            age,
            d.get("message", ""),
        )
    Console().print(table)


cli.add_command(__import__("otel_dra.cli.k8s", fromlist=["k8s"]).k8s)  # otel-dra k8s (otel_dra/cli/k8s.py)
__import__("otel_dra.cli.scenario", fromlist=["register"]).register(cli)  # simulate, score (otel_dra/cli/scenario.py)
