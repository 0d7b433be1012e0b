"""What every server here shares: a socket bound before anything starts, an asyncio loop on its own
thread, the connection cap that closes the connection idle the longest to make room, and a TLS
context asked again for each connection (a renewed certificate).

:class:`~otel_dra.serve.http.HttpServer` (OTLP/HTTP, ``/metrics``) and
:class:`~otel_dra.serve.grpc_front.GrpcFront` (OTLP/gRPC) are both built from these, so both ports
hold the same line against a client that holds connections.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Final, Generic, TypeVar

from otel_dra.serve.config import ListenError

log = logging.getLogger(__name__)

#: Connections waiting in the kernel to be accepted (asyncio's default is 100).
BACKLOG: Final = 512

C = TypeVar("C", bound=Hashable)


def listen_socket(name: str, host: str, port: int) -> socket.socket:
    """A TCP socket bound and listening on ``host:port`` (non-blocking), or :class:`ListenError` naming
    the server and the port: bound when the server is built, so a port in use fails before anything starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ListenError(name, host, port, why, exc.errno) from None
    sock.setblocking(False)
    return sock


def per_connection_tls(provider: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """The context to listen with: the provider's current one, which swaps itself for the provider's
    newest at each handshake, so a renewed certificate reaches new connections without a restart."""
    context = provider()

    def newest(ssl_object: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext) -> None:
        ssl_object.context = provider()

    context.sni_callback = newest
    return context


class IdleFirstCap(Generic[C]):
    """At most ``limit`` connections: a newcomer past it closes the connection idle the longest (nginx's
    reuse of keep-alive connections), so one client holding connections cannot lock the others out;
    with none idle, the newcomer is closed. A connection is idle from its arrival until it starts a
    request, and again from the end of its last one.

    Idle connections have a rank, and the lowest goes first: a server that can tell a connection that
    never made a request (rank 0, as every connection arrives) from one that did (rank 1) closes the
    first kind first, as the gRPC front does; within a rank, the one idle the longest. ``grace_s``: per
    rank, how long a connection must have been idle before it may be closed to make room (a newcomer
    gets the time to make its first request, so that newcomers arriving fast do not close each other
    before any of them could).

    ``close``: how to close a connection (the server's own, graceful where it can be). ``counts``:
    the server's counters, of which this moves ``accepted``, ``evicted`` and ``refused``. Used from
    the server's event loop only.
    """

    def __init__(
        self, limit: int, close: Callable[[C], None], counts: dict[str, int], grace_s: tuple[float, ...] = (0.0,)
    ) -> None:
        self.limit = limit
        self._close = close
        self._counts = counts
        self._grace_s = grace_s
        self._open: set[C] = set()
        self._idle: list[OrderedDict[C, float]] = [OrderedDict() for _ in grace_s]  # each in the order idled

    def __len__(self) -> int:
        return len(self._open)

    def arrived(self, conn: C) -> bool:
        """A new connection: False when it was closed for want of room."""
        self._counts["accepted"] += 1
        self._open.add(conn)
        self._idle[0][conn] = time.monotonic()
        if len(self._open) <= self.limit or self.make_room(spare=conn):
            return True
        # every other connection is busy with a request (or just arrived): the newcomer waits outside
        self._counts["refused"] += 1
        self.gone(conn)
        self._close(conn)
        return False

    def make_room(self, lowest_rank: int = 0, spare: C | None = None) -> bool:
        """Close the idle connection of the lowest rank (from ``lowest_rank`` up) idle the longest, past its
        rank's grace, other than ``spare``; False when there is none."""
        now = time.monotonic()
        for idle, grace_s in zip(self._idle[lowest_rank:], self._grace_s[lowest_rank:], strict=True):
            for victim, since in idle.items():  # (oldest first: past the first, none is older)
                if victim is spare:
                    continue
                if since > now - grace_s:
                    break
                self._counts["evicted"] += 1
                self.gone(victim)
                self._close(victim)
                return True
        return False

    def busy(self, conn: C) -> None:
        """``conn`` started a request: it is not to be closed to make room."""
        for idle in self._idle:
            idle.pop(conn, None)

    def idle(self, conn: C, rank: int = 0) -> None:
        """``conn`` has no request open any more (it goes to the back of its rank's queue)."""
        if conn in self._open:
            self.busy(conn)
            self._idle[rank][conn] = time.monotonic()

    def gone(self, conn: C) -> None:
        """``conn`` closed (by either side)."""
        self._open.discard(conn)
        self.busy(conn)


class LoopThread:
    """An asyncio event loop on a daemon thread of its own, named ``name``: a server's whole life
    (accepting, timing out, answering) runs there, so nothing it does waits on the caller's thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, setup: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start the loop and run ``setup()`` on it (listening, say); its exception is raised here."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name}: already started")
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            loop.set_exception_handler(self._loop_error)
            try:
                loop.run_until_complete(setup())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name=self.name.replace(" ", "-"), daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread = None
            raise failure[0]

    def stop(self, closing: Callable[[], Coroutine[Any, Any, None]], timeout_s: float) -> None:
        """Run ``closing()`` on the loop (half of ``timeout_s`` at most), cancel what is left, and end the
        thread; what would not close in time is closed with the loop."""
        loop, thread = self.loop, self._thread
        self._thread = None
        if loop is None or thread is None:
            return

        async def stop() -> None:
            try:
                await asyncio.wait_for(closing(), timeout_s / 2)
            except TimeoutError:
                log.debug("%s: did not close within %.1f s; closing the rest", self.name, timeout_s / 2)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:  # connections still open (held idle, mid-body): their handlers end here
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout_s / 2 + 1.0)
        except Exception as exc:  # a connection that would not close: the loop's end closes it
            log.debug("%s: shutdown: %s", self.name, exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s / 2 + 1.0)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's complaints (``accept()`` out of file descriptors: it retries in a second) as one line."""
        exc = context.get("exception")
        log.warning("%s: %s%s", self.name, context.get("message", "event loop error"), f": {exc}" if exc else "")
