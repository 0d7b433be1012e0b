"""Health policy as data: load, validate, merge over the default, resolve per device model.

The whole file is validated before anything runs: an unknown key, a wrong type or a bad
value is one :class:`PolicyError` naming the file, line, column and key, and what would be
valid. A user file is merged over ``policies/default.yaml``, so it only needs the keys it
changes. YAML is read with the safe loader and nothing in it is ever evaluated.
"""

from __future__ import annotations

import copy
import fnmatch
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from otel_dra.sinks.k8s import validation as k8s
from otel_dra.vocabulary import COMBINE_MODES, HEALTH, REASONS, REMEDIATIONS

DEFAULT_POLICY = "default.yaml"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

#: Event-count thresholds, judged on each device's log of its last EVENT_LOG_DEPTH events.
EVENT_LOG_DEPTH = 8
EVENT_THRESHOLDS = (
    ("memory_pressure", "out_of_memory"),
    ("driver_errors", "application_repeats"),
    ("device_reset", "resets"),
)

#: Buckets the long horizon keeps per device at most (memory: about 50 bytes a bucket).
HORIZON_MAX_BUCKETS = 1440

#: Driver error code classes, and the ladder step a fatal class starts at.
DRIVER_CLASSES: tuple[str, ...] = ("ignore", "application", "reset_device", "reboot_node", "mechanical")
#: hw.state values a rule may set (Unknown is not a state).
RULE_STATES: tuple[str, ...] = ("degraded", "predicted_failure", "failed")


def _show(value: object, limit: int = 60) -> str:
    """A value as it appears in an error: its repr, shortened so a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]


class PolicyError(ValueError):
    """A policy file a user must fix; ``str()`` is one line: ``FILE:LINE:COL: KEY: problem``."""


# -- validators -------------------------------------------------------------------------------
# Each validator takes a YAML node and a location function and returns the Python value,
# raising PolicyError with the node's position.
Where = Callable[[yaml.Node, str], PolicyError]
Validator = Callable[[yaml.Node, str, Where], Any]


def _scalar(node: yaml.Node, key: str, where: Where) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        got = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
        raise where(node, f"{key}: expected a single value, got a {got}")
    return yaml.safe_load(yaml.serialize(node))


def number(lo: float | None = None, hi: float | None = None, integer: bool = False) -> Validator:
    def check(node: yaml.Node, key: str, where: Where) -> float:
        value = _scalar(node, key, where)
        kind = "a whole number" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
            raise where(node, f"{key}: expected {kind}, got {_show(value)}")
        if value != value or (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"between {lo:g} and {hi:g}" if lo is not None and hi is not None else f"at least {lo:g}"
            raise where(node, f"{key}: {_show(value)} is out of range; use {kind} {bounds}")
        return value

    return check


def duration(node: yaml.Node, key: str, where: Where) -> float:
    """``30s``, ``5m``, ``1h``, ``1d`` or seconds; returned in seconds."""
    value = _scalar(node, key, where)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    match = _DURATION.match(str(value)) if isinstance(value, str) else None
    if match is None:
        raise where(node, f"{key}: {_show(value)} is not a duration; write e.g. 30s, 5m, 1h or a number of seconds")
    return float(match[1]) * _UNITS[match[2]]


def one_of(choices: tuple[str, ...]) -> Validator:
    def check(node: yaml.Node, key: str, where: Where) -> str:
        value = _scalar(node, key, where)
        if value not in choices:
            raise where(node, f"{key}: {_show(value)} is not one of: {', '.join(choices)}")
        return str(value)

    return check


def string(node: yaml.Node, key: str, where: Where) -> str:
    value = _scalar(node, key, where)
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        raise where(node, f"{key}: expected a string, got {_show(value)}")
    return str(value)


def boolean(node: yaml.Node, key: str, where: Where) -> bool:
    value = _scalar(node, key, where)
    if not isinstance(value, bool):
        raise where(node, f"{key}: expected true or false, got {_show(value)}")
    return value


def list_of(item: Validator, min_len: int = 0) -> Validator:
    def check(node: yaml.Node, key: str, where: Where) -> list[Any]:
        if not isinstance(node, yaml.SequenceNode):
            raise where(node, f"{key}: expected a list, e.g. [a, b]")
        if len(node.value) < min_len:
            raise where(node, f"{key}: needs at least {min_len} entr{'y' if min_len == 1 else 'ies'}")
        return [item(child, f"{key}[{i}]", where) for i, child in enumerate(node.value)]

    return check


def map_of(key_check: Validator, value_check: Validator) -> Validator:
    def check(node: yaml.Node, key: str, where: Where) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            raise where(node, f"{key}: expected a mapping, e.g. {{a: 1}}")
        return {
            key_check(k, f"{key} key", where): value_check(v, f"{key}.{_scalar(k, key, where)}", where)
            for k, v in node.value
        }

    return check


def struct(fields: Mapping[str, Validator]) -> Validator:
    """A mapping with exactly these keys allowed (any subset: the rest comes from the default)."""

    def check(node: yaml.Node, key: str, where: Where) -> dict[str, Any]:
        if not isinstance(node, yaml.MappingNode):
            raise where(node, f"{key or 'policy'}: expected a mapping")
        out: dict[str, Any] = {}
        for k, v in node.value:
            name = _scalar(k, key, where)
            path = f"{key}.{name}" if key else str(name)
            if name not in fields:
                raise where(k, f"{path}: unknown key; allowed here: {', '.join(fields)}")
            if name in out:
                raise where(k, f"{path}: given twice")
            out[str(name)] = fields[str(name)](v, path, where)
        return out

    return check


FRACTION = number(0.0, 1.0)
POSITIVE = number(0.0)
COUNT = number(1, None, integer=True)
LADDER = list_of(one_of(REMEDIATIONS), min_len=1)
STATE = one_of(RULE_STATES)
CODES = list_of(string)

RULES = struct(
    {
        "thermal": struct(
            {
                "state": STATE,
                "min_fraction": FRACTION,
                "critical_state": STATE,
                "throttle_share": FRACTION,
                "duty": FRACTION,
                "fallback_limits": struct({"high.degraded": number(), "high.critical": number()}),
                "remediation": LADDER,
            }
        ),
        "cooling": struct(
            {
                "state": STATE,
                "min_rpm": POSITIVE,
                "min_ratio": FRACTION,
                "warm": number(),
                "min_fraction": FRACTION,
                "duty": FRACTION,
                "remediation": LADDER,
            }
        ),
        "memory_ecc": struct(
            {
                "uncorrected": COUNT,
                "retired_pages_failed": COUNT,
                "retired_pages_predicted": COUNT,
                "corrected_per_minute": POSITIVE,
                "corrected_mad_k": POSITIVE,
                "corrected_storm_ratio": number(1.0),
                "corrected_cohort_ratio": number(1.0),
                "corrected_floor_per_minute": POSITIVE,
                "remediation": LADDER,
            }
        ),
        "power_delivery": struct(
            {"state": STATE, "errors": COUNT, "voltage_fraction": FRACTION, "duty": FRACTION, "remediation": LADDER}
        ),
        "power_throttling": struct(
            {
                "state": STATE,
                "throttle_share": FRACTION,
                "pinned_ratio": FRACTION,
                "pinned_fraction": FRACTION,
                "duty": FRACTION,
                "remediation": LADDER,
            }
        ),
        "memory_pressure": struct(
            {
                "state": STATE,
                "utilization": FRACTION,
                "min_fraction": FRACTION,
                "duty": FRACTION,
                "out_of_memory": COUNT,
                "events_window": duration,
                "remediation": LADDER,
            }
        ),
        "link": struct(
            {
                "state": STATE,
                "replays_per_lane_per_minute": map_of(number(1, 16, integer=True), POSITIVE),
                "default_generation": number(1, 16, integer=True),
                "default_width": number(1, 64, integer=True),
                "mad_k": POSITIVE,
                "storm_ratio": number(1.0),
                "cohort_ratio": number(1.0),
                "floor_per_minute": POSITIVE,
                "duty": FRACTION,
                "downgrade_fraction": FRACTION,
                "generation_min_utilization": FRACTION,
                "remediation": LADDER,
            }
        ),
        "driver_errors": struct(
            {
                "code_tables": map_of(string, struct(dict.fromkeys(DRIVER_CLASSES, CODES))),
                "application_repeats": COUNT,
                "events_window": duration,
                "remediation": LADDER,
            }
        ),
        "firmware": struct({"state": STATE, "deny": CODES, "minimum": map_of(string, string), "remediation": LADDER}),
        "device_reset": struct({"state": STATE, "resets": COUNT, "events_window": duration, "remediation": LADDER}),
        "device_lost": struct({"remediation": LADDER}),
        "vendor_status": struct({"remediation": LADDER}),
    }
)

# -- kubernetes: taints and attributes (otel_dra.sinks.k8s) ------------------------------------------
#: Placeholders of a taint key or value (one taint per reason), and of an attribute value (per device).
TAINT_FIELDS: tuple[str, ...] = ("reason", "state", "health", "remediation")
ATTRIBUTE_FIELDS: tuple[str, ...] = ("health", "state", "remediation")


def _k8s_domain(node: yaml.Node, key: str, where: Where) -> str:
    """The domain of taint keys and attribute names: a DNS subdomain of at most 63 (attribute domain limit)."""
    value = string(node, key, where)
    problem = k8s.dns1123_subdomain_problem(value, k8s.ATTRIBUTE_DOMAIN_MAX)
    if problem:
        raise where(node, f"{key}: {_show(value)} {problem}")
    return value


def _expansions(
    node: yaml.Node, key: str, where: Where, template: str, fields: tuple[str, ...], shown: str
) -> list[str]:
    try:
        return list(k8s.expansions(template, fields))
    except ValueError as exc:
        raise where(node, f"{key}: {_show(shown)}: {exc}") from None


def _taint_key(node: yaml.Node, key: str, where: Where) -> str:
    """A label name once filled in, for every reason, state, health and remediation."""
    value = string(node, key, where)
    prefix, slash, name = value.rpartition("/")
    if "{" in prefix and prefix != "{domain}":
        raise where(node, f"{key}: {_show(value)}: the part before '/' is a DNS subdomain or exactly {{domain}}")
    head = ("example.com" if prefix == "{domain}" else prefix) + slash
    for filled in _expansions(node, key, where, name, TAINT_FIELDS, value):
        problem = k8s.label_name_problem(head + filled)
        if problem:
            raise where(node, f"{key}: {_show(value)} can become {_show(head + filled)}, not a label name: {problem}")
    return value


def _taint_value(node: yaml.Node, key: str, where: Where) -> str:
    """A label value (at most 63 characters) once filled in."""
    value = string(node, key, where)
    for filled in _expansions(node, key, where, value, TAINT_FIELDS, value):
        problem = k8s.label_value_problem(filled)
        if problem:
            raise where(node, f"{key}: {_show(value)} can become {_show(filled)}, not a label value: {problem}")
    return value


def _attribute_name(node: yaml.Node, key: str, where: Where) -> str:
    value = string(node, key, where)
    problem = k8s.c_identifier_problem(value)
    if problem:
        raise where(node, f"{key}: {_show(value)} is not an attribute name (after '<domain>/'): {problem}")
    return value


def _attribute_value(node: yaml.Node, key: str, where: Where) -> str:
    """A string attribute value (at most 64 characters) once filled in."""
    value = string(node, key, where)
    for filled in _expansions(node, key, where, value, ATTRIBUTE_FIELDS, value):
        problem = k8s.attribute_string_problem(filled)
        if problem:
            raise where(node, f"{key}: {_show(value)} can become {_show(filled)}, which {problem}")
    return value


def _attributes(node: yaml.Node, key: str, where: Where) -> dict[str, str]:
    out: dict[str, str] = map_of(_attribute_name, _attribute_value)(node, key, where)
    if len(out) > k8s.ATTRIBUTES_PER_DEVICE_MAX:
        raise where(node, f"{key}: {len(out)} attributes; a device has at most {k8s.ATTRIBUTES_PER_DEVICE_MAX}")
    return out


EFFECT = one_of(k8s.TAINT_EFFECTS)
KUBERNETES = struct(
    {
        "domain": _k8s_domain,
        "taints": struct(
            {
                "enabled": boolean,
                "health": list_of(one_of(HEALTH)),
                "key": _taint_key,
                "value": _taint_value,
                "effect": struct(
                    {
                        "default": EFFECT,
                        "by_state": map_of(one_of(k8s.PLACEHOLDER_VALUES["state"]), EFFECT),
                        "by_reason": map_of(one_of(REASONS), EFFECT),
                    }
                ),
                "max_per_device": number(1, k8s.TAINTS_PER_DEVICE_MAX, integer=True),
            }
        ),
        "attributes": _attributes,
    }
)

#: Reasons a policy has rules (and hold times) for: every contract reason but ``stale``.
RULES_KEYS: tuple[str, ...] = tuple(r for r in REASONS if r != "stale")

SCHEMA = struct(
    {
        "version": number(1, 1, integer=True),
        "window": duration,
        "min_samples": COUNT,
        "stale_timeout": duration,
        "stale_intervals": number(2.0, 100.0),
        "device_ttl": duration,
        "horizon": struct(
            {"bucket": duration, "duty_span": duration, "rate_span": duration, "duty_hold_ratio": FRACTION}
        ),
        "cohorts": struct(
            {
                "by": list_of(string),
                "min_devices": COUNT,
                "significance": POSITIVE,
                "span_significance": POSITIVE,
                "healthy_ratio": number(1.0),
            }
        ),
        "unhealthy_states": list_of(one_of(RULE_STATES), min_len=1),
        "hold": map_of(one_of(("default", *RULES_KEYS)), duration),
        "escalation": struct({"window": duration, "after": COUNT}),
        "rules": RULES,
        "overrides": list_of(struct({"match": struct({"hw.vendor": string, "hw.model": string}), "rules": RULES})),
        "kubernetes": KUBERNETES,
        "shared_devices": struct({"combine": one_of(COMBINE_MODES)}),
    }
)


# -- loading ----------------------------------------------------------------------------------
def _where(source: str) -> Where:
    def at(node: yaml.Node, message: str) -> PolicyError:
        mark = node.start_mark
        return PolicyError(f"{source}:{mark.line + 1}:{mark.column + 1}: {message}")

    return at


def parse(text: str, source: str) -> dict[str, Any]:
    """Validate one policy document; returns the keys it sets (not merged)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise PolicyError(
            f"{source}: nested too deeply to be a policy (a policy is a few levels of mappings)"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f"{mark.line + 1}:{mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PolicyError(f"{source}:{pos}not valid YAML: {problem}") from None
    if node is None:
        return {}
    return SCHEMA(node, "", _where(source))  # type: ignore[no-any-return]


def merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict) and key not in _REPLACED_WHOLE:
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# Maps whose keys are data (not schema): a user's table replaces the default's whole.
_REPLACED_WHOLE = frozenset({"code_tables", "minimum", "replays_per_lane_per_minute", "attributes"})


def default_text() -> str:
    return resources.files("otel_dra.policies").joinpath(DEFAULT_POLICY).read_text()


def load(path: Path | str | None = None) -> Policy:
    """The default policy, with ``path`` (if given) merged over it."""
    data = parse(default_text(), f"<default policy {DEFAULT_POLICY}>")
    source = "<default>"
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError(f"{path}: cannot read the policy file: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise PolicyError(f"{path}: not a text file (byte {exc.start} is not UTF-8); a policy is YAML") from None
        data = merge(data, parse(text, str(path)))
        source = str(path)
    _check_consistency(data, source)
    return Policy(data, source)


def _check_consistency(data: Mapping[str, Any], source: str) -> None:
    for rules in (data["rules"], *(o.get("rules", {}) for o in data["overrides"])):
        for reason, key in EVENT_THRESHOLDS:
            value = rules.get(reason, {}).get(key)
            if value is not None and value > EVENT_LOG_DEPTH:
                raise PolicyError(
                    f"{source}: rules.{reason}.{key} ({value}) is above the {EVENT_LOG_DEPTH} events kept per "
                    f"device; use at most {EVENT_LOG_DEPTH}"
                )
    hz = data["horizon"]
    if not 1.0 <= hz["bucket"] <= hz["duty_span"] <= hz["rate_span"]:
        raise PolicyError(
            f"{source}: horizon: need 1s <= bucket ({hz['bucket']:g}s) <= duty_span ({hz['duty_span']:g}s) "
            f"<= rate_span ({hz['rate_span']:g}s)"
        )
    if hz["rate_span"] / hz["bucket"] > HORIZON_MAX_BUCKETS:
        raise PolicyError(
            f"{source}: horizon: rate_span / bucket is {hz['rate_span'] / hz['bucket']:.0f} buckets per device; "
            f"use at most {HORIZON_MAX_BUCKETS} (a longer bucket or a shorter span)"
        )
    ecc = data["rules"]["memory_ecc"]
    if ecc["retired_pages_predicted"] > ecc["retired_pages_failed"]:
        raise PolicyError(
            f"{source}: rules.memory_ecc.retired_pages_predicted ({ecc['retired_pages_predicted']}) must not exceed "
            f"retired_pages_failed ({ecc['retired_pages_failed']})"
        )
    taints = data["kubernetes"]["taints"]
    if "{reason}" not in taints["key"] + taints["value"]:
        raise PolicyError(
            f"{source}: kubernetes.taints: key {_show(taints['key'])} or value {_show(taints['value'])} "
            "must contain {reason} (one taint per reason, or they would collide)"
        )


@dataclass(frozen=True)
class Policy:
    """A validated, merged policy. ``data`` mirrors the YAML (durations in seconds)."""

    data: Mapping[str, Any]
    source: str

    @property
    def window_s(self) -> float:
        return float(self.data["window"])

    @property
    def stale_timeout_s(self) -> float:
        return float(self.data["stale_timeout"])

    @property
    def stale_intervals(self) -> float:
        return float(self.data["stale_intervals"])

    @property
    def min_samples(self) -> int:
        return int(self.data["min_samples"])

    @property
    def horizon_bucket_s(self) -> float:
        return float(self.data["horizon"]["bucket"])

    def horizon_buckets(self, span: str) -> int:
        """A horizon span (``duty_span``, ``rate_span``) in whole buckets, rounded up."""
        hz = self.data["horizon"]
        return max(1, math.ceil(float(hz[span]) / float(hz["bucket"]) - 1e-9))

    @property
    def duty_hold_ratio(self) -> float:
        return float(self.data["horizon"]["duty_hold_ratio"])

    @property
    def cohort_keys(self) -> tuple[str, ...]:
        return tuple(self.data["cohorts"]["by"])

    @property
    def cohort_min_devices(self) -> int:
        return int(self.data["cohorts"]["min_devices"])

    @property
    def cohort_significance(self) -> float:
        return float(self.data["cohorts"]["significance"])

    @property
    def cohort_span_significance(self) -> float:
        return float(self.data["cohorts"]["span_significance"])

    @property
    def cohort_healthy_ratio(self) -> float:
        return float(self.data["cohorts"]["healthy_ratio"])

    def hold_s(self, reason: str) -> float:
        hold = self.data["hold"]
        return float(hold.get(reason, hold["default"]))

    def rules_for(self, vendor: str, model: str) -> Mapping[str, Any]:
        """The rules for one device model: the base rules with matching overrides merged in order."""
        rules = self.data["rules"]
        for override in self.data["overrides"]:
            match = override.get("match", {})
            if fnmatch.fnmatchcase(vendor, match.get("hw.vendor", "*")) and fnmatch.fnmatchcase(
                model, match.get("hw.model", "*")
            ):
                rules = merge(dict(rules), override.get("rules", {}))
        return rules

    def to_yaml(self) -> str:
        """The effective policy, for ``otel-dra policy check``."""
        return yaml.safe_dump(_plain(self.data), sort_keys=False, default_flow_style=None, width=100)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k) if not isinstance(k, int) else k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
