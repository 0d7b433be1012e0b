"""Shared parts in the scenario generator and scorer: every GPU's topology and firmware, the faults of a PCIe
switch, an NVLink fabric and a firmware version (and their lone-GPU look-alikes), their labels' scope and
group, and the scorer's checks of them."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

import numpy as np
import pytest
from click.testing import CliRunner

from otel_dra import conventions as cv
from otel_dra.cli import cli
from otel_dra.decode.files import read_lines
from otel_dra.decode.otlp_json import OtlpJsonDecoder
from otel_dra.frame import Schema
from otel_dra.scenario import ScenarioConfig, form, passes, run
from otel_dra.scenario.fault_groups import FIRMWARE_EVENTS, MIN_RATIO, SPREAD_S
from otel_dra.scenario.kinds import LOST_KINDS, TOPOLOGY_MIN_GPUS, kinds_for
from otel_dra.scenario.models import MODELS
from otel_dra.scenario.plan import US, WARMUP_S
from otel_dra.scenario.planner import make_plan
from otel_dra.scenario.score import score
from otel_dra.scenario.score_labels import LabelsError, check_labels
from otel_dra.scenario.series import KEY
from otel_dra.vocabulary import fabric_group, firmware_group, pcie_group

ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
UUID_CLIQUE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}/\d+$")
MODEL = {m.model: m for m in MODELS}
SHARED = ("pcie_switch", "fabric", "nvlink_xid74", "firmware_version")


@pytest.fixture(scope="module")
def plans():
    return [make_plan(form("long", seed=seed)) for seed in range(4)]


def gpus_of(plan, node):
    return [plan.devices[r] for r in node.rows]


# -- topology and firmware --------------------------------------------------------------------------------
def test_every_gpu_sits_where_its_model_s_servers_put_it(plans):
    for plan in plans:
        boards: dict[str, set] = defaultdict(set)
        fabrics = []
        for node in plan.nodes:
            gpus = gpus_of(plan, node)
            a = [d.attrs for d in gpus]
            address = [x[cv.HW_PCIE_ADDRESS] for x in a]
            assert all(ADDRESS.match(x) for x in address) and len(set(address)) == len(address)
            assert all(ADDRESS.match(x[cv.HW_PCIE_UPSTREAM]) for x in a)
            assert not set(address) & {x[cv.HW_PCIE_UPSTREAM] for x in a}  # a switch port is no GPU
            behind = sorted(Counter(x[cv.HW_PCIE_UPSTREAM] for x in a[:8]).values())
            name = node.model.model
            boards[name].add(tuple(address[:8]))
            if name in ("H100 80GB HBM3", "A100-SXM4-80GB"):  # HGX/DGX: 4 switches, 2 GPUs each; one NVSwitch fabric
                assert behind == [2, 2, 2, 2]
                (fabric,) = {x[cv.HW_FABRIC_ID] for x in a}
                assert UUID_CLIQUE.match(fabric)
                fabrics.append(fabric)
            elif name == "L40S":  # PCIe cards: 2 switches of 4, no fabric
                assert behind == [4, 4] and not any(cv.HW_FABRIC_ID in x for x in a)
            else:  # MI300X: a root port each, one xGMI hive
                assert behind == [1] * 8 and len({x[cv.HW_FABRIC_ID] for x in a}) == 1
        assert all(len(b) == 1 for b in boards.values())  # identical servers: the same addresses on every node
        assert len(set(fabrics)) == len(fabrics)  # one fabric per node


def test_each_model_runs_two_or_three_firmware_versions_most_on_the_newest(plans):
    for plan in plans:
        seen: dict[str, Counter] = defaultdict(Counter)
        for d in plan.devices:
            if d.model is not None:
                seen[d.model.model][d.attrs[cv.HW_FIRMWARE_VERSION]] += 1
        for name, counts in seen.items():
            m = MODEL[name]
            assert 2 <= len(m.firmwares) <= 3 and set(counts) == set(m.firmwares), name
            assert counts.most_common(1)[0][0] == m.firmwares[0]


def test_the_short_form_and_small_fleets_keep_their_kinds():
    assert not {k.name for k in kinds_for("idle", 48)} & set(SHARED)
    assert {k.name for k in kinds_for("idle", TOPOLOGY_MIN_GPUS)} >= set(SHARED)
    assert form("long").gpus >= TOPOLOGY_MIN_GPUS


# -- the faults, in the plan ------------------------------------------------------------------------------
def by_kind(plan):
    out = defaultdict(list)
    for f in plan.faults:
        out[f.kind.name].append(f)
    return out


def test_the_long_form_has_every_shared_part_fault_for_every_seed(plans):
    for plan in plans:
        kinds = by_kind(plan)
        assert len(kinds["firmware_version"]) == 1
        for name in ("pcie_switch", "fabric", "nvlink_xid74", "link_degraded", "link_bursts_intermittent"):
            assert kinds[name], name


def test_a_switch_fault_is_on_the_gpus_behind_one_switch_within_a_minute(plans):
    for plan in plans:
        groups = defaultdict(list)
        for f in by_kind(plan)["pcie_switch"]:
            groups[(f.node, f.group)].append(f)  # a switch's address repeats on every node
        for (_, group), members in groups.items():
            d = [plan.devices[f.row] for f in members]
            upstream = d[0].attrs[cv.HW_PCIE_UPSTREAM]
            assert group == pcie_group(upstream) and len({x.node for x in d}) == 1
            behind = [r for r in plan.nodes[d[0].node].rows if plan.devices[r].attrs[cv.HW_PCIE_UPSTREAM] == upstream]
            assert len(members) in (len(behind), len(behind) - 1) and len(members) >= 2
            onsets = [f.evidence_us for f in members]
            assert max(onsets) - min(onsets) <= SPREAD_S * US
            for f in members:
                assert f.kind.scope == "link" and plan.params["burst_col"][f.row] == 1  # PCIe errors
                assert plan.params["burst_duty"][f.row] == 1.0 and plan.params["burst_rate"][f.row] * 60 >= 60
                assert f.detail["width_downgrade"] == (plan.params["linkdeg_on"][f.row] < 1e11)


def test_a_fabric_fault_is_on_every_gpu_of_one_fabric(plans):
    for plan in plans:
        groups = defaultdict(list)
        for f in by_kind(plan)["fabric"]:
            groups[f.group].append(f)
        assert groups
        for group, members in groups.items():
            node = plan.nodes[members[0].node]
            fabric = plan.devices[node.rows[0]].attrs[cv.HW_FABRIC_ID]
            assert group == fabric_group(fabric) and sorted(f.row for f in members) == node.rows
            onsets = [f.evidence_us for f in members]
            assert max(onsets) - min(onsets) <= SPREAD_S * US
            for f in members:
                assert plan.params["burst_col"][f.row] == 2  # NVLink
                xid = [e for e in plan.events if e.row == f.row and e.key == "err.driver.74"]
                assert xid and xid[0].at_s * US == f.evidence_us


def test_a_lone_link_fault_shares_no_switch_or_fabric_with_another_link_fault(plans):
    for plan in plans:
        link = [f for f in plan.faults if "link" in f.kind.reasons]
        for f in link:
            if f.kind.scope != "device":
                continue
            d = plan.devices[f.row]
            parts = {(d.node, d.attrs.get(a)) for a in (cv.HW_PCIE_UPSTREAM, cv.HW_FABRIC_ID)} - {(d.node, None)}
            for g in link:
                if g is not f:
                    e = plan.devices[g.row]
                    assert not parts & {(e.node, e.attrs.get(a)) for a in (cv.HW_PCIE_UPSTREAM, cv.HW_FABRIC_ID)}


def test_a_bad_firmware_version_fails_several_times_as_often_as_the_others(plans):
    for plan in plans:
        (f,) = by_kind(plan)["firmware_version"]
        model, version = f.detail["hw.model"], f.detail["hw.firmware_version"]
        assert f.group == firmware_group(model, version) and f.kind.scope == "firmware"
        lost = {g.row for g in plan.faults if g.kind.name in LOST_KINDS}
        version_rows = [
            d.row for d in plan.devices
            if d.model is not None and d.model.model == model and d.attrs[cv.HW_FIRMWARE_VERSION] == version
        ]  # fmt: skip
        assert f.rows == sorted(set(version_rows) - lost)
        counts = Counter(d.attrs[cv.HW_FIRMWARE_VERSION] for d in plan.devices if d.model and d.model.model == model)
        assert counts[version] < max(counts.values())  # the model's other versions are the baseline
        others = [
            d.row for d in plan.devices
            if d.model is not None and d.model.model == model and d.row not in version_rows and d.row not in lost
        ]  # fmt: skip
        bad = [e for e in f.events if e.bad]
        good = [e for e in f.events if not e.bad]
        assert FIRMWARE_EVENTS[0] <= len(bad) <= FIRMWARE_EVENTS[1] and len(good) <= 3
        assert {e.row for e in bad} <= set(f.rows) and {e.row for e in good} <= set(others)
        assert len(bad) / len(f.rows) >= MIN_RATIO * len(good) / len(others)  # several times the rate per GPU
        assert (f.row, f.evidence_us) == (bad[0].row, min(e.at_s for e in bad) * US)
        faulted = {g.row for g in plan.faults if g is not f} | {t.row for t in plan.traps}
        for e in f.events:
            assert e.row not in faulted  # events go on GPUs left clean
            assert WARMUP_S <= e.at_s <= plan.duration_s - 180 and e.code in ("79", "119")
            mine = [x for x in plan.events if x.row == e.row]
            assert any(x.key == f"err.driver.{e.code}" and x.at_s == e.at_s for x in mine)
            assert any(x.key == "err.reset" and 10 <= x.at_s - e.at_s <= 60 for x in mine)
            assert not any(x.op == "vanish" for x in mine)  # healthy again after the reset


def test_the_plan_is_the_same_for_the_same_seed(plans):
    again = make_plan(form("long", seed=0))
    assert [(f.kind.name, f.row, f.evidence_us, f.group) for f in again.faults] == [
        (f.kind.name, f.row, f.evidence_us, f.group) for f in plans[0].faults
    ]
    assert [d.attrs for d in again.devices] == [d.attrs for d in plans[0].devices]
    assert {d.attrs.get(cv.HW_FABRIC_ID) for d in plans[1].devices} != {
        d.attrs.get(cv.HW_FABRIC_ID) for d in again.devices
    }


# -- the faults, in the recording and its labels (a fleet just big enough for them, 50 minutes) -------------------
@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    config = ScenarioConfig(nodes=32, devices_per_node=8, duration_s=3000, seed=5)
    recording, labels_path = run(config, tmp_path_factory.mktemp("shared"))
    return recording, json.loads(labels_path.read_text())


def decode_nodes(recording, names):
    """(node, hw.id) -> (stamps, {series: values}, attrs) for the nodes named (the rest is skipped: fast)."""
    schema = Schema()
    decoder = OtlpJsonDecoder(schema)
    needles = [b'"stringValue":"' + n.encode() + b'"' for n in names]
    rows = defaultdict(list)
    attrs = {}
    for _, lineno, raw in read_lines([recording]):
        if not any(x in raw[:300] for x in needles):
            continue
        frames, errors = decoder.decode_line(raw, lineno)
        assert not errors
        for frame in frames:
            for i, dev in enumerate(frame.devices.ids):
                key = (frame.devices.node, dev)
                rows[key].append((frame.time_unix_nano, frame.values[i]))
                attrs[key] = dict(frame.devices.attrs[i])
    width = len(schema)
    out = {}
    for key, seq in rows.items():
        t = np.array([x for x, _ in seq])
        v = np.array([np.pad(y, (0, width - len(y)), constant_values=np.nan) for _, y in seq])
        out[key] = (t, v, attrs[key])
    return schema, out


def column(schema, metric, **attrs):
    for i, c in enumerate(schema.columns):
        if c.metric == metric and dict(c.attrs) == attrs:
            return i
    return None


def per_min(t, v, lo, hi):
    sel = (t >= lo) & (t <= hi) & ~np.isnan(v)
    return float((v[sel][-1] - v[sel][0]) / ((t[sel][-1] - t[sel][0]) / 6e10)) if sel.sum() > 1 else 0.0


def test_labels_carry_scope_and_group_and_the_firmware_fault_its_devices(fleet):
    _, labels = fleet
    check_labels(labels)
    kinds = defaultdict(list)
    for f in labels["faults"]:
        kinds[f["kind"]].append(f)
    for f in kinds["pcie_switch"] + kinds["fabric"]:
        assert f["scope"] == "link" and f["group"].startswith(("pcie/", "fabric/"))
    for name in ("nvlink_xid74", "link_degraded", "link_bursts_intermittent"):
        assert all(f["scope"] == "device" and "group" not in f for f in kinds[name]), name
    (fw,) = kinds["firmware_version"]
    assert fw["scope"] == "firmware" and fw["remediation"] == "update_firmware"
    assert fw["group"] == firmware_group(fw["hw.model"], fw["detail"]["hw.firmware_version"])
    assert {"k8s.node.name": fw["k8s.node.name"], "hw.id": fw["hw.id"]} in fw["devices"]
    end = labels["t0_unix_nano"] + labels["duration_s"] * 10**9
    skew = {n["k8s.node.name"]: round(n["skew_s"] * 1e9) for n in labels["nodes"]}
    assert 0 <= end - (fw["onset_unix_nano"] - skew[fw["k8s.node.name"]] + fw["deadline_s"] * 10**9) < 10**9
    assert len(fw["events"]) == fw["detail"]["events"] + fw["detail"]["other_versions_events"]


def test_the_recording_shows_each_fault_s_evidence_on_its_gpus(fleet):
    recording, labels = fleet
    faults = [f for f in labels["faults"] if f["kind"] in SHARED]
    fw = next(f for f in faults if f["kind"] == "firmware_version")
    names = {f["k8s.node.name"] for f in faults} | {e["k8s.node.name"] for e in fw["events"]}
    schema, data = decode_nodes(recording, names)
    pcie = column(schema, "hw.errors", **{"error.type": "link", "hw.link.type": "pcie"})
    nvlink = column(schema, "hw.errors", **{"error.type": "link", "hw.link.type": "nvlink"})
    width = column(schema, "hw.pcie.link.width")
    xid74 = column(schema, "hw.errors", **{"error.type": "driver", "hw.error.code": "74"})
    reset = column(schema, "hw.errors", **{"error.type": "reset"})
    for key, (_, _, attrs) in data.items():
        if key[1].startswith("gpu"):
            assert attrs[cv.HW_PCIE_ADDRESS] and attrs[cv.HW_PCIE_UPSTREAM] and attrs[cv.HW_FIRMWARE_VERSION]
    for f in faults:
        t, v, attrs = data[(f["k8s.node.name"], f["hw.id"])]
        onset = f["onset_unix_nano"]
        i = int(np.searchsorted(t, onset))
        assert t[i] == onset
        if f["kind"] == "pcie_switch":
            assert f["group"] == pcie_group(attrs[cv.HW_PCIE_UPSTREAM])
            assert (
                per_min(t, v[:, pcie], onset, onset + 600 * 10**9) >= 40 > 5 > per_min(t, v[:, pcie], 0, onset - 10**9)
            )
            if f["detail"]["width_downgrade"]:
                assert (v[i:, width] == v[0, width] / 2).all() and (v[:i, width] == v[0, width]).all()
        elif f["kind"] in ("fabric", "nvlink_xid74"):
            if f["kind"] == "fabric":
                assert f["group"] == fabric_group(attrs[cv.HW_FABRIC_ID])
            assert per_min(t, v[:, nvlink], onset, onset + 600 * 10**9) >= 15
            assert v[i, xid74] >= 1 and np.isnan(v[:i, xid74]).all()  # the XID 74 series is born at the onset
    lone = [f for f in faults if f["kind"] == "nvlink_xid74"]
    for f in lone:  # its fabric's other GPUs stay clean
        for (node, dev), (_, v, _) in data.items():
            if node == f["k8s.node.name"] and dev != f["hw.id"] and dev.startswith("gpu") and xid74 is not None:
                assert np.isnan(v[:, xid74]).all()
    born = set()
    for e in sorted(fw["events"], key=lambda e: e["at_unix_nano"]):
        t, v, attrs = data[(e["k8s.node.name"], e["hw.id"])]
        code = column(schema, "hw.errors", **{"error.type": "driver", "hw.error.code": e["hw.error.code"]})
        i = int(np.searchsorted(t, e["at_unix_nano"]))
        assert v[i, code] > (v[i - 1, code] if i and not np.isnan(v[i - 1, code]) else 0)
        if (e["hw.id"], e["k8s.node.name"], code) not in born:  # the XID's series is born with its first
            assert np.isnan(v[:i, code]).all()
            born.add((e["hw.id"], e["k8s.node.name"], code))
        after = (t > e["at_unix_nano"]) & (t <= e["at_unix_nano"] + 120 * 10**9)
        assert np.nanmax(v[after, reset]) > v[i - 1, reset]  # a reset within a minute or so
        assert (t > e["at_unix_nano"] + 90 * 10**9).any()  # and it goes on reporting
        version = fw["detail"]["hw.firmware_version"]
        assert (attrs[cv.HW_FIRMWARE_VERSION] == version) == e["bad_version"]
    for d in fw["devices"]:
        if d["k8s.node.name"] in names:
            assert (
                data[(d["k8s.node.name"], d["hw.id"])][2][cv.HW_FIRMWARE_VERSION] == fw["detail"]["hw.firmware_version"]
            )


# -- the scorer, on hand-written labels and verdicts ------------------------------------------------------
S = 10**9
T0 = 1_000 * S
SWITCH = pcie_group("0000:15:00.0")
FIRMWARE = firmware_group("H100 80GB HBM3", "96.00.74.00.0F")


def shared_labels() -> dict:
    def f(kind, node, dev, at, reasons, **kw):
        deadline = kw.pop("deadline_s", 900)
        return {
            "k8s.node.name": node, "hw.id": dev, "kind": kind, "reasons": list(reasons), "severity": "soft",
            "deadline_s": deadline, "onset_unix_nano": T0 + at * S, **kw,
        }  # fmt: skip

    return {
        "interval_s": 5.0,
        "t0_unix_nano": T0,
        "ticks": 720,
        "faults": [
            f("pcie_switch", "n1", "gpu-0", 1000, ["link"], scope="link", group=SWITCH),
            f("pcie_switch", "n1", "gpu-1", 1030, ["link"], scope="link", group=SWITCH),
            f("nvlink_xid74", "n1", "gpu-2", 1000, ["link", "driver_errors"], scope="device"),
            f(
                "firmware_version",
                "n2",
                "gpu-0",
                1200,
                ["firmware"],
                scope="firmware",
                group=FIRMWARE,
                deadline_s=2400,
                remediation="update_firmware",
                devices=[{"k8s.node.name": "n2", "hw.id": f"gpu-{i}"} for i in range(3)],
                events=[
                    {
                        "k8s.node.name": "n2",
                        "hw.id": "gpu-0",
                        "at_unix_nano": T0 + 1199 * S,
                        "hw.error.code": "79",
                        "bad_version": True,
                    },
                    {
                        "k8s.node.name": "n2",
                        "hw.id": "gpu-1",
                        "at_unix_nano": T0 + 1300 * S,
                        "hw.error.code": "119",
                        "bad_version": True,
                    },
                    {
                        "k8s.node.name": "n1",
                        "hw.id": "gpu-3",
                        "at_unix_nano": T0 + 1500 * S,
                        "hw.error.code": "119",
                        "bad_version": False,
                    },
                ],
            ),
        ],
        "traps": [],
        "devices": [{"k8s.node.name": n, "hw.id": f"gpu-{i}"} for n in ("n1", "n2") for i in range(4)],
    }


def line(at, node, dev, health="Healthy", state="ok", reasons=(), remediation="none", scope=None, group=None):
    out = {
        "time_unix_nano": T0 + at * S, "k8s.node.name": node, "hw.id": dev, "health": health, "hw.state": state,
        "reasons": list(reasons), "remediation": remediation, "message": "",
    }  # fmt: skip
    if scope is not None:
        out["scope"] = scope
    if group is not None:
        out["group"] = group
    return out


RESET = {"state": "degraded", "remediation": "reset_device"}


def right_verdicts() -> list[dict]:
    start = [line(0, n, f"gpu-{i}") for n in ("n1", "n2") for i in range(4)]
    return [
        *start,
        line(1060, "n1", "gpu-0", reasons=["link"], scope="link", group=SWITCH, **RESET),
        line(1060, "n1", "gpu-1", reasons=["link"], scope="link", group=SWITCH, **RESET),
        line(1010, "n1", "gpu-2", reasons=["link", "driver_errors"], **RESET),
        # the event on its own first (the GPU's XID 79, device-scoped), then the version named
        line(1200, "n2", "gpu-0", "Unhealthy", "failed", ["driver_errors", "device_lost"], "reset_device"),
        line(1260, "n2", "gpu-0"),
        line(1300, "n2", "gpu-1", reasons=["driver_errors", "device_reset"], **RESET),
        line(1400, "n2", "gpu-1"),
        line(1500, "n1", "gpu-3", "Unhealthy", "failed", ["driver_errors"], "reset_device"),  # another version's
        line(1560, "n1", "gpu-3"),
        *(
            line(2400, "n2", f"gpu-{i}", state="degraded", reasons=["firmware"], remediation="update_firmware",
                 scope="firmware", group=FIRMWARE)
            for i in range(3)
        ),
    ]  # fmt: skip


def test_right_verdicts_meet_every_shared_part_target():
    s = score(shared_labels(), right_verdicts())
    assert (s.link_group_detected, s.link_group_total) == (2, 2)
    assert (s.lone_link_detected, s.lone_link_total) == (1, 1)
    assert (s.firmware_devices_detected, s.firmware_devices_total) == (3, 3)
    assert s.firmware_wrong_devices == 0 and s.replace_on_group_devices == 0 and s.group_fault_devices == 5
    # right, not false: the events' own verdicts (n2/gpu-1, n1/gpu-3) and the version's on its GPUs but the label's
    assert s.fp_episodes == 0 and s.firmware_event_episodes == 4
    assert passes(s) == []
    names = [t.name for t in s.targets()]
    for words in ("link faults:", "lone-GPU link", "bad firmware", "GPUs named firmware", "replace_device"):
        assert sum(n.startswith(words) for n in names) == 1, words


def replace(lines, node, dev, at, **changes):
    out = []
    for x in lines:
        if (x["k8s.node.name"], x["hw.id"], x["time_unix_nano"]) == (node, dev, T0 + at * S):
            x = {**x, **changes}
            x = {k: v for k, v in x.items() if v is not None}
        out.append(x)
    return out


@pytest.mark.parametrize(
    ("node", "dev", "at", "changes", "figure", "words"),
    [
        ("n1", "gpu-1", 1060, {"group": pcie_group("0000:35:00.0")}, "link_group_detected", "scope link pcie/0000:35"),
        ("n1", "gpu-0", 1060, {"scope": None, "group": None}, "link_group_detected", "scope device, not link"),
        ("n1", "gpu-2", 1010, {"scope": "link", "group": SWITCH}, "lone_link_detected", "scope link"),
        ("n2", "gpu-2", 2400, {"group": firmware_group("L40S", "1")}, "firmware_devices_detected", ""),
        ("n2", "gpu-1", 2400, {"scope": None, "group": None}, "firmware_devices_detected", ""),
    ],
)  # fmt: skip
def test_a_wrong_scope_or_group_misses_its_check(node, dev, at, changes, figure, words):
    right = score(shared_labels(), right_verdicts())
    s = score(shared_labels(), replace(right_verdicts(), node, dev, at, **changes))
    assert getattr(s, figure) == getattr(right, figure) - 1
    assert passes(s) and any(
        figure.split("_")[0] in t.name.lower() or "firmware" in t.name for t in s.targets() if not t.met
    )
    missed = [m["why"] for m in s.soft_missed + s.firmware_missed if m["hw.id"] == dev and m["k8s.node.name"] == node]
    assert missed and words in missed[0]


def test_replace_device_on_a_group_fault_s_gpu_is_counted():
    for node, dev, at in (("n1", "gpu-0", 1060), ("n2", "gpu-1", 2400), ("n2", "gpu-0", 1200)):
        s = score(shared_labels(), replace(right_verdicts(), node, dev, at, remediation="replace_device"))
        assert s.replace_on_group_devices == 1 and s.replace_examples[0]["hw.id"] == dev
        assert any(t.name.startswith("replace_device") and not t.met for t in s.targets())
    lone = score(shared_labels(), replace(right_verdicts(), "n1", "gpu-2", 1010, remediation="replace_device"))
    assert lone.replace_on_group_devices == 0  # a lone GPU's own fault may be replaced


def test_firmware_named_outside_the_bad_version_is_wrong_and_a_false_positive():
    verdicts = [
        *right_verdicts(),
        line(2500, "n2", "gpu-3", state="degraded", reasons=["firmware"], scope="firmware", group=FIRMWARE),
        line(2500, "n1", "gpu-3", state="degraded", reasons=["firmware"], scope="firmware", group=FIRMWARE),
    ]
    s = score(shared_labels(), verdicts)
    assert s.firmware_wrong_devices == 2 and s.fp_episodes == 2
    assert {e["k8s.node.name"] for e in s.firmware_wrong_examples} == {"n1", "n2"}
    # another reason on a bad version's GPU is still false
    s = score(shared_labels(), [*right_verdicts(), line(3000, "n2", "gpu-2", state="degraded", reasons=["thermal"])])
    assert s.fp_episodes == 1


def test_a_gpu_of_the_version_lost_on_its_own_may_be_named_firmware_and_need_not_be():
    """n2/gpu-3 runs the bad version and is lost later (its own device_lost): named firmware while it still reports
    is right, not a wrong device nor a false episode; and the version's detection does not wait for it."""
    labels = shared_labels()
    firmware = next(f for f in labels["faults"] if f["kind"] == "firmware_version")
    firmware["lost_devices"] = [{"k8s.node.name": "n2", "hw.id": "gpu-3"}]
    named = line(2500, "n2", "gpu-3", state="degraded", reasons=["firmware"], scope="firmware", group=FIRMWARE)
    for verdicts in (right_verdicts(), [*right_verdicts(), named]):
        s = score(labels, verdicts)
        assert s.firmware_wrong_devices == 0 and s.fp_episodes == 0
        assert (s.firmware_devices_detected, s.firmware_devices_total) == (3, 3)
    s = score(shared_labels(), [*right_verdicts(), named])  # without the label's word, it is outside the version
    assert s.firmware_wrong_devices == 1 and s.fp_episodes == 1


def test_labels_without_shared_parts_show_no_such_target():
    plain = {**shared_labels(), "faults": []}
    names = [t.name for t in score(plain, []).targets()]
    assert not [n for n in names if "firmware" in n or "link" in n or "replace" in n]


def test_score_json_and_table_report_the_shared_part_lines(tmp_path):
    lab, ver = tmp_path / "labels.json", tmp_path / "verdicts.jsonl"
    lab.write_text(json.dumps(shared_labels()))
    ver.write_text("\n".join(json.dumps(x) for x in right_verdicts()) + "\n")
    result = CliRunner().invoke(cli, ["score", str(lab), str(ver), "--output", "json"])
    doc = json.loads(result.output)
    assert result.exit_code == 0 and doc["passed"] is True
    assert (doc["link_group_detected"], doc["lone_link_detected"], doc["firmware_devices_detected"]) == (2, 1, 3)
    assert doc["replace_on_group_devices"] == 0 and "hard_detected" in doc and "fp_episodes" in doc
    result = CliRunner().invoke(cli, ["score", str(lab), str(ver)])
    assert result.exit_code == 0 and "bad firmware" in result.output and "replace_device" in result.output


@pytest.mark.parametrize(
    ("mangle", "words"),
    [
        (lambda f: f.update(devices="n2/gpu-0"), "'devices' is not a list"),
        (lambda f: f.update(devices=[{"k8s.node.name": "n2"}]), "devices[0] has no 'hw.id'"),
        (lambda f: f["events"][0].pop("at_unix_nano"), "events[0] has no 'at_unix_nano'"),
        (lambda f: f.update(remediation=3), "'remediation' is int"),
    ],
)
def test_bad_firmware_labels_are_one_clear_error(mangle, words):
    doc = shared_labels()
    mangle(doc["faults"][3])
    with pytest.raises(LabelsError, match=re.escape(words)) as err:
        check_labels(doc)
    assert "\n" not in str(err.value)


def test_firmware_events_use_the_catalogue_s_codes():
    assert {"err.driver.74", "err.driver.79", "err.driver.119"} <= set(KEY)


def test_a_firmware_finding_outranked_by_the_gpus_own_fault_still_counts_as_named():
    """A verdict has one scope, the worse reason's (the device's own first among equals): a bad version's GPU that
    holds a failure of its own shows firmware among its reasons under scope device, and that is named; firmware
    alone under scope device is not."""
    own = replace(
        right_verdicts(), "n2", "gpu-1", 2400, reasons=["driver_errors", "firmware"], state="failed",
        health="Unhealthy", scope=None, group=None,
    )  # fmt: skip
    s = score(shared_labels(), own)
    assert (s.firmware_devices_detected, s.firmware_devices_total) == (3, 3)
    alone = replace(right_verdicts(), "n2", "gpu-1", 2400, scope=None, group=None)
    assert score(shared_labels(), alone).firmware_devices_detected == 2
