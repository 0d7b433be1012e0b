"""deploy/: the Dockerfile, the build context (.dockerignore) and the Kubernetes manifests.

Docker cannot build here and there is no cluster, so the deployment is checked statically:
every manifest is deserialized into the `kubernetes` client's typed models and serialized back
(the client silently drops keys it doesn't know, so any difference is a typo or a misplaced
field), then the facts the deployment relies on are asserted: the flags it passes exist in
`otel-dra run --help`, the host paths match the flags, the RBAC is exactly what applying
DeviceTaintRules needs, the policy validates with the project's own loader. Two tests run the
agent itself: with the DaemonSet's command line (host paths moved under a temporary directory),
and the image's HEALTHCHECK command against it.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import kubernetes.client.models as k8s_models
import pytest
import yaml
from kubernetes.client import ApiClient

import otel_dra
from otel_dra.config import DEFAULT_PROMETHEUS_PORT
from otel_dra.policy import load as load_policy
from tests.conftest import free_port, http_get, wait_for

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
MANIFEST_DIR = DEPLOY / "kubernetes"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

NAMESPACE = "otel-dra"
METRICS_PORT = 9464
KUBELET_PLUGINS = "/var/lib/kubelet/plugins"
KUBELET_REGISTRY = "/var/lib/kubelet/plugins_registry"
HEALTH_SOCKET_DIR = KUBELET_PLUGINS + "/otel-dra"  # deploy/README.md, "Relaying health to the kubelet"
TAINT_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
MAX_SOCKET_PATH_BYTES = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


# -- manifests -----------------------------------------------------------------------------
def manifest_files() -> list[Path]:
    return sorted(MANIFEST_DIR.rglob("*.yaml"))


@cache
def manifests() -> tuple[tuple[Path, dict], ...]:
    found = []
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                found.append((path, doc))
    return tuple(found)


def objects(kind: str) -> list[dict]:
    return [obj for _, obj in manifests() if obj["kind"] == kind]


def the(kind: str) -> dict:
    found = objects(kind)
    assert len(found) == 1, f"expected one {kind} in deploy/kubernetes, found {len(found)}"
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


def daemonset() -> dict:
    return the("DaemonSet")


def pod_spec() -> dict:
    return daemonset()["spec"]["template"]["spec"]


def container() -> dict:
    containers = pod_spec()["containers"]
    assert len(containers) == 1, "the agent's pod has one container"
    return containers[0]


def env_values() -> dict[str, str]:
    return {e["name"]: e["value"] for e in container().get("env", []) if "value" in e}


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


def agent_flags() -> dict[str, str]:
    """The DaemonSet's flags with ``$(VAR)`` expanded from the container's env."""
    env = env_values()
    return {k: expand(v, env) if v is not None else v for k, v in flag_values(container()["args"]).items()}


def mounts_by_volume() -> dict[str, dict]:
    return {m["name"]: m for m in container().get("volumeMounts", [])}


def volumes() -> dict[str, dict]:
    return {v["name"]: v for v in pod_spec().get("volumes", [])}


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
    api = ApiClient()
    name = model_name(obj)
    assert hasattr(k8s_models, name), f"{path.name}: the kubernetes client has no model {name} for {obj['apiVersion']}"
    model = api._ApiClient__deserialize(obj, name)  # raises on a missing required field or a wrong type
    back = api.sanitize_for_serialization(model)
    assert differences(obj, back) == [], f"{path.relative_to(REPO)}: fields the {name} model does not take as written"


def test_namespaced_objects_live_in_the_declared_namespace():
    assert {n["metadata"]["name"] for n in objects("Namespace")} == {NAMESPACE}
    for path, obj in manifests():
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], f"{path.name}: {obj['kind']} is cluster-scoped"
        else:
            assert obj["metadata"].get("namespace") == NAMESPACE, f"{path.name}: {obj['kind']} outside {NAMESPACE}"


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
    assert ports["metrics"]["containerPort"] == METRICS_PORT == DEFAULT_PROMETHEUS_PORT
    assert ports["metrics"].get("protocol", "TCP") == "TCP"
    flags = agent_flags()
    assert flags.get("--prometheus-port", str(METRICS_PORT)) == str(METRICS_PORT)
    assert "OTEL_EXPORTER_PROMETHEUS_PORT" not in env_values(), "the port is set in one place: containerPort"


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
    assert set(by_host_path) == {HEALTH_SOCKET_DIR}, "only otel-dra's own socket directory, no other kubelet path"
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
    for flag in ("--kubelet-socket", "--k8s-output"):
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
        # uid 0 only for the kubelet's root-owned socket directories.
        host_paths = {v["hostPath"]["path"] for v in volumes().values() if "hostPath" in v}
        assert host_paths and all(p.startswith(KUBELET_PLUGINS + "/") for p in host_paths)
    assert pod_spec().get("automountServiceAccountToken") is False, "no API token unless taints are opted into"


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
    accounts = {(a["metadata"]["namespace"], a["metadata"]["name"]) for a in objects("ServiceAccount")}
    ds = daemonset()
    assert (ds["metadata"]["namespace"], pod_spec()["serviceAccountName"]) in accounts
    for binding in objects("ClusterRoleBinding") + objects("RoleBinding"):
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
    rbac_files = {p for p, o in manifests() if o["apiVersion"].startswith("rbac.authorization.k8s.io/")}
    assert len(rbac_files) == 1
    (rbac_file,) = rbac_files
    kinds = {o["kind"] for p, o in manifests() if p == rbac_file}
    assert kinds == {"ClusterRole", "ClusterRoleBinding"}
    # `kubectl apply -f deploy/kubernetes/` (without -R) must leave it out.
    assert rbac_file.parent != MANIFEST_DIR


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


def test_dockerfile_installs_the_package_with_the_k8s_extra():
    build = [s for s in stages() if any("pip install" in r for r in instructions(s, "RUN"))]
    assert build, "no stage runs pip install"
    runs = [expand_docker(r, build[0]["args"]) for r in instructions(build[0], "RUN")]
    installs = [m for r in runs for m in re.finditer(r"pip install [^&|;]*?[\"']?\.\[([a-z0-9,-]+)\][\"']?", r)]
    assert installs, f"no `pip install .[...]` of the build context in {runs}"
    assert "k8s" in installs[0][1].split(",")
    copied = [r.split()[:-1] for r in instructions(build[0], "COPY")]
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
    "path", ["pyproject.toml", "README.md", "otel_dra/cli.py", "otel_dra/policies/default.yaml", "otel_dra/sources"]
)
def test_dockerignore_keeps_what_pip_install_needs(path):
    assert (REPO / path).exists()
    assert not dockerignored(path)


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/test_deploy.py",
        ".pytest_cache/README.md",
        ".hypothesis/examples",
        ".ruff_cache/CACHEDIR.TAG",
        "otel_dra.egg-info/PKG-INFO",
        "otel_dra/__pycache__/cli.cpython-311.pyc",
        "otel_dra/kubelet/api/.ruff_cache/CACHEDIR.TAG",
        "bench/bench_agent.py",
        "deploy/kubernetes/30-daemonset.yaml",
        "build/lib/otel_dra/cli.py",
    ],
)
def test_dockerignore_leaves_out_environments_tests_and_caches(path):
    assert dockerignored(path)


# -- the agent, run as deployed -------------------------------------------------------------
@pytest.mark.e2e
def test_the_daemonset_command_line_runs_and_serves_the_health_socket(start_agent):
    """The DaemonSet's args, with its host paths moved under a short temporary directory (unix
    socket paths are limited to 107 bytes). Needs the kubelet flags of issue 4."""
    missing = sorted(set(flag_values(container()["args"])) - set(re.findall(r"--[a-z][a-z0-9-]*", run_help())))
    if missing:  # fail at once, not after the agent fixture's 30 s wait for a process that exited
        pytest.fail(f"`otel-dra run` does not take {', '.join(missing)} yet")
    root = Path(tempfile.mkdtemp(prefix="od-"))
    try:
        env = env_values() | {"NODE_NAME": "node-a", "POD_NAME": "otel-dra-x", "POD_NAMESPACE": NAMESPACE}
        args = [expand(a, env) for a in container()["args"][1:]]
        moved = {"/var/lib/kubelet": str(root / "kubelet")}
        for name, mount in mounts_by_volume().items():
            if "hostPath" not in volumes()[name]:
                moved[mount["mountPath"]] = str(root / name)

        def relocate(value: str) -> str:
            for source in sorted(moved, key=len, reverse=True):
                if value == source or value.startswith(source + "/"):
                    return moved[source] + value[len(source) :]
            return value

        for target in moved.values():  # the volumes exist before the container starts
            Path(target).mkdir(parents=True, exist_ok=True)
        for host_path in (v["hostPath"]["path"] for v in volumes().values() if "hostPath" in v):
            Path(relocate(host_path)).mkdir(parents=True, exist_ok=True)
        args = [
            f"{flag}={relocate(value)}" if eq else relocate(flag)
            for flag, eq, value in (a.partition("=") for a in args)
        ]
        policy = agent_flags()["--policy"]
        (configmap,) = objects("ConfigMap")
        policy_file = Path(relocate(policy))
        policy_file.parent.mkdir(parents=True, exist_ok=True)
        policy_file.write_text(configmap["data"][Path(policy).name])
        attributes = expand(env["OTEL_RESOURCE_ATTRIBUTES"], env)
        agent = start_agent(*args, env={"NODE_NAME": env["NODE_NAME"], "OTEL_RESOURCE_ATTRIBUTES": attributes})
        flags = flag_values(args)
        socket_path = Path(flags["--kubelet-socket"])
        wait_for(socket_path.is_socket, 15, "the health socket")
        assert http_get(agent.url + "/healthz")[0] == 200
        registry = Path(relocate(KUBELET_REGISTRY))
        assert not registry.exists() or not any(registry.iterdir()), "no registration socket"
        assert 'k8s_node_name="node-a"' in agent.metrics()
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
