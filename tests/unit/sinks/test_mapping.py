"""Identity rules (README "Metrics", semconv/registry.yaml), as pure functions, and the label names
the Prometheus exporter writes."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_dra.frame import Column, attrs_of
from otel_dra.sinks import provider
from otel_dra.sinks._mapping import prometheus_label, series_attributes

DEVICE = {"hw.type": "gpu", "hw.vendor": "NVIDIA", "dra.device.name": "gpu-2"}


def test_device_series_carry_the_device_identity():
    col = Column("hw.errors", attrs_of({"error.type": "uncorrected"}))
    assert series_attributes("gpu-2", DEVICE, col) == {
        "hw.id": "gpu-2",
        "hw.type": "gpu",
        "hw.vendor": "NVIDIA",
        "dra.device.name": "gpu-2",
        "error.type": "uncorrected",
    }


def test_sensor_series_are_child_components_with_a_parent_and_the_devices_dra_identity():
    """What users filter dashboards by (dra_pool_name, dra_device_name) is on the sensors too; the
    device's descriptive attributes (hw.vendor) are not: they describe the device, not the sensor."""
    col = Column("hw.temperature", attrs_of({"hw.sensor_location": "gpu"}), "temp/gpu", "temperature")
    device = {**DEVICE, "dra.pool.name": "node-1", "dra.driver.name": "gpu.example.com"}
    attrs = series_attributes("gpu-2", device, col)
    assert attrs == {
        "hw.id": "gpu-2/temp/gpu",
        "hw.type": "temperature",
        "hw.parent": "gpu-2",
        "dra.driver.name": "gpu.example.com",
        "dra.pool.name": "node-1",
        "dra.device.name": "gpu-2",
        "hw.sensor_location": "gpu",
    }
    assert "dra.pool.name" not in series_attributes("gpu-2", {"hw.type": "gpu"}, col)  # none known: none added


#: Keys that exercise every rule: dots, a leading digit, runs of unsafe characters, underscores.
LABEL_KEYS = ("hw.id", "dra.device.health.state", "9lives", "a-b/c", "x..y", "a__b", "_lead", "UPPER.case", "k8s.node")


def test_prometheus_label_is_what_the_exporter_writes():
    """Through the exporter's public reader, not its private ``_mapping``: if a release changes how
    it sanitizes keys, this fails before the fleet's own text and the agent's scrape disagree."""
    assert prometheus_label("hw.id") == "hw_id" and prometheus_label("9lives") == "_lives"
    registry = CollectorRegistry()
    mp = provider.build_meter_provider("node-1", [provider.prometheus_reader(registry)], 100)
    gauge = mp.get_meter("t").create_gauge("probe_labels")
    for key in LABEL_KEYS:
        gauge.set(1.0, {key: key})
    text = generate_latest(registry).decode()
    mp.shutdown()
    written = set()
    for family in text_string_to_metric_families(text):
        if family.name == "probe_labels":
            for sample in family.samples:
                written |= {
                    (k, v)
                    for k, v in sample.labels.items()
                    if v and not k.startswith("otel_scope") and k != "k8s_node_name"
                }
    assert written == {(prometheus_label(key), key) for key in LABEL_KEYS}
