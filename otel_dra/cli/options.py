"""Command-line options several commands share, declared once."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from otel_dra.decode.limits import DecodeLimits
    from otel_dra.serve.config import HttpServerConfig

LOG_LEVELS = ("debug", "info", "warning", "error")
F = TypeVar("F", bound=Callable[..., Any])


def log_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--log-level`` (``OTEL_DRA_LOG_LEVEL``, else ``OTEL_LOG_LEVEL``, else info) and ``--log-format``
    (``OTEL_DRA_LOG_FORMAT``) of every command that logs; pass their values to :func:`start_logging`."""
    from otel_dra.logs import LOG_FORMATS

    f = click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        default="logfmt",
        show_default=True,
        envvar="OTEL_DRA_LOG_FORMAT",
        show_envvar=True,
        help="logfmt: key=value lines (time, level, logger, msg, error), values quoted as logfmt parsers "
        "(Loki, Grafana, lnav) require. json: one JSON object per line with the same fields.",
    )(f)
    return click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default=None,
        envvar="OTEL_DRA_LOG_LEVEL",
        show_envvar=True,
        help="Default: OTEL_LOG_LEVEL, the OpenTelemetry SDKs' variable, if set (debug, info, warn, error, "
        "or a severity number: 1-8 debug, 9-12 info, 13-16 warn, 17-20 error), else info.",
    )(f)


def start_logging(log_level: str | None, log_format: str) -> None:
    """Log as :func:`log_options` say: an explicit ``--log-level`` wins over ``OTEL_LOG_LEVEL``; an
    ``OTEL_LOG_LEVEL`` that is no level is logged and info used, as the SDKs do."""
    import logging
    import os

    from otel_dra.logs import otel_log_level, setup_logging

    otel = os.environ.get("OTEL_LOG_LEVEL", "").strip()
    level = log_level or (otel_log_level(otel) if otel else None) or "info"
    setup_logging(level, log_format)
    if log_level is None and otel and otel_log_level(otel) is None:
        logging.getLogger("otel_dra.cli").warning("OTEL_LOG_LEVEL=%s is not a log level: logging at info", otel)


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


def load_option(what: str) -> Callable[[Any], Any]:
    """``--load``: what simulated GPUs run (``otel_dra.scenario.load.PROFILES``), default idle; ``what`` says whose."""
    from otel_dra.scenario.load import PROFILE_HELP, PROFILES

    profiles = "; ".join(f"{name}: {PROFILE_HELP[name]}" for name in PROFILES)
    return click.option(
        "--load",
        type=click.Choice(PROFILES),
        default="idle",
        show_default=True,
        help=f"What the {what} run. {profiles}.",
    )


def policy_option(help_text: str) -> Callable[[Any], Any]:
    """``--policy FILE`` (``OTEL_DRA_POLICY``), passed as ``policy_file``."""
    return click.option(
        "--policy", "policy_file", default=None, envvar="OTEL_DRA_POLICY", help=f"{help_text} [env: OTEL_DRA_POLICY]"
    )


class Seconds(click.ParamType):
    """A duration in seconds (a number, or with a unit as the policy writes them: 30s, 5m, 1h, 7d): finite,
    positive (or, with ``zero_ok``, 0 meaning "off"), at most a year. ``nan`` and ``inf`` pass click's
    FloatRange but stall or break whatever sleeps on them."""

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
                from otel_dra.policy import parse_duration

                parsed = parse_duration(str(value))
                if parsed is None:
                    self.fail(f"{value!r} is not a number of seconds (or a duration: 30s, 5m, 1h, 7d)", param, ctx)
                seconds = parsed
        low = "0 (off) or more" if self.zero_ok else "more than 0"
        if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not self.zero_ok) or seconds > self.MAX_S:
            self.fail(f"{value!r} is not a number of seconds {low}, up to a year", param, ctx)
        return seconds


def progress_bar(console: Console, refresh_thread: bool = True) -> Progress:
    """The commands' progress bar: on stderr, gone when done, off when stderr is not a terminal. Without
    ``refresh_thread`` it is redrawn only as it advances (:func:`advancer`): a replay forks its decode process,
    which it does only while no other thread runs (``decode/stage.py``)."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
        auto_refresh=refresh_thread,
    )


def advancer(progress: Progress, task: TaskID, every_s: float = 0.1) -> Callable[[int], None]:
    """``advance(n)`` for a bar without its refresh thread: moves ``task`` on by ``n`` and redraws the bar at
    most once every ``every_s`` (as its thread would)."""
    shown = -every_s

    def advance(n: int) -> None:
        nonlocal shown
        progress.advance(task, n)
        now = time.monotonic()
        if now - shown >= every_s:
            shown = now
            progress.refresh()

    return advance


def http_server_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--max-connections``, ``--header-timeout``, ``--body-timeout``, ``--idle-timeout``: the bounds of
    every HTTP server the command runs (and the gRPC receiver's connections); see ``serve/config.py``."""
    from otel_dra.serve.config import HttpServerConfig

    d = HttpServerConfig()
    for option in reversed(
        (
            click.option(
                "--max-connections",
                type=click.IntRange(min=1),
                default=None,
                help="Open connections per server at most; past it the one idle longest is closed to make room "
                "(on the gRPC port, one that never made a request first). Default: a quarter of the open-files "
                "limit (ulimit -n), 16 to 4,096 (the gRPC port: that many descriptors, three per piped connection).",
            ),
            click.option(
                "--header-timeout",
                type=Seconds(),
                default=d.header_timeout_s,
                show_default=True,
                help="Seconds a client has, from connecting or from its next request's first byte, to send complete "
                "headers (a TLS handshake included); then it is disconnected.",
            ),
            click.option(
                "--body-timeout",
                type=Seconds(),
                default=d.body_timeout_s,
                show_default=True,
                help="Seconds to send a whole request body once its headers are in (408 after).",
            ),
            click.option(
                "--idle-timeout",
                type=Seconds(),
                default=d.idle_timeout_s,
                show_default=True,
                help="Seconds a keep-alive connection may stay idle between requests.",
            ),
        )
    ):
        f = option(f)
    return f


def http_server_config(
    max_connections: int | None, header_timeout: float, body_timeout: float, idle_timeout: float
) -> HttpServerConfig:
    """The :class:`~otel_dra.serve.config.HttpServerConfig` of :func:`http_server_options`' values."""
    from otel_dra.serve.config import HttpServerConfig

    return HttpServerConfig(
        max_connections=max_connections,
        header_timeout_s=header_timeout,
        body_timeout_s=body_timeout,
        idle_timeout_s=idle_timeout,
    )


def limit_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--max-nodes``, ``--max-devices``, ``--max-devices-per-node``, ``--max-series``,
    ``--max-attribute-length``: what input may create (``decode/limits.py``); past a cap points are
    refused and counted."""
    from otel_dra.decode.limits import DecodeLimits

    d = DecodeLimits()
    specs = (
        ("--max-nodes", d.max_nodes, "Nodes at most (a node silent for an hour frees its place)."),
        ("--max-devices", d.max_devices, "Devices at most, over all nodes."),
        ("--max-devices-per-node", d.max_devices_per_node, "Devices at most on one node."),
        ("--max-series", d.max_series, "Distinct series kinds (metric and attributes) at most, fleet-wide."),
        (
            "--max-attribute-length",
            d.max_attribute_length,
            "Characters at most in an attribute value: longer descriptive values are shortened, longer hw.id "
            "or hw.parent values refused. (k8s.node.name must be a DNS subdomain of at most 253.)",
        ),
    )
    for flag, default, text in reversed(specs):
        f = click.option(flag, type=click.IntRange(min=1), default=default, show_default=True, help=text)(f)
    return f


def decode_limits(
    max_nodes: int, max_devices: int, max_devices_per_node: int, max_series: int, max_attribute_length: int
) -> DecodeLimits:
    """The :class:`~otel_dra.decode.limits.DecodeLimits` of :func:`limit_options`' values."""
    from otel_dra.decode.limits import DecodeLimits

    return DecodeLimits(
        max_devices_per_node=max_devices_per_node,
        max_nodes=max_nodes,
        max_devices=max_devices,
        max_series=max_series,
        max_attribute_length=max_attribute_length,
    )


def options(*decorators: Callable[[Any], Any]) -> Callable[[F], F]:
    """Option decorators as one, listed in the order ``--help`` shows them: a group of options that
    several commands declare once and apply each (``otel-dra run`` and ``otel-dra fleet``)."""

    def apply(f: F) -> F:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return apply


#: What ``-o/--output`` may ask for, on every command that has it.
OUTPUTS = ("table", "json")


def output_option(help_text: str, **envvar: Any) -> Callable[[F], F]:
    """``-o/--output table|json`` (default table) of the commands that print for people and for scripts;
    ``help_text``: what each gives there, ``envvar``: its environment variable, where it has one."""
    return click.option(
        "--output", "-o", type=click.Choice(OUTPUTS), default="table", show_default=True, help=help_text, **envvar
    )
