"""The job model's timelines: what runs on a group of GPUs (a lane), from one job to the next, with its crashes.

Why timelines: a label must know every crash of a recording before the recording is written, and a live
node must be able to ask a little further at each read; a lane generated forward in time, deterministic
for its generator, serves both. Where each number comes from is in docs/load-profiles.md; the short
version is beside each constant.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

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


def uniform_in(rng: np.random.Generator, span: tuple[float, float]) -> float:
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
        ramp = _whole(uniform_in(rng, TRAINING_RAMP_S if training else INFERENCE_RAMP_S))
        if self._loop_until is not None:  # crash-looping: up, a few minutes, down again
            end = _whole(start + uniform_in(rng, LOOP_RUN_S))
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
            forced.at = _whole(start + ramp + uniform_in(rng, (60.0, 180.0)))
        end = min(planned, natural, forced.at if forced is not None else math.inf)
        crashed = end < planned
        loop_s = 0.0
        if forced is not None and end == forced.at:
            self.forced.pop(0)
            crashed, loop_s = True, forced.loop_s
        elif crashed and rng.random() < (LOOP_CHANCE if training else INFERENCE_LOOP_CHANCE):
            loop_s = uniform_in(rng, LOOP_LEN_S)
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
            self._t = _whole(end + uniform_in(rng, RESTART_S))

    def _job_levels(self) -> None:
        rng = self.rng
        if self.training:
            self._util = uniform_in(rng, TRAINING_UTIL)
            self._mem = uniform_in(rng, TRAINING_MEM)
            self._compute = uniform_in(rng, TRAINING_COMPUTE)
            self._comm = uniform_in(rng, TRAINING_COMM_POWER)
            self._period = uniform_in(rng, CHECKPOINT_PERIOD_S)
        else:
            self._util = uniform_in(rng, INFERENCE_PEAK)
            self._mem = uniform_in(rng, INFERENCE_MEM)
            self._compute = self._comm = 0.0
            self._period = math.inf

    def _add_run(self, start: float, end: float, ramp: float, crashed: bool, loop: bool) -> None:
        run = Run(start, end, len(self.jobs) - 1, self._util, self._mem, self._compute, self._comm, ramp, crashed, loop)
        if self.training and not loop:
            first = start + ramp + self._period * (self.rng.uniform(0.3, 1.0) if len(self.runs) == 0 else 1.0)
            at = _whole(first)
            while at < end:
                length = _whole(uniform_in(self.rng, CHECKPOINT_LEN_S))
                run.dips.append((at, min(at + length, end), uniform_in(self.rng, CHECKPOINT_UTIL)))
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
