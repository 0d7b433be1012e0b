"""``--state-dir`` / ``--no-state``: where ``otel-dra run`` and ``otel-dra fleet`` keep the verdict
engine's memory across restarts (:mod:`otel_dra.state.persist`)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import click


def resolve_state_dir(flag: str | None, off: bool, env: Mapping[str, str] = os.environ) -> str | None:
    """The directory, or None for no state file: ``--no-state`` or an empty ``--state-dir`` turn it
    off; no flag (nor ``OTEL_DRA_STATE_DIR``) is ``$XDG_STATE_HOME/otel-dra``."""
    from otel_dra.state.persist import default_state_dir

    if off or flag == "":
        return None
    return flag if flag is not None else default_state_dir(env)


def state_dir_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """Adds ``--state-dir`` and ``--no-state``; the command gets one ``state_dir`` (None: off)."""

    @functools.wraps(f)
    def command(*args: Any, state_dir: str | None, no_state: bool, **kwargs: Any) -> Any:
        return f(*args, state_dir=resolve_state_dir(state_dir, no_state), **kwargs)

    command = click.option(
        "--no-state",
        is_flag=True,
        envvar="OTEL_DRA_NO_STATE",
        show_envvar=True,
        help="Keep no state file: a restart forgets held faults (an uncorrected ECC error held for an hour).",
    )(command)
    return click.option(
        "--state-dir",
        default=None,
        metavar="DIR",
        envvar="OTEL_DRA_STATE_DIR",
        show_envvar=True,
        help="Where the verdict engine's memory (held faults and their timers, escalation counts, last "
        "verdicts) is kept, so a restart forgets no fault: agent-<node>.json or fleet.json, written every 30 s, "
        "soon after a verdict changes, and at shutdown. Default: $XDG_STATE_HOME/otel-dra "
        "(~/.local/state/otel-dra). '' or --no-state: none.",
    )(command)
