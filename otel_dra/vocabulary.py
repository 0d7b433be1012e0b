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
