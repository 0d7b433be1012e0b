"""The collector goes away and comes back: the agent keeps serving, holds no growing backlog, and
its push resumes on its own (issue #7's collector fault, first slice)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import free_port, http_get, parse_rotel_debug, spawn_rotel, stop_rotel, wait_for

pytestmark = pytest.mark.e2e


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_push_survives_a_collector_outage(start_agent, tmp_path):
    grpc_port = free_port()
    collector = spawn_rotel(tmp_path, "before", grpc_port=grpc_port)
    out = collector.out
    agent = start_agent(
        "--interval",
        "1",
        "--otlp-endpoint",
        f"http://127.0.0.1:{grpc_port}",
        "--otlp-interval",
        "1",
        "--node-name",
        "node-o",
    )
    wait_for(lambda: any(p.metric == "hw.power" for p in parse_rotel_debug(out.read_text())), 20, "the first push")
    stop_rotel(collector)
    # The collector is gone for a while: the agent keeps serving its own endpoint and verdicts...
    time.sleep(3)
    before = rss_kb(agent.proc.pid)
    for _ in range(8):
        status, body = http_get(agent.url + "/metrics")
        assert status == 200 and b"hw_power_watts{" in body
        assert http_get(agent.url + "/healthz")[0] == 200
        time.sleep(1)
    # ...holds no growing backlog (cumulative metrics: each push carries the newest totals, nothing queues)...
    grown_kb = rss_kb(agent.proc.pid) - before
    assert grown_kb < 8 * 1024, f"RSS grew {grown_kb} kB during an 8 s outage"
    assert agent.proc.poll() is None
    # ...and its push resumes on its own once a collector listens there again.
    collector = spawn_rotel(tmp_path, "after", grpc_port=grpc_port)
    out = collector.out
    try:
        wait_for(lambda: any(p.metric == "hw.power" for p in parse_rotel_debug(out.read_text())), 40, "push to resume")
        points = parse_rotel_debug(out.read_text())
        assert {p.resource["k8s.node.name"] for p in points} == {"node-o"}
        assert "Traceback" not in agent.logs()
    finally:
        stop_rotel(collector)
