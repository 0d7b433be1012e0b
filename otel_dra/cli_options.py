"""Command-line options several commands share, declared once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

LOG_LEVELS = ("debug", "info", "warning", "error")

#: ``--log-level`` (``OTEL_DRA_LOG_LEVEL``).
log_level_option = click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    default="info",
    show_default=True,
    envvar="OTEL_DRA_LOG_LEVEL",
)


def policy_option(help_text: str) -> Callable[[Any], Any]:
    """``--policy FILE`` (``OTEL_DRA_POLICY``), passed as ``policy_file``."""
    return click.option(
        "--policy", "policy_file", default=None, envvar="OTEL_DRA_POLICY", help=f"{help_text} [env: OTEL_DRA_POLICY]"
    )
