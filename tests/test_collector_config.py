"""collector-config.yaml is a well-formed Collector config: every pipeline component is
declared, and the OTLP receiver listens where the agent pushes by default.

(No Collector-contrib binary can be installed here, so this checks structure; the OTLP
path itself is tested end to end against rotel in test_e2e_otlp.py.)"""

from pathlib import Path

import yaml

CONFIG = Path(__file__).resolve().parents[1] / "collector-config.yaml"


def test_pipelines_reference_declared_components():
    config = yaml.safe_load(CONFIG.read_text())
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
