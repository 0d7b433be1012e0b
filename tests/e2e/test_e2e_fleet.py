"""The whole fleet pipeline for real: agents push OTLP to a collector (rotel), which forwards to
`otel-dra fleet`, which a real Prometheus scrapes."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests.conftest import http_get, spawn_fleet, spawn_rotel, stop_rotel, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def fleet_process(tmp_path, request):
    """`otel-dra fleet` on free loopback ports (with the policy text a test passes as the fixture's param)."""
    policy: list[str] = []
    if getattr(request, "param", None):
        (tmp_path / "policy.yaml").write_text(request.param)
        policy = ["--policy", str(tmp_path / "policy.yaml")]
    fleet = spawn_fleet(tmp_path, *policy)
    yield fleet.ports, fleet.url, fleet.proc
    fleet.stop()


@pytest.fixture
def forwarding_collector(tmp_path, fleet_process):
    """rotel receiving OTLP from the agents and exporting it over OTLP/gRPC to the fleet."""
    ports, _, _ = fleet_process
    exporter = (
        "--exporter",
        "otlp",
        "--otlp-exporter-endpoint",
        f"http://127.0.0.1:{ports['grpc']}",
        "--otlp-exporter-protocol",
        "grpc",
        "--batch-timeout",
        "100ms",
    )
    collector = spawn_rotel(tmp_path, "forward", exporter)
    yield collector.grpc_endpoint
    stop_rotel(collector)


def test_agents_through_a_collector_to_the_fleet_and_prometheus(
    start_agent, start_prometheus, fleet_process, forwarding_collector
):
    _, fleet_url, _ = fleet_process
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{forwarding_collector}", "OTEL_METRIC_EXPORT_INTERVAL": "1000"}
    start_agent("--interval", "1", "--node-name", "node-1", "--prometheus-port", "0", env=env, wait=False)
    start_agent("--interval", "1", "--node-name", "node-2", "--fault", "gpu-4:memory_ecc@3", env=env, wait=False)
    prom = start_prometheus([fleet_url.removeprefix("http://")])

    def devices() -> list[dict]:
        return json.loads(http_get(fleet_url + "/v1/devices")[1])["devices"]

    wait_for(lambda: len(devices()) == 16, 40, "every device of both nodes at the fleet")
    wait_for(
        lambda: (
            {
                (r["metric"]["hw_id"], r["metric"]["dra_pool_name"])
                for r in prom.query('hw_status{hw_state="failed"} == 1')
            }
            == {("gpu-4", "node-2")}
        ),
        60,
        "node-2's gpu-4 failed in Prometheus",
    )
    ok = prom.query('hw_status{hw_state="ok"} == 1')
    assert len(ok) == 15
    first = devices()[0]
    assert (first["k8s.node.name"], first["hw.id"], first["health"]) == ("node-2", "gpu-4", "Unhealthy")
    assert first["reasons"] == ["memory_ecc"]


@pytest.mark.parametrize("fleet_process", ["stale_timeout: 10s\n"], indirect=True)  # silence is judged sooner
def test_alerts_stay_quiet_when_only_the_collector_fails(tmp_path, start_agent, forwarding_collector, fleet_process):
    """The collector between the agents and the fleet dies: telemetry stops arriving from the agents'
    side, and every device must read Unknown (stale), none Unhealthy (issue #7's collector check)."""
    _, fleet_url, _ = fleet_process
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{forwarding_collector}", "OTEL_METRIC_EXPORT_INTERVAL": "1000"}
    start_agent("--interval", "1", "--node-name", "node-1", env=env, wait=False)
    start_agent("--interval", "1", "--node-name", "node-2", env=env, wait=False)

    def devices() -> list[dict]:
        return json.loads(http_get(fleet_url + "/v1/devices")[1])["devices"]

    wait_for(lambda: len(devices()) == 16 and all(d["health"] == "Healthy" for d in devices()), 40, "a healthy fleet")
    subprocess.run(["pkill", "-f", f"otlp-grpc-endpoint {forwarding_collector}"], check=False)  # the collector dies
    # The fleet's stale timeout is the policy's (10 s here), or twice the sampling interval, whichever is longer.
    unknown = wait_for(lambda: [d for d in devices() if d["health"] == "Unknown"], 60, "the fleet to see silence")
    final = wait_for(
        lambda: (lambda ds: ds if all(d["health"] == "Unknown" for d in ds) else None)(devices()),
        30,
        "every device Unknown",
    )
    assert unknown and len(final) == 16
    assert all(d["reasons"] == ["stale"] and d["hw.state"] is None for d in final)
    assert "Unhealthy" not in http_get(fleet_url + "/v1/devices")[1].decode()
    # A collector comes back on the same address: the agents' queues deliver the outage's samples, oldest
    # first, and the Unknown clears by itself: no alarm stays, none is raised on the way. How long that
    # takes is bounded by the queue's backoff (at most 18 s between attempts), one failed attempt of the
    # exporter (its 10 s timeout), and the backlog's drain (about one collection per second of outage).
    ports, _, _ = fleet_process
    forward = ("--exporter", "otlp", "--otlp-exporter-endpoint", f"http://127.0.0.1:{ports['grpc']}", "--batch-timeout")
    back = spawn_rotel(tmp_path, "back", (*forward, "100ms"), int(forwarding_collector.split(":")[1]))
    try:
        seen: list[dict] = []
        last: list[object] = []

        def all_back() -> bool:
            now = devices()
            seen.extend(now)
            last[:] = sorted({(d["k8s.node.name"], d["health"], *d["reasons"]) for d in now})
            return len(now) == 16 and all(d["health"] == "Healthy" and not d["reasons"] for d in now)

        try:
            wait_for(all_back, 120, "the fleet to see every device Healthy again")
        except AssertionError as exc:
            logs = sorted([*tmp_path.glob("*.log"), *tmp_path.glob("*.out")])
            tails = {p.name: p.read_text(errors="replace").splitlines()[-4:] for p in logs}
            raise AssertionError(f"{exc}; (node, health, reasons): {last}; log tails: {tails}") from None
        assert not [d for d in seen if d["health"] == "Unhealthy"]
    finally:
        stop_rotel(back)


def test_an_agent_restart_raises_no_false_alarm(start_agent, fleet_process):
    """An agent killed and restarted: its counters restart (not errors), and the short gap is neither a
    lost device nor a fault; the fleet's verdicts stay Healthy throughout (issue #7's restart check)."""
    ports, fleet_url, _ = fleet_process
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['grpc']}", "OTEL_METRIC_EXPORT_INTERVAL": "1000"}
    args = ("--interval", "1", "--node-name", "node-r", "--seed", "7")

    def devices() -> list[dict]:
        return json.loads(http_get(fleet_url + "/v1/devices")[1])["devices"]

    first = start_agent(*args, env=env)
    wait_for(lambda: len(devices()) == 8, 30, "the agent's devices at the fleet")
    time.sleep(5)  # windows with some history, so a counter going down is judged against it
    first.stop(signal.SIGKILL)  # no flush, no goodbye
    time.sleep(3)
    start_agent(*args, env=env)
    seen: list[dict] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        seen.extend(devices())
        time.sleep(0.5)
    assert len({d["hw.id"] for d in seen}) == 8
    bad = [
        (d["hw.id"], d["health"], d["hw.state"], d["reasons"]) for d in seen if d["health"] != "Healthy" or d["reasons"]
    ]
    assert not bad, bad
