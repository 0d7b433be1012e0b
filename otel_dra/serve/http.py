"""One bounded HTTP/1.1 server for the OTLP/HTTP receiver and the ``/metrics`` endpoint.

The protocol is aiohttp's: its llhttp parser handles the request line, headers, ``Content-Length``,
chunked bodies, and refuses a request that has both ``Content-Length`` and ``Transfer-Encoding``
(request smuggling) with 400. What this module adds is what a server facing a whole network needs
and aiohttp leaves to the application, after Go's ``net/http`` (which the Collector uses) and nginx:

- **asyncio, not a thread per connection**: a held connection costs a file descriptor and a few
  kB, nothing else. Work that takes CPU (decoding a request, rendering a page) goes to a small
  worker pool (:meth:`HttpServer.offload`), so the event loop keeps accepting and timing out.
- **a connection cap** (:class:`~otel_dra.serve.config.HttpServerConfig`): past it, the connection
  idle the longest is closed to make room (nginx's reuse of keep-alive connections), so one client
  holding connections cannot lock the others out; with none idle, the newcomer is closed.
- **a header timeout** from a connection's arrival, or from the first byte of its next request,
  to complete headers (slowloris); **an idle timeout** between requests; **a body timeout** and a
  size cap in :func:`read_body`; header line and count limits in the parser.
- **no spin at the fd limit**: asyncio stops accepting for a second when ``accept()`` fails with
  EMFILE, and keeps serving the connections it has; the log line about it is rate-limited.
- **a quick lane** for the request a fleet gets thousands of a second, an agent's push on a kept connection:
  parsed by the same parser, with the same limits, it is answered where its bytes arrive (``quick``, see
  :meth:`_Connection._quick`) when the connection has no other request open; anything else, or anything
  ``quick`` declines, goes aiohttp's way, in order.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final, TypeVar

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from otel_dra.inflate import InflateError, inflate, one_member, reader
from otel_dra.serve.config import HttpServerConfig
from otel_dra.serve.listener import BACKLOG, IdleFirstCap, LoopThread, listen_socket, per_connection_tls

log = logging.getLogger(__name__)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
#: A request answered where it arrived (:class:`_Connection`): given the parsed head, the whole body and the
#: connection's transport, the answer's bytes (:func:`answer`), or None to leave it to ``Handler``.
Quick = Callable[[RawRequestMessage, bytes, asyncio.BaseTransport], bytes | None]
T = TypeVar("T")

#: Bytes read from a body at a time.
_CHUNK: Final = 1 << 16
#: Seconds a connection is read (and the bytes dropped) after an answer given before its body was read
#: (413, 408), so that the client sees the answer rather than a reset; then it is closed.
LINGER_S: Final = 2.0
#: Counters of :meth:`HttpServer.stats`. ``bad_requests``: refused by the parser (malformed request line or
#: headers, headers too long, Content-Length with Transfer-Encoding), answered 400 by aiohttp.
STATS: Final = ("accepted", "evicted", "refused", "header_timeouts", "bad_requests")
#: The ``Server`` header of every answer (not aiohttp's, with its version).
SERVER: Final = "otel-dra"


class BodyError(Exception):
    """A request body that can't be taken: ``status`` is the HTTP answer (413, 408, 400, 411, 501)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


#: aiohttp's ``read_bufsize`` (its default is 64 kB): a body's reader stops the socket past twice this, so a request
#: held for its body (:meth:`_Connection._quick`) may be this large. An agent's push of 8 GPUs is ~150 kB.
READ_BUFSIZE: Final = 256 << 10
#: Bytes of a request's head looked at for where it ends (the parser refuses heads longer than this anyway).
MAX_WATCHED_HEAD: Final = 64 << 10


def _chunked(head: bytes) -> bool:
    """Whether a request head (its request line and header lines) says its body is chunked."""
    if b"chunked" not in head.lower():  # (the usual: one look, not a split and a loop over the lines)
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            return True
    return False


class ChunkSizes:
    """The chunk-size lines of a chunked body (RFC 9112 section 7.1), fed its bytes in any pieces; the
    data between them is skipped, not read. :meth:`feed` returns the first size past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.done = False  # the last chunk (size 0) was seen: trailers follow, nothing more to look at
        self._skip = 0  # data bytes (and their CRLF) still to pass
        self._line = b""  # a chunk-size line cut across pieces

    def feed(self, data: bytes) -> int | None:
        pos, end = 0, len(data)
        while pos < end and not self.done:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                continue
            eol = data.find(b"\n", pos)
            if eol < 0:
                self._line = (self._line + data[pos:])[-256:]  # (a longer line is the parser's to refuse)
                return None
            line, self._line = self._line + data[pos:eol], b""
            pos = eol + 1
            digits = line.split(b";", 1)[0].strip()
            try:
                size = int(digits, 16)
            except ValueError:
                self.done = True  # not a size: the parser answers 400
                return None
            if size > self.limit:
                return size
            if size == 0:
                self.done = True
            self._skip = size + 2
        return None


async def read_body(request: web.BaseRequest, limit: int, timeout_s: float) -> bytes:
    """The request's body, at most ``limit`` bytes, all of it within ``timeout_s``. A declared length
    over the limit is refused before a byte of it is read (and before ``Expect: 100-continue`` is
    answered, so the client need not send it); a chunked body is refused at the first byte past it.
    Raises :class:`BodyError`."""
    length = request.content_length
    if length is not None and length > limit:
        raise BodyError(413, f"{length:,}")
    coding = ",".join(request.headers.getall("Transfer-Encoding", []))
    if coding and [c.strip().lower() for c in coding.split(",")] != ["chunked"]:
        # Go's net/http answers any transfer coding but chunked alone so (RFC 9112 6.1: 501): a body whose
        # transfer coding we do not undo would be read as if it had none.
        raise BodyError(501, f"unsupported transfer encoding {coding!r}: send chunked, or Content-Length")
    if length is None and not coding:
        if request.method in ("POST", "PUT", "PATCH"):
            raise BodyError(411, "Content-Length required")
        return b""
    if request.headers.get("Expect", "").lower() == "100-continue":  # curl asks before a body over 1 MB
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    parts: list[bytes] = []
    size = 0
    content = request.content
    try:
        if content.is_eof():  # all of it came with the head (a push on a fast link): no timer to arm and cancel
            parts.append(content.read_nowait())
            size = len(parts[0])
        else:
            async with asyncio.timeout(timeout_s):
                while chunk := await content.readany():
                    size += len(chunk)
                    if size > limit:
                        break
                    parts.append(chunk)
        if size > limit:
            raise BodyError(413, f"more than {limit:,}")
    except TimeoutError:
        raise BodyError(408, f"the body did not arrive within {timeout_s:g} s") from None
    except (ConnectionError, RequestPayloadError) as exc:  # the client went away mid-body, or sent a bad chunk
        raise BodyError(400, f"the body could not be read: {exc}") from None
    if length is not None and size < length:
        raise BodyError(400, f"the body ended after {size:,} of {length:,} bytes")
    return b"".join(parts)


#: Most gzip members one body may hold: an exporter sends one; many tiny ones are work without data.
MAX_GZIP_MEMBERS = 1024
#: Most CPU seconds inflating one body may take, whatever its size (a backstop: inflation is linear).
MAX_GZIP_CPU_S = 2.0
#: Most bytes a body's inflation makes at a time. zlib-ng sizes its output buffer by this bound: a megabyte was
#: mapped and faulted in afresh on every call (glibc maps allocations that large), a collector's batch of 22
#: nodes inflating 5x slower than in 256 kB pieces (measured in fresh processes: 4.4 ms against 0.8 ms).
_BODY_PIECE: Final = 256 << 10


def gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body (one or more members), refusing to inflate past ``limit`` bytes (a gzip bomb is
    refused after ``limit`` bytes of work, however small it was on the wire), past ``MAX_GZIP_MEMBERS``
    members or past ``MAX_GZIP_CPU_S`` of CPU. Raises :class:`BodyError`: 413 past a limit, 400 for bytes
    that are not gzip."""
    started = time.thread_time()

    def cpu() -> None:
        if time.thread_time() - started > MAX_GZIP_CPU_S:
            raise BodyError(413, f"took more than {MAX_GZIP_CPU_S:g}s of CPU to inflate")

    def member(n: int) -> None:
        if n > MAX_GZIP_MEMBERS:
            raise BodyError(413, f"more than {MAX_GZIP_MEMBERS:,} gzip members")
        cpu()

    whole = one_member(body, limit)  # (the usual: one member, inflated at once)
    if whole is not None:
        cpu()
        return whole
    out: list[bytes] = []
    size = 0
    try:
        for piece in inflate(reader(body), min(_BODY_PIECE, limit + 1), member):
            size += len(piece)
            if size > limit:
                raise BodyError(413, f"more than {limit:,} (inflated)")
            out.append(piece)
            cpu()
    except EOFError:
        raise BodyError(400, "body is not valid gzip: truncated") from None
    except InflateError as exc:
        raise BodyError(400, f"body is not valid gzip: {exc}") from None
    return b"".join(out)


class Answer(web.StreamResponse):
    """A 200 whose bytes, head and body, are written as they were given (:func:`ok`).

    Why: an agent's push is answered 200 with an empty body, the same bytes every time but the date, and
    aiohttp's ``Response`` builds them afresh for each (its header multidict, Content-Type and
    Content-Length set, the date formatted, the head serialized): ~35 us a request on a 2 GHz core, and the
    fleet's direct pushes took 9% less CPU without it (BENCHMARKS.md's notes on #32). Its ``headers`` are not
    what was sent (the server's ``Server`` default lands there unused): the bytes are.
    """

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._data = data
        self._keep_alive = True

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if not self._eof_sent:
            self._eof_sent = True
            self._body_length = len(self._data)
            await request.writer.write_eof(self._data)
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        """Written whole by :meth:`prepare`."""


#: Per status and content type: the second its head was made in, and the head (up to Content-Length's value).
_HEADS: dict[tuple[int, str], tuple[int, bytes]] = {}


def answer(status: int, content_type: str, body: bytes) -> bytes:
    """A whole keep-alive HTTP/1.1 answer, head and body, from a head made once a second per status and
    content type (the date is the only thing in it that changes)."""
    now = int(time.time())
    made, head = _HEADS.get((status, content_type), (-1, b""))
    if made != now:
        date = formatdate(now, usegmt=True)
        phrase = HTTPStatus(status).phrase
        head = (
            f"HTTP/1.1 {status} {phrase}\r\nContent-Type: {content_type}\r\nDate: {date}\r\nServer: {SERVER}\r\n"
        ).encode()
        _HEADS[(status, content_type)] = (now, head)  # (one tuple replaced: safe across the servers' loop threads)
    return b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)


def ok(request: web.BaseRequest, content_type: str, body: bytes) -> web.StreamResponse:
    """``200 OK`` with ``body``: an :class:`Answer` (:func:`answer`) for a keep-alive HTTP/1.1 request (the
    usual), aiohttp's ``Response`` otherwise (it says ``Connection: close`` when it closes)."""
    if not request.keep_alive or request.version != HttpVersion11:
        return web.Response(body=body, content_type=content_type)
    return Answer(answer(200, content_type, body))


class _Connection(RequestHandler):
    """aiohttp's connection, with the header timeout: armed when the connection arrives and at the
    first byte after a response, disarmed when a request's headers are complete."""

    def __init__(self, manager: _Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.owner = manager
        self.busy = False
        self.header_timer: asyncio.TimerHandle | None = None
        # The chunk sizes of a chunked body, looked at as the bytes arrive (llhttp keeps them to itself), so
        # that a chunk declared past the body limit is refused at once rather than waited for.
        self._head = bytearray()  # the next request's bytes, until its headers end
        self._asked = False  # its headers ended; nothing to look at until it is answered
        self._chunks: ChunkSizes | None = None
        self.body: StreamReader | None = None  # the request's body, once its handler runs
        self.refused_body: BodyError | None = None
        self._held: object | None = None  # a request kept from aiohttp's loop until its body is whole

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.arm()
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.busy and self.header_timer is None:
            self.arm()
        if self.owner.max_body_bytes is not None and self.refused_body is None:
            self._watch(data)
        waiter, held = self._waiter, self._held
        if held is not None and not (self._messages and self._messages[0] is held):
            held = self._held = None  # (aiohttp's loop, starting late, took it)
        idle = (
            held is None
            and not self._messages
            and (self._request_count == 0 or (waiter is not None and not waiter.done()))
        )
        if self.owner.quick is None or not (idle or held):
            super().data_received(data)  # a request in flight (its answer not yet written), or none taken quick
            return
        # Idle (aiohttp's loop waits for a request, or has not started and none came), or a request held for the
        # rest of its body: parse with aiohttp's parser, its limits and refusals, but keep the loop asleep until
        # it is known whether the request is one answered here.
        self._waiter = None
        try:
            super().data_received(data)
        finally:
            self._waiter = waiter
        if not self._messages:
            return
        if len(self._messages) == 1:
            taken = self._quick()
            if taken is not False:
                self._held = self._messages[0] if taken is None else None
                return
        self._hand_over()

    def _hand_over(self) -> None:
        """The requests parsed go aiohttp's way: wake its loop."""
        self._held = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _quick(self) -> bool | None:
        """Answer the one request parsed, here and now (True), when it is keep-alive HTTP/1.1 with a
        ``Content-Length``, its body is whole, and the server's ``quick`` takes it; None: hold it for the rest
        of a small body (a client may send the head and the body apart, as Python's ``http.client`` does); False:
        aiohttp's way. Why: aiohttp's way (a request object, a task, a response and its writer) took more CPU
        than decoding a node's push (the profile in BENCHMARKS.md's notes on #32). What its loop does after an
        answer is done here: the parser's slot freed, the idle timeout restarted, the connection idle again for
        the cap."""
        message, payload = self._messages[0]
        if (
            not isinstance(message, RawRequestMessage)  # (a parser refusal: aiohttp answers it)
            or message.should_close
            or message.version != HttpVersion11
            or message.chunked
            or message.upgrade
            or "Expect" in message.headers
            or self.transport is None
        ):
            return False
        if not payload.is_eof():
            # Held while its body fits the reader's buffer (past it, the reader stops the socket: only aiohttp's
            # loop reading it would start it again) and the body limit (past it, aiohttp's way refuses it before
            # it is sent), and at most until the header timeout (_headers_late).
            limit = min(READ_BUFSIZE, self.owner.max_body_bytes or READ_BUFSIZE)
            return None if int(message.headers.get("Content-Length", "0")) <= limit else False
        quick = self.owner.quick
        assert quick is not None
        self._held = None  # (reading the body calls data_received again, through aiohttp's resume_reading)
        body = payload.read_nowait()
        reply = quick(message, body, self.transport)
        if reply is None:  # (its body, read, goes back to aiohttp's way in a reader of its own)
            again = StreamReader(self, READ_BUFSIZE, loop=self._loop)
            again.feed_data(body)
            again.feed_eof()
            self._messages[0] = (message, again)
            return False
        self._messages.popleft()
        if self._parser is not None:
            self._parser.message_consumed()  # (frees the parser's slot for a pipelined request)
        self.owner.requests_count += 1
        # The next request's head is timed from its next byte (a head begun in this request's last piece and
        # left unfinished is closed at the idle timeout).
        self.disarm()
        self.answered()
        self.owner.cap.idle(self)
        self.transport.write(reply)
        self._keepalive = True
        self._next_keepalive_close_time = close_time = self._loop.time() + self._keepalive_timeout
        if self._keepalive_handle is None:
            self._keepalive_handle = self._loop.call_at(close_time, self._process_keepalive)
        return True

    def _watch(self, data: bytes) -> None:
        """Find where the next request's headers end and, when its body is chunked, follow its chunk sizes."""
        if self._chunks is None:
            if self._asked:
                return
            if self._head:  # (a head that came in pieces: rare; else the chunk is looked at where it is)
                self._head += data
                data = bytes(self._head)
                self._head.clear()
            end = data.find(b"\r\n\r\n", 0, MAX_WATCHED_HEAD + 4)
            if end < 0:
                if len(data) > MAX_WATCHED_HEAD:
                    self._asked = True  # the parser refuses headers this long; nothing to look at
                else:
                    self._head += data
                return
            self._asked = True
            if not _chunked(data[:end]):
                return  # (the body's bytes are not looked at, nor copied)
            data = data[end + 4 :]
            assert self.owner.max_body_bytes is not None
            self._chunks = ChunkSizes(self.owner.max_body_bytes)
        too_large = self._chunks.feed(data)
        if too_large is not None:
            self.refused_body = BodyError(413, f"a chunk of {too_large:,}")
            if self.body is not None:
                self.body.set_exception(self.refused_body)
        elif self._chunks.done:
            self._chunks = None

    def answered(self) -> None:
        """The request was answered: the next bytes start the next one."""
        self.busy = False
        self._asked = False
        self._chunks = None
        self.body = None
        self.refused_body = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.disarm()
        super().connection_lost(exc)

    def remote_address(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return str(peer[0]) if peer else "?"

    def arm(self) -> None:
        self.header_timer = self._loop.call_later(self.owner.config.header_timeout_s, self._headers_late)

    def disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_late(self) -> None:
        self.header_timer = None
        if self._held is not None:  # its body is late: aiohttp's way reads the rest, or answers 408
            self._hand_over()
        elif not self.busy:
            self.owner.count("header_timeouts")
            self.force_close()

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """aiohttp's report of a request it could not take, as one line: a parser refusal (the
        client's fault, answered 400) is counted and logged without a traceback (a flood of them is
        summarised by the log's limiter)."""
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self.owner.count("bad_requests")
            first = str(exc.message).strip().splitlines()[0] if exc.message else type(exc).__name__
            log.warning("refused a malformed request from %s: %s", self.remote_address(), first)
            return
        log.warning("a request failed: %s", exc if isinstance(exc, BaseException) else args[0] if args else "?")


class _Server(web.Server):
    """aiohttp's low-level server, holding the connection cap (:class:`IdleFirstCap`)."""

    def __init__(
        self,
        handler: Handler,
        config: HttpServerConfig,
        counts: dict[str, int],
        max_body_bytes: int | None = None,
        quick: Quick | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(self._handle, **kwargs)
        self.config = config
        self.max_body_bytes = max_body_bytes
        self.quick = quick
        self._user_handler = handler
        self._counts = counts
        self.cap: IdleFirstCap[RequestHandler] = IdleFirstCap(config.connections(), _force_close, counts)

    def count(self, what: str) -> None:
        self._counts[what] += 1

    def __call__(self) -> RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.cap.arrived(handler)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.cap.gone(handler)
        super().connection_lost(handler, exc)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        conn = request.protocol
        if isinstance(conn, _Connection):
            conn.busy = True
            conn.disarm()
            conn.body = request.content
            if conn.refused_body is not None:  # refused before the handler ran
                request.content.set_exception(conn.refused_body)
        self.cap.busy(conn)
        try:
            response = await self._user_handler(request)
            response.headers.setdefault("Server", SERVER)
            return response
        finally:
            if isinstance(conn, _Connection):
                conn.answered()
            if conn.transport is not None:
                self.cap.idle(conn)


def _force_close(handler: RequestHandler) -> None:
    handler.force_close()


class HttpServer:
    """One listening socket served by an asyncio loop on its own thread; ``handler`` answers each
    request (aiohttp's request and response types). The socket is bound when this is built, so a
    port in use fails before anything starts (:class:`~otel_dra.serve.config.ListenError`, naming the port).

    ``tls``: called for each new connection's context (the newest certificate; see
    :mod:`otel_dra.receivers.tls`). ``workers``: threads for :meth:`offload`. ``max_body_bytes``: the body
    limit its handler reads with (:func:`read_body`); given, a chunk declared past it is refused (413) as
    soon as its size arrives. ``quick``: answers the requests it takes where they arrive, on the event loop,
    without aiohttp's request and response objects (:meth:`_Connection._quick` says which it is offered);
    ``handler`` answers the rest.
    """

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        handler: Handler,
        config: HttpServerConfig | None = None,
        *,
        tls: Callable[[], ssl.SSLContext] | None = None,
        workers: int = 1,
        max_body_bytes: int | None = None,
        quick: Quick | None = None,
    ) -> None:
        self.name = name
        self._quick = quick
        self.config = config or HttpServerConfig()
        self._handler = handler
        self._tls = tls
        self._max_body_bytes = max_body_bytes
        self._sock = listen_socket(name, host, port)
        self.host = host
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{name.replace(' ', '-')}-work")
        self._thread = LoopThread(name)
        self._server: _Server | None = None
        self._listener: asyncio.base_events.Server | None = None
        self._counts = dict.fromkeys(STATS, 0)
        self.max_connections = self.config.connections()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def stats(self) -> dict[str, int]:
        """Counters so far (:data:`STATS`) and ``open``, the connections open now."""
        server = self._server
        return {**self._counts, "open": len(server.connections) if server is not None else 0}

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the worker pool: CPU work must not stall the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start(self._listen)

    async def _listen(self) -> None:
        cfg = self.config
        self._server = _Server(
            self._handler,
            cfg,
            self._counts,
            self._max_body_bytes,
            self._quick,
            keepalive_timeout=cfg.idle_timeout_s,
            max_line_size=cfg.max_header_line_bytes,
            max_field_size=cfg.max_header_line_bytes,
            max_headers=cfg.max_headers,
            auto_decompress=False,  # bodies are inflated by gunzip(), bounded
            lingering_time=LINGER_S,
            read_bufsize=READ_BUFSIZE,
            access_log=None,
        )
        context = per_connection_tls(self._tls) if self._tls is not None else None
        self._listener = await asyncio.get_running_loop().create_server(
            self._server,
            sock=self._sock,
            ssl=context,
            ssl_handshake_timeout=cfg.header_timeout_s if context is not None else None,
            backlog=BACKLOG,
        )

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop listening; requests in flight get half of ``timeout_s`` to finish, then every
        connection is closed."""

        async def closing() -> None:
            if self._listener is not None:
                self._listener.close()
            if self._server is not None:
                await self._server.shutdown(timeout_s / 2)

        self._thread.stop(closing, timeout_s)
        self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
