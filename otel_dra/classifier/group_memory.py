"""What the classifier must not forget across a restart about what devices share, in words a file can hold.

A device's own memory is :mod:`otel_dra.classifier.memory`'s. Beside it: each firmware version's fatal events
and exposure over days (:class:`~otel_dra.classifier.firmware_rates.FirmwareHistory`), and each link group's
escalation (how many episodes a PCIe switch or fabric had within the escalation window, and whether one is on),
so that a restart neither starts a month's count again nor counts a held switch fault as a new episode.
:meth:`GroupMemory.from_json` accepts exactly what :meth:`GroupMemory.to_json` writes and raises ``ValueError``
on anything else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from otel_dra.classifier.firmware_rates import FirmwareHistory

#: Longest group or node name kept (a name, not a document).
MAX_NAME = 1000


@dataclass(frozen=True)
class LinkEpisodes:
    """One link group's escalation: its name (``pcie/...``, ``fabric/...``), its node for a ``pcie/`` group ("" for
    a fabric), whether a finding of it is on, its episodes within the window, and when the first of them began
    (the reference clock, unix seconds)."""

    group: str
    node: str
    on: bool
    episodes: int
    first_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "node": self.node,
            "on": self.on,
            "episodes": self.episodes,
            "first_at": self.first_at,
        }

    @classmethod
    def from_json(cls, doc: Any, where: str) -> LinkEpisodes:
        keys = {"group", "node", "on", "episodes", "first_at"}
        if not isinstance(doc, dict) or set(doc) != keys:
            raise ValueError(f"{where}: expected {', '.join(sorted(keys))}")
        group, node, on, episodes, first_at = (doc[k] for k in ("group", "node", "on", "episodes", "first_at"))
        if not isinstance(group, str) or not isinstance(node, str) or not group or len(group) + len(node) > MAX_NAME:
            raise ValueError(f"{where}: group and node are names")
        if not isinstance(on, bool):
            raise ValueError(f"{where}: on must be true or false")
        if not isinstance(episodes, int) or isinstance(episodes, bool) or not 0 <= episodes < 2**31:
            raise ValueError(f"{where}: episodes must be a count")
        if isinstance(first_at, bool) or not isinstance(first_at, int | float) or not math.isfinite(first_at):
            raise ValueError(f"{where}: first_at must be unix seconds")
        return cls(group, node, on, episodes, float(first_at))


@dataclass(frozen=True)
class GroupMemory:
    """The firmware versions' history and the link groups' escalation, for the state file."""

    firmware: FirmwareHistory
    links: tuple[LinkEpisodes, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"firmware": self.firmware.to_json(), "links": [link.to_json() for link in self.links]}

    @classmethod
    def from_json(cls, doc: Any) -> GroupMemory:
        if not isinstance(doc, dict) or set(doc) != {"firmware", "links"}:
            raise ValueError('expected {"firmware": {...}, "links": [...]}')
        try:
            firmware = FirmwareHistory.from_json(doc["firmware"])
        except ValueError as exc:
            raise ValueError(f"firmware: {exc}") from None
        if not isinstance(doc["links"], list):
            raise ValueError("links is not a list")
        return cls(firmware, tuple(LinkEpisodes.from_json(x, f"links[{i}]") for i, x in enumerate(doc["links"])))
