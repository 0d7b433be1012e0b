"""How one NVML call's answer is judged, the same way for every reading of a GPU.

A call that says a field is unsupported (``NOT_SUPPORTED``, ``NO_PERMISSION``, ...) is None, and one
that never changes is not asked again of that GPU; any other NVML error (``GPU_IS_LOST``,
``UNKNOWN``, ...) is the whole device's (:class:`DeviceLost`): its row is NaN this pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: NVML's "unsupported field" answers: the column stays NaN, the device is fine.
FIELD_ERROR_NAMES = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_DATA",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    "NVML_ERROR_DEPRECATED",
)
#: Of those, the ones that never change for a device: skip the call on later passes.
PERMANENT_ERROR_NAMES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_DEPRECATED")
#: The member of a field value's union that holds each nvmlValueType_t.
FIELD_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
#: Per-field answers of nvmlDeviceGetFieldValues that mean "no such counter here", for good: a field id
#: this driver does not know comes back INVALID_ARGUMENT rather than NOT_SUPPORTED.
FIELD_ABSENT_NAMES = (*PERMANENT_ERROR_NAMES, "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_FOUND")
#: nvmlValueType_t of a 64-bit count (NVML_VALUE_TYPE_UNSIGNED_LONG, _UNSIGNED_LONG_LONG, _SIGNED_LONG_LONG).
COUNT_VALUE_TYPE_NAMES = (
    "NVML_VALUE_TYPE_UNSIGNED_LONG",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG",
)


class DeviceLost(Exception):
    """One device failed as a whole this pass; its row is NaN."""


def text(value: str | bytes) -> str:
    """pynvml returns str in current releases and bytes in old ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _codes(nv: Any, names: tuple[str, ...]) -> set[Any]:
    """The codes this pynvml defines for ``names`` (an older one lacks some)."""
    return {getattr(nv, n) for n in names if hasattr(nv, n)}


class NvmlCalls:
    """The calls of one source's GPUs, judged (module docstring); ``unsupported[i]``: what GPU ``i``
    is not asked again."""

    def __init__(self, nv: Any, count: int) -> None:
        self.nv = nv
        self.field_errors = _codes(nv, FIELD_ERROR_NAMES)
        self.permanent_errors = _codes(nv, PERMANENT_ERROR_NAMES)
        self.absent_fields = _codes(nv, FIELD_ABSENT_NAMES)
        self.count_types = _codes(nv, COUNT_VALUE_TYPE_NAMES)
        self.unsupported: list[set[str]] = [set() for _ in range(count)]

    def call(self, i: int, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, or None when the field is unsupported; raises DeviceLost on any other NVML error."""
        if what in self.unsupported[i]:
            return None
        try:
            return fn()
        except self.nv.NVMLError as err:
            code = getattr(err, "value", None)
            if code in self.field_errors:
                if code in self.permanent_errors:
                    self.unsupported[i].add(what)
                return None
            raise DeviceLost(f"{what}: {err}") from err

    def field_value(self, handle: Any, field_id: int) -> float:
        """One NVML field value; raises NOT_SUPPORTED (as NVML would) when the field has none."""
        nv = self.nv
        fv = nv.nvmlDeviceGetFieldValues(handle, [field_id])[0]
        if int(fv.nvmlReturn) != 0:
            raise nv.NVMLError(int(fv.nvmlReturn))
        return float(getattr(fv.value, FIELD_VALUE_MEMBERS[int(fv.valueType)]))
