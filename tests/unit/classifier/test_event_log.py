"""The event log keeps a row's events in a pool given out at its first event: it reads as the dense log it
replaced (every row its own ``depth`` slots), through records, moves, clears, renumbering and restarts, and rows
that never had an event cost it no slots."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra.classifier.events import EventLog

DEPTH = 4


class DenseLog:
    """The dense log as it was before the pool (times and amounts for every row): the reference."""

    def __init__(self, capacity: int) -> None:
        self.times = np.full((capacity, DEPTH), -np.inf)
        self.amounts = np.zeros((capacity, DEPTH), dtype=np.float32)
        self.next = np.zeros(capacity, dtype=np.int32)

    def resize(self, capacity: int, keep: np.ndarray | None) -> None:
        if keep is not None:
            self.times, self.amounts, self.next = self.times[keep], self.amounts[keep], self.next[keep]
        extra = capacity - len(self.next)
        if extra > 0:
            self.times = np.vstack([self.times, np.full((extra, DEPTH), -np.inf)])
            self.amounts = np.vstack([self.amounts, np.zeros((extra, DEPTH), dtype=np.float32)])
            self.next = np.concatenate([self.next, np.zeros(extra, dtype=np.int32)])

    def record(self, rows: np.ndarray, t: float, amounts: np.ndarray) -> None:
        hit = np.nan_to_num(amounts) > 0
        r = rows[hit]
        slot = self.next[r] % DEPTH
        self.times[r, slot], self.amounts[r, slot] = t, amounts[hit]
        self.next[r] += 1

    def clear(self, rows: np.ndarray) -> None:
        self.times[rows], self.amounts[rows], self.next[rows] = -np.inf, 0.0, 0

    def since(self, cutoff: float, rows: np.ndarray) -> np.ndarray:
        return (self.amounts[rows] * (self.times[rows] >= cutoff)).sum(axis=1)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.integers(0, 2**16)),
        st.tuples(st.just("clear"), st.integers(0, 2**16)),
        st.tuples(st.just("renumber"), st.integers(0, 2**16)),
        st.tuples(st.just("grow"), st.integers(1, 9)),
        st.tuples(st.just("move"), st.integers(0, 2**16)),
        st.tuples(st.just("restart"), st.integers(0, 2**16)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=120, deadline=None)
@given(ops=ops)
def test_the_pooled_log_reads_as_the_dense_log(ops):
    log, dense = EventLog(6, DEPTH), DenseLog(6)
    other, other_dense = EventLog(6, DEPTH), DenseLog(6)  # what ``move`` moves into
    t = 0.0
    for op, arg in ops:
        rng = np.random.default_rng(arg)
        n = len(log.next)
        if op == "record":
            t += 1.0
            rows = rng.choice(n, size=rng.integers(1, n + 1), replace=False)
            amounts = np.where(rng.random(rows.size) < 0.5, rng.integers(1, 4, rows.size).astype(float), 0.0)
            amounts[rng.random(rows.size) < 0.1] = np.nan
            log.record(rows, np.full(rows.size, t), amounts)
            dense.record(rows, t, amounts)
        elif op == "clear":
            rows = rng.choice(n, size=rng.integers(1, n + 1), replace=False)
            log.clear(rows)
            dense.clear(rows)
        elif op == "renumber":  # the registry compacts: some rows dropped, the rest renumbered
            keep = np.sort(rng.choice(n, size=rng.integers(1, n + 1), replace=False))
            for a, b in ((log, dense), (other, other_dense)):
                a.resize(len(a.next), keep=keep)
                b.resize(len(b.next), keep=keep)
            log.resize(n, None)
            dense.resize(n, None)
            other.resize(n, None)
            other_dense.resize(n, None)
        elif op == "grow":
            for a, b in ((log, dense), (other, other_dense)):
                a.resize(len(a.next) + arg)
                b.resize(len(b.next) + arg, None)
        elif op == "move":  # events since a cutoff go to another log (a job's crash)
            rows = rng.choice(n, size=rng.integers(1, n + 1), replace=False)
            cutoff = np.full(rows.size, float(rng.integers(0, int(t) + 2)))
            log.move(rows, cutoff, other)
            hit = (dense.times[rows] >= cutoff[:, None]) & (dense.amounts[rows] > 0)
            for i, row in enumerate(rows):  # the reference, one row and one event at a time, oldest first
                for j in np.argsort(np.where(hit[i], dense.times[row], np.inf), kind="stable")[: hit[i].sum()]:
                    other_dense.record(np.asarray([row]), dense.times[row, j], np.asarray([dense.amounts[row, j]]))
                dense.amounts[row] = np.where(hit[i], 0.0, dense.amounts[row])
        elif op == "restart":  # what a restart keeps of a row, given back to a row of a fresh log
            row = int(rng.integers(0, n))
            kept = log.history(row)
            fresh = EventLog(n, DEPTH)
            fresh.restore(row, kept)
            assert fresh.history(row) == kept
            np.testing.assert_array_equal(fresh.next[row], min(len(kept), DEPTH))
        rows = np.arange(len(log.next))
        for cutoff in (0.0, t / 2, t):
            np.testing.assert_array_equal(log.since(cutoff, rows), dense.since(cutoff, rows))
            np.testing.assert_array_equal(other.since(cutoff, rows), other_dense.since(cutoff, rows))
        np.testing.assert_array_equal(log.next, dense.next)
        np.testing.assert_array_equal(log.times(rows), dense.times)
        np.testing.assert_array_equal(log.amounts(rows), dense.amounts)


def test_rows_without_events_hold_no_slots():
    log = EventLog(100_000, DEPTH)
    rows = np.arange(100_000)
    amounts = np.zeros(rows.size)
    amounts[[7, 99_999]] = 2.0
    log.record(rows, np.full(rows.size, 5.0), amounts)
    log.resize(200_000)
    assert log.times(np.arange(200_000)).shape == (200_000, DEPTH)
    pooled = log.times(np.asarray([7, 99_999]))
    np.testing.assert_array_equal(pooled[:, 0], [5.0, 5.0])
    assert np.flatnonzero(log.slot).tolist() == [7, 99_999]
    assert log.since(0.0, rows).sum() == 4.0
    assert log._times.shape[0] < 10  # place 0 and the two rows': not a slot a row
