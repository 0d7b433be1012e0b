"""A function run in a forked copy of the process: its parts come back whole, or None (and the copy is reaped)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from otel_dra import forked

pytestmark = pytest.mark.skipif(not forked.can_fork(), reason="forks (Linux)")


def gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_the_copys_parts_come_back_whole_and_it_is_reaped():
    big = os.urandom(3 << 20)  # (more than a pipe holds: the copy waits on its writes while this one reads)
    call = forked.ForkedCall(lambda: [b"", big, b"tail"])
    assert call.result(30.0) == [b"", big, b"tail"]
    assert gone(call.pid)


def test_a_copy_that_fails_or_dies_gives_none():
    def dies() -> list[bytes]:
        os._exit(3)

    for work in (lambda: 1 / 0, dies):
        call = forked.ForkedCall(work)  # type: ignore[arg-type]
        assert call.result(30.0) is None and gone(call.pid)


def test_a_copy_past_its_time_is_killed_and_gives_none():
    call = forked.ForkedCall(lambda: [time.sleep(60) or b""])  # type: ignore[func-returns-value]
    t0 = time.monotonic()
    assert call.result(0.5) is None
    assert time.monotonic() - t0 < 10 and gone(call.pid)


@pytest.mark.parametrize("cut", [0, 3, 4 + 8, 4 + 8 + 2])
def test_a_result_cut_short_is_none(cut):
    whole = forked._COUNT.pack(1) + forked._LENGTH.pack(5) + b"hello"
    assert forked._parts(whole) == [b"hello"]
    assert forked._parts(whole[:cut]) is None
    assert forked._parts(whole + b"x") is None


def test_a_copy_forked_from_a_thread_among_others_gives_its_parts():
    """As the fleet forks: from its rendering thread, while the receivers' and the ticks' threads run."""
    stop = threading.Event()
    busy = [threading.Thread(target=stop.wait, daemon=True) for _ in range(3)]
    for t in busy:
        t.start()
    got: list[object] = []
    caller = threading.Thread(target=lambda: got.append(forked.ForkedCall(lambda: [b"made"]).result(30.0)))
    caller.start()
    caller.join(60)
    stop.set()
    assert got == [[b"made"]]


def test_the_copys_pipe_is_read_past_the_descriptors_select_could_watch():
    """A server holds more than 1,024 descriptors (connections); select() cannot watch one past them."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if min(hard, 4096) < 1200:
        pytest.skip("cannot open 1,200 descriptors here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        call = forked.ForkedCall(lambda: [b"far"])
        assert call._reader > 1024 and call.result(30.0) == [b"far"]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_copy_lets_go_of_the_callers_connections():
    """A connection the caller closes while its copy runs is closed at once, not held open by the copy."""
    mine, peer = socket.socketpair()
    call = forked.ForkedCall(lambda: [time.sleep(5) or b""])  # type: ignore[func-returns-value]
    try:
        mine.close()
        peer.settimeout(2.0)
        assert peer.recv(1) == b""  # (EOF: no copy of the descriptor is left open)
    finally:
        peer.close()
        call.result(0.1)
