"""What a verdict beyond its device is about, as one finding: the identity that ``otel-dra status --by group``
lists once, the Prometheus alerts fire once for, and the Kubernetes renderer labels every rule of.

A finding is (scope, group) and, for a group whose name does not say its node, the node too: a
``pcie/0000:40:00.0`` group names a PCI address, which repeats on every host, so two nodes' switches with one
address are two findings. ``node/<node>`` and ``workload/node/<node>`` name their node already (adding it
changes nothing); ``fabric/...`` and ``firmware/...`` are fleet-wide, one finding across nodes (contract
section 4). prometheus/rules.yaml draws the same line (its node-local and fleet-wide group alerts).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from otel_dra.classifier.features import STATE_OF_CODE
from otel_dra.classifier.verdict import Verdict
from otel_dra.vocabulary import REASONS, REMEDIATIONS, SCOPES

#: Groups that span nodes: one finding whatever the node (an NVLink fabric, a firmware version).
FLEET_WIDE_PREFIXES = ("fabric/", "firmware/")
#: A Kubernetes label value's limit (k8s.io/apimachinery validation: at most 63 characters).
LABEL_VALUE_MAX = 63
_DIGEST = 8  # hex characters of the hash suffix a cut label value keeps
#: Health and hw.state, best to worst: the states in the classifier's order of severity (a degraded device is
#: worse off than one predicted to fail; None: Unknown, the least said).
HEALTH_ORDER = ("Healthy", "Unknown", "Unhealthy")
STATE_ORDER = (None, STATE_OF_CODE[0], "needs_cleaning", *STATE_OF_CODE[1:])


class Finding(NamedTuple):
    """A finding's identity: its scope, its group (the scope's name when the verdict names none), and its node
    ("" for a fleet-wide group)."""

    scope: str
    group: str
    node: str

    @property
    def name(self) -> str:
        """One string naming the finding: the group, after its node when the group's name does not say it
        (``train-007/pcie/0000:40:00.0``)."""
        if not self.node or self.node in self.group.split("/"):
            return self.group
        return f"{self.node}/{self.group}"


def fleet_wide(group: str) -> bool:
    """Whether a group spans nodes (its name holds for the whole fleet), so its node is no part of it."""
    return group.startswith(FLEET_WIDE_PREFIXES)


def finding_of(verdict: Verdict) -> Finding | None:
    """The finding a verdict is part of; None for a verdict about its device alone."""
    if verdict.scope == "device":
        return None
    group = verdict.group or verdict.scope
    return Finding(verdict.scope, group, "" if fleet_wide(group) else verdict.node)


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value: every run of characters other than ``[A-Za-z0-9._-]`` made one
    '-' (``/`` made '.'), trimmed to start and end with an alphanumeric, and at most 63 characters: a longer
    one is cut and suffixed with a hash of the whole text, so two long names that share a head stay apart."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", text.replace("/", "."))
    safe = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", safe)
    if len(safe) <= LABEL_VALUE_MAX:
        return safe
    digest = hashlib.sha256(text.encode()).hexdigest()[:_DIGEST]
    head = re.sub(r"[^A-Za-z0-9]+$", "", safe[: LABEL_VALUE_MAX - _DIGEST - 1])
    return f"{head}-{digest}"


@dataclass(frozen=True)
class Summary:
    """A finding as its devices' verdicts say it: the worst health and state among them, every reason any of
    them gives (contract order), the most disruptive remediation, and the devices (node, hw.id), sorted."""

    finding: Finding
    health: str
    state: str | None
    reasons: tuple[str, ...]
    remediation: str
    devices: tuple[tuple[str, str], ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({node for node, _ in self.devices}))


def summarize(verdicts: Iterable[Verdict]) -> list[Summary]:
    """One :class:`Summary` per finding among ``verdicts`` (device verdicts are none): the worst health first,
    then by scope (contract order), group and node."""
    members: dict[Finding, list[Verdict]] = {}
    for verdict in verdicts:
        finding = finding_of(verdict)
        if finding is not None:
            members.setdefault(finding, []).append(verdict)
    out = []
    for finding, vs in members.items():
        reasons = {r for v in vs for r in v.reasons}
        out.append(
            Summary(
                finding=finding,
                health=max((v.health for v in vs), key=_rank(HEALTH_ORDER)),
                state=max((v.state for v in vs), key=_rank(STATE_ORDER)),
                reasons=tuple(r for r in REASONS if r in reasons),
                remediation=max((v.remediation for v in vs), key=REMEDIATIONS.index),
                devices=tuple(sorted((v.node, v.hw_id) for v in vs)),
            )
        )
    scope_rank = _rank(SCOPES)
    out.sort(key=lambda s: (-HEALTH_ORDER.index(s.health), scope_rank(s.finding.scope), s.finding[1:]))
    return out


def _rank(order: tuple[str | None, ...]) -> Callable[[str | None], int]:
    """A sort key by place in ``order`` (a value outside it: below all)."""
    places = {x: i for i, x in enumerate(order)}
    return lambda x: places.get(x, -1)
