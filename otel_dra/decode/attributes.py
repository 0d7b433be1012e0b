"""Which attributes the decoders read, and how their values are kept (``semconv/registry.yaml``)."""

from __future__ import annotations

import sys
from typing import Final

from otel_dra import conventions as cv

#: The resource attribute that names a point's node (one Frame per node and time).
NODE: Final = cv.K8S_NODE_NAME_ATTR

#: Descriptive attributes of a device, taken from its own points into ``DeviceTable.attrs``.
DESCRIPTIVE: Final[tuple[str, ...]] = (
    cv.HW_TYPE,
    cv.HW_NAME,
    cv.HW_VENDOR,
    cv.HW_MODEL,
    cv.HW_SERIAL_NUMBER,
    cv.HW_FIRMWARE_VERSION,
    cv.HW_DRIVER_VERSION,
    cv.HW_PCIE_ADDRESS,
    cv.HW_PCIE_UPSTREAM,
    cv.HW_FABRIC_ID,
    cv.DRA_DRIVER_NAME,
    cv.DRA_POOL_NAME,
    cv.DRA_DEVICE_NAME,
)
#: Attributes that say which series it is, not which kind: never part of a Column's attrs (which are the
#: metric's ``conventions.SERIES_ATTRIBUTES`` only).
NOT_COLUMN_ATTRS: Final = frozenset({cv.HW_ID, cv.HW_PARENT, *DESCRIPTIVE})
NO_ATTRIBUTES: Final[frozenset[str]] = frozenset()
#: Per sampled metric, every point attribute that is read: identity, descriptive, the metric's series attributes.
#: A point with any other is taken and that attribute ignored (counted: :attr:`DecodeResult.stray`).
READ_ATTRIBUTES: Final[dict[str, frozenset[str]]] = {
    metric: NOT_COLUMN_ATTRS | cv.SERIES_ATTRIBUTES.get(metric, NO_ATTRIBUTES) for metric in cv.SAMPLED_METRICS
}

#: Attributes whose value is one device's own: not interned (a string of its own, and no entry in the
#: interpreter's table of interned strings, for each of 100,000 devices).
_OWN_VALUES: Final = frozenset({cv.HW_SERIAL_NUMBER})


def intern(key: str, value: str) -> str:
    """An attribute's value, interned unless it is one device's own (its serial number): a fleet's devices
    repeat their models, vendors, versions, pool and node names, and what a device keeps of its attributes
    (the series index's descriptive sets) then shares one string per value; a device's ``hw.id`` and its DRA
    device name, often equal, are one string."""
    return value if key in _OWN_VALUES else sys.intern(value)
