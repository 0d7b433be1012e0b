"""A simulated node of GPUs that behaves like real ones, with injectable faults.

Utilization drives power; power (and the fan) drive temperature through a first
order lag; energy integrates power; counters (ECC, PCIe replays) tick at
realistic background rates. Every failure reason of the contract can be injected
on a device at a time (``--fault gpu-3:memory_ecc@30``), producing the evidence
``failure-modes.md`` lists for it. All devices advance together as arrays.

``--load`` (:data:`otel_dra.scenario.load.PROFILES`) puts the node under the job model
``otel-dra simulate`` uses (training, inference, mixed): jobs hold memory full and
power at its cap, checkpoints dip, idle gaps train PCIe down to Gen1, crashes leave an
application XID and an OOM on every GPU the job held. ``idle`` (the default) is the
wander this source always had, value for value for a given seed.

Topology (:func:`simulated_topology`) is an HGX board's: GPUs in pairs behind PCIe switches, all in one
NVSwitch fabric of the node, so the agent's output carries ``hw.pcie.address``, ``hw.pcie.upstream`` and
``hw.fabric.id`` as a real source's does.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

import numpy as np

from otel_dra import conventions as cv
from otel_dra.faults import ANY_DEVICE, Fault
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of
from otel_dra.scenario import load as wl
from otel_dra.sources import Probe
from otel_dra.vocabulary import HW_STATES, REASONS

if TYPE_CHECKING:
    from otel_dra.sources import SourceSettings

GIB = float(1 << 30)


@dataclass(frozen=True)
class SimulatedGpuModel:
    """What the simulated GPU is and how it behaves: its identity, physical constants, limits and background
    rates, as one typed row of figures (the instance below) rather than loose module constants."""

    model: str
    vendor: str
    good_firmware: str
    bad_firmware: str  # what the firmware fault rolls a device back to
    driver_version: str
    driver_fault_xid: str  # the XID the driver_errors fault raises
    power_idle_w: float
    power_cap_w: float
    ambient_c: float
    thermal_c_per_w: float  # steady-state rise per watt at nominal airflow
    thermal_tau_s: float
    temp_limits_gpu: Mapping[str, float]
    temp_limits_memory: Mapping[str, float]
    fan_max_rpm: float
    fan_low_critical_rpm: float
    volt_nominal: float
    volt_limits: Mapping[str, float]
    memory_bytes: float
    pcie_width: float
    pcie_gen: float
    io_bytes_per_s: float
    corrected_ecc_per_s: float  # background counter rates, per device per second
    pcie_replay_per_s: float


#: The simulated model: an H100 SXM-like part.
GPU: Final = SimulatedGpuModel(
    model="H100 80GB HBM3",
    vendor="NVIDIA",
    good_firmware="96.00.99.00.01",
    bad_firmware="96.00.30.00.01",
    driver_version="580.95.05",
    driver_fault_xid="119",  # GSP RPC timeout: a reset-class XID
    power_idle_w=70.0,
    power_cap_w=700.0,
    ambient_c=30.0,
    thermal_c_per_w=0.075,
    thermal_tau_s=30.0,
    temp_limits_gpu=MappingProxyType({"high.degraded": 85.0, "throttled": 88.0, "high.critical": 92.0}),
    temp_limits_memory=MappingProxyType({"high.degraded": 95.0, "high.critical": 105.0}),
    fan_max_rpm=10000.0,
    fan_low_critical_rpm=500.0,
    volt_nominal=0.90,
    volt_limits=MappingProxyType({"low.critical": 0.80, "high.critical": 1.00}),
    memory_bytes=80.0 * GIB,
    pcie_width=16.0,
    pcie_gen=5.0,
    io_bytes_per_s=20e9,
    corrected_ecc_per_s=1.0 / 3600.0,
    pcie_replay_per_s=0.05 / 60.0,
)
#: The names callers read (tests, benches): the model's figures.
TEMP_LIMITS_GPU: Final = GPU.temp_limits_gpu
BAD_FIRMWARE: Final = GPU.bad_firmware
DRIVER_FAULT_XID: Final = GPU.driver_fault_xid


#: GPUs behind one simulated PCIe switch (an HGX H100 board has 4 switches of 2 GPUs).
GPUS_PER_SWITCH: Final = 2
#: Switches per PCI domain (each takes 0x20 buses from 0x10: the bus number is 8 bits).
_SWITCHES_PER_DOMAIN = 7


def simulated_topology(node_name: str, devices: int) -> tuple[dict[str, str], ...]:
    """Each simulated GPU's topology attributes. Switch ``k`` has its upstream port at bus ``0x10 + 0x20k``
    and its GPUs on the buses after its downstream ports' (``0000:10:00.0`` above ``0000:12:00.0`` and
    ``0000:13:00.0``). The node's GPUs share one NVLink fabric, ``<clusterUuid>/<cliqueId>``, whose cluster
    UUID comes from the node's name, so a restarted node keeps it."""
    fabric = f"{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node_name}.fabric.simulated.otel-dra.io')}/1"
    places = []
    for i in range(devices):
        switch, slot = divmod(i, GPUS_PER_SWITCH)
        domain, k = divmod(switch, _SWITCHES_PER_DOMAIN)
        bus = 0x10 + 0x20 * k
        places.append(
            {
                cv.HW_PCIE_ADDRESS: f"{domain:04x}:{bus + 2 + slot:02x}:00.0",
                cv.HW_PCIE_UPSTREAM: f"{domain:04x}:{bus:02x}:00.0",
                cv.HW_FABRIC_ID: fabric,
            }
        )
    return tuple(places)


def gpu_columns() -> dict[str, Column]:
    """The simulated GPU's series kinds, by a short local key."""
    t, f, v = "temp/gpu", "fan/0", "volt/core"
    cols: dict[str, Column] = {}
    for state in HW_STATES:
        cols[f"status.{state}"] = Column(cv.HW_STATUS.name, attrs_of({cv.HW_STATE: state}))
    for etype in ("corrected", "uncorrected", "retired_page", "reset", "power", "out_of_memory"):
        cols[f"errors.{etype}"] = Column(cv.HW_ERRORS.name, attrs_of({cv.ERROR_TYPE_ATTR: etype}))
    for link in ("pcie", "nvlink"):
        cols[f"errors.link.{link}"] = Column(
            cv.HW_ERRORS.name, attrs_of({cv.ERROR_TYPE_ATTR: "link", cv.HW_LINK_TYPE: link})
        )
    cols["temp.gpu"] = Column(cv.HW_TEMPERATURE.name, attrs_of({cv.HW_SENSOR_LOCATION: "gpu"}), t, "temperature")
    for limit in GPU.temp_limits_gpu:
        cols[f"temp.gpu.limit.{limit}"] = Column(
            cv.HW_TEMPERATURE_LIMIT.name,
            attrs_of({cv.HW_SENSOR_LOCATION: "gpu", cv.HW_LIMIT_TYPE: limit}),
            t,
            "temperature",
        )
    m = "temp/memory"
    cols["temp.memory"] = Column(cv.HW_TEMPERATURE.name, attrs_of({cv.HW_SENSOR_LOCATION: "memory"}), m, "temperature")
    for limit in GPU.temp_limits_memory:
        cols[f"temp.memory.limit.{limit}"] = Column(
            cv.HW_TEMPERATURE_LIMIT.name,
            attrs_of({cv.HW_SENSOR_LOCATION: "memory", cv.HW_LIMIT_TYPE: limit}),
            m,
            "temperature",
        )
    cols["fan.speed"] = Column(cv.HW_FAN_SPEED.name, (), f, "fan")
    cols["fan.ratio"] = Column(cv.HW_FAN_SPEED_RATIO.name, (), f, "fan")
    cols["fan.limit.low.critical"] = Column(
        cv.HW_FAN_SPEED_LIMIT.name, attrs_of({cv.HW_LIMIT_TYPE: "low.critical"}), f, "fan"
    )
    cols["volt"] = Column(cv.HW_VOLTAGE.name, (), v, "voltage")
    for limit in GPU.volt_limits:
        cols[f"volt.limit.{limit}"] = Column(
            cv.HW_VOLTAGE_LIMIT.name, attrs_of({cv.HW_LIMIT_TYPE: limit}), v, "voltage"
        )
    cols["power"] = Column(cv.HW_POWER.name)
    cols["power.limit.max"] = Column(cv.HW_POWER_LIMIT.name, attrs_of({cv.HW_LIMIT_TYPE: "max"}))
    cols["energy"] = Column(cv.HW_ENERGY.name)
    cols["util"] = Column(cv.HW_GPU_UTILIZATION.name, attrs_of({cv.HW_GPU_TASK: "general"}))
    cols["mem.usage"] = Column(cv.HW_GPU_MEMORY_USAGE.name)
    cols["mem.limit"] = Column(cv.HW_GPU_MEMORY_LIMIT.name)
    cols["mem.util"] = Column(cv.HW_GPU_MEMORY_UTILIZATION.name)
    for direction in ("receive", "transmit"):
        cols[f"io.{direction}"] = Column(cv.HW_GPU_IO.name, attrs_of({cv.NETWORK_IO_DIRECTION_ATTR: direction}))
    for reason in ("thermal", "power", "other"):
        cols[f"throttle.{reason}"] = Column(cv.HW_THROTTLE_TIME.name, attrs_of({cv.HW_THROTTLE_REASON: reason}))
    cols["pcie.width"] = Column(cv.HW_PCIE_LINK_WIDTH.name)
    cols["pcie.width.limit"] = Column(cv.HW_PCIE_LINK_WIDTH_LIMIT.name, attrs_of({cv.HW_LIMIT_TYPE: "max"}))
    cols["pcie.gen"] = Column(cv.HW_PCIE_LINK_GENERATION.name)
    cols["pcie.gen.limit"] = Column(cv.HW_PCIE_LINK_GENERATION_LIMIT.name, attrs_of({cv.HW_LIMIT_TYPE: "max"}))
    return cols


#: Throttle reasons the source reports under load, instead of ``power``: NVML tells these causes apart.
BUSY_THROTTLE_REASONS = ("power_cap", "power_brake", "hw_slowdown")


def busy_columns() -> dict[str, Column]:
    """The series kinds a node under load adds (``throttle.power_cap`` ...): registered only then, so the
    idle node's schema is what it always was."""
    return {
        f"throttle.{reason}": Column(cv.HW_THROTTLE_TIME.name, attrs_of({cv.HW_THROTTLE_REASON: reason}))
        for reason in BUSY_THROTTLE_REASONS
    }


def driver_error_column(code: str) -> Column:
    """``hw.errors{error.type=driver, hw.error.code=CODE}``: a series born at the first such event."""
    return Column(cv.HW_ERRORS.name, attrs_of({cv.ERROR_TYPE_ATTR: "driver", cv.HW_ERROR_CODE: code}))


@dataclass(frozen=True)
class SimulatorConfig:
    """How many devices, on which node, with which faults."""

    node_name: str
    devices: int = 8
    faults: tuple[Fault, ...] = ()
    seed: int | None = None
    # Not a real driver's name: taints rendered for simulated devices must never select real GPUs.
    driver_name: str = "gpu.simulated.otel-dra.io"
    start_unix_nano: int | None = None  # fault times count from here; default: the first read
    #: What the GPUs run (otel_dra.scenario.load.PROFILES); idle: the wander this source always had.
    load: str = "idle"

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValueError(f"--devices must be at least 1, got {self.devices}")
        if self.load not in wl.PROFILES:
            raise ValueError(f"--load must be one of {', '.join(wl.PROFILES)}, got {self.load!r}")
        known = {f"gpu-{i}" for i in range(self.devices)}
        for fault in self.faults:
            if fault.device != ANY_DEVICE and fault.device not in known:
                raise ValueError(
                    f"--fault {fault}: no device {fault.device!r} in a simulated node of {self.devices} "
                    f"(devices are gpu-0 .. gpu-{self.devices - 1}, or * for all)"
                )


@dataclass
class _State:
    util: np.ndarray
    job_level: np.ndarray
    temp: np.ndarray
    temp_mem: np.ndarray
    mem_frac: np.ndarray
    counters: dict[str, np.ndarray] = field(default_factory=dict)
    driver_errors: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class _Step:
    """One read's workload and power, devices as rows (``load``, ``throttled``: under load only)."""

    util: np.ndarray
    power: np.ndarray
    cap: np.ndarray
    power_capped: np.ndarray
    busy: np.ndarray  # rows the job model manages
    load: wl.LoadSample | None = None
    throttled: wl.Throttled | None = None


class SimulatedSource:
    """A node of simulated GPUs; one :meth:`read` advances the simulation to ``now``."""

    name = "simulated"

    def __init__(self, config: SimulatorConfig, schema: Schema | None = None) -> None:
        self.config = config
        self.schema = schema if schema is not None else Schema()
        self._cols = {key: self.schema.index(col) for key, col in gpu_columns().items()}
        n = config.devices
        self._rng = np.random.default_rng(config.seed)
        self._ids = tuple(f"gpu-{i}" for i in range(n))
        # onset[reason][device] in seconds after start; +inf where not injected.
        self._onset = {reason: np.full(n, np.inf) for reason in REASONS}
        for fault in config.faults:
            rows = slice(None) if fault.device == ANY_DEVICE else self._ids.index(fault.device)
            current = self._onset[fault.reason][rows]
            self._onset[fault.reason][rows] = np.minimum(current, fault.at)
        # A simulated GPU with faults injected is another GPU than the same one without: its serial number says
        # which reasons it was given, so a state file does not hand a run without them what an earlier run's
        # injected faults left (a held fault belongs to its serial number), while a run with the same ones (a
        # restart) finds its memory.
        # Without a seed, the number is the node's and the device's: a restarted `otel-dra run` simulates the same
        # GPUs, so it must find their memory (the draw is made either way, so a seed's stream stays what it was).
        injected = [sorted({f.reason for f in config.faults if f.device in (ANY_DEVICE, dev)}) for dev in self._ids]
        drawn = [int(self._rng.integers(10**9, 10**10)) for _ in self._ids]
        if config.seed is None:
            drawn = [10**9 + zlib.crc32(f"{config.node_name}/{dev}".encode()) for dev in self._ids]
        self._serials = tuple(
            f"SIM{number}" + (f"-{zlib.crc32(','.join(r).encode()):08x}" if r else "")
            for number, r in zip(drawn, injected, strict=True)
        )
        self._tables: dict[bytes, DeviceTable] = {}
        self._topology = simulated_topology(config.node_name, n)
        rng = self._rng
        job = rng.uniform(0.3, 0.95, n)
        idle = GPU.power_idle_w
        self._state = _State(
            util=job.copy(),
            job_level=job,
            temp=GPU.ambient_c + GPU.thermal_c_per_w * (idle + job * (GPU.power_cap_w * 0.85 - idle)),
            temp_mem=np.full(n, GPU.ambient_c + 20.0),
            mem_frac=rng.uniform(0.2, 0.8, n),
            counters={
                "energy": rng.uniform(1e6, 1e9, n),
                "corrected": rng.integers(0, 5, n).astype(float),
                "uncorrected": np.zeros(n),
                "retired_page": np.zeros(n),
                "reset": np.zeros(n),
                "power": np.zeros(n),
                "out_of_memory": np.zeros(n),
                "link.pcie": rng.integers(0, 3, n).astype(float),
                "link.nvlink": np.zeros(n),
                "io.receive": rng.uniform(1e9, 1e12, n),
                "io.transmit": rng.uniform(1e9, 1e12, n),
                "throttle.thermal": np.zeros(n),
                "throttle.power": np.zeros(n),
                "throttle.other": np.zeros(n),
            },
        )
        self._start_ns = config.start_unix_nano
        self._last_t: float | None = None
        # Under load: the job model, from its own generators (the idle node's draws stay what they were).
        #: The job model of this node's GPUs (None under --load idle); ``profile``: what the node runs.
        self.workload: wl.LoadModel | None = None
        self.profile = "idle"
        if config.load != "idle":
            self._busy_setup(config)

    def _busy_setup(self, config: SimulatorConfig) -> None:
        n = config.devices
        lrng = np.random.default_rng(None if config.seed is None else [config.seed, 0x10AD])
        self.profile = wl.profile_of_nodes(config.load, 1, lrng)[0]
        lanes = wl.make_lanes(self.profile, n, lrng)
        rows = [list(lane.slots) for lane in lanes]
        self.workload = wl.LoadModel(
            lanes,
            rows,
            np.full(n, GPU.power_idle_w),
            np.full(n, GPU.power_cap_w),
            np.random.default_rng(None if config.seed is None else [config.seed, 0x10AD, 1]),
        )
        # Thermal layout (the generator's): slots, the node's inlet, a spread; at its cap the hottest stays under
        # its high.degraded limit.
        limit = np.full(n, GPU.temp_limits_gpu["high.degraded"])
        t_cap = wl.full_load_temperature(limit, wl.slot_offsets(n), np.full(n, lrng.uniform(0.0, 6.0)), lrng)
        self._r = (t_cap - GPU.ambient_c) / GPU.power_cap_w
        self._cols.update({key: self.schema.index(col) for key, col in busy_columns().items()})
        for key in busy_columns():
            self._state.counters[key] = np.zeros(n)

    # -- helpers -------------------------------------------------------------------
    @classmethod
    def probe(cls, config: SourceSettings) -> Probe:
        """The simulator reports what ``--devices`` asks for, on any machine."""
        return Probe(cls.name, config.devices, f"{config.devices} simulated device(s)")

    @classmethod
    def from_config(cls, config: SourceSettings, schema: Schema) -> SimulatedSource:
        """The simulator with ``config``'s devices, faults, seed and load, for :func:`otel_dra.sources.build`."""
        sim = SimulatorConfig(
            config.node_name, config.devices, faults=config.faults, seed=config.seed, load=config.load
        )
        return cls(sim, schema)

    def _active(self, reason: str, t: float) -> np.ndarray:
        return self._onset[reason] <= t

    def _device_table(self, bad_firmware: np.ndarray) -> DeviceTable:
        key = np.packbits(bad_firmware).tobytes()
        table = self._tables.get(key)
        if table is None:
            node = self.config.node_name
            table = DeviceTable(
                node=node,
                ids=self._ids,
                attrs=tuple(
                    {
                        cv.HW_TYPE: "gpu",
                        cv.HW_NAME: f"GPU {i}",
                        cv.HW_VENDOR: GPU.vendor,
                        cv.HW_MODEL: GPU.model,
                        cv.HW_SERIAL_NUMBER: self._serials[i],
                        cv.HW_FIRMWARE_VERSION: GPU.bad_firmware if bad_firmware[i] else GPU.good_firmware,
                        cv.HW_DRIVER_VERSION: GPU.driver_version,
                        **self._topology[i],
                        cv.DRA_DRIVER_NAME: self.config.driver_name,
                        cv.DRA_POOL_NAME: node,
                        cv.DRA_DEVICE_NAME: dev,
                    }
                    for i, dev in enumerate(self._ids)
                ),
            )
            self._tables[key] = table
        return table

    def _tick_events(self, active: np.ndarray, onset: np.ndarray, t: float, t_prev: float, period: float) -> np.ndarray:
        """How many periodic fault events (one at onset, then every ``period`` s) fell in (t_prev, t]."""
        since = np.where(active, t - onset, -1.0)
        before = np.where(onset <= t_prev, t_prev - onset, -1.0)
        now_n = np.where(since >= 0, np.floor(since / period) + 1, 0)
        prev_n = np.where(before >= 0, np.floor(before / period) + 1, 0)
        return now_n - prev_n

    # -- the source protocol -------------------------------------------------------
    def read(self, now_unix_nano: int) -> Frame:
        if self._start_ns is None:
            self._start_ns = now_unix_nano
        t = (now_unix_nano - self._start_ns) / 1e9
        dt = 0.0 if self._last_t is None else max(0.0, t - self._last_t)
        t_prev = t - dt if self._last_t is not None else -np.inf
        self._last_t = t
        on = {reason: self._active(reason, t) for reason in REASONS}
        step = self._power(t, dt, on)
        fan_ratio = self._cooling(step, dt, on)
        mem_frac = self._memory(step, t, t_prev, dt, on)
        self._errors(step, t, t_prev, dt, on)
        volt = GPU.volt_nominal + self._rng.normal(0, 0.004, self.config.devices)
        volt = np.where(on["power_delivery"], self._rng.uniform(0.70, 0.79, self.config.devices), volt)
        values = self._values(step, fan_ratio, mem_frac, volt, on)
        # A lost device reports nothing; a stale node reports nothing for anyone.
        silent = on["device_lost"] | on["stale"].any()
        values[silent, :] = np.nan
        return Frame(now_unix_nano, self._device_table(on["firmware"]), values)

    def _power(self, t: float, dt: float, on: dict[str, np.ndarray]) -> _Step:
        """Workload and power: utilization wanders around a per-device job level (jobs change now and then);
        demand from utilization, held at the cap (throttling) when it exceeds it; under load the job model's
        utilization and demand, under the device's (maybe lowered) limit. Energy integrates power."""
        n, rng, st = self.config.devices, self._rng, self._state
        new_job = rng.random(n) < dt / 900.0
        st.job_level = np.where(new_job, rng.uniform(0.3, 0.95, n), st.job_level)
        decay = np.exp(-dt / 20.0)
        st.util = np.clip(st.job_level + (st.util - st.job_level) * decay + rng.normal(0, 0.03, n), 0.0, 1.0)
        util = np.where(on["power_throttling"], 1.0, st.util)
        cap = np.where(on["power_throttling"], 0.55 * GPU.power_cap_w, GPU.power_cap_w)
        demand = GPU.power_idle_w + util * (GPU.power_cap_w - GPU.power_idle_w) * 0.85 + rng.normal(0, 5.0, n)
        demand = np.where(on["power_throttling"], GPU.power_cap_w, demand)
        power = np.minimum(demand, cap)
        step = _Step(util, power, cap, demand >= cap, np.zeros(n, bool))
        model = self.workload
        if model is not None:
            step.load = load = model.step(t)
            step.busy = busy = model.managed
            step.util = np.where(busy, load.util, util)
            step.throttled = throttled = wl.power_and_throttle(load, cap, dt)
            step.power = np.where(busy, throttled.power_w, power)
        self._state.counters["energy"] += step.power * dt
        return step

    def _cooling(self, step: _Step, dt: float, on: dict[str, np.ndarray]) -> np.ndarray:
        """Cooling and temperature: a fan failure stops the fan; a thermal fault adds heat the fan can't remove.
        Returns the fan's speed ratio; throttle time accrues."""
        n, rng, st, c = self.config.devices, self._rng, self._state, self._state.counters
        resistance: np.ndarray | float = self._r if step.load is not None else GPU.thermal_c_per_w
        airflow = np.where(on["cooling"], 0.25, 1.0)
        target = GPU.ambient_c + resistance * step.power / airflow
        throttled_c = GPU.temp_limits_gpu["throttled"]
        target = np.where(on["thermal"], np.maximum(target, throttled_c + 2.0), target)
        alpha = 1.0 - np.exp(-dt / GPU.thermal_tau_s)
        st.temp = st.temp + (target - st.temp) * alpha + rng.normal(0, 0.3, n)
        st.temp_mem = st.temp_mem + (st.temp + 8.0 - st.temp_mem) * alpha
        fan_ratio = np.clip(0.3 + (st.temp - 40.0) / 60.0, 0.3, 1.0)
        fan_ratio = np.where(on["cooling"], rng.uniform(0.0, 0.02, n), fan_ratio)
        c["throttle.thermal"] += np.where(st.temp >= throttled_c, dt, 0.0)
        c["throttle.power"] += np.where(step.power_capped, dt, 0.0)
        if step.throttled is not None:  # NVML tells the causes apart: the software power cap's share of the step
            capped = np.where(step.power_capped, dt, 0.0)
            c["throttle.power_cap"] += np.where(step.busy, step.throttled.power_cap_s, capped)
        return fan_ratio

    def _memory(self, step: _Step, t: float, t_prev: float, dt: float, on: dict[str, np.ndarray]) -> np.ndarray:
        """Memory: a pressured device runs full and hits out-of-memory now and then; under load the job's
        memory, and a job's crash leaves its application XID and an OOM on every GPU it held, in one read."""
        n, rng, st, c = self.config.devices, self._rng, self._state, self._state.counters
        st.mem_frac = np.clip(st.mem_frac + rng.normal(0, 0.01, n), 0.05, 0.9)
        mem_frac = np.where(on["memory_pressure"], rng.uniform(0.97, 0.995, n), st.mem_frac)
        c["out_of_memory"] += self._tick_events(on["memory_pressure"], self._onset["memory_pressure"], t, t_prev, 20.0)
        model = self.workload
        if model is not None and step.load is not None:
            mem_frac = np.where(step.busy & ~on["memory_pressure"], step.load.mem, mem_frac)
            if dt > 0:
                for rows, code in model.crashes_between(t_prev, t):
                    st.driver_errors.setdefault(code, np.zeros(n))[rows] += 1
                    c["out_of_memory"][rows] += 1
        return mem_frac

    def _errors(self, step: _Step, t: float, t_prev: float, dt: float, on: dict[str, np.ndarray]) -> None:
        """Errors: background rates for everyone, bursts for faulted devices; I/O bytes from utilization."""
        n, rng, st, c = self.config.devices, self._rng, self._state, self._state.counters
        c["corrected"] += rng.poisson(GPU.corrected_ecc_per_s * dt, n)
        ecc = self._tick_events(on["memory_ecc"], self._onset["memory_ecc"], t, t_prev, 60.0)
        c["uncorrected"] += ecc
        c["retired_page"] += ecc
        c["corrected"] += np.where(on["memory_ecc"], rng.poisson(2.0 * dt, n), 0)
        replay_rate = np.where(on["link"], 60.0 / 60.0, GPU.pcie_replay_per_s)
        c["link.pcie"] += rng.poisson(replay_rate * dt)
        c["power"] += self._tick_events(on["power_delivery"], self._onset["power_delivery"], t, t_prev, 30.0)
        c["reset"] += self._tick_events(on["device_reset"], self._onset["device_reset"], t, t_prev, 60.0)
        xid = self._tick_events(on["driver_errors"], self._onset["driver_errors"], t, t_prev, 120.0)
        if xid.any() or GPU.driver_fault_xid in st.driver_errors:
            st.driver_errors.setdefault(GPU.driver_fault_xid, np.zeros(n))
            st.driver_errors[GPU.driver_fault_xid] += xid
        c["io.receive"] += step.util * GPU.io_bytes_per_s * dt
        c["io.transmit"] += step.util * GPU.io_bytes_per_s * 0.8 * dt

    def _values(
        self, step: _Step, fan_ratio: np.ndarray, mem_frac: np.ndarray, volt: np.ndarray, on: dict[str, np.ndarray]
    ) -> np.ndarray:
        """The frame's values, devices as rows and the schema's columns."""
        st, c, load = self._state, self._state.counters, step.load
        for code in st.driver_errors:
            self._cols.setdefault(f"xid.{code}", self.schema.index(driver_error_column(code)))
        values = np.full((self.config.devices, len(self.schema)), np.nan)
        k = self._cols

        def put(key: str, column_values: np.ndarray | float) -> None:
            values[:, k[key]] = column_values

        state = np.where(on["vendor_status"], "failed", "ok")
        for s in HW_STATES:
            put(f"status.{s}", (state == s).astype(float))
        for etype in ("corrected", "uncorrected", "retired_page", "reset", "power", "out_of_memory"):
            put(f"errors.{etype}", c[etype])
        put("errors.link.pcie", c["link.pcie"])
        put("errors.link.nvlink", c["link.nvlink"])
        for code, counts in st.driver_errors.items():
            put(f"xid.{code}", counts)
        put("temp.gpu", st.temp)
        for limit, value in GPU.temp_limits_gpu.items():
            put(f"temp.gpu.limit.{limit}", value)
        put("temp.memory", st.temp_mem)
        for limit, value in GPU.temp_limits_memory.items():
            put(f"temp.memory.limit.{limit}", value)
        put("fan.speed", fan_ratio * GPU.fan_max_rpm)
        put("fan.ratio", fan_ratio)
        put("fan.limit.low.critical", GPU.fan_low_critical_rpm)
        put("volt", volt)
        for limit, value in GPU.volt_limits.items():
            put(f"volt.limit.{limit}", value)
        put("power", step.power)
        put("power.limit.max", step.cap)
        put("energy", c["energy"])
        put("util", step.util)
        put("mem.usage", np.round(mem_frac * GPU.memory_bytes))
        put("mem.limit", GPU.memory_bytes)
        put("mem.util", mem_frac)
        put("io.receive", c["io.receive"])
        put("io.transmit", c["io.transmit"])
        for reason in ("thermal", "power", "other"):
            if load is None or reason != "power":
                put(f"throttle.{reason}", c[f"throttle.{reason}"])
        put("pcie.width", np.where(on["link"], GPU.pcie_width / 2, GPU.pcie_width))
        put("pcie.width.limit", GPU.pcie_width)
        put("pcie.gen", GPU.pcie_gen)
        put("pcie.gen.limit", GPU.pcie_gen)
        if load is not None:  # under load power_cap replaces power; an idle GPU's link trains down to Gen1
            for reason in BUSY_THROTTLE_REASONS:
                put(f"throttle.{reason}", c[f"throttle.{reason}"])
            put("pcie.gen", np.where(step.busy & ~load.running, 1.0, GPU.pcie_gen))
        return values

    def close(self) -> None:
        """Nothing to release."""
