"""`--source auto`: NVML when it finds GPUs, else sysfs when it finds accelerators, else a one-line error:
never the simulator, which runs only when asked for (or by --fault) and says so on its resource.
Each source answers with the discovery it reads with, so the one chosen is never one that reports no GPU."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from otel_dra import sources
from otel_dra.config import AgentConfig
from otel_dra.faults import Fault
from otel_dra.frame import Schema
from otel_dra.sources import NoAccelerator, Probe, SourceUnavailable, build, choose, reason, source_class
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
    with pytest.raises(NoAccelerator):
        choose(auto(nic_only))
    with_gpu = fake_pci(
        tmp_path / "b", {"0000:03:00.0": ("0x030200", "0x10de"), "0000:04:00.0": ("0x120000", "0x1e52")}
    )
    name, probes = choose(auto(with_gpu))
    assert name == "sysfs"
    assert [(p.source, p.found) for p in probes] == [("nvml", 0), ("sysfs", 2)]


def test_a_bmc_vga_is_not_a_gpu(tmp_path):
    # Most servers: the BMC's ASPEED VGA (vendor 0x1a03) is the only PCI display device.
    root = fake_pci(tmp_path, {"0000:02:00.0": ("0x030000", "0x1a03"), "0000:00:03.0": ("0x020000", "0x8086")})
    with pytest.raises(NoAccelerator) as err:
        choose(auto(root))
    sysfs = err.value.probes[-1]
    assert sysfs.source == "sysfs" and sysfs.found == 0
    assert "0000:02:00.0 (0x1a03)" in sysfs.why and "0000:02:00.0 (0x1a03)" in str(err.value)
    # What the probe said is what a sysfs pass reads: no GPU.
    frame = SysfsSource("n", root).read(0)
    assert [a["hw.type"] for a in frame.devices.attrs if a["hw.type"] == "gpu"] == []


def test_auto_never_runs_the_simulator_and_says_what_it_looked_for(tmp_path):
    """A node missing the [nvidia] extra or its /sys mount must not report 8 healthy pretend GPUs:
    auto stops with what each real source saw and the three ways out, on one line."""
    root = fake_pci(tmp_path, {"0000:00:03.0": ("0x020000", "0x8086")})
    with pytest.raises(NoAccelerator) as err:
        choose(auto(root))
    assert isinstance(err.value, SourceUnavailable)  # the CLI's one line, exit 2
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--source auto found no accelerator (NVML did not load; sysfs shows no PCI accelerator")
    assert f"under {root})" in message
    assert message.endswith(
        ": pip install 'otel-dra[nvidia]' for NVIDIA GPUs, mount the host's /sys (--sysfs-root, e.g. /host/sys "
        "in a container), or pass --source simulated for simulated GPUs"
    )
    assert [p.source for p in err.value.probes] == list(sources.AUTO_ORDER)
    gpu_root = fake_pci(tmp_path / "gpu", {"0000:03:00.0": ("0x030000", "0x1002")})
    assert choose(auto(gpu_root))[0] == "sysfs"
    explicit = AgentConfig(node_name="n", source="simulated", sysfs_root=root)
    assert choose(explicit) == ("simulated", ())
    assert reason(*choose(explicit)) == "chosen with --source"


def test_fault_under_auto_is_the_simulator_and_the_log_says_why(tmp_path):
    """--fault is a request for the simulator (the only source faults go into): auto runs it without
    asking the real sources, and the reason logged names --fault, not a silent fallback."""
    root = fake_pci(tmp_path, {"0000:03:00.0": ("0x030000", "0x10de")})  # a GPU is there: --fault still wins
    config = AgentConfig(node_name="n", source="auto", sysfs_root=root, devices=4, faults=(Fault("gpu-1", "thermal"),))
    name, probes = choose(config)
    assert name == "simulated"
    assert reason(name, probes) == "--fault given: 4 simulated device(s), the only source faults are injected into"


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
    assert set(sources.AUTO_ORDER) | {"simulated"} == set(sources.SOURCES[1:])
    assert "simulated" not in sources.AUTO_ORDER


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


def no_nvml_env(tmp_path: Path) -> dict[str, str]:
    """The environment of an agent on a node without the [nvidia] extra: a ``pynvml`` that can't be
    imported shadows any installed one (a subprocess can't be monkeypatched)."""
    shadow = tmp_path / "no-nvml"
    shadow.mkdir()
    (shadow / "pynvml.py").write_text('raise ImportError("pynvml hidden by the test")\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shadow), env.get("PYTHONPATH")]))
    return env


def test_run_auto_on_a_node_without_accelerators_exits_2_with_one_line(tmp_path):
    empty = tmp_path / "sys"
    empty.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "run", "--source", "auto", "--sysfs-root", str(empty)],
        capture_output=True,
        text=True,
        timeout=30,
        env=no_nvml_env(tmp_path),
    )
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "otel-dra: error: --source auto found no accelerator (pynvml is not installed (pip install "
        "'otel-dra[nvidia]'); sysfs shows no PCI accelerator (a display device of AMD/NVIDIA/Intel, or class "
        f"0x12) under {empty}): pip install 'otel-dra[nvidia]' for NVIDIA GPUs, mount the host's /sys "
        "(--sysfs-root, e.g. /host/sys in a container), or pass --source simulated for simulated GPUs"
    ]
    assert result.stdout == ""


def test_the_simulators_metrics_say_simulated_on_their_resource(tmp_path, start_agent):
    """--fault under auto runs the simulator, the log says it was --fault, and every metric's resource
    (target_info on /metrics) carries otel_dra.source="simulated"."""
    agent = start_agent("--interval", "1", "--fault", "gpu-1:thermal", pick_source=True)
    assert "source simulated: --fault given: 8 simulated device(s)" in agent.logs()
    target_info = [line for line in agent.metrics().splitlines() if line.startswith("target_info{")]
    assert len(target_info) == 1, target_info
    assert 'otel_dra_source="simulated"' in target_info[0]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', target_info[0]))
    assert labels["k8s_node_name"] and labels["service_name"] == "otel-dra"


def test_otel_dra_source_is_registered_with_every_source():
    registry = Path(__file__).resolve().parents[3] / "semconv" / "registry.yaml"
    groups = yaml.safe_load(registry.read_text())["groups"]
    attrs = {a.get("id"): a for g in groups if g["type"] == "attribute_group" for a in g["attributes"]}
    members = {m["value"] for m in attrs["otel_dra.source"]["type"]["members"]}
    assert members == set(sources.SOURCES[1:])
