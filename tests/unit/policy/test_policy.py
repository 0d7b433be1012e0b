"""Policy as data: the default validates, user files merge over it, every mistake is one line
with its file position, and `otel-dra policy check` shows the effective policy."""

import subprocess
import sys

import pytest
import yaml

from otel_dra import policy
from otel_dra.classifier.params import version_key


def check(tmp_path, text: str):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return policy.load(path), path


def test_default_policy_loads_with_every_reason():
    p = policy.load()
    assert p.window_s == 300 and p.stale_timeout_s == 60
    assert set(p.rules) == set(policy.RULES_KEYS)
    assert p.hold_s("memory_ecc") == 3600 and p.hold_s("thermal") == 180


def test_a_user_file_merges_over_the_default(tmp_path):
    p, _ = check(tmp_path, "window: 10m\nrules:\n  thermal:\n    min_fraction: 0.8\n")
    assert p.window_s == 600
    assert p.rules["thermal"]["min_fraction"] == 0.8
    assert p.rules["thermal"]["throttle_share"] == 0.1  # untouched keys keep their default


def test_overrides_apply_per_vendor_and_model(tmp_path):
    p, _ = check(
        tmp_path,
        "overrides:\n"
        "  - match: {hw.vendor: NVIDIA, hw.model: 'A100*'}\n"
        "    rules: {thermal: {fallback_limits: {high.degraded: 80}}}\n",
    )
    assert p.rules_for("NVIDIA", "A100-SXM4-80GB")["thermal"]["fallback_limits"]["high.degraded"] == 80
    assert p.rules_for("NVIDIA", "H100 80GB HBM3")["thermal"]["fallback_limits"]["high.degraded"] == 85
    assert p.rules_for("AMD", "MI300X")["thermal"]["fallback_limits"]["high.degraded"] == 85


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("window: 5x\n", "p.yaml:1:9: window: '5x' is not a duration"),
        ("rules:\n  thermal:\n    colour: red\n", "p.yaml:3:5: rules.thermal.colour: unknown key; allowed here:"),
        ("rules: {thermal: {min_fraction: 1.5}}\n", "rules.thermal.min_fraction: 1.5 is out of range"),
        ("rules: {memory_ecc: {uncorrected: 0.5}}\n", "rules.memory_ecc.uncorrected: expected a whole number"),
        ("unhealthy_states: [broken]\n", "unhealthy_states[0]: 'broken' is not one of"),
        ("rules: {link: {remediation: [pray]}}\n", "rules.link.remediation[0]: 'pray' is not one of: none,"),
        ("hold: {thermal: forever}\n", "hold.thermal: 'forever' is not a duration"),
        (
            "rules: {thermal: {peers: {baseline_tau: 0s}}}\n",
            "rules.thermal.peers.baseline_tau: must be longer than 0s",
        ),
        ("hold: {sunburn: 1m}\n", "hold key: 'sunburn' is not one of: default, thermal"),
        ("rules: [1, 2]\n", "rules: expected a mapping"),
        ("window: [1\n", "not valid YAML"),
        ("rules: {memory_ecc: {retired_pages_predicted: 100}}\n", "must not exceed retired_pages_failed"),
        (
            "rules: {thermal: {min_fraction: !foo 0.5}}\n",
            "p.yaml:1:33: rules.thermal.min_fraction: could not determine a constructor for the tag '!foo'",
        ),
        ("window: !!python/name:os.system 5m\n", "p.yaml:1:9: window: could not determine a constructor"),
    ],
)
def test_every_mistake_is_one_line_naming_the_key_and_position(tmp_path, text, expected):
    with pytest.raises(policy.PolicyError) as err:
        check(tmp_path, text)
    message = str(err.value)
    assert "\n" not in message
    assert expected in message


def test_each_load_is_its_own_though_the_default_is_parsed_once(tmp_path, monkeypatch):
    """The shipped default is parsed once a process; each load gets a copy of it: what one load (or a user's file
    merged over it) changes, no later load sees."""
    from otel_dra.policy import loading
    from otel_dra.policy.sections import in_effect

    policy.load()
    parsed: list[str] = []
    real_parse = loading.parse
    monkeypatch.setattr(
        loading, "parse", lambda text, source, *a, **k: parsed.append(source) or real_parse(text, source, *a, **k)
    )
    mine = loading._default_data(in_effect(None))
    mine["window"] = 1.0
    mine["rules"]["thermal"]["min_fraction"] = 0.99
    check(tmp_path, "window: 10m\nrules:\n  thermal:\n    min_fraction: 0.8\n")
    p = policy.load()
    assert p.window_s == 300 and p.rules["thermal"]["min_fraction"] == 0.5
    assert parsed == [str(tmp_path / "p.yaml")]  # the user's file alone: the default was parsed before


def test_a_section_kept_as_read_names_a_tag_it_cannot_build_too(tmp_path):
    """An owned section loaded without its owner is read as plain YAML: a tag there is one line, as a checked
    key's is."""
    path = tmp_path / "p.yaml"
    path.write_text("kubernetes:\n  taints: !foo 1\n")
    with pytest.raises(policy.PolicyError) as err:
        policy.load(path, sections={})
    assert (
        str(err.value)
        == f"{path}:2:3: kubernetes: could not determine a constructor for the tag '!foo'; write a plain value"
    )


def test_yaml_is_never_evaluated(tmp_path):
    with pytest.raises(policy.PolicyError):
        check(tmp_path, "window: !!python/object/apply:os.system ['echo pwned']\n")


def test_policy_check_prints_the_effective_policy_and_rejects_bad_files(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("window: 2m\n")
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "policy", "check", str(good)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["window"] == 120 and effective["rules"]["thermal"]["min_fraction"] == 0.5
    bad = tmp_path / "bad.yaml"
    bad.write_text("stale_timeout: -5\n")
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "policy", "check", str(bad)], capture_output=True, text=True
    )
    assert result.returncode == 2
    expected = f"otel-dra: error: {bad}:1:16: stale_timeout: -5 is not a duration; write e.g. 30s, 5m, 1h"
    assert result.stderr.strip().splitlines() == [expected + " or a number of seconds"]


def test_firmware_versions_compare_by_segments_hex_included():
    assert version_key("96.00.5F.00.01") > version_key("96.00.30.00.01")
    assert version_key("535.104.12") > version_key("535.54.03")
    assert version_key("1.10") > version_key("1.9")


def test_event_thresholds_must_fit_the_event_log(tmp_path):
    with pytest.raises(policy.PolicyError, match=r"rules.device_reset.resets \(9\) is above the 8 events kept"):
        check(tmp_path, "rules: {device_reset: {resets: 9}}\n")
    with pytest.raises(policy.PolicyError, match="above the 8 events kept"):
        check(tmp_path, "overrides:\n  - match: {hw.vendor: AMD}\n    rules: {memory_pressure: {out_of_memory: 12}}\n")


def test_shared_devices_combine_mode_is_validated(tmp_path):
    assert check(tmp_path, "shared_devices: {combine: majority}\n")[0].shared_devices.combine == "majority"
    with pytest.raises(policy.PolicyError, match=r"shared_devices.combine: 'most' is not one of: any, majority, all"):
        check(tmp_path, "shared_devices: {combine: most}\n")


def test_the_horizon_and_cohorts_are_validated(tmp_path):
    p, _ = check(tmp_path, "horizon: {bucket: 2m, rate_span: 1h}\ncohorts: {by: [hw.model], min_devices: 4}\n")
    assert (p.horizon.bucket_s, p.horizon.duty_buckets, p.horizon.rate_buckets) == (120, 8, 30)
    assert p.cohorts.keys == ("hw.model",) and p.cohorts.min_devices == 4
    mistakes = [
        ("horizon: {duty_span: 30m, rate_span: 20m}", r"horizon: need 1s <= bucket \(60s\) <= duty_span \(1800s\)"),
        ("horizon: {bucket: 1s, duty_span: 10m, rate_span: 48m}", r"2880 buckets per device; use at most 1440"),
        ("cohorts: {healthy_ratio: 0.5}", r"p.yaml:1:26: cohorts.healthy_ratio: 0.5 is out of range; use a number at"),
        ("stale_intervals: 1.5", r"stale_intervals: 1.5 is out of range; use a number between 2 and 100"),
    ]
    for text, expected in mistakes:
        with pytest.raises(policy.PolicyError, match=expected):
            check(tmp_path, text + "\n")
