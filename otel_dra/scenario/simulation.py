"""The fleet's simulation: its state, devices as rows and series as columns, stepped once per second.

Why one matrix: every quantity of every device is one numpy expression per step (no Python loop over
devices), and a line of the recording is a gather of the matrix's cells. The plan's parameters
(:mod:`otel_dra.scenario.physics`) say which device has which fault from when; the plan's events are
the discrete changes (a counter step, a status, a device coming or going, an agent restart).
"""

from __future__ import annotations

import numpy as np

from otel_dra.scenario import load as wl
from otel_dra.scenario.plan import US, Event, Plan
from otel_dra.scenario.series import DRIVER_CODES, KEY, SERIES, STATUS_STATES


def _phase(t: float, on: np.ndarray, period: np.ndarray, duty: np.ndarray) -> np.ndarray:
    """Rows whose intermittent fault is in its on part at ``t``."""
    since = t - on
    return (since >= 0) & (np.mod(since, period) < duty * period)


_POISSON = np.array([KEY[k] for k in ("err.corrected", "err.link.pcie", "err.link.nvlink", "err.link.xgmi")])
_POISSON = np.append(_POISSON, KEY["err.link.other"])
_COUNTERS = np.array([i for i, s in enumerate(SERIES) if s.monotonic])
_DRIVERS = np.array([KEY[f"err.driver.{c}"] for c in DRIVER_CODES])
_STATUS = np.array([KEY[f"status.{s}"] for s in STATUS_STATES])


class FleetSim:
    """The fleet's state, devices as rows: one :meth:`step` per second of true time."""

    def __init__(self, plan: Plan, rng: np.random.Generator) -> None:
        self.plan, self.p, self.rng = plan, plan.params, rng
        self.V = np.ascontiguousarray(plan.initial.copy())
        self.flat = self.V.reshape(-1)
        n = len(plan.devices)
        self.on = np.zeros(self.V.shape, bool)
        for d in plan.devices:
            self.on[d.row, [KEY[k] for k in d.series]] = True
        self.on[:, _DRIVERS] = self.V[:, _DRIVERS] > 0  # XID series from before the recording
        self.present = self.p["present"].copy()
        self.job = self.p["job"].copy()
        self.util = self.job.copy()
        self.mem = self.p["mem"].copy()
        p = self.p
        self.temp = p["ambient"] + p["r"] * (p["idle"] + self.job * (0.9 * p["cap"] - p["idle"]))
        self.rows = np.arange(n)
        self.node_start = [node.agent_start_ns for node in plan.nodes]
        self.start_override: dict[tuple[int, int], int] = {}
        self.version = [0] * len(plan.nodes)
        self.alpha = 1.0 - np.exp(-1.0 / p["tau"])  # the temperature's first-order lag over one second
        # Under load the job model drives the busy nodes' GPUs (plan.workload; None: idle, the code as before).
        self.load = plan.workload
        self.managed = self.load.managed if self.load is not None else np.zeros(n, bool)
        self.gen_max = plan.initial[:, KEY["pcie.gen"]].copy()
        self.tells_causes = self.on[:, KEY["throttle.power_cap"]].copy()  # reports power_cap, not power
        self.step(0, 0.0)

    def step(self, t: int, dt: float) -> None:
        """Advance to grid second ``t`` (``dt`` seconds after the last step: 1, or 0 for the first)."""
        p, rng, V, n = self.p, self.rng, self.V, len(self.job)
        lo, hi = np.maximum, np.minimum  # np.clip costs more than both on arrays this small
        z = rng.standard_normal((7, n))
        u = rng.random((3, n))
        if dt > 0:
            change = (u[0] < dt / 900.0) & ~p["steady"]
            self.job = np.where(change, 0.35 + 0.6 * u[1], self.job)
        decay = np.exp(-dt / 20.0)
        self.util = hi(lo(self.job + (self.util - self.job) * decay + 0.01 * z[0], 0.02), 1.0)
        s = self.load.step(float(t)) if self.load is not None else None
        m = self.managed
        util = self.util if s is None else np.where(m, s.util, self.util)

        # Power: demand from utilization, held down by the device's own thermal throttling, pinned at the
        # cap while power-throttled.
        cap, idle = p["cap"], p["idle"]
        throttled = (t >= p["throttle_on"]) | _phase(t, p["cycle_on"], p["cycle_period"], p["cycle_duty"])
        demand = idle + self.util * (0.9 * cap - idle) + 0.004 * z[1] * cap
        hot = self.temp - p["throttle_c"]
        power = hi(demand * lo(1.0 - 0.06 * lo(hot, 0.0), 0.6), cap)
        power = np.where(throttled, cap * (1.0 - 0.004 * u[1]), power)
        if s is not None:  # under load: the job's demand under the device's limit (lowered by a throttling fault)
            limit = np.where(throttled, cap * p["limit_factor"], cap)
            brake_w = np.where(m & (t >= p["brake_on"]), p["brake_w"], np.nan)
            slowing = t >= p["slow_on"]
            slowdown = slowing & (np.mod(t + p["slow_phase"], 60.0) < p["slow_share"] * 60.0)
            derate = lo(1.0 - 0.06 * lo(hot, 0.0), 0.6)
            th = wl.power_and_throttle(
                s, limit, dt, derate, brake_w, p["brake_share"], slowdown, np.where(slowing, p["slow_share"], 0.0)
            )
            power = np.where(m, th.power_w, power)

        # Cooling: the fan follows temperature, limited by what a decaying or stalled fan can still do;
        # less airflow, more heat. Drift and excursions add heat the fan can't remove.
        capability = hi(lo(1.0 - (t - p["fan_decay_on"]) / p["fan_decay_len"], 0.0), 1.0)
        capability = np.where(_phase(t, p["stall_on"], p["stall_period"], p["stall_duty"]), 0.0, capability)
        controller = hi(lo(0.35 + (self.temp - 45.0) / 80.0, 0.35), 1.0)
        ratio = hi(lo(controller * capability + 0.002 * z[2], 0.0), 1.0)
        cool = 1.0 + 1.3 * lo(1.0 - ratio / 0.35, 0.0)
        extra = p["drift_extra"] * hi(lo((t - p["drift_on"]) / p["drift_len"], 0.0), 1.0)
        excursion = _phase(t, p["excursion_on"], p["excursion_period"], p["excursion_duty"])
        extra = extra + np.where(excursion, p["excursion_extra"], 0.0)
        r = p["r"] if s is None else np.where(t >= p["hot_on"], p["r_hot"], p["r"])  # a hot GPU: its paste dried
        target = p["ambient"] + r * power * cool + extra
        alpha = self.alpha if dt == 1.0 else 1.0 - np.exp(-dt / p["tau"])
        if s is not None and dt == 0:  # the first step: a busy GPU starts where its load holds it
            alpha = np.where(m, 1.0, alpha)
        self.temp = self.temp + (target - self.temp) * alpha + 0.1 * z[3]

        self.mem = hi(lo(self.mem + 0.002 * z[4], 0.1), 0.88)
        pressure = hi(lo(p["mempress_level"] + 0.003 * z[5], 0.97), 0.998)
        mem = np.where(t >= p["mempress_on"], pressure, self.mem)
        if s is not None:
            mem = np.where(m, s.mem, mem)
        volt = np.where(t >= p["pdeliv_on"], p["pdeliv_volt"], p["volt"]) + 0.003 * z[6]

        if dt > 0:
            lam = p["rates"].copy()
            lam[:, 0] = np.where(
                t >= p["storm_on"], p["storm_rate"], np.where(t >= p["outlier_on"], p["outlier_rate"], lam[:, 0])
            )
            burst = _phase(t, p["burst_on"], p["burst_period"], p["burst_duty"])
            lam[self.rows, p["burst_col"]] += np.where(burst, p["burst_rate"], 0.0)
            V[:, _POISSON] += rng.poisson(lam * dt)
            V[:, KEY["energy"]] += power * dt
            V[:, KEY["io.receive"]] += np.floor(util * p["bw"] * dt)
            V[:, KEY["io.transmit"]] += np.floor(util * p["bw"] * 0.8 * dt)
            capped = np.where(throttled, 0.75 + 0.2 * u[2], 0.0) * dt
            if s is None:
                V[:, KEY["throttle.power"]] += capped
            else:  # a busy fleet's sources tell the causes apart: power_cap, not power
                capped = np.where(m, th.power_cap_s, capped)
                causes = self.tells_causes
                V[:, KEY["throttle.power"]] += np.where(causes, 0.0, capped)
                V[:, KEY["throttle.power_cap"]] += np.where(causes, capped, 0.0)
                V[:, KEY["throttle.power_brake"]] += np.where(m, th.power_brake_s, 0.0)
                V[:, KEY["throttle.hw_slowdown"]] += np.where(m, th.hw_slowdown_s, 0.0)
            V[:, KEY["throttle.thermal"]] += (hot > 0) * dt

        V[:, KEY["temp.gpu"]] = self.temp
        V[:, KEY["temp.board"]] = self.temp
        V[:, KEY["fan.speed"]] = ratio * p["fan_max"]
        V[:, KEY["fan.ratio"]] = ratio
        V[:, KEY["volt"]] = volt
        V[:, KEY["power"]] = power
        V[:, KEY["util"]] = util
        V[:, KEY["mem.util"]] = mem
        V[:, KEY["mem.usage"]] = np.floor(mem * p["mem_bytes"])
        V[:, KEY["pcie.width"]] = np.where(t >= p["linkdeg_on"], p["width"] / 2, p["width"])
        if s is not None:  # an idle NVIDIA GPU trains its link down to Gen1 and back up under load
            V[:, KEY["pcie.gen"]] = np.where(m & p["nvidia"] & ~s.running, 1.0, self.gen_max)
            V[:, KEY["power.limit.max"]] = np.where(m, limit, V[:, KEY["power.limit.max"]])

    def apply(self, e: Event) -> None:
        """One discrete event of the plan."""
        V, nodes = self.V, self.plan.nodes
        if e.op == "add":
            V[e.row, KEY[e.key]] += e.value
            self.on[e.row, KEY[e.key]] = True  # a new error code's series is born with its first error
        elif e.op == "status":
            V[e.row, _STATUS] = 0.0
            V[e.row, KEY[e.key]] = 1.0
        elif e.op == "vanish":
            self.present[e.row] = False
        elif e.op == "appear":
            self.present[e.row] = True
        elif e.op == "reset_series":
            V[e.row, KEY[e.key]] = 0.0
            self.start_override[(e.row, KEY[e.key])] = nodes[e.node].stamp_ns(e.at_s * US)
            self.version[e.node] += 1
        elif e.op == "restart":  # every counter from zero, XID series gone until their next error
            rows = nodes[e.node].rows
            row_idx = np.asarray(rows, dtype=np.intp)
            V[np.ix_(row_idx, _COUNTERS)] = 0.0
            self.on[np.ix_(row_idx, _DRIVERS)] = False
            self.node_start[e.node] = self.plan.restart[2]
            self.start_override = {k: v for k, v in self.start_override.items() if k[0] not in rows}
            self.version[e.node] += 1
