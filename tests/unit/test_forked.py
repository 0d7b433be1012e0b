"""A function run in a forked copy of the process: its parts come back whole, or None (and the copy is reaped)."""

from __future__ import annotations

import os
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
