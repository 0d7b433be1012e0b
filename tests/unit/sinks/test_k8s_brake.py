"""The brake on mass quarantine (issue #27): a budget of new acting taints per window, and every path past it."""

from __future__ import annotations

from typing import Any

import pytest

from otel_dra import policy as policy_mod
from otel_dra.sinks.k8s.brake import Brake, BrakeState, BudgetSettings, gate

SETTINGS = BudgetSettings(
    window_s=600.0, share=0.05, devices=64, no_execute_share=0.01, no_execute_devices=8, cooldown_s=3600.0
)
NODES, GPUS = 200, 8
FLEET = NODES * GPUS


def rule(node: int, gpu: int, reason: str = "memory_ecc", effect: str = "NoSchedule") -> dict[str, Any]:
    device = f"gpu-{gpu}"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"gpu.nvidia.com.node-{node:03d}.{device}.{reason}"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": f"node-{node:03d}", "device": device},
            "taint": {"key": f"health.otel-dra.io/{reason}", "value": "failed", "effect": effect},
        },
    }


def effects(rules: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rules:
        e = r["spec"]["taint"]["effect"]
        out[e] = out.get(e, 0) + 1
    return out


def whole_fleet(effect: str = "NoSchedule") -> list[dict[str, Any]]:
    return [rule(n, g, effect=effect) for n in range(NODES) for g in range(GPUS)]


def test_the_default_policy_carries_a_budget():
    settings = BudgetSettings.from_policy(policy_mod.load())
    assert settings.allowed(FLEET) == (64, 8)  # 5% of 1,600 is 80, capped at 64; 1% is 16, capped at 8
    assert settings.allowed(10) == (1, 1)  # a small fleet may still quarantine one device


def test_a_whole_fleet_turning_unhealthy_at_once_gets_the_budgets_worth_and_the_rest_as_facts():
    decision = gate(whole_fleet(), [], BrakeState(), SETTINGS, FLEET, now=1000.0)
    assert decision.tripped_now and decision.state.tripped
    assert effects(decision.rules) == {"NoSchedule": 64, "None": FLEET - 64}
    assert len(decision.withheld) == FLEET - 64 and decision.state.withheld == FLEET - 64
    assert "1600 new acting taints in one batch" in decision.state.why
    # The same batch again (the cluster now holds what was written): nothing more is let through.
    written = decision.rules
    again = gate(whole_fleet(), written, decision.state, SETTINGS, FLEET, now=1005.0)
    assert not again.tripped_now and effects(again.rules) == {"NoSchedule": 64, "None": FLEET - 64}


def test_no_execute_has_its_own_tighter_budget():
    decision = gate(whole_fleet("NoExecute"), [], BrakeState(), SETTINGS, FLEET, now=0.0)
    assert effects(decision.rules) == {"NoExecute": 8, "None": FLEET - 8}


def test_a_device_already_tainted_keeps_its_taint_while_the_brake_holds():
    existing = [rule(0, 0, effect="NoExecute"), rule(0, 1, effect="NoSchedule")]
    tripped = BrakeState(tripped_at=0.0, why="earlier")
    desired = [rule(0, 0, effect="NoExecute"), rule(0, 1, effect="NoExecute"), rule(0, 2)]
    decision = gate(desired, existing, tripped, SETTINGS, FLEET, now=10.0)
    got = {r["spec"]["deviceSelector"]["device"]: r["spec"]["taint"]["effect"] for r in decision.rules}
    # gpu-0 kept NoExecute; gpu-1's escalation is withheld (it keeps NoSchedule); gpu-2 is recorded as None.
    assert got == {"gpu-0": "NoExecute", "gpu-1": "NoSchedule", "gpu-2": "None"}
    assert not decision.tripped_now and sorted(n.split(".")[4] for n in decision.withheld) == ["gpu-1", "gpu-2"]


def test_an_escalation_from_none_is_a_new_acting_taint():
    existing = [rule(n, 0, effect="None") for n in range(3)]
    tight = BudgetSettings(600.0, 1.0, 2, 1.0, 2, 0.0)
    decision = gate([rule(n, 0) for n in range(3)], existing, BrakeState(), tight, FLEET, now=0.0)
    assert decision.tripped_now and effects(decision.rules) == {"NoSchedule": 2, "None": 1}


def test_the_window_slides_and_a_device_counts_once_whatever_its_reasons():
    tight = BudgetSettings(600.0, 1.0, 2, 1.0, 2, 0.0)
    two_reasons = [rule(0, 0, "memory_ecc"), rule(0, 0, "thermal"), rule(0, 1)]
    first = gate(two_reasons, [], BrakeState(), tight, FLEET, now=0.0)
    assert not first.tripped_now and effects(first.rules) == {"NoSchedule": 3}
    # A third device within the window trips it; the same device after the window has slid does not.
    assert gate([rule(0, 2)], first.rules, first.state, tight, FLEET, now=599.0).tripped_now
    later = gate([rule(0, 2)], first.rules, first.state, tight, FLEET, now=601.0)
    assert not later.tripped_now and effects(later.rules) == {"NoSchedule": 1}


def test_the_cool_down_releases_it_and_zero_holds_until_an_operator_does():
    tripped = BrakeState(tripped_at=100.0, why="earlier")
    held = gate([rule(1, 1)], [], tripped, SETTINGS, FLEET, now=100.0 + 3599.0)
    assert effects(held.rules) == {"None": 1} and not held.released_now
    freed = gate([rule(1, 1)], [], tripped, SETTINGS, FLEET, now=100.0 + 3600.0)
    assert freed.released_now and not freed.state.tripped and effects(freed.rules) == {"NoSchedule": 1}
    manual = BudgetSettings(600.0, 0.05, 64, 0.01, 8, 0.0)
    forever = gate([rule(1, 1)], [], tripped, manual, FLEET, now=1e9)
    assert forever.state.tripped and effects(forever.rules) == {"None": 1}
    brake = Brake(manual, tripped)
    assert brake.release() and not brake.state.tripped
    assert effects(brake.gate([rule(1, 1)], [], FLEET, now=1e9).rules) == {"NoSchedule": 1}


@pytest.mark.parametrize("effect", ["None", "NoSchedule"])
def test_informational_rules_and_unchanged_ones_never_count(effect: str):
    tight = BudgetSettings(600.0, 1.0, 1, 1.0, 1, 0.0)
    existing = [rule(n, 0, effect=effect) for n in range(50)]
    decision = gate([rule(n, 0, effect=effect) for n in range(50)], existing, BrakeState(), tight, FLEET, 0.0)
    assert not decision.tripped_now and decision.withheld == []


def test_a_budget_the_policy_refuses(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("kubernetes: {budget: {devices: 0}}\n")
    with pytest.raises(policy_mod.PolicyError, match=r"kubernetes\.budget\.devices"):
        policy_mod.load(bad)


# -- through the writer, against the fake API server ------------------------------------------------------------
def test_a_fleet_turning_unhealthy_in_one_evaluation_writes_only_the_budgets_worth_of_acting_taints(
    tmp_path, caplog, api
):
    """The Done-when: 200 nodes x 8 GPUs Unhealthy at once; the API server validates every rule and Event."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_dra.classifier.verdict import Verdict
    from otel_dra.sinks.k8s.apply import connect
    from otel_dra.sinks.k8s.events import EventRecorder, Ref
    from otel_dra.sinks.k8s.sink import new_k8s_sink as K8sOutputSink
    from otel_dra.state.board import VerdictBoard

    policy_file = tmp_path / "p.yaml"
    policy_file.write_text("kubernetes: {taints: {effect: {by_state: {failed: NoSchedule}}}}\n")
    pol = policy_mod.load(policy_file)
    board = VerdictBoard()
    sick = [
        Verdict(1, f"node-{n:03d}", f"gpu-{g}", "Unhealthy", "failed", ("memory_ecc",), "reset_device",
                "memory_ecc: uncorrected ECC errors: 1 in 5m", pool=f"node-{n:03d}", device=f"gpu-{g}")
        for n in range(NODES)
        for g in range(GPUS)
    ]  # fmt: skip
    board.update(sick, lambda node, hw: {"dra.driver.name": "gpu.nvidia.com"})
    brake = Brake(BudgetSettings.from_policy(pol))
    reader = InMemoryMetricReader()
    brake.instrument(MeterProvider(metric_readers=[reader]).get_meter("t"))
    events = EventRecorder(connect(), "health.otel-dra.io/fleet", "fleet-0")
    lease = Ref("coordination.k8s.io/v1", "Lease", "otel-dra-fleet", "otel-dra")
    sink = K8sOutputSink(
        board, None, pol, apply_rules=True, brake=brake, events=events, brake_ref=lease, name="cluster writer"
    )
    sink.render()
    assert sink.reconcile(force=True)
    written = list(api.objects.values())
    assert len(written) == FLEET and effects(written) == {"NoSchedule": 64, "None": FLEET - 64}
    assert brake.state.tripped and brake.state.withheld == FLEET - 64
    # The log line, once.
    lines = [r.getMessage() for r in caplog.records if "the brake on mass quarantine tripped" in r.getMessage()]
    assert len(lines) == 1 and "1600 new acting taints in one batch" in lines[0]
    # The metric.
    metrics = {
        m.name: m.data.data_points[0].value
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert metrics == {"otel_dra.k8s.brake.tripped": 1, "otel_dra.k8s.brake.withheld": FLEET - 64}
    # The Event, about the Lease that carries the brake's state, in its namespace; it was queued first.
    assert events.flush(timeout_s=60)
    [tripped] = api.event_list("otel-dra")
    said = (tripped["type"], tripped["reason"], tripped["action"])
    assert said == ("Warning", "QuarantineBrakeTripped", "Withhold")
    assert tripped["regarding"]["kind"] == "Lease" and "1536 new acting taints written as None" in tripped["note"]
    # Each rule its own Event, up to client-go's queue of 1,000 (the rest are counted as dropped).
    taints = api.event_list("default")
    assert len(taints) == 999 and events.counts.dropped == FLEET - 999
    withheld = [e for e in taints if "the brake on mass quarantine withheld NoSchedule" in e["note"]]
    assert withheld and all("effect None" in e["note"] for e in withheld)


# -- across a restart and a change of leader: the state rides on the Lease ----------------------------------------
def test_the_brake_holds_across_a_restart_and_a_change_of_leader(api):
    from otel_dra.sinks.k8s import apply as k8s_apply
    from otel_dra.sinks.k8s.brake import annotation_key
    from otel_dra.sinks.k8s.lease import LeaderElector, LeaseConfig

    key = annotation_key(policy_mod.load())
    assert key == "health.otel-dra.io/quarantine-brake"

    def candidate(identity: str, brake: Brake) -> LeaderElector:
        cfg = LeaseConfig(namespace="otel-dra", identity=identity)
        return LeaderElector(
            k8s_apply.connect(),
            cfg,
            annotations=lambda: brake.annotations(key),
            adopt=lambda found: brake.adopt(found, key),
        )

    first = Brake(SETTINGS)
    tripped = first.gate(whole_fleet(), [], FLEET, now=1000.0)
    assert tripped.tripped_now
    leader = candidate("fleet-0", first)
    assert leader.try_acquire_or_renew()
    carried = api.lease()["metadata"]["annotations"][key]
    assert '"trippedAt":1000.0' in carried and len(carried) < 8192  # one entry per device let through
    # The same pod restarted (a StatefulSet keeps its name): it finds itself the holder and takes the brake
    # over instead of writing a released one.
    restarted_brake = Brake(SETTINGS)
    restarted = candidate("fleet-0", restarted_brake)
    assert restarted.try_acquire_or_renew() and restarted_brake.state.tripped
    assert restarted_brake.state.why == first.state.why and len(restarted_brake.state.added) == 64
    # Handed over to another replica: it holds the same brake, and writes it on.
    assert restarted.release()
    standby_brake = Brake(SETTINGS)
    standby = candidate("fleet-1", standby_brake)
    assert standby.try_acquire_or_renew() and standby_brake.state.tripped
    assert effects(standby_brake.gate(whole_fleet(), [], FLEET, now=1010.0).rules)["None"] == FLEET
    assert '"trippedAt":1000.0' in api.lease()["metadata"]["annotations"][key]
    # Released there, the release is what the Lease carries next.
    assert standby_brake.release() and standby.try_acquire_or_renew()
    assert '"trippedAt":null' in api.lease()["metadata"]["annotations"][key]


def test_the_brake_holds_when_the_electors_own_threads_hand_over(api):
    """As the fleet runs them: each replica's elector campaigns on its own thread; the leader, with its brake
    tripped, shuts down (releasing the Lease), and the standby's thread takes the Lease and the brake with it."""
    import time

    from otel_dra.sinks.k8s import apply as k8s_apply
    from otel_dra.sinks.k8s.brake import annotation_key
    from otel_dra.sinks.k8s.lease import LeaderElector, LeaseConfig

    key = annotation_key(policy_mod.load())

    def candidate(identity: str, brake: Brake) -> LeaderElector:
        cfg = LeaseConfig(
            namespace="otel-dra", identity=identity, lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.2
        )
        return LeaderElector(
            k8s_apply.connect(),
            cfg,
            annotations=lambda: brake.annotations(key),
            adopt=lambda found: brake.adopt(found, key),
            watch=lambda found: brake.watch(found, key),
        )

    def until(check, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            assert time.monotonic() < deadline
            time.sleep(0.05)

    leading_brake, standby_brake = Brake(SETTINGS), Brake(SETTINGS)
    leader, standby = candidate("fleet-0", leading_brake), candidate("fleet-1", standby_brake)
    leader.start()
    until(leader.is_leader)
    standby.start()
    try:
        assert leading_brake.gate(whole_fleet(), [], FLEET, now=time.time()).tripped_now
        until(lambda: '"trippedAt":' in api.lease()["metadata"]["annotations"][key] and not standby.is_leader())
        until(lambda: '"trippedAt":null' not in api.lease()["metadata"]["annotations"][key])
        assert not standby_brake.state.tripped  # a standby does not act on it
        leader.shutdown(2.0)
        until(standby.is_leader)
        assert standby_brake.state.tripped and standby_brake.state.why == leading_brake.state.why
        assert effects(standby_brake.gate(whole_fleet(), [], FLEET, now=time.time()).rules)["None"] == FLEET
    finally:
        leader.shutdown(1.0)
        standby.shutdown(1.0)


def test_an_unreadable_annotation_is_ignored_with_a_warning(caplog):
    brake = Brake(SETTINGS)
    brake.adopt({"k/quarantine-brake": "{not json"}, "k/quarantine-brake")
    assert not brake.state.tripped and "not readable" in caplog.text


class Result:
    def __init__(self, exit_code: int, output: str) -> None:
        self.exit_code, self.output = exit_code, output


class Runner:
    """``otel-dra`` as a user runs it (``main``: a user error is one line and exit code 2), output captured."""

    def __init__(self, capsys: Any) -> None:
        self.capsys = capsys

    def invoke(self, argv: list[str]) -> Result:
        from otel_dra.cli import main

        code = 0
        try:
            main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = self.capsys.readouterr()
        return Result(code, out.out + out.err)


def test_an_operator_releases_it_with_a_command_the_leader_honours_at_its_next_renewal(capsys, api):
    from otel_dra.sinks.k8s import apply as k8s_apply
    from otel_dra.sinks.k8s.brake import annotation_key, release_key
    from otel_dra.sinks.k8s.lease import LeaderElector, LeaseConfig

    key = annotation_key(policy_mod.load())
    runner = Runner(capsys)
    status = ["k8s", "brake", "status", "-n", "otel-dra"]
    missing = runner.invoke(["k8s", "brake", "release", "-n", "otel-dra"])
    assert missing.exit_code == 2 and "no Lease otel-dra/otel-dra-fleet" in missing.output
    brake = Brake(BudgetSettings(600.0, 0.05, 64, 0.01, 8, 0.0))  # cooldown 0: only a release opens it
    leader = LeaderElector(
        k8s_apply.connect(),
        LeaseConfig(namespace="otel-dra", identity="fleet-0"),
        annotations=lambda: brake.annotations(key),
        adopt=lambda found: brake.adopt(found, key),
        watch=lambda found: brake.watch(found, key),
    )
    assert brake.gate(whole_fleet(), [], FLEET, now=1000.0).tripped_now
    assert leader.try_acquire_or_renew()
    shown = runner.invoke(status)
    assert shown.exit_code == 0, shown.output
    assert "tripped at 1970-01-01T00:16:40Z: 1600 new acting taints" in shown.output and "fleet-0" in shown.output

    released = runner.invoke(["k8s", "brake", "release", "-n", "otel-dra"])
    assert released.exit_code == 0, released.output
    assert "asked the leader (fleet-0) to release the brake (tripped)" in released.output
    token = api.lease()["metadata"]["annotations"][release_key(key)]
    assert "waits for the leader's next renewal" in runner.invoke(status).output
    assert brake.state.tripped  # not before the leader reads the Lease
    assert leader.try_acquire_or_renew() and not brake.state.tripped
    assert brake.state.released == token and brake.state.added == ()  # a fresh budget
    assert effects(brake.gate(whole_fleet(), [], FLEET, now=1001.0).rules)["NoSchedule"] == 64  # trips again
    # The token is honoured once: the same one on the next renewal, or on a new leader's first, does nothing.
    assert leader.try_acquire_or_renew() and brake.state.tripped
    assert '"released":"' + token + '"' in api.lease()["metadata"]["annotations"][key]
    after = runner.invoke(status)
    assert "tripped at" in after.output and "waits" not in after.output


def test_releasing_without_a_cluster_says_what_to_set(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = Runner(capsys).invoke(["k8s", "brake", "release"])
    assert result.exit_code == 2 and "set KUBECONFIG" in result.output and "Traceback" not in result.output
