"""Everything the agent emits is registered in semconv/registry.yaml with the same unit and
instrument, and the registry's upstream entries agree with opentelemetry-semantic-conventions."""

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from opentelemetry.semconv._incubating.metrics import hw_metrics

from otel_dra import conventions as cv
from otel_dra import policy
from otel_dra.classifier import Classifier
from otel_dra.faults import Fault
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from otel_dra.state.board import VerdictBoard
from otel_dra.vocabulary import REASONS
from tests.support.helpers import collect

REGISTRY = Path(__file__).resolve().parents[2] / "semconv" / "registry.yaml"


@pytest.fixture(scope="module")
def registry():
    groups = yaml.safe_load(REGISTRY.read_text())["groups"]
    metrics = {g["metric_name"]: g for g in groups if g["type"] == "metric"}
    attributes = {}
    for g in groups:
        if g["type"] == "attribute_group":
            for a in g["attributes"]:
                attributes[a.get("id") or a["ref"]] = a
    return metrics, attributes


@pytest.fixture(scope="module", params=["metric", "all"])
def emitted(request):
    """Every series the agent can produce: all faults injected (on different devices), the
    verdicts from the classifier, in both --health-attribute modes."""
    faults = tuple(Fault(f"gpu-{i}", r, 0.0) for i, r in enumerate(REASONS) if r not in ("stale", "device_lost"))
    src = SimulatedSource(SimulatorConfig("node-1", devices=len(REASONS), faults=faults, seed=3))
    classifier = Classifier(policy.load(), src.schema, interval_s=10.0)
    board = VerdictBoard()
    for t in range(0, 131, 10):
        frame = src.read(t * 10**9)
        classifier.ingest(frame)
        attrs = {dev: dict(a) for dev, a in zip(frame.devices.ids, frame.devices.attrs, strict=True)}
        board.update(classifier.evaluate(t * 10**9), lambda _node, dev, attrs=attrs: attrs[dev])
    # A second node's view of gpu-0 makes it a shared (network-attached) device.
    seen_elsewhere = replace(next(v for v, _ in board.snapshot() if v.hw_id == "gpu-0"), node="node-2")
    board.update([seen_elsewhere], lambda _node, dev: attrs[dev])
    return collect(frame, src.schema, board=board, health_all=request.param == "all")


def test_every_emitted_metric_is_registered_with_its_unit_and_instrument(registry, emitted):
    metrics, _ = registry
    points, _ = emitted
    seen = {(p.metric, p.unit, p.kind) for p in points}
    assert {m for m, _, _ in seen} == set(cv.METRICS), "the simulator should exercise every declared metric"
    for metric, unit, kind in seen:
        assert metric in metrics, f"{metric} is emitted but not in semconv/registry.yaml"
        assert metrics[metric]["unit"] == unit, metric
        assert metrics[metric]["instrument"] == kind, metric


def test_every_emitted_attribute_is_registered_for_its_metric(registry, emitted):
    metrics, attributes = registry
    points, resource = emitted
    for p in points:
        allowed = {a["ref"] for a in metrics[p.metric]["attributes"]}
        assert set(p.attrs) <= allowed, (p.metric, set(p.attrs) - allowed)
        assert set(p.attrs) <= set(attributes)
    assert {"k8s.node.name", "service.name"} <= set(resource)
    assert resource["k8s.node.name"] == "node-1"


def test_upstream_entries_agree_with_the_semconv_package(registry):
    metrics, _ = registry
    upstream = [m for m in metrics.values() if m["annotations"]["otel_dra"]["origin"] == "upstream"]
    assert upstream
    factories = {
        getattr(hw_metrics, name): getattr(hw_metrics, "create_" + name.lower())
        for name in dir(hw_metrics)
        if name.startswith("HW_") and hasattr(hw_metrics, "create_" + name.lower())
    }
    for entry in upstream:
        name = entry["metric_name"]
        assert name in factories, f"{name} is marked upstream but the semconv package has no such metric"
        spec = cv.upstream(factories[name])
        assert (entry["unit"], entry["instrument"]) == (spec.unit, spec.instrument), name


def test_extensions_are_not_upstream_names_and_match_the_code(registry):
    metrics, attributes = registry
    upstream_names = {getattr(hw_metrics, n) for n in dir(hw_metrics) if n.startswith("HW_")}
    declared = {**cv.METRICS, **cv.FLEET_METRICS, **cv.PUSH_METRICS}
    assert set(metrics) == set(declared), "semconv/registry.yaml and otel_dra.conventions list the same metrics"
    for name, entry in metrics.items():
        origin = entry["annotations"]["otel_dra"]["origin"]
        assert origin == declared[name].origin, name
        if origin == "extension":
            assert name not in upstream_names, f"{name} exists upstream: reference it instead"
            assert (entry["unit"], entry["instrument"]) == (declared[name].unit, declared[name].instrument)
    extensions = (
        cv.HW_LINK_TYPE,
        cv.HW_ERROR_CODE,
        cv.HW_THROTTLE_REASON,
        cv.HW_PCIE_ADDRESS,
        cv.HW_PCIE_UPSTREAM,
        cv.HW_FABRIC_ID,
        cv.DRA_POOL_NAME,
        cv.DRA_DEVICE_NAME,
    )
    for attr in (*extensions, cv.DRA_DEVICE_HEALTH_STATE, cv.DRA_DEVICE_HEALTH_REASONS):
        assert attributes[attr]["annotations"]["otel_dra"]["origin"] == "extension"
