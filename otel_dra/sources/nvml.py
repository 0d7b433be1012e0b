"""NVIDIA GPUs read through NVML (``pynvml``, from the ``nvidia-ml-py`` package).

Produces the same contract columns as the simulator, one row per GPU, keyed by the
GPU's UUID. Robustness rules, because this runs unattended on production nodes:

* a call that says a field is unsupported (``NOT_SUPPORTED``, ``NO_PERMISSION``, ...)
  leaves that column NaN for that GPU and is not asked again;
* any other NVML error (``GPU_IS_LOST``, ``UNKNOWN``, ...) makes the whole row NaN for
  this pass: the classifier turns a GPU that stays silent into ``device_lost``;
* XID events come from an NVML event set polled on a background thread with a short
  timeout, so a slow or wedged event wait never delays sampling.

How a call's answer is judged is :mod:`otel_dra.sources.nvml_calls`; throttle time
(``hw.throttle.time``, by reason, from the best source each GPU answers) is
:mod:`otel_dra.sources.nvml_throttle`.

Topology is read when GPUs are identified (at start, and when a GPU that failed then joins), never per pass:
it does not change while the driver runs. It gives three descriptive attributes:

* ``hw.pcie.address``: ``nvmlDeviceGetPciInfo``'s ``busId`` (``00000000:41:00.0``), in the kernel's form
  ``0000:41:00.0``.
* ``hw.pcie.upstream``: from sysfs when ``<sysfs root>/bus/pci/devices/<address>`` exists
  (:mod:`otel_dra.sources.pci_topology`, as the sysfs source reads it). Otherwise from
  ``nvmlDeviceGetTopologyCommonAncestor``: GPUs whose common ancestor is at most ``NVML_TOPOLOGY_SINGLE``
  (one board, or one PCIe switch) form a group, named by its smallest member's address. That name is a GPU's
  address, not the switch's, since NVML does not name the switch. A GPU with no such peer gets no upstream.
* ``hw.fabric.id``: from ``nvmlDeviceGetGpuFabricInfoV``, else ``nvmlDeviceGetGpuFabricInfo`` on a driver
  without it. Only once the GPU's fabric registration is ``NVML_GPU_FABRIC_STATE_COMPLETED`` with status
  success, as ``<clusterUuid>/<cliqueId>`` (canonical UUID text). An all-zero ``clusterUuid`` (no multi-node
  fabric) is left out: it would put every node's GPUs in one fabric.

Any of the three that a GPU or driver does not answer is left out.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from otel_dra import conventions as cv
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of
from otel_dra.sources import Probe, SourceUnavailable
from otel_dra.sources.nvml_calls import DeviceLost, NvmlCalls, text
from otel_dra.sources.nvml_throttle import THROTTLE_REASONS, ThrottleClock
from otel_dra.sources.nvml_throttle import slowdown_field_ids as slowdown_field_ids  # (importers use it from here)
from otel_dra.sources.pci_topology import pcie_address, pcie_place
from otel_dra.sources.simulated import driver_error_column

if TYPE_CHECKING:
    from otel_dra.sources import SourceSettings

log = logging.getLogger(__name__)

#: The DRA driver name NVIDIA's k8s-dra-driver-gpu publishes GPUs under.
DRA_DRIVER = "gpu.nvidia.com"
#: How long one event-set wait blocks (ms); close() waits about this long for the thread.
EVENT_WAIT_MS = 200
#: The topology attributes this source sets (module docstring): replaced as a whole when re-read.
TOPOLOGY_ATTRS = (cv.HW_PCIE_ADDRESS, cv.HW_PCIE_UPSTREAM, cv.HW_FABRIC_ID)
#: Fabric info calls, newest first: (structure, function) names in pynvml.
_FABRIC_CALLS = (
    ("c_nvmlGpuFabricInfoV_t", "nvmlDeviceGetGpuFabricInfoV"),
    ("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo"),
)


def _import_pynvml() -> Any:
    import pynvml  # optional dependency: otel-dra[nvidia]

    return pynvml


def nvml_gpus(nvml: Any = None) -> tuple[int, str]:
    """How many GPUs NVML lists (what :class:`NvmlSource` would read: the same init and count), and
    why none when 0; NVML is shut down again."""
    if nvml is None:
        try:
            nvml = _import_pynvml()
        except ImportError:
            return 0, "pynvml is not installed (pip install 'otel-dra[nvidia]')"
    try:
        nvml.nvmlInit()
    except Exception as err:  # NVMLError (library or driver missing), OSError from the loader
        return 0, f"NVML did not load: {err}"
    try:
        count = int(nvml.nvmlDeviceGetCount())
        driver = text(nvml.nvmlSystemGetDriverVersion())
    except Exception as err:
        return 0, f"NVML loaded but could not list GPUs: {err}"
    finally:
        with contextlib.suppress(Exception):  # nothing to do about a failed shutdown of a probe
            nvml.nvmlShutdown()
    if count < 1:
        return 0, "NVML loaded but found no GPU"
    return count, f"{count} NVIDIA GPU(s), driver {driver}"


def nvml_available(nvml: Any = None) -> tuple[bool, str]:
    """Whether NVML loads and sees at least one GPU, and why not (:func:`nvml_gpus` as a yes/no)."""
    count, why = nvml_gpus(nvml)
    return count > 0, why


def _gpu_columns() -> dict[str, Column]:
    """The fixed columns of an NVML GPU, by a short local key (fans and XIDs are added as found)."""
    t, m = "temp/gpu", "temp/memory"
    errors = cv.HW_ERRORS.name
    cols: dict[str, Column] = {
        "temp.gpu": Column(cv.HW_TEMPERATURE.name, attrs_of({cv.HW_SENSOR_LOCATION: "gpu"}), t, "temperature"),
        "temp.memory": Column(cv.HW_TEMPERATURE.name, attrs_of({cv.HW_SENSOR_LOCATION: "memory"}), m, "temperature"),
        "power": Column(cv.HW_POWER.name),
        "power.limit.max": Column(cv.HW_POWER_LIMIT.name, attrs_of({cv.HW_LIMIT_TYPE: "max"})),
        "energy": Column(cv.HW_ENERGY.name),
        "util": Column(cv.HW_GPU_UTILIZATION.name, attrs_of({cv.HW_GPU_TASK: "general"})),
        "mem.usage": Column(cv.HW_GPU_MEMORY_USAGE.name),
        "mem.limit": Column(cv.HW_GPU_MEMORY_LIMIT.name),
        "mem.util": Column(cv.HW_GPU_MEMORY_UTILIZATION.name),
        "errors.corrected": Column(errors, attrs_of({cv.ERROR_TYPE_ATTR: "corrected"})),
        "errors.uncorrected": Column(errors, attrs_of({cv.ERROR_TYPE_ATTR: "uncorrected"})),
        "errors.retired_page": Column(errors, attrs_of({cv.ERROR_TYPE_ATTR: "retired_page"})),
        "errors.link.pcie": Column(errors, attrs_of({cv.ERROR_TYPE_ATTR: "link", cv.HW_LINK_TYPE: "pcie"})),
        "pcie.width": Column(cv.HW_PCIE_LINK_WIDTH.name),
        "pcie.width.limit": Column(cv.HW_PCIE_LINK_WIDTH_LIMIT.name, attrs_of({cv.HW_LIMIT_TYPE: "max"})),
        "pcie.gen": Column(cv.HW_PCIE_LINK_GENERATION.name),
        "pcie.gen.limit": Column(cv.HW_PCIE_LINK_GENERATION_LIMIT.name, attrs_of({cv.HW_LIMIT_TYPE: "max"})),
    }
    for sensor, location, limits in ((t, "gpu", ("high.degraded", "high.critical")), (m, "memory", ("high.degraded",))):
        for limit in limits:
            cols[f"temp.{location}.limit.{limit}"] = Column(
                cv.HW_TEMPERATURE_LIMIT.name,
                attrs_of({cv.HW_SENSOR_LOCATION: location, cv.HW_LIMIT_TYPE: limit}),
                sensor,
                "temperature",
            )
    for reason in THROTTLE_REASONS:
        cols[f"throttle.{reason}"] = Column(cv.HW_THROTTLE_TIME.name, attrs_of({cv.HW_THROTTLE_REASON: reason}))
    return cols


def fan_column(fan: int) -> Column:
    """``hw.fan.speed_ratio`` of fan sensor ``fan/<i>``."""
    return Column(cv.HW_FAN_SPEED_RATIO.name, (), f"fan/{fan}", "fan")


class NvmlSource:
    """The node's NVIDIA GPUs, sampled through NVML; XIDs counted on a background thread."""

    name = "nvml"

    def __init__(
        self, node_name: str, schema: Schema | None = None, nvml: Any = None, sysfs_root: str = "/sys"
    ) -> None:
        self.node_name = node_name
        self.sysfs_root = Path(sysfs_root)
        self.schema = schema if schema is not None else Schema()
        if nvml is None:
            try:
                nvml = _import_pynvml()
            except ImportError:
                raise SourceUnavailable(
                    "--source nvml needs pynvml: pip install 'otel-dra[nvidia]' (or use --source auto)"
                ) from None
        self.nvml = nv = nvml
        self._cols = {key: self.schema.index(col) for key, col in _gpu_columns().items()}
        try:
            nv.nvmlInit()
        except Exception as err:  # NVMLError (library or driver missing), OSError from the loader
            raise SourceUnavailable(
                f"--source nvml: NVML did not load ({err}); is the NVIDIA driver installed? "
                "--source auto tries sysfs next"
            ) from None
        self._closed = False
        try:
            self._driver_version = text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError as err:
            log.warning("nvml: driver version unavailable: %s", err)
            self._driver_version = ""
        self._count = int(nv.nvmlDeviceGetCount())
        self._calls = NvmlCalls(nv, self._count)
        self._throttle = ThrottleClock(self._calls, self._driver_version, self._count)
        self._handles: list[Any] = [None] * self._count
        self._identity: list[dict[str, str] | None] = [None] * self._count
        self._fans: list[list[int] | None] = [None] * self._count
        self._table: DeviceTable | None = None
        for i in range(self._count):
            self._identify(i)
        self._read_topology()
        # XID counts: code -> per-GPU cumulative count, written by the event thread.
        self._xid_lock = threading.Lock()
        self._xids: dict[str, np.ndarray] = {}
        self._by_handle: dict[Any, int] = {}
        self._by_uuid: dict[str, int] = {}
        self._stop = threading.Event()
        self._event_set: Any = None
        self._thread: threading.Thread | None = None
        self._start_events()

    @classmethod
    def probe(cls, config: SourceSettings) -> Probe:
        """The GPUs NVML lists here (:func:`nvml_gpus`, the init and count :meth:`__init__` does)."""
        count, why = nvml_gpus()
        return Probe(cls.name, count, why)

    @classmethod
    def from_config(cls, config: SourceSettings, schema: Schema) -> NvmlSource:
        """The source for ``config``'s node, for :func:`otel_dra.sources.build`."""
        return cls(config.node_name, schema, sysfs_root=config.sysfs_root)

    # -- identity ------------------------------------------------------------------------------
    def _identify(self, i: int) -> bool:
        """Read GPU ``i``'s handle and identity once; a GPU that fails is retried on later passes."""
        nv = self.nvml
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            uuid = text(nv.nvmlDeviceGetUUID(handle))
            name = text(nv.nvmlDeviceGetName(handle))
        except nv.NVMLError as err:
            log.warning("nvml: GPU %d not identified (%s); retrying on the next pass", i, err)
            return False
        attrs = {
            cv.HW_ID: uuid,
            cv.HW_TYPE: "gpu",
            cv.HW_NAME: name,
            cv.HW_VENDOR: "NVIDIA",
            cv.HW_MODEL: name,
            cv.DRA_DRIVER_NAME: DRA_DRIVER,
            cv.DRA_POOL_NAME: self.node_name,
            cv.DRA_DEVICE_NAME: f"gpu-{i}",
        }
        if self._driver_version:
            attrs[cv.HW_DRIVER_VERSION] = self._driver_version
        for attr, getter in (
            (cv.HW_SERIAL_NUMBER, "nvmlDeviceGetSerial"),
            (cv.HW_FIRMWARE_VERSION, "nvmlDeviceGetVbiosVersion"),
        ):
            with contextlib.suppress(nv.NVMLError):  # descriptive only: a GeForce has no serial
                attrs[attr] = text(getattr(nv, getter)(handle))
        self._handles[i] = handle
        self._identity[i] = attrs
        self._table = None
        return True

    # -- topology ------------------------------------------------------------------------------
    def _ask(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, or None when NVML does not answer: topology is descriptive, a GPU goes without it."""
        try:
            return fn(*args)
        except self.nvml.NVMLError as err:
            log.debug("nvml: topology: %s: %s", getattr(fn, "__name__", fn), err)
            return None

    def _fabric(self, handle: Any) -> str | None:
        """``<clusterUuid>/<cliqueId>`` of the GPU's completed NVLink fabric registration (module docstring)."""
        nv = self.nvml
        for struct_name, fn_name in _FABRIC_CALLS:
            try:
                info = getattr(nv, struct_name)()
                getattr(nv, fn_name)(handle, ctypes.byref(info))
            except AttributeError:
                continue  # this pynvml release lacks the call
            except nv.NVMLError as err:
                if getattr(err, "value", None) == getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", None):
                    continue  # this driver lacks the call: the older one may be there
                return None  # NOT_SUPPORTED (no NVSwitch fabric), or the GPU's trouble: no fabric to name
            if int(info.state) != nv.NVML_GPU_FABRIC_STATE_COMPLETED or int(info.status) != nv.NVML_SUCCESS:
                return None
            cluster = uuid.UUID(bytes=bytes(info.clusterUuid))
            return f"{cluster}/{int(info.cliqueId)}" if cluster.int else None
        return None

    def _read_topology(self) -> None:
        """Every identified GPU's topology attributes (module docstring), into its identity."""
        nv = self.nvml
        known = [i for i, ident in enumerate(self._identity) if ident is not None]
        places: dict[int, dict[str, str]] = {i: {} for i in known}
        by_nvml: list[int] = []  # GPUs sysfs does not show: grouped by NVML's common ancestor
        for i in known:
            handle = self._handles[i]
            info = self._ask(nv.nvmlDeviceGetPciInfo, handle)
            address = pcie_address(info.busId) if info is not None else None
            if address is not None:
                places[i][cv.HW_PCIE_ADDRESS] = address
                in_sysfs, upstream = pcie_place(self.sysfs_root / "bus" / "pci" / "devices" / address)
                if upstream is not None:
                    places[i][cv.HW_PCIE_UPSTREAM] = upstream
                elif in_sysfs is None:
                    by_nvml.append(i)
            fabric = self._fabric(handle)
            if fabric is not None:
                places[i][cv.HW_FABRIC_ID] = fabric
        for i, group in self._switch_groups(by_nvml).items():
            places[i][cv.HW_PCIE_UPSTREAM] = min(places[j][cv.HW_PCIE_ADDRESS] for j in group)
        for i, place in places.items():
            ident = self._identity[i]
            if ident is not None:
                for attr in TOPOLOGY_ATTRS:
                    ident.pop(attr, None)
                ident.update(place)
        self._table = None

    def _switch_groups(self, gpus: list[int]) -> dict[int, list[int]]:
        """GPU -> the GPUs behind its switch (itself included), for the GPUs with at least one such peer: the
        connected GPUs where NVML's common ancestor is at most ``NVML_TOPOLOGY_SINGLE``."""
        nv = self.nvml
        single = nv.NVML_TOPOLOGY_SINGLE
        group = {i: [i] for i in gpus}
        for a, i in enumerate(gpus):
            for j in gpus[a + 1 :]:
                if group[i] is group[j]:
                    continue
                level = self._ask(nv.nvmlDeviceGetTopologyCommonAncestor, self._handles[i], self._handles[j])
                if level is not None and int(level) <= single:
                    merged = group[i] + group[j]
                    for k in merged:
                        group[k] = merged
        return {i: members for i, members in group.items() if len(members) > 1}

    def _device_table(self) -> tuple[DeviceTable, list[int]]:
        """The table of identified GPUs and their NVML indices (rebuilt only when one is identified)."""
        identified = [(i, ident) for i, ident in enumerate(self._identity) if ident is not None]
        known = [i for i, _ in identified]
        if self._table is None:
            ids = tuple(ident[cv.HW_ID] for _, ident in identified)
            attrs = tuple({k: v for k, v in ident.items() if k != cv.HW_ID} for _, ident in identified)
            self._table = DeviceTable(node=self.node_name, ids=ids, attrs=attrs)
        return self._table, known

    # -- XID events ----------------------------------------------------------------------------
    @staticmethod
    def _handle_key(handle: Any) -> Any:
        """A hashable key for a handle: the pointer value for ctypes handles, else the object."""
        try:
            address = ctypes.cast(handle, ctypes.c_void_p).value
        except (ctypes.ArgumentError, TypeError):
            return handle
        return handle if address is None else address

    def _start_events(self) -> None:
        nv = self.nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as err:
            log.warning("nvml: no event set, XIDs will not be counted: %s", err)
            return
        registered = 0
        for i, handle in enumerate(self._handles):
            if handle is None:
                continue
            self._by_handle[self._handle_key(handle)] = i
            ident = self._identity[i]
            if ident is not None:  # a GPU with a handle was identified when it was opened
                self._by_uuid[ident[cv.HW_ID]] = i
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._event_set)
                registered += 1
            except nv.NVMLError as err:
                log.warning("nvml: GPU %d: XID events unavailable: %s", i, err)
        if not registered:
            self._free_event_set()
            return
        self._thread = threading.Thread(target=self._event_loop, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def _event_loop(self) -> None:
        nv = self.nvml
        timeout = getattr(nv, "NVML_ERROR_TIMEOUT", 10)
        while not self._stop.is_set():
            try:
                event = nv.nvmlEventSetWait_v2(self._event_set, EVENT_WAIT_MS)
            except nv.NVMLError as err:
                if getattr(err, "value", None) != timeout:
                    log.warning("nvml: event wait failed: %s", err)
                    self._stop.wait(1.0)  # don't spin on a broken event set
                continue
            except Exception:
                log.exception("nvml: event wait crashed")
                self._stop.wait(1.0)
                continue
            if int(event.eventType) & int(nv.nvmlEventTypeXidCriticalError):
                self._count_xid(event)

    def _count_xid(self, event: Any) -> None:
        row = self._by_handle.get(self._handle_key(event.device))
        if row is None:
            try:
                row = self._by_uuid.get(text(self.nvml.nvmlDeviceGetUUID(event.device)))
            except self.nvml.NVMLError:
                row = None
        code = str(int(event.eventData))
        if row is None:
            log.warning("nvml: XID %s from an unknown GPU, not counted", code)
            return
        ident = self._identity[row]
        log.warning("nvml: GPU %d (%s): XID %s", row, ident[cv.HW_ID] if ident else "unidentified", code)
        with self._xid_lock:
            self._xids.setdefault(code, np.zeros(self._count))[row] += 1.0

    def _free_event_set(self) -> None:
        if self._event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._event_set)
            except self.nvml.NVMLError as err:
                log.warning("nvml: event set free failed: %s", err)
            self._event_set = None

    # -- sampling ------------------------------------------------------------------------------
    def _read_device(self, i: int, row: dict[int, float], now_ns: int) -> None:
        """Fill one GPU's row (column index -> value); unsupported fields stay out (NaN)."""
        nv, h, k = self.nvml, self._handles[i], self._cols

        def put(key: str, value: float | None, scale: float = 1.0) -> None:
            if value is not None:
                row[k[key]] = float(value) * scale

        call = functools.partial(self._calls.call, i)
        put("temp.gpu", call("temp", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
        th = nv.nvmlDeviceGetTemperatureThreshold
        put("temp.gpu.limit.high.degraded", call("t.slow", lambda: th(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)))
        put("temp.gpu.limit.high.critical", call("t.shut", lambda: th(h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)))
        put("temp.memory", call("temp.mem", lambda: self._calls.field_value(h, nv.NVML_FI_DEV_MEMORY_TEMP)))
        put("temp.memory.limit.high.degraded", call("t.mem", lambda: th(h, nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)))
        put("power", call("power", lambda: nv.nvmlDeviceGetPowerUsage(h)), 1e-3)  # mW
        put("power.limit.max", call("power.limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h)), 1e-3)
        put("energy", call("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)), 1e-3)  # mJ
        util = call("util", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        put("util", None if util is None else util.gpu, 0.01)  # percent
        mem = call("mem", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            put("mem.usage", mem.used)
            put("mem.limit", mem.total)
            put("mem.util", mem.used / mem.total if mem.total else None)
        ecc = nv.nvmlDeviceGetTotalEccErrors
        put(
            "errors.corrected", call("ecc.c", lambda: ecc(h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC))
        )
        put(
            "errors.uncorrected",
            call("ecc.u", lambda: ecc(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
        )
        put("errors.retired_page", self._retired(i, h))
        put("errors.link.pcie", call("replay", lambda: nv.nvmlDeviceGetPcieReplayCounter(h)))
        put("pcie.width", call("pcie.w", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)))
        put("pcie.width.limit", call("pcie.wmax", lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h)))
        put("pcie.gen", call("pcie.g", lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)))
        put("pcie.gen.limit", call("pcie.gmax", lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h)))
        for reason, seconds in self._throttle.seconds(i, h, now_ns).items():
            put(f"throttle.{reason}", seconds)
        for fan, speed in self._fan_speeds(i, h):
            row[self.schema.index(fan_column(fan))] = speed / 100.0

    def _retired(self, i: int, h: Any) -> float | None:
        """Retired pages (pre-Ampere) plus remapped rows (Ampere and later): whichever the GPU has."""
        nv = self.nvml
        total: float | None = None
        for cause in (
            nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        ):
            pages = self._calls.call(i, f"retired.{cause}", functools.partial(nv.nvmlDeviceGetRetiredPages, h, cause))
            if pages is not None:
                total = (total or 0.0) + len(pages)
        rows = self._calls.call(i, "remapped", lambda: nv.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            corrected, uncorrected = rows[0], rows[1]
            total = (total or 0.0) + corrected + uncorrected
        return total

    def _fan_speeds(self, i: int, h: Any) -> list[tuple[int, float]]:
        """(fan, percent) of each fan that answers; passively cooled GPUs have none."""
        nv = self.nvml
        if self._fans[i] is None:
            count = self._calls.call(i, "fans", lambda: nv.nvmlDeviceGetNumFans(h))
            self._fans[i] = list(range(int(count or 0)))
        out = []
        for fan in self._fans[i] or ():
            speed = self._calls.call(i, f"fan.{fan}", functools.partial(nv.nvmlDeviceGetFanSpeed_v2, h, fan))
            if speed is not None:
                out.append((fan, float(speed)))
        return out

    def read(self, now_unix_nano: int) -> Frame:
        """One pass over every GPU; a GPU that fails as a whole gets a NaN row, the rest report."""
        joined = [i for i in range(self._count) if self._identity[i] is None and self._identify(i)]
        if joined:
            self._read_topology()
        table, known = self._device_table()
        with self._xid_lock:
            xids = {code: counts.copy() for code, counts in self._xids.items()}
        xid_cols = {code: self.schema.index(driver_error_column(code)) for code in xids}
        rows: list[dict[int, float]] = []
        for r, i in enumerate(known):
            row: dict[int, float] = {}
            try:
                self._read_device(i, row, now_unix_nano)
            except DeviceLost as err:
                log.warning("nvml: GPU %d (%s) not read: %s", i, table.ids[r], err)
                row = {}
                self._throttle.restart(i)
            except Exception:  # a bug or an odd binding must not stop the other GPUs or the loop
                log.exception("nvml: GPU %d (%s) read failed", i, table.ids[r])
                row = {}
                self._throttle.restart(i)
            else:
                for code, counts in xids.items():
                    row[xid_cols[code]] = float(counts[i])
            rows.append(row)
        values = np.full((len(known), len(self.schema)), np.nan)  # after the pass: fans add columns
        for r, row in enumerate(rows):
            if row:
                values[r, list(row)] = list(row.values())
        return Frame(now_unix_nano, table, values)

    def close(self) -> None:
        """Stop the event thread, free the event set and shut NVML down; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0 + EVENT_WAIT_MS / 1000.0)
            if self._thread.is_alive():
                log.warning("nvml: event thread still waiting; leaving the event set allocated")
                self._event_set = None
        self._free_event_set()
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as err:
            log.warning("nvml: shutdown failed: %s", err)
