"""``otel-dra run``: the node agent."""

from __future__ import annotations

from typing import Any

import click

from otel_dra.cli import common
from otel_dra.cli.flags import usage_error
from otel_dra.cli.options import Seconds, http_server_options, load_option, policy_option, start_logging
from otel_dra.cli.pipeline_configs import agent_config
from otel_dra.cli.pipeline_options import k8s_output_options, kubelet_options, otlp_push_options, service_options
from otel_dra.config import HEALTH_ATTRIBUTE_MODES, AgentConfig
from otel_dra.faults import Fault, FaultSpecError, parse_fault
from otel_dra.sinks.config import EndpointConfig
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
@otlp_push_options
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
@kubelet_options
@k8s_output_options
@http_server_options
@service_options
def run(**options: Any) -> None:
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

    start_logging(options["log_level"], options["log_format"])
    try:
        agent = Agent(agent_config(options))
    except (PolicyError, SourceUnavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    except ValueError as exc:  # a value a config refused: named by its flag
        raise usage_error(exc) from exc

    common.stop_on_signals(agent.stop)
    try:
        agent.run()
    except (KubeletSocketError, K8sApplyError, K8sValidationError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:  # the port is taken, the address can't be bound
        raise click.ClickException(common.listen_error(exc, {"HTTP endpoint": "--prometheus-port"})) from exc
