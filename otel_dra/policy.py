"""Health policy as data: load, validate, merge over the default, resolve per device model.

The whole file is validated before anything runs: an unknown key, a wrong type or a bad
value is one :class:`PolicyError` naming the file, line, column and key, and what would be
valid. A user file is merged over ``policies/default.yaml``, so it only needs the keys it
changes. YAML is read with the safe loader and nothing in it is ever evaluated.
"""

from __future__ import annotations

import fnmatch
import importlib
import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import yaml

from otel_dra.vocabulary import COMBINE_MODES, REASONS, REMEDIATIONS

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
#: Reasons judged on event logs (each has an ``events_window``), in EVENT_THRESHOLDS' order.
EVENT_REASONS: tuple[str, ...] = tuple(reason for reason, _ in EVENT_THRESHOLDS)

#: Buckets the long horizon keeps per device at most (memory: about 50 bytes a bucket).
HORIZON_MAX_BUCKETS = 1440

#: Driver error code classes, and the ladder step a fatal class starts at.
DRIVER_CLASSES: tuple[str, ...] = ("ignore", "application", "reset_device", "reboot_node", "mechanical")
#: Reasons whose evidence, on most devices of a node at once, is the node's (power, cooling, the host).
NODE_SCOPE_REASONS: tuple[str, ...] = ("thermal", "cooling", "power_delivery", "power_throttling")

#: hw.state values a rule may set (Unknown is not a state).
RULE_STATES: tuple[str, ...] = ("degraded", "predicted_failure", "failed")


def show(value: object, limit: int = 60) -> str:
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
            raise where(node, f"{key}: expected {kind}, got {show(value)}")
        if value != value or (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"between {lo:g} and {hi:g}" if lo is not None and hi is not None else f"at least {lo:g}"
            raise where(node, f"{key}: {show(value)} is out of range; use {kind} {bounds}")
        return value

    return check


def parse_duration(text: str) -> float | None:
    """``30s``, ``5m``, ``1h``, ``1d``, ``250ms`` or a bare number of seconds, in seconds; None when it is none."""
    match = _DURATION.match(text)
    return None if match is None else float(match[1]) * _UNITS[match[2]]


def duration(node: yaml.Node, key: str, where: Where) -> float:
    """``30s``, ``5m``, ``1h``, ``1d`` or seconds; returned in seconds."""
    value = _scalar(node, key, where)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    seconds = parse_duration(value) if isinstance(value, str) else None
    if seconds is None:
        raise where(node, f"{key}: {show(value)} is not a duration; write e.g. 30s, 5m, 1h or a number of seconds")
    return seconds


def positive_duration(node: yaml.Node, key: str, where: Where) -> float:
    """A :func:`duration` longer than zero (a time constant, something divided by)."""
    value = duration(node, key, where)
    if value <= 0:
        raise where(node, f"{key}: must be longer than 0s; write e.g. 30m or 1h")
    return value


def one_of(choices: tuple[str, ...]) -> Validator:
    def check(node: yaml.Node, key: str, where: Where) -> str:
        value = _scalar(node, key, where)
        if value not in choices:
            raise where(node, f"{key}: {show(value)} is not one of: {', '.join(choices)}")
        return str(value)

    return check


def string(node: yaml.Node, key: str, where: Where) -> str:
    value = _scalar(node, key, where)
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        raise where(node, f"{key}: expected a string, got {show(value)}")
    return str(value)


def boolean(node: yaml.Node, key: str, where: Where) -> bool:
    value = _scalar(node, key, where)
    if not isinstance(value, bool):
        raise where(node, f"{key}: expected true or false, got {show(value)}")
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
                "slowdown_share": FRACTION,
                "duty": FRACTION,
                "fallback_limits": struct({"high.degraded": number(), "high.critical": number()}),
                "peers": struct(
                    {
                        "enabled": boolean,
                        "state": STATE,
                        "margin": POSITIVE,
                        "mad_k": POSITIVE,
                        "hold_ratio": FRACTION,
                        "sustain": duration,
                        "min_utilization": FRACTION,
                        "slope": number(0.0, 200.0),
                        "min_node_devices": number(2, None, integer=True),
                        "min_slot_nodes": number(2, None, integer=True),
                        "change_margin": POSITIVE,
                        "change_floor": number(0.0, None),
                        "history": duration,
                        "baseline_tau": positive_duration,
                    }
                ),
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
            {
                "state": STATE,
                "errors": COUNT,
                "voltage_fraction": FRACTION,
                "brake_share": FRACTION,
                "duty": FRACTION,
                "remediation": LADDER,
            }
        ),
        "power_throttling": struct(
            {
                "state": STATE,
                "throttle_share": FRACTION,
                "pinned_ratio": FRACTION,
                "duty": FRACTION,
                "min_peers": number(2, None, integer=True),
                "peer_quantile": FRACTION,
                "peer_margin": FRACTION,
                "busy_utilization": FRACTION,
                "load_coupling": FRACTION,
                "limit_ratio": FRACTION,
                "remediation": LADDER,
            }
        ),
        "memory_pressure": struct(
            {
                "state": STATE,
                "full_is_evidence": boolean,
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

# -- sections other packages own -------------------------------------------------------------
Check = Callable[[Mapping[str, Any], str], None]


@dataclass(frozen=True)
class Section:
    """A top-level section whose keys a consumer owns: the consumer knows its rules (the
    Kubernetes API's, for ``kubernetes``), so the policy need not import it."""

    schema: Validator
    #: Checks across the merged section's keys; raises PolicyError naming the source.
    check: Check | None = None
    #: Keys whose tables are data, not schema: a user's table replaces the default's whole.
    replaced_whole: frozenset[str] = frozenset()


#: Each owned section and the module that registers it: imported by name the first time a
#: policy is validated, so importing this module imports none of them (and no cycle forms).
SECTION_OWNERS: Mapping[str, str] = MappingProxyType({"kubernetes": "otel_dra.sinks.k8s.settings"})
_SECTIONS: dict[str, Section] = {}


def register_section(name: str, section: Section) -> None:
    """Called by an owner at import: its section's schema and checks."""
    if name not in SECTION_OWNERS:
        raise ValueError(f"{name!r} is not a policy section; owned sections: {', '.join(SECTION_OWNERS)}")
    _SECTIONS[name] = section


def section(name: str) -> Section:
    """An owned section's rules, importing its owner on first use."""
    found = _SECTIONS.get(name)
    if found is None:
        importlib.import_module(SECTION_OWNERS[name])
        found = _SECTIONS[name]
    return found


def _owned(name: str) -> Validator:
    """The schema slot of an owned section: its key keeps its place among the policy's keys."""

    def check(node: yaml.Node, key: str, where: Where) -> Any:
        return section(name).schema(node, key, where)

    return check


#: How a reason that is on clears (the policy's ``clears``): ``hold``, once its evidence has been gone for its hold
#: time; ``repair``, a failure, only once the repair its remediation names was seen on the device and it stayed clean.
CLEAR_MODES: tuple[str, ...] = ("hold", "repair")

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
                "slot_by": list_of(string),
                "load_bins": list_of(FRACTION, min_len=1),
                "min_devices": COUNT,
                "significance": POSITIVE,
                "span_significance": POSITIVE,
                "healthy_ratio": number(1.0),
            }
        ),
        "unhealthy_states": list_of(one_of(RULE_STATES), min_len=1),
        "hold": map_of(one_of(("default", *RULES_KEYS)), duration),
        "clears": map_of(one_of(("default", *RULES_KEYS)), one_of(CLEAR_MODES)),
        "clean_after_repair": duration,
        "escalation": struct({"window": duration, "after": COUNT}),
        "rules": RULES,
        "overrides": list_of(struct({"match": struct({"hw.vendor": string, "hw.model": string}), "rules": RULES})),
        "kubernetes": _owned("kubernetes"),
        "shared_devices": struct({"combine": one_of(COMBINE_MODES)}),
        "scopes": struct(
            {
                "workload": struct({"min_devices": number(2, None, integer=True), "together": duration}),
                "node": struct(
                    {
                        "reasons": list_of(one_of(NODE_SCOPE_REASONS)),
                        "min_devices": number(2, None, integer=True),
                        "share": FRACTION,
                        "remediation": one_of(REMEDIATIONS),
                    }
                ),
            }
        ),
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
    return SCHEMA(node, "", _where(source))


# Maps whose keys are data (not schema): a user's table replaces the default's whole.
_REPLACED_WHOLE = frozenset({"code_tables", "minimum", "replays_per_lane_per_minute"})
# (Lists, load_bins and slot_by among them, are always replaced whole: merge only merges mappings.)


def merge(
    base: Mapping[str, Any], override: Mapping[str, Any], replaced: frozenset[str] = _REPLACED_WHOLE
) -> dict[str, Any]:
    """Deep merge into plain dicts: mappings merge key by key (but those named in ``replaced``),
    anything else is replaced."""
    out: dict[str, Any] = _thawed(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict) and key not in replaced:
            out[key] = merge(out[key], value, replaced)
        else:
            out[key] = _thawed(value)
    return out


def _thawed(value: Any) -> Any:
    """A plain, independent copy (dicts and lists) of a value, frozen or not."""
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thawed(v) for v in value]
    return value


def _frozen(value: Any) -> Any:
    """A read-only copy: mappings become mapping proxies and lists tuples, so no reader can
    change the policy under another."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


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
        replaced = _REPLACED_WHOLE.union(*(section(name).replaced_whole for name in SECTION_OWNERS))
        data = merge(data, parse(text, str(path)), replaced)
        source = str(path)
    _check_consistency(data, source)
    return Policy.from_data(data, source)


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
    bins = data["cohorts"]["load_bins"]
    if any(b <= a for a, b in itertools.pairwise(bins)):
        raise PolicyError(f"{source}: cohorts.load_bins must increase, got {bins}")
    ecc = data["rules"]["memory_ecc"]
    if ecc["retired_pages_predicted"] > ecc["retired_pages_failed"]:
        raise PolicyError(
            f"{source}: rules.memory_ecc.retired_pages_predicted ({ecc['retired_pages_predicted']}) must not exceed "
            f"retired_pages_failed ({ecc['retired_pages_failed']})"
        )
    for name in SECTION_OWNERS:
        check = section(name).check
        if check is not None:
            check(data[name], source)


# -- the typed policy -------------------------------------------------------------------------
#: Rules by reason (``rules["thermal"]["min_fraction"]``), read-only; durations in seconds.
Rules = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Horizon:
    """The long horizon: per-device buckets of ``bucket_s``, and the spans judged over them."""

    bucket_s: float
    duty_span_s: float
    rate_span_s: float
    duty_hold_ratio: float

    def buckets(self, span_s: float) -> int:
        """A span in whole buckets, rounded up (at least one)."""
        return max(1, math.ceil(span_s / self.bucket_s - 1e-9))

    @property
    def duty_buckets(self) -> int:
        return self.buckets(self.duty_span_s)

    @property
    def rate_buckets(self) -> int:
        return self.buckets(self.rate_span_s)


@dataclass(frozen=True)
class Cohorts:
    """Which devices' rates are compared (``keys``: attribute names), and how strictly."""

    keys: tuple[str, ...]
    #: Attributes naming a device's slot in its node (the first one present): peers in the same slot of other
    #: nodes share its airflow, so a slot that always runs hotter is not a fault of the devices in it.
    slot_keys: tuple[str, ...]
    #: Utilization bin edges: devices in the same bin are under comparable load.
    load_bins: np.ndarray
    min_devices: int
    significance: float
    span_significance: float
    healthy_ratio: float


@dataclass(frozen=True)
class WorkloadScope:
    """Application driver errors and out-of-memory events on ``min_devices`` or more GPUs of a node within
    ``together_s`` are a job's crash (scope ``workload``), not the devices'."""

    min_devices: int
    together_s: float


@dataclass(frozen=True)
class NodeScope:
    """A reason in ``reasons`` present on at least ``min_devices`` devices of a node and ``share`` of those
    reporting is the node's (scope ``node``), remediated by ``remediation``, never device by device."""

    reasons: tuple[str, ...]
    min_devices: int
    share: float
    remediation: str


@dataclass(frozen=True)
class Escalation:
    """``after`` remediations of one device within ``window_s`` step its ladder up."""

    window_s: float
    after: int


@dataclass(frozen=True)
class SharedDevices:
    """How several nodes' views of one device combine (one of COMBINE_MODES)."""

    combine: str


@dataclass(frozen=True)
class Override:
    """Rules merged over the base rules for the device models matching both patterns (fnmatch)."""

    vendor: str
    model: str
    rules: Rules

    def matches(self, vendor: str, model: str) -> bool:
        return fnmatch.fnmatchcase(vendor, self.vendor) and fnmatch.fnmatchcase(model, self.model)


@dataclass(frozen=True)
class Policy:
    """A validated, merged policy, typed (durations in seconds). The sections other packages
    own (SECTION_OWNERS) are in ``sections``, as validated; each owner types its own."""

    source: str
    window_s: float
    min_samples: int
    stale_timeout_s: float
    stale_intervals: float
    device_ttl_s: float
    horizon: Horizon
    cohorts: Cohorts
    unhealthy_states: tuple[str, ...]
    hold: Mapping[str, float]
    clears: Mapping[str, str]
    clean_after_repair_s: float
    escalation: Escalation
    rules: Rules
    overrides: tuple[Override, ...]
    shared_devices: SharedDevices
    workload: WorkloadScope
    node: NodeScope
    sections: Mapping[str, Mapping[str, Any]]
    _raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_data(cls, data: Mapping[str, Any], source: str) -> Policy:
        """Type a validated, merged policy (:func:`load` makes one)."""
        hz, co, esc = data["horizon"], data["cohorts"], data["escalation"]
        return cls(
            source=source,
            window_s=float(data["window"]),
            min_samples=int(data["min_samples"]),
            stale_timeout_s=float(data["stale_timeout"]),
            stale_intervals=float(data["stale_intervals"]),
            device_ttl_s=float(data["device_ttl"]),
            horizon=Horizon(
                float(hz["bucket"]), float(hz["duty_span"]), float(hz["rate_span"]), float(hz["duty_hold_ratio"])
            ),
            cohorts=Cohorts(
                tuple(co["by"]),
                tuple(co["slot_by"]),
                np.asarray(co["load_bins"], dtype=np.float64),
                int(co["min_devices"]),
                float(co["significance"]),
                float(co["span_significance"]),
                float(co["healthy_ratio"]),
            ),
            unhealthy_states=tuple(data["unhealthy_states"]),
            hold=MappingProxyType({str(k): float(v) for k, v in data["hold"].items()}),
            clears=MappingProxyType({str(k): str(v) for k, v in data["clears"].items()}),
            clean_after_repair_s=float(data["clean_after_repair"]),
            escalation=Escalation(float(esc["window"]), int(esc["after"])),
            rules=_frozen(data["rules"]),
            overrides=tuple(
                Override(
                    o.get("match", {}).get("hw.vendor", "*"),
                    o.get("match", {}).get("hw.model", "*"),
                    _frozen(o.get("rules", {})),
                )
                for o in data["overrides"]
            ),
            shared_devices=SharedDevices(str(data["shared_devices"]["combine"])),
            workload=WorkloadScope(
                int(data["scopes"]["workload"]["min_devices"]), float(data["scopes"]["workload"]["together"])
            ),
            node=NodeScope(
                tuple(data["scopes"]["node"]["reasons"]),
                int(data["scopes"]["node"]["min_devices"]),
                float(data["scopes"]["node"]["share"]),
                str(data["scopes"]["node"]["remediation"]),
            ),
            sections=MappingProxyType({name: data[name] for name in SECTION_OWNERS}),
            _raw=data,
        )

    def hold_s(self, reason: str) -> float:
        """How long a reason holds after its evidence ends: its own, else the default."""
        return self.hold.get(reason, self.hold["default"])

    def clears_by(self, reason: str) -> str:
        """How a reason clears once on (one of CLEAR_MODES): its own, else the default."""
        return self.clears.get(reason, self.clears.get("default", "hold"))

    def rules_for(self, vendor: str, model: str) -> Rules:
        """The rules for one device model: the base rules with matching overrides merged in order."""
        rules = self.rules
        for override in self.overrides:
            if override.matches(vendor, model):
                rules = _frozen(merge(rules, override.rules))
        return rules

    def to_yaml(self) -> str:
        """The effective policy, for ``otel-dra policy check``."""
        return yaml.safe_dump(_plain(self._raw), sort_keys=False, default_flow_style=None, width=100)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k) if not isinstance(k, int) else k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
