"""Freshness and pacing: whether each device (and its node) was heard recently enough to be judged.

Freshness is read in the reference clock (the agent's or the fleet's wall clock, or a replay's watermark),
against when each device was last heard, so a node whose clock runs ahead or behind is neither silent nor
early. Pacing is the evaluating loop telling how late its pass is: a pass far behind its schedule means this
process stood still (and heard nothing meanwhile), so the devices get a grace of one sampling interval
before silence counts against them.
"""

from __future__ import annotations

import time

import numpy as np

from otel_dra.classifier.features import F
from otel_dra.classifier.numeric import filled, flatnonzero
from otel_dra.classifier.registry import DeviceRegistry
from otel_dra.classifier.window import WindowStore
from otel_dra.policy import Policy

#: A loop pass more than this many of its periods late means its own process was stalled.
STALL_PERIODS = 2.0
#: How early a stall's grace may end: times are compared to the millisecond, not to a float's last bit.
_GRACE_SLACK_S = 1e-3


def monotonic_s() -> float:
    """The clock stalls are measured with: monotonic (never stepped by NTP or a user), and on Linux
    counting the time the system was suspended too (``CLOCK_BOOTTIME``), which ``time.monotonic`` skips."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def _runs(groups: np.ndarray) -> np.ndarray:
    """Where each run of equal neighbours in ``groups`` starts."""
    return np.concatenate(([0], flatnonzero(groups[1:] != groups[:-1]) + 1)) if groups.size else np.zeros(0, np.intp)


def _max_into(out: np.ndarray, groups: np.ndarray, values: np.ndarray, starts: np.ndarray) -> None:
    """``out[g] = max(out[g], values of group g)``, by runs (``starts``, :func:`_runs`): a node's devices hold
    neighbouring rows, so a fleet's 10,000 devices are some 1,250 runs, and ``np.maximum.at`` (slow per
    element) sees one value a run."""
    if starts.size:
        np.maximum.at(out, groups[starts], np.maximum.reduceat(values, starts))


class Freshness:
    """Each device's freshness at an evaluation, and the stall grace :meth:`pace` notes.

    ``interval_s`` is the shortest sampling interval expected: the least grace a device gets after a stall."""

    def __init__(self, policy: Policy, registry: DeviceRegistry, store: WindowStore, interval_s: float) -> None:
        self.policy = policy
        self.registry = registry
        self.store = store
        self.interval_s = interval_s
        self._last_pass_s: float | None = None  # monotonic_s() of the last loop pass (see pace)
        self._stall_since_s: float | None = None  # a stall noted by pace, its grace not yet begun
        self._stall: tuple[float, float] | None = None  # (since, resumed) in the reference clock: in grace

    def intervals(self, rows: np.ndarray | slice) -> np.ndarray:
        """Each row's sampling interval as its window shows it (NaN until it has two samples)."""
        st = self.store
        steps = st.counts[F.DT, rows] - st.holds_first(rows)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(steps > 0, st.sums[F.DT, rows] / steps, np.nan)

    def pace(self, every_s: float, last_now_ns: int, monotonic: float | None = None) -> float:
        """A loop's pass, every ``every_s`` seconds, before its evaluation (the last one at ``last_now_ns``, 0:
        none yet); how late it is when that makes it a stall (seconds; 0.0 when not).

        A pass more than ``STALL_PERIODS`` periods late, by :func:`monotonic_s` (``monotonic``: a
        test's clock), means this process was not running: stopped (SIGSTOP), throttled, swapped out,
        in a long pause. Its receivers could not read their sockets either, so nothing was heard
        while it stood still, and a node is not to be blamed for that: from the next evaluation each
        device gets one sampling interval (its own, never under ``interval_s``) to be heard before it
        is called stale, and until then a device (or node) that was fresh at the last evaluation
        before the stall stays fresh. One that really went silent is stale when that interval ends."""
        now = monotonic_s() if monotonic is None else monotonic
        last, self._last_pass_s = self._last_pass_s, now
        if last is None or last_now_ns == 0:
            return 0.0
        late = now - last - every_s
        if late <= STALL_PERIODS * every_s:
            return 0.0
        self._stall_since_s = last_now_ns / 1e9
        return late

    def of(self, now_s: float, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(device fresh, node fresh, device age s, node age s) for ``rows``, in the reference clock.

        A device's stale timeout is the policy's, never under ``stale_intervals`` of its own
        sampling interval (until that is known, of the stale timeout itself: a new 60 s node is
        not stale before its second sample); a node's is the longest of its devices', judged
        against when it was last heard. After a stall of the judging process (:meth:`pace`), what
        was fresh when it stalled stays fresh for a sampling interval after it resumed."""
        reg = self.registry
        active = flatnonzero(reg.active)
        base = self.policy.stale_timeout_s
        measured = self.intervals(active)
        interval = np.where(np.isnan(measured), base, measured)
        timeout = filled(reg.capacity, base)
        timeout[active] = np.maximum(base, self.policy.stale_intervals * interval)
        nodes = len(reg.nodes)
        node_last = filled(nodes, -np.inf)
        node_timeout = np.zeros(nodes)
        node_of = reg.node_of[active]
        starts = _runs(node_of)
        _max_into(node_last, node_of, reg.last_heard[active], starts)
        _max_into(node_timeout, node_of, timeout[active], starts)
        age = now_s - reg.last_heard[rows]
        node = reg.node_of[rows]
        node_age = now_s - node_last[node]
        fresh, node_fresh = age <= timeout[rows], node_age <= node_timeout[node]
        if self._stall is not None:
            since, resumed = self._stall
            grace = np.zeros(reg.capacity, dtype=bool)  # in grace and fresh when the stall began
            grace[active] = (now_s < resumed + np.fmax(self.interval_s, measured) - _GRACE_SLACK_S) & (
                reg.last_heard[active] + timeout[active] >= since
            )
            node_grace = np.zeros(nodes, dtype=bool)
            np.logical_or.at(node_grace, reg.node_of[active], grace[active])
            fresh |= grace[rows]
            node_fresh |= node_grace[node]
        return fresh, node_fresh, age, node_age

    def grace(self, now_s: float) -> bool:
        """Begin the grace of a stall :meth:`pace` noted, or end one whose every device's interval
        is over; True while one lasts."""
        if self._stall_since_s is not None:
            self._stall, self._stall_since_s = (self._stall_since_s, now_s), None
        elif self._stall is not None:
            longest = np.nanmax(self.intervals(flatnonzero(self.registry.active)), initial=0.0)
            if now_s >= self._stall[1] + max(self.interval_s, float(longest)) - _GRACE_SLACK_S:
                self._stall = None
        return self._stall is not None
