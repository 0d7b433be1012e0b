"""Read access to every row's window and long horizon: what the rules judge by.

Terms, per device over its window (the last ``window`` of samples):

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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from otel_dra.classifier.events import EventLog
from otel_dra.classifier.features import F
from otel_dra.classifier.horizon import HorizonStore
from otel_dra.classifier.layout import DUTY_SPAN, RATE_SPAN, H, R
from otel_dra.classifier.numeric import flatnonzero, nan_to_num, nans
from otel_dra.classifier.params import PolicyGroups
from otel_dra.classifier.peer_evidence import CapPeers, ThermalPeers, cap_peers, thermal_peers
from otel_dra.classifier.rates import FROM_COHORT, FROM_NONE, RATE_MIN_SPAN_S, RateVerdict, above, centre
from otel_dra.classifier.thresholds import RateParams
from otel_dra.classifier.window import WindowStore

#: Up to this many rows an evaluation reads a window quantity (a fraction, a share, a mean) for every feature at
#: once and indexes it: for a small fleet one call's fixed cost is the whole cost of reading a feature.
SMALL_WINDOW_ROWS: Final = 1024


def _by_counter(bars: list[np.ndarray]) -> np.ndarray:
    """Per-row bars, a counter's a row: ``(counters, 1)`` where each is one value for every row (a policy's value
    shared by its groups is a broadcast view: copying it out to every row costs a large fleet megabytes an
    evaluation), else ``(counters, rows)`` (``np.array`` of them: a fifth of ``np.stack``'s fixed cost)."""
    if all(b.strides == (0,) for b in bars):
        return np.array([b[:1] for b in bars])
    return np.array(bars)


@dataclass
class SpanRuns:
    """A time counter's shape over a span (:meth:`Window.span_runs`)."""

    runs: np.ndarray  # separate runs of minutes spent mostly in it
    util_on: np.ndarray  # mean utilization of those minutes (NaN: none, or no utilization)
    util_off: np.ndarray  # ... and of the span's other minutes


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
        #: Whether each window has the samples and the time a share or a rate over it is judged on.
        self.timed = (self.samples >= self.min_samples) & (self.seconds > 0)
        self.latest = self.store.latest(at)
        self.span = [self.horizon.span_sums(i, at) for i in range(len(self.horizon.spans))]
        self.span_s = [self.horizon.spans[i] * self.horizon.bucket_s for i in range(len(self.horizon.spans))]
        dt = H[F.DT]
        # Whether each span holds at least half its length of samples (younger devices: the window only); the spans
        # side by side, a row each.
        half = 0.5 * np.asarray(self.span_s)[:, None]
        covered = (self.horizon.total_counts[:, dt, at] >= self.min_samples) & (
            self.horizon.total_sums[:, dt, at] >= half
        )
        self._covered = list(covered)
        # Window quantities read this evaluation (_read): by (quantity, span) and feature, and for a small fleet,
        # every feature's at once by (quantity, span).
        self._reads: dict[tuple[tuple[str, int], int], np.ndarray] = {}
        self._every: dict[tuple[str, int], np.ndarray] = {}
        self._rates: dict[F, RateVerdict] = {}
        self._thermal: ThermalPeers | None = None
        self._capped: CapPeers | None = None
        self._most_on_a_node: int | None = None
        #: Per reason, whether it is on for any row (most evaluations: none, or a few reasons).
        self._reasons_on = np.logical_or.reduce(self.on, axis=0)  # (the ufunc's own: np.any adds its wrapper)
        #: The rules' thresholds for these rows (``w.params.thermal.min_fraction``: one per row).
        self.params = self.groups.at(self.rows)

    def most_on_a_node(self) -> int:
        """The most rows one node holds (0: none)."""
        if self._most_on_a_node is None:
            self._most_on_a_node = int(np.bincount(self.nodes).max()) if self.nodes.size else 0
        return self._most_on_a_node

    def no_node_holds(self, least: np.ndarray) -> bool:
        """Whether no node holds as many rows as the fewest of ``least`` (per row: the devices a group of a node's own
        needs): then no such group can stand anywhere (a fleet of one-GPU nodes), nor for no rows."""
        return self.rows.shape[0] == 0 or self.most_on_a_node() < np.fmin.reduce(least)

    def _read(self, name: tuple[str, int], f: int, read: Callable[[int | slice], np.ndarray]) -> np.ndarray:
        """``read(f)``: one feature's values of a window quantity (``name``: which, and over which span), read once
        per evaluation however many rules ask (a contiguous row of the feature-major sums); for a small fleet, every
        feature's at once, then indexed (the same values, elementwise: an evaluation of a few dozen devices pays each
        numpy call's fixed cost, not its work). Read-only: every caller gets the same array."""
        got = self._reads.get((name, f))
        if got is None:
            if self.rows.shape[0] > SMALL_WINDOW_ROWS:
                got = read(f)
            else:
                every = self._every.get(name)
                if every is None:
                    every = self._every[name] = read(slice(None))
                got = every[f]
            got.flags.writeable = False
            self._reads[name, f] = got
        return got

    def fraction(self, f: F) -> np.ndarray:
        def read(f: int | slice) -> np.ndarray:
            counts = self.counts[f]
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(counts >= self.min_samples, self.sums[f] / counts, 0.0)

        return self._read(("fraction", 0), f, read)

    def increase(self, f: F | list[F]) -> np.ndarray:
        return self.sums[f]

    def share(self, f: F) -> np.ndarray:
        def read(f: int | slice) -> np.ndarray:
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(self.timed, self.sums[f] / self.seconds, 0.0)

        return self._read(("share", 0), f, read)

    def per_minute(self, f: F | list[F]) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.timed, 60.0 * self.sums[f] / np.maximum(self.seconds, RATE_MIN_SPAN_S), np.nan)

    def mean(self, f: F) -> np.ndarray:
        def read(f: int | slice) -> np.ndarray:
            n = self.counts[f]
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(n > 0, self.sums[f] / n, np.nan)

        return self._read(("mean", 0), f, read)

    def events_since(self, f: F, window_s: np.ndarray) -> np.ndarray:
        return self.events[f].since(self.now_s - window_s, self.rows)

    # -- the long horizon ----------------------------------------------------------------------
    def covered(self, span: int) -> np.ndarray:
        """Whether a span holds at least half its length of samples (younger devices: the window only)."""
        return self._covered[span]

    def span_fraction(self, f: F, span: int) -> np.ndarray:
        """Share of the span's samples whose indicator ``f`` is 1 (0 while the span is not covered)."""

        def read(h: int | slice) -> np.ndarray:
            sums, counts = self.span[span][0][h], self.span[span][1][h]
            judged = self.covered(span) & (counts >= self.min_samples)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(judged, sums / counts, 0.0)

        return self._read(("span_fraction", span), H[f], read)

    def span_mean(self, f: F, span: int) -> np.ndarray:
        """A gauge's mean over the span (NaN where it has none)."""

        def read(h: int | slice) -> np.ndarray:
            sums, counts = self.span[span][0][h], self.span[span][1][h]
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(counts > 0, sums / counts, np.nan)

        return self._read(("span_mean", span), H[f], read)

    def span_share(self, f: F, span: int) -> np.ndarray:
        """A time counter's increase over the span's time (0 while the span is not covered)."""

        def read(h: int | slice) -> np.ndarray:
            sums, _ = self.span[span]
            seconds = sums[H[F.DT]]
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(self.covered(span) & (seconds > 0), sums[h] / seconds, 0.0)

        return self._read(("span_share", span), H[f], read)

    def span_runs(self, f: F, span: int, pick: np.ndarray, bar: float = 0.5) -> SpanRuns:
        """The shape of a time counter ``f`` over a span, for the rows ``pick`` (a mask): how many separate runs of
        the span's buckets (minutes) spent at least ``bar`` of their time with it (a condition that comes and goes
        makes several, one burst of load one), and the mean utilization of those minutes and of the others (a
        cap reached only at the device's busiest minutes follows its load). Read bucket by bucket, so only for
        the few rows a rule asks about; 0 runs and NaN elsewhere."""
        n = self.rows.shape[0]
        out = SpanRuns(np.zeros(n, dtype=np.int64), nans(n), nans(n))
        some = flatnonzero(pick)
        if some.size:
            rows = self.rows[some]
            seconds, _ = self.horizon.bucket_sums(span, rows, H[F.DT])
            time_in, _ = self.horizon.bucket_sums(span, rows, H[f])
            util, util_n = self.horizon.bucket_sums(span, rows, H[F.UTIL])
            with np.errstate(invalid="ignore", divide="ignore"):
                on = nan_to_num(time_in / seconds) >= bar
                out.runs[some] = on[0].astype(np.int64) + (on[1:] & ~on[:-1]).sum(axis=0)
                util = nan_to_num(util)
                out.util_on[some] = (util * on).sum(axis=0) / (util_n * on).sum(axis=0)
                out.util_off[some] = (util * ~on).sum(axis=0) / (util_n * ~on).sum(axis=0)
        return out

    def duty(self, f: F, reason: str, duty: np.ndarray, share: bool = False) -> np.ndarray:
        """A condition that comes and goes: present in at least ``duty`` (the rule's, per row) of the duty span
        (15 minutes by default), or, once ``reason`` is on, in ``duty x duty_hold_ratio`` of the duty span or
        of the longer rate span, so a fault that recurs is one episode, not one per burst."""
        read = self.span_share if share else self.span_fraction
        recent = read(f, DUTY_SPAN)
        if not self._reasons_on[R[reason]]:  # (on for no row, the usual: nothing is held)
            return recent >= duty
        stay = duty * self.groups.policy.horizon.duty_hold_ratio
        held = self.on[:, R[reason]] & (np.maximum(recent, read(f, RATE_SPAN)) >= stay)
        return (recent >= duty) | held

    def rate(self, f: F, bars: RateParams, absolute: np.ndarray) -> RateVerdict:
        """A counter's rate judged two ways, each beyond counting noise (:func:`above`), by the rule's ``bars``
        (per row: storm ratio, ratio, MAD k, floor):

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
        if cached is None:
            self.rates({f: (bars, absolute)})
            cached = self._rates[f]
        return cached

    def rates(self, asks: Mapping[F, tuple[RateParams, np.ndarray]]) -> None:
        """Counters' rates (:meth:`rate`), each with its bars and absolute bar, judged side by side (a counter a
        row: a small fleet pays each numpy call's fixed cost once, not once a counter) and kept for the rules that
        ask (:meth:`rate` then reads them)."""
        fs = [f for f in asks if f not in self._rates]
        if not fs:
            return
        rows = self.rows
        sums, _ = self.span[RATE_SPAN]
        span_minutes = sums[H[F.DT]] / 60.0
        span_count = sums[[H[f] for f in fs]]
        with np.errstate(invalid="ignore", divide="ignore"):
            span_rate = np.where(span_minutes > 0, span_count / np.maximum(span_minutes, 1.0), np.nan)
        cohorts = self.groups.cohort[rows]
        # Every recent device with a rate counts towards its cohort's centre, young ones too: a
        # fleet that just started judges a storm against its peers, not against the absolute bar.
        eligible = self.recent & (span_minutes > 0)
        cohorts_policy = self.groups.policy.cohorts
        c = centre(span_rate, eligible, self.recent, cohorts, len(self.groups.cohort_names), cohorts_policy.min_devices)
        bars = [asks[f][0] for f in fs]
        ratio = _by_counter([b.cohort_ratio for b in bars])
        window_bar = np.maximum(
            _by_counter([asks[f][1] for f in fs]), _by_counter([b.storm_ratio for b in bars]) * c.median
        )
        window_minutes = np.maximum(self.seconds, RATE_MIN_SPAN_S) / 60.0
        z = cohorts_policy.significance
        fast = self.timed & above(self.increase(fs), window_minutes, window_bar, z)
        spread = c.median + _by_counter([b.mad_k for b in bars]) * 1.4826 * c.mad
        far = nan_to_num(span_rate) >= np.maximum(ratio * c.median, spread)
        norm = np.maximum(cohorts_policy.healthy_ratio * c.median, _by_counter([b.floor_per_minute for b in bars]))
        span_z = cohorts_policy.span_significance
        minutes = np.maximum(span_minutes, 1.0)
        own = far & above(span_count, minutes, norm, span_z)
        slow = self.covered(RATE_SPAN) & np.where(
            c.source == FROM_COHORT, own, above(span_count, minutes, window_bar, span_z)
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            times = np.where((c.source != FROM_NONE) & (c.median > 0), span_rate / c.median, np.nan)
        flagged, per_minute = fast | slow, self.per_minute(fs)
        for i, f in enumerate(fs):
            self._rates[f] = RateVerdict(flagged[i], per_minute[i], span_rate[i], span_minutes, c.counter(i), times[i])

    # -- peers under the same load (otel_dra.classifier.peer_evidence) -----------------------------------
    def thermal_peers(self) -> ThermalPeers:
        """Each device's temperature against its peers at the same load (``peer_evidence.thermal_peers``)."""
        if self._thermal is None:
            self._thermal = thermal_peers(self)
        return self._thermal

    def cap_peers(self) -> CapPeers:
        """Each device's power-cap time against its cohort at comparable load (``peer_evidence.cap_peers``)."""
        if self._capped is None:
            self._capped = cap_peers(self)
        return self._capped
