"""`otel-dra k8s`: verdicts as DRA DeviceTaintRules (KEP-5055) and ResourceSlice attributes.

Rendered from real `Verdict` objects, from the real `otel-dra replay` output and from a real
running agent; every name, key and value checked against Kubernetes' own validation rules
(written out below from k8s.io/apimachinery/pkg/util/validation and pkg/apis/resource) and
against the `kubernetes` client's models of both API versions. `--apply` is tested as a pure
plan, against a small fake API server speaking the real HTTP API, and without any cluster.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import kubernetes.client as kc
import pytest
import yaml

from otel_dra import policy as policy_mod
from otel_dra.classifier.verdict import Verdict, VerdictInputError
from otel_dra.cli import k8s as k8s_cli
from otel_dra.faults import Fault
from otel_dra.sinks.k8s import apply as k8s_apply
from otel_dra.sinks.k8s import render as r
from otel_dra.sinks.k8s import validation as v
from otel_dra.sinks.k8s.sink import new_k8s_sink as K8sOutputSink
from otel_dra.state.board import VerdictBoard
from otel_dra.vocabulary import REASONS
from tests.conftest import free_port, http_get, wait_for
from tests.support.fake_apiserver import FakeApiServer, kubeconfig, write_kubeconfig
from tests.support.otlp_trace import read_verdicts, write_trace

DRIVER = "gpu.nvidia.com"

# -- Kubernetes' validation rules, written out independently of otel_dra.sinks.k8s.validation ------
# k8s.io/apimachinery/pkg/util/validation/validation.go
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_subdomain(s: str, max_len: int = 253) -> bool:
    return len(s) <= max_len and bool(DNS1123_SUBDOMAIN.match(s))


def is_label_name(s: str) -> bool:  # IsQualifiedName
    parts = s.split("/")
    if len(parts) == 2:
        if not parts[0] or not is_subdomain(parts[0]):
            return False
        name = parts[1]
    elif len(parts) == 1:
        name = parts[0]
    else:
        return False
    return 0 < len(name) <= 63 and bool(QUALIFIED_NAME.match(name))


def is_label_value(s: str) -> bool:
    return len(s) <= 63 and bool(LABEL_VALUE.match(s))


def is_attribute_name(s: str) -> bool:  # pkg/apis/resource/validation: validateQualifiedName
    parts = s.split("/")
    if len(parts) > 2:  # Kubernetes leaves a second '/' unchecked (a TODO there); we never write one
        return False
    domain, ident = parts if len(parts) == 2 else (None, parts[0])
    ok_ident = 0 < len(ident) <= 32 and bool(C_IDENTIFIER.match(ident))
    return ok_ident and (domain is None or (domain != "" and is_subdomain(domain, 63)))


def assert_valid_rule(rule: dict) -> None:
    meta, spec = rule["metadata"], rule["spec"]
    assert is_subdomain(meta["name"]), meta["name"]
    assert all(is_label_name(k) and is_label_value(x) for k, x in meta["labels"].items())
    assert all(is_label_name(k) for k in meta["annotations"])
    assert is_label_name(spec["taint"]["key"]), spec["taint"]["key"]
    assert is_label_value(spec["taint"].get("value", "")), spec["taint"]
    assert spec["taint"]["effect"] in ("None", "NoSchedule", "NoExecute")
    sel = spec["deviceSelector"]
    assert is_subdomain(sel["driver"], 63) and DNS1123_LABEL.match(sel["device"])
    assert all(is_subdomain(p) for p in sel["pool"].split("/"))


# -- helpers ------------------------------------------------------------------------------------
def verdict(hw_id: str, health: str = "Healthy", state: str | None = "ok", reasons=(), **kw) -> Verdict:
    fields = {
        "time_unix_nano": 1,
        "node": "node-a",
        "hw_id": hw_id,
        "health": health,
        "state": state,
        "reasons": tuple(reasons),
        "remediation": "none",
        "message": f"{hw_id}: evidence",
        "pool": "node-a",
        "device": hw_id,
    }
    fields.update(kw)
    return Verdict(**fields)


FLEET = [
    verdict("gpu-0"),
    verdict("gpu-1", "Unhealthy", "failed", ["memory_ecc"], remediation="reset_device"),
    verdict("gpu-2", "Unknown", None, ["stale"]),
    verdict("gpu-3", "Healthy", "degraded", ["thermal"], remediation="reduce_load"),
]


def load_policy(tmp_path: Path, text: str | None = None) -> policy_mod.Policy:
    if text is None:
        return policy_mod.load()
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return policy_mod.load(path)


def otel_dra(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "otel_dra", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        input=stdin,
    )


def docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def taint_rules(text: str) -> list[dict]:
    return [d for d in docs(text) if d.get("kind") == "DeviceTaintRule"]


# -- the rules themselves -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("check", "good", "bad"),
    [
        (
            v.label_name_problem,
            ["example.com/MyName", "my.name", "123-abc", "a/" + "x" * 63],
            ["-a", "a/b/c", "A.io/x", "/x", "x" * 64],
        ),
        (v.label_value_problem, ["", "failed", "predicted_failure", "x" * 63], ["a b", "-a", "x" * 64, "a/b"]),
        (v.dns1123_subdomain_problem, ["a", "health.otel-dra.io", "x" * 253], ["A", "a_b", "a..b", "-a", "x" * 254]),
        (v.c_identifier_problem, ["health", "_x1", "x" * 32], ["1x", "a-b", "x" * 33, ""]),
        (
            v.attribute_name_problem,
            ["health", "health.otel-dra.io/health"],
            ["a.io/1x", "x" * 64 + ".io/h", "a/b/c", "/h"],
        ),
        (v.pool_name_problem, ["node-a", "rack-1/node-a"], ["", "Node", "x" * 254]),
    ],
)
def test_the_api_rules_accept_and_reject_what_kubernetes_does(check, good, bad):
    for s in good:
        assert check(s) is None, s
    for s in bad:
        assert check(s), s
    independent = {
        v.label_name_problem: is_label_name,
        v.label_value_problem: is_label_value,
        v.dns1123_subdomain_problem: is_subdomain,
        v.attribute_name_problem: is_attribute_name,
    }.get(check)
    if independent:
        assert all(independent(s) for s in good) and not any(independent(s) for s in bad)


def test_every_reason_has_a_severity_and_the_cli_offers_the_rendered_api_versions():
    assert sorted(r.REASON_SEVERITY) == sorted(REASONS)
    assert tuple(r.API_VERSIONS) == k8s_cli.API_VERSION_CHOICES and k8s_cli.DEFAULT_API_VERSION == r.DEFAULT_API_VERSION


def test_rule_names_are_stable_dns_subdomains_and_never_collide():
    name = r.rule_name(DRIVER, "node-a", "gpu-1", "memory_ecc")
    assert name == r.rule_name(DRIVER, "node-a", "gpu-1", "memory_ecc")
    assert name.startswith("otel-dra-node-a-gpu-1-memory-ecc-") and is_subdomain(name)
    long_pool = "/".join(["rack-" + "x" * 60] * 4)[:253]
    long = r.rule_name(DRIVER, long_pool, "gpu-1", "memory_ecc")
    assert len(long) <= 253 and is_subdomain(long)
    names = {
        r.rule_name(DRIVER, "a-b", "c", "thermal"),
        r.rule_name(DRIVER, "a", "b-c", "thermal"),
        r.rule_name("other.example.com", "a-b", "c", "thermal"),
        r.rule_name(DRIVER, "A_B", "c", "thermal"),
    }
    assert len(names) == 4 and all(is_subdomain(n) for n in names)


# -- rendering -------------------------------------------------------------------------------------
def test_unhealthy_and_unknown_devices_get_one_informational_rule_per_reason_healthy_ones_none():
    out = r.render(FLEET, policy_mod.load(), driver=DRIVER)
    assert [(x["spec"]["deviceSelector"]["device"], x["spec"]["taint"]) for x in out.rules] == [
        ("gpu-1", {"effect": "None", "key": "health.otel-dra.io/memory_ecc", "value": "failed"}),
        ("gpu-2", {"effect": "None", "key": "health.otel-dra.io/stale", "value": "unknown"}),
    ]
    for rule in out.rules:
        assert_valid_rule(rule)
        assert rule["apiVersion"] == "resource.k8s.io/v1" and rule["kind"] == "DeviceTaintRule"
        assert rule["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "otel-dra"
        assert rule["spec"]["deviceSelector"] == {
            "device": rule["spec"]["deviceSelector"]["device"],
            "driver": DRIVER,
            "pool": "node-a",
        }
    gpu1 = out.rules[0]["metadata"]
    assert gpu1["labels"]["health.otel-dra.io/reason"] == "memory_ecc"
    assert gpu1["annotations"]["health.otel-dra.io/remediation"] == "reset_device"
    # attributes for every device, healthy or not
    attrs = {a["device"]: a["attributes"] for a in out.attributes}
    assert attrs["gpu-0"] == {
        "health.otel-dra.io/health": {"string": "Healthy"},
        "health.otel-dra.io/state": {"string": "ok"},
    }
    assert attrs["gpu-2"]["health.otel-dra.io/health"] == {"string": "Unknown"}
    assert attrs["gpu-3"]["health.otel-dra.io/state"] == {"string": "degraded"}
    for a in out.attributes:
        assert all(is_attribute_name(k) and len(x["string"]) <= 64 for k, x in a["attributes"].items())
    assert out.scope == {(DRIVER, "node-a")} and not out.skipped and not out.dropped


def test_healthy_devices_render_no_rules_at_all():
    out = r.render(
        [verdict("gpu-0"), verdict("gpu-3", "Healthy", "degraded", ["thermal"])], policy_mod.load(), driver=DRIVER
    )
    assert out.rules == [] and len(out.attributes) == 2
    assert "DeviceTaintRule" not in out.to_yaml().split("# Each")[1]


@pytest.mark.parametrize("version", ["v1alpha3", "v1beta2", "v1"])
def test_every_api_version_validates_against_the_client_models(version):
    out = r.render(FLEET, policy_mod.load(), version, driver=DRIVER)
    model = {"v1alpha3": kc.V1alpha3DeviceTaintRule, "v1beta2": kc.V1beta2DeviceTaintRule, "v1": kc.V1DeviceTaintRule}[
        version
    ]
    api = kc.ApiClient()
    assert out.rules
    for rule in out.rules:
        assert rule["apiVersion"] == f"resource.k8s.io/{version}"
        parsed = model.from_dict(rule)  # pydantic, extra fields forbidden
        assert api.sanitize_for_serialization(parsed) == rule
    for row in out.attributes:
        device = kc.V1Device(
            name=row["device"], attributes={k: kc.V1DeviceAttribute(**x) for k, x in row["attributes"].items()}
        )
        assert api.sanitize_for_serialization(device)["attributes"] == row["attributes"]


def test_the_effect_is_the_admins_choice_by_reason_then_state(tmp_path):
    p = load_policy(
        tmp_path,
        "kubernetes:\n  taints:\n    effect:\n"
        "      by_state: {failed: NoSchedule}\n      by_reason: {device_lost: NoExecute}\n",
    )
    out = r.render(
        [
            verdict("gpu-1", "Unhealthy", "failed", ["memory_ecc", "device_lost"]),
            verdict("gpu-2", "Unknown", None, ["stale"]),
        ],
        p,
        driver=DRIVER,
    )
    effects = {
        (x["spec"]["deviceSelector"]["device"], x["spec"]["taint"]["key"].split("/")[1]): x["spec"]["taint"]["effect"]
        for x in out.rules
    }
    assert effects == {
        ("gpu-1", "device_lost"): "NoExecute",
        ("gpu-1", "memory_ecc"): "NoSchedule",
        ("gpu-2", "stale"): "None",
    }


def test_taints_cap_per_device_keeps_the_most_disruptive_then_most_severe(tmp_path):
    p = load_policy(
        tmp_path,
        "kubernetes:\n  taints:\n    max_per_device: 2\n    effect: {by_reason: {link: NoExecute}}\n",
    )
    many = verdict("gpu-1", "Unhealthy", "failed", ["thermal", "link", "memory_ecc", "stale", "firmware"])
    out = r.render([many], p, driver=DRIVER)
    assert [x["metadata"]["labels"]["health.otel-dra.io/reason"] for x in out.rules] == ["link", "memory_ecc"]
    assert len(out.dropped) == 3 and all("max_per_device (2)" in d for d in out.dropped)
    # the API's own limit: 16 per device, whatever renders them
    every = verdict("gpu-1", "Unhealthy", "failed", REASONS)
    assert len(r.render([every], policy_mod.load(), driver=DRIVER).rules) == len(REASONS) <= 16
    rule = r.render([verdict("gpu-1", "Unhealthy", "failed", ["thermal"])], policy_mod.load(), driver=DRIVER).rules[0]
    with pytest.raises(
        v.K8sValidationError, match=r"device gpu.nvidia.com/node-a/gpu-1: 17 taints .* at most 16 per device"
    ):
        v.check_taint_count([rule] * 17)
    v.check_taint_count([rule] * 16)


def test_key_per_state_and_informational_taints_for_healthy_degraded_devices(tmp_path):
    p = load_policy(
        tmp_path,
        "kubernetes:\n  domain: gpu-health.example.com\n  taints:\n"
        "    key: '{domain}/{state}'\n    value: '{reason}'\n    health: [Healthy, Unhealthy]\n"
        "  attributes: {health: '{health}'}\n",
    )
    out = r.render(FLEET, p, driver=DRIVER)
    taints = sorted((x["spec"]["taint"]["key"], x["spec"]["taint"]["value"]) for x in out.rules)
    assert taints == [("gpu-health.example.com/degraded", "thermal"), ("gpu-health.example.com/failed", "memory_ecc")]
    assert all(set(a["attributes"]) == {"gpu-health.example.com/health"} for a in out.attributes)  # replaced whole


def test_taints_can_be_switched_off_leaving_attributes(tmp_path):
    out = r.render(FLEET, load_policy(tmp_path, "kubernetes: {taints: {enabled: false}}\n"), driver=DRIVER)
    assert out.rules == [] and len(out.attributes) == 4


def test_several_views_of_one_device_combine_an_unhealthy_view_wins():
    views = [
        verdict("nic-0", node="node-b", pool="fabric"),
        verdict("nic-0", "Unhealthy", "failed", ["link"], node="node-a", pool="fabric"),
        verdict("nic-0", "Unknown", None, ["stale"], node="node-c", pool="fabric"),
    ]
    out = r.render(views, policy_mod.load(), driver=DRIVER)
    assert [x["spec"]["taint"]["key"] for x in out.rules] == ["health.otel-dra.io/link"]
    assert (
        len(out.attributes) == 1
        and out.attributes[0]["attributes"]["health.otel-dra.io/health"]["string"] == "Unhealthy"
    )


def test_bad_device_names_are_one_line_errors_naming_object_and_field_or_skipped():
    bad = verdict("gpu-1", "Unhealthy", "failed", ["thermal"], device="GPU_1")
    with pytest.raises(v.K8sValidationError) as err:
        r.render([bad], policy_mod.load(), driver=DRIVER)
    assert "\n" not in str(err.value) and "device: 'GPU_1' must be a DNS label" in str(err.value)
    out = r.render([bad, verdict("gpu-0")], policy_mod.load(), driver=DRIVER, strict=False)
    assert len(out.skipped) == 1 and [a["device"] for a in out.attributes] == ["gpu-0"]
    with pytest.raises(v.K8sValidationError, match=r"no dra\.driver\.name .*--driver"):
        r.render([verdict("gpu-0")], policy_mod.load())
    not_dra = r.render([verdict(f"gpu-{i}", pool=None, device=None) for i in range(5)], policy_mod.load())
    assert not_dra.attributes == [] and len(not_dra.skipped) == 1
    assert not_dra.skipped[0].startswith("5 devices without dra.pool.name/dra.device.name are not DRA devices")


def test_a_bad_taint_is_named_by_object_and_field():
    rule = r.render([FLEET[1]], policy_mod.load(), driver=DRIVER).rules[0]
    rule["spec"]["taint"]["value"] = "x" * 64
    with pytest.raises(
        v.K8sValidationError,
        match=r"^DeviceTaintRule otel-dra-node-a-gpu-1-memory-ecc-\w+: spec.taint.value: 'x+' must be no more than 63",
    ):
        v.check_taint_rule(rule)


# -- scope and group (contract section 4) ----------------------------------------------------------------
NODE_WIDE = verdict(
    "gpu-1", "Unhealthy", "failed", ["power_delivery"], remediation="reboot_node", scope="node", group="node/node-a"
)


def test_scope_and_group_come_through_verdict_lines_and_into_the_rules_annotations():
    """A verdict line's scope and group are kept (a line without them, an older agent's, is the device's own),
    and each rule says them in its annotations, a device's own with an empty group."""
    lines = [json.dumps(x.to_json()) for x in (NODE_WIDE, FLEET[2])]
    older = {k: x for k, x in FLEET[3].to_json().items() if k not in ("scope", "group")}
    read = r.read_verdict_lines([*lines, json.dumps(older)], "verdicts.jsonl")
    assert [(x.hw_id, x.scope, x.group) for x in read] == [
        ("gpu-1", "node", "node/node-a"),
        ("gpu-2", "device", None),
        ("gpu-3", "device", None),
    ]
    assert [x.to_json() for x in r.read_verdict_lines(lines, "v")] == [NODE_WIDE.to_json(), FLEET[2].to_json()]
    devices = r.read_devices_json({"devices": [NODE_WIDE.to_json(), older]}, "http://agent/v1/devices")
    assert [(x.scope, x.group) for x in devices] == [("node", "node/node-a"), ("device", None)]
    out = r.render([NODE_WIDE, FLEET[2]], policy_mod.load(), driver=DRIVER)
    notes = {x["spec"]["deviceSelector"]["device"]: x["metadata"]["annotations"] for x in out.rules}
    assert (notes["gpu-1"]["health.otel-dra.io/scope"], notes["gpu-1"]["health.otel-dra.io/group"]) == (
        "node",
        "node/node-a",
    )
    assert (notes["gpu-2"]["health.otel-dra.io/scope"], notes["gpu-2"]["health.otel-dra.io/group"]) == ("device", "")
    for rule in out.rules:
        assert_valid_rule(rule)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"scope": "rack"}, "scope 'rack' is not one of: device, workload, node, link, firmware"),
        ({"group": 7}, "group 7"),
    ],
)
def test_a_verdict_line_with_a_scope_outside_the_contract_is_one_line(extra, expected):
    with pytest.raises(VerdictInputError, match=f"^v.jsonl:1: {expected}"):
        r.read_verdict_lines([json.dumps({**NODE_WIDE.to_json(), **extra})], "v.jsonl")


def test_a_rule_that_was_about_its_node_loses_its_group_when_the_verdict_is_the_devices_own_again():
    """An update keeps the annotations it does not set (others' ones): the group is always set, empty for the
    device's own verdict, so no stale group survives the change."""
    before = r.render([NODE_WIDE], policy_mod.load(), "v1beta2", driver=DRIVER).rules
    own = verdict("gpu-1", "Unhealthy", "failed", ["power_delivery"], remediation="reboot_node")
    after = r.render([own], policy_mod.load(), "v1beta2", driver=DRIVER).rules
    [act] = k8s_apply.plan(after, before, {(DRIVER, "node-a")})
    notes = act.body["metadata"]["annotations"]
    assert act.verb == "update" and (notes["health.otel-dra.io/scope"], notes["health.otel-dra.io/group"]) == (
        "device",
        "",
    )


def test_render_through_the_cli_keeps_a_node_verdicts_scope_and_group():
    line = json.dumps({**NODE_WIDE.to_json(), "dra.driver.name": DRIVER})
    result = otel_dra("k8s", "render", "-", stdin=line + "\n")
    assert result.returncode == 0, result.stderr
    [rule] = taint_rules(result.stdout)
    assert rule["metadata"]["annotations"]["health.otel-dra.io/group"] == "node/node-a"
    assert rule["metadata"]["annotations"]["health.otel-dra.io/scope"] == "node"


# -- a finding beyond a device: one rule per device, a shared key and value, one group label (issue #31) ----
SWITCH = "pcie/0000:40:00.0"


def linked(node: str, i: int, group: str = SWITCH, **kw) -> Verdict:
    """gpu-<i> of ``node`` in a link finding (its PCIe switch's): Unhealthy, link, reboot_node."""
    fields = {"remediation": "reboot_node", "node": node, "pool": node, "scope": "link", "group": group, **kw}
    return verdict(f"gpu-{i}", "Unhealthy", "failed", ["link"], **fields)


LINKED = [
    *(linked("node-a", i) for i in range(4)),
    *(linked("node-b", i) for i in range(2)),  # the same PCI address on another host: another finding
    verdict("gpu-7", "Unhealthy", "failed", ["memory_ecc"], remediation="reset_device"),  # a device's own
]


def test_a_finding_is_one_rule_per_device_sharing_its_taint_and_labelled_with_its_group():
    out = r.render(LINKED, policy_mod.load(), driver=DRIVER)
    by_device = {(x["spec"]["deviceSelector"]["pool"], x["spec"]["deviceSelector"]["device"]): x for x in out.rules}
    assert len(out.rules) == len(by_device) == 7  # one reason each: one rule per device
    switch_a = [by_device[("node-a", f"gpu-{i}")] for i in range(4)]
    switch_b = [by_device[("node-b", f"gpu-{i}")] for i in range(2)]
    taints = {(x["spec"]["taint"]["key"], x["spec"]["taint"].get("value")) for x in switch_a + switch_b}
    assert taints == {("health.otel-dra.io/link", "failed")}  # one key and value for the finding's devices
    groups = {x["metadata"]["labels"]["health.otel-dra.io/group"] for x in switch_a}
    assert groups == {"node-a.pcie.0000-40-00.0"}  # the node first: PCI addresses repeat across hosts
    assert {x["metadata"]["labels"]["health.otel-dra.io/group"] for x in switch_b} == {"node-b.pcie.0000-40-00.0"}
    assert by_device[("node-a", "gpu-7")]["metadata"]["labels"]["health.otel-dra.io/group"] == ""
    assert {x["metadata"]["annotations"]["health.otel-dra.io/group"] for x in switch_a + switch_b} == {SWITCH}
    for rule in out.rules:
        assert_valid_rule(rule)


@pytest.mark.parametrize(("version", "kubernetes"), [("v1", "1.37"), ("v1beta2", "1.36"), ("v1alpha3", "1.35")])
def test_a_findings_rules_validate_against_the_official_schema_and_the_client_model(version, kubernetes):
    """The group label on every API version, as its server's OpenAPI schema (strict) and the client take it; a
    fleet-wide group (a firmware version, its name longer than a label value) is cut and hash-suffixed."""
    import kubernetes_validate

    firmware = "firmware/NVIDIA H100 80GB HBM3 with a long product name/96.00.89.00.01-really-long-version"
    fleet_wide = [verdict("gpu-5", "Unhealthy", "failed", ["firmware"], scope="firmware", group=firmware)]
    out = r.render([*LINKED, *fleet_wide], policy_mod.load(), version, driver=DRIVER, kubernetes_version=kubernetes)
    model = {"v1": kc.V1DeviceTaintRule, "v1beta2": kc.V1beta2DeviceTaintRule, "v1alpha3": kc.V1alpha3DeviceTaintRule}
    for rule in out.rules:
        assert kubernetes_validate.validate(rule, kubernetes, strict=True) == kubernetes
        assert kc.ApiClient().sanitize_for_serialization(model[version].from_dict(rule)) == rule
        assert_valid_rule(rule)
    [label] = {
        x["metadata"]["labels"]["health.otel-dra.io/group"]
        for x in out.rules
        if x["spec"]["taint"]["key"].endswith("/firmware")
    }
    assert (
        len(label) == 63 and label.startswith("firmware.NVIDIA-H100-80GB-HBM3") and re.search(r"-[0-9a-f]{8}$", label)
    )


def test_kubectl_finds_a_findings_rules_by_its_group_label(fake_cluster):
    """Applied to a (fake) API server, a list with the group's label selector (as ``kubectl get devicetaintrules
    -l health.otel-dra.io/group=...`` sends it) gets the finding's 4 rules, not the other node's switch's."""
    k8s_apply.apply(r.render(LINKED, policy_mod.load(), driver=DRIVER), k8s_apply.connect())
    api = kc.ResourceV1Api(k8s_apply.connect())
    found = api.list_device_taint_rule(label_selector="health.otel-dra.io/group=node-a.pcie.0000-40-00.0")
    assert sorted(x.spec.device_selector.device for x in found.items) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert {x.spec.device_selector.pool for x in found.items} == {"node-a"}


def test_a_device_that_leaves_a_finding_loses_its_group_label_on_update():
    before = r.render([linked("node-a", 1)], policy_mod.load(), "v1beta2", driver=DRIVER).rules
    own = verdict("gpu-1", "Unhealthy", "failed", ["link"], remediation="reboot_node")
    after = r.render([own], policy_mod.load(), "v1beta2", driver=DRIVER).rules
    [act] = k8s_apply.plan(after, before, {(DRIVER, "node-a")})
    assert act.verb == "update" and act.body["metadata"]["labels"]["health.otel-dra.io/group"] == ""


# -- the policy section -------------------------------------------------------------------------------
def test_the_default_policy_section_is_informational():
    s = r.K8sSettings.from_policy(policy_mod.load())
    assert s.domain == "health.otel-dra.io" and s.taints_enabled and s.effect_default == "None"
    assert s.key == "{domain}/{reason}" and s.max_per_device == 16 and s.taint_health == {"Unhealthy", "Unknown"}
    assert s.effect("memory_ecc", "failed") == "None"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "kubernetes: {taints: {effect: {default: Maybe}}}\n",
            "p.yaml:1:41: kubernetes.taints.effect.default: 'Maybe' is not one of: None, NoSchedule, NoExecute",
        ),
        (
            "kubernetes:\n  taints:\n    effect:\n      by_state: {failed: Evict}\n",
            "p.yaml:4:26: kubernetes.taints.effect.by_state.failed: 'Evict' is not one of",
        ),
        (
            "kubernetes: {taints: {effect: {by_reason: {sunburn: NoSchedule}}}}\n",
            "kubernetes.taints.effect.by_reason key: 'sunburn' is not one of",
        ),
        ("kubernetes: {domain: Health.IO}\n", "p.yaml:1:22: kubernetes.domain: 'Health.IO' must be a DNS subdomain"),
        ("kubernetes: {domain: " + "x" * 64 + ".io}\n", "kubernetes.domain: 'xxxx"),
        (
            "kubernetes:\n  taints:\n    key: '{domain}/{bogus}'\n",
            "p.yaml:3:10: kubernetes.taints.key: '{domain}/{bogus}': {bogus} is not a placeholder here; use: {reason}",
        ),
        ("kubernetes: {taints: {key: '{domain}/" + "x" * 55 + "{reason}'}}\n", "can become 'example.com/xxx"),
        (
            "kubernetes: {taints: {key: 'gpu.{domain}/{reason}'}}\n",
            "the part before '/' is a DNS subdomain or exactly {domain}",
        ),
        ("kubernetes: {taints: {key: 'a/b/{reason}'}}\n", "not a label name"),
        (
            "kubernetes: {taints: {value: '{state} now'}}\n",
            "kubernetes.taints.value: '{state} now' can become 'degraded now', not a label value",
        ),
        ("kubernetes: {taints: {max_per_device: 17}}\n", "kubernetes.taints.max_per_device: 17 is out of range"),
        ("kubernetes: {taints: {enabled: 1}}\n", "kubernetes.taints.enabled: expected true or false, got 1"),
        (
            "kubernetes: {taints: {health: [Sick]}}\n",
            "kubernetes.taints.health[0]: 'Sick' is not one of: Healthy, Unhealthy, Unknown",
        ),
        (
            "kubernetes: {attributes: {1health: '{health}'}}\n",
            "kubernetes.attributes key: '1health' is not an attribute name",
        ),
        ("kubernetes: {attributes: {" + "h" * 33 + ": '{health}'}}\n", "must be no more than 32 characters"),
        (
            "kubernetes: {attributes: {health: '{health} " + "x" * 60 + "'}}\n",
            "which must be no more than 64 characters",
        ),
        (
            "kubernetes: {attributes: {health: '{reason}'}}\n",
            "{reason} is not a placeholder here; use: {health}, {state}, {remediation}",
        ),
        (
            "kubernetes: {colour: red}\n",
            "p.yaml:1:14: kubernetes.colour: unknown key; allowed here: domain, taints, budget, attributes",
        ),
        (
            "kubernetes:\n  taints: {key: '{domain}/unhealthy'}\n",
            "p.yaml: kubernetes.taints: key '{domain}/unhealthy' or value '{state}' must contain {reason}",
        ),
    ],
)
def test_policy_mistakes_in_the_kubernetes_section_are_one_line_with_positions(tmp_path, text, expected):
    with pytest.raises(policy_mod.PolicyError) as err:
        load_policy(tmp_path, text)
    assert "\n" not in str(err.value)
    assert expected in str(err.value)


# -- verdict lines in, YAML out, through the CLI -----------------------------------------------------
@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> Path:
    """The real `otel-dra replay` on a small trace: gpu-1 loses ECC, gpu-2 runs hot (degraded, still Healthy)."""
    work = tmp_path_factory.mktemp("replay")
    trace = write_trace(
        work / "t.jsonl", {"node-a": (3, [Fault("gpu-1", "memory_ecc", 30), Fault("gpu-2", "thermal", 30)])}, 150
    )
    out = work / "verdicts.jsonl"
    result = otel_dra("replay", str(trace), "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def test_render_from_replay_output_keeps_the_last_line_per_device(replayed, tmp_path):
    lines = read_verdicts(replayed)
    assert len(lines) > 3  # several lines for some device: only the last counts
    result = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--attributes")
    assert result.returncode == 0, result.stderr
    rules = taint_rules(result.stdout)
    assert [(x["spec"]["deviceSelector"]["device"], x["spec"]["taint"]["key"]) for x in rules] == [
        ("gpu-1", "health.otel-dra.io/memory_ecc")
    ]
    assert_valid_rule(rules[0])
    attrs = next(d for d in docs(result.stdout) if "devices" in d)["devices"]
    assert {a["device"]: a["attributes"]["health.otel-dra.io/state"]["string"] for a in attrs} == {
        "gpu-0": "ok",
        "gpu-1": "failed",
        "gpu-2": "degraded",
    }
    only = otel_dra(
        "k8s",
        "render",
        "-",
        "--driver",
        DRIVER,
        "--only",
        "taints",
        "--api-version",
        "v1alpha3",
        stdin=replayed.read_text(),
    )
    assert only.returncode == 0, only.stderr
    assert [d["apiVersion"] for d in docs(only.stdout)] == ["resource.k8s.io/v1alpha3"]


def test_by_default_render_prints_only_kubernetes_objects_for_kubectl_apply(replayed):
    result = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER)
    assert result.returncode == 0, result.stderr
    objects = [d for d in docs(result.stdout) if d is not None]
    assert objects and all(d["kind"] == "DeviceTaintRule" for d in objects)
    for obj in objects:
        assert_valid_rule(obj)


def test_the_experimental_attributes_say_so_in_help():
    for argv in (("k8s", "render", "--help"), ("run", "--help")):
        text = " ".join(otel_dra(*argv).stdout.split())
        assert "EXPERIMENTAL" in text and "KEP-5283" in text and "provisional" in text


def test_the_agents_attributes_need_a_directory_to_go_to():
    result = otel_dra("run", "--source", "simulated", "--k8s-attributes")
    assert result.returncode == 2 and "--k8s-attributes needs --k8s-output DIR" in result.stderr


def test_render_to_a_directory_writes_both_files_only_when_changed(replayed, tmp_path):
    out = tmp_path / "k8s"
    plain = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "-o", str(tmp_path / "plain"))
    assert plain.returncode == 0 and "(1 files changed)" in plain.stderr, plain.stderr
    assert [p.name for p in (tmp_path / "plain").iterdir()] == [r.RULES_FILE]  # attributes: opt-in
    first = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--attributes", "-o", str(out))
    assert first.returncode == 0 and "(2 files changed)" in first.stderr, first.stderr
    rules_file, attrs_file = out / r.RULES_FILE, out / r.ATTRIBUTES_FILE
    assert len(taint_rules(rules_file.read_text())) == 1 and "devices" in yaml.safe_load(attrs_file.read_text())
    stamps = (rules_file.stat().st_mtime_ns, attrs_file.stat().st_mtime_ns)
    again = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--attributes", "-o", str(out))
    assert (
        "(0 files changed)" in again.stderr and (rules_file.stat().st_mtime_ns, attrs_file.stat().st_mtime_ns) == stamps
    )
    assert sorted(p.name for p in out.iterdir()) == sorted([r.RULES_FILE, r.ATTRIBUTES_FILE])  # no temp files left


def test_cli_user_errors_are_one_line_exit_2(replayed, tmp_path):
    # Verdict lines without dra.driver.name (telemetry that never carried it): --driver must say.
    driverless = tmp_path / "driverless.jsonl"
    lines = [json.loads(line) for line in replayed.read_text().splitlines()]
    driverless.write_text(
        "".join(json.dumps({k: v for k, v in d.items() if k != "dra.driver.name"}) + "\n" for d in lines)
    )
    no_driver = otel_dra("k8s", "render", str(driverless))
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"k8s.node.name": "n", "hw.id": "g", "health": "Healthy"}\nnot json\n')
    bad_policy = tmp_path / "p.yaml"
    bad_policy.write_text("kubernetes: {taints: {effect: {default: Evict}}}\n")
    for result, expected in [
        (no_driver, "no dra.driver.name in its telemetry"),
        (otel_dra("k8s", "render", str(junk), "--driver", DRIVER), f"{junk}:2: not JSON"),
        (
            otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--policy", str(bad_policy)),
            "'Evict' is not one of",
        ),
        (otel_dra("k8s", "render"), "give a verdict FILE or --from URL"),
        (otel_dra("k8s", "render", str(driverless), "--driver", "Bad_Driver"), "must be a DNS subdomain"),
        (otel_dra("k8s", "render", "--from", f"http://127.0.0.1:{free_port()}"), "cannot read http://127.0.0.1:"),
    ]:
        assert result.returncode == 2, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], result.stderr


def test_render_from_a_running_agent(start_agent):
    agent = start_agent("--interval", "1", "--devices", "2", "--node-name", "node-a", "--fault", "gpu-1:memory_ecc@1")

    def gpu1_unhealthy() -> bool:
        devices = json.loads(http_get(agent.url + "/v1/devices")[1])["devices"]
        return any(d["hw.id"] == "gpu-1" and d["health"] == "Unhealthy" for d in devices)

    wait_for(gpu1_unhealthy, 20, "gpu-1 to turn Unhealthy")
    result = otel_dra("k8s", "render", "--from", agent.url)  # the verdicts carry dra.driver.name
    assert result.returncode == 0, result.stderr
    rules = taint_rules(result.stdout)
    simulated = "gpu.simulated.otel-dra.io"  # the simulator's driver: never a real one's
    assert [(x["spec"]["deviceSelector"], x["spec"]["taint"]["key"]) for x in rules] == [
        ({"device": "gpu-1", "driver": simulated, "pool": "node-a"}, "health.otel-dra.io/memory_ecc")
    ]
    assert_valid_rule(rules[0])


# -- --apply ---------------------------------------------------------------------------------------
def no_cluster_env(tmp_path: Path) -> dict:
    env = {k: x for k, x in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(tmp_path / "no-such-kubeconfig")
    return env


def test_apply_without_a_cluster_is_one_line_exit_2(replayed, tmp_path):
    result = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--apply", env=no_cluster_env(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--apply: no Kubernetes cluster to talk to" in lines[0], result.stderr
    assert result.stdout == ""  # with --apply, no YAML unless -o asks for it


def test_apply_to_a_cluster_that_refuses_connections_is_one_line_exit_2(replayed, tmp_path):
    env = no_cluster_env(tmp_path)
    Path(env["KUBECONFIG"]).write_text(kubeconfig(f"http://127.0.0.1:{free_port()}"))
    result = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--apply", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the Kubernetes API at http://127.0.0.1:" in lines[0], result.stderr
    assert "connection refused" in lines[0]


def managed(name: str, pool: str = "node-a", effect: str = "None", **extra_meta) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "otel-dra"}, **extra_meta},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": pool, "device": name},
            "taint": {"key": f"health.otel-dra.io/{name}", "value": "failed", "effect": effect},
        },
    }


def test_plan_creates_updates_and_deletes_idempotently():
    desired = [managed("a"), managed("b", effect="NoSchedule"), managed("c")]
    server_a = managed("a", resourceVersion="7", uid="u1")  # as the server returns it
    server_a["spec"]["taint"]["timeAdded"] = "2030-01-01T00:00:00Z"
    server_a["metadata"]["labels"]["team"] = "gpu"  # someone else's label: not ours to judge
    server_b = managed("b", resourceVersion="3")
    server_b["spec"]["taint"]["timeAdded"] = "2030-01-01T00:00:00Z"
    healthy_again = managed("d", resourceVersion="4")
    other_pool = managed("e", pool="node-z")
    not_ours = managed("f")
    not_ours["metadata"]["labels"] = {}
    actions = k8s_apply.plan(desired, [server_a, server_b, healthy_again, other_pool, not_ours], {(DRIVER, "node-a")})
    assert sorted((a.verb, a.name) for a in actions) == [("create", "c"), ("delete", "d"), ("update", "b")]
    update = next(a for a in actions if a.verb == "update").body
    assert update["metadata"]["resourceVersion"] == "3"
    assert update["spec"]["taint"] == {**desired[1]["spec"]["taint"], "timeAdded": "2030-01-01T00:00:00Z"}
    # once applied, the same rendering plans nothing
    applied = [
        server_a,
        {**update, "metadata": {**update["metadata"], "resourceVersion": "9"}},
        managed("c"),
        other_pool,
    ]
    assert k8s_apply.plan(desired, applied, {(DRIVER, "node-a")}) == []
    # an annotation we set that changed is an update too; others' labels and annotations are kept
    changed = managed("a", annotations={"health.otel-dra.io/remediation": "replace_device"})
    [act] = k8s_apply.plan([changed], [server_a], {(DRIVER, "node-a")})
    assert act.verb == "update" and act.body["metadata"]["labels"]["team"] == "gpu"


def test_a_new_message_alone_does_not_rewrite_a_rule_but_rides_along_with_any_other_change():
    """The message carries durations ("no telemetry for 5s") that differ between evaluations and
    between fleet replicas: rewriting a rule for that alone would be churn after every takeover."""
    old = managed("a", resourceVersion="7", annotations={"health.otel-dra.io/message": "for 4s", "x/y": "1"})
    assert k8s_apply.plan([managed("a", annotations={"health.otel-dra.io/message": "for 5s"})], [old], None) == []
    moved = managed("a", annotations={"health.otel-dra.io/message": "for 5s", "health.otel-dra.io/health": "Unknown"})
    [act] = k8s_apply.plan([moved], [old], None)
    assert act.verb == "update" and act.body["metadata"]["annotations"]["health.otel-dra.io/message"] == "for 5s"


def test_the_fleets_plan_owns_every_managed_rule_whatever_its_pool():
    other_pool = managed("e", pool="node-z", resourceVersion="2")
    assert k8s_apply.plan([], [other_pool], {(DRIVER, "node-a")}) == []  # an agent leaves it to its node
    assert [(a.verb, a.name) for a in k8s_apply.plan([], [other_pool], None)] == [("delete", "e")]


@pytest.fixture
def fake_cluster(tmp_path, monkeypatch):
    api = FakeApiServer()
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(api, tmp_path)))
    yield api
    api.close()


def test_apply_reconciles_through_the_kubernetes_client(fake_cluster):
    pol = policy_mod.load()
    sick = [verdict("gpu-0"), verdict("gpu-1", "Unhealthy", "failed", ["memory_ecc", "thermal"])]
    first = k8s_apply.apply(r.render(sick, pol, driver=DRIVER), k8s_apply.connect())
    assert sorted(a.verb for a in first.actions) == ["create", "create"]
    assert {o["spec"]["taint"]["key"] for o in fake_cluster.objects.values()} == {
        "health.otel-dra.io/memory_ecc",
        "health.otel-dra.io/thermal",
    }
    again = k8s_apply.apply(r.render(sick, pol, driver=DRIVER), k8s_apply.connect())
    assert again.actions == [] and again.unchanged == 2  # idempotent: a rerun sends nothing
    better = [verdict("gpu-0"), verdict("gpu-1", "Unhealthy", "failed", ["memory_ecc"], remediation="replace_device")]
    third = k8s_apply.apply(r.render(better, pol, driver=DRIVER), k8s_apply.connect())
    assert sorted((a.verb, a.name.split("-")[-2]) for a in third.actions) == [("delete", "thermal"), ("update", "ecc")]
    [kept] = fake_cluster.objects.values()
    added = dt.datetime.fromisoformat(kept["spec"]["taint"]["timeAdded"].replace("Z", "+00:00"))
    assert added == dt.datetime(2030, 1, 1, tzinfo=dt.UTC)  # the eviction clock did not restart
    healed = k8s_apply.apply(r.render([verdict("gpu-0"), verdict("gpu-1")], pol, driver=DRIVER), k8s_apply.connect())
    assert [a.verb for a in healed.actions] == ["delete"] and fake_cluster.objects == {}


def test_apply_from_the_cli_and_an_unserved_api_version(fake_cluster, replayed):
    env = {**os.environ}
    result = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--apply", env=env)
    assert result.returncode == 0, result.stderr
    assert "applied: 1 created, 0 updated, 0 deleted, 0 unchanged" in result.stderr
    again = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--apply", "-o", "-", env=env)
    assert "applied: 0 created, 0 updated, 0 deleted, 1 unchanged" in again.stderr and taint_rules(again.stdout)
    alpha = otel_dra(
        "k8s", "render", str(replayed), "--driver", DRIVER, "--apply", "--api-version", "v1alpha3", env=env
    )
    assert alpha.returncode == 2 and "does not serve resource.k8s.io/v1alpha3 devicetaintrules" in alpha.stderr


# -- the agent's sink ----------------------------------------------------------------------------------
def driver_attrs(node: str, hw_id: str) -> dict:
    return {"dra.driver.name": DRIVER, "dra.pool.name": node, "dra.device.name": hw_id}


def test_the_sink_writes_atomically_and_only_on_change(tmp_path):
    board = VerdictBoard()
    board.update(FLEET, driver_attrs)
    sink = K8sOutputSink(board, tmp_path / "out", policy_mod.load(), "v1alpha3", attributes=True)
    rules_file, attrs_file = tmp_path / "out" / r.RULES_FILE, tmp_path / "out" / r.ATTRIBUTES_FILE
    assert sink.write() is True
    assert len(taint_rules(rules_file.read_text())) == 2
    assert stat.S_IMODE(rules_file.stat().st_mode) == 0o644
    stamps = (rules_file.stat().st_mtime_ns, attrs_file.stat().st_mtime_ns)
    assert sink.write() is False and sink.writes == 2
    assert (rules_file.stat().st_mtime_ns, attrs_file.stat().st_mtime_ns) == stamps
    # a fresh sink (an agent restart) finds the same content on disk and leaves it alone
    assert K8sOutputSink(board, tmp_path / "out", policy_mod.load(), "v1alpha3", attributes=True).write() is False
    board.update([verdict("gpu-1", "Healthy", "ok")], driver_attrs)
    inode = rules_file.stat().st_ino
    assert sink.write() is True
    assert len(taint_rules(rules_file.read_text())) == 1 and rules_file.stat().st_ino != inode  # renamed in
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([r.RULES_FILE, r.ATTRIBUTES_FILE])


def test_the_sink_thread_follows_the_board(tmp_path):
    board = VerdictBoard()
    board.update([verdict("gpu-0")], driver_attrs)
    sink = K8sOutputSink(board, tmp_path, policy_mod.load(), poll_s=0.1)
    sink.start()
    try:
        rules_file = tmp_path / r.RULES_FILE
        wait_for(lambda: rules_file.exists(), 5, "the first write")
        assert taint_rules(rules_file.read_text()) == []
        board.update([verdict("gpu-0", "Unhealthy", "failed", ["device_lost"])], driver_attrs)
        wait_for(lambda: len(taint_rules(rules_file.read_text())) == 1, 5, "the rule for gpu-0")
    finally:
        t0 = time.monotonic()
        sink.shutdown()
        assert time.monotonic() - t0 < 1.0
    assert sink._thread is not None and not sink._thread.is_alive()


def test_the_sink_rejects_a_bad_api_version_before_the_agent_starts(tmp_path):
    with pytest.raises(ValueError, match="'v2' is not one of: v1, v1beta2, v1alpha3"):
        K8sOutputSink(VerdictBoard(), tmp_path, policy_mod.load(), "v2")


def test_the_sink_applies_the_rules_in_cluster_when_asked(fake_cluster, tmp_path):
    board = VerdictBoard()
    board.update([verdict("gpu-0"), verdict("gpu-1", "Unhealthy", "failed", ["device_lost"])], driver_attrs)
    sink = K8sOutputSink(board, tmp_path, policy_mod.load(), apply_rules=True, poll_s=0.05, resync_s=0.2)
    sink.start()
    try:
        wait_for(lambda: len(fake_cluster.objects) == 1, 5, "the rule for gpu-1 in the cluster")
        fake_cluster.objects.clear()  # deleted by hand: the resync brings it back
        wait_for(lambda: len(fake_cluster.objects) == 1, 5, "the resync")
        board.update([verdict("gpu-1")], driver_attrs)
        wait_for(lambda: not fake_cluster.objects, 5, "the rule to go once gpu-1 is healthy")
    finally:
        sink.shutdown()
    assert sink.applies >= 3 and "DELETE" in " ".join(fake_cluster.requests)


def test_the_sink_needs_a_cluster_to_apply_and_says_so_before_starting(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(k8s_apply.ClusterUnavailable, match="no Kubernetes cluster to talk to"):
        K8sOutputSink(VerdictBoard(), tmp_path, policy_mod.load(), apply_rules=True)


# -- --apply discovers the DeviceTaintRule version the server serves ------------------------------------
@pytest.fixture
def cluster(tmp_path):
    """A FakeApiServer built by the test, and the environment whose kubeconfig points at it."""
    started: list[FakeApiServer] = []

    def start(**kw) -> tuple[FakeApiServer, dict]:
        api = FakeApiServer(**kw)
        started.append(api)
        return api, {**os.environ, "KUBECONFIG": str(write_kubeconfig(api, tmp_path))}

    yield start
    for api in started:
        api.close()


@pytest.mark.parametrize(
    ("group_versions", "taint_versions", "kubernetes", "expected"),
    [
        (("v1", "v1beta2", "v1beta1"), ("v1", "v1beta2"), "1.37", "v1"),
        (("v1", "v1beta2", "v1beta1", "v1alpha3"), ("v1beta2", "v1alpha3"), "1.36", "v1beta2"),
        (("v1", "v1beta1", "v1alpha3"), ("v1alpha3",), "1.35", "v1alpha3"),
    ],
)
def test_apply_uses_the_newest_version_the_server_serves(
    cluster, replayed, group_versions, taint_versions, kubernetes, expected
):
    api, env = cluster(
        served=expected, group_versions=group_versions, taint_versions=taint_versions, kubernetes=kubernetes
    )
    result = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--apply", env=env)
    assert result.returncode == 0, result.stderr
    chosen = [line for line in result.stderr.splitlines() if line.startswith("DeviceTaintRules:")]
    assert chosen == [f"DeviceTaintRules: resource.k8s.io/{expected} (served by Kubernetes {kubernetes} at {api.url})"]
    assert "applied: 1 created" in result.stderr
    [rule] = api.objects.values()
    assert rule["apiVersion"] == f"resource.k8s.io/{expected}"
    assert f"GET /apis/resource.k8s.io/{expected}/devicetaintrules" in api.requests
    assert "GET /apis/resource.k8s.io" in api.requests and "GET /version" in api.requests


def test_discovery_passes_the_servers_kubernetes_version_to_the_effect_rules(cluster, replayed):
    # 1.34 serves v1alpha3, but not effect None (the default policy's): the rendering says so
    api, env = cluster(served="v1alpha3", group_versions=("v1", "v1alpha3"), kubernetes="1.34")
    result = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--apply", env=env)
    assert result.returncode == 2, result.stderr
    assert "1.35" in result.stderr.strip().splitlines()[-1] and api.objects == {}


@pytest.mark.parametrize(
    ("group_versions", "kubernetes", "why"),
    [
        (
            ("v1", "v1beta1"),
            "1.36",
            "Kubernetes 1.36: resource.k8s.io serves v1, v1beta1; v1beta2 DeviceTaintRules need the "
            "DRADeviceTaintRules feature gate and the resource.k8s.io/v1beta2 API enabled)",
        ),
        (
            ("v1", "v1beta1"),
            "1.34",
            "Kubernetes 1.34: resource.k8s.io serves v1, v1beta1; v1alpha3 DeviceTaintRules need the "
            "DRADeviceTaints feature gate and the resource.k8s.io/v1alpha3 API enabled)",
        ),
    ],
)
def test_a_server_without_devicetaintrules_is_one_line_naming_the_gate(
    cluster, replayed, group_versions, kubernetes, why
):
    api, env = cluster(group_versions=group_versions, taint_versions=(), kubernetes=kubernetes)
    result = otel_dra("k8s", "render", str(replayed), "--driver", DRIVER, "--apply", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [f"otel-dra: error: --apply: DeviceTaintRules are not served by {api.url} ({why}"], result.stderr
    assert not any("devicetaintrules" in q for q in api.requests)


def test_an_explicit_api_version_skips_discovery(cluster, replayed):
    api, env = cluster(served="v1beta2", group_versions=("v1", "v1beta2"), kubernetes="1.36")
    result = otel_dra(
        "k8s", "render", str(replayed), "--driver", DRIVER, "--apply", "--api-version", "v1beta2", env=env
    )
    assert result.returncode == 0, result.stderr
    assert "DeviceTaintRules:" not in result.stderr and "applied: 1 created" in result.stderr
    assert not any(q in ("GET /version", "GET /apis/resource.k8s.io") for q in api.requests), api.requests


def test_silence_does_not_repair_a_silent_devices_rules_are_neither_deleted_nor_changed():
    """Issue #27: a device whose verdict is Unknown (its telemetry stopped) keeps the rules it has; what it did not
    have (stale) is still created, and a device that speaks again is reconciled as before."""
    held = managed("a", effect="NoExecute", resourceVersion="5")
    stale = managed("a-stale")
    stale["spec"]["deviceSelector"]["device"] = "a"  # the same device's stale rule
    silent = {(DRIVER, "node-a", "a")}
    weaker = managed("a", effect="None")  # what an Unknown verdict would render for it
    actions = k8s_apply.plan([weaker, stale], [held], None, silent)
    assert [(x.verb, x.name) for x in actions] == [("create", "a-stale")]
    assert k8s_apply.plan([stale], [held], None, silent) == [k8s_apply.Action("create", "a-stale", stale)]
    # Heard again (not silent): its verdict rules.
    assert sorted((x.verb, x.name) for x in k8s_apply.plan([], [held, stale], None)) == [
        ("delete", "a"),
        ("delete", "a-stale"),
    ]
