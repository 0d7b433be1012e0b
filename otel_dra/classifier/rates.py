"""A counter's rate against its cohort: robust centres (median, MAD) per cohort, and counts judged
beyond counting noise. The rules' :meth:`~otel_dra.classifier.reader.Window.rate` puts them together."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otel_dra.classifier.numeric import all_of, flatnonzero
from otel_dra.classifier.peers import grouped_median_mad

#: A rate per minute is judged over at least this much time, however young the window.
RATE_MIN_SPAN_S = 60.0
#: Where a rate's centre came from: the device's cohort, the whole fleet, or nowhere (too few).
FROM_COHORT, FROM_FLEET, FROM_NONE = 0, 1, 2
#: Up to this many values a median is read off a sort: np.median's fixed cost is many times a small sort's.
SMALL_MEDIAN = 64
#: Up to this many values, every group's median and MAD come from one sort of them all; values at least
#: ``SORT_BOUND`` (or not finite) take the selections (the sort's key scales them by their range).
SMALL_SORT = 256
SORT_BOUND = 1e150
#: Up to this many groups, a large set of values is grouped by a radix sort of 16-bit group ids (numpy's stable sort
#: of integers of 16 bits or fewer), a few times faster than a sort of 64-bit ones.
RADIX_GROUPS = 1 << 15


def group_medians(values: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(median, MAD, size) of ``values`` per group id in ``0..n_groups-1`` (NaN for an empty group).

    The rows are grouped once (a stable sort of small integers), then each group's median and
    MAD are two linear-time selections over its slice: a loop over the few cohorts, never over
    devices, and no sort of the values themselves. A small fleet's few values are sorted instead, every
    group at once (:func:`~otel_dra.classifier.peers.grouped_median_mad`: the same values, at a fixed cost
    that does not grow with its cohorts)."""
    if values.size <= SMALL_SORT and all_of(np.abs(values) < SORT_BOUND):  # (finite, and far from overflow)
        return grouped_median_mad(values, groups, n_groups)
    size = np.bincount(groups, minlength=n_groups)
    median = np.full(n_groups, np.nan)
    mad = np.full(n_groups, np.nan)
    # Groups in runs already (one cohort, a fleet of one model; counters side by side, each of one cohort) need no
    # grouping; few groups are grouped by a radix sort of 16-bit ids (a stable sort's order is the same whichever).
    if all_of(groups[1:] >= groups[:-1]):
        order = None
    else:
        order = np.argsort(groups.astype(np.int16) if n_groups <= RADIX_GROUPS else groups, kind="stable")
    start = np.concatenate(([0], size.cumsum()[:-1]))
    for g in flatnonzero(size).tolist():
        at = slice(start[g], start[g] + size[g])
        part = values[at] if order is None else values[order[at]]
        median[g] = _median(part)
        mad[g] = _median(np.abs(part - median[g]))
    return median, mad, size


def _median(values: np.ndarray) -> float:
    """``np.median`` of a 1-D array, the same value (the middle one, or the mean of the middle two; NaN when any
    is NaN), without its fixed cost on the small groups of a small fleet."""
    n = values.size
    if n > SMALL_MEDIAN or n == 0:
        return float(np.median(values))
    ordered = values.copy()  # (np.sort's copy and sort, without its Python-level wrapper)
    ordered.sort()  # (NaN sorts last)
    if np.isnan(ordered[-1]):
        return float("nan")
    mid = n // 2
    return float(ordered[mid]) if n % 2 else float((ordered[mid - 1] + ordered[mid]) / 2.0)


@dataclass
class Centre:
    """A rate's robust centre for each row: its cohort's, else the fleet's, else none."""

    median: np.ndarray  # per minute; 0 where there is none
    mad: np.ndarray  # median absolute deviation, per minute
    source: np.ndarray  # FROM_COHORT, FROM_FLEET or FROM_NONE
    size: np.ndarray  # devices the centre was taken over

    def counter(self, i: int) -> Centre:
        """The ``i``-th counter's of a centre of counters side by side (:func:`centre`)."""
        return Centre(self.median[i], self.mad[i], self.source[i], self.size[i])


def centre(
    rate: np.ndarray, eligible: np.ndarray, members: np.ndarray, cohort: np.ndarray, n_cohorts: int, min_devices: int
) -> Centre:
    """Median and MAD of each counter's ``rate`` (``(counters, rows)``: counters side by side, so a small fleet
    pays each numpy call's fixed cost once, not once a counter) over the ``eligible`` rows of each cohort. A cohort
    with fewer than ``min_devices`` ``members`` falls back to the fleet's, and a fleet that small to none; a cohort's
    members count whether or not they have a rate yet (a fleet that just started has a cohort, judged by the few
    that do), but a centre needs at least one rate. The centre's arrays are ``(counters, rows)``."""
    k, n = rate.shape
    at = flatnonzero(eligible & ~np.isnan(rate))  # (counter-major: each counter's rates in one run, in row order)
    counter = at // n
    row = at - counter * n
    values = rate.reshape(-1)[at]
    keys, n_keys = counter * n_cohorts + cohort[row], k * n_cohorts
    fleet: tuple[np.ndarray, np.ndarray] | None = None
    if 2 * values.size <= SMALL_SORT:
        # A small fleet's few rates: each counter's whole fleet's centre beside its cohorts', in the one grouping (its
        # rates again, keyed by the counter alone), not a loop over the counters that fall back to it.
        med, mad, size = group_medians(
            np.concatenate((values, values)), np.concatenate((keys, n_keys + counter)), n_keys + k
        )
        fleet = (med[n_keys:], mad[n_keys:])
        med, mad, size = med[:n_keys], mad[:n_keys], size[:n_keys]
    else:
        med, mad, size = group_medians(values, keys, n_keys)
    med, mad, size = med.reshape(k, n_cohorts), mad.reshape(k, n_cohorts), size.reshape(k, n_cohorts)
    count = np.add.reduce(size, axis=1)  # rates a counter
    known = np.bincount(cohort[members], minlength=n_cohorts)
    # (each row's cohort's, a counter a row: ``take`` along the cohorts, several times faster than ``[:, cohort]``)
    cohort_size = size.take(cohort, axis=1)
    own = (known[cohort] >= min_devices) & (cohort_size > 0)
    fleet_ok = ((int(np.count_nonzero(members)) >= min_devices) & (count > 0))[:, None]
    fleet_med, fleet_mad = fleet or (np.zeros(k), np.zeros(k))  # (read only where a row falls back and there are rates)
    end = count.cumsum()
    # Else the fleet's centre, of the counters some row falls back to (a loop over the few counters, never devices).
    for c in [] if fleet else flatnonzero(fleet_ok[:, 0] & ~own.all(axis=1)).tolist():
        held = flatnonzero(size[c])
        if held.size == 1:  # one cohort holds every rate (a fleet of one model): the fleet's centre is its own
            fleet_med[c], fleet_mad[c] = med[c, held[0]], mad[c, held[0]]
        else:
            part = values[end[c] - count[c] : end[c]]
            fleet_med[c] = _median(part)
            fleet_mad[c] = _median(np.abs(part - fleet_med[c]))
    source = np.where(own, FROM_COHORT, np.where(fleet_ok, FROM_FLEET, FROM_NONE)).astype(np.int8)
    return Centre(
        median=np.where(own, med.take(cohort, axis=1), np.where(fleet_ok, fleet_med[:, None], 0.0)),
        mad=np.where(own, mad.take(cohort, axis=1), np.where(fleet_ok, fleet_mad[:, None], 0.0)),
        source=source,
        size=np.where(own, cohort_size, np.where(fleet_ok, count[:, None], 0)),
    )


def above(count: np.ndarray, minutes: np.ndarray, bar: np.ndarray, z: np.ndarray | float) -> np.ndarray:
    """Whether ``count`` events in ``minutes`` are a rate above ``bar`` per minute beyond counting
    noise: ``z`` deviations above the expected count on the square-root scale, where Poisson
    counts have a variance of about 1/4 whatever their mean (Anscombe), so a short window or a
    low rate needs clearer evidence than a long one, and 8 errors where 2 were due (a normal
    approximation's 4 deviations) are not taken for more than the luck they often are."""
    expected = np.maximum(bar * minutes, 0.0)
    with np.errstate(invalid="ignore"):
        return 2.0 * (np.sqrt(np.fmax(count, 0.0)) - np.sqrt(expected)) > z  # (fmax: a NaN count is 0)


@dataclass
class RateVerdict:
    """A counter rate judged against its bars, with what a message needs to say why."""

    flagged: np.ndarray  # bool: the window's or the span's rate is above its bar
    window_rate: np.ndarray  # per minute over the window
    span_rate: np.ndarray  # per minute over the horizon's rate span
    span_minutes: np.ndarray
    centre: Centre
    ratio: np.ndarray  # span rate / its centre (NaN where there is no centre)
