"""Topology from the sources (issue #31): each device's PCI address, the switch or root port above it, and its
fabric. The sysfs tree logic is read against fake trees laid out as the kernel lays them out (tests/unit/sources/
pci_tree.py) and against this machine's /sys; NVML through recorded return values (tests/support/fake_nvml.py);
the simulator's layout checked for plausibility."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from otel_dra import conventions as cv
from otel_dra.frame import Frame
from otel_dra.sources import pci_topology as topo
from otel_dra.sources import sysfs as sysfs_mod
from otel_dra.sources.pci_topology import bridges_above, config_port_type, pcie_address, pcie_place, upstream_of
from otel_dra.sources.simulated import GPUS_PER_SWITCH, SimulatedSource, SimulatorConfig
from otel_dra.sources.sysfs import SysfsSource
from tests.unit.sources.pci_tree import (
    HGX_LIKE_UPSTREAM,
    PCIE_TO_PCI,
    ROOT_PORT,
    SHORT,
    SWITCH_DOWN,
    SWITCH_UP,
    config_space,
    hgx_like,
)

T0 = 1_764_000_000_000_000_000
HIVE = 4_660_473_893_247_131_985


def _by_id(frame: Frame) -> dict[str, dict[str, str]]:
    return {dev: dict(a) for dev, a in zip(frame.devices.ids, frame.devices.attrs, strict=True)}


# -- the tree logic -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("00000000:41:00.0", "0000:41:00.0"),  # NVML's busId: 8-digit domain, uppercase
        (b"00000000:1A:00.0", "0000:1a:00.0"),  # older pynvml: bytes
        ("0000:1A:00.1", "0000:1a:00.1"),  # NVML's legacy form
        ("0000:41:00.0", "0000:41:00.0"),  # the kernel's
        ("10000:e1:00.0", "10000:e1:00.0"),  # a VMD domain: the kernel's %04x prints 5 digits
        ("00000000:41:00.0\x00\x00", "0000:41:00.0"),
    ],
)
def test_addresses_take_the_kernel_s_form(text: str | bytes, address: str) -> None:
    assert pcie_address(text) == address


@pytest.mark.parametrize("text", ["", "virtio2", "pci0000:00", "0000:41:00", "0000:41:00.8", "0000:4g:00.0"])
def test_what_is_not_a_pci_address_is_none(text: str) -> None:
    assert pcie_address(text) is None


@pytest.mark.parametrize("kind", [0x0, ROOT_PORT, SWITCH_UP, SWITCH_DOWN, PCIE_TO_PCI])
def test_port_type_is_read_from_the_pcie_capability_past_the_others(kind: int) -> None:
    assert config_port_type(config_space(kind)) == kind


def test_port_type_unknown_when_the_config_cannot_tell() -> None:
    assert config_port_type(config_space(SWITCH_UP, SHORT)) is None  # unprivileged: the header only
    assert config_port_type(config_space(SWITCH_UP, 0x61)) is None  # the capability cut in the middle
    assert config_port_type(b"") is None
    assert config_port_type(config_space(None)) is None  # conventional PCI: no PCIe capability
    no_list = bytearray(config_space(SWITCH_UP))
    no_list[0x06] = 0  # no PCI_STATUS_CAP_LIST
    assert config_port_type(bytes(no_list)) is None
    looped = bytearray(config_space(SWITCH_UP))
    looped[0x51] = 0x40  # MSI points back at PM: the kernel's TTL ends the walk
    assert config_port_type(bytes(looped)) is None


def test_each_gpu_names_the_nearest_switch_upstream_port_or_its_root_port(tmp_path: Path) -> None:
    hgx_like(tmp_path)
    devices = tmp_path / "bus" / "pci" / "devices"
    for gpu, upstream in HGX_LIKE_UPSTREAM.items():
        assert pcie_place(devices / gpu) == (gpu, upstream), gpu


def test_types_win_over_the_tree_s_shape_and_the_shape_answers_without_them(tmp_path: Path) -> None:
    hgx_like(tmp_path)
    devices = tmp_path / "bus" / "pci" / "devices"
    behind_pci_bridge = bridges_above(devices / "0000:53:00.0")
    assert [b.name for b in behind_pci_bridge] == ["0000:52:00.0", "0000:51:00.0", "0000:50:00.0", "0000:00:06.0"]
    # The shape alone would take the grandparent, the switch's downstream port: the types skip it.
    assert upstream_of(behind_pci_bridge) == "0000:50:00.0"
    for config in (devices / "0000:52:00.0" / "config", devices / "0000:51:00.0" / "config"):
        config.write_bytes(config.read_bytes()[:SHORT])
    assert upstream_of(behind_pci_bridge) == "0000:51:00.0"  # now unreadable: the shape's answer


def test_a_device_on_a_root_bus_or_outside_the_tree_has_no_upstream(tmp_path: Path) -> None:
    t = hgx_like(tmp_path)
    devices = tmp_path / "bus" / "pci" / "devices"
    assert pcie_place(devices / "0000:00:01.0") == ("0000:00:01.0", None)  # the root port itself
    assert pcie_place(devices / "0000:99:00.0") == (None, None)
    virtio = t.dirs["0000:00:03.0"] / "virtio2"
    virtio.mkdir()
    assert pcie_place(virtio) == (None, None)


def test_this_machine_s_tree_reads_without_error() -> None:
    """Every PCI function of this machine's /sys: its address is its name, and its upstream is a bridge above it."""
    devices = Path("/sys/bus/pci/devices")
    if not devices.is_dir():
        pytest.skip("no /sys/bus/pci here")
    for dev in sorted(devices.iterdir()):
        address, upstream = pcie_place(dev)
        assert address == dev.name
        bridges = {b.name for b in bridges_above(dev)}
        assert upstream is None if not bridges else upstream in bridges


# -- the sysfs source ---------------------------------------------------------------------------------------------
def test_sysfs_source_publishes_address_upstream_and_xgmi_hive(tmp_path: Path) -> None:
    hgx_like(tmp_path)
    src = SysfsSource("node-a", str(tmp_path))
    attrs = _by_id(src.read(T0))
    assert {d for d in attrs if attrs[d][cv.HW_TYPE] == "gpu"} == set(HGX_LIKE_UPSTREAM)
    for gpu, upstream in HGX_LIKE_UPSTREAM.items():
        assert attrs[gpu][cv.HW_PCIE_ADDRESS] == gpu
        assert attrs[gpu][cv.HW_PCIE_UPSTREAM] == upstream
    hive = {gpu for gpu in attrs if cv.HW_FABRIC_ID in attrs[gpu]}
    assert hive == {"0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0"}
    assert {attrs[gpu][cv.HW_FABRIC_ID] for gpu in hive} == {f"xgmi/{HIVE}"}
    nic = attrs["eth0"]
    assert (nic[cv.HW_PCIE_ADDRESS], nic[cv.HW_PCIE_UPSTREAM]) == ("0000:07:00.0", "0000:01:00.0")
    assert cv.HW_FABRIC_ID not in nic


def test_sysfs_topology_is_read_once_at_discovery_and_kept_while_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = hgx_like(tmp_path)
    calls: list[Path] = []

    def counting(device_dir: Path) -> tuple[str | None, str | None]:
        calls.append(device_dir)
        return topo.pcie_place(device_dir)

    monkeypatch.setattr(sysfs_mod, "pcie_place", counting)
    src = SysfsSource("node-a", str(tmp_path))
    first = _by_id(src.read(T0))
    assert len(calls) == len(first)  # one per device (11 GPUs and the NIC)
    src.read(T0 + 10**10)
    t.amd_gpu("0000:17:00.0", "0000:13:01.0")  # hot-added behind the inner switch: read when it is discovered
    later = _by_id(src.read(T0 + 2 * 10**10))
    assert len(calls) == len(first) + 1
    assert later["0000:17:00.0"][cv.HW_PCIE_UPSTREAM] == "0000:12:00.0"


def test_a_device_unreadable_from_its_first_pass_still_says_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hgx_like(tmp_path)
    src = SysfsSource("node-a", str(tmp_path))

    def unreadable(hw_id: str, kind: str, path: Path, now_ns: int) -> None:
        raise sysfs_mod.DeviceUnreadable(f"{path}: EIO")

    monkeypatch.setattr(src, "_read_device", unreadable)
    attrs = _by_id(src.read(T0))
    assert attrs["0000:20:00.0"][cv.HW_PCIE_UPSTREAM] == "0000:00:03.0"
    assert attrs["0000:05:00.0"][cv.HW_FABRIC_ID] == f"xgmi/{HIVE}"


def test_committed_amd_tree_without_bridges_has_an_address_and_no_upstream() -> None:
    data = Path(__file__).resolve().parents[2] / "data" / "sysfs-amd"
    attrs = _by_id(SysfsSource("n", str(data)).read(T0))
    assert attrs["0000:03:00.0"][cv.HW_PCIE_ADDRESS] == "0000:03:00.0"
    assert cv.HW_PCIE_UPSTREAM not in attrs["0000:03:00.0"] and cv.HW_FABRIC_ID not in attrs["0000:03:00.0"]


# -- the simulator ------------------------------------------------------------------------------------------------
def test_simulated_gpus_sit_in_pairs_behind_switches_in_one_fabric() -> None:
    src = SimulatedSource(SimulatorConfig("node-a", devices=8, seed=1))
    attrs = list(_by_id(src.read(T0)).values())
    addresses = [a[cv.HW_PCIE_ADDRESS] for a in attrs]
    assert len(set(addresses)) == 8 and all(pcie_address(a) == a for a in addresses)
    behind: dict[str, list[str]] = {}
    for a in attrs:
        behind.setdefault(a[cv.HW_PCIE_UPSTREAM], []).append(a[cv.HW_PCIE_ADDRESS])
    assert len(behind) == 8 // GPUS_PER_SWITCH and all(len(g) == GPUS_PER_SWITCH for g in behind.values())
    assert not set(behind) & set(addresses)
    fabrics = {a[cv.HW_FABRIC_ID] for a in attrs}
    assert len(fabrics) == 1
    cluster, clique = fabrics.pop().split("/")
    assert str(uuid.UUID(cluster)) == cluster and clique.isdigit()
    other = SimulatedSource(SimulatorConfig("node-b", devices=8, seed=1)).read(T0).devices.attrs[0]
    assert other[cv.HW_FABRIC_ID] != attrs[0][cv.HW_FABRIC_ID]  # one fabric per node
    assert other[cv.HW_PCIE_UPSTREAM] == attrs[0][cv.HW_PCIE_UPSTREAM]  # addresses repeat across nodes


def test_a_large_simulated_node_keeps_valid_distinct_addresses() -> None:
    src = SimulatedSource(SimulatorConfig("node-a", devices=64, seed=1))
    addresses = [a[cv.HW_PCIE_ADDRESS] for a in src.read(T0).devices.attrs]
    assert len(set(addresses)) == 64 and all(pcie_address(a) == a for a in addresses)
