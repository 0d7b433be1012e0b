"""What devices share: the PCIe switch above them, their fabric, their model's firmware version; and the rule that
finds a fault of the shared thing (scope ``link``) instead of one fault per device.

Each device row carries three group codes (0: none), read from its descriptive attributes when they change:
``pcie`` (``hw.pcie.upstream``, keyed by node too: PCI addresses are per host), ``fabric`` (``hw.fabric.id``,
which may span nodes) and ``firmware`` (``hw.model`` and ``hw.firmware_version``). All codes index one table of
group names (``pcie/0000:40:00.0``, ``fabric/<id>``, ``firmware/<model>/<version>``, contract §4), so the verdict
engine holds one code per (device, reason) whatever the scope, and a verdict names its group from it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from otel_dra import conventions as cv
from otel_dra.classifier.layout import DEVICE, LINK, R
from otel_dra.classifier.numeric import any_of, flatnonzero
from otel_dra.classifier.registry import grown_rows
from otel_dra.policy import LinkScope
from otel_dra.vocabulary import fabric_group, firmware_group, pcie_group

log = logging.getLogger(__name__)


#: The most group names a process keeps. A code, once given, keeps its name for the process's life (a held
#: reason refers to it), and names come from devices' attributes, which a sender could rotate at every push: past
#: this many, a new group is none (its devices judged alone) and it is said once. A fleet of 100,000 GPUs behind
#: 4 switches per 8 needs 50,000, and a firmware version per model a handful.
MAX_GROUPS = 262_144


class GroupNames:
    """Group names by code; code 0 is no group (see :data:`MAX_GROUPS`)."""

    def __init__(self, limit: int = MAX_GROUPS) -> None:
        self.limit = limit
        self.full = False  # a name was refused for want of room
        self.names: list[str] = [""]
        self.keys: list[tuple[str, ...]] = [()]
        self._codes: dict[tuple[str, ...], int] = {}
        #: Per code, the firmware code's model (an index of ``models``); -1 for other groups.
        self.model_of: list[int] = [-1]
        self.models: list[str] = []
        self._model_index: dict[str, int] = {}

    def code(self, key: tuple[str, ...], name: str, model: str | None = None) -> int:
        found = self._codes.get(key)
        if found is not None:
            return found
        if len(self.names) > self.limit:
            if not self.full:
                log.warning(
                    "more than %d device groups (PCIe switches, fabrics, firmware versions) seen: %s and later ones "
                    "are not grouped; their devices are judged alone",
                    self.limit,
                    name,
                )
            self.full = True
            return 0
        code = self._codes[key] = len(self.names)
        self.names.append(name)
        self.keys.append(key)
        if model is None:
            self.model_of.append(-1)
        else:
            index = self._model_index.setdefault(model, len(self.models))
            if index == len(self.models):
                self.models.append(model)
            self.model_of.append(index)
        return code

    def firmware_code(self, model: str, version: str) -> int:
        """The code of a model's firmware version (its group ``firmware/<model>/<version>``)."""
        return self.code(("firmware", model, version), firmware_group(model, version), model)

    def pcie_code(self, node: str, upstream: str) -> int:
        return self.code(("pcie", node, upstream), pcie_group(upstream))

    def fabric_code(self, fabric: str) -> int:
        return self.code(("fabric", fabric), fabric_group(fabric))

    def recall(self, name: str, node: str) -> int:
        """The code of a group a state file names on a device of ``node`` (0 for a name no topology gives)."""
        kind, _, rest = name.partition("/")
        if kind == "pcie" and rest:
            return self.pcie_code(node, rest)
        if kind == "fabric" and rest:
            return self.fabric_code(rest)
        model, _, version = rest.rpartition("/")
        if kind == "firmware" and model and version:
            return self.firmware_code(model, version)
        return 0

    def __len__(self) -> int:
        return len(self.names)


class Topology:
    """Per device row, the codes of what it shares (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.groups = GroupNames()
        self.pcie = np.zeros(capacity, dtype=np.int32)
        self.fabric = np.zeros(capacity, dtype=np.int32)
        self.firmware = np.zeros(capacity, dtype=np.int32)

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.pcie = grown_rows(self.pcie, capacity, keep=keep)
        self.fabric = grown_rows(self.fabric, capacity, keep=keep)
        self.firmware = grown_rows(self.firmware, capacity, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        self.pcie[rows] = 0
        self.fabric[rows] = 0
        self.firmware[rows] = 0

    def assign(self, row: int, node: str, attrs: Mapping[str, str]) -> None:
        """(Re)read one device's place after its attributes changed."""
        g = self.groups
        upstream = attrs.get(cv.HW_PCIE_UPSTREAM)
        self.pcie[row] = g.pcie_code(node, upstream) if upstream else 0
        fabric = attrs.get(cv.HW_FABRIC_ID)
        self.fabric[row] = g.fabric_code(fabric) if fabric else 0
        model, version = attrs.get(cv.HW_MODEL), attrs.get(cv.HW_FIRMWARE_VERSION)
        self.firmware[row] = g.firmware_code(model, version) if model and version else 0

    @property
    def any_links(self) -> bool:
        return any_of(self.pcie) or any_of(self.fabric)


def link_scoped(
    rows: np.ndarray,
    nodes: np.ndarray,
    n_nodes: int,
    known: np.ndarray,
    topology: Topology,
    policy: LinkScope,
    present: np.ndarray,
    scope: np.ndarray,
    group: np.ndarray,
    group_hits: np.ndarray,
    group_devices: np.ndarray,
    recent: np.ndarray | None = None,
) -> None:
    """Mark, in place, each reason of ``policy.reasons`` whose evidence is a switch's or fabric's: shown within
    the window on ``min_devices`` or more of one group's known devices and on ``share`` of them, while the node's
    known devices outside the group do not show it as widely (else it is more than the group). The fabric is
    tried first (a fault of an NVSwitch shows on every GPU of it, and on each switch's GPUs too); then the PCIe
    switch. A (row, reason) with evidence now in such a group gets scope ``link``, the group's code, and how many
    of how many devices show it.

    ``rows``' ``nodes`` (codes < ``n_nodes``); ``known``: the device reports, or is lost while its node reports;
    ``present``/``scope``/``group``/``group_hits``/``group_devices``: the evidence arrays, (rows, reasons);
    ``recent``: (rows, reasons), the reason is held with evidence within the window, the device's or a link's (a
    fabric's XIDs land on its GPUs minutes apart: each one's evidence is over by the time the last one's is in,
    yet all are the fabric's)."""
    if not policy.reasons or rows.size == 0:
        return
    pcie, fabric = topology.pcie[rows], topology.fabric[rows]
    if not (any_of(pcie) or any_of(fabric)):
        return
    node_size: np.ndarray | None = None
    for reason in policy.reasons:
        r = R[reason]
        now = present[:, r] & known & (scope[:, r] == DEVICE)
        on = now if recent is None else now | (recent[:, r] & known & ~present[:, r])
        if not any_of(now) or np.count_nonzero(on) < policy.min_devices:
            continue
        if node_size is None:
            node_size = np.bincount(nodes[known], minlength=n_nodes)
        node_hits = np.bincount(nodes[on], minlength=n_nodes)
        for codes in (fabric, pcie):
            # Devices showing it per group code (small dense codes: a count, not np.unique's sort), the groups
            # with enough of them in code order.
            counted = np.bincount(codes[on & (codes > 0)])
            cand = flatnonzero(counted >= max(policy.min_devices, 1))
            if cand.size == 0:
                continue
            hits = counted[cand]
            member = flatnonzero(known & np.isin(codes, cand))
            which = np.searchsorted(cand, codes[member])
            size = np.bincount(which, minlength=cand.size)
            wide = hits >= policy.share * size
            # The node's devices outside the group, per (group, node) the member rows sit in.
            node_m = nodes[member]
            _, inv = np.unique(which.astype(np.int64) * n_nodes + node_m, return_inverse=True)
            inside = np.bincount(inv)[inv]
            inside_hits = np.bincount(inv, weights=on[member])[inv]
            outside = node_size[node_m] - inside
            outside_hits = node_hits[node_m] - inside_hits
            quiet = (outside == 0) | (outside_hits < policy.share * outside)
            mark = now[member] & wide[which] & quiet & (scope[member, r] == DEVICE)
            if not mark.any():
                continue
            at = member[mark]
            scope[at, r] = LINK
            group[at, r] = codes[at]
            group_hits[at, r] = hits[which[mark]]
            group_devices[at, r] = size[which[mark]]
