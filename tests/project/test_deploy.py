"""deploy/: the Dockerfile, the build context (.dockerignore) and the Kubernetes manifests.

Docker cannot build here and there is no cluster, so the deployment is checked statically:
every plain manifest (the kustomize base, fleet/, taints/; the overlays are rendered and checked
in test_deploy_overlays.py with the helpers here) validates against the official OpenAPI schema
of each Kubernetes release the project supports (``kubernetes-validate``, strict: no unknown
field) and is deserialized into the `kubernetes` client's typed models and serialized back (the
client silently drops keys it doesn't know, so any difference is a typo or a misplaced field),
then the facts the deployment relies on are asserted: the flags it passes exist in `otel-dra run
--help` / `otel-dra fleet --help`, the host paths match the flags, the RBAC is exactly what
applying DeviceTaintRules (and, for the fleet, its leader election) needs, the node agent's
ServiceAccount is bound to nothing unless taints/ is opted into, the policy validates with the
project's own loader. Three tests run the agent itself: with the demo overlay's DaemonSet command
line (host paths moved under a temporary directory), with the base's on a machine without
accelerators (it must refuse, not simulate), and the image's HEALTHCHECK command against it.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from functools import cache
from pathlib import Path

import kubernetes.client.models as k8s_models
import kubernetes_validate
import pytest
import yaml
from kubernetes.client import ApiClient

import otel_dra
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.sinks.config import EndpointConfig
from otel_dra.sinks.policy_sections import load_policy
from tests.conftest import free_port, http_get, wait_for

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MANIFEST_DIR = DEPLOY / "kubernetes"
BASE_DIR = MANIFEST_DIR / "base"  # the node agent's set, the kustomize base of overlays/
OVERLAYS_DIR = MANIFEST_DIR / "overlays"  # kustomize overlays: patches, checked once rendered
FLEET_DIR = MANIFEST_DIR / "fleet"  # the cluster-level writer, applied on its own
TAINTS_DIR = MANIFEST_DIR / "taints"  # opt-in RBAC for the agent's own (single-node) --k8s-apply
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

NAMESPACE = "otel-dra"
METRICS_PORT = 9464
KUBELET_PLUGINS = "/var/lib/kubelet/plugins"
KUBELET_REGISTRY = "/var/lib/kubelet/plugins_registry"
#: The agent's state directory on the host (--state-dir): otel-dra's own, outside the kubelet's.
STATE_HOST_PATH = "/var/lib/otel-dra"
HEALTH_SOCKET_DIR = KUBELET_PLUGINS + "/otel-dra"  # deploy/README.md, "Relaying health to the kubelet"
TAINT_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
MAX_SOCKET_PATH_BYTES = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
KUBERNETES = ("1.33", "1.34", "1.35", "1.36", "1.37")  # as tests/test_k8s_versions.py names them


# -- manifests -----------------------------------------------------------------------------
KUSTOMIZATION = "kustomization.yaml"
KUBECTL = shutil.which("kubectl")


def manifest_files() -> list[Path]:
    """The plain manifests: every object file but the overlays' patches (partial objects) and the
    kustomization files (kustomize's, not the API server's)."""
    return sorted(p for p in MANIFEST_DIR.rglob("*.yaml") if OVERLAYS_DIR not in p.parents and p.name != KUSTOMIZATION)


@cache
def manifests() -> tuple[tuple[Path, dict], ...]:
    found = []
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                found.append((path, doc))
    return tuple(found)


def in_fleet(path: Path) -> bool:
    return FLEET_DIR in path.parents


def node_manifests() -> list[tuple[Path, dict]]:
    """The node agent's set: deploy/kubernetes/*.yaml and the opt-in taints/."""
    return [(p, o) for p, o in manifests() if not in_fleet(p)]


def fleet_manifests() -> list[tuple[Path, dict]]:
    return [(p, o) for p, o in manifests() if in_fleet(p)]


def objects(kind: str, fleet: bool = False) -> list[dict]:
    """The node set's objects of this kind (``fleet=True``: the fleet's)."""
    return [obj for _, obj in (fleet_manifests() if fleet else node_manifests()) if obj["kind"] == kind]


def the(kind: str, fleet: bool = False) -> dict:
    found = objects(kind, fleet)
    where = "deploy/kubernetes/fleet" if fleet else "deploy/kubernetes (outside fleet/)"
    assert len(found) == 1, f"expected one {kind} in {where}, found {len(found)}"
    return found[0]


def model_name(obj: dict) -> str:
    """``apps/v1`` + ``DaemonSet`` -> ``V1DaemonSet``, the client's model class."""
    version = obj["apiVersion"].rsplit("/", 1)[-1]
    return version[0].upper() + version[1:] + obj["kind"]


def differences(given: object, back: object, path: str = "") -> list[str]:
    """Where the round trip through the typed model changed the manifest."""
    if isinstance(given, dict) and isinstance(back, dict):
        out = []
        for key in sorted(given.keys() | back.keys()):
            if key not in back:
                out.append(f"{path}.{key}: not a field of the model (dropped)")
            elif key not in given:
                out.append(f"{path}.{key}: added by the model")
            else:
                out += differences(given[key], back[key], f"{path}.{key}")
        return out
    if isinstance(given, list) and isinstance(back, list) and len(given) == len(back):
        return [d for i, (a, b) in enumerate(zip(given, back, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if given != back or type(given) is not type(back):
        return [f"{path}: {given!r} became {back!r}"]
    return []


def validate_strictly(obj: dict, kubernetes: str, where: str) -> None:
    """The official schema of one release, strict: an unknown or misplaced field fails, as do wrong types."""
    try:
        assert kubernetes_validate.validate(obj, kubernetes, strict=True) == kubernetes
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{where}: {obj['kind']} is not valid on Kubernetes {kubernetes}: {exc.message}")


def assert_round_trips(obj: dict, where: str) -> None:
    """Through the client's typed model and back, unchanged: the client drops keys it does not know."""
    api = ApiClient()
    name = model_name(obj)
    assert hasattr(k8s_models, name), f"{where}: the kubernetes client has no model {name} for {obj['apiVersion']}"
    model = api._ApiClient__deserialize(obj, name)  # type: ignore[attr-defined]  # raises on a missing field or a wrong type
    back = api.sanitize_for_serialization(model)
    assert differences(obj, back) == [], f"{where}: fields the {name} model does not take as written"


@cache
def kustomize(directory: Path) -> tuple[dict, ...]:
    """What `kubectl apply -k DIRECTORY` would send: `kubectl kustomize DIRECTORY`, as objects."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: the kustomize base and overlays cannot be rendered here")
    result = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl kustomize {directory.relative_to(REPO)}: {result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc is not None)


def daemonset() -> dict:
    return the("DaemonSet")


# The DaemonSet helpers below read the base's DaemonSet, or the one given (a rendered overlay's).
def pod_spec(ds: dict | None = None) -> dict:
    return (ds or daemonset())["spec"]["template"]["spec"]


def container(ds: dict | None = None) -> dict:
    containers = pod_spec(ds)["containers"]
    assert len(containers) == 1, "the agent's pod has one container"
    return containers[0]


def env_values(ds: dict | None = None) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(ds).get("env", []) if "value" in e}


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in args and env values."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def flag_values(args: list[str]) -> dict[str, str | None]:
    """``--flag=value`` / ``--flag value`` / ``--switch`` as {flag: value}."""
    values: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        flag, eq, value = arg.partition("=")
        if eq:
            values[flag] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            values[flag] = args[i + 1]
        else:
            values[flag] = None
    return values


def agent_flags(ds: dict | None = None) -> dict[str, str]:
    """The DaemonSet's flags with ``$(VAR)`` expanded from the container's env."""
    env = env_values(ds)
    return {k: expand(v, env) if v is not None else v for k, v in flag_values(container(ds)["args"]).items()}


def mounts_by_volume(ds: dict | None = None) -> dict[str, dict]:
    return {m["name"]: m for m in container(ds).get("volumeMounts", [])}


def volumes(ds: dict | None = None) -> dict[str, dict]:
    return {v["name"]: v for v in pod_spec(ds).get("volumes", [])}


def quantity(text: str) -> float:
    """A Kubernetes resource quantity (the suffixes these manifests may use) as a number."""
    units = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", str(text))
    assert match and match[2] in units, f"unexpected quantity {text!r}"
    return float(match[1]) * units[match[2]]


@cache
def run_help() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "run", "--help"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_manifest_parses_and_names_an_api_object():
    assert manifest_files(), "no manifests under deploy/kubernetes"
    for path, obj in manifests():
        where = path.relative_to(REPO)
        assert isinstance(obj, dict), f"{where}: a document is not a mapping"
        for key in ("apiVersion", "kind", "metadata"):
            assert key in obj, f"{where}: no {key}"
        assert obj["metadata"].get("name"), f"{where}: {obj['kind']} has no name"


@pytest.mark.parametrize(
    "path,obj",
    [pytest.param(p, o, id=f"{p.name}:{o.get('kind')}/{o.get('metadata', {}).get('name')}") for p, o in manifests()],
)
def test_manifest_round_trips_through_the_client_models(path, obj):
    assert_round_trips(obj, str(path.relative_to(REPO)))


@pytest.mark.parametrize("kubernetes", KUBERNETES)
@pytest.mark.parametrize(
    "path,obj",
    [pytest.param(p, o, id=f"{p.name}:{o.get('kind')}/{o.get('metadata', {}).get('name')}") for p, o in manifests()],
)
def test_manifest_validates_against_the_kubernetes_openapi_schema(path, obj, kubernetes):
    """The official schema of each release, strict: an unknown or misplaced field fails, as do wrong types."""
    validate_strictly(obj, kubernetes, str(path.relative_to(REPO)))


@pytest.mark.parametrize(
    "kind,fleet,where,key,value",
    [
        ("DaemonSet", False, ("spec", "template", "spec", "containers", 0), "serviceAccountName", "otel-dra"),
        ("StatefulSet", True, ("spec",), "replicas", "2"),
        ("StatefulSet", True, ("spec", "template", "spec", "containers", 0, "securityContext"), "runAsNonroot", True),
        ("Role", True, ("rules", 0), "resourceName", ["otel-dra-fleet"]),
    ],
)
def test_the_schema_check_catches_a_misplaced_field_or_a_wrong_type(kind, fleet, where, key, value):
    obj = json.loads(json.dumps(the(kind, fleet)))
    target = obj
    for step in where:
        target = target[step]
    target[key] = value
    for kubernetes in KUBERNETES:
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(obj, kubernetes, strict=True)


def test_namespaced_objects_live_in_the_declared_namespace():
    assert {n["metadata"]["name"] for n in objects("Namespace")} == {NAMESPACE}
    for path, obj in manifests():
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], f"{path.name}: {obj['kind']} is cluster-scoped"
        else:
            assert obj["metadata"].get("namespace") == NAMESPACE, f"{path.name}: {obj['kind']} outside {NAMESPACE}"


# -- the kustomize base ---------------------------------------------------------------------
def base_resources() -> list[Path]:
    """What the base's kustomization.yaml applies, resolved."""
    kustomization = yaml.safe_load((BASE_DIR / KUSTOMIZATION).read_text())
    return [(BASE_DIR / name).resolve() for name in kustomization["resources"]]


def test_the_base_kustomization_applies_every_base_file_and_nothing_else():
    """`kubectl apply -k deploy/kubernetes/base` is the node agent's set: each of its files once, in
    order (the namespace first), and neither fleet/ nor taints/, which are applied on their own."""
    kustomization = yaml.safe_load((BASE_DIR / KUSTOMIZATION).read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    files = sorted(p.resolve() for p in BASE_DIR.glob("*.yaml") if p.name != KUSTOMIZATION)
    assert files, "no manifests in deploy/kubernetes/base"
    assert base_resources() == files, "list every base manifest once, in file-name order"
    assert set(kustomization) == {"apiVersion", "kind", "resources"}, (
        "the base renders its files as written: the plain-manifest tests read them as such"
    )


def test_the_base_reads_real_devices_and_never_simulates():
    """The default DaemonSet picks a real source (`auto` never falls back to simulated GPUs: it exits
    saying what it looked for); only overlays/demo simulates, and says so."""
    flags = agent_flags()
    assert flags["--source"] == "auto"
    assert not {"--devices", "--fault"} & set(flags), "simulator-only flags on a real source"
    assert not [a for a in container()["args"] if "simulated" in a]
    ds = daemonset()
    for labels in (ds["metadata"]["labels"], ds["spec"]["template"]["metadata"]["labels"]):
        assert labels["otel-dra.io/source"] == "auto"
    assert "otel-dra.io/source" not in ds["spec"]["selector"]["matchLabels"], "overlays change it: not selected on"
    # For NVML under auto, where the NVIDIA toolkit is the node's runtime: every GPU, utility only.
    assert env_values()["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env_values()["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


# -- the DaemonSet -------------------------------------------------------------------------
def test_daemonset_selects_its_own_pods():
    ds = daemonset()
    selector = ds["spec"]["selector"]["matchLabels"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_node_name_comes_from_the_downward_api():
    env = {e["name"]: e for e in container()["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    resource_attributes = dict(
        item.split("=", 1) for item in env["OTEL_RESOURCE_ATTRIBUTES"]["value"].split(",") if "=" in item
    )
    assert resource_attributes["k8s.node.name"] == "$(NODE_NAME)"
    # Kubernetes expands $(VAR) in an env value only from variables defined before it.
    defined: set[str] = set()
    for entry in container()["env"]:
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", entry.get("value", "")):
            assert ref in defined, f"env {entry['name']} uses $({ref}) before it is defined"
        defined.add(entry["name"])
    for arg in container()["args"]:
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
            assert ref in defined, f"arg {arg} uses $({ref}), which the container's env does not define"


def test_metrics_port_is_9464_named_metrics():
    ports = {p["name"]: p for p in container()["ports"]}
    assert ports["metrics"]["containerPort"] == METRICS_PORT == EndpointConfig.port
    assert ports["metrics"].get("protocol", "TCP") == "TCP"
    flags = agent_flags()
    assert flags.get("--prometheus-port", str(METRICS_PORT)) == str(METRICS_PORT)
    assert "OTEL_EXPORTER_PROMETHEUS_PORT" not in env_values(), "the port is set in one place: containerPort"


#: Kinds whose pods run otel-dra's containers.
WORKLOADS = ("DaemonSet", "StatefulSet", "Deployment")
#: Where a port reached from outside its pod may bind: every interface, or the pod's IP (the downward API).
REACHABLE_HOSTS = ("0.0.0.0", "::", "$(POD_IP)")


def serving_containers() -> list[tuple[str, dict]]:
    """Every container of every workload that declares a port, named by file and container."""
    found = []
    for path, obj in manifests():
        if obj["kind"] in WORKLOADS:
            for c in obj["spec"]["template"]["spec"]["containers"]:
                if c.get("ports"):
                    found.append((f"{path.relative_to(REPO)}: {c['name']}", c))
    return found


def test_every_container_serving_a_port_binds_where_it_is_reached():
    """otel-dra binds the loopback unless told otherwise (as the Collector's receivers do): every
    container whose ports Prometheus, the Collector or the kubelet's probes reach sets --host, to every
    interface or to the pod's IP from the downward API."""
    assert ReceiverConfig.host == EndpointConfig.host == "127.0.0.1"
    containers = serving_containers()
    assert len(containers) >= 2, "the agent's DaemonSet and the fleet's StatefulSet"
    for where, c in containers:
        flags = flag_values(c.get("args", []))
        host = flags.get("--host", flags.get("--prometheus-host"))
        assert host in REACHABLE_HOSTS, f"{where}: serves {len(c['ports'])} port(s) but binds {host or '127.0.0.1'}"
        if host == "$(POD_IP)":
            env = {e["name"]: e for e in c.get("env", [])}
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", where


def test_resources_are_requested_and_bounded():
    resources = container()["resources"]
    for key in ("cpu", "memory"):
        request, limit = quantity(resources["requests"][key]), quantity(resources["limits"][key])
        assert 0 < request <= limit, f"{key}: request {request} must be positive and within the limit {limit}"
    # The memory request covers the benchmarked peak RSS (BENCHMARKS.md) with room to spare.
    bench = (REPO / "BENCHMARKS.md").read_text() if (REPO / "BENCHMARKS.md").exists() else ""
    peak = re.search(r"Agent peak RSS \| ([0-9.]+) MB", bench)
    if peak:
        peak_bytes = float(peak[1]) * 1e6
        assert quantity(resources["requests"]["memory"]) >= 1.5 * peak_bytes
        assert quantity(resources["limits"]["memory"]) >= 3 * peak_bytes


def port_number(port: int | str) -> int:
    if isinstance(port, int):
        return port
    return {p["name"]: p["containerPort"] for p in container()["ports"]}[port]


def test_liveness_and_readiness_probe_healthz_on_the_metrics_port():
    for probe in ("livenessProbe", "readinessProbe"):
        get = container()[probe]["httpGet"]
        assert get["path"] == "/healthz", probe
        assert port_number(get["port"]) == METRICS_PORT, probe


def test_the_health_socket_is_in_a_host_directory_of_its_own_mounted_where_the_flag_points():
    mounts, vols = mounts_by_volume(), volumes()
    by_host_path = {v["hostPath"]["path"]: name for name, v in vols.items() if "hostPath" in v}
    kubelet_paths = {p for p in by_host_path if p.startswith("/var/lib/kubelet")}
    assert kubelet_paths == {HEALTH_SOCKET_DIR}, "only otel-dra's own socket directory, no other kubelet path"
    assert set(by_host_path) <= {HEALTH_SOCKET_DIR, STATE_HOST_PATH}, "no host path but otel-dra's own"
    name = by_host_path[HEALTH_SOCKET_DIR]
    assert vols[name]["hostPath"]["type"] == "DirectoryOrCreate"
    # The DRA driver's pod mounts the same hostPath and dials the same path: mount at the same path.
    assert mounts[name]["mountPath"] == HEALTH_SOCKET_DIR, f"{HEALTH_SOCKET_DIR} must be mounted at the same path"
    assert not mounts[name].get("readOnly"), f"the agent creates its socket in {HEALTH_SOCKET_DIR}"

    socket_path = agent_flags()["--kubelet-socket"]
    assert socket_path == HEALTH_SOCKET_DIR + "/health.sock", "the path deploy/README.md gives DRA drivers"
    assert not socket_path.endswith("/dra.sock"), "never a driver's plugin socket name"
    assert len(socket_path.encode()) <= MAX_SOCKET_PATH_BYTES
    assert f"`{socket_path}`" in (DEPLOY / "README.md").read_text()


def test_readme_says_how_a_dra_driver_relays_the_stream_and_why_otel_dra_does_not_register():
    readme = (DEPLOY / "README.md").read_text()
    (section,) = re.findall(r"^## Relaying health to the kubelet\n(.*?)(?=^## )", readme, re.M | re.S)
    for text in (
        f"`{agent_flags()['--kubelet-socket']}`",
        "NodeWatchResources",
        "NodeWatchResourcesResponse",
        "health_check_timeout_seconds",
        "`v1.DRAPlugin`",
        "none of services supported by the plugin [v1alpha1.DRAResourceHealth v1.DRAResourceHealth] are "
        "supported by the kubelet",
        "```go",
        "--register-with-kubelet",
    ):
        assert text in section, text


def test_the_default_daemonset_does_not_register_with_the_kubelet():
    """Kubelets 1.34+ refuse a DRA registration that lists no DRAPlugin service, and otel-dra serves only
    the health service: the stream reaches the kubelet through the DRA driver, which relays it."""
    flags = agent_flags()
    assert "--register-with-kubelet" not in flags
    assert "--plugin-registry" not in flags
    host_paths = {v["hostPath"]["path"] for v in volumes().values() if "hostPath" in v}
    assert KUBELET_REGISTRY not in host_paths, "nothing to mount the plugin registry for"
    assert not any(m["mountPath"].startswith(KUBELET_REGISTRY) for m in mounts_by_volume().values())


def test_every_path_the_agent_writes_is_a_volume():
    mounts = [m["mountPath"] for m in container()["volumeMounts"] if not m.get("readOnly")]
    flags = agent_flags()
    for flag in ("--kubelet-socket", "--k8s-output", "--state-dir"):
        if flag in flags:
            assert any(flags[flag].startswith(m.rstrip("/") + "/") or flags[flag] == m for m in mounts), (
                f"{flag} {flags[flag]} is not on a writable volume (the root filesystem is read-only)"
            )


def test_security_context_is_as_tight_as_the_kubelet_sockets_allow():
    spec, sc = pod_spec(), container()["securityContext"]
    for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(host_namespace), host_namespace
    seccomp = sc.get("seccompProfile") or spec.get("securityContext", {}).get("seccompProfile")
    assert seccomp == {"type": "RuntimeDefault"}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert not sc.get("privileged")
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert not sc["capabilities"].get("add")
    if sc.get("runAsUser", 0) == 0 or not sc.get("runAsNonRoot"):
        # uid 0 only for the kubelet's root-owned socket directories (and otel-dra's own state directory).
        host_paths = {v["hostPath"]["path"] for v in volumes().values() if "hostPath" in v}
        assert host_paths and all(p.startswith(KUBELET_PLUGINS + "/") or p == STATE_HOST_PATH for p in host_paths)
    assert pod_spec().get("automountServiceAccountToken") is False, "no API token unless taints are opted into"


def test_the_state_file_outlives_the_pod():
    """Held faults survive a restart only if the state directory does: a hostPath for the agent (an
    emptyDir goes with the pod), one claim per replica for the fleet (issue 16)."""
    flags = agent_flags()
    (name,) = [n for n, m in mounts_by_volume().items() if m["mountPath"] == flags["--state-dir"]]
    assert not mounts_by_volume()[name].get("readOnly")
    assert volumes()[name].get("hostPath") == {"path": STATE_HOST_PATH, "type": "DirectoryOrCreate"}
    state_dir = fleet_flags()["--state-dir"]
    mounts = {m["name"]: m for m in fleet_container()["volumeMounts"]}
    (name,) = [n for n, m in mounts.items() if m["mountPath"] == state_dir]
    assert not mounts[name].get("readOnly")
    assert name not in {v["name"] for v in fleet_pod_spec()["volumes"]}, "not an emptyDir: a claim of its own"
    (claim,) = [c for c in statefulset()["spec"]["volumeClaimTemplates"] if c["metadata"]["name"] == name]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert quantity(claim["spec"]["resources"]["requests"]["storage"]) >= 2**20
    # The image's non-root user writes it: the pod's fsGroup owns the volume.
    assert fleet_pod_spec()["securityContext"]["fsGroup"] == fleet_container()["securityContext"]["runAsGroup"]


def test_tolerates_gpu_taints_and_selects_linux_nodes():
    keys = {t.get("key") for t in pod_spec()["tolerations"]}
    assert "nvidia.com/gpu" in keys
    assert pod_spec()["nodeSelector"]["kubernetes.io/os"] == "linux"


def test_image_is_tagged_with_the_package_version():
    image = container()["image"]
    assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest")
    assert image.rsplit(":", 1)[1] == otel_dra.__version__, "bump the DaemonSet's image with the package version"


def test_policy_configmap_is_mounted_where_the_flag_points_and_validates(tmp_path):
    policy_path = agent_flags()["--policy"]
    mounts, vols = mounts_by_volume(), volumes()
    (name,) = [n for n, m in mounts.items() if policy_path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts[name].get("readOnly") is True
    configmap_name = vols[name]["configMap"]["name"]
    (configmap,) = [c for c in objects("ConfigMap") if c["metadata"]["name"] == configmap_name]
    key = policy_path.rsplit("/", 1)[1]
    assert key in configmap["data"], f"ConfigMap {configmap_name} has no key {key}"
    extracted = tmp_path / key
    extracted.write_text(configmap["data"][key])
    policy = load_policy(extracted)  # raises PolicyError naming the line and key
    assert policy.source == str(extracted)


def test_flags_used_by_the_manifests_exist_in_otel_dra_run_help():
    """Needs --kubelet-socket and --k8s-output (issue 4)."""
    args = container()["args"]
    assert args[0] == "run", "the image's ENTRYPOINT is otel-dra; args start with the subcommand"
    known = set(re.findall(r"--[a-z][a-z0-9-]*", run_help()))
    used = set(flag_values(args))
    missing = sorted(used - known)
    assert not missing, f"deploy/kubernetes uses flags that `otel-dra run --help` does not list: {', '.join(missing)}"


def test_environment_the_deployment_sets_is_read_by_the_agent():
    # NODE_NAME and OTEL_RESOURCE_ATTRIBUTES (DaemonSet), OTEL_EXPORTER_PROMETHEUS_PORT (HEALTHCHECK).
    for name in ("NODE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_PROMETHEUS_PORT"):
        assert name in run_help(), f"{name} is set by deploy/ but `otel-dra run --help` does not mention it"


# -- ServiceAccount and RBAC ----------------------------------------------------------------
def test_the_service_account_used_exists():
    accounts = {
        (a["metadata"]["namespace"], a["metadata"]["name"]) for _, a in manifests() if a["kind"] == "ServiceAccount"
    }
    ds = daemonset()
    assert (ds["metadata"]["namespace"], pod_spec()["serviceAccountName"]) in accounts
    bindings = [o for _, o in manifests() if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert bindings
    for binding in bindings:
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert (subject["namespace"], subject["name"]) in accounts


def test_rbac_grants_exactly_device_taint_rules_and_nothing_else():
    assert not objects("Role") and not objects("RoleBinding")
    role = the("ClusterRole")
    assert "aggregationRule" not in role
    (rule,) = role["rules"]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert rule["resources"] == ["devicetaintrules"]
    assert set(rule["verbs"]) == TAINT_VERBS and len(rule["verbs"]) == len(TAINT_VERBS)
    assert not rule.get("nonResourceURLs")
    assert "*" not in json.dumps(role), "no wildcards"
    binding = the("ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    (subject,) = binding["subjects"]
    assert (subject["namespace"], subject["name"]) == (NAMESPACE, pod_spec()["serviceAccountName"])


def test_rbac_is_opt_in_in_a_file_of_its_own():
    rbac_files = {p for p, o in node_manifests() if o["apiVersion"].startswith("rbac.authorization.k8s.io/")}
    assert len(rbac_files) == 1
    (rbac_file,) = rbac_files
    assert rbac_file.parent == TAINTS_DIR
    kinds = {o["kind"] for p, o in node_manifests() if p == rbac_file}
    assert kinds == {"ClusterRole", "ClusterRoleBinding"}
    # `kubectl apply -k deploy/kubernetes/base` (and so every overlay) must leave it out.
    assert BASE_DIR not in rbac_file.parents
    assert rbac_file not in base_resources()


# -- Service --------------------------------------------------------------------------------
def test_headless_service_for_scraping_with_prometheus_annotations():
    service = the("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= daemonset()["spec"]["template"]["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == METRICS_PORT and port_number(port["targetPort"]) == METRICS_PORT
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"


# -- the fleet: one cluster-level writer (deploy/kubernetes/fleet/) --------------------------
FLEET_ACCOUNT = "otel-dra-fleet"
LEASE = "otel-dra-fleet"
LEASE_VERBS = {("create", None), ("get", LEASE), ("update", LEASE)}
FLEET_KINDS = {
    "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
    "StatefulSet", "Service", "PodDisruptionBudget",
}  # fmt: skip
K8S_API_VERSIONS = {"auto", "v1", "v1beta2", "v1alpha3"}
OTLP_GRPC_PORT, OTLP_HTTP_PORT = 4317, 4318


def statefulset() -> dict:
    return the("StatefulSet", fleet=True)


def fleet_pod_spec() -> dict:
    return statefulset()["spec"]["template"]["spec"]


def fleet_container() -> dict:
    containers = fleet_pod_spec()["containers"]
    assert len(containers) == 1, "the fleet's pod has one container"
    return containers[0]


def fleet_env() -> dict[str, dict]:
    return {e["name"]: e for e in fleet_container().get("env", [])}


def downward(env: dict[str, dict], pod: str, namespace: str) -> dict[str, str]:
    """What the downward API gives the env entries that use it, for a pod of this name and namespace."""
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    out = {}
    for name, entry in env.items():
        if "value" in entry:
            out[name] = entry["value"]
        elif "fieldRef" in entry.get("valueFrom", {}):
            out[name] = fields.get(entry["valueFrom"]["fieldRef"]["fieldPath"], "")
    return out


def fleet_flags() -> dict[str, str | None]:
    """The fleet's flags, ``$(VAR)`` expanded as in its first replica's pod."""
    sts = statefulset()
    env = downward(fleet_env(), sts["metadata"]["name"] + "-0", sts["metadata"]["namespace"])
    return {k: expand(v, env) if v is not None else v for k, v in flag_values(fleet_container()["args"]).items()}


def fleet_port(port: int | str) -> int:
    if isinstance(port, int):
        return port
    return {p["name"]: p["containerPort"] for p in fleet_container()["ports"]}[port]


def grants(role: dict) -> set[tuple[str, str, str, str | None]]:
    """Every (apiGroup, resource, verb, resourceName or None for any) a Role or ClusterRole grants."""
    out = set()
    for rule in role["rules"]:
        assert not rule.get("nonResourceURLs"), "no non-resource URLs"
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [None]:
                        out.add((group, resource, verb, name))
    return out


def device_taint_grants() -> set[tuple[str, str, str, None]]:
    return {("resource.k8s.io", "devicetaintrules", verb, None) for verb in TAINT_VERBS}


def fleet_cluster_grants() -> set[tuple[str, str, str, None]]:
    """The DeviceTaintRules, and the Events that record each change (in ``default``, where client-go puts those of
    a cluster-scoped object, and in the Lease's namespace for the brake): create, and patch for their series."""
    return device_taint_grants() | {("events.k8s.io", "events", verb, None) for verb in ("create", "patch")}


def lease_grants() -> set[tuple[str, str, str, str | None]]:
    return {("coordination.k8s.io", "leases", verb, name) for verb, name in LEASE_VERBS}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@cache
def fleet_help() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "fleet", "--help"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_fleet_is_a_set_of_its_own_that_applying_the_node_set_leaves_out():
    assert BASE_DIR not in FLEET_DIR.parents, "`kubectl apply -k deploy/kubernetes/base` must not include it"
    assert not [p for p in base_resources() if FLEET_DIR in p.parents or p == FLEET_DIR.resolve()]
    assert {o["kind"] for _, o in fleet_manifests()} == FLEET_KINDS
    assert not [o for _, o in node_manifests() if o["kind"] == "StatefulSet"], "the node set stays as it is"
    for path, obj in fleet_manifests():
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/component") == "fleet", f"{path.name}: {obj['kind']} not labelled fleet"
    for path, obj in node_manifests():
        assert obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "fleet", path.name
    # What the fleet takes from the node set: its namespace and the policy ConfigMap (apply order).
    assert {o["metadata"]["namespace"] for _, o in fleet_manifests() if o["kind"] not in CLUSTER_SCOPED} == {NAMESPACE}


def test_the_fleet_has_its_own_service_account_with_its_api_token():
    (account,) = objects("ServiceAccount", fleet=True)
    assert account["metadata"]["name"] == FLEET_ACCOUNT != pod_spec()["serviceAccountName"]
    assert fleet_pod_spec()["serviceAccountName"] == FLEET_ACCOUNT
    assert fleet_pod_spec().get("automountServiceAccountToken", True) is True, "it calls the API"


def test_the_fleet_cluster_role_grants_exactly_device_taint_rules_and_their_events():
    role, binding = the("ClusterRole", fleet=True), the("ClusterRoleBinding", fleet=True)
    assert "aggregationRule" not in role
    assert "*" not in json.dumps(role), "no wildcards"
    assert grants(role) == fleet_cluster_grants()
    assert role["metadata"]["name"] != the("ClusterRole")["metadata"]["name"], "not the agent's opt-in role"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FLEET_ACCOUNT, "namespace": NAMESPACE}]


def test_the_fleet_role_grants_exactly_its_lease_in_its_namespace():
    role, binding = the("Role", fleet=True), the("RoleBinding", fleet=True)
    flags = fleet_flags()
    assert "*" not in json.dumps(role), "no wildcards"
    assert grants(role) == lease_grants()
    assert flags["--leader-elect-resource-name"] == LEASE, "the Lease the Role's resourceNames allows"
    assert role["metadata"]["namespace"] == flags.get("--leader-elect-resource-namespace", NAMESPACE) == NAMESPACE
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FLEET_ACCOUNT, "namespace": NAMESPACE}]


@pytest.mark.parametrize(
    "kind,change",
    [
        ("ClusterRole", lambda r: r["rules"][0]["verbs"].append("deletecollection")),
        ("ClusterRole", lambda r: r["rules"][0]["resources"].append("resourceslices")),
        ("ClusterRole", lambda r: r["rules"].append({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]})),
        ("ClusterRole", lambda r: r["rules"][0].update(apiGroups=["*"])),
        ("Role", lambda r: r["rules"][1].pop("resourceNames")),
        ("Role", lambda r: r["rules"][1]["verbs"].append("patch")),
        ("Role", lambda r: r["rules"][0]["verbs"].append("list")),
        ("Role", lambda r: r["rules"][1].update(resourceNames=["otel-dra-fleet", "kube-scheduler"])),
    ],
)
def test_the_rbac_checks_catch_a_wider_grant(kind, change):
    role = json.loads(json.dumps(the(kind, fleet=True)))
    expected = fleet_cluster_grants() if kind == "ClusterRole" else lease_grants()
    assert grants(role) == expected
    change(role)
    assert grants(role) != expected


def test_the_agents_service_account_is_bound_only_by_the_opt_in_taints_file():
    """The agent's --k8s-apply is for single-node use: nothing in the default set, nor in fleet/, binds a
    role to the DaemonSet's ServiceAccount; only taints/rbac.yaml does, when it is applied on purpose."""
    agent = (daemonset()["metadata"]["namespace"], pod_spec()["serviceAccountName"])
    binding_files = set()
    for path, obj in manifests():
        if obj["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if agent in {(s.get("namespace"), s["name"]) for s in obj["subjects"] if s["kind"] == "ServiceAccount"}:
            binding_files.add(path)
    assert binding_files, "taints/rbac.yaml, the opt-in, binds the agent"
    assert {p.parent for p in binding_files} == {TAINTS_DIR}, (
        f"bound outside taints/: {sorted(map(str, binding_files))}"
    )
    default_set = [o for p, o in manifests() if p.parent == BASE_DIR]
    assert default_set, "the base's manifests"
    assert not [o for o in default_set if o["apiVersion"].startswith("rbac.authorization.k8s.io/")]
    assert pod_spec().get("automountServiceAccountToken") is False
    assert "single-node" in (TAINTS_DIR / "rbac.yaml").read_text()


def test_the_fleet_statefulset_runs_two_replicas_behind_its_headless_service():
    sts, service = statefulset(), the("Service", fleet=True)
    assert sts["spec"]["replicas"] == 2
    assert sts["spec"]["serviceName"] == service["metadata"]["name"], "the Service that names each replica"
    assert service["spec"]["clusterIP"] == "None", "headless: one DNS name per replica"
    assert sts["spec"].get("podManagementPolicy") == "Parallel", "a standby does not wait for the leader"
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert selects(sts["spec"]["selector"]["matchLabels"], labels)
    assert fleet_pod_spec()["containers"][0]["image"] == container()["image"], "the agent's image"
    pdb = the("PodDisruptionBudget", fleet=True)
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"]["maxUnavailable"] < sts["spec"]["replicas"]


def test_each_service_selects_its_own_pods_only():
    node_pods = daemonset()["spec"]["template"]["metadata"]["labels"]
    fleet_pods = statefulset()["spec"]["template"]["metadata"]["labels"]
    node_service, fleet_service = the("Service"), the("Service", fleet=True)
    assert selects(node_service["spec"]["selector"], node_pods)
    assert not selects(node_service["spec"]["selector"], fleet_pods)
    assert selects(fleet_service["spec"]["selector"], fleet_pods)
    assert not selects(fleet_service["spec"]["selector"], node_pods)
    assert not selects(statefulset()["spec"]["selector"]["matchLabels"], node_pods)
    assert not selects(daemonset()["spec"]["selector"]["matchLabels"], fleet_pods)


def test_the_fleet_applies_taints_under_leader_election():
    args, flags = fleet_container()["args"], fleet_flags()
    assert args[0] == "fleet", "the image's ENTRYPOINT is otel-dra; args start with the subcommand"
    assert "--k8s-apply" in flags and flags["--k8s-apply"] is None, "a switch"
    assert flags.get("--k8s-api-version", "auto") in K8S_API_VERSIONS
    assert flags.get("--k8s-driver"), "the driver of devices whose telemetry names none"
    assert "--no-leader-elect" not in flags, "two replicas must elect one writer"
    assert "--leader-elect" in flags and flags["--leader-elect"] is None
    lease, renew, retry = (
        float(flags[f"--leader-elect-{name}"]) for name in ("lease-duration", "renew-deadline", "retry-period")
    )
    assert (lease, renew, retry) == (15, 10, 2), "deploy/README.md's table"
    assert 0 < retry < renew < lease, "renew before the deadline, give up before a standby may take over"
    assert renew < lease - 1.2 * retry, "the retries are jittered up to 1.2x (`otel-dra fleet --help`)"
    assert flags["--leader-elect-resource-name"] == LEASE
    assert flags["--leader-elect-resource-namespace"] == NAMESPACE
    assert "--k8s-output" not in flags, "the fleet applies; it writes no files"
    # The agents push every --interval (their OTLP export interval unless set): the fleet's window unit.
    assert float(flags["--sample-interval"]) == float(agent_flags()["--interval"])


def test_the_fleet_identity_and_namespace_come_from_the_downward_api():
    env = fleet_env()
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    defined = set(env)
    for arg in fleet_container()["args"]:
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
            assert ref in defined, f"arg {arg} uses $({ref}), which the container's env does not define"


def test_the_fleet_ports_match_its_flags_and_the_probes_hit_healthz_on_metrics():
    ports = {p["name"]: p for p in fleet_container()["ports"]}
    flags = fleet_flags()
    for name, flag, default in (
        ("otlp-grpc", "--otlp-grpc-port", OTLP_GRPC_PORT),
        ("otlp-http", "--otlp-http-port", OTLP_HTTP_PORT),
        ("metrics", "--prometheus-port", METRICS_PORT),
    ):
        assert ports[name]["containerPort"] == int(flags.get(flag, default)) == default, name
        assert ports[name].get("protocol", "TCP") == "TCP"
    for probe in ("livenessProbe", "readinessProbe"):
        get = fleet_container()[probe]["httpGet"]
        assert get["path"] == "/healthz", probe
        assert fleet_port(get["port"]) == METRICS_PORT, probe
    service = the("Service", fleet=True)
    served = {p["name"]: (p["port"], fleet_port(p["targetPort"])) for p in service["spec"]["ports"]}
    assert served == {n: (p["containerPort"], p["containerPort"]) for n, p in ports.items()}
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_fleet_resources_are_requested_and_bounded():
    resources = fleet_container()["resources"]
    for key in ("cpu", "memory"):
        request, limit = quantity(resources["requests"][key]), quantity(resources["limits"][key])
        assert 0 < request <= limit, f"{key}: request {request} must be positive and within the limit {limit}"
    assert quantity(resources["limits"]["memory"]) >= 2 * quantity(resources["requests"]["memory"])
    # The request covers the 10,000 devices the manifest says it fits, at the real process's measured RSS
    # (bench_fleet_scale's 8,000-device row: floor and full windows, MiB), with room to spare.
    bench = (REPO / "BENCHMARKS.md").read_text()
    row = re.search(r"^\| 8,000 \| ([0-9,]+) MiB \| ([0-9,]+) MiB \|", bench, re.MULTILINE)
    assert row, "BENCHMARKS.md has bench_fleet_scale's 8,000-device memory row"
    floor, full = (float(x.replace(",", "")) * 2**20 for x in row.groups())
    assert "about 10,000 devices" in (REPO / "deploy/kubernetes/fleet/30-statefulset.yaml").read_text()
    assert quantity(resources["requests"]["memory"]) >= 1.15 * (floor + (full - floor) * 10_000 / 8_000)


def test_the_fleet_security_context_is_tight_and_non_root():
    spec, sc = fleet_pod_spec(), fleet_container()["securityContext"]
    for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(host_namespace), host_namespace
    assert not [v for v in spec.get("volumes", []) if "hostPath" in v], "no host paths: no host sockets"
    seccomp = sc.get("seccompProfile") or spec.get("securityContext", {}).get("seccompProfile")
    assert seccomp == {"type": "RuntimeDefault"}
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001 and sc["runAsGroup"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert not sc.get("privileged")
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert not sc["capabilities"].get("add")


def test_the_fleet_policy_is_the_node_sets_configmap_mounted_where_the_flag_points():
    policy_path = fleet_flags()["--policy"]
    mounts = {m["name"]: m for m in fleet_container()["volumeMounts"]}
    vols = {v["name"]: v for v in fleet_pod_spec()["volumes"]}
    (name,) = [n for n, m in mounts.items() if policy_path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts[name].get("readOnly") is True
    (configmap,) = [c for c in objects("ConfigMap") if c["metadata"]["name"] == vols[name]["configMap"]["name"]]
    assert policy_path.rsplit("/", 1)[1] in configmap["data"]
    writable = [m["mountPath"] for m in mounts.values() if not m.get("readOnly")]
    assert "/tmp" in writable, "the root filesystem is read-only"


def test_flags_used_by_the_fleet_manifest_exist_in_otel_dra_fleet():
    """Needs the fleet's --k8s-* and --leader-elect* flags (issue 12)."""
    from otel_dra.cli import fleet

    args = fleet_container()["args"]
    known = set(re.findall(r"--[a-z][a-z0-9-]*", fleet_help()))
    missing = sorted(set(flag_values(args)) - known)
    assert not missing, (
        f"fleet/30-statefulset.yaml uses flags `otel-dra fleet --help` does not list: {', '.join(missing)}"
    )
    sts = statefulset()
    env = downward(fleet_env(), sts["metadata"]["name"] + "-0", sts["metadata"]["namespace"])
    fleet.make_context("fleet", [expand(a, env) for a in args[1:]])  # click parses them: types, choices, ranges


def fleet_readme_section() -> str:
    readme = (DEPLOY / "README.md").read_text()
    (section,) = re.findall(r"^## Fleet: one cluster-level writer\n(.*?)(?=^## )", readme, re.M | re.S)
    return section


def replica_addresses() -> list[str]:
    sts, service = statefulset(), the("Service", fleet=True)
    name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
    port, host = fleet_port("otlp-http"), f"{service['metadata']['name']}.{namespace}.svc"
    return [f"http://{name}-{i}.{host}:{port}" for i in range(sts["spec"]["replicas"])]


def test_the_readme_collector_config_fans_out_to_every_replica():
    (snippet,) = re.findall(r"```yaml\n(.*?)```", fleet_readme_section(), re.S)
    config = yaml.safe_load(snippet)
    exporters = config["exporters"]
    assert all(name.split("/")[0] == "otlphttp" for name in exporters), "otlphttp exporters only: no loadbalancing"
    assert sorted(e["endpoint"] for e in exporters.values()) == replica_addresses()
    assert set(config["service"]["pipelines"]["metrics"]["exporters"]) >= set(exporters)
    for address in replica_addresses():
        host = address.removeprefix("http://").rsplit(":", 1)[0]
        assert host in (FLEET_DIR / "30-statefulset.yaml").read_text()
        assert host in (FLEET_DIR / "40-service.yaml").read_text()


def test_the_readme_fleet_section_says_what_the_manifests_do():
    section = fleet_readme_section()
    plain = " ".join(section.replace("`", "").replace("*", "").split())
    assert "The agent's --k8s-apply is for single-node use; in a cluster, the fleet writes" in plain
    assert "kubectl apply -f deploy/kubernetes/fleet/" in section
    assert section.index("kubectl apply -k deploy/kubernetes/base ") < section.index(
        "kubectl apply -f deploy/kubernetes/fleet/"
    )
    for text in ("`devicetaintrules`", "`leases`", f"`{LEASE}`", "`create`", "`get`, `update`", "`POD_NAME`"):
        assert text in section, text
    flags = fleet_flags()
    for flag in ("--leader-elect-lease-duration", "--leader-elect-renew-deadline", "--leader-elect-retry-period"):
        (row,) = [line for line in section.splitlines() if line.startswith(f"| `{flag}` |")]
        assert f"| {float(flags[flag]):g} s |" in row, f"{flag}: the README's value is not the manifest's"
    assert "only the holder" in section.lower() or "only the lease holder" in section.lower()


# -- Dockerfile -----------------------------------------------------------------------------
INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined and comments dropped, as the builder reads it."""
    out, pending = [], ""
    for number, raw in enumerate(DOCKERFILE.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # blank lines and comments, also inside a continuation
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        word, _, rest = text.partition(" ")
        assert word in INSTRUCTIONS, f"Dockerfile line {number}: {word!r} is not an instruction (or not upper case)"
        out.append((word, rest.strip()))
    assert not pending, "Dockerfile ends inside a line continuation"
    return out


def stages() -> list[dict]:
    """Each stage: its base image (ARGs resolved), its alias and its instructions."""
    global_args: dict[str, str] = {}
    found: list[dict] = []
    for word, rest in dockerfile():
        if word == "ARG" and not found:
            name, _, default = rest.partition("=")
            global_args[name] = default
            continue
        if word == "FROM":
            parts = [p for p in rest.split() if not p.startswith("--")]  # drop --platform=...
            named = len(parts) == 3 and parts[1].upper() == "AS"
            image = expand_docker(parts[0], global_args)
            # A stage sees a global ARG only where it declares it again (ARG NAME).
            found.append({"image": image, "alias": parts[2] if named else None, "body": [], "args": {}})
            continue
        assert found, f"{word} before the first FROM"
        if word == "ARG":
            name, _, default = rest.partition("=")
            found[-1]["args"][name] = default or global_args.get(name, "")
        found[-1]["body"].append((word, rest))
    return found


def expand_docker(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), text)


def instructions(stage: dict, word: str) -> list[str]:
    return [rest for w, rest in stage["body"] if w == word]


def test_dockerfile_parses_and_starts_from_a_pinned_python_311_slim():
    built = stages()
    assert built, "no FROM"
    aliases = {s["alias"] for s in built if s["alias"]}
    for stage in built:
        image = stage["image"]
        if image in aliases:
            continue
        assert "$" not in image, f"base image {image!r} uses an ARG without a default"
        assert re.match(r"python:3\.11\.\d+-slim", image) or "@sha256:" in image, (
            f"base image {image!r} is not pinned (a 3.11 patch release, or a digest)"
        )
        assert ":latest" not in image


def installed_extras() -> list[str]:
    """The extras of the image's `pip install .[...]`, its ARG defaults resolved as a plain build has them."""
    build = [s for s in stages() if any("pip install" in r for r in instructions(s, "RUN"))]
    assert build, "no stage runs pip install"
    runs = [expand_docker(r, build[0]["args"]) for r in instructions(build[0], "RUN")]
    installs = [m for r in runs for m in re.finditer(r"pip install [^&|;]*?[\"']?\.\[([a-z0-9,-]+)\][\"']?", r)]
    assert installs, f"no `pip install .[...]` of the build context in {runs}"
    return installs[0][1].split(",")


def test_dockerfile_installs_the_package_with_the_k8s_and_nvml_extras():
    """The one image reads NVIDIA GPUs (the NVML binding; the library is the node's) as well as sysfs."""
    extras = installed_extras()
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not set(extras) - set(declared), f"extras pyproject.toml does not declare: {set(extras) - set(declared)}"
    assert "k8s" in extras, "the kubernetes client, for DeviceTaintRules"
    (nvml_extra,) = [
        name for name, deps in declared.items() if name != "test" and any("nvidia-ml-py" in d for d in deps)
    ]
    assert nvml_extra in extras, f"the image must install the NVML extra `{nvml_extra}` by default"
    # The build proves the binding imports (pip could install the extra and the import still fail).
    (build,) = [s for s in stages() if any("pip install" in r for r in instructions(s, "RUN"))]
    assert any('-c "import pynvml"' in r for r in instructions(build, "RUN")), "the build imports pynvml"
    copied = [r.split()[:-1] for r in instructions(build, "COPY")]
    sources = [src for parts in copied for src in parts if not src.startswith("--")]
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: not in the repository"
        assert not dockerignored(src), f"COPY {src}: left out of the build context by .dockerignore"
    assert {"pyproject.toml", "otel_dra"} <= set(sources)


def test_dockerfile_runs_otel_dra_as_a_non_root_user():
    final = stages()[-1]
    users = instructions(final, "USER")
    assert users, "the runtime stage sets no USER (it would run as root)"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert json.loads(instructions(final, "ENTRYPOINT")[-1]) == ["otel-dra"]
    assert json.loads(instructions(final, "CMD")[-1]) == ["run"]
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^otel-dra = "otel_dra\.cli:main"$', pyproject, re.M), "the otel-dra console script"
    assert str(METRICS_PORT) in instructions(final, "EXPOSE")[-1].split()
    # The root choice for the kubelet sockets is documented where the user is set.
    assert "/var/lib/kubelet" in DOCKERFILE.read_text()


def healthcheck_argv() -> list[str]:
    (check,) = instructions(stages()[-1], "HEALTHCHECK")
    _options, sep, command = check.partition("CMD ")
    assert sep, "HEALTHCHECK without CMD"
    argv = json.loads(command)
    assert isinstance(argv, list), "HEALTHCHECK CMD in exec form (JSON array)"
    return argv


def test_healthcheck_uses_python_urllib_on_healthz():
    argv = healthcheck_argv()
    assert argv[:2] == ["python", "-c"]
    code = argv[2]
    compile(code, "HEALTHCHECK", "exec")
    assert "urllib" in code and "/healthz" in code
    assert "curl" not in code and "wget" not in code


# -- .dockerignore --------------------------------------------------------------------------
def dockerignore_patterns() -> list[tuple[bool, re.Pattern]]:
    """(exception, regex) per line, in order; the last match wins, as in Docker."""
    out = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex, i = regex + pattern[i : end + 1], end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        out.append((exception, re.compile(regex)))
    return out


def dockerignored(path: str) -> bool:
    """Whether Docker leaves ``path`` (relative to the repo) out of the build context."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for exception, regex in dockerignore_patterns():
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not exception
    return ignored


@pytest.mark.parametrize(
    "path",
    ["pyproject.toml", "README.md", "otel_dra/cli/__init__.py", "otel_dra/policy/default.yaml", "otel_dra/sources"],
)
def test_dockerignore_keeps_what_pip_install_needs(path):
    assert (REPO / path).exists()
    assert not dockerignored(path)


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/project/test_deploy.py",
        ".pytest_cache/README.md",
        ".hypothesis/examples",
        ".ruff_cache/CACHEDIR.TAG",
        "otel_dra.egg-info/PKG-INFO",
        "otel_dra/__pycache__/cli.cpython-311.pyc",
        "otel_dra/sinks/kubelet/api/.ruff_cache/CACHEDIR.TAG",
        "bench/bench_agent.py",
        "deploy/kubernetes/base/30-daemonset.yaml",
        "deploy/kubernetes/overlays/nvidia/kustomization.yaml",
        "build/lib/otel_dra/cli/__init__.py",
    ],
)
def test_dockerignore_leaves_out_environments_tests_and_caches(path):
    assert dockerignored(path)


# -- the agent, run as deployed -------------------------------------------------------------
DOWNWARD = {"NODE_NAME": "node-a", "POD_NAME": "otel-dra-x", "POD_NAMESPACE": NAMESPACE}


def as_deployed_here(ds: dict, configmaps: list[dict], root: Path) -> tuple[list[str], dict[str, str]]:
    """The DaemonSet's `otel-dra run` arguments and environment, its host paths and volumes moved under
    ``root`` (unix socket paths are limited to 107 bytes: keep it short), the volumes made and the policy
    ConfigMap's file written where the pod would see it, and the endpoint on this machine's loopback."""
    missing = sorted(set(flag_values(container(ds)["args"])) - set(re.findall(r"--[a-z][a-z0-9-]*", run_help())))
    if missing:  # fail at once, not after the agent fixture's 30 s wait for a process that exited
        pytest.fail(f"`otel-dra run` does not take {', '.join(missing)} yet")
    env = env_values(ds) | DOWNWARD
    args = [expand(a, env) for a in container(ds)["args"][1:]]
    mounts, vols = mounts_by_volume(ds), volumes(ds)
    moved = {"/var/lib/kubelet": str(root / "kubelet")}
    for name, mount in mounts.items():
        if "hostPath" not in vols[name] or not mount["mountPath"].startswith("/var/lib/kubelet/"):
            moved[mount["mountPath"]] = str(root / name)

    def relocate(value: str) -> str:
        for source in sorted(moved, key=len, reverse=True):
            if value == source or value.startswith(source + "/"):
                return moved[source] + value[len(source) :]
        return value

    for target in moved.values():  # the volumes exist before the container starts
        Path(target).mkdir(parents=True, exist_ok=True)
    for host_path in (v["hostPath"]["path"] for v in vols.values() if "hostPath" in v):
        Path(relocate(host_path)).mkdir(parents=True, exist_ok=True)
    args = [
        f"{flag}={relocate(value)}" if eq else relocate(flag) for flag, eq, value in (a.partition("=") for a in args)
    ]
    args = ["--host=127.0.0.1" if a.startswith("--host=") else a for a in args]  # this machine's loopback
    policy = agent_flags(ds)["--policy"]
    (name,) = [n for n, m in mounts.items() if policy.startswith(m["mountPath"].rstrip("/") + "/")]
    (configmap,) = [c for c in configmaps if c["metadata"]["name"] == vols[name]["configMap"]["name"]]
    policy_file = Path(relocate(policy))
    policy_file.parent.mkdir(parents=True, exist_ok=True)
    policy_file.write_text(configmap["data"][Path(policy).name])
    attributes = expand(env["OTEL_RESOURCE_ATTRIBUTES"], env)
    return args, {"NODE_NAME": env["NODE_NAME"], "OTEL_RESOURCE_ATTRIBUTES": attributes}


@pytest.mark.e2e
def test_the_demo_daemonset_command_line_runs_and_serves_the_health_socket(start_agent):
    """The demo overlay's args as `kubectl apply -k` would deploy them, its source included: the one
    DaemonSet meant to run anywhere. Needs the kubelet flags of issue 4."""
    rendered = kustomize(OVERLAYS_DIR / "demo")
    (ds,) = [o for o in rendered if o["kind"] == "DaemonSet"]
    root = Path(tempfile.mkdtemp(prefix="od-"))
    try:
        args, env = as_deployed_here(ds, [o for o in rendered if o["kind"] == "ConfigMap"], root)
        assert "--source=simulated" in args
        agent = start_agent(*args, env=env, pick_source=True)  # the overlay's own --source, nothing added
        socket_path = Path(str(flag_values(args)["--kubelet-socket"]))
        wait_for(socket_path.is_socket, 15, "the health socket")
        assert http_get(agent.url + "/healthz")[0] == 200
        registry = root / "kubelet" / Path(KUBELET_REGISTRY).relative_to("/var/lib/kubelet")
        assert not registry.exists() or not any(registry.iterdir()), "no registration socket"
        assert 'k8s_node_name="node-a"' in agent.metrics()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.e2e
def test_the_base_daemonset_refuses_to_start_where_it_finds_no_accelerator(start_agent):
    """The base's own command line (`--source=auto`) on a node with no GPU NVML can list and an empty
    /sys: the agent exits 2 saying what it looked for, and never serves simulated GPUs instead."""
    from otel_dra.sources.nvml import nvml_gpus

    gpus, _why = nvml_gpus()
    if gpus:
        pytest.skip(f"NVML lists {gpus} GPU(s) on this machine: auto would rightly read them")
    root = Path(tempfile.mkdtemp(prefix="od-"))
    try:
        args, env = as_deployed_here(daemonset(), objects("ConfigMap"), root)
        assert "--source=auto" in args
        no_sysfs = root / "sys"  # what the sysfs probe reads instead of this machine's /sys
        no_sysfs.mkdir()
        agent = start_agent(*args, env=env | {"OTEL_DRA_SYSFS_ROOT": str(no_sysfs)}, wait=False, pick_source=True)
        assert agent.proc.wait(timeout=30) == 2, agent.logs()
        logs = agent.logs()
        assert "--source auto found no accelerator" in logs, logs
        assert "first sample" not in logs, "it sampled something"
        assert not Path(str(flag_values(args)["--kubelet-socket"])).exists(), "it served a health stream"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.e2e
def test_the_image_healthcheck_passes_on_a_running_agent_and_fails_without_one(start_agent):
    argv = [sys.executable, *healthcheck_argv()[1:]]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)
    }
    assert subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode != 0, "nothing listens yet"
    start_agent(env={"OTEL_EXPORTER_PROMETHEUS_PORT": str(port)})
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
