"""``otel-dra state show`` / ``forget`` (issue #29): a real state file, written by the agent's own writer from a
classifier that saw an uncorrected ECC error, is shown with what clears each held fault; ``forget`` drops
exactly one device (a restart then starts it clean, no repair needed); every bad input is one line, exit 2."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier, Verdict
from otel_dra.cli import main
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of
from otel_dra.state.persist import StateFile, StateStore, agent_file, default_state_dir

S = 10**9
T0 = 1_800_000_000 * S
NODE = "n1"
IDS = ("gpu-0", "gpu-1", "gpu-2")
UNCORRECTED = Column("hw.errors", attrs_of({"error.type": "uncorrected"}))
XID79 = Column("hw.errors", attrs_of({"error.type": "driver", "hw.error.code": "79"}))
TEMP = Column("hw.temperature", attrs_of({"hw.sensor_location": "gpu"}), "temp/gpu", "temperature")
COLUMNS = {"UNCORRECTED": UNCORRECTED, "XID79": XID79, "TEMP": TEMP}
HOUR_AGO_NS = time.time_ns() - 3600 * S  # a file its process wrote an hour ago: stopped


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the options read from the environment must come from the test alone."""
    for var in ("OTEL_DRA_STATE_DIR", "OTEL_DRA_NODE_NAME", "OTEL_DRA_POLICY", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(var, raising=False)


class Node:
    """Three GPUs of one node sampled every 10 s by hand, judged by a classifier as the agent's."""

    def __init__(self) -> None:
        self.schema = Schema()
        self.classifier = Classifier(policy_mod.load(), self.schema, interval_s=10, restart_repairs=True)
        self.t = 0
        self.counts = {"UNCORRECTED": [0.0] * 3, "XID79": [0.0] * 3}
        self.verdicts: dict[str, Verdict] = {}

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            now = T0 + self.t * S
            attrs = tuple({"hw.type": "gpu", "hw.vendor": "NVIDIA", "hw.serial_number": f"SN-{i}"} for i in range(3))
            cols = {name: self.schema.index(column) for name, column in COLUMNS.items()}  # (the schema grows)
            values = np.full((3, len(self.schema)), np.nan)
            for name, per_device in self.counts.items():
                values[:, cols[name]] = per_device
            values[:, cols["TEMP"]] = 60.0
            self.classifier.ingest(Frame(now, DeviceTable(NODE, IDS, attrs), values))
            for v in self.classifier.evaluate(now):
                self.verdicts[v.hw_id] = v
            self.t += 10

    @property
    def now_s(self) -> float:
        return (T0 + self.t * S) / S


def failing_node() -> Node:
    """gpu-0: one uncorrected ECC error (held until a reset); gpu-1: XID 79 (held until a reboot); gpu-2 fine."""
    node = Node()
    node.step(3)
    node.counts["UNCORRECTED"][0] += 1
    node.counts["XID79"][1] += 1
    node.step()
    assert node.verdicts["gpu-0"].reasons == ("memory_ecc",) and node.verdicts["gpu-0"].health == "Unhealthy"
    assert node.verdicts["gpu-1"].reasons == ("driver_errors",)
    return node


def write_state(folder: Path, written_ns: int | None = HOUR_AGO_NS) -> tuple[Path, Node]:
    """The agent's file for NODE, as its StateStore writes it (remember + baselines, StateFile.save)."""
    node = failing_node()
    path = folder / agent_file(NODE)
    StateFile(path, "agent", NODE).save(
        node.classifier.remember(node.now_s), written_ns, counters=node.classifier.baselines()
    )
    return path, node


def otel_dra(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``otel-dra ARGS`` as the console script runs it: exit code, stdout, stderr."""
    code = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "", (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("otel-dra: error: ") and "Traceback" not in err, err
    return lines[0]


# -- show -------------------------------------------------------------------------------------------
def test_show_lists_the_held_ecc_fault_with_what_clears_it_as_json(tmp_path, capsys):
    path, node = write_state(tmp_path)
    code, out, err = otel_dra(capsys, "state", "show", "--state-file", str(path), "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["role"], doc["k8s.node.name"], doc["state_file"]) == ("agent", NODE, str(path))
    devices = {d["hw.id"]: d for d in doc["devices"]}
    assert set(devices) == {"gpu-0", "gpu-1"}  # a healthy GPU has no memory to show
    gpu0 = devices["gpu-0"]
    assert gpu0["k8s.node.name"] == NODE and gpu0["hw.serial_number"] == "SN-0"
    assert gpu0["verdict"]["health"] == "Unhealthy" and gpu0["verdict"]["remediation"] == "reset_device"
    [ecc] = gpu0["faults"]
    assert ecc["reason"] == "memory_ecc" and ecc["held"] is True and ecc["state"] == "failed"
    seen = node.now_s - 10  # the last evaluation's time: the error's evidence
    assert ecc["last_evidence"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seen))
    assert "uncorrected" in ecc["evidence"]
    assert ecc["clears"] == {
        "by": "repair",
        "awaits": "reset",
        "clean_s": 300.0,
        "text": "held until the device is reset, then 5m clean",
    }
    assert devices["gpu-1"]["faults"][0]["clears"]["awaits"] == "reboot"


def test_show_as_a_table_names_device_fault_evidence_and_clearing(tmp_path, capsys):
    path, _ = write_state(tmp_path)
    code, out, err = otel_dra(capsys, "state", "show", "--state-file", str(path))
    assert code == 0, err
    row = next(line for line in out.splitlines() if "gpu-0" in line)  # piped: one line per row
    for cell in ("SN-0", "memory_ecc", "Z memory_ecc: uncorrected", "held until the device is reset, then 5m clean"):
        assert cell in row, row
    assert "Unhealthy (failed, reset_device)" in row
    assert f"{path}: node {NODE}'s agent" in out and "2 devices remembered" in out


def test_show_lists_what_devices_share_firmware_history_and_link_escalation(tmp_path, capsys):
    from otel_dra.classifier.firmware_rates import FirmwareHistory
    from otel_dra.classifier.group_memory import GroupMemory, LinkEpisodes

    path = tmp_path / agent_file(NODE)
    groups = GroupMemory(
        FirmwareHistory(3600.0, [("H100 80GB HBM3", "96.00.89.00.01", [(1, 43_200.0, 2.0), (2, 43_200.0, 1.0)])]),
        (LinkEpisodes("pcie/0000:40:00.0", NODE, True, 2, 1.0e9),),
    )
    StateFile(path, "agent", NODE).save([], HOUR_AGO_NS, groups=groups)
    code, out, err = otel_dra(capsys, "state", "show", "--state-file", str(path), "-o", "json")
    assert code == 0, err
    doc = json.loads(out)["groups"]
    assert doc["firmware"] == [
        {"hw.model": "H100 80GB HBM3", "hw.firmware_version": "96.00.89.00.01", "device_days": 1.0, "fatal_events": 3.0}
    ]
    assert doc["links"] == [{"group": "pcie/0000:40:00.0", "k8s.node.name": NODE, "on": True, "episodes": 2}]
    code, out, err = otel_dra(capsys, "state", "show", "--state-file", str(path))
    assert code == 0, err
    assert any("firmware/H100 80GB HBM3/96.00.89.00.01" in line and "3 fatal events in 1 device-days" in line
               for line in out.splitlines())  # fmt: skip
    assert any("pcie/0000:40:00.0" in line and "2 episodes" in line for line in out.splitlines())


def test_show_finds_the_agents_file_where_the_agent_keeps_it(tmp_path, capsys, monkeypatch):
    """No --state-file: the default folder and the agent's file name, from the agent's own helpers."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    folder = Path(default_state_dir())
    write_state(folder)
    code, out, err = otel_dra(capsys, "state", "show", "--node", NODE, "-o", "json")
    assert code == 0, err
    assert json.loads(out)["state_file"] == str(folder / agent_file(NODE))
    line = one_error_line(*otel_dra(capsys, "state", "show", "--node", "n2"))
    assert str(folder / agent_file("n2")) in line


def test_show_holds_to_a_time_hold_when_the_policy_says_hold(tmp_path, capsys):
    path, node = write_state(tmp_path)
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nclears:\n  memory_ecc: hold\n")
    code, out, err = otel_dra(capsys, "state", "show", "--state-file", str(path), "-o", "json", "--policy", str(policy))
    assert code == 0, err
    ecc = next(d for d in json.loads(out)["devices"] if d["hw.id"] == "gpu-0")["faults"][0]
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(node.now_s - 10 + 3600))
    assert ecc["clears"]["by"] == "hold" and ecc["clears"]["until"] == until and "1h" in ecc["clears"]["text"]


# -- forget -----------------------------------------------------------------------------------------
def test_forget_drops_exactly_that_device_and_a_restart_starts_it_clean(tmp_path, capsys):
    path, node = write_state(tmp_path)
    code, out, err = otel_dra(capsys, "state", "forget", "gpu-0", "--state-file", str(path))
    assert code == 0, err
    assert "forgot gpu-0 on node n1 (held memory_ecc)" in out and "stop it, forget, start it" in out

    saved = StateFile(path, "agent", NODE).read()  # the agent's reader takes it (nothing moved aside)
    assert path.exists() and [m.hw_id for m in saved.devices] == ["gpu-1"]
    assert saved.counters is not None and "gpu-0" not in saved.counters.ids and "gpu-1" in saved.counters.ids
    assert json.loads(path.read_text())["written_unix_nano"] == HOUR_AGO_NS  # still says when the agent wrote it

    # The restart: a new agent recalls the file, and its GPUs report the same counts as before.
    again = Node()
    again.t, again.counts = node.t, node.counts
    again.classifier.recall(saved.devices, again.now_s)
    again.classifier.recall_baselines(saved.counters)
    again.step()
    assert again.verdicts["gpu-0"].health == "Healthy" and again.verdicts["gpu-0"].reasons == ()
    assert again.verdicts["gpu-1"].health == "Unhealthy" and again.verdicts["gpu-1"].reasons == ("driver_errors",)


def test_without_forget_the_restart_still_holds_the_ecc_fault(tmp_path):
    """The control: the same restart from the untouched file keeps gpu-0 Unhealthy (so the test above can fail)."""
    path, node = write_state(tmp_path)
    saved = StateFile(path, "agent", NODE).read()
    again = Node()
    again.t, again.counts = node.t, node.counts
    again.classifier.recall(saved.devices, again.now_s)
    again.classifier.recall_baselines(saved.counters)
    again.step()
    assert again.verdicts["gpu-0"].reasons == ("memory_ecc",) and again.verdicts["gpu-0"].health == "Unhealthy"


def test_forgetting_an_unknown_device_is_one_line_with_close_matches(tmp_path, capsys):
    path, _ = write_state(tmp_path)
    before = path.read_bytes()
    line = one_error_line(*otel_dra(capsys, "state", "forget", "gpu-9", "--state-file", str(path)))
    assert "no device 'gpu-9'" in line and set(line.split("close matches: ")[1].split(", ")) == {"gpu-0", "gpu-1"}
    line = one_error_line(*otel_dra(capsys, "state", "forget", "gpu-2", "--state-file", str(path)))
    assert "no device 'gpu-2'" in line  # healthy: nothing remembered to forget
    assert path.read_bytes() == before


def test_forget_refuses_a_file_written_lately_unless_told(tmp_path, capsys):
    """A file written seconds ago may belong to a running agent, which would write its memory back."""
    path, _ = write_state(tmp_path, written_ns=None)  # written now
    before = path.read_bytes()
    line = one_error_line(*otel_dra(capsys, "state", "forget", "gpu-0", "--state-file", str(path)))
    assert "s ago" in line and "stop it first" in line and "--yes" in line
    assert path.read_bytes() == before
    code, _, err = otel_dra(capsys, "state", "forget", "gpu-0", "--state-file", str(path), "--yes")
    assert code == 0, err
    assert [m.hw_id for m in StateFile(path, "agent", NODE).read().devices] == ["gpu-1"]


def test_forget_in_a_fleet_file_needs_the_node_when_two_nodes_share_the_id(tmp_path, capsys):
    a, _ = write_state(tmp_path)
    memory = StateFile(a, "agent", NODE).read().devices
    from dataclasses import replace

    fleet = StateFile(tmp_path / "fleet.json", "fleet")
    fleet.save([*memory, *(replace(m, node="n2") for m in memory)], HOUR_AGO_NS)
    line = one_error_line(*otel_dra(capsys, "state", "forget", "gpu-0", "--state-dir", str(tmp_path), "--fleet"))
    assert "on 2 nodes" in line and "--node" in line
    args = ("state", "forget", "gpu-0", "--state-dir", str(tmp_path), "--fleet", "--node", "n2")
    code, _, err = otel_dra(capsys, *args)
    assert code == 0, err
    left = sorted(m.key for m in fleet.read().devices)
    assert left == [("n1", "gpu-0"), ("n1", "gpu-1"), ("n2", "gpu-1")]


# -- bad files ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"format": "otel-dra-state", "version": 1, "role": "agent", "node": "n1", "devi', "not JSON"),
        (b'{"hello": "world"}', "not an otel-dra state file"),
        (
            b'{"format": "otel-dra-state", "version": 1, "role": "agent", "node": "n1", "devices": [{"id": 3}]}',
            "device 0",
        ),
    ],
)
@pytest.mark.parametrize("command", ["show", "forget"])
def test_a_corrupt_file_is_one_line_and_left_in_place(tmp_path, capsys, content, why, command):
    path = tmp_path / agent_file(NODE)
    path.write_bytes(content)
    args = ("gpu-0", "--yes") if command == "forget" else ()
    line = one_error_line(*otel_dra(capsys, "state", command, *args, "--state-file", str(path)))
    assert why in line and str(path) in line
    assert path.read_bytes() == content and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_missing_file_a_folder_and_the_wrong_role_are_one_line(tmp_path, capsys):
    path, _ = write_state(tmp_path)
    line = one_error_line(*otel_dra(capsys, "state", "show", "--state-file", str(tmp_path / "nope.json")))
    assert "no state file at" in line
    line = one_error_line(*otel_dra(capsys, "state", "show", "--state-file", str(tmp_path)))
    assert "is a directory" in line
    line = one_error_line(*otel_dra(capsys, "state", "show", "--state-file", str(path), "--fleet"))
    assert "written by the 'agent', not the fleet" in line
    line = one_error_line(*otel_dra(capsys, "state", "forget", "gpu-0", "--state-file", str(path), "--node", "n2"))
    assert "node n1's agent file, not node n2's" in line


# -- the restart's log line -----------------------------------------------------------------------------
@pytest.mark.parametrize(("devices", "said"), [(1, "1 device's memory recalled"), (2, "2 devices' memory recalled")])
def test_the_restart_says_how_many_and_how_to_look(tmp_path, caplog, devices, said):
    path, _ = write_state(tmp_path)
    saved = StateFile(path, "agent", NODE).read()
    StateFile(path, "agent", NODE).save(saved.devices[:devices], HOUR_AGO_NS, saved.counters)
    again = Node()
    again.classifier.last_now_ns = 0
    store = StateStore(again.classifier, StateFile(path, "agent", NODE))
    with caplog.at_level(logging.INFO, logger="otel_dra.state.persist"):
        store.start()
    store.shutdown(5)
    [line] = [r.getMessage() for r in caplog.records if "recalled" in r.getMessage()]
    assert said in line
    assert f"otel-dra state show --state-file {path}" in line and "otel-dra state forget DEVICE" in line
