"""`otel-dra replay` as a user runs it: recorded OTLP JSON in, verdict lines out."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from otel_dra.faults import Fault
from tests.support.otlp_trace import T0, S, power_line, read_verdicts, write_trace

CONTRACT_KEYS = {"time_unix_nano", "k8s.node.name", "hw.id", "health", "hw.state", "reasons", "remediation", "message"}
NON_OK = {"degraded", "predicted_failure", "failed"}


def otel_dra(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_dra", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """Three nodes of four GPUs for 25 minutes: an ECC fault, a thermal fault, a lost device,
    and one node silent for 400 s."""
    path = tmp_path_factory.mktemp("trace") / "fleet.jsonl.gz"
    return write_trace(
        path,
        {
            "node-a": (4, [Fault("gpu-1", "memory_ecc", 300), Fault("gpu-3", "device_lost", 600)]),
            "node-b": (4, [Fault("gpu-2", "thermal", 300)]),
            "node-c": (4, []),
        },
        seconds=1500,
        silent={"node-c": (600, 1000)},
    )


@pytest.fixture(scope="module")
def replayed(trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "verdicts.jsonl"
    result = otel_dra("replay", str(trace), "-o", str(out))
    return result, read_verdicts(out)


def timeline(verdicts: list[dict], node: str, device: str) -> list[dict]:
    return [v for v in verdicts if v["k8s.node.name"] == node and v["hw.id"] == device]


def first_at(verdicts: list[dict], node: str, device: str, predicate) -> float | None:
    for v in timeline(verdicts, node, device):
        if predicate(v):
            return (v["time_unix_nano"] - T0) / S
    return None


def test_replay_writes_contract_lines_and_a_summary(replayed):
    result, verdicts = replayed
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert verdicts and all(set(v) >= CONTRACT_KEYS for v in verdicts)
    assert {(v["k8s.node.name"], v["hw.id"]) for v in verdicts} == {
        (n, f"gpu-{i}") for n in ("node-a", "node-b", "node-c") for i in range(4)
    }
    assert all(v["dra.pool.name"] == v["k8s.node.name"] and v["dra.device.name"] == v["hw.id"] for v in verdicts)
    assert all(v["reasons"] == sorted(v["reasons"]) for v in verdicts)
    assert "hw.state" in result.stderr and "Unhealthy" in result.stderr  # the summary table


def test_faults_are_found_in_time_with_their_reason(replayed):
    _, verdicts = replayed
    ecc = first_at(verdicts, "node-a", "gpu-1", lambda v: v["hw.state"] == "failed" and "memory_ecc" in v["reasons"])
    assert ecc is not None and 300 <= ecc <= 360
    ecc_line = next(v for v in timeline(verdicts, "node-a", "gpu-1") if v["hw.state"] == "failed")
    assert ecc_line["health"] == "Unhealthy" and ecc_line["remediation"] == "reset_device"
    assert "uncorrected ECC errors: 1" in ecc_line["message"]
    thermal = first_at(verdicts, "node-b", "gpu-2", lambda v: v["hw.state"] in NON_OK and "thermal" in v["reasons"])
    assert thermal is not None and 300 <= thermal <= 300 + 900
    lost = first_at(verdicts, "node-a", "gpu-3", lambda v: v["health"] == "Unhealthy" and "device_lost" in v["reasons"])
    assert lost is not None and 600 + 60 <= lost <= 600 + 150


def test_silent_node_reads_unknown_then_comes_back_without_false_alarms(replayed):
    _, verdicts = replayed
    for i in range(4):
        seq = timeline(verdicts, "node-c", f"gpu-{i}")
        unknown = [v for v in seq if v["health"] == "Unknown"]
        assert unknown and unknown[0]["reasons"] == ["stale"] and unknown[0]["hw.state"] is None
        assert 600 + 60 <= (unknown[0]["time_unix_nano"] - T0) / S <= 600 + 150
        assert seq[-1]["health"] == "Healthy" and seq[-1]["hw.state"] == "ok"
        assert not any(v["hw.state"] in NON_OK for v in seq)


def test_healthy_devices_never_leave_ok(replayed):
    _, verdicts = replayed
    faulted = {("node-a", "gpu-1"), ("node-a", "gpu-3"), ("node-b", "gpu-2")}
    for v in verdicts:
        if (v["k8s.node.name"], v["hw.id"]) not in faulted and v["k8s.node.name"] != "node-c":
            assert v["health"] == "Healthy" and v["hw.state"] == "ok", v


def test_no_fault_flaps(replayed):
    _, verdicts = replayed
    for node, device in (("node-a", "gpu-1"), ("node-b", "gpu-2"), ("node-a", "gpu-3")):
        seq = timeline(verdicts, node, device)
        entries = sum(1 for a, b in itertools.pairwise(seq) if a["hw.state"] not in NON_OK and b["hw.state"] in NON_OK)
        assert entries == 1, [(v["hw.state"], v["reasons"]) for v in seq]


def test_bad_lines_are_skipped_counted_and_the_rest_kept(tmp_path):
    bad = ["this is not json", "{}", json.dumps({"resourceMetrics": [{"resource": {}}]}), "[1, 2]"]
    trace = write_trace(tmp_path / "t.jsonl", {"n": (2, [Fault("gpu-0", "memory_ecc", 60)])}, 200, extra_lines=bad)
    out = tmp_path / "v.jsonl"
    result = otel_dra("replay", str(trace), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "line 22" in result.stderr  # the first bad line, with its number
    assert "skipped: 4 lines" in result.stderr
    assert any(v["hw.state"] == "failed" for v in read_verdicts(out))
    strict = otel_dra("replay", str(trace), "-o", str(out), "--strict")
    assert strict.returncode == 2
    assert strict.stderr.strip().splitlines()[-1].startswith("otel-dra: error: --strict")


def test_nothing_usable_is_exit_2_with_one_error_line(tmp_path):
    junk = tmp_path / "junk.jsonl"
    junk.write_text("nope\n{}\n")
    result = otel_dra("replay", str(junk), "-o", str(tmp_path / "v.jsonl"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("otel-dra: error: nothing in")


def test_missing_file_and_bad_policy_are_one_line_errors(tmp_path, trace):
    missing = otel_dra("replay", str(tmp_path / "absent.jsonl"))
    assert missing.returncode == 2 and "absent.jsonl" in missing.stderr and "Traceback" not in missing.stderr
    policy = tmp_path / "p.yaml"
    policy.write_text("rules:\n  thermal:\n    min_fraction: lots\n")
    bad = otel_dra("replay", str(trace), "--policy", str(policy))
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        == f"otel-dra: error: {policy}:3:19: rules.thermal.min_fraction: expected a number, got 'lots'"
    )


def test_policy_widens_unhealthy(tmp_path, trace):
    policy = tmp_path / "strict.yaml"
    policy.write_text("unhealthy_states: [failed, degraded]\n")
    out = tmp_path / "v.jsonl"
    assert otel_dra("replay", str(trace), "-o", str(out), "--policy", str(policy)).returncode == 0
    thermal = [v for v in read_verdicts(out) if v["hw.id"] == "gpu-2" and v["k8s.node.name"] == "node-b"]
    assert any(v["health"] == "Unhealthy" and v["hw.state"] == "degraded" for v in thermal)


def test_plot_draws_a_png(tmp_path, trace):
    png = tmp_path / "timeline.png"
    result = otel_dra("replay", str(trace), "-o", str(tmp_path / "v.jsonl"), "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_points_refused_by_the_caps_are_skipped_and_counted_by_reason(tmp_path):
    """Issue #14: a line naming a node that is no Kubernetes name and more devices than a node may have
    is read for what it may keep; the rest is skipped, counted by reason in the summary."""
    from otel_dra.decode.limits import DEVICES_PER_NODE, NODE_NAME
    from otel_dra.policy import load
    from otel_dra.replay import replay, skip_summary

    lines = [power_line("Bad_Node", 3), power_line("big", 300)]
    trace = write_trace(tmp_path / "t.jsonl", {"n": (2, [])}, 30, extra_lines=lines)
    result = replay([trace], load(), io.StringIO())
    assert dict(result.limited) == {NODE_NAME: 3, DEVICES_PER_NODE: 300 - 256}
    assert result.points_skipped >= 3 + 44 and result.lines_skipped == 0
    assert skip_summary(result) == (
        f"skipped: 0 lines, {result.points_skipped} points (refused by caps: node_name 3, devices_per_node 44)"
    )
    assert any("more than 256 devices on one node" in e.message for e in result.errors)


def test_a_replay_keeps_no_verdict_it_wrote_only_each_devices_outcome(trace):
    """Issue #17: what a replay holds is the classifier's state; of the verdict lines it wrote it keeps each
    device's last outcome for the summary (one tuple per distinct outcome, shared), and the timeline of
    every change only when a plot asks for it."""
    from otel_dra.policy import load
    from otel_dra.replay import replay, summary_rows

    out = io.StringIO()
    result = replay([trace], load(), out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == result.verdict_lines > len(result.final) == 12
    assert not result.timeline
    outcomes = list(result.final.values())
    assert len({id(o) for o in outcomes}) == len(set(outcomes)) < len(outcomes)
    last = {(v["k8s.node.name"], v["hw.id"]): (v["health"], v["hw.state"], tuple(v["reasons"])) for v in lines}
    assert result.final == last
    plotted = replay([trace], load(), io.StringIO(), timeline=True)
    assert sum(map(len, plotted.timeline.values())) == result.verdict_lines
    assert summary_rows(plotted) == summary_rows(result)
