"""A Kubernetes API server's discovery, DeviceTaintRule and Lease endpoints, in memory, over real HTTP.

No kube-apiserver runs here, so this stand-in keeps the rules of the real one that otel-dra meets:

- discovery as the server serves it: ``/version``, the ``resource.k8s.io`` APIGroup and each
  version's APIResourceList;
- optimistic concurrency: an update must carry the object's current ``resourceVersion``, else
  409 Conflict with the apiserver's own message ("Operation cannot be fulfilled on ..."), and a
  create of an existing name is 409 AlreadyExists; a missing object is 404 NotFound;
- every DeviceTaintRule written is validated against the official OpenAPI schema of the
  server's Kubernetes version (``kubernetes-validate``), and refused with 422 Invalid if it fails;
- Lease bodies are checked for the fields leader election depends on.

It records every request (``requests``, for the assertions the older tests make) and every write
with the client's User-Agent and the time (``writes``), so a test can tell which replica wrote.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate

DTR_PREFIX = "/apis/resource.k8s.io/"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/"


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
        self.namespaces: set[str] | None = None  # None: every namespace exists
        self.partitioned: set[str] = set()  # User-Agent substrings answered 503, as an unreachable server
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

    def _next_version(self) -> str:
        self.version += 1
        return str(self.version)

    # -- the endpoints ---------------------------------------------------------------------------
    def _rule_problem(self, obj: dict) -> str | None:
        try:
            kubernetes_validate.validate(obj, self.kubernetes, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return str(exc).splitlines()[0]
        return None

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
        try:
            kubernetes_validate.validate(obj, self.kubernetes, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return str(exc).splitlines()[0]
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

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
                    obj["metadata"].update(resourceVersion=store._next_version(), uid=f"uid-{name}")
                    obj["spec"]["taint"]["timeAdded"] = "2030-01-01T00:00:00Z"
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
                    obj["metadata"]["resourceVersion"] = store._next_version()
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
