"""Command-line options several commands share, declared once."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

LOG_LEVELS = ("debug", "info", "warning", "error")

#: ``--log-level`` (``OTEL_DRA_LOG_LEVEL``).
log_level_option = click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    default="info",
    show_default=True,
    envvar="OTEL_DRA_LOG_LEVEL",
)


def driver_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A DRA driver name as the API takes it (a DNS subdomain of at most 63), else a usage error."""
    if value is None:
        return None
    from otel_dra.sinks.k8s.validation import driver_name_problem

    problem = driver_name_problem(value)
    if problem:
        raise click.BadParameter(f"{value!r} {problem}", ctx, param)
    return value


#: ``--k8s-driver`` of ``run`` and ``fleet``: checked as the API would check it.
k8s_driver_option = click.option(
    "--k8s-driver",
    default=None,
    callback=driver_name,
    help="DRA driver name for devices whose telemetry carries no dra.driver.name, e.g. gpu.nvidia.com.",
)


def policy_option(help_text: str) -> Callable[[Any], Any]:
    """``--policy FILE`` (``OTEL_DRA_POLICY``), passed as ``policy_file``."""
    return click.option(
        "--policy", "policy_file", default=None, envvar="OTEL_DRA_POLICY", help=f"{help_text} [env: OTEL_DRA_POLICY]"
    )


class Seconds(click.ParamType):
    """A duration in seconds: a finite number, positive (or, with ``zero_ok``, 0 meaning "off"), at
    most a year. ``nan`` and ``inf`` pass click's FloatRange but stall or break whatever sleeps on them."""

    name = "SECONDS"
    MAX_S = 366 * 86400.0

    def __init__(self, zero_ok: bool = False) -> None:
        self.zero_ok = zero_ok

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float | int) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        low = "0 (off) or more" if self.zero_ok else "more than 0"
        if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not self.zero_ok) or seconds > self.MAX_S:
            self.fail(f"{value!r} is not a number of seconds {low}, up to a year", param, ctx)
        return seconds


def progress_bar(console: Console) -> Progress:
    """The commands' progress bar: on stderr, gone when done, off when stderr is not a terminal."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
