"""Pure translations from the columnar model to OpenTelemetry series attributes.

Kept free of servers and SDK state (as the Prometheus exporter keeps its
``_mapping.py``) so the identity rules of telemetry.md section 1 can be tested alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_dra import conventions as cv
from otel_dra.frame import Column


def series_attributes(device_id: str, device_attrs: Mapping[str, str], column: Column) -> dict[str, str]:
    """Attributes of one device's series for ``column``.

    Device series carry the device's identity and descriptive attributes; sensor
    series are child components: their own ``hw.id``, their ``hw.type`` and
    ``hw.parent`` pointing at the device.
    """
    if column.sensor is None:
        return {cv.HW_ID: device_id, **device_attrs, **dict(column.attrs)}
    assert column.sensor_type is not None
    return {
        cv.HW_ID: f"{device_id}/{column.sensor}",
        cv.HW_TYPE: column.sensor_type,
        cv.HW_PARENT: device_id,
        **dict(column.attrs),
    }


def series_per_device(columns_per_metric: int, dynamic_headroom: int = 32) -> int:
    """Upper bound of one metric's series per device, with room for series born at run time
    (a driver error code seen for the first time)."""
    return columns_per_metric + dynamic_headroom
