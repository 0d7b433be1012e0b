"""``otel-dra run``: the node agent."""

from __future__ import annotations

import click

from otel_dra.cli import common
from otel_dra.cli.options import (
    Seconds,
    http_server_config,
    http_server_options,
    k8s_driver_option,
    load_option,
    log_options,
    policy_option,
    start_logging,
)
from otel_dra.cli.state_dir import state_dir_option
from otel_dra.config import HEALTH_ATTRIBUTE_MODES, AgentConfig, ConfigError, resolve_node_name
from otel_dra.faults import Fault, FaultSpecError, parse_fault
from otel_dra.sinks.config import (
    OTLP_PROTOCOLS,
    EndpointConfig,
    K8sOutputConfig,
    KubeletConfig,
    OtlpPushConfig,
    resolve_otlp_endpoint,
    resolve_otlp_protocol,
)
from otel_dra.sinks.k8s.versions import API_VERSIONS
from otel_dra.sources import SOURCES, SourceUnavailable


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


@click.command()
@click.option(
    "--source",
    type=click.Choice(SOURCES),
    default="auto",
    show_default=True,
    help="Where samples come from: 'nvml' (NVIDIA GPUs, needs otel-dra[nvidia]), 'sysfs' (Linux hwmon, PCIe "
    "AER, amdgpu, NICs), 'simulated' (GPUs that behave like real ones; --fault works here), or 'auto': NVML "
    "if it finds GPUs, else sysfs if it finds accelerators, else exit 2 saying what it looked for (auto never "
    "serves simulated GPUs; the choice and why are logged). --fault with auto means simulated.",
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
    "--host",
    "--prometheus-host",
    "prometheus_host",
    default=EndpointConfig.host,
    show_default=True,
    envvar=["OTEL_DRA_HOST", "OTEL_EXPORTER_PROMETHEUS_HOST"],
    help="Address the endpoint binds to, as the fleet's --host: the loopback by default (as "
    "OTEL_EXPORTER_PROMETHEUS_HOST's localhost); 0.0.0.0 where Prometheus scrapes the pod. --prometheus-host is "
    "the same flag. [env: OTEL_DRA_HOST, else OTEL_EXPORTER_PROMETHEUS_HOST]",
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
@load_option("simulated GPUs (--source simulated) of this node")
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
@http_server_options
@state_dir_option
@log_options
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
    load: str,
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
    max_connections: int | None,
    header_timeout: float,
    body_timeout: float,
    idle_timeout: float,
    state_dir: str | None,
    log_level: str | None,
    log_format: str,
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

    start_logging(log_level, log_format)
    try:
        config = AgentConfig(
            node_name=resolve_node_name(node_name),
            source=source,  # auto with --fault is the simulator: sources.choose says so in the log
            sysfs_root=sysfs_root,
            devices=devices,
            faults=faults,
            interval_s=interval,
            seed=seed,
            load=load,
            policy_path=policy_file,
            health_attribute=health_attribute,
            endpoint=EndpointConfig(
                host=prometheus_host,
                port=prometheus_port,
                http=http_server_config(max_connections, header_timeout, body_timeout, idle_timeout),
            ),
            otlp=OtlpPushConfig(
                endpoint=resolve_otlp_endpoint(otlp_endpoint),
                protocol=resolve_otlp_protocol(otlp_protocol),
                export_interval_s=otlp_interval,
                queue_max_age_s=otlp_queue_max_age,
                queue_max_points=otlp_queue_max_points,
            ),
            kubelet=KubeletConfig(
                socket=kubelet_socket,
                health_timeout_s=kubelet_health_timeout,
                register_with=register_driver,
                plugin_registry=plugin_registry,
            ),
            k8s=K8sOutputConfig(
                output=k8s_output,
                api_version=k8s_api_version,
                driver=k8s_driver,
                apply=k8s_apply,
                attributes=k8s_attributes,
            ),
            state_dir=state_dir,
        )
        agent = Agent(config)
    except (PolicyError, SourceUnavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    except (ConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc

    common.stop_on_signals(agent.stop)
    try:
        agent.run()
    except (KubeletSocketError, K8sApplyError, K8sValidationError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:  # the port is taken, the address can't be bound
        raise click.ClickException(common.listen_error(exc, {"HTTP endpoint": "--prometheus-port"})) from exc
