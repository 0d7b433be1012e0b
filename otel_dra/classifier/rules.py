"""The rules: each failure reason's evidence, judged for every device at once.

Every rule reads the devices' windows through :class:`Window` (sums and counts kept by the
window store, so reading a window is O(1) per device) and returns, per device, whether its
evidence is present now, the ``hw.state`` it implies, and the ladder step its remediation
starts at. Terms used below, per device over its window (the last ``window`` of samples):

- ``fraction(f)``: share of the window's samples whose indicator ``f`` is 1; 0 when the
  window has fewer than ``min_samples`` samples with ``f`` known (one spike is not a trend);
- ``share(f)``: the increase of a time counter (seconds throttled) over the window's time;
- ``increase(f)``: the counter's increase over the window;
- ``per_minute(f)``: ``increase(f)`` per minute of window time, the time taken as at least a
  minute (``RATE_MIN_SPAN_S``): one corrected error two seconds after a start is one per minute,
  not thirty (a storm of them still counts at once);
- ``events(f, w)``: events of a rare counter within the last ``w`` seconds (event log);
- ``duty``: the share of a longer *duty span* (the long horizon's per-minute buckets, 15
  minutes by default) that a condition held: faults that come and go (a fan stalling 2
  minutes in 6) are never most of a 5-minute window, yet are a fault;
- ``rate``: a counter's rate judged against its *cohort* (devices of the same vendor and
  model, by default): over the window against a storm bar, and over the horizon's longer
  rate span against the cohort's median, so a low rate 5x its peers' is caught and a
  model that runs a higher background is judged by its own norm (``Window.rate``).

Rules judge only devices whose telemetry is fresh: a silent device's window is frozen, and
what it means is ``device_lost``'s or ``stale``'s business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from otel_dra.classifier.events import EventLog
from otel_dra.classifier.features import STATE_CODE, F
from otel_dra.classifier.horizon import HorizonStore
from otel_dra.classifier.params import PolicyGroups
from otel_dra.classifier.peers import (
    ThermalResiduals,
    dense,
    grouped_median,
    load_bins,
    quantile_of_others,
    thermal_residuals,
)
from otel_dra.classifier.window import WindowStore
from otel_dra.vocabulary import REASONS, REMEDIATIONS, SCOPES

R = {reason: i for i, reason in enumerate(REASONS)}
#: Peers at a device's load whose reference share of time at the power cap is under this are never capped.
QUIET_PEERS = 0.01
#: A rate per minute is judged over at least this much time, however young the window.
RATE_MIN_SPAN_S = 60.0
OK, PREDICTED, DEGRADED, FAILED = 0, 1, 2, 3
EVENT_FEATURES = (F.RESETS, F.OUT_OF_MEMORY, F.DRIVER_APPLICATION, F.WORKLOAD_APPLICATION, F.WORKLOAD_OOM)
#: Scopes as codes (``otel_dra.vocabulary.SCOPES``): what a reason's evidence is about.
SCOPE = {scope: i for i, scope in enumerate(SCOPES)}
DEVICE, WORKLOAD, NODE = SCOPE["device"], SCOPE["workload"], SCOPE["node"]


#: Features the long horizon keeps (per-minute buckets): low rates and sustained conditions.
HORIZON_FEATURES: tuple[F, ...] = (
    F.DT,
    F.ECC_CORRECTED,
    F.LINK_ERRORS,
    F.THROTTLE_THERMAL,
    F.THROTTLE_POWER,
    F.THROTTLE_BRAKE,
    F.THROTTLE_SLOWDOWN,
    F.UTIL,
    F.BUSY,
    F.TEMP_HOT,
    F.COOLING_BAD,
    F.MEM_FULL,
    F.VOLT_BAD,
    F.WIDTH_DOWN,
    F.GEN_DOWN,
)
H = {f: i for i, f in enumerate(HORIZON_FEATURES)}
#: The horizon's spans, in the order the store keeps them: the duty span, then the rate span.
DUTY_SPAN, RATE_SPAN = 0, 1
#: Where a rate's centre came from: the device's cohort, the whole fleet, or nowhere (too few).
FROM_COHORT, FROM_FLEET, FROM_NONE = 0, 1, 2


def group_medians(values: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(median, MAD, size) of ``values`` per group id in ``0..n_groups-1`` (NaN for an empty group).

    The rows are grouped once (a stable sort of small integers), then each group's median and
    MAD are two linear-time selections over its slice: a loop over the few cohorts, never over
    devices, and no sort of the values themselves."""
    size = np.bincount(groups, minlength=n_groups)
    median = np.full(n_groups, np.nan)
    mad = np.full(n_groups, np.nan)
    # One cohort (a fleet of one model) needs no grouping.
    order = None if np.count_nonzero(size) == 1 else np.argsort(groups, kind="stable")
    start = np.concatenate(([0], np.cumsum(size)[:-1]))
    for g in np.flatnonzero(size).tolist():
        part = values if order is None else values[order[start[g] : start[g] + size[g]]]
        median[g] = np.median(part)
        mad[g] = np.median(np.abs(part - median[g]))
    return median, mad, size


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
    only = np.flatnonzero(size)
    if only.size == 1:  # one cohort holds every rate (a fleet of one model): the fleet's centre is its own
        fleet_med, fleet_mad = float(med[only[0]]), float(mad[only[0]])
    elif values.size:
        fleet_med = float(np.median(values))
        fleet_mad = float(np.median(np.abs(values - fleet_med)))
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
        return 2.0 * (np.sqrt(np.maximum(np.nan_to_num(count), 0.0)) - np.sqrt(expected)) > z


@dataclass
class SpanRuns:
    """A time counter's shape over a span (:meth:`Window.span_runs`)."""

    runs: np.ndarray  # separate runs of minutes spent mostly in it
    util_on: np.ndarray  # mean utilization of those minutes (NaN: none, or no utilization)
    util_off: np.ndarray  # ... and of the span's other minutes


@dataclass
class RateVerdict:
    """A counter rate judged against its bars, with what a message needs to say why."""

    flagged: np.ndarray  # bool: the window's or the span's rate is above its bar
    window_rate: np.ndarray  # per minute over the window
    span_rate: np.ndarray  # per minute over the horizon's rate span
    span_minutes: np.ndarray
    centre: Centre
    ratio: np.ndarray  # span rate / its centre (NaN where there is no centre)


@dataclass
class ThermalPeers:
    """Devices running hotter than their peers at the same load (:meth:`Window.thermal_peers`)."""

    flagged: np.ndarray  # bool: hotter than its peers (its samples' median too) for ``sustain``: the evidence
    hot: np.ndarray  # bool: its window mean hotter than its peers' now (what PeerHistory keeps the time of)
    judged: np.ndarray  # bool: had peers to be judged against now
    residuals: ThermalResiduals
    bar: np.ndarray  # Cel above the expectation that flags (lowered while the reason is on)
    baseline: np.ndarray  # Cel it usually runs above its peers, where that set the bar (NaN elsewhere)


@dataclass
class CapPeers:
    """Power-cap time against peers at comparable load (:meth:`Window.cap_peers`): per span (the window, the
    duty span, the rate span) each device's share of time capped and its peers' reference share (NaN: no
    peers)."""

    shares: tuple[np.ndarray, np.ndarray, np.ndarray]  # over the window, the duty span, the rate span
    references: list[np.ndarray]  # the peer_quantile of its peers' shares, itself left out (NaN: too few)
    node_medians: list[np.ndarray]  # the median share of its node's devices of its cohort (NaN: too few)
    util: np.ndarray  # the window's mean utilization
    limit: np.ndarray  # its power limit over the window, W
    limit_median: np.ndarray  # its cohort's median power limit (NaN: too few devices report one)


@dataclass
class Window:
    """Read access to the window and the long horizon of every row in ``rows``.

    ``now_s`` is each row's own present (its node's clock); ``fresh`` marks the rows whose
    telemetry is fresh; ``recent`` those heard within the rate span (a cohort's centre is
    taken over them: a node that falls silent for a few minutes does not shrink its peers'
    cohort); ``on`` is each row's reasons that are on before this evaluation (a sustained
    condition that is already on stays on at a lower share over a longer span); ``nodes`` each
    row's node index (of ``n_nodes``), for comparing a device with its node's others;
    ``hot_since``, ``baseline`` and ``history_s`` what :class:`~otel_dra.classifier.peers.PeerHistory` kept of
    earlier evaluations."""

    store: WindowStore
    horizon: HorizonStore
    events: dict[F, EventLog]
    rows: np.ndarray
    now_s: np.ndarray
    min_samples: int
    groups: PolicyGroups
    fresh: np.ndarray
    recent: np.ndarray
    on: np.ndarray
    nodes: np.ndarray
    n_nodes: int
    hot_since: np.ndarray  # per row, since when (its own clock) it has run hotter than its peers; NaN: not
    baseline: np.ndarray  # per row, how much hotter than its peers it usually runs (Cel; NaN: not learnt)
    history_s: np.ndarray  # ... learnt over this many seconds of being judged

    def __post_init__(self) -> None:
        n = self.rows.shape[0]
        # Rows 0..n-1 (every row in use, the usual case) are read as views, not gathered copies.
        at: np.ndarray | slice = slice(0, n) if n and self.rows[-1] == n - 1 else self.rows
        # The stores are feature-major: a rule reads one feature of every device, a contiguous row.
        self.sums = self.store.sums[:, at]
        self.counts = self.store.counts[:, at]
        self.seconds = self.sums[F.DT]
        self.samples = self.counts[F.DT]
        self.latest = self.store.latest(at)
        self.span = [self.horizon.span_sums(i, at) for i in range(len(self.horizon.spans))]
        self.span_s = [self.horizon.spans[i] * self.horizon.bucket_s for i in range(len(self.horizon.spans))]
        dt = H[F.DT]
        # Whether each span holds at least half its length of samples (younger devices: the window only).
        self._covered = [
            (counts[dt] >= self.min_samples) & (sums[dt] >= 0.5 * span_s)
            for (sums, counts), span_s in zip(self.span, self.span_s, strict=True)
        ]
        self._rates: dict[F, RateVerdict] = {}
        self._fractions: dict[F, np.ndarray] = {}
        self._span_fractions: dict[tuple[int, F], np.ndarray] = {}
        self._thermal: ThermalPeers | None = None
        self._capped: CapPeers | None = None

    def fraction(self, f: F) -> np.ndarray:
        share = self._fractions.get(f)
        if share is None:  # once per feature a rule reads (a contiguous row of the feature-major sums)
            counts = self.counts[f]
            with np.errstate(invalid="ignore", divide="ignore"):
                share = self._fractions[f] = np.where(counts >= self.min_samples, self.sums[f] / counts, 0.0)
        return share

    def increase(self, f: F) -> np.ndarray:
        return self.sums[f]

    def share(self, f: F) -> np.ndarray:
        ok = (self.samples >= self.min_samples) & (self.seconds > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ok, self.sums[f] / self.seconds, 0.0)

    def per_minute(self, f: F) -> np.ndarray:
        ok = (self.samples >= self.min_samples) & (self.seconds > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ok, 60.0 * self.sums[f] / np.maximum(self.seconds, RATE_MIN_SPAN_S), np.nan)

    def mean(self, f: F) -> np.ndarray:
        n = self.counts[f]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, self.sums[f] / n, np.nan)

    def events_since(self, f: F, window_s: np.ndarray) -> np.ndarray:
        return self.events[f].since(self.now_s - window_s, self.rows)

    # -- the long horizon ----------------------------------------------------------------------
    def covered(self, span: int) -> np.ndarray:
        """Whether a span holds at least half its length of samples (younger devices: the window only)."""
        return self._covered[span]

    def span_fraction(self, f: F, span: int) -> np.ndarray:
        """Share of the span's samples whose indicator ``f`` is 1 (0 while the span is not covered)."""
        share = self._span_fractions.get((span, f))
        if share is None:  # once per (span, feature) a rule reads
            sums, counts = self.span[span][0][H[f]], self.span[span][1][H[f]]
            judged = self.covered(span) & (counts >= self.min_samples)
            with np.errstate(invalid="ignore", divide="ignore"):
                share = self._span_fractions[span, f] = np.where(judged, sums / counts, 0.0)
        return share

    def span_mean(self, f: F, span: int) -> np.ndarray:
        """A gauge's mean over the span (NaN where it has none)."""
        sums, counts = self.span[span][0][H[f]], self.span[span][1][H[f]]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, sums / counts, np.nan)

    def span_share(self, f: F, span: int) -> np.ndarray:
        """A time counter's increase over the span's time (0 while the span is not covered)."""
        sums, _ = self.span[span]
        seconds = sums[H[F.DT]]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.covered(span) & (seconds > 0), sums[H[f]] / seconds, 0.0)

    def span_runs(self, f: F, span: int, pick: np.ndarray, bar: float = 0.5) -> SpanRuns:
        """The shape of a time counter ``f`` over a span, for the rows ``pick`` (a mask): how many separate runs of
        the span's buckets (minutes) spent at least ``bar`` of their time with it (a condition that comes and goes
        makes several, one burst of load one), and the mean utilization of those minutes and of the others (a
        cap reached only at the device's busiest minutes follows its load). Read bucket by bucket, so only for
        the few rows a rule asks about; 0 runs and NaN elsewhere."""
        n = self.rows.shape[0]
        out = SpanRuns(np.zeros(n, dtype=np.int64), np.full(n, np.nan), np.full(n, np.nan))
        some = np.flatnonzero(pick)
        if some.size:
            rows = self.rows[some]
            seconds, _ = self.horizon.bucket_sums(span, rows, H[F.DT])
            time_in, _ = self.horizon.bucket_sums(span, rows, H[f])
            util, util_n = self.horizon.bucket_sums(span, rows, H[F.UTIL])
            with np.errstate(invalid="ignore", divide="ignore"):
                on = np.nan_to_num(time_in / seconds) >= bar
                out.runs[some] = on[0].astype(np.int64) + (on[1:] & ~on[:-1]).sum(axis=0)
                util = np.nan_to_num(util)
                out.util_on[some] = (util * on).sum(axis=0) / (util_n * on).sum(axis=0)
                out.util_off[some] = (util * ~on).sum(axis=0) / (util_n * ~on).sum(axis=0)
        return out

    def duty(self, f: F, reason: str, share: bool = False, bar: np.ndarray | None = None) -> np.ndarray:
        """A condition that comes and goes: present in at least the rule's ``duty`` (or ``bar``) of the duty
        span (15 minutes by default), or, once the reason is on, in ``duty x duty_hold_ratio`` of the duty
        span or of the longer rate span, so a fault that recurs is one episode, not one per burst."""
        read = self.span_share if share else self.span_fraction
        duty = self.groups.param(self.rows, reason, "duty") if bar is None else bar
        stay = duty * self.groups.policy.horizon.duty_hold_ratio
        recent = read(f, DUTY_SPAN)
        held = self.on[:, R[reason]] & (np.maximum(recent, read(f, RATE_SPAN)) >= stay)
        return (recent >= duty) | held

    def rate(self, f: F, reason: str, keys: tuple[str, str, str, str], absolute: np.ndarray) -> RateVerdict:
        """A counter's rate judged two ways, each beyond counting noise (:func:`above`); ``keys``
        name the rule's (storm ratio, ratio, MAD k, floor):

        - over the window, against ``max(absolute, storm_ratio x centre)``: a storm, at once;
        - over the rate span (30 minutes by default), against the cohort's own norm, when the
          device's cohort is large enough: a rate of at least ``max(ratio x median, median +
          mad_k x 1.4826 x MAD)`` (far above its peers), whose count is also beyond counting noise
          above what a healthy peer may run, ``max(healthy_ratio x median, floor)``
          (``cohorts.span_significance`` deviations: devices differ, and a few errors in a quiet
          cohort are luck, eighteen where three were due are not);
          without a cohort, the window's bar, beyond the same noise.
        """
        cached = self._rates.get(f)
        if cached is not None:
            return cached
        p, rows = self.groups.param, self.rows
        sums, _ = self.span[RATE_SPAN]
        span_minutes = sums[H[F.DT]] / 60.0
        span_count = sums[H[f]]
        with np.errstate(invalid="ignore", divide="ignore"):
            span_rate = np.where(span_minutes > 0, span_count / np.maximum(span_minutes, 1.0), np.nan)
        cohorts = self.groups.cohort[rows]
        # Every recent device with a rate counts towards its cohort's centre, young ones too: a
        # fleet that just started judges a storm against its peers, not against the absolute bar.
        eligible = self.recent & (span_minutes > 0)
        least = self.groups.policy.cohorts.min_devices
        c = centre(span_rate, eligible, self.recent, cohorts, len(self.groups.cohort_names), least)
        storm_key, ratio_key, mad_key, floor_key = keys
        ratio = p(rows, reason, ratio_key)
        z = np.full(rows.shape, self.groups.policy.cohorts.significance)
        window_bar = np.maximum(absolute, p(rows, reason, storm_key) * c.median)
        ok = (self.samples >= self.min_samples) & (self.seconds > 0)
        window_minutes = np.maximum(self.seconds, RATE_MIN_SPAN_S) / 60.0
        fast = ok & above(self.increase(f), window_minutes, window_bar, z)
        spread = c.median + p(rows, reason, mad_key) * 1.4826 * c.mad
        far = np.nan_to_num(span_rate) >= np.maximum(ratio * c.median, spread)
        healthy = self.groups.policy.cohorts.healthy_ratio
        norm = np.maximum(healthy * c.median, p(rows, reason, floor_key))
        span_z = np.full(rows.shape, self.groups.policy.cohorts.span_significance)
        minutes = np.maximum(span_minutes, 1.0)
        own = far & above(span_count, minutes, norm, span_z)
        slow = self.covered(RATE_SPAN) & np.where(
            c.source == FROM_COHORT, own, above(span_count, minutes, window_bar, span_z)
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            times = np.where((c.source != FROM_NONE) & (c.median > 0), span_rate / c.median, np.nan)
        out = RateVerdict(fast | slow, self.per_minute(f), span_rate, span_minutes, c, times)
        self._rates[f] = out
        return out

    # -- peers under the same load (otel_dra.classifier.peers) ----------------------------------------
    def thermal_peers(self) -> ThermalPeers:
        """Each device's temperature against its peers at the same load (``rules.thermal.peers``): flagged when
        both its window mean and the median of its window's samples run ``max(margin, mad_k x spread)`` above
        what its node's devices, its slot elsewhere and its utilization say (``hold_ratio`` of that while
        ``thermal`` is on), at every evaluation for ``sustain``; not judged while its peers run under
        ``min_utilization``."""
        if self._thermal is not None:
            return self._thermal
        g, rows = self.groups, self.rows
        p = g.param
        enabled = p(rows, "thermal", "peers", "enabled") > 0
        judged = enabled & self.fresh & (self.counts[F.TEMP_MAX] >= self.min_samples)
        res = thermal_residuals(
            self.mean(F.TEMP_MAX),
            self.mean(F.UTIL),
            judged,
            self.nodes,
            g.cohort[rows],
            len(g.cohort_names),
            g.slot[rows],
            g.n_slots,
            g.policy.cohorts.load_bins,
            p(rows, "thermal", "peers", "slope"),
            p(rows, "thermal", "peers", "min_node_devices"),
            p(rows, "thermal", "peers", "min_slot_nodes"),
        )
        on = self.on[:, R["thermal"]]
        hold = np.where(on, p(rows, "thermal", "peers", "hold_ratio"), 1.0)
        bar = hold * np.fmax(p(rows, "thermal", "peers", "margin"), p(rows, "thermal", "peers", "mad_k") * res.sigma)
        # Or hotter than it usually runs against the same peers (`change_margin` over its baseline, and at least
        # `change_floor` over them), once it has `history` of being judged: a device that always ran 3 Cel over
        # its peers is that device; one that now runs 6 Cel over them where it ran 1 Cel has changed.
        known = (self.history_s >= p(rows, "thermal", "peers", "history")) & ~np.isnan(self.baseline)
        own = np.fmax(
            self.baseline + hold * p(rows, "thermal", "peers", "change_margin"),
            hold * p(rows, "thermal", "peers", "change_floor"),
        )
        with np.errstate(invalid="ignore"):
            changed = known & (own < bar)
        bar = np.where(changed, own, bar)
        # At light load there is little heat to tell devices apart by (a checkpoint's dip, an idle node): no news.
        with np.errstate(invalid="ignore"):
            light = res.node_util < p(rows, "thermal", "peers", "min_utilization")
            judged = ~np.isnan(res.residual) & ~light
            hot = judged & (res.residual >= bar)
        flagged = hot.copy()
        some = np.flatnonzero(flagged)
        if some.size:  # a few devices: their samples' median, so that one spike is not heat
            r = rows[some]
            temps = self.store.samples(r, F.TEMP_MAX)
            utils = self.store.samples(r, F.UTIL)
            utils = np.where(np.isnan(utils), res.node_util[some], utils)
            expected = res.base[some] + res.slope[some] * np.nan_to_num(utils)
            with np.errstate(invalid="ignore"):
                typical = np.nanmedian(temps - expected, axis=0)
            flagged[some] = typical >= bar[some]
        # Sustained: a device has run that hot, judged at every evaluation, for ``sustain`` (a load change or a
        # job's start moves a node's temperatures for a few minutes; dried paste stays).
        # Once on, it stays on while it is still that hot, or while it has no peers to be judged against (no news
        # is not a repair).
        since = np.where(np.isnan(self.hot_since), self.now_s, self.hot_since)
        sustained = self.now_s - since >= p(rows, "thermal", "peers", "sustain")
        held = (flagged & (sustained | on)) | (on & ~judged & ~np.isnan(self.hot_since))
        self._thermal = ThermalPeers(held, hot, judged, res, bar, np.where(changed, self.baseline, np.nan))
        return self._thermal

    def cap_peers(self) -> CapPeers:
        """Each device's power-cap time against its cohort's devices at comparable load: the same
        utilization bin (``cohorts.load_bins``), or, when that holds fewer than ``min_peers`` (itself
        included), every device at least as loaded (its bin and the bins above: a device under more load is
        capped at least as often, so this errs toward quiet); the reference is a high quantile
        (``peer_quantile``) of theirs, itself left out: devices differ by several percent in the power they draw
        for the same work, so at the same utilization some sit at the cap much more than others. No such
        peers: not judged (its reference NaN)."""
        if self._capped is not None:
            return self._capped
        g, rows = self.groups, self.rows
        p = g.param
        edges = g.policy.cohorts.load_bins
        n_bins = edges.size + 1
        # Each span against peers at comparable load over that span: the window's utilization for its share,
        # the duty span's for its (a peer that dipped for a checkpoint ten minutes ago was not at this load then).
        utils = (self.mean(F.UTIL), self.span_mean(F.UTIL, DUTY_SPAN), self.span_mean(F.UTIL, RATE_SPAN))
        shares = (
            self.share(F.THROTTLE_POWER),
            self.span_share(F.THROTTLE_POWER, DUTY_SPAN),
            self.span_share(F.THROTTLE_POWER, RATE_SPAN),
        )
        ready = self.fresh & (self.samples >= self.min_samples)
        spans = (ready, ready & self.covered(DUTY_SPAN), ready & self.covered(RATE_SPAN))
        cohort = g.cohort[rows]
        n_groups = len(g.cohort_names) * n_bins
        least = p(rows, "power_throttling", "min_peers")
        q = float(g.policy.rules["power_throttling"]["peer_quantile"])
        references, node_medians = [], []
        for share, util, covered in zip(shares, utils, spans, strict=True):
            b = load_bins(util, edges)
            eligible = covered & (b >= 0)
            # Its node's devices of its cohort (the same job, usually): a training node at its cap beside a fleet
            # of inference replicas at the same utilization is not four devices capped far more than their peers.
            host, n_hosts = dense(self.nodes[eligible], cohort[eligible])
            host_median, host_size = grouped_median(share[eligible], host, n_hosts)
            at_node = np.full(rows.shape, np.nan)
            at_node[eligible] = np.where(host_size[host] >= least[eligible], host_median[host], np.nan)
            node_medians.append(at_node)
            reference = np.full(rows.shape, np.nan)
            chosen = np.zeros(rows.shape, dtype=bool)
            # Its own bin first, then its bin and those above (one pass a bin, never a loop over devices).
            for lowest in [None, *range(n_bins)]:
                mine = eligible & ~chosen & ((b >= 0) if lowest is None else (b == lowest))
                pick = eligible if lowest is None else eligible & (b >= lowest)
                key = (cohort * n_bins + (b if lowest is None else lowest))[pick]
                found, others = quantile_of_others(share[pick], key, n_groups, q)
                ok = np.zeros(rows.shape, dtype=bool)
                ok[pick] = others + 1 >= least[pick]
                ok &= mine
                value = np.full(rows.shape, np.nan)
                value[pick] = found
                reference = np.where(ok, value, reference)
                chosen |= ok
            references.append(reference)
        limit = self.mean(F.POWER_LIMIT)
        known = self.fresh & ~np.isnan(limit)
        limit_median, size = grouped_median(limit[known], cohort[known], len(g.cohort_names))
        limit_median = np.where(size[cohort] >= least, limit_median[cohort], np.nan)
        self._capped = CapPeers(shares, references, node_medians, utils[0], limit, limit_median)
        return self._capped


@dataclass
class Evidence:
    """Per (row, reason): evidence present now, the state it implies, the least remediation it needs,
    and what it is about (a SCOPE code: the device, the workload on it, its node)."""

    present: np.ndarray  # bool (n, R)
    state: np.ndarray  # int8 (n, R)
    floor: np.ndarray  # int8 (n, R): a REMEDIATIONS index the remediation is at least
    scope: np.ndarray  # int8 (n, R): a SCOPE code
    #: For a node-scoped reason: how many of the row's node's reporting devices show it, and how many report.
    node_hits: np.ndarray  # int32 (n, R)
    node_devices: np.ndarray  # int32 (n,)


Rule = Callable[[Window, PolicyGroups, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _state(groups: PolicyGroups, rows: np.ndarray, reason: str, key: str = "state") -> np.ndarray:
    codes = np.asarray([STATE_CODE[rules[reason][key]] for rules in groups.rules], dtype=np.int8)
    return codes[groups.group[rows]]


def thermal(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sustained temperature above the sensor's high.degraded limit, thermal throttling or the device's
    own hardware slowdown a share of the time, in the window or for the rule's duty of the duty span
    (excursions that come and go): ``state``; sustained above high.critical: ``critical_state``. Below
    every limit, running hotter than its peers at the same load (:meth:`Window.thermal_peers`):
    ``peers.state``."""
    p = g.param
    hot = w.fraction(F.TEMP_HOT) >= p(w.rows, "thermal", "min_fraction")
    throttled = w.share(F.THROTTLE_THERMAL) >= p(w.rows, "thermal", "throttle_share")
    slowdown_bar = p(w.rows, "thermal", "slowdown_share")
    slowdown = (w.share(F.THROTTLE_SLOWDOWN) >= slowdown_bar) | w.duty(
        F.THROTTLE_SLOWDOWN, "thermal", share=True, bar=slowdown_bar
    )
    recurring = w.duty(F.TEMP_HOT, "thermal") | w.duty(F.THROTTLE_THERMAL, "thermal", share=True)
    critical = w.fraction(F.TEMP_CRIT) >= p(w.rows, "thermal", "min_fraction")
    limits = hot | throttled | slowdown | recurring | critical
    peers = w.thermal_peers().flagged
    state = np.where(
        critical,
        _state(g, w.rows, "thermal", "critical_state"),
        np.where(limits, _state(g, w.rows, "thermal"), _peer_state(g, w.rows)),
    )
    return limits | peers, state


def _peer_state(groups: PolicyGroups, rows: np.ndarray) -> np.ndarray:
    codes = np.asarray([STATE_CODE[rules["thermal"]["peers"]["state"]] for rules in groups.rules], dtype=np.int8)
    return codes[groups.group[rows]]


def cooling(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A fan near zero (or below its own low limit) while the device is warm, sustained in the
    window or recurring for the rule's duty of the duty span (a fan that stalls now and then)."""
    sustained = w.fraction(F.COOLING_BAD) >= g.param(w.rows, "cooling", "min_fraction")
    return sustained | w.duty(F.COOLING_BAD, "cooling"), _state(g, w.rows, "cooling")


def memory_ecc(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Uncorrected errors in the window or retired pages at the limit fail the device; retired
    pages near it, or a corrected-error rate far above its cohort's (:meth:`Window.rate`), predict
    failure."""
    p = g.param
    uncorrected = w.increase(F.ECC_UNCORRECTED) >= p(w.rows, "memory_ecc", "uncorrected")
    retired = np.nan_to_num(w.latest[F.RETIRED_TOTAL])
    retired_failed = retired >= p(w.rows, "memory_ecc", "retired_pages_failed")
    retired_warn = retired >= p(w.rows, "memory_ecc", "retired_pages_predicted")
    storm = corrected_rate(w).flagged
    state = np.where(uncorrected | retired_failed, FAILED, PREDICTED).astype(np.int8)
    return uncorrected | retired_failed | retired_warn | storm, state


def corrected_rate(w: Window) -> RateVerdict:
    """The corrected-ECC rate against the policy's absolute bar and the device's cohort."""
    absolute = w.groups.param(w.rows, "memory_ecc", "corrected_per_minute")
    keys = ("corrected_storm_ratio", "corrected_cohort_ratio", "corrected_mad_k", "corrected_floor_per_minute")
    return w.rate(F.ECC_CORRECTED, "memory_ecc", keys, absolute)


def power_delivery(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Power delivery faults reported in the window, voltage outside its critical limits (in the window,
    or recurring), or the hardware power brake asserted a share of the window's or the duty span's time."""
    p = g.param
    errors = w.increase(F.POWER_ERRORS) >= p(w.rows, "power_delivery", "errors")
    voltage = w.fraction(F.VOLT_BAD) >= p(w.rows, "power_delivery", "voltage_fraction")
    brake_bar = p(w.rows, "power_delivery", "brake_share")
    brake = (w.share(F.THROTTLE_BRAKE) >= brake_bar) | w.duty(
        F.THROTTLE_BRAKE, "power_delivery", share=True, bar=brake_bar
    )
    present = errors | voltage | brake | w.duty(F.VOLT_BAD, "power_delivery")
    return present, _state(g, w.rows, "power_delivery")


def power_throttling(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Capped far more than its peers under comparable load (:meth:`Window.cap_peers`): its share of the duty
    span's time at the power cap at least ``duty``, ``peer_margin`` above its peers' reference share and above
    its node's median, and so over the rate span too, or ``peer_margin`` more than the duty span's share of
    busy samples (capped while not busy), or against peers that are never capped while capped for ``duty`` of
    the rate span too or in two or more runs of minutes that do not follow its load (:meth:`Window.span_runs`,
    ``load_coupling``); once on, of the window's at least ``throttle_share``, or of the duty span's. Or its
    power limit under ``limit_ratio`` of its cohort's. A busy GPU at its cap is how the power limit works;
    without peers it is not judged."""
    p = g.param
    peers = w.cap_peers()
    duty = p(w.rows, "power_throttling", "duty")
    bars = (p(w.rows, "power_throttling", "throttle_share"), duty, duty)
    held = w.on[:, R["power_throttling"]]
    stay = w.groups.policy.horizon.duty_hold_ratio
    margin = p(w.rows, "power_throttling", "peer_margin")
    margin = np.where(held, stay * margin, margin)
    found = []
    for share, reference, at_node, bar in zip(peers.shares, peers.references, peers.node_medians, bars, strict=True):
        need = np.where(held, stay * bar, bar)
        with np.errstate(invalid="ignore"):
            # Peers at its load never capped leave no spread to clear: the bar alone then.
            above = np.where(reference < QUIET_PEERS, 0.0, margin)
            above_node = np.isnan(at_node) | (share - at_node >= margin)
            found.append((share >= need) & (share - reference >= above) & above_node)
    # It enters on the duty span, confirmed over the rate span, or by being capped while not busy, or by peers
    # at its load that are never capped (15 and 30 minutes: a leaky GPU serving a traffic burst sits at its cap
    # for minutes, and only while busy, where some of its peers do too); once on, the window or the duty span
    # holds it.
    idle_capped = peers.shares[1] - w.span_fraction(F.BUSY, DUTY_SPAN) >= margin
    with np.errstate(invalid="ignore"):
        # Peers never capped over the duty span: capped for ``duty`` of the rate span too, or in more than one run
        # of minutes (one traffic burst that a leaky GPU alone rode at its cap fills a duty span in one run; a
        # lowered limit holds it down every time its job asks, and a limit that comes and goes does so again).
        quiet = found[1] & (peers.references[1] < QUIET_PEERS)
    # A cap reached only in its busiest minutes follows its load (a leaky GPU at each burst of traffic): its capped
    # minutes' mean utilization more than `load_coupling` above its other minutes'.
    shape = w.span_runs(F.THROTTLE_POWER, DUTY_SPAN, quiet & (peers.shares[2] < duty))
    with np.errstate(invalid="ignore"):
        follows_load = shape.util_on - shape.util_off > p(w.rows, "power_throttling", "load_coupling")
    quiet_peers = quiet & ((peers.shares[2] >= duty) | ((shape.runs >= 2) & ~follows_load))
    out = (found[1] & (found[2] | idle_capped | quiet_peers)) | (held & (found[0] | found[1]))
    # A power limit well under its cohort's: lowered by firmware, a misconfiguration or the board (the
    # remediation's "check firmware power limits"), it holds the device down whenever its job asks for more.
    with np.errstate(invalid="ignore"):
        out |= peers.limit < p(w.rows, "power_throttling", "limit_ratio") * peers.limit_median
    return out, _state(g, w.rows, "power_throttling")


def memory_pressure(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-memory events that recur on the device itself (a job's crash on all its GPUs is the workload's:
    see :mod:`otel_dra.classifier.workload`); memory held full only with ``full_is_evidence``."""
    p = g.param
    window = p(w.rows, "memory_pressure", "events_window")
    ooms = w.events_since(F.OUT_OF_MEMORY, window) >= p(w.rows, "memory_pressure", "out_of_memory")
    full = (w.fraction(F.MEM_FULL) >= p(w.rows, "memory_pressure", "min_fraction")) | w.duty(
        F.MEM_FULL, "memory_pressure"
    )
    full &= p(w.rows, "memory_pressure", "full_is_evidence") > 0
    return ooms | full, _state(g, w.rows, "memory_pressure")


def link(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Link errors above both DCGM's expected replay rate for the negotiated width and
    generation and the cohort's norm (:meth:`Window.rate`); or width/generation below the
    maximum, sustained or recurring."""
    p = g.param
    errors = link_rate(w).flagged
    fraction = p(w.rows, "link", "downgrade_fraction")
    down = (w.fraction(F.WIDTH_DOWN) >= fraction) | (w.fraction(F.GEN_DOWN) >= fraction)
    recurring = w.duty(F.WIDTH_DOWN, "link") | w.duty(F.GEN_DOWN, "link")
    return errors | down | recurring, _state(g, w.rows, "link")


def link_rate(w: Window) -> RateVerdict:
    """The link error rate against DCGM's expected replays and the device's cohort."""
    expected = np.nan_to_num(w.mean(F.LINK_EXPECTED))
    return w.rate(F.LINK_ERRORS, "link", ("storm_ratio", "cohort_ratio", "mad_k", "floor_per_minute"), expected)


def driver_errors(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A fatal-class driver error in the window fails the device; application-class errors
    repeated within their events window degrade it."""
    p = g.param
    fatal = (w.increase(F.DRIVER_RESET) + w.increase(F.DRIVER_REBOOT) + w.increase(F.DRIVER_MECHANICAL)) >= 1
    window = p(w.rows, "driver_errors", "events_window")
    repeated = w.events_since(F.DRIVER_APPLICATION, window) >= p(w.rows, "driver_errors", "application_repeats")
    return fatal | repeated, np.where(fatal, FAILED, DEGRADED).astype(np.int8)


def driver_floor(w: Window) -> np.ndarray:
    """The least remediation a driver error calls for, by its most disruptive class in the
    window: a reset-class code needs reset_device, XID 79 reboot_node, a mechanical fault
    replace_device (check the hardware); application codes start at the ladder's first step."""
    code = REMEDIATIONS.index
    floor = np.zeros(w.rows.shape, dtype=np.int8)
    floor = np.where(w.increase(F.DRIVER_RESET) >= 1, code("reset_device"), floor)
    floor = np.where(w.increase(F.DRIVER_REBOOT) >= 1, code("reboot_node"), floor)
    return np.where(w.increase(F.DRIVER_MECHANICAL) >= 1, code("replace_device"), floor).astype(np.int8)


def firmware(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Firmware on the policy's deny list or below its minimum (judged when attributes change)."""
    return g.firmware_bad[w.rows].copy(), _state(g, w.rows, "firmware")


def device_reset(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Device resets recurring within the events window."""
    p = g.param
    resets = w.events_since(F.RESETS, p(w.rows, "device_reset", "events_window"))
    return resets >= p(w.rows, "device_reset", "resets"), _state(g, w.rows, "device_reset")


def vendor_status(w: Window, g: PolicyGroups, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The device or its vendor library reports a state other than ok."""
    reported = np.nan_to_num(w.latest[F.VENDOR_STATE]).astype(np.int8)
    return reported > OK, reported


WINDOW_RULES: dict[str, Rule] = {
    "thermal": thermal,
    "cooling": cooling,
    "memory_ecc": memory_ecc,
    "power_delivery": power_delivery,
    "power_throttling": power_throttling,
    "memory_pressure": memory_pressure,
    "link": link,
    "driver_errors": driver_errors,
    "firmware": firmware,
    "device_reset": device_reset,
    "vendor_status": vendor_status,
}


def evaluate(w: Window, groups: PolicyGroups, fresh: np.ndarray, lost: np.ndarray) -> Evidence:
    """Every reason's evidence for the rows of ``w``, then its scope (:func:`scoped`). ``fresh``: the device
    reports; ``lost``: it stopped while its node still reports (``device_lost``)."""
    n = w.rows.shape[0]
    present = np.zeros((n, len(REASONS)), dtype=bool)
    state = np.zeros((n, len(REASONS)), dtype=np.int8)
    floor = np.zeros((n, len(REASONS)), dtype=np.int8)
    for reason, rule in WINDOW_RULES.items():
        ev, st = rule(w, groups, fresh)
        present[:, R[reason]] = ev & fresh
        state[:, R[reason]] = st
    floor[:, R["driver_errors"]] = driver_floor(w)
    present[:, R["device_lost"]] = lost
    state[:, R["device_lost"]] = FAILED
    scope = np.zeros((n, len(REASONS)), dtype=np.int8)
    evidence = Evidence(present, state, floor, scope, np.zeros((n, len(REASONS)), np.int32), np.zeros(n, np.int32))
    return scoped(w, groups, evidence)


def scoped(w: Window, groups: PolicyGroups, ev: Evidence) -> Evidence:
    """What each reason's evidence is about (``policy.scopes``):

    - **node**: a reason of ``scopes.node.reasons`` present on at least ``min_devices`` of a node's reporting
      devices and ``share`` of them at once (all eight GPUs braked: the node's PSU, not eight GPUs);
    - **workload**: a job that keeps crashing. Where the device has no evidence of its own for the reason, its
      node's job crashes (:mod:`otel_dra.classifier.workload`) that reach the rule's repeat count within its
      events window are the workload's, on each GPU it held: ``hw.state`` ok, remediation ``check_workload``.
      Memory pressure is the workload's too, and degraded: out-of-memory events recurring on one GPU alone.
    """
    policy = groups.policy
    p, rows, fresh = groups.param, w.rows, w.fresh
    node = w.nodes
    reporting = np.bincount(node[fresh], minlength=w.n_nodes)
    ev.node_devices[:] = reporting[node]
    for reason in policy.node.reasons:
        r = R[reason]
        on = ev.present[:, r] & fresh
        if not on.any():
            continue
        hits = np.bincount(node[on], minlength=w.n_nodes)
        wide = (hits >= policy.node.min_devices) & (hits >= policy.node.share * reporting)
        mark = on & wide[node]
        ev.scope[mark, r] = NODE
        ev.node_hits[:, r] = hits[node]
    # Memory pressure is about what runs on the device (failure-modes.md: check_workload, scope workload): even
    # out-of-memory events that recur on one GPU alone may be one job's (a one-GPU replica that keeps failing to
    # fit) as well as the device's; degraded, shown as the workload's.
    ev.scope[ev.present[:, R["memory_pressure"]], R["memory_pressure"]] = WORKLOAD
    for reason, feature, key in (
        ("driver_errors", F.WORKLOAD_APPLICATION, "application_repeats"),
        ("memory_pressure", F.WORKLOAD_OOM, "out_of_memory"),
    ):
        r = R[reason]
        crashes = w.events_since(feature, p(rows, reason, "events_window")) >= p(rows, reason, key)
        job = crashes & fresh & ~ev.present[:, r]
        if job.any():
            ev.present[job, r] = True
            ev.state[job, r] = OK
            ev.floor[job, r] = 0
            ev.scope[job, r] = WORKLOAD
    return ev
