"""``otel-dra kubelet watch``: the ``DRAResourceHealth`` stream as the kubelet reads it, without
``grpcurl`` and the proto.

It dials the unix socket ``otel-dra run --kubelet-socket`` serves (``unix://PATH``, as the kubelet does),
calls ``NodeWatchResources`` and prints each update: every device's pool, name, health, the time the
agent last determined it (UTC and age), its ``health_check_timeout_seconds`` and ``message``. A table
for people, or one JSON object per update for ``jq``.

Imports nothing heavy at import time (grpc, the stubs and rich are loaded when the command runs),
so registering the group costs ``otel-dra --help`` nothing. Every user error is a
:class:`click.ClickException`: one line, exit code 2 through ``otel_dra.cli.main``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from otel_dra.cli.common import listing
from otel_dra.cli.options import Seconds, output_option
from otel_dra.sinks.config import KUBELET_DEFAULT_TIMEOUT_S, KUBELET_PLUGINS_DIR

if TYPE_CHECKING:
    import grpc
    from google.protobuf.message import Message
    from rich.console import Console
    from rich.table import Table

    from otel_dra.sinks.kubelet.api.dra_health_v1alpha1_pb2 import NodeWatchResourcesResponse

#: Where the DaemonSet (deploy/kubernetes/base/30-daemonset.yaml) serves the stream on every node.
DEFAULT_SOCKET = os.path.join(KUBELET_PLUGINS_DIR, "otel-dra", "health.sock")
#: ``auto``: v1alpha1 (what kubelets up to 1.36 call), then v1 when the server has no v1alpha1.
API_VERSIONS = ("auto", "v1alpha1", "v1")

_COLORS = {"Unhealthy": "red", "Unknown": "yellow", "Healthy": "green"}


@click.group()
def kubelet() -> None:
    """Device health as the kubelet hears it from otel-dra.

    The kubelet reads otel-dra's DRAResourceHealth stream (relayed by the node's DRA driver) to set
    each allocated device's health in the pod's status; these commands read the same stream.
    """


@kubelet.command()
@click.argument(
    "socket_path", metavar="[SOCKET]", default=DEFAULT_SOCKET, required=False, envvar="OTEL_DRA_KUBELET_WATCH_SOCKET"
)
@output_option(
    "'table' for people: on a terminal one table redrawn in place per update; piped, a table for "
    "the first update and again whenever a health, message or device changes (resends that change "
    "only the times are skipped). 'json': one object per update and line, every update, for jq."
)
@click.option("--once", is_flag=True, help="Print the first update (the complete device list) and exit 0.")
@click.option(
    "--timeout",
    type=Seconds(zero_ok=True),
    default=0,
    show_default=True,
    help="Give up (exit 2) when no update arrives for this long, the first one included; 0: wait forever. "
    "The agent resends the full list at least every 10 s while its verdicts are fresh, so 30 (the "
    "kubelet's own timeout) catches a stream the kubelet would time out on.",
)
@click.option(
    "--api-version",
    type=click.Choice(API_VERSIONS),
    default="auto",
    show_default=True,
    help="The DRAResourceHealth package to call: v1alpha1 (kubelets up to 1.36) or v1 (newer kubelets); "
    "auto: v1alpha1, then v1 if the server has no v1alpha1.",
)
def watch(socket_path: str, output: str, once: bool, timeout: float, api_version: str) -> None:
    """Print the health stream the kubelet reads, update by update.

    The kubelet reads this stream (DRAResourceHealth.NodeWatchResources, KEP-4680) to set each
    allocated device's health in the pod's status (allocatedResourcesStatus) and so in what
    `kubectl describe pod` shows: Healthy, Unhealthy, or Unknown when it hears nothing about a
    device within its timeout or the stream ends. This command reads the same stream over the
    same socket and prints every update: pool, device, health, when the agent last determined it
    (UTC, and how long ago), health_check_timeout_seconds (read by kubelets from 1.35; 1.34 uses
    30 s) and the message (shown by kubelets from 1.36).

    SOCKET is the unix socket `otel-dra run --kubelet-socket` serves; default
    /var/lib/kubelet/plugins/otel-dra/health.sock (the DaemonSet's), or
    OTEL_DRA_KUBELET_WATCH_SOCKET. The socket is owner-only: run as the agent's user or root.
    Ctrl-C ends the watch (exit 130).
    """
    from rich.console import Console

    path = os.path.abspath(socket_path)
    _check_socket(path, timeout or 5.0)
    console = Console() if sys.stdout.isatty() else Console(width=100_000)  # piped: no wrapping at all
    with _open(path, api_version, timeout) as (stream, first):
        try:
            if output == "json":
                _json_lines(stream, first, once)
            elif console.is_terminal and not once:
                _table_in_place(console, stream, first)
            else:
                _tables(console, stream, first, once)
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            _silence_stdout()


# -- the socket and the stream ---------------------------------------------------------------
def _check_socket(path: str, timeout_s: float) -> None:
    """One line for each reason a kubelet could not dial ``path``: nothing there, not a socket,
    permission denied (the socket is 0600, its directory 0700), nothing listening. Dialing it
    ourselves says which, where gRPC would only say UNAVAILABLE."""
    from otel_dra.sinks.kubelet._socket import _describe

    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise click.ClickException(
            f"no socket at {path}: is `otel-dra run --kubelet-socket {path}` running on this node?"
        ) from None
    except PermissionError:
        raise click.ClickException(
            f"permission denied looking up {path}: its directory is open to its owner only; "
            "run as the user otel-dra runs as, or as root (sudo)"
        ) from None
    except OSError as exc:
        raise click.ClickException(f"cannot look up {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise click.ClickException(
            f"{path} is {_describe(st.st_mode)}, not a socket: give the path `otel-dra run --kubelet-socket` serves"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        try:
            probe.connect(path)
        except PermissionError:
            raise click.ClickException(
                f"permission denied on {path}: the socket is owner-only (0600, owner {_owner(st.st_uid)}); "
                f"run as {_owner(st.st_uid)} or root, e.g. sudo otel-dra kubelet watch {path}"
            ) from None
        except ConnectionRefusedError:
            raise click.ClickException(
                f"nothing listens on {path} (a socket left by an agent that stopped?): "
                f"is `otel-dra run --kubelet-socket {path}` running on this node?"
            ) from None
        except OSError as exc:
            raise click.ClickException(f"cannot connect to {path}: {exc.strerror or exc}") from None


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class _Stream:
    """One ``NodeWatchResources`` call, read on its own thread: the wait for each update can then
    time out, and Ctrl-C is heard at once."""

    def __init__(self, channel: grpc.Channel, service: str, path: str, timeout_s: float) -> None:
        from otel_dra.sinks.kubelet.api import dra_health_v1alpha1_pb2 as pb
        from otel_dra.sinks.kubelet.server import METHOD

        self.service, self.path, self.timeout_s = service, path, timeout_s
        self.updates = 0
        # v1alpha1 and v1 are the same messages on the wire (the server shares one encoding too).
        method = channel.unary_stream(
            f"/{service}/{METHOD}",
            request_serializer=pb.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=pb.NodeWatchResourcesResponse.FromString,
        )
        self.call = method(pb.NodeWatchResourcesRequest())
        self._queue: queue.Queue[NodeWatchResourcesResponse | BaseException | None] = queue.Queue()
        threading.Thread(target=self._read, name="kubelet-watch", daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self._queue.put(message)
            self._queue.put(None)  # the server ended the stream
        except BaseException as exc:  # grpc.RpcError, mostly: the main thread says what it means
            self._queue.put(exc)

    def next(self) -> NodeWatchResourcesResponse:
        """The next update; a one-line :class:`click.ClickException` when none comes in time or the stream ends."""
        try:
            item = self._queue.get(timeout=self.timeout_s or None)
        except queue.Empty:
            self.call.cancel()
            raise click.ClickException(self._silent()) from None
        if item is None or isinstance(item, BaseException):
            raise _StreamError(item, self)
        self.updates += 1
        return item

    def _silent(self) -> str:
        from otel_dra.sinks.kubelet.server import MAX_RESEND_S

        if not self.updates:
            return (
                f"nothing arrived from {self.path} within {self.timeout_s:g}s: "
                "is it the socket `otel-dra run --kubelet-socket` serves?"
            )
        return (
            f"no update from {self.path} for {self.timeout_s:g}s after {_updates(self.updates)}: the agent resends "
            f"at least every {MAX_RESEND_S:g}s while its verdicts are fresh, so they are stale or it hangs "
            "(the kubelet turns a device Unknown when its timeout passes without an update)"
        )

    def close(self) -> None:
        self.call.cancel()


class _StreamError(click.ClickException):
    """The stream failed or ended; its message says what that means for the kubelet."""

    def __init__(self, error: BaseException | None, stream: _Stream) -> None:
        self.code = _code(error)
        super().__init__(self._say(error, stream))

    def _say(self, error: BaseException | None, stream: _Stream) -> str:
        status = f"{self.code}: {_details(error)}" if self.code else "closed by the server"
        path = stream.path
        if stream.updates:
            return (
                f"the stream from {path} ended after {_updates(stream.updates)} ({status}): the agent stopped or "
                "restarted; the kubelet turns every device Unknown when its stream ends"
            )
        if self.code == "UNAVAILABLE":
            return (
                f"no gRPC server answered on {path} ({_details(error)}): "
                "is it the socket `otel-dra run --kubelet-socket` serves?"
            )
        return f"{stream.service}/NodeWatchResources on {path} failed before any update ({status})"


def _code(error: BaseException | None) -> str | None:
    import grpc

    return error.code().name if isinstance(error, grpc.Call) else None


def _details(error: BaseException | None) -> str:
    import grpc

    text = error.details() if isinstance(error, grpc.Call) else str(error or "")
    return " ".join(str(text or "no details").split())


def _updates(n: int) -> str:
    return f"{n} update{'s' * (n != 1)}"


@contextlib.contextmanager
def _open(path: str, api_version: str, timeout_s: float) -> Iterator[tuple[_Stream, NodeWatchResourcesResponse]]:
    """(the stream, its first update), from the first service the server has; closed on exit."""
    import grpc

    from otel_dra.sinks.kubelet.server import HEALTH_SERVICES

    services = [s for s in HEALTH_SERVICES if api_version == "auto" or s.split(".")[0] == api_version]
    with grpc.insecure_channel(f"unix://{path}") as channel:
        for service in services:
            stream = _Stream(channel, service, path, timeout_s)
            try:
                first = stream.next()
            except _StreamError as exc:
                stream.close()
                if exc.code == "UNIMPLEMENTED":
                    continue  # auto: the next package
                raise
            try:
                yield stream, first
            finally:
                stream.close()
            return
    raise click.ClickException(
        f"{path} serves gRPC but not {' or '.join(services)} (UNIMPLEMENTED): is it a DRA driver's plugin or "
        "registration socket? Give the one `otel-dra run --kubelet-socket` serves"
    )


# -- the update as data ----------------------------------------------------------------------
def fields(message: Message) -> dict[str, Any]:
    """A proto message's fields by their proto names, zero values included, enums by name: the data
    as it came, where proto's JSON mapping would write int64s as strings and leave zeros out."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        out[field.name] = [_value(field, v) for v in value] if field.is_repeated else _value(field, value)
    return out


def _value(field: Any, value: Any) -> Any:
    """One value of ``field`` (a FieldDescriptor, pure-Python or upb): a message as a dict, an enum by name."""
    if field.message_type is not None:
        return fields(value)
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    return value


def update_json(message: NodeWatchResourcesResponse, stream: _Stream, received_s: float) -> dict[str, Any]:
    """One update as a JSON object: each device's proto fields, plus ``last_updated`` (its
    ``last_updated_time`` in UTC) and ``age_seconds`` (how long before the update arrived)."""
    from otel_dra.classifier.verdict import rfc3339

    devices = []
    for device in message.devices:
        entry = fields(device)
        stamp = device.last_updated_time
        entry["last_updated"] = rfc3339(stamp * 10**9) if stamp > 0 else None
        entry["age_seconds"] = int(received_s) - stamp if stamp > 0 else None
        devices.append(entry)
    return {
        "received": rfc3339(int(received_s * 1e9)),
        "socket": stream.path,
        "service": stream.service,
        "update": stream.updates,
        "devices": devices,
    }


def health_name(value: int) -> str:
    """HEALTHY → Healthy: the word the kubelet writes in the pod's allocatedResourcesStatus."""
    from otel_dra.sinks.kubelet.api import dra_health_v1alpha1_pb2 as pb

    try:
        return pb.HealthStatus.Name(value).capitalize()
    except ValueError:
        return str(value)


def _changes(message: NodeWatchResourcesResponse) -> list[tuple[str, str, int, int, str]]:
    """What a piped table is reprinted for: everything but the times."""
    return [
        (d.device.pool_name, d.device.device_name, d.health, d.health_check_timeout_seconds, d.message)
        for d in message.devices
    ]


# -- printing --------------------------------------------------------------------------------
def _json_lines(stream: _Stream, message: NodeWatchResourcesResponse, once: bool) -> None:
    while True:
        sys.stdout.write(json.dumps(update_json(message, stream, time.time()), ensure_ascii=False) + "\n")
        sys.stdout.flush()
        if once:
            return
        message = stream.next()


def _tables(console: Console, stream: _Stream, message: NodeWatchResourcesResponse, once: bool) -> None:
    """Piped (or --once): a table per update that changes something but the times, a blank line between."""
    shown = None
    while True:
        if _changes(message) != shown:
            if shown is not None:
                sys.stdout.write("\n")
            shown = _changes(message)
            width = console.width if console.is_terminal else None
            _print(console, device_table(message, stream, time.time(), width=width))
        if once:
            return
        message = stream.next()


def _table_in_place(console: Console, stream: _Stream, message: NodeWatchResourcesResponse) -> None:
    """On a terminal: one table redrawn in place per update (rich's Live); the last one stays on screen."""
    from rich.live import Live

    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            live.update(device_table(message, stream, time.time(), width=console.width), refresh=True)
            message = stream.next()


def _print(console: Console, table: Table) -> None:
    if console.is_terminal:
        console.print(table)
        return
    with console.capture() as captured:  # piped: the lines as they are, without padding to the table's width
        console.print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    sys.stdout.flush()


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null, so the interpreter's final flush is quiet too."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def device_table(
    message: NodeWatchResourcesResponse, stream: _Stream, received_s: float, width: int | None = None
) -> Table:
    """An update as a table: the devices in the order sent (the agent sorts them by pool and device);
    ``width`` (a terminal's) folds the message column, ``None`` keeps each device on one line."""
    from rich.text import Text

    from otel_dra.classifier.verdict import rfc3339
    from otel_dra.words import human_duration

    rows: list[dict[str, str]] = []
    for d in message.devices:
        stamp = d.last_updated_time
        age = int(received_s) - stamp
        timeout = d.health_check_timeout_seconds
        rows.append(
            {
                "pool": d.device.pool_name or '""',
                "device": d.device.device_name or '""',
                "health": health_name(d.health),
                "last updated (UTC)": rfc3339(stamp * 10**9) if stamp > 0 else "-",
                "age": "-" if stamp <= 0 else human_duration(age) if age >= 0 else f"in {human_duration(-age)}",
                "timeout": f"{timeout}s" if timeout > 0 else f"{KUBELET_DEFAULT_TIMEOUT_S:g}s (default)",
                "message": " ".join(d.message.split()) or "-",
            }
        )
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["health"]] = counts.get(r["health"], 0) + 1
    worst = ", ".join(f"{counts[h]} {h}" for h in ("Unhealthy", "Unknown") if counts.get(h))
    at = time.strftime("%H:%M:%SZ", time.gmtime(received_s))
    title = (
        f"{len(rows)} device{'s' * (len(rows) != 1)} from {stream.path} ({stream.service}), "
        f"update {stream.updates} at {at}" + (f" ({worst})" if worst else "")
    )
    table = listing(
        title,
        width,
        None if rows else "no devices: the agent names none (each needs dra.pool.name and dra.device.name)",
    )
    columns = ["pool", "device", "health", "last updated (UTC)", "age", "timeout", "message"]
    for col in columns:
        if col == "message":
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(*(Text(r[c], style=_COLORS.get(r[c], "") if c == "health" else "") for c in columns))
    return table
