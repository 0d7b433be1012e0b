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
    # One cohort (a fleet of one model) needs no grouping.
    order = None if np.count_nonzero(size) == 1 else np.argsort(groups, kind="stable")
    start = np.concatenate(([0], np.cumsum(size)[:-1]))
    for g in flatnonzero(size).tolist():
        part = values if order is None else values[order[start[g] : start[g] + size[g]]]
        median[g] = _median(part)
        mad[g] = _median(np.abs(part - median[g]))
    return median, mad, size


def _median(values: np.ndarray) -> float:
    """``np.median`` of a 1-D array, the same value (the middle one, or the mean of the middle two; NaN when any
    is NaN), without its fixed cost on the small groups of a small fleet."""
    n = values.size
    if n > SMALL_MEDIAN or n == 0:
        return float(np.median(values))
    ordered = np.sort(values)  # (NaN sorts last)
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


def centre(
    rate: np.ndarray, eligible: np.ndarray, members: np.ndarray, cohort: np.ndarray, n_cohorts: int, min_devices: int
) -> Centre:
    """Median and MAD of ``rate`` over the ``eligible`` rows of each cohort. A cohort with fewer than
    ``min_devices`` ``members`` falls back to the fleet's, and a fleet that small to none; a cohort's
    members count whether or not they have a rate yet (a fleet that just started has a cohort,
    judged by the few that do), but a centre needs at least one rate."""
    pick = eligible & ~np.isnan(rate)
    values, groups = rate[pick], cohort[pick]
    med, mad, size = group_medians(values, groups, n_cohorts)
    only = flatnonzero(size)
    if only.size == 1:  # one cohort holds every rate (a fleet of one model): the fleet's centre is its own
        fleet_med, fleet_mad = float(med[only[0]]), float(mad[only[0]])
    elif values.size:
        fleet_med = _median(values)
        fleet_mad = _median(np.abs(values - fleet_med))
    else:
        fleet_med = fleet_mad = 0.0
    known = np.bincount(cohort[members], minlength=n_cohorts)
    own = (known[cohort] >= min_devices) & (size[cohort] > 0)
    fleet_ok = (int(members.sum()) >= min_devices) & (values.size > 0)
    source = np.where(own, FROM_COHORT, np.where(fleet_ok, FROM_FLEET, FROM_NONE)).astype(np.int8)
    return Centre(
        median=np.where(own, med[cohort], np.where(fleet_ok, fleet_med, 0.0)),
        mad=np.where(own, mad[cohort], np.where(fleet_ok, fleet_mad, 0.0)),
        source=source,
        size=np.where(own, size[cohort], np.where(fleet_ok, values.size, 0)),
    )


def above(count: np.ndarray, minutes: np.ndarray, bar: np.ndarray, z: np.ndarray) -> np.ndarray:
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
