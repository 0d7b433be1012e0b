"""What every command shares: the exit code for user errors, signal handling, policy loading."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from otel_dra.policy import Policy

USAGE_ERROR = 2
log = logging.getLogger("otel_dra.cli")


def stop_on_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and Ctrl-C ask the running loop to stop (it flushes and exits within 5 s)."""

    def on_signal(signum: int, _: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def load_policy(path: str | None) -> Policy:
    from otel_dra.policy import PolicyError, load

    try:
        return load(path)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from exc
