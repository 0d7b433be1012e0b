"""NVIDIA GPUs read through NVML (``pynvml``, from the ``nvidia-ml-py`` package).

Produces the same contract columns as the simulator, one row per GPU, keyed by the
GPU's UUID. Robustness rules, because this runs unattended on production nodes:

* a call that says a field is unsupported (``NOT_SUPPORTED``, ``NO_PERMISSION``, ...)
  leaves that column NaN for that GPU and is not asked again;
* any other NVML error (``GPU_IS_LOST``, ``UNKNOWN``, ...) makes the whole row NaN for
  this pass: the classifier turns a GPU that stays silent into ``device_lost``;
* XID events come from an NVML event set polled on a background thread with a short
  timeout, so a slow or wedged event wait never delays sampling.

Throttle time (``hw.throttle.time``, seconds, by ``hw.throttle.reason``) comes from NVML's clock-event
reasons, per reason from the best source the GPU answers, decided on its first read (a source that
answers NOT_SUPPORTED is not asked again):

1. **the driver's time counters** (ns, cumulative): ``nvmlDeviceGetFieldValues`` with
   ``NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP`` (= ``NVML_FI_DEV_PERF_POLICY_POWER``, 74) for
   ``power_cap``; ``..._SW_THERM_SLOWDOWN`` (else ``NVML_FI_DEV_PERF_POLICY_THERMAL``, 75) for
   ``thermal``; ``..._HW_THERM_SLOWDOWN`` for ``hw_slowdown``; ``..._HW_POWER_BRAKE_SLOWDOWN`` for
   ``power_brake``; ``..._SYNC_BOOST`` (76), ``NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT`` (77) and
   ``..._RELIABILITY`` (79) summed into ``other``. The three slowdown counters exist from driver
   575 on, and NVIDIA renumbered them: 251-253 in the nvml.h of CUDA 12.9 and 13.0 (drivers 575 and
   580.65), 269-271 from nvidia-ml-py 13.580.82 and the nvml.h of CUDA 13.1 on, which gave 251-268
   back to power smoothing. A pynvml constant says what the header pynvml was built from, not what the
   driver answers, so the ids are chosen by the driver's version (:data:`_SLOWDOWN_FIELD_IDS`), and a
   reply that is not a 64-bit count is not taken for one;
2. where a perf-policy field is not answered, **the violation-time getter**
   ``nvmlDeviceGetViolationStatus`` (ns; deprecated since NVML 13.0, "use field values": its
   policies are those same counters, ``NVML_PERF_POLICY_POWER`` -> ``..._SW_POWER_CAP``). The power
   policy's violation time is the software power cap, so it is ``power_cap``; nothing is emitted as
   ``power`` (a cap whose cause is unknown), and no time is read from both a field and a policy;
3. for every reason bit no counter times, **the current reasons bitmask**
   (``nvmlDeviceGetCurrentClocksEventReasons``, before driver 535 and in older pynvml
   ``nvmlDeviceGetCurrentClocksThrottleReasons``), sampled at each read: the reasons seen at one read
   are credited with the time to the next (the first read is a baseline; a failed read starts a new
   one), into a cumulative counter per reason. Bits: software power cap (0x4) -> ``power_cap``;
   software thermal slowdown (0x20) -> ``thermal``; hardware power brake (0x80) -> ``power_brake``;
   hardware slowdown (0x8) and hardware thermal slowdown (0x40) -> ``hw_slowdown``; sync boost (0x10),
   applications clocks (0x2), display clock (0x100), board limit (0x200), reliability (0x400) ->
   ``other``. GPU idle (0x1) is not throttling and never counts. NVML sets the generic hardware
   slowdown bit with the power-brake and hardware-thermal bits, so a braked sample is ``power_brake``
   only and a hardware-thermal one counts once. The generic bit alone (a power "fast trigger", per
   nvml.h) has no counter, so it is sampled even where the other counters exist.

Where two causes run at once each counts its time (as NVML's own counters do). A reason whose sources
all fail for a read is NaN for that read; one with no source on the GPU stays NaN.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from otel_dra import conventions as cv
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of
from otel_dra.sources import Probe, SourceUnavailable
from otel_dra.sources.simulated import driver_error_column

if TYPE_CHECKING:
    from otel_dra.sources import SourceSettings

log = logging.getLogger(__name__)

#: The DRA driver name NVIDIA's k8s-dra-driver-gpu publishes GPUs under.
DRA_DRIVER = "gpu.nvidia.com"
#: How long one event-set wait blocks (ms); close() waits about this long for the thread.
EVENT_WAIT_MS = 200
#: NVML's "unsupported field" answers: the column stays NaN, the device is fine.
_FIELD_ERROR_NAMES = (
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
_PERMANENT_ERROR_NAMES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_DEPRECATED")
_FIELD_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
#: Per-field answers of nvmlDeviceGetFieldValues that mean "no such counter here", for good: a field id
#: this driver does not know comes back INVALID_ARGUMENT rather than NOT_SUPPORTED.
_FIELD_ABSENT_NAMES = (*_PERMANENT_ERROR_NAMES, "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_FOUND")
#: nvmlValueType_t of a 64-bit count (NVML_VALUE_TYPE_UNSIGNED_LONG, _UNSIGNED_LONG_LONG, _SIGNED_LONG_LONG).
_COUNT_VALUE_TYPE_NAMES = (
    "NVML_VALUE_TYPE_UNSIGNED_LONG",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG",
)

#: ``hw.throttle.reason`` values NVML can tell apart (contract section 2); ``power`` is never emitted here.
THROTTLE_REASONS = ("thermal", "power_cap", "power_brake", "hw_slowdown", "other")

#: Field ids of the three slowdown time counters (SW thermal, HW thermal, HW power brake; ns) in the
#: numbering a driver speaks, newest first: ``(first driver version, ids)``. Read from nvml.h as NVIDIA
#: publishes it (github.com/NVIDIA/go-nvml pkg/nvml/nvml.h) and from nvidia-ml-py's pynvml.py:
#:
#: * 269, 270, 271: nvml.h of CUDA 13.1, 13.2, 13.3 (power smoothing back at 251-268, as in CUDA 12.8);
#:   nvidia-ml-py 13.580.82, 13.580.126, 13.590.44, 13.595.45, 13.615.71 (the one this project pins);
#: * 251, 252, 253: nvml.h of CUDA 12.9 and 13.0 (power smoothing moved to 256-273); nvidia-ml-py
#:   12.575.51 and 13.580.65; NVIDIA's mock NVML (k8s-test-infra pkg/gpu/mocknvml/engine/
#:   throttle_counters.go) traced nvidia-smi 580.65.06 asking exactly 74, 76, 251, 252 and 253;
#: * none before driver 575 (nvml.h of CUDA 12.8: 251 is NVML_FI_PWR_SMOOTHING_ENABLED, NVML_FI_MAX 269).
#:
#: Drivers between 580.65 and 580.82 (580.76) are taken to speak the older numbering: no pynvml was
#: built from them. A newer renumbering needs a line here; until then the 64-bit-count check of
#: :meth:`NvmlSource._counter_field` keeps a power-smoothing setting from being read as time.
_SLOWDOWN_FIELD_IDS: tuple[tuple[tuple[int, int], tuple[int, int, int]], ...] = (
    ((580, 82), (269, 270, 271)),
    ((575, 0), (251, 252, 253)),
)


def slowdown_field_ids(driver_version: str) -> tuple[int, int, int] | None:
    """(SW thermal, HW thermal, HW power brake) time-counter field ids for ``driver_version``
    (``"580.95.05"``), or None for a driver without them or a version that does not parse."""
    try:
        parts = [int(p) for p in driver_version.strip().split(".")[:2]]
    except ValueError:
        return None
    if not parts:
        return None
    version = (parts[0], parts[1] if len(parts) > 1 else 0)
    for first, ids in _SLOWDOWN_FIELD_IDS:
        if version >= first:
            return ids
    return None


@dataclass(frozen=True)
class _TimeCounter:
    """One cumulative NVML time counter (ns) feeding a throttle reason.

    ``fields``: field ids, asked in this order until one is answered (several names can share an id);
    ``policy``: the ``nvmlDeviceGetViolationStatus`` policy holding the same count, asked when no field
    answers; ``bits``: the reasons-bitmask bits this counter times, sampled only while it has no source.
    """

    reason: str
    fields: tuple[int, ...]
    policy: int | None
    bits: int


@dataclass
class _Sampled:
    """One GPU's bitmask-sampled throttle time: the previous read's (time, reason bits) and the seconds
    credited so far per reason."""

    last: tuple[int, int] | None = None
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(THROTTLE_REASONS, 0.0))


def _bit(nv: Any, *names: str) -> int:
    """The first of ``names`` pynvml defines (``nvmlClocksEventReason*`` before ``nvmlClocksThrottleReason*``),
    as an int; 0 when this pynvml has none of them (the bit then maps to nothing)."""
    for name in names:
        value = getattr(nv, name, None)
        if value is not None:
            return int(value)
    return 0


def _reason_bits(nv: Any) -> dict[str, int]:
    """The reasons-bitmask bits by role, from pynvml (values in nvml.h's nvmlClocksEventReasons group:
    idle 0x1, applications clocks 0x2, SW power cap 0x4, HW slowdown 0x8, sync boost 0x10, SW thermal
    0x20, HW thermal 0x40, HW power brake 0x80, display clock 0x100; pynvml's
    nvmlClocksThrottleReasonBoardLimit 0x200 and ...Reliability 0x400)."""
    b = functools.partial(_bit, nv)
    return {
        "idle": b("nvmlClocksEventReasonGpuIdle", "nvmlClocksThrottleReasonGpuIdle"),
        "app_clocks": b(
            "nvmlClocksEventReasonApplicationsClocksSetting", "nvmlClocksThrottleReasonApplicationsClocksSetting"
        ),
        "sw_power_cap": b("nvmlClocksEventReasonSwPowerCap", "nvmlClocksThrottleReasonSwPowerCap"),
        "hw_slowdown": b("nvmlClocksEventReasonHwSlowdown", "nvmlClocksThrottleReasonHwSlowdown"),
        "sync_boost": b("nvmlClocksEventReasonSyncBoost", "nvmlClocksThrottleReasonSyncBoost"),
        "sw_thermal": b("nvmlClocksEventReasonSwThermalSlowdown", "nvmlClocksThrottleReasonSwThermalSlowdown"),
        "hw_thermal": b("nvmlClocksEventReasonHwThermalSlowdown", "nvmlClocksThrottleReasonHwThermalSlowdown"),
        "power_brake": b("nvmlClocksEventReasonHwPowerBrakeSlowdown", "nvmlClocksThrottleReasonHwPowerBrakeSlowdown"),
        "display_clock": b("nvmlClocksEventReasonDisplayClockSetting", "nvmlClocksThrottleReasonDisplayClockSetting"),
        "board_limit": b("nvmlClocksEventReasonBoardLimit", "nvmlClocksThrottleReasonBoardLimit"),
        "reliability": b("nvmlClocksEventReasonReliability", "nvmlClocksThrottleReasonReliability"),
    }


def _field_id(nv: Any, *names: str) -> tuple[int, ...]:
    """The field ids pynvml defines for ``names``, in order, without repeats."""
    ids: list[int] = []
    for name in names:
        value = getattr(nv, name, None)
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return tuple(ids)


def _time_counters(nv: Any, bits: dict[str, int], slowdown: tuple[int, int, int] | None) -> tuple[_TimeCounter, ...]:
    """The time counters a GPU may have, for pynvml ``nv`` and the driver's slowdown ids."""
    sw_therm, hw_therm, brake = slowdown if slowdown is not None else (None, None, None)

    def pol(name: str) -> int | None:
        value = getattr(nv, name, None)
        return None if value is None else int(value)

    counters = [
        _TimeCounter(
            "power_cap",
            _field_id(nv, "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", "NVML_FI_DEV_PERF_POLICY_POWER"),
            pol("NVML_PERF_POLICY_POWER"),
            bits["sw_power_cap"],
        ),
        _TimeCounter(
            "thermal",
            ((sw_therm,) if sw_therm is not None else ()) + _field_id(nv, "NVML_FI_DEV_PERF_POLICY_THERMAL"),
            pol("NVML_PERF_POLICY_THERMAL"),
            bits["sw_thermal"],
        ),
        _TimeCounter("hw_slowdown", (hw_therm,) if hw_therm is not None else (), None, bits["hw_thermal"]),
        _TimeCounter("power_brake", (brake,) if brake is not None else (), None, bits["power_brake"]),
        _TimeCounter(
            "other",
            _field_id(nv, "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST", "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST"),
            pol("NVML_PERF_POLICY_SYNC_BOOST"),
            bits["sync_boost"],
        ),
        _TimeCounter(
            "other",
            _field_id(nv, "NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT"),
            pol("NVML_PERF_POLICY_BOARD_LIMIT"),
            bits["board_limit"],
        ),
        _TimeCounter(
            "other",
            _field_id(nv, "NVML_FI_DEV_PERF_POLICY_RELIABILITY"),
            pol("NVML_PERF_POLICY_RELIABILITY"),
            bits["reliability"],
        ),
    ]
    return tuple(counters)


def _bit_reasons(bits: dict[str, int]) -> tuple[tuple[int, str], ...]:
    """(bit, reason) of every bit that counts as throttling (idle does not)."""
    by_role = {
        "sw_power_cap": "power_cap",
        "sw_thermal": "thermal",
        "power_brake": "power_brake",
        "hw_slowdown": "hw_slowdown",
        "hw_thermal": "hw_slowdown",
        "sync_boost": "other",
        "app_clocks": "other",
        "display_clock": "other",
        "board_limit": "other",
        "reliability": "other",
    }
    return tuple((bits[role], reason) for role, reason in by_role.items() if bits[role])


def effective_reasons(mask: int, bits: dict[str, int]) -> int:
    """The bits of a reasons bitmask that count as throttling time: idle dropped, and the generic
    hardware-slowdown bit NVML sets with the power-brake and hardware-thermal bits folded into them (a
    braked sample is power brake only, even when also hot)."""
    mask &= ~bits["idle"]
    if mask & bits["power_brake"]:
        mask &= ~(bits["hw_slowdown"] | bits["hw_thermal"])
    elif mask & bits["hw_thermal"]:
        mask &= ~bits["hw_slowdown"]
    return mask


def _import_pynvml() -> Any:
    import pynvml  # optional dependency: otel-dra[nvidia]

    return pynvml


def _text(value: str | bytes) -> str:
    """pynvml returns str in current releases and bytes in old ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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
        driver = _text(nvml.nvmlSystemGetDriverVersion())
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


class _DeviceLost(Exception):
    """One device failed as a whole this pass; its row is NaN."""


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

    def __init__(self, node_name: str, schema: Schema | None = None, nvml: Any = None) -> None:
        self.node_name = node_name
        self.schema = schema if schema is not None else Schema()
        if nvml is None:
            try:
                nvml = _import_pynvml()
            except ImportError:
                raise SourceUnavailable(
                    "--source nvml needs pynvml: pip install 'otel-dra[nvidia]' (or use --source auto)"
                ) from None
        self.nvml = nv = nvml
        self._field_errors = {getattr(nv, n) for n in _FIELD_ERROR_NAMES if hasattr(nv, n)}
        self._permanent_errors = {getattr(nv, n) for n in _PERMANENT_ERROR_NAMES if hasattr(nv, n)}
        self._absent_fields = {getattr(nv, n) for n in _FIELD_ABSENT_NAMES if hasattr(nv, n)}
        self._count_types = {getattr(nv, n) for n in _COUNT_VALUE_TYPE_NAMES if hasattr(nv, n)}
        self._bits = _reason_bits(nv)
        self._bit_reasons = _bit_reasons(self._bits)
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
            self._driver_version = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError as err:
            log.warning("nvml: driver version unavailable: %s", err)
            self._driver_version = ""
        slowdown = slowdown_field_ids(self._driver_version)
        self._counters = _time_counters(nv, self._bits, slowdown)
        self._renumbered = set(slowdown or ())  # taken only as 64-bit counts (see _SLOWDOWN_FIELD_IDS)
        self._reasons_fns = [
            name
            for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
            if getattr(nv, name, None) is not None
        ]
        self._count = int(nv.nvmlDeviceGetCount())
        self._handles: list[Any] = [None] * self._count
        self._identity: list[dict[str, str] | None] = [None] * self._count
        self._unsupported: list[set[str]] = [set() for _ in range(self._count)]
        self._fans: list[list[int] | None] = [None] * self._count
        self._sampled = [_Sampled() for _ in range(self._count)]
        self._table: DeviceTable | None = None
        for i in range(self._count):
            self._identify(i)
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
        return cls(config.node_name, schema)

    # -- identity ------------------------------------------------------------------------------
    def _identify(self, i: int) -> bool:
        """Read GPU ``i``'s handle and identity once; a GPU that fails is retried on later passes."""
        nv = self.nvml
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            name = _text(nv.nvmlDeviceGetName(handle))
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
                attrs[attr] = _text(getattr(nv, getter)(handle))
        self._handles[i] = handle
        self._identity[i] = attrs
        self._table = None
        return True

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
                row = self._by_uuid.get(_text(self.nvml.nvmlDeviceGetUUID(event.device)))
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
    def _call(self, i: int, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, or None when the field is unsupported; raises _DeviceLost on any other NVML error."""
        if what in self._unsupported[i]:
            return None
        try:
            return fn()
        except self.nvml.NVMLError as err:
            code = getattr(err, "value", None)
            if code in self._field_errors:
                if code in self._permanent_errors:
                    self._unsupported[i].add(what)
                return None
            raise _DeviceLost(f"{what}: {err}") from err

    def _read_device(self, i: int, row: dict[int, float], now_ns: int) -> None:
        """Fill one GPU's row (column index -> value); unsupported fields stay out (NaN)."""
        nv, h, k = self.nvml, self._handles[i], self._cols

        def put(key: str, value: float | None, scale: float = 1.0) -> None:
            if value is not None:
                row[k[key]] = float(value) * scale

        call = lambda what, fn: self._call(i, what, fn)  # noqa: E731
        put("temp.gpu", call("temp", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
        th = nv.nvmlDeviceGetTemperatureThreshold
        put("temp.gpu.limit.high.degraded", call("t.slow", lambda: th(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)))
        put("temp.gpu.limit.high.critical", call("t.shut", lambda: th(h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)))
        put("temp.memory", call("temp.mem", lambda: self._field_value(h, nv.NVML_FI_DEV_MEMORY_TEMP)))
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
        for reason, seconds in self._throttle_time(i, h, now_ns).items():
            put(f"throttle.{reason}", seconds)
        for fan, speed in self._fan_speeds(i, h):
            row[self.schema.index(fan_column(fan))] = speed / 100.0

    def _field_value(self, handle: Any, field_id: int) -> float:
        """One NVML field value; raises NOT_SUPPORTED (as NVML would) when the field has none."""
        nv = self.nvml
        fv = nv.nvmlDeviceGetFieldValues(handle, [field_id])[0]
        if int(fv.nvmlReturn) != 0:
            raise nv.NVMLError(int(fv.nvmlReturn))
        return float(getattr(fv.value, _FIELD_VALUE_MEMBERS[int(fv.valueType)]))

    # -- throttle time ---------------------------------------------------------------------------
    def _throttle_time(self, i: int, h: Any, now_ns: int) -> dict[str, float]:
        """Seconds throttled so far by reason (module docstring): counters where the GPU has them, the
        sampled bitmask for the bits none times; a reason with no answer this read is left out (NaN)."""
        counted, missing, timed = self._throttle_counters(i, h)
        sampled = 0
        for bit, _reason in self._bit_reasons:
            sampled |= bit
        sampled &= ~timed
        mask_known = self._sample_reasons(i, h, now_ns, sampled)
        state = self._sampled[i]
        out: dict[str, float] = {}
        for reason in THROTTLE_REASONS:
            if reason in missing:
                continue
            ns = [value for counter, value in counted if counter.reason == reason]
            has_bits = any(bit & sampled for bit, r in self._bit_reasons if r == reason)
            if not ns and not (mask_known and has_bits):
                continue
            out[reason] = sum(ns) * 1e-9 + state.seconds[reason]
        return out

    def _throttle_counters(self, i: int, h: Any) -> tuple[list[tuple[_TimeCounter, float]], set[str], int]:
        """The time counters this GPU answers, with their values (ns); the reasons one of whose counters
        failed this read (NaN: a partial sum would look like a counter reset); and the reason bits these
        counters time, answered or not (never sampled too). A counter whose every source is unsupported
        is none of these: its bits are sampled instead."""
        nv, unsupported = self.nvml, self._unsupported[i]
        values: dict[int, float | None] = {}  # field id -> ns, None when it failed this read
        while True:  # a field found absent makes its counter ask its next one, in the same read
            ask: list[int] = []
            for counter in self._counters:
                fid = next((f for f in counter.fields if f"fi.{f}" not in unsupported), None)
                if fid is not None and fid not in values and fid not in ask:
                    ask.append(fid)
            if not ask:
                break
            try:
                answers = nv.nvmlDeviceGetFieldValues(h, ask)
            except nv.NVMLError as err:
                # NVML answers per field when it can fill any (nvml.h: "NVML_SUCCESS if any values in
                # values were populated"), so a failed call says none of these fields is here.
                code = getattr(err, "value", None)
                if code in self._absent_fields:
                    unsupported.update(f"fi.{f}" for f in ask)
                    continue
                if code in self._field_errors:
                    values.update(dict.fromkeys(ask))
                    break
                raise _DeviceLost(f"field values: {err}") from err
            for fid, fv in zip(ask, answers, strict=True):
                values[fid] = self._counter_field(i, fid, fv, fid in self._renumbered)
        counted: list[tuple[_TimeCounter, float]] = []
        missing: set[str] = set()
        timed = 0
        for counter in self._counters:
            fid = next((f for f in counter.fields if f"fi.{f}" not in unsupported), None)
            if fid is not None:
                value = values.get(fid)
            elif counter.policy is not None:
                policy = counter.policy
                result = self._call(i, f"v.{policy}", functools.partial(nv.nvmlDeviceGetViolationStatus, h, policy))
                value = None if result is None else float(result.violationTime)  # ns
                if result is None and f"v.{policy}" in unsupported:
                    continue  # no source: its bits are sampled
            else:
                continue
            timed |= counter.bits
            if value is None:
                missing.add(counter.reason)
            else:
                counted.append((counter, value))
        return counted, missing, timed

    def _counter_field(self, i: int, fid: int, fv: Any, count_only: bool) -> float | None:
        """One field value of a time counter (ns); None when it failed this read. A field the driver does
        not have is marked unsupported (not asked again); ``count_only`` also refuses a reply that is not
        a 64-bit count (a renumbered id answering with another field's value)."""
        code = int(fv.nvmlReturn)
        if code == 0:
            value_type = int(fv.valueType)
            if count_only and value_type not in self._count_types:
                log.warning(
                    "nvml: GPU %d: field %d answered value type %d, not a time counter; not used (driver %s)",
                    i,
                    fid,
                    value_type,
                    self._driver_version,
                )
                self._unsupported[i].add(f"fi.{fid}")
                return None
            return float(getattr(fv.value, _FIELD_VALUE_MEMBERS[value_type]))
        if code in self._absent_fields:
            self._unsupported[i].add(f"fi.{fid}")
            return None
        if code in self._field_errors:
            return None
        raise _DeviceLost(f"field {fid}: {self.nvml.NVMLError(code)}")

    def _sample_reasons(self, i: int, h: Any, now_ns: int, sampled: int) -> bool:
        """Read the reasons bitmask and credit the bits in ``sampled`` that the previous read saw with the
        time since it; False when this GPU has no bitmask to read."""
        state = self._sampled[i]
        mask: int | None = None
        for name in self._reasons_fns:  # the current name first; before driver 535 only the older one
            what = f"reasons.{name}"
            if what in self._unsupported[i]:
                continue
            mask = self._call(i, what, functools.partial(getattr(self.nvml, name), h))
            if mask is not None or what not in self._unsupported[i]:
                break
        if mask is None:
            state.last = None  # a gap: the next read is a new baseline
            return any(f"reasons.{name}" not in self._unsupported[i] for name in self._reasons_fns)
        mask = effective_reasons(int(mask), self._bits)
        if state.last is not None and now_ns > state.last[0]:
            elapsed = (now_ns - state.last[0]) * 1e-9
            held = state.last[1] & sampled
            for reason in {r for bit, r in self._bit_reasons if held & bit}:
                state.seconds[reason] += elapsed
        state.last = (now_ns, mask)
        return True

    def _retired(self, i: int, h: Any) -> float | None:
        """Retired pages (pre-Ampere) plus remapped rows (Ampere and later): whichever the GPU has."""
        nv = self.nvml
        total: float | None = None
        for cause in (
            nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        ):
            pages = self._call(i, f"retired.{cause}", functools.partial(nv.nvmlDeviceGetRetiredPages, h, cause))
            if pages is not None:
                total = (total or 0.0) + len(pages)
        rows = self._call(i, "remapped", lambda: nv.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            corrected, uncorrected = rows[0], rows[1]
            total = (total or 0.0) + corrected + uncorrected
        return total

    def _fan_speeds(self, i: int, h: Any) -> list[tuple[int, float]]:
        """(fan, percent) of each fan that answers; passively cooled GPUs have none."""
        nv = self.nvml
        if self._fans[i] is None:
            count = self._call(i, "fans", lambda: nv.nvmlDeviceGetNumFans(h))
            self._fans[i] = list(range(int(count or 0)))
        out = []
        for fan in self._fans[i] or ():
            speed = self._call(i, f"fan.{fan}", functools.partial(nv.nvmlDeviceGetFanSpeed_v2, h, fan))
            if speed is not None:
                out.append((fan, float(speed)))
        return out

    def read(self, now_unix_nano: int) -> Frame:
        """One pass over every GPU; a GPU that fails as a whole gets a NaN row, the rest report."""
        for i in range(self._count):
            if self._identity[i] is None:
                self._identify(i)
        table, known = self._device_table()
        with self._xid_lock:
            xids = {code: counts.copy() for code, counts in self._xids.items()}
        xid_cols = {code: self.schema.index(driver_error_column(code)) for code in xids}
        rows: list[dict[int, float]] = []
        for r, i in enumerate(known):
            row: dict[int, float] = {}
            try:
                self._read_device(i, row, now_unix_nano)
            except _DeviceLost as err:
                log.warning("nvml: GPU %d (%s) not read: %s", i, table.ids[r], err)
                row = {}
                self._sampled[i].last = None  # sampled throttle time restarts from a new baseline
            except Exception:  # a bug or an odd binding must not stop the other GPUs or the loop
                log.exception("nvml: GPU %d (%s) read failed", i, table.ids[r])
                row = {}
                self._sampled[i].last = None
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
