"""The long horizon: per device, coarse buckets (1 minute by default) of a few features.

The window store keeps every sample of the last few minutes, which is right for telling a
spike from a trend, but too short for low rates (0.4 corrected errors a minute is two in a
5-minute window) and for faults that come and go (a fan that stalls 2 minutes in every 6 is
never 50% of a 5-minute window). The horizon keeps, per device and bucket, the sums and
counts of a few features over the last ``buckets`` buckets, and running totals over each of
a few *spans* (say the last 15 and 30 buckets), so reading a span is O(devices), like the
window.

Buckets are numbered by the device's own sample times (``floor(t / bucket_s)``), so one
node's clock never moves another's buckets. A span ends at the device's newest bucket.
Running totals are kept in step the way the window's are: when a device moves into a new
bucket, the buckets that leave each span are subtracted and the slots they free are
cleared; a device that skipped buckets (a gap) has each skipped one handled the same way,
a handful of array operations per skipped bucket, never a loop over devices.

Like the window store, the horizon is feature-major: buckets ``(B, features, devices)`` and
totals ``(spans, features, devices)``, a batch of samples ``(features, devices)``.
"""

from __future__ import annotations

import numpy as np

from otel_dra.classifier.numeric import all_of, any_of
from otel_dra.classifier.registry import grown_rows
from otel_dra.classifier.rows import RowIndex, ring_offsets

_NONE = np.iinfo(np.int64).min  # "no bucket yet"


class HorizonStore:
    """Per-row bucket sums and counts of ``features`` features, with totals over ``spans``."""

    def __init__(self, features: int, bucket_s: float, spans: tuple[int, ...], capacity: int) -> None:
        if bucket_s <= 0:
            raise ValueError("the horizon's bucket must be a positive number of seconds")
        if not spans or min(spans) < 1:
            raise ValueError("the horizon needs at least one span of at least one bucket")
        self.features = features
        self.bucket_s = float(bucket_s)
        self.spans = tuple(int(s) for s in spans)
        self.buckets = max(self.spans)
        b = self.buckets
        self.sums = np.zeros((b, features, capacity), dtype=np.float32)
        self.counts = np.zeros((b, features, capacity), dtype=np.uint16)
        self.ids = np.full((b, capacity), _NONE, dtype=np.int64)  # the bucket each slot holds
        self.head = np.full(capacity, _NONE, dtype=np.int64)  # each row's newest bucket
        # Each span's totals, the spans side by side (one call updates all of them: a small fleet's cost is calls).
        self.total_sums = np.zeros((len(self.spans), features, capacity))
        # int32: a span's count is at most its buckets' (uint16 each), far below 2**31.
        self.total_counts = np.zeros((len(self.spans), features, capacity), dtype=np.int32)
        self._span_lengths = np.array(self.spans, dtype=np.int64)[:, None]  # (a column: one span a row)

    @property
    def capacity(self) -> int:
        return int(self.head.shape[0])

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.sums = grown_rows(self.sums, capacity, axis=2, keep=keep)
        self.counts = grown_rows(self.counts, capacity, axis=2, keep=keep)
        self.ids = grown_rows(self.ids, capacity, axis=1, keep=keep)
        self.head = grown_rows(self.head, capacity, keep=keep)
        self.total_sums = grown_rows(self.total_sums, capacity, axis=2, keep=keep)
        self.total_counts = grown_rows(self.total_counts, capacity, axis=2, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        """A row's start state. Its bucket slots' sums and counts are left: a slot is read only while its id is
        the bucket it holds, and zeroed when a bucket enters it."""
        self.ids[:, rows] = _NONE
        self.head[rows] = _NONE
        self.total_sums[:, :, rows] = 0.0
        self.total_counts[:, :, rows] = 0

    def append(self, rows: np.ndarray | RowIndex, time_s: np.ndarray, values: np.ndarray) -> None:
        """One sample per row (rows unique): ``values`` is ``(features, len(rows))``, NaN = absent.
        A sample older than its row's newest bucket is counted in that bucket."""
        ix = RowIndex.of(rows)
        bucket = np.floor(np.asarray(time_s, dtype=np.float64) / self.bucket_s).astype(np.int64)
        head = ix.take(self.head)
        started = head != _NONE
        bucket = np.where(started, np.maximum(bucket, head), bucket)
        gap = np.where(started, bucket - head, 0)
        if any_of(gap):
            self._advance(ix, head, gap)
        fresh = ~started
        if any_of(fresh):  # a row's first sample: its slot is new
            sub, first = _subset(ix, fresh, bucket)
            slot = first % self.buckets
            sub.put_slots(self.sums, slot, 0.0)
            sub.put_slots(self.counts, slot, 0)
            sub.put_slots(self.ids, slot, first)
        ix.put(self.head, bucket)
        valid = ~np.isnan(values)
        add = np.where(valid, values, 0.0).astype(np.float32)  # totals add what the buckets hold
        ix.add_slots((self.sums, self.counts), bucket % self.buckets, (add, valid.astype(np.uint16)))
        ix.add(self.total_sums, add[None], axis=2)  # (every span's: each total gets the one addition it got alone)
        ix.add(self.total_counts, valid[None], axis=2)

    def _advance(self, ix: RowIndex, head: np.ndarray, gap: np.ndarray) -> None:
        """Move rows from bucket ``head`` to ``head + gap``: buckets leave each span, slots free up."""
        # Only the moving rows (a batch's usually all move one bucket: every step below then reads this one index).
        moving = gap > 0
        if not all_of(moving):
            ix, head, gap = RowIndex(ix.rows[moving]), head[moving], gap[moving]
        # Buckets head-span+1 .. head+gap-span leave each span (at most ``span`` of them), the spans side by side:
        # (spans, rows) arrays, each span's totals less its own leaving bucket, where a slot still holds it.
        spans = self._span_lengths
        capacity = self.capacity
        sub, at, far = ix, head, gap
        for k in range(int(min(gap.max(), self.buckets))):
            if k:  # past the first bucket, only the rows that move further (a device back from a gap)
                further = far > k
                sub, at = _subset(sub, further, at)
                far = far[further]
            leaving = at - spans + 1 + k
            slot = leaving % self.buckets
            held = (self.ids.reshape(-1).take(slot * capacity + sub.rows) == leaving) & (k < spans)
            if any_of(held):
                cells = ring_offsets(self.sums.shape)[None] + (slot * (self.features * capacity) + sub.rows)[:, None, :]
                mask = held[:, None, :]
                for totals, ring in ((self.total_sums, self.sums), (self.total_counts, self.counts)):
                    taken = sub.take(totals, axis=2)
                    np.subtract(taken, ring.reshape(-1).take(cells), out=taken, where=mask)
                    sub.written_back(totals, taken, axis=2)
        # Buckets head+1 .. head+gap enter: the newest ``buckets`` of them get a slot each.
        for k in range(int(min(gap.max(), self.buckets))):
            sub, entering = _subset(ix, gap > k, head + gap - k)
            slot = entering % self.buckets
            sub.put_slots(self.sums, slot, 0.0)
            sub.put_slots(self.counts, slot, 0)
            sub.put_slots(self.ids, slot, entering)
        # No float residue where a span now holds nothing (only a moving row had anything taken out).
        empty = ix.take(self.total_counts, axis=2) == 0
        if any_of(empty):
            totals = ix.take(self.total_sums, axis=2)
            np.copyto(totals, 0.0, where=empty)
            ix.written_back(self.total_sums, totals, axis=2)

    def span_sums(self, span_index: int, rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """(sums, counts) of every feature over span ``span_index`` for ``rows``: ``(features, rows)`` each."""
        return self.total_sums[span_index][:, rows], self.total_counts[span_index][:, rows]

    def bucket_sums(self, span_index: int, rows: np.ndarray, feature: int) -> tuple[np.ndarray, np.ndarray]:
        """One feature's (sum, count) in each bucket of span ``span_index`` for ``rows``, oldest first:
        ``(span, rows)`` each, the sum NaN (and the count 0) for a bucket the row has no samples of it in (a
        gap, or before its first). For the shape of a span (how often a condition came and went, and at what
        load), where its totals say only how much."""
        rows = np.asarray(rows, dtype=np.intp)
        span = self.spans[span_index]
        head = self.head[rows]
        wanted = head[None, :] - np.arange(span - 1, -1, -1, dtype=np.int64)[:, None]
        slot = wanted % self.buckets
        held = (head[None, :] != _NONE) & (self.ids[slot, rows[None, :]] == wanted)
        counts = np.where(held, self.counts[slot, feature, rows[None, :]], 0)
        return np.where(counts > 0, self.sums[slot, feature, rows[None, :]], np.nan), counts


def _subset(ix: RowIndex, pick: np.ndarray, values: np.ndarray) -> tuple[RowIndex, np.ndarray]:
    """The picked rows of ``ix`` and their ``values`` (all of them, as they are, when every row is picked)."""
    if all_of(pick):
        return ix, values
    return RowIndex(ix.rows[pick]), values[pick]
