"""The OTLP/gRPC port's front: it accepts the connections, holds the same cap as the HTTP servers, and
hands each connection's bytes to the gRPC server, which listens on a private Unix socket.

Why a front: gRPC's core caps connections by refusing newcomers (``grpc.max_allowed_incoming_connections``;
``ConnectionQuota::AllowIncomingConnection`` in ``src/core/lib/resource_quota/connection_quota.cc``),
so a few hundred silent connections, reopened as they are closed, lock every honest node out; and
grpcio cannot be handed a socket accepted elsewhere (the core's passive listener is not in its Python
API). The front keeps :class:`~otel_dra.serve.listener.IdleFirstCap`: past the cap, the connection
idle the longest is closed to make room, so a newcomer always gets in while any connection is idle.

What makes a connection idle: it has no request open. The front reads the 9-byte HTTP/2 frame headers
(RFC 9113 section 4.1) in both directions, never their payloads: a client's ``HEADERS`` opens a
request, the server's ``HEADERS`` with ``END_STREAM`` (gRPC's trailers) or either side's
``RST_STREAM`` ends it. A connection that sent only the HTTP/2 preface, or nothing, is idle from its
arrival. Reading frame headers needs the plain bytes, so the front terminates TLS (with the newest
certificate, ALPN ``h2`` as gRPC clients require) and tells the gRPC handler who the client is
(address, certificate) by the name the Unix socket of its connection was bound to
(:meth:`GrpcFront.peer`, from the handler's ``context.peer()``).

A connection closed to make room gets an HTTP/2 ``GOAWAY`` (``NO_ERROR``) first, where the server's
side is between frames, so a gRPC client knows no request of its was lost and opens a new connection
for the next one. The other bounds stay gRPC's own, on the inner connection: the HTTP/2 preface and
settings within the handshake timeout, a connection idle past the idle timeout closed with a
``GOAWAY``, keepalive pings enforced. The TLS handshake is bounded here (the header timeout).

Each connection costs three file descriptors (the client's, and both ends of its Unix socket).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import os
import secrets
import select
import shutil
import socket
import ssl
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from otel_dra.serve.config import HttpServerConfig
from otel_dra.serve.listener import BACKLOG, IdleFirstCap, LoopThread, listen_socket, per_connection_tls

log = logging.getLogger(__name__)

#: Counters of :meth:`GrpcFront.stats` (``open``: connections open now, beside them). ``bad_requests``: not
#: HTTP/2 (no preface); ``unreachable``: the gRPC server behind could not be reached.
#: ``header_timeouts``: no HTTP/2 preface within the header timeout.
STATS: Final = ("accepted", "evicted", "refused", "header_timeouts", "bad_requests", "unreachable")
#: What a client sends first on an HTTP/2 connection (RFC 9113 section 3.4).
PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x7
_END_STREAM: Final = 0x1
_ACK: Final = 0x1
_NO_ERROR, _REFUSED_STREAM = 0x0, 0x7
_MAX_CONCURRENT_STREAMS: Final = 0x3
#: Bytes a client may send before its first request (preface, SETTINGS, WINDOW_UPDATE, PING: a few
#: dozen from a real client); past it, the connection is not a gRPC client's and is closed.
MAX_BEFORE_REQUEST: Final = 16 << 10
#: Ranks of idle connections in the cap: those that never made a request go first.
_NEVER_ASKED, _ASKED = 0, 1
#: Seconds a new connection has to make its first request before it may be closed to make room: a gRPC
#: client needs one round trip after its TLS handshake (the front says the server's preface at once).
FIRST_REQUEST_GRACE_S: Final = 1.0
#: Seconds between looks for room while the cap is full and no connection may be closed yet.
ROOM_CHECK_S: Final = 0.05
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@dataclass(frozen=True)
class FrontPeer:
    """The client behind a gRPC call: its address as it connected, and its TLS certificate (the dict of
    ``ssl.SSLSocket.getpeercert()``; None without mutual TLS)."""

    address: str
    peercert: dict[str, Any] | None = None


UNKNOWN_PEER: Final = FrontPeer("?")


class FrameHeads:
    """The frame headers of one direction of an HTTP/2 connection, fed its bytes in any pieces;
    payloads are skipped, not read. ``skip``: bytes to pass over first (the client's preface)."""

    def __init__(self, skip: int = 0) -> None:
        self._skip = skip

    @property
    def between_frames(self) -> bool:
        """Whether the whole bytes so far end at a frame boundary (a frame may be written in here)."""
        return self._skip == 0

    def feed(self, data: bytes) -> tuple[list[tuple[int, int, int, int]], int]:
        """(offset, type, flags, stream) of each frame header whole in ``data``, and how many bytes of
        ``data`` are whole: a header cut at its end is not, and is to be fed again with what follows."""
        heads = []
        pos, end = 0, len(data)
        while pos < end:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                continue
            if end - pos < 9:
                break
            self._skip = int.from_bytes(data[pos : pos + 3], "big")
            stream = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            heads.append((pos, data[pos + 3], data[pos + 4], stream))
            pos += 9
        return heads, pos


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame (RFC 9113 section 4.1)."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def goaway(last_stream: int, message: bytes, code: int = _NO_ERROR) -> bytes:
    """An HTTP/2 ``GOAWAY`` frame: streams after ``last_stream`` were not processed (gRPC clients retry them)."""
    return frame(_GOAWAY, 0, 0, last_stream.to_bytes(4, "big") + code.to_bytes(4, "big") + message)


class _Client(asyncio.Protocol):
    """One client connection, and (from its first request) the Unix-socket connection to the gRPC
    server it is piped to.

    The front says the server's connection preface itself (a SETTINGS frame) as soon as the client
    is in, so a gRPC client, which waits for it, sends its first request one round trip after
    connecting; the gRPC server is connected only then. A client that never asks costs one file
    descriptor and no work of gRPC's. The server's own SETTINGS follow through the pipe, as a later
    SETTINGS frame (which HTTP/2 allows at any time); the client's acknowledgement of the front's
    SETTINGS is the one frame the front takes out of the stream, since the server never sent them.
    """

    def __init__(self, front: GrpcFront) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.inner: asyncio.Transport | None = None
        self.name = ""
        self.up = FrameHeads(skip=len(PREFACE))
        self.down = FrameHeads()
        self.waiting = b""  # the client's bytes before its first request, kept until the server is connected
        self.cut = b""  # a frame header cut across reads, looked at with the next
        self.down_cut = b""  # the same, from the server
        self.acked = False  # the client's acknowledgement of the front's SETTINGS taken out
        self.open: set[int] = set()  # streams with a request not yet answered
        self.last_stream = 0
        self.closed = False
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- the client's side ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.front.arrived(self):
            transport.write(self.front.server_preface)
            self._timer = asyncio.get_running_loop().call_later(self.front.config.header_timeout_s, self._preface_late)

    def _preface_late(self) -> None:
        """The header timeout from arrival: a client that has not sent the HTTP/2 preface is closed; one
        that has gets the rest of the idle timeout to make its first request."""
        self._timer = None
        if self._task is not None or self.closed:
            return
        if len(self.waiting) < len(PREFACE):
            self.front.count("header_timeouts")
            self.close()
            return
        rest = max(0.0, self.front.config.idle_timeout_s - self.front.config.header_timeout_s)
        self._timer = asyncio.get_running_loop().call_later(rest, self._never_asked)

    def _never_asked(self) -> None:
        self._timer = None
        if self._task is None:
            self.close(b"no request within the idle timeout")

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self.cut:
            data = self.cut + data
        heads, whole = self.up.feed(data)
        self.cut = data[whole:] if whole < len(data) else b""
        if whole < len(data):
            data = data[:whole]
        for offset, kind, flags, _ in reversed(heads):  # from the end: a cut leaves earlier offsets valid
            if kind == _SETTINGS and flags & _ACK and not self.acked:
                self.acked = True
                data = data[:offset] + data[offset + 9 :]
        for _, kind, _flags, stream in heads:
            if kind == _HEADERS and stream > self.last_stream:
                self.last_stream = stream
                self.open.add(stream)
                self.front.cap.busy(self)
            elif kind == _RST_STREAM:
                self._ended(stream)
        if self.inner is not None:
            self.inner.write(data)
            return
        self.waiting += data
        if self._task is None:
            self._before_first_request()

    def _before_first_request(self) -> None:
        """Keep the client's bytes until it asks for something; then connect the gRPC server for it."""
        if self.waiting[: len(PREFACE)] != PREFACE[: len(self.waiting)]:
            self.front.count("bad_requests")
            self.close(b"not an HTTP/2 connection preface")
            return
        if not self.open:
            if len(self.waiting) > MAX_BEFORE_REQUEST:
                self.front.count("bad_requests")
                self.close(b"too much before the first request")
            return
        assert self.transport is not None
        self.transport.pause_reading()  # until the gRPC server's side is connected
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.front.take_server(self):  # every connection to the server is busy: wait in line
            wait_s = self.front.config.header_timeout_s
            self._timer = asyncio.get_running_loop().call_later(wait_s, self._server_late)

    def got_server(self) -> None:
        """The front has a connection to the gRPC server for this one: make it."""
        if self._timer is not None:  # gRPC's own timeouts take over
            self._timer.cancel()
            self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._connect())

    def _server_late(self) -> None:
        self._timer = None
        if self._task is None:
            self.front.count("refused")
            self.close(b"the server is busy; retry", _REFUSED_STREAM)

    async def _connect(self) -> None:
        front = self.front
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            self.name = front.new_name()
            sock.bind(b"\0" + self.name.encode())
            front.register(self)
            await asyncio.get_running_loop().sock_connect(sock, front.inner_path)
            inner, _ = await asyncio.get_running_loop().create_unix_connection(lambda: _Server(self), sock=sock)
        except OSError as exc:
            sock.close()
            front.unreachable(exc)
            self.close()
            return
        except BaseException:  # cancelled: the client left first
            sock.close()
            raise
        self.inner = inner
        if self.closed:
            inner.close()
            return
        inner.write(self.waiting)
        self.waiting = b""
        if self.transport is not None:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front.forget(self)
        if self.inner is not None:
            self.inner.close()
        elif self._task is not None:
            self._task.cancel()

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_reading()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_reading()

    # -- the gRPC server's side -------------------------------------------------------------
    def from_server(self, data: bytes) -> None:
        if self.transport is None or self.closed:
            return
        self.transport.write(data)  # (every byte goes on at once: a cut header is only looked at with the next)
        if self.down_cut:
            data = self.down_cut + data
        heads, whole = self.down.feed(data)
        self.down_cut = data[whole:] if whole < len(data) else b""
        for _, kind, flags, stream in heads:
            if (kind in (_HEADERS, _DATA) and flags & _END_STREAM) or kind == _RST_STREAM:
                self._ended(stream)

    def server_closed(self) -> None:
        self.inner = None
        self.close()

    def _ended(self, stream: int) -> None:
        if stream in self.open:
            self.open.discard(stream)
            if not self.open:
                self.front.cap.idle(self, _ASKED)
                self.front.serve_waiting()

    # -- closing ------------------------------------------------------------------------------
    def close(self, why: bytes = b"", code: int = _NO_ERROR) -> None:
        """Close both sides; with ``why``, say ``GOAWAY`` first where the server's side is between frames."""
        if self.closed:
            return
        self.closed = True
        self.front.release(self)
        if self._timer is not None:
            self._timer.cancel()
        if self.transport is not None:
            if why and self.down.between_frames and not self.down_cut:
                self.transport.write(goaway(self.last_stream if self.inner else 0, why, code))
            self.transport.close()
        if self.inner is not None:
            self.inner.close()


class _Server(asyncio.Protocol):
    """The Unix-socket side of one client connection: what the gRPC server says goes to the client."""

    def __init__(self, client: _Client) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.from_server(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.server_closed()

    def pause_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client.transport is not None and not self.client.closed:
            self.client.transport.resume_reading()


def _evict(conn: _Client) -> None:
    conn.close(b"idle connection closed to make room for a new one")


def _limits(config: HttpServerConfig) -> tuple[int, int]:
    """(connections piped to the gRPC server, connections in all) for ``config``: its ``max_connections``
    for both, or a share of the fd limit's quarter (what ``connections()`` gives): a piped connection
    takes three descriptors, the rest one, so a quarter of the budget is piped and the rest not."""
    budget = config.connections()
    if config.max_connections is not None:
        return budget, budget
    servers = max(4, budget // 4)
    return servers, max(servers, budget - 2 * servers)


class GrpcFront:
    """The public gRPC port: ``host:port`` (TCP, TLS when ``tls`` gives contexts), each connection piped
    to :attr:`inner_address`, where the gRPC server is to listen. ``config``: the cap and the TLS
    handshake timeout (:class:`~otel_dra.serve.config.HttpServerConfig`, shared with the HTTP side;
    the automatic cap counts the three descriptors a piped connection takes). ``max_streams``: requests at once
    on one connection, as the front's preface announces it (the server's own setting must match).
    ``max_piped``: connections piped to the server at most, when not the config's share. The port is bound
    when this is built."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        config: HttpServerConfig | None = None,
        *,
        tls: Callable[[], ssl.SSLContext] | None = None,
        max_streams: int = 100,
        max_piped: int | None = None,
    ) -> None:
        self.name = name
        self.config = config or HttpServerConfig()
        self._tls = tls
        self._sock = listen_socket(name, host, port)
        self._poll = select.poll()  # whether a connection waits to be accepted
        self._poll.register(self._sock, select.POLLIN)
        self._dir = tempfile.mkdtemp(prefix="otel-dra-grpc-")  # 0700: no other user reaches the server
        self.inner_path = os.path.join(self._dir, "grpc.sock")
        self._counts = dict.fromkeys(STATS, 0)
        self.max_servers, limit = _limits(self.config)
        if max_piped is not None:
            self.max_servers = max_piped
        grace = (FIRST_REQUEST_GRACE_S, 0.0)  # by rank: never asked, asked
        self.cap: IdleFirstCap[_Client] = IdleFirstCap(limit, _evict, self._counts, grace)
        self._servers: set[_Client] = set()  # connections piped to the gRPC server
        self._waiting: deque[_Client] = deque()  # connections that asked, waiting for one
        streams = _MAX_CONCURRENT_STREAMS.to_bytes(2, "big") + max_streams.to_bytes(4, "big")
        self.server_preface = frame(_SETTINGS, 0, 0, streams)  # what the front says first, for the server
        self._peers: dict[str, _Client] = {}  # by the peer string gRPC gives its handler
        self._tag = f"otel-dra-{os.getpid()}-{secrets.token_hex(4)}"
        self._serial = itertools.count(1)
        self._thread = LoopThread(name)
        self._context: ssl.SSLContext | None = None
        self._clients: set[_Client] = set()
        self._admitting: set[asyncio.Task[None]] = set()  # accepted, not yet connections (in their TLS handshake)
        self._paused: asyncio.TimerHandle | None = None  # not accepting, until then
        self._unreachable_told = False

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def inner_address(self) -> str:
        """Where the gRPC server listens, in gRPC's words (``add_insecure_port``)."""
        return f"unix:{self.inner_path}"

    @property
    def max_connections(self) -> int:
        return self.cap.limit

    def stats(self) -> dict[str, int]:
        """Counters so far (:data:`STATS`), ``open``, the connections open now, ``piped``, those of them
        piped to the gRPC server, and ``busy``, those with a request open."""
        busy = sum(1 for conn in list(self._clients) if conn.open)
        return {**self._counts, "open": len(self.cap), "piped": len(self._servers), "busy": busy}

    def peer(self, grpc_peer: str) -> FrontPeer:
        """The client of a gRPC call, from its ``context.peer()`` (``unix-abstract:<name>``)."""
        conn = self._peers.get(grpc_peer.removeprefix("unix-abstract:"))
        if conn is None or conn.transport is None:
            return UNKNOWN_PEER
        address = conn.transport.get_extra_info("peername")
        where = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else "?"
        cert = conn.transport.get_extra_info("peercert")
        return FrontPeer(where, cert or None)

    # -- for the connections ------------------------------------------------------------------
    def new_name(self) -> str:
        return f"{self._tag}-{next(self._serial)}"

    def count(self, what: str) -> None:
        self._counts[what] += 1

    def take_server(self, conn: _Client) -> bool:
        """A connection to the gRPC server for ``conn`` (:meth:`_Client.got_server`), now if there is one or
        an idle connection gives its own up, else when one is free (False: ``conn`` waits in line)."""
        if self._waiting or not self._free_server(conn):
            self._waiting.append(conn)
            return False
        self._servers.add(conn)
        conn.got_server()
        return True

    def _free_server(self, spare: _Client | None = None) -> bool:
        return len(self._servers) < self.max_servers or self.cap.make_room(lowest_rank=_ASKED, spare=spare)

    def serve_waiting(self) -> None:
        """Give the connections waiting for the gRPC server what has come free, in the order they asked."""
        while self._waiting:
            conn = self._waiting[0]
            if conn.closed:
                self._waiting.popleft()
                continue
            if not self._free_server(conn):
                return
            self._waiting.popleft()
            self._servers.add(conn)
            conn.got_server()

    def register(self, conn: _Client) -> None:
        self._peers[conn.name] = conn

    def release(self, conn: _Client) -> None:
        """``conn`` closes: its connection to the gRPC server is free again."""
        if conn in self._servers:
            self._servers.discard(conn)
            asyncio.get_running_loop().call_soon(self.serve_waiting)  # (not now: this may be inside make_room)

    def arrived(self, conn: _Client) -> bool:
        self._clients.add(conn)
        return self.cap.arrived(conn)

    def forget(self, conn: _Client) -> None:
        self.cap.gone(conn)
        self._clients.discard(conn)
        self.release(conn)
        self._peers.pop(conn.name, None)
        self._resume()  # room now, maybe

    def unreachable(self, exc: OSError) -> None:
        self._counts["unreachable"] += 1
        if not self._unreachable_told:  # the gRPC server is gone or swamped: say it once
            self._unreachable_told = True
            log.warning("%s: cannot reach the gRPC server behind the port (%s); closing the client", self.name, exc)

    # -- accepting ----------------------------------------------------------------------------
    def _accept(self) -> None:
        """Take the connections waiting in the kernel while there is room (or a connection to close for
        one); with none, stop taking them for a moment: they wait in the kernel's backlog, in order,
        rather than close each other before any could make a request."""
        loop = asyncio.get_running_loop()
        for _ in range(BACKLOG):
            full = len(self.cap) + len(self._admitting) >= self.cap.limit
            if full and not self._poll.poll(0):  # nobody waiting: nobody to close a connection for
                return
            if full and not self.cap.make_room():
                self._pause(ROOM_CHECK_S)
                return
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors (or buffers): serve the connections there are
                if exc.errno in _OUT_OF_RESOURCES:
                    log.warning("%s: cannot accept a connection: %s; trying again in 1 s", self.name, exc)
                    self._pause(1.0)
                    return
                raise
            sock.setblocking(False)
            task = loop.create_task(self._admit(sock))
            self._admitting.add(task)
            task.add_done_callback(self._admitting.discard)

    async def _admit(self, sock: socket.socket) -> None:
        """Make the connection (after its TLS handshake, within the header timeout)."""
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: _Client(self),
                sock,
                ssl=self._context,
                ssl_handshake_timeout=self.config.header_timeout_s if self._context is not None else None,
            )
        except (TimeoutError, OSError, ssl.SSLError) as exc:  # a failed or timed-out TLS handshake
            log.debug("%s: a connection did not complete its TLS handshake: %s", self.name, exc)
            sock.close()

    def _pause(self, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        if self._paused is None:
            loop.remove_reader(self._sock.fileno())
            self._paused = loop.call_later(delay_s, self._resume)

    def _resume(self) -> None:
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
            if self._sock.fileno() >= 0:
                asyncio.get_running_loop().add_reader(self._sock.fileno(), self._accept)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start(self._listen)

    async def _listen(self) -> None:
        self._context = per_connection_tls(self._tls) if self._tls is not None else None
        asyncio.get_running_loop().add_reader(self._sock.fileno(), self._accept)

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop listening and close every connection (the gRPC server has had its grace by now)."""

        async def closing() -> None:
            if self._paused is not None:
                self._paused.cancel()
            else:
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            for conn in list(self._clients):
                conn.close()

        self._thread.stop(closing, timeout_s)
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)
