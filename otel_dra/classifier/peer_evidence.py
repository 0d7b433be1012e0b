"""Evidence against peers under the same load, read from the rows' windows: temperature against the
node's devices (:func:`thermal_peers`) and power-cap time against the cohort at comparable load
(:func:`cap_peers`). The statistics are :mod:`otel_dra.classifier.peers`'; what they judge is here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from otel_dra.classifier.features import F
from otel_dra.classifier.layout import DUTY_SPAN, RATE_SPAN, R
from otel_dra.classifier.numeric import all_of, flatnonzero, nan_to_num, nans
from otel_dra.classifier.peers import (
    LEXSORT_MAX,
    ThermalResiduals,
    dense,
    grouped_median,
    load_bins,
    quantile_of_others,
    thermal_residuals,
)

if TYPE_CHECKING:
    from otel_dra.classifier.reader import Window

#: Reasons whose evidence is the device's own heat or its cause (slowed, throttled, braked, a fan out): while one
#: is on, the device runs hot or cool for itself and does not stand for its slot (:func:`thermal_residuals`).
HEAT_REASONS: Final = np.array([R[r] for r in ("thermal", "cooling", "power_delivery", "power_throttling")])
#: Devices judged (over the three spans) up to which :func:`cap_peers` pools every level beside the own bins in one
#: pass (a few dozen devices: each numpy call's fixed cost is most of the work); past it only the levels some
#: device needs are pooled, after its own bin's pass (a large fleet's full bins need none: no copies made).
POOLS_AT_ONCE: Final = 256


@dataclass
class ThermalPeers:
    """Devices running hotter than their peers at the same load (:meth:`Window.thermal_peers`)."""

    flagged: np.ndarray  # bool: hotter than its peers (its samples' median too) for ``sustain``: the evidence
    hot: np.ndarray  # bool: its window mean hotter than its peers' now (what PeerHistory keeps the time of)
    judged: np.ndarray  # bool: had peers to be judged against now
    residuals: ThermalResiduals
    bar: np.ndarray  # Cel above the expectation that flags (lowered while the reason is on)
    baseline: np.ndarray  # Cel it usually runs above its peers (as residuals are now), where that set the bar


@dataclass
class CapPeers:
    """Power-cap time against peers at comparable load (:meth:`Window.cap_peers`): per span (the window, the
    duty span, the rate span) each device's share of time capped and its peers' reference share (NaN: no
    peers)."""

    # (spans, rows) each, the spans in this order: the window, the duty span, the rate span.
    shares: np.ndarray  # its share of the span's time at its power cap
    references: np.ndarray  # the peer_quantile of its peers' shares, itself left out (NaN: too few)
    node_medians: np.ndarray  # the median share of its node's devices of its cohort (NaN: too few)
    util: np.ndarray  # the window's mean utilization
    limit: np.ndarray  # its power limit over the window, W (reported, or seen: the power it drew while capped)
    limit_median: np.ndarray  # its cohort's median reported limit; a seen one's, its node's devices' of its cohort
    limit_seen: np.ndarray  # whether its limit is seen, not reported (no limit series)


def thermal_peers(w: Window) -> ThermalPeers:
    """Each device's temperature against its peers at the same load (``rules.thermal.peers``): flagged when
    both its window mean and the median of its window's samples run ``max(margin, mad_k x spread)`` above
    what its node's devices, its slot elsewhere and its utilization say (``hold_ratio`` of that while
    ``thermal`` is on), at every evaluation for ``sustain``; not judged while its peers run under
    ``min_utilization``."""
    g, rows = w.groups, w.rows
    p = w.params.thermal.peers
    on = w.on[:, R["thermal"]]
    hold = np.where(on, p.hold_ratio, 1.0)
    # No node with as many devices as a peer group needs (a fleet of one-GPU nodes): nobody is judged, said before
    # any of the work below (thermal_residuals says the same of the judged rows, a subset of these). What is on
    # stays on; the bar is the one with no slot known and no spread.
    if w.no_node_holds(p.min_node_devices):
        return _nobody(w, on, ThermalResiduals.none(rows.shape[0]), hold * p.unknown_slot_margin)
    # Judged only with its utilization known: without it, a GPU running a heavier job than its neighbours (each GPU
    # its own job, no utilization series) is hotter than them for its load, and nothing says which.
    judged = p.enabled & w.fresh & (w.counts[F.TEMP_MAX] >= w.min_samples) & (w.counts[F.UTIL] >= w.min_samples)
    res = thermal_residuals(
        w.mean(F.TEMP_MAX),
        w.mean(F.UTIL),
        judged,
        w.nodes,
        g.cohort[rows],
        len(g.cohort_names),
        g.slot[rows],
        g.n_slots,
        g.policy.cohorts.load_bins,
        p.slope,
        p.min_node_devices,
        p.min_slot_nodes,
        p.min_utilization,
        ~np.logical_or.reduce(w.on[:, HEAT_REASONS], axis=1),
    )
    # Where its slot's effect is not known (too few loaded nodes of its model), its residual holds it: a rear slot runs
    # several Cel over its node's front row at full load, so the bar is wider there.
    margin = np.where(res.slot_known, p.margin, p.unknown_slot_margin)
    bar = hold * np.fmax(margin, p.mad_k * res.sigma)
    if all_of(np.isnan(res.residual)):  # nobody judged (too few loaded peers): what is on stays on
        return _nobody(w, on, res, bar)
    # Or hotter than it usually runs against the same peers (`change_margin` over its baseline, and at least
    # `change_floor` over them), once it has `history` of being judged: a device that always ran 3 Cel over
    # its peers is that device; one that now runs 6 Cel over them where it ran 1 Cel has changed. The baseline
    # is its usual excess over its node's devices (residual + offset): what its slot on other nodes says moves
    # as those nodes come, go and change load, and a device is not changed by that; it is judged here less
    # what the slot and the polish take out now.
    known = (w.history_s >= p.history) & ~np.isnan(w.baseline)
    usual = w.baseline - res.offset
    own = np.fmax(w.baseline + hold * p.change_margin, hold * p.change_floor) - res.offset
    with np.errstate(invalid="ignore"):
        changed = known & (own < bar)
    bar = np.where(changed, own, bar)
    # At light load there is little heat to tell devices apart by (a checkpoint's dip, an idle node): no news.
    with np.errstate(invalid="ignore"):
        light = res.node_util < p.min_utilization
        judged = ~np.isnan(res.residual) & ~light
        hot = judged & (res.residual >= bar)
    flagged = hot.copy()
    some = flatnonzero(flagged)
    if some.size:  # a few devices: their samples' median, so that one spike is not heat
        r = rows[some]
        temps = w.store.samples(r, F.TEMP_MAX)
        utils = w.store.samples(r, F.UTIL)
        utils = np.where(np.isnan(utils), res.node_util[some], utils)
        expected = res.base[some] + res.slope[some] * nan_to_num(utils)
        with np.errstate(invalid="ignore"):
            typical = np.nanmedian(temps - expected, axis=0)
        flagged[some] = typical >= bar[some]
    # Sustained: a device has run that hot, judged at every evaluation, for ``sustain`` (a load change or a
    # job's start moves a node's temperatures for a few minutes; dried paste stays).
    # Once on, it stays on while it is still that hot, or while it has no peers to be judged against (no news
    # is not a repair).
    since = np.where(np.isnan(w.hot_since), w.now_s, w.hot_since)
    sustained = w.now_s - since >= p.sustain
    held = (flagged & (sustained | on)) | (on & ~judged & ~np.isnan(w.hot_since))
    return ThermalPeers(held, hot, judged, res, bar, np.where(changed, usual, np.nan))


def _nobody(w: Window, on: np.ndarray, res: ThermalResiduals, bar: np.ndarray) -> ThermalPeers:
    """:func:`thermal_peers` where nobody was judged: what is on stays on (no news is not a repair)."""
    n = w.rows.shape[0]
    nobody = np.zeros((2, n), dtype=bool)
    return ThermalPeers(on & ~np.isnan(w.hot_since), nobody[0], nobody[1], res, bar, nans(n))


def cap_peers(w: Window) -> CapPeers:
    """Each device's power-cap time against its cohort's devices at comparable load: the same
    utilization bin (``cohorts.load_bins``), or, when that holds fewer than ``min_peers`` (itself
    included), every device at least as loaded (its bin and the bins above: a device under more load is
    capped at least as often, so this errs toward quiet); the reference is a high quantile
    (``peer_quantile``) of theirs, itself left out: devices differ by several percent in the power they draw
    for the same work, so at the same utilization some sit at the cap much more than others. No such
    peers: not judged (its reference NaN)."""
    g, rows = w.groups, w.rows
    edges = g.policy.cohorts.load_bins
    n_bins = edges.size + 1
    # Each span against peers at comparable load over that span: the window's utilization for its share,
    # the duty span's for its (a peer that dipped for a checkpoint ten minutes ago was not at this load then).
    utils = (w.mean(F.UTIL), w.span_mean(F.UTIL, DUTY_SPAN), w.span_mean(F.UTIL, RATE_SPAN))
    shares = (
        w.share(F.THROTTLE_POWER),
        w.span_share(F.THROTTLE_POWER, DUTY_SPAN),
        w.span_share(F.THROTTLE_POWER, RATE_SPAN),
    )
    ready = w.fresh & (w.samples >= w.min_samples)
    spans = (ready, ready & w.covered(DUTY_SPAN), ready & w.covered(RATE_SPAN))
    cohort = g.cohort[rows]
    n_cohorts = len(g.cohort_names)
    n = rows.shape[0]
    least = w.params.power_throttling.min_peers
    q = float(g.base.power_throttling.peer_quantile[0])
    # The three spans side by side (span s's rows at s*n ..): each group below is of one span, so one pass over
    # all of them gives what one pass a span (and a bin) would, at one call's fixed cost, not fifteen.
    n_spans = len(spans)
    share = np.concatenate(shares)
    b = load_bins(np.concatenate(utils), edges)
    eligible = flatnonzero(np.concatenate(spans) & (b >= 0))
    span = eligible // n
    row = eligible - span * n
    group = span * n_cohorts + cohort[row]  # (span, cohort)
    peers = np.concatenate((least,) * n_spans)
    # Its node's devices of its cohort (the same job, usually): a training node at its cap beside a fleet of
    # inference replicas at the same utilization is not four devices capped far more than their peers. With a
    # reported limit against its cohort's (below): a small fleet's medians of both in one grouping (one call's fixed
    # cost); past a lexsort's size apart (the one sort's scaled key would order shares and watts together coarsely);
    # where no node holds ``least`` devices (a fleet of one-GPU nodes), no node's group is large enough: the limits'
    # alone.
    limit = w.mean(F.POWER_LIMIT)
    seen = w.counts[F.POWER_PINNED] == 0
    known = w.fresh & ~np.isnan(limit) & (~seen | (w.counts[F.POWER_LIMIT] >= w.min_samples))
    reported = flatnonzero(known & ~seen)
    at_node = nans(n_spans * n)
    if w.no_node_holds(least):
        by_cohort, size = grouped_median(limit[reported], cohort[reported], n_cohorts)
    else:
        host, n_hosts = dense(group, w.nodes[row])
        if eligible.size + reported.size <= LEXSORT_MAX:
            medians, sizes = grouped_median(
                np.concatenate((share[eligible], limit[reported])),
                np.concatenate((host, n_hosts + cohort[reported])),
                n_hosts + n_cohorts,
            )
            host_median, host_size = medians[:n_hosts], sizes[:n_hosts]
            by_cohort, size = medians[n_hosts:], sizes[n_hosts:]
        else:
            host_median, host_size = grouped_median(share[eligible], host, n_hosts)
            by_cohort, size = grouped_median(limit[reported], cohort[reported], n_cohorts)
        at_node[eligible] = np.where(host_size[host] >= peers[eligible], host_median[host], np.nan)
    # Its peers: its own bin's, or where those are too few, every bin from its own up ("bin >= level"), keyed (kind,
    # span, cohort, bin or level). Own bins first; then the pools of the levels some device has too few peers in
    # its own bin at: each device joins every such level up to its bin's, and the needy read their bin's level's
    # (their last copy). A large fleet's bins are full: no level pooled, none of the copies made (one a device and
    # level, 3.7 times its rows at 100,000 devices: 68 ms of cap_peers an evaluation sorted them, 23 ms without
    # them; the copies' indexes alone 4 ms of 30).
    n_keys = n_spans * n_cohorts * n_bins
    own_key = group * n_bins + b[eligible]
    values = share[eligible]
    if eligible.size <= POOLS_AT_ONCE:
        # A small fleet: every level's pool beside the own bins, in one pass (disjoint keys: a level's members are
        # every device at or above it, whichever levels turn out needed), one call's fixed cost, not two.
        copies = b[eligible] + 1
        member, level_key = _levels(group, copies, n_bins)
        m = eligible.size
        both, both_others = quantile_of_others(
            np.concatenate((values, values[member])), np.concatenate((own_key, n_keys + level_key)), 2 * n_keys, q
        )
        own, own_others, up, up_others = both[:m], both_others[:m], both[m:], both_others[m:]
        at = copies.cumsum() - 1  # each device's copy at its own bin's level
    else:
        own, own_others = quantile_of_others(values, own_key, n_keys, q)
    needy = own_others + 1 < peers[eligible]
    reference = nans(n_spans * n)
    reference[eligible[~needy]] = own[~needy]
    up_ok = flatnonzero(needy)
    if up_ok.size:  # (none where every bin is full, as a large fleet's are: no copies made for nothing)
        if eligible.size > POOLS_AT_ONCE:  # the pools of the levels some device needs, alone
            needed = np.zeros(n_keys, dtype=bool)
            needed[own_key[needy]] = True
            copies = b[eligible] + 1
            member, level_key = _levels(group, copies, n_bins)
            kept = needed[level_key]
            up, up_others = quantile_of_others(values[member[kept]], level_key[kept], n_keys, q)
            at = kept.cumsum()[copies.cumsum() - 1] - 1  # each needy device's copy at its own bin's level
        up_ok = up_ok[up_others[at[up_ok]] + 1 >= peers[eligible[up_ok]]]
        reference[eligible[up_ok]] = up[at[up_ok]]
    # A reported limit against its cohort's; a seen one (no limit series: POWER_PINNED is judged only against one),
    # from enough capped samples, against its node's devices' of its cohort: the same job holds them at their caps.
    # Capped samples read low in a job's communication phases, so a seen limit under the bar by its mean is the
    # highest power it drew while capped: a lowered limit bounds every sample, a healthy GPU reaches its cap.
    limit_median = np.where(size[cohort] >= least, by_cohort[cohort], np.nan)
    observed = flatnonzero(known & seen)
    if observed.size:  # (none where every device reports its limit: no grouping an evaluation for nothing)
        host, n_hosts = dense(cohort[observed], w.nodes[observed])
        by_node, size = grouped_median(limit[observed], host, n_hosts)
        limit_median[observed] = np.where(size[host] >= least[observed], by_node[host], np.nan)
    limit = np.where(seen & ~known, np.nan, limit)
    ratio = w.params.power_throttling.limit_ratio
    with np.errstate(invalid="ignore"):
        low = flatnonzero(seen & (limit < ratio * limit_median))
    if low.size:
        limit[low] = np.nanmax(w.store.samples(rows[low], F.POWER_LIMIT), axis=0)
    spanned = (n_spans, n)  # (the spans side by side, as rows)
    shared, referenced, node_medians = share.reshape(spanned), reference.reshape(spanned), at_node.reshape(spanned)
    return CapPeers(shared, referenced, node_medians, utils[0], limit, limit_median, seen)


def _levels(group: np.ndarray, copies: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Each device's copies, one a level from 0 up to its own bin (``copies``: its bin + 1): which device each copy
    is (an index into ``group``), and its key (group, level)."""
    member = np.arange(copies.size).repeat(copies)  # (ndarray methods: numpy's wrappers cost a small fleet)
    return member, group[member] * n_bins + np.arange(member.size) - (copies.cumsum() - copies).repeat(copies)
