"""The ``otel-dra`` command line.

User mistakes (a bad flag, a bad ``--fault``, a port in use) end in one line on
stderr naming what is wrong and how to fix it, with exit code 2; never a traceback.
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

import click

from otel_dra import __version__
from otel_dra.config import (
    DEFAULT_PROMETHEUS_PORT,
    OTLP_PROTOCOLS,
    AgentConfig,
    ConfigError,
    resolve_node_name,
    resolve_otlp_endpoint,
    resolve_otlp_protocol,
)
from otel_dra.faults import Fault, FaultSpecError, parse_fault
from otel_dra.logs import setup_logging
from otel_dra.sources import SOURCES

USAGE_ERROR = 2
log = logging.getLogger("otel_dra.cli")


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
    default="simulated",
    show_default=True,
    help="Where samples come from. 'simulated' is a node of GPUs that behave like real ones.",
)
@click.option("--devices", type=click.IntRange(min=1), default=8, show_default=True, help="Simulated devices.")
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
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds between sampling passes.",
)
@click.option(
    "--prometheus-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PROMETHEUS_PORT,
    show_default=True,
    envvar="OTEL_EXPORTER_PROMETHEUS_PORT",
    help="Port for /metrics and /healthz; 0 turns the endpoint off. [env: OTEL_EXPORTER_PROMETHEUS_PORT]",
)
@click.option(
    "--prometheus-host",
    default="0.0.0.0",
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
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds between OTLP pushes. Default: OTEL_METRIC_EXPORT_INTERVAL (ms) if set, else --interval.",
)
@click.option(
    "--node-name",
    default=None,
    help="Node the devices belong to (k8s.node.name). Default: k8s.node.name in OTEL_RESOURCE_ATTRIBUTES, "
    "else NODE_NAME, else the host name.",
)
@click.option("--seed", type=int, default=None, help="Seed the simulator for a repeatable run.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    envvar="OTEL_DRA_LOG_LEVEL",
)
def run(
    source: str,
    devices: int,
    faults: tuple[Fault, ...],
    interval: float,
    prometheus_port: int,
    prometheus_host: str,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    otlp_interval: float | None,
    node_name: str | None,
    seed: int | None,
    log_level: str,
) -> None:
    """Run the node agent until SIGTERM or Ctrl-C.

    Serves every hw.* signal of the telemetry contract on http://HOST:PORT/metrics
    (Prometheus) and /healthz, and pushes it over OTLP when an endpoint is set.
    Resource attributes: service.name=otel-dra and k8s.node.name, plus
    OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME.
    """
    from otel_dra.agent import Agent  # heavy imports only when running

    setup_logging(log_level)
    try:
        config = AgentConfig(
            node_name=resolve_node_name(node_name),
            source=source,
            devices=devices,
            faults=faults,
            interval_s=interval,
            prometheus_host=prometheus_host,
            prometheus_port=prometheus_port,
            otlp_endpoint=resolve_otlp_endpoint(otlp_endpoint),
            otlp_protocol=resolve_otlp_protocol(otlp_protocol),
            otlp_export_interval_s=otlp_interval,
            seed=seed,
        )
        agent = Agent(config)
    except (ConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc

    def on_signal(signum: int, _: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.run()
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
