"""Metric and attribute names the project emits.

Upstream ``hw.*`` metrics are read from ``opentelemetry-semantic-conventions``
(their factory functions are run against a recorder, so name, unit, description
and instrument kind come from the package, never retyped). Project extensions are
declared here and registered in ``semconv/registry.yaml``; a test keeps the two
in step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.semconv._incubating.attributes import hw_attributes as hw
from opentelemetry.semconv._incubating.attributes.network_attributes import (
    NETWORK_IO_DIRECTION,
)
from opentelemetry.semconv._incubating.metrics import hw_metrics
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.k8s_attributes import K8S_NODE_NAME
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME

# Attribute names: upstream ones re-exported from the package, extensions defined here.
HW_ID: Final = hw.HW_ID
HW_TYPE: Final = hw.HW_TYPE
HW_PARENT: Final = hw.HW_PARENT
HW_NAME: Final = hw.HW_NAME
HW_VENDOR: Final = hw.HW_VENDOR
HW_MODEL: Final = hw.HW_MODEL
HW_SERIAL_NUMBER: Final = hw.HW_SERIAL_NUMBER
HW_FIRMWARE_VERSION: Final = hw.HW_FIRMWARE_VERSION
HW_DRIVER_VERSION: Final = hw.HW_DRIVER_VERSION
HW_STATE: Final = hw.HW_STATE
HW_LIMIT_TYPE: Final = hw.HW_LIMIT_TYPE
HW_SENSOR_LOCATION: Final = hw.HW_SENSOR_LOCATION
HW_GPU_TASK: Final = hw.HW_GPU_TASK
ERROR_TYPE_ATTR: Final = ERROR_TYPE
NETWORK_IO_DIRECTION_ATTR: Final = NETWORK_IO_DIRECTION
K8S_NODE_NAME_ATTR: Final = K8S_NODE_NAME
SERVICE_NAME_ATTR: Final = SERVICE_NAME

# Project extension attributes (registered in semconv/registry.yaml).
HW_LINK_TYPE: Final = "hw.link.type"
HW_ERROR_CODE: Final = "hw.error.code"
HW_THROTTLE_REASON: Final = "hw.throttle.reason"
#: Topology (issue #31): where the device sits, so a fault of what it shares is found once. The device's own
#: PCI address (``0000:41:00.0``); the PCIe switch or root port above it, by its upstream port's address (the
#: devices behind one switch share it); the device-to-device fabric it belongs to (an NVLink fabric's cluster UUID
#: and clique, an AMD xGMI hive).
HW_PCIE_ADDRESS: Final = "hw.pcie.address"
HW_PCIE_UPSTREAM: Final = "hw.pcie.upstream"
HW_FABRIC_ID: Final = "hw.fabric.id"
DRA_DRIVER_NAME: Final = "dra.driver.name"
DRA_POOL_NAME: Final = "dra.pool.name"
DRA_DEVICE_NAME: Final = "dra.device.name"
DRA_DEVICE_HEALTH_STATE: Final = "dra.device.health.state"
DRA_DEVICE_HEALTH_REASONS: Final = "dra.device.health.reasons"
DRA_DEVICE_HEALTH_REMEDIATION: Final = "dra.device.health.remediation"
DRA_DEVICE_HEALTH_SCOPE: Final = "dra.device.health.scope"
DRA_DEVICE_HEALTH_GROUP: Final = "dra.device.health.group"
DRA_DEVICE_VIEW_NODE: Final = "dra.device.view.node"

#: Resource attribute: the source the agent samples (``simulated``, ``nvml``, ``sysfs``), so pretend GPUs
#: can never pass for real ones on a dashboard.
OTEL_DRA_SOURCE: Final = "otel_dra.source"

#: The instrumentation scope of everything an otel-dra agent emits. Its ``hw.status`` is a verdict,
#: not a device's own report: a fleet reading agents' telemetry must not take it as input.
AGENT_SCOPE: Final = "otel_dra"

#: Instrument kinds as the semantic-conventions model names them.
COUNTER: Final = "counter"
UPDOWNCOUNTER: Final = "updowncounter"
GAUGE: Final = "gauge"


@dataclass(frozen=True)
class MetricSpec:
    """What one metric is: the facts an instrument is created from."""

    name: str
    unit: str
    instrument: str  # counter | updowncounter | gauge
    description: str
    origin: str  # upstream | extension


_FACTORY_KINDS: dict[str, str] = {
    "create_counter": COUNTER,
    "create_observable_counter": COUNTER,
    "create_up_down_counter": UPDOWNCOUNTER,
    "create_observable_up_down_counter": UPDOWNCOUNTER,
    "create_gauge": GAUGE,
    "create_observable_gauge": GAUGE,
}


class _SpecRecorder:
    """A stand-in Meter that records what a semconv factory asks to create."""

    def __getattr__(self, method: str) -> Callable[..., MetricSpec]:
        kind = _FACTORY_KINDS[method]

        def record(name: str, *args: Any, unit: str = "", description: str = "", **_: Any) -> MetricSpec:
            return MetricSpec(name, unit, kind, description, "upstream")

        return record


def upstream(factory: Callable[..., Any]) -> MetricSpec:
    """The spec of an upstream metric, read from its semconv factory function."""
    recorder = _SpecRecorder()
    try:
        return factory(recorder)
    except TypeError:  # asynchronous factories take a callbacks argument
        return factory(recorder, None)


def _extension(name: str, unit: str, instrument: str, description: str) -> MetricSpec:
    return MetricSpec(name, unit, instrument, description, "extension")


HW_STATUS = upstream(hw_metrics.create_hw_status)
HW_ERRORS = upstream(hw_metrics.create_hw_errors)
HW_TEMPERATURE = upstream(hw_metrics.create_hw_temperature)
HW_TEMPERATURE_LIMIT = upstream(hw_metrics.create_hw_temperature_limit)
HW_FAN_SPEED = upstream(hw_metrics.create_hw_fan_speed)
HW_FAN_SPEED_LIMIT = upstream(hw_metrics.create_hw_fan_speed_limit)
HW_FAN_SPEED_RATIO = upstream(hw_metrics.create_hw_fan_speed_ratio)
HW_POWER = upstream(hw_metrics.create_hw_power)
HW_ENERGY = upstream(hw_metrics.create_hw_energy)
HW_VOLTAGE = upstream(hw_metrics.create_hw_voltage)
HW_VOLTAGE_LIMIT = upstream(hw_metrics.create_hw_voltage_limit)
HW_GPU_UTILIZATION = upstream(hw_metrics.create_hw_gpu_utilization)
HW_GPU_MEMORY_USAGE = upstream(hw_metrics.create_hw_gpu_memory_usage)
HW_GPU_MEMORY_LIMIT = upstream(hw_metrics.create_hw_gpu_memory_limit)
HW_GPU_MEMORY_UTILIZATION = upstream(hw_metrics.create_hw_gpu_memory_utilization)
HW_GPU_IO = upstream(hw_metrics.create_hw_gpu_io)

HW_POWER_LIMIT = _extension("hw.power.limit", "W", GAUGE, "Power cap of the device.")
HW_THROTTLE_TIME = _extension(
    "hw.throttle.time", "s", COUNTER, "Time the device ran throttled (clocks held down), by reason."
)
HW_PCIE_LINK_WIDTH = _extension("hw.pcie.link.width", "{lane}", GAUGE, "Negotiated PCIe link width.")
HW_PCIE_LINK_WIDTH_LIMIT = _extension(
    "hw.pcie.link.width.limit", "{lane}", GAUGE, "Maximum PCIe link width of the device."
)
HW_PCIE_LINK_GENERATION = _extension("hw.pcie.link.generation", "1", GAUGE, "Negotiated PCIe link generation.")
HW_PCIE_LINK_GENERATION_LIMIT = _extension(
    "hw.pcie.link.generation.limit", "1", GAUGE, "Maximum PCIe link generation of the device."
)

DRA_DEVICE_HEALTH = _extension(
    "dra.device.health",
    "1",
    GAUGE,
    "Derived device health, info-style: value 1, the verdict in the attributes "
    "(dra.device.health.state, .reasons, .remediation).",
)

DRA_DEVICE_VIEW_DISAGREEMENT = _extension(
    "dra.device.view.disagreement",
    "1",
    GAUGE,
    "1 when this node's view of a device seen from several nodes disagrees with the combined verdict.",
)

DRA_KUBELET_DEVICES_UNIDENTIFIED = _extension(
    "dra.kubelet.devices.unidentified",
    "{device}",
    GAUGE,
    "Devices left out of the kubelet health stream because their verdict lacks dra.pool.name or dra.device.name.",
)
DRA_KUBELET_WATCHERS = _extension(
    "dra.kubelet.watchers",
    "{stream}",
    GAUGE,
    "Open DRAResourceHealth.NodeWatchResources streams (the kubelet holds one per registered plugin).",
)

#: Every metric the agent can emit, by name.
METRICS: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        HW_STATUS,
        HW_ERRORS,
        HW_TEMPERATURE,
        HW_TEMPERATURE_LIMIT,
        HW_FAN_SPEED,
        HW_FAN_SPEED_LIMIT,
        HW_FAN_SPEED_RATIO,
        HW_POWER,
        HW_ENERGY,
        HW_VOLTAGE,
        HW_VOLTAGE_LIMIT,
        HW_GPU_UTILIZATION,
        HW_GPU_MEMORY_USAGE,
        HW_GPU_MEMORY_LIMIT,
        HW_GPU_MEMORY_UTILIZATION,
        HW_GPU_IO,
        HW_POWER_LIMIT,
        HW_THROTTLE_TIME,
        HW_PCIE_LINK_WIDTH,
        HW_PCIE_LINK_WIDTH_LIMIT,
        HW_PCIE_LINK_GENERATION,
        HW_PCIE_LINK_GENERATION_LIMIT,
        DRA_DEVICE_HEALTH,
        DRA_DEVICE_VIEW_DISAGREEMENT,
        DRA_KUBELET_DEVICES_UNIDENTIFIED,
        DRA_KUBELET_WATCHERS,
    )
}

# The fleet's OTLP receiver (not emitted by node agents).
OTEL_DRA_RECEIVER_REQUESTS = _extension(
    "otel_dra.receiver.requests",
    "{request}",
    COUNTER,
    "OTLP metrics export requests received, by transport (grpc, http) and outcome "
    "(ok, partial, invalid, too_large, error, overloaded, unauthenticated: no bearer token or a wrong one).",
)
OTEL_DRA_RECEIVER_POINTS = _extension(
    "otel_dra.receiver.points",
    "{point}",
    COUNTER,
    "Data points in OTLP metrics export requests that were decoded, by outcome (accepted into frames, rejected, "
    "ignored: otel-dra's own telemetry in an agent's push, such as its otel_dra.push.* queue metrics).",
)
OTEL_DRA_RECEIVER_REFUSED = _extension(
    "otel_dra.receiver.refused",
    "{point}",
    COUNTER,
    "Data points refused past a cardinality or size limit, or for a node the client may not report for, by reason "
    "(forbidden_node, node_name, nodes, devices, devices_per_node, series, attribute_length); also counted as "
    "rejected.",
)
OTEL_DRA_RECEIVER_CLOCK_SKEW = _extension(
    "otel_dra.receiver.clock_skew",
    "{point}",
    COUNTER,
    "Data points of nodes whose clock jumped, by direction (ahead: more than --max-future ahead of the fleet's "
    "clock, refused and also counted as rejected; behind: more than a minute behind what was read for their "
    "series, taken and their series restarted).",
)
OTEL_DRA_RECEIVER_ATTRIBUTES_IGNORED = _extension(
    "otel_dra.receiver.attributes.ignored",
    "{point}",
    COUNTER,
    "Data points taken that carried attributes otel-dra does not read (not the device's identity, its descriptive "
    "attributes or the metric's series attributes): those attributes were ignored and made no series.",
)
OTEL_DRA_RECEIVER_CONNECTIONS = _extension(
    "otel_dra.receiver.connections",
    "{connection}",
    GAUGE,
    "Connections open to the OTLP/HTTP receiver (bounded by --max-connections).",
)
# The cluster writer's brake on mass quarantine (otel_dra/sinks/k8s/brake.py).
OTEL_DRA_K8S_BRAKE_TRIPPED = _extension(
    "otel_dra.k8s.brake.tripped",
    "1",
    GAUGE,
    "1 while the cluster writer's brake on mass quarantine holds (a batch of new acting taints went past "
    "kubernetes.budget): new NoSchedule and NoExecute taints are written with effect None until it is released.",
)
OTEL_DRA_K8S_BRAKE_WITHHELD = _extension(
    "otel_dra.k8s.brake.withheld",
    "{rule}",
    GAUGE,
    "DeviceTaintRules the cluster writer's last apply wrote with a milder effect than rendered, because the brake "
    "on mass quarantine held.",
)
#: What became of the pods on a tainted device, by what the cluster's device-taint controller said (Kubernetes
#: 1.35+ DeviceTaintRule status): ``would`` (a rule with effect None: what NoExecute would evict), ``pending``,
#: ``evicted``.
EVICTION_ATTR: Final = "eviction"
OTEL_DRA_K8S_TAINT_PODS = _extension(
    "otel_dra.k8s.taint.pods",
    "{pod}",
    GAUGE,
    "Pods on a device with a DeviceTaintRule, as the cluster's device-taint controller reported them in the rule's "
    "EvictionInProgress condition: those NoExecute would evict (eviction=would, for effect None), those waiting to "
    "be evicted (pending) and those it evicted (evicted).",
)

#: Metrics only `otel-dra fleet` emits, by name.
FLEET_METRICS: dict[str, MetricSpec] = {
    s.name: s
    for s in (
        OTEL_DRA_RECEIVER_REQUESTS,
        OTEL_DRA_RECEIVER_POINTS,
        OTEL_DRA_RECEIVER_REFUSED,
        OTEL_DRA_RECEIVER_CLOCK_SKEW,
        OTEL_DRA_RECEIVER_ATTRIBUTES_IGNORED,
        OTEL_DRA_RECEIVER_CONNECTIONS,
        OTEL_DRA_K8S_BRAKE_TRIPPED,
        OTEL_DRA_K8S_BRAKE_WITHHELD,
        OTEL_DRA_K8S_TAINT_PODS,
    )
}

# The agent's OTLP push (its sending queue: otel_dra/sinks/sending_queue.py).
PUSH_OUTCOME: Final = "outcome"
OTEL_DRA_PUSH_QUEUE_SIZE = _extension(
    "otel_dra.push.queue.size",
    "{point}",
    GAUGE,
    "Data points waiting in the OTLP push's sending queue (collections the collector has not taken yet).",
)
OTEL_DRA_PUSH_POINTS = _extension(
    "otel_dra.push.points",
    "{point}",
    COUNTER,
    "Data points the OTLP push has handled, by outcome (sent: the collector took them; dropped: older than "
    "the queue's max age, or past its size, while the collector was unreachable).",
)
#: Metrics of the agent's OTLP push, by name (only while a push endpoint is set).
PUSH_METRICS: dict[str, MetricSpec] = {s.name: s for s in (OTEL_DRA_PUSH_QUEUE_SIZE, OTEL_DRA_PUSH_POINTS)}

#: Metrics sampled from devices (what sources and decoders carry, as frame columns); the rest are derived
#: by the agent (verdicts, views, the kubelet stream).
SAMPLED_METRICS: frozenset[str] = frozenset(name for name in METRICS if name.startswith("hw."))

#: The attributes that tell a sampled metric's series apart on one device (a frame column each: the contract's
#: "attributes that matter", telemetry.md §2), besides the device's identity (hw.id, hw.type, hw.parent) and its
#: descriptive attributes; semconv/registry.yaml lists the same per metric (a test keeps them in step). The set is
#: closed: any other attribute of a point is ignored by the decoders (the point is taken), so a client can't make a
#: column, and the arrays behind it, per attribute it invents. A metric not named here has none.
SERIES_ATTRIBUTES: dict[str, frozenset[str]] = {
    HW_STATUS.name: frozenset({HW_STATE}),
    HW_ERRORS.name: frozenset({ERROR_TYPE_ATTR, HW_LINK_TYPE, HW_ERROR_CODE}),
    HW_TEMPERATURE.name: frozenset({HW_SENSOR_LOCATION}),
    HW_TEMPERATURE_LIMIT.name: frozenset({HW_SENSOR_LOCATION, HW_LIMIT_TYPE}),
    HW_FAN_SPEED_LIMIT.name: frozenset({HW_LIMIT_TYPE}),
    HW_VOLTAGE_LIMIT.name: frozenset({HW_LIMIT_TYPE}),
    HW_GPU_UTILIZATION.name: frozenset({HW_GPU_TASK}),
    HW_GPU_IO.name: frozenset({NETWORK_IO_DIRECTION_ATTR}),
    HW_POWER_LIMIT.name: frozenset({HW_LIMIT_TYPE}),
    HW_THROTTLE_TIME.name: frozenset({HW_THROTTLE_REASON}),
    HW_PCIE_LINK_WIDTH_LIMIT.name: frozenset({HW_LIMIT_TYPE}),
    HW_PCIE_LINK_GENERATION_LIMIT.name: frozenset({HW_LIMIT_TYPE}),
}

#: Metrics every device has (the disagreement gauge exists only for devices seen from several nodes; the
#: kubelet stream's gauges describe the agent, not a device).
PER_DEVICE_METRICS: frozenset[str] = frozenset(METRICS) - {
    DRA_DEVICE_VIEW_DISAGREEMENT.name,
    DRA_KUBELET_DEVICES_UNIDENTIFIED.name,
    DRA_KUBELET_WATCHERS.name,
}
