"""A fake ``pynvml`` for tests: the functions NvmlSource calls, over per-GPU state a test sets.

Errors are the real ``pynvml.NVMLError`` classes with the real codes, so the source's error
handling is exercised exactly as on a node. Units are NVML's (mW, mJ, percent, ns). Structures are
pynvml's own: ``nvmlDeviceGetFieldValues`` returns a ctypes array of ``c_nvmlFieldValue_t`` (a field
the GPU lacks answers in its ``nvmlReturn``, the call itself succeeds), ``nvmlDeviceGetViolationStatus``
a ``c_nvmlViolationTime_t``, the clock-event reasons an int bitmask (pynvml returns ``c_ulonglong.value``),
and a function the driver lacks raises FUNCTION_NOT_FOUND as pynvml's ``_nvmlGetFunctionPointer`` does.
Topology answers are recorded ones: ``nvmlDeviceGetPciInfo`` an ``nvmlPciInfo_t`` (``busId`` bytes in NVML's
``%08X:%02X:%02X.0``), ``nvmlDeviceGetTopologyCommonAncestor`` an ``NVML_TOPOLOGY_*`` level, and the fabric calls
fill the ``c_nvmlGpuFabricInfo*_t`` the caller passes by reference, checking its ``version`` as the driver does.
"""

from __future__ import annotations

import collections
import ctypes
import queue
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
from pynvml import (  # noqa: F401 - re-exported: the source reads them off the module it is given
    NVML_DEVICE_PCI_BUS_ID_FMT,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NO_DATA,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNKNOWN,
    NVML_FI_DEV_MEMORY_TEMP,
    NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT,
    NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
    NVML_FI_DEV_PERF_POLICY_POWER,
    NVML_FI_DEV_PERF_POLICY_RELIABILITY,
    NVML_FI_DEV_PERF_POLICY_SYNC_BOOST,
    NVML_FI_DEV_PERF_POLICY_THERMAL,
    NVML_GPU_FABRIC_STATE_COMPLETED,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    NVML_PERF_POLICY_BOARD_LIMIT,
    NVML_PERF_POLICY_LOW_UTILIZATION,
    NVML_PERF_POLICY_POWER,
    NVML_PERF_POLICY_RELIABILITY,
    NVML_PERF_POLICY_SYNC_BOOST,
    NVML_PERF_POLICY_THERMAL,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
    NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    NVML_TOPOLOGY_HOSTBRIDGE,
    NVML_TOPOLOGY_SINGLE,
    NVML_VALUE_TYPE_UNSIGNED_INT,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
    NVML_VOLATILE_ECC,
    NVMLError,
    c_nvmlFieldValue_t,
    c_nvmlGpuFabricInfo_t,
    c_nvmlGpuFabricInfo_v3_t,
    c_nvmlGpuFabricInfoV_t,
    c_nvmlViolationTime_t,
    nvmlEventTypeXidCriticalError,
    nvmlGpuFabricInfo_v2,
    nvmlGpuFabricInfo_v3,
    nvmlPciInfo_t,
)

#: The perf-policy time counters as field values: nvml.h's nvmlDeviceGetViolationStatus translation
#: table (NVML_PERF_POLICY_POWER -> NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP = 74, ...): one count.
POLICY_FIELDS = {
    NVML_FI_DEV_PERF_POLICY_POWER: NVML_PERF_POLICY_POWER,
    NVML_FI_DEV_PERF_POLICY_THERMAL: NVML_PERF_POLICY_THERMAL,
    NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: NVML_PERF_POLICY_SYNC_BOOST,
    NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: NVML_PERF_POLICY_BOARD_LIMIT,
    NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: NVML_PERF_POLICY_LOW_UTILIZATION,
    NVML_FI_DEV_PERF_POLICY_RELIABILITY: NVML_PERF_POLICY_RELIABILITY,
}


@dataclass
class FakeGpu:
    """One GPU's state, in NVML units. ``fail`` raises that NVML code from every call;
    ``unsupported`` names functions (``nvmlDeviceGet...``) that answer NOT_SUPPORTED."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1654123456789"
    vbios: str = "96.00.99.00.01"
    temp: int = 45
    mem_temp: int = 50
    slowdown: int = 87
    shutdown: int = 92
    mem_max: int = 95
    power_mw: int = 350_000
    power_limit_mw: int = 700_000
    energy_mj: int = 5_000_000_000
    util_pct: int = 60
    mem_used: int = 20 << 30
    mem_total: int = 80 << 30
    ecc_corrected: int = 3
    ecc_uncorrected: int = 0
    retired: tuple[int, int] = (0, 0)  # pages by cause (single-bit, double-bit)
    remapped: tuple[int, int, int, int] = (1, 0, 0, 0)  # corrected, uncorrected, pending, failure
    replays: int = 2
    width: tuple[int, int] = (16, 16)  # current, max
    gen: tuple[int, int] = (5, 5)
    violation_ns: dict[int, int] = field(
        default_factory=lambda: {
            NVML_PERF_POLICY_THERMAL: 2_000_000_000,
            NVML_PERF_POLICY_POWER: 5_000_000_000,
            NVML_PERF_POLICY_SYNC_BOOST: 0,
            NVML_PERF_POLICY_BOARD_LIMIT: 1_000_000_000,
            NVML_PERF_POLICY_RELIABILITY: 500_000_000,
        }
    )
    # Clock-event reasons: the bitmask nvmlDeviceGetCurrentClocksEventReasons answers now, and the
    # driver's other time counters (ns) by field id, in the numbering of the driver the test models
    # (the slowdown counters: 269-271 from driver 580.82, 251-253 on 575 and 580.65). The perf-policy
    # fields (74-79) answer violation_ns unless set here; any other id answers NOT_SUPPORTED.
    clock_reasons: int = 0
    counters_ns: dict[int, int] = field(default_factory=lambda: {269: 2_000_000_000, 270: 0, 271: 0})
    field_types: dict[int, int] = field(default_factory=dict)  # valueType other than unsigned long long
    field_errors: dict[int, int] = field(default_factory=dict)  # a field's nvmlReturn other than success
    fans_pct: list[int] = field(default_factory=list)
    # Topology: NVML's busId ("" = FakeNvml numbers the GPUs 00000000:18:00.0, 00000000:19:00.0, ...); the PCIe
    # switch it sits behind (GPUs behind one answer NVML_TOPOLOGY_SINGLE, others HOSTBRIDGE); its fabric
    # registration (clusterUuid, cliqueId, state, status), None: the fabric calls answer NOT_SUPPORTED.
    bus_id: str = ""
    switch: str | None = None
    fabric: tuple[bytes, int, int, int] | None = None
    fail: int | None = None
    unsupported: set[str] = field(default_factory=set)
    calls: int = 0
    called: collections.Counter[str] = field(default_factory=collections.Counter)  # by function name
    fields_asked: list[int] = field(default_factory=list)

    def field_counter(self, fid: int) -> int | None:
        """What the driver counts in field ``fid`` (ns), None when it has no such field."""
        if fid in self.counters_ns:
            return self.counters_ns[fid]
        policy = POLICY_FIELDS.get(fid)
        return None if policy is None else self.violation_ns.get(policy)


class FakeHandle:
    """An opaque device handle, like pynvml's pointer (hashable by identity)."""

    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """Module-like stand-in for ``pynvml``: constants as attributes, functions as methods.

    ``hidden`` names attributes this pynvml release lacks (an older nvidia-ml-py); ``driver_lacks``
    names functions the driver's libnvidia-ml lacks (pynvml raises FUNCTION_NOT_FOUND for them)."""

    NVMLError = NVMLError
    c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfoV_t
    hidden: frozenset[str] = frozenset()

    def __getattribute__(self, name: str) -> Any:
        if name in object.__getattribute__(self, "hidden"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def __init__(self, gpus: list[FakeGpu], driver: str = "580.95.05") -> None:
        self.driver_lacks: set[str] = set()
        self.gpus = gpus
        self.driver = driver
        self.init_count = 0
        self.shutdowns = 0
        self.init_error: int | None = None
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: set[int] = set()
        self.waits = 0
        self.freed = False
        self._lock = threading.Lock()
        self.handles = [FakeHandle(i) for i in range(len(gpus))]
        #: Recorded common-ancestor answers by pair of GPU indices, over the one ``switch`` implies.
        self.ancestors: dict[frozenset[int], int] = {}
        for i, gpu in enumerate(gpus):
            gpu.bus_id = gpu.bus_id or NVML_DEVICE_PCI_BUS_ID_FMT % (0, 0x18 + i, 0)
        for name in dir(pynvml):  # every constant, as the real module has them
            if name.startswith(("NVML_", "nvmlEventType", "nvmlClocks")) and not hasattr(self, name):
                setattr(self, name, getattr(pynvml, name))

    # -- test controls -----------------------------------------------------------------------
    def emit_xid(self, index: int, code: int, by_uuid: bool = False) -> None:
        """Deliver an XID critical-error event for GPU ``index``, as the driver would."""
        self.events.put(
            SimpleNamespace(
                device=FakeHandle(index) if by_uuid else self.handles[index],
                eventType=nvmlEventTypeXidCriticalError,
                eventData=code,
            )
        )

    def _gpu(self, handle: FakeHandle, fn: str) -> FakeGpu:
        gpu = self.gpus[handle.index]
        with self._lock:
            gpu.calls += 1
            gpu.called[fn] += 1
        if fn in self.driver_lacks:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if gpu.fail is not None:
            raise NVMLError(gpu.fail)
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # -- library -----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._gpu(self.handles[index], "nvmlDeviceGetHandleByIndex")
        return self.handles[index]

    # -- identity ----------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: FakeHandle) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetSerial(self, h: FakeHandle) -> str:
        return self._gpu(h, "nvmlDeviceGetSerial").serial

    def nvmlDeviceGetVbiosVersion(self, h: FakeHandle) -> str:
        return self._gpu(h, "nvmlDeviceGetVbiosVersion").vbios

    # -- topology ----------------------------------------------------------------------------
    def nvmlDeviceGetPciInfo(self, h: FakeHandle) -> Any:
        gpu = self._gpu(h, "nvmlDeviceGetPciInfo")
        domain, bus, rest = gpu.bus_id.split(":")
        info = nvmlPciInfo_t()
        info.busId = info.busIdLegacy = gpu.bus_id.encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        return info

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: FakeHandle, h2: FakeHandle) -> int:
        a, b = (
            self._gpu(h1, "nvmlDeviceGetTopologyCommonAncestor"),
            self._gpu(h2, "nvmlDeviceGetTopologyCommonAncestor"),
        )
        recorded = self.ancestors.get(frozenset((h1.index, h2.index)))
        if recorded is not None:
            return recorded
        return NVML_TOPOLOGY_SINGLE if a.switch is not None and a.switch == b.switch else NVML_TOPOLOGY_HOSTBRIDGE

    def _fill_fabric(self, h: FakeHandle, fn: str, info: Any) -> int:
        gpu = self._gpu(h, fn)
        if gpu.fabric is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        cluster, clique, state, status = gpu.fabric
        ctypes.memmove(info.clusterUuid, cluster, len(cluster))
        info.cliqueId, info.state, info.status = clique, state, status
        return NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, h: FakeHandle, ref: Any) -> int:
        """As the driver: the structure's ``version`` says which layout the caller passed."""
        info = ref._obj  # pynvml's callers pass ctypes.byref(structure)
        layouts = {nvmlGpuFabricInfo_v2: c_nvmlGpuFabricInfoV_t, nvmlGpuFabricInfo_v3: c_nvmlGpuFabricInfo_v3_t}
        if not isinstance(info, layouts.get(int(info.version), ())):
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self._fill_fabric(h, "nvmlDeviceGetGpuFabricInfoV", info)

    def nvmlDeviceGetGpuFabricInfo(self, h: FakeHandle, ref: Any) -> int:
        info = ref._obj
        assert isinstance(info, c_nvmlGpuFabricInfo_t)
        return self._fill_fabric(h, "nvmlDeviceGetGpuFabricInfo", info)

    # -- readings ----------------------------------------------------------------------------
    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return self._gpu(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetTemperatureThreshold(self, h: FakeHandle, threshold: int) -> int:
        gpu = self._gpu(h, "nvmlDeviceGetTemperatureThreshold")
        by = {
            NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: gpu.slowdown,
            NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: gpu.shutdown,
            NVML_TEMPERATURE_THRESHOLD_MEM_MAX: gpu.mem_max,
        }
        if threshold not in by:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return by[threshold]

    def nvmlDeviceGetFieldValues(self, h: FakeHandle, field_ids: list[Any]) -> Any:
        """A ``c_nvmlFieldValue_t`` array, filled as pynvml's nvmlDeviceGetFieldValues and the driver do."""
        gpu = self._gpu(h, "nvmlDeviceGetFieldValues")
        values = (c_nvmlFieldValue_t * len(field_ids))()
        now_us = time.time_ns() // 1000
        for fv, requested in zip(values, field_ids, strict=True):
            try:
                (fv.fieldId, fv.scopeId) = requested
            except TypeError:
                fv.fieldId = requested
            fid = int(fv.fieldId)
            gpu.fields_asked.append(fid)
            fv.timestamp, fv.latencyUsec = now_us, 0
            count = gpu.field_counter(fid)
            if fid in gpu.field_errors:
                fv.nvmlReturn = gpu.field_errors[fid]
            elif fid == NVML_FI_DEV_MEMORY_TEMP and "memory_temp" not in gpu.unsupported:
                fv.nvmlReturn, fv.valueType, fv.value.uiVal = NVML_SUCCESS, NVML_VALUE_TYPE_UNSIGNED_INT, gpu.mem_temp
            elif count is not None:
                fv.nvmlReturn = NVML_SUCCESS
                fv.valueType = gpu.field_types.get(fid, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
                member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[fv.valueType]
                setattr(fv.value, member, count)
            else:
                fv.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> Any:
        return SimpleNamespace(gpu=self._gpu(h, "nvmlDeviceGetUtilizationRates").util_pct, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle) -> Any:
        gpu = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=gpu.mem_total, used=gpu.mem_used, free=gpu.mem_total - gpu.mem_used)

    def nvmlDeviceGetTotalEccErrors(self, h: FakeHandle, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        assert counter_type == NVML_VOLATILE_ECC
        return gpu.ecc_corrected if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc_uncorrected

    def nvmlDeviceGetRetiredPages(self, h: FakeHandle, cause: int) -> list[int]:
        gpu = self._gpu(h, "nvmlDeviceGetRetiredPages")
        n = gpu.retired[0 if cause == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS else 1]
        return [0x1000 * k for k in range(n)]

    def nvmlDeviceGetRemappedRows(self, h: FakeHandle) -> tuple[int, int, int, int]:
        return self._gpu(h, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").replays

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").width[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").width[1]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").gen[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").gen[1]

    def nvmlDeviceGetViolationStatus(self, h: FakeHandle, policy: int) -> Any:
        gpu = self._gpu(h, "nvmlDeviceGetViolationStatus")
        if policy not in gpu.violation_ns:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return c_nvmlViolationTime_t(referenceTime=time.time_ns() // 1000, violationTime=gpu.violation_ns[policy])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_reasons

    def nvmlDeviceGetNumFans(self, h: FakeHandle) -> int:
        return len(self._gpu(h, "nvmlDeviceGetNumFans").fans_pct)

    def nvmlDeviceGetFanSpeed_v2(self, h: FakeHandle, fan: int) -> int:
        return self._gpu(h, "nvmlDeviceGetFanSpeed_v2").fans_pct[fan]

    # -- events ------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: FakeHandle, event_types: int, event_set: Any) -> None:
        self._gpu(h, "nvmlDeviceRegisterEvents")
        assert event_types & nvmlEventTypeXidCriticalError
        self.registered.add(h.index)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self.waits += 1
        try:
            return self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.freed = True
