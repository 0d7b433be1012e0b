"""RowIndex reads and writes exactly what numpy's fancy indexing does, whatever the batch's shape:
one ascending run (a slice), ascending with holes (runs), or any order (an index)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra.classifier.rows import ROWS_PER_RUN, RowIndex

CAPACITY = 600


@st.composite
def batches(draw: st.DrawFn) -> np.ndarray:
    """Unique rows: a run, a run with a few holes, a sparse ascending pick, or shuffled."""
    shape = draw(st.sampled_from(["run", "holes", "sparse", "shuffled", "tiny"]))
    if shape == "tiny":
        return np.asarray(draw(st.lists(st.integers(0, CAPACITY - 1), max_size=2, unique=True)), dtype=np.intp)
    lo = draw(st.integers(0, CAPACITY // 2))
    hi = draw(st.integers(lo + 1, CAPACITY))
    rows = np.arange(lo, hi)
    if shape in ("holes", "shuffled"):
        holes = draw(st.lists(st.integers(lo, hi - 1), max_size=max(1, (hi - lo) // (2 * ROWS_PER_RUN)), unique=True))
        rows = np.setdiff1d(rows, holes)
    elif shape == "sparse":
        rows = rows[:: draw(st.integers(2, 5))]
    if shape == "shuffled":
        rows = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(rows)
    return rows.astype(np.intp)


@settings(max_examples=150, deadline=None)
@given(rows=batches(), seed=st.integers(0, 2**32 - 1))
def test_row_index_matches_fancy_indexing(rows: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ix = RowIndex(rows)
    if rows.size and int(rows.max()) - int(rows.min()) == rows.size - 1 and bool((np.diff(rows) == 1).all()):
        assert isinstance(ix.at, slice)  # one ascending run: views, not gathers
    a = rng.random((CAPACITY, 5))
    v = rng.random((rows.size, 5))
    assert np.array_equal(ix.take(a), a[rows])
    for op in ("put", "add", "subtract"):
        want, got = a.copy(), a.copy()
        if op == "put":
            want[rows] = v
            ix.put(got, v)
        elif op == "add":
            want[rows] += v
            ix.add(got, v)
        else:
            want[rows] -= v
            ix.subtract(got, v)
        assert np.array_equal(got, want), op
    # Rows on the last axis of a feature-major array.
    fm = rng.random((3, CAPACITY))
    vt = rng.random((3, rows.size))
    assert np.array_equal(ix.take(fm, axis=1), fm[:, rows])
    for op in ("put", "add", "subtract"):
        want, got = fm.copy(), fm.copy()
        if op == "put":
            want[:, rows] = vt
            ix.put(got, vt, axis=1)
        elif op == "add":
            want[:, rows] += vt
            ix.add(got, vt, axis=1)
        else:
            want[:, rows] -= vt
            ix.subtract(got, vt, axis=1)
        assert np.array_equal(got, want), op
    counts = rng.integers(0, 9, (3, CAPACITY)).astype(np.int16)
    want_c = counts.copy()
    want_c[:, rows] += np.ones((3, rows.size), dtype=bool)
    ix.add(counts, np.ones((3, rows.size), dtype=bool), axis=1)
    assert np.array_equal(counts, want_c)
    # Rings (slots, ..., rows): each row's own slot, or every row in one slot (devices that started together).
    for ring in (rng.random((4, 3, CAPACITY)).astype(np.float32), rng.random((4, CAPACITY))):
        for slots in (rng.integers(0, 4, rows.size), np.full(rows.size, 2)):
            want_t = np.moveaxis(ring[(slots, Ellipsis, rows)], 0, -1)
            assert np.array_equal(ix.take_slots(ring, slots), want_t)
            values = rng.random(want_t.shape).astype(ring.dtype)
            want_r, got_r = ring.copy(), ring.copy()
            want_r[(slots, Ellipsis, rows)] = np.moveaxis(values, -1, 0)
            ix.put_slots(got_r, slots, values)
            assert np.array_equal(got_r, want_r)
            want_r, got_r = ring.copy(), ring.copy()
            want_r[(slots, Ellipsis, rows)] = 0.0
            ix.put_slots(got_r, slots, 0.0)
            assert np.array_equal(got_r, want_r)
    # Several rings of one shape read and added to at once (a horizon's sums and counts); a strided one, and rings of
    # different shapes, each at its own positions.
    for rings in (
        (rng.random((4, 3, CAPACITY)).astype(np.float32), rng.integers(0, 9, (4, 3, CAPACITY)).astype(np.uint16)),
        (rng.random((4, 3, 2 * CAPACITY))[:, :, ::2],),
        (rng.random((4, 3, CAPACITY)), rng.random((4, 2, CAPACITY))),
    ):
        for slots in (rng.integers(0, 4, rows.size), np.full(rows.size, 1)):
            values = tuple(rng.integers(0, 5, (ring.shape[1], rows.size)).astype(ring.dtype) for ring in rings)
            wants = [ring.copy() for ring in rings]
            for want, value in zip(wants, values, strict=True):
                want[(slots, Ellipsis, rows)] += np.moveaxis(value, -1, 0)
            taken = ix.take_slots_of(rings, slots)
            for ring, got in zip(rings, taken, strict=True):
                assert got.dtype == ring.dtype and np.array_equal(got, ix.take_slots(ring, slots))
            ix.add_slots(rings, slots, values)
            for ring, want in zip(rings, wants, strict=True):
                assert ring.dtype == want.dtype and np.array_equal(ring, want)


def test_a_ring_that_is_not_contiguous_is_indexed_as_it_is() -> None:
    """A strided view (no flat index of it is a view) is read and written by its own indices."""
    base = np.arange(4 * 2 * 20, dtype=np.float64).reshape(4, 2, 20)
    ring = base[:, :, ::2]
    rows = np.asarray([0, 2, 3, 7])
    slots = np.asarray([0, 1, 2, 3])
    ix = RowIndex(rows)
    assert np.array_equal(ix.take_slots(ring, slots), np.moveaxis(ring[slots, :, rows], 0, -1))
    ix.put_slots(ring, slots, np.full((2, 4), -1.0))
    assert (base[slots, :, rows * 2] == -1.0).all()


def test_runs_are_used_only_for_few_holes() -> None:
    n = 10 * ROWS_PER_RUN
    few = np.delete(np.arange(n), [5, 300])
    assert RowIndex(few).runs == [(0, 0, 5), (6, 5, 299), (301, 299, n - 2)]
    many = np.arange(0, n, 2)
    assert RowIndex(many).runs is None
    assert RowIndex(few[::-1].copy()).runs is None  # descending: an index
