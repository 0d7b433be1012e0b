"""The group statistics the peer rules rest on, against the obvious way: every group's median, MAD and id."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra.classifier import peers
from otel_dra.classifier.peers import dense, grouped_median, grouped_median_mad, load_bins, quantile_of_others

values = st.lists(
    st.tuples(st.integers(0, 6), st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False)), max_size=60
)
#: Both ways of ordering a group's values (peers._order): a small fleet's lexsort, and the scaled key past it.
ORDERINGS = [
    pytest.param(peers.LEXSORT_MAX, id="lexsort"),
    pytest.param(0, id="scaled-key"),
]


@pytest.mark.parametrize("lexsort_max", ORDERINGS)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(values)
def test_grouped_median_and_mad_are_each_groups(lexsort_max: int, pairs: list[tuple[int, float]]) -> None:
    peers.LEXSORT_MAX, kept = lexsort_max, peers.LEXSORT_MAX
    try:
        _each_groups_median(pairs)
    finally:
        peers.LEXSORT_MAX = kept


def _each_groups_median(pairs: list[tuple[int, float]]) -> None:
    groups = np.asarray([g for g, _ in pairs], dtype=np.intp)
    data = np.asarray([v for _, v in pairs], dtype=np.float64)
    median, mad, size = grouped_median_mad(data, groups, 7)
    for g in range(7):
        members = [v for k, v in pairs if k == g]
        assert size[g] == len(members)
        if not members:
            assert np.isnan(median[g]) and np.isnan(mad[g])
            continue
        m = statistics.median(members)
        assert median[g] == m
        assert mad[g] == statistics.median([abs(v - m) for v in members])
    alone, counted = grouped_median(data, groups, 7)
    assert np.array_equal(alone, median, equal_nan=True) and np.array_equal(counted, size)


#: Both ways of numbering (peers.dense): a table of the key space, and the sort past it.
NUMBERINGS = [
    pytest.param((peers.DENSE_TABLE_PER_ROW, peers.DENSE_TABLE_MIN), id="table"),
    pytest.param((0, 0), id="sort"),
]


@pytest.mark.parametrize("table", NUMBERINGS)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(-1, 3), st.integers(0, 2)), min_size=1, max_size=80))
def test_dense_ids_are_one_per_distinct_combination(table: tuple[int, int], rows: list[tuple[int, int, int]]) -> None:
    kept = peers.DENSE_TABLE_PER_ROW, peers.DENSE_TABLE_MIN
    peers.DENSE_TABLE_PER_ROW, peers.DENSE_TABLE_MIN = table
    try:
        ids, n = dense(*[np.asarray(column) for column in zip(*rows, strict=True)])
    finally:
        peers.DENSE_TABLE_PER_ROW, peers.DENSE_TABLE_MIN = kept
    assert n == len(set(rows))
    # Numbered in the order of the combinations (both ways alike: what a group's id says about it is the same).
    number = {combination: i for i, combination in enumerate(sorted(set(rows)))}
    assert ids.tolist() == [number[combination] for combination in rows]


def test_load_bins_count_the_edges_at_or_below():
    util = np.asarray([0.0, 0.29, 0.3, 0.6, 0.85, 1.0, np.nan])
    assert load_bins(util, np.asarray([0.3, 0.6, 0.85])).tolist() == [0, 0, 1, 2, 3, 3, -1]


@pytest.mark.parametrize("lexsort_max", ORDERINGS)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(values, st.sampled_from([0.0, 0.5, 0.75, 0.9, 1.0]))
def test_the_quantile_of_the_others_leaves_the_device_out(
    lexsort_max: int, pairs: list[tuple[int, float]], q: float
) -> None:
    peers.LEXSORT_MAX, kept = lexsort_max, peers.LEXSORT_MAX
    try:
        _quantile_of_others(pairs, q)
    finally:
        peers.LEXSORT_MAX = kept


def _quantile_of_others(pairs: list[tuple[int, float]], q: float) -> None:
    groups = np.asarray([g for g, _ in pairs], dtype=np.intp)
    data = np.asarray([v for _, v in pairs], dtype=np.float64)
    found, others = quantile_of_others(data, groups, 7, q)
    for i, (g, _) in enumerate(pairs):
        rest = [v for j, (k, v) in enumerate(pairs) if k == g and j != i]
        assert others[i] == len(rest)
        if not rest:
            assert np.isnan(found[i])
            continue
        assert found[i] == pytest.approx(np.quantile(np.asarray(rest), q), rel=1e-12, abs=1e-12)
