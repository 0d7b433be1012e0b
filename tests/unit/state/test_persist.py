"""The state file: a held fault survives a restart for its hold time, and a file that is not ours
is one warning, moved aside, and a clean start (never a crash, never a wrong verdict)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier, Verdict
from otel_dra.classifier.memory import DeviceMemory
from otel_dra.cli.state_dir import resolve_state_dir
from otel_dra.faults import Fault
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from otel_dra.state.persist import (
    FLEET_FILE,
    StateFile,
    StateStore,
    agent_file,
    default_state_dir,
)

S = 10**9
T0 = 1_800_000_000 * S
NODE = "node-a"
HOUR = 3600


class Node:
    """A simulated node feeding a classifier at a clock the test moves."""

    def __init__(self, faults: tuple[Fault, ...] = (), start_s: int = 0, policy: policy_mod.Policy | None = None):
        cfg = SimulatorConfig(NODE, devices=4, faults=faults, seed=3, start_unix_nano=T0 + start_s * S)
        self.source = SimulatedSource(cfg)
        self.classifier = Classifier(policy or policy_mod.load(), self.source.schema, interval_s=10)
        self.current: dict[str, Verdict] = {}

    def run(self, from_s: int, to_s: int, every: int = 10) -> None:
        for t in range(from_s, to_s + 1, every):
            self.classifier.ingest(self.source.read(T0 + t * S))
            for v in self.classifier.evaluate(T0 + t * S):
                self.current[v.hw_id] = v

    def verdict(self, hw_id: str) -> tuple[str, tuple[str, ...]]:
        v = self.current[hw_id]
        return v.health, v.reasons


#: The same simulated GPUs after a restart (their serial numbers say which reasons were injected on them), the
#: fault not firing again.
LATER = 10**7
#: Time-based clearing, chosen: these tests are about what a restart keeps of a hold (test_repair.py: the default,
#: clearing on a reset).
HELD_BY_TIME = "clears: {memory_ecc: hold}\n"


def timed(tmp_path: Path) -> policy_mod.Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(HELD_BY_TIME)
    return policy_mod.load(path)


def faulted_then_saved(path: Path, policy: policy_mod.Policy | None = None) -> tuple[Node, StateFile]:
    """gpu-3 gets an uncorrected ECC error at 30 s; the state is written at 60 s."""
    node = Node((Fault("gpu-3", "memory_ecc", 30),), policy=policy)
    node.run(0, 60)
    assert node.verdict("gpu-3") == ("Unhealthy", ("memory_ecc",))
    file = StateFile(path / agent_file(NODE), "agent", NODE)
    file.save(node.classifier.remember((T0 + 60 * S) / S))
    return node, file


def test_a_held_fault_survives_a_restart_for_its_hold_time(tmp_path):
    before, file = faulted_then_saved(tmp_path, timed(tmp_path))
    since = before.current["gpu-3"].last_transition_time
    # restarted, the fault not firing again: its counters start again
    after = Node((Fault("gpu-3", "memory_ecc", LATER),), start_s=90, policy=timed(tmp_path))
    assert after.classifier.recall(file.load(), (T0 + 90 * S) / S) == 1  # Healthy, ok devices keep nothing
    after.run(90, 90)
    assert after.verdict("gpu-3") == ("Unhealthy", ("memory_ecc",))  # from the first verdict on
    assert after.current["gpu-3"].last_transition_time == since  # the same verdict, not a new transition
    assert "uncorrected ECC errors" in after.current["gpu-3"].message
    assert {after.verdict(f"gpu-{i}")[0] for i in range(3)} == {"Healthy"}
    after.run(100, 30 + HOUR - 60, every=60)
    assert after.verdict("gpu-3")[0] == "Unhealthy"  # still within the hour from its last evidence
    after.run(30 + HOUR + 120, 30 + HOUR + 240, every=60)
    assert after.verdict("gpu-3") == ("Healthy", ())


def test_a_restart_after_the_hold_has_run_out_starts_healthy(tmp_path):
    _, file = faulted_then_saved(tmp_path, timed(tmp_path))
    later = 60 + HOUR - 100  # within device_ttl of the last sample, past the hold of the last evidence
    after = Node((Fault("gpu-3", "memory_ecc", LATER),), start_s=later, policy=timed(tmp_path))
    after.classifier.recall(file.load(), (T0 + later * S) / S)
    after.run(later, later + 200)
    assert after.verdict("gpu-3") == ("Healthy", ())


def test_healthy_devices_keep_nothing_and_start_with_a_first_verdict(tmp_path):
    before, file = faulted_then_saved(tmp_path)
    assert [m.hw_id for m in file.load()] == ["gpu-3"]
    after = Node((Fault("gpu-3", "memory_ecc", LATER),), start_s=90)
    after.classifier.recall(file.load(), (T0 + 90 * S) / S)
    after.run(90, 90)
    v = after.current["gpu-0"]
    assert v.last_transition_time == v.time_unix_nano  # a first verdict (logged at debug level), not a restart's
    assert after.current["gpu-3"].last_transition_time == before.current["gpu-3"].last_transition_time


def test_memory_older_than_the_device_ttl_is_not_recalled_unless_it_holds_a_fault(tmp_path):
    _, file = faulted_then_saved(tmp_path)
    # What it keeps once its fault cleared: an escalation episode, nothing held.
    memory = [
        dataclasses.replace(m, reasons={r: dataclasses.replace(held, on=False) for r, held in m.reasons.items()})
        for m in file.load()
    ]
    after = Node((Fault("gpu-3", "memory_ecc", LATER),), start_s=2 * HOUR)
    assert after.classifier.recall(memory, (T0 + 2 * HOUR * S) / S) == 0
    # A held failure is kept for the escalation window (24h): silence does not repair it.
    for hours, kept in ((2, 1), (23, 1), (25, 0)):
        again = Node((Fault("gpu-3", "memory_ecc", LATER),), start_s=hours * HOUR)
        assert again.classifier.recall(file.load(), (T0 + hours * HOUR * S) / S) == kept, hours


def test_escalation_episodes_and_events_are_kept(tmp_path):
    node = Node((Fault("gpu-1", "device_reset", 30),))
    node.run(0, 400)
    assert "device_reset" in node.verdict("gpu-1")[1]
    saved = {m.hw_id: m for m in node.classifier.remember((T0 + 400 * S) / S)}["gpu-1"]
    assert saved.events and saved.reasons
    file = StateFile(tmp_path / "a.json", "agent", NODE)
    file.save(list(node.classifier.remember((T0 + 400 * S) / S)))
    back = {m.hw_id: m for m in file.load()}["gpu-1"]
    assert back == saved
    after = Node((Fault("gpu-1", "device_reset", LATER),), start_s=410)
    after.classifier.recall([back], (T0 + 410 * S) / S)
    after.run(410, 410)
    assert "device_reset" in after.verdict("gpu-1")[1]
    row = after.classifier.registry.row(NODE, "gpu-1")
    assert row is not None
    r = after.classifier.engine.episodes[row]
    assert r.max() >= 1


def test_the_file_is_written_atomically_and_privately(tmp_path):
    _, file = faulted_then_saved(tmp_path / "deep" / "dir")
    assert stat.S_IMODE(file.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(file.path.parent.stat().st_mode) == 0o700
    assert [p.name for p in file.path.parent.iterdir()] == [file.path.name]  # no temporary file left
    doc = json.loads(file.path.read_text())
    assert (doc["format"], doc["version"], doc["role"], doc["node"]) == ("otel-dra-state", 1, "agent", NODE)
    gpu3 = next(d for d in doc["devices"] if d["id"] == "gpu-3")
    assert gpu3["verdict"]["health"] == "Unhealthy" and gpu3["reasons"]["memory_ecc"]["on"] is True
    assert gpu3["reasons"]["memory_ecc"]["evidence_at"] > 1.7e9  # wall-clock UNIX seconds


# -- files that are not ours ----------------------------------------------------------------------------
def good_document(tmp_path: Path) -> dict:
    _, file = faulted_then_saved(tmp_path / "source")
    return json.loads(file.path.read_text())


def _future(doc: dict) -> dict:
    return {**doc, "version": 2}


def _other_node(doc: dict) -> dict:
    return {**doc, "node": "node-b", "devices": [{**d, "node": "node-b"} for d in doc["devices"]]}


def _other_node_devices(doc: dict) -> dict:
    return {**doc, "devices": [{**d, "node": "node-b"} for d in doc["devices"]]}


def _fleet(doc: dict) -> dict:
    return {**doc, "role": "fleet", "node": None}


def _bad_reason(doc: dict) -> dict:
    (gpu3,) = doc["devices"]
    return {**doc, "devices": [{**gpu3, "reasons": {"memory_ecc": {**gpu3["reasons"]["memory_ecc"], "on": "yes"}}}]}


def _unknown_reason(doc: dict) -> dict:
    (gpu3,) = doc["devices"]
    return {**doc, "devices": [{**gpu3, "reasons": {"gremlins": gpu3["reasons"]["memory_ecc"]}}]}


CORRUPT = {
    "truncated": lambda raw, doc: raw[: len(raw) // 2],
    "empty": lambda raw, doc: b"",
    "binary": lambda raw, doc: b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    "another program's JSON": lambda raw, doc: json.dumps({"version": 1, "devices": []}).encode(),
    "a JSON list": lambda raw, doc: b"[1, 2, 3]",
    "a future version": lambda raw, doc: json.dumps(_future(doc)).encode(),
    "another node's file": lambda raw, doc: json.dumps(_other_node(doc)).encode(),
    "another node's devices": lambda raw, doc: json.dumps(_other_node_devices(doc)).encode(),
    "the fleet's file": lambda raw, doc: json.dumps(_fleet(doc)).encode(),
    "a field of the wrong type": lambda raw, doc: json.dumps(_bad_reason(doc)).encode(),
    "an unknown reason": lambda raw, doc: json.dumps(_unknown_reason(doc)).encode(),
    "NaN": lambda raw, doc: raw.replace(b'"heard":', b'"heard":NaN,"x":', 1),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_file_that_is_not_ours_is_one_warning_moved_aside_and_a_clean_start(tmp_path, caplog, case):
    doc = good_document(tmp_path)
    raw = json.dumps(doc).encode()
    path = tmp_path / "state" / agent_file(NODE)
    path.parent.mkdir()
    path.write_bytes(CORRUPT[case](raw, doc))
    node = Node((), start_s=90)
    store = StateStore(node.classifier, StateFile(path, "agent", NODE))
    with caplog.at_level(logging.WARNING, logger="otel_dra.state.persist"):
        store.start()
    try:
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "ignored" in warnings[0].getMessage() and "starting clean" in warnings[0].getMessage()
        assert store.recalled == 0
        aside = [p.name for p in path.parent.iterdir() if p.name.startswith(path.name + ".corrupt-")]
        assert len(aside) == 1 and not path.exists()
        node.run(90, 120)
        assert {node.verdict(f"gpu-{i}") for i in range(4)} == {("Healthy", ())}  # clean, not half-believed
    finally:
        store.shutdown(2.0)
    assert StateFile(path, "agent", NODE).load() == []  # the clean start wrote a good (empty) file in its place
    assert path.exists() and len(list(path.parent.iterdir())) == 2


def test_a_missing_file_is_a_quiet_clean_start(tmp_path, caplog):
    node = Node()
    with caplog.at_level(logging.INFO, logger="otel_dra.state.persist"):
        store = StateStore(node.classifier, StateFile(tmp_path / "none" / FLEET_FILE, "fleet"))
        store.start()
        store.shutdown(2.0)
    assert not caplog.records
    assert (tmp_path / "none" / FLEET_FILE).exists()


def test_the_parser_refuses_what_it_did_not_write():
    with pytest.raises(ValueError):
        DeviceMemory.from_json({"node": "n", "id": "gpu-0", "heard": 1.0, "extra": 1})
    with pytest.raises(ValueError):
        DeviceMemory.from_json({"node": "n", "id": "gpu-0", "heard": True})
    with pytest.raises(ValueError):
        DeviceMemory.from_json({"node": "n", "id": "gpu-0", "heard": 1.0, "events": {"resets": [[1.0, -1.0]]}})
    m = DeviceMemory.from_json({"node": "n", "id": "gpu-0", "heard": 1.0})
    assert DeviceMemory.from_json(m.to_json()) == m


# -- the store's schedule -------------------------------------------------------------------------------
def test_the_store_writes_soon_after_a_change_and_at_shutdown(tmp_path):
    node = Node((Fault("gpu-3", "memory_ecc", 30),))
    path = tmp_path / agent_file(NODE)
    store = StateStore(node.classifier, StateFile(path, "agent", NODE), every_s=3600, min_gap_s=0.0)
    store.start()
    try:
        node.run(0, 0)  # the first verdicts are a change
        node.run(10, 40)
        _wait(lambda: _held(path, "gpu-3"))
    finally:
        store.shutdown(2.0)
    assert node.classifier.evaluated == []  # unhooked at shutdown


def test_a_clock_that_went_back_holds_no_longer_than_from_now(tmp_path):
    _, file = faulted_then_saved(tmp_path)
    memories = file.load()
    after = Node(start_s=0)
    # recalled at a time before the evidence (the clock stepped back 10 minutes): taken as now
    after.classifier.recall(memories, (T0 + 60 * S) / S)
    after.run(-600, -600)
    row = after.classifier.registry.row(NODE, "gpu-3")
    assert row is not None
    assert after.classifier.engine.evidence_at[row].max() <= (T0 - 600 * S) / S


def _held(path: Path, hw_id: str) -> bool:
    if not path.exists():
        return False
    doc = json.loads(path.read_text())
    return any(d["id"] == hw_id and "memory_ecc" in d.get("reasons", {}) for d in doc["devices"])


def _wait(predicate, timeout: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- where -------------------------------------------------------------------------------------------------
def test_the_default_directory_follows_xdg(monkeypatch):
    assert default_state_dir({"XDG_STATE_HOME": "/srv/state"}) == "/srv/state/otel-dra"
    home = os.path.expanduser("~")
    assert default_state_dir({}) == os.path.join(home, ".local", "state", "otel-dra")
    assert default_state_dir({"XDG_STATE_HOME": "relative"}) == os.path.join(home, ".local", "state", "otel-dra")
    assert resolve_state_dir("/x", False) == "/x"
    assert resolve_state_dir("", False) is None
    assert resolve_state_dir("/x", True) is None
    assert resolve_state_dir(None, False, {"XDG_STATE_HOME": "/s"}) == "/s/otel-dra"
    assert agent_file("node/../x y") == "agent-node_.._x_y.json"


# -- counter baselines ----------------------------------------------------------------------------------
UNCORRECTED = Column("hw.errors", attrs_of({"error.type": "uncorrected"}))
POWER = Column("hw.power", ())


class Counting:
    """Four GPUs that keep counting whoever reads them; gpu-3 gets one uncorrected ECC error (a one-off) at
    ``error_at`` seconds. Each starts with a history (counts from before anyone watched)."""

    def __init__(self, error_at: int) -> None:
        self.schema = Schema()
        self.error_at = error_at
        self.ids = tuple(f"gpu-{i}" for i in range(4))
        self.table = DeviceTable(
            NODE, self.ids, tuple({"hw.type": "gpu", "hw.serial_number": f"S{i}"} for i in range(4))
        )

    def frame(self, t: int) -> Frame:
        values = np.full((4, 2), np.nan)
        values[:, self.schema.index(UNCORRECTED)] = [3.0, 0.0, 7.0, 2.0 + (t >= self.error_at)]
        values[:, self.schema.index(POWER)] = 300.0
        return Frame(T0 + t * S, self.table, values)

    def run(self, classifier: Classifier, from_s: int, to_s: int) -> dict[str, tuple[str, tuple[str, ...]]]:
        for t in range(from_s, to_s + 1, 10):
            classifier.ingest(self.frame(t))
            classifier.evaluate(T0 + t * S)
        return {v.hw_id: (v.health, v.reasons) for v in classifier.current()}


def _restart_across_a_fault(path: Path, down_s: int, recall: bool = True, serial: str | None = None) -> dict:
    """The process is down from 60 s for ``down_s`` seconds while the devices keep counting: gpu-3's one
    error comes at 70 s, unseen by anyone. A new classifier (``recall``: with the file's memory) then reads
    the same devices; returns its verdicts."""
    devices = Counting(error_at=70)
    before = Classifier(policy_mod.load(), devices.schema, interval_s=10)
    assert devices.run(before, 0, 60)["gpu-3"] == ("Healthy", ())
    file = StateFile(path / agent_file(NODE), "agent", NODE)
    file.save(before.remember((T0 + 60 * S) / S), counters=before.baselines())
    after = Classifier(policy_mod.load(), devices.schema, interval_s=10)
    back = 60 + down_s
    if recall:
        saved = file.read()
        assert saved.counters is not None and len(saved.counters) == 4
        counters = saved.counters
        if serial is not None:  # the file says gpu-3 had another serial number: another device under its id
            serials = tuple(serial if i == "gpu-3" else s for i, s in zip(counters.ids, counters.serials, strict=True))
            counters = dataclasses.replace(counters, serials=serials)
        after.recall(saved.devices, (T0 + back * S) / S)
        after.recall_baselines(counters)
    return devices.run(after, back, back + 30)


def test_an_error_counted_while_the_process_was_down_is_news_after_the_restart(tmp_path):
    after = _restart_across_a_fault(tmp_path, 30)
    assert after["gpu-3"] == ("Unhealthy", ("memory_ecc",))
    assert {after[f"gpu-{i}"] for i in range(3)} == {("Healthy", ())}  # their history is not news


def test_without_the_baselines_the_error_would_be_taken_for_history(tmp_path):
    """The control: the same restart with nothing recalled (the contract's first sight) misses it."""
    assert _restart_across_a_fault(tmp_path, 30, recall=False)["gpu-3"] == ("Healthy", ())


def test_baselines_are_not_recalled_after_a_window_of_silence_or_for_another_device(tmp_path):
    # Down longer than the policy's 5 m window: what the counter gained meanwhile is history.
    assert _restart_across_a_fault(tmp_path / "long", 400)["gpu-3"] == ("Healthy", ())
    # Another serial number under the same hw.id: a swapped device brings its own counts.
    assert _restart_across_a_fault(tmp_path / "swap", 30, serial="another-serial")["gpu-3"] == ("Healthy", ())


def test_the_counters_block_round_trips_and_a_bad_one_is_refused_whole(tmp_path):
    devices = Counting(error_at=10**6)
    classifier = Classifier(policy_mod.load(), devices.schema, interval_s=10)
    devices.run(classifier, 0, 30)
    file = StateFile(tmp_path / agent_file(NODE), "agent", NODE)
    baselines = classifier.baselines()
    assert baselines.serials == ("S0", "S1", "S2", "S3")
    file.save([], counters=baselines)
    back = file.read().counters
    assert back is not None and back.ids == baselines.ids and back.columns == baselines.columns
    assert np.array_equal(back.values, baselines.values, equal_nan=True)
    doc = json.loads(file.path.read_text())
    doc["counters"]["values"][0][0] = -1.0
    file.path.write_text(json.dumps(doc))
    assert file.read() == ([], None, None)  # refused whole, moved aside
    assert list(tmp_path.glob("*.corrupt-*"))


def test_what_devices_share_round_trips_through_the_file_and_a_bad_block_is_refused_whole(tmp_path):
    """Days of fatal-event counts per firmware version and each link group's escalation must outlive a restart
    (issue #31): written beside the devices' memory, read back into a new classifier, and a block that is not ours
    refuses the whole file."""
    from otel_dra.classifier.firmware_rates import FirmwareHistory
    from otel_dra.classifier.group_memory import GroupMemory, LinkEpisodes

    now = 500_000 * 3600.0 + 60
    groups = GroupMemory(
        FirmwareHistory(3600.0, [("H100 80GB HBM3", "96.00.89.00.01", [(500_000, 86_400.0, 3.0)])]),
        (LinkEpisodes("pcie/0000:40:00.0", NODE, True, 2, now - 600),),
    )
    file = StateFile(tmp_path / agent_file(NODE), "agent", NODE)
    file.save([], groups=groups)
    back = file.read().groups
    assert back is not None and back.to_json() == groups.to_json()
    classifier = Classifier(policy_mod.load(), Counting(error_at=10**6).schema, interval_s=10)
    classifier.recall_groups(back, now)
    exposure, events, _ = classifier.firmware_rates.totals(now)
    assert exposure.sum() == 86_400.0 and events.sum() == 3.0
    assert classifier.group_memory(now).links == groups.links
    for key, value in (("events", -1), ("episodes", "2")):
        doc = json.loads(file.path.read_text()) if file.path.exists() else None
        file.save([], groups=groups)
        doc = json.loads(file.path.read_text())
        if key == "events":
            doc["groups"]["firmware"]["versions"][0]["buckets"][0][2] = value
        else:
            doc["groups"]["links"][0][key] = value
        file.path.write_text(json.dumps(doc))
        assert file.read() == ([], None, None), key
    assert list(tmp_path.glob("*.corrupt-*"))
