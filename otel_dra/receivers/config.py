"""The OTLP receiver's typed config: its defaults, stated once, and its checks.

Light on purpose (no grpc or protobuf imports): the CLI reads its option defaults from here.
The ports are OTLP's registered defaults, as the Collector's ``otlpreceiver`` uses them.

The host is the loopback address unless told otherwise, as the Collector's receivers bind
``localhost`` by default since v0.104: a fleet started by hand is not open to its network until
``host`` says so (the deploy manifests do). 127.0.0.1 rather than the name ``localhost``: Go's
listener (the Collector's) binds the one address the name resolves to first, the IPv4 loopback;
asyncio and gRPC would bind every address it resolves to, and fail where ``/etc/hosts`` names ``::1``
but IPv6 is off, as in many containers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from otel_dra.component import ConfigError
from otel_dra.decode.limits import DecodeLimits
from otel_dra.serve.config import HttpServerConfig

if TYPE_CHECKING:
    from otel_dra.receivers.auth import ReceiverAuth
    from otel_dra.receivers.tls import TlsSettings

#: Where every port binds unless ``host`` says otherwise: the loopback only (see the module docstring).
DEFAULT_HOST = "127.0.0.1"


@dataclass(frozen=True)
class ReceiverConfig:
    """Where OTLP/gRPC and OTLP/HTTP listen (a port of None turns that transport off, 0 takes any free
    one), and the bounds on what a request may bring. Checked once, here: the receiver takes it whole."""

    host: str = DEFAULT_HOST
    grpc_port: int | None = 4317
    http_port: int | None = 4318
    max_request_bytes: int = 16 << 20  # the Collector's confighttp default, for both transports
    #: Points further ahead of the receiver's clock are rejected (0: no bound), and their node's clock is told
    #: to be ahead (a warning, ``otel_dra.receiver.clock_skew``): a point stamped ahead holds back its series
    #: until its own time. Two of the fleet's sampling intervals (10 s): an NTP-synced node is well inside it,
    #: and one request stamped ahead can hold a series back two samples at most.
    max_future_s: float = 20.0
    tls: TlsSettings | None = None  # both transports; None: plaintext
    #: A bearer token to ask for, and which nodes a client certificate may report for (with mutual TLS a
    #: certificate speaks for the node it names even without it); None: no token.
    auth: ReceiverAuth | None = None
    #: Requests at most being read or waiting to be decoded, per process (each may hold max_request_bytes);
    #: past it the answer is UNAVAILABLE / 503 with a retry delay.
    max_pending_requests: int = 16
    limits: DecodeLimits = field(default_factory=DecodeLimits)  # caps on nodes, devices, series, value length
    http: HttpServerConfig = field(default_factory=HttpServerConfig)  # connections and timeouts (gRPC's too)

    def __post_init__(self) -> None:
        for name, port in (("grpc_port", self.grpc_port), ("http_port", self.http_port)):
            if port is not None and not 0 <= port <= 65535:
                raise ConfigError(f"{{ReceiverConfig.{name}}} must be a TCP port (None turns it off), got {port}")
        if self.max_request_bytes < 1:
            raise ConfigError(f"{{ReceiverConfig.max_request_bytes}} must be at least 1, got {self.max_request_bytes}")
        if self.max_pending_requests < 1:
            raise ConfigError(
                f"{{ReceiverConfig.max_pending_requests}} must be at least 1, got {self.max_pending_requests}"
            )
        if not self.max_future_s >= 0:
            raise ConfigError(
                f"{{ReceiverConfig.max_future_s}} must be 0 (no bound) or a number of seconds, got {self.max_future_s}"
            )

    @property
    def grpc_endpoint(self) -> str | None:
        return None if self.grpc_port is None else f"{self.host}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str | None:
        return None if self.http_port is None else f"{self.host}:{self.http_port}"
