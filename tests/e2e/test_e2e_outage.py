"""The collector goes away and comes back: the agent keeps serving, queues what it could not push
within its stated bound, and once a collector listens again sends it, oldest first, so the
collector sees the outage's samples too (issue #7's collector fault)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import free_port, http_get, parse_rotel_debug, spawn_rotel, stop_rotel, wait_for
from tests.unit.sinks.test_kubelet_stream import Watch, health_of, pb

pytestmark = pytest.mark.e2e


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_push_survives_a_collector_outage(start_agent, tmp_path, sock_dir):
    grpc_port = free_port()
    collector = spawn_rotel(tmp_path, "before", grpc_port=grpc_port)
    out = collector.out
    socket_path = sock_dir / "dra.sock"
    agent = start_agent(
        "--interval",
        "1",
        "--otlp-endpoint",
        f"http://127.0.0.1:{grpc_port}",
        "--otlp-interval",
        "1",
        "--node-name",
        "node-o",
        "--kubelet-socket",
        str(socket_path),
        "--fault",
        "gpu-2:memory_ecc@8",
        "--kubelet-health-timeout",
        "3",
    )
    wait_for(lambda: any(p.metric == "hw.power" for p in parse_rotel_debug(out.read_text())), 20, "the first push")
    stop_rotel(collector)
    down_from = time.time_ns()
    # The collector is gone for a while: the agent keeps serving its own endpoint and verdicts...
    time.sleep(3)
    before = rss_kb(agent.proc.pid)
    for _ in range(8):
        status, body = http_get(agent.url + "/metrics")
        assert status == 200 and b"hw_power_watts{" in body
        assert http_get(agent.url + "/healthz")[0] == 200
        time.sleep(1)
    # ...and the kubelet's stream: a kubelet connecting now gets the list, and gpu-2's ECC fault reaches it...
    watch = Watch(str(socket_path))
    try:
        _, first = watch.next(5.0)
        assert len(first.devices) == 8
        watch.until(lambda m: health_of(m).get("gpu-2") == pb.UNHEALTHY, 30.0)
    finally:
        watch.close()
    # ...queues the pushes it could not make, within the bound (8 GPUs: ~300 points a push, ~210 bytes each)...
    queued = re.search(rb"^otel_dra_push_queue_size(?:\{[^}]*\})? (\S+)$", http_get(agent.url + "/metrics")[1], re.M)
    assert queued and float(queued.group(1)) > 0
    grown_kb = rss_kb(agent.proc.pid) - before
    assert grown_kb < 8 * 1024, f"RSS grew {grown_kb} kB during an 8 s outage"
    assert agent.proc.poll() is None
    # ...and once a collector listens there again, its push resumes by itself and the queue goes out,
    # oldest first: the collector gets the samples taken while it was away.
    up_at = time.time_ns()
    collector = spawn_rotel(tmp_path, "after", grpc_port=grpc_port)
    out = collector.out

    def outage_samples() -> set[int]:
        points = parse_rotel_debug(out.read_text())
        return {p.time_unix_nano for p in points if p.metric == "hw.power" and down_from < p.time_unix_nano < up_at}

    try:
        wait_for(lambda: len(outage_samples()) >= 8, 60, "the outage's samples at the new collector")
        points = parse_rotel_debug(out.read_text())
        assert {p.resource["k8s.node.name"] for p in points} == {"node-o"}
        stamps = [p.time_unix_nano for p in points if p.metric == "hw.power" and p.attrs["hw.id"] == "gpu-0"]
        assert stamps == sorted(stamps), "queued pushes go out oldest first"
        assert "Traceback" not in agent.logs()
    finally:
        stop_rotel(collector)
