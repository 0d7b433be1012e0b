"""The device models of a scenario fleet: what each one reports and how it behaves, as data.

Why a catalogue: a real fleet mixes models whose limits, background error rates and sensors
differ (an MI300X's corrected-ECC background would be a storm on an A100), so every
per-device parameter of the generator is drawn from its model here, never from one global
constant. One model reports no ``*.limit`` series at all, so that the classifier's policy
fallbacks are what judges it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from otel_dra.scenario.series import (
    AMD_THROTTLE_REASONS,
    BUSY_THROTTLE_REASONS,
    COMMON_KEYS,
    SERIES_KEYS,
    STATUS_KEYS,
)

#: The default policy's fallbacks (policy/default.yaml: rules.thermal.fallback_limits and
#: rules.cooling.min_rpm / min_ratio). A model without limits is judged against these, so its
#: labels (the crossing times of thermal drift and fan decay) are too. A test keeps them in step.
FALLBACK_TEMP_LIMITS: Final = MappingProxyType({"high.degraded": 85.0, "high.critical": 92.0})
FALLBACK_FAN_MIN_RPM: Final = 300.0
FALLBACK_FAN_MIN_RATIO: Final = 0.05


@dataclass(frozen=True)
class DeviceModel:
    """What one GPU model reports and how it behaves (limits, power, thermals, background rates)."""

    model: str
    vendor: str
    dra_driver: str
    firmwares: tuple[str, ...]  # newest first: a rollout, most devices on the newest, some still on older ones
    driver_version: str
    serial_prefix: str
    temp_limits: Mapping[str, float]  # reported hw.temperature.limit by hw.limit_type; empty: none reported
    throttle_c: float  # where the device's clocks start to throttle, reported or not
    fan: str  # "rpm": hw.fan.speed (with its limits when reported); "ratio": hw.fan.speed_ratio only
    fan_max_rpm: float
    fan_limits: Mapping[str, float]  # low.degraded / low.critical, rpm; empty: none reported
    power_idle_w: float
    power_cap_w: float
    thermal_c_per_w: float  # steady-state temperature rise per watt at nominal airflow
    thermal_tau_s: float
    memory_bytes: float
    pcie_gen: float
    pcie_width: float
    volt_nominal: float
    volt_limits: Mapping[str, float]
    corrected_per_min: float  # median background of corrected ECC errors
    link_per_min: Mapping[str, float]  # background link errors by hw.link.type
    io_bytes_per_s: float
    reports_limits: bool = True
    #: Each firmware's share of the model's devices (a rollout). The first share is the draw that chose the
    #: newest before there were three versions: a device's draw under 0.8 still gets it.
    firmware_shares: tuple[float, ...] = (0.8, 0.2)

    def firmware_for(self, draw: float) -> str:
        """The firmware of a device whose uniform draw is ``draw`` (the shares, cumulated)."""
        edge = 0.0
        for version, share in zip(self.firmwares, self.firmware_shares, strict=True):
            edge += share
            if draw < edge:
                return version
        return self.firmwares[-1]

    @property
    def series(self) -> tuple[str, ...]:
        """The series keys a device of this model reports (~25-37)."""
        keys = [*COMMON_KEYS, *(f"err.link.{link}" for link in self.link_per_min)]
        keys.append("fan.speed" if self.fan == "rpm" else "fan.ratio")
        if self.reports_limits:
            keys += [f"temp.limit.{k}" for k in self.temp_limits]
            keys += [f"fan.limit.{k}" for k in self.fan_limits]
            keys += [f"volt.limit.{k}" for k in self.volt_limits]
            keys += ["power.limit.max", "mem.limit", "pcie.width.limit", "pcie.gen.limit"]
        return tuple(k for k in SERIES_KEYS if k in keys)

    def series_under_load(self) -> tuple[str, ...]:
        """:attr:`series` of a device in a busy fleet: its throttle causes told apart instead of ``power``
        (NVIDIA: ``power_cap``, ``power_brake``, ``hw_slowdown``; AMD: no ``power_brake``)."""
        reasons = BUSY_THROTTLE_REASONS if self.vendor == "NVIDIA" else AMD_THROTTLE_REASONS
        keys = [k for k in self.series if k != "throttle.power"]
        keys += [f"throttle.{reason}" for reason in reasons]
        return tuple(k for k in SERIES_KEYS if k in keys)

    @property
    def temp_degraded_c(self) -> float:
        """The high.degraded limit the device is judged by: its own, else the policy's fallback."""
        return float(self.temp_limits.get("high.degraded", FALLBACK_TEMP_LIMITS["high.degraded"]))

    @property
    def temp_critical_c(self) -> float:
        return float(self.temp_limits.get("high.critical", FALLBACK_TEMP_LIMITS["high.critical"]))

    @property
    def fan_floor(self) -> float:
        """The fan reading (in its own unit: rpm or ratio) below which cooling is judged failing."""
        if self.fan == "rpm":
            return float(self.fan_limits.get("low.degraded", FALLBACK_FAN_MIN_RPM))
        return FALLBACK_FAN_MIN_RATIO

    @property
    def fan_floor_ratio(self) -> float:
        """:attr:`fan_floor` as a share of the fan's full speed."""
        return self.fan_floor / self.fan_max_rpm if self.fan == "rpm" else self.fan_floor


_V = MappingProxyType({"low.critical": 0.80, "high.critical": 1.00})

H100 = DeviceModel(
    model="H100 80GB HBM3",
    vendor="NVIDIA",
    dra_driver="gpu.nvidia.com",
    firmwares=("96.00.99.00.01", "96.00.89.00.01", "96.00.74.00.0F"),
    driver_version="580.95.05",
    serial_prefix="1654923",
    temp_limits=MappingProxyType({"high.degraded": 85.0, "throttled": 88.0, "high.critical": 92.0}),
    throttle_c=88.0,
    fan="rpm",
    fan_max_rpm=9000.0,
    fan_limits=MappingProxyType({"low.degraded": 1500.0, "low.critical": 800.0}),
    power_idle_w=70.0,
    power_cap_w=700.0,
    thermal_c_per_w=0.066,
    thermal_tau_s=30.0,
    memory_bytes=80.0 * 2**30,
    pcie_gen=5.0,
    pcie_width=16.0,
    volt_nominal=0.90,
    volt_limits=_V,
    corrected_per_min=0.4,
    link_per_min=MappingProxyType({"pcie": 0.05, "nvlink": 0.02}),
    io_bytes_per_s=25e9,
    firmware_shares=(0.8, 0.12, 0.08),
)
A100 = DeviceModel(
    model="A100-SXM4-80GB",
    vendor="NVIDIA",
    dra_driver="gpu.nvidia.com",
    firmwares=("92.00.45.00.06", "92.00.36.00.02", "92.00.25.00.08"),
    driver_version="580.95.05",
    serial_prefix="1323021",
    temp_limits=MappingProxyType({"high.degraded": 83.0, "high.critical": 90.0}),
    throttle_c=87.0,
    fan="ratio",
    fan_max_rpm=7000.0,
    fan_limits=MappingProxyType({}),
    power_idle_w=55.0,
    power_cap_w=400.0,
    thermal_c_per_w=0.11,
    thermal_tau_s=35.0,
    memory_bytes=80.0 * 2**30,
    pcie_gen=4.0,
    pcie_width=16.0,
    volt_nominal=0.85,
    volt_limits=MappingProxyType({"low.critical": 0.75, "high.critical": 0.95}),
    corrected_per_min=0.1,
    link_per_min=MappingProxyType({"pcie": 0.03, "nvlink": 0.01}),
    io_bytes_per_s=16e9,
    firmware_shares=(0.8, 0.12, 0.08),
)
MI300X = DeviceModel(
    model="Instinct MI300X",
    vendor="AMD",
    dra_driver="gpu.amd.com",
    firmwares=("113-M3000100-102", "113-M3000100-101"),
    driver_version="6.10.5",
    serial_prefix="PCB05",
    temp_limits=MappingProxyType({"high.degraded": 95.0, "high.critical": 105.0}),
    throttle_c=100.0,
    fan="rpm",
    fan_max_rpm=8000.0,
    fan_limits=MappingProxyType({"low.degraded": 1200.0, "low.critical": 600.0}),
    power_idle_w=120.0,
    power_cap_w=750.0,
    thermal_c_per_w=0.075,
    thermal_tau_s=40.0,
    memory_bytes=192.0 * 2**30,
    pcie_gen=5.0,
    pcie_width=16.0,
    volt_nominal=0.90,
    volt_limits=_V,
    corrected_per_min=5.0,
    link_per_min=MappingProxyType({"pcie": 0.05, "xgmi": 3.0}),
    io_bytes_per_s=30e9,
)
L40S = DeviceModel(
    model="L40S",
    vendor="NVIDIA",
    dra_driver="gpu.nvidia.com",
    firmwares=("95.02.66.00.02", "95.02.5D.00.01"),
    driver_version="580.95.05",
    serial_prefix="1325123",
    temp_limits=MappingProxyType({}),
    throttle_c=89.0,
    fan="ratio",
    fan_max_rpm=5000.0,
    fan_limits=MappingProxyType({}),
    power_idle_w=35.0,
    power_cap_w=350.0,
    thermal_c_per_w=0.12,
    thermal_tau_s=25.0,
    memory_bytes=48.0 * 2**30,
    pcie_gen=4.0,
    pcie_width=16.0,
    volt_nominal=0.88,
    volt_limits=MappingProxyType({}),
    corrected_per_min=0.2,
    link_per_min=MappingProxyType({"pcie": 0.05}),
    io_bytes_per_s=12e9,
    reports_limits=False,
)

#: Every GPU model, and the share of a mixed fleet's nodes each gets.
MODELS: Final[tuple[DeviceModel, ...]] = (H100, A100, MI300X, L40S)
MIX: Final[Mapping[str, float]] = MappingProxyType(
    {H100.model: 0.35, A100.model: 0.25, MI300X.model: 0.2, L40S.model: 0.2}
)


@dataclass(frozen=True)
class NetworkModel:
    """The network-attached device several nodes report (a shared NIC)."""

    model: str = "ConnectX-7"
    vendor: str = "NVIDIA"
    dra_driver: str = "nic.nvidia.com"
    firmware: str = "28.39.1002"
    driver_version: str = "24.10-1.1.4"
    series: tuple[str, ...] = (*STATUS_KEYS, "err.link.other", "temp.board")
    link_per_min: float = 0.2


NIC = NetworkModel()
