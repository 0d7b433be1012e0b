"""A Kubernetes API server's discovery, DeviceTaintRule and Lease endpoints, in memory, over real HTTP.

No kube-apiserver runs here, so this stand-in keeps the rules of the real one that otel-dra meets:

- discovery as the server serves it: ``/version``, the ``resource.k8s.io`` APIGroup and each
  version's APIResourceList;
- optimistic concurrency: an update must carry the object's current ``resourceVersion``, else
  409 Conflict with the apiserver's own message ("Operation cannot be fulfilled on ..."), and a
  create of an existing name is 409 AlreadyExists; a missing object is 404 NotFound;
- every DeviceTaintRule written is validated against the official OpenAPI schema of the
  server's Kubernetes version (``kubernetes-validate``), and refused with 422 Invalid if it fails;
- Lease bodies are checked for the fields leader election depends on;
- ``events.k8s.io/v1`` Events: created (schema, and the API server's own ``ValidateEventCreate`` rules
  with its error texts: k8s.io/kubernetes pkg/apis/core/validation/events.go), and their series
  patched with a strategic merge patch (only ``series`` may change: ``ValidateEventUpdate``).

It records every request (``requests``, for the assertions the older tests make) and every write
with the client's User-Agent and the time (``writes``), so a test can tell which replica wrote.
"""

from __future__ import annotations

import functools
import json
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
import kubernetes_validate
import referencing
from kubernetes_validate import utils as kv

DTR_PREFIX = "/apis/resource.k8s.io/"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/"
EVENTS = "/apis/events.k8s.io/v1/namespaces/"
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@functools.lru_cache(maxsize=64)
def _validator(kubernetes: str, kind: str, api_version: str) -> tuple[Any, str]:
    """``kubernetes_validate.validate``'s strict validator for one kind, built once: loading the schema files
    on every call made 1,600 rules take minutes."""
    version = [v for v in kv.all_versions() if kv.major_minor(v) <= kv.major_minor(kubernetes)][-1]
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    schema = kv.schema_contents(f"{folder}/{kind.lower()}-{group}.json", kubernetes)
    definitions = kv.schema_contents(f"{folder}/_definitions.json", kubernetes)
    registry = referencing.Resource.from_contents(definitions) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry()
    )
    return jsonschema.validators.Draft202012Validator(schema, registry=registry), kv.major_minor(version)


def schema_problem(obj: dict, kubernetes: str) -> str | None:
    """The first line of ``kubernetes_validate.validate(obj, kubernetes, strict=True)``'s error, or None."""
    validator, version = _validator(kubernetes, str(obj.get("kind")), str(obj.get("apiVersion")))
    try:
        validator.validate(obj)
    except jsonschema.ValidationError as exc:
        return str(kubernetes_validate.ValidationError(exc, version)).splitlines()[0]
    return None


def event_problems(obj: dict) -> list[str]:
    """``ValidateEventCreate`` for events.k8s.io/v1 (k8s.io/kubernetes pkg/apis/core/validation/events.go),
    in the API server's field-error wording."""
    out = []
    meta, regarding = obj.get("metadata") or {}, obj.get("regarding") or {}
    namespace = meta.get("namespace") or ""
    if not regarding.get("namespace") and namespace not in ("default", "kube-system"):
        out.append('involvedObject.namespace: Invalid value: "": does not match event.namespace')
    controller = obj.get("reportingController") or ""
    if not controller:
        out.append("reportingController: Required value")
    else:
        prefix, _, name = controller.rpartition("/")
        if (prefix and not _DNS_SUBDOMAIN.match(prefix)) or len(name) > 63 or not _QUALIFIED_NAME.match(name):
            out.append(
                f'reportingController: Invalid value: "{controller}": name part must consist of alphanumeric '
                "characters, '-', '_' or '.', and must start and end with an alphanumeric character"
            )
    for field_, limit, required in (
        ("reportingInstance", 128, True),
        ("action", 128, True),
        ("reason", 128, True),
        ("note", 1024, False),
    ):
        value = obj.get(field_) or ""
        path = "message" if field_ == "note" else field_  # the internal type's name for it
        if required and not value:
            out.append(f"{path}: Required value")
        if len(value) > limit:
            out.append(f'{path}: Invalid value: "": can have at most {limit} characters')
    if not _DNS_SUBDOMAIN.match(namespace):
        out.append(f'namespace: Invalid value: "{namespace}": a lowercase RFC 1123 subdomain')
    name = meta.get("name") or ""
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        out.append(
            f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower '
            "case alphanumeric characters, '-' or '.'"
        )
    series = obj.get("series")
    if series is not None:
        if int(series.get("count") or 0) < 2:
            out.append('series.count: Invalid value: "": should be at least 2')
        if not series.get("lastObservedTime"):
            out.append("series.lastObservedTime: Required value")
    if not obj.get("eventTime"):
        out.append("eventTime: Required value")
    if obj.get("type") not in ("Normal", "Warning"):
        out.append(f'type: Invalid value: "": has invalid value: {obj.get("type")}')
    for legacy in ("deprecatedFirstTimestamp", "deprecatedLastTimestamp", "deprecatedCount", "deprecatedSource"):
        if obj.get(legacy):
            out.append(f'{legacy}: Invalid value: "": needs to be unset')
    return out


def invalid(kind: str, name: str, problems: list[str]) -> str:
    """The API server's 422 message: one field error bare, several in brackets."""
    what = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
    return f'{kind} "{name}" is invalid: {what}'


@dataclass(frozen=True)
class Write:
    verb: str  # POST, PUT, DELETE
    kind: str  # devicetaintrules, leases
    name: str
    user_agent: str
    at: float  # time.monotonic()
    status: int
    body: dict[str, Any] | None = None


def status(code: int, reason: str, message: str, name: str = "", kind: str = "") -> dict[str, Any]:
    """A metav1.Status as the apiserver sends it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name:
        body["details"] = {"name": name, "kind": kind}
    return body


class FakeApiServer:
    """Serves ``served``'s devicetaintrules and coordination.k8s.io/v1 leases on 127.0.0.1."""

    def __init__(
        self,
        served: str = "v1",
        group_versions: tuple[str, ...] = ("v1", "v1beta2", "v1beta1"),
        taint_versions: tuple[str, ...] | None = None,
        kubernetes: str = "1.37",
    ) -> None:
        taint_versions = (served,) if taint_versions is None else taint_versions
        major, minor = kubernetes.split(".")
        self.kubernetes = kubernetes
        self.served = served
        self.discovery: dict[str, dict] = {
            "/version": {"major": major, "minor": minor, "gitVersion": f"v{kubernetes}.0", "platform": "linux/amd64"},
            "/apis/resource.k8s.io": {
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": "resource.k8s.io",
                "versions": [{"groupVersion": f"resource.k8s.io/{x}", "version": x} for x in group_versions],
                "preferredVersion": {
                    "groupVersion": f"resource.k8s.io/{group_versions[0]}",
                    "version": group_versions[0],
                },
            },
        }
        for x in group_versions:
            names = ["deviceclasses", "resourceclaims", "resourceslices"]
            names += ["devicetaintrules"] * (x in taint_versions)
            self.discovery[f"/apis/resource.k8s.io/{x}"] = {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"resource.k8s.io/{x}",
                "resources": [
                    {
                        "name": n,
                        "singularName": n[:-1],
                        "namespaced": n == "resourceclaims",
                        "kind": n,
                        "verbs": ["get"],
                    }
                    for n in names
                ],
            }
        self.objects: dict[str, dict] = {}  # devicetaintrules by name
        self.leases: dict[tuple[str, str], dict] = {}  # (namespace, name)
        self.events: dict[tuple[str, str], dict] = {}  # (namespace, name)
        self.namespaces: set[str] | None = None  # None: every namespace exists
        self.partitioned: set[str] = set()  # User-Agent substrings answered 503, as an unreachable server
        #: Seconds each DeviceTaintRule write waits before it is served (an overloaded server, etc.), and how many
        #: are waiting now.
        self.rule_write_delay_s = 0.0
        self.rule_writes_waiting = 0
        #: The device-taint eviction controller's world (Kubernetes 1.35+): the devices published in ResourceSlices
        #: (None: every device a rule names) and, by (driver, pool, device), the pods (namespace, name) whose
        #: allocated claims use it; the pods it evicted, per rule uid, since it started.
        self.published: set[tuple[str, str, str]] | None = None
        self.pods: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
        self.evicted: dict[str, int] = {}
        self.user = "system:serviceaccount:otel-dra:otel-dra-fleet"
        self.lease_verbs = {"get", "create", "update"}  # what RBAC grants self.user on leases
        self.requests: list[str] = []
        self.writes: list[Write] = []
        self.version = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what the tests read -------------------------------------------------------------------
    def rule_writes(self) -> list[Write]:
        with self.lock:
            return [w for w in self.writes if w.kind == "devicetaintrules"]

    def lease(self, name: str = "otel-dra-fleet", namespace: str = "otel-dra") -> dict | None:
        with self.lock:
            return json.loads(json.dumps(self.leases.get((namespace, name))))

    # -- the device-taint eviction controller (kube-controller-manager) ------------------------------
    # As pkg/controller/devicetainteviction/device_taint_eviction.go, maybeUpdateRuleStatus (Kubernetes 1.35+,
    # gate DRADeviceTaintRules) writes it: one condition, type EvictionInProgress, observedGeneration the rule's,
    # its reason and message by effect, in the controller's own words. The real one updates it asynchronously
    # (at most every 10 s while evicting); here it is written with the request that changed the rule, and
    # evict() does what its eviction workers do.
    def _selected(self, obj: dict) -> list[tuple[str, str, str]]:
        sel = obj["spec"].get("deviceSelector") or {}
        known = set(self.pods) | (self.published or set())
        if self.published is None:
            known.add((sel.get("driver", ""), sel.get("pool", ""), sel.get("device", "")))
        names = ("driver", "pool", "device")
        return sorted(d for d in known if all(sel.get(k) in (None, v) for k, v in zip(names, d, strict=True)))

    def _condition(self, obj: dict) -> None:
        if tuple(int(x) for x in self.kubernetes.split(".")) < (1, 35):
            return  # no status before 1.35
        effect = obj["spec"]["taint"]["effect"]
        selected = self._selected(obj)
        pods = [p for d in selected for p in self.pods.get(d, [])]
        namespaces = len({ns for ns, _ in pods})

        def many(n: int, one: str, more: str) -> str:
            return one if n == 1 else more % n

        status, message = "False", ""
        if effect == "NoExecute":
            if pods:
                status, reason = "True", "PodsPendingEviction"
                message = many(len(pods), "1 pod needs to be evicted in ", "%d pods need to be evicted in ")
                message += many(namespaces, "1 namespace.", "%d different namespaces.")
            else:
                reason = "Completed" if self.evicted.get(obj["metadata"]["uid"]) else "NotStarted"
        elif effect == "None":
            reason = "NoEffect"
            published = len(selected) if self.published is None else len(self.published & set(selected))
            allocated = sum(1 for d in selected if self.pods.get(d))
            message = (
                many(published, "1 published device selected. ", "%d published devices selected. ")
                + many(allocated, "1 allocated device selected. ", "%d allocated devices selected. ")
                + many(len(pods), "1 pod would be evicted in ", "%d pods would be evicted in ")
                + many(namespaces, "1 namespace ", "%d different namespaces ")
                + "if the effect was NoExecute. This information will not be updated again. Recreate the "
                "DeviceTaintRule to trigger an update."
            )
        else:
            reason, message = "OtherEffect", "Eviction only happens for the NoExecute effect."
        evicted = self.evicted.get(obj["metadata"]["uid"], 0)
        if evicted:
            message += (" " if message else "") + many(evicted, "1 pod ", "%d pods ")
            message += "evicted since starting the controller."
        condition = {
            "type": "EvictionInProgress",
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": obj["metadata"]["generation"],
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        obj["status"] = {"conditions": [condition]}

    def evict(self) -> int:
        """The controller's eviction workers: every pod on a device of a NoExecute rule is evicted (deleted);
        each rule's condition then says so. Returns how many were."""
        with self.lock:
            done = 0
            for obj in self.objects.values():
                if obj["spec"]["taint"]["effect"] != "NoExecute":
                    continue
                for device in self._selected(obj):
                    gone = self.pods.pop(device, [])
                    uid = obj["metadata"]["uid"]
                    self.evicted[uid] = self.evicted.get(uid, 0) + len(gone)
                    done += len(gone)
            for obj in self.objects.values():
                self._condition(obj)
            return done

    def _next_version(self) -> str:
        self.version += 1
        return str(self.version)

    # -- the endpoints ---------------------------------------------------------------------------
    def _rule_problem(self, obj: dict) -> str | None:
        return schema_problem(obj, self.kubernetes)

    def _lease_problem(self, obj: dict) -> str | None:
        spec = obj.get("spec") or {}
        # The apiserver takes a body without apiVersion/kind (the URL says what it is), not a wrong one.
        obj.setdefault("apiVersion", "coordination.k8s.io/v1")
        obj.setdefault("kind", "Lease")
        if obj.get("apiVersion") != "coordination.k8s.io/v1" or obj.get("kind") != "Lease":
            return f"wrong apiVersion/kind: {obj.get('apiVersion')}/{obj.get('kind')}"
        seconds = spec.get("leaseDurationSeconds")
        if seconds is not None and (not isinstance(seconds, int) or seconds <= 0):
            return "spec.leaseDurationSeconds: Invalid value: must be greater than 0"
        return schema_problem(obj, self.kubernetes)

    def _event_schema_problem(self, obj: dict) -> str | None:
        return schema_problem(obj, self.kubernetes)

    def event_list(self, namespace: str | None = None) -> list[dict]:
        """The Events stored, oldest first (``namespace`` None: every namespace)."""
        with self.lock:
            items = [o for (ns, _), o in self.events.items() if namespace is None or ns == namespace]
            return json.loads(json.dumps(items))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # A reply is two writes (headers, body): with Nagle's algorithm the second waits for the
                # client's delayed ACK, 40 ms a request on a keep-alive connection. The API server sends at once.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def body(self) -> dict:
                return json.loads(self.raw or b"{}")

            def record(self, verb: str, kind: str, name: str, code: int, body: dict | None = None) -> None:
                ua = self.headers.get("User-Agent", "")
                store.writes.append(Write(verb, kind, name, ua, time.monotonic(), code, body))

            # -- routing ------------------------------------------------------------------------
            def route(self, verb: str) -> None:
                url = urlsplit(self.path)
                path = url.path.rstrip("/")
                # Read the whole body first: a reply sent before it is read would leave its bytes to
                # be parsed as the next request on this keep-alive connection.
                self.raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if store.rule_write_delay_s and verb != "GET" and "/devicetaintrules" in path:
                    with store.lock:
                        store.rule_writes_waiting += 1
                    time.sleep(store.rule_write_delay_s)
                    with store.lock:
                        store.rule_writes_waiting -= 1
                with store.lock:
                    ua = self.headers.get("User-Agent", "")
                    if any(cut in ua for cut in store.partitioned):
                        message = "the server is currently unable to handle the request"
                        return self.reply(503, status(503, "ServiceUnavailable", message))
                    if verb == "GET" and path in store.discovery:
                        store.requests.append(f"GET {path}")
                        return self.reply(200, store.discovery[path])
                    if path.startswith(LEASES):
                        return self.leases(verb, path[len(LEASES) :].split("/"))
                    if path.startswith(EVENTS):
                        return self.event(verb, path[len(EVENTS) :].split("/"), url.query)
                    if path.startswith(f"{DTR_PREFIX}{store.served}/devicetaintrules"):
                        rest = path[len(f"{DTR_PREFIX}{store.served}/devicetaintrules") :].strip("/")
                        return self.rules(verb, rest, url.query)
                    store.requests.append(f"{verb} {url.path}")
                    return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))

            def do_GET(self) -> None:
                self.route("GET")

            def do_POST(self) -> None:
                self.route("POST")

            def do_PUT(self) -> None:
                self.route("PUT")

            def do_DELETE(self) -> None:
                self.route("DELETE")

            def do_PATCH(self) -> None:
                self.route("PATCH")

            # -- resource.k8s.io devicetaintrules (cluster-scoped) ---------------------------------
            def rules(self, verb: str, name: str, query: str) -> None:
                served = store.served
                kind = "devicetaintrules"
                if verb == "GET" and not name:
                    store.requests.append(f"GET {DTR_PREFIX}{served}/{kind}")
                    selector = parse_qs(query).get("labelSelector", [""])[0]
                    key, _, want = selector.partition("=")
                    items = [
                        o
                        for o in store.objects.values()
                        if not key or (o["metadata"].get("labels") or {}).get(key) == want
                    ]
                    return self.reply(
                        200,
                        {
                            "apiVersion": f"resource.k8s.io/{served}",
                            "kind": "DeviceTaintRuleList",
                            "metadata": {"resourceVersion": str(store.version)},
                            "items": items,
                        },
                    )
                if verb == "POST":
                    obj = self.body()
                    name = obj["metadata"]["name"]
                    store.requests.append(f"POST {name}")
                    if name in store.objects:
                        message = f'{kind}.resource.k8s.io "{name}" already exists'
                        self.record("POST", kind, name, 409)
                        return self.reply(409, status(409, "AlreadyExists", message, name, kind))
                    problem = store._rule_problem(obj)
                    if problem:
                        self.record("POST", kind, name, 422)
                        message = f'DeviceTaintRule.resource.k8s.io "{name}" is invalid: {problem}'
                        return self.reply(422, status(422, "Invalid", message, name, kind))
                    # The strategy's PrepareForCreate: no status from the client, generation 1.
                    obj.pop("status", None)
                    obj["metadata"].update(resourceVersion=store._next_version(), uid=f"uid-{name}", generation=1)
                    obj["spec"]["taint"]["timeAdded"] = "2030-01-01T00:00:00Z"
                    store._condition(obj)
                    store.objects[name] = obj
                    self.record("POST", kind, name, 201, obj)
                    return self.reply(201, obj)
                name = name.split("?")[0]
                if name not in store.objects:
                    store.requests.append(f"{verb} {name}")
                    message = f'{kind}.resource.k8s.io "{name}" not found'
                    if verb != "GET":
                        self.record(verb, kind, name, 404)
                    return self.reply(404, status(404, "NotFound", message, name, kind))
                if verb == "GET":
                    store.requests.append(f"GET {name}")
                    return self.reply(200, store.objects[name])
                if verb == "PUT":
                    obj = self.body()
                    store.requests.append(f"PUT {name}")
                    if obj["metadata"].get("resourceVersion") != store.objects[name]["metadata"]["resourceVersion"]:
                        self.record("PUT", kind, name, 409)
                        return self.reply(
                            409, status(409, "Conflict", conflict(kind, "resource.k8s.io", name), name, kind)
                        )
                    problem = store._rule_problem(obj)
                    if problem:
                        self.record("PUT", kind, name, 422)
                        message = f'DeviceTaintRule.resource.k8s.io "{name}" is invalid: {problem}'
                        return self.reply(422, status(422, "Invalid", message, name, kind))
                    # PrepareForUpdate: the status stays as it was; the generation moves with the spec.
                    old = store.objects[name]
                    obj.pop("status", None)
                    if "status" in old:
                        obj["status"] = old["status"]
                    obj["metadata"]["resourceVersion"] = store._next_version()
                    obj["metadata"]["uid"] = old["metadata"]["uid"]
                    generation = old["metadata"].get("generation", 1)

                    def spec(o: dict) -> dict:
                        return {**o["spec"], "taint": {k: v for k, v in o["spec"]["taint"].items() if k != "timeAdded"}}

                    changed = spec(obj) != spec(old)
                    obj["metadata"]["generation"] = generation + changed
                    if changed:
                        store._condition(obj)
                    store.objects[name] = obj
                    self.record("PUT", kind, name, 200, obj)
                    return self.reply(200, obj)
                store.requests.append(f"DELETE {name}")
                gone = store.objects.pop(name)
                self.record("DELETE", kind, name, 200)
                return self.reply(200, gone)

            # -- coordination.k8s.io/v1 leases (namespaced) -------------------------------------
            def leases(self, verb: str, parts: list[str]) -> None:
                kind = "leases"
                if len(parts) < 2 or parts[1] != kind:
                    return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
                namespace, name = parts[0], (parts[2] if len(parts) > 2 else "")
                store.requests.append(f"{verb} lease {namespace}/{name}")
                rbac_verb = {"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete"}[verb]
                if rbac_verb not in store.lease_verbs:  # the authorizer's own wording
                    message = (
                        f'{kind}.coordination.k8s.io "{name}" is forbidden: User "{store.user}" cannot '
                        f'{rbac_verb} resource "{kind}" in API group "coordination.k8s.io" in the namespace '
                        f'"{namespace}"'
                    )
                    return self.reply(403, status(403, "Forbidden", message, name, kind))
                if verb == "POST":
                    obj = self.body()
                    if store.namespaces is not None and namespace not in store.namespaces:
                        message = f'namespaces "{namespace}" not found'
                        return self.reply(404, status(404, "NotFound", message, namespace, "namespaces"))
                    name = obj["metadata"]["name"]
                    if (namespace, name) in store.leases:
                        self.record("POST", kind, name, 409)
                        message = f'{kind}.coordination.k8s.io "{name}" already exists'
                        return self.reply(409, status(409, "AlreadyExists", message, name, kind))
                    problem = store._lease_problem(obj)
                    if problem:
                        return self.reply(422, status(422, "Invalid", f'Lease "{name}" is invalid: {problem}'))
                    obj["metadata"].update(
                        resourceVersion=store._next_version(), namespace=namespace, uid=f"uid-{name}"
                    )
                    store.leases[(namespace, name)] = obj
                    self.record("POST", kind, name, 201, obj)
                    return self.reply(201, obj)
                have = store.leases.get((namespace, name))
                if have is None:
                    message = f'{kind}.coordination.k8s.io "{name}" not found'
                    return self.reply(404, status(404, "NotFound", message, name, kind))
                if verb == "GET":
                    return self.reply(200, have)
                if verb == "PUT":
                    obj = self.body()
                    if obj["metadata"].get("resourceVersion") != have["metadata"]["resourceVersion"]:
                        self.record("PUT", kind, name, 409)
                        message = conflict(kind, "coordination.k8s.io", name)
                        return self.reply(409, status(409, "Conflict", message, name, kind))
                    problem = store._lease_problem(obj)
                    if problem:
                        return self.reply(422, status(422, "Invalid", f'Lease "{name}" is invalid: {problem}'))
                    obj["metadata"]["resourceVersion"] = store._next_version()
                    store.leases[(namespace, name)] = obj
                    self.record("PUT", kind, name, 200, obj)
                    return self.reply(200, obj)
                return self.reply(405, status(405, "MethodNotAllowed", "the server does not allow this method"))

            # -- events.k8s.io/v1 events (namespaced) ---------------------------------------------
            def event(self, verb: str, parts: list[str], query: str = "") -> None:
                kind = "events"
                if len(parts) < 2 or parts[1] != kind:
                    return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
                namespace, name = parts[0], (parts[2] if len(parts) > 2 else "")
                store.requests.append(f"{verb} event {namespace}/{name}")
                if verb == "GET" and not name:
                    items = [o for (ns, _), o in store.events.items() if ns == namespace]
                    # Field selectors as events.k8s.io/v1's field label conversion takes them (pkg/apis/events/v1/
                    # conversion.go: regarding.* onto involvedObject.*, reason, type, reportingController ...).
                    selector = parse_qs(query).get("fieldSelector", [""])[0]
                    for term in filter(None, selector.split(",")):
                        label, _, want = term.partition("=")
                        path_of = {"regarding.kind": ("regarding", "kind"), "regarding.name": ("regarding", "name"),
                                   "reason": ("reason",), "type": ("type",),
                                   "reportingController": ("reportingController",)}.get(label)  # fmt: skip
                        if path_of is None:
                            return self.reply(400, status(400, "BadRequest", f"field label not supported: {label}"))

                        def value(o: dict, path_of: tuple[str, ...] = path_of) -> object:
                            for k in path_of:
                                o = o.get(k) or {} if isinstance(o, dict) else {}
                            return o

                        items = [o for o in items if value(o) == want]
                    body = {"apiVersion": "events.k8s.io/v1", "kind": "EventList", "metadata": {}, "items": items}
                    return self.reply(200, body)
                if verb == "POST":
                    obj = self.body()
                    obj.setdefault("apiVersion", "events.k8s.io/v1")
                    obj.setdefault("kind", "Event")
                    name = (obj.get("metadata") or {}).get("name") or ""
                    if (obj.get("metadata") or {}).get("namespace", namespace) != namespace:
                        message = (
                            "the namespace of the provided object does not match the namespace sent on the request"
                        )
                        return self.reply(400, status(400, "BadRequest", message))
                    obj["metadata"]["namespace"] = namespace
                    if (namespace, name) in store.events:
                        self.record("POST", kind, name, 409)
                        message = f'{kind}.events.k8s.io "{name}" already exists'
                        return self.reply(409, status(409, "AlreadyExists", message, name, kind))
                    for stamp in (obj.get("eventTime"), (obj.get("series") or {}).get("lastObservedTime")):
                        if stamp is not None and not _MICRO_TIME.match(str(stamp)):
                            message = (  # metav1.MicroTime's UnmarshalJSON: time.Parse(RFC3339Micro, ...)
                                f'Event in version "v1" cannot be handled as a Event: parsing time "{stamp}" as '
                                '"2006-01-02T15:04:05.000000Z07:00": cannot parse'
                            )
                            return self.reply(400, status(400, "BadRequest", message))
                    schema = store._event_schema_problem(obj)
                    problems = ([schema] if schema else []) + event_problems(obj)
                    if problems:
                        self.record("POST", kind, name, 422, obj)
                        return self.reply(422, status(422, "Invalid", invalid("Event.events.k8s.io", name, problems)))
                    obj["metadata"].update(resourceVersion=store._next_version(), uid=f"uid-{name}")
                    store.events[(namespace, name)] = obj
                    self.record("POST", kind, name, 201, obj)
                    return self.reply(201, obj)
                have = store.events.get((namespace, name))
                if have is None:
                    if verb != "GET":
                        self.record(verb, kind, name, 404)
                    message = f'{kind}.events.k8s.io "{name}" not found'
                    return self.reply(404, status(404, "NotFound", message, name, kind))
                if verb == "GET":
                    return self.reply(200, have)
                if verb == "PATCH":
                    content_type = self.headers.get("Content-Type", "")
                    if content_type != "application/strategic-merge-patch+json":
                        message = (
                            "the body of the request was in an unknown format - accepted media types include: "
                            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, "
                            "application/strategic-merge-patch+json"
                        )
                        return self.reply(415, status(415, "UnsupportedMediaType", message))
                    patch = self.body()
                    merged = json.loads(json.dumps(have))
                    for key, value in patch.items():
                        if isinstance(value, dict) and isinstance(merged.get(key), dict):
                            merged[key].update(value)
                        else:
                            merged[key] = value
                    immutable = [k for k in merged if k not in ("series", "metadata") and merged.get(k) != have.get(k)]
                    problems = [f"{k}: Invalid value: field is immutable" for k in immutable]
                    schema = store._event_schema_problem(merged)
                    problems += ([schema] if schema else []) + event_problems(merged)
                    if problems:
                        self.record("PATCH", kind, name, 422, patch)
                        return self.reply(422, status(422, "Invalid", invalid("Event.events.k8s.io", name, problems)))
                    merged["metadata"]["resourceVersion"] = store._next_version()
                    store.events[(namespace, name)] = merged
                    self.record("PATCH", kind, name, 200, patch)
                    return self.reply(200, merged)
                return self.reply(405, status(405, "MethodNotAllowed", "the server does not allow this method"))

        return Handler


def conflict(resource: str, group: str, name: str) -> str:
    """The apiserver's optimistic-concurrency message (k8s.io/apiserver registry/generic)."""
    return (
        f'Operation cannot be fulfilled on {resource}.{group} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )


def write_kubeconfig(api: FakeApiServer, directory: Path) -> Path:
    """A kubeconfig in ``directory`` pointing at ``api`` (token auth), for ``KUBECONFIG``."""
    path = directory / "kubeconfig"
    path.write_text(kubeconfig(api.url))
    return path


def kubeconfig(server: str) -> str:
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
