"""collector-config.yaml is a well-formed Collector config: every pipeline component is
declared, and the OTLP receiver listens where the agent pushes by default.

(No Collector-contrib binary can be installed here, so this checks structure; the OTLP
path itself is tested end to end against rotel in test_e2e_otlp.py.)"""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "collector-config.yaml"
SHARDING = ROOT / "collector-sharding.yaml"


@pytest.mark.parametrize("path", [CONFIG, SHARDING], ids=lambda p: p.name)
def test_pipelines_reference_declared_components(path):
    config = yaml.safe_load(path.read_text())
    for name, pipeline in config["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"pipeline {name} uses undeclared {kind[:-1]} {component}"


def test_receives_otlp_on_both_transports_and_exports_prometheus():
    config = yaml.safe_load(CONFIG.read_text())
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    assert "prometheus" in config["service"]["pipelines"]["metrics"]["exporters"]
    assert config["exporters"]["prometheus"]["resource_to_telemetry_conversion"]["enabled"] is True


def test_every_fleet_replica_gets_every_nodes_telemetry():
    """A standby replica must hold the whole view to take over as the DeviceTaintRule writer at
    once: one exporter per StatefulSet pod of deploy/kubernetes/fleet, the same settings each."""
    config = yaml.safe_load(CONFIG.read_text())
    fleet = yaml.safe_load((ROOT / "deploy/kubernetes/fleet/30-statefulset.yaml").read_text())
    name, namespace = fleet["metadata"]["name"], fleet["metadata"]["namespace"]
    service = fleet["spec"]["serviceName"]
    wanted = {f"http://{name}-{i}.{service}.{namespace}.svc:4318" for i in range(fleet["spec"]["replicas"])}
    used = [e for e in config["service"]["pipelines"]["metrics"]["exporters"] if e.startswith("otlphttp/fleet")]
    assert {config["exporters"][e]["endpoint"] for e in used} == wanted and len(used) == len(wanted)
    settings = [{k: v for k, v in config["exporters"][e].items() if k != "endpoint"} for e in used]
    assert all(s == settings[0] for s in settings)


def test_sharding_routes_each_node_to_one_replica():
    config = yaml.safe_load(SHARDING.read_text())
    lb = config["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "resource"  # a node's resource never changes: its devices stay on one replica
    assert "dns" in lb["resolver"] and lb["resolver"]["dns"]["port"] == "4317"
