"""The vectorised classifier and its naive twin (tests/naive_twin.py) give the same verdicts.

Hypothesis generates small fleets (1-3 nodes of 1-4 GPUs, 5-60 ticks of 10 s) over the
simulator's series kinds plus driver error series, with values drawn around every
threshold: temperatures near their limits (own limits, missing ones, flaky ones),
fans near zero, counters that increase, stay, reset or appear mid-run, NaN values,
devices skipping ticks or going silent, whole nodes going silent (held faults stay), vendor
states, firmware on a deny list, per-model overrides, failures that wait for a repair (a reset
event, counters starting over on one device or on a node's) and a new serial number in a slot.
Both classifiers get the same frames, are evaluated at every tick, and must emit the same
verdict streams.
"""

from __future__ import annotations

import dataclasses
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from otel_dra import conventions as cv
from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of
from otel_dra.sources.simulated import driver_error_column, gpu_columns
from otel_dra.vocabulary import HW_STATES
from tests.support.naive_twin import NaiveClassifier

INTERVAL_S = 10
T0_S = 1_764_000_000
NS = 10**9

GOOD_FW = "96.00.99.00.01"
DENIED_FW = "96.00.30.00.01"
OLD_FW = "96.00.40.00.01"  # below the test policy's NVIDIA minimum

POLICY_A = f"""
window: 60s
min_samples: 3
stale_timeout: 30s
device_ttl: 150s
unhealthy_states: [failed]
hold: {{default: 30s, memory_ecc: 60s, driver_errors: 60s, device_reset: 60s, device_lost: 30s, firmware: 0s}}
escalation: {{window: 5m, after: 2}}
# Failures of memory_ecc and driver_errors wait for a repair (the default), then 30 s clean.
clean_after_repair: 30s
# A short horizon, so that cohorts and duty cycles matter within a generated fleet's minutes.
horizon: {{bucket: 20s, duty_span: 1m, rate_span: 2m, duty_hold_ratio: 0.5}}
cohorts: {{min_devices: 3, significance: 1, span_significance: 1}}
rules:
  memory_ecc: {{corrected_per_minute: 6, corrected_mad_k: 3, retired_pages_failed: 10, retired_pages_predicted: 5,
               corrected_cohort_ratio: 2, corrected_storm_ratio: 4, corrected_floor_per_minute: 0.5}}
  memory_pressure: {{events_window: 2m, out_of_memory: 3}}
  driver_errors: {{events_window: 2m, application_repeats: 2}}
  device_reset: {{events_window: 2m, resets: 2}}
  link: {{mad_k: 3, cohort_ratio: 2, storm_ratio: 3, floor_per_minute: 1}}
  thermal: {{duty: 0.3, slowdown_share: 0.1,
            peers: {{min_node_devices: 2, min_slot_nodes: 2, sustain: 20s, margin: 3, unknown_slot_margin: 3.5,
                     mad_k: 2, hold_ratio: 0.5, history: 30s, baseline_tau: 1m, change_margin: 1.5, change_floor: 1}}}}
  cooling: {{duty: 0.3}}
  power_delivery: {{brake_share: 0.05}}
  power_throttling: {{min_peers: 2, peer_quantile: 0.5, peer_margin: 0.1}}
  firmware: {{deny: ["{DENIED_FW}"], minimum: {{NVIDIA: "96.00.50.00.01"}}}}
scopes: {{workload: {{min_devices: 2, together: 15s}}, node: {{min_devices: 2, share: 0.6}}}}
overrides:
  - match: {{hw.model: "A100*"}}
    rules:
      thermal: {{fallback_limits: {{high.degraded: 75, high.critical: 85}}}}
      cooling: {{min_rpm: 800, warm: 50}}
      # as many application driver errors as the event log keeps (8)
      driver_errors: {{application_repeats: 8, events_window: 5m}}
"""

POLICY_B = f"""
window: 45s
min_samples: 2
stale_timeout: 25s
device_ttl: 1h
unhealthy_states: [failed, degraded]
hold: {{default: 20s, memory_ecc: 40s, driver_errors: 40s, vendor_status: 0s, firmware: 0s, thermal: 50s}}
escalation: {{window: 2m, after: 3}}
clears: {{default: hold, memory_ecc: hold, driver_errors: repair, vendor_status: repair}}
clean_after_repair: 1m
horizon: {{bucket: 15s, duty_span: 45s, rate_span: 90s, duty_hold_ratio: 0.3}}
cohorts: {{by: [hw.vendor], min_devices: 2, significance: 0, span_significance: 0.5, load_bins: [0.2, 0.5]}}
stale_intervals: 3
rules:
  thermal: {{min_fraction: 0.6, throttle_share: 0.2,
            peers: {{min_node_devices: 2, min_slot_nodes: 3, sustain: 0s, margin: 4, unknown_slot_margin: 5, mad_k: 3,
                     slope: 10, history: 0s, baseline_tau: 2m, change_margin: 2, change_floor: 0}}}}
  memory_ecc: {{corrected_per_minute: 3, corrected_mad_k: 5}}
  # more out-of-memory events than the event log keeps (8) can matter here
  memory_pressure: {{events_window: 3m, out_of_memory: 8, min_fraction: 0.5, duty: 0.3, full_is_evidence: true}}
  driver_errors: {{events_window: 90s, application_repeats: 2}}
  device_reset: {{events_window: 90s, resets: 1}}
  power_throttling: {{throttle_share: 0.3, duty: 0.2, min_peers: 3, peer_margin: 0.15, peer_quantile: 0.75}}
  link: {{replays_per_lane_per_minute: {{1: 0.05, 4: 0.1, 5: 0.2}}, mad_k: 2}}
  firmware: {{deny: ["{DENIED_FW}", "{OLD_FW}"]}}
scopes: {{workload: {{min_devices: 3, together: 0s}}, node: {{min_devices: 2, share: 1.0, remediation: reset_device}}}}
overrides:
  - match: {{hw.vendor: AMD}}
    rules: {{thermal: {{state: predicted_failure, peers: {{state: degraded}}}}, device_reset: {{resets: 2}}}}
"""


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, policy_mod.Policy]:
    out = {}
    for name, text in (("A", POLICY_A), ("B", POLICY_B)):
        path: Path = tmp_path_factory.mktemp("policy") / f"{name}.yaml"
        path.write_text(text)
        out[name] = policy_mod.load(path)
    return out


# -- generated fleets -----------------------------------------------------------------------
COUNTERS = (
    "errors.corrected",
    "errors.uncorrected",
    "errors.reset",
    "errors.power",
    "errors.out_of_memory",
    "errors.link.pcie",
    "errors.link.nvlink",
    "errors.retired_page",
    "throttle.thermal",
    "throttle.power",
    "throttle.other",
    "throttle.power_cap",
    "throttle.power_brake",
    "throttle.hw_slowdown",
)
DRIVER_CODES = ("13", "79", "48", "999", "63", "54")
# (probability of an increase per tick, largest increase)
COUNTER_RATES = {
    "quiet": (0.0, 0),
    "trickle": (0.1, 1),
    "busy": (0.5, 3),
    "steady": (0.9, 2),
    "storm": (0.9, 10),
    "flood": (0.9, 40),
}


@dataclass(frozen=True)
class CounterProfile:
    rate: str
    init: int
    reset_p: float
    appear: int | None  # tick the series first appears (None: from the start)
    nan_p: float


@dataclass(frozen=True)
class DeviceProfile:
    hw_id: str
    vendor: str | None
    model: str | None
    firmware: str | None
    firmware_change: tuple[int, str] | None
    serial_swap: int | None  # tick from which another device (a new hw.serial_number) sits in its slot
    join: int
    silences: tuple[tuple[int, int], ...]
    skip_p: float
    nan_p: float
    temp: int
    temp_jitter: int
    spike_p: float
    temp_limits: str
    temp_mem: int | None
    fan_rpm: int | None
    fan_ratio: float | None
    fan_limit: int | None
    fan_flicker: float
    volt: float | None
    volt_limits: str
    power: int | None
    power_cap: int | None
    util: float | None
    mem: str
    width: int | None
    width_max: int | None
    gen: int | None
    gen_max: int | None
    link_flicker: float
    status: str
    counters: tuple[tuple[str, CounterProfile], ...]
    drivers: tuple[tuple[str, CounterProfile], ...]


@dataclass(frozen=True)
class NodeProfile:
    name: str
    offset: int  # seconds a node's sample precedes the tick
    every: int  # the node samples every this many ticks (sampling intervals differ by node)
    silences: tuple[tuple[int, int], ...]
    silent_rows: bool  # a silent device is an all-NaN row (True) or missing from the table (False)
    devices: tuple[DeviceProfile, ...]
    # What the node's devices share: a job crashing every this many ticks (an XID 13 and an OOM on each at
    # once), a span of ticks with the power brake on all of them, a span with all of them this much hotter.
    crash_every: int | None = None
    brake: tuple[int, int] | None = None
    capped: tuple[int, int] | None = None  # a span of ticks with all of them at their power cap (their job's)
    dip: tuple[int, int] | None = None  # a span of ticks their job's utilization drops (a checkpoint)
    heat: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class Fleet:
    policy: str
    ticks: int
    seed: int
    nodes: tuple[NodeProfile, ...]


def silences(ticks: int, longest: int) -> st.SearchStrategy[tuple[tuple[int, int], ...]]:
    one = st.tuples(st.integers(0, max(0, ticks - 1)), st.integers(1, longest))
    return st.lists(one, max_size=2).map(tuple)


@st.composite
def counter_profiles(draw: st.DrawFn, ticks: int, busy: bool = False) -> CounterProfile:
    rates = [*COUNTER_RATES, "steady"] if busy else ["quiet", "quiet", "trickle", "busy", "steady", "storm", "flood"]
    return CounterProfile(
        rate=draw(st.sampled_from(rates)),
        init=draw(st.sampled_from([0, 0, 3, 50])),
        reset_p=draw(st.sampled_from([0.0, 0.0, 0.05, 0.25])),
        appear=draw(st.one_of(st.none(), st.none(), st.integers(0, ticks))),
        nan_p=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
    )


#: Aspects of a device that a generated device gets wrong (or odd); the rest stay healthy.
#: Event-driven aspects are listed more than once: they need luck (rates, windows) to matter.
ASPECTS = (
    "drivers",
    "drivers",
    "errors.out_of_memory",
    "errors.reset",
    "firmware",
    "status",
    "thermal",
    "cooling",
    "voltage",
    "power",
    "memory",
    "link",
    "status",
    "drivers",
    "firmware",
    "nan",
    *COUNTERS,
)
QUIET = CounterProfile("quiet", 0, 0.0, None, 0.0)
HEALTHY = {
    "thermal": {"temp": 60, "temp_jitter": 2, "spike_p": 0.0, "temp_limits": "own", "temp_mem": 50},
    "cooling": {"fan_rpm": 4000, "fan_ratio": 0.4, "fan_limit": 500, "fan_flicker": 0.0},
    "voltage": {"volt": 0.9, "volt_limits": "own"},
    "power": {"power": 300, "power_cap": 700},
    "memory": {"mem": "util_low"},
    "link": {"width": 16, "width_max": 16, "gen": 5, "gen_max": 5, "link_flicker": 0.0, "util": 0.9},
    "status": {"status": "ok"},
    "drivers": {"drivers": ()},
    "firmware": {"firmware": GOOD_FW, "firmware_change": None},
    "nan": {"nan_p": 0.0},
}


@st.composite
def device_profiles(
    draw: st.DrawFn,
    hw_id: str,
    ticks: int,
    kind: tuple[str | None, str | None] | None = None,
    load: float = 0.9,
) -> DeviceProfile:
    """One device; ``kind``: the (vendor, model) its node's devices share, when they do; ``load``: its job's
    utilization."""
    wild = draw(st.sets(st.sampled_from(ASPECTS), max_size=4))
    counters = tuple((key, draw(counter_profiles(ticks)) if key in wild else QUIET) for key in COUNTERS)
    codes = draw(st.lists(st.sampled_from(DRIVER_CODES), max_size=3, unique=True))
    drivers = tuple((code, draw(counter_profiles(ticks, busy=True))) for code in codes)
    fw_change = draw(
        st.one_of(st.none(), st.tuples(st.integers(0, ticks), st.sampled_from([GOOD_FW, DENIED_FW, OLD_FW])))
    )
    profile = DeviceProfile(
        hw_id=hw_id,
        vendor=draw(st.sampled_from(["NVIDIA", "NVIDIA", "AMD", None])) if kind is None else kind[0],
        model=draw(st.sampled_from(["H100 80GB HBM3", "A100 80GB", None])) if kind is None else kind[1],
        firmware=draw(st.sampled_from([GOOD_FW, GOOD_FW, DENIED_FW, OLD_FW, None])),
        firmware_change=fw_change,
        serial_swap=draw(st.one_of(st.none(), st.none(), st.integers(1, ticks))),
        join=draw(st.sampled_from([0, 0, 0, 1, 3, ticks // 2])),
        silences=draw(silences(ticks, 24)),
        skip_p=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
        nan_p=draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])),
        temp=draw(st.sampled_from([30, 45, 63, 64, 65, 66, 68, 74, 76, 84, 85, 86, 91, 92, 93, 100])),
        temp_jitter=draw(st.sampled_from([0, 1, 2, 5])),
        spike_p=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
        temp_limits=draw(st.sampled_from(["own", "own", "none", "flaky", "low", "throttled_only"])),
        temp_mem=draw(st.sampled_from([None, 50, 94, 96, 104, 106])),
        fan_rpm=draw(st.sampled_from([None, 0, 150, 299, 300, 450, 500, 501, 799, 800, 4000])),
        fan_ratio=draw(st.sampled_from([None, 0.0, 0.03, 0.05, 0.4])),
        fan_limit=draw(st.sampled_from([None, 100, 500])),
        fan_flicker=draw(st.sampled_from([0.0, 0.0, 0.3])),
        volt=draw(st.sampled_from([None, 0.9, 0.9, 0.75, 1.05])),
        volt_limits=draw(st.sampled_from(["own", "own", "none", "flaky"])),
        power=draw(st.sampled_from([None, 300, 685, 686, 700])),
        power_cap=draw(st.sampled_from([None, 700, 700, 500])),
        util=draw(st.sampled_from([None, 0.1, 0.3, 0.8, 0.9, 0.95])),
        mem=draw(st.sampled_from(["none", "util_low", "util_full", "util_edge", "usage_full", "usage_low", "flaky"])),
        width=draw(st.sampled_from([None, 16, 16, 8])),
        width_max=draw(st.sampled_from([None, 16, 16])),
        gen=draw(st.sampled_from([None, 5, 5, 4, 1, 7])),
        gen_max=draw(st.sampled_from([None, 5, 5])),
        link_flicker=draw(st.sampled_from([0.0, 0.0, 0.4])),
        status=draw(st.sampled_from(["none", "ok", "flip", "flip", *HW_STATES])),
        counters=counters,
        drivers=drivers,
    )
    for aspect, healthy in HEALTHY.items():
        if aspect not in wild:
            profile = dataclasses.replace(profile, **healthy)
    # Healthy devices of a node differ a little (their place in the airflow, their load), so a peer
    # comparison has something to weigh.
    if "thermal" not in wild:
        profile = dataclasses.replace(profile, temp=60 + draw(st.sampled_from([0, 0, 1, 2, 3])))
    if "link" not in wild:
        profile = dataclasses.replace(profile, util=load + draw(st.sampled_from([0.0, 0.0, 0.02, -0.03, 0.08])))
    return profile


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    ticks = draw(st.integers(5, 60))
    nodes = []
    for n in range(draw(st.integers(1, 3))):
        kind = draw(st.one_of(st.none(), st.sampled_from([("NVIDIA", "H100 80GB HBM3"), ("AMD", None)])))
        count = draw(st.integers(1, 4))
        load = draw(st.sampled_from([0.9, 0.75, 0.86]))
        devices = tuple(draw(device_profiles(f"gpu-{d}", ticks, kind, load)) for d in range(count))
        span = st.tuples(st.integers(0, ticks), st.integers(2, 30))
        nodes.append(
            NodeProfile(
                name=f"node-{n}",
                offset=draw(st.sampled_from([0, 0, 3, 7, -95, 95])),
                every=draw(st.sampled_from([1, 1, 2, 3])),
                silences=draw(silences(ticks, 12)),
                silent_rows=draw(st.booleans()),
                devices=devices,
                crash_every=draw(st.sampled_from([None, None, 1, 2, 4, 9])),
                brake=draw(st.one_of(st.none(), st.none(), span)),
                capped=draw(st.one_of(st.none(), span)),
                dip=draw(st.one_of(st.none(), span)),
                heat=draw(
                    st.one_of(
                        st.none(),
                        st.none(),
                        st.tuples(st.integers(0, ticks), st.integers(2, 30), st.sampled_from([5, 30])),
                    )
                ),
            )
        )
    return Fleet(draw(st.sampled_from(["A", "B"])), ticks, draw(st.integers(0, 2**32 - 1)), tuple(nodes))


def _silent(tick: int, spans: tuple[tuple[int, int], ...]) -> bool:
    return any(start <= tick < start + length for start, length in spans)


class DeviceSim:
    """One generated device: counters advance every tick, values are drawn around thresholds."""

    def __init__(self, p: DeviceProfile, rng: random.Random) -> None:
        self.p = p
        self.rng = rng
        self.counts = {key: float(c.init) for key, c in p.counters}
        self.counts.update({f"xid.{code}": float(c.init) for code, c in p.drivers})
        self.profiles = dict(p.counters) | {f"xid.{code}": c for code, c in p.drivers}
        self.flip_state = "ok"

    def attrs(self, tick: int) -> dict[str, str]:
        p = self.p
        out = {cv.HW_TYPE: "gpu"}
        if p.vendor is not None:
            out[cv.HW_VENDOR] = p.vendor
        if p.model is not None:
            out[cv.HW_MODEL] = p.model
        firmware = p.firmware
        if p.firmware_change is not None and tick >= p.firmware_change[0]:
            firmware = p.firmware_change[1]
        if firmware is not None:
            out[cv.HW_FIRMWARE_VERSION] = firmware
        swapped = p.serial_swap is not None and tick >= p.serial_swap
        out[cv.HW_SERIAL_NUMBER] = f"SN-{p.hw_id}" + ("-2" if swapped else "")
        return out

    def crash(self) -> None:
        """A job's crash on this GPU: an application XID and an out-of-memory event."""
        for key in ("xid.13", "errors.out_of_memory"):
            self.profiles.setdefault(key, QUIET)
            self.counts[key] = self.counts.get(key, 0.0) + 1.0

    def advance(self) -> None:
        rng = self.rng
        for key, c in self.profiles.items():
            if rng.random() < c.reset_p:
                self.counts[key] = float(rng.choice([0, 0, 1]))
            chance, largest = COUNTER_RATES[c.rate]
            if largest and rng.random() < chance:
                self.counts[key] += rng.randint(1, largest)

    def values(self, tick: int, heat: int = 0, dip: bool = False) -> dict[str, float]:
        p, rng = self.p, self.rng
        v: dict[str, float] = {}

        def maybe(key: str, value: float | None) -> None:
            if value is not None and rng.random() >= p.nan_p:
                v[key] = float(value)

        for key, value in self.counts.items():
            c = self.profiles[key]
            if (c.appear is None or tick >= c.appear) and rng.random() >= c.nan_p:
                v[key] = value
        temp = p.temp + heat + rng.randint(-p.temp_jitter, p.temp_jitter)
        if rng.random() < p.spike_p:
            temp += 15
        maybe("temp.gpu", temp)
        limits = {
            "own": (85, 88, 92),
            "low": (80, 83, 86),
            "none": (None, None, None),
            "throttled_only": (None, 84, None),
        }
        mode = p.temp_limits
        if mode == "flaky":
            mode = rng.choice(["own", "none"])
        degraded, throttled, critical = limits[mode]
        maybe("temp.gpu.limit.high.degraded", degraded)
        maybe("temp.gpu.limit.throttled", throttled)
        maybe("temp.gpu.limit.high.critical", critical)
        if p.temp_mem is not None:
            maybe("temp.memory", p.temp_mem + rng.randint(-1, 1))
            if p.temp_limits != "none":
                maybe("temp.memory.limit.high.degraded", 95)
                maybe("temp.memory.limit.high.critical", 105)
        flicker = rng.random() < p.fan_flicker
        if p.fan_rpm is not None:
            maybe("fan.speed", 4000 if flicker else p.fan_rpm)
        if p.fan_ratio is not None:
            maybe("fan.ratio", 0.4 if flicker else p.fan_ratio)
        maybe("fan.limit.low.critical", p.fan_limit)
        if p.volt is not None:
            maybe("volt", p.volt if rng.random() < 0.8 else 0.9)
            if p.volt_limits == "own" or (p.volt_limits == "flaky" and rng.random() < 0.5):
                maybe("volt.limit.low.critical", 0.8)
                maybe("volt.limit.high.critical", 1.0)
        if p.power is not None:
            maybe("power", p.power if rng.random() < 0.85 else 200)
        maybe("power.limit.max", p.power_cap)
        maybe("util", 0.2 if dip and p.util is not None else p.util)
        maybe("energy", 1e9 + tick)
        mem = p.mem if p.mem != "flaky" else rng.choice(["util_low", "util_full", "none", "usage_full"])
        if mem.startswith("util"):
            maybe("mem.util", {"util_low": 0.5, "util_full": 0.99, "util_edge": rng.choice([0.94, 0.95])}[mem])
        elif mem.startswith("usage"):
            maybe("mem.usage", 99 if mem == "usage_full" else 40)
            maybe("mem.limit", 100)
        down = rng.random() < p.link_flicker
        maybe("pcie.width", 8 if down else p.width)
        maybe("pcie.width.limit", p.width_max)
        maybe("pcie.gen", 3 if down else p.gen)
        maybe("pcie.gen.limit", p.gen_max)
        if p.status != "none":
            state = p.status
            if state == "flip":
                if rng.random() < 0.3:
                    self.flip_state = rng.choice(["ok", "degraded", "failed", "predicted_failure"])
                state = self.flip_state
            for s in HW_STATES:
                maybe(f"status.{s}", 1.0 if s == state else 0.0)
        return v


@dataclass
class Recorder:
    """Verdict streams, one list of comparable tuples per tick."""

    fast: list[list[tuple]] = field(default_factory=list)
    naive: list[list[tuple]] = field(default_factory=list)


def key_of(v: dict) -> tuple:
    return (
        v[cv.K8S_NODE_NAME_ATTR],
        v[cv.HW_ID],
        v["health"],
        v[cv.HW_STATE],
        tuple(v["reasons"]),
        v["remediation"],
        v["scope"],
        v.get("group"),
    )


def columns() -> dict[str, Column]:
    """The simulator's series kinds, and the throttle causes a source that tells them apart reports."""
    cols = gpu_columns()
    for reason in ("power_cap", "power_brake", "hw_slowdown"):
        cols[f"throttle.{reason}"] = Column(cv.HW_THROTTLE_TIME.name, attrs_of({cv.HW_THROTTLE_REASON: reason}))
    return cols


def run_fleet(fleet: Fleet, policy: policy_mod.Policy) -> Recorder:
    cols = columns()
    schema = Schema(cols.values())
    index = {key: schema.index(col) for key, col in cols.items()}
    fast = Classifier(policy, schema, interval_s=float(INTERVAL_S))
    naive = NaiveClassifier(policy, schema, interval_s=float(INTERVAL_S))
    rng = random.Random(fleet.seed)
    sims = {(n.name, d.hw_id): DeviceSim(d, rng) for n in fleet.nodes for d in n.devices}
    tables: dict[tuple, DeviceTable] = {}
    rec = Recorder()
    for tick in range(fleet.ticks):
        now_s = T0_S + tick * INTERVAL_S
        for node in fleet.nodes:
            if tick % node.every:
                continue
            node_silent = _silent(tick, node.silences)
            rows: list[tuple[str, dict[str, str], dict[str, float] | None]] = []
            crash = node.crash_every is not None and tick % node.crash_every == 0
            braked = node.brake is not None and _silent(tick, (node.brake,))
            capped = node.capped is not None and _silent(tick, (node.capped,))
            heat = node.heat[2] if node.heat is not None and _silent(tick, (node.heat[:2],)) else 0
            for d in node.devices:
                sim = sims[(node.name, d.hw_id)]
                sim.advance()
                if crash:
                    sim.crash()
                if braked:
                    sim.profiles.setdefault("throttle.power_brake", QUIET)
                    sim.counts["throttle.power_brake"] = sim.counts.get("throttle.power_brake", 0.0) + 9.0
                if capped:
                    sim.profiles.setdefault("throttle.power_cap", QUIET)
                    sim.counts["throttle.power_cap"] = sim.counts.get("throttle.power_cap", 0.0) + 7.0
                if tick < d.join:
                    continue
                silent = node_silent or _silent(tick, d.silences) or rng.random() < d.skip_p
                dipped = node.dip is not None and _silent(tick, (node.dip,))
                values = None if silent else sim.values(tick, heat, dipped)
                if values is None and not node.silent_rows:
                    continue
                rows.append((d.hw_id, sim.attrs(tick), values))
            if not rows:
                continue
            for _, _, values in rows:
                for key in values or {}:
                    if key.startswith("xid.") and key not in index:
                        index[key] = schema.index(driver_error_column(key.removeprefix("xid.")))
            ids = tuple(r[0] for r in rows)
            attrs = tuple(r[1] for r in rows)
            table_key = (node.name, ids, tuple(tuple(sorted(a.items())) for a in attrs))
            table = tables.setdefault(table_key, DeviceTable(node.name, ids, attrs))
            matrix = np.full((len(rows), len(schema)), np.nan)
            for i, (_, _, values) in enumerate(rows):
                for key, value in (values or {}).items():
                    matrix[i, index[key]] = value
            frame = Frame((now_s - node.offset) * NS, table, matrix)
            # Heard now in the reference clock, whatever the node's own clock says (as the fleet does).
            fast.ingest(frame, now_s * NS)
            naive.ingest(frame, now_s * NS)
        got = fast.evaluate(now_s * NS)
        want = naive.evaluate(now_s * NS)
        for verdict in got:
            assert isinstance(verdict.message, str) and verdict.message
        rec.fast.append(sorted(key_of(v.to_json()) for v in got))
        rec.naive.append(sorted(key_of(v) for v in want))
    return rec


def assert_same(rec: Recorder) -> None:
    for tick, (fast, naive) in enumerate(zip(rec.fast, rec.naive, strict=True)):
        assert fast == naive, f"tick {tick}: vectorised {fast} != naive {naive}"


#: Shrinking a failing fleet replays it thousands of times (minutes): opt in with
#: OTEL_DRA_TWIN_SHRINK=1. Without it a failure reports the generated fleet and the first
#: tick where the verdict streams differ.
PHASES = tuple(Phase) if os.environ.get("OTEL_DRA_TWIN_SHRINK") == "1" else (Phase.explicit, Phase.generate)


@settings(
    max_examples=int(os.environ.get("OTEL_DRA_TWIN_EXAMPLES", "150")),
    deadline=None,
    derandomize=True,
    database=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(fleet=fleets())
def test_vectorised_classifier_matches_naive_twin(policies: dict[str, policy_mod.Policy], fleet: Fleet) -> None:
    assert_same(run_fleet(fleet, policies[fleet.policy]))


# -- examples -------------------------------------------------------------------------------
COLS = columns()
NVIDIA_H100 = {cv.HW_TYPE: "gpu", cv.HW_VENDOR: "NVIDIA", cv.HW_MODEL: "H100 80GB HBM3"}


class Pair:
    """Both classifiers fed the same hand-written frames."""

    def __init__(self, policy: policy_mod.Policy) -> None:
        self.schema = Schema(COLS.values())
        self.fast = Classifier(policy, self.schema, interval_s=float(INTERVAL_S))
        self.naive = NaiveClassifier(policy, self.schema, interval_s=float(INTERVAL_S))
        self.tables: dict[tuple, DeviceTable] = {}
        self.fast_log: list[tuple] = []

    def feed(
        self,
        tick: int,
        node: str,
        devices: dict[str, dict[str, float]],
        attrs: dict[str, dict[str, str]] | None = None,
    ) -> None:
        """One frame of ``node`` at ``tick``; a device with no values is an all-NaN row (not read)."""
        ids = tuple(devices)
        attrs = attrs or {}
        per_device = tuple(attrs.get(hw_id, NVIDIA_H100) for hw_id in ids)
        table_key = (node, ids, tuple(tuple(sorted(a.items())) for a in per_device))
        table = self.tables.setdefault(table_key, DeviceTable(node, ids, per_device))
        matrix = np.full((len(ids), len(self.schema)), np.nan)
        for i, values in enumerate(devices.values()):
            for key, value in values.items():
                col = COLS[key] if key in COLS else driver_error_column(key.removeprefix("xid."))
                j = self.schema.index(col)
                if j >= matrix.shape[1]:
                    matrix = np.concatenate([matrix, np.full((len(ids), j + 1 - matrix.shape[1]), np.nan)], axis=1)
                matrix[i, j] = value
        frame = Frame((T0_S + tick * INTERVAL_S) * NS, table, matrix)
        self.fast.ingest(frame)
        self.naive.ingest(frame)

    def evaluate(self, tick: int) -> dict[tuple[str, str], tuple]:
        """Verdicts that changed at ``tick``, checked equal in both; by (node, hw.id)."""
        now = (T0_S + tick * INTERVAL_S) * NS
        fast = sorted(key_of(v.to_json()) for v in self.fast.evaluate(now))
        naive = sorted(key_of(v) for v in self.naive.evaluate(now))
        assert fast == naive, f"tick {tick}: vectorised {fast} != naive {naive}"
        self.fast_log += fast
        return {(k[0], k[1]): k[2:6] for k in fast}  # (scope and group: checked equal above)

    def current(self) -> dict[tuple[str, str], tuple]:
        out = {}
        for k in self.fast_log:
            out[(k[0], k[1])] = k[2:6]
        return out


def test_counter_reset_is_not_an_error(policies: dict[str, policy_mod.Policy]) -> None:
    pair = Pair(policies["A"])
    seen_reasons = set()
    for tick, uncorrected in enumerate([5, 5, 5, 0, 0, 1, 1, 1]):
        pair.feed(tick, "n", {"gpu-0": {"errors.uncorrected": uncorrected, "temp.gpu": 50}})
        pair.evaluate(tick)
        seen_reasons |= {r for v in pair.current().values() for r in v[2]}
        if tick == 4:
            assert seen_reasons == set(), "a counter going down is a reset, not errors"
    # 0 -> 1 after the reset is one real uncorrected error.
    assert pair.current()[("n", "gpu-0")][:3] == ("Unhealthy", "failed", ("memory_ecc",))


def test_first_values_are_a_baseline_and_new_series_count_whole(policies: dict[str, policy_mod.Policy]) -> None:
    pair = Pair(policies["A"])
    pair.feed(0, "n", {"gpu-0": {"errors.uncorrected": 7, "temp.gpu": 50}, "gpu-1": {"temp.gpu": 50}})
    assert {k: v[2] for k, v in pair.evaluate(0).items()} == {("n", "gpu-0"): (), ("n", "gpu-1"): ()}
    # A series that appears on a known device: its whole value is new.
    pair.feed(1, "n", {"gpu-0": {"errors.uncorrected": 7, "temp.gpu": 50}, "gpu-1": {"xid.79": 1, "temp.gpu": 50}})
    changed = pair.evaluate(1)
    assert changed == {("n", "gpu-1"): ("Unhealthy", "failed", ("driver_errors",), "reboot_node")}


def test_single_temperature_spike_is_not_thermal(policies: dict[str, policy_mod.Policy]) -> None:
    pair = Pair(policies["A"])
    for tick in range(12):
        pair.feed(tick, "n", {"gpu-0": {"temp.gpu": 99 if tick == 5 else 60, "temp.gpu.limit.high.degraded": 85}})
        pair.evaluate(tick)
    assert pair.current()[("n", "gpu-0")] == ("Healthy", "ok", (), "none")
    assert len(pair.fast_log) == 1  # the first verdict only: the spike changed nothing


def test_sustained_heat_is_thermal_and_repeats_escalate(policies: dict[str, policy_mod.Policy]) -> None:
    pair = Pair(policies["A"])
    remediations = []
    # Apart by more than the rate span and the hold (policy A: 2m + 30s): two episodes, not one that recurs.
    hot = set(range(0, 6)) | set(range(28, 34))
    for tick in range(40):
        pair.feed(tick, "n", {"gpu-0": {"temp.gpu": 90 if tick in hot else 60}})
        changed = pair.evaluate(tick)
        if ("n", "gpu-0") in changed and changed[("n", "gpu-0")][2]:
            remediations.append(changed[("n", "gpu-0")][3])
    # Escalation after 2 (policy A): the second episode climbs the thermal ladder.
    assert remediations == ["reduce_load", "replace_device"]


def test_node_silence_is_stale_and_device_silence_is_device_lost(policies: dict[str, policy_mod.Policy]) -> None:
    pair = Pair(policies["A"])
    ok = {"temp.gpu": 50}
    for tick in range(3):
        pair.feed(tick, "a", {"gpu-0": ok, "gpu-1": ok})
        pair.feed(tick, "b", {"gpu-0": ok})
        pair.evaluate(tick)
    for tick in range(3, 9):  # node a: gpu-1 stops; node b stops altogether
        pair.feed(tick, "a", {"gpu-0": ok})
        changed = pair.evaluate(tick)
        if tick < 6:  # 30 s stale timeout: 10, 20, 30 s of silence are not yet news
            assert changed == {}
    state = pair.current()
    assert state[("a", "gpu-0")] == ("Healthy", "ok", (), "none")
    assert state[("a", "gpu-1")] == ("Unhealthy", "failed", ("device_lost",), "reboot_node")
    assert state[("b", "gpu-0")] == ("Unknown", None, ("stale",), "none")


def test_a_gap_widens_the_stale_timeout(policies: dict[str, policy_mod.Policy]) -> None:
    pair = Pair(policies["A"])
    history = []
    for tick in range(15):
        if tick in (0, 1, 5):  # steps of 10 s and 40 s: a 25 s interval, a timeout of 2.5 x 25 = 62.5 s
            pair.feed(tick, "a", {"gpu-0": {"temp.gpu": 50}})
        pair.evaluate(tick)
        history.append(pair.current()[("a", "gpu-0")][0])
    assert history == ["Healthy"] * 12 + ["Unknown"] * 3


def test_attributes_that_change_while_a_device_is_not_read_are_noted(policies: dict[str, policy_mod.Policy]) -> None:
    """A node's new device table arrives while one of its devices is not read (an all-NaN row);
    the next frames reuse that table and read the device: its new attributes count.
    (Found by the twin: ``Classifier.ingest`` looks at attributes only when the table object
    changes or a device is new, and the new table was first seen while gpu-1 was not read.)"""
    pair = Pair(policies["A"])
    ok = {"temp.gpu": 50}
    denied = {"gpu-0": NVIDIA_H100, "gpu-1": NVIDIA_H100 | {cv.HW_FIRMWARE_VERSION: DENIED_FW}}
    updated = {"gpu-0": NVIDIA_H100, "gpu-1": NVIDIA_H100 | {cv.HW_FIRMWARE_VERSION: GOOD_FW}}
    pair.feed(0, "n", {"gpu-0": ok, "gpu-1": ok}, denied)
    assert pair.evaluate(0)[("n", "gpu-1")][2] == ("firmware",)
    pair.feed(1, "n", {"gpu-0": ok, "gpu-1": {}}, updated)  # firmware updated; gpu-1 not read this time
    pair.evaluate(1)
    pair.feed(2, "n", {"gpu-0": ok, "gpu-1": ok}, updated)  # the same table again, gpu-1 read
    assert pair.evaluate(2) == {("n", "gpu-1"): ("Healthy", "ok", (), "none")}


# -- peers under the same load, each boundary once (policy A: margin 3, sustain 20 s, 2 slot nodes) -----------
def run_peers(pair: Pair, ticks: int, nodes: dict[str, dict[str, tuple[float, float]]], spike: int = -1) -> None:
    """Feed ``nodes`` (node -> device -> (temperature, utilization)) for ``ticks`` ticks, both classifiers alike;
    at tick ``spike`` every node's gpu-3 reads 15 Cel hotter once."""
    for tick in range(ticks):
        for node, devices in nodes.items():
            frame = {
                dev: {"temp.gpu": temp + (15 if tick == spike and dev == "gpu-3" else 0), "util": util}
                for dev, (temp, util) in devices.items()
            }
            pair.feed(tick, node, frame)
        pair.evaluate(tick)


def test_a_gpu_hotter_than_its_peers_and_not_a_spike(policies: dict[str, policy_mod.Policy]) -> None:
    pair = Pair(policies["A"])
    node = {
        "gpu-0": (60.0, 0.9),
        "gpu-1": (60.0, 0.9),
        "gpu-2": (64.0, 0.9),
        "gpu-3": (61.0, 0.9),
        "gpu-4": (60.0, 0.9),
    }
    run_peers(pair, 12, {"n": node}, spike=5)
    state = pair.current()
    assert state[("n", "gpu-2")] == ("Healthy", "predicted_failure", ("thermal",), "reduce_load")
    assert state[("n", "gpu-3")] == ("Healthy", "ok", (), "none")  # one sample 15 Cel up: its median is not


def test_where_its_slot_is_not_known_a_gpu_needs_the_wider_margin(policies: dict[str, policy_mod.Policy]) -> None:
    """3.2 Cel over its node's others (policy A: margin 3, unknown_slot_margin 3.5). On its model's one node nothing
    says it is not its slot (rear slots run hotter): under the bar. With the same slot level on two more nodes, the
    slot is known and it is the device."""
    node = {"gpu-0": (60.0, 0.9), "gpu-1": (60.0, 0.9), "gpu-2": (63.2, 0.9), "gpu-3": (60.0, 0.9)}
    alone = Pair(policies["A"])
    run_peers(alone, 12, {"n": node})
    assert alone.current()[("n", "gpu-2")] == ("Healthy", "ok", (), "none")
    known = Pair(policies["A"])
    level = dict.fromkeys(node, (60.0, 0.9))
    run_peers(known, 12, {"n": node, "m": level, "o": level})
    assert known.current()[("n", "gpu-2")] == ("Healthy", "predicted_failure", ("thermal",), "reduce_load")


def test_an_idle_node_does_not_say_what_a_slot_adds_at_load(policies: dict[str, policy_mod.Policy]) -> None:
    """The same 3.2 Cel with its slot on two idle nodes besides (policy A: min_slot_nodes 2, min_utilization 0.8):
    idle GPUs make no heat for a slot to add, so its slot is as unknown as on its model's one node."""
    node = {"gpu-0": (60.0, 0.9), "gpu-1": (60.0, 0.9), "gpu-2": (63.2, 0.9), "gpu-3": (60.0, 0.9)}
    idle = dict.fromkeys(node, (35.0, 0.05))
    pair = Pair(policies["A"])
    run_peers(pair, 12, {"n": node, "m": idle, "o": idle})
    assert pair.current()[("n", "gpu-2")] == ("Healthy", "ok", (), "none")


def test_a_slot_that_runs_hot_on_every_node_is_not_a_fault(policies: dict[str, policy_mod.Policy]) -> None:
    pair = Pair(policies["A"])
    node = {"gpu-0": (60.0, 0.9), "gpu-1": (60.0, 0.9), "gpu-2": (65.0, 0.9)}
    run_peers(pair, 12, {"a": node, "b": node})  # gpu-2 runs 5 Cel hot on both nodes: its slot, not it
    assert {key: value[1] for key, value in pair.current().items()} == dict.fromkeys(
        [(n, f"gpu-{g}") for n in "ab" for g in range(3)], "ok"
    )


def test_a_gpu_at_another_load_than_its_peers_is_not_judged_against_them(
    policies: dict[str, policy_mod.Policy],
) -> None:
    pair = Pair(policies["A"])
    node = {"gpu-0": (60.0, 0.86), "gpu-1": (60.0, 0.86), "gpu-2": (60.0, 0.86), "gpu-3": (68.0, 1.0)}
    run_peers(pair, 12, {"n": node})  # 0.14 busier: the slope's 4.2 Cel would leave 3.8 over, but it is not a peer
    assert pair.current()[("n", "gpu-3")][1] == "ok"


def test_the_spread_is_taken_at_the_devices_load(policies: dict[str, policy_mod.Policy]) -> None:
    """Eight or more devices of a cohort in one utilization bin have their own spread of residuals: wide among
    the busiest here (5 Cel from their median is within it), narrow in the bin below (where 3 Cel is not)."""
    pair = Pair(policies["A"])
    patterns = {"a": (60, 62.5, 65, 67.5, 70), "b": (70, 67.5, 65, 62.5, 60), "c": (65, 60, 70, 62.5, 67.5)}
    nodes = {}
    for name, temps in patterns.items():
        busy = {f"gpu-{g}": (temp, 0.9) for g, temp in enumerate(temps)}
        steady = {f"gpu-{g}": (58.0 if (name, g) == ("c", 8) else 55.0, 0.82) for g in range(5, 9)}
        nodes[name] = busy | steady
    run_peers(pair, 12, nodes)
    state = {key: value[1] for key, value in pair.current().items()}
    assert state.pop(("c", "gpu-8")) == "predicted_failure"  # 3 Cel above peers that never differ
    assert set(state.values()) == {"ok"}  # the busiest 5 Cel apart: within their own spread


def test_cap_time_is_compared_at_the_load_of_its_own_span(tmp_path: Path) -> None:
    """A 30 s window and a 2-minute duty span: a GPU capped all along whose node just dipped for a checkpoint
    is compared over the duty span with the peers busy then (capped as much), not with the dipped ones."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "window: 30s\nhorizon: {bucket: 20s, duty_span: 2m, rate_span: 2m}\n"
        "rules: {power_throttling: {min_peers: 2, peer_quantile: 0.5, peer_margin: 0.1}}\n"
    )
    pair = Pair(policy_mod.load(path))
    for tick in range(16):
        dip = tick >= 14
        for node, capped in (("a", {"gpu-0", "gpu-1", "gpu-2"}), ("b", {"gpu-0"})):
            frame = {
                f"gpu-{g}": {
                    "util": 0.7 if (dip and node == "b") else 0.95,
                    "throttle.power_cap": 10.0 * tick if f"gpu-{g}" in capped else 0.0,
                }
                for g in range(3)
            }
            pair.feed(tick, node, frame)
        pair.evaluate(tick)
    assert {key: value[1] for key, value in pair.current().items()} == dict.fromkeys(
        [(n, f"gpu-{g}") for n in "ab" for g in range(3)], "ok"
    )


def test_a_limit_no_series_reports_is_seen_in_the_power_drawn_at_the_cap() -> None:
    """No power.limit series: gpu-3 sits at its cap all the time at 450 W while the job holds its node's others at
    700 W (read at 560 W in every third sample, a communication phase); its peers' capped samples that read low are not
    a lowered limit (their highest is their cap). Both classifiers say the same at every tick."""
    pair = Pair(policy_mod.load())
    for tick in range(14):
        frame = {
            f"gpu-{g}": {
                "util": 0.95,
                "power": 450.0 if g == 3 else (560.0 if (tick + g) % 3 == 0 else 699.0),
                "throttle.power_cap": (10.0 if g == 3 else 7.0) * tick,
            }
            for g in range(4)
        }
        pair.feed(tick, "a", frame)
        pair.evaluate(tick)
    states = {key: value[1:3] for key, value in pair.current().items()}
    assert states == {
        **{("a", f"gpu-{g}"): ("ok", ()) for g in range(3)},
        ("a", "gpu-3"): ("degraded", ("power_throttling",)),
    }
