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
    tmp_path, monkeypatch, caplog
):
    # 50 nodes of 8 (the fake API server validates every rule against the OpenAPI schema: 1,600 take a minute
    # and a half; gate() is shown on 200 x 8 above).
    nodes = 50
    from otel_dra.classifier.verdicts import Verdict
    from otel_dra.sinks.k8s.sink import K8sOutputSink
    from otel_dra.state.board import VerdictBoard
    from tests.support.fake_apiserver import FakeApiServer, write_kubeconfig

    policy_file = tmp_path / "p.yaml"
    policy_file.write_text("kubernetes: {taints: {effect: {by_state: {failed: NoSchedule}}}}\n")
    pol = policy_mod.load(policy_file)
    api = FakeApiServer()
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(api, tmp_path)))
    try:
        board = VerdictBoard()
        sick = [
            Verdict(1, f"node-{n:03d}", f"gpu-{g}", "Unhealthy", "failed", ("memory_ecc",), "reset_device",
                    "memory_ecc: uncorrected ECC errors: 1 in 5m", pool=f"node-{n:03d}", device=f"gpu-{g}")
            for n in range(nodes)
            for g in range(GPUS)
        ]  # fmt: skip
        board.update(sick, lambda node, hw: {"dra.driver.name": "gpu.nvidia.com"})
        brake = Brake(BudgetSettings.from_policy(pol))
        sink = K8sOutputSink(board, None, pol, apply_rules=True, brake=brake, name="cluster writer")
        sink.render()
        assert sink.reconcile(force=True)
        written = list(api.objects.values())
        fleet = nodes * GPUS  # 400 devices: 5% is 20
        assert len(written) == fleet and effects(written) == {"NoSchedule": 20, "None": fleet - 20}
        assert brake.state.tripped and brake.state.withheld == fleet - 20
        assert any("the brake on mass quarantine tripped" in r.getMessage() for r in caplog.records)
    finally:
        api.close()
