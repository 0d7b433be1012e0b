"""A cohort's rate centre against numpy's own medians, and the per-row thresholds kept between evaluations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra import policy
from otel_dra.classifier import rates
from otel_dra.classifier.params import PolicyGroups
from otel_dra.classifier.rates import FROM_COHORT, FROM_FLEET, FROM_NONE, SMALL_SORT, centre, group_medians

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 4), finite), min_size=1, max_size=SMALL_SORT + 40))
def test_group_medians_are_numpys(pairs: list[tuple[int, float]]) -> None:
    groups = np.asarray([g for g, _ in pairs], dtype=np.intp)
    data = np.asarray([v for _, v in pairs], dtype=np.float64)
    median, mad, size = group_medians(data, groups, 5)
    for g in range(5):
        members = data[groups == g]
        assert size[g] == members.size
        if members.size:
            m = np.median(members)
            assert median[g] == m  # bit for bit: the verdicts rest on it
            assert mad[g] == np.median(np.abs(members - m))
        else:
            assert np.isnan(median[g]) and np.isnan(mad[g])


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e300])
@pytest.mark.parametrize("n", [4, SMALL_SORT + 1])
def test_a_group_median_with_a_non_finite_or_huge_value_is_numpys(bad: float, n: int) -> None:
    data = np.arange(n, dtype=np.float64)
    data[1] = bad
    median, mad, _ = group_medians(data, np.zeros(n, dtype=np.intp), 1)
    assert np.array_equal(median, [np.median(data)], equal_nan=True)
    assert np.array_equal(mad, [np.median(np.abs(data - np.median(data)))], equal_nan=True)


def test_row_thresholds_are_kept_while_the_rows_and_their_groups_are() -> None:
    groups = PolicyGroups(policy.load(), 8)
    rows = np.arange(4)
    first = groups.at(rows)
    assert groups.at(rows.copy()) is first
    assert first.thermal.min_fraction.shape == (4,)
    with pytest.raises(ValueError):  # shared by the evaluations that follow: no rule may write into it
        first.thermal.min_fraction[0] = 0.0
    assert groups.at(np.arange(3)) is not first
    again = groups.at(rows)
    groups.assign(2, {"hw.vendor": "nvidia", "hw.model": "H100"})  # a new group: the thresholds are read again
    assert groups.at(rows) is not again
    assert groups.device_params(rows) is groups.device_params(rows)


def _centre_by_hand(
    rate: np.ndarray, eligible: np.ndarray, members: np.ndarray, cohort: np.ndarray, least: int
) -> list[tuple[float, float, int, int]]:
    """One counter's centre for each row, device by device with numpy's medians (what :func:`centre` stands for)."""
    ok = eligible & ~np.isnan(rate)
    fleet = rate[ok]
    out = []
    for j in range(rate.size):
        own = rate[ok & (cohort == cohort[j])]
        if np.count_nonzero(members & (cohort == cohort[j])) >= least and own.size:
            m = np.median(own)
            out.append((m, np.median(np.abs(own - m)), FROM_COHORT, own.size))
        elif np.count_nonzero(members) >= least and fleet.size:
            m = np.median(fleet)
            out.append((m, np.median(np.abs(fleet - m)), FROM_FLEET, fleet.size))
        else:
            out.append((0.0, 0.0, FROM_NONE, 0))
    return out


rates_strategy = st.floats(0, 1e4, allow_nan=False, allow_subnormal=False) | st.just(np.nan)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.integers(1, 40).flatmap(
        lambda n: st.tuples(
            st.lists(st.lists(rates_strategy, min_size=n, max_size=n), min_size=1, max_size=3),
            st.lists(st.integers(0, 3), min_size=n, max_size=n),
            st.lists(st.booleans(), min_size=n, max_size=n),
            st.lists(st.booleans(), min_size=n, max_size=n),
        )
    ),
    st.integers(1, 4),
    st.sampled_from([SMALL_SORT, 0]),
)
def test_counters_side_by_side_get_each_its_own_centre(case, least: int, small_sort: int) -> None:
    # Counters judged side by side (Window.rates) share no values: each row's centre is what that counter's rates
    # alone give, device by device, bit for bit; the fleet's centre grouped beside the cohorts' (a small fleet's
    # rates) or counter by counter (``small_sort`` 0: every fleet so).
    rows, cohorts, eligible_list, members_list = case
    rate = np.asarray(rows, dtype=np.float64)
    cohort = np.asarray(cohorts, dtype=np.intp)
    eligible, members = np.asarray(eligible_list), np.asarray(members_list)
    kept, rates.SMALL_SORT = rates.SMALL_SORT, small_sort
    try:
        c = centre(rate, eligible, members, cohort, 4, least)
    finally:
        rates.SMALL_SORT = kept
    for i in range(rate.shape[0]):
        got = list(zip(c.median[i], c.mad[i], c.source[i], c.size[i], strict=True))
        assert got == _centre_by_hand(rate[i], eligible, members, cohort, least)
