"""A verdict in words: its fields from the verdict engine's codes, and its message from the evidence.

The message says each reason's evidence for what it is about (the device, its node, its job). A reason held
by hysteresis, with no evidence now, says the evidence it was last seen with (kept per device and reason,
and across a restart by :mod:`otel_dra.classifier.recall`) and what clears it. Times in a message are
absolute (UTC): it is stored (a taint rule's annotation, a verdict file), where "10s ago" would read the
same an hour later.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from otel_dra import conventions as cv
from otel_dra.classifier.engine import REPAIRS, VerdictEngine
from otel_dra.classifier.explain import (
    NODE_CAUSE,
    explain,
    explain_workload,
    group_of,
    health_name,
    reasons_of,
    remediation_name,
    state_name,
)
from otel_dra.classifier.firmware_rates import FirmwareRates
from otel_dra.classifier.layout import SCOPE, R
from otel_dra.classifier.params import PolicyGroups
from otel_dra.classifier.reader import Window
from otel_dra.classifier.registry import DeviceRegistry
from otel_dra.classifier.rules import Evidence
from otel_dra.classifier.verdict import Verdict, rfc3339
from otel_dra.vocabulary import SCOPES
from otel_dra.words import human_duration

#: What a held failure waits for, by repair (``REPAIRS``).
_AWAITED = ("the device is reset", "its node is rebooted", "the device is replaced")


def _at(unix_s: float) -> str:
    """A moment as a stored message says it: RFC 3339, UTC, to the second."""
    return rfc3339(int(unix_s * 1e9)) if math.isfinite(unix_s) else "an unknown time"


class Shared(NamedTuple):
    """An evaluation's counts of what devices share, for row ``i`` of its evidence: how many of its node's (or
    its switch's, its fabric's) devices show each reason, and how many there are."""

    evidence: Evidence
    i: int


#: What a link group is, by its name's prefix.
_LINK_THING = {"pcie": "PCIe switch", "fabric": "fabric"}


class VerdictWriter:
    """Writes the verdicts of registered rows, and keeps what each row's reasons were last said with
    (``said``: (row, reason) → text), in step with the registry's rows."""

    def __init__(
        self,
        registry: DeviceRegistry,
        groups: PolicyGroups,
        engine: VerdictEngine,
        window_s: float,
        firmware_rates: FirmwareRates | None = None,
    ) -> None:
        self.registry = registry
        self.firmware_rates = firmware_rates
        self.groups = groups
        self.engine = engine
        self.window_s = window_s
        #: A device's message with no reason: one string for every such verdict, not one each.
        self._no_evidence = f"no evidence of a fault in the last {human_duration(window_s)}"
        self.said: dict[tuple[int, str], str] = {}  # (row, reason) -> the evidence last put in words

    def forget(self, rows: np.ndarray) -> None:
        """The registry released ``rows``: what they said is gone with them."""
        gone = set(rows.tolist())
        self.said = {key: text for key, text in self.said.items() if key[0] not in gone}

    def renumber(self, new_of: dict[int, int]) -> None:
        """The registry compacted: row ``old`` is now ``new_of[old]`` (absent: gone)."""
        self.said = {(new_of[row], reason): text for (row, reason), text in self.said.items() if row in new_of}

    def verdict(
        self,
        w: Window,
        i: int,
        row: int,
        now_ns: int,
        health: int,
        state: int,
        bits: int,
        remediation: int,
        scope: int,
        age_s: float,
        node_age_s: float,
        evidence_now: np.ndarray,
        since_ns: int | None = None,
        hits: Shared | None = None,
    ) -> Verdict:
        """Row ``row``'s verdict (``i``: its place in ``w``) from the engine's codes, at ``now_ns``; changed at
        ``since_ns`` (default: its last transition)."""
        key = self.registry.keys[row]
        assert key is not None, "a verdict is built only for a registered row"
        node, hw_id = key
        attrs = self.registry.attrs[row]
        reasons = reasons_of(bits)
        message = self.message(w, i, row, reasons, now_ns / 1e9, age_s, node_age_s, evidence_now, hits)
        return Verdict(
            time_unix_nano=now_ns,
            node=node,
            hw_id=hw_id,
            health=health_name(health),
            state=state_name(state),
            reasons=reasons,
            remediation=remediation_name(remediation),
            message=message,
            pool=attrs.get(cv.DRA_POOL_NAME),
            device=attrs.get(cv.DRA_DEVICE_NAME),
            driver=attrs.get(cv.DRA_DRIVER_NAME),
            last_transition_time=int(self.engine.transition_ns[row]) if since_ns is None else since_ns,
            last_reported_time=round(self.registry.last_seen[row] * 1e9),
            scope=SCOPES[scope],
            group=self.group_name(row, scope, node),
        )

    def group_name(self, row: int, scope: int, node: str) -> str | None:
        """The verdict's ``group``: for a link or firmware scope, the group of the reason its scope was taken
        from; else what the scope and node name."""
        if scope not in (SCOPE["link"], SCOPE["firmware"]):
            return group_of(SCOPES[scope], node)
        code = int(self.engine.verdict_group[row])
        return self.engine.names.names[code] if code else None

    def message(
        self,
        w: Window,
        i: int,
        row: int,
        reasons: tuple[str, ...],
        now_s: float,
        age_s: float,
        node_age_s: float,
        evidence_now: np.ndarray,
        hits: Shared | None = None,
    ) -> str:
        """Each reason's evidence, for what it is about (the device, its node, its job, its switch or fabric, its
        firmware version); a reason held by hysteresis shows the evidence it was last seen with. ``hits``: the
        evaluation's counts of the devices that show it (for a node- or link-scoped reason)."""
        node = self.registry.nodes[self.registry.node_of[row]]
        ew = self.groups.events_windows(int(self.groups.group[row]))
        scopes = self.engine.scope[row]
        parts = []
        for reason in reasons:
            r = R[reason]
            counted = scopes[r] in (SCOPE["node"], SCOPE["link"])
            if evidence_now[r] and counted and hits is None and (row, reason) in self.said:
                text = self.said[(row, reason)]  # (current(): the last evaluation's words, with the counts)
            elif reason == "stale" or evidence_now[r]:
                if scopes[r] == SCOPE["workload"]:
                    text = explain_workload(w, i, reason, node, ew)
                else:
                    text = explain(w, i, reason, self.window_s, node, node_age_s, age_s, self._firmware(row), ew)
                    if scopes[r] == SCOPE["node"] and hits is not None:
                        ev, at = hits
                        shared = f"{int(ev.node_hits[at, r])} of {int(ev.node_devices[at])} devices of node {node}"
                        text = f"{text} (on {shared} at once: {NODE_CAUSE[reason]}, not the devices)"
                    elif scopes[r] == SCOPE["link"] and hits is not None:
                        text = f"{text} ({self._link_words(row, r, hits, node)})"
                self.said[(row, reason)] = text
            else:
                text = self.held_text(row, reason, now_s)
            parts.append(text)
        return "; ".join(parts) if parts else self._no_evidence

    def _firmware(self, row: int) -> str:
        """Why the device's firmware is named: the policy's words, else the fleet's rates for its version."""
        said = self.groups.firmware_text[row]
        rates = self.firmware_rates
        if said or rates is None:
            return said
        return rates.text.get(int(self.engine.group[row, R["firmware"]]), "")

    def _link_words(self, row: int, r: int, hits: Shared, node: str) -> str:
        """A link finding's statistics: how many of the group's devices show it, over what time, and what it
        means."""
        ev, at = hits
        name = self.engine.names.names[int(ev.group[at, r])]
        kind, _, what = name.partition("/")
        thing = f"{_LINK_THING.get(kind, kind)} {what}"
        # (A PCIe switch's neighbours are the node's other devices; a fabric may be the whole node.)
        where = f" on node {node} (not as widely on the node's others)" if kind == "pcie" else ""
        return (
            f"on {int(ev.group_hits[at, r])} of the {int(ev.group_devices[at, r])} devices of {thing}{where} within "
            f"{human_duration(self.window_s)}: the {_LINK_THING.get(kind, kind)}, not the devices"
        )

    def held_text(self, row: int, reason: str, now_s: float) -> str:
        """A reason held without evidence now: what it was last seen with, and what clears it."""
        eng, r = self.engine, R[reason]
        held = self.said.get((row, reason), reason)
        seen = _at(float(eng.evidence_at[row, r]))
        need = int(eng.need[row, r])
        if not need:
            return f"{held} (last evidence at {seen}; clears after {human_duration(eng.hold_s[r])} without)"
        clean = human_duration(eng.clean_after_repair_s)
        fixed_at = float(eng.repaired_at[row, need - 1])
        if fixed_at > eng.evidence_at[row, r]:
            done = _at(fixed_at)
            return f"{held} (last evidence at {seen}; {REPAIRS[need - 1]} seen at {done}, clears after {clean} clean)"
        return f"{held} (last evidence at {seen}; held until {_AWAITED[need - 1]}, then {clean} clean)"
