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
(and once, its first); its message then says the evidence in words (:mod:`otel_dra.classifier.explain`).
"""

from __future__ import annotations

import numpy as np

from otel_dra.classifier.features import STATE_OF_CODE
from otel_dra.classifier.group_memory import LinkEpisodes
from otel_dra.classifier.layout import SCOPE, R
from otel_dra.classifier.memory import ReasonMemory, VerdictMemory, pack_key
from otel_dra.classifier.numeric import any_of, filled, flatnonzero
from otel_dra.classifier.registry import grown_rows
from otel_dra.classifier.rules import Evidence
from otel_dra.classifier.topology import GroupNames
from otel_dra.vocabulary import REASONS, REMEDIATIONS, SCOPES

HEALTHY, UNHEALTHY, UNKNOWN = 0, 1, 2
#: Among reasons of the same state, whose scope a verdict takes: the device's own first, then the most
#: specific shared thing (a link, then the node), a firmware version, and last what runs on it.
_SCOPE_RANK = np.zeros(len(SCOPES), dtype=np.int64)
for _rank, _scope in enumerate(("workload", "firmware", "node", "link", "device")):
    _SCOPE_RANK[SCOPE[_scope]] = _rank
_STALE_BIT = 1 << R["stale"]
_LINK, _FIRMWARE, _DEVICE = SCOPE["link"], SCOPE["firmware"], SCOPE["device"]
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
#: Each reason's column, as a row (``(1, reasons)``): indexes a per-(row, reason) table beside a column of rows.
_REASON_COLUMNS = np.arange(len(REASONS))[None, :]


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
        link_remediation: tuple[str, ...] = ("reset_device", "reboot_node"),
        names: GroupNames | None = None,
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
        self.scope_remediation[_FIRMWARE] = REMEDIATIONS.index("update_firmware")
        #: A link finding's ladder, climbed by its group's episodes (not its devices'): per group code, whether
        #: it is on, its episodes within the escalation window, and the step its remediation is at.
        self.names = names if names is not None else GroupNames()
        self.link_ladder = np.asarray([REMEDIATIONS.index(step) for step in link_remediation], dtype=np.int8)
        self.group_on = np.zeros(1, dtype=bool)
        self.group_episodes = np.zeros(1, dtype=np.int32)
        self.group_first_at = np.full(1, -np.inf)
        self.group_remediation = np.full(1, self.link_ladder[0], dtype=np.int8)
        self.on = np.zeros((capacity, r), dtype=bool)
        self.evidence_at = np.full((capacity, r), -np.inf)
        self.state = np.zeros((capacity, r), dtype=np.int8)
        self.state_at = np.full((capacity, r), -np.inf)  # when the held state was last evidenced
        self.floor = np.zeros((capacity, r), dtype=np.int8)
        self.scope = np.zeros((capacity, r), dtype=np.int8)  # a SCOPE code per (row, reason), held with it
        self.group = np.zeros((capacity, r), dtype=np.int32)  # a group code (topology.GroupNames), held with it
        #: Per row: the group code of the reason its verdict's scope was taken from (0: none).
        self.verdict_group = np.zeros(capacity, dtype=np.int32)
        self.episodes = np.zeros((capacity, r), dtype=np.int32)
        self.first_episode_at = np.full((capacity, r), -np.inf)
        self.key = np.full(capacity, -1, dtype=np.int64)  # packed (health, state, reasons, remediation)
        self.transition_ns = np.zeros(capacity, dtype=np.int64)
        #: Per row, when each repair (REPAIRS) was last seen, in the reference clock.
        self.repaired_at = np.full((capacity, len(REPAIRS)), -np.inf)
        #: Per (row, reason): the repair level its held failure waits for (0: it clears with its hold).
        self.need = np.zeros((capacity, r), dtype=np.int8)

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.on = grown_rows(self.on, capacity, keep=keep)
        self.evidence_at = grown_rows(self.evidence_at, capacity, keep=keep)
        self.state = grown_rows(self.state, capacity, keep=keep)
        self.state_at = grown_rows(self.state_at, capacity, keep=keep)
        self.floor = grown_rows(self.floor, capacity, keep=keep)
        self.scope = grown_rows(self.scope, capacity, keep=keep)
        self.group = grown_rows(self.group, capacity, keep=keep)
        self.verdict_group = grown_rows(self.verdict_group, capacity, keep=keep)
        self.episodes = grown_rows(self.episodes, capacity, keep=keep)
        self.first_episode_at = grown_rows(self.first_episode_at, capacity, keep=keep)
        self.key = grown_rows(self.key, capacity, keep=keep)
        self.transition_ns = grown_rows(self.transition_ns, capacity, keep=keep)
        self.repaired_at = grown_rows(self.repaired_at, capacity, keep=keep)
        self.need = grown_rows(self.need, capacity, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        self.on[rows] = False
        self.evidence_at[rows] = -np.inf
        self.state[rows] = 0
        self.state_at[rows] = -np.inf
        self.floor[rows] = 0
        self.scope[rows] = 0
        self.group[rows] = 0
        self.verdict_group[rows] = 0
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

    def recent(self, rows: np.ndarray, now_s: float, window_s: float) -> np.ndarray:
        """Per (row of ``rows``, reason): held, the device's own or a link's, with evidence within ``window_s``
        of ``now_s`` (what a switch's or fabric's devices showed in the same window)."""
        scope = self.scope[rows]
        return self.on[rows] & (now_s - self.evidence_at[rows] <= window_s) & ((scope == _DEVICE) | (scope == _LINK))

    def _step(self, episodes: np.ndarray, steps: int) -> np.ndarray:
        """The ladder step ``episodes`` within the escalation window reach (``after`` episodes: the next step)."""
        per_step = max(1, self.escalate_after - 1)
        return np.minimum((np.maximum(episodes, 1) - 1) // per_step, steps - 1)

    def _codes(
        self,
        groups: np.ndarray,
        ladders: np.ndarray,
        episodes: np.ndarray,
        floor: np.ndarray,
        scopes: np.ndarray,
        group_codes: np.ndarray,
    ) -> np.ndarray:
        """Each (row, reason)'s remediation code: its ladder's step for its episodes, at least its floor, and
        for a reason beyond the device what that thing is remediated with (a link: its group's ladder step)."""
        step = self._step(episodes, ladders.shape[2])
        codes = ladders[groups[:, None], _REASON_COLUMNS, step]
        codes = np.maximum(codes, floor)
        beyond = self.scope_remediation[scopes]
        link = scopes == _LINK
        if any_of(link):
            beyond = np.where(link, self.group_remediation[np.minimum(group_codes, self.group_on.size - 1)], beyond)
        return np.where(beyond >= 0, beyond, codes)

    def _grow_groups(self) -> int:
        """Room for every group code given so far; returns how many there are."""
        n = len(self.names)
        if self.group_on.size < n:
            grow = n - self.group_on.size
            self.group_on = np.concatenate([self.group_on, np.zeros(grow, dtype=bool)])
            self.group_episodes = np.concatenate([self.group_episodes, np.zeros(grow, dtype=np.int32)])
            self.group_first_at = np.concatenate([self.group_first_at, np.full(grow, -np.inf)])
            self.group_remediation = np.concatenate(
                [self.group_remediation, np.full(grow, self.link_ladder[0], dtype=np.int8)]
            )
        return n

    def _link_groups(self, now_s: float, codes: np.ndarray) -> None:
        """The link findings on now (``codes``: the group codes of every link-scoped reason on): a group that
        was not is a new episode of it; its remediation climbs the link ladder with them, as a device's does."""
        n = self._grow_groups()
        on = np.zeros(n, dtype=bool)
        on[codes] = True
        on[0] = False
        entered = on & ~self.group_on
        if any_of(entered):
            restart = entered & (now_s - self.group_first_at > self.escalation_window_s)
            self.group_first_at[restart] = now_s
            self.group_episodes[restart] = 0
            self.group_episodes[entered] += 1
            step = self._step(self.group_episodes[entered], self.link_ladder.size)
            self.group_remediation[entered] = self.link_ladder[step]
        self.group_on = on

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
        worst, bits, remediation, scope = np.zeros((4, n), dtype=np.int64)  # (one allocation, a row each)
        health = filled(n, HEALTHY, np.int64)
        busy = flatnonzero(np.logical_or.reduce(evidence.present, axis=1) | np.logical_or.reduce(self.on[rows], axis=1))
        was_group = self.verdict_group[rows]  # (a verdict whose group changed, say pcie to fabric, is a change)
        links = np.zeros(0, dtype=np.int32)  # the group codes of the link findings on (every row is evaluated)
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
            if any_of(bound):  # (the usual evaluation holds no such failure: no ladder lookup for it)
                need = REPAIR_LEVEL[
                    self._codes(groups[busy], ladders, self.episodes[r], self.floor[r], self.scope[r], self.group[r])
                ]
                bound &= need > 0
                # (each row's repair at its reasons' levels: take_along_axis's indexing, without its wrapper)
                fixed_at = self.repaired_at[r[:, None], np.maximum(need - 1, 0)]
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
            group_codes = np.where(present, evidence.group[busy], self.group[r])
            on = present | silent | (was_on & np.where(bound, waiting, now_s - at < self.hold_s))
            entered = on & ~was_on
            first = self.first_episode_at[r]
            episodes = self.episodes[r]
            restart = entered & (now_s - first > self.escalation_window_s)
            first = np.where(restart, now_s, first)
            # A finding beyond the device (a link, a firmware version) climbs its own ladder, not the device's.
            episodes = np.where(restart, 0, episodes) + (entered & (scopes != _LINK) & (scopes != _FIRMWARE))
            self.on[r], self.evidence_at[r], self.state[r], self.floor[r] = on, at, state, floor
            self.scope[r], self.group[r] = scopes, group_codes
            links = group_codes[on & (scopes == _LINK)]
            self.episodes[r], self.first_episode_at[r] = episodes, first
            rank = np.where(on, state.astype(np.int64) * len(SCOPES) + _SCOPE_RANK[scopes] + 1, 0)
            pick = rank.argmax(axis=1)
            each = np.arange(busy.size)
            picked = rank[each, pick] > 0
            scope[busy] = np.where(picked, scopes[each, pick], 0)
            verdict_group = np.zeros(rows.shape[0], dtype=np.int32)
            verdict_group[busy] = np.where(picked, group_codes[each, pick], 0)
            self.verdict_group[rows] = verdict_group

            worst[busy] = np.maximum.reduce(np.where(on, state, 0), axis=1)
            health[busy] = np.where(unhealthy[worst[busy]], UNHEALTHY, HEALTHY)
            bits[busy] = on.astype(np.int64) @ _REASON_BITS
            self._link_groups(now_s, links)
            codes = self._codes(groups[busy], ladders, episodes, floor, scopes, group_codes)
            remediation[busy] = np.maximum.reduce(np.where(on, codes, 0), axis=1)
            self.need[r] = np.where(on & self.repair_bound[None, :] & (state == _FAILED), REPAIR_LEVEL[codes], 0)
        else:
            self.verdict_group[rows] = 0
            if any_of(self.group_on):
                self._link_groups(now_s, links)
        # Unknown: its held reasons, their remediation and scope stay, with ``stale`` beside them.
        health = np.where(unknown, UNKNOWN, health)
        bits = np.where(unknown, bits | _STALE_BIT, bits)
        state_code = np.where(unknown, -1, worst)
        key = pack_key(health, state_code, bits, remediation, scope)
        changed = (key != self.key[rows]) | (self.verdict_group[rows] != was_group)
        self.key[rows] = key
        return health, state_code, bits, remediation, scope, changed

    # -- memory across restarts (otel_dra.state.persist) ----------------------------------------
    def link_memory(self, now_s: float) -> tuple[LinkEpisodes, ...]:
        """Each link group whose finding is on or whose episodes still count toward escalation at ``now_s``."""
        keep = self.group_on | ((self.group_episodes > 0) & (now_s - self.group_first_at <= self.escalation_window_s))
        out = []
        for code in flatnonzero(keep).tolist():
            key = self.names.keys[code]
            out.append(
                LinkEpisodes(
                    self.names.names[code],
                    key[1] if key[0] == "pcie" else "",
                    bool(self.group_on[code]),
                    int(self.group_episodes[code]),
                    float(self.group_first_at[code]),
                )
            )
        return tuple(out)

    def recall_links(self, links: tuple[LinkEpisodes, ...], now_s: float) -> None:
        """Put back what :meth:`link_memory` gave (a previous process's): a finding held across the restart is no
        new episode of its group, and the group's ladder step is where it was."""
        for link in links:
            code = self.names.recall(link.group, link.node)
            if not code:
                continue
            self._grow_groups()
            self.group_on[code] = link.on
            self.group_episodes[code] = link.episodes
            self.group_first_at[code] = min(link.first_at, now_s)
            self.group_remediation[code] = self.link_ladder[
                self._step(np.asarray(link.episodes), self.link_ladder.size)
            ]

    def remembered(self, rows: np.ndarray, now_s: float) -> dict[int, dict[int, ReasonMemory]]:
        """Per row of ``rows`` that has any, the reasons whose state outlives the process: those on
        (held), and those whose episodes still count toward escalation at ``now_s``."""
        counting = (self.episodes[rows] > 0) & (now_s - self.first_episode_at[rows] <= self.escalation_window_s)
        keep = self.on[rows] | counting
        out: dict[int, dict[int, ReasonMemory]] = {}
        for i in flatnonzero(keep.any(axis=1)).tolist():
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
                    group=self.names.names[int(self.group[row, r])],
                )
                for r in flatnonzero(keep[i]).tolist()
            }
        return out

    def recall(
        self, row: int, reasons: dict[int, ReasonMemory], verdict: VerdictMemory | None, now_s: float, node: str = ""
    ) -> None:
        """Put remembered state back on a (new) row of ``node``; times later than ``now_s`` (a clock that went
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
            self.group[row, r] = self.names.recall(m.group, node) if m.group else 0
            if verdict is not None and m.on and m.scope == verdict.scope and self.group[row, r]:
                self.verdict_group[row] = self.group[row, r]
        if verdict is not None:
            self.key[row] = verdict.key
            self.transition_ns[row] = verdict.since_ns
