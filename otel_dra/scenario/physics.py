"""A fleet's physics, one array per parameter with devices as rows: what each device's model says, varied
per device, and the counters it brings to the recording.

Why arrays of parameters: the simulation steps every device at once (one numpy expression per quantity),
so a fault is a parameter (an onset, a rate, a level) in a row of these arrays, not code of its own; a
parameter no fault sets holds a value that changes nothing (an onset that never comes: ``NEVER``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import numpy as np

from otel_dra.scenario.models import NIC
from otel_dra.scenario.plan import NEVER, Device, Node
from otel_dra.scenario.series import KEY

#: Parameters read off each device's model (models.DeviceModel): parameter -> (the model's field, the value a
#: network device gets). ``r``, the thermal resistance, is varied per device by 7% either way.
MODEL_PARAMS: Final[Mapping[str, tuple[str, float]]] = MappingProxyType(
    {
        "r": ("thermal_c_per_w", 1.2),
        "tau": ("thermal_tau_s", 60.0),
        "idle": ("power_idle_w", 15.0),
        "cap": ("power_cap_w", 25.0),
        "throttle_c": ("throttle_c", 200.0),
        "fan_max": ("fan_max_rpm", 1.0),
        "bw": ("io_bytes_per_s", 0.0),
        "mem_bytes": ("memory_bytes", 0.0),
        "width": ("pcie_width", 0.0),
        "volt": ("volt_nominal", 0.0),
    }
)


def physics(
    rng: np.random.Generator, nodes: list[Node], devices: list[Device]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per-row physical parameters (model values, varied per device) and counter history at t0."""
    n = len(devices)
    p: dict[str, np.ndarray] = {}

    def col(name: str) -> np.ndarray:
        field, nic = MODEL_PARAMS[name]
        return np.array([getattr(d.model, field) if d.model is not None else nic for d in devices], float)

    ambient_node = rng.uniform(22.0, 28.0, len(nodes))
    p["ambient"] = np.array([ambient_node[d.node] for d in devices]) + rng.uniform(-1.5, 1.5, n)
    p["r"] = col("r") * rng.uniform(0.93, 1.07, n)
    for name in MODEL_PARAMS:
        if name != "r":
            p[name] = col(name)
    p["job"] = rng.uniform(0.35, 0.95, n)
    p["mem"] = rng.uniform(0.2, 0.8, n)
    p["steady"] = np.zeros(n, bool)
    # Background rates per second: lognormal around the model's median (a fleet is not uniform).
    spread = rng.lognormal(0.0, 0.3, (n, 5))
    rates = np.zeros((n, 5))
    for d in devices:
        if d.model is None:
            rates[d.row, 4] = NIC.link_per_min / 60.0
            continue
        rates[d.row, 0] = d.model.corrected_per_min / 60.0
        for j, link in enumerate(("pcie", "nvlink", "xgmi")):
            rates[d.row, 1 + j] = d.model.link_per_min.get(link, 0.0) / 60.0
    p["rates"] = rates * spread
    for name in ("storm", "outlier", "drift", "fan_decay", "throttle", "pdeliv", "linkdeg", "mempress"):
        p[f"{name}_on"] = np.full(n, NEVER)
    for name in ("stall", "excursion", "burst", "cycle"):
        p[f"{name}_on"] = np.full(n, NEVER)
        p[f"{name}_period"] = np.ones(n)
        p[f"{name}_duty"] = np.zeros(n)
    for name in ("storm_rate", "outlier_rate", "drift_len", "drift_extra", "fan_decay_len", "pdeliv_volt"):
        p[name] = np.ones(n) if name.endswith("_len") else np.zeros(n)
    p["mempress_level"] = np.zeros(n)
    p["excursion_extra"] = np.zeros(n)
    p["burst_rate"] = np.zeros(n)
    p["burst_col"] = np.ones(n, np.intp)
    p["present"] = np.ones(n, bool)
    # Under load only (constants otherwise): a hot GPU's thermal resistance from its onset, a hardware
    # slowdown's share of each minute, a node's power brake, a power limit lowered by a fault.
    p["nvidia"] = np.array([d.model is not None and d.model.vendor == "NVIDIA" for d in devices], bool)
    for name in ("hot", "slow", "brake"):
        p[f"{name}_on"] = np.full(n, NEVER)
    p["r_hot"] = p["r"].copy()
    p["slow_share"] = np.zeros(n)
    p["slow_phase"] = np.zeros(n)
    p["brake_w"] = np.zeros(n)
    p["brake_share"] = np.zeros(n)
    p["limit_factor"] = np.ones(n)

    # Constants and counter history at t0: what a device brings when first seen.
    init = np.zeros((n, len(KEY)))
    for d in devices:
        r, m = d.row, d.model
        init[r, KEY["status.ok"]] = 1.0
        if m is None:
            init[r, KEY["err.link.other"]] = rng.integers(0, 50)
            continue
        minutes = rng.uniform(2_000, 40_000)
        init[r, KEY["err.corrected"]] = rng.poisson(p["rates"][r, 0] * 60 * minutes)
        for j, link in enumerate(("pcie", "nvlink", "xgmi")):
            init[r, KEY[f"err.link.{link}"]] = rng.poisson(p["rates"][r, 1 + j] * 60 * minutes)
        init[r, KEY["err.reset"]] = rng.integers(0, 3)
        init[r, KEY["err.out_of_memory"]] = rng.integers(0, 20)
        init[r, KEY["energy"]] = round(minutes * 60 * m.power_cap_w * 0.5, 1)
        init[r, KEY["io.receive"]] = round(minutes * 60 * m.io_bytes_per_s * 0.3)
        init[r, KEY["io.transmit"]] = round(minutes * 60 * m.io_bytes_per_s * 0.25)
        init[r, KEY["throttle.thermal"]] = round(rng.uniform(0, 300), 3)
        throttled = "throttle.power" if "throttle.power" in d.series else "throttle.power_cap"
        init[r, KEY[throttled]] = round(rng.uniform(0, 3000), 3)
        for kind, value in m.temp_limits.items():
            init[r, KEY[f"temp.limit.{kind}"]] = value
        for kind, value in m.fan_limits.items():
            init[r, KEY[f"fan.limit.{kind}"]] = value
        for kind, value in m.volt_limits.items():
            init[r, KEY[f"volt.limit.{kind}"]] = value
        init[r, KEY["power.limit.max"]] = m.power_cap_w
        init[r, KEY["mem.limit"]] = m.memory_bytes
        init[r, KEY["pcie.width.limit"]] = m.pcie_width
        init[r, KEY["pcie.gen.limit"]] = m.pcie_gen
        init[r, KEY["pcie.gen"]] = m.pcie_gen
    return p, init
