"""`otel-dra fleet --k8s-apply` as the cluster's one DeviceTaintRule writer: two real fleet processes,
fed the same telemetry over real OTLP/HTTP, against the fake API server (real HTTP, the apiserver's
concurrency and schema rules). What a kube-apiserver would add (watch caches, RBAC, admission) is not
here; `deploy/kubernetes/fleet` carries the RBAC, checked against the official schemas in test_deploy.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter

import pytest

from otel_dra.faults import Fault
from otel_dra.frame import Schema
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from tests.conftest import REPO, FleetProcess, http_get, spawn_fleet, wait_for
from tests.support.fake_apiserver import FakeApiServer, write_kubeconfig
from tests.support.otlp_trace import request

pytestmark = pytest.mark.e2e
LEASE = {"duration": 3.0, "renew": 2.0, "retry": 0.5}
SHARED_POOL = "shared"


class Pusher:
    """Every node's telemetry, once a second, to every fleet replica (as a Collector fanning out
    to each replica does). ``gpu-0`` of the nodes added with ``shared`` is one device (pool ``shared``)."""

    def __init__(self, fleets: list[FleetProcess]) -> None:
        self.fleets = fleets
        self.sources: dict[str, SimulatedSource] = {}
        self.shared: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def add_node(self, node: str, faults: tuple[Fault, ...] = (), shared: bool = False) -> None:
        # Fault times count from the node's first push, not from now: a device's first sample is a baseline
        # (the contract, section 2), so an error pushed in it would be history, not news. (From now, a push
        # loop slowed by a busy machine made a memory_ecc fault at 1 s part of n2's first sample.)
        config = SimulatorConfig(node, devices=2, faults=faults, seed=len(self.sources))
        with self._lock:
            self.sources[node] = SimulatedSource(config, Schema())
            if shared:
                self.shared.add(node)

    def _body(self, node: str, src: SimulatedSource) -> bytes:
        doc = request(src.read(time.time_ns()), src.schema)
        if node not in self.shared:
            return json.dumps(doc).encode()
        for rm in doc["resourceMetrics"]:
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    for kind in ("gauge", "sum"):
                        for point in metric.get(kind, {}).get("dataPoints", []):
                            attrs = {a["key"]: a for a in point["attributes"]}
                            if attrs.get("hw.id", {}).get("value", {}).get("stringValue") == "gpu-0":
                                attrs["dra.pool.name"]["value"] = {"stringValue": SHARED_POOL}
        return json.dumps(doc).encode()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                bodies = [self._body(node, src) for node, src in self.sources.items()]
            for fleet in self.fleets:
                if fleet.proc.poll() is not None:
                    continue
                for body in bodies:
                    req = urllib.request.Request(
                        f"http://127.0.0.1:{fleet.ports['http']}/v1/metrics",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    )
                    with contextlib.suppress(OSError):  # a replica that is down misses it, as from a Collector
                        urllib.request.urlopen(req, timeout=5).read()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def cluster(tmp_path):
    api = FakeApiServer()
    yield api, {"KUBECONFIG": str(write_kubeconfig(api, tmp_path))}
    api.close()


def writer_args(tmp_path) -> tuple[str, ...]:
    # A device that stops reporting is device_lost after the stale timeout: 2 s instead of 60.
    (tmp_path / "policy.yaml").write_text("stale_timeout: 2s\n")
    return (
        "--policy",
        str(tmp_path / "policy.yaml"),
        "--k8s-apply",
        "--leader-elect-lease-duration",
        str(LEASE["duration"]),
        "--leader-elect-renew-deadline",
        str(LEASE["renew"]),
        "--leader-elect-retry-period",
        str(LEASE["retry"]),
        "--leader-elect-resource-namespace",
        "otel-dra",
    )


def devices(fleet: FleetProcess) -> list[dict]:
    code, body = http_get(fleet.url + "/v1/devices", 2)
    return json.loads(body)["devices"] if code == 200 else []


def rules_by_device(api: FakeApiServer) -> set[tuple[str, str, str]]:
    with api.lock:
        found = set()
        for obj in api.objects.values():
            sel = obj["spec"]["deviceSelector"]
            found.add((sel["pool"], sel["device"], obj["spec"]["taint"]["key"].rsplit("/", 1)[1]))
        return found


def test_two_replicas_elect_one_writer_and_a_killed_leader_hands_over_within_one_lease_duration(tmp_path, cluster):
    api, env = cluster
    fleets = {
        name: spawn_fleet(tmp_path, *writer_args(tmp_path), env={**env, "POD_NAME": name}, name=name)
        for name in ("fleet-a", "fleet-b")
    }
    pusher = Pusher(list(fleets.values()))
    # The shared device is lost as n1 sees it and healthy as n2 sees it: one rule, per combine.
    pusher.add_node("n1", (Fault("gpu-0", "device_lost", 2.0),), shared=True)
    pusher.add_node("n2", shared=True)
    pusher.start()
    try:
        wait_for(lambda: (SHARED_POOL, "gpu-0", "device_lost") in rules_by_device(api), 30, "the shared device's rule")
        time.sleep(2 * LEASE["retry"] + 1.0)  # a few renewals and evaluation ticks more
        assert rules_by_device(api) == {(SHARED_POOL, "gpu-0", "device_lost")}
        leader = api.lease()["spec"]["holderIdentity"]
        standby = ({"fleet-a", "fleet-b"} - {leader}).pop()
        writers = {w.user_agent for w in api.rule_writes()}
        assert writers == {f"otel-dra/0.1.0 (fleet; {leader})"}, writers  # only the leader wrote
        for fleet in fleets.values():  # both hold the whole view: the standby can take over at once
            shared = [d for d in devices(fleet) if d["hw.id"] == "gpu-0" and d["k8s.node.name"] == "n1"]
            assert shared and shared[0]["health"] == "Unhealthy", devices(fleet)

        # kill -9 the leader: no release, the standby must wait the lease out, and no longer.
        os.kill(fleets[leader].proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        fleets[leader].proc.wait(5)
        pusher.add_node("n3", (Fault("gpu-1", "device_lost", 2.0),))
        wait_for(lambda: ("n3", "gpu-1", "device_lost") in rules_by_device(api), 30, "the new leader's rule")
        took_over = min(
            w.at
            for w in api.writes
            if w.kind == "leases" and standby in w.user_agent and w.status == 200 and w.body
            if w.body["spec"].get("holderIdentity") == standby
        )
        assert took_over - killed <= LEASE["duration"] + 0.5, took_over - killed  # + scheduling slack
        assert api.lease()["spec"]["holderIdentity"] == standby
        assert api.lease()["spec"]["leaseTransitions"] == 1
        time.sleep(2.0)
    finally:
        pusher.stop()
        for fleet in fleets.values():
            if fleet.proc.poll() is None:
                fleet.stop()
    # None lost, none written twice: each rule created once, never refused, never rewritten by the new leader.
    assert rules_by_device(api) == {(SHARED_POOL, "gpu-0", "device_lost"), ("n3", "gpu-1", "device_lost")}
    writes = api.rule_writes()
    assert all(w.status in (200, 201) for w in writes), [(w.verb, w.name, w.status) for w in writes]
    assert Counter(w.name for w in writes if w.verb == "POST") == Counter(api.objects.keys())
    after = [w for w in writes if w.at > killed]
    assert after and {w.user_agent for w in after} == {f"otel-dra/0.1.0 (fleet; {standby})"}
    assert [w.verb for w in after] == ["POST"]  # the shared device's rule was left as it was
    log = (tmp_path / f"{standby}.log").read_text()
    assert "became the leader" in log and "DeviceTaintRules: resource.k8s.io/v1" in log
    assert "released lease" in log  # the standby's clean exit handed the Lease back
    # The audit trail: one Event per rule created, each from the replica that wrote it, all taken by the server
    # (which checks the events.k8s.io/v1 schema and the API server's own Event rules).
    events = api.event_list("default")
    assert sorted(e["regarding"]["name"] for e in events) == sorted(api.objects), events
    assert {e["reason"] for e in events} == {"DeviceTainted"}
    assert {e["reportingInstance"] for e in events} == {leader, standby}
    assert all(w.status == 201 for w in api.writes if w.kind == "events")


def test_without_a_cluster_fleet_k8s_apply_is_a_one_line_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KUBE"))}
    env["KUBECONFIG"] = str(tmp_path / "missing")
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "fleet", "--k8s-apply", "--prometheus-port", "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "--k8s-apply: no Kubernetes cluster to talk to" in line and "set KUBECONFIG" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--k8s-output", "/tmp/x"), "--k8s-output needs --k8s-apply"),
        (("--k8s-apply", "--leader-elect-renew-deadline", "20"), "must be greater than --leader-elect-renew-deadline"),
    ],
)
def test_fleet_writer_flags_that_cannot_work_are_usage_errors(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "fleet", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_silence_does_not_repair_a_collector_outage_keeps_every_noexecute_rule_and_adds_stale(tmp_path, cluster):
    """Issue #27: failed GPUs held NoExecute taints; the Collector went down for longer than the stale timeout and
    every device turned Unknown (stale). The writer used to delete every rule; it keeps them and adds stale."""
    api, env = cluster
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "stale_timeout: 2s\n"
        "kubernetes:\n"
        "  taints: {effect: {by_state: {failed: NoExecute}}}\n"
        "  budget: {share: 1.0, no_execute_share: 1.0}\n"
    )
    args = ["--policy", str(policy), "--k8s-apply", "--no-leader-elect"]
    fleet = spawn_fleet(tmp_path, *args, env=env)
    pusher = Pusher([fleet])
    pusher.add_node("n1", (Fault("gpu-0", "memory_ecc", 2.0),))
    pusher.add_node("n2", (Fault("gpu-1", "memory_ecc", 2.0),))
    pusher.start()
    failed = {("n1", "gpu-0", "memory_ecc"), ("n2", "gpu-1", "memory_ecc")}
    try:
        wait_for(lambda: failed <= rules_by_device(api), 30, "the failed devices' NoExecute rules")
        held = {name: obj["spec"]["taint"]["effect"] for name, obj in api.objects.items()}
        assert set(held.values()) == {"NoExecute"}, held
        pusher.stop()  # the Collector goes down
        outage = time.monotonic()
        every = {(n, g, "stale") for n in ("n1", "n2") for g in ("gpu-0", "gpu-1")}
        wait_for(lambda: every <= rules_by_device(api), 30, "stale beside the held rules")
        time.sleep(3.0)  # more evaluations and resyncs in the outage
        with api.lock:
            now = {name: obj["spec"]["taint"]["effect"] for name, obj in api.objects.items()}
        assert {name: now.get(name) for name in held} == held  # every NoExecute rule kept, as it was
        assert rules_by_device(api) == failed | every
        touched = [w for w in api.rule_writes() if w.at > outage and w.name in held]
        assert not touched, [(w.verb, w.name) for w in touched]  # neither deleted nor rewritten
    finally:
        if fleet.proc.poll() is None:
            fleet.stop()


def test_a_sigterm_during_a_taint_write_still_writes_the_state_file(tmp_path, cluster):
    """Issue #27: a SIGTERM while a DeviceTaintRule write hung used up the shutdown budget, and fleet.json was left
    11-27 s old. The state file is written first at shutdown, whatever the writer is waiting for."""
    api, env = cluster
    state = tmp_path / "state"
    fleet = spawn_fleet(tmp_path, *writer_args(tmp_path), "--no-leader-elect", "--state-dir", str(state), env=env)
    pusher = Pusher([fleet])
    pusher.add_node("n1")
    pusher.start()
    try:
        wait_for(lambda: (state / "fleet.json").exists(), 20, "the fleet's state file")
        api.rule_write_delay_s = 30.0  # the API server stops answering writes
        pusher.add_node("n2", (Fault("gpu-1", "memory_ecc", 1.0),))
        wait_for(lambda: api.rule_writes_waiting > 0, 30, "a DeviceTaintRule write in flight")
        time.sleep(2.5)  # past the state file's last write after a change (1 s)
        pusher.stop()
        before = (state / "fleet.json").stat().st_mtime
        signalled = time.time()
        fleet.proc.send_signal(signal.SIGTERM)
        fleet.proc.wait(15)
        after = (state / "fleet.json").stat().st_mtime
        assert after > before and after >= signalled - 0.5, (before, signalled, after)
        held = json.loads((state / "fleet.json").read_text())["devices"]
        assert any(d["node"] == "n2" and d["id"] == "gpu-1" and d["reasons"]["memory_ecc"]["on"] for d in held)
        assert time.time() - signalled < 10  # and it still exits within its budget
    finally:
        api.rule_write_delay_s = 0.0
        pusher.stop()
        if fleet.proc.poll() is None:
            fleet.stop()
