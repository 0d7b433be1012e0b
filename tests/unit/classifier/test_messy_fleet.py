"""The classifier on a fleet as real ones are: cohorts with their own background rates, faults
that come and go, nodes sampled every 5 to 60 s with jitter, clocks that disagree.

Each test builds its fleet from seeded random draws and checks the behaviour over several
seeds (a rule that passes one draw by luck fails another)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from otel_dra import conventions as cv
from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier, Verdict
from otel_dra.decode.clock import TraceClock
from otel_dra.frame import DeviceTable, Frame, Schema
from otel_dra.sources.simulated import gpu_columns

S = 10**9
T0 = 1_795_000_000
COLS = gpu_columns()
SEEDS = (1, 2, 3)
H100 = {cv.HW_TYPE: "gpu", cv.HW_VENDOR: "NVIDIA", cv.HW_MODEL: "H100 80GB HBM3"}
MI300X = {cv.HW_TYPE: "gpu", cv.HW_VENDOR: "AMD", cv.HW_MODEL: "Instinct MI300X"}
HEALTHY = {"temp.gpu": 60.0, "temp.gpu.limit.high.degraded": 85.0, "temp.gpu.limit.high.critical": 92.0}


@dataclass
class Device:
    """One simulated device: its node, attributes, and a function of time giving its readings."""

    node: str
    hw_id: str
    attrs: dict[str, str]
    read: Callable[[float], dict[str, float] | None]  # seconds since T0 -> values (None: not read)
    counters: dict[str, float] = field(default_factory=dict)


class Fleet:
    """Nodes with their own interval, jitter and clock; the classifier fed in arrival order."""

    def __init__(self, policy: policy_mod.Policy | None = None, interval_s: float = 5.0) -> None:
        self.schema = Schema(COLS.values())
        self.classifier = Classifier(policy or policy_mod.load(), self.schema, interval_s=interval_s)
        self.devices: list[Device] = []
        self.nodes: dict[str, tuple[float, float, float]] = {}  # name -> (interval, jitter, skew)
        self.history: dict[tuple[str, str], list[tuple[float, Verdict]]] = {}
        self.tables: dict[str, DeviceTable] = {}

    def node(self, name: str, interval_s: float, jitter_s: float = 0.0, skew_s: float = 0.0) -> None:
        self.nodes[name] = (interval_s, jitter_s, skew_s)

    def add(self, device: Device) -> None:
        self.devices.append(device)

    def run(self, minutes: float, seed: int, evaluate_every_s: float = 5.0) -> None:
        """Sample every node on its own schedule, evaluate every ``evaluate_every_s`` of true time."""
        rng = np.random.default_rng(seed)
        due = {name: float(rng.uniform(0, interval)) for name, (interval, _, _) in self.nodes.items()}
        t = 0.0
        while t <= minutes * 60:
            for name, (interval, jitter, skew) in self.nodes.items():
                while due[name] <= t:
                    self._sample(name, due[name], skew)
                    due[name] += interval + (rng.uniform(-jitter, jitter) if jitter else 0.0)
            for v in self.classifier.evaluate(round((T0 + t) * S)):
                self.history.setdefault((v.node, v.hw_id), []).append((t, v))
            t += evaluate_every_s

    def _sample(self, node: str, t: float, skew: float) -> None:
        devices = [d for d in self.devices if d.node == node]
        readings = [d.read(t) for d in devices]
        ids = tuple(d.hw_id for d, r in zip(devices, readings, strict=True) if r is not None)
        if not ids:
            return
        attrs = tuple(d.attrs for d, r in zip(devices, readings, strict=True) if r is not None)
        table = self.tables.get(node)
        if table is None or table.ids != ids:
            table = self.tables[node] = DeviceTable(node, ids, attrs)
        values = np.full((len(ids), len(self.schema)), np.nan)
        for i, r in enumerate(r for r in readings if r is not None):
            for key, value in r.items():
                values[i, self.schema.index(COLS[key])] = value
        # Stamped by the node's own clock, heard now (the reference clock).
        self.classifier.ingest(Frame(round((T0 + t + skew) * S), table, values), round((T0 + t) * S))

    # -- reading the outcome -------------------------------------------------------------------
    def states(self, node: str, hw_id: str) -> list[tuple[float, Verdict]]:
        return self.history.get((node, hw_id), [])

    def episodes(self, node: str, hw_id: str) -> list[tuple[float, float, set[str]]]:
        """(start s, end s, reasons) of each non-ok run of the device's verdicts."""
        out: list[tuple[float, float, set[str]]] = []
        current: list | None = None
        for t, v in self.states(node, hw_id):
            bad = v.health == "Unhealthy" or v.state not in ("ok", None)
            if bad and current is None:
                current = [t, None, set(v.reasons)]
            elif bad and current is not None:
                current[2] |= set(v.reasons)
            elif not bad and current is not None:
                out.append((current[0], t, current[2]))
                current = None
        if current is not None:
            out.append((current[0], float("inf"), current[2]))
        return out

    def ever(self, health: str) -> list[tuple[str, str]]:
        return sorted({key for key, seq in self.history.items() if any(v.health == health for _, v in seq)})


def counter(rate_per_min: float, rng: np.random.Generator, key: str = "errors.corrected") -> Callable[[float], float]:
    """A Poisson counter at ``rate_per_min``, read at increasing times."""
    state = {"t": 0.0, "value": float(rng.integers(0, 100))}

    def read(t: float) -> float:
        state["value"] += rng.poisson(rate_per_min * max(t - state["t"], 0.0) / 60.0)
        state["t"] = t
        return state["value"]

    return read


def gpu(rng: np.random.Generator, rate: float, extra: Callable[[float], dict[str, float]] | None = None):
    ecc = counter(rate, rng)

    def read(t: float) -> dict[str, float]:
        return {**HEALTHY, "errors.corrected": ecc(t), **(extra(t) if extra else {})}

    return read


# -- cohorts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_a_low_rate_outlier_of_its_cohort_is_caught_and_a_high_background_cohort_is_not(seed: int) -> None:
    """H100s at about 0.4 corrected errors a minute, every MI300X at about 5: an H100 at 3/min
    (under the absolute 6/min) is the outlier, within 30 minutes; no MI300X is, and no other H100."""
    rng = np.random.default_rng(seed)
    fleet = Fleet()
    for n in range(4):
        fleet.node(f"h{n}", interval_s=10.0, jitter_s=1.0, skew_s=float(rng.uniform(-90, 90)))
        fleet.node(f"m{n}", interval_s=30.0, jitter_s=3.0, skew_s=float(rng.uniform(-90, 90)))
        for d in range(4):
            # Background rates differ by device too (lognormal), as in a real fleet.
            fleet.add(Device(f"h{n}", f"gpu-{d}", H100, gpu(rng, 0.4 * rng.lognormal(0, 0.3))))
            fleet.add(Device(f"m{n}", f"gpu-{d}", MI300X, gpu(rng, 5.0 * rng.lognormal(0, 0.3))))
    outlier = Device("h9", "gpu-0", H100, gpu(rng, 3.0))
    fleet.node("h9", interval_s=15.0, jitter_s=1.5)
    fleet.add(outlier)
    fleet.add(Device("h9", "gpu-1", H100, gpu(rng, 0.4)))
    fleet.run(minutes=45, seed=seed)

    episodes = fleet.episodes("h9", "gpu-0")
    assert episodes and episodes[0][2] == {"memory_ecc"} and episodes[0][0] <= 30 * 60, episodes
    flagged = next(v for _, v in fleet.states("h9", "gpu-0") if v.reasons)
    assert flagged.state == "predicted_failure"
    assert "its cohort NVIDIA H100 80GB HBM3 median" in flagged.message, flagged.message
    others = [key for key in fleet.history if key != ("h9", "gpu-0") and fleet.episodes(*key)]
    assert others == []


@pytest.mark.parametrize("seed", SEEDS)
def test_a_small_cohort_falls_back_to_the_fleet_then_the_absolute_bar(seed: int) -> None:
    """Three MI300X (too few for a cohort of their own) at 5/min beside 16 H100s at 0.4/min: not
    flagged (the window's absolute 6/min stands); a storm on one of them is."""
    rng = np.random.default_rng(seed)
    fleet = Fleet()
    for n in range(4):
        fleet.node(f"h{n}", interval_s=10.0)
        for d in range(4):
            fleet.add(Device(f"h{n}", f"gpu-{d}", H100, gpu(rng, 0.4)))
    fleet.node("m0", interval_s=20.0, jitter_s=2.0)
    for d in range(3):
        fleet.add(Device("m0", f"gpu-{d}", MI300X, gpu(rng, 5.0)))
    storm = counter(5.0, rng)
    fleet.add(Device("m0", "gpu-3", MI300X, lambda t: {**HEALTHY, "errors.corrected": storm(t) + max(0.0, t - 1200)}))
    fleet.run(minutes=40, seed=seed)
    assert [key for key in fleet.history if fleet.episodes(*key)] == [("m0", "gpu-3")]
    start = fleet.episodes("m0", "gpu-3")[0][0]
    assert 1200 < start <= 1200 + 5 * 60


# -- faults that come and go ------------------------------------------------------------------
def cycling(onset_s: float, on_s: float, off_s: float) -> Callable[[float], bool]:
    return lambda t: t >= onset_s and (t - onset_s) % (on_s + off_s) < on_s


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("reason", "on_s", "off_s", "interval_s"),
    [("cooling", 120, 240, 10.0), ("thermal", 180, 240, 15.0), ("cooling", 120, 240, 60.0), ("thermal", 180, 240, 5.0)],
)
def test_a_fault_that_comes_and_goes_is_one_episode(
    seed: int, reason: str, on_s: float, off_s: float, interval_s: float
) -> None:
    """A fan stalling 2 minutes in every 6, thermal excursions 3 minutes on and 4 off: detected
    within 15 minutes, then held while it recurs (one episode); neighbours untouched."""
    rng = np.random.default_rng(seed)
    onset = float(rng.uniform(900, 1500))
    bad = cycling(onset, on_s, off_s)

    def fault(t: float) -> dict[str, float]:
        if reason == "cooling":
            return {"fan.speed": 100.0 if bad(t) else 4000.0, "fan.limit.low.critical": 500.0, "temp.gpu": 70.0}
        return {"temp.gpu": 89.0 + rng.normal(0, 0.5) if bad(t) else 70.0 + rng.normal(0, 1.0)}

    fleet = Fleet()
    fleet.node("n", interval_s=interval_s, jitter_s=interval_s * 0.1, skew_s=float(rng.uniform(-90, 90)))
    fleet.add(Device("n", "gpu-0", H100, gpu(rng, 0.4, fault)))
    for d in range(1, 4):
        fleet.add(Device("n", f"gpu-{d}", H100, gpu(rng, 0.4, lambda t: {"fan.speed": 4000.0, "temp.gpu": 70.0})))
    fleet.run(minutes=90, seed=seed)
    episodes = fleet.episodes("n", "gpu-0")
    assert len(episodes) == 1, episodes
    start, end, reasons = episodes[0]
    assert onset <= start <= onset + 15 * 60 and end == float("inf") and reason in reasons
    assert all(not fleet.episodes("n", f"gpu-{d}") for d in range(1, 4))


# -- sampling intervals and clocks ------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_slow_jittery_nodes_miss_a_sample_without_going_stale(seed: int) -> None:
    """A node sampled every 60 s ± 10%, one device skipping one sample now and then, another node
    every 5 s: never device_lost nor Unknown, from the first sample on; no verdict but the first."""
    rng = np.random.default_rng(seed)
    fleet = Fleet()
    fleet.node("slow", interval_s=60.0, jitter_s=6.0, skew_s=float(rng.uniform(-90, 90)))
    fleet.node("fast", interval_s=5.0, jitter_s=0.5, skew_s=float(rng.uniform(-90, 90)))
    skips = {round(t) for t in rng.uniform(300, 3000, 6)}

    def sometimes(t: float) -> dict[str, float] | None:
        return None if any(abs(t - s) < 30 for s in skips) else HEALTHY

    fleet.add(Device("slow", "gpu-0", H100, sometimes))
    fleet.add(Device("slow", "gpu-1", H100, lambda t: HEALTHY))
    fleet.add(Device("fast", "gpu-0", H100, lambda t: HEALTHY))
    fleet.run(minutes=60, seed=seed)
    for key, seq in fleet.history.items():
        assert [(v.health, v.state) for _, v in seq] == [("Healthy", "ok")], (key, [v.reasons for _, v in seq])


def test_a_lost_device_that_reports_again_clears_after_its_hold() -> None:
    fleet = Fleet()
    fleet.node("n", interval_s=30.0, jitter_s=2.0)
    fleet.add(Device("n", "gpu-0", H100, lambda t: None if 600 <= t < 1200 else HEALTHY))
    fleet.add(Device("n", "gpu-1", H100, lambda t: HEALTHY))
    fleet.run(minutes=40, seed=0)
    seq = [(round(t), v.health, v.reasons) for t, v in fleet.states("n", "gpu-0")]
    assert [s[1:] for s in seq] == [("Healthy", ()), ("Unhealthy", ("device_lost",)), ("Healthy", ())], seq
    lost_at, back_at = seq[1][0], seq[2][0]
    assert 600 + 60 < lost_at <= 600 + 2.5 * 30 + 35  # 2.5 of its 30 s intervals, give or take a sample
    assert 1200 + 300 <= back_at <= 1200 + 300 + 40  # device_lost holds 5 minutes after it is back


@pytest.mark.parametrize("seed", SEEDS)
def test_clocks_that_disagree_make_no_node_silent(seed: int) -> None:
    """Nodes 90 s ahead and behind the reference: all fresh to the end; a silent one Unknown (stale),
    never Unhealthy, and back when it speaks again."""
    rng = np.random.default_rng(seed)
    fleet = Fleet()
    for name, skew in (("ahead", 90.0), ("behind", -90.0), ("quiet", float(rng.uniform(-90, 90)))):
        fleet.node(name, interval_s=float(rng.choice([5, 10, 30, 60])), jitter_s=1.0, skew_s=skew)
        fleet.add(Device(name, "gpu-0", H100, lambda t, n=name: None if n == "quiet" and 900 <= t < 1500 else HEALTHY))
    fleet.run(minutes=40, seed=seed)
    for node in ("ahead", "behind"):
        assert [v.health for _, v in fleet.states(node, "gpu-0")] == ["Healthy"]
    quiet = [(round(t), v.health) for t, v in fleet.states("quiet", "gpu-0")]
    assert [h for _, h in quiet] == ["Healthy", "Unknown", "Healthy"], quiet
    assert 900 < quiet[1][0] <= 900 + 150 + 60 and quiet[2][0] <= 1500 + 60


def test_the_trace_clock_takes_each_node_s_offset_out() -> None:
    def at(node: str, t: float) -> Frame:
        return Frame(round(t * S), DeviceTable(node, ("gpu-0",), ({},)), np.zeros((1, 1)))

    clock = TraceClock()
    assert clock.heard([at("a", T0 + 90)]) == (T0 + 90) * S  # the first node's clock is the base
    clock.heard([at("b", T0 - 90)])  # 180 s behind a, heard at the same moment
    clock.heard([at("c", T0)])
    assert clock.now_ns == (T0 + 90) * S
    for step in range(1, 20):  # every node 10 s on: the clock 10 s on, each line moving it
        now = clock.heard([at("b", T0 - 90 + 10 * step)])
        now = clock.heard([at("c", T0 + 10 * step)])
        now = clock.heard([at("a", T0 + 90 + 10 * step)])
    assert now == (T0 + 90 + 190) * S
    now = clock.heard([at("c", T0 + 300)])  # one node's clock jumps 100 s: a quantile, not the max
    assert now == (T0 + 90 + 190) * S
    now = clock.heard([at("c", T0 + 5000)])  # stepped by more than CLOCK_JUMP_S: its offset is learned again
    assert now == (T0 + 90 + 190) * S
    for step in range(20, 100):  # a node that falls silent for long no longer holds the clock back
        now = clock.heard([at("a", T0 + 90 + 10 * step)])
    assert now == (T0 + 90 + 990) * S
