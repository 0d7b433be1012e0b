"""Real sources as a user runs them: `otel-dra run --source sysfs --sysfs-root tests/data/sysfs-amd`."""

import re
from pathlib import Path

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e
TREE = Path(__file__).resolve().parents[1] / "data" / "sysfs-amd"


def test_sysfs_tree_is_served_with_its_limits(start_agent):
    agent = start_agent("--source", "sysfs", "--sysfs-root", str(TREE), "--interval", "1")

    def families() -> set[str]:
        return {m.group(1) for m in re.finditer(r"^(hw_[a-z_]+)\{", agent.metrics(), re.M)}

    expected = {
        "hw_temperature_celsius",
        "hw_temperature_limit_celsius",
        "hw_power_watts",
        "hw_power_limit_watts",
        "hw_energy_joules_total",
        "hw_fan_speed_rpm",
        "hw_fan_speed_limit_rpm",
        "hw_voltage_volts",
        "hw_voltage_limit_volts",
        "hw_gpu_utilization",
        "hw_gpu_memory_usage_bytes",
        "hw_gpu_memory_limit_bytes",
        "hw_errors_total",
        "hw_pcie_link_width",
        "hw_pcie_link_width_limit",
        "hw_pcie_link_generation",
        "hw_pcie_link_generation_limit",
        "hw_status",
    }
    wait_for(lambda: expected <= families(), 20, "the sysfs tree's signals")
    text = agent.metrics()
    limits = re.findall(r'^hw_temperature_limit_celsius\{[^}]*hw_limit_type="([a-z.]+)"', text, re.M)
    assert {"high.degraded", "high.critical"} <= set(limits)
    assert 'hw_type="network"' in text  # the NIC beside the GPU
    assert "source sysfs: chosen with --source" in agent.logs()
