"""Judging a device against its peers under the same load: robust statistics over groups of rows.

Healthy load is not a fault (telemetry contract §4): a training job holds every GPU of its node at its
power cap and some degrees under its slowdown limit for hours. What points at one device is how it
compares with devices doing the same thing:

- **temperature** against its node's devices (the same inlet air, usually the same job), corrected for
  a different utilization by the cohort's measured slope and for its slot by the same slot on other
  nodes (a rear slot that always runs hotter is not a fault): :func:`thermal_residuals`;
- **power-cap time** against the cohort's devices in the same utilization bin: :func:`load_bins`
  with :func:`grouped_median` over (cohort, bin) groups.

Everything is array work over the rows: medians of many small groups (a fleet's nodes) come from one
sort of a composite key, never a loop over groups or devices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otel_dra.classifier.numeric import any_of, flatnonzero, nan_to_num, nans, shaped
from otel_dra.classifier.registry import grown_rows

#: 1 / Φ⁻¹(3/4): a MAD times this estimates a normal spread's standard deviation.
MAD_SCALE = 1.4826
#: Utilization difference from the node's median below which a device says nothing about the slope.
SLOPE_MIN_SPREAD = 0.1
#: Devices of a cohort in one utilization bin its own spread of residuals is taken over (fewer: the cohort's).
SPREAD_MIN_DEVICES = 8
#: How far from its peers' median utilization a device is still judged at the same load.
SAME_LOAD = 0.1
#: Devices with such a difference a cohort needs before its own slope replaces the policy's.
SLOPE_MIN_DEVICES = 4
#: Devices that stand for a slot (``reference``) its effect is taken from: the median of one is that device.
SLOT_MIN_REFERENCES = 2
#: Up to this many values :func:`_order` is one ``np.lexsort`` (measured on grouped rows: 5 us against the scaled
#: key's 11 at 256 values, 10-14 against 15 at 512; past ~1,000 values of a continuous spread, ~2,000 with ties, the
#: key's one argsort is the faster). A small fleet's power-cap pools (its devices copied into each load level) hold
#: a few hundred.
LEXSORT_MAX = 512


#: :func:`dense` numbers its keys with a table of the key space while that space is at most this many keys a row
#: (and ``DENSE_TABLE_MIN`` more): a cumulative count over it costs less than a sort of the rows.
DENSE_TABLE_PER_ROW = 8
DENSE_TABLE_MIN = 1024


def _order(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Indices sorting ``values`` by (group, value). One argsort of ``group + scaled value``, a key that is
    nearly sorted already when rows come grouped (a node's devices hold neighbouring rows); where that key's
    rounding put two values of a group out of order (they differ by less than its resolution), the exact
    two-pass sort instead. A small fleet's few values: one lexsort (equal values may come in another order, the
    values in order are the same)."""
    if values.size <= LEXSORT_MAX:
        return np.lexsort((values, groups))
    lo = float(values.min())
    span = float(values.max()) - lo
    scaled = (values - lo) / span * 0.999 if span > 0 else np.zeros_like(values)
    order = np.argsort(groups.astype(np.float64) + scaled, kind="quicksort")
    g, v = groups[order], values[order]
    if bool(((g[1:] == g[:-1]) & (v[1:] < v[:-1])).any()):
        by_value = np.argsort(values, kind="stable")
        order = by_value[np.argsort(groups[by_value], kind="stable")]
    return order


def grouped_median(values: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(median, size) of ``values`` per group id in ``0..n_groups-1`` (median NaN for an empty group); the
    values must not be NaN."""
    size = np.bincount(groups, minlength=n_groups)
    if values.size == 0:
        return nans(n_groups), size
    return _Middles(size).median(values, groups), size


class _Middles:
    """Where each non-empty group's middle values sit once its members are in order (by group, then value): the
    same for every set of values over one grouping, so a MAD reads its deviations' medians off the medians' work."""

    def __init__(self, size: np.ndarray) -> None:
        self.n_groups = size.size
        start = size.cumsum() - size
        self.some = flatnonzero(size)
        self.lo = start[self.some] + (size[self.some] - 1) // 2
        self.hi = start[self.some] + size[self.some] // 2

    def median(self, values: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Each group's median of ``values`` (NaN for an empty group)."""
        ordered = values[_order(values, groups)]
        median = nans(self.n_groups)
        median[self.some] = 0.5 * (ordered[self.lo] + ordered[self.hi])
        return median


def grouped_median_mad(
    values: np.ndarray, groups: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(median, MAD, size) of ``values`` per group (NaN for an empty group)."""
    size = np.bincount(groups, minlength=n_groups)
    if values.size == 0:
        return nans(n_groups), nans(n_groups), size
    middles = _Middles(size)
    median = middles.median(values, groups)
    return median, middles.median(np.abs(values - median[groups]), groups), size


def quantile_of_others(
    values: np.ndarray, groups: np.ndarray, n_groups: int, q: float
) -> tuple[np.ndarray, np.ndarray]:
    """For each element, the ``q`` quantile (linear between order statistics, numpy's default method) of the other
    members of its group, and how many there are (NaN where none): a device is not its own peer, and a high
    quantile of a handful of peers would otherwise be the device itself."""
    n = values.size
    out = nans(n)
    if n == 0:
        return out, np.zeros(0, dtype=np.intp)
    order = _order(values, groups)
    ordered = values[order]
    size = np.bincount(groups, minlength=n_groups)
    start = size.cumsum() - size
    rank = np.empty(n, dtype=np.intp)
    rank[order] = np.arange(n) - start[groups[order]]
    others = size[groups] - 1
    some = flatnonzero(others >= 1)
    if some.size:
        m, r, first = others[some], rank[some], start[groups[some]]
        pos = q * (m - 1)
        lo = np.floor(pos)
        frac = pos - lo
        lo_i = lo.astype(np.intp)
        hi_i = np.minimum(lo_i + 1, m - 1)
        v_lo = ordered[first + lo_i + (lo_i >= r)]  # the others' j-th is the group's j-th, or the next past itself
        v_hi = ordered[first + hi_i + (hi_i >= r)]
        out[some] = v_lo + frac * (v_hi - v_lo)
    return out, others


@dataclass
class ThermalResiduals:
    """Each row's temperature above what its peers at its load say it should run at (NaN: not judged)."""

    residual: np.ndarray  # Cel: the window mean's excess over the expectation
    sigma: np.ndarray  # Cel: the cohort's robust spread of residuals (1.4826 x MAD)
    peers: np.ndarray  # devices the expectation was taken over (its node's, of its cohort, at its load)
    # The expectation at utilization u is base + slope x u (per row), so that each sample can be judged too.
    base: np.ndarray
    slope: np.ndarray
    node_temp: np.ndarray  # the peers' median window temperature (for the message)
    node_util: np.ndarray  # ... and utilization
    # Cel: what its slot elsewhere and its peers' median residual took out (the slot effect and the polish):
    # residual + offset is its excess over its node's devices at its load, which no other node's load moves.
    offset: np.ndarray
    # Whether its slot's effect was known (its slot on ``min_slot_nodes`` loaded nodes of its cohort): where not,
    # its residual still holds it, and the bar is the wider ``unknown_slot_margin``.
    slot_known: np.ndarray

    @classmethod
    def none(cls, n: int) -> ThermalResiduals:
        """``n`` rows, none judged: NaN throughout, no peers, no slot known."""
        fields = ("residual", "sigma", "peers", "base", "slope", "node_temp", "node_util", "offset")
        block = nans((len(fields), n))  # (one array, each field a row of it: one allocation, not eight)
        out = cls(**dict(zip(fields, block, strict=True)), slot_known=np.zeros(n, dtype=bool))
        out.peers[:] = 0.0
        return out


def dense(*keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Group ids 0..n-1 for the distinct combinations of the integer arrays ``keys`` (row-wise), numbered in the
    order of their combined key, and n: one int64 key in mixed radix, then, where those keys span at most
    ``DENSE_TABLE_PER_ROW`` a row, a table of the keys present (a small fleet's few dozen rows: no sort), else
    one stable sort (nearly sorted already when rows come grouped by node)."""
    if keys[0].size == 0:
        return np.zeros(0, dtype=np.intp), 0
    combined = np.zeros(keys[0].shape, dtype=np.int64)
    span = 1
    for k in keys:
        k = k.astype(np.int64)
        lo, hi = int(k.min()), int(k.max())
        combined = combined * (hi - lo + 1) + (k - lo)
        span *= hi - lo + 1
    if span <= DENSE_TABLE_PER_ROW * combined.size + DENSE_TABLE_MIN:
        present = np.zeros(span, dtype=np.intp)
        present[combined] = 1
        number = present.cumsum() - 1  # each present key's place among them, in key order
        return number[combined], int(number[-1]) + 1
    order = np.argsort(combined, kind="stable")
    ordered = combined[order]
    starts = np.concatenate(([True], ordered[1:] != ordered[:-1]))
    ids = np.empty(combined.shape, dtype=np.intp)
    ids[order] = starts.cumsum() - 1
    return ids, int(starts.sum())


def thermal_residuals(
    temp: np.ndarray,
    util: np.ndarray,
    judged: np.ndarray,
    node: np.ndarray,
    cohort: np.ndarray,
    n_cohorts: int,
    slot: np.ndarray,
    n_slots: int,
    edges: np.ndarray,
    default_slope: np.ndarray,
    min_node_devices: np.ndarray,
    min_slot_nodes: np.ndarray,
    min_utilization: np.ndarray,
    reference: np.ndarray,
) -> ThermalResiduals:
    """How much hotter each ``judged`` row runs than its peers at its load (per row: window means ``temp``
    and ``util``, its ``node``, ``cohort`` and ``slot`` group, whether it may stand for its slot
    (``reference``); the rest are per-row policy values).

    1. Peers are the devices of its node and cohort in its utilization bin (``edges``, :func:`load_bins`):
       the same inlet air and, usually, the same job; only groups of ``min_node_devices`` are judged.
    2. A utilization difference within the bin is worth the cohort's slope: the median of its devices'
       temperature-over-utilization differences from their node's median where they differ enough (at
       least ``SLOPE_MIN_DEVICES`` of them), else ``default_slope``.
    3. The slot's effect: the median residual of the same slot on the nodes of the cohort, over its ``reference``
       rows (at least ``SLOT_MIN_REFERENCES``), where the slot is on ``min_slot_nodes`` nodes under load (their
       peers' utilization at ``min_utilization`` or more: a slot adds the heat of the GPUs upstream, which an idle
       node has not, so idle nodes alone do not make it known), taken out; then the peers' median residual, taken
       out again (one round of median polish). A device already found running hot or cool for a cause of its own
       (slowed, throttled, braked, a fan out) says nothing of its slot's airflow: with three nodes of a model, one
       slowed GPU running 17 Cel under its node would otherwise make its slot look cool everywhere, and the healthy
       GPU in that slot of another node look hot.
    4. The spread: 1.4826 x the MAD of the residuals of its cohort's devices in its utilization bin (of its
       whole cohort while that bin holds fewer than ``SPREAD_MIN_DEVICES``).
    """
    n = temp.shape[0]
    out = ThermalResiduals.none(n)
    rows = flatnonzero(judged & ~np.isnan(temp))
    # No node with as many devices as a peer group needs (a fleet of one-GPU nodes): nobody is judged, and a
    # group is one node's, so this says so before any of the work below.
    if rows.size == 0 or int(np.bincount(node[rows]).max()) < int(min_node_devices[rows].min()):
        return out
    t, u, co = temp[rows], util[rows], cohort[rows]
    known_u = ~np.isnan(u)
    # The cohort's slope, from every device's difference to its node's (same cohort) medians.
    host, n_hosts = dense(node[rows], co)
    host_t, host_u = _medians_of_two(t, host, u[known_u], host[known_u], n_hosts)
    with np.errstate(invalid="ignore", divide="ignore"):
        du = u - host_u[host]
        spread = known_u & (np.abs(du) >= SLOPE_MIN_SPREAD)
        cohort_slope, counted = grouped_median((t - host_t[host])[spread] / du[spread], co[spread], n_cohorts)
    own = (counted >= SLOPE_MIN_DEVICES) & ~np.isnan(cohort_slope)
    slope = np.clip(np.where(own[co], cohort_slope[co], default_slope[rows]), 0.0, 200.0)
    # Peers: its node's devices of its cohort at comparable load.
    bins = load_bins(u, edges)
    peer, n_peers = dense(node[rows], co, bins)
    size = np.bincount(peer, minlength=n_peers)
    med_t, med_u = _medians_of_two(t, peer, u[known_u], peer[known_u], n_peers)
    # Judged: devices with enough peers, at nearly their peers' load (a slope is a straight line through a curve
    # that lags: extrapolated far, its error is the size of a fault).
    with np.errstate(invalid="ignore"):
        near = ~(np.abs(u - med_u[peer]) > SAME_LOAD)
    keep = (size[peer] >= min_node_devices[rows]) & near
    rows, t, u, co, peer, slope, bins = rows[keep], t[keep], u[keep], co[keep], peer[keep], slope[keep], bins[keep]
    centre_u = np.where(np.isnan(med_u[peer]), 0.0, med_u[peer])
    slope = np.where(np.isnan(u) | np.isnan(med_u[peer]), 0.0, slope)
    r = t - med_t[peer] - slope * (nan_to_num(u) - centre_u)
    sl = slot[rows]
    with np.errstate(invalid="ignore"):
        loaded = med_u[peer] >= min_utilization[rows]
    ref = reference[rows]
    slot_size = np.bincount(sl[loaded], minlength=n_slots)
    slot_med, refs = grouped_median(r[ref], sl[ref], n_slots)
    known = (slot_size[sl] >= min_slot_nodes[rows]) & (refs[sl] >= SLOT_MIN_REFERENCES)
    effect = np.where(known, slot_med[sl], 0.0)
    r = r - effect
    again, _ = grouped_median(r, peer, n_peers)
    r = r - again[peer]
    # The spread of residuals at its load (a bursty inference replica's temperature follows its traffic less
    # closely than a training job's): its cohort's in its utilization bin, from SPREAD_MIN_DEVICES, else its
    # cohort's.
    # (Both groupings in one pass: each group's MAD is its own members', whatever else is sorted beside them.)
    regime, n_regimes = dense(co, bins)
    _, mads, sizes = grouped_median_mad(
        np.concatenate([r, r]), np.concatenate([co, n_cohorts + regime]), n_cohorts + n_regimes
    )
    mad, regime_mad, regime_size = mads[:n_cohorts], mads[n_cohorts:], sizes[n_cohorts:]
    spread = np.where(regime_size[regime] >= SPREAD_MIN_DEVICES, regime_mad[regime], mad[co])
    out.residual[rows] = r
    out.sigma[rows] = MAD_SCALE * spread
    out.peers[rows] = size[peer]
    # expectation(u) = med_t + slope (u - med_u) + effect + again = base + slope u
    out.base[rows] = med_t[peer] - slope * centre_u + effect + again[peer]
    out.slope[rows] = slope
    out.offset[rows] = effect + again[peer]
    out.slot_known[rows] = known
    out.node_temp[rows] = med_t[peer]
    out.node_util[rows] = med_u[peer]
    return out


def _medians_of_two(
    a: np.ndarray, a_groups: np.ndarray, b: np.ndarray, b_groups: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """The medians of ``a`` and of ``b`` per group of the same ``n_groups``, in one pass (each group's median is
    its own members' whatever is sorted beside them: one call's fixed cost instead of two)."""
    both, _ = grouped_median(np.concatenate([a, b]), np.concatenate([a_groups, n_groups + b_groups]), 2 * n_groups)
    return both[:n_groups], both[n_groups:]


def load_bins(util: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each row's utilization bin (0 .. len(edges)); -1 where its utilization is unknown."""
    return np.where(np.isnan(util), -1, edges.searchsorted(nan_to_num(util), side="right"))


class PeerHistory:
    """What earlier evaluations said of each device against its peers (its own clock): since when it has run
    hotter than them, at every evaluation that could judge it (NaN: it does not, or was judged not to since),
    and how much hotter it usually runs (``baseline``, Cel: a moving average of its excess over its node's
    devices at its load, :attr:`ThermalResiduals.offset` not taken out, over ``history_s`` seconds of being
    judged). Devices of one model differ by a few degrees for good (paste, the die, the heatsink's seat); a
    device that turns several degrees hotter than it was, at the same load, has changed. A rule's input,
    updated after each evaluation by :meth:`update`; not kept across a restart (the baseline is learnt
    again)."""

    def __init__(self, capacity: int) -> None:
        self.hot_since = np.full(capacity, np.nan)
        self.baseline = np.full(capacity, np.nan)
        self.history_s = np.zeros(capacity)
        self.judged_at = np.full(capacity, np.nan)

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.hot_since = grown_rows(self.hot_since, capacity, keep=keep)
        self.baseline = grown_rows(self.baseline, capacity, keep=keep)
        self.history_s = grown_rows(self.history_s, capacity, keep=keep)
        self.judged_at = grown_rows(self.judged_at, capacity, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        self.hot_since[rows] = np.nan
        self.baseline[rows] = np.nan
        self.history_s[rows] = 0.0
        self.judged_at[rows] = np.nan

    def update(
        self,
        rows: np.ndarray,
        now_s: np.ndarray,
        hot: np.ndarray,
        judged: np.ndarray,
        residual: np.ndarray,
        learn: np.ndarray,
        tau_s: np.ndarray,
    ) -> None:
        """After an evaluation: rows ``hot`` now keep (or start) their time; rows judged and not hot start over;
        rows without peers to judge them keep what they had (no news). Rows to ``learn`` from (judged, neither
        hot now nor held hot) move their baseline toward ``residual`` with time constant ``tau_s`` (a fault is
        not learnt as the device's normal)."""
        since = self.hot_since[rows]
        kept = np.where(judged, np.nan, since)
        self.hot_since[rows] = np.where(hot, np.where(np.isnan(since), now_s, since), kept)
        learn = learn & ~np.isnan(residual)
        if not any_of(learn):
            return
        r = rows[learn]
        now = shaped(np.asarray(now_s, dtype=np.float64), rows.shape)[learn]
        # The time since it was last learnt from, at most one time constant (a device back after a day away is
        # not the same step).
        step = np.clip(np.nan_to_num(now - self.judged_at[r], nan=0.0), 0.0, tau_s[learn])
        base = self.baseline[r]
        weight = 1.0 - np.exp(-step / tau_s[learn])
        self.baseline[r] = np.where(np.isnan(base), residual[learn], base + weight * (residual[learn] - base))
        self.history_s[r] += step
        self.judged_at[r] = now
