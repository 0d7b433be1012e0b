"""The series a scenario device may report: one catalogue, each series with its metric and attributes.

Why a catalogue: the simulation's state is one matrix with a column per series kind (``KEY``), and a
line lists a device's series in one fixed order (``METRIC_ORDER``); which of them a device reports is its
model's business (:mod:`otel_dra.scenario.models`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from otel_dra import conventions as cv

#: Upstream hw.state values a device reports as input (one series each, 1 for the current one).
STATUS_STATES: Final = ("ok", "degraded", "failed", "predicted_failure")

#: ``error.type`` values of the device-wide error counters (link and driver errors have series of their own).
ERROR_TYPES: Final = ("corrected", "uncorrected", "retired_page", "reset", "power", "out_of_memory")
#: Metrics whose points carry ``asInt`` (counts and bytes); the rest carry ``asDouble``.
INT_METRICS: Final = frozenset(
    {
        cv.HW_STATUS.name,
        cv.HW_ERRORS.name,
        cv.HW_GPU_MEMORY_USAGE.name,
        cv.HW_GPU_MEMORY_LIMIT.name,
        cv.HW_GPU_IO.name,
    }
)


@dataclass(frozen=True)
class Series:
    """One kind of series a device may report, with the attributes that tell it apart."""

    key: str
    metric: str
    attrs: tuple[tuple[str, str], ...] = ()
    sensor: str | None = None  # "temp/gpu": the series is on a sensor component (hw.parent = the device)
    sensor_type: str | None = None
    decimals: int = 2  # asDouble precision in the file

    @property
    def spec(self) -> cv.MetricSpec:
        return cv.METRICS[self.metric]

    @property
    def is_sum(self) -> bool:
        return self.spec.instrument in (cv.COUNTER, cv.UPDOWNCOUNTER)

    @property
    def monotonic(self) -> bool:
        return self.spec.instrument == cv.COUNTER

    @property
    def as_int(self) -> bool:
        return self.metric in INT_METRICS


def _catalogue() -> tuple[Series, ...]:
    err, t, lim = cv.HW_ERRORS.name, cv.HW_TEMPERATURE.name, cv.HW_LIMIT_TYPE
    out: list[Series] = [Series(f"status.{s}", cv.HW_STATUS.name, ((cv.HW_STATE, s),)) for s in STATUS_STATES]
    for etype in ERROR_TYPES:
        out.append(Series(f"err.{etype}", err, ((cv.ERROR_TYPE_ATTR, etype),)))
    for link in ("pcie", "nvlink", "xgmi", "other"):
        out.append(Series(f"err.link.{link}", err, ((cv.ERROR_TYPE_ATTR, "link"), (cv.HW_LINK_TYPE, link))))
    for code in DRIVER_CODES:
        out.append(Series(f"err.driver.{code}", err, ((cv.ERROR_TYPE_ATTR, "driver"), (cv.HW_ERROR_CODE, code))))
    gpu_loc = ((cv.HW_SENSOR_LOCATION, "gpu"),)
    out.append(Series("temp.gpu", t, gpu_loc, "temp/gpu", "temperature"))
    for kind in ("high.degraded", "throttled", "high.critical"):
        out.append(
            Series(
                f"temp.limit.{kind}", cv.HW_TEMPERATURE_LIMIT.name, (*gpu_loc, (lim, kind)), "temp/gpu", "temperature"
            )
        )
    out.append(Series("temp.board", t, ((cv.HW_SENSOR_LOCATION, "board"),), "temp/board", "temperature"))
    out.append(Series("fan.speed", cv.HW_FAN_SPEED.name, (), "fan/0", "fan", 0))
    for kind in ("low.degraded", "low.critical"):
        out.append(Series(f"fan.limit.{kind}", cv.HW_FAN_SPEED_LIMIT.name, ((lim, kind),), "fan/0", "fan", 0))
    out.append(Series("fan.ratio", cv.HW_FAN_SPEED_RATIO.name, (), "fan/0", "fan", 4))
    out.append(Series("volt", cv.HW_VOLTAGE.name, (), "volt/core", "voltage", 4))
    for kind in ("low.critical", "high.critical"):
        out.append(Series(f"volt.limit.{kind}", cv.HW_VOLTAGE_LIMIT.name, ((lim, kind),), "volt/core", "voltage", 3))
    out += [
        Series("power", cv.HW_POWER.name, (), decimals=1),
        Series("power.limit.max", cv.HW_POWER_LIMIT.name, ((lim, "max"),), decimals=1),
        Series("energy", cv.HW_ENERGY.name, (), decimals=1),
        Series("throttle.thermal", cv.HW_THROTTLE_TIME.name, ((cv.HW_THROTTLE_REASON, "thermal"),), decimals=3),
        Series("throttle.power", cv.HW_THROTTLE_TIME.name, ((cv.HW_THROTTLE_REASON, "power"),), decimals=3),
        *(
            Series(f"throttle.{reason}", cv.HW_THROTTLE_TIME.name, ((cv.HW_THROTTLE_REASON, reason),), decimals=3)
            for reason in BUSY_THROTTLE_REASONS
        ),
        Series("util", cv.HW_GPU_UTILIZATION.name, ((cv.HW_GPU_TASK, "general"),), decimals=4),
        Series("mem.util", cv.HW_GPU_MEMORY_UTILIZATION.name, (), decimals=4),
        Series("mem.usage", cv.HW_GPU_MEMORY_USAGE.name),
        Series("mem.limit", cv.HW_GPU_MEMORY_LIMIT.name),
        Series("io.receive", cv.HW_GPU_IO.name, ((cv.NETWORK_IO_DIRECTION_ATTR, "receive"),)),
        Series("io.transmit", cv.HW_GPU_IO.name, ((cv.NETWORK_IO_DIRECTION_ATTR, "transmit"),)),
        Series("pcie.width", cv.HW_PCIE_LINK_WIDTH.name, (), decimals=0),
        Series("pcie.width.limit", cv.HW_PCIE_LINK_WIDTH_LIMIT.name, ((lim, "max"),), decimals=0),
        Series("pcie.gen", cv.HW_PCIE_LINK_GENERATION.name, (), decimals=0),
        Series("pcie.gen.limit", cv.HW_PCIE_LINK_GENERATION_LIMIT.name, ((lim, "max"),), decimals=0),
    ]
    return tuple(out)


#: Driver error codes the scenarios use (NVIDIA XID catalogue): 13 application (graphics engine exception),
#: 31 application (MMU fault), 43 application (GPU stopped processing), 48 double-bit ECC (reset class),
#: 74 NVLink error, 79 fallen off the bus (reboot class), 119 GSP RPC timeout (firmware; reset class).
DRIVER_CODES: Final = ("13", "31", "43", "48", "74", "79", "119")
#: ``hw.throttle.reason`` values a device reports in a busy fleet instead of ``power``, as the project's own
#: sources do: NVML tells the software power cap, an external power brake and the device's own hardware
#: slowdown apart; amdgpu's gpu_metrics (MI300) gives the power cap and hardware slowdown, no power brake.
BUSY_THROTTLE_REASONS: Final = ("power_cap", "power_brake", "hw_slowdown")
AMD_THROTTLE_REASONS: Final = ("power_cap", "hw_slowdown")
SERIES: Final[tuple[Series, ...]] = _catalogue()
#: Column of each series key in the simulation's state matrix.
KEY: Final[Mapping[str, int]] = MappingProxyType({s.key: i for i, s in enumerate(SERIES)})
#: Metrics in the order a line lists them.
METRIC_ORDER: Final[tuple[str, ...]] = tuple(dict.fromkeys(s.metric for s in SERIES))

STATUS_KEYS: Final = tuple(f"status.{s}" for s in STATUS_STATES)
ERROR_KEYS: Final = tuple(f"err.{etype}" for etype in ERROR_TYPES)
#: What every GPU reports, whatever its model.
COMMON_KEYS: Final = (
    *STATUS_KEYS,
    *ERROR_KEYS,
    "temp.gpu",
    "volt",
    "power",
    "energy",
    "throttle.thermal",
    "throttle.power",
    "util",
    "mem.util",
    "mem.usage",
    "io.receive",
    "io.transmit",
    "pcie.width",
    "pcie.gen",
)
SERIES_KEYS: Final = tuple(s.key for s in SERIES)
