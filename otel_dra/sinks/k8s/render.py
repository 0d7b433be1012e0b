"""Verdicts → ``DeviceTaintRule`` objects and ResourceSlice device attributes, validated.

One rule per (device, reason that is on) for the verdicts whose health the policy taints
(Unhealthy and Unknown by default; Healthy devices get none), keyed and valued by the policy's
templates, effect ``None`` unless the policy chooses a response; at most ``max_per_device``
rules per device, the most disruptive effect and then the most severe reason kept first.
Names are deterministic (the same verdicts give the same names on every run and every node)
and every rule is labelled ``app.kubernetes.io/managed-by: otel-dra``, so ``--apply`` can find
the ones it made and delete those whose device is healthy again.

A finding beyond a device (contract section 4: scope workload, node, link or firmware) says so on every device it
touches, and is rendered the same way: one rule per (device, reason), so its devices' rules share the taint's key
and value (both come from the reason, state, health and remediation, which the finding's verdicts share). Every rule
is labelled ``<domain>/group`` with the finding's name (:mod:`otel_dra.sinks.findings`: the group, after its node for
a ``pcie/<address>`` group, as PCI addresses repeat across hosts), made a label value (at most 63 characters of
``[A-Za-z0-9._-]``, hash-suffixed when cut; empty for a device's own verdict, so an update clears a group that no
longer holds): ``kubectl get devicetaintrules -l <domain>/group=<value>`` lists a finding's rules, and
``-L <domain>/group`` shows every rule's.

Why one rule per device, not one rule for the group: a DeviceTaintRule's ``deviceSelector`` selects by driver, pool
and device name only (resource.k8s.io v1, v1beta2, and v1alpha3 from Kubernetes 1.35). v1alpha3 on 1.33 and 1.34
also had CEL ``selectors`` and ``deviceClassName``; 1.35 removed them, and no later version has them. Even where
served, a CEL selector could only match what the DRA driver publishes in its ResourceSlices (a PCIe switch or a
fabric is not an attribute otel-dra can put there: slices are the driver's), and a finding's members change device by
device: per-device rules keep the reconcile per device (a device that leaves the finding loses its rule, the others
keep theirs and their NoExecute clocks), on every server.

Attributes (``<domain>/health``, ``<domain>/state`` by default) go to every device: they are
facts for the DRA driver to publish in its own ResourceSlices (slices belong to the driver, so
otel-dra renders them and never writes slices).

Every object is built with the ``kubernetes`` client's models of its API version
(``V1DeviceTaintRule``, ``V1beta2DeviceTaintRule`` or ``V1alpha3DeviceTaintRule``;
``V1Device``/``V1DeviceAttribute``), serialized with
``ApiClient().sanitize_for_serialization`` and checked against the API's name and size rules
(:mod:`otel_dra.sinks.k8s.validation`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from otel_dra import conventions as cv
from otel_dra.classifier.verdict import Verdict, VerdictInputError
from otel_dra.classifier.views import combine
from otel_dra.policy import Policy
from otel_dra.sinks.findings import finding_of, label_value
from otel_dra.sinks.k8s import validation as val
from otel_dra.sinks.k8s.settings import K8sSettings
from otel_dra.sinks.k8s.validation import K8sValidationError
from otel_dra.sinks.k8s.versions import API_VERSIONS, DEFAULT_API_VERSION, SERVED_FROM

#: The server assumed when none is given: the version's first, but at least 1.35 (so v1alpha3 may
#: carry effect None; say ``--kubernetes-version 1.33`` or ``1.34`` for the servers that may not).
ASSUMED_KUBERNETES = (1, 35)
KIND = "DeviceTaintRule"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "otel-dra"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
RULES_FILE = "devicetaintrules.yaml"
ATTRIBUTES_FILE = "resourceslice-attributes.yaml"

#: Which taint to keep first under the per-device cap, after the effect: lost and broken
#: hardware before degraded performance, and ``stale`` (the node is silent, not the device) last.
REASON_SEVERITY: tuple[str, ...] = (
    "device_lost",
    "memory_ecc",
    "driver_errors",
    "vendor_status",
    "power_delivery",
    "device_reset",
    "thermal",
    "cooling",
    "link",
    "firmware",
    "power_throttling",
    "memory_pressure",
    "stale",
)
_SEVERITY = {r: i for i, r in enumerate(REASON_SEVERITY)}
_EFFECT_RANK = {e: i for i, e in enumerate(val.TAINT_EFFECTS)}


def api_version_of(choice: str) -> str:
    """``v1beta2`` or ``resource.k8s.io/v1beta2`` → ``resource.k8s.io/v1beta2``; ValueError otherwise."""
    short = choice.removeprefix("resource.k8s.io/")
    if short not in API_VERSIONS:
        raise ValueError(f"API version {choice!r} is not one of: {', '.join(API_VERSIONS)}")
    return API_VERSIONS[short]


def kubernetes_version_of(text: str) -> tuple[int, int]:
    """``1.35``, ``v1.35`` or ``1.35.2`` → ``(1, 35)``; ValueError otherwise."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?", text.strip())
    if not m:
        raise ValueError(f"Kubernetes version {text!r} is not MAJOR.MINOR (e.g. 1.35)")
    return int(m.group(1)), int(m.group(2))


def target_kubernetes(api_version: str, kubernetes_version: str | tuple[int, int] | None = None) -> tuple[int, int]:
    """The Kubernetes server the rules are for: the one given (which must serve ``api_version``,
    else a one-line error naming the version to use), else the assumed one (``ASSUMED_KUBERNETES``)."""
    api = api_version_of(api_version)
    first = SERVED_FROM[api]
    if kubernetes_version is None:
        return max(first, ASSUMED_KUBERNETES)
    target = kubernetes_version_of(kubernetes_version) if isinstance(kubernetes_version, str) else kubernetes_version
    if target < first:
        served = [short for short, full in API_VERSIONS.items() if SERVED_FROM[full] <= target]
        fix = f"render with --api-version {served[0]}" if served else "DeviceTaintRule needs Kubernetes 1.33+"
        raise K8sValidationError(
            f"{api} DeviceTaintRules are served from Kubernetes {val.version_text(first)}, "
            f"not {val.version_text(target)}; {fix}"
        )
    return target


def effect_of(rule: Mapping[str, Any] | None) -> str:
    """A DeviceTaintRule's taint effect: ``None`` when it sets none, or for no rule at all."""
    return str((((rule or {}).get("spec") or {}).get("taint") or {}).get("effect") or "None")


def device_of(rule: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """The (driver, pool, device) a DeviceTaintRule selects."""
    sel = (rule.get("spec") or {}).get("deviceSelector") or {}
    return sel.get("driver"), sel.get("pool"), sel.get("device")


def rule_name(driver: str, pool: str, device: str, reason: str) -> str:
    """``otel-dra-<pool>-<device>-<reason>-<hash>``: a DNS subdomain (≤ 253), the same on every run.

    The readable part is lower-cased with every other character run made '-', and cut to fit;
    the hash of the exact (driver, pool, device, reason) keeps two devices whose readable parts
    collide (another driver, ``a-b``/``c`` vs ``a``/``b-c``, a cut) apart.
    """
    digest = hashlib.sha256("\0".join((driver, pool, device, reason)).encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9]+", "-", f"otel-dra-{pool}-{device}-{reason}".lower()).strip("-")
    slug = slug[: val.DNS1123_SUBDOMAIN_MAX - len(digest) - 1].rstrip("-")
    return f"{slug}-{digest}"


@dataclass(frozen=True)
class DeviceRef:
    """A DRA device: what a DeviceTaintRule selects and a ResourceSlice lists."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass
class Rendering:
    """What :func:`render` made: API objects (plain dicts, as the API takes them) and notes."""

    api_version: str
    #: The Kubernetes (major, minor) the rules were checked for (see :func:`target_kubernetes`).
    kubernetes: tuple[int, int] = ASSUMED_KUBERNETES
    rules: list[dict[str, Any]] = field(default_factory=list)
    attributes: list[dict[str, Any]] = field(default_factory=list)
    #: (driver, pool) of every device rendered, healthy or not: the pools whose rules
    #: ``--apply`` reconciles (rules in other pools belong to other agents' devices).
    scope: set[tuple[str, str]] = field(default_factory=set)
    dropped: list[str] = field(default_factory=list)  # taints over the per-device cap
    skipped: list[str] = field(default_factory=list)  # devices not rendered, and why
    #: (driver, pool, device) of every device whose verdict is Unknown: silence does not repair, so
    #: ``--apply`` keeps the rules such a device has in the cluster (and adds ``stale`` beside them).
    silent: set[tuple[str, str, str]] = field(default_factory=set)

    def rules_yaml(self) -> str:
        head = (
            f"# DeviceTaintRules ({self.api_version}): {len(self.rules)}, rendered by otel-dra from device health "
            f"verdicts.\n# Each is labelled {MANAGED_SELECTOR}; 'otel-dra k8s render --apply' also deletes "
            "the ones no longer rendered.\n"
        )
        return head + _dump_all(self.rules)

    def attributes_yaml(self) -> str:
        head = (
            "# ResourceSlice device attributes (resource.k8s.io/v1 spec.devices[].attributes) rendered by otel-dra.\n"
            "# Not a Kubernetes object: slices belong to their DRA driver, which publishes these for its devices.\n"
        )
        return head + yaml.safe_dump({"devices": self.attributes}, sort_keys=False, allow_unicode=True, width=120)

    def to_yaml(self, only: str | None = None) -> str:
        """A multi-document stream: the rules (``kubectl apply -f`` takes them), then the attributes."""
        parts = []
        if only in (None, "taints"):
            parts.append(self.rules_yaml())
        if only in (None, "attributes"):
            parts.append("---\n" + self.attributes_yaml() if parts and self.rules else self.attributes_yaml())
        return "".join(parts)


def _dump_all(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, explicit_start=True, allow_unicode=True, width=120)


def render(
    verdicts: Iterable[Verdict],
    policy: Policy,
    api_version: str = DEFAULT_API_VERSION,
    *,
    drivers: Mapping[tuple[str, str], str | None] | None = None,
    driver: str | None = None,
    strict: bool = True,
    kubernetes_version: str | tuple[int, int] | None = None,
) -> Rendering:
    """Render the current verdicts (one per device; several views of a device are combined).

    A device's DRA driver is ``drivers[(node, hw.id)]``, else the verdict's own (its
    ``dra.driver.name``), else ``driver``. Devices without ``dra.pool.name``/``dra.device.name`` are not DRA devices and
    are skipped. With ``strict``, a device without a driver or with names the API would reject
    raises :class:`K8sValidationError`; without, it is skipped with the reason in ``skipped``
    (the agent must keep serving the other devices).

    ``kubernetes_version`` (``"1.34"``) is the server the rules are for; it must serve
    ``api_version`` and every effect is checked against it (``None`` needs 1.35). Not given: the
    API version's first server, at least 1.35 (:func:`target_kubernetes`).
    """
    client = val.client_models()
    settings = K8sSettings.from_policy(policy)
    out = Rendering(api_version_of(api_version), target_kubernetes(api_version, kubernetes_version))
    views: dict[DeviceRef, list[Verdict]] = {}
    not_dra: list[str] = []
    for verdict in verdicts:
        where = f"device {verdict.node}/{verdict.hw_id}"
        if verdict.pool is None or verdict.device is None:
            not_dra.append(f"{verdict.node}/{verdict.hw_id}")
            continue
        name = (drivers or {}).get((verdict.node, verdict.hw_id)) or verdict.driver or driver
        if not name:
            message = f"{where}: no {cv.DRA_DRIVER_NAME} in its telemetry; give the DRA driver's name (--driver)"
            if strict:
                raise K8sValidationError(message)
            out.skipped.append(message)
            continue
        views.setdefault(DeviceRef(name, verdict.pool, verdict.device), []).append(verdict)
    if not_dra:  # one line, however many: a trace without DRA names is not an error
        out.skipped.append(
            f"{len(not_dra)} devices without {cv.DRA_POOL_NAME}/{cv.DRA_DEVICE_NAME} are not DRA devices and get "
            f"nothing (e.g. {', '.join(sorted(not_dra)[:3])})"
        )
    mode = policy.shared_devices.combine
    for ref in sorted(views, key=lambda r: (r.driver, r.pool, r.device)):
        verdict = combine(views[ref], mode)
        try:
            attributes = _attributes(client, settings, ref, verdict)
            rules = _rules(client, settings, out, ref, verdict)
        except K8sValidationError as exc:
            if strict:
                raise
            out.skipped.append(str(exc))
            continue
        out.scope.add((ref.driver, ref.pool))
        if verdict.health == "Unknown":
            out.silent.add((ref.driver, ref.pool, ref.device))
        out.attributes.append(attributes)
        out.rules.extend(rules)
    val.check_taint_count(out.rules)
    return out


def _state(verdict: Verdict) -> str:
    return verdict.state or "unknown"


def _rules(
    client: Any, settings: K8sSettings, out: Rendering, ref: DeviceRef, verdict: Verdict
) -> list[dict[str, Any]]:
    """One DeviceTaintRule per reason that is on, capped at ``max_per_device``, most disruptive first."""
    if not settings.taints_enabled or verdict.health not in settings.taint_health:
        return []
    state = _state(verdict)
    ranked = sorted(
        verdict.reasons,
        key=lambda r: (-_EFFECT_RANK.get(settings.effect(r, state), 0), _SEVERITY.get(r, len(_SEVERITY)), r),
    )
    keep, over = ranked[: settings.max_per_device], ranked[settings.max_per_device :]
    for reason in over:
        out.dropped.append(
            f"device {ref}: taint {reason} not rendered: over kubernetes.taints.max_per_device "
            f"({settings.max_per_device}); kept {', '.join(keep)}"
        )
    return [_rule(client, settings, out, ref, verdict, reason, state) for reason in keep]


def _rule(
    client: Any, settings: K8sSettings, out: Rendering, ref: DeviceRef, verdict: Verdict, reason: str, state: str
) -> dict[str, Any]:
    fill = {
        "domain": settings.domain,
        "reason": reason,
        "state": state,
        "health": verdict.health,
        "remediation": verdict.remediation,
    }
    name = rule_name(ref.driver, ref.pool, ref.device, reason)
    d = settings.domain
    value = settings.value.format(**fill)
    obj = {
        "apiVersion": out.api_version,
        "kind": KIND,
        "metadata": {
            "name": name,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, f"{d}/reason": reason, f"{d}/group": group_label(verdict)},
            "annotations": {
                f"{d}/node": verdict.node,
                f"{d}/hw-id": verdict.hw_id,
                f"{d}/health": verdict.health,
                f"{d}/remediation": verdict.remediation,
                # What the verdict is about (contract section 4), and the shared thing ("" for the device's own):
                # both always written, so an update (which keeps annotations it does not set) leaves no stale group.
                f"{d}/scope": verdict.scope,
                f"{d}/group": verdict.group or "",
                f"{d}/message": verdict.message,
            },
        },
        "spec": {
            "deviceSelector": {"driver": ref.driver, "pool": ref.pool, "device": ref.device},
            "taint": {
                "key": settings.key.format(**fill),
                **({"value": value} if value else {}),
                "effect": settings.effect(reason, state),
            },
        },
    }
    val.check_taint_rule(obj, out.kubernetes)
    return _through_model(client, obj)


def group_label(verdict: Verdict) -> str:
    """The ``<domain>/group`` label value of a verdict's rules: its finding's name as a label value, "" for a
    device's own verdict (always set, so that an update, which keeps labels it does not set, clears it)."""
    finding = finding_of(verdict)
    return "" if finding is None else label_value(finding.name)


def _through_model(client: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """Build the client's models of this version (``V1…``, ``V1beta2…``, ``V1alpha3…``) and serialize
    them back: what the client would send."""
    short = obj["apiVersion"].removeprefix("resource.k8s.io/")
    cap = short[0].upper() + short[1:]  # v1beta2 → V1beta2
    meta, spec = obj["metadata"], obj["spec"]
    try:
        model = getattr(client, f"{cap}DeviceTaintRule")(
            api_version=obj["apiVersion"],
            kind=obj["kind"],
            metadata=client.V1ObjectMeta(name=meta["name"], labels=meta["labels"], annotations=meta["annotations"]),
            spec=getattr(client, f"{cap}DeviceTaintRuleSpec")(
                device_selector=getattr(client, f"{cap}DeviceTaintSelector")(**spec["deviceSelector"]),
                taint=getattr(client, f"{cap}DeviceTaint")(**spec["taint"]),
            ),
        )
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise val.model_error(KIND, meta["name"], exc) from None
    serialized: dict[str, Any] = _serializer(client).sanitize_for_serialization(model)
    return serialized


@functools.cache
def _serializer(client: Any) -> Any:
    """One ``ApiClient`` for turning models into plain dicts: each one builds a connection pool and
    its configuration, which cost more than the serializing, and a rendering serializes every device."""
    return client.ApiClient()


def _attributes(client: Any, settings: K8sSettings, ref: DeviceRef, verdict: Verdict) -> dict[str, Any]:
    """The device's attributes, built as a ``V1Device`` (name + attributes) and checked."""
    where = f"{ref}"
    for field_name, value, rule in (
        ("driver", ref.driver, val.driver_name_problem),
        ("pool", ref.pool, val.pool_name_problem),
        ("device", ref.device, val.dns1123_label_problem),
    ):
        val.check("device", where, field_name, value, rule(value))
    fill = {"health": verdict.health, "state": _state(verdict), "remediation": verdict.remediation}
    attrs = {f"{settings.domain}/{name}": {"string": tpl.format(**fill)} for name, tpl in settings.attributes.items()}
    val.check_device_attributes(where, attrs)
    try:
        device = client.V1Device(
            name=ref.device, attributes={k: client.V1DeviceAttribute(**v) for k, v in attrs.items()}
        )
    except ValueError as exc:
        raise val.model_error("device", where, exc) from None
    serialized = _serializer(client).sanitize_for_serialization(device)
    return {
        "driver": ref.driver,
        "pool": ref.pool,
        "device": serialized["name"],
        "attributes": serialized["attributes"],
    }


# -- verdicts in ------------------------------------------------------------------------------
def read_verdict_lines(lines: Iterable[str], source: str) -> list[Verdict]:
    """Verdict JSON lines (the replay output): the last line per device wins."""
    latest: dict[tuple[str, str], Verdict] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise VerdictInputError(f"{source}:{number}: not JSON ({exc})") from None
        verdict = Verdict.from_json(row, f"{source}:{number}")
        latest[(verdict.node, verdict.hw_id)] = verdict
    return list(latest.values())


def read_devices_json(doc: Any, source: str) -> list[Verdict]:
    """An agent's ``/v1/devices`` answer: ``{"devices": [verdict lines...]}``."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("devices"), list):
        raise VerdictInputError(f"{source}: not otel-dra's device list (no 'devices' list)")
    verdicts = []
    for i, row in enumerate(doc["devices"]):
        verdicts.append(Verdict.from_json(row, f"{source}: devices[{i}]"))
    return verdicts


# -- files out --------------------------------------------------------------------------------
def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` atomically (temp file in the same directory, then rename) unless the file
    already holds it: a reader (kubectl, a driver) sees the old file or the new one, never half."""
    try:
        if path.read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the files are for other processes to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def write_rendering(rendering: Rendering, out_dir: Path, only: str | None = None) -> list[Path]:
    """``devicetaintrules.yaml`` and ``resourceslice-attributes.yaml`` in ``out_dir``; the ones that changed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    if only in (None, "taints"):
        files.append((out_dir / RULES_FILE, rendering.rules_yaml()))
    if only in (None, "attributes"):
        files.append((out_dir / ATTRIBUTES_FILE, rendering.attributes_yaml()))
    return [path for path, text in files if write_if_changed(path, text)]
