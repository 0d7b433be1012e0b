"""Say where the fault is: a PCIe switch's or a fabric's, a firmware version's, or the device's own.

Hand-built nodes of 8 GPUs laid out as HGX servers are (two PCIe switches of four GPUs each, one NVSwitch fabric
per node). A switch that drops its GPUs' link width, a fabric fault (XID 74 on every GPU of it), the same evidence
on one lone GPU, and a firmware version whose devices fail far more often than the same model's other version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier, Verdict
from otel_dra.classifier.firmware_rates import FirmwareHistory, binomial_tail
from otel_dra.classifier.group_memory import GroupMemory
from otel_dra.classifier.memory import DeviceMemory
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of

S = 10**9
T0 = 1_800_000_000
GPUS = 8
MODEL = "H100 80GB HBM3"
UPSTREAM = ("0000:15:00.0", "0000:95:00.0")  # a switch's upstream port per four GPUs
GPU_ADDRESS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0")

COLUMNS = {
    "util": Column("hw.gpu.utilization", attrs_of({"hw.gpu.task": "general"})),
    "width": Column("hw.pcie.link.width"),
    "width_max": Column("hw.pcie.link.width.limit", attrs_of({"hw.limit_type": "max"})),
    "xid74": Column("hw.errors", attrs_of({"error.type": "driver", "hw.error.code": "74"})),
    "xid119": Column("hw.errors", attrs_of({"error.type": "driver", "hw.error.code": "119"})),
    "reset": Column("hw.errors", attrs_of({"error.type": "reset"})),
}


def gpu_attrs(node: int, g: int, firmware: str) -> dict[str, str]:
    return {
        "hw.type": "gpu",
        "hw.vendor": "NVIDIA",
        "hw.model": MODEL,
        "hw.firmware_version": firmware,
        "hw.serial_number": f"S{node:03d}{g}",
        "dra.device.name": f"gpu-{g}",
        "hw.pcie.address": GPU_ADDRESS[g % 4].replace("0000:", f"0000:{1 + g // 4}"),
        "hw.pcie.upstream": UPSTREAM[g // 4],
        "hw.fabric.id": f"6c1e2a0b-0000-4000-8000-{node:012d}/1",
    }


@dataclass
class Fleet:
    nodes: int = 4
    interval: int = 10
    seed: int = 0
    policy: policy_mod.Policy = field(default_factory=policy_mod.load)
    #: Per node, the firmware version of its GPUs (the default: one version everywhere).
    firmware: Callable[[int], str] = lambda node: "96.00.99.00.01"
    schema: Schema = field(default_factory=Schema)
    verdicts: dict[tuple[str, str], list[Verdict]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.cols = {key: self.schema.index(c) for key, c in COLUMNS.items()}
        n = self.nodes * GPUS
        self.names = [f"hgx-{i:03d}" for i in range(self.nodes)]
        self.tables = [
            DeviceTable(
                name,
                tuple(f"gpu-{g}" for g in range(GPUS)),
                tuple(gpu_attrs(i, g, self.firmware(i)) for g in range(GPUS)),
            )
            for i, name in enumerate(self.names)
        ]
        self.width = np.full(n, 16.0)
        self.counters = {key: np.zeros(n) for key in ("xid74", "xid119", "reset")}
        self.classifier = Classifier(self.policy, self.schema, interval_s=float(self.interval))

    def run(self, seconds: int, each: Callable[[int, Fleet], None] | None = None, start: int = 0) -> None:
        for t in range(start, start + seconds, self.interval):
            if each is not None:
                each(t, self)
            self.tick(t)

    def tick(self, t: int) -> None:
        n = self.nodes * GPUS
        values = np.full((n, len(self.schema)), np.nan)
        c = self.cols
        values[:, c["util"]] = np.clip(0.9 + self.rng.normal(0, 0.02, n), 0, 1)
        values[:, c["width"]] = self.width
        values[:, c["width_max"]] = 16.0
        for key, counts in self.counters.items():
            values[:, c[key]] = counts
        now = (T0 + t) * S
        for i, table in enumerate(self.tables):
            self.classifier.ingest(Frame(now, table, values[i * GPUS : (i + 1) * GPUS]))
        for v in self.classifier.evaluate(now):
            self.verdicts.setdefault((v.node, v.hw_id), []).append(v)

    def rows(self, node: int, gpus: range | list[int]) -> list[int]:
        return [node * GPUS + g for g in gpus]

    def findings(self) -> list[Verdict]:
        return [v for seq in self.verdicts.values() for v in seq if v.state not in ("ok", None)]


def test_a_switch_that_drops_its_four_gpus_link_width_is_the_switchs_not_four_devices():
    fleet = Fleet(seed=1)
    behind = fleet.rows(1, range(4, 8))

    def drop(t: int, f: Fleet) -> None:
        f.width[behind] = 8.0 if t >= 600 else 16.0

    fleet.run(1800, drop)
    hits = fleet.findings()
    assert {(v.node, v.hw_id) for v in hits} == {("hgx-001", f"gpu-{g}") for g in range(4, 8)}
    last = {v.hw_id: v for v in hits}
    for v in last.values():
        assert v.reasons == ("link",) and v.scope == "link" and v.group == "pcie/0000:95:00.0"
        assert v.remediation == "reset_device"  # the link's ladder: drain the devices behind it, reset it
        assert "on 4 of the 4 devices of PCIe switch 0000:95:00.0 on node hgx-001" in v.message
        assert "not the devices" in v.message
    assert all(v.remediation != "replace_device" for v in hits)
    # Within the window of the fault: every GPU behind the switch says so.
    first_link = min(v.time_unix_nano for v in hits if v.scope == "link") / S - T0
    assert first_link <= 600 + 300


def test_the_same_width_drop_on_one_gpu_is_that_devices():
    fleet = Fleet(seed=2)
    lone = fleet.rows(2, [5])

    def drop(t: int, f: Fleet) -> None:
        f.width[lone] = 8.0 if t >= 600 else 16.0

    fleet.run(1500, drop)
    hits = fleet.findings()
    assert {(v.node, v.hw_id) for v in hits} == {("hgx-002", "gpu-5")}
    assert all(v.scope == "device" and v.group is None and v.reasons == ("link",) for v in hits)


def test_two_of_four_behind_a_switch_is_not_the_switch_at_a_share_of_three_quarters():
    fleet = Fleet(seed=3)
    two = fleet.rows(0, [0, 1])
    fleet.run(1500, lambda t, f: f.width.__setitem__(two, 8.0 if t >= 600 else 16.0))
    hits = fleet.findings()
    assert {v.hw_id for v in hits} == {"gpu-0", "gpu-1"} and all(v.scope == "device" for v in hits)


def test_an_xid_74_on_every_gpu_of_a_fabric_is_the_fabrics():
    fleet = Fleet(seed=4)
    node0 = fleet.rows(0, range(GPUS))

    def nvlink(t: int, f: Fleet) -> None:
        if t == 900:
            f.counters["xid74"][node0] += 1

    fleet.run(1500, nvlink)
    hits = fleet.findings()
    assert {(v.node, v.hw_id) for v in hits} == {("hgx-000", f"gpu-{g}") for g in range(GPUS)}
    for v in hits:
        assert v.reasons == ("driver_errors",) and v.state == "failed" and v.health == "Unhealthy"
        assert (v.scope, v.group) == ("link", "fabric/6c1e2a0b-0000-4000-8000-000000000000/1")
        assert v.remediation == "reset_device"
        assert "on 8 of the 8 devices of fabric 6c1e2a0b-0000-4000-8000-000000000000/1" in v.message


def test_a_fabrics_xids_landing_minutes_apart_are_still_the_fabrics():
    """Each GPU's XID 74 is evidence for the window after it; landing 40 s apart, the first GPU's is half over by
    the time the last one's is in. What its group's devices showed within the window counts, so every GPU of the
    fabric says the fabric, and says it once it is the fabric's (no device-scoped verdict after the group is
    wide), with one group per verdict."""
    fleet = Fleet(seed=9)

    def staggered(t: int, f: Fleet) -> None:
        if 900 <= t < 900 + 8 * 40 and (t - 900) % 40 == 0:
            f.counters["xid74"][(t - 900) // 40] += 1  # gpu-0 .. gpu-7 of node 0

    fleet.run(1800, staggered)
    for g in range(GPUS):
        seq = [v for v in fleet.verdicts[("hgx-000", f"gpu-{g}")] if v.state != "ok"]
        assert seq and seq[-1].scope == "link" and seq[-1].group == "fabric/6c1e2a0b-0000-4000-8000-000000000000/1"
        after = [v for v in seq if v.time_unix_nano / S - T0 >= 900 + 7 * 40 + 10]
        assert all(v.scope == "link" and v.group.startswith("fabric/") for v in after), (g, after)
    assert {v.node for v in fleet.findings()} == {"hgx-000"}


def test_a_switch_fault_that_recurs_climbs_the_links_ladder_per_group_never_to_replace_device():
    fleet = Fleet(seed=5)
    behind = fleet.rows(3, range(4))
    # The escalation policy: the 3rd episode within 24 h takes the next step. Each episode: the width drops for
    # ten minutes, then a reset of the GPUs clears it (the link retrains).
    remediations: list[str] = []

    def flap(t: int, f: Fleet) -> None:
        on = (t % 2400) < 600 and t >= 600
        f.width[behind] = 8.0 if on else 16.0

    fleet.run(4 * 2400, flap)
    for v in fleet.findings():
        assert v.scope == "link" or v.hw_id in {f"gpu-{g}" for g in range(4)}
        remediations.append(v.remediation)
    assert "replace_device" not in remediations
    assert remediations.count("reboot_node") >= 4  # the group's third episode: drain the node and reset it
    group_steps = [v.remediation for v in fleet.verdicts[("hgx-003", "gpu-0")] if v.scope == "link"]
    assert group_steps[0] == "reset_device" and group_steps[-1] == "reboot_node"


def _firmware_policy(tmp_path: Path) -> policy_mod.Policy:
    """A policy whose firmware statistics fit a test's hours (the default wants a device-day of exposure)."""
    path = tmp_path / "policy.yaml"
    path.write_text(
        "scopes:\n  firmware:\n    horizon: 1d\n    bucket: 10m\n    min_device_days: 0.05\n    every: 1m\n"
    )
    return policy_mod.load(path)


def test_a_firmware_version_that_fails_far_more_often_is_named_on_its_devices(tmp_path: Path):
    bad, good = "96.00.89.00.01", "96.00.99.00.01"
    fleet = Fleet(nodes=8, seed=6, policy=_firmware_policy(tmp_path), firmware=lambda i: bad if i < 4 else good)
    rng = np.random.default_rng(6)
    n = fleet.nodes * GPUS
    pending: list[tuple[int, np.ndarray]] = []

    def gsp_timeouts(t: int, f: Fleet) -> None:
        # A GSP timeout (XID 119) then the driver's reset a minute later: about one a device every 3 hours on
        # the bad version, one every 60 on the good.
        p = np.where(np.arange(n) < 4 * GPUS, 10 / (3 * 3600), 10 / (60 * 3600))
        hit = rng.random(n) < p
        f.counters["xid119"][hit] += 1
        pending.append((t + 60, np.flatnonzero(hit)))
        for at, rows in list(pending):
            if at <= t:
                f.counters["reset"][rows] += 1
                pending.remove((at, rows))

    fleet.run(6 * 3600, gsp_timeouts)
    named = {(v.node, v.hw_id): v for v in fleet.findings() if v.scope == "firmware"}
    on_bad = {(f"hgx-{i:03d}", f"gpu-{g}") for i in range(4) for g in range(GPUS)}
    assert named and set(named) <= on_bad
    for v in named.values():
        assert v.group == f"firmware/{MODEL}/{bad}" and v.remediation == "update_firmware"
        assert "firmware" in v.reasons
    text = next(iter(named.values())).message
    assert f"firmware {bad} of {MODEL}:" in text and "fatal events" in text and "per 1,000 device-days" in text
    assert "32 and 32 devices" in text
    # What the classifier holds now: every device of the bad version, none of the good.
    now = fleet.classifier.current()
    assert {(v.node, v.hw_id) for v in now if v.scope == "firmware" or "firmware" in v.reasons} == on_bad


def test_no_version_is_named_when_both_fail_alike(tmp_path: Path):
    fleet = Fleet(nodes=8, seed=7, policy=_firmware_policy(tmp_path), firmware=lambda i: "A" if i < 4 else "B")
    rng = np.random.default_rng(7)
    n = fleet.nodes * GPUS

    def even(t: int, f: Fleet) -> None:
        hit = rng.random(n) < 10 / (4 * 3600)
        f.counters["xid119"][hit] += 1
        f.counters["reset"][hit] += 1

    fleet.run(6 * 3600, even)
    assert not [v for v in fleet.findings() if "firmware" in v.reasons]


def test_the_policys_deny_list_still_names_a_version_as_firmware_scope(tmp_path: Path):
    path = tmp_path / "deny.yaml"
    path.write_text('rules:\n  firmware:\n    deny: ["96.00.30.00.01"]\n')
    fleet = Fleet(nodes=2, policy=policy_mod.load(path), firmware=lambda i: "96.00.30.00.01" if i == 0 else "96.00.99")
    fleet.run(60)
    hits = fleet.findings()
    assert {v.node for v in hits} == {"hgx-000"} and len({v.hw_id for v in hits}) == GPUS
    for v in hits:
        assert (v.reasons, v.scope, v.remediation) == (("firmware",), "firmware", "update_firmware")
        assert v.group == f"firmware/{MODEL}/96.00.30.00.01" and "deny list" in v.message


@pytest.mark.parametrize(("k", "n", "p"), [(0, 5, 0.3), (3, 5, 0.3), (5, 5, 0.5), (7, 20, 0.1), (12, 13, 0.5)])
def test_binomial_tail_is_the_exact_sum(k: int, n: int, p: float):
    from math import comb

    exact = sum(comb(n, x) * p**x * (1 - p) ** (n - x) for x in range(k, n + 1))
    assert binomial_tail(k, n, p) == pytest.approx(exact, rel=1e-9)


def test_firmware_history_round_trips_and_refuses_what_it_did_not_write(tmp_path: Path):
    policy = _firmware_policy(tmp_path)
    fleet = Fleet(nodes=2, policy=policy, firmware=lambda i: "A" if i == 0 else "B")
    fleet.run(1200, lambda t, f: f.counters["xid119"].__setitem__(0, t // 300))
    rates = fleet.classifier.firmware_rates
    now = fleet.classifier.last_now_ns / 1e9
    doc = rates.history(now).to_json()
    assert {v["version"] for v in doc["versions"]} == {"A", "B"}
    back = FirmwareHistory.from_json(json.loads(json.dumps(doc)))
    again = Classifier(policy, fleet.schema).firmware_rates
    again.recall(back, now)
    assert again.totals(now)[0].sum() == pytest.approx(rates.totals(now)[0].sum())
    assert again.totals(now)[1].sum() == rates.totals(now)[1].sum() > 0
    for broken in ({"bucket_s": 600}, {"bucket_s": -1, "versions": []}, {"bucket_s": 600, "versions": [{"x": 1}]}):
        with pytest.raises(ValueError):
            FirmwareHistory.from_json(broken)


def test_a_held_link_finding_keeps_its_group_across_a_restart():
    """The state file remembers a held reason's group by name; a new process (the fleet's) puts it back on the
    device's row, so the verdict after the restart names the same switch and is no new transition."""
    fleet = Fleet(seed=8)
    behind = fleet.rows(1, range(4))
    fleet.run(900, lambda t, f: f.width.__setitem__(behind, 8.0 if t >= 300 else 16.0))
    before = fleet.verdicts[("hgx-001", "gpu-2")][-1]
    assert (before.scope, before.group) == ("link", "pcie/0000:15:00.0")
    now_s = fleet.classifier.last_now_ns / 1e9
    memory = [json.loads(json.dumps(m.to_json())) for m in fleet.classifier.remember(now_s)]
    saved = next(m for m in memory if m["node"] == "hgx-001" and m["id"] == "gpu-2")
    assert saved["reasons"]["link"]["group"] == "pcie/0000:15:00.0"
    again = Fleet(seed=8)
    again.width = fleet.width
    again.classifier.recall([DeviceMemory.from_json(m) for m in memory], now_s)
    again.tick(900)
    (after,) = again.verdicts[("hgx-001", "gpu-2")]  # said once by the new process, as it was
    assert (after.scope, after.group, after.reasons) == ("link", "pcie/0000:15:00.0", ("link",))
    assert after.last_transition_time == before.last_transition_time  # no transition
    now = {(v.node, v.hw_id): v for v in again.classifier.current()}
    assert (now[("hgx-001", "gpu-2")].scope, now[("hgx-001", "gpu-2")].group) == ("link", "pcie/0000:15:00.0")


def test_group_names_are_bounded_and_a_full_table_groups_no_more(caplog: pytest.LogCaptureFixture):
    """Group names come from pushed attributes: a sender rotating them at every push must not grow the table
    for ever; past the limit a new group is none, said once."""
    from otel_dra.classifier.topology import GroupNames

    names = GroupNames(limit=3)
    codes = [names.pcie_code("n", f"0000:{i:02x}:00.0") for i in range(6)]
    assert codes[:3] == [1, 2, 3] and codes[3:] == [0, 0, 0]
    assert names.pcie_code("n", "0000:01:00.0") == 2  # known names keep their code
    assert len(names) == 4 and sum("device groups" in r.message for r in caplog.records) == 1
    # ... and the firmware rates keep buckets for at most max_versions versions, not for every group.
    from otel_dra.classifier.firmware_rates import FirmwareRates

    names = GroupNames()
    rates = FirmwareRates(policy_mod.load().firmware, names, 4, max_versions=2)
    codes = np.asarray([names.pcie_code("n", "0000:40:00.0"), *(names.firmware_code("M", v) for v in "abc")])
    assert rates.named(codes).tolist() == [False] * 4
    assert rates.exposure.shape[0] == 2 and rates.index_of[codes].tolist() == [-1, 0, 1, -1]


def test_a_switch_findings_escalation_survives_a_restart():
    """The group's escalation is in the state file: recalled, the switch's second episode, held across the
    restart, stays its second (a process that forgot would count it its first), and its third, after the restart,
    climbs to the next step."""
    fleet = Fleet(seed=10)
    behind = fleet.rows(2, range(4, 8))

    def flap(t: int, f: Fleet) -> None:  # down 10 minutes in every 40
        f.width[behind] = 8.0 if t >= 300 and (t - 300) % 2400 < 600 else 16.0

    fleet.run(3000, flap)
    now_s = fleet.classifier.last_now_ns / 1e9
    groups = json.loads(json.dumps(fleet.classifier.group_memory(now_s).to_json()))
    (link,) = groups["links"]
    assert (link["group"], link["node"], link["on"], link["episodes"]) == ("pcie/0000:95:00.0", "hgx-002", True, 2)
    memory = [DeviceMemory.from_json(m.to_json()) for m in fleet.classifier.remember(now_s)]
    again = Fleet(seed=10)
    again.width = fleet.width
    again.classifier.recall(memory, now_s)
    again.classifier.recall_groups(GroupMemory.from_json(groups), now_s)
    again.run(300, flap, start=3000)
    (after,) = again.classifier.group_memory(again.classifier.last_now_ns / 1e9).links
    assert after.episodes == 2 and after.on
    again.run(2400, flap, start=3300)  # the third episode: the next step of the link's ladder
    (third,) = again.classifier.group_memory(again.classifier.last_now_ns / 1e9).links
    assert third.episodes == 3
    steps = [v.remediation for v in again.verdicts[("hgx-002", "gpu-4")] if v.scope == "link"]
    assert steps[-1] == "reboot_node" and "replace_device" not in steps


def _naive_link_scoped(nodes, known, pcie, fabric, present, scope, recent, reasons, min_devices, share):
    """The group rule one device at a time, as its docstring says it (the reference for the vectorised one)."""
    from otel_dra.classifier.layout import DEVICE, LINK, R

    n = len(nodes)
    scope, group = scope.copy(), np.zeros(present.shape, dtype=np.int32)
    for reason in reasons:
        r = R[reason]
        now = [present[i, r] and known[i] and scope[i, r] == DEVICE for i in range(n)]
        shown = [now[i] or (recent[i, r] and known[i] and not present[i, r]) for i in range(n)]
        if not any(now) or sum(shown) < min_devices:
            continue
        for codes in (fabric, pcie):
            for i in range(n):
                c = codes[i]
                if not (now[i] and c > 0 and scope[i, r] == DEVICE):
                    continue
                members = [j for j in range(n) if known[j] and codes[j] == c]
                hits = sum(shown[j] for j in range(n) if codes[j] == c)
                if hits < min_devices or hits < share * len(members):
                    continue
                outside = [j for j in range(n) if known[j] and nodes[j] == nodes[i] and codes[j] != c]
                outside_hits = sum(shown[j] for j in range(n) if nodes[j] == nodes[i] and codes[j] != c)
                if outside and outside_hits >= share * len(outside):
                    continue
                scope[i, r], group[i, r] = LINK, c
    return scope, group


@pytest.mark.parametrize("seed", range(40))
def test_the_group_rule_matches_its_one_device_at_a_time_reference(seed: int):
    from otel_dra.classifier.layout import DEVICE, WORKLOAD
    from otel_dra.classifier.topology import Topology, link_scoped
    from otel_dra.policy import LinkScope
    from otel_dra.vocabulary import REASONS

    rng = np.random.default_rng(seed)
    n_nodes = int(rng.integers(1, 5))
    per = int(rng.choice([2, 4, 8]))
    n = n_nodes * per
    topo = Topology(n)
    nodes = np.repeat(np.arange(n_nodes), per)
    switch = int(rng.choice([1, 2, 4]))
    for row in range(n):
        attrs = {"hw.model": "M", "hw.firmware_version": "1"}
        if rng.random() < 0.9:
            attrs["hw.pcie.upstream"] = f"0000:{(row % per) // switch:02x}:00.0"
        if rng.random() < 0.8:
            attrs["hw.fabric.id"] = f"f{nodes[row] // int(rng.choice([1, 2]))}"
        topo.assign(row, f"n{nodes[row]}", attrs)
    present = rng.random((n, len(REASONS))) < rng.choice([0.2, 0.5, 0.8])
    recent = rng.random((n, len(REASONS))) < 0.2
    known = rng.random(n) < 0.95
    scope = np.where(rng.random((n, len(REASONS))) < 0.1, WORKLOAD, DEVICE).astype(np.int8)
    policy = LinkScope(
        ("link", "driver_errors", "device_lost"),
        int(rng.integers(2, 4)),
        float(rng.choice([0.5, 0.75])),
        ("reset_device",),
    )
    want_scope, want_group = _naive_link_scoped(
        nodes, known, topo.pcie, topo.fabric, present, scope, recent, policy.reasons, policy.min_devices, policy.share
    )
    got_scope, got_group = scope.copy(), np.zeros((n, len(REASONS)), dtype=np.int32)
    hits, devices = np.zeros_like(got_group), np.zeros_like(got_group)
    link_scoped(np.arange(n), nodes, n_nodes, known, topo, policy, present, got_scope, got_group, hits, devices, recent)
    assert np.array_equal(got_scope, want_scope) and np.array_equal(got_group, want_group)
