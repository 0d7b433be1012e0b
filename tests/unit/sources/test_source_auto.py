"""`--source auto`: NVML when it finds GPUs, else sysfs when it finds accelerators, else the simulator.
Each source answers with the discovery it reads with, so the one chosen is never one that reports no GPU."""

import subprocess
import sys

import pytest

from otel_dra import sources
from otel_dra.config import AgentConfig
from otel_dra.frame import Schema
from otel_dra.sources import Probe, build, choose, reason, source_class
from otel_dra.sources.nvml import NvmlSource
from otel_dra.sources.sysfs import SysfsSource


def fake_pci(root, devices: dict[str, tuple[str, str]]) -> str:
    """PCI functions by address: (class, vendor) each, as the kernel lays them out."""
    for address, (klass, vendor) in devices.items():
        device = root / "bus" / "pci" / "devices" / address
        device.mkdir(parents=True)
        (device / "class").write_text(klass + "\n")
        (device / "vendor").write_text(vendor + "\n")
    return str(root)


@pytest.fixture(autouse=True)
def no_nvml(monkeypatch):
    """Ask sysfs whatever machine runs the tests: NVML finds nothing here."""
    monkeypatch.setattr(NvmlSource, "probe", classmethod(lambda cls, config: Probe("nvml", 0, "NVML did not load")))


def auto(root: str) -> AgentConfig:
    return AgentConfig(node_name="n", source="auto", sysfs_root=root)


def test_only_accelerators_make_auto_read_sysfs(tmp_path):
    nic_only = fake_pci(
        tmp_path / "a", {"0000:00:03.0": ("0x020000", "0x8086"), "0000:00:00.0": ("0x060000", "0x8086")}
    )
    assert choose(auto(nic_only))[0] == "simulated"
    with_gpu = fake_pci(
        tmp_path / "b", {"0000:03:00.0": ("0x030200", "0x10de"), "0000:04:00.0": ("0x120000", "0x1e52")}
    )
    name, probes = choose(auto(with_gpu))
    assert name == "sysfs"
    assert [(p.source, p.found) for p in probes] == [("nvml", 0), ("sysfs", 2)]


def test_a_bmc_vga_is_not_a_gpu(tmp_path):
    # Most servers: the BMC's ASPEED VGA (vendor 0x1a03) is the only PCI display device.
    root = fake_pci(tmp_path, {"0000:02:00.0": ("0x030000", "0x1a03"), "0000:00:03.0": ("0x020000", "0x8086")})
    name, probes = choose(auto(root))
    assert name != "sysfs"
    assert name == "simulated"
    sysfs = probes[-1]
    assert sysfs.source == "sysfs" and sysfs.found == 0
    assert "0000:02:00.0 (0x1a03)" in sysfs.why
    # What the probe said is what a sysfs pass reads: no GPU.
    frame = SysfsSource("n", root).read(0)
    assert [a["hw.type"] for a in frame.devices.attrs if a["hw.type"] == "gpu"] == []


def test_auto_falls_back_to_the_simulator_and_says_why(tmp_path):
    root = fake_pci(tmp_path, {"0000:00:03.0": ("0x020000", "0x8086")})
    name, probes = choose(auto(root))
    assert name == "simulated"
    why = reason(name, probes)
    assert why.startswith("NVML did not load; sysfs shows no PCI accelerator")
    assert why.endswith("; running the simulated source")
    gpu_root = fake_pci(tmp_path / "gpu", {"0000:03:00.0": ("0x030000", "0x1002")})
    assert choose(auto(gpu_root))[0] == "sysfs"
    explicit = AgentConfig(node_name="n", source="simulated", sysfs_root=gpu_root)
    assert choose(explicit) == ("simulated", ())
    assert reason(*choose(explicit)) == "chosen with --source"


def test_build_opens_what_choose_picked(tmp_path):
    gpu_root = fake_pci(tmp_path, {"0000:03:00.0": ("0x038000", "0x1002")})
    source, why = build(auto(gpu_root), Schema())
    assert source.name == "sysfs"
    assert why == f"NVML did not load; sysfs shows 1 PCI accelerator(s) ['0000:03:00.0'] under {gpu_root}"
    assert source.read(0).devices.ids == ("0000:03:00.0",)
    sim, _ = build(AgentConfig(node_name="n", source="simulated", devices=3), Schema())
    assert len(sim.read(0).devices) == 3


def test_every_source_answers_probe_and_opens_from_config():
    assert sources.SOURCES == ("auto", "simulated", "nvml", "sysfs")
    for name in sources.SOURCES[1:]:
        cls = source_class(name)
        assert cls.name == name
        assert callable(cls.probe) and callable(cls.from_config)
    assert set(sources.AUTO_ORDER) | {sources.AUTO_FALLBACK} == set(sources.SOURCES[1:])


def test_fault_on_a_real_source_is_a_one_line_error():
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "run", "--source", "sysfs", "--fault", "gpu-1:thermal"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "otel-dra run: error: --fault injects into the simulated source only; use --source simulated "
        "(see 'otel-dra run --help')"
    ]
