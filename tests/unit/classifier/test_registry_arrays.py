"""The registry's grown arrays (``registry.zeroed``): a large one is anonymous pages of its own, private to this
process, zero and not resident until written, and not malloc's, whatever glibc's mmap threshold has risen to."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from otel_dra.classifier.registry import MAPPED_BYTES, grown, zeroed
from otel_dra.heap import _glibc
from tests.support.helpers import resident_bytes

LARGE = (30, 33, 16_384)  # float32: 65 MB, the ring of a fleet of 16,384 rows

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and fork as Linux has them")


@linux_only
def test_a_large_array_is_zero_and_holds_no_resident_pages_until_written():
    before = resident_bytes()
    a = zeroed(LARGE, np.float32)
    assert a.shape == LARGE and a.dtype == np.float32 and a.flags.writeable and a.flags.c_contiguous
    assert resident_bytes() - before < a.nbytes / 16
    a[:, :, :1024] = 1.0  # a slab's first rows: one page of 16 in each
    assert resident_bytes() - before < a.nbytes / 8
    assert a[:, :, :1024].all() and not a[:, :, 1024:].any()


@pytest.mark.skipif(_glibc() is None, reason="glibc's mallinfo2")
def test_a_large_array_is_not_mallocs_after_the_threshold_rose():
    use = _glibc()[0]  # type: ignore[index]
    freed = np.ones(24 << 20, np.uint8)  # mapped by malloc, and freed: glibc's mmap threshold rises to its size
    del freed
    before = use()
    a = zeroed((4, 1 << 20), np.float32)  # 16 MB: under the threshold now, so np.zeros would be the heap's
    after = use()
    assert after.in_use + after.free - before.in_use - before.free < a.nbytes / 16
    small = zeroed((4, 16), np.float32)  # (a small one is malloc's: a page of its own would cost more)
    assert small.nbytes < MAPPED_BYTES and not small.any()


@linux_only
def test_a_forked_process_writes_its_own_copy():
    a = zeroed(LARGE, np.float32)
    pid = os.fork()
    if pid == 0:  # (the child: its write must not reach the parent's pages)
        a[...] = 7.0
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not a.any()


def test_grown_keeps_the_values_and_zeroes_the_new_rows_on_either_path():
    rng = np.random.default_rng(3)
    for shape in [(3, 5), (30, 33, 300)]:  # (small: malloc's; large: pages of its own)
        a = rng.random(shape).astype(np.float32)
        g = grown(a, 2 * shape[-1], 0, axis=len(shape) - 1)
        np.testing.assert_array_equal(g[..., : shape[-1]], a)
        assert not g[..., shape[-1] :].any()
        kept = grown(a, shape[-1] + 1, np.nan, axis=len(shape) - 1, keep=np.array([2, 0]))
        np.testing.assert_array_equal(kept[..., :2], a[..., [2, 0]])
        assert np.isnan(kept[..., 2:]).all()
