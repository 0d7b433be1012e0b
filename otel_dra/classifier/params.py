"""The policy resolved per device: rows grouped by (``hw.vendor``, ``hw.model``), thresholds as arrays.

Overrides make thresholds differ by model, yet rules must stay array expressions: each row
carries a policy group index, each threshold is an array over groups, and ``param[group]``
gives the per-row values. Groups change only when a device's attributes do, which is rare
and the only place Python touches a single device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from otel_dra import conventions as cv
from otel_dra.classifier.features import DeviceParams
from otel_dra.classifier.registry import grown
from otel_dra.policy import Policy
from otel_dra.vocabulary import REASONS, REMEDIATIONS

_SEGMENT = re.compile(r"[.\-_]")


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


class PolicyGroups:
    """Per-row policy group, firmware verdict, and per-group threshold arrays."""

    def __init__(self, policy: Policy, capacity: int) -> None:
        self.policy = policy
        self._index: dict[tuple[str, str], int] = {}
        self.rules: list[Mapping[str, Any]] = []
        self.vendors: list[str] = []
        self.group = np.zeros(capacity, dtype=np.intp)
        self.firmware_bad = np.zeros(capacity, dtype=bool)
        self.firmware_text: list[str] = [""] * capacity
        self._cache: dict[tuple[str, ...], np.ndarray] = {}
        self._uniform: dict[tuple[str, ...], bool] = {}  # per threshold: the same in every group
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

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.group = grown(self.group, capacity, 0, keep=keep)
        self.cohort = grown(self.cohort, capacity, 0, keep=keep)
        self.slot = grown(self.slot, capacity, 0, keep=keep)
        self.firmware_bad = grown(self.firmware_bad, capacity, False, keep=keep)
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
            self.rules.append(self.policy.rules_for(vendor, model))
            self.vendors.append(vendor)
            self._cache.clear()
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
        fw = self.rules[group]["firmware"]
        version = attrs.get(cv.HW_FIRMWARE_VERSION)
        bad, why = False, ""
        if version is not None:
            if version in fw["deny"]:
                bad, why = True, f"firmware {version} is on the policy's deny list"
            minimum = fw["minimum"].get(attrs.get(cv.HW_VENDOR, ""))
            if minimum is not None and version_key(version) < version_key(minimum):
                bad, why = True, f"firmware {version} is below the policy minimum {minimum}"
        self.firmware_bad[row] = bad
        self.firmware_text[row] = why

    # -- thresholds ----------------------------------------------------------------------------
    def values(self, *path: str) -> np.ndarray:
        """One threshold (``rules.<path>``) per group, as float64."""
        cached = self._cache.get(path)
        if cached is None:
            out = []
            for rules in self.rules:
                node: Any = rules
                for key in path:
                    node = node[key]
                out.append(float(node))
            cached = self._cache[path] = np.asarray(out)
            self._uniform[path] = bool((cached == cached[0]).all())
        return cached

    def param(self, rows: np.ndarray, *path: str) -> np.ndarray:
        """One threshold per row (one value, broadcast, while every device shares one group: a
        read-only view that costs nothing, whatever the fleet's size)."""
        values = self.values(*path)
        if self._uniform.get(path, False):  # no override changes it: one value for every row
            return np.broadcast_to(values[0], np.shape(rows))
        return values[self.group[rows]]

    def device_params(self, rows: np.ndarray) -> DeviceParams:
        """What the sample stage needs for these rows."""
        base = self.policy.rules["link"]["replays_per_lane_per_minute"]
        tables: list[dict[str, str]] = []
        for rules in self.rules:
            table = rules["driver_errors"]["code_tables"]
            vendor = self.vendors[len(tables)]
            classes = table.get(vendor, {})
            tables.append({code: klass for klass, codes in classes.items() for code in codes})
        return DeviceParams(
            temp_degraded=self.param(rows, "thermal", "fallback_limits", "high.degraded"),
            temp_critical=self.param(rows, "thermal", "fallback_limits", "high.critical"),
            fan_min_rpm=self.param(rows, "cooling", "min_rpm"),
            fan_min_ratio=self.param(rows, "cooling", "min_ratio"),
            warm=self.param(rows, "cooling", "warm"),
            pinned_ratio=self.param(rows, "power_throttling", "pinned_ratio"),
            mem_full=self.param(rows, "memory_pressure", "utilization"),
            gen_min_util=self.param(rows, "link", "generation_min_utilization"),
            busy_util=self.param(rows, "power_throttling", "busy_utilization"),
            default_gen=self.param(rows, "link", "default_generation"),
            default_width=self.param(rows, "link", "default_width"),
            groups=self.group[rows],
            code_tables=tables,
            per_lane_rate={int(g): float(r) for g, r in base.items()},
        )

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
