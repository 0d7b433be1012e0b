"""The gRPC port's front (issue #28): a real gRPC server behind it on its Unix socket, real gRPC clients and
raw sockets in front, on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra.serve.config import HttpServerConfig
from otel_dra.serve.grpc_front import PREFACE, FrameHeads, GrpcFront, _Client, frame
from otel_dra.serve.grpc_pool import ReadDeadlines, ShedPool, shedding
from otel_dra.serve.listener import IdleFirstCap
from tests.conftest import wait_for

METHOD = "/test.Echo/Call"


class Backend:
    """A gRPC server behind a front: ``Call`` echoes its request after ``delay_s`` and notes the peer."""

    def __init__(self, front: GrpcFront) -> None:
        self.front = front
        self.delay_s = 0.0
        self.peers: list[str] = []
        handler = grpc.unary_unary_rpc_method_handler(self.call)
        self.server = grpc.server(
            ThreadPoolExecutor(8), handlers=[grpc.method_handlers_generic_handler("test.Echo", {"Call": handler})]
        )
        assert self.server.add_insecure_port(front.inner_address)
        self.server.start()
        front.start()

    def call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.peers.append(self.front.peer(context.peer()).address)
        time.sleep(self.delay_s)
        return request

    def stop(self) -> None:
        self.server.stop(0)
        self.front.shutdown(1.0)


def start(max_piped: int | None = None, **config: float | int) -> Backend:
    cfg = HttpServerConfig(**config)  # type: ignore[arg-type]
    return Backend(GrpcFront("test gRPC", "127.0.0.1", 0, cfg, max_piped=max_piped))


@pytest.fixture
def backend() -> Iterator[Backend]:
    b = start(header_timeout_s=1.0, idle_timeout_s=3.0)
    yield b
    b.stop()


def call(port: int, payload: bytes = b"hello", timeout: float = 5.0) -> bytes:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        return channel.unary_unary(METHOD)(payload, timeout=timeout)


def closed(sock: socket.socket, within_s: float) -> bytes | None:
    """What the server said before closing ``sock`` within ``within_s``; None when it kept it open."""
    sock.settimeout(within_s)
    said = b""
    deadline = time.monotonic() + within_s
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                return said
            said += chunk
    except TimeoutError:
        return None
    except OSError:
        return said
    return None


# -- frame headers -------------------------------------------------------------------------------
frames = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 255), st.integers(0, 2**31 - 1), st.binary(max_size=40)),
    max_size=20,
)


@given(frames, st.lists(st.integers(1, 50), max_size=30))
@settings(max_examples=300, deadline=None)
def test_frame_headers_are_found_however_the_bytes_are_cut(sent: list, cuts: list[int]):
    """The front reads a direction's frame headers from reads cut anywhere, a header included, as the
    client side does: what is not whole is fed again with what follows."""
    wire = PREFACE + b"".join(frame(kind, flags, stream, payload) for kind, flags, stream, payload in sent)
    heads = FrameHeads(skip=len(PREFACE))
    seen, carried, pos = [], b"", 0
    for size in [*cuts, len(wire)]:
        data = carried + wire[pos : pos + size]
        pos += size
        found, whole = heads.feed(data)
        for offset, kind, flags, stream in found:
            assert data[offset + 3] == kind  # the offset is the header's, in what was fed
            seen.append((kind, flags, stream))
        carried = data[whole:]
        if pos >= len(wire):
            break
    assert seen == [(kind, flags, stream) for kind, flags, stream, _ in sent]
    assert heads.between_frames and not carried


# -- the cap ---------------------------------------------------------------------------------------
def test_a_newcomer_closes_the_idle_asked_connection_before_waiting_on_a_new_ones_grace():
    counts = dict.fromkeys(("accepted", "evicted", "refused"), 0)
    gone: list[str] = []
    cap: IdleFirstCap[str] = IdleFirstCap(2, gone.append, counts, grace_s=(0.2, 0.0))
    assert cap.arrived("asked") and cap.arrived("new-1")
    cap.busy("asked")
    cap.idle("asked", 1)
    assert cap.arrived("new-2")  # new-1 is within its grace: the asked, idle one makes room
    assert gone == ["asked"]
    assert not cap.arrived("new-3")  # both left are new, within their grace: the newcomer waits outside
    assert gone == ["asked", "new-3"] and counts["refused"] == 1
    time.sleep(0.25)
    assert cap.arrived("new-4")  # past its grace, the oldest new one goes
    assert gone[-1] == "new-1" and counts["evicted"] == 2
    cap.busy("new-2")
    cap.busy("new-4")
    assert not cap.arrived("new-5")  # busy ones are never closed to make room
    assert len(cap) == 2


# -- the front, with a gRPC server behind it ------------------------------------------------------
def test_a_call_goes_through_and_the_server_learns_the_clients_address(backend: Backend):
    port = backend.front.port
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        assert channel.unary_unary(METHOD)(b"hello", timeout=5) == b"hello"
        assert backend.front.stats()["piped"] == 1
        client = channel.unary_unary(METHOD)(b"again", timeout=5)  # the same connection
    assert client == b"again" and backend.front.stats()["accepted"] == 1
    assert len(backend.peers) == 2 and backend.peers[0].startswith("127.0.0.1:")
    wait_for(lambda: backend.front.stats()["open"] == 0, 5, "the connection gone with its channel")


def test_the_ends_of_large_answers_are_seen_however_the_server_side_reads_cut_them(backend: Backend):
    """Megabyte answers arrive from the gRPC server in reads cut anywhere, frame headers included: the front
    still sees each answer end, so the connection is idle (and may be closed to make room) between calls."""
    with grpc.insecure_channel(
        f"127.0.0.1:{backend.front.port}",
        options=[("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 8 << 20)],
    ) as channel:
        for size in (1 << 20, 3 << 20, 777_777):
            assert len(channel.unary_unary(METHOD)(b"m" * size, timeout=10)) == size
            wait_for(lambda: backend.front.stats()["busy"] == 0, 2, "the answer's end seen")
        assert backend.front.stats()["piped"] == 1


class _Sink:
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def get_extra_info(self, _name: str) -> None:
        return None


@pytest.mark.parametrize("cut", range(1, 30))
def test_an_answers_end_is_seen_when_the_servers_bytes_are_cut_inside_a_frame_header(cut: int):
    front = GrpcFront("test gRPC", "127.0.0.1", 0)
    try:
        conn = _Client(front)
        sink = _Sink()
        conn.transport = sink  # type: ignore[assignment]
        assert front.arrived(conn)
        conn.open, conn.last_stream = {1}, 1
        wire = frame(0x0, 0, 1, b"x" * 16) + frame(0x1, 0x1, 1, b"trailers")  # DATA, then HEADERS + END_STREAM
        conn.from_server(wire[:cut])
        assert conn.open == {1}
        conn.from_server(wire[cut:])
        assert conn.open == set() and sink.data == wire  # the end seen; every byte passed on, in order
    finally:
        front.shutdown(0)


def test_bytes_that_are_not_http2_are_refused(backend: Backend):
    with socket.create_connection(("127.0.0.1", backend.front.port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        said = closed(sock, 3.0)
    assert said is not None and b"not an HTTP/2 connection preface" in said
    assert backend.front.stats()["bad_requests"] == 1
    assert backend.front.stats()["piped"] == 0  # the gRPC server never saw it


def test_a_silent_connection_is_closed_at_the_header_timeout(backend: Backend):
    with socket.create_connection(("127.0.0.1", backend.front.port)) as sock:
        started = time.monotonic()
        assert closed(sock, 5.0) is not None
        assert 0.8 < time.monotonic() - started < 3.0
    assert backend.front.stats()["header_timeouts"] == 1


def test_a_preface_only_connection_gets_a_goaway_at_the_idle_timeout_and_no_server(backend: Backend):
    with socket.create_connection(("127.0.0.1", backend.front.port)) as sock:
        sock.sendall(PREFACE + frame(0x4, 0, 0))
        started = time.monotonic()
        said = closed(sock, 6.0)
        took = time.monotonic() - started
    assert said is not None and said.startswith(backend.front.server_preface)  # the server's preface, at once
    assert b"no request within the idle timeout" in said and said[len(backend.front.server_preface) + 3] == 0x7
    assert 2.5 < took < 5.0
    assert backend.front.stats()["piped"] == 0


def test_squatters_at_the_cap_wait_their_grace_then_make_room_for_a_caller():
    b = start(max_connections=4, header_timeout_s=30.0, idle_timeout_s=60.0)
    squatters = []
    try:
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", b.front.port))
            s.sendall(PREFACE + frame(0x4, 0, 0))
            squatters.append(s)
        wait_for(lambda: b.front.stats()["open"] == 4, 5, "four squatters in")
        started = time.monotonic()
        assert call(b.front.port, timeout=10) == b"hello"  # waited in the backlog for a squatter's grace
        assert time.monotonic() - started < 3.0
        assert b.front.stats()["evicted"] >= 1
        assert sum(closed(s, 0.5) is not None for s in squatters) >= 1
    finally:
        for s in squatters:
            s.close()
        b.stop()


def test_a_request_waits_in_line_for_the_server_instead_of_being_refused():
    """Two connections piped at most, both busy with slow calls: a third caller, let in (there is room for
    connections), waits for one of them to finish and be closed for it, and is answered."""
    b = start(max_piped=2, max_connections=8, header_timeout_s=10.0)
    b.delay_s = 1.0
    try:
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda i: call(b.front.port, b"x%d" % i, timeout=10), range(3)))
        assert sorted(answers) == [b"x0", b"x1", b"x2"]
        assert b.front.stats()["refused"] == 0 and b.front.stats()["evicted"] == 1
    finally:
        b.stop()


# -- the workers ---------------------------------------------------------------------------------
def test_the_pool_sheds_calls_past_its_bound_at_once():
    pool = ShedPool(workers=1, queue=1)
    release = threading.Event()
    try:
        held = [pool.submit(lambda: (release.wait(5), shedding())[1]) for _ in range(2)]
        shed = pool.submit(shedding)
        assert shed.result(timeout=2) is True  # answered while the two others still wait
        release.set()
        assert [f.result(timeout=5) for f in held] == [False, False]
        assert pool.waiting == 0
    finally:
        release.set()
        pool.shutdown()


def test_a_read_not_done_in_time_is_cancelled():
    class Call:
        cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    late: list[int] = []
    reads = ReadDeadlines(0.3, on_late=lambda: late.append(1))
    reads.start()
    try:
        slow, quick = Call(), Call()
        slow_token = reads.watch(slow)
        reads.done(reads.watch(quick))
        wait_for(lambda: slow.cancelled, 2, "the slow read cancelled")
        assert not quick.cancelled and late == [1]
        reads.done(slow_token)
        again = Call()  # (watched after a spell with nothing watched, when the thread sleeps)
        reads.watch(again)
        wait_for(lambda: again.cancelled, 2, "a read watched after an idle spell cancelled")
        assert late == [1, 1]
    finally:
        reads.stop()
