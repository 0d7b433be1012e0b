"""The policy resolved per device: rows grouped by (``hw.vendor``, ``hw.model``), thresholds as arrays.

Overrides make thresholds differ by model, yet rules must stay array expressions: each row
carries a policy group index, each threshold is an array over groups
(:mod:`otel_dra.classifier.thresholds`, compiled when a group appears), and :meth:`PolicyGroups.at`
gives the per-row values. Groups change only when a device's attributes do, which is rare
and the only place Python touches a single device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from otel_dra import conventions as cv
from otel_dra.classifier.features import DeviceParams, DriverClasses
from otel_dra.classifier.registry import grown_rows
from otel_dra.classifier.thresholds import RowParams, RuleParams, at_group, compile_rules
from otel_dra.policy import Policy
from otel_dra.vocabulary import REASONS, REMEDIATIONS

_SEGMENT = re.compile(r"[.\-_]")
#: Arrays of groups whose sample-stage thresholds are kept (:meth:`PolicyGroups.device_params`).
MAX_KEPT_PARAMS: Final = 256


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """A sortable key for firmware versions: dotted segments compared as numbers when they
    are (decimal, or hex as NVIDIA VBIOS versions use), as text otherwise."""
    key: list[tuple[int, int | str]] = []
    for seg in _SEGMENT.split(version.strip()):
        if seg.isdigit():
            key.append((0, int(seg)))
        elif re.fullmatch(r"[0-9A-Fa-f]+", seg):
            key.append((0, int(seg, 16)))
        else:
            key.append((1, seg))
    return tuple(key)


@dataclass(frozen=True)
class FirmwareLimits:
    """One group's firmware rule: versions denied, and the least version per vendor."""

    deny: frozenset[str]
    minimum: Mapping[str, str]


class PolicyGroups:
    """Per-row policy group, firmware verdict, and per-group threshold arrays."""

    def __init__(self, policy: Policy, capacity: int) -> None:
        self.policy = policy
        self._index: dict[tuple[str, str], int] = {}
        self.rules: list[Mapping[str, Any]] = []  # each group's merged rules, as the policy has them
        self.vendors: list[str] = []
        #: The rules' thresholds, arrays over groups (recompiled when a group appears).
        self.params: RuleParams = compile_rules([])
        #: The base rules' (no override's): fleet-wide values (the peer quantile of power-cap references).
        self.base: RuleParams = compile_rules([policy.rules])
        self.firmware: list[FirmwareLimits] = []
        self.code_tables: list[dict[str, str]] = []  # per group: driver error code -> class
        self._driver = DriverClasses(self.code_tables)
        link = policy.rules["link"]["replays_per_lane_per_minute"]
        self._rate_of_gen = np.zeros(17)  # (DeviceParams.rate_of_gen: one array for every batch, read-only)
        for g, rate in link.items():
            self._rate_of_gen[int(g)] = float(rate)
        self._rate_of_gen.flags.writeable = False
        self.group = np.zeros(capacity, dtype=np.intp)
        self.firmware_bad = np.zeros(capacity, dtype=bool)
        self.firmware_text: list[str] = [""] * capacity
        self._group_for("", "")
        # Cohorts: devices whose rates are compared (the policy's ``cohorts.by`` attributes).
        self._cohort_index: dict[tuple[str, ...], int] = {}
        self.cohort_names: list[str] = []
        self.cohort = np.zeros(capacity, dtype=np.intp)
        self._cohort_for(("",) * len(policy.cohorts.keys))
        # Slots: a cohort's devices that sit in the same place of their nodes (``cohorts.slot_by``).
        self._slot_index: dict[tuple[int, str], int] = {}
        self.slot = np.zeros(capacity, dtype=np.intp)
        self._slot_for(0, "")
        #: The last :meth:`at`: (the thresholds it read, its rows' and their groups' bytes, what it gave).
        self._row_params: tuple[RuleParams, tuple[bytes, bytes], RowParams] | None = None
        #: What :meth:`device_params` gave, by the rows' groups (their bytes), for the thresholds it read.
        #: ... and the thresholds every group shares, by the batch's shape (DeviceParams' fields by name: any
        #: field's type, as ``**`` gives them).
        self._device_params: (
            tuple[RuleParams, dict[bytes, DeviceParams], dict[tuple[int, ...], dict[str, Any]]] | None
        ) = None

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.group = grown_rows(self.group, capacity, keep=keep)
        self.cohort = grown_rows(self.cohort, capacity, keep=keep)
        self.slot = grown_rows(self.slot, capacity, keep=keep)
        self.firmware_bad = grown_rows(self.firmware_bad, capacity, keep=keep)
        kept = self.firmware_text if keep is None else [self.firmware_text[row] for row in keep.tolist()]
        self.firmware_text = kept + [""] * (capacity - len(kept))

    def clear(self, rows: np.ndarray) -> None:
        self.group[rows] = 0
        self.cohort[rows] = 0
        self.slot[rows] = 0
        self.firmware_bad[rows] = False
        for row in rows.tolist():
            self.firmware_text[row] = ""

    def _group_for(self, vendor: str, model: str) -> int:
        key = (vendor, model)
        group = self._index.get(key)
        if group is None:
            group = self._index[key] = len(self.rules)
            rules = self.policy.rules_for(vendor, model)
            self.rules.append(rules)
            self.vendors.append(vendor)
            self.params = compile_rules(self.rules)
            fw = rules["firmware"]
            self.firmware.append(FirmwareLimits(frozenset(fw["deny"]), dict(fw["minimum"])))
            classes = rules["driver_errors"]["code_tables"].get(vendor, {})
            self.code_tables.append({code: klass for klass, codes in classes.items() for code in codes})
        return group

    def _cohort_for(self, key: tuple[str, ...]) -> int:
        cohort = self._cohort_index.get(key)
        if cohort is None:
            cohort = self._cohort_index[key] = len(self.cohort_names)
            self.cohort_names.append(" ".join(part for part in key if part) or "(no model)")
        return cohort

    def _slot_for(self, cohort: int, name: str) -> int:
        slot = self._slot_index.get((cohort, name))
        if slot is None:
            slot = self._slot_index[(cohort, name)] = len(self._slot_index)
        return slot

    @property
    def n_slots(self) -> int:
        return len(self._slot_index)

    def assign(self, row: int, attrs: Mapping[str, str], hw_id: str = "") -> None:
        """(Re)classify one device after its attributes changed (``hw_id``: its id, which ``slot_by`` may name)."""
        group = self._group_for(attrs.get(cv.HW_VENDOR, ""), attrs.get(cv.HW_MODEL, ""))
        self.group[row] = group
        cohort = self.cohort[row] = self._cohort_for(tuple(attrs.get(key, "") for key in self.policy.cohorts.keys))
        with_id = {**attrs, cv.HW_ID: hw_id} if hw_id else attrs
        name = next((with_id[key] for key in self.policy.cohorts.slot_keys if with_id.get(key)), "")
        self.slot[row] = self._slot_for(int(cohort), name)
        fw = self.firmware[group]
        version = attrs.get(cv.HW_FIRMWARE_VERSION)
        bad, why = False, ""
        if version is not None:
            if version in fw.deny:
                bad, why = True, f"firmware {version} is on the policy's deny list"
            minimum = fw.minimum.get(attrs.get(cv.HW_VENDOR, ""))
            if minimum is not None and version_key(version) < version_key(minimum):
                bad, why = True, f"firmware {version} is below the policy minimum {minimum}"
        self.firmware_bad[row] = bad
        self.firmware_text[row] = why

    # -- thresholds ----------------------------------------------------------------------------
    def at(self, rows: np.ndarray) -> RowParams:
        """The thresholds of ``rows``, each rule's read at their groups when first asked for. Kept while the rows,
        their groups and the compiled thresholds stay the same (every evaluation of a steady fleet asks for the
        same ones: read once, not at each evaluation)."""
        group = self.group[rows]
        key = (rows.tobytes(), group.tobytes())  # (compared as bytes: np.array_equal's checks cost ten times more)
        kept = self._row_params
        if kept is not None:
            params, kept_key, row_params = kept
            if params is self.params and kept_key == key:
                return row_params
        row_params = RowParams(self, rows, group)
        self._row_params = (self.params, key, row_params)
        return row_params

    def events_windows(self, group: int) -> dict[str, float]:
        """Per reason judged on event logs (``EVENT_REASONS``), its events window in ``group``, seconds."""
        p = self.params
        return {
            "memory_pressure": float(p.memory_pressure.events_window[group]),
            "driver_errors": float(p.driver_errors.events_window[group]),
            "device_reset": float(p.device_reset.events_window[group]),
        }

    def device_params(self, rows: np.ndarray) -> DeviceParams:
        """What the sample stage needs for these rows (only its thresholds read: a batch is often a node's). Kept
        by the rows' groups while the compiled thresholds stay the same (batches of a fleet of few groups are
        few arrays of groups, whatever their rows), read-only. A batch of a new mix of groups (a replay's: the
        nodes heard since the last evaluation, a different mix each time) reads the thresholds every group shares
        (a policy's usual: no model overrides them) as views kept by the batch's size, not at its rows again."""
        group = self.group[rows]
        kept = self._device_params
        if kept is None or kept[0] is not self.params:
            kept = self._device_params = (self.params, {}, {})
        key = group.tobytes()
        found = kept[1].get(key)
        if found is not None:
            return found
        shape = rows.shape
        thresholds = kept[2].get(shape)
        if thresholds is None:
            p = self.params
            thermal, cooling, throttling, link = p.thermal, p.cooling, p.power_throttling, p.link
            by_name = {
                "temp_degraded": thermal.fallback_limits.high_degraded,
                "temp_critical": thermal.fallback_limits.high_critical,
                "fan_min_rpm": cooling.min_rpm,
                "fan_min_ratio": cooling.min_ratio,
                "warm": cooling.warm,
                "pinned_ratio": throttling.pinned_ratio,
                "capped_share": throttling.capped_share,
                "mem_full": p.memory_pressure.utilization,
                "gen_min_util": link.generation_min_utilization,
                "busy_util": throttling.busy_utilization,
                "default_gen": link.default_generation,
                "default_width": link.default_width,
            }
            thresholds = {name: at_group(values, group, shape) for name, values in by_name.items()}
            for values in thresholds.values():
                values.flags.writeable = False
            if all(values.strides == (0,) for values in by_name.values()):  # (shared: the same for any rows)
                if len(kept[2]) >= MAX_KEPT_PARAMS:
                    kept[2].clear()
                kept[2][shape] = thresholds
        group.flags.writeable = False
        out = DeviceParams(**thresholds, groups=group, driver=self._driver, rate_of_gen=self._rate_of_gen)
        if len(kept[1]) >= MAX_KEPT_PARAMS:
            kept[1].clear()
        kept[1][key] = out
        return out

    def ladders(self) -> np.ndarray:
        """Remediation ladders as codes: ``(groups, reasons, steps)``, short ladders padded with their last step."""
        longest = max(len(rules[r]["remediation"]) for rules in self.rules for r in REASONS if r in rules)
        table = np.zeros((len(self.rules), len(REASONS), longest), dtype=np.int8)
        for g, rules in enumerate(self.rules):
            for r, reason in enumerate(REASONS):
                ladder: Sequence[str] = rules[reason]["remediation"] if reason in rules else ["none"]
                codes = [REMEDIATIONS.index(step) for step in ladder]
                table[g, r] = codes + [codes[-1]] * (longest - len(codes))
        return table
