"""The HTTP server's bounds: how many connections, and how long each may take to say what it wants.

Light on purpose (no aiohttp import): the CLI reads the defaults from here. The names and defaults
follow Go's ``net/http`` server, which the Collector's ``confighttp`` exposes (``read_header_timeout``,
``idle_timeout``), and nginx's ``worker_connections``.
"""

from __future__ import annotations

import errno
import resource
from dataclasses import dataclass
from typing import Final

from otel_dra.component import ConfigError

#: Without ``max_connections``, a server takes a quarter of the process's file-descriptor limit
#: (the receiver's, the endpoint's and gRPC's connections must all fit under it), within these bounds.
AUTO_MIN_CONNECTIONS: Final = 16
AUTO_MAX_CONNECTIONS: Final = 4_096


def fd_limit() -> int:
    """The process's soft limit on open files (RLIMIT_NOFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


@dataclass(frozen=True)
class HttpServerConfig:
    """Bounds of one HTTP server: its connections and how long each may take."""

    #: Open connections at most (None: a quarter of the fd limit, 16 to 4,096). Past it, the connection
    #: idle longest is closed to make room (as nginx reuses keep-alive connections); with none idle, the new one is.
    max_connections: int | None = None
    #: Seconds from a connection's first byte (or its arrival) to a request's complete headers (slowloris).
    header_timeout_s: float = 10.0
    #: Seconds to read a request's whole body once its headers are in (a never-ending or trickled body).
    body_timeout_s: float = 30.0
    #: Seconds a keep-alive connection may sit idle between requests.
    idle_timeout_s: float = 60.0
    #: Bytes in the request line or one header line (aiohttp's ``max_line_size``/``max_field_size``);
    #: headers at most.
    max_header_line_bytes: int = 8_190
    max_headers: int = 64

    def __post_init__(self) -> None:
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError(f"{{HttpServerConfig.max_connections}} must be at least 1, got {self.max_connections}")
        for name, value in (
            ("header_timeout_s", self.header_timeout_s),
            ("body_timeout_s", self.body_timeout_s),
            ("idle_timeout_s", self.idle_timeout_s),
        ):
            if not value > 0:
                raise ConfigError(f"{{HttpServerConfig.{name}}} must be a positive number of seconds, got {value}")
        if self.max_header_line_bytes < 256 or self.max_headers < 8:
            raise ConfigError("header limits below 256 bytes a line or 8 headers would refuse ordinary clients")

    def connections(self) -> int:
        """``max_connections``, or the automatic share of the fd limit."""
        if self.max_connections is not None:
            return self.max_connections
        return max(AUTO_MIN_CONNECTIONS, min(AUTO_MAX_CONNECTIONS, fd_limit() // 4))


class ListenError(OSError):
    """A server that could not listen: which one (``server``, as its flags name it), where, and why
    (``errno`` when the OS said; gRPC's core does not), so the CLI can name the flag and the port."""

    def __init__(self, server: str, host: str, port: int, why: str, err: int | None = None) -> None:
        busy = " (is another process using it?)" if err == errno.EADDRINUSE else ""
        super().__init__(err or 0, f"cannot listen for {server} on {host}:{port}: {why}{busy}")
        self.server, self.host, self.port, self.why = server, host, port, why
