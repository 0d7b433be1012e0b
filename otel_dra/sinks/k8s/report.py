"""``otel-dra k8s report``: what the managed DeviceTaintRules did, or with effect None would have done, over a
period, per failure reason: how an operator decides to move a reason from ``None`` to ``NoSchedule`` or
``NoExecute``.

Two records, both the cluster's own: the rules as they are now, with the device-taint controller's
``EvictionInProgress`` condition (:mod:`otel_dra.sinks.k8s.readback`: the pods NoExecute would evict, those it
evicted), and the writer's Events over the period (:mod:`otel_dra.sinks.k8s.events`: ``DeviceTainted``,
``DeviceTaintChanged``, ``DeviceTaintRemoved``; a repeated Event counts its series). Events live as long as the
API server keeps them (``--event-ttl``, 1h by default): a longer period reads what is left, and says so.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_dra.sinks.k8s import readback
from otel_dra.sinks.k8s.render import device_of, effect_of

#: The writer's Event reasons, and what each counts.
CHANGES = {"DeviceTainted": "tainted", "DeviceTaintChanged": "changed", "DeviceTaintRemoved": "removed"}
_NOTE = re.compile(r"^\S+ \S+: (?P<reason>[a-z_]+)(?:,| cleared)")


@dataclass
class ReasonReport:
    """One failure reason's rules now and changes over the period."""

    reason: str
    rules: Counter[str] = field(default_factory=Counter)  # by effect, now
    devices: set[tuple[str, str, str]] = field(default_factory=set)  # (driver, pool, device) with a rule now
    would_evict: int = 0  # pods NoExecute would evict from its None rules' devices (the controller's count)
    reported: int = 0  # of its devices, those whose rules the controller reported on (1.35+)
    pending: int = 0
    evicted: int = 0
    changes: Counter[str] = field(default_factory=Counter)  # tainted / changed / removed, over the period

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "rules": dict(sorted(self.rules.items())),
            "devices": len(self.devices),
            "devices_reported": self.reported,
            "would_evict_pods": self.would_evict,
            "pods_pending_eviction": self.pending,
            "pods_evicted": self.evicted,
            **{name: self.changes[name] for name in CHANGES.values()},
        }


def event_time(event: Mapping[str, Any]) -> float | None:
    """When an Event last happened (its series' last observation, else its own time), UNIX seconds."""
    series = event.get("series") or {}
    stamp = (
        series.get("lastObservedTime")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
    )
    if isinstance(stamp, dt.datetime):
        return stamp.timestamp()
    if not isinstance(stamp, str):
        return None
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def summarise(
    rules: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    domain: str,
    since_s: float,
) -> list[ReasonReport]:
    """Per reason (sorted): the managed ``rules`` as listed now, and the writer's ``events`` at or after
    ``since_s`` (UNIX seconds)."""
    out: dict[str, ReasonReport] = {}

    def of(reason: str) -> ReasonReport:
        return out.setdefault(reason, ReasonReport(reason))

    by_device: dict[tuple[str, tuple[str, str, str]], list[readback.RuleStatus]] = {}
    for rule in rules:
        labels = (rule.get("metadata") or {}).get("labels") or {}
        reason = str(labels.get(f"{domain}/reason") or "?")
        device = tuple(str(x or "") for x in device_of(rule))
        report = of(reason)
        report.rules[effect_of(rule)] += 1
        report.devices.add(device)  # type: ignore[arg-type]
        status = readback.read(rule)
        if status is not None:
            by_device.setdefault((reason, device), []).append(status)  # type: ignore[arg-type]
    for (reason, _), statuses in by_device.items():
        report = of(reason)
        report.reported += 1
        report.would_evict += readback.would_evict(statuses) or 0
        report.pending += readback.pending(statuses) or 0
        report.evicted += sum(s.evicted or 0 for s in statuses)
    for event in events:
        name = CHANGES.get(str(event.get("reason") or ""))
        when = event_time(event)
        if name is None or when is None or when < since_s:
            continue
        if not str(event.get("reportingController") or "").startswith(f"{domain}/"):
            continue  # another controller's Event of the same name
        found = _NOTE.match(str(event.get("note") or ""))
        if found is None:
            continue
        count = int((event.get("series") or {}).get("count") or 1)
        of(found.group("reason")).changes[name] += count
    return [out[r] for r in sorted(out)]
