"""Issue #16, "who may speak for a node", against a real ``otel-dra fleet``: it listens on the loopback
unless told otherwise, and with ``--auth-token-file`` the forged POST (a node's own request replayed
with gpu-0's uncorrected-ECC counter raised) no longer makes the GPU Unhealthy."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

from tests.conftest import REPO, FleetProcess, free_port, http_get, wait_for
from tests.unit.receivers.test_receiver_auth import forged
from tests.unit.receivers.test_receiver_otlp import Agent, post

pytestmark = pytest.mark.e2e

TOKEN = "fleet-token-for-the-e2e-test"


def start_fleet(tmp_path: Path, *args: str) -> FleetProcess:
    """``otel-dra fleet`` with no ``--host``: where it binds is its default's doing. Its state file is the
    test's own (the default one outlives the test: a GPU made Unhealthy here would be recalled)."""
    ports = {"grpc": free_port(), "http": free_port(), "prom": free_port()}
    argv = [sys.executable, "-m", "otel_dra", "fleet", "--otlp-grpc-port", str(ports["grpc"])]
    argv += ["--otlp-http-port", str(ports["http"]), "--prometheus-port", str(ports["prom"])]
    argv += ["--sample-interval", "1", "--evaluate-every", "1", "--state-dir", str(tmp_path / "state"), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    log = tmp_path / "fleet.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    fleet = FleetProcess(ports, proc, log)
    wait_for(lambda: http_get(fleet.url + "/healthz", 1)[0] == 200 or proc.poll() is not None, 30, "the fleet")
    assert proc.poll() is None, log.read_text()
    return fleet


def non_loopback_address() -> str | None:
    """This machine's address on its network (the one a route out would use), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def listening(port: int) -> set[str]:
    """The local addresses a socket listens on at ``port`` (/proc/net/tcp and tcp6; IPv4-mapped ones as IPv4)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # LISTEN
                raw = bytes.fromhex(address)
                if len(raw) == 4:
                    found.add(socket.inet_ntoa(raw[::-1]))
                    continue
                v6 = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four host-order words
                mapped = v6[:12] == b"\0" * 10 + b"\xff\xff"  # ::ffff:a.b.c.d, as gRPC binds 127.0.0.1
                found.add(socket.inet_ntoa(v6[12:]) if mapped else socket.inet_ntop(socket.AF_INET6, v6))
    return found


def test_the_fleet_binds_the_loopback_by_default(tmp_path):
    fleet = start_fleet(tmp_path)
    try:
        if Path("/proc/net/tcp").exists():
            for name, port in fleet.ports.items():
                assert listening(port) == {"127.0.0.1"}, (name, listening(port))
        other = non_loopback_address()
        if other is not None:
            for port in fleet.ports.values():
                with pytest.raises(OSError), socket.create_connection((other, port), timeout=2):
                    pass
        assert http_get(fleet.url + "/healthz")[0] == 200
        assert "on 127.0.0.1:" in fleet.log.read_text()
    finally:
        fleet.stop()


def devices(fleet: FleetProcess) -> dict[str, tuple[str, list[str]]]:
    return {
        d["hw.id"]: (d["health"], d["reasons"])
        for d in json.loads(http_get(fleet.url + "/v1/devices")[1])["devices"]
        if d["k8s.node.name"] == "node-0002"
    }


def test_the_forged_post_without_the_token_does_not_make_the_gpu_unhealthy(tmp_path):
    """The issue's probe: node-0002's own request, replayed with gpu-0's uncorrected-ECC counter raised
    by one, sent without a token (and with a wrong one). Refused: gpu-0 stays Healthy. The same request
    with the token is taken, and does make it Unhealthy: the token is what stopped it."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    fleet = start_fleet(tmp_path, "--auth-token-file", str(token_file))
    port = fleet.ports["http"]
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    agent = Agent("node-0002", devices=2)
    try:
        last = None

        def push() -> None:
            nonlocal last
            _, data = agent.sample(time.time_ns())
            last = encode_metrics(data)
            assert post(port, last.SerializeToString(), **bearer)[0] == 200

        def healthy() -> bool:
            push()
            seen = devices(fleet)
            return len(seen) == 2 and all(health == "Healthy" for health, _ in seen.values())

        wait_for(healthy, 30, "node-0002 Healthy at the fleet", every=1.0)
        assert last is not None
        attack = forged(last, 0.5).SerializeToString()
        assert post(port, attack)[0] == 401
        assert post(port, attack, Authorization="Bearer not-the-token")[0] == 401
        for _ in range(4):  # the fleet evaluates every second
            time.sleep(1.0)
            push()
            assert devices(fleet)["gpu-0"] == ("Healthy", []), "the forged request got in"
        metrics = http_get(fleet.url + "/metrics")[1].decode()
        counted = (
            r'^otel_dra_receiver_requests_total\{[^}]*outcome="unauthenticated"[^}]*transport="http"[^}]*\} 2(\.0)?$'
        )
        assert re.search(counted, metrics, re.M), "two unauthenticated requests counted"
        # The control: the same forgery from a token holder is taken, and it is the attack.
        assert post(port, forged(last, 0.5).SerializeToString(), **bearer)[0] == 200
        wait_for(lambda: devices(fleet)["gpu-0"][0] == "Unhealthy", 20, "the token holder's report")
        assert "memory_ecc" in devices(fleet)["gpu-0"][1]
        log = fleet.log.read_text()
        assert log.count("unauthenticated request from") == 2 and "Traceback" not in log
    finally:
        agent.close()
        fleet.stop()


def test_an_unauthenticated_flood_takes_none_of_the_node_cap(tmp_path):
    """Issue #28: after 100,000 fake nodes, honest new nodes were refused ("more than 16,384 nodes"). With
    ``--auth-token-file`` a request is refused before it is decoded, so a flood without the token (here 200
    fake nodes over OTLP/HTTP and gRPC against a cap of 3) fills nothing: three honest nodes still get in."""
    import grpc

    from tests.e2e.test_e2e_attacks import EXPORT, node, request

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    fleet = start_fleet(tmp_path, "--auth-token-file", str(token_file), "--max-nodes", "3")
    port, bearer = fleet.ports["http"], {"Authorization": f"Bearer {TOKEN}"}
    try:
        for batch in range(10):
            flood = request([node(f"fake-{batch}-{i}") for i in range(10)]).SerializeToString()
            assert post(port, flood)[0] == 401
            with grpc.insecure_channel(f"127.0.0.1:{fleet.ports['grpc']}") as channel:
                call = channel.unary_unary(EXPORT)
                with pytest.raises(grpc.RpcError) as refused:
                    call(flood, timeout=5)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        honest = request([node(f"honest-{i}", devices=2) for i in range(3)]).SerializeToString()
        assert post(port, honest, **bearer)[0] == 200
        seen = lambda: {d["k8s.node.name"] for d in json.loads(http_get(fleet.url + "/v1/devices")[1])["devices"]}  # noqa: E731
        wait_for(lambda: seen() == {"honest-0", "honest-1", "honest-2"}, 20, "the three honest nodes")
        over = request([node("honest-3")]).SerializeToString()  # the cap still holds for those who may speak
        status, body = post(port, over, **bearer)
        assert status == 200 and b"more than 3 nodes" in body, body
    finally:
        fleet.stop()
