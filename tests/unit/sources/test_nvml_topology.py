"""The NVML source's topology through recorded return values (tests/support/fake_nvml.py): addresses from
nvmlDeviceGetPciInfo, upstream from sysfs when the GPU is there (a fake tree as the kernel lays it out) and from
NVML's common ancestor when it is not, fabric from the fabric info calls; read when GPUs are identified only."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytest.importorskip("pynvml")

from otel_dra import conventions as cv
from otel_dra.sources.nvml import NvmlSource
from tests.support.fake_nvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_GPU_FABRIC_STATE_COMPLETED,
    NVML_SUCCESS,
    FakeGpu,
    FakeNvml,
)
from tests.unit.sources.pci_tree import HGX_LIKE_UPSTREAM, PciTree, hgx_like

T0 = 1_764_000_000_000_000_000
S = 10**9
CLUSTER = uuid.UUID("1b2f2a64-5e0c-4c5e-9a3c-2d4f6e8a0b1c")
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2


def _gpus(bus_ids: list[str], **kw: object) -> list[FakeGpu]:
    return [FakeGpu(uuid=f"GPU-{i:08d}-topo", bus_id=b, **kw) for i, b in enumerate(bus_ids)]  # type: ignore[arg-type]


def _attrs(src: NvmlSource, now: int = T0) -> list[dict[str, str]]:
    return [dict(a) for a in src.read(now).devices.attrs]


def test_address_is_normalised_and_upstream_comes_from_sysfs(tmp_path: Path) -> None:
    hgx_like(tmp_path)
    gpus = sorted(HGX_LIKE_UPSTREAM)
    fake = FakeNvml(_gpus([f"0000{g.upper()}" for g in gpus]))  # NVML's 8-digit uppercase form
    fake.ancestors = {frozenset((i, j)): 0 for i in range(len(gpus)) for j in range(len(gpus))}  # all "one board"
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))
    try:
        attrs = _attrs(src)
        assert [a[cv.HW_PCIE_ADDRESS] for a in attrs] == gpus
        assert [a[cv.HW_PCIE_UPSTREAM] for a in attrs] == [HGX_LIKE_UPSTREAM[g] for g in gpus]  # sysfs wins
        assert sum(g.called["nvmlDeviceGetTopologyCommonAncestor"] for g in fake.gpus) == 0
    finally:
        src.close()


def test_without_sysfs_gpus_behind_one_switch_are_named_by_their_smallest_address(tmp_path: Path) -> None:
    buses = ["00000000:1B:00.0", "00000000:1A:00.0", "00000000:3A:00.0", "00000000:3B:00.0"]
    buses += ["00000000:5D:00.0", "00000000:5C:00.0", "00000000:9A:00.0", "00000000:AB:00.0", "00000000:DB:00.0"]
    gpus = _gpus(buses)
    for gpu, switch in zip(gpus, ["a", "a", "b", "b", None, None, "c", "c", None], strict=True):
        gpu.switch = switch
    fake = FakeNvml(gpus)
    fake.ancestors[frozenset((4, 5))] = fake.NVML_TOPOLOGY_INTERNAL  # one board: counts as one switch
    fake.ancestors[frozenset((6, 7))] = fake.NVML_TOPOLOGY_MULTIPLE  # two switches apart, whatever `switch` says
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))  # an empty sysfs: no GPU there
    try:
        attrs = _attrs(src)
        upstream = [a.get(cv.HW_PCIE_UPSTREAM) for a in attrs]
        assert upstream[:4] == ["0000:1a:00.0", "0000:1a:00.0", "0000:3a:00.0", "0000:3a:00.0"]
        assert upstream[4:6] == ["0000:5c:00.0", "0000:5c:00.0"]
        assert upstream[6:] == [None, None, None]  # no peer behind their switch: nothing to name
        assert attrs[1][cv.HW_PCIE_ADDRESS] == "0000:1a:00.0"
    finally:
        src.close()


def test_a_chain_of_single_switch_answers_is_one_group(tmp_path: Path) -> None:
    fake = FakeNvml(_gpus(["00000000:03:00.0", "00000000:02:00.0", "00000000:01:00.0"]))
    fake.ancestors[frozenset((0, 1))] = fake.NVML_TOPOLOGY_SINGLE
    fake.ancestors[frozenset((1, 2))] = fake.NVML_TOPOLOGY_SINGLE
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))
    try:
        assert {a[cv.HW_PCIE_UPSTREAM] for a in _attrs(src)} == {"0000:01:00.0"}
    finally:
        src.close()


def test_topology_is_read_at_start_not_per_pass(tmp_path: Path) -> None:
    fake = FakeNvml(_gpus(["00000000:1A:00.0", "00000000:1B:00.0"], switch="a"))
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))
    try:
        for k in range(3):
            src.read(T0 + k * S)
        assert [g.called["nvmlDeviceGetPciInfo"] for g in fake.gpus] == [1, 1]
        assert sum(g.called["nvmlDeviceGetTopologyCommonAncestor"] for g in fake.gpus) == 2  # one pair, both sides
        assert [g.called["nvmlDeviceGetGpuFabricInfoV"] for g in fake.gpus] == [1, 1]
    finally:
        src.close()


def test_a_gpu_lost_at_start_gets_its_place_when_it_joins(tmp_path: Path) -> None:
    fake = FakeNvml(_gpus(["00000000:1B:00.0", "00000000:1A:00.0"], switch="a"))
    fake.gpus[1].fail = NVML_ERROR_GPU_IS_LOST
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))
    try:
        first = _attrs(src)
        assert len(first) == 1 and cv.HW_PCIE_UPSTREAM not in first[0]  # its peer is not there yet
        fake.gpus[1].fail = None
        joined = _attrs(src, T0 + S)
        assert [a[cv.HW_PCIE_UPSTREAM] for a in joined] == ["0000:1a:00.0", "0000:1a:00.0"]
    finally:
        src.close()


@pytest.mark.parametrize("driver_lacks", [set(), {"nvmlDeviceGetGpuFabricInfoV"}])
def test_a_completed_fabric_is_cluster_uuid_and_clique(tmp_path: Path, driver_lacks: set[str]) -> None:
    fabric = (CLUSTER.bytes, 32766, NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS)
    fake = FakeNvml(_gpus(["00000000:1A:00.0", "00000000:1B:00.0"], fabric=fabric))
    fake.driver_lacks = driver_lacks
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))
    try:
        assert {a[cv.HW_FABRIC_ID] for a in _attrs(src)} == {"1b2f2a64-5e0c-4c5e-9a3c-2d4f6e8a0b1c/32766"}
        assert fake.gpus[0].called["nvmlDeviceGetGpuFabricInfo"] == (1 if driver_lacks else 0)
    finally:
        src.close()


def test_an_older_pynvml_without_the_versioned_call_uses_the_old_one(tmp_path: Path) -> None:
    fabric = (CLUSTER.bytes, 7, NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS)
    fake = FakeNvml(_gpus(["00000000:1A:00.0"], fabric=fabric))
    fake.hidden = frozenset({"nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"})
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))
    try:
        assert _attrs(src)[0][cv.HW_FABRIC_ID] == f"{CLUSTER}/7"
    finally:
        src.close()


@pytest.mark.parametrize(
    "fabric",
    [
        None,  # NOT_SUPPORTED: no NVSwitch fabric
        (CLUSTER.bytes, 1, NVML_GPU_FABRIC_STATE_IN_PROGRESS, NVML_SUCCESS),  # registration not done
        (CLUSTER.bytes, 1, NVML_GPU_FABRIC_STATE_COMPLETED, NVML_ERROR_NOT_SUPPORTED),  # done, failed
        (bytes(16), 0, NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS),  # no multi-node cluster
    ],
)
def test_no_fabric_id_unless_registration_completed(tmp_path: Path, fabric: tuple[bytes, int, int, int] | None) -> None:
    fake = FakeNvml(_gpus(["00000000:1A:00.0"], fabric=fabric))
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))
    try:
        attrs = _attrs(src)[0]
        assert cv.HW_FABRIC_ID not in attrs and attrs[cv.HW_PCIE_ADDRESS] == "0000:1a:00.0"
    finally:
        src.close()


def test_a_driver_without_any_topology_call_leaves_the_attributes_out(tmp_path: Path) -> None:
    fabric = (CLUSTER.bytes, 1, NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS)
    fake = FakeNvml(_gpus(["00000000:1A:00.0", "00000000:1B:00.0"], switch="a", fabric=fabric))
    fake.driver_lacks = {
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetGpuFabricInfo",
    }
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))
    try:
        frame = src.read(T0)
        assert len(frame.devices) == 2
        for attrs in frame.devices.attrs:
            assert not {cv.HW_PCIE_ADDRESS, cv.HW_PCIE_UPSTREAM, cv.HW_FABRIC_ID} & set(attrs)
            assert attrs[cv.HW_SERIAL_NUMBER]  # the rest of the identity is there
    finally:
        src.close()


def test_gpus_sysfs_shows_on_a_root_bus_get_no_upstream_from_nvml(tmp_path: Path) -> None:
    """A VM's passed-through GPUs sit on the root bus: sysfs tells where they are, NVML's guess is not taken."""
    tree = PciTree(tmp_path)
    tree.add("0000:00:05.0", None)
    tree.add("0000:00:06.0", None)
    fake = FakeNvml(_gpus(["00000000:00:05.0", "00000000:00:06.0"], switch="a"))
    src = NvmlSource("node-a", nvml=fake, sysfs_root=str(tmp_path))
    try:
        attrs = _attrs(src)
        assert [a[cv.HW_PCIE_ADDRESS] for a in attrs] == ["0000:00:05.0", "0000:00:06.0"]
        assert not any(cv.HW_PCIE_UPSTREAM in a for a in attrs)
    finally:
        src.close()
