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


class _RowModel:
    """One row's window, a sample at a time, in plain Python: what :meth:`WindowStore.append` must give, operation
    for operation (the same float additions and subtractions in the same order)."""

    def __init__(self, features: int, window: int, window_s: float) -> None:
        self.window, self.window_s = window, window_s
        self.held: list[tuple[float, np.ndarray]] = []  # (time, float32 values), oldest first
        self.sums = [0.0] * features
        self.counts = [0] * features

    def _leave(self) -> None:
        _, old = self.held.pop(0)
        for f, x in enumerate(old.tolist()):
            if not np.isnan(x):
                self.counts[f] -= 1
                self.sums[f] -= x
        self.sums = [0.0 if c == 0 else s for s, c in zip(self.sums, self.counts, strict=True)]

    def append(self, t: float, values: np.ndarray) -> None:
        if len(self.held) == self.window:  # its ring is full: the oldest leaves as the new comes
            self._leave()
        for f, x in enumerate(values.tolist()):
            known = not np.isnan(x)
            self.sums[f] += x if known else 0.0
            self.counts[f] += known
        self.held.append((t, values))
        while self.window_s != float("inf") and len(self.held) > 1 and not t - self.window_s < self.held[0][0] <= t:
            self._leave()  # left behind by the new one's time (or stamped after it: its clock went back)


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    steps=st.integers(1, 40),
    window=st.integers(1, 5),
    window_s=st.sampled_from([float("inf"), 25.0, 45.0]),
)
def test_the_windows_sums_are_a_sample_at_a_times_in_the_same_float_order(seed, steps, window, window_s):
    """Rows sampled at their own pace (gaps, clocks that go back), some values absent, each batch a different mix
    of rows whose rings are full or not and whose oldest the new time leaves behind or not: the store's sums,
    counts and windows are those of each row's samples taken in and out one at a time, bit for bit."""
    rng = np.random.default_rng(seed)
    features, n = 3, 6
    store = WindowStore(features=features, window=window, capacity=n, window_s=window_s)
    models = [_RowModel(features, window, window_s) for _ in range(n)]
    clock = rng.uniform(0.0, 20.0, n)
    for _ in range(steps):
        rows = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False))
        steps_s = rng.choice([2.0, 5.0, 10.0, 15.0, 70.0, -40.0], size=rows.size, p=[0.2, 0.3, 0.2, 0.15, 0.1, 0.05])
        clock[rows] += steps_s  # (70: back from a gap; -40: its clock went back)
        # Magnitudes 24 decades apart: a window's sum is then inexact, so a change in the order of its float
        # operations shows (within a few decades, float32 values add exactly in float64, in any order).
        scale = 10.0 ** rng.integers(-12, 13, size=(features, rows.size))
        values = (rng.normal(size=(features, rows.size)) * scale).astype(np.float32)
        values[rng.random(values.shape) < 0.3] = np.nan
        store.append(rows, clock[rows].copy(), values)
        for i, row in enumerate(rows.tolist()):
            models[row].append(float(clock[row]), values[:, i])
    np.testing.assert_array_equal(store.sums, np.array([m.sums for m in models]).T)
    np.testing.assert_array_equal(store.counts, np.array([m.counts for m in models]).T)
    np.testing.assert_array_equal(store.written - store.tail, [len(m.held) for m in models])
