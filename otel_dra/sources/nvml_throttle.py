"""NVML throttle time: which source each reason is read from, and the reading.

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

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

from otel_dra.sources.nvml_calls import FIELD_VALUE_MEMBERS, DeviceLost, NvmlCalls

log = logging.getLogger("otel_dra.sources.nvml")  # the source's logger: these lines are its

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
#: :meth:`ThrottleClock._counter_field` keeps a power-smoothing setting from being read as time.
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


class ThrottleClock:
    """The throttle time of one source's GPUs: which counters each answers, and the reasons bitmask
    sampled for the bits none times (module docstring)."""

    def __init__(self, calls: NvmlCalls, driver_version: str, count: int) -> None:
        nv = calls.nv
        self._calls = calls
        self._driver_version = driver_version
        self._bits = _reason_bits(nv)
        self._bit_reasons = _bit_reasons(self._bits)
        slowdown = slowdown_field_ids(driver_version)
        self._counters = _time_counters(nv, self._bits, slowdown)
        self._renumbered = set(slowdown or ())  # taken only as 64-bit counts (see _SLOWDOWN_FIELD_IDS)
        self._reasons_fns = [
            name
            for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
            if getattr(nv, name, None) is not None
        ]
        self._sampled = [_Sampled() for _ in range(count)]

    def restart(self, i: int) -> None:
        """GPU ``i`` was not read: its sampled throttle time restarts from a new baseline."""
        self._sampled[i].last = None

    def seconds(self, i: int, h: Any, now_ns: int) -> dict[str, float]:
        """GPU ``i``'s seconds throttled so far by reason (module docstring): counters where the GPU has them, the
        sampled bitmask for the bits none times; a reason with no answer this read is left out (NaN)."""
        counted, missing, timed = self._read_counters(i, h)
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

    def _read_counters(self, i: int, h: Any) -> tuple[list[tuple[_TimeCounter, float]], set[str], int]:
        """The time counters this GPU answers, with their values (ns); the reasons one of whose counters
        failed this read (NaN: a partial sum would look like a counter reset); and the reason bits these
        counters time, answered or not (never sampled too). A counter whose every source is unsupported
        is none of these: its bits are sampled instead."""
        nv, unsupported = self._calls.nv, self._calls.unsupported[i]
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
                if code in self._calls.absent_fields:
                    unsupported.update(f"fi.{f}" for f in ask)
                    continue
                if code in self._calls.field_errors:
                    values.update(dict.fromkeys(ask))
                    break
                raise DeviceLost(f"field values: {err}") from err
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
                result = self._calls.call(
                    i, f"v.{policy}", functools.partial(nv.nvmlDeviceGetViolationStatus, h, policy)
                )
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
            if count_only and value_type not in self._calls.count_types:
                log.warning(
                    "nvml: GPU %d: field %d answered value type %d, not a time counter; not used (driver %s)",
                    i,
                    fid,
                    value_type,
                    self._driver_version,
                )
                self._calls.unsupported[i].add(f"fi.{fid}")
                return None
            return float(getattr(fv.value, FIELD_VALUE_MEMBERS[value_type]))
        if code in self._calls.absent_fields:
            self._calls.unsupported[i].add(f"fi.{fid}")
            return None
        if code in self._calls.field_errors:
            return None
        raise DeviceLost(f"field {fid}: {self._calls.nv.NVMLError(code)}")

    def _sample_reasons(self, i: int, h: Any, now_ns: int, sampled: int) -> bool:
        """Read the reasons bitmask and credit the bits in ``sampled`` that the previous read saw with the
        time since it; False when this GPU has no bitmask to read."""
        state = self._sampled[i]
        mask: int | None = None
        for name in self._reasons_fns:  # the current name first; before driver 535 only the older one
            what = f"reasons.{name}"
            if what in self._calls.unsupported[i]:
                continue
            mask = self._calls.call(i, what, functools.partial(getattr(self._calls.nv, name), h))
            if mask is not None or what not in self._calls.unsupported[i]:
                break
        if mask is None:
            state.last = None  # a gap: the next read is a new baseline
            return any(f"reasons.{name}" not in self._calls.unsupported[i] for name in self._reasons_fns)
        mask = effective_reasons(int(mask), self._bits)
        if state.last is not None and now_ns > state.last[0]:
            elapsed = (now_ns - state.last[0]) * 1e-9
            held = state.last[1] & sampled
            for reason in {r for bit, r in self._bit_reasons if held & bit}:
                state.seconds[reason] += elapsed
        state.last = (now_ns, mask)
        return True
