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
  belong to devices another agent reports and are left alone.

ResourceSlice attributes are never applied: slices belong to their DRA driver, which would
overwrite (or fight) any other writer; the driver publishes the rendered attributes itself.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_dra.k8s.render import KIND, MANAGED_BY, MANAGED_BY_LABEL, MANAGED_SELECTOR, Rendering

#: Server-set fields a comparison ignores.
_SERVER_TAINT_FIELDS = ("timeAdded",)
_LIST_PAGE = 500


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


def _selector(obj: Mapping[str, Any]) -> tuple[Any, Any]:
    sel = (obj.get("spec") or {}).get("deviceSelector") or {}
    return sel.get("driver"), sel.get("pool")


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
    fields), or any label or annotation ``desired`` sets. Others' labels don't count."""
    if _comparable_spec(desired.get("spec")) != _comparable_spec(existing.get("spec")):
        return True
    have_meta = existing.get("metadata") or {}
    for part in ("labels", "annotations"):
        have = have_meta.get(part) or {}
        if any(have.get(k) != v for k, v in (desired["metadata"].get(part) or {}).items()):
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
    scope: Collection[tuple[str, str]],
) -> list[Action]:
    """The creates, updates and deletes that make ``existing`` (the cluster's managed rules)
    match ``desired``; deletes only in ``scope`` ((driver, pool) pairs). Sorted, deterministic."""
    want = {o["metadata"]["name"]: o for o in desired}
    have = {
        o["metadata"]["name"]: o
        for o in existing
        if ((o.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
    }
    actions: list[Action] = []
    for name in sorted(want):
        if name not in have:
            actions.append(Action("create", name, want[name]))
        elif differs(want[name], have[name]):
            actions.append(Action("update", name, _update_body(want[name], have[name])))
    for name in sorted(have.keys() - want.keys()):
        if _selector(have[name]) in scope:
            actions.append(Action("delete", name))
    return actions


# -- the cluster ------------------------------------------------------------------------------
def _kubeconfig_paths() -> list[Path]:
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path("~/.kube/config").expanduser()]


def connect(context: str | None = None) -> Any:
    """An ``ApiClient`` from the kubeconfig (KUBECONFIG or ~/.kube/config), else the pod's
    service account; :class:`ClusterUnavailable` when there is neither."""
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
            raise ClusterUnavailable(
                f"no Kubernetes cluster to apply to: no kubeconfig at {where} and not running in a pod "
                "(KUBERNETES_SERVICE_HOST unset); set KUBECONFIG, or render without --apply"
            ) from None
    return client.ApiClient(cfg)


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


def _short(reason: Any) -> str:
    text = str(reason)
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text.splitlines()[0][:200]


def apply(rendering: Rendering, api_client: Any | None = None, timeout_s: float = 10.0) -> ApplyResult:
    """Reconcile the cluster's managed DeviceTaintRules with ``rendering`` (see the module doc)."""
    api = _Api(api_client if api_client is not None else connect(), rendering.api_version, timeout_s)
    existing = api.list_managed()
    result = ApplyResult(plan(rendering.rules, existing, rendering.scope))
    result.unchanged = len(rendering.rules) - sum(a.verb in ("create", "update") for a in result.actions)
    for done, action in enumerate(result.actions):
        try:
            api.run(action)
        except K8sApplyError as exc:
            if done:
                raise type(exc)(f"{exc} (after {done} of {len(result.actions)} changes)") from None
            raise
    return result
