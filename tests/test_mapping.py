"""Identity rules of telemetry.md section 1, as pure functions."""

from otel_dra.frame import Column, attrs_of
from otel_dra.sinks._mapping import series_attributes

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


def test_sensor_series_are_child_components_with_a_parent():
    col = Column("hw.temperature", attrs_of({"hw.sensor_location": "gpu"}), "temp/gpu", "temperature")
    attrs = series_attributes("gpu-2", DEVICE, col)
    assert attrs == {
        "hw.id": "gpu-2/temp/gpu",
        "hw.type": "temperature",
        "hw.parent": "gpu-2",
        "hw.sensor_location": "gpu",
    }
