"""``otel-dra status`` as people and scripts use it (issue #15), run as its own process against a
real HTTP endpoint (the agent's own :class:`HttpEndpoint`) serving a ``/v1/devices`` document:
a table that splits no word at 80 columns or piped, ``--output json``, URLs without a scheme,
``--watch`` in place on a terminal (a pty) and line by line when piped, an env var per option."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from otel_dra.sinks.endpoint import HttpEndpoint
from otel_dra.sinks.exposition import ExpositionCache

NODE = "gpu-node-17.us-east1.example.internal"
CAPTION = "too narrow for: widen the terminal, pipe the output or use --output json"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def device(node: str, i: int, health: str, state: str, reasons: list[str], remediation: str, message: str) -> dict:
    now = time.time_ns()
    return {
        "time_unix_nano": now,
        "k8s.node.name": node,
        "hw.id": f"gpu-{i}",
        "health": health,
        "hw.state": state,
        "reasons": reasons,
        "remediation": remediation,
        "message": message,
        "dra.pool.name": node,
        "dra.device.name": f"gpu-{i}",
        "dra.driver.name": "gpu.simulated.otel-dra.io",
        "last_transition_time": now - 200 * 10**9,
        "last_reported_time": now,
        "since": "2026-12-02T05:50:42Z",
    }


def agent_document(node: str = NODE) -> dict[str, Any]:
    """As an agent serves it (the messages are the classifier's), unhealthy first."""
    return {
        "devices": [
            device(
                node,
                6,
                "Unhealthy",
                "failed",
                ["memory_ecc", "power_throttling"],
                "reset_device",
                "memory_ecc: uncorrected ECC errors: 3 in 5m; power_throttling: throttled by power in 80% of samples",
            ),
            device(
                node,
                2,
                "Unhealthy",
                "degraded",
                ["thermal"],
                "reduce_load",
                "thermal: temperature above its high.degraded limit in 100% of samples over 5m",
            ),
            device(node, 3, "Unknown", "unknown", ["stale"], "check_workload", "stale: no sample for 45s"),
            *(
                device(node, i, "Healthy", "ok", [], "none", "no evidence of a fault in the last 5m")
                for i in (0, 1, 4, 5, 7)
            ),
        ]
    }


class Served:
    """A /v1/devices document on a real socket; ``doc`` may be replaced between reads."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        cache = ExpositionCache(CollectorRegistry(), 60.0)
        cache.render()
        self.endpoint = HttpEndpoint("127.0.0.1", 0, cache, {"/v1/devices": self._devices})
        self.endpoint.start()
        self.port = self.endpoint.port
        self.url = f"http://127.0.0.1:{self.port}"

    def _devices(self) -> tuple[str, str, bytes]:
        return "200 OK", "application/json", json.dumps(self.doc).encode()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served(agent_document())
    yield s
    s.endpoint.shutdown()


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k not in ("COLUMNS", "LINES")}
    return {**base, "NO_COLOR": "1", **extra}


def status(*args: str, timeout: float = 30, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_dra", "status", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(**extra_env),
    )


def on_a_terminal(args: list[str], columns: int, seconds: float, interrupt: bool) -> tuple[int, str]:
    """Run status with stdout on a pty ``columns`` wide; (exit code, what it showed without escapes)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_dra", "status", *args],
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env(COLUMNS=str(columns), LINES="50", TERM="xterm"),
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + seconds
    while True:
        timeout = deadline - time.monotonic() if interrupt else 30
        if interrupt and timeout <= 0:
            proc.send_signal(signal.SIGINT)
            interrupt = False
            deadline = time.monotonic() + 30
            continue
        if time.monotonic() > deadline + 30:  # (still running 30 s past its time: it did not end)
            proc.kill()
            break
        ready, _, _ = select.select([master], [], [], max(0.0, min(timeout, 0.2)))
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the pty
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None and not interrupt:
            break
    code = proc.wait(timeout=30)
    os.close(master)
    # An escape (cursor up, erase line) ends what was drawn before it, as a new line does.
    return code, ANSI.sub("\n", out.decode("utf-8", "replace").replace("\r\n", "\n"))


def words_of(doc: dict[str, Any], url: str) -> set[str]:
    """Every word the table may show: headers, the title's, the caption's and each device's values."""
    known = {"device", "health", "hw.state", "reasons", "remediation", "scope", "since", "evidence", "node", "-"}
    known |= set(f"8 devices on node {NODE} at {url} (2 Unhealthy, 1 Unknown) on 2 nodes, from the fleet".split())
    known |= set(
        ["too", "narrow", "for:", "widen", "the", "terminal,", "pipe", "the", "output", "or", "use", "--output", "json"]
    )
    known |= {"and", "whole", "evidence"}
    for d in doc["devices"]:
        known |= {d["k8s.node.name"], d["hw.id"], d["health"], d["hw.state"], d["remediation"]}
        known |= set(d["message"].split()) | set(d["reasons"]) | set(str(d.get("group") or "").split())
    return {w.rstrip(",:;") for w in known}


def assert_no_word_split(text: str, known: set[str]) -> None:
    """A word split across lines leaves pieces ("remediati", "on") that are no word of the table."""
    table_chars = re.compile(r"^[─━│┃┏┓┗┛┡┩╇╋┳┻ ]+$")
    pieces = {w for line in text.splitlines() if not table_chars.match(line) for w in line.split()}
    pieces = {w.strip("│┃").rstrip(",:;") for w in pieces} - {""}
    pieces = {w for w in pieces if not re.fullmatch(r"\d+[dhms](\d+[dhms])?|[\d:]+|every|0.3s", w)}
    # The evidence shortened to its column ends in an ellipsis, the last word cut where it ends: "abov…".
    cut = {w for w in pieces if w.endswith("…") and any(k.startswith(w[:-1]) for k in known)}
    assert pieces - cut <= known, sorted(pieces - cut - known)


def test_piped_each_device_is_one_line_and_no_word_is_split(served):
    shown = status(served.url, COLUMNS="80")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    rows = [line for line in lines if re.match(r"gpu-\d ", line)]
    assert len(rows) == 8 and rows[0].startswith("gpu-6") and rows[2].startswith("gpu-3")
    assert "memory_ecc, power_throttling" in rows[0] and "reset_device" in rows[0] and "80% of samples" in rows[0]
    assert lines[1].split() == ["device", "health", "hw.state", "reasons", "remediation", "since", "evidence"]
    assert all(line == line.rstrip() for line in lines)
    assert_no_word_split(shown.stdout, words_of(served.doc, f"http://127.0.0.1:{served.port}"))


def test_at_80_columns_on_a_terminal_nothing_is_wider_and_no_word_is_split(served):
    code, shown = on_a_terminal([served.url], 80, 0, interrupt=False)
    assert code == 0, shown
    lines = [line for line in shown.splitlines() if line.strip()]
    assert max(len(line) for line in lines) <= 80, shown
    assert any(line.startswith("gpu-6") and "Unhealthy" in line and "reset_device" in line for line in lines), shown
    assert "remediation" in shown and "evidence" in shown
    assert_no_word_split(shown, words_of(served.doc, served.url))


def test_a_fleet_at_80_columns_keeps_the_node_and_says_what_it_left_out(served):
    served.doc = agent_document()
    served.doc["devices"][1]["k8s.node.name"] = "n2"
    code, shown = on_a_terminal([served.url], 80, 0, interrupt=False)
    assert code == 0, shown
    assert "8 devices on 2 nodes" in shown and NODE in shown and "too narrow for" in shown
    assert max(len(line) for line in shown.splitlines()) <= 80
    assert_no_word_split(shown, words_of(served.doc, served.url))


def test_output_json_is_the_document_as_served(served):
    shown = status(served.url, "--output", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == served.doc


def test_every_option_has_an_environment_variable_shown_in_help(served):
    shown = status("--help")
    assert shown.returncode == 0
    for flag in ("OUTPUT", "WATCH", "INTERVAL", "TIMEOUT", "URL"):
        assert f"OTEL_DRA_STATUS_{flag}" in shown.stdout, flag
    by_env = status(OTEL_DRA_STATUS_URL=f"127.0.0.1:{served.port}", OTEL_DRA_STATUS_OUTPUT="json")
    assert by_env.returncode == 0, by_env.stderr
    assert json.loads(by_env.stdout) == served.doc


@pytest.mark.parametrize("form", ["127.0.0.1:{port}", ":{port}", "http://127.0.0.1:{port}/v1/devices"])
def test_a_url_without_a_scheme_or_host_works(served, form):
    shown = status(form.format(port=served.port), "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert len(json.loads(shown.stdout)["devices"]) == 8


@pytest.mark.parametrize("url", ["ftp://x", "http://[::1", "host:port", "http://", "a b", "x" * 300, "http:/x"])
def test_a_bad_url_is_one_line_and_exit_2(url):
    shown = status(url)
    assert shown.returncode == 2, shown
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("otel-dra status: error:"), shown.stderr
    assert "HOST:PORT" in lines[0] and "Traceback" not in shown.stderr


def test_nothing_listening_is_one_line_and_exit_2():
    shown = status("127.0.0.1:1", "--timeout", "2")
    assert shown.returncode == 2
    assert shown.stderr.strip().splitlines() == [
        "otel-dra: error: cannot read http://127.0.0.1:1/v1/devices: [Errno 111] Connection refused; "
        "is 'otel-dra run' or 'otel-dra fleet' serving there?"
    ]


def test_watch_piped_prints_a_table_per_refresh_and_ends_cleanly_on_ctrl_c(served):
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_dra", "status", served.url, "--watch", "--interval", "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    first = [proc.stdout.readline() for _ in range(11)] if proc.stdout else []
    served.doc = {"devices": served.doc["devices"][2:]}
    second: list[str] = []
    while proc.stdout and not any(line.startswith("6 devices") for line in second):
        second.append(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert first[0].startswith("8 devices") and ", every 0.3s" in first[0]
    assert any(line.startswith("6 devices") for line in second)


def test_watch_json_is_one_document_per_line(served):
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_dra", "status", served.url, "-w", "--interval", "0.2", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert proc.stdout is not None
    docs = [json.loads(proc.stdout.readline()) for _ in range(3)]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert docs == [served.doc] * 3


def test_watch_on_a_terminal_redraws_in_place_and_ends_cleanly_on_ctrl_c(served):
    code, shown = on_a_terminal([served.url, "--watch", "--interval", "0.3"], 80, 2.5, interrupt=True)
    assert code == 0, shown
    assert shown.count("8 devices on node") >= 2, shown  # drawn, then redrawn
    assert "Traceback" not in shown and "KeyboardInterrupt" not in shown
    assert_no_word_split(shown, words_of(served.doc, served.url))


# -- a verdict about more than its device (contract section 4: scope and group) -------------------------
def scoped_document(node: str = "train-007") -> dict[str, Any]:
    """A newer server's: every verdict has a scope; gpu-6's is its node's power, gpu-2's its workload's."""
    doc = agent_document(node)
    for d in doc["devices"]:
        d["scope"] = "device"
    doc["devices"][0].update(scope="node", group=f"node/{node}", remediation="reboot_node")
    doc["devices"][1].update(scope="workload", group="workload/ml/trainer-0", remediation="check_workload")
    return doc


def cells(line: str) -> list[str]:
    """A piped row's cells: columns are two or more spaces apart, a cell's words one."""
    return re.split(r" {2,}", line.strip())


def test_piped_a_verdict_about_its_node_or_workload_says_which_in_the_scope_column(served):
    served.doc = scoped_document()
    shown = status(served.url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1].split() == ["device", "health", "hw.state", "reasons", "remediation", "scope", "since", "evidence"]
    rows = {cells(line)[0]: cells(line) for line in lines if re.match(r"gpu-\d ", line)}
    assert len(rows) == 8
    assert rows["gpu-6"][4:6] == ["reboot_node", "node/train-007"]
    assert rows["gpu-2"][4:6] == ["check_workload", "workload/ml/trainer-0"]
    assert rows["gpu-0"][4:6] == ["none", "-"]  # a device's own verdict: nothing more to say
    assert_no_word_split(shown.stdout, words_of(served.doc, served.url))


def test_a_document_without_scope_or_with_only_device_verdicts_has_no_scope_column(served):
    """An older server's document (no scope at all) reads as device verdicts, as does a newer one's whose
    verdicts are all the device's own; one without a scope beside one with is a device's own."""
    for doc in (agent_document(), {"devices": [{**d, "scope": "device"} for d in agent_document()["devices"]]}):
        served.doc = doc
        shown = status(served.url)
        assert shown.returncode == 0, shown.stderr
        assert "scope" not in shown.stdout.splitlines()[1].split()
    mixed = agent_document()
    mixed["devices"][0].update(scope="link", group="pcie/0000:40:00.0")
    served.doc = mixed
    shown = status(served.url)
    rows = {cells(line)[0]: cells(line) for line in shown.stdout.splitlines() if re.match(r"gpu-\d ", line)}
    assert rows["gpu-6"][5] == "pcie/0000:40:00.0" and rows["gpu-0"][5] == "-" and rows["gpu-3"][5] == "-"
    mixed["devices"][0].pop("group")  # a scope without a group: its name is what it is about
    shown = status(served.url)
    assert [cells(line)[5] for line in shown.stdout.splitlines() if line.startswith("gpu-6 ")] == ["link"]


def test_on_a_terminal_the_scope_column_shows_when_there_is_room_and_is_named_when_not(served):
    served.doc = scoped_document()
    code, wide = on_a_terminal([served.url], 200, 0, interrupt=False)
    assert code == 0, wide
    assert any(
        line.startswith("gpu-6") and "reboot_node" in line and "node/train-007" in line for line in wide.splitlines()
    )
    assert "scope" in wide and "too narrow" not in wide
    code, narrow = on_a_terminal([served.url], 80, 0, interrupt=False)
    assert code == 0, narrow
    assert max(len(line) for line in narrow.splitlines()) <= 80, narrow
    caption = " ".join(narrow.split()[narrow.split().index("narrow") :])
    assert "scope" in caption.split(":")[0] and "evidence" in narrow  # scope goes before the evidence does
    assert_no_word_split(narrow, words_of(served.doc, served.url))


def test_output_json_passes_scope_and_group_through_as_served(served):
    served.doc = scoped_document()
    shown = status(served.url, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    devices = json.loads(shown.stdout)["devices"]
    assert json.loads(shown.stdout) == served.doc
    assert [(d["scope"], d.get("group")) for d in devices[:3]] == [
        ("node", "node/train-007"),
        ("workload", "workload/ml/trainer-0"),
        ("device", None),
    ]


# -- issue #29: the reasons stay whole at 80 columns; a fleet is called a fleet ----------------------------
def rendered(doc: dict[str, Any], width: int) -> str:
    """The table as a terminal ``width`` columns wide shows it (no colour)."""
    from rich.console import Console

    from otel_dra.cli.cmd_status import device_table

    console = Console(width=width, color_system=None, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(device_table(doc, "http://127.0.0.1:9464", width=width))
    console.file.close()
    return console.export_text()


def test_at_80_columns_the_reasons_stay_whole_and_a_long_evidence_is_cut_with_an_ellipsis():
    doc = agent_document()
    long = "memory_ecc: uncorrected ECC errors: 3 in 5m; retired pages pending; row remapping failed " * 4
    doc["devices"][0]["message"] = long
    shown = rendered(doc, 80)
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80, shown
    assert lines[2].split()[:5] == ["device", "health", "reasons", "remediation", "evidence"], shown
    gpu6 = lines.index(next(line for line in lines if line.startswith("gpu-6")))
    assert lines[gpu6].split()[2] == "memory_ecc" and lines[gpu6 + 1].split() == ["power_throttling"], shown
    assert lines[gpu6].rstrip().endswith("…") and "memory_ecc: uncorrected" in lines[gpu6], shown  # one line, cut
    assert "no evidence of a fault in the last 5m" not in shown  # 37 characters: cut too, not wrapped
    assert "too narrow for hw.state, since and the whole evidence:" in " ".join(shown.split())
    assert_no_word_split(shown, words_of(doc, "http://127.0.0.1:9464") | set(long.split()))


def test_wide_enough_nothing_is_cut_and_nothing_is_said():
    shown = rendered(agent_document(), 200)
    assert "…" not in shown and "too narrow" not in shown
    assert (
        "memory_ecc: uncorrected ECC errors: 3 in 5m; power_throttling: throttled by power in 80% of samples" in shown
    )


def test_several_nodes_are_a_fleet_in_the_headline_one_node_says_neither(served):
    served.doc = agent_document()
    served.doc["devices"][1]["k8s.node.name"] = "n2"
    shown = status(served.url)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"8 devices on 2 nodes, from the fleet at {served.url} (2 Unhealthy, 1 Unknown)")
    served.doc = agent_document()
    shown = status(served.url)
    assert shown.stdout.startswith(f"8 devices on node {NODE} at {served.url} (")
    assert "fleet" not in shown.stdout and "agent" not in shown.stdout
    served.doc = {"devices": []}
    shown = status(served.url)
    assert "agent or fleet" in shown.stdout  # a server with no device yet may be either


def test_a_failed_refresh_of_a_fleet_says_the_fleet_was_lost(served):
    served.doc = agent_document()
    served.doc["devices"][1]["k8s.node.name"] = "n2"
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_dra", "status", served.url, "--watch", "--interval", "0.2", "--timeout", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith("8 devices on 2 nodes, from the fleet")
    served.endpoint.shutdown()
    line = proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert line.startswith(f"otel-dra status: lost the fleet at {served.url}: cannot read "), line
    assert "(retrying every 0.2s)" in line


def test_status_json_flag_is_answered_with_the_right_one(capsys):
    from otel_dra.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["status", "--json"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert (
        err == "otel-dra status: error: no such option: --json (did you mean -o json?) (see 'otel-dra status --help')\n"
    )


# -- --by group: what the findings are about (issue #31) ---------------------------------------------------------
FIRMWARE = "firmware/NVIDIA H100 80GB HBM3/96.00.89.00.01"


def grouped_document() -> dict[str, Any]:
    """Two nodes' devices from a fleet: one PCIe switch at the same address on each (4 GPUs of train-001, 2 of
    train-002: two findings, as PCI addresses are per host), a firmware version on gpu-7 of both (one finding,
    fleet-wide), and the agent document's own device findings (gpu-6, gpu-2, gpu-3) on each."""
    devices = []
    for node in ("train-001", "train-002"):
        devices += agent_document(node)["devices"]
    for d in devices:
        d["scope"] = "device"
        i, node = int(d["hw.id"].removeprefix("gpu-")), d["k8s.node.name"]
        if i in ((0, 1, 4, 5) if node == "train-001" else (0, 1)):
            d.update({"health": "Unhealthy", "hw.state": "failed", "reasons": ["link"], "remediation": "reboot_node"})
            d.update(scope="link", group="pcie/0000:40:00.0")
        if i == 7:
            d.update({"hw.state": "degraded", "reasons": ["firmware"], "remediation": "update_firmware"})
            d.update(scope="firmware", group=FIRMWARE)
    return {"devices": devices}


def test_by_group_lists_each_finding_once_with_its_nodes_and_device_count_then_the_device_findings(served):
    served.doc = grouped_document()
    shown = status(served.url, "--by", "group")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"3 findings beyond a device (8 devices), 6 device findings, of 16 devices at {served.url}"
    assert cells(lines[1]) == ["scope", "group", "nodes", "devices", "health", "hw.state", "reasons", "remediation"]
    assert [cells(line) for line in lines[2:5]] == [
        ["link", "pcie/0000:40:00.0", "train-001", "4", "Unhealthy", "failed", "link", "reboot_node"],
        ["link", "pcie/0000:40:00.0", "train-002", "2", "Unhealthy", "failed", "link", "reboot_node"],
        ["firmware", FIRMWARE, "train-001, train-002", "2", "Healthy", "degraded", "firmware", "update_firmware"],
    ]
    assert lines[5] == ""
    assert lines[6].startswith("device findings: 6 devices on 2 nodes, from the fleet")
    devices = [cells(line)[:2] for line in lines[8:]]
    # The devices' own findings only: none of a group's devices, and no Healthy device with nothing to say.
    assert sorted(devices) == sorted([n, f"gpu-{i}"] for n in ("train-001", "train-002") for i in (6, 2, 3))


def test_by_group_as_json_gives_the_findings_and_the_device_findings_lines(served):
    served.doc = grouped_document()
    shown = status(served.url, "--by", "group", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    link = doc["groups"][0]
    assert (link["scope"], link["group"], link["node"], link["device_count"]) == (
        "link",
        "pcie/0000:40:00.0",
        "train-001",
        4,
    )
    assert [d["hw.id"] for d in link["devices"]] == ["gpu-0", "gpu-1", "gpu-4", "gpu-5"]
    firmware = doc["groups"][2]
    nodes = ["train-001", "train-002"]
    assert (firmware["node"], firmware["nodes"], firmware["reasons"]) == (None, nodes, ["firmware"])
    served_lines = {(d["k8s.node.name"], d["hw.id"]): d for d in served.doc["devices"]}
    assert all(d == served_lines[(d["k8s.node.name"], d["hw.id"])] for d in doc["devices"])  # as served
    assert len(doc["devices"]) == 6


def test_by_group_without_findings_beyond_a_device_says_so_and_an_older_servers_document_works(served):
    """An older server's document (no scope): every verdict is the device's own."""
    shown = status(served.url, "--by", "group")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "no finding beyond a device" in lines and lines[0].startswith("0 findings beyond a device (0 devices)")
    assert [cells(line)[0] for line in lines if re.match(r"gpu-\d ", line)] == ["gpu-6", "gpu-2", "gpu-3"]


def test_by_group_on_a_terminal_and_from_the_environment(served):
    served.doc = grouped_document()
    code, shown = on_a_terminal([served.url, "--by", "group"], 200, 0, interrupt=False)
    assert code == 0, shown
    assert any(line.split()[:4] == ["link", "pcie/0000:40:00.0", "train-002", "2"] for line in shown.splitlines())
    piped = status(served.url, OTEL_DRA_STATUS_BY="group")
    assert piped.returncode == 0 and piped.stdout.startswith("3 findings beyond a device")


def test_a_bad_by_value_is_one_line_exit_2(served):
    shown = status(served.url, "--by", "node")
    assert shown.returncode == 2 and shown.stdout == ""
    assert shown.stderr == (
        "otel-dra status: error: Invalid value for '--by' (env var: 'OTEL_DRA_STATUS_BY'): 'node' is not one of "
        "'device', 'group'. (see 'otel-dra status --help')\n"
    )
