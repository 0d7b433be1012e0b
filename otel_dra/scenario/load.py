"""What jobs do to GPUs: the load profiles and the job model, shared by ``otel-dra simulate`` and the
simulated source (``otel-dra run --source simulated --load ...``).

Why its own module: a classifier tried only on idle fleets calls healthy busy GPUs degraded (memory
held full, power at its cap) and a job's crash a device fault. Both simulators draw their load from
here, so the generator's labelled fleets and the agent's live node behave alike. Where each number
comes from is in docs/load-profiles.md; the short version is beside each constant.

Profiles (``PROFILES``): ``idle`` is no job model at all (each simulator keeps its own wander at light
to moderate load, unchanged); ``training``: one job holds a node's GPUs for hours; ``inference``:
model-server replicas hold 1, 2, 4 or 8 GPUs each; ``mixed``: nodes drawn 50/35/15 % training,
inference, idle.

The model has two parts:

- :class:`Lane`: the GPUs one workload holds together (a training node, an inference replica) and
  what runs on them, as a timeline of :class:`Run` (start, end, levels, checkpoint dips, crash or not),
  generated forward in time as far as asked (the generator asks for the whole recording up front, so
  its labels know every crash; the agent asks a little further at each read).
- :class:`LoadModel`: all lanes stepped together, vectorised over lanes and devices (a Python loop
  touches only the few lanes whose run, dip or burst changes at that step). :meth:`LoadModel.step`
  gives each device's utilization, memory, power demand and whether a process holds it;
  :func:`power_and_throttle` turns demand into power and the ``hw.throttle.time`` each reason accrues.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

#: Load profiles, ``--load`` of both commands. ``idle`` is each simulator's behaviour before profiles existed.
PROFILES: Final = ("idle", "training", "inference", "mixed")
#: Profiles a node runs under the job model (``mixed`` assigns one of these, or idle, per node).
BUSY: Final = ("training", "inference")
#: ``mixed``: the share of nodes each profile gets.
MIXED_SHARES: Final = (("training", 0.50), ("inference", 0.35), ("idle", 0.15))
#: One line per profile, for ``--help``.
PROFILE_HELP: Final = {
    "idle": "GPUs wander at light to moderate load, memory 20-80%, well under the power cap (the default)",
    "training": "one job holds each node for hours: utilization 0.9-1.0, memory held at 93-99%, power at its "
    "cap much of the time (power_cap throttle time accrues), checkpoint dips every 30-60 min, idle gaps between "
    "jobs (PCIe back to Gen1), crashes that leave an XID and an OOM on every GPU of the job, some crash-looping",
    "inference": "model-server replicas hold 1, 2, 4 or 8 GPUs for hours with 90-95% of memory reserved; "
    "utilization follows diurnal, bursty traffic (0.1-0.9) and reaches the power cap only at peaks; fewer crashes",
    "mixed": "nodes drawn 50% training, 35% inference, 15% idle",
}

#: NVIDIA XIDs of the catalogue's application class a crashing job leaves (13 graphics engine exception,
#: 31 MMU fault, 43 GPU stopped processing). Non-NVIDIA devices report only the out-of-memory event.
APP_XIDS: Final = ("13", "31", "43")

# -- job model: training (docs/load-profiles.md) ------------------------------------------------------
#: A training job holds its node this long: lognormal, median 6 h (between 4 and 8 h, as the brief of the
#: recorded fleets says), sigma 0.5. A 4-hour recording sees few job changes.
TRAINING_MEDIAN_S: Final = 6 * 3600.0
TRAINING_SIGMA: Final = 0.5
#: Between jobs the node sits idle a few minutes to half an hour (scheduler queue, image pull, data staging).
TRAINING_GAP_S: Final = (180.0, 1800.0)
#: Utilization while a step runs (NVML's "a kernel was running" share) and the memory a job holds: PyTorch's
#: caching allocator keeps what the first iterations took until the process exits.
TRAINING_UTIL: Final = (0.92, 0.99)
TRAINING_MEM: Final = (0.93, 0.99)
#: Share of seconds in compute phases (the GPU draws what it can, up to its cap); the rest is exposed
#: communication and input stalls, all GPUs of a job in step with each other (the Llama 3 paper's power swings).
TRAINING_COMPUTE: Final = (0.55, 0.85)
#: Power drawn in the other phases, as a share of the cap.
TRAINING_COMM_POWER: Final = (0.75, 0.92)
#: Checkpoints: every 30-60 min, 1-5 min long, utilization 0.05-0.3 on every GPU of the job at once.
CHECKPOINT_PERIOD_S: Final = (1800.0, 3600.0)
CHECKPOINT_LEN_S: Final = (60.0, 300.0)
CHECKPOINT_UTIL: Final = (0.05, 0.3)
#: From a (re)start, loading the model and the first iterations: memory grows to its level, utilization low.
TRAINING_RAMP_S: Final = (30.0, 120.0)
#: Natural crashes of a training job per hour. Llama 3's 419 unexpected interruptions in 54 days on 2,048
#: nodes are 1.6e-4 an hour a node, most of them hardware; multi-tenant research clusters (Philly, Meta's RSC)
#: lose far more jobs to user-program errors. One in 100 node-hours is between the two (a modelling choice).
TRAINING_CRASH_PER_H: Final = 0.01
#: After a crash the job restarts from its last checkpoint after this long (the pod recreated).
RESTART_S: Final = (60.0, 180.0)
#: A crash starts a crash loop this often: Kubernetes restarts the container after 10 s, doubling to 300 s
#: (CrashLoopBackOff), and it crashes again a few minutes in, for 30-90 minutes until someone stops it.
LOOP_CHANCE: Final = 0.15
LOOP_LEN_S: Final = (1800.0, 5400.0)
LOOP_RUN_S: Final = (60.0, 300.0)
BACKOFF_FIRST_S: Final = 10.0
BACKOFF_MAX_S: Final = 300.0

# -- job model: inference ------------------------------------------------------------------------------
#: A replica (vLLM or alike) lives this long: lognormal, median 12 h; redeploys leave 1-10 min idle.
INFERENCE_MEDIAN_S: Final = 12 * 3600.0
INFERENCE_SIGMA: Final = 0.7
INFERENCE_GAP_S: Final = (60.0, 600.0)
#: vLLM reserves gpu_memory_utilization (default 0.9) of the GPU's memory at start and holds it; with the CUDA
#: context and a few deployments at 0.95, NVML reads 0.90-0.95.
INFERENCE_MEM: Final = (0.90, 0.95)
#: Loading weights, profiling and capturing CUDA graphs take this long before traffic is served.
INFERENCE_RAMP_S: Final = (60.0, 300.0)
#: A replica's utilization at the day's peak before bursts; traffic follows the time of day (lowest 0.1 of the
#: peak at night), bursts add 15-40% for 1-5 minutes about every 15 minutes, and it wanders (OU, 2 min).
INFERENCE_PEAK: Final = (0.75, 0.9)
DIURNAL_PEAK_HOUR_UTC: Final = 15.0
BURST_EVERY_S: Final = 900.0
BURST_LEN_S: Final = (60.0, 300.0)
BURST_ADD: Final = (0.15, 0.4)
TRAFFIC_TAU_S: Final = 120.0
TRAFFIC_SIGMA: Final = 0.05
#: Replica sizes (tensor parallel) and how often each is chosen where it fits.
REPLICA_SIZES: Final = ((8, 0.3), (4, 0.3), (2, 0.2), (1, 0.2))
#: Inference crashes less: a serving process runs known code on known shapes.
INFERENCE_CRASH_PER_H: Final = 0.0025
INFERENCE_LOOP_CHANCE: Final = 0.1
#: At this utilization a replica's demand reaches its cap (the peaks).
INFERENCE_FULL_UTIL: Final = 0.9

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


def profile_of_nodes(load: str, n: int, rng: np.random.Generator) -> list[str]:
    """Each node's profile: ``load`` for all, or for ``mixed`` a draw of :data:`MIXED_SHARES` (at least
    one training and one inference node when there are three or more)."""
    if load not in PROFILES:
        raise ValueError(f"load must be one of {', '.join(PROFILES)}, got {load!r}")
    if load != "mixed":
        return [load] * n
    names = [name for name, _ in MIXED_SHARES]
    shares = np.array([share for _, share in MIXED_SHARES])
    counts = np.floor(shares * n).astype(int)
    while counts.sum() < n:
        counts[int(np.argmax(shares * n - counts))] += 1
    if n >= 3:
        for i in (0, 1):  # training, inference
            if counts[i] == 0:
                counts[i] = 1
                counts[int(np.argmax(counts))] -= 1
    out = [name for name, k in zip(names, counts, strict=True) for _ in range(int(k))]
    rng.shuffle(out)
    return out


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


def _uniform(rng: np.random.Generator, span: tuple[float, float]) -> float:
    return float(rng.uniform(span[0], span[1]))


def _whole(x: float) -> float:
    """Times are whole seconds: every event of a generated recording lands on its grid."""
    return float(round(x))


@dataclass
class Run:
    """One process of a workload on its lane's GPUs, from ``start`` to ``end`` (s); a crash at ``end`` when
    ``crashed``. ``dips`` are checkpoints: (start, end, utilization)."""

    start: float
    end: float
    job: int
    util: float  # training: the job's utilization; inference: the replica's peak traffic
    mem: float
    compute: float  # training: share of seconds in compute phases
    comm: float  # training: power in the other phases, share of the cap
    ramp_s: float
    crashed: bool = False
    loop: bool = False
    dips: list[tuple[float, float, float]] = field(default_factory=list)


@dataclass
class Job:
    """A workload from its submission to its end, across restarts: what a label calls one job."""

    index: int
    kind: str
    xid: str
    start: float


@dataclass
class Forced:
    """A crash the generator places (a trap it guarantees): at ``at`` s, then a crash loop of ``loop_s``."""

    at: float
    loop_s: float = 0.0


class Lane:
    """The GPUs (slots of one node) one workload holds together, and its runs, generated forward in time.

    ``kind``: ``training``, ``inference`` or ``vacant`` (never runs anything). Deterministic for a given
    ``rng``; :meth:`extend` may be called any number of times with growing ``until``.
    """

    def __init__(
        self,
        kind: str,
        slots: Sequence[int],
        rng: np.random.Generator,
        start_s: float = 0.0,
        forced: Sequence[Forced] = (),
        first_job_at: float | None = None,
    ) -> None:
        self.kind = kind
        self.slots = tuple(slots)
        self.rng = rng
        self.runs: list[Run] = []
        self.jobs: list[Job] = []
        self.forced = sorted(forced, key=lambda f: f.at)
        self._t = float(start_s)
        self._left = 0.0  # seconds of the current job still to run
        self._loop_until: float | None = None
        self._backoff = BACKOFF_FIRST_S
        self._first_job_at = first_job_at
        self.horizon = math.inf if kind == "vacant" else float(start_s)

    @property
    def training(self) -> bool:
        return self.kind == "training"

    def extend(self, until: float) -> None:
        """Generate runs until one starts at or after ``until``."""
        while self.kind != "vacant" and self._t < until:
            self._next()
        self.horizon = max(self.horizon, self._t)

    def _next(self) -> None:
        rng, training = self.rng, self.training
        if not self.jobs or (self._left <= 0 and self._loop_until is None):
            if self._first_job_at is not None and not self.jobs:
                self._t = float(self._first_job_at)
            else:
                lo, hi = TRAINING_GAP_S if training else INFERENCE_GAP_S
                self._t = _whole(self._t + math.exp(rng.uniform(math.log(lo), math.log(hi))))
            median, sigma = (TRAINING_MEDIAN_S, TRAINING_SIGMA) if training else (INFERENCE_MEDIAN_S, INFERENCE_SIGMA)
            self._left = _whole(max(600.0, median * math.exp(sigma * rng.standard_normal())))
            xid = APP_XIDS[int(rng.integers(len(APP_XIDS)))]
            self.jobs.append(Job(len(self.jobs), self.kind, xid, self._t))
            self._job_levels()
        start = self._t
        ramp = _whole(_uniform(rng, TRAINING_RAMP_S if training else INFERENCE_RAMP_S))
        if self._loop_until is not None:  # crash-looping: up, a few minutes, down again
            end = _whole(start + _uniform(rng, LOOP_RUN_S))
            self._add_run(start, end, ramp, crashed=True, loop=True)
            self._t = end + self._backoff
            self._backoff = min(2 * self._backoff, BACKOFF_MAX_S)
            if self._t >= self._loop_until:  # given up: the job is stopped, the node goes idle
                self._loop_until, self._left = None, 0.0
            return
        planned = start + self._left
        rate = TRAINING_CRASH_PER_H if training else INFERENCE_CRASH_PER_H
        natural = _whole(start + ramp + rng.exponential(3600.0 / rate))  # a process gets past its start-up first
        forced = self.forced[0] if self.forced else None
        if forced is not None and forced.at < start + ramp + 30:  # it fell in a gap: soon after this start
            forced.at = _whole(start + ramp + _uniform(rng, (60.0, 180.0)))
        end = min(planned, natural, forced.at if forced is not None else math.inf)
        crashed = end < planned
        loop_s = 0.0
        if forced is not None and end == forced.at:
            self.forced.pop(0)
            crashed, loop_s = True, forced.loop_s
        elif crashed and rng.random() < (LOOP_CHANCE if training else INFERENCE_LOOP_CHANCE):
            loop_s = _uniform(rng, LOOP_LEN_S)
        self._add_run(start, end, ramp, crashed=crashed, loop=loop_s > 0)
        self._left -= end - start
        if not crashed:
            self._t = end
        elif loop_s > 0:
            self._loop_until = end + loop_s
            self._backoff = BACKOFF_FIRST_S
            self._t = end + self._backoff
            self._backoff *= 2
        else:
            self._t = _whole(end + _uniform(rng, RESTART_S))

    def _job_levels(self) -> None:
        rng = self.rng
        if self.training:
            self._util = _uniform(rng, TRAINING_UTIL)
            self._mem = _uniform(rng, TRAINING_MEM)
            self._compute = _uniform(rng, TRAINING_COMPUTE)
            self._comm = _uniform(rng, TRAINING_COMM_POWER)
            self._period = _uniform(rng, CHECKPOINT_PERIOD_S)
        else:
            self._util = _uniform(rng, INFERENCE_PEAK)
            self._mem = _uniform(rng, INFERENCE_MEM)
            self._compute = self._comm = 0.0
            self._period = math.inf

    def _add_run(self, start: float, end: float, ramp: float, crashed: bool, loop: bool) -> None:
        run = Run(start, end, len(self.jobs) - 1, self._util, self._mem, self._compute, self._comm, ramp, crashed, loop)
        if self.training and not loop:
            first = start + ramp + self._period * (self.rng.uniform(0.3, 1.0) if len(self.runs) == 0 else 1.0)
            at = _whole(first)
            while at < end:
                length = _whole(_uniform(self.rng, CHECKPOINT_LEN_S))
                run.dips.append((at, min(at + length, end), _uniform(self.rng, CHECKPOINT_UTIL)))
                at = _whole(at + length + self._period * self.rng.uniform(0.95, 1.05))
        self.runs.append(run)

    # -- what the planner asks -------------------------------------------------------------------------
    def run_at(self, t: float) -> Run | None:
        """The run holding the lane at ``t`` (None: a gap)."""
        for run in self.runs:
            if run.start <= t < run.end:
                return run
            if run.start > t:
                return None
        return None

    def coverage(self, lo: float, hi: float) -> float:
        """The share of [lo, hi) the lane runs a workload, past its ramp and outside crash loops."""
        if hi <= lo:
            return 0.0
        covered = 0.0
        for run in self.runs:
            if run.loop:
                continue
            a, b = max(lo, run.start + run.ramp_s), min(hi, run.end)
            covered += max(0.0, b - a)
        return covered / (hi - lo)

    def crashes(self, lo: float, hi: float) -> Iterator[tuple[Run, Job]]:
        """Crashes at times in [lo, hi), in time order."""
        for run in self.runs:
            if run.crashed and lo <= run.end < hi:
                yield run, self.jobs[run.job]


def make_lanes(
    profile: str,
    slots: int,
    rng: np.random.Generator,
    start_s: float = 0.0,
    forced: Sequence[Forced] = (),
) -> list[Lane]:
    """The lanes of one node of ``slots`` GPUs under ``profile`` (``training``, ``inference``; anything else:
    none). A node is in the middle of its life when a recording starts: the first job started up to one
    median job length before ``start_s`` (so it may be in a job or in a gap)."""
    if profile == "training":
        first = _whole(start_s - float(rng.uniform(0.0, TRAINING_MEDIAN_S)))
        return [Lane("training", range(slots), rng, first, forced, first_job_at=first)]
    if profile != "inference":
        return []
    lanes: list[Lane] = []
    pos = 0
    sizes = np.array([s for s, _ in REPLICA_SIZES])
    weights = np.array([w for _, w in REPLICA_SIZES])
    while pos < slots:
        fits = (sizes <= slots - pos) & (pos % sizes == 0)
        p = np.where(fits, weights, 0.0)
        size = int(sizes[int(rng.choice(len(sizes), p=p / p.sum()))])
        first = _whole(start_s - float(rng.uniform(0.0, INFERENCE_MEDIAN_S)))
        lanes.append(Lane("inference", range(pos, pos + size), rng, first, forced if pos == 0 else (), first))
        pos += size
    return lanes


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
                self.burst[i] = _uniform(self.rng, BURST_ADD)
                self.burst_until[i] = t + _uniform(self.rng, BURST_LEN_S)
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


__all__ = [
    "APP_XIDS",
    "BUSY",
    "MIXED_SHARES",
    "PROFILES",
    "PROFILE_HELP",
    "Forced",
    "Job",
    "Lane",
    "LoadModel",
    "LoadSample",
    "Run",
    "Throttled",
    "diurnal",
    "full_load_temperature",
    "make_lanes",
    "normal_cdf",
    "power_and_throttle",
    "profile_of_nodes",
    "slot_offsets",
]
