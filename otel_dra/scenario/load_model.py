"""The job model stepped: every lane of a fleet (or a node) at once, devices as rows, and power under its caps.

Why vectorised: the generator steps thousands of GPUs each second, so utilization, memory and demand are
numpy expressions over lanes and devices; a Python loop touches only the few lanes whose run, dip or
burst changes at that step. Where each number comes from is in docs/load-profiles.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from otel_dra.scenario.jobs import (
    BURST_ADD,
    BURST_EVERY_S,
    BURST_LEN_S,
    DIURNAL_PEAK_HOUR_UTC,
    INFERENCE_FULL_UTIL,
    TRAFFIC_SIGMA,
    TRAFFIC_TAU_S,
    Lane,
    uniform_in,
)

# -- devices ---------------------------------------------------------------------------------------------
#: A GPU's power demand at full compute as a share of its cap: same-SKU GPUs differ by several percent in power
#: and performance (Sinha et al., SC'22), so some sit at the cap more of the time than others.
EFFICIENCY: Final = (1.02, 1.10)
#: Relative spread of power demand within a phase, second to second.
DEMAND_SIGMA: Final = 0.03
#: Memory an idle GPU shows (no process: the driver's own reservation).
IDLE_MEM: Final = 0.005
#: Thermal layout under load: the hottest possible healthy GPU at its cap stays this far under high.degraded;
#: rear slots of a chassis run hotter (the same pattern on every node), nodes' inlets differ (each degree
#: of cooler inlet air a degree cooler GPU), and devices spread (paste, heatsink). The hottest GPUs of a fleet
#: sit 2-5 °C under the limit at their cap, a few degrees more over a job's compute and communication phases.
MIN_HEADROOM_C: Final = 0.8
SLOT_PATTERN_C: Final = (0.0, 0.8, 1.5, 0.6, 3.0, 4.2, 5.0, 3.6)  # 8 slots: front row, then the rear (2-5 °C hotter)
SPREAD_C: Final = 1.0
SPREAD_MAX_C: Final = 2.0


def slot_offsets(slots: int) -> np.ndarray:
    """Each slot's extra heat (°C) at full load in a chassis of ``slots`` GPUs."""
    pattern = np.asarray(SLOT_PATTERN_C)
    return pattern[(np.arange(slots) * len(pattern)) // max(slots, 1)]


def full_load_temperature(
    limit_c: np.ndarray, slot_c: np.ndarray, inlet_gap_c: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Each GPU's temperature (°C) with power held at its cap: ``limit - MIN_HEADROOM_C`` for the hottest
    possible one (hottest inlet, hottest slot, the spread's top), less each way it is cooler (``inlet_gap_c``:
    how much cooler its node's inlet air is than the hottest)."""
    spread = np.clip(rng.normal(0.0, SPREAD_C, len(limit_c)), -SPREAD_MAX_C, SPREAD_MAX_C)
    cooler = inlet_gap_c + (max(SLOT_PATTERN_C) - slot_c) + (SPREAD_MAX_C - spread)
    return limit_c - MIN_HEADROOM_C - cooler


def diurnal(unix_s: float) -> float:
    """Traffic relative to its daily peak at ``unix_s``: 1.0 at DIURNAL_PEAK_HOUR_UTC, 0.1 twelve hours off."""
    hour = (unix_s / 3600.0) % 24.0
    return 0.55 + 0.45 * math.cos(2.0 * math.pi * (hour - DIURNAL_PEAK_HOUR_UTC) / 24.0)


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """Φ(x), vectorised (Abramowitz and Stegun 7.1.26: error under 1.5e-7)."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


@dataclass
class LoadSample:
    """One step of the load, one value per device (row); rows the model does not manage hold NaN or False."""

    util: np.ndarray
    mem: np.ndarray  # share of the device's memory
    demand_w: np.ndarray  # what the device would draw this second without a cap
    running: np.ndarray  # a process holds the device (else: idle, PCIe link trained down)
    compute: np.ndarray  # share of the step's seconds in compute phases
    hi_w: np.ndarray  # mean demand in compute phases
    lo_w: np.ndarray  # mean demand otherwise


@dataclass
class Throttled:
    """Power after the caps, and the seconds each ``hw.throttle.reason`` accrued over the step."""

    power_w: np.ndarray
    power_cap_s: np.ndarray
    power_brake_s: np.ndarray
    hw_slowdown_s: np.ndarray


def power_and_throttle(
    s: LoadSample,
    cap_w: np.ndarray,
    dt: float,
    derate: np.ndarray | float = 1.0,
    brake_w: np.ndarray | None = None,
    brake_share: np.ndarray | float = 1.0,
    slowdown: np.ndarray | None = None,
    slowdown_share: np.ndarray | float = 0.0,
) -> Throttled:
    """Power from demand under the device's power limit ``cap_w`` (its own thermal derating first), and the
    throttle time of the step: the software power cap accrues the expected share of the step the demand is
    over the cap (NVML's SW power cap); ``brake_w`` (a node's power brake, where asserted; NaN elsewhere) holds
    power under it and accrues ``brake_share`` of the step instead; ``slowdown`` (the device's hardware slowdown
    asserted now) halves power, and accrues ``slowdown_share`` of the step."""
    demand = s.demand_w * derate
    power = np.minimum(demand, cap_w)
    hi = np.maximum(s.hi_w * derate, 1e-9)
    lo = np.maximum(s.lo_w * derate, 1e-9)
    share = s.compute * normal_cdf((hi - cap_w) / (DEMAND_SIGMA * hi))
    share = share + (1.0 - s.compute) * normal_cdf((lo - cap_w) / (DEMAND_SIGMA * lo))
    zero = np.zeros_like(power)
    brake_s, slow_s = zero, zero
    if brake_w is not None:
        braked = ~np.isnan(brake_w)
        power = np.where(braked, np.minimum(power, np.nan_to_num(brake_w, nan=np.inf)), power)
        share = np.where(braked, 0.0, share)
        brake_s = np.where(braked, brake_share * dt, 0.0)
    if slowdown is not None:  # asserted now: clocks halved; over the step it holds ``slowdown_share`` of the time
        power = np.where(slowdown, power * 0.5, power)
        slow = np.broadcast_to(np.asarray(slowdown_share, float), power.shape)
        slow_s = slow * dt
        share = share * (1.0 - slow)
    return Throttled(power, share * dt, brake_s, slow_s)


class LoadModel:
    """Every lane of a fleet (or a node) stepped together; devices are rows.

    ``lanes[i]`` holds rows ``rows[i]`` (in slot order); ``idle_w``/``cap_w`` are each row's idle power and
    nominal power limit. Rows in no lane are not managed (``managed`` False): the caller keeps its own
    model there. ``rng`` draws the second-to-second noise (the lanes have their own, for their timelines).
    ``t0_unix_s`` places time 0 in the day, for inference traffic.
    """

    def __init__(
        self,
        lanes: Sequence[Lane],
        rows: Sequence[Sequence[int]],
        idle_w: np.ndarray,
        cap_w: np.ndarray,
        rng: np.random.Generator,
        t0_unix_s: float = 0.0,
        eff: np.ndarray | None = None,
    ) -> None:
        n = len(idle_w)
        self.lanes = list(lanes)
        self.rng = rng
        self.t0 = t0_unix_s
        self.idle_w = np.asarray(idle_w, float)
        self.cap_w = np.asarray(cap_w, float)
        self.lane_of = np.full(n, -1, np.intp)
        self.rows = [np.asarray(r, np.intp) for r in rows]
        for i, r in enumerate(self.rows):
            self.lane_of[r] = i
        self.managed = self.lane_of >= 0
        self.eff = eff if eff is not None else rng.uniform(EFFICIENCY[0], EFFICIENCY[1], n)
        self.mem_offset = np.abs(rng.normal(0.0, 0.002, n))  # some ranks hold a little more than the job level
        L = len(self.lanes)
        self._lane = np.maximum(self.lane_of, 0)
        self.training = np.array([lane.training for lane in self.lanes], bool)
        self.running = np.zeros(L, bool)
        self.start = np.zeros(L)
        self.ramp = np.ones(L)
        self.util = np.zeros(L)
        self.mem = np.full(L, IDLE_MEM)
        self.compute = np.zeros(L)
        self.comm = np.zeros(L)
        self.dip = np.full(L, np.nan)
        self.burst = np.zeros(L)
        self.burst_until = np.full(L, -np.inf)
        self.next_burst = np.array([float(rng.exponential(BURST_EVERY_S)) for _ in range(L)])
        self.ou = np.zeros(L)
        self.next_change = np.full(L, -np.inf)
        self._pos = [0] * L  # index of the current (or next) run per lane
        self._last_t: float | None = None

    # -- lane state -------------------------------------------------------------------------------------
    def _update(self, i: int, t: float) -> None:
        lane = self.lanes[i]
        if lane.kind == "vacant":
            self.running[i], self.next_change[i] = False, math.inf
            return
        if lane.horizon < t + 3600.0:
            lane.extend(t + 7200.0)
        runs, k = lane.runs, self._pos[i]
        while k < len(runs) and runs[k].end <= t:
            k += 1
        self._pos[i] = k
        nxt = lane.horizon
        if k < len(runs) and runs[k].start <= t:
            run = runs[k]
            self.running[i] = True
            self.start[i], self.ramp[i] = run.start, max(run.ramp_s, 1.0)
            self.util[i], self.mem[i], self.compute[i], self.comm[i] = run.util, run.mem, run.compute, run.comm
            self.dip[i] = np.nan
            nxt = run.end
            if t < run.start + run.ramp_s:
                nxt = min(nxt, run.start + run.ramp_s)
            for a, b, u in run.dips:
                if a <= t < b:
                    self.dip[i] = u
                    nxt = min(nxt, b)
                    break
                if a > t:
                    nxt = min(nxt, a)
                    break
        else:
            self.running[i] = False
            if k < len(runs):
                nxt = runs[k].start
        if not lane.training:  # traffic bursts: one at a time, about every BURST_EVERY_S
            if t >= self.burst_until[i]:
                self.burst[i] = 0.0
            if t >= self.next_burst[i]:
                self.burst[i] = uniform_in(self.rng, BURST_ADD)
                self.burst_until[i] = t + uniform_in(self.rng, BURST_LEN_S)
                self.next_burst[i] = self.burst_until[i] + float(self.rng.exponential(BURST_EVERY_S))
            nxt = min(nxt, self.burst_until[i] if self.burst[i] > 0 else self.next_burst[i])
        self.next_change[i] = max(nxt, t + 1e-6)

    def step(self, t: float) -> LoadSample:
        """The load at ``t`` seconds (after the previous step; the first may be anywhere)."""
        dt = 0.0 if self._last_t is None else max(0.0, t - self._last_t)
        self._last_t = t
        for i in np.nonzero(self.next_change <= t)[0]:
            self._update(int(i), t)
        rng, L, n = self.rng, len(self.lanes), len(self.lane_of)
        z_lane = rng.standard_normal(L)
        phase = rng.random(L)
        z_row = rng.standard_normal((2, n))
        since = t - self.start
        ramping = self.running & (since < self.ramp)
        # Inference traffic: diurnal x bursts, with a slow wander (an Ornstein-Uhlenbeck process per replica).
        keep = math.exp(-dt / TRAFFIC_TAU_S) if dt > 0 else 1.0
        self.ou = self.ou * keep + TRAFFIC_SIGMA * math.sqrt(max(0.0, 1.0 - keep * keep)) * z_lane
        traffic = np.clip(self.util * diurnal(self.t0 + t) * (1.0 + self.burst) + self.ou, 0.05, 0.95)
        level = np.where(self.training, np.where(np.isnan(self.dip), self.util, self.dip), traffic)
        lane_util = np.where(self.running, np.where(ramping, 0.15, level), 0.0)
        frac = np.clip(since / self.ramp, 0.0, 1.0)
        lane_mem = np.where(self.running, IDLE_MEM + (self.mem - IDLE_MEM) * frac, IDLE_MEM)
        # Training: a synchronous job's GPUs are in compute or communication phases together.
        steady = self.running & self.training & ~ramping & np.isnan(self.dip)
        in_compute = steady & (phase < self.compute)
        lane_c = np.where(steady, self.compute, 0.0)

        li = self._lane
        managed = self.managed
        run = self.running[li] & managed
        util = np.where(run, np.clip(lane_util[li] + 0.01 * z_row[0], 0.0, 1.0), 0.0)
        mem = np.where(run, np.clip(lane_mem[li] + self.mem_offset, 0.0, 0.995), IDLE_MEM)
        idle, cap, eff = self.idle_w, self.cap_w, self.eff
        hi_w = eff * cap
        noise = 1.0 + DEMAND_SIGMA * z_row[1]
        steady_r = steady[li] & managed
        training_r = self.training[li]
        comm_w = self.comm[li] * cap
        # Other rows: a level of activity between idle and full demand.
        activity = np.where(training_r, util, np.minimum(util / INFERENCE_FULL_UTIL, 1.15))
        other_w = idle + (hi_w - idle) * activity
        mean_lo = np.where(steady_r, comm_w, np.where(run, other_w, idle))
        demand = np.where(steady_r, np.where(in_compute[li], hi_w, comm_w), mean_lo) * noise
        return LoadSample(
            util=np.where(managed, util, np.nan),
            mem=np.where(managed, mem, np.nan),
            demand_w=np.where(managed, demand, np.nan),
            running=run,
            compute=np.where(steady_r, lane_c[li], 0.0),
            hi_w=np.where(steady_r, hi_w, mean_lo),
            lo_w=mean_lo,
        )

    def crashes_between(self, lo: float, hi: float) -> Iterator[tuple[np.ndarray, str]]:
        """Crashes at times in (lo, hi]: the rows the crashed job held and its application XID (the caller
        adds that XID, on NVIDIA devices, and one out-of-memory event on each row)."""
        for lane, rows in zip(self.lanes, self.rows, strict=True):
            for run in lane.runs:
                if run.crashed and lo < run.end <= hi:
                    yield rows, lane.jobs[run.job].xid

    def expected_demand_w(self, rows: np.ndarray, t: float) -> np.ndarray:
        """A row's mean demand at ``t`` from its lane's schedule, noise aside (what the planner sizes thermal
        faults by): the job's phase mix while it runs, idle in gaps."""
        out = self.idle_w[rows].astype(float).copy()
        for j, row in enumerate(np.atleast_1d(rows)):
            i = int(self.lane_of[row])
            if i < 0:
                continue
            run = self.lanes[i].run_at(t)
            if run is None:
                continue
            hi = self.eff[row] * self.cap_w[row]
            if self.lanes[i].training:
                mean = run.compute * min(hi, self.cap_w[row]) + (1 - run.compute) * run.comm * self.cap_w[row]
            else:
                a = min(run.util * diurnal(self.t0 + t) / INFERENCE_FULL_UTIL, 1.0)
                mean = min(self.idle_w[row] + (hi - self.idle_w[row]) * a, self.cap_w[row])
            out[j] = mean
        return out
