"""The bounded HTTP server, over real sockets: the connection cap makes room for a newcomer, slow
headers and slow bodies are cut off, a smuggling attempt is refused, bodies are capped before and
after inflation, and the server shuts down with connections still held."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import socket
import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime

import pytest
from aiohttp import web
from aiohttp.http import RawRequestMessage
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra.serve.config import AUTO_MAX_CONNECTIONS, AUTO_MIN_CONNECTIONS, HttpServerConfig
from otel_dra.serve.http import BodyError, ChunkSizes, HttpServer, answer, gunzip, ok, read_body
from tests.support.sockets import exchange

LIMIT = 1000


async def echo(request: web.BaseRequest) -> web.Response:
    try:
        body = await read_body(request, LIMIT, 1.0)
    except BodyError as exc:
        reply = web.Response(status=exc.status, text=str(exc))
        reply.force_close()
        return reply
    return web.Response(text=f"got {len(body)}")


@pytest.fixture
def server() -> Iterator[HttpServer]:
    config = HttpServerConfig(max_connections=8, header_timeout_s=1.0, body_timeout_s=1.0, idle_timeout_s=3.0)
    srv = HttpServer("test server", "127.0.0.1", 0, echo, config, max_body_bytes=LIMIT)
    srv.start()
    yield srv
    srv.shutdown(1.0)


def post(body: bytes, *headers: str, path: str = "/", close: bool = True) -> bytes:
    """A whole request; ``close``: it asks for the connection to be closed after its answer."""
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: x",
        *(["Connection: close"] if close else []),
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode() + body


def test_a_request_is_served_and_the_server_says_who_it_is(server):
    answer, _ = exchange(server.port, post(b"abc"))
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"got 3")
    assert b"Server: otel-dra\r\n" in answer and b"aiohttp" not in answer


def test_held_connections_past_the_cap_make_room_for_a_newcomer(server):
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(40)]
    try:
        time.sleep(0.3)
        answer, took = exchange(server.port, post(b"x"))
        assert answer.startswith(b"HTTP/1.1 200") and took < 0.5
        stats = server.stats()
        assert stats["open"] <= 8 and stats["evicted"] >= 40 - 8
    finally:
        for s in held:
            s.close()


def test_slow_headers_are_cut_off(server):
    answer, took = exchange(server.port, b"POST / HTTP/1.1\r\nHost: x\r\n", wait_s=5)
    assert answer == b"" and 0.9 < took < 2.5
    assert server.stats()["header_timeouts"] == 1


def test_a_silent_connection_is_cut_off_at_the_header_timeout(server):
    _, took = exchange(server.port, b"", wait_s=5)
    assert 0.9 < took < 2.5


def test_a_trickled_body_gets_408(server):
    answer, took = exchange(server.port, b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
    assert answer.startswith(b"HTTP/1.1 408") and took < 5


def test_content_length_with_transfer_encoding_is_refused_whole(server):
    second = post(b"smuggled")
    answer, _ = exchange(
        server.port, post(b"0\r\n\r\n", "Transfer-Encoding: chunked").replace(b"Connection: close\r\n", b"") + second
    )
    assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"400"
    assert b"got" not in answer
    assert server.stats()["bad_requests"] == 1


@pytest.mark.parametrize("cut", [None, 3, 60, 70])
def test_a_chunk_declared_past_the_limit_is_refused_at_once(server, cut):
    """Issue #28: a chunk-size line past the limit got 408 at the body timeout; it gets 413 as soon as its size
    arrives, after smaller chunks too, and however the bytes are cut (``cut``: sent in two pieces there)."""
    head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire = head + b"10\r\n" + b"z" * 16 + b"\r\n" + b"7fffffff;ext=1\r\nthe start of it"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        started = time.monotonic()
        if cut is None:
            sock.sendall(wire)
        else:
            sock.sendall(wire[:cut])
            time.sleep(0.05)
            sock.sendall(wire[cut:])
        sock.settimeout(3)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert time.monotonic() - started < 0.5  # not the body timeout (1 s here)
    assert b"2,147,483,647" in answer


@given(st.lists(st.integers(0, 600), max_size=12), st.lists(st.integers(1, 40), max_size=20))
@settings(max_examples=200, deadline=None)
def test_chunk_sizes_are_followed_however_the_body_is_cut(sizes: list[int], cuts: list[int]):
    """A chunked body of chunks within the limit is never refused, and its end is seen; a chunk past it is."""
    body = b"".join(b"%x\r\n" % n + b"q" * n + b"\r\n" for n in sizes if n) + b"0\r\n\r\n"
    for oversized in (False, True):
        wire = (b"%x\r\n" % (LIMIT + 1) if oversized else b"") + body
        chunks, pos, refused = ChunkSizes(LIMIT), 0, None
        for size in [*cuts, len(wire)]:
            refused = refused or chunks.feed(wire[pos : pos + size])
            pos += size
        assert refused == (LIMIT + 1 if oversized else None)
        assert chunks.done is not oversized


def test_bodies_are_capped_by_declared_length_by_chunks_and_after_inflation(server):
    declared = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\nonly the start"
    assert exchange(server.port, declared)[0].startswith(b"HTTP/1.1 413")  # refused before the body is read
    chunk = b"200\r\n" + b"y" * 512 + b"\r\n"
    chunked = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 2 + b"0\r\n\r\n"
    assert exchange(server.port, chunked)[0].startswith(b"HTTP/1.1 413")
    bomb = gzip.compress(b"\0" * (10 << 20))
    with pytest.raises(BodyError) as refused:
        gunzip(bomb, LIMIT)
    assert refused.value.status == 413
    assert gunzip(gzip.compress(b"ab") + gzip.compress(b"cd"), LIMIT) == b"abcd"  # several members
    # Members are capped (an exporter sends one; thousands of empty ones are work without data), and a body of
    # many members inflates whole, wherever they end within the slices fed to the inflater.
    from otel_dra.serve.http import MAX_GZIP_MEMBERS

    with pytest.raises(BodyError, match=f"more than {MAX_GZIP_MEMBERS:,} gzip members") as many:
        gunzip(gzip.compress(b"") * (MAX_GZIP_MEMBERS + 1), LIMIT)
    assert many.value.status == 413
    parts = [bytes([i % 251]) * (i * 37 % 3000) for i in range(MAX_GZIP_MEMBERS)]
    assert gunzip(b"".join(gzip.compress(p) for p in parts), 2 << 20) == b"".join(parts)
    with pytest.raises(BodyError, match="truncated"):
        gunzip(gzip.compress(b"x" * 500)[:-9], LIMIT)
    with pytest.raises(BodyError, match="not valid gzip"):
        gunzip(b"\x1f\x8b nope", LIMIT)


def lying(body: bytes, size: int) -> bytes:
    """``body`` (one gzip member) with a trailer that states ``size`` as its content's length."""
    return body[:-4] + (size % (1 << 32)).to_bytes(4, "little")


def test_a_member_inflated_at_once_is_held_to_the_limit_whatever_its_trailer_says():
    """One member is inflated in one call into a buffer of the size its trailer states; a trailer that lies (or
    several members, or padding) sends the body down the general path, which holds the same limits."""
    from otel_dra.inflate import one_member

    content = bytes(range(256)) * 3
    body = gzip.compress(content)
    assert one_member(body, LIMIT) == content == gunzip(body, LIMIT)
    assert one_member(body, len(content) - 1) is None  # past the limit: the general path refuses it (413)
    bomb = gzip.compress(b"\0" * (10 << 20))
    for claimed in (10, LIMIT, (10 << 20) + (1 << 32)):  # a bomb whose trailer claims little, or wraps around
        assert one_member(lying(bomb, claimed), LIMIT) is None
        with pytest.raises(BodyError) as refused:
            gunzip(lying(bomb, claimed), LIMIT)
        assert refused.value.status == 413
    short = lying(body, len(content) + 5)  # claims more than there is: zlib's length check fails the general path
    assert one_member(short, LIMIT) is None
    with pytest.raises(BodyError, match="not valid gzip"):
        gunzip(short, LIMIT)
    assert one_member(body + gzip.compress(b"more"), LIMIT) is None  # two members: the general path's
    assert gunzip(body + gzip.compress(b"more"), LIMIT) == content + b"more"
    assert one_member(body + b"\0" * 8, LIMIT) is None  # padding after it, as gzip reads it: the general path's
    assert gunzip(body + b"\0" * 8, LIMIT) == content


@pytest.mark.parametrize("coding", ["gzip, chunked", "chunked, chunked", "gzip", "identity"])
def test_a_transfer_coding_other_than_chunked_is_refused_as_go_refuses_it(server, coding):
    """Go's net/http answers 501 to any transfer coding but chunked alone: a body whose coding is not undone
    would be read as if it had none."""
    body = gzip.compress(b"abc")
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    request = f"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {coding}\r\n\r\n".encode() + chunked
    answer, _ = exchange(server.port, request)
    status = answer.split(b" ", 2)[1]
    # What the parser takes (chunked last) is refused here, 501; what it does not is its own 400.
    assert status == (b"501" if coding == "gzip, chunked" else b"400") or status == b"501", answer[:200]


def test_shutdown_with_connections_held_is_prompt():
    srv = HttpServer("test server", "127.0.0.1", 0, echo, HttpServerConfig(max_connections=4))
    srv.start()
    held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(4)]
    started = time.monotonic()
    srv.shutdown(1.0)
    assert time.monotonic() - started < 2.5
    for s in held:
        s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=1)


def test_a_port_in_use_is_one_line_naming_it(server):
    taken = rf"cannot listen for test server on 127.0.0.1:{server.port}: Address already in use \(is another process"
    with pytest.raises(OSError, match=taken):
        HttpServer("test server", "127.0.0.1", server.port, echo)


def test_config_bounds():
    assert AUTO_MIN_CONNECTIONS <= HttpServerConfig().connections() <= AUTO_MAX_CONNECTIONS
    assert HttpServerConfig(max_connections=3).connections() == 3
    for bad in ({"max_connections": 0}, {"header_timeout_s": 0}, {"idle_timeout_s": -1}):
        with pytest.raises(ValueError, match="must be"):
            HttpServerConfig(**bad)


def test_expect_100_continue_is_answered_and_an_oversized_body_refused_before_it_is_sent(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=3) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"abc")
        assert b"got 3" in s.recv(1000)
    big = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
    answer, _ = exchange(server.port, big)
    assert answer.startswith(b"HTTP/1.1 413") and b"100 Continue" not in answer


def test_an_answer_from_a_prebuilt_head_says_what_aiohttps_response_says_and_keeps_the_connection():
    """``ok``'s bytes against aiohttp's own ``Response`` for the same answer, read by a real client on one
    keep-alive connection; a request that asks to close gets aiohttp's answer, which closes."""

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        if request.path == "/aiohttp":
            return web.Response(body=body, content_type="application/x-protobuf")
        return ok(request, "application/x-protobuf", body)

    srv = HttpServer("test server", "127.0.0.1", 0, answer)
    srv.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        heads = {}
        for path, body in (("/ok", b""), ("/aiohttp", b""), ("/ok", b"\x0a\x02%s"), ("/aiohttp", b"\x0a\x02%s")):
            conn.request("POST", path, body, {"Content-Type": "application/x-protobuf"})
            reply = conn.getresponse()
            assert (reply.status, reply.reason, reply.read()) == (200, "OK", body)
            date = parsedate_to_datetime(reply.headers["Date"]).timestamp()
            assert abs(date - time.time()) < 5
            heads[path, body] = {k: v for k, v in reply.getheaders() if k != "Date"}
            assert not reply.will_close
        plain = {"Content-Type": "application/x-protobuf", "Content-Length": "0", "Server": "otel-dra"}
        assert heads["/ok", b""] == heads["/aiohttp", b""] == plain
        assert heads["/ok", b"\x0a\x02%s"] == heads["/aiohttp", b"\x0a\x02%s"]
        assert srv.stats()["accepted"] == 1, "the four requests did not share one connection"
        conn.close()
        for ask in ("POST /ok HTTP/1.1\r\nConnection: close", "POST /ok HTTP/1.0"):
            reply, took = exchange(srv.port, f"{ask}\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
            assert reply.startswith((b"HTTP/1.1 200 OK\r\n", b"HTTP/1.0 200 OK\r\n")) and took < 2, reply
            assert b"Content-Length: 0\r\n" in reply and (b"Connection: close" in reply or b"HTTP/1.0" in reply)
    finally:
        srv.shutdown(1.0)


# -- requests answered where they arrive (``quick``) --------------------------------------------------------------
def quick_server(max_body_bytes: int | None = None, **config: float) -> tuple[HttpServer, list[bytes]]:
    """A server whose ``quick`` takes ``POST /quick`` (not a body saying ``decline``) and whose handler says
    ``slow`` for the rest, after a pause for ``/wait``; ``taken``: the bodies ``quick`` answered."""
    taken: list[bytes] = []

    def quick(message: RawRequestMessage, body: bytes, transport: object) -> bytes | None:
        if message.path != "/quick" or body == b"decline":
            return None
        taken.append(body)
        return answer(200, "application/x-protobuf", b"quick " + body)

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        try:
            body = await read_body(request, LIMIT, request.protocol.owner.config.body_timeout_s)
        except BodyError as exc:
            return web.Response(status=exc.status, text=str(exc))
        if request.path == "/wait":
            await asyncio.sleep(0.3)
        return web.Response(body=b"slow " + body, content_type="application/x-protobuf")

    settings = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "idle_timeout_s": 3.0, **config}
    srv = HttpServer(
        "test server", "127.0.0.1", 0, handler, HttpServerConfig(**settings), quick=quick, max_body_bytes=max_body_bytes
    )
    srv.start()
    return srv, taken


def test_a_whole_request_is_answered_where_it_arrives_as_aiohttp_would_and_the_rest_by_the_handler():
    """On one keep-alive connection: ``quick`` answers what it takes, with the head aiohttp's ``Response``
    gives (but the date); a request it declines after reading the body reaches the handler with that body."""
    srv, taken = quick_server()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        heads = {}
        for path, body, said in (
            ("/quick", b"abc", b"quick abc"),
            ("/other", b"abc", b"slow abc"),
            ("/quick", b"decline", b"slow decline"),
            ("/quick", b"", b"quick "),
            ("/quick", b"\x0a\x02%s", b"quick \x0a\x02%s"),
        ):
            conn.request("POST", path, body, {"Content-Type": "application/x-protobuf"})
            reply = conn.getresponse()
            assert (reply.status, reply.reason, reply.read()) == (200, "OK", said), path
            assert not reply.will_close
            heads[said[:5]] = {k: v for k, v in reply.getheaders() if k not in ("Date", "Content-Length")}
        assert taken == [b"abc", b"", b"\x0a\x02%s"]
        assert heads[b"quick"] == heads[b"slow "] == {"Content-Type": "application/x-protobuf", "Server": "otel-dra"}
        assert srv.stats()["accepted"] == 1
        conn.close()
    finally:
        srv.shutdown(1.0)


@pytest.mark.parametrize(
    "ask",
    [
        "Connection: close",
        "Transfer-Encoding: chunked",
        "Expect: 100-continue",
        "HTTP/1.0",
    ],
)
def test_requests_that_are_not_a_plain_keep_alive_push_go_the_handlers_way(ask):
    srv, taken = quick_server()
    try:
        if ask == "HTTP/1.0":
            data = b"POST /quick HTTP/1.0\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        elif ask.startswith("Transfer"):
            data = (
                b"POST /quick HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                % ask.encode()
            )
        else:
            data = post(b"abc", ask, path="/quick")
        reply, _ = exchange(srv.port, data)
        reply = reply.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert reply.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")) and reply.endswith(b"slow abc"), reply
        assert taken == []
    finally:
        srv.shutdown(1.0)


def test_a_head_and_its_body_sent_apart_are_answered_where_they_arrive_and_a_late_body_goes_the_handlers_way():
    """Python's ``http.client`` (under the SDK exporter's ``requests``) sends a request's head and body in two
    writes: the request is held for its body, then answered where it arrived. A body that does not come by the
    header timeout goes to the handler, which waits its body timeout and answers 408."""
    srv, taken = quick_server(header_timeout_s=0.5, body_timeout_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            request = post(b"abcdef", path="/quick", close=False)
            for cut in (10, len(request) - 6, len(request) - 2):
                s.sendall(request[:cut])
                time.sleep(0.05)
                s.sendall(request[cut:])
                assert s.recv(1000).endswith(b"quick abcdef")
            s.sendall(request[:-2])
            started = time.monotonic()
            reply = s.recv(1000)
            assert reply.startswith(b"HTTP/1.1 408") and 0.8 < time.monotonic() - started < 2.0, reply
        assert taken == [b"abcdef"] * 3
        assert srv.stats()["header_timeouts"] == 0
    finally:
        srv.shutdown(1.0)


def test_a_head_declaring_a_body_past_the_limit_is_not_held_for_it():
    """Refused at once (413, before a byte of the body is sent), as without the lane, not after waiting for it."""
    srv, taken = quick_server(max_body_bytes=LIMIT)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            started = time.monotonic()
            s.sendall(b"POST /quick HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
            reply = s.recv(1000)
            took = time.monotonic() - started
        assert reply.startswith(b"HTTP/1.1 413") and took < 0.5, (reply, took)
        assert taken == []
    finally:
        srv.shutdown(1.0)


def test_answers_keep_the_order_of_the_requests():
    """Pipelined requests, and a push arriving while the handler still works on the one before it: each is
    answered after the one before (a quick answer written first would be read as the earlier one's)."""
    srv, _ = quick_server()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(
                post(b"1", path="/quick", close=False) + post(b"2", path="/quick", close=False)
            )  # two in one segment
            s.sendall(post(b"3", path="/wait", close=False))
            time.sleep(0.1)  # the handler is pausing on /wait
            s.sendall(post(b"4", path="/quick", close=False))
            time.sleep(0.5)
            s.sendall(post(b"5", path="/quick"))
            got = b""
            while chunk := s.recv(65536):
                got += chunk
        bodies = [part.rsplit(b"\r\n\r\n", 1)[-1] for part in got.split(b"HTTP/1.1 ")[1:]]
        assert [b[-1:] for b in bodies] == [b"1", b"2", b"3", b"4", b"5"], got
        assert b"quick 4" not in got  # it waited behind /wait: the handler answered it
    finally:
        srv.shutdown(1.0)


def test_after_quick_answers_the_idle_and_header_timeouts_still_hold():
    """Pushes every 0.4 s keep a connection with a 1.5 s idle timeout open; then it is closed when idle. A
    next request's head that never ends is cut off at the header timeout, timed from its last piece's arrival."""
    srv, taken = quick_server(idle_timeout_s=1.5, header_timeout_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            for i in range(6):
                s.sendall(post(b"%d" % i, path="/quick", close=False))
                assert s.recv(1000).endswith(b"quick %d" % i)
                time.sleep(0.4)
            started = time.monotonic()
            assert s.recv(1000) == b""
            assert 0.7 < time.monotonic() - started < 1.45  # (1.5 s from the last answer)
        assert len(taken) == 6
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(post(b"x", path="/quick", close=False) + b"POST /quick HTTP/1.1\r\n")
            assert s.recv(1000).endswith(b"quick x")
            time.sleep(0.3)
            s.sendall(b"Host: x\r\n")  # the next head, trickled: timed from this byte
            started = time.monotonic()
            assert s.recv(1000) == b""
            assert 0.4 < time.monotonic() - started < 1.0  # (the idle timeout would have been 1.2 s from now)
        assert srv.stats()["header_timeouts"] == 1
    finally:
        srv.shutdown(1.0)
