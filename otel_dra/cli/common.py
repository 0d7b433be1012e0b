"""What every command shares: the exit code for user errors, signal handling, policy loading, the
one line for a port that cannot be listened on, counted nouns, the hint for ``--json``, and stderr
lines that a pipe gets whole."""

from __future__ import annotations

import errno
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import click

from otel_dra.words import plural as plural  # (the CLI's messages use it from here too)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

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
    from otel_dra.policy import PolicyError
    from otel_dra.sinks.policy_sections import load_policy as load

    try:
        return load(path)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from exc


def port_busy(flag: str, port: int) -> str:
    """The line for a port another process holds."""
    return f"{flag} {port} is in use by another process: stop it or pick another port (0 turns the endpoint off)"


def listen_error(exc: OSError, flags: dict[str, str]) -> str:
    """One line for a server that could not listen, naming the flag of its port and the port:
    ``--prometheus-port 9464 is in use by another process: stop it or pick another port (0 turns
    the endpoint off)``. ``flags``: each server's name (:class:`ListenError`'s ``server``) to its port flag."""
    from otel_dra.serve.config import ListenError

    text = " ".join(str(exc).split())
    flag = flags.get(exc.server) if isinstance(exc, ListenError) else None
    if not isinstance(exc, ListenError) or flag is None:
        return f"{text}; pick other ports (0 turns an endpoint off)"
    # gRPC's core does not say why it could not bind: binding the port ourselves does.
    busy = exc.errno == errno.EADDRINUSE or (not exc.errno and port_in_use(exc.host, exc.port))
    if busy:
        return port_busy(flag, exc.port)
    why = exc.why or "refused"
    return f"{flag} {exc.port}: cannot listen on {exc.host}: {why}; pick another port or --host (0: off)"


def port_in_use(host: str, port: int) -> bool:
    """Whether another process listens on ``host:port`` (binding it, as the servers do, says so)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        socket.create_server((host, port), family=family).close()
    except OSError as exc:
        return exc.errno == errno.EADDRINUSE
    return False


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Before any server starts: a port (``ports``: flag to port, 0 for off) another process holds is
    one line naming its flag, not whatever a server's library says (gRPC logs its own lines first)."""
    for flag, port in ports.items():
        if port and port_in_use(host, port):
            raise click.ClickException(port_busy(flag, port))


def output_flag_hint(exc: click.UsageError) -> str | None:
    """``--json`` (or ``--table``) on a command whose ``-o/--output`` has that choice: the line that
    names the right flag, ``no such option: --json (did you mean -o json?)``, where click would
    suggest whatever flag is spelt closest (``--version``). ``None`` for any other mistake."""
    if not isinstance(exc, click.NoSuchOption) or exc.ctx is None:
        return None
    wanted = exc.option_name.removeprefix("--")
    for param in exc.ctx.command.params:
        if not isinstance(param, click.Option) or not isinstance(param.type, click.Choice):
            continue
        if "--output" in param.opts and wanted in param.type.choices:
            flag = "-o" if "-o" in param.opts else "--output"
            return f"no such option: {exc.option_name} (did you mean {flag} {wanted}?)"
    return None


def stderr_console() -> Console:
    """A rich console on stderr. Piped (not a terminal), no line is wrapped, whatever ``COLUMNS``
    says: a log or ``2>file`` gets each message whole, not cut mid-sentence at 80 columns."""
    import sys

    from rich.console import Console

    if sys.stderr.isatty():
        return Console(stderr=True)
    return Console(stderr=True, width=100_000, soft_wrap=True)


#: Spaces between two columns of a listing.
COLUMN_GAP = 2


def listing(title: str, width: int | None, caption: str | None) -> Table:
    """A listing as kubectl prints one: a left-aligned title, a rule under the header on a terminal
    (``width``), plain columns ``COLUMN_GAP`` apart when piped, and a caption (what is not shown, or
    why nothing is). ``title`` is taken as text, not markup."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    return Table(
        title=escape(title),
        box=box.SIMPLE_HEAD if width else None,  # piped: plain columns, as kubectl prints them
        show_edge=False,
        padding=(0, COLUMN_GAP - 1 if width else COLUMN_GAP, 0, 0),
        expand=False,
        title_justify="left",
        caption=caption,
        caption_justify="left",
    )
