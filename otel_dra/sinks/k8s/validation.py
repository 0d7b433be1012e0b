"""The Kubernetes API's rules for the names and values this package writes, checked before
anything reaches a cluster, so a bad policy or a bad device name is one clear line here and
not a rejected request (or a half-applied set of rules) there.

The regular expressions are Kubernetes' own (``k8s.io/apimachinery/pkg/util/validation``);
the limits are ``pkg/apis/resource`` (``validation.go``: ``validateDeviceTaint``,
``validateQualifiedName``, ``validateCIdentifier``, ``validatePoolName``; ``types.go``:
``DeviceMaxDomainLength``, ``DeviceMaxIDLength``, ``DeviceAttributeMaxValueLength``,
``DeviceTaintsMaxLength``). Every check returns the problem as text, or None when valid.
"""

from __future__ import annotations

import itertools
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from otel_dra.vocabulary import HEALTH, HW_STATES, REASONS, REMEDIATIONS

# -- apimachinery/pkg/util/validation ---------------------------------------------------------
DNS1123_LABEL_FMT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + r"(\." + DNS1123_LABEL_FMT + r")*"
QUALIFIED_NAME_FMT = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE_FMT = "(" + QUALIFIED_NAME_FMT + ")?"
C_IDENTIFIER_FMT = r"[A-Za-z_][A-Za-z0-9_]*"

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63  # the name part of a label name
LABEL_VALUE_MAX = 63

# -- pkg/apis/resource ------------------------------------------------------------------------
DRIVER_NAME_MAX = 63  # a CSI driver name: DNS subdomain, at most 63
POOL_NAME_MAX = 253
ATTRIBUTE_DOMAIN_MAX = 63  # DeviceMaxDomainLength
ATTRIBUTE_ID_MAX = 32  # DeviceMaxIDLength
ATTRIBUTE_STRING_MAX = 64  # DeviceAttributeMaxValueLength
ATTRIBUTES_PER_DEVICE_MAX = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
#: DeviceTaintsMaxLength (4 before 1.35): the API caps the taints a *ResourceSlice* lists per device
#: and applies no such cap to DeviceTaintRules. otel-dra keeps its own rules per device under
#: the same number by policy (``kubernetes.taints.max_per_device``), so a device never carries more
#: taints from us than its driver could publish.
TAINTS_PER_DEVICE_MAX = 16
TAINT_EFFECTS: tuple[str, ...] = ("None", "NoSchedule", "NoExecute")  # least to most disruptive
#: The first Kubernetes minor that accepts each effect (``None`` came with 1.35, KEP-5055).
EFFECT_SINCE: Mapping[str, tuple[int, int]] = {"None": (1, 35), "NoSchedule": (1, 33), "NoExecute": (1, 33)}

_DNS1123_LABEL = re.compile(f"^{DNS1123_LABEL_FMT}$")
_DNS1123_SUBDOMAIN = re.compile(f"^{DNS1123_SUBDOMAIN_FMT}$")
_QUALIFIED_NAME = re.compile(f"^{QUALIFIED_NAME_FMT}$")
_LABEL_VALUE = re.compile(f"^{LABEL_VALUE_FMT}$")
_C_IDENTIFIER = re.compile(f"^{C_IDENTIFIER_FMT}$")


class K8sValidationError(ValueError):
    """An object the API would reject; ``str()`` is one line naming the object and the field."""


def dns1123_label_problem(value: str) -> str | None:
    if len(value) > DNS1123_LABEL_MAX:
        return f"must be no more than {DNS1123_LABEL_MAX} characters"
    if not _DNS1123_LABEL.match(value):
        return "must be a DNS label: lower case alphanumerics or '-', starting and ending with an alphanumeric"
    return None


def dns1123_subdomain_problem(value: str, max_len: int = DNS1123_SUBDOMAIN_MAX) -> str | None:
    if len(value) > max_len:
        return f"must be no more than {max_len} characters"
    if not _DNS1123_SUBDOMAIN.match(value):
        return (
            "must be a DNS subdomain: lower case alphanumerics, '-' or '.', "
            "starting and ending with an alphanumeric (e.g. example.com)"
        )
    return None


def label_name_problem(value: str) -> str | None:
    """A label name (``IsQualifiedName``): ``[prefix/]name``, prefix a DNS subdomain, name ≤ 63."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return "prefix part must be non-empty"
        problem = dns1123_subdomain_problem(prefix)
        if problem:
            return f"prefix part {problem}"
    else:
        return "must be a name with an optional DNS subdomain prefix and '/' (e.g. example.com/MyName)"
    if not name:
        return "name part must be non-empty"
    if len(name) > QUALIFIED_NAME_MAX:
        return f"name part must be no more than {QUALIFIED_NAME_MAX} characters"
    if not _QUALIFIED_NAME.match(name):
        return "name part must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > LABEL_VALUE_MAX:
        return f"must be no more than {LABEL_VALUE_MAX} characters"
    if not _LABEL_VALUE.match(value):
        return "must be empty or alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
    return None


def c_identifier_problem(value: str, max_len: int = ATTRIBUTE_ID_MAX) -> str | None:
    if len(value) > max_len:
        return f"must be no more than {max_len} characters"
    if not _C_IDENTIFIER.match(value):
        return "must be a C identifier: letters, digits and '_', not starting with a digit"
    return None


def driver_name_problem(value: str) -> str | None:
    return dns1123_subdomain_problem(value, DRIVER_NAME_MAX) if value else "must be non-empty"


def pool_name_problem(value: str) -> str | None:
    """A pool name: ≤ 253, '/'-separated DNS subdomains."""
    if not value:
        return "must be non-empty"
    if len(value) > POOL_NAME_MAX:
        return f"must be no more than {POOL_NAME_MAX} characters"
    for part in value.split("/"):
        problem = dns1123_subdomain_problem(part)
        if problem:
            return problem
    return None


def attribute_name_problem(value: str) -> str | None:
    """A device attribute name: a C identifier, or ``<domain>/<C identifier>`` (domain ≤ 63)."""
    parts = value.split("/")
    if len(parts) == 1:
        return c_identifier_problem(value)
    if len(parts) != 2:
        return "must be a C identifier or <domain>/<C identifier>"
    domain, ident = parts
    problem = dns1123_subdomain_problem(domain, ATTRIBUTE_DOMAIN_MAX) if domain else "must be non-empty"
    if problem:
        return f"domain {problem}"
    problem = c_identifier_problem(ident) if ident else "must be non-empty"
    return f"identifier {problem}" if problem else None


def attribute_string_problem(value: str) -> str | None:
    return f"must be no more than {ATTRIBUTE_STRING_MAX} characters" if len(value) > ATTRIBUTE_STRING_MAX else None


# -- templates --------------------------------------------------------------------------------
#: What each placeholder of a taint or attribute template can become.
PLACEHOLDER_VALUES: Mapping[str, tuple[str, ...]] = {
    "reason": REASONS,
    "state": (*HW_STATES, "unknown"),  # "unknown": an Unknown verdict has no hw.state
    "health": HEALTH,
    "remediation": REMEDIATIONS,
}


def template_fields(template: str, allowed: Sequence[str]) -> set[str]:
    """The placeholders of a ``{name}`` template; ValueError when it has other ones or bad syntax."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"not a template ({exc}); write e.g. {{reason}}") from None
    fields: set[str] = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in allowed or spec or conversion:
            raise ValueError(f"{{{name}}} is not a placeholder here; use: " + ", ".join(f"{{{a}}}" for a in allowed))
        fields.add(name)
    return fields


def expansions(template: str, allowed: Sequence[str], fixed: Mapping[str, str] | None = None) -> Iterator[str]:
    """Every string the template can become (each placeholder over its vocabulary)."""
    fields = sorted(template_fields(template, allowed) - set(fixed or {}))
    for combo in itertools.product(*(PLACEHOLDER_VALUES[f] for f in fields)):
        yield template.format(**dict(zip(fields, combo, strict=True)), **(fixed or {}))


# -- objects ----------------------------------------------------------------------------------
def check(kind: str, name: str, field: str, value: str, problem: str | None) -> None:
    """Raise the one-line error for ``problem`` (if any) on ``kind`` ``name`` at ``field``."""
    if problem:
        raise K8sValidationError(f"{kind} {name}: {field}: {value!r} {problem}")


def check_taint_rule(obj: Mapping[str, Any], kubernetes: tuple[int, int] | None = None) -> None:
    """A DeviceTaintRule (as the API takes it) against ``ValidateDeviceTaintRule``'s rules, the
    effect against what a Kubernetes ``(major, minor)`` server accepts."""
    meta, spec = obj["metadata"], obj["spec"]
    name = meta["name"]
    kind = "DeviceTaintRule"
    check(kind, name, "metadata.name", name, dns1123_subdomain_problem(name))
    for key, value in meta.get("labels", {}).items():
        check(kind, name, "metadata.labels", key, label_name_problem(key))
        check(kind, name, f"metadata.labels[{key}]", value, label_value_problem(value))
    for key in meta.get("annotations", {}):
        check(kind, name, "metadata.annotations", key, label_name_problem(key))
    selector = spec.get("deviceSelector", {})
    for field, rule in (
        ("driver", driver_name_problem),
        ("pool", pool_name_problem),
        ("device", dns1123_label_problem),
    ):
        if field in selector:
            check(kind, name, f"spec.deviceSelector.{field}", selector[field], rule(selector[field]))
    taint = spec["taint"]
    check(kind, name, "spec.taint.key", taint["key"], label_name_problem(taint["key"]))
    if taint.get("value"):
        check(kind, name, "spec.taint.value", taint["value"], label_value_problem(taint["value"]))
    check(kind, name, "spec.taint.effect", taint["effect"], taint_effect_problem(taint["effect"], kubernetes))


def version_text(version: tuple[int, int]) -> str:
    """``(1, 35)`` → ``1.35``."""
    return ".".join(str(n) for n in version)


def taint_effect_problem(effect: str, kubernetes: tuple[int, int] | None = None) -> str | None:
    """``effect`` on a Kubernetes ``(major, minor)`` server (None: any supported one), as one clause
    naming the fix; None when the server accepts it."""
    if effect not in TAINT_EFFECTS:
        return "is not one of: " + ", ".join(TAINT_EFFECTS)
    since = EFFECT_SINCE[effect]
    if kubernetes is not None and kubernetes < since:
        have, need = version_text(kubernetes), version_text(since)
        return (
            f"needs Kubernetes {need}+; for {have} set kubernetes.taints.effect.default (and any by_state or "
            f"by_reason {effect}) to NoSchedule in the policy, or render for a newer server (--kubernetes-version)"
        )
    return None


def check_device_attributes(where: str, attributes: Mapping[str, Mapping[str, Any]]) -> None:
    """A device's attributes against ``validateDevice``'s rules (names, string values, count)."""
    if len(attributes) > ATTRIBUTES_PER_DEVICE_MAX:
        raise K8sValidationError(
            f"{where}: attributes: {len(attributes)} attributes, at most {ATTRIBUTES_PER_DEVICE_MAX} per device"
        )
    for key, value in attributes.items():
        check("device", where, "attributes", key, attribute_name_problem(key))
        if "string" in value:
            check(
                "device", where, f"attributes[{key}].string", value["string"], attribute_string_problem(value["string"])
            )


def check_taint_count(rules: Sequence[Mapping[str, Any]], limit: int = TAINTS_PER_DEVICE_MAX) -> None:
    """At most ``limit`` rules per device: otel-dra's cap (see ``TAINTS_PER_DEVICE_MAX``), not a
    DeviceTaintRule limit of the API."""
    per_device: dict[tuple[str, str, str], list[str]] = {}
    for rule in rules:
        sel = rule["spec"]["deviceSelector"]
        per_device.setdefault((sel["driver"], sel["pool"], sel["device"]), []).append(rule["metadata"]["name"])
    for (driver, pool, device), names in per_device.items():
        if len(names) > limit:
            raise K8sValidationError(
                f"device {driver}/{pool}/{device}: {len(names)} taints (DeviceTaintRules {names[0]}, ...), "
                f"at most {limit} per device"
            )


# -- the kubernetes client's models -----------------------------------------------------------
def client_models() -> Any:
    """``kubernetes.client``, or a one-line error saying how to install it."""
    try:
        import kubernetes.client as client
    except ImportError:
        raise K8sValidationError(
            "the Kubernetes output needs the kubernetes client: pip install 'otel-dra[k8s]'"
        ) from None
    return client


def model_error(kind: str, name: str, exc: Exception) -> K8sValidationError:
    """A pydantic ValidationError from a client model, as one line naming the field."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "?"
        return K8sValidationError(f"{kind} {name}: {field}: {first.get('msg', exc)} (kubernetes client model)")
    return K8sValidationError(f"{kind} {name}: {str(exc).splitlines()[0]} (kubernetes client model)")
