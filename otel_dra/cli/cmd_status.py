"""``otel-dra status``: every device's verdict from a running agent or fleet."""

from __future__ import annotations

import click

from otel_dra.cli.client import read_devices
from otel_dra.cli.options import Seconds
from otel_dra.sinks.config import EndpointConfig


@click.command()
@click.argument("url", default=f"http://localhost:{EndpointConfig.port}", required=False)
@click.option("--timeout", type=Seconds(), default=5.0, show_default=True, help="Seconds to wait for the agent.")
def status(url: str, timeout: float) -> None:
    """Show every device's verdict from a running agent or fleet (URL/v1/devices).

    Unhealthy devices first, then Unknown, then the rest; with the reasons, the
    remediation and how long the verdict has stood.
    """
    import time

    from rich.console import Console
    from rich.table import Table

    from otel_dra.classifier.verdicts import human_duration

    _, doc = read_devices(url, timeout)
    devices = [d for d in doc["devices"] if isinstance(d, dict)]
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
