"""Fake sysfs PCI trees laid out as the Linux kernel lays them out, for the topology tests.

``devices/pci<domain>:<bus>/<root port>/[<switch upstream>/<switch downstream>/]*<device>`` holds each function's
directory under the bridge whose secondary bus it is on; ``bus/pci/devices/<BDF>`` is a relative symlink into it
(``../../../devices/pci0000:00/...``), and each function has a ``config`` file with a capability list: a power
management and an MSI capability, then the PCI Express one with its Device/Port Type (``pci_regs.h``). A config
cut to 64 bytes is what an unprivileged reader gets.
"""

from __future__ import annotations

import os
from pathlib import Path

ENDPOINT, ROOT_PORT, SWITCH_UP, SWITCH_DOWN, PCIE_TO_PCI = 0x0, 0x4, 0x5, 0x6, 0x7
#: Full configuration space a privileged reader gets, and the header an unprivileged one gets.
FULL, SHORT = 256, 64


def config_space(port_type: int | None, length: int = FULL, bridge: bool = False) -> bytes:
    """A configuration space: vendor/device, status with the capability-list bit, header type, and the capability
    list at 0x34: PM at 0x40, MSI at 0x50, then (unless ``port_type`` is None: a conventional PCI function)
    the PCI Express capability at 0x60 whose Capabilities register carries ``port_type`` in bits 7:4."""
    cfg = bytearray(FULL)
    cfg[0:4] = (0x10DE).to_bytes(2, "little") + (0x2330).to_bytes(2, "little")
    cfg[0x06] = 0x10  # PCI_STATUS_CAP_LIST
    cfg[0x0E] = 0x01 if bridge else 0x00  # header type
    cfg[0x34] = 0x40
    cfg[0x40:0x42] = bytes((0x01, 0x50))  # PCI_CAP_ID_PM, next
    cfg[0x50:0x52] = bytes((0x05, 0x60 if port_type is not None else 0x00))  # PCI_CAP_ID_MSI, next
    if port_type is not None:
        cfg[0x60:0x62] = bytes((0x10, 0x00))  # PCI_CAP_ID_EXP, end of list
        cfg[0x62:0x64] = ((port_type << 4) | 0x2).to_bytes(2, "little")  # PCI_EXP_FLAGS: type, version 2
    return bytes(cfg[:length])


class PciTree:
    """A sysfs root with one PCI domain's tree; :meth:`add` puts a function under its parent bridge."""

    def __init__(self, root: Path, domain: str = "0000", bus: str = "00") -> None:
        self.root = root
        self.host = root / "devices" / f"pci{domain}:{bus}"
        self.host.mkdir(parents=True, exist_ok=True)
        (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        self.dirs: dict[str, Path] = {}

    def add(self, bdf: str, parent: str | None, port_type: int | None = ENDPOINT, config: int | None = FULL) -> Path:
        """Function ``bdf`` on the secondary bus of ``parent`` (None: the root bus), with a config of ``config``
        bytes (None: no config file) and, when it is a GPU, the identity files the sysfs source discovers."""
        where = self.host if parent is None else self.dirs[parent]
        d = where / bdf
        d.mkdir(parents=True)
        bridge = port_type in (ROOT_PORT, SWITCH_UP, SWITCH_DOWN, PCIE_TO_PCI)
        if config is not None:
            (d / "config").write_bytes(config_space(port_type, config, bridge))
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x060400\n" if bridge else "0x030200\n")
        (d / "device").write_text("0x2330\n")
        link = self.root / "bus" / "pci" / "devices" / bdf
        link.symlink_to(os.path.relpath(d, link.parent))
        self.dirs[bdf] = d
        return d

    def amd_gpu(self, bdf: str, parent: str, config: int = FULL) -> Path:
        """An amdgpu function (vendor 0x1002, display class) under ``parent``."""
        d = self.add(bdf, parent, ENDPOINT, config)
        (d / "vendor").write_text("0x1002\n")
        return d

    def xgmi_hive(self, hive_id: int, first: str, *others: str) -> None:
        """amdgpu_xgmi.c's layout: the hive's first device holds ``xgmi_hive_info/xgmi_hive_id`` (``%llu``), the
        others a ``xgmi_hive_info`` symlink to it."""
        info = self.dirs[first] / "xgmi_hive_info"
        info.mkdir()
        (info / "xgmi_hive_id").write_text(f"{hive_id}\n")
        for bdf in others:
            link = self.dirs[bdf] / "xgmi_hive_info"
            link.symlink_to(os.path.relpath(info, link.parent))

    def nic(self, iface: str, bdf: str) -> None:
        """A NIC: ``class/net/<iface>`` links to ``<function>/net/<iface>``, whose ``device`` links back up."""
        net = self.dirs[bdf] / "net" / iface
        net.mkdir(parents=True)
        (net / "device").symlink_to("../../../" + bdf)
        (net / "statistics").mkdir()
        for name in ("rx_errors", "tx_errors"):
            (net / "statistics" / name).write_text("0\n")
        cls = self.root / "class" / "net"
        cls.mkdir(parents=True, exist_ok=True)
        (cls / iface).symlink_to(os.path.relpath(net, cls))


def hgx_like(root: Path) -> PciTree:
    """The tree the tests share: one root port with a switch of 4 downstream ports and 4 GPUs; a two-level
    nested switch (2 GPUs behind the inner one, 1 behind the outer one's other port); a GPU directly on a root
    port; a switch whose ports' config is the unprivileged 64 bytes; a GPU on a root port with no config file;
    a PCIe-to-PCI bridge behind a switch (where the tree's shape alone would name the wrong port); a NIC."""
    t = PciTree(root)
    # Root port 00:01.0 -> switch (upstream 01:00.0) -> 4 downstream ports -> 4 GPUs, and a NIC on a 5th.
    t.add("0000:00:01.0", None, ROOT_PORT)
    t.add("0000:01:00.0", "0000:00:01.0", SWITCH_UP)
    for n in range(4):
        t.add(f"0000:02:0{n}.0", "0000:01:00.0", SWITCH_DOWN)
        t.amd_gpu(f"0000:0{3 + n}:00.0", f"0000:02:0{n}.0")
    t.add("0000:02:04.0", "0000:01:00.0", SWITCH_DOWN)
    t.add("0000:07:00.0", "0000:02:04.0", ENDPOINT).joinpath("class").write_text("0x020000\n")
    t.nic("eth0", "0000:07:00.0")
    # Root port 00:02.0 -> outer switch 10:00.0 -> port 11:00.0 -> inner switch 12:00.0 -> ports 13:0n.0 -> GPUs
    # 14:00.0, 15:00.0; the outer switch's port 11:01.0 -> GPU 16:00.0.
    t.add("0000:00:02.0", None, ROOT_PORT)
    t.add("0000:10:00.0", "0000:00:02.0", SWITCH_UP)
    t.add("0000:11:00.0", "0000:10:00.0", SWITCH_DOWN)
    t.add("0000:12:00.0", "0000:11:00.0", SWITCH_UP)
    for n in range(2):
        t.add(f"0000:13:0{n}.0", "0000:12:00.0", SWITCH_DOWN)
        t.amd_gpu(f"0000:{0x14 + n:02x}:00.0", f"0000:13:0{n}.0")
    t.add("0000:11:01.0", "0000:10:00.0", SWITCH_DOWN)
    t.amd_gpu("0000:16:00.0", "0000:11:01.0")
    # Root port 00:03.0 -> GPU 20:00.0, directly.
    t.add("0000:00:03.0", None, ROOT_PORT)
    t.amd_gpu("0000:20:00.0", "0000:00:03.0")
    # Root port 00:04.0 -> switch 30:00.0 -> port 31:00.0 -> GPU 32:00.0, every config cut to 64 bytes.
    t.add("0000:00:04.0", None, ROOT_PORT, SHORT)
    t.add("0000:30:00.0", "0000:00:04.0", SWITCH_UP, SHORT)
    t.add("0000:31:00.0", "0000:30:00.0", SWITCH_DOWN, SHORT)
    t.amd_gpu("0000:32:00.0", "0000:31:00.0", SHORT)
    # Root port 00:05.0 (no config file at all) -> GPU 40:00.0.
    t.add("0000:00:05.0", None, ROOT_PORT, None)
    t.amd_gpu("0000:40:00.0", "0000:00:05.0")
    # Root port 00:06.0 -> switch 50:00.0 -> port 51:00.0 -> PCIe-to-PCI bridge 52:00.0 -> GPU 53:00.0.
    t.add("0000:00:06.0", None, ROOT_PORT)
    t.add("0000:50:00.0", "0000:00:06.0", SWITCH_UP)
    t.add("0000:51:00.0", "0000:50:00.0", SWITCH_DOWN)
    t.add("0000:52:00.0", "0000:51:00.0", PCIE_TO_PCI)
    t.amd_gpu("0000:53:00.0", "0000:52:00.0")
    # The first switch's 4 GPUs are one xGMI hive.
    t.xgmi_hive(4_660_473_893_247_131_985, "0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0")
    return t


#: hw.pcie.upstream of every GPU of :func:`hgx_like`.
HGX_LIKE_UPSTREAM = {
    "0000:03:00.0": "0000:01:00.0",
    "0000:04:00.0": "0000:01:00.0",
    "0000:05:00.0": "0000:01:00.0",
    "0000:06:00.0": "0000:01:00.0",
    "0000:14:00.0": "0000:12:00.0",
    "0000:15:00.0": "0000:12:00.0",
    "0000:16:00.0": "0000:10:00.0",
    "0000:20:00.0": "0000:00:03.0",
    "0000:32:00.0": "0000:30:00.0",
    "0000:40:00.0": "0000:00:05.0",
    "0000:53:00.0": "0000:50:00.0",
}
