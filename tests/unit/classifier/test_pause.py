"""A fleet that was paused knows it (issue #16): after its own stall (SIGSTOP, a throttled container,
a long pause) it does not call the nodes it could not listen to stale, and a node that really went
silent is still stale one sampling interval after the resume at the latest.

The fleet is driven with fake clocks: each node's request is handed to ``Fleet.on_frames`` at its
arrival, and ``Fleet.tick`` runs every ``evaluate_every`` of both the wall and the monotonic clock,
except while the fleet stands still."""

from __future__ import annotations

import numpy as np

from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier, Verdict
from otel_dra.config import FleetConfig
from otel_dra.fleet import Fleet
from otel_dra.frame import DeviceTable, Frame, Schema
from otel_dra.sources.simulated import gpu_columns

S = 10**9
T0 = 1_795_000_000  # the wall clock's start, s
M0 = 5_000.0  # the monotonic clock's start, s
COLS = gpu_columns()
READING = {"temp.gpu": 60.0, "temp.gpu.limit.high.degraded": 85.0, "temp.gpu.limit.high.critical": 92.0}
INTERVAL_S = 10.0
EVERY_S = 5.0
STALL_S = 75.0
NODES = 20
GPUS = 4


class PausedFleet:
    """``NODES`` nodes of ``GPUS`` GPUs pushing every 10 s (each at its own phase) to a fleet ticking every 5 s."""

    def __init__(self) -> None:
        self.fleet = Fleet(FleetConfig(sample_interval_s=INTERVAL_S, evaluate_every_s=EVERY_S), policy_mod.load())
        for col in COLS.values():
            self.fleet.schema.index(col)
        self.tables = {
            f"node-{n:02d}": DeviceTable(f"node-{n:02d}", tuple(f"gpu-{g}" for g in range(GPUS)), ({},) * GPUS)
            for n in range(NODES)
        }
        self.phase = {name: 0.37 * n for n, name in enumerate(self.tables)}
        self.silent: set[str] = set()  # nodes that stopped pushing
        self.verdicts: list[tuple[float, Verdict]] = []  # (fleet time s, verdict) of every change
        self.t = 0.0  # seconds since T0 on the wall clock, and since M0 on the monotonic one

    def frame(self, node: str, at_s: float) -> Frame:
        values = np.full((GPUS, len(self.fleet.schema)), np.nan)
        for key, value in READING.items():
            values[:, self.fleet.schema.index(COLS[key])] = value
        values[:, self.fleet.schema.index(COLS["errors.corrected"])] = 0.0
        return Frame(round((T0 + at_s) * S), self.tables[node], values)

    def pushes(self, start_s: float, end_s: float) -> list[tuple[float, str]]:
        """(time, node) of every push in ``[start_s, end_s)``, in time order."""
        out = []
        for node, phase in self.phase.items():
            k = np.ceil((start_s - phase) / INTERVAL_S)
            while (at := phase + k * INTERVAL_S) < end_s:
                out.append((at, node))
                k += 1
        return sorted(out)

    def tick(self) -> None:
        for v in self.fleet.tick(round((T0 + self.t) * S), M0 + self.t):
            self.verdicts.append((self.t, v))

    def run(self, seconds: float) -> None:
        """Pushes heard as they arrive, a tick every ``EVERY_S``, for ``seconds`` from now."""
        end = self.t + seconds
        pushes = self.pushes(self.t, end)
        while self.t < end:
            next_tick = self.t + EVERY_S
            while pushes and pushes[0][0] < next_tick:
                at, node = pushes.pop(0)
                if node not in self.silent:
                    self.fleet.on_frames([self.frame(node, at)], round((T0 + at) * S))
            self.t = next_tick
            self.tick()

    def stall(self, seconds: float) -> None:
        """The fleet stands still for ``seconds``: no tick, nothing read. It resumes with a tick, and
        then reads the burst the kernel buffered meanwhile (each request heard at its arrival)."""
        buffered = [(at, node) for at, node in self.pushes(self.t, self.t + seconds) if node not in self.silent]
        self.t += seconds
        self.tick()
        for i, (at, node) in enumerate(buffered):
            self.fleet.on_frames([self.frame(node, at)], round((T0 + self.t + 0.001 * (i + 1)) * S))

    def health(self) -> dict[tuple[str, str], str]:
        return {(v.node, v.hw_id): v.health for v in self.fleet.classifier.current()}


def test_a_75_s_stall_of_the_fleet_leaves_no_device_unknown_and_a_silent_node_is_stale_a_sampling_interval_after():
    f = PausedFleet()
    f.run(300)  # windows with history: every device Healthy
    assert set(f.health().values()) == {"Healthy"}, f.health()
    f.silent.add("node-07")  # goes silent as the fleet stalls: its last request came before the stall
    resumed = f.t + STALL_S
    before = len(f.verdicts)
    f.stall(STALL_S)
    f.run(60)
    after = f.verdicts[before:]
    unknown = sorted({(v.node, v.hw_id) for _, v in after if v.health == "Unknown" and v.node != "node-07"})
    assert not unknown, (
        f"{len(unknown)} of {NODES * GPUS - GPUS} devices Unknown after the fleet's own stall: {unknown}"
    )
    stale = {v.hw_id: t for t, v in after if v.node == "node-07" and v.health == "Unknown"}
    assert set(stale) == {f"gpu-{g}" for g in range(GPUS)}, after
    assert max(stale.values()) <= resumed + INTERVAL_S, (resumed, stale)
    assert all(v.reasons == ("stale",) for _, v in after if v.node == "node-07" and v.health == "Unknown")


def test_the_burst_after_a_stall_is_heard_at_its_arrival_not_at_the_stall_or_the_tick():
    f = PausedFleet()
    f.run(60)
    f.stall(STALL_S)
    arrived = T0 + f.t + 0.001
    f.t += 1.0
    f.tick()
    reg = f.fleet.classifier.registry
    row = reg.row("node-00", "gpu-0")
    assert row is not None
    assert abs(float(reg.last_heard[row]) - arrived) < 0.5  # heard at the burst's arrival, before this tick
    assert float(reg.last_heard[row]) < T0 + f.t


def test_a_node_already_stale_before_the_stall_stays_unknown_through_it():
    """The grace is for what was fresh when the fleet stopped: a node that was already stale does
    not flip back to Healthy and then to Unknown again."""
    f = PausedFleet()
    f.run(300)
    f.silent.add("node-03")
    f.run(90)  # stale by now (60 s timeout)
    assert {h for (node, _), h in f.health().items() if node == "node-03"} == {"Unknown"}
    before = len(f.verdicts)
    f.stall(STALL_S)
    f.run(30)
    assert not [v for _, v in f.verdicts[before:] if v.node == "node-03"]


def test_a_late_tick_short_of_a_stall_changes_nothing_and_a_node_silent_for_its_timeout_is_stale():
    """A tick up to two periods late is no stall: a silent node is judged on the usual schedule."""
    f = PausedFleet()
    f.run(300)
    f.silent.add("node-05")
    silent_at = f.t
    assert f.fleet.classifier.pace(EVERY_S, M0 + f.t + 3 * EVERY_S) == 0.0  # 2 periods late: on time
    f.t += 3 * EVERY_S
    f.tick()
    f.run(60)
    stale = [t for t, v in f.verdicts if v.node == "node-05" and v.health == "Unknown"]
    assert stale and min(stale) <= silent_at + 60 + INTERVAL_S, (silent_at, stale)


def test_an_agent_paced_through_a_stall_keeps_a_device_its_source_skipped_fresh_for_an_interval():
    """The agent's loop uses the same pace: a device its source did not read on the first pass after
    the agent's own stall is not stale at once; still unread an interval later, it is."""
    policy = policy_mod.load()
    schema = Schema(COLS.values())
    c = Classifier(policy, schema, interval_s=INTERVAL_S)
    table = DeviceTable("node-a", ("gpu-0", "gpu-1"), ({}, {}))
    values = np.full((2, len(schema)), np.nan)
    for key, value in READING.items():
        values[:, schema.index(COLS[key])] = value

    def sample(t: float, read_gpu1: bool = True) -> list[Verdict]:
        c.pace(INTERVAL_S, M0 + t)
        v = values.copy()
        if not read_gpu1:
            v[1] = np.nan
        c.ingest(Frame(round((T0 + t) * S), table, v))
        return c.evaluate(round((T0 + t) * S))

    t = 0.0
    while t < 300:
        sample(t)
        t += INTERVAL_S
    assert {v.health for v in c.current()} == {"Healthy"}
    t += STALL_S  # the agent was stopped
    assert not sample(t, read_gpu1=False)  # gpu-1, last read 85 s ago, is not lost at once
    late = sample(t + INTERVAL_S, read_gpu1=False)
    assert [(v.hw_id, v.reasons) for v in late] == [("gpu-1", ("device_lost",))]
