"""Where a PCI device sits in the PCIe tree, read from sysfs as the Linux kernel lays it out.

Why: a failing PCIe switch or root port shows up on every device behind it. Naming that port on each device
(``hw.pcie.upstream``) lets the classifier find the shared fault once instead of once per device. The sysfs
source uses this for its own devices, and the NVML source for its GPUs when their addresses are in sysfs.

The kernel's layout: ``/sys/bus/pci/devices/<BDF>`` is a symlink into
``/sys/devices/pci<domain>:<bus>/<root port>/[<switch upstream port>/<switch downstream port>/]*<device>``.
A bridge's directory holds the devices on its secondary bus. The upstream is the nearest switch upstream port
above the device, or the root port when no switch is in between. A port's type is read the way the kernel reads
it: from the PCI Express capability's Device/Port Type field in ``config``
(``include/uapi/linux/pci_regs.h``: ``PCI_EXP_FLAGS_TYPE``, ``PCI_EXP_TYPE_ROOT_PORT`` 4, ``_UPSTREAM`` 5,
``_DOWNSTREAM`` 6). An unprivileged read of ``config`` returns only the first 64 bytes, which hold no
capability, so when a type cannot be read the walk falls back to the tree's shape. The bridges above a device
alternate: root port, then (upstream, downstream) for each switch. So the device's grandparent, when it is a
PCI device, is the upstream port of the switch the device hangs off; when the grandparent is not a PCI device,
the parent is a root port.
"""

from __future__ import annotations

import re
from pathlib import Path

#: A PCI address as the kernel (``%04x:%02x:%02x.%d``) or NVML (``%08X:%02X:%02X.0``) writes it.
_BDF = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")
#: pci_regs.h: the status bit saying a capability list exists, where the list starts, the PCIe capability's id,
#: and the offset of its Capabilities register (whose bits 7:4 are the Device/Port Type).
PCI_STATUS, PCI_STATUS_CAP_LIST = 0x06, 0x10
PCI_CAPABILITY_LIST, PCI_CAP_ID_EXP, PCI_EXP_FLAGS = 0x34, 0x10, 2
PCI_EXP_TYPE_ROOT_PORT, PCI_EXP_TYPE_UPSTREAM, PCI_EXP_TYPE_DOWNSTREAM = 0x4, 0x5, 0x6
#: drivers/pci/pci.c PCI_FIND_CAP_TTL: how many capability entries the kernel follows at most (a loop guard).
_CAP_TTL = 48
#: Standard configuration header size; capabilities live after it.
_HEADER = 0x40


def pcie_address(text: str | bytes) -> str | None:
    """The kernel's form of a PCI address (``00000000:41:00.0`` -> ``0000:41:00.0``: 4-digit domain at least,
    lowercase), or None when ``text`` is not one."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    m = _BDF.fullmatch(text.strip().rstrip("\x00"))
    if m is None:
        return None
    domain, bus, dev, fn = (int(g, 16) for g in m.groups())
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def config_port_type(config: bytes) -> int | None:
    """The Device/Port Type of a device's PCI Express capability in ``config`` (its configuration space), or
    None when it cannot be told: no capability list, no PCIe capability, or the list reaches beyond what was
    read (an unprivileged read returns the 64-byte header only). Walks the list as the kernel's
    ``pci_find_capability`` does."""
    if len(config) < _HEADER or not config[PCI_STATUS] & PCI_STATUS_CAP_LIST:
        return None
    pos = config[PCI_CAPABILITY_LIST]
    for _ in range(_CAP_TTL):
        if pos < _HEADER:
            return None
        pos &= ~3
        if pos + PCI_EXP_FLAGS + 2 > len(config):
            return None  # the capability is in the part this read did not return
        cap_id, nxt = config[pos], config[pos + 1]
        if cap_id == 0xFF:
            return None
        if cap_id == PCI_CAP_ID_EXP:
            flags = int.from_bytes(config[pos + PCI_EXP_FLAGS : pos + PCI_EXP_FLAGS + 2], "little")
            return (flags & 0x00F0) >> 4
        pos = nxt
    return None


def _config(device_dir: Path) -> bytes:
    """The first 256 bytes of a device's configuration space (64 when not privileged); empty when unreadable."""
    try:
        with (device_dir / "config").open("rb") as f:
            return f.read(256)
    except OSError:
        return b""


def bridges_above(device_dir: Path) -> tuple[Path, ...]:
    """The PCI bridges above a device, nearest first (its parent directories that are PCI devices, with the
    symlinks of ``bus/pci/devices`` resolved); empty when it is on a root bus or not in the tree."""
    try:
        real = device_dir.resolve(strict=True)
    except OSError:
        return ()
    bridges = []
    for parent in real.parents:
        if _BDF.fullmatch(parent.name) is None:
            break
        bridges.append(parent)
    return tuple(bridges)


def upstream_of(bridges: tuple[Path, ...]) -> str | None:
    """The address of the nearest switch upstream port among ``bridges`` (nearest first), or of the root port
    when none comes first; by the ports' types, else by the tree's shape (module docstring). None when the
    device sits on a root bus (no bridge above it)."""
    if not bridges:
        return None
    for bridge in bridges:
        kind = config_port_type(_config(bridge))
        if kind is None:
            break  # the type cannot be read here: the tree's shape answers
        if kind in (PCI_EXP_TYPE_UPSTREAM, PCI_EXP_TYPE_ROOT_PORT):
            return bridge.name
    return bridges[1].name if len(bridges) > 1 else bridges[0].name


def pcie_place(device_dir: Path) -> tuple[str | None, str | None]:
    """``(hw.pcie.address, hw.pcie.upstream)`` of the PCI device whose sysfs directory is ``device_dir``
    (``bus/pci/devices/<BDF>`` or a NIC's ``device`` link); each None where sysfs does not tell it."""
    try:
        name = device_dir.resolve(strict=True).name
    except OSError:
        return None, None
    address = pcie_address(name)
    if address is None:  # not a PCI function (a virtio NIC's device is virtioN)
        return None, None
    return address, upstream_of(bridges_above(device_dir))
