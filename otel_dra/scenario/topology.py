"""Where each GPU of a scenario node sits: its PCI address, the switch (or root port) above it, its fabric.

Why a layout per model: faults that one part shared by several GPUs causes (a PCIe switch, an NVSwitch
fabric) are told from a GPU's own only by who shares the part, so every GPU carries ``hw.pcie.address``,
``hw.pcie.upstream`` and, where it has one, ``hw.fabric.id`` (otel_dra.conventions), laid out as on real
servers of its model. Identical servers repeat the same addresses on every node (a group is named by its
address and the node, as the contract's ``pcie/<addr>`` groups are); a fabric id is unique per node here
(no rack-scale NVLink model in the catalogue, so no fabric spans nodes).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import numpy as np

from otel_dra import conventions as cv
from otel_dra.scenario.models import A100, H100, L40S, MI300X


@dataclass(frozen=True)
class Layout:
    """One model's 8-GPU board: each GPU's bus and the upstream port above it, in ``hw.id`` order.

    ``upstream``: a switch's upstream port (GPUs behind one switch share it) or, where a GPU hangs off a
    root port of its own, that root port's address. ``fabric``: ``nvswitch`` (NVLink through NVSwitch: all
    GPUs of the node, id ``<cluster uuid>/<clique id>``), ``xgmi`` (an AMD hive, id the hive's) or None."""

    buses: tuple[int, ...]
    upstream: tuple[str, ...]
    fabric: str | None


def _switches(uplinks: tuple[int, ...], per_switch: int) -> tuple[str, ...]:
    return tuple(f"0000:{bus:02x}:00.0" for bus in uplinks for _ in range(per_switch))


LAYOUTS: Final[Mapping[str, Layout]] = MappingProxyType(
    {
        # DGX H100: 8 GPUs behind 4 PCIe Gen5 switches, 2 each (GPU buses as nvidia-smi lists them on a
        # DGX H100); all 8 on the NVSwitch fabric.
        H100.model: Layout(
            (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB), _switches((0x15, 0x35, 0x97, 0xB5), 2), "nvswitch"
        ),
        # DGX A100: 4 PCIe Gen4 switches, 2 GPUs each; NVSwitch fabric.
        A100.model: Layout(
            (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD), _switches((0x03, 0x43, 0x83, 0xB3), 2), "nvswitch"
        ),
        # MI300X platform (OAM UBB): each GPU on a CPU root port of its own (no shared switch); one xGMI hive.
        MI300X.model: Layout(
            (0x05, 0x15, 0x65, 0x75, 0x85, 0x95, 0xE5, 0xF5),
            tuple(f"0000:{seg:02x}:01.1" for seg in (0x00, 0x10, 0x60, 0x70, 0x80, 0x90, 0xE0, 0xF0)),
            "xgmi",
        ),
        # A PCIe-only L40S server: 2 switches with 4 cards each (one per CPU socket); no device fabric.
        L40S.model: Layout((0x4F, 0x52, 0x56, 0x57, 0xCE, 0xD1, 0xD5, 0xD6), _switches((0x4C, 0xCB), 4), None),
    }
)


def node_topology(model: str, count: int, rng: np.random.Generator) -> list[dict[str, str]]:
    """The topology attributes of a node's ``count`` GPUs, in ``hw.id`` order. A node with more GPUs than
    its board (no real server: only --devices-per-node over 8, or the hot-plugged one) repeats the board
    on the next PCI device numbers behind the same upstream ports."""
    lay = LAYOUTS[model]
    if lay.fabric == "nvswitch":
        cluster = uuid.UUID(bytes=rng.bytes(16), version=4)
        fabric: str | None = f"{cluster}/{int(rng.integers(1, 32768))}"
    elif lay.fabric == "xgmi":
        fabric = f"0x{int(rng.integers(2**62, 2**63)):016x}"
    else:
        fabric = None
    out = []
    board = len(lay.buses)
    for i in range(count):
        attrs = {
            cv.HW_PCIE_ADDRESS: f"0000:{lay.buses[i % board]:02x}:{i // board:02x}.0",
            cv.HW_PCIE_UPSTREAM: lay.upstream[i % board],
        }
        if fabric is not None:
            attrs[cv.HW_FABRIC_ID] = fabric
        out.append(attrs)
    return out


__all__ = ["LAYOUTS", "Layout", "node_topology"]
