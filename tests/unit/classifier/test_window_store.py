"""The window store's capacity: rows grown ahead of the devices hold no resident memory of the largest arrays, and
what a row's window reads never depends on slots it has not written (they start as zeros, not NaN)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra.classifier.window import WindowStore
from tests.support.helpers import resident_bytes


@pytest.fixture
def small_pages():
    """numpy's arrays off huge pages, as the fleet runs (``otel_dra.heap.numpy_small_pages``), for this test."""
    from numpy._core import multiarray

    before = multiarray._set_madvise_hugepage(False)
    yield
    multiarray._set_madvise_hugepage(before)


def huge_pages_always() -> bool:
    """Whether the kernel backs every anonymous mapping with huge pages (THP ``always``): then any written
    byte makes 2 MB resident whatever numpy asks."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


@pytest.mark.skipif(huge_pages_always(), reason="transparent huge pages are 'always' on this kernel")
def test_rows_grown_ahead_hold_no_resident_pages_until_written(small_pages):
    store = WindowStore(features=33, window=30, capacity=1024)
    rows = np.arange(1024)
    values = np.random.default_rng(1).random((33, 1024))
    store.append(rows, 100.0, values)
    before = resident_bytes()
    store.resize(120_000)
    grown = resident_bytes() - before
    ring_and_times = store.ring.nbytes + store.times.nbytes  # 490 MB
    assert grown < ring_and_times / 4, f"{grown:,} bytes resident after growing to 120,000 rows"
    np.testing.assert_array_equal(store.last[:, :1024], values.astype(np.float32))  # (the rows held are kept)
    assert not store.last[:, 1024:].any() and not store.written[1024:].any()  # (zeros: not written)
    store.clear(np.arange(1024, 2048))  # what the registry does before giving rows out: their start state
    assert np.isnan(store.last[:, 1024:2048]).all()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    steps=st.integers(1, 14),
    window_s=st.sampled_from([float("inf"), 25.0]),
    back=st.booleans(),
)
def test_a_row_given_after_growth_reads_as_one_of_a_store_made_that_large(seed, steps, window_s, back):
    """Samples (some absent) into rows of a store grown from 2 rows and of one made with 12 rows whose slots
    start as NaN (as they did before): sums, counts, newest values and the windows' samples are the same, with
    rings that wrap, samples that leave by age, and a clock that jumps back."""
    rng = np.random.default_rng(seed)
    grown = WindowStore(features=3, window=4, capacity=2, window_s=window_s)
    grown.resize(12)
    grown.clear(np.arange(2, 12))  # (the registry's start state for rows it gives out)
    made = WindowStore(features=3, window=4, capacity=12, window_s=window_s)
    made.ring[...] = np.nan
    made.times[...] = np.nan
    t = 100.0
    for step in range(steps):
        rows = np.sort(rng.choice(12, size=int(rng.integers(1, 13)), replace=False))
        values = rng.normal(size=(3, len(rows)))
        values[rng.random(values.shape) < 0.3] = np.nan
        t += -30.0 if back and step == steps // 2 else 10.0
        for store in (grown, made):
            store.append(rows, t, values)
    np.testing.assert_array_equal(grown.sums, made.sums)
    np.testing.assert_array_equal(grown.counts, made.counts)
    np.testing.assert_array_equal(grown.last, made.last)
    np.testing.assert_array_equal(grown.written, made.written)
    np.testing.assert_array_equal(grown.tail, made.tail)
    every = np.arange(12)
    for feature in range(3):
        np.testing.assert_array_equal(grown.samples(every, feature), made.samples(every, feature))
