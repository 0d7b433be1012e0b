"""The closed vocabularies of the telemetry contract (error types, health, states, reasons, remediations).

Kept in one place so that parsing (``--fault``), the simulator and the sinks agree
on exactly the words the contract allows.
"""

from __future__ import annotations

from opentelemetry.semconv._incubating.attributes.hw_attributes import HwStateValues

#: Failure reasons, the contract's closed set (section 4), in contract order.
REASONS: tuple[str, ...] = (
    "thermal",
    "cooling",
    "memory_ecc",
    "power_delivery",
    "power_throttling",
    "memory_pressure",
    "link",
    "driver_errors",
    "firmware",
    "device_reset",
    "device_lost",
    "vendor_status",
    "stale",
)

#: Remediations, least to most disruptive.
REMEDIATIONS: tuple[str, ...] = (
    "none",
    "reduce_load",
    "check_workload",
    "reset_device",
    "reboot_node",
    "update_firmware",
    "replace_device",
)

#: What a verdict is about (contract section 4, added 2026-12-03), ``device`` when absent: the device
#: itself; ``workload``: what runs on it (a job's crash on every GPU it held); ``node``: what the node's
#: devices share (power, cooling, the host); ``link``: a PCIe switch or fabric a group shares; ``firmware``:
#: a firmware version, across the fleet.
SCOPES: tuple[str, ...] = ("device", "workload", "node", "link", "firmware")


def pcie_group(upstream: str) -> str:
    """The ``group`` of a finding about a PCIe switch or root port (``hw.pcie.upstream``): ``pcie/0000:40:00.0``.
    Addresses repeat across nodes: the verdict's ``k8s.node.name`` says which node's."""
    return f"pcie/{upstream}"


def fabric_group(fabric: str) -> str:
    """The ``group`` of a finding about a device-to-device fabric (``hw.fabric.id``): ``fabric/<id>``."""
    return f"fabric/{fabric}"


def firmware_group(model: str, version: str) -> str:
    """The ``group`` of a finding about a firmware version of a model (contract §4's example):
    ``firmware/NVIDIA H100 80GB HBM3/96.00.89.00.01``."""
    return f"firmware/{model}/{version}"


#: ``hw.throttle.reason`` values (contract section 2): why a device's clocks were held down.
#: ``power`` is a power cap whose cause was not reported, read as ``power_cap``.
THROTTLE_REASONS: tuple[str, ...] = ("thermal", "power", "power_cap", "power_brake", "hw_slowdown", "other")

#: Health as the kubelet knows it (KEP-4680).
HEALTH: tuple[str, ...] = ("Healthy", "Unhealthy", "Unknown")

#: Upstream ``hw.state`` values, taken from the semantic-conventions package.
HW_STATES: tuple[str, ...] = tuple(s.value for s in HwStateValues)

#: ``hw.type`` values of sensor components: folded into their parent device.
SENSOR_TYPES: frozenset[str] = frozenset({"temperature", "fan", "voltage"})

#: How several nodes' views of one shared (network-attached) device combine into its verdict.
COMBINE_MODES: tuple[str, ...] = ("any", "majority", "all")
#: The default policy's choice (``shared_devices.combine``), and what a sink given none assumes.
DEFAULT_COMBINE = COMBINE_MODES[0]
