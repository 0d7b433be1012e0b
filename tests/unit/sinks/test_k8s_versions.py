"""DeviceTaintRules for every API version on every Kubernetes server that serves it.

Each rendered object is checked against that server's official OpenAPI schema (strict: no
field the version does not have), as bundled by ``kubernetes-validate``, and through the
``kubernetes`` client's model of its version. The schemas do not check enums, so the effects
each server accepts (``None`` from 1.35 only) are a table here, held against the renderer's
own one-line error.
"""

from __future__ import annotations

import json
import subprocess
import sys

import kubernetes.client as kc
import kubernetes_validate
import pytest

from otel_dra import conventions as cv
from otel_dra import policy as policy_mod
from otel_dra.classifier.verdict import Verdict
from otel_dra.sinks.k8s import render as r
from otel_dra.sinks.k8s import validation as v
from otel_dra.sinks.k8s.validation import K8sValidationError

DRIVER = "gpu.nvidia.com"
KUBERNETES = ("1.33", "1.34", "1.35", "1.36", "1.37")
MODELS = {"v1": kc.V1DeviceTaintRule, "v1beta2": kc.V1beta2DeviceTaintRule, "v1alpha3": kc.V1alpha3DeviceTaintRule}


def minor(k: str) -> tuple[int, int]:
    return r.kubernetes_version_of(k)


def served_on(short: str) -> list[str]:
    return [k for k in KUBERNETES if minor(k) >= r.SERVED_FROM[r.API_VERSIONS[short]]]


PAIRS = [(short, k) for short in r.API_VERSIONS for k in served_on(short)]


def verdict(hw_id: str, health: str, state: str | None, reasons: tuple[str, ...]) -> Verdict:
    return Verdict(
        time_unix_nano=1,
        node="node-a",
        hw_id=hw_id,
        health=health,
        state=state,
        reasons=reasons,
        remediation="reset_device",
        message=f"{hw_id}: evidence",
        pool="node-a",
        device=hw_id,
    )


FLEET = [
    verdict("gpu-0", "Healthy", "ok", ()),
    verdict("gpu-1", "Unhealthy", "failed", ("memory_ecc", "thermal")),
    verdict("gpu-2", "Unknown", None, ("stale",)),
]


def policy_with(effect: str, **by_reason: str) -> policy_mod.Policy:
    """The default policy with this effect (set after loading: the policy file would refuse an
    unknown one, and the renderer's own check is what is under test)."""
    pol = policy_mod.load()
    pol.sections["kubernetes"]["taints"]["effect"]["default"] = effect
    pol.sections["kubernetes"]["taints"]["effect"]["by_reason"] = dict(by_reason)
    return pol


def test_the_table_matches_the_brief_and_every_version_is_rendered():
    assert list(r.API_VERSIONS) == ["v1", "v1beta2", "v1alpha3"] and r.DEFAULT_API_VERSION == "v1"
    assert PAIRS == [
        ("v1", "1.37"),
        ("v1beta2", "1.36"),
        ("v1beta2", "1.37"),
        ("v1alpha3", "1.33"),
        ("v1alpha3", "1.34"),
        ("v1alpha3", "1.35"),
        ("v1alpha3", "1.36"),
        ("v1alpha3", "1.37"),
    ]


@pytest.mark.parametrize(("short", "kubernetes"), PAIRS)
def test_every_rule_validates_against_its_servers_official_schema_and_client_model(short, kubernetes):
    api = kc.ApiClient()
    accepted = [e for e in v.TAINT_EFFECTS if minor(kubernetes) >= v.EFFECT_SINCE[e]]
    for effect in accepted:
        # one reason with its own effect too, so a rendering mixes effects
        out = r.render(
            FLEET, policy_with(effect, thermal="NoExecute"), short, driver=DRIVER, kubernetes_version=kubernetes
        )
        assert out.kubernetes == minor(kubernetes)
        assert len(out.rules) == 3
        assert {x["spec"]["taint"]["effect"] for x in out.rules} == {effect, "NoExecute"}
        for rule in out.rules:
            assert rule["apiVersion"] == f"resource.k8s.io/{short}"
            assert kubernetes_validate.validate(rule, kubernetes, strict=True) == kubernetes
            parsed = MODELS[short].from_dict(rule)  # pydantic, extra fields forbidden
            assert api.sanitize_for_serialization(parsed) == rule


@pytest.mark.parametrize("short", list(r.API_VERSIONS))
def test_the_server_before_the_first_one_has_no_schema_for_the_version(short):
    """SERVED_FROM against the official schemas: the minor before a version's first lacks it."""
    major, first = r.SERVED_FROM[r.API_VERSIONS[short]]
    rule = r.render(FLEET, policy_with("NoSchedule"), short, driver=DRIVER).rules[0]
    kubernetes_validate.validate(rule, f"{major}.{first}", strict=True)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(rule, f"{major}.{first - 1}", strict=True)
    with pytest.raises(K8sValidationError) as exc:
        r.render(FLEET, policy_with("NoSchedule"), short, driver=DRIVER, kubernetes_version=f"{major}.{first - 1}")
    message = str(exc.value)
    assert "\n" not in message and f"served from Kubernetes {major}.{first}, not {major}.{first - 1}" in message
    if short != "v1alpha3":
        assert "render with --api-version" in message


@pytest.mark.parametrize("kubernetes", KUBERNETES)
@pytest.mark.parametrize("effect", ["None", "NoSchedule", "NoExecute", "PreferNoSchedule", "none", ""])
def test_which_effects_each_kubernetes_accepts(effect, kubernetes):
    accepted = effect in ("NoSchedule", "NoExecute") or (effect == "None" and minor(kubernetes) >= (1, 35))
    assert (v.taint_effect_problem(effect, minor(kubernetes)) is None) is accepted
    # on the newest API version the server serves, and on v1alpha3 (served on all of them)
    newest = next(s for s in r.API_VERSIONS if minor(kubernetes) >= r.SERVED_FROM[r.API_VERSIONS[s]])
    for short in {newest, "v1alpha3"}:
        if accepted:
            out = r.render(FLEET, policy_with(effect), short, driver=DRIVER, kubernetes_version=kubernetes)
            assert [x["spec"]["taint"]["effect"] for x in out.rules] == [effect] * 3
            continue
        with pytest.raises(K8sValidationError) as exc:
            r.render(FLEET, policy_with(effect), short, driver=DRIVER, kubernetes_version=kubernetes)
        message = str(exc.value)
        assert "\n" not in message and "spec.taint.effect" in message and message.startswith("DeviceTaintRule ")
        if effect == "None":
            assert (
                f"'None' needs Kubernetes 1.35+; for {kubernetes} set kubernetes.taints.effect.default" in message
                and "to NoSchedule in the policy, or render for a newer server (--kubernetes-version)" in message
            )
        else:
            assert "is not one of: None, NoSchedule, NoExecute" in message


def test_without_a_server_version_each_api_version_assumes_its_first_but_at_least_1_35():
    assert {s: r.target_kubernetes(s) for s in r.API_VERSIONS} == {
        "v1": (1, 37),
        "v1beta2": (1, 36),
        "v1alpha3": (1, 35),
    }
    out = r.render(FLEET, policy_mod.load(), "v1alpha3", driver=DRIVER)  # effect None, for 1.35
    assert out.kubernetes == (1, 35) and {x["spec"]["taint"]["effect"] for x in out.rules} == {"None"}
    for rule in out.rules:
        kubernetes_validate.validate(rule, "1.35", strict=True)
    assert r.kubernetes_version_of("v1.34.2") == (1, 34)
    with pytest.raises(ValueError, match=r"not MAJOR\.MINOR"):
        r.kubernetes_version_of("latest")


def test_a_by_reason_none_on_1_34_is_refused_too():
    with pytest.raises(K8sValidationError, match=r"'None' needs Kubernetes 1\.35\+; for 1\.34"):
        r.render(FLEET, policy_with("NoSchedule", stale="None"), "v1alpha3", driver=DRIVER, kubernetes_version="1.34")


def otel_dra(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_dra", *args], capture_output=True, text=True, timeout=60)


def test_the_cli_renders_for_a_server_and_says_the_fix_in_one_line(tmp_path):
    line = {
        cv.K8S_NODE_NAME_ATTR: "node-a",
        cv.HW_ID: "gpu-1",
        "health": "Unhealthy",
        cv.HW_STATE: "failed",
        "reasons": ["memory_ecc"],
        cv.DRA_POOL_NAME: "node-a",
        cv.DRA_DEVICE_NAME: "gpu-1",
    }
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(json.dumps(line) + "\n")
    base = ("k8s", "render", str(verdicts), "--driver", DRIVER, "--only", "taints")
    old = otel_dra(*base, "--api-version", "v1alpha3", "--kubernetes-version", "1.34")
    assert old.returncode == 2 and old.stdout == ""
    [error] = old.stderr.strip().splitlines()
    assert "'None' needs Kubernetes 1.35+; for 1.34 set kubernetes.taints.effect.default" in error, error
    policy = tmp_path / "p.yaml"
    policy.write_text("kubernetes:\n  taints:\n    effect:\n      default: NoSchedule\n")
    fixed = otel_dra(*base, "--api-version", "v1alpha3", "--kubernetes-version", "1.34", "--policy", str(policy))
    assert fixed.returncode == 0, fixed.stderr
    assert "effect: NoSchedule" in fixed.stdout and "apiVersion: resource.k8s.io/v1alpha3" in fixed.stdout
    default = otel_dra(*base)
    assert default.returncode == 0 and "apiVersion: resource.k8s.io/v1\n" in default.stdout, default.stderr
    unserved = otel_dra(*base, "--api-version", "v1", "--kubernetes-version", "1.36")  # asked for: held to it
    assert unserved.returncode == 2 and "render with --api-version v1beta2" in unserved.stderr, unserved.stderr
    bad = otel_dra(*base, "--kubernetes-version", "latest")
    assert bad.returncode == 2 and "--kubernetes-version" in bad.stderr and "MAJOR.MINOR" in bad.stderr


@pytest.mark.parametrize(
    ("kubernetes", "short"),
    [
        ((1, 32), None),
        ((1, 33), "v1alpha3"),
        ((1, 35), "v1alpha3"),
        ((1, 36), "v1beta2"),
        ((1, 37), "v1"),
        ((2, 0), "v1"),
    ],
)
def test_the_newest_api_version_each_server_serves(kubernetes, short):
    from otel_dra.sinks.k8s.versions import newest_served

    assert newest_served(kubernetes) == short


def test_a_kubernetes_version_alone_picks_its_api_version_and_fails_once_on_effect_none(tmp_path):
    """Issue #29: ``--kubernetes-version 1.33`` without ``--api-version`` renders v1alpha3 (saying so), so
    the only error left is the one about effect None (1.35+), naming the policy setting that fixes it."""
    line = {cv.K8S_NODE_NAME_ATTR: "node-a", cv.HW_ID: "gpu-1", "health": "Unhealthy", cv.HW_STATE: "failed"}
    line |= {"reasons": ["memory_ecc"], cv.DRA_POOL_NAME: "node-a", cv.DRA_DEVICE_NAME: "gpu-1"}
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(json.dumps(line) + "\n")
    base = ("k8s", "render", str(verdicts), "--driver", DRIVER)
    refused = otel_dra(*base, "--kubernetes-version", "1.33")
    assert refused.returncode == 2 and refused.stdout == ""
    note, error = refused.stderr.strip().splitlines()
    assert note.startswith("note: Kubernetes 1.33 serves DeviceTaintRules up to resource.k8s.io/v1alpha3"), note
    assert "DRADeviceTaints" in note
    assert "'None' needs Kubernetes 1.35+; for 1.33 set kubernetes.taints.effect.default" in error, error
    assert "--api-version" not in error
    policy = tmp_path / "p.yaml"
    policy.write_text("kubernetes:\n  taints:\n    effect:\n      default: NoSchedule\n")
    fixed = otel_dra(*base, "--kubernetes-version", "1.34", "--policy", str(policy))
    assert fixed.returncode == 0, fixed.stderr
    assert "apiVersion: resource.k8s.io/v1alpha3" in fixed.stdout and "effect: NoSchedule" in fixed.stdout
    newer = otel_dra(*base, "--kubernetes-version", "1.36")
    assert newer.returncode == 0 and "apiVersion: resource.k8s.io/v1beta2" in newer.stdout, newer.stderr
    assert newer.stderr.startswith("note: Kubernetes 1.36 serves DeviceTaintRules up to resource.k8s.io/v1beta2")
    newest = otel_dra(*base, "--kubernetes-version", "1.37")  # the default already: nothing to say
    assert newest.returncode == 0 and newest.stderr == "", newest.stderr
