"""The figures of one scoring and the targets they are held to (see :mod:`otel_dra.scenario.score`).

Why apart from the scoring: the figures are what a scorer hands on (the table and JSON of ``otel-dra
score``, the benches' reports); how they are counted is the scorer's business.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Final

#: The silent node's devices must read Unknown this long after the silence starts.
SILENT_PROBE_S: Final = 150
# Targets (see passes()).
SOFT_TARGET: Final = 0.95
FP_TARGET: Final = 0.3
EXTRA_TARGET: Final = 0.1


@dataclass(frozen=True)
class Target:
    """One target: what it measures, the figure, the goal, and whether it was met."""

    name: str
    figure: str
    goal: str
    met: bool


@dataclass
class Score:
    """The figures of one scoring (``to_json`` for machines, ``targets`` for the verdict)."""

    hard_total: int = 0
    hard_detected: int = 0  # failed/Unhealthy with a matching reason within the deadline
    hard_missed: list[dict[str, Any]] = field(default_factory=list)  # kind, device, why
    soft_total: int = 0
    soft_detected: int = 0  # non-ok with a matching reason within the deadline
    soft_missed: list[dict[str, Any]] = field(default_factory=list)
    median_delay_s: dict[str, float | None] = field(default_factory=dict)  # hard, soft: from onset to the hit
    median_delay_by_kind_s: dict[str, float] = field(default_factory=dict)
    fp_episodes: int = 0  # non-ok episodes outside every fault window of their device
    device_hours: float = 0.0  # labelled devices x the recording's length
    fp_per_100_device_hours: float = 0.0
    fp_by_trap: dict[str, int] = field(default_factory=dict)  # per trap kind of the device ("none"); an
    # episode on a device with two trap kinds counts for both
    fp_examples: list[dict[str, Any]] = field(default_factory=list)
    fp_unhealthy_episodes: int = 0  # of fp_episodes: reached Unhealthy
    fp_degraded_episodes: int = 0  # of fp_episodes: degraded or predicted_failure only
    fp_unhealthy_per_100_device_hours: float = 0.0
    fp_degraded_per_100_device_hours: float = 0.0
    fp_by_reason: dict[str, int] = field(default_factory=dict)  # reason -> episodes carrying it
    fp_unhealthy_by_reason: dict[str, int] = field(default_factory=dict)
    workload_traps: int = 0  # job_crash and crash_loop traps in the labels
    workload_trap_devices: int = 0  # the GPUs they held
    workload_device_scoped_episodes: int = 0  # non-ok device-scoped episodes there, outside fault windows
    workload_device_scoped_devices: int = 0
    workload_scoped_episodes: int = 0  # episodes there of another scope (workload): right, not false
    workload_examples: list[dict[str, Any]] = field(default_factory=list)
    # Shared parts (labels with scope link / firmware; older labels have none and show no target for them).
    link_group_total: int = 0  # GPUs of switch and fabric faults (one label each)
    link_group_detected: int = 0  # scope link, the label's group, a matching reason, by the deadline
    lone_link_total: int = 0  # link faults of one GPU alone (labelled scope device)
    lone_link_detected: int = 0  # scope device, a matching reason, by the deadline
    firmware_devices_total: int = 0  # GPUs of bad firmware versions
    firmware_devices_detected: int = 0  # reason firmware, scope firmware, the version's group, by the deadline
    firmware_missed: list[dict[str, Any]] = field(default_factory=list)
    firmware_wrong_devices: int = 0  # GPUs outside every bad version named firmware (reason or scope)
    firmware_wrong_examples: list[dict[str, Any]] = field(default_factory=list)
    firmware_event_episodes: int = 0  # on a firmware fault's GPUs, with its or its events' reasons: not false
    group_fault_devices: int = 0  # GPUs of link, firmware and node faults (without a fault of their own)
    replace_on_group_devices: int = 0  # of those, GPUs ever given remediation replace_device
    replace_examples: list[dict[str, Any]] = field(default_factory=list)
    intermittent_faults: int = 0
    extra_episodes_per_intermittent: float = 0.0  # mean over intermittent faults of (episodes after onset - 1)
    extra_episodes_per_fault: float = 0.0  # the same over every fault
    spurious_unknown_devices: int = 0
    spurious_unknown_episodes: int = 0  # runs of Unknown outside the silent node's and lost devices' excuses
    final_unknown_devices: int = 0  # of those, devices whose last verdict is such an Unknown
    spurious_unknown_examples: list[dict[str, Any]] = field(default_factory=list)
    silent_node: str | None = None
    silent_node_devices: int = 0
    silent_node_unknown: int = 0  # Unknown SILENT_PROBE_S after the silence starts
    silent_node_unhealthy: int = 0  # devices Unhealthy at any time during the silence
    verdict_lines: int = 0
    bad_lines: int = 0  # not JSON, or not a verdict line (missing key, unknown health)
    devices_total: int = 0
    devices_with_verdicts: int = 0
    unlabelled_devices: int = 0  # verdicts for devices the labels don't list (their episodes are false)

    @property
    def soft_fraction(self) -> float:
        return self.soft_detected / self.soft_total if self.soft_total else 1.0

    def targets(self) -> list[Target]:
        """Every target, met or not (``passes`` lists the missed ones)."""
        silent = (
            Target("silent node: Unknown, never Unhealthy", "no silent node labelled", "all Unknown, 0 Unhealthy", True)
            if self.silent_node is None
            else Target(
                "silent node: Unknown, never Unhealthy",
                f"{self.silent_node_unknown}/{self.silent_node_devices} Unknown after {SILENT_PROBE_S} s, "
                f"{self.silent_node_unhealthy} Unhealthy",
                "all Unknown, 0 Unhealthy",
                self.silent_node_unknown == self.silent_node_devices and self.silent_node_unhealthy == 0,
            )
        )
        return [
            Target(
                "hard faults failed in time",
                f"{self.hard_detected}/{self.hard_total}",
                "all",
                self.hard_detected == self.hard_total,
            ),
            Target(
                "soft faults flagged in time",
                f"{self.soft_detected}/{self.soft_total} ({100 * self.soft_fraction:.1f}%)",
                f">= {100 * SOFT_TARGET:.0f}%",
                self.soft_fraction >= SOFT_TARGET,
            ),
            Target(
                "false-positive episodes per 100 device-hours",
                f"{self.fp_per_100_device_hours:.2f} ({self.fp_episodes} episodes in {self.device_hours:.0f} h)",
                f"<= {FP_TARGET}",
                self.fp_per_100_device_hours <= FP_TARGET,
            ),
            Target(
                "extra episodes per intermittent fault",
                f"{self.extra_episodes_per_intermittent:.2f} ({self.intermittent_faults} faults)",
                f"<= {EXTRA_TARGET}",
                self.extra_episodes_per_intermittent <= EXTRA_TARGET,
            ),
            Target(
                "spurious Unknown",
                f"{self.spurious_unknown_devices} devices, {self.spurious_unknown_episodes} episodes, "
                f"{self.final_unknown_devices} at the end",
                "0",
                self.spurious_unknown_episodes == 0 and self.final_unknown_devices == 0,
            ),
            silent,
            *self._shared_targets(),
            *(
                [
                    Target(
                        "workload traps with a device-scoped non-ok verdict",
                        f"{self.workload_device_scoped_episodes} episodes on {self.workload_device_scoped_devices} "
                        f"of {self.workload_trap_devices} GPUs ({self.workload_traps} crashed jobs)",
                        "0",
                        self.workload_device_scoped_episodes == 0,
                    )
                ]
                if self.workload_traps
                else []
            ),
        ]

    def _shared_targets(self) -> list[Target]:
        """The shared-part targets, each only where the labels hold such faults."""
        out = []
        if self.link_group_total:
            out.append(
                Target(
                    "link faults: every GPU scope link, its group, in time",
                    f"{self.link_group_detected}/{self.link_group_total}",
                    "all",
                    self.link_group_detected == self.link_group_total,
                )
            )
        if self.lone_link_total:
            out.append(
                Target(
                    "lone-GPU link faults: scope device, in time",
                    f"{self.lone_link_detected}/{self.lone_link_total}",
                    "all",
                    self.lone_link_detected == self.lone_link_total,
                )
            )
        if self.firmware_devices_total:
            out.append(
                Target(
                    "bad firmware: every GPU of the version scope firmware, its group, by the end",
                    f"{self.firmware_devices_detected}/{self.firmware_devices_total}",
                    "all",
                    self.firmware_devices_detected == self.firmware_devices_total,
                )
            )
            out.append(
                Target(
                    "GPUs named firmware outside a bad version",
                    str(self.firmware_wrong_devices),
                    "0",
                    self.firmware_wrong_devices == 0,
                )
            )
        if self.group_fault_devices:
            out.append(
                Target(
                    "replace_device on a GPU of a link, firmware or node fault",
                    f"{self.replace_on_group_devices} of {self.group_fault_devices} GPUs",
                    "0",
                    self.replace_on_group_devices == 0,
                )
            )
        return out

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["soft_fraction"] = round(self.soft_fraction, 4)
        doc["targets"] = [asdict(t) for t in self.targets()]
        doc["passed"] = not passes(self)
        return doc


def passes(score: Score) -> list[str]:
    """The targets ``score`` misses, one line each (empty: every target met)."""
    return [f"{t.name}: {t.figure} (target {t.goal})" for t in score.targets() if not t.met]
