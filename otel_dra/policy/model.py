"""The typed policy: what the classifier and the sinks read, validated and merged (durations in seconds)."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import yaml

from otel_dra.policy.merging import frozen, merge, plain
from otel_dra.policy.sections import OWNED_SECTIONS

#: Rules by reason (``rules["thermal"]["min_fraction"]``), read-only; durations in seconds.
Rules = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Horizon:
    """The long horizon: per-device buckets of ``bucket_s``, and the spans judged over them."""

    bucket_s: float
    duty_span_s: float
    rate_span_s: float
    duty_hold_ratio: float

    def buckets(self, span_s: float) -> int:
        """A span in whole buckets, rounded up (at least one)."""
        return max(1, math.ceil(span_s / self.bucket_s - 1e-9))

    @property
    def duty_buckets(self) -> int:
        return self.buckets(self.duty_span_s)

    @property
    def rate_buckets(self) -> int:
        return self.buckets(self.rate_span_s)


@dataclass(frozen=True)
class Cohorts:
    """Which devices' rates are compared (``keys``: attribute names), and how strictly."""

    keys: tuple[str, ...]
    #: Attributes naming a device's slot in its node (the first one present): peers in the same slot of other
    #: nodes share its airflow, so a slot that always runs hotter is not a fault of the devices in it.
    slot_keys: tuple[str, ...]
    #: Utilization bin edges: devices in the same bin are under comparable load.
    load_bins: np.ndarray
    min_devices: int
    significance: float
    span_significance: float
    healthy_ratio: float


@dataclass(frozen=True)
class WorkloadScope:
    """Application driver errors and out-of-memory events on ``min_devices`` or more GPUs of a node within
    ``together_s`` are a job's crash (scope ``workload``), not the devices'."""

    min_devices: int
    together_s: float


@dataclass(frozen=True)
class NodeScope:
    """A reason in ``reasons`` present on at least ``min_devices`` devices of a node and ``share`` of those
    reporting is the node's (scope ``node``), remediated by ``remediation``, never device by device."""

    reasons: tuple[str, ...]
    min_devices: int
    share: float
    remediation: str


@dataclass(frozen=True)
class LinkScope:
    """A reason in ``reasons`` present on at least ``min_devices`` of the devices behind one PCIe switch (or on one
    fabric) and ``share`` of them, while their node's other devices mostly show none, is that switch's or fabric's
    (scope ``link``); remediated by ``remediation``, a ladder climbed by the group's own episodes."""

    reasons: tuple[str, ...]
    min_devices: int
    share: float
    remediation: tuple[str, ...]


@dataclass(frozen=True)
class FirmwareScope:
    """Per model, the rate of fatal events on each firmware version against the model's other versions, over
    ``horizon_s`` in ``bucket_s`` buckets, tested every ``every_s``: a version at least ``min_ratio`` times the
    others' rate with ``min_events`` events on ``min_devices`` of its devices and a one-sided p-value under
    ``significance`` (Bonferroni over the versions tested) names its devices (scope ``firmware``)."""

    horizon_s: float
    bucket_s: float
    min_events: int
    min_devices: int
    significance: float
    min_ratio: float
    min_device_days: float
    every_s: float


@dataclass(frozen=True)
class Escalation:
    """``after`` remediations of one device within ``window_s`` step its ladder up."""

    window_s: float
    after: int


@dataclass(frozen=True)
class SharedDevices:
    """How several nodes' views of one device combine (one of COMBINE_MODES)."""

    combine: str


@dataclass(frozen=True)
class Override:
    """Rules merged over the base rules for the device models matching both patterns (fnmatch)."""

    vendor: str
    model: str
    rules: Rules

    def matches(self, vendor: str, model: str) -> bool:
        return fnmatch.fnmatchcase(vendor, self.vendor) and fnmatch.fnmatchcase(model, self.model)


@dataclass(frozen=True)
class Policy:
    """A validated, merged policy, typed (durations in seconds). The sections other packages
    own (OWNED_SECTIONS) are in ``sections``, as their owner validated them (as read when the load
    was given no owner for one); each owner types its own."""

    source: str
    window_s: float
    min_samples: int
    stale_timeout_s: float
    stale_intervals: float
    device_ttl_s: float
    horizon: Horizon
    cohorts: Cohorts
    unhealthy_states: tuple[str, ...]
    hold: Mapping[str, float]
    clears: Mapping[str, str]
    clean_after_repair_s: float
    escalation: Escalation
    rules: Rules
    overrides: tuple[Override, ...]
    shared_devices: SharedDevices
    workload: WorkloadScope
    node: NodeScope
    link: LinkScope
    firmware: FirmwareScope
    sections: Mapping[str, Mapping[str, Any]]
    _raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_data(cls, data: Mapping[str, Any], source: str) -> Policy:
        """Type a validated, merged policy (:func:`load` makes one)."""
        hz, co, esc = data["horizon"], data["cohorts"], data["escalation"]
        fw = data["scopes"]["firmware"]
        return cls(
            source=source,
            window_s=float(data["window"]),
            min_samples=int(data["min_samples"]),
            stale_timeout_s=float(data["stale_timeout"]),
            stale_intervals=float(data["stale_intervals"]),
            device_ttl_s=float(data["device_ttl"]),
            horizon=Horizon(
                float(hz["bucket"]), float(hz["duty_span"]), float(hz["rate_span"]), float(hz["duty_hold_ratio"])
            ),
            cohorts=Cohorts(
                tuple(co["by"]),
                tuple(co["slot_by"]),
                np.asarray(co["load_bins"], dtype=np.float64),
                int(co["min_devices"]),
                float(co["significance"]),
                float(co["span_significance"]),
                float(co["healthy_ratio"]),
            ),
            unhealthy_states=tuple(data["unhealthy_states"]),
            hold=MappingProxyType({str(k): float(v) for k, v in data["hold"].items()}),
            clears=MappingProxyType({str(k): str(v) for k, v in data["clears"].items()}),
            clean_after_repair_s=float(data["clean_after_repair"]),
            escalation=Escalation(float(esc["window"]), int(esc["after"])),
            rules=frozen(data["rules"]),
            overrides=tuple(
                Override(
                    o.get("match", {}).get("hw.vendor", "*"),
                    o.get("match", {}).get("hw.model", "*"),
                    frozen(o.get("rules", {})),
                )
                for o in data["overrides"]
            ),
            shared_devices=SharedDevices(str(data["shared_devices"]["combine"])),
            workload=WorkloadScope(
                int(data["scopes"]["workload"]["min_devices"]), float(data["scopes"]["workload"]["together"])
            ),
            node=NodeScope(
                tuple(data["scopes"]["node"]["reasons"]),
                int(data["scopes"]["node"]["min_devices"]),
                float(data["scopes"]["node"]["share"]),
                str(data["scopes"]["node"]["remediation"]),
            ),
            link=LinkScope(
                tuple(data["scopes"]["link"]["reasons"]),
                int(data["scopes"]["link"]["min_devices"]),
                float(data["scopes"]["link"]["share"]),
                tuple(data["scopes"]["link"]["remediation"]),
            ),
            firmware=FirmwareScope(
                float(fw["horizon"]),
                float(fw["bucket"]),
                int(fw["min_events"]),
                int(fw["min_devices"]),
                float(fw["significance"]),
                float(fw["min_ratio"]),
                float(fw["min_device_days"]),
                float(fw["every"]),
            ),
            sections=MappingProxyType({name: data[name] for name in OWNED_SECTIONS}),
            _raw=data,
        )

    def hold_s(self, reason: str) -> float:
        """How long a reason holds after its evidence ends: its own, else the default."""
        return self.hold.get(reason, self.hold["default"])

    def clears_by(self, reason: str) -> str:
        """How a reason clears once on (one of CLEAR_MODES): its own, else the default."""
        return self.clears.get(reason, self.clears.get("default", "hold"))

    def rules_for(self, vendor: str, model: str) -> Rules:
        """The rules for one device model: the base rules with matching overrides merged in order."""
        rules = self.rules
        for override in self.overrides:
            if override.matches(vendor, model):
                rules = frozen(merge(rules, override.rules))
        return rules

    def to_yaml(self) -> str:
        """The effective policy, for ``otel-dra policy check``."""
        return yaml.safe_dump(plain(self._raw), sort_keys=False, default_flow_style=None, width=100)
