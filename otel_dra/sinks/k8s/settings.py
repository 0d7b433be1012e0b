"""The policy's ``kubernetes`` section: its schema, its checks and its typed form.

The section's rules are the Kubernetes API's (:mod:`otel_dra.sinks.k8s.validation`), so they
live here, beside the code that renders taints and attributes, as :data:`POLICY_SECTION`. The
pipelines and commands pass it to :func:`otel_dra.policy.load` (:mod:`otel_dra.sinks.policy_sections`
lists it), and importing this module registers it for a load given no sections. So the policy
never imports the sinks, and the sinks import the policy without a cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from otel_dra import policy as pol
from otel_dra.policy import (
    Policy,
    PolicyError,
    Where,
    boolean,
    duration,
    list_of,
    map_of,
    number,
    one_of,
    positive_duration,
    show,
    string,
    struct,
)
from otel_dra.sinks.k8s import validation as k8s
from otel_dra.vocabulary import HEALTH, REASONS

SECTION = "kubernetes"
#: Placeholders of a taint key or value (one taint per reason), and of an attribute value (per device).
TAINT_FIELDS: tuple[str, ...] = ("reason", "state", "health", "remediation")
ATTRIBUTE_FIELDS: tuple[str, ...] = ("health", "state", "remediation")


def _k8s_domain(node: yaml.Node, key: str, where: Where) -> str:
    """The domain of taint keys and attribute names: a DNS subdomain of at most 63 (attribute domain limit)."""
    value = string(node, key, where)
    problem = k8s.dns1123_subdomain_problem(value, k8s.ATTRIBUTE_DOMAIN_MAX)
    if problem:
        raise where(node, f"{key}: {show(value)} {problem}")
    return value


def _expansions(
    node: yaml.Node, key: str, where: Where, template: str, fields: tuple[str, ...], shown: str
) -> list[str]:
    """Every text a template can become, or the template's mistake at its position."""
    try:
        return list(k8s.expansions(template, fields))
    except ValueError as exc:
        raise where(node, f"{key}: {show(shown)}: {exc}") from None


def _taint_key(node: yaml.Node, key: str, where: Where) -> str:
    """A label name once filled in, for every reason, state, health and remediation."""
    value = string(node, key, where)
    prefix, slash, name = value.rpartition("/")
    if "{" in prefix and prefix != "{domain}":
        raise where(node, f"{key}: {show(value)}: the part before '/' is a DNS subdomain or exactly {{domain}}")
    head = ("example.com" if prefix == "{domain}" else prefix) + slash
    for filled in _expansions(node, key, where, name, TAINT_FIELDS, value):
        problem = k8s.label_name_problem(head + filled)
        if problem:
            raise where(node, f"{key}: {show(value)} can become {show(head + filled)}, not a label name: {problem}")
    return value


def _taint_value(node: yaml.Node, key: str, where: Where) -> str:
    """A label value (at most 63 characters) once filled in."""
    value = string(node, key, where)
    for filled in _expansions(node, key, where, value, TAINT_FIELDS, value):
        problem = k8s.label_value_problem(filled)
        if problem:
            raise where(node, f"{key}: {show(value)} can become {show(filled)}, not a label value: {problem}")
    return value


def _attribute_name(node: yaml.Node, key: str, where: Where) -> str:
    """The name after ``<domain>/``: a C identifier, as the API requires."""
    value = string(node, key, where)
    problem = k8s.c_identifier_problem(value)
    if problem:
        raise where(node, f"{key}: {show(value)} is not an attribute name (after '<domain>/'): {problem}")
    return value


def _attribute_value(node: yaml.Node, key: str, where: Where) -> str:
    """A string attribute value (at most 64 characters) once filled in."""
    value = string(node, key, where)
    for filled in _expansions(node, key, where, value, ATTRIBUTE_FIELDS, value):
        problem = k8s.attribute_string_problem(filled)
        if problem:
            raise where(node, f"{key}: {show(value)} can become {show(filled)}, which {problem}")
    return value


def _attributes(node: yaml.Node, key: str, where: Where) -> dict[str, str]:
    """The attribute table, no larger than a device may carry."""
    out: dict[str, str] = map_of(_attribute_name, _attribute_value)(node, key, where)
    if len(out) > k8s.ATTRIBUTES_PER_DEVICE_MAX:
        raise where(node, f"{key}: {len(out)} attributes; a device has at most {k8s.ATTRIBUTES_PER_DEVICE_MAX}")
    return out


EFFECT = one_of(k8s.TAINT_EFFECTS)
SCHEMA = struct(
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
        "budget": struct(
            {
                "window": positive_duration,
                "share": number(0.0, 1.0),
                "devices": number(1, None, integer=True),
                "no_execute_share": number(0.0, 1.0),
                "no_execute_devices": number(1, None, integer=True),
                "cooldown": duration,
            }
        ),
        "attributes": _attributes,
    }
)


def check(section: Mapping[str, Any], source: str) -> None:
    """What no single key shows: the taint key or value must tell the reasons apart."""
    taints = section["taints"]
    if "{reason}" not in taints["key"] + taints["value"]:
        raise PolicyError(
            f"{source}: kubernetes.taints: key {show(taints['key'])} or value {show(taints['value'])} "
            "must contain {reason} (one taint per reason, or they would collide)"
        )


#: The section's rules, for :func:`otel_dra.policy.load`. ``attributes`` is data (attribute names),
#: not schema: a user's table replaces the default's whole.
POLICY_SECTION = pol.Section(SCHEMA, check, replaced_whole=frozenset({"attributes"}))
pol.register_section(SECTION, POLICY_SECTION)


@dataclass(frozen=True)
class K8sSettings:
    """The policy's ``kubernetes`` section, typed."""

    domain: str
    taints_enabled: bool
    taint_health: frozenset[str]
    key: str
    value: str
    effect_default: str
    effect_by_state: Mapping[str, str]
    effect_by_reason: Mapping[str, str]
    max_per_device: int
    attributes: Mapping[str, str]

    @classmethod
    def from_policy(cls, policy: Policy) -> K8sSettings:
        """Read when rendering (not at load), so a test may set what a policy file would refuse."""
        k = policy.sections[SECTION]
        t, e = k["taints"], k["taints"]["effect"]
        return cls(
            domain=k["domain"],
            taints_enabled=bool(t["enabled"]),
            taint_health=frozenset(t["health"]),
            key=t["key"],
            value=t["value"],
            effect_default=e["default"],
            effect_by_state=dict(e["by_state"]),
            effect_by_reason=dict(e["by_reason"]),
            max_per_device=int(t["max_per_device"]),
            attributes=dict(k["attributes"]),
        )

    def effect(self, reason: str, state: str) -> str:
        """The reason's own choice, else its state's, else the default (None: informational)."""
        return self.effect_by_reason.get(reason) or self.effect_by_state.get(state) or self.effect_default
