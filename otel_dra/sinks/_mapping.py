"""Pure translations from the columnar model to OpenTelemetry series attributes, and from
attribute keys to Prometheus label names.

Kept free of servers and SDK state (as the Prometheus exporter keeps its ``_mapping.py``) so the
identity rules (every series carries the device's ``hw.id``; a sensor's series carry ``hw.parent``
and the device's DRA identity: README "Metrics", ``semconv/registry.yaml``) can be tested alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from otel_dra import conventions as cv
from otel_dra.frame import Column

#: The device's DRA identity, which its sensors' series carry too.
DRA_IDENTITY = (cv.DRA_DRIVER_NAME, cv.DRA_POOL_NAME, cv.DRA_DEVICE_NAME)


def series_attributes(device_id: str, device_attrs: Mapping[str, str], column: Column) -> dict[str, str]:
    """Attributes of one device's series for ``column``.

    Device series carry the device's identity and descriptive attributes; sensor
    series are child components: their own ``hw.id``, their ``hw.type`` and
    ``hw.parent`` pointing at the device, and the device's DRA identity (``dra.*``),
    which is what dashboards and alerts filter by.
    """
    if column.sensor is None:
        return {cv.HW_ID: device_id, **device_attrs, **dict(column.attrs)}
    assert column.sensor_type is not None
    return {
        cv.HW_ID: f"{device_id}/{column.sensor}",
        cv.HW_TYPE: column.sensor_type,
        cv.HW_PARENT: device_id,
        **{k: device_attrs[k] for k in DRA_IDENTITY if k in device_attrs},
        **dict(column.attrs),
    }


def series_per_device(columns_per_metric: int, dynamic_headroom: int = 32) -> int:
    """Upper bound of one metric's series per device, with room for series born at run time
    (a driver error code seen for the first time)."""
    return columns_per_metric + dynamic_headroom


#: What the exporter replaces in an attribute key: every run of characters outside ``[a-zA-Z0-9]``.
_LABEL_UNSAFE = re.compile(r"[^a-zA-Z0-9]+")


def prometheus_label(key: str) -> str:
    """An attribute key as the OpenTelemetry Prometheus exporter writes it as a label name
    (``hw.id`` → ``hw_id``; a leading digit becomes ``_``).

    Restated from the exporter's private ``_mapping.sanitize_attribute`` so that a sink rendering its
    own text (:mod:`otel_dra.sinks.verdict_text`) does not import a private API that can change in
    any 0.x release; tests/unit/sinks/test_mapping.py holds it to what the exporter's public reader writes.
    """
    if key and key[0].isdigit():
        key = "_" + key[1:]
    return _LABEL_UNSAFE.sub("_", key)
