"""From evidence to verdicts: hysteresis, escalation, health, remediation, and what changed.

Per (device, reason), vectorised:
- *hysteresis*: a reason turns on with its evidence and stays on until the evidence has been
  gone for the reason's hold time, so a device near a threshold does not flap;
- *escalation*: each time a reason turns on is an episode; the ``after``-th episode within
  the escalation window climbs the reason's remediation ladder one step, and so on;
- the device's ``hw.state`` is the worst state among its reasons that are on; its health is
  Unhealthy when that state is one of the policy's ``unhealthy_states``, Unknown when its
  node has gone silent (reason ``stale``), Healthy otherwise; its remediation is the most
  disruptive step among its reasons.

A verdict is emitted for a device when its health, state, reasons or remediation change
(and once, its first); its message then says the evidence in words.
"""

from __future__ import annotations

import numpy as np

from otel_dra.classifier.features import STATE_OF_CODE, F
from otel_dra.classifier.memory import ReasonMemory, VerdictMemory, pack_key
from otel_dra.classifier.registry import grown
from otel_dra.classifier.rules import (
    DUTY_SPAN,
    FROM_COHORT,
    FROM_NONE,
    RATE_SPAN,
    SCOPE,
    Evidence,
    R,
    RateVerdict,
    Window,
    corrected_rate,
    link_rate,
)
from otel_dra.vocabulary import HEALTH, REASONS, REMEDIATIONS, SCOPES
from otel_dra.words import human_duration

HEALTHY, UNHEALTHY, UNKNOWN = 0, 1, 2
#: Among reasons of the same state, whose scope a verdict takes: the device's own first, then the most
#: specific shared thing (a link, then the node), a firmware version, and last what runs on it.
_SCOPE_RANK = np.zeros(len(SCOPES), dtype=np.int64)
for _rank, _scope in enumerate(("workload", "firmware", "node", "link", "device")):
    _SCOPE_RANK[SCOPE[_scope]] = _rank
_STALE_BIT = 1 << R["stale"]
_FAILED = STATE_OF_CODE.index("failed")
#: The repair each remediation asks for, as a level of evidence (``VerdictEngine.repaired_at``'s columns + 1):
#: 1 a reset (a firmware update ends with one), 2 a reboot of the node, 3 a new device; 0: none (the reason is
#: a condition, or the job's: it clears with its hold).
REPAIR_LEVEL = np.zeros(len(REMEDIATIONS), dtype=np.int64)
for _name, _level in (("reset_device", 1), ("update_firmware", 1), ("reboot_node", 2), ("replace_device", 3)):
    REPAIR_LEVEL[REMEDIATIONS.index(_name)] = _level
REPAIRS: tuple[str, ...] = ("reset", "reboot", "replace")
RESET, REBOOT, REPLACE = 1, 2, 4  # their bits
_REASON_BITS = np.int64(1) << np.arange(len(REASONS), dtype=np.int64)


class VerdictEngine:
    """Per (row, reason) hysteresis and escalation state, and the last verdict per row."""

    def __init__(
        self,
        capacity: int,
        hold_s: np.ndarray,
        escalation_window_s: float,
        escalate_after: int,
        node_remediation: str = "reboot_node",
        repair_bound: np.ndarray | None = None,
        clean_after_repair_s: float = 300.0,
    ) -> None:
        r = len(REASONS)
        self.hold_s = hold_s
        #: Per reason: a failure of it clears on repair, not with time (the policy's ``clears``).
        self.repair_bound = np.zeros(r, dtype=bool) if repair_bound is None else repair_bound
        self.clean_after_repair_s = clean_after_repair_s
        self.escalation_window_s = escalation_window_s
        self.escalate_after = escalate_after
        # What a finding beyond the device is remediated with, whatever its reason's ladder says.
        self.scope_remediation = np.full(len(SCOPES), -1, dtype=np.int8)
        self.scope_remediation[SCOPE["workload"]] = REMEDIATIONS.index("check_workload")
        self.scope_remediation[SCOPE["node"]] = REMEDIATIONS.index(node_remediation)
        self.on = np.zeros((capacity, r), dtype=bool)
        self.evidence_at = np.full((capacity, r), -np.inf)
        self.state = np.zeros((capacity, r), dtype=np.int8)
        self.state_at = np.full((capacity, r), -np.inf)  # when the held state was last evidenced
        self.floor = np.zeros((capacity, r), dtype=np.int8)
        self.scope = np.zeros((capacity, r), dtype=np.int8)  # a SCOPE code per (row, reason), held with it
        self.episodes = np.zeros((capacity, r), dtype=np.int32)
        self.first_episode_at = np.full((capacity, r), -np.inf)
        self.key = np.full(capacity, -1, dtype=np.int64)  # packed (health, state, reasons, remediation)
        self.transition_ns = np.zeros(capacity, dtype=np.int64)
        #: Per row, when each repair (REPAIRS) was last seen, in the reference clock.
        self.repaired_at = np.full((capacity, len(REPAIRS)), -np.inf)
        #: Per (row, reason): the repair level its held failure waits for (0: it clears with its hold).
        self.need = np.zeros((capacity, r), dtype=np.int8)

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.on = grown(self.on, capacity, False, keep=keep)
        self.evidence_at = grown(self.evidence_at, capacity, -np.inf, keep=keep)
        self.state = grown(self.state, capacity, 0, keep=keep)
        self.state_at = grown(self.state_at, capacity, -np.inf, keep=keep)
        self.floor = grown(self.floor, capacity, 0, keep=keep)
        self.scope = grown(self.scope, capacity, 0, keep=keep)
        self.episodes = grown(self.episodes, capacity, 0, keep=keep)
        self.first_episode_at = grown(self.first_episode_at, capacity, -np.inf, keep=keep)
        self.key = grown(self.key, capacity, -1, keep=keep)
        self.transition_ns = grown(self.transition_ns, capacity, 0, keep=keep)
        self.repaired_at = grown(self.repaired_at, capacity, -np.inf, keep=keep)
        self.need = grown(self.need, capacity, 0, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        self.on[rows] = False
        self.evidence_at[rows] = -np.inf
        self.state[rows] = 0
        self.state_at[rows] = -np.inf
        self.floor[rows] = 0
        self.scope[rows] = 0
        self.episodes[rows] = 0
        self.first_episode_at[rows] = -np.inf
        self.key[rows] = -1
        self.transition_ns[rows] = 0
        self.repaired_at[rows] = -np.inf
        self.need[rows] = 0

    def repaired(self, rows: np.ndarray, kinds: np.ndarray, at_s: np.ndarray) -> None:
        """Note repairs: ``rows[i]`` had the repairs of bitmask ``kinds[i]`` (bit k: ``REPAIRS[k]``) at ``at_s[i]``
        (the reference clock). Whoever saw the repair sets every kind it implies (a node's reboot resets its
        devices; the agent's own restart reboots none of them, and resets nothing)."""
        got = (kinds[:, None] >> np.arange(len(REPAIRS))[None, :]) & 1 == 1
        seen = self.repaired_at[rows]
        self.repaired_at[rows] = np.where(got, np.fmax(seen, at_s[:, None]), seen)

    def awaiting_repair(self, rows: np.ndarray) -> np.ndarray:
        """Which of ``rows`` hold a failure that only a repair clears (their window's evidence is the old
        device's once a repair is seen)."""
        return (self.on[rows] & (self.state[rows] == _FAILED) & self.repair_bound[None, :]).any(axis=1)

    def _codes(
        self, groups: np.ndarray, ladders: np.ndarray, episodes: np.ndarray, floor: np.ndarray, scopes: np.ndarray
    ) -> np.ndarray:
        """Each (row, reason)'s remediation code: its ladder's step for its episodes, at least its floor, and
        for a reason beyond the device what that thing is remediated with."""
        per_step = max(1, self.escalate_after - 1)
        step = np.minimum((np.maximum(episodes, 1) - 1) // per_step, ladders.shape[2] - 1)
        codes = ladders[groups[:, None], np.arange(len(REASONS))[None, :], step]
        codes = np.maximum(codes, floor)
        beyond = self.scope_remediation[scopes]
        return np.where(beyond >= 0, beyond, codes)

    def step(
        self,
        rows: np.ndarray,
        now_s: float,
        evidence: Evidence,
        unknown: np.ndarray,
        unhealthy: np.ndarray,
        ladders: np.ndarray,
        groups: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Advance the state of ``rows`` to ``now_s``; returns per row (health, state code or -1,
        reasons bitmask, remediation code, scope code, changed mask).

        A verdict's scope is that of its reason with the worst state (the device's own first among equals:
        a device fault is never hidden behind its node's or its job's). A reason scoped beyond the device is
        remediated for what it is about (``check_workload``, the node's remediation), not by its ladder.

        ``unhealthy[state]`` says which state codes are Unhealthy; ``ladders`` is
        ``(groups, reasons, steps)`` of remediation codes and ``groups`` each row's group.
        Only rows with evidence now or a reason still on do per-reason work: a device with
        neither is Healthy and ok, and its per-reason state does not change.
        """
        n = rows.shape[0]
        health = np.full(n, HEALTHY, dtype=np.int64)
        worst = np.zeros(n, dtype=np.int64)
        bits = np.zeros(n, dtype=np.int64)
        remediation = np.zeros(n, dtype=np.int64)
        scope = np.zeros(n, dtype=np.int64)
        busy = np.flatnonzero(evidence.present.any(axis=1) | self.on[rows].any(axis=1))
        if busy.size:
            r = rows[busy]
            present = evidence.present[busy] & ~unknown[busy, None]
            was_on = self.on[r]
            # Silence does not repair: while the node is silent, what was on stays on, its hold clock stopped.
            silent = unknown[busy, None] & was_on
            at = np.where(present | silent, now_s, self.evidence_at[r])
            # A failure that only a repair clears: held until the repair its remediation names was seen after
            # its last evidence, and the device stayed clean for ``clean_after_repair_s`` since.
            held, held_at = self.state[r], self.state_at[r]
            bound = was_on & self.repair_bound[None, :] & (held == _FAILED)
            if bound.any():  # (the usual evaluation holds no such failure: no ladder lookup for it)
                need = REPAIR_LEVEL[self._codes(groups[busy], ladders, self.episodes[r], self.floor[r], self.scope[r])]
                bound &= need > 0
                fixed_at = np.take_along_axis(self.repaired_at[r], np.maximum(need - 1, 0), axis=1)
                waiting = bound & ~((fixed_at > at) & (now_s - fixed_at >= self.clean_after_repair_s))
            else:
                waiting = bound
            # Severity has hysteresis too: a lower state replaces the held one only once the held
            # one's evidence has been gone for the hold time (no failed/degraded see-saw), or a repair.
            keep = (evidence.state[busy] < held) & ((now_s - held_at < self.hold_s) | waiting)
            state = np.where(present, np.where(keep, held, evidence.state[busy]), held)
            self.state_at[r] = np.where(present & ~keep, now_s, held_at)
            floor = np.where(present, evidence.floor[busy], self.floor[r])
            scopes = np.where(present, evidence.scope[busy], self.scope[r])
            on = present | silent | (was_on & np.where(bound, waiting, now_s - at < self.hold_s))
            entered = on & ~was_on
            first = self.first_episode_at[r]
            episodes = self.episodes[r]
            restart = entered & (now_s - first > self.escalation_window_s)
            first = np.where(restart, now_s, first)
            episodes = np.where(restart, 0, episodes) + entered
            self.on[r], self.evidence_at[r], self.state[r], self.floor[r] = on, at, state, floor
            self.scope[r] = scopes
            self.episodes[r], self.first_episode_at[r] = episodes, first
            rank = np.where(on, state.astype(np.int64) * len(SCOPES) + _SCOPE_RANK[scopes] + 1, 0)
            pick = rank.argmax(axis=1)
            scope[busy] = np.where(rank[np.arange(busy.size), pick] > 0, scopes[np.arange(busy.size), pick], 0)

            worst[busy] = np.where(on, state, 0).max(axis=1)
            health[busy] = np.where(unhealthy[worst[busy]], UNHEALTHY, HEALTHY)
            bits[busy] = on.astype(np.int64) @ _REASON_BITS
            codes = self._codes(groups[busy], ladders, episodes, floor, scopes)
            remediation[busy] = np.where(on, codes, 0).max(axis=1)
            self.need[r] = np.where(on & self.repair_bound[None, :] & (state == _FAILED), REPAIR_LEVEL[codes], 0)
        # Unknown: its held reasons, their remediation and scope stay, with ``stale`` beside them.
        health = np.where(unknown, UNKNOWN, health)
        bits = np.where(unknown, bits | _STALE_BIT, bits)
        state_code = np.where(unknown, -1, worst)
        key = pack_key(health, state_code, bits, remediation, scope)
        changed = key != self.key[rows]
        self.key[rows] = key
        return health, state_code, bits, remediation, scope, changed

    # -- memory across restarts (otel_dra.state.persist) ----------------------------------------
    def remembered(self, rows: np.ndarray, now_s: float) -> dict[int, dict[int, ReasonMemory]]:
        """Per row of ``rows`` that has any, the reasons whose state outlives the process: those on
        (held), and those whose episodes still count toward escalation at ``now_s``."""
        counting = (self.episodes[rows] > 0) & (now_s - self.first_episode_at[rows] <= self.escalation_window_s)
        keep = self.on[rows] | counting
        out: dict[int, dict[int, ReasonMemory]] = {}
        for i in np.flatnonzero(keep.any(axis=1)).tolist():
            row = int(rows[i])
            out[row] = {
                r: ReasonMemory(
                    bool(self.on[row, r]),
                    float(self.evidence_at[row, r]),
                    int(self.state[row, r]),
                    float(self.state_at[row, r]),
                    int(self.floor[row, r]),
                    int(self.episodes[row, r]),
                    float(self.first_episode_at[row, r]),
                    scope=int(self.scope[row, r]),
                )
                for r in np.flatnonzero(keep[i]).tolist()
            }
        return out

    def recall(self, row: int, reasons: dict[int, ReasonMemory], verdict: VerdictMemory | None, now_s: float) -> None:
        """Put remembered state back on a (new) row; times later than ``now_s`` (a clock that went
        back) are taken as ``now_s``."""
        for r, m in reasons.items():
            self.on[row, r] = m.on
            self.evidence_at[row, r] = min(m.evidence_at, now_s)
            self.state[row, r] = m.state
            self.state_at[row, r] = min(m.state_at, now_s)
            self.floor[row, r] = m.floor
            self.episodes[row, r] = m.episodes
            self.first_episode_at[row, r] = min(m.first_episode_at, now_s)
            self.scope[row, r] = m.scope
        if verdict is not None:
            self.key[row] = verdict.key
            self.transition_ns[row] = verdict.since_ns


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
    items: list[str] = []

    def say(value: float, text: str) -> None:
        if not np.isnan(value) and value > 0:
            items.append(text)

    frac = w.fraction
    duty_span = human_duration(w.span_s[DUTY_SPAN])

    def recurring(f: F, what: str, share: bool = False) -> None:
        """The duty-cycle evidence, when it is what the window alone does not show."""
        value = (w.span_share if share else w.span_fraction)(f, DUTY_SPAN)[i]
        say(value, f"{what} {value:.0%} of the last {duty_span}")

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
    if reason == "thermal":
        hot = frac(F.TEMP_HOT)[i]
        say(hot, f"temperature above its high.degraded limit in {hot:.0%} of samples over {win}")
        say(hot, f"hottest sensor {w.latest[F.TEMP_MAX, i]:.0f} Cel")
        say(frac(F.TEMP_CRIT)[i], f"above high.critical in {frac(F.TEMP_CRIT)[i]:.0%}")
        share = w.share(F.THROTTLE_THERMAL)[i]
        say(share, f"thermal throttling {share:.0%} of the time")
        slow = w.share(F.THROTTLE_SLOWDOWN)[i]
        say(slow, f"hardware slowdown {slow:.0%} of the time")
        recurring(F.TEMP_HOT, "above high.degraded")
        recurring(F.THROTTLE_SLOWDOWN, "hardware slowdown", share=True)
        hot_peers = w.thermal_peers()
        if hot_peers.flagged[i]:
            res = hot_peers.residuals
            load = "" if np.isnan(res.node_util[i]) else f" at utilization {res.node_util[i]:.2f}"
            usual = hot_peers.baseline[i]
            own = "" if np.isnan(usual) else f", {usual:.1f} Cel over them as usual"
            items.append(
                f"{res.residual[i]:.1f} Cel hotter than its peers at the same load over {win} (mean "
                f"{w.mean(F.TEMP_MAX)[i]:.1f} Cel; its node's {res.peers[i]:.0f} devices' median "
                f"{res.node_temp[i]:.1f} Cel{load}; bar {hot_peers.bar[i]:.1f} Cel{own})"
            )
    elif reason == "cooling":
        say(
            frac(F.COOLING_BAD)[i],
            f"fan near zero while the device is warm in {frac(F.COOLING_BAD)[i]:.0%} of samples over {win}",
        )
        recurring(F.COOLING_BAD, "fan stalled while warm")
    elif reason == "memory_ecc":
        n = w.increase(F.ECC_UNCORRECTED)[i]
        say(n, f"uncorrected ECC errors: {n:g} in {win}")
        retired = w.latest[F.RETIRED_TOTAL, i]
        say(retired, f"retired pages: {retired:g}")
        items.extend(rate_text(corrected_rate(w), i, "corrected ECC", w))
    elif reason == "power_delivery":
        n = w.increase(F.POWER_ERRORS)[i]
        say(n, f"power delivery errors: {n:g} in {win}")
        say(frac(F.VOLT_BAD)[i], f"voltage outside its critical limits in {frac(F.VOLT_BAD)[i]:.0%} of samples")
        recurring(F.VOLT_BAD, "voltage outside its critical limits")
        brake = w.share(F.THROTTLE_BRAKE)[i]
        say(brake, f"hardware power brake asserted {brake:.0%} of the time over {win}")
        recurring(F.THROTTLE_BRAKE, "power brake", share=True)
    elif reason == "power_throttling":
        capped = w.cap_peers()
        quantile = float(w.groups.rules[w.groups.group[w.rows[i]]]["power_throttling"]["peer_quantile"])
        rate_span = human_duration(w.span_s[RATE_SPAN])
        for share, reference, span in zip(capped.shares, capped.references, (win, duty_span, rate_span), strict=True):
            if not np.isnan(share[i]) and share[i] > 0:
                peers = (
                    f", its peers at the same load {reference[i]:.0%} (their {quantile:.0%} quantile)"
                    if not np.isnan(reference[i])
                    else ""
                )
                items.append(f"at its power cap {share[i]:.0%} of the time over {span}{peers}")
        say(frac(F.POWER_PINNED)[i], f"power at its cap in {frac(F.POWER_PINNED)[i]:.0%} of samples")
        limit, usual = capped.limit[i], capped.limit_median[i]
        if not np.isnan(limit) and not np.isnan(usual) and limit < usual:
            items.append(f"power limit {limit:.0f} W, its cohort's {usual:.0f} W")
    elif reason == "memory_pressure":
        say(frac(F.MEM_FULL)[i], f"memory full in {frac(F.MEM_FULL)[i]:.0%} of samples over {win}")
        ooms = w.events_since(F.OUT_OF_MEMORY, np.full(w.rows.shape, ew["memory_pressure"]))[i]
        say(ooms, f"out-of-memory errors: {ooms:g} in {human_duration(ew['memory_pressure'])}")
    elif reason == "link":
        expected = np.nan_to_num(w.mean(F.LINK_EXPECTED)[i])
        items.extend(rate_text(link_rate(w), i, "link errors", w, f" (DCGM's bar for this link: {expected:.1f}/min)"))
        say(frac(F.WIDTH_DOWN)[i], f"PCIe width below its maximum in {frac(F.WIDTH_DOWN)[i]:.0%} of samples")
        say(frac(F.GEN_DOWN)[i], f"PCIe generation below its maximum under load in {frac(F.GEN_DOWN)[i]:.0%}")
        recurring(F.WIDTH_DOWN, "PCIe width below its maximum")
    elif reason == "driver_errors":
        fatal = w.increase(F.DRIVER_RESET)[i] + w.increase(F.DRIVER_REBOOT)[i] + w.increase(F.DRIVER_MECHANICAL)[i]
        say(fatal, f"fatal driver errors: {fatal:g} in {win}")
        app = w.events_since(F.DRIVER_APPLICATION, np.full(w.rows.shape, ew["driver_errors"]))[i]
        say(app, f"application driver errors: {app:g} in {human_duration(ew['driver_errors'])}")
    elif reason == "device_reset":
        resets = w.events_since(F.RESETS, np.full(w.rows.shape, ew["device_reset"]))[i]
        say(resets, f"device resets: {resets:g} in {human_duration(ew['device_reset'])}")
    return f"{reason}: " + (", ".join(items) if items else "no evidence in the current window")


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
