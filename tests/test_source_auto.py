"""`--source auto`: NVML when it finds GPUs, else sysfs when it finds accelerators, else the simulator."""

import subprocess
import sys

from otel_dra.agent import choose_source, pci_accelerators
from otel_dra.config import AgentConfig


def fake_pci(root, devices: dict[str, str]) -> str:
    for address, klass in devices.items():
        device = root / "bus" / "pci" / "devices" / address
        device.mkdir(parents=True)
        (device / "class").write_text(klass + "\n")
    return str(root)


def test_only_accelerators_make_auto_read_sysfs(tmp_path):
    nic_only = fake_pci(tmp_path / "a", {"0000:00:03.0": "0x020000", "0000:00:00.0": "0x060000"})
    assert pci_accelerators(nic_only) == []
    with_gpu = fake_pci(tmp_path / "b", {"0000:03:00.0": "0x030200", "0000:04:00.0": "0x120000"})
    assert pci_accelerators(with_gpu) == ["0000:03:00.0", "0000:04:00.0"]


def test_auto_falls_back_to_the_simulator_and_says_why(tmp_path):
    # No NVIDIA driver on this machine (the test environment), no accelerator in the fake tree.
    root = fake_pci(tmp_path, {"0000:00:03.0": "0x020000"})
    name, why = choose_source(AgentConfig(node_name="n", source="auto", sysfs_root=root))
    assert name == "simulated"
    assert "no PCI display or processing accelerator" in why
    gpu_root = fake_pci(tmp_path / "gpu", {"0000:03:00.0": "0x030000"})
    assert choose_source(AgentConfig(node_name="n", source="auto", sysfs_root=gpu_root))[0] == "sysfs"
    assert choose_source(AgentConfig(node_name="n", source="simulated", sysfs_root=gpu_root))[0] == "simulated"


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
