"""``otel-dra fleet``: every node's telemetry in over OTLP, one classifier, the fleet's verdicts out."""

from __future__ import annotations

from typing import Any

import click

from otel_dra.cli import common
from otel_dra.cli.common import load_policy
from otel_dra.cli.options import Seconds, http_server_options, limit_options, policy_option, start_logging
from otel_dra.cli.pipeline_configs import fleet_config
from otel_dra.cli.pipeline_options import (
    cluster_writer_options,
    receiver_bound_options,
    receiver_port_options,
    service_options,
    tls_auth_options,
)
from otel_dra.config import FleetConfig
from otel_dra.heap import HeapTrimConfig
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.sinks.config import EndpointConfig


@click.command()
@click.option(
    "--host",
    default=ReceiverConfig.host,
    show_default=True,
    help="Address every port binds to (the agent's --host names the same). The loopback by default, as the "
    "Collector's receivers: give 0.0.0.0 (or the pod's IP) where agents, a Collector or Prometheus must reach it.",
)
@receiver_port_options
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
@receiver_bound_options
@click.option(
    "--max-queued-points",
    type=click.IntRange(min=1),
    default=FleetConfig.max_queued_points,
    show_default=True,
    help="Values decoded but not yet evaluated at most (about 8 bytes each); past it clients are told to retry "
    "after the next evaluation.",
)
@click.option(
    "--heap-trim/--no-heap-trim",
    default=HeapTrimConfig.enabled,
    show_default=True,
    help="After a tick, hand the memory the C library holds free back to the system when it holds a lot "
    "(glibc's malloc_trim, at most 1% of the time): requests and ticks free temporaries that would otherwise "
    "stay resident, about as much again as the devices' windows at 8,000 devices. During a tick, its large "
    "arrays get pages of their own, handed back as each is freed, rather than growing the heap (glibc's mmap "
    "threshold lowered for the tick; MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES, when they "
    "set one, decide instead). Also keeps numpy's large arrays off transparent huge pages, where one written byte "
    "makes 2 MB resident (NUMPY_MADVISE_HUGEPAGE, when set, decides that instead).",
)
@click.option(
    "--render-fork/--no-render-fork",
    default=FleetConfig.render_fork,
    show_default=True,
    help="Make /metrics for a fleet of 20,000 devices or more on two cores, half in a copy of this process forked "
    "for the rendering and gone after it (where the process may use two CPUs): the first scrape of 100,000 "
    "devices in about 60% of the time. While it renders, the copy holds the pages it touches of its own (58 MB "
    "at 24,000 devices, about 2.4 kB a device); --no-render-fork where the memory limit has no room for that.",
)
@limit_options
@http_server_options
@tls_auth_options
@cluster_writer_options
@service_options
def fleet(**options: Any) -> None:
    """Classify a whole fleet: receive every node's hw.* telemetry over OTLP (from the agents,
    usually through an OpenTelemetry Collector) and serve the verdicts like an agent does.

    Point a Collector's otlp exporter (or agents' OTEL_EXPORTER_OTLP_ENDPOINT) at the gRPC or
    HTTP port; scrape /metrics for hw_status and dra_device_health of every device.

    With --k8s-apply it is also the cluster's one DeviceTaintRule writer: run two or more replicas,
    each fed every node's telemetry, and the Lease holder writes (deploy/kubernetes/fleet).
    """
    from otel_dra.fleet import Fleet
    from otel_dra.sinks.k8s.apply import K8sApplyError
    from otel_dra.sinks.k8s.validation import K8sValidationError

    start_logging(options["log_level"], options["log_format"])
    policy = load_policy(options["policy_file"])
    config = fleet_config(options)
    # gRPC's own error says only "Failed to bind" (and its C core logs a line of its own first): a
    # taken gRPC port is told before it tries. The HTTP servers say "in use" themselves.
    common.check_ports_free(config.receiver.host, {"--otlp-grpc-port": config.receiver.grpc_port or 0})
    runner = Fleet(config, policy)

    common.stop_on_signals(runner.stop)
    try:
        runner.run()
    except (K8sApplyError, K8sValidationError) as exc:
        raise click.ClickException(f"--k8s-apply: {exc}") from exc
    except OSError as exc:
        flags = {"OTLP/gRPC": "--otlp-grpc-port", "OTLP/HTTP": "--otlp-http-port", "HTTP endpoint": "--prometheus-port"}
        raise click.ClickException(common.listen_error(exc, flags)) from exc
