"""The catalogue of a scenario's faults and traps: what each kind asks of a classifier and where it can go.

Why a table of its own: the planner places them, the labels write them and the fleet-size check counts
them; one catalogue keeps the three in step. A fault kind is data (reasons, severity, deadline and where
it may occur); how it is simulated is :mod:`otel_dra.scenario.fault_builders`' table, by the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: One instance of every fault kind and trap per this many GPUs (at least one each).
GPUS_PER_COPY: Final = 170


@dataclass(frozen=True)
class FaultKind:
    """A kind of fault: what a classifier must answer (reasons, by when) and where it can occur."""

    name: str
    reasons: tuple[str, ...]
    severity: str  # hard | soft
    deadline_s: int
    intermittent: bool = False
    nvidia_only: bool = False  # NVIDIA XIDs
    needs_limits: bool = False  # judged against a reported *.limit series
    low_rate_only: bool = False  # a cohort outlier hides below a fixed threshold only on low-rate models
    busy_only: bool = False  # placed only in busy load profiles (it shows only under load)
    whole_node: bool = False  # on every GPU of one node at once, one label per GPU
    scope: str | None = None  # the verdict scope that catches it (absent: any); group names what it is
    #: On the GPUs that share a part (``pcie``: a switch, ``fabric``: an NVLink fabric, one label per GPU;
    #: ``firmware``: a firmware version, one label listing its GPUs), placed by :mod:`fault_groups`.
    shared: str | None = None
    link: str | None = None  # the device must have this link type (models.DeviceModel.link_per_min)
    big_fleet: bool = False  # only in fleets of TOPOLOGY_MIN_GPUS or more (see kinds_for)
    to_end: bool = False  # the deadline is the end of the recording (a fleet-wide rate takes the run to tell)


FAULT_KINDS: Final[tuple[FaultKind, ...]] = (
    FaultKind("ecc_uncorrected", ("memory_ecc",), "hard", 60),
    FaultKind("xid_dbe", ("driver_errors", "memory_ecc"), "hard", 60, nvidia_only=True),
    FaultKind("fell_off_bus", ("driver_errors", "device_lost"), "hard", 60, nvidia_only=True),
    FaultKind("device_lost", ("device_lost",), "hard", 150),
    FaultKind("vendor_failed", ("vendor_status",), "hard", 60),
    FaultKind("ecc_corrected_storm", ("memory_ecc",), "soft", 900),
    FaultKind("ecc_cohort_outlier", ("memory_ecc",), "soft", 1800, low_rate_only=True),
    FaultKind("thermal_drift", ("thermal",), "soft", 900),
    FaultKind("fan_decay", ("cooling", "thermal"), "soft", 900),
    FaultKind("power_throttling", ("power_throttling",), "soft", 900),
    FaultKind("power_delivery", ("power_delivery",), "soft", 900),
    FaultKind("link_degraded", ("link",), "soft", 900, needs_limits=True, scope="device"),
    FaultKind("memory_pressure", ("memory_pressure",), "soft", 900),
    FaultKind("app_errors_repeated", ("driver_errors",), "soft", 900, nvidia_only=True),
    FaultKind("device_resets", ("device_reset",), "soft", 1800),
    FaultKind("fan_stall_intermittent", ("cooling", "thermal"), "soft", 900, intermittent=True),
    FaultKind("thermal_intermittent", ("thermal",), "soft", 900, intermittent=True),
    FaultKind("link_bursts_intermittent", ("link",), "soft", 900, intermittent=True, scope="device"),
    FaultKind("power_throttling_intermittent", ("power_throttling",), "soft", 900, intermittent=True),
    # Only under load (--load training|inference|mixed): a GPU hotter than its peers at the same load, a node's
    # power brake on all its GPUs (the node's power, not the GPUs), a GPU's own hardware slowdown.
    FaultKind("hot_gpu", ("thermal",), "soft", 900, busy_only=True),
    FaultKind(
        "node_power_brake",
        ("power_delivery",),
        "soft",
        900,
        nvidia_only=True,
        busy_only=True,
        whole_node=True,
        scope="node",
    ),
    FaultKind("hw_slowdown", ("thermal",), "soft", 900, nvidia_only=True, busy_only=True),
    # Shared parts (issue #31): the GPUs behind one PCIe switch, or of one NVLink fabric, show link evidence
    # together; the same evidence on one GPU alone is the GPU's own (scope device, as the lone link kinds
    # above). Delta study: 16% of NVLink errors touch several GPUs at once, 5% four or more, so a multi-GPU
    # fabric fault and a lone one both occur. XID 74 is NVIDIA's NVLink error (XID catalogue). A firmware
    # version whose devices fall off the bus (XID 79) or time out their GSP RPC (XID 119) several times as
    # often as the model's other versions: remediation update_firmware for the version, never replace_device
    # per GPU (the seed thread's remediation ladder, vocabulary.REMEDIATIONS: least disruptive first,
    # replace_device last).
    FaultKind("pcie_switch", ("link",), "soft", 900, scope="link", shared="pcie", big_fleet=True),
    FaultKind(
        "fabric", ("link", "driver_errors"), "soft", 900, nvidia_only=True, scope="link", shared="fabric",
        link="nvlink", big_fleet=True,
    ),
    FaultKind(
        "nvlink_xid74", ("link", "driver_errors"), "soft", 900, nvidia_only=True, scope="device", link="nvlink",
        big_fleet=True,
    ),
    FaultKind(
        "firmware_version", ("firmware",), "soft", 0, nvidia_only=True, scope="firmware", shared="firmware",
        big_fleet=True, to_end=True,
    ),
)  # fmt: skip
KIND: Final = {k.name: k for k in FAULT_KINDS}
#: The shared-part kinds (a switch, a fabric, a lone XID 74, a bad firmware) need a fleet with several nodes
#: of each NVLink model and a firmware version with enough devices for its rate to stand out: the long form
#: (512 GPUs) has them; the short form (48 GPUs) is kept as it was.
TOPOLOGY_MIN_GPUS: Final = 256
#: The most fatal events a firmware fault puts in a run (the bad version's and the others' together).
FIRMWARE_EVENTS_MAX: Final = 23


def kinds_for(load: str, gpus: int = 0) -> tuple[FaultKind, ...]:
    """The fault kinds a fleet of ``gpus`` under ``load`` holds: the busy-only ones only under load, a hot GPU
    only where training jobs run (it is told from its peers at one steady load; see plan_load.hot_gpu), the
    shared-part kinds only in big fleets (TOPOLOGY_MIN_GPUS)."""
    return tuple(
        k
        for k in FAULT_KINDS
        if (load != "idle" or not k.busy_only)
        and (k.name != "hot_gpu" or load != "inference")
        and (gpus >= TOPOLOGY_MIN_GPUS or not k.big_fleet)
    )


#: Faults after which the device reports nothing more (Unknown or failed there is no surprise).
LOST_KINDS: Final = frozenset({"device_lost", "fell_off_bus"})
#: Traps on one device each (placed like faults), then the node-wide ones.
DEVICE_TRAPS: Final = (
    "temp_spike",
    "power_spike",
    "mem_spike",
    "single_app_error",
    "counter_reset",
    "missed_sample",
    "counter_history",
)
NODE_TRAPS: Final = ("agent_restart", "high_background_cohort", "one_missed_sample", "hot_plug")
#: Under load: a job that crashed (an application XID and an OOM on every GPU it held, in one second) and a job
#: that crash-looped. The workload's, not the devices': labelled node-wide, with the GPUs in their detail.
WORKLOAD_TRAPS: Final = ("job_crash", "crash_loop")
TRAP_KINDS: Final = (*DEVICE_TRAPS, *NODE_TRAPS, *WORKLOAD_TRAPS)


def copies_for(gpus: int) -> int:
    """How many instances of each fault kind and device trap a fleet of ``gpus`` gets."""
    return max(1, gpus // GPUS_PER_COPY)


def devices_needed(gpus: int, load: str = "idle", faults: bool = True, devices_per_node: int = 1) -> int:
    """GPUs a plan places something on (outside the silent and the restarted node). Under load, each copy
    also takes whole nodes: one for each node-wide fault kind and the crash-looping node."""
    kinds = kinds_for(load, gpus) if faults else ()
    # a switch takes its 2-4 GPUs, a fabric a node's; the firmware fault (one per fleet) its events' GPUs
    per_device = sum({"pcie": 4, "fabric": devices_per_node}.get(k.shared or "", 1) for k in kinds if not k.whole_node)
    per_device -= sum(1 for k in kinds if k.shared == "firmware")
    once = FIRMWARE_EVENTS_MAX if any(k.shared == "firmware" for k in kinds) else 0
    need = copies_for(gpus) * (per_device + len(DEVICE_TRAPS)) + 1 + once  # + the missed sample on a 60 s node
    if load != "idle":
        need += copies_for(gpus) * (sum(1 for k in kinds if k.whole_node) + 1) * devices_per_node
    return need
