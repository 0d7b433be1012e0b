"""``--apply``: make the cluster's otel-dra DeviceTaintRules match a rendering, idempotently.

:func:`plan` is pure (desired and existing objects in, actions out), so the reconciliation is
tested without a cluster; :func:`apply` lists the rules labelled
``app.kubernetes.io/managed-by=otel-dra`` and runs the plan through the ``kubernetes`` client:

- create a rendered rule that does not exist;
- update one whose spec, or whose otel-dra labels and annotations, differ (other labels and
  annotations, and the taint's ``timeAdded``, are kept, so a NoExecute eviction clock does not
  restart); an identical one is left alone, so a rerun changes nothing;
- delete a managed rule that is no longer rendered (its device is healthy again, or gone)
  when its device's (driver, pool) is one this rendering covers: rules of pools it did not see
  belong to devices another agent reports and are left alone. The fleet, the one writer of a
  cluster's rules, owns every managed rule instead (``whole_fleet``);
- leave alone every rule of a device whose verdict is Unknown (silence does not repair: see
  :func:`plan`), adding only what it did not have.

ResourceSlice attributes are never applied: slices belong to their DRA driver, which would
overwrite (or fight) any other writer; the driver publishes the rendered attributes itself.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_dra import __version__
from otel_dra.sinks.k8s.render import KIND, MANAGED_BY, MANAGED_BY_LABEL, MANAGED_SELECTOR, Rendering, device_of

#: Server-set fields a comparison ignores.
_SERVER_TAINT_FIELDS = ("timeAdded",)
_LIST_PAGE = 500
#: The annotation whose change alone does not rewrite a rule (see :func:`differs`).
MESSAGE_ANNOTATION = "/message"


class K8sApplyError(RuntimeError):
    """The cluster refused or failed a change; ``str()`` is one line."""


class ClusterUnavailable(K8sApplyError):
    """No cluster to talk to (no kubeconfig, not in a pod, or it does not answer)."""


@dataclass(frozen=True)
class Action:
    """One change: ``create``/``update`` send ``body``; ``delete`` removes ``name``."""

    verb: str
    name: str
    body: Mapping[str, Any] | None = None

    def __str__(self) -> str:
        return f"{self.verb} {KIND} {self.name}"


@dataclass
class ApplyResult:
    actions: list[Action] = field(default_factory=list)
    unchanged: int = 0
    #: The managed rules as listed before the changes, status included (what the cluster said they did).
    listed: list[dict[str, Any]] = field(default_factory=list)


def _selector(obj: Mapping[str, Any]) -> tuple[Any, Any]:
    return device_of(obj)[:2]


def _comparable_spec(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    spec = dict(spec or {})
    sel = spec.get("deviceSelector") or {}
    taint = {k: v for k, v in (spec.get("taint") or {}).items() if k not in _SERVER_TAINT_FIELDS and v is not None}
    return {
        "deviceSelector": {k: v for k, v in sel.items() if v is not None},
        "taint": {**taint, "value": taint.get("value") or ""},
    }


def differs(desired: Mapping[str, Any], existing: Mapping[str, Any]) -> bool:
    """Whether ``existing`` needs an update to match ``desired``: its spec (less server-set
    fields), or any label or annotation ``desired`` sets. Others' labels don't count, nor does the
    ``.../message`` annotation alone: its text carries durations that differ from one evaluation
    (or one fleet replica) to the next, and rewriting a rule for that is churn. It is refreshed
    whenever anything else changes."""
    if _comparable_spec(desired.get("spec")) != _comparable_spec(existing.get("spec")):
        return True
    have_meta = existing.get("metadata") or {}
    for part in ("labels", "annotations"):
        have = have_meta.get(part) or {}
        for key, value in (desired["metadata"].get(part) or {}).items():
            if have.get(key) != value and not (part == "annotations" and key.endswith(MESSAGE_ANNOTATION)):
                return True
    return False


def _update_body(desired: Mapping[str, Any], existing: Mapping[str, Any]) -> dict[str, Any]:
    """``desired`` as a replacement of ``existing``: its resourceVersion (no lost update), the
    labels and annotations others set, and the taint's timeAdded."""
    body = copy.deepcopy(dict(desired))
    have_meta = existing.get("metadata") or {}
    meta = body["metadata"]
    if have_meta.get("resourceVersion"):
        meta["resourceVersion"] = have_meta["resourceVersion"]
    for part in ("labels", "annotations"):
        meta[part] = {**(have_meta.get(part) or {}), **(meta.get(part) or {})}
    added = ((existing.get("spec") or {}).get("taint") or {}).get("timeAdded")
    if added:
        body["spec"]["taint"]["timeAdded"] = added
    return body


def plan(
    desired: Sequence[Mapping[str, Any]],
    existing: Sequence[Mapping[str, Any]],
    scope: Collection[tuple[str, str]] | None,
    silent: Collection[tuple[str, str, str]] = (),
) -> list[Action]:
    """The creates, updates and deletes that make ``existing`` (the cluster's managed rules)
    match ``desired``; deletes only in ``scope`` ((driver, pool) pairs; ``None``: every managed
    rule, for the fleet, the one writer of them all). Sorted, deterministic.

    Silence does not repair: a rule of a ``silent`` device (driver, pool, device: its verdict is
    Unknown, its telemetry stopped) is neither deleted nor changed, so a Collector outage does not
    put failed GPUs back into scheduling; rules it did not have (``stale``) are still created."""
    want = {o["metadata"]["name"]: o for o in desired}
    have = {
        o["metadata"]["name"]: o
        for o in existing
        if ((o.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
    }
    actions: list[Action] = []
    hush = set(silent)
    for name in sorted(want):
        if name not in have:
            actions.append(Action("create", name, want[name]))
        elif differs(want[name], have[name]) and device_of(have[name]) not in hush:
            actions.append(Action("update", name, _update_body(want[name], have[name])))
    for name in sorted(have.keys() - want.keys()):
        if (scope is None or _selector(have[name]) in scope) and device_of(have[name]) not in hush:
            actions.append(Action("delete", name))
    return actions


# -- the cluster ------------------------------------------------------------------------------
def _kubeconfig_paths() -> list[Path]:
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path("~/.kube/config").expanduser()]


def connect(context: str | None = None, user_agent: str | None = None, flag: str = "--apply") -> Any:
    """An ``ApiClient`` from the kubeconfig (KUBECONFIG or ~/.kube/config), else the pod's
    service account; :class:`ClusterUnavailable` when there is neither. Its User-Agent is
    ``otel-dra/<version>`` (or ``user_agent``), so API audit logs say who wrote what."""
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise K8sApplyError("--apply needs the kubernetes client: pip install 'otel-dra[k8s]'") from None
    cfg = client.Configuration()
    paths = _kubeconfig_paths()
    found = [p for p in paths if p.is_file()]
    if found:
        try:
            # The path explicitly: the client reads KUBECONFIG once, when it is imported.
            config.load_kube_config(
                config_file=os.pathsep.join(map(str, found)),
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
        except (ConfigException, OSError, ValueError, TypeError) as exc:
            raise ClusterUnavailable(f"kubeconfig {found[0]}: {str(exc).splitlines()[0]}") from None
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except ConfigException:
            where = os.pathsep.join(map(str, paths))
            instead = f", or run without {flag}" if flag.startswith("--") else ""  # (a command needs one)
            raise ClusterUnavailable(
                f"no Kubernetes cluster to talk to: no kubeconfig at {where} and not running in a pod "
                f"(KUBERNETES_SERVICE_HOST unset); set KUBECONFIG{instead}"
            ) from None
    api_client = client.ApiClient(cfg)
    api_client.user_agent = user_agent or f"otel-dra/{__version__}"
    return api_client


def _status_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "reason", "") or exc)


class _Api:
    """The DeviceTaintRule calls of one API version, each failure one line."""

    def __init__(self, api_client: Any, api_version: str, timeout_s: float) -> None:
        import kubernetes.client as client
        import urllib3

        self.client = client
        self.short = api_version.removeprefix("resource.k8s.io/")
        self.api_version = api_version
        cap = self.short[0].upper() + self.short[1:]
        self.model = getattr(client, f"{cap}DeviceTaintRule")
        self.api = getattr(client, f"Resource{cap}Api")(api_client)
        self.api_client = api_client
        self.host = api_client.configuration.host
        self.timeout_s = timeout_s
        self._net_errors = (urllib3.exceptions.HTTPError, OSError)

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self.timeout_s, **kwargs)
        except self.client.ApiException as exc:
            status = exc.status
            if status == 404 and what.startswith("list"):
                raise K8sApplyError(
                    f"{self.host} does not serve {self.api_version} devicetaintrules (v1: Kubernetes 1.37+; "
                    "v1beta2: 1.36+, with the DRADeviceTaintRules feature and the API version enabled; "
                    "v1alpha3: 1.33+, with the DRADeviceTaints feature and the API version enabled); "
                    "try the other --api-version"
                ) from None
            if status in (401, 403):
                raise K8sApplyError(
                    f"{what}: {'unauthorized' if status == 401 else 'forbidden'}: {_status_message(exc)}; otel-dra "
                    "needs list, create, update and delete on devicetaintrules.resource.k8s.io"
                ) from None
            raise K8sApplyError(f"{what}: HTTP {status}: {_status_message(exc)}") from None
        except self._net_errors as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ClusterUnavailable(f"cannot reach the Kubernetes API at {self.host}: {_short(reason)}") from None

    def list_managed(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            extra = {"_continue": token} if token else {}
            page = self.call(
                "list devicetaintrules",
                self.api.list_device_taint_rule,
                label_selector=MANAGED_SELECTOR,
                limit=_LIST_PAGE,
                **extra,
            )
            doc = self.api_client.sanitize_for_serialization(page)
            items.extend(doc.get("items") or [])
            token = (doc.get("metadata") or {}).get("continue")
            if not token:
                return items

    def run(self, action: Action) -> None:
        if action.verb == "delete":
            self.call(str(action), self.api.delete_device_taint_rule, action.name)
            return
        body = self.model.from_dict(dict(action.body or {}))
        if action.verb == "create":
            self.call(str(action), self.api.create_device_taint_rule, body)
        else:
            self.call(str(action), self.api.replace_device_taint_rule, action.name, body)


def list_managed(api_client: Any, api_version: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every DeviceTaintRule otel-dra manages (its label), as the cluster lists them, status included; each
    failure one line (:class:`K8sApplyError`)."""
    return _Api(api_client, api_version, timeout_s).list_managed()


def _short(reason: Any) -> str:
    text = str(reason)
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text.splitlines()[0][:200]


class NotLeader(K8sApplyError):
    """The writer lost its Lease mid-apply and stopped (the new leader finishes the job)."""


def apply(
    rendering: Rendering,
    api_client: Any | None = None,
    timeout_s: float = 10.0,
    *,
    whole_fleet: bool = False,
    may_write: Callable[[], bool] | None = None,
    gate: Callable[[list[dict[str, Any]], list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
    done: Callable[[Action, Mapping[str, Any] | None], None] | None = None,
) -> ApplyResult:
    """Reconcile the cluster's managed DeviceTaintRules with ``rendering`` (see the module doc).

    ``whole_fleet``: delete every managed rule not rendered, not only those in the rendering's
    pools (the fleet is the one writer). ``may_write`` is asked before each change; when it says
    no (a leader whose Lease lapsed), :class:`NotLeader` stops the apply at once. ``gate``: the
    rules to write instead of the rendered ones, given the cluster's (the brake on mass quarantine,
    :mod:`otel_dra.sinks.k8s.brake`). ``done``: called after each change the cluster took, with the rule it
    replaced or deleted (None for a create): the audit trail's Events."""
    api = _Api(api_client if api_client is not None else connect(), rendering.api_version, timeout_s)
    existing = api.list_managed()
    desired = rendering.rules if gate is None else gate(rendering.rules, existing)
    result = ApplyResult(plan(desired, existing, None if whole_fleet else rendering.scope, rendering.silent))
    result.listed = existing
    result.unchanged = len(desired) - sum(a.verb in ("create", "update") for a in result.actions)
    before = {(o.get("metadata") or {}).get("name"): o for o in existing}
    for count, action in enumerate(result.actions):
        if may_write is not None and not may_write():
            raise NotLeader(f"lost the leader Lease: stopped after {count} of {len(result.actions)} changes")
        try:
            api.run(action)
        except K8sApplyError as exc:
            if count:
                raise type(exc)(f"{exc} (after {count} of {len(result.actions)} changes)") from None
            raise
        if done is not None:
            done(action, before.get(action.name))
    return result


# -- discovery --------------------------------------------------------------------------------
_GROUP = "resource.k8s.io"
_RESOURCE = "devicetaintrules"


@dataclass(frozen=True)
class Discovered:
    """What the server serves: the newest DeviceTaintRule ``api_version`` and its Kubernetes
    ``(major, minor)`` (``None`` when ``/version`` did not say)."""

    api_version: str
    kubernetes: tuple[int, int] | None
    host: str

    def __str__(self) -> str:
        from otel_dra.sinks.k8s.validation import version_text

        k8s = f"Kubernetes {version_text(self.kubernetes)}" if self.kubernetes else "Kubernetes of unknown version"
        return f"DeviceTaintRules: {self.api_version} (served by {k8s} at {self.host})"


def _get(api_client: Any, path: str, timeout_s: float) -> tuple[int, Any]:
    """GET ``path`` through ``api_client`` (its auth and TLS): (status, JSON body or None);
    :class:`ClusterUnavailable` when the server does not answer."""
    import kubernetes.client as client
    import urllib3

    host = api_client.configuration.host
    try:
        params = api_client.param_serialize(method="GET", resource_path=path, auth_settings=["BearerToken"])
        resp = api_client.call_api(*params, _request_timeout=timeout_s)
        resp.read()
    except client.ApiException as exc:  # status 0: TLS and connection failures, as the client reports them
        raise ClusterUnavailable(f"cannot reach the Kubernetes API at {host}: {_short(exc.reason)}") from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ClusterUnavailable(f"cannot reach the Kubernetes API at {host}: {_short(reason)}") from None
    try:
        doc = json.loads(resp.data or b"null")
    except ValueError:
        doc = None
    if resp.status in (401, 403):
        message = (doc or {}).get("message") if isinstance(doc, dict) else None
        raise K8sApplyError(
            f"GET {path}: {'unauthorized' if resp.status == 401 else 'forbidden'}: {message or resp.reason}; "
            "otel-dra needs to read the API discovery (/apis, /version) and devicetaintrules.resource.k8s.io"
        )
    return resp.status, doc


def _server_kubernetes(doc: Any) -> tuple[int, int] | None:
    """``/version``'s (major, minor): from gitVersion (``v1.37.1-gke.3``), else major/minor (``"37+"``)."""
    import re

    if not isinstance(doc, dict):
        return None
    m = re.match(r"v?(\d+)\.(\d+)", str(doc.get("gitVersion") or ""))
    if m:
        return int(m.group(1)), int(m.group(2))
    major, minor = (re.match(r"\d+", str(doc.get(k) or "")) for k in ("major", "minor"))
    return (int(major.group()), int(minor.group())) if major and minor else None


def _how_to_serve(kubernetes: tuple[int, int] | None) -> str:
    from otel_dra.sinks.k8s.render import SERVED_FROM
    from otel_dra.sinks.k8s.validation import version_text

    def need(short: str, gate: str) -> str:
        return f"{short} DeviceTaintRules need the {gate} feature gate and the {_GROUP}/{short} API enabled"

    alpha, beta = need("v1alpha3", "DRADeviceTaints"), need("v1beta2", "DRADeviceTaintRules")
    if kubernetes is None:
        return f"{beta} (Kubernetes 1.36+); {alpha} (1.33+)"
    if kubernetes >= SERVED_FROM[f"{_GROUP}/v1"]:
        return need("v1", "DRADeviceTaintRules") + " (both on by default)"
    if kubernetes >= SERVED_FROM[f"{_GROUP}/v1beta2"]:
        return beta
    if kubernetes >= SERVED_FROM[f"{_GROUP}/v1alpha3"]:
        return alpha
    return f"DeviceTaintRules need Kubernetes {version_text(SERVED_FROM[f'{_GROUP}/v1alpha3'])}+"


def discover(api_client: Any, timeout_s: float = 10.0) -> Discovered:
    """The newest DeviceTaintRule version the server serves (``/apis/resource.k8s.io`` and each
    version's resource list, newest first) and its Kubernetes version (``/version``); a one-line
    :class:`K8sApplyError` saying why and how to fix it when it serves none."""
    from otel_dra.sinks.k8s.render import API_VERSIONS
    from otel_dra.sinks.k8s.validation import version_text

    host = api_client.configuration.host
    status, version_doc = _get(api_client, "/version", timeout_s)
    kubernetes = _server_kubernetes(version_doc) if status == 200 else None
    status, group = _get(api_client, f"/apis/{_GROUP}", timeout_s)
    served: list[str] = []
    if status == 200 and isinstance(group, dict):
        served = [str(v.get("version")) for v in group.get("versions") or [] if isinstance(v, dict)]
    elif status != 404:
        raise K8sApplyError(f"GET /apis/{_GROUP}: HTTP {status}")
    for short in API_VERSIONS:  # newest first
        if short not in served:
            continue
        status, resources = _get(api_client, f"/apis/{_GROUP}/{short}", timeout_s)
        names = (
            {str(x.get("name")) for x in resources.get("resources") or [] if isinstance(x, dict)}
            if status == 200 and isinstance(resources, dict)
            else set()
        )
        if _RESOURCE in names:
            return Discovered(API_VERSIONS[short], kubernetes, host)
    k8s = f"Kubernetes {version_text(kubernetes)}" if kubernetes else "Kubernetes of unknown version"
    group_says = f"{_GROUP} serves {', '.join(served)}" if served else f"{_GROUP} is not served"
    raise K8sApplyError(f"DeviceTaintRules are not served by {host} ({k8s}: {group_says}; {_how_to_serve(kubernetes)})")
