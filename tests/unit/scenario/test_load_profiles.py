"""Busy fleets (``otel-dra simulate --load``): healthy load looks like load (memory held full, power at
its cap, some degrees under the slowdown limit, PCIe at Gen1 when idle), faults look like themselves on
busy GPUs, a job's crash looks like the job's, and the scorer judges scopes and workload traps.

Properties are measured from one generated training fleet (10 nodes of 8 H100s, 50 minutes, decoded
with the project's decoder), from plans of several seeds and profiles, and from the job model itself."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_dra import conventions as cv
from otel_dra.cli import cli
from otel_dra.scenario import load as wl
from otel_dra.scenario.figures import passes
from otel_dra.scenario.generate import ScenarioConfig, form, generate
from otel_dra.scenario.kinds import WORKLOAD_TRAPS, kinds_for
from otel_dra.scenario.planner import make_plan
from otel_dra.scenario.score import score
from tests.unit.scenario.test_scenario import ALL, T0, Recording, S, decode, degraded, fault, labels, v

H100_LIMIT = 85.0
THROTTLE = cv.HW_THROTTLE_TIME.name


# -- one training fleet, generated once ---------------------------------------------------------------
@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    folder = tmp_path_factory.mktemp("training")
    config = form("short", seed=0, load="training", shape="tidy", nodes=10, devices_per_node=8)
    result = generate(config, folder / "training.jsonl.gz")
    return decode(result.recording, json.loads(result.labels.read_text()))


def gpus(rec: Recording) -> list[tuple[str, str]]:
    return [k for k in rec.times if k[1].startswith("gpu")]


def healthy(rec: Recording) -> list[tuple[str, str]]:
    """GPUs with no fault and no device trap, off the silent, the restarted and the crash-looping node."""
    odd = {(f["k8s.node.name"], f["hw.id"]) for f in rec.labels["faults"]}
    odd |= {(t["k8s.node.name"], t["hw.id"]) for t in rec.labels["traps"] if t["hw.id"]}
    nodes = {rec.labels["node_silence"]["node"], rec.labels["agent_restart"]["node"]}
    nodes |= {t["k8s.node.name"] for t in rec.labels["traps"] if t["kind"] == "crash_loop"}
    return [k for k in gpus(rec) if k not in odd and k[0] not in nodes]


def series(rec: Recording, key: tuple[str, str], metric: str, **attrs: str) -> np.ndarray:
    return rec.series(key, metric, **attrs)[1]


def util(rec: Recording, key: tuple[str, str]) -> np.ndarray:
    return series(rec, key, cv.HW_GPU_UTILIZATION.name, **{cv.HW_GPU_TASK: "general"})


def temp(rec: Recording, key: tuple[str, str]) -> np.ndarray:
    return series(rec, key, cv.HW_TEMPERATURE.name, **{cv.HW_SENSOR_LOCATION: "gpu"})


def throttle(rec: Recording, key: tuple[str, str], reason: str) -> np.ndarray:
    return series(rec, key, THROTTLE, **{cv.HW_THROTTLE_REASON: reason})


def errors(rec: Recording, key: tuple[str, str], **attrs: str) -> np.ndarray:
    return np.nan_to_num(series(rec, key, cv.HW_ERRORS.name, **attrs), nan=0.0)


def faults_of(rec: Recording, kind: str) -> list[dict]:
    found = [f for f in rec.labels["faults"] if f["kind"] == kind]
    assert found, kind
    return found


def rate(t: np.ndarray, counter: np.ndarray, mask: np.ndarray) -> float:
    """Seconds a counter of seconds accrued per second, between consecutive samples both in ``mask``."""
    both = mask[:-1] & mask[1:]
    return float(np.diff(counter)[both].sum() / (np.diff(t)[both].sum() / 1e9))


# -- healthy load --------------------------------------------------------------------------------------
def test_training_holds_memory_full_and_power_at_its_cap(training):
    shares = []
    for key in healthy(training):
        t, u = training.times[key], util(training, key)
        busy = u >= 0.85
        if busy.sum() < 60:  # its job ended early in the recording: nothing to measure
            continue
        mem = series(training, key, cv.HW_GPU_MEMORY_UTILIZATION.name)
        assert np.median(mem[busy]) >= 0.93, key  # PyTorch's caching allocator keeps what the job took
        power = series(training, key, cv.HW_POWER.name)
        limit = series(training, key, cv.HW_POWER_LIMIT.name, **{cv.HW_LIMIT_TYPE: "max"})
        assert (power <= limit + 0.05).all()
        assert (power[busy] >= 0.98 * limit[busy]).mean() >= 0.3, key  # at the cap much of the busy time
        shares.append(rate(t, throttle(training, key, "power_cap"), busy))
        assert np.isnan(throttle(training, key, "power")).all()  # NVML tells the causes apart
    assert len(shares) >= 10
    assert min(shares) >= 0.25 and max(shares) <= 0.9  # 30-80% of busy time, by device and job
    assert max(shares) - min(shares) > 0.05  # devices differ (their power efficiency does)


def test_busy_gpus_run_some_degrees_under_their_slowdown_limit(training):
    medians = {}
    for key in healthy(training):
        busy = util(training, key) >= 0.85
        t = temp(training, key)
        assert t.max() < H100_LIMIT - 0.5, key
        if busy.sum() >= 60:
            medians[key] = float(np.median(t[busy]))
    hottest = max(medians.values())
    assert H100_LIMIT - 9.0 <= hottest <= H100_LIMIT - 2.0
    # The same chassis: rear slots (the higher half) run hotter than the front ones at the same load.
    rear = [m for (_, dev), m in medians.items() if int(dev.split("-")[1]) >= 4]
    front = [m for (_, dev), m in medians.items() if int(dev.split("-")[1]) < 4]
    assert np.median(rear) > np.median(front) + 1.0


def test_pcie_trains_down_to_gen1_when_no_job_holds_the_gpu(training):
    idle = busy = 0
    for key in gpus(training):
        u = util(training, key)
        gen = series(training, key, cv.HW_PCIE_LINK_GENERATION.name)
        limit = series(training, key, cv.HW_PCIE_LINK_GENERATION_LIMIT.name, **{cv.HW_LIMIT_TYPE: "max"})
        assert (gen[u == 0] == 1).all(), key
        assert (gen[u >= 0.85] == limit[u >= 0.85]).all(), key
        idle += int((u == 0).sum())
        busy += int((u >= 0.85).sum())
    assert idle > 0 and busy > idle


# -- a job's crash ---------------------------------------------------------------------------------------
def workload_traps(rec: Recording) -> list[dict]:
    quiet = {rec.labels["node_silence"]["node"], rec.labels["agent_restart"]["node"]}
    found = [t for t in rec.labels["traps"] if t["kind"] in WORKLOAD_TRAPS]
    assert {t["kind"] for t in found} == set(WORKLOAD_TRAPS)
    return [t for t in found if t["k8s.node.name"] not in quiet]


def test_a_crash_puts_one_xid_and_one_oom_on_every_gpu_of_the_job_in_the_same_line(training):
    for trap in workload_traps(training):
        node, detail = trap["k8s.node.name"], trap["detail"]
        assert trap["hw.id"] is None and detail["group"] == f"workload/node/{node}"
        assert detail["hw.error.code"] in wl.APP_XIDS and detail["out_of_memory"] is True
        assert trap["at_unix_nano"] == detail["crashes_unix_nano"][0]
        for at in detail["crashes_unix_nano"]:
            steps, lines = set(), set()
            for dev in detail["hw.ids"]:
                key = (node, dev)
                t = training.times[key]
                i = int(np.searchsorted(t, at))  # the first line at or after the crash
                if i == len(t):
                    continue  # a lost device: nothing more from it
                oom = errors(training, key, **{cv.ERROR_TYPE_ATTR: "out_of_memory"})
                xid = errors(training, key, **{cv.ERROR_TYPE_ATTR: "driver", cv.HW_ERROR_CODE: detail["hw.error.code"]})
                steps.add((oom[i] - oom[i - 1], xid[i] - xid[i - 1]))
                lines.add(int(t[i]))
            assert steps == {(1.0, 1.0)} and len(lines) == 1, (trap["kind"], node, at, steps)


def test_a_crash_loop_restarts_with_the_kubelet_s_backoff(training):
    (loop,) = [t for t in training.labels["traps"] if t["kind"] == "crash_loop"]
    crashes = np.array(loop["detail"]["crashes_unix_nano"]) / 1e9
    assert len(crashes) >= 4
    assert loop["detail"]["from_unix_nano"] == loop["detail"]["crashes_unix_nano"][0]
    assert loop["detail"]["to_unix_nano"] == loop["detail"]["crashes_unix_nano"][-1]
    gaps = np.diff(crashes)  # a back-off (10 s doubling to 300 s) then a run of a few minutes
    assert (gaps >= wl.BACKOFF_FIRST_S + wl.LOOP_RUN_S[0]).all()
    assert (gaps <= wl.BACKOFF_MAX_S + wl.LOOP_RUN_S[1]).all()


def test_no_gpu_outside_a_crash_gets_an_application_xid_or_an_oom(training):
    crashed = defaultdict(set)
    for trap in training.labels["traps"]:
        if trap["kind"] in WORKLOAD_TRAPS:
            crashed[trap["k8s.node.name"]].update(trap["detail"]["hw.ids"])
    for key in healthy(training):
        if key[1] in crashed.get(key[0], ()):
            continue
        oom = errors(training, key, **{cv.ERROR_TYPE_ATTR: "out_of_memory"})
        assert (np.diff(oom) == 0).all(), key


# -- faults on busy GPUs -------------------------------------------------------------------------------
def peers_of(rec: Recording, f: dict) -> list[tuple[str, str]]:
    return [k for k in gpus(rec) if k[0] == f["k8s.node.name"] and k[1] != f["hw.id"]]


def test_a_hot_gpu_runs_6_to_10_degrees_over_its_peers_and_under_its_limit(training):
    for f in faults_of(training, "hot_gpu"):
        key = (f["k8s.node.name"], f["hw.id"])
        t, own = training.times[key], temp(training, key)
        assert 6.0 <= f["detail"]["offset_c"] <= 10.0
        assert own.max() < f["detail"]["limit"]
        peers = peers_of(training, f)
        others = np.array([np.interp(t, training.times[p], temp(training, p)) for p in peers])
        busy = (util(training, key) >= 0.85) & (t >= f["onset_unix_nano"] + 150 * S)  # a few time constants in
        before = (util(training, key) >= 0.85) & (t < f["onset_unix_nano"])
        over = own - np.median(others, axis=0)
        assert np.median(over[busy]) >= 6.0
        assert np.median(over[busy]) - np.median(over[before]) >= 5.0  # the extra heat starts at the onset


def test_a_node_power_brake_is_on_every_gpu_of_one_node(training):
    braked = faults_of(training, "node_power_brake")
    (node,) = {f["k8s.node.name"] for f in braked}
    assert {f["hw.id"] for f in braked} == {k[1] for k in gpus(training) if k[0] == node}
    assert {(f["scope"], f["group"], f["onset_unix_nano"]) for f in braked} == {
        ("node", f"node/{node}", braked[0]["onset_unix_nano"])
    }
    for f in braked:
        key = (node, f["hw.id"])
        t = training.times[key]
        after, before = t >= f["onset_unix_nano"], t < f["onset_unix_nano"]
        brake = throttle(training, key, "power_brake")
        assert rate(t, brake, after) >= 0.8 and rate(t, brake, before) == 0.0
        power = series(training, key, cv.HW_POWER.name)
        assert 0.4 <= np.median(power[after]) / 700.0 <= 0.6 < np.median(power[before]) / 700.0


def test_hw_slowdown_accrues_on_its_gpu_for_much_of_each_minute(training):
    for f in faults_of(training, "hw_slowdown"):
        key = (f["k8s.node.name"], f["hw.id"])
        t = training.times[key]
        slow = throttle(training, key, "hw_slowdown")
        assert 0.45 <= rate(t, slow, t >= f["onset_unix_nano"]) <= 0.9
        assert rate(t, slow, t < f["onset_unix_nano"]) == 0.0
        for peer in peers_of(training, f):
            assert np.nanmax(throttle(training, peer, "hw_slowdown")) == 0.0


def test_power_throttling_under_load_is_a_lowered_limit_held_all_the_busy_time(training):
    for f in faults_of(training, "power_throttling"):
        key = (f["k8s.node.name"], f["hw.id"])
        t = training.times[key]
        limit = series(training, key, cv.HW_POWER_LIMIT.name, **{cv.HW_LIMIT_TYPE: "max"})
        after = t >= f["onset_unix_nano"]
        assert set(limit[~after]) == {700.0} and np.abs(limit[after] - f["detail"]["limit_w"]).max() <= 0.05
        assert 0.55 * 700 <= f["detail"]["limit_w"] <= 0.7 * 700
        busy = after & (util(training, key) >= 0.85)
        assert rate(t, throttle(training, key, "power_cap"), busy) >= 0.85


def test_memory_pressure_under_load_is_one_gpu_running_out_again_and_again(training):
    for f in faults_of(training, "memory_pressure"):
        key = (f["k8s.node.name"], f["hw.id"])
        t = training.times[key]
        oom = errors(training, key, **{cv.ERROR_TYPE_ATTR: "out_of_memory"})
        mem = series(training, key, cv.HW_GPU_MEMORY_UTILIZATION.name)
        after = t >= f["onset_unix_nano"]
        assert oom[after][-1] - oom[~after][-1] >= 2
        assert np.median(mem[util(training, key) >= 0.85]) >= 0.93  # full like everyone's, no more


# -- plans: every seed and profile -----------------------------------------------------------------------
@pytest.mark.parametrize("load", ["training", "inference", "mixed"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_busy_fleet_holds_every_fault_and_workload_trap(load, seed):
    plan = make_plan(form("short", seed=seed, load=load))
    assert {f.kind.name for f in plan.faults} == {k.name for k in kinds_for(load)}
    assert {"job_crash", "crash_loop"} <= {t.kind for t in plan.traps}
    assert set(plan.node_load) <= {"training", "inference", "idle"}
    if load != "mixed":
        assert set(plan.node_load) == {load}
    braked = [f for f in plan.faults if f.kind.name == "node_power_brake"]
    (node,) = {f.node for f in braked}
    assert sorted(f.row for f in braked) == sorted(plan.nodes[node].rows)
    assert plan.nodes[node].model.vendor == "NVIDIA"
    for trap in plan.traps:
        if trap.kind in WORKLOAD_TRAPS:  # an AMD GPU shows the crash as an OOM only
            nvidia = plan.nodes[trap.node].model.vendor == "NVIDIA"
            assert ("hw.error.code" in trap.detail) == nvidia
            assert trap.row is None and trap.detail["group"] == f"workload/node/{plan.nodes[trap.node].name}"


def test_mixed_assigns_nodes_to_training_inference_and_idle():
    rng = np.random.default_rng(0)
    assert sorted(wl.profile_of_nodes("mixed", 20, rng)) == ["idle"] * 3 + ["inference"] * 7 + ["training"] * 10
    assert set(wl.profile_of_nodes("mixed", 3, rng)) >= {"training", "inference"}


def test_no_faults_keeps_the_traps_and_oddities():
    plan = make_plan(form("short", seed=4, load="training", faults=False))
    assert plan.faults == []
    kinds = {t.kind for t in plan.traps}
    assert {"job_crash", "crash_loop", "agent_restart", "hot_plug", "temp_spike"} <= kinds
    idle = make_plan(form("short", seed=4, faults=False))
    assert idle.faults == [] and "temp_spike" in {t.kind for t in idle.traps}


def test_a_busy_fleet_too_small_for_its_whole_node_faults_is_one_clear_line():
    ScenarioConfig(nodes=12, devices_per_node=4, load="training")  # the short form fits
    with pytest.raises(ValueError, match="too small for every fault and trap under --load training") as err:
        ScenarioConfig(nodes=8, devices_per_node=4, load="training")
    assert "\n" not in str(err.value)
    ScenarioConfig(nodes=8, devices_per_node=4, load="training", faults=False)  # no fault: it fits
    with pytest.raises(ValueError, match="load must be one of idle, training, inference, mixed"):
        ScenarioConfig(load="busy")


# -- the job model ---------------------------------------------------------------------------------------
def test_training_jobs_last_hours_with_short_gaps_between():
    rng = np.random.default_rng(5)
    lengths, gaps = [], []
    for _ in range(200):
        lane = wl.Lane("training", range(8), rng, 0.0, first_job_at=0.0)
        lane.extend(10 * 86400.0)
        for job, nxt in zip(lane.jobs, lane.jobs[1:], strict=False):
            runs = [r for r in lane.runs if r.job == job.index]
            lengths.append(runs[-1].end - job.start)
            gaps.append(nxt.start - runs[-1].end)
    assert 4 * 3600 <= np.median(lengths) <= 8 * 3600
    assert wl.TRAINING_GAP_S[0] <= min(gaps) and max(gaps) <= wl.TRAINING_GAP_S[1] + 600


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["training", "inference"]))
def test_a_lane_s_runs_never_overlap_and_crash_loops_back_off(seed, kind):
    rng = np.random.default_rng(seed)
    lane = wl.Lane(kind, range(4), rng, 0.0, forced=[wl.Forced(3000.0, 3600.0)], first_job_at=0.0)
    lane.extend(3 * 86400.0)
    for a, b in zip(lane.runs, lane.runs[1:], strict=False):
        assert a.start < a.end <= b.start
        assert float(a.end).is_integer() and float(b.start).is_integer()
    loop = [r for r in lane.runs if r.loop]
    assert len(loop) >= 3 and all(r.crashed for r in loop)
    waits = [b.start - a.end for a, b in itertools.pairwise(loop) if a.job == b.job]
    assert waits[0] == wl.BACKOFF_FIRST_S  # the kubelet: 10 s, doubling, at most 300 s
    for before, after in itertools.pairwise(waits):
        assert after in (min(2 * before, wl.BACKOFF_MAX_S), wl.BACKOFF_FIRST_S)
    for run in lane.runs:
        for a, b, u in run.dips:
            assert run.start <= a < b <= run.end and 0.05 <= u <= 0.3


def test_inference_reserves_its_memory_and_reaches_the_cap_only_at_peaks():
    rng = np.random.default_rng(2)
    lanes = wl.make_lanes("inference", 8, rng)
    model = wl.LoadModel(
        lanes, [list(x.slots) for x in lanes], np.full(8, 70.0), np.full(8, 700.0), np.random.default_rng(3), 1.8e9
    )
    mem, util, at_cap = [], [], []
    for t in range(0, 24 * 3600, 30):
        s = model.step(float(t))
        th = wl.power_and_throttle(s, np.full(8, 700.0), 30.0)
        ramped = s.running & (s.util > 0.05)
        mem += list(s.mem[ramped])
        util += list(s.util[ramped])
        at_cap += list(th.power_w[ramped] >= 0.98 * 700)
    assert np.percentile(mem, 5) >= 0.89 and np.percentile(mem, 95) <= 0.955
    assert np.percentile(util, 5) < 0.3 and np.percentile(util, 95) > 0.75  # the day's trough and its peaks
    assert 0.0 < np.mean(at_cap) < 0.25


def test_the_power_model_caps_brakes_and_slows():
    s = wl.LoadSample(
        util=np.ones(3),
        mem=np.full(3, 0.95),
        demand_w=np.array([760.0, 760.0, 760.0]),
        running=np.ones(3, bool),
        compute=np.ones(3),
        hi_w=np.full(3, 760.0),
        lo_w=np.full(3, 600.0),
    )
    th = wl.power_and_throttle(
        s,
        np.full(3, 700.0),
        10.0,
        brake_w=np.array([np.nan, 350.0, np.nan]),
        brake_share=0.9,
        slowdown=np.array([False, False, True]),
        slowdown_share=np.array([0.0, 0.0, 0.6]),
    )
    assert th.power_w.tolist() == [700.0, 350.0, 350.0]
    assert th.power_cap_s[0] == pytest.approx(10.0, abs=0.1) and th.power_cap_s[1] == 0.0
    assert th.power_brake_s.tolist() == pytest.approx([0.0, 9.0, 0.0])
    assert th.hw_slowdown_s.tolist() == pytest.approx([0.0, 0.0, 6.0])
    assert th.power_cap_s[2] == pytest.approx(4.0, abs=0.1)


# -- the command line ------------------------------------------------------------------------------------
def test_simulate_with_load_and_no_faults(tmp_path):
    out = tmp_path / "busy.jsonl.gz"
    result = CliRunner().invoke(cli, ["simulate", str(out), "--load", "inference", "--no-faults", "--seed", "3"])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "busy.labels.json").read_text())
    assert doc["load"] == "inference" and doc["faults"] == []
    assert {n["load"] for n in doc["nodes"]} == {"inference"}
    assert {"job_crash", "crash_loop"} <= {t["kind"] for t in doc["traps"]}
    result = CliRunner().invoke(cli, ["simulate", str(out), "--load", "training", "--nodes", "8"])
    assert result.exit_code == 2 and "too small" in result.output
    help_text = CliRunner().invoke(cli, ["simulate", "--help"]).output
    for words in ("--load", "training", "inference", "mixed", "--no-faults"):
        assert words in help_text


# -- the scorer: scopes and workload traps ---------------------------------------------------------------
def scoped(at, dev, reasons, scope, group=None, node="n1", health="Healthy", state="degraded"):
    line = v(at, dev, health, state, reasons, node)
    line["scope"] = scope
    if group is not None:
        line["group"] = group
    return line


def brake(dev):
    return fault(
        kind="node_power_brake", dev=dev, reasons=("power_delivery",), severity="soft", scope="node", group="node/n1"
    )


def test_a_scoped_fault_is_caught_only_in_its_scope_and_group():
    lab = labels([brake(f"gpu-{i}") for i in range(4)])
    lines = [
        *[v(0, d, node=n) for n, d in ALL],
        scoped(1100, "gpu-0", ["power_delivery"], "node", "node/n1"),  # right
        degraded(1100, "gpu-1", ("power_delivery",)),  # no scope: the device's
        scoped(1100, "gpu-2", ["power_delivery"], "node", "node/n2"),  # another node
        scoped(1100, "gpu-3", ["thermal"], "node", "node/n1"),  # the right scope, another reason
    ]
    s = score(lab, lines)
    assert s.soft_detected == 1
    why = {m["hw.id"]: m["why"] for m in s.soft_missed}
    assert why["gpu-1"] == "matching reason but scope device, not node node/n1"
    assert why["gpu-2"] == "matching reason but scope node node/n2, not node node/n1"
    assert why["gpu-3"] == "flagged with other reasons: thermal"


def crash_trap(at=1000, ids=("gpu-0", "gpu-1"), kind="job_crash", node="n1", **detail):
    return {
        "k8s.node.name": node,
        "hw.id": None,
        "kind": kind,
        "at_unix_nano": T0 + at * S,
        "detail": {
            "hw.error.code": "13",
            "crashes_unix_nano": [T0 + at * S],
            "group": f"workload/node/{node}",
            "hw.ids": list(ids),
            **detail,
        },
    }


def test_device_scoped_verdicts_on_a_crashed_job_s_gpus_are_their_own_figure():
    lines = [
        *[v(0, d, node=n) for n, d in ALL],
        degraded(1010, "gpu-0", ("driver_errors",)),  # device-scoped, inside the hour: counted
        v(1300, "gpu-0"),
        scoped(1010, "gpu-1", ["driver_errors"], "workload", "workload/node/n1"),  # the right answer
        v(1300, "gpu-1"),
        degraded(1000 + 3700, "gpu-1", ("memory_pressure",)),  # after the hour: an ordinary false positive
        degraded(1010, "gpu-2", ("driver_errors",)),  # not a GPU of the job
    ]
    s = score(labels(traps=[crash_trap()]), lines)
    assert (s.workload_traps, s.workload_trap_devices) == (1, 2)
    figures = (s.workload_device_scoped_episodes, s.workload_device_scoped_devices, s.workload_scoped_episodes)
    assert figures == (1, 1, 1)
    assert s.fp_episodes == 3  # gpu-0's, gpu-1's late one, gpu-2's
    names = [t.name for t in s.targets()]
    assert names[-1] == "workload traps with a device-scoped non-ok verdict"
    assert any(m.startswith("workload traps with a device-scoped non-ok verdict: 1 episodes") for m in passes(s))
    assert s.workload_examples[0]["hw.id"] == "gpu-0"
    # A crash loop is watched until an hour after its last crash; a fault window excuses as ever.
    loop = crash_trap(kind="crash_loop", ids=("gpu-0",), to_unix_nano=T0 + 2000 * S, from_unix_nano=T0 + 1000 * S)
    s = score(labels(traps=[loop]), [v(0, "gpu-0"), degraded(5500, "gpu-0", ("driver_errors",))])
    assert s.workload_device_scoped_episodes == 1
    ecc = fault(at=5400)
    s = score(labels([ecc], traps=[loop]), [v(0, "gpu-0"), degraded(5500, "gpu-0", ("driver_errors",))])
    assert s.workload_device_scoped_episodes == 0 and s.fp_episodes == 0
    # Labels without workload traps keep their six targets.
    assert len(score(labels(), lines).targets()) == 6


def test_false_positives_split_by_health_and_reason():
    lines = [
        *[v(0, d, node=n) for n, d in ALL],
        degraded(100, "gpu-0", ("memory_pressure", "power_throttling")),
        v(200, "gpu-0"),
        v(300, "gpu-1", "Unhealthy", "failed", ("driver_errors",)),
        v(400, "gpu-1"),
        degraded(500, "gpu-2", ("power_throttling",)),
    ]
    s = score(labels(), lines)
    assert (s.fp_episodes, s.fp_unhealthy_episodes, s.fp_degraded_episodes) == (3, 1, 2)
    assert s.fp_by_reason == {"driver_errors": 1, "memory_pressure": 1, "power_throttling": 2}
    assert s.fp_unhealthy_by_reason == {"driver_errors": 1}
    assert s.fp_unhealthy_per_100_device_hours == pytest.approx(12.5)
    doc = s.to_json()
    assert doc["fp_by_reason"] == s.fp_by_reason and "workload_device_scoped_episodes" in doc


EXAMPLE = Path(__file__).resolve().parents[3].parent / "shared" / "examples" / "fleet-sample.labels.json"


@pytest.mark.skipif(not EXAMPLE.exists(), reason="the shared example is not beside this checkout")
def test_the_shared_example_s_labels_keep_their_six_targets_and_ignore_verdict_scopes():
    """Old labels (no scope, no workload traps): the same targets, and a fault without a scope is caught by a
    verdict of any scope, as before scopes existed."""
    doc = json.loads(EXAMPLE.read_text())
    first = doc["faults"][0]
    hit = {**v(0), "time_unix_nano": first["onset_unix_nano"], "k8s.node.name": first["k8s.node.name"]}
    hit.update({"hw.id": first["hw.id"], "health": "Unhealthy", "hw.state": "failed", "reasons": first["reasons"]})
    plain = score(doc, [hit]).to_json()
    with_scope = score(doc, [{**hit, "scope": "node", "group": "node/x"}]).to_json()
    assert plain == with_scope and plain["hard_detected"] + plain["soft_detected"] == 1
    assert [t["name"] for t in plain["targets"]] == [t.name for t in score(doc, []).targets()]
    assert len(plain["targets"]) == 6 and plain["workload_traps"] == 0
