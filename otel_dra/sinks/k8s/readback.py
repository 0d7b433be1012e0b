"""What the cluster says its DeviceTaintRules did: the ``EvictionInProgress`` condition read back.

Kubernetes 1.35+ (``DRADeviceTaintRules``) has the device-taint eviction controller
(``pkg/controller/devicetainteviction``, ``maybeUpdateRuleStatus``) set one condition on each rule,
``status.conditions[type=EvictionInProgress]``, with ``observedGeneration`` the rule's generation:

- ``NoExecute``: ``True``/``PodsPendingEviction`` with "N pods need to be evicted in M different
  namespaces." while pods wait; then ``False``/``Completed`` (or ``NotStarted``);
- ``None``: ``False``/``NoEffect``, set once per change of the spec, with what ``NoExecute`` *would* do:
  "D published devices selected. A allocated devices selected. P pods would be evicted in M different
  namespaces if the effect was NoExecute. ..." The feedback an operator weighs before moving a reason from
  ``None`` to ``NoSchedule`` or ``NoExecute``;
- ``NoSchedule``: ``False``/``OtherEffect``;
- and "K pods evicted since starting the controller." appended once the controller evicted any.

The message is the controller's own words (singular "1 pod", "1 namespace"); its numbers are read from
them, as documented in ``DeviceTaintRuleStatus`` ("includes information about number of pending pods and
already evicted pods in a human-readable format"). A condition whose ``observedGeneration`` is older than
the rule's is about a previous spec and is shown as such (``current: false``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_dra.sinks.k8s.render import device_of, effect_of

EVICTION_IN_PROGRESS = "EvictionInProgress"

_WOULD = re.compile(r"(\d+) pods? would be evicted in (\d+) (?:different )?namespaces?")
_PENDING = re.compile(r"(\d+) pods? needs? to be evicted in (\d+) (?:different )?namespaces?")
_EVICTED = re.compile(r"(\d+) pods? evicted since starting the controller")
_ALLOCATED = re.compile(r"(\d+) allocated devices? selected")


def _count(pattern: re.Pattern[str], text: str) -> int | None:
    found = pattern.search(text)
    return int(found.group(1)) if found else None


@dataclass(frozen=True, slots=True)
class RuleStatus:
    """One rule's ``EvictionInProgress`` condition, with the numbers its message gives (None: not said)."""

    name: str
    driver: str
    pool: str
    device: str
    key: str  # the taint's key (``<domain>/<reason>``)
    effect: str
    reason: str  # the condition's: PodsPendingEviction, Completed, NotStarted, NoEffect, OtherEffect
    in_progress: bool
    message: str
    current: bool  # observedGeneration is the rule's generation: about its spec as it is
    would_evict: int | None  # effect None: pods NoExecute would evict
    pending: int | None  # NoExecute: pods waiting to be evicted
    evicted: int | None  # pods the controller evicted for it (since it started)
    allocated: int | None  # effect None: allocated devices the rule selects
    since: str  # the condition's lastTransitionTime

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.name,
            "taint": self.key,
            "effect": self.effect,
            "condition": {
                "type": EVICTION_IN_PROGRESS,
                "status": "True" if self.in_progress else "False",
                "reason": self.reason,
                "message": self.message,
                "current": self.current,
                "since": self.since,
            },
        }
        for field, value in (
            ("would_evict_pods", self.would_evict),
            ("pods_pending_eviction", self.pending),
            ("pods_evicted", self.evicted),
        ):
            if value is not None:
                out[field] = value
        return out


def read(rule: Mapping[str, Any]) -> RuleStatus | None:
    """A listed DeviceTaintRule's condition; None when the cluster set none (before 1.35, or not yet)."""
    status = rule.get("status") or {}
    condition = next(
        (c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") == EVICTION_IN_PROGRESS),
        None,
    )
    if condition is None:
        return None
    meta = rule.get("metadata") or {}
    message = str(condition.get("message") or "")
    driver, pool, device = device_of(rule)
    generation = meta.get("generation")
    observed = condition.get("observedGeneration")
    since = condition.get("lastTransitionTime") or ""
    return RuleStatus(
        name=str(meta.get("name") or ""),
        driver=str(driver or ""),
        pool=str(pool or ""),
        device=str(device or ""),
        key=str((((rule.get("spec") or {}).get("taint")) or {}).get("key") or ""),
        effect=effect_of(rule),
        reason=str(condition.get("reason") or ""),
        in_progress=condition.get("status") == "True",
        message=message,
        current=generation is None or observed == generation,
        would_evict=_count(_WOULD, message),
        pending=_count(_PENDING, message),
        evicted=_count(_EVICTED, message),
        allocated=_count(_ALLOCATED, message),
        since=since if isinstance(since, str) else str(since),
    )


def by_device(rules: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[RuleStatus]]:
    """The conditions of ``rules`` (as listed), by the (pool, device) they select."""
    out: dict[tuple[str, str], list[RuleStatus]] = {}
    for rule in rules:
        status = read(rule)
        if status is not None:
            out.setdefault((status.pool, status.device), []).append(status)
    for statuses in out.values():
        statuses.sort(key=lambda s: s.name)
    return out


def would_evict(statuses: Iterable[RuleStatus]) -> int | None:
    """Pods ``NoExecute`` would evict from a device, by what its ``None`` rules' current conditions say (the
    largest: every rule selects the same device, so the same pods); None when none says."""
    counts = [s.would_evict for s in statuses if s.would_evict is not None and s.current]
    return max(counts) if counts else None


def pending(statuses: Iterable[RuleStatus]) -> int | None:
    """Pods waiting to be evicted from a device, by what its NoExecute rules' conditions say; None when it has
    no NoExecute rule."""
    evicting = [s for s in statuses if s.effect == "NoExecute"]
    return sum(s.pending or 0 for s in evicting) if evicting else None
