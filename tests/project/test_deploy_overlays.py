"""deploy/kubernetes/overlays: the kustomize variants of the node agent, rendered as `kubectl apply -k` would.

An overlay's patches are only parts of objects, so what is checked is what the API server would get:
`kubectl kustomize DIR` (kustomize v5, built into kubectl) of the base and of each overlay, every
rendered object validated as test_deploy.py validates the plain manifests (the official OpenAPI schemas
of Kubernetes 1.33 to 1.37, strict, and the client's typed models, with its helpers). Then what each
overlay promises: the base and every real source never simulate; nvidia runs NVML under the nvidia
RuntimeClass; amd mounts the host's /sys read-only; demo simulates and is labelled a demo; all share the
base's one policy ConfigMap; and each changes the DaemonSet in exactly the ways it says and nothing
else. Without kubectl these tests are skipped, saying so.
"""

import re
import shutil
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from otel_dra.cli import run
from tests.project.test_deploy import (
    BASE_DIR,
    DEPLOY,
    KUBECTL,
    KUBERNETES,
    KUSTOMIZATION,
    OVERLAYS_DIR,
    REPO,
    agent_flags,
    assert_round_trips,
    container,
    env_values,
    flag_values,
    kustomize,
    manifests,
    mounts_by_volume,
    objects,
    pod_spec,
    run_help,
    statefulset,
    validate_strictly,
    volumes,
)

TEMPLATE = ("spec", "template")
POD = (*TEMPLATE, "spec")
ARGS = (*POD, "containers", "otel-dra", "args")
#: Every overlay relabels the DaemonSet and its pods with its source.
SOURCE_LABELS = {("metadata", "labels", "otel-dra.io/source"), (*TEMPLATE, "metadata", "labels", "otel-dra.io/source")}
#: Each overlay: its --source, the arguments it adds right after it, and every other place it changes the
#: base's DaemonSet (paths as :func:`changes` names them; lists of named items keyed by name).
OVERLAYS: dict[str, dict] = {
    "nvidia": {
        "source": "nvml",
        "args": [],
        "changes": {ARGS, (*POD, "runtimeClassName"), (*POD, "nodeSelector", "nvidia.com/gpu.present")},
    },
    "amd": {
        "source": "sysfs",
        "args": ["--sysfs-root=/host/sys"],
        "changes": {
            ARGS,
            (*POD, "volumes", "host-sys"),
            (*POD, "containers", "otel-dra", "volumeMounts", "host-sys"),
        },
    },
    "demo": {
        "source": "simulated",
        "args": ["--devices=8"],
        "changes": {
            ARGS,
            ("metadata", "labels", "otel-dra.io/demo"),
            (*TEMPLATE, "metadata", "labels", "otel-dra.io/demo"),
            ("metadata", "annotations"),
            (*TEMPLATE, "metadata", "annotations"),
        },
    },
}
#: What `kubectl apply -k` takes: the base and each overlay, by name.
RENDERINGS = {"base": BASE_DIR, **{name: OVERLAYS_DIR / name for name in OVERLAYS}}
#: The renderings that read real devices: none of them may ever simulate.
REAL = ("base", "nvidia", "amd")
HOST_SYS = "/host/sys"


def rendered(name: str) -> tuple[dict, ...]:
    return kustomize(RENDERINGS[name])


def rendered_daemonset(name: str) -> dict:
    (ds,) = [o for o in rendered(name) if o["kind"] == "DaemonSet"]
    return ds


def key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def changes(base: object, other: object, path: tuple = ()) -> set[tuple]:
    """Where ``other`` differs from ``base``: a path per changed, added or removed value; a list of named
    items (containers, env, volumes, mounts) is compared item by item, keyed by name."""
    if isinstance(base, dict) and isinstance(other, dict):
        out: set[tuple] = set()
        for k in base.keys() | other.keys():
            if k not in base or k not in other:
                out.add((*path, k))
            else:
                out |= changes(base[k], other[k], (*path, k))
        return out
    if isinstance(base, list) and isinstance(other, list) and all(is_named(x) for x in [*base, *other]):
        return changes({x["name"]: x for x in base}, {x["name"]: x for x in other}, path)
    return set() if base == other else {path}


def is_named(item: object) -> bool:
    return isinstance(item, dict) and "name" in item


def source_of(ds: dict) -> str | None:
    """The --source the pod runs with, as `otel-dra run` would read it (a flag, else OTEL_DRA_SOURCE)."""
    return agent_flags(ds).get("--source") or env_values(ds).get("OTEL_DRA_SOURCE")


def simulates(ds: dict) -> bool:
    """Whether the DaemonSet's agent would serve simulated devices: asked for in any spelling, or implied
    (`--fault` under auto means the simulator)."""
    args = container(ds)["args"]
    spelled = any(a == "--source=simulated" for a in args) or ("--source", "simulated") in pairwise(args)
    return spelled or source_of(ds) == "simulated" or "--fault" in agent_flags(ds)


# -- every rendering is valid ----------------------------------------------------------------
@pytest.mark.parametrize("kubernetes", KUBERNETES)
@pytest.mark.parametrize("name", RENDERINGS)
def test_every_rendered_object_validates_against_the_kubernetes_openapi_schema(name, kubernetes):
    objs = rendered(name)
    assert objs, f"kubectl kustomize {name} rendered nothing"
    for obj in objs:
        validate_strictly(obj, kubernetes, f"{name}: {obj['kind']}/{obj['metadata']['name']}")


@pytest.mark.parametrize("name", RENDERINGS)
def test_every_rendered_object_round_trips_through_the_client_models(name):
    for obj in rendered(name):
        assert_round_trips(obj, f"{name}: {obj['kind']}/{obj['metadata']['name']}")


def test_the_base_renders_exactly_its_plain_manifests():
    """`kubectl apply -k deploy/kubernetes/base` sends the files test_deploy.py checks, as written."""
    plain = {key(o): o for p, o in manifests() if p.parent == BASE_DIR}
    assert plain, "no plain manifests in deploy/kubernetes/base"
    assert {key(o): o for o in rendered("base")} == plain


@pytest.mark.parametrize("name", RENDERINGS)
def test_the_rendered_args_are_what_otel_dra_run_takes(name):
    args = container(rendered_daemonset(name))["args"]
    assert args[0] == "run", "the image's ENTRYPOINT is otel-dra; args start with the subcommand"
    known = set(re.findall(r"--[a-z][a-z0-9-]*", run_help()))
    assert not sorted(set(flag_values(args)) - known), f"{name}: flags `otel-dra run --help` does not list"
    run.make_context("run", args[1:])  # click parses them: types, choices (the source names), ranges


# -- what each overlay promises --------------------------------------------------------------
@pytest.mark.parametrize("name", REAL)
def test_the_base_and_the_real_overlays_never_simulate(name):
    ds = rendered_daemonset(name)
    assert not simulates(ds), f"{name} would serve simulated GPUs"
    assert source_of(ds) in {"auto", "nvml", "sysfs"}
    assert "--devices" not in agent_flags(ds), "a simulator-only flag"


@pytest.mark.parametrize("name", RENDERINGS)
def test_each_daemonset_is_labelled_with_the_source_it_runs(name):
    ds = rendered_daemonset(name)
    expected = OVERLAYS[name]["source"] if name in OVERLAYS else "auto"
    assert source_of(ds) == expected
    assert ds["metadata"]["labels"]["otel-dra.io/source"] == expected
    assert ds["spec"]["template"]["metadata"]["labels"]["otel-dra.io/source"] == expected


@pytest.mark.parametrize("name", OVERLAYS)
def test_each_overlay_changes_the_daemonset_as_it_says_and_nothing_else(name):
    """Only the DaemonSet differs from the base, in exactly the overlay's places: its security context,
    probes, resources, volumes, and every other object stay the base's."""
    base = {key(o): o for o in rendered("base")}
    overlay = {key(o): o for o in rendered(name)}
    assert overlay.keys() == base.keys(), f"{name} adds or drops objects"
    ds_key = key(rendered_daemonset("base"))
    for k in base:
        if k != ds_key:
            assert overlay[k] == base[k], f"{name} changes {k}: only the DaemonSet is an overlay's"
    assert changes(base[ds_key], overlay[ds_key]) == OVERLAYS[name]["changes"] | SOURCE_LABELS
    base_args, args = container(base[ds_key])["args"], container(overlay[ds_key])["args"]
    i = base_args.index("--source=auto")
    expected = [*base_args[:i], f"--source={OVERLAYS[name]['source']}", *OVERLAYS[name]["args"], *base_args[i + 1 :]]
    assert args == expected


@pytest.mark.parametrize("name", RENDERINGS)
def test_every_rendering_is_the_same_daemonset_so_switching_updates_it_in_place(name):
    """One DaemonSet, whichever is applied: applying another overlay rolls the pods, no second agent per
    node (a selector cannot change, so a different one would make `kubectl apply` fail)."""
    base, ds = rendered_daemonset("base"), rendered_daemonset(name)
    assert key(ds) == key(base)
    assert ds["spec"]["selector"] == base["spec"]["selector"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_the_nvidia_overlay_runs_nvml_under_the_nvidia_runtime_class():
    ds = rendered_daemonset("nvidia")
    spec, env = pod_spec(ds), env_values(ds)
    assert spec["runtimeClassName"] == "nvidia"
    assert agent_flags(ds)["--source"] == "nvml"
    assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true", "GPU feature discovery's label"
    # What the NVIDIA container toolkit reads: every GPU, without allocating any, NVML only.
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert not [r for r in container(ds)["resources"].get("limits", {}) if "gpu" in r], "allocates no GPU"
    sc = container(ds)["securityContext"]
    assert not sc.get("privileged") and sc["capabilities"] == {"drop": ["ALL"]}


def test_the_amd_overlay_mounts_the_hosts_sys_read_only_where_sysfs_root_points():
    ds = rendered_daemonset("amd")
    flags, mounts, vols = agent_flags(ds), mounts_by_volume(ds), volumes(ds)
    assert flags["--source"] == "sysfs"
    (name,) = [n for n, v in vols.items() if v.get("hostPath", {}).get("path") == "/sys"]
    assert vols[name]["hostPath"]["type"] == "Directory", "the node's /sys: never created"
    mount = mounts[name]
    assert mount["mountPath"] == flags["--sysfs-root"] == HOST_SYS
    assert mount["readOnly"] is True
    # Read-only all the way down: cgroupfs, bpffs, debugfs, securityfs are mounted under /sys.
    assert mount["recursiveReadOnly"] == "Enabled"
    assert "mountPropagation" not in mount, "recursiveReadOnly needs no propagation"
    assert not pod_spec(ds).get("initContainers"), "nothing else mounts it"


def test_the_demo_overlay_simulates_and_is_labelled_as_a_demo():
    ds = rendered_daemonset("demo")
    assert simulates(ds)
    assert "--source=simulated" in container(ds)["args"], "the simulation is explicit in the pod's args"
    assert int(agent_flags(ds)["--devices"]) >= 1
    for meta in (ds["metadata"], ds["spec"]["template"]["metadata"]):
        assert meta["labels"]["otel-dra.io/demo"] == "true"
        description = meta["annotations"]["kubernetes.io/description"]
        assert "DEMO" in description and "simulated" in description
    for name in REAL:
        labels = rendered_daemonset(name)["spec"]["template"]["metadata"]["labels"]
        assert "otel-dra.io/demo" not in labels, f"{name} is not a demo"


def test_every_overlay_shares_the_base_policy_configmap():
    """One policy: each rendering has the base's ConfigMap, unchanged and under its name, and mounts it
    where --policy points; no overlay carries a ConfigMap or a generator of its own. The fleet mounts it."""
    (configmap,) = objects("ConfigMap")
    referenced = set()
    for name in RENDERINGS:
        maps = [o for o in rendered(name) if o["kind"] == "ConfigMap"]
        assert maps == [configmap], f"{name}: not the base's one ConfigMap"
        ds = rendered_daemonset(name)
        policy = agent_flags(ds)["--policy"]
        (volume,) = [n for n, m in mounts_by_volume(ds).items() if policy.startswith(m["mountPath"].rstrip("/") + "/")]
        referenced.add(volumes(ds)[volume]["configMap"]["name"])
    assert referenced == {configmap["metadata"]["name"]}
    fleet_maps = {
        v["configMap"]["name"] for v in statefulset()["spec"]["template"]["spec"]["volumes"] if "configMap" in v
    }
    assert fleet_maps == referenced
    for path in OVERLAYS_DIR.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            assert doc.get("kind") != "ConfigMap", f"{path.relative_to(REPO)}: a copy of the policy"
            for field in ("configMapGenerator", "namePrefix", "nameSuffix", "namespace", "resources"):
                if field == "resources":
                    assert doc.get(field, ["../../base"]) == ["../../base"], f"{path.relative_to(REPO)}: base only"
                else:
                    assert field not in doc, f"{path.relative_to(REPO)}: {field} would copy or rename the base's"


def test_every_overlay_directory_is_tested_and_documented():
    readme = (DEPLOY / "README.md").read_text()
    found = {p.parent.name for p in OVERLAYS_DIR.glob(f"*/{KUSTOMIZATION}")}
    assert found == set(OVERLAYS), "an overlay this module does not check, or one gone"
    for directory in RENDERINGS.values():
        command = f"kubectl apply -k {directory.relative_to(REPO)}"
        assert re.search(rf"{re.escape(command)}/?\s", readme), f"deploy/README.md does not say `{command}`"


def test_an_overlay_refuses_a_base_whose_source_argument_moved(tmp_path: Path):
    """The overlays replace the base's `--source` by position; their JSON-patch `test` ops make the
    rendering fail, rather than replace another argument, when the base's order changes."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: the kustomize overlays cannot be rendered here")
    shutil.copytree(BASE_DIR, tmp_path / "base")
    shutil.copytree(OVERLAYS_DIR, tmp_path / "overlays")
    daemonset_file = tmp_path / "base" / "30-daemonset.yaml"
    text = daemonset_file.read_text()
    line = "            - --source=auto\n"
    assert text.count(line) == 1
    text = text.replace(line, "").replace("            - --interval=5\n", "            - --interval=5\n" + line)
    daemonset_file.write_text(text)
    for name in OVERLAYS:
        result = subprocess.run(
            [KUBECTL, "kustomize", str(tmp_path / "overlays" / name)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode != 0, f"{name} patched a base whose --source moved"
        assert "test failed" in result.stderr, result.stderr


# -- deploy/README.md links ------------------------------------------------------------------
def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_deploy_readme_points_only_inside_the_repository():
    """Every relative link, and every `../` path in code spans, names a file of this repository (and a
    heading that exists): none into a checkout's neighbours such as ../shared/."""
    readme_path = DEPLOY / "README.md"
    readme = readme_path.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme) + re.findall(r"`(\.\./[^`\s]+)`", readme)
    relative = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert relative, "no relative link to check"
    for target in relative:
        file, _, anchor = target.partition("#")
        path = (readme_path.parent / file).resolve() if file else readme_path
        assert REPO.resolve() in path.parents or path == REPO.resolve(), f"{target}: outside the repository"
        assert path.exists(), f"{target}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"{target}: no such heading in {path.name}"
