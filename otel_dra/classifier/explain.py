"""A verdict in words: each reason's evidence as an admin can act on it, and the names of a verdict's codes.

Only the parts of the evidence that are there are said (no "0 errors" noise); a rate says its centre when
that is the news, a node-scoped reason what the node's devices share.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from otel_dra.classifier.features import STATE_OF_CODE, F
from otel_dra.classifier.layout import DUTY_SPAN, RATE_SPAN
from otel_dra.classifier.rates import FROM_COHORT, FROM_NONE, RateVerdict
from otel_dra.classifier.reader import Window
from otel_dra.classifier.rules import corrected_rate, link_rate
from otel_dra.vocabulary import HEALTH, REASONS, REMEDIATIONS
from otel_dra.words import human_duration

#: What a node's devices share that a node-scoped reason points at (the message says so).
NODE_CAUSE: dict[str, str] = {
    "thermal": "the node's cooling or inlet air",
    "cooling": "the node's fans or airflow",
    "power_delivery": "the node's power supply",
    "power_throttling": "the node's power limits",
}


def group_of(scope: str, node: str) -> str | None:
    """The ``group`` a verdict of ``scope`` names on ``node`` (contract §4): ``node/<node>``; for a job whose
    pod is not known, ``workload/node/<node>``: the workload running on that node's GPUs."""
    if scope == "node":
        return f"node/{node}"
    if scope == "workload":
        return f"workload/node/{node}"
    return None


def explain_workload(w: Window, i: int, reason: str, node: str, ew: dict[str, float]) -> str:
    """A job's crashes, shown on a GPU it held: the workload's, not the device's."""
    window = human_duration(ew[reason])
    what, feature = (
        ("application driver errors", F.WORKLOAD_APPLICATION)
        if reason == "driver_errors"
        else ("out-of-memory errors", F.WORKLOAD_OOM)
    )
    crashes = w.events_since(feature, np.full(w.rows.shape, ew[reason]))[i]
    return (
        f"{reason}: a job crashing on node {node}: {what} on several of its GPUs at once, {crashes:g} times in "
        f"{window}; the workload's, not the device's (check the job)"
    )


def reasons_of(bits: int) -> tuple[str, ...]:
    """Reason names of a bitmask, sorted (the contract's order for ``reasons``)."""
    return tuple(sorted(REASONS[i] for i in range(len(REASONS)) if bits >> i & 1))


def health_name(code: int) -> str:
    return HEALTH[code]


def state_name(code: int) -> str | None:
    return None if code < 0 else STATE_OF_CODE[code]


def remediation_name(code: int) -> str:
    return REMEDIATIONS[code]


def explain(
    w: Window,
    i: int,
    reason: str,
    window_s: float,
    node: str,
    node_age_s: float,
    device_age_s: float,
    firmware_text: str,
    events_window_s: dict[str, float],
) -> str:
    """The evidence for one reason, in words an admin can act on."""
    return _explain_one(
        w, i, reason, human_duration(window_s), node, node_age_s, device_age_s, firmware_text, events_window_s
    )


class _Said:
    """One reason's evidence in words, gathered part by part: only the parts that are there (no "0 errors"
    noise)."""

    def __init__(self, w: Window, i: int, win: str, ew: dict[str, float]) -> None:
        self.w, self.i, self.win, self.ew = w, i, win, ew
        self.items: list[str] = []
        self.duty_span = human_duration(w.span_s[DUTY_SPAN])

    def say(self, value: float, text: str) -> None:
        if not np.isnan(value) and value > 0:
            self.items.append(text)

    def fraction(self, f: F) -> float:
        return self.w.fraction(f)[self.i]

    def recurring(self, f: F, what: str, share: bool = False) -> None:
        """The duty-cycle evidence, when it is what the window alone does not show."""
        value = (self.w.span_share if share else self.w.span_fraction)(f, DUTY_SPAN)[self.i]
        self.say(value, f"{what} {value:.0%} of the last {self.duty_span}")

    def events(self, f: F, reason: str) -> float:
        """Events of ``f`` within ``reason``'s events window."""
        return self.w.events_since(f, np.full(self.w.rows.shape, self.ew[reason]))[self.i]


def _thermal(s: _Said) -> None:
    w, i, win = s.w, s.i, s.win
    hot = s.fraction(F.TEMP_HOT)
    s.say(hot, f"temperature above its high.degraded limit in {hot:.0%} of samples over {win}")
    s.say(hot, f"hottest sensor {w.latest[F.TEMP_MAX, i]:.0f} Cel")
    s.say(s.fraction(F.TEMP_CRIT), f"above high.critical in {s.fraction(F.TEMP_CRIT):.0%}")
    share = w.share(F.THROTTLE_THERMAL)[i]
    s.say(share, f"thermal throttling {share:.0%} of the time")
    slow = w.share(F.THROTTLE_SLOWDOWN)[i]
    s.say(slow, f"hardware slowdown {slow:.0%} of the time")
    s.recurring(F.TEMP_HOT, "above high.degraded")
    s.recurring(F.THROTTLE_SLOWDOWN, "hardware slowdown", share=True)
    hot_peers = w.thermal_peers()
    if hot_peers.flagged[i]:
        res = hot_peers.residuals
        load = "" if np.isnan(res.node_util[i]) else f" at utilization {res.node_util[i]:.2f}"
        usual = hot_peers.baseline[i]
        own = "" if np.isnan(usual) else f", {usual:.1f} Cel over them as usual"
        s.items.append(
            f"{res.residual[i]:.1f} Cel hotter than its peers at the same load over {win} (mean "
            f"{w.mean(F.TEMP_MAX)[i]:.1f} Cel; its node's {res.peers[i]:.0f} devices' median "
            f"{res.node_temp[i]:.1f} Cel{load}; bar {hot_peers.bar[i]:.1f} Cel{own})"
        )


def _cooling(s: _Said) -> None:
    cooling = s.fraction(F.COOLING_BAD)
    s.say(cooling, f"fan near zero while the device is warm in {cooling:.0%} of samples over {s.win}")
    s.recurring(F.COOLING_BAD, "fan stalled while warm")


def _memory_ecc(s: _Said) -> None:
    w, i = s.w, s.i
    n = w.increase(F.ECC_UNCORRECTED)[i]
    s.say(n, f"uncorrected ECC errors: {n:g} in {s.win}")
    retired = w.latest[F.RETIRED_TOTAL, i]
    s.say(retired, f"retired pages: {retired:g}")
    s.items.extend(rate_text(corrected_rate(w), i, "corrected ECC", w))


def _power_delivery(s: _Said) -> None:
    w, i = s.w, s.i
    n = w.increase(F.POWER_ERRORS)[i]
    s.say(n, f"power delivery errors: {n:g} in {s.win}")
    s.say(s.fraction(F.VOLT_BAD), f"voltage outside its critical limits in {s.fraction(F.VOLT_BAD):.0%} of samples")
    s.recurring(F.VOLT_BAD, "voltage outside its critical limits")
    brake = w.share(F.THROTTLE_BRAKE)[i]
    s.say(brake, f"hardware power brake asserted {brake:.0%} of the time over {s.win}")
    s.recurring(F.THROTTLE_BRAKE, "power brake", share=True)


def _power_throttling(s: _Said) -> None:
    w, i = s.w, s.i
    capped = w.cap_peers()
    quantile = float(w.params.power_throttling.peer_quantile[i])
    rate_span = human_duration(w.span_s[RATE_SPAN])
    spans = (s.win, s.duty_span, rate_span)
    for share, reference, span in zip(capped.shares, capped.references, spans, strict=True):
        if not np.isnan(share[i]) and share[i] > 0:
            peers = (
                f", its peers at the same load {reference[i]:.0%} (their {quantile:.0%} quantile)"
                if not np.isnan(reference[i])
                else ""
            )
            s.items.append(f"at its power cap {share[i]:.0%} of the time over {span}{peers}")
    s.say(s.fraction(F.POWER_PINNED), f"power at its cap in {s.fraction(F.POWER_PINNED):.0%} of samples")
    limit, usual = capped.limit[i], capped.limit_median[i]
    if not np.isnan(limit) and not np.isnan(usual) and limit < usual:
        if capped.limit_seen[i]:
            s.items.append(f"capped at {limit:.0f} W, its node's devices of its model {usual:.0f} W (no limit series)")
        else:
            s.items.append(f"power limit {limit:.0f} W, its cohort's {usual:.0f} W")


def _memory_pressure(s: _Said) -> None:
    s.say(s.fraction(F.MEM_FULL), f"memory full in {s.fraction(F.MEM_FULL):.0%} of samples over {s.win}")
    ooms = s.events(F.OUT_OF_MEMORY, "memory_pressure")
    s.say(ooms, f"out-of-memory errors: {ooms:g} in {human_duration(s.ew['memory_pressure'])}")


def _link(s: _Said) -> None:
    w, i = s.w, s.i
    expected = np.nan_to_num(w.mean(F.LINK_EXPECTED)[i])
    s.items.extend(rate_text(link_rate(w), i, "link errors", w, f" (DCGM's bar for this link: {expected:.1f}/min)"))
    s.say(s.fraction(F.WIDTH_DOWN), f"PCIe width below its maximum in {s.fraction(F.WIDTH_DOWN):.0%} of samples")
    s.say(s.fraction(F.GEN_DOWN), f"PCIe generation below its maximum under load in {s.fraction(F.GEN_DOWN):.0%}")
    s.recurring(F.WIDTH_DOWN, "PCIe width below its maximum")


def _driver_errors(s: _Said) -> None:
    w, i = s.w, s.i
    fatal = w.increase(F.DRIVER_RESET)[i] + w.increase(F.DRIVER_REBOOT)[i] + w.increase(F.DRIVER_MECHANICAL)[i]
    s.say(fatal, f"fatal driver errors: {fatal:g} in {s.win}")
    app = s.events(F.DRIVER_APPLICATION, "driver_errors")
    s.say(app, f"application driver errors: {app:g} in {human_duration(s.ew['driver_errors'])}")


def _device_reset(s: _Said) -> None:
    resets = s.events(F.RESETS, "device_reset")
    s.say(resets, f"device resets: {resets:g} in {human_duration(s.ew['device_reset'])}")


#: Per reason read from the window, what its evidence says.
_EXPLAIN: dict[str, Callable[[_Said], None]] = {
    "thermal": _thermal,
    "cooling": _cooling,
    "memory_ecc": _memory_ecc,
    "power_delivery": _power_delivery,
    "power_throttling": _power_throttling,
    "memory_pressure": _memory_pressure,
    "link": _link,
    "driver_errors": _driver_errors,
    "device_reset": _device_reset,
}


def _explain_one(
    w: Window,
    i: int,
    reason: str,
    win: str,
    node: str,
    node_age_s: float,
    device_age_s: float,
    firmware_text: str,
    ew: dict[str, float],
) -> str:
    """One reason's evidence: only the parts that are there (no "0 errors" noise)."""
    if reason == "stale":
        return (
            f"no telemetry from node {node} for {human_duration(node_age_s)}: the agent or its network, not the devices"
        )
    if reason == "device_lost":
        return f"no telemetry from the device for {human_duration(device_age_s)} while node {node} still reports"
    if reason == "firmware":
        return firmware_text or "firmware flagged by the policy"
    if reason == "vendor_status":
        code = int(np.nan_to_num(w.latest[F.VENDOR_STATE, i]))
        return f"the device reports hw.state={STATE_OF_CODE[code]}"
    said = _Said(w, i, win, ew)
    if reason in _EXPLAIN:
        _EXPLAIN[reason](said)
    return f"{reason}: " + (", ".join(said.items) if said.items else "no evidence in the current window")


def rate_text(rate: RateVerdict, i: int, what: str, w: Window, note: str = "") -> list[str]:
    """A rate's evidence: the window's rate, and the span's against its centre when that is the news
    ("corrected ECC 3.2/min over 30m, 8x its cohort NVIDIA H100 80GB HBM3 median 0.4/min")."""
    out = []
    window_rate = rate.window_rate[i]
    if not np.isnan(window_rate) and window_rate > 0:
        out.append(f"{what}: {window_rate:.1f}/min{note}")
    ratio, c = rate.ratio[i], rate.centre
    if rate.flagged[i] and not np.isnan(ratio) and c.source[i] != FROM_NONE:
        row = int(w.rows[i])
        peers = (
            f"its cohort {w.groups.cohort_names[w.groups.cohort[row]]}" if c.source[i] == FROM_COHORT else "the fleet"
        )
        span = human_duration(rate.span_minutes[i] * 60.0)
        out.append(f"{what} {rate.span_rate[i]:.1f}/min over {span}, {ratio:.0f}x {peers} median {c.median[i]:.1f}/min")
    return out
