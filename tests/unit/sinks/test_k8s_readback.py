"""DeviceTaintRule status read back (Kubernetes 1.35+): what the cluster's device-taint controller says a rule
did, or with effect None would do under NoExecute, beside the device's verdict: ``/v1/devices``, ``otel-dra
status`` and ``otel_dra.k8s.taint.pods``. Against the fake API server, which writes the ``EvictionInProgress``
condition in the controller's words (pkg/controller/devicetainteviction, maybeUpdateRuleStatus) and keeps
status out of the writer's reach as the registry's strategy does; every object checked against the real
OpenAPI schema."""

from __future__ import annotations

import json

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_dra import policy as policy_mod
from otel_dra.classifier import Verdict
from otel_dra.cli.cmd_status import device_table
from otel_dra.sinks.k8s import readback
from otel_dra.sinks.k8s.sink import new_k8s_sink as K8sOutputSink
from otel_dra.state.board import VerdictBoard
from tests.support.fake_apiserver import FakeApiServer, schema_problem

DRIVER = "gpu.nvidia.com"


def rule(api: FakeApiServer, effect: str, device: str = "gpu-0", generation: int = 1) -> dict:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"r-{device}-{effect.lower()}", "uid": f"u-{device}-{effect}", "generation": generation},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": "node-1", "device": device},
            "taint": {"key": "health.otel-dra.io/memory_ecc", "value": "failed", "effect": effect},
        },
    }
    api._condition(obj)
    assert schema_problem(obj, api.kubernetes) is None, schema_problem(obj, api.kubernetes)
    return obj


def test_the_controllers_words_read_back() -> None:
    api = FakeApiServer()
    try:
        api.pods[(DRIVER, "node-1", "gpu-0")] = [("ml", "trainer-0"), ("ml", "trainer-1"), ("infer", "svc-0")]
        api.pods[(DRIVER, "node-1", "gpu-1")] = [("ml", "solo")]
        none = readback.read(rule(api, "None"))
        assert none is not None and (none.reason, none.in_progress) == ("NoEffect", False)
        assert (none.would_evict, none.allocated, none.pending, none.evicted) == (3, 1, None, None)
        assert "3 pods would be evicted in 2 different namespaces if the effect was NoExecute" in none.message
        one = readback.read(rule(api, "None", "gpu-1"))
        assert one is not None and one.would_evict == 1 and "1 pod would be evicted in 1 namespace " in one.message
        pending = readback.read(rule(api, "NoExecute"))
        assert pending is not None and (pending.reason, pending.in_progress, pending.pending) == (
            "PodsPendingEviction",
            True,
            3,
        )
        other = readback.read(rule(api, "NoSchedule"))
        assert other is not None and other.reason == "OtherEffect" and other.would_evict is None
        # The condition of an older spec is said to be so.
        stale = rule(api, "None")
        stale["metadata"]["generation"] = 2
        assert readback.read(stale).current is False  # type: ignore[union-attr]
        assert readback.would_evict([readback.read(stale)]) is None  # type: ignore[list-item]
        assert readback.read({"metadata": {"name": "x"}, "spec": {}}) is None  # before 1.35: no status
    finally:
        api.close()


def verdict(device: str, health: str = "Unhealthy") -> Verdict:
    failed = health == "Unhealthy"
    return Verdict(
        1,
        "node-1",
        device,
        health,
        "failed" if failed else "ok",
        ("memory_ecc",) if failed else (),
        "reset_device" if failed else "none",
        "memory_ecc: uncorrected ECC errors: 1 in 5m" if failed else "",
        pool="node-1",
        device=device,
    )


def writer(api: FakeApiServer, board: VerdictBoard, policy_text: str, tmp_path) -> K8sOutputSink:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text)
    sink = K8sOutputSink(board, None, policy_mod.load(path), apply_rules=True, name="cluster writer")
    sink.render()
    return sink


def test_the_writer_shows_what_noexecute_would_evict_and_then_what_it_did(api, tmp_path) -> None:
    board = VerdictBoard()
    board.update([verdict("gpu-0"), verdict("gpu-1", "Healthy")], lambda n, h: {"dra.driver.name": DRIVER})
    api.pods[(DRIVER, "node-1", "gpu-0")] = [("ml", "trainer-0"), ("ml", "trainer-1"), ("infer", "svc-0")]
    api.pods[(DRIVER, "node-1", "gpu-1")] = [("ml", "other")]
    sink = writer(api, board, "", tmp_path)  # the default policy: effect None, facts only
    reader = InMemoryMetricReader()
    sink.instrument(MeterProvider(metric_readers=[reader]).get_meter("t"))
    assert sink.reconcile(force=True)  # creates the rule; the controller answers
    assert sink.reconcile(force=True)  # the next list reads its status back
    [obj] = api.objects.values()
    assert schema_problem(obj, api.kubernetes) is None
    devices = {d["hw.id"]: d for d in json.loads(board.json_route()[2])["devices"]}
    cluster = devices["gpu-0"]["cluster"]
    assert cluster["would_evict_pods"] == 3, cluster
    [taint] = cluster["taints"]
    assert taint["effect"] == "None" and taint["condition"]["reason"] == "NoEffect" and taint["condition"]["current"]
    assert "cluster" not in devices["gpu-1"]  # no rule, nothing said
    points = {
        (p.attributes["dra.device.name"], p.attributes["eviction"]): p.value
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "otel_dra.k8s.taint.pods"
        for p in m.data.data_points
    }
    assert points == {("gpu-0", "would"): 3}
    table = device_table(json.loads(board.json_route()[2]), "http://fleet")
    assert "would evict" in [c.header for c in table.columns]
    assert "3 pods" in [str(cell) for c in table.columns for cell in c.cells]

    # The operator moves the reason to NoExecute: the controller evicts, and the writer reads that back too.
    sink = writer(api, board, "kubernetes: {taints: {effect: {by_reason: {memory_ecc: NoExecute}}}}\n", tmp_path)
    sink.instrument(MeterProvider(metric_readers=[reader := InMemoryMetricReader()]).get_meter("t"))
    assert sink.reconcile(force=True) and sink.reconcile(force=True)
    [taint] = json.loads(board.json_route()[2])["devices"][0]["cluster"]["taints"]
    assert (taint["effect"], taint["condition"]["reason"], taint["pods_pending_eviction"]) == (
        "NoExecute",
        "PodsPendingEviction",
        3,
    )
    assert api.evict() == 3
    assert sink.reconcile(force=True)
    [taint] = json.loads(board.json_route()[2])["devices"][0]["cluster"]["taints"]
    assert (taint["condition"]["reason"], taint["pods_evicted"]) == ("Completed", 3)
    assert "3 pods evicted since starting the controller." in taint["condition"]["message"]


def test_a_cluster_before_1_35_says_nothing(tmp_path, monkeypatch) -> None:
    from tests.support.fake_apiserver import write_kubeconfig

    old = FakeApiServer(served="v1alpha3", group_versions=("v1alpha3",), kubernetes="1.34")
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(old, tmp_path)))
    try:
        board = VerdictBoard()
        board.update([verdict("gpu-0")], lambda n, h: {"dra.driver.name": DRIVER})
        sink = K8sOutputSink(board, None, policy_mod.load(), "v1alpha3", apply_rules=True, name="cluster writer")
        sink.render()
        assert sink.reconcile(force=True) and sink.reconcile(force=True)
        assert old.objects and "cluster" not in json.loads(board.json_route()[2])["devices"][0]
    finally:
        old.close()


def test_the_report_says_per_reason_what_the_rules_did_or_would_have_done(api, tmp_path, capsys) -> None:
    from otel_dra.sinks.k8s.apply import connect
    from otel_dra.sinks.k8s.events import EventRecorder
    from tests.unit.sinks.test_k8s_brake import Runner

    board = VerdictBoard()
    sick = [verdict(f"gpu-{i}") for i in range(3)]
    board.update([*sick, verdict("gpu-3", "Healthy")], lambda n, h: {"dra.driver.name": DRIVER})
    api.pods[(DRIVER, "node-1", "gpu-0")] = [("ml", "trainer-0"), ("ml", "trainer-1")]
    api.pods[(DRIVER, "node-1", "gpu-1")] = [("infer", "svc-0")]
    events = EventRecorder(connect(), "health.otel-dra.io/fleet", "fleet-0")
    sink = K8sOutputSink(board, None, policy_mod.load(), apply_rules=True, events=events, name="cluster writer")
    sink.render()
    assert sink.reconcile(force=True)
    board.update([verdict("gpu-2", "Healthy")], lambda n, h: {"dra.driver.name": DRIVER})  # gpu-2 repaired
    sink.render()
    assert sink.reconcile(force=True) and events.flush()
    runner = Runner(capsys)
    shown = runner.invoke(["k8s", "report", "-o", "json", "--since", "1h"])
    assert shown.exit_code == 0, shown.output
    [ecc] = json.loads(shown.output)["reasons"]
    assert ecc == {
        "reason": "memory_ecc",
        "rules": {"None": 2},
        "devices": 2,
        "devices_reported": 2,
        "would_evict_pods": 3,
        "pods_pending_eviction": 0,
        "pods_evicted": 0,
        "tainted": 3,
        "changed": 0,
        "removed": 1,
    }
    table = runner.invoke(["k8s", "report"])
    assert table.exit_code == 0 and "memory_ecc" in table.output and "3 pods (2/2 said)" in table.output, table.output
    assert "Events read" in table.output


def test_the_report_without_a_cluster_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    from tests.unit.sinks.test_k8s_brake import Runner

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    shown = Runner(capsys).invoke(["k8s", "report"])
    assert shown.exit_code == 2 and len(shown.output.strip().splitlines()) == 1, shown.output
