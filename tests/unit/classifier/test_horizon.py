"""The long horizon's running totals, and each bucket's sum, equal a plain recount, whatever the gaps."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra.classifier.horizon import HorizonStore

BUCKET_S = 60.0


def recount(samples: list[tuple[float, float]], span: int) -> tuple[float, int]:
    """The plain way: each sample's bucket (never before the newest so far), the last ``span`` buckets."""
    head = None
    kept: list[tuple[int, float]] = []
    for t, value in samples:
        bucket = math.floor(t / BUCKET_S)
        head = bucket if head is None else max(head, bucket)
        kept.append((head, value))
    if head is None:
        return 0.0, 0
    inside = [v for b, v in kept if b > head - span and not math.isnan(v)]
    return float(sum(np.float32(v) for v in inside)), len(inside)


def recount_buckets(samples: list[tuple[float, float]], span: int) -> list[float]:
    """The plain way, bucket by bucket: the sum in each of the last ``span`` buckets, oldest first (NaN: none)."""
    head = None
    kept: list[tuple[int, float]] = []
    for t, value in samples:
        bucket = math.floor(t / BUCKET_S)
        head = bucket if head is None else max(head, bucket)
        kept.append((head, value))
    if head is None:
        return [math.nan] * span
    out = []
    for b in range(head - span + 1, head + 1):
        inside = [v for k, v in kept if k == b and not math.isnan(v)]
        out.append(float(sum(np.float32(v) for v in inside)) if inside else math.nan)
    return out


steps = st.lists(
    st.tuples(
        st.sampled_from([0.0, 5.0, 10.0, 59.0, 60.0, 61.0, 300.0, 1800.0, 7200.0, -30.0, -120.0]),
        st.sampled_from([0.0, 1.0, 2.0, 7.0, float("nan")]),
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(rows=st.lists(steps, min_size=1, max_size=4), spans=st.sampled_from([(1, 1), (3, 5), (15, 30), (2, 60)]))
def test_span_totals_match_a_recount(rows: list[list[tuple[float, float]]], spans: tuple[int, int]) -> None:
    store = HorizonStore(1, BUCKET_S, spans, capacity=2)  # grows below: resize is exercised too
    store.resize(len(rows))
    clocks = [1_764_000_000.0 + 17.0 * r for r in range(len(rows))]
    fed: list[list[tuple[float, float]]] = [[] for _ in rows]
    for step in range(max(len(r) for r in rows)):
        live = [r for r in range(len(rows)) if step < len(rows[r])]
        times, values = [], []
        for r in live:
            dt, value = rows[r][step]
            clocks[r] += dt
            times.append(clocks[r])
            values.append(value)
            fed[r].append((clocks[r], value))
        store.append(np.asarray(live), np.asarray(times), np.asarray(values)[None, :])
        for span_index, span in enumerate(spans):
            sums, counts = store.span_sums(span_index, np.arange(len(rows)))
            for r in range(len(rows)):
                want_sum, want_n = recount(fed[r], span)
                assert counts[0, r] == want_n, (r, span, fed[r])
                assert math.isclose(sums[0, r], want_sum, abs_tol=1e-6), (r, span, fed[r])
            each, _ = store.bucket_sums(span_index, np.arange(len(rows)), 0)
            for r in range(len(rows)):
                want = recount_buckets(fed[r], span)
                assert np.allclose(each[:, r], want, atol=1e-6, equal_nan=True), (r, span, fed[r], each[:, r])


def test_a_cleared_row_starts_empty() -> None:
    store = HorizonStore(1, BUCKET_S, (2, 4), capacity=3)
    rows = np.asarray([0, 1])
    store.append(rows, np.asarray([600.0, 600.0]), np.asarray([[1.0, 2.0]]))
    store.clear(np.asarray([1]))
    store.append(rows, np.asarray([660.0, 720.0]), np.asarray([[1.0, 5.0]]))
    sums, counts = store.span_sums(1, rows)
    assert sums[0].tolist() == [2.0, 5.0] and counts[0].tolist() == [2, 1]
