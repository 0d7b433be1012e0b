"""Judge the device, not the workload: a busy fleet's healthy load reads ok, the faults hidden in it do not.

Hand-built telemetry of nodes of 8 GPUs running a training job: utilization near 1, memory held full
(vLLM reserves 90%, PyTorch's caching allocator keeps what it took), power at its cap with the cap's time
accruing (an H100 in training sits at its software power cap much of its busy time), temperatures some
degrees under the slowdown limit with hotter slots. Into that load go: a job that crash-loops (an XID and
an OOM on every GPU at once), an XID recurring on one GPU, a node's power brake, one GPU hotter than its
peers, a GPU capped far more than its peers, a hardware slowdown.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier, Verdict
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of

S = 10**9
T0 = 1_800_000_000
GPUS = 8
H100 = {"hw.type": "gpu", "hw.vendor": "NVIDIA", "hw.model": "H100 80GB HBM3"}


def col(metric: str, sensor: str | None = None, **attrs: str) -> Column:
    return Column(
        metric, attrs_of({k.replace("_", "."): v for k, v in attrs.items()}), sensor, sensor and "temperature"
    )


COLUMNS = {
    "temp": col("hw.temperature", "temp/gpu", hw_sensor_location="gpu"),
    "limit": Column(
        "hw.temperature.limit",
        attrs_of({"hw.sensor_location": "gpu", "hw.limit_type": "high.degraded"}),
        "temp/gpu",
        "temperature",
    ),
    "util": Column("hw.gpu.utilization", attrs_of({"hw.gpu.task": "general"})),
    "mem": Column("hw.gpu.memory.utilization"),
    "power": Column("hw.power"),
    "cap": Column("hw.power.limit", attrs_of({"hw.limit_type": "max"})),
    "t.power_cap": Column("hw.throttle.time", attrs_of({"hw.throttle.reason": "power_cap"})),
    "t.power_brake": Column("hw.throttle.time", attrs_of({"hw.throttle.reason": "power_brake"})),
    "t.hw_slowdown": Column("hw.throttle.time", attrs_of({"hw.throttle.reason": "hw_slowdown"})),
    "xid13": Column("hw.errors", attrs_of({"error.type": "driver", "hw.error.code": "13"})),
    "oom": Column("hw.errors", attrs_of({"error.type": "out_of_memory"})),
}
SLOT_OFFSET = np.array([0.0, 0.5, 1.0, 1.5, 2.5, 3.0, 3.5, 4.0])  # rear slots run hotter, on every node alike


@dataclass
class Busy:
    """Nodes of 8 H100s held by a training job; ``faults`` bend the telemetry of some."""

    nodes: int = 3
    interval: int = 10
    seed: int = 0
    #: The slots' extra heat (°C, the slot pattern times this) at full power: with ``slot_by_power``, in
    #: proportion to the power drawn (airflow carries heat; an idle GPU has little to carry), else always.
    slot_scale: float = 1.0
    slot_by_power: bool = False
    report_util: bool = True  # False: no utilization series (an exporter without it)
    report_limit: bool = True  # False: no power limit series (dcgm-exporter's default counters leave it out)
    #: The share of samples whose power is read in a communication phase, 75-85% of the limit, while the interval's
    #: capped time stays (a sample's power is read at one moment, its capped time over the interval).
    dips: float = 0.0
    schema: Schema = field(default_factory=Schema)
    verdicts: dict[tuple[str, str], list[Verdict]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.cols = {key: self.schema.index(c) for key, c in COLUMNS.items()}
        n = self.nodes * GPUS
        self.names = [f"train-{i:03d}" for i in range(self.nodes)]
        self.tables = [
            DeviceTable(
                name,
                tuple(f"gpu-{g}" for g in range(GPUS)),
                tuple({**H100, "dra.device.name": f"gpu-{g}"} for g in range(GPUS)),
            )
            for name in self.names
        ]
        self.ambient = np.repeat(self.rng.uniform(22, 27, self.nodes), GPUS)
        self.resist = self.rng.uniform(0.97, 1.03, n)
        self.cap_share = self.rng.uniform(0.5, 0.7, n)  # how much of the time each GPU sits at its cap
        self.counters = {key: self.rng.integers(0, 1000, n).astype(float) for key in ("t.power_cap", "xid13", "oom")}
        self.counters["t.power_brake"] = np.zeros(n)
        self.counters["t.hw_slowdown"] = np.zeros(n)
        self.extra_heat = np.zeros(n)
        self.brake = np.zeros(n, dtype=bool)
        self.slowdown = np.zeros(n, dtype=bool)
        self.limits = np.full(n, 700.0)
        self.util = np.full(n, 0.97)  # each GPU's utilization (about it)
        self.idle = np.zeros(n, dtype=bool)  # no job: 60 W, utilization near 0, never at its cap
        self.classifier = Classifier(policy_mod.load(), self.schema, interval_s=float(self.interval))

    def run(self, seconds: int, each: Callable[[int, Busy], None] | None = None, start: int = 0) -> None:
        for t in range(start, start + seconds, self.interval):
            if each is not None:
                each(t, self)
            self.tick(t)

    def tick(self, t: int) -> None:
        n, rng, iv = self.nodes * GPUS, self.rng, self.interval
        util = np.where(self.idle, 0.02, np.clip(self.util + rng.normal(0, 0.01, n), 0, 1))
        power = np.where(self.brake, 350.0, self.limits - rng.uniform(0, 3, n))
        power = np.where(rng.random(n) < self.dips, self.limits * rng.uniform(0.75, 0.85, n), power)
        power = np.where(self.idle, 60.0 + rng.uniform(0, 3, n), power)
        slots = self.slot_scale * np.tile(SLOT_OFFSET, self.nodes) * (power / self.limits if self.slot_by_power else 1)
        temp = self.ambient + slots + 0.066 * power * self.resist + self.extra_heat
        temp = temp + rng.normal(0, 0.3, n)
        self.counters["t.power_cap"] += np.where(
            self.brake | self.idle, 0.0, iv * np.clip(self.cap_share + rng.normal(0, 0.05, n), 0, 1)
        )
        self.counters["t.power_brake"] += np.where(self.brake, iv * 0.9, 0.0)
        self.counters["t.hw_slowdown"] += np.where(self.slowdown, iv * 0.6, 0.0)
        values = np.full((n, len(self.schema)), np.nan)
        c = self.cols
        values[:, c["temp"]] = temp
        values[:, c["limit"]] = 85.0
        values[:, c["util"]] = util if self.report_util else np.nan
        values[:, c["mem"]] = np.clip(0.97 + rng.normal(0, 0.005, n), 0, 0.999)
        values[:, c["power"]] = power
        values[:, c["cap"]] = self.limits if self.report_limit else np.nan
        for key, counts in self.counters.items():
            values[:, c[key]] = counts
        now = (T0 + t) * S
        for i, table in enumerate(self.tables):
            self.classifier.ingest(Frame(now, table, values[i * GPUS : (i + 1) * GPUS]))
        for v in self.classifier.evaluate(now):
            self.verdicts.setdefault((v.node, v.hw_id), []).append(v)

    def row(self, node: int, gpu: int) -> int:
        return node * GPUS + gpu

    def episodes(self, scope: str | None = "device") -> list[tuple[tuple[str, str], Verdict]]:
        """Verdicts that are not ok (of ``scope``, every scope with None)."""
        return [
            (key, v)
            for key, seq in self.verdicts.items()
            for v in seq
            if v.state not in ("ok", None) and (scope is None or v.scope == scope)
        ]


def test_a_busy_healthy_fleet_reads_ok():
    fleet = Busy(seed=1)
    fleet.run(2 * 3600)
    assert fleet.episodes(None) == []
    last = {key: seq[-1] for key, seq in fleet.verdicts.items()}
    assert len(last) == 3 * GPUS and all(v.state == "ok" and v.reasons == () for v in last.values())


def test_a_crash_looping_job_is_the_workloads_not_eight_device_faults():
    def crash_loop(t: int, fleet: Busy) -> None:
        if 1200 <= t < 4800 and t % 240 == 0:  # every 4 minutes, an XID 13 and an OOM on all 8 GPUs at once
            rows = slice(0, GPUS)
            fleet.counters["xid13"][rows] += 1
            fleet.counters["oom"][rows] += 1

    fleet = Busy(seed=2)
    fleet.run(5400, crash_loop)
    assert fleet.episodes("device") == []
    assert fleet.episodes(None) == []  # the job's findings keep hw.state ok: the devices are fine
    seen = [v for (node, _), seq in fleet.verdicts.items() for v in seq if node == "train-000" and v.scope != "device"]
    assert {v.hw_id for v in seen} == {f"gpu-{g}" for g in range(GPUS)}
    for v in seen:
        assert (v.scope, v.group, v.remediation, v.health) == (
            "workload",
            "workload/node/train-000",
            "check_workload",
            "Healthy",
        )
        assert {"driver_errors", "memory_pressure"} <= set(v.reasons) and "not the device's" in v.message
    # Other nodes saw nothing.
    assert all(v.scope == "device" for (node, _), seq in fleet.verdicts.items() for v in seq if node != "train-000")


def test_an_xid_recurring_on_one_gpu_is_that_gpus_while_its_neighbours_stay_clean():
    bad = Busy(seed=3).row(1, 5)

    def recur(t: int, fleet: Busy) -> None:
        if t >= 1200 and t % 600 == 0:
            fleet.counters["xid13"][bad] += 1

    fleet = Busy(seed=3)
    fleet.run(4200, recur)
    hits = fleet.episodes("device")
    assert {key for key, _ in hits} == {("train-001", "gpu-5")}
    v = hits[0][1]
    assert v.reasons == ("driver_errors",) and v.state == "degraded" and v.scope == "device" and v.group is None
    assert (v.time_unix_nano / S - T0) <= 1200 + 2 * 600 + 60  # the third within the hour


def test_a_power_brake_on_every_gpu_of_a_node_is_the_nodes():
    def brake(t: int, fleet: Busy) -> None:
        if t == 1500:
            fleet.brake[GPUS : 2 * GPUS] = True

    fleet = Busy(seed=4)
    fleet.run(3000, brake)
    hits = fleet.episodes(None)
    assert {key[0] for key, _ in hits} == {"train-001"}
    assert {key[1] for key, _ in hits} == {f"gpu-{g}" for g in range(GPUS)}
    for _, v in hits:
        assert v.reasons == ("power_delivery",) and v.state == "degraded"
        assert (v.scope, v.group, v.remediation) == ("node", "node/train-001", "reboot_node")
        assert "power brake" in v.message and "8 of 8 devices of node train-001" in v.message
        assert v.time_unix_nano / S - T0 <= 1500 + 120
    # Its cap time stopped: the others' did not make it a power_throttling fault either.
    assert all("power_throttling" not in v.reasons for _, v in hits)
    # What /v1/devices serves says the same, the node's count included.
    now = {v.hw_id: v for v in fleet.classifier.current() if v.node == "train-001"}
    assert all(v.scope == "node" and "8 of 8 devices of node train-001" in v.message for v in now.values())


def test_a_power_brake_on_one_gpu_is_that_gpus():
    fleet = Busy(seed=5)
    fleet.run(2400, lambda t, f: f.brake.__setitem__(f.row(2, 3), t >= 1200))
    hits = fleet.episodes(None)
    assert {key for key, _ in hits} == {("train-002", "gpu-3")}
    assert all(v.scope == "device" and v.reasons == ("power_delivery",) for _, v in hits)


@pytest.mark.parametrize("seed", [6, 7, 8])
def test_a_gpu_hotter_than_its_peers_is_thermal_before_any_limit(seed: int):
    fleet = Busy(seed=seed)
    hot = fleet.row(0, 2)
    fleet.run(3600, lambda t, f: f.extra_heat.__setitem__(hot, 8.0 if t >= 1800 else 0.0))
    hits = fleet.episodes(None)
    assert {key for key, _ in hits} == {("train-000", "gpu-2")}, hits
    v = hits[0][1]
    assert v.reasons == ("thermal",) and v.state == "predicted_failure" and v.scope == "device"
    assert "hotter than its peers at the same load" in v.message
    assert 1800 + 300 <= v.time_unix_nano / S - T0 <= 1800 + 900  # sustained for 5 minutes, within the deadline
    temps = fleet.classifier.store.latest()[1]  # (the hottest sensor stayed under its 85 Cel limit)
    assert np.nanmax(temps[: 3 * GPUS]) < 85.0


def test_a_single_temperature_spike_on_a_busy_gpu_is_not_a_fault():
    spiky = Busy(seed=9).row(2, 6)

    def spike(t: int, fleet: Busy) -> None:
        fleet.extra_heat[spiky] = 20.0 if t % 900 == 450 else 0.0

    fleet = Busy(seed=9)
    fleet.run(3600, spike)
    assert fleet.episodes(None) == []


def test_a_gpu_capped_far_more_than_its_peers_is_power_throttling():
    fleet = Busy(seed=10)
    capped = fleet.row(1, 1)
    fleet.cap_share[:] = 0.55 + fleet.rng.uniform(-0.03, 0.03, fleet.cap_share.shape)  # peers close together
    fleet.run(3600, lambda t, f: f.cap_share.__setitem__(capped, 1.0 if t >= 1800 else 0.55))
    hits = fleet.episodes(None)
    assert {key for key, _ in hits} == {("train-001", "gpu-1")}
    v = hits[0][1]
    assert v.reasons == ("power_throttling",) and "its peers at the same load" in v.message


@pytest.mark.parametrize("burst_s", [300, 420])
def test_one_traffic_burst_ridden_at_the_cap_is_not_power_throttling(burst_s: int):
    # Inference replicas that never reach their cap; one, drawing a few percent more, rides a burst of traffic at
    # its cap for minutes: a third or more of its duty span, and nothing like that over the rate span.
    fleet = Busy(seed=15)
    fleet.cap_share[:] = -1.0  # never capped (under the sampling noise)
    burst = fleet.row(0, 3)
    fleet.run(3600, lambda t, f: f.cap_share.__setitem__(burst, 1.0 if 2400 <= t < 2400 + burst_s else -1.0))
    assert fleet.episodes(None) == []
    # The same GPU held at its cap from then on is power_throttling.
    fleet.run(1200, lambda t, f: f.cap_share.__setitem__(burst, 1.0), start=3600)
    assert {(key, v.reasons) for key, v in fleet.episodes(None)} == {(("train-000", "gpu-3"), ("power_throttling",))}


def test_a_leaky_gpu_at_its_cap_in_every_traffic_burst_is_not_power_throttling():
    # Inference replicas whose traffic comes in bursts (utilization 0.95 for 2.5 minutes in 7, 0.6 between); one,
    # drawing a few percent more, reaches its cap in each burst: two runs of minutes in 15 (a third of
    # them), each at its busiest, and under a quarter of 30 minutes.
    fleet = Busy(seed=18)
    fleet.cap_share[:] = -1.0
    fleet.util[:] = 0.6
    leaky = fleet.row(1, 2)

    def traffic(t: int, f: Busy) -> None:
        burst = t >= 3000 and (t - 3000) % 420 < 150
        f.util[:] = 0.95 if burst else 0.6
        f.cap_share[leaky] = 1.0 if burst else -1.0

    fleet.run(3000 + 600, traffic)
    assert fleet.episodes(None) == []


def test_a_gpu_still_capped_as_its_peers_were_until_their_load_moved_is_not_yet_power_throttling():
    # Peers capped 65% of the time for half an hour, then not at all (their traffic's peak passed); one GPU, at its
    # cap 45% all along (no outlier while they were capped), stays there. Over the last quarter-hour it is capped
    # against peers never capped, but over the half hour its peers were capped too, within the margin of it: not
    # an outlier over that span (the mixed fleet's false positive in bench_base_rate, seed 5). Held there while
    # the half hour fills with its peers' new load, it is power_throttling.
    fleet = Busy(seed=19)
    gpu = fleet.row(0, 4)
    moved = 1800

    def load(t: int, f: Busy) -> None:
        f.cap_share[:] = 0.65 if t < moved else -1.0
        f.cap_share[gpu] = 0.45

    fleet.run(moved + 1200, load)
    assert fleet.episodes(None) == []
    fleet.run(1200, load, start=moved + 1200)
    assert {(key, v.reasons) for key, v in fleet.episodes(None)} == {(("train-000", "gpu-4"), ("power_throttling",))}


@pytest.mark.parametrize(("period_s", "on_s"), [(480, 180), (600, 240), (720, 260)])
def test_a_cap_that_comes_and_goes_against_peers_never_capped_is_caught_in_time(period_s: int, on_s: int):
    # The same peers; one GPU's limit comes and goes (a firmware power controller that keeps stepping it down):
    # capped 35-45% of each cycle, in runs of a few minutes. Over the rate span that is under `duty` until well
    # past 15 minutes; its runs tell it from one burst of traffic.
    fleet = Busy(seed=16)
    fleet.cap_share[:] = -1.0
    gpu = fleet.row(2, 5)
    onset = 2400

    def cycle(t: int, f: Busy) -> None:
        f.cap_share[gpu] = 1.0 if t >= onset and (t - onset) % period_s < on_s else -1.0

    fleet.run(onset + 900, cycle)
    hits = fleet.episodes(None)
    assert {(key, v.reasons) for key, v in hits} == {(("train-002", "gpu-5"), ("power_throttling",))}
    assert hits[0][1].time_unix_nano <= (T0 + onset + 900) * S


def test_a_gpu_turned_hotter_than_its_own_usual_is_thermal_and_one_always_that_warm_is_not():
    # One GPU runs 4 Cel over its peers from the start (its own seat and paste: under the 5.5 Cel bar, and its
    # usual); another, after an hour like its peers, turns 5 Cel hotter (paste drying): under the bar too, but
    # 3 Cel over its own usual.
    fleet = Busy(seed=17)
    warm, drying = fleet.row(0, 2), fleet.row(1, 6)
    fleet.extra_heat[warm] = 4.0

    def heat(t: int, f: Busy) -> None:
        f.extra_heat[drying] = 5.0 if t >= 3600 else 0.0

    fleet.run(3600 + 900, heat)
    hits = fleet.episodes(None)
    assert {(key, v.reasons) for key, v in hits} == {(("train-001", "gpu-6"), ("thermal",))}
    v = hits[0][1]
    assert v.state == "predicted_failure" and "as usual" in v.message
    assert v.time_unix_nano <= (T0 + 3600 + 900) * S


def test_a_hardware_slowdown_is_thermal():
    fleet = Busy(seed=11)
    fleet.run(2400, lambda t, f: f.slowdown.__setitem__(f.row(0, 7), t >= 1200))
    hits = fleet.episodes(None)
    assert {key for key, _ in hits} == {("train-000", "gpu-7")}
    assert hits[0][1].reasons == ("thermal",) and hits[0][1].state == "degraded"
    assert "hardware slowdown" in hits[0][1].message


def test_gpus_running_cool_for_faults_of_their_own_do_not_make_their_slot_look_hot_elsewhere():
    # Three nodes of a model, as on a small fleet: in one slot, one GPU is slowed (its hardware slowdown: it runs
    # 15 Cel cool) and another braked (half its power: some 20 Cel cool). Their slot's healthy GPU on the third
    # node is no hotter than its slot runs everywhere: no news (a median over the three, faults counted, said
    # its slot runs cool and it hot; seen on bench_base_rate's busy fleet).
    fleet = Busy(seed=5)
    slowed, braked = fleet.row(1, 6), fleet.row(2, 6)

    def faults(t: int, f: Busy) -> None:
        f.slowdown[slowed] = f.brake[braked] = t >= 1200
        f.extra_heat[slowed] = -15.0 if t >= 1200 else 0.0

    fleet.run(3600, faults)
    hits = {(key, v.reasons) for key, v in fleet.episodes(None)}
    assert hits == {(("train-001", "gpu-6"), ("thermal",)), (("train-002", "gpu-6"), ("power_delivery",))}, hits


@pytest.mark.parametrize("seed", [21, 22])
def test_a_gpu_is_not_changed_by_the_other_nodes_of_its_slot_going_idle(seed: int):
    # Rear slots run up to 4 Cel over their node's median at full power, less as power falls (seen on
    # bench_base_rate's training fleet: a job crashed, its nodes went idle, and what the slot's other nodes said
    # of it moved by that much). A GPU's usual excess over its node's devices did not change: no news.
    fleet = Busy(nodes=4, seed=seed, slot_scale=2.0, slot_by_power=True)

    def jobs_end(t: int, f: Busy) -> None:
        f.idle[GPUS:] = t >= 3600  # every node but the first, after an hour (the baselines are learnt)

    fleet.run(3600 + 1800, jobs_end)
    assert fleet.episodes(None) == []


def test_without_utilization_a_gpu_hotter_than_its_neighbours_is_not_judged_against_them():
    # Each GPU its own job and no utilization series (bench_prometheus' exporter writes none): one GPU's job turns
    # heavier than its neighbours' and it runs 12 Cel hotter than its usual over them. Nothing says its load is
    # theirs: the peers do not judge it (its limits still would).
    fleet = Busy(seed=31, report_util=False)
    heavier = fleet.row(1, 3)
    fleet.run(3600 + 1200, lambda t, f: f.extra_heat.__setitem__(heavier, 12.0 if t >= 3600 else 0.0))
    assert fleet.episodes(None) == []


def test_memory_held_full_is_evidence_only_when_the_policy_says_so(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("rules: {memory_pressure: {full_is_evidence: true}}\n")
    fleet = Busy(seed=12)
    fleet.classifier = Classifier(policy_mod.load(path), fleet.schema, interval_s=10.0)
    fleet.run(1200)
    assert {v.reasons for _, v in fleet.episodes(None)} == {("memory_pressure",)}


def test_a_lowered_power_limit_is_power_throttling():
    fleet = Busy(seed=13)
    low = fleet.row(2, 4)
    limits = np.full(3 * GPUS, 700.0)

    def lower(t: int, f: Busy) -> None:
        limits[low] = 450.0 if t >= 1200 else 700.0
        f.limits = limits

    fleet.run(2400, lower)
    hits = fleet.episodes(None)
    assert {key for key, _ in hits} == {("train-002", "gpu-4")}
    assert hits[0][1].reasons == ("power_throttling",)


@pytest.mark.parametrize("seed", [13, 14])
def test_a_lowered_power_limit_no_series_reports_is_seen_in_the_power_drawn_at_the_cap(seed: int):
    """No power limit series: a GPU held to 450 W sits at its cap as often as its node's job holds its peers at 700 W;
    the power it draws while capped says its limit. Its peers' capped samples that read low (communication phases)
    are not a lowered limit: every GPU reaches its own cap now and then."""
    fleet = Busy(seed=seed, report_limit=False, dips=0.3)
    low = fleet.row(2, 4)
    limits = np.full(3 * GPUS, 700.0)

    def lower(t: int, f: Busy) -> None:
        limits[low] = 450.0 if t >= 1200 else 700.0
        f.limits = limits
        f.cap_share[low] = f.cap_share[low - 1]  # capped as often as its neighbour: its cap time is no news

    fleet.run(2400, lower)
    hits = fleet.episodes(None)
    assert {key for key, _ in hits} == {("train-002", "gpu-4")}
    first = hits[0][1]
    assert first.reasons == ("power_throttling",) and "(no limit series)" in first.message
    assert first.time_unix_nano <= (T0 + 1200 + 600) * S  # within 10 minutes of the change


def test_gpus_whose_capped_samples_read_low_now_and_then_are_not_a_lowered_limit():
    fleet = Busy(seed=15, report_limit=False, dips=0.5)
    fleet.run(3600)
    assert fleet.episodes(None) == []


def test_a_crash_whose_events_straddle_two_samples_is_still_the_jobs():
    def crash(t: int, fleet: Busy) -> None:
        if t >= 1200 and t % 300 == 0:  # five GPUs now, three one sample later
            fleet.counters["xid13"][0:5] += 1
            fleet.counters["oom"][0:5] += 1
        if t >= 1200 and t % 300 == 10:
            fleet.counters["xid13"][5:8] += 1
            fleet.counters["oom"][5:8] += 1

    fleet = Busy(seed=14)
    fleet.run(3600, crash)
    assert fleet.episodes(None) == []
    scoped = {v.hw_id for (node, _), seq in fleet.verdicts.items() for v in seq if v.scope == "workload"}
    assert scoped == {f"gpu-{g}" for g in range(GPUS)}


def test_one_crash_is_not_news():
    def crash(t: int, fleet: Busy) -> None:
        if t == 1800:
            fleet.counters["xid13"][8:16] += 1
            fleet.counters["oom"][8:16] += 1

    fleet = Busy(seed=15)
    fleet.run(2700, crash)
    assert fleet.episodes(None) == []
    assert all(v.reasons == () for seq in fleet.verdicts.values() for v in seq)


def test_every_gpu_of_a_node_over_its_limit_is_the_nodes_cooling():
    fleet = Busy(seed=16)
    fleet.run(2400, lambda t, f: f.extra_heat.__setitem__(slice(0, GPUS), 20.0 if t >= 1200 else 0.0))
    hits = fleet.episodes(None)
    assert {key for key, _ in hits} == {("train-000", f"gpu-{g}") for g in range(GPUS)}
    for _, v in hits:
        assert v.reasons == ("thermal",) and (v.scope, v.group) == ("node", "node/train-000")
        assert "the node's cooling or inlet air" in v.message


def test_a_one_gpu_job_that_keeps_crashing_is_the_workloads():
    """A one-GPU replica's crash leaves its XID and its OOM on that GPU alone, at once: its process died."""

    def crash(t: int, fleet: Busy) -> None:
        if t >= 1200 and t % 300 == 0:
            fleet.counters["xid13"][fleet.row(1, 2)] += 1
            fleet.counters["oom"][fleet.row(1, 2)] += 1

    fleet = Busy(seed=17)
    fleet.run(3600, crash)
    assert fleet.episodes(None) == []
    seen = [v for seq in fleet.verdicts.values() for v in seq if v.scope != "device"]
    assert {(v.node, v.hw_id, v.scope) for v in seen} == {("train-001", "gpu-2", "workload")}


@pytest.mark.parametrize("seed", [21, 22])
def test_the_peers_power_cap_references_are_the_same_pooled_at_once_or_as_needed(seed: int, monkeypatch):
    # Loads spread over the utilization bins, so that some bins hold too few peers and their devices read the
    # pools of the levels above: a small fleet pools every level beside its own bins in one pass, a large one
    # only the levels some device needs. Each evaluation's references and node medians must not depend on which.
    from otel_dra.classifier import peer_evidence, reader

    seen: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for pools in (0, 10**9):
        monkeypatch.setattr(peer_evidence, "POOLS_AT_ONCE", pools)
        got = seen[pools] = []

        def kept(w, got=got):
            capped = peer_evidence.cap_peers(w)
            got.append((capped.references.copy(), capped.node_medians.copy()))
            return capped

        monkeypatch.setattr(reader, "cap_peers", kept)
        fleet = Busy(nodes=2, seed=seed)
        spread = np.random.default_rng(seed)
        fleet.util[:] = spread.choice([0.2, 0.5, 0.7, 0.9, 0.97], fleet.util.shape)
        fleet.cap_share[:] = spread.uniform(0.0, 0.8, fleet.cap_share.shape)
        fleet.run(1800)
    at_once, as_needed = seen[10**9], seen[0]
    assert len(at_once) == len(as_needed) > 100
    assert any(np.isfinite(ref).any() for ref, _ in at_once)  # (peers were found: the references were read)
    for (ref_a, med_a), (ref_b, med_b) in zip(at_once, as_needed, strict=True):
        np.testing.assert_array_equal(ref_a, ref_b)
        np.testing.assert_array_equal(med_a, med_b)


def test_a_fleet_of_one_gpu_nodes_has_no_thermal_peers_and_the_short_ways_say_what_the_long_one_does(monkeypatch):
    # One GPU a node: no node holds a peer group, nobody is judged against peers, and thermal_peers says so without
    # the work for the judged (held where on, its bar, no baseline): the same arrays as that work gives. Two short
    # ways: before the residuals (no node holds min_node_devices), and after them (every residual NaN).
    from otel_dra.classifier import peer_evidence, reader

    here = sys.modules[__name__]
    monkeypatch.setattr(here, "GPUS", 1)
    monkeypatch.setattr(here, "SLOT_OFFSET", SLOT_OFFSET[:1])
    seen: dict[str, list[tuple[np.ndarray, ...]]] = {}
    residuals: Counter[str] = Counter()  # thermal_residuals' calls each way
    thermal_residuals = peer_evidence.thermal_residuals
    for way in ("before", "after", "long"):
        if way != "before":  # (no node counted too small)
            monkeypatch.setattr(reader.Window, "most_on_a_node", lambda self: 1 << 30)
        if way == "long":  # (and the all-NaN residuals not taken for nobody judged)
            monkeypatch.setattr(peer_evidence, "all_of", lambda a: False)
        got = seen[way] = []
        _calls_through(
            monkeypatch, peer_evidence, "thermal_residuals", thermal_residuals, lambda _, w=way: residuals.update([w])
        )
        _calls_through(
            monkeypatch,
            reader,
            "thermal_peers",
            peer_evidence.thermal_peers,
            lambda p, got=got: got.append((p.flagged, p.hot, p.judged, p.bar, p.baseline)),
        )
        fleet = Busy(nodes=6, seed=3)
        fleet.extra_heat[2] = 12.0  # (hot for itself: its own limits may hold thermal on)
        fleet.run(1200)
    assert len(seen["before"]) == len(seen["after"]) == len(seen["long"]) > 50
    assert residuals["before"] == 0 < residuals["after"] == residuals["long"]  # (the first short way was taken)
    assert not any(judged.any() for _, _, judged, _, _ in seen["long"])  # (nobody judged: the second was there to take)
    for short in ("before", "after"):
        for got, long in zip(seen[short], seen["long"], strict=True):
            for a, b in zip(got, long, strict=True):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", [23, 24])
def test_a_fleet_of_one_gpu_nodes_has_no_power_cap_node_medians_and_the_short_way_says_what_the_long_one_does(
    seed: int, monkeypatch
):
    # One GPU a node: no node holds ``min_peers`` devices, so cap_peers groups the limits alone, not the node medians
    # beside them: every array it gives is the same as the grouping of both gives (node medians all NaN).
    from otel_dra.classifier import peer_evidence, reader

    here = sys.modules[__name__]
    monkeypatch.setattr(here, "GPUS", 1)
    monkeypatch.setattr(here, "SLOT_OFFSET", SLOT_OFFSET[:1])
    seen: dict[bool, list[tuple[np.ndarray, ...]]] = {}
    grouped: Counter[bool] = Counter()  # node groupings made (the long way's node medians)
    dense = peer_evidence.dense
    for short in (True, False):
        if not short:  # (the long way: no node counted too small)
            monkeypatch.setattr(reader.Window, "most_on_a_node", lambda self: 1 << 30)
        got = seen[short] = []
        _calls_through(monkeypatch, peer_evidence, "dense", dense, lambda _, s=short: grouped.update([s]))
        _calls_through(
            monkeypatch,
            reader,
            "cap_peers",
            peer_evidence.cap_peers,
            lambda c, got=got: got.append(
                (c.shares, c.references, c.node_medians, c.limit, c.limit_median, c.limit_seen)
            ),
        )
        fleet = Busy(nodes=12, seed=seed)
        spread = np.random.default_rng(seed)
        fleet.util[:] = spread.choice([0.5, 0.9, 0.97], fleet.util.shape)
        fleet.cap_share[:] = spread.uniform(0.0, 0.8, fleet.cap_share.shape)
        fleet.run(1800)
    assert len(seen[True]) == len(seen[False]) > 100
    assert grouped[True] < grouped[False]  # (the short way was taken)
    assert any(np.isfinite(c[1]).any() for c in seen[True])  # (peers were found: the references were read)
    assert any(np.isfinite(c[4]).any() for c in seen[True])  # (and the limits' medians)
    for short, long in zip(seen[True], seen[False], strict=True):
        for a, b in zip(short, long, strict=True):
            np.testing.assert_array_equal(a, b)


def _calls_through(
    monkeypatch: pytest.MonkeyPatch,
    module: object,
    name: str,
    original: Callable[..., Any],
    each: Callable[[Any], object],
) -> None:
    """``module.name`` patched to call ``original`` (the function before any patch: the loops above patch it again
    each way) and hand each result to ``each`` (a count, a record)."""

    def call(*args: Any) -> Any:
        result = original(*args)
        each(result)
        return result

    monkeypatch.setattr(module, name, call)
