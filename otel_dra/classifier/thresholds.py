# ruff: noqa: RUF009  (field defaults here are dataclasses.field()s, made by number(), flag(), hw_state(), section())
"""The rules' thresholds, typed: one frozen dataclass per rule section, compiled from the policy once.

The policy is validated nested dicts (``rules.<reason>.<key>``), merged per device model. Reading them by
string path at every evaluation would tie the rules to the policy's spelling and cost a dict walk a
threshold; instead :func:`compile_rules` turns the merged rules of every policy group into typed sections
whose fields are arrays over the groups (float64 numbers, bools, states as int8 codes), once, when a new
group appears. :class:`RowParams` then reads a section for a set of rows: each field at the rows'
groups. A value every group shares is kept as a broadcast (stride 0) array and read as a broadcast view,
which costs nothing whatever the fleet's size.

A field is named after its policy key; :func:`number` and friends name the key where Python can't
(``high.degraded``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from otel_dra.classifier.features import STATE_CODE

if TYPE_CHECKING:
    from otel_dra.classifier.params import PolicyGroups

S = TypeVar("S")
Reader = Callable[[Any], Any]


def _field(read: Reader, dtype: type, key: str | None) -> Any:
    return dataclasses.field(metadata={"read": read, "dtype": dtype, "key": key})


def number(key: str | None = None) -> Any:
    """A numeric threshold (float64), read from ``key`` (default: the field's name)."""
    return _field(float, np.float64, key)


def flag(key: str | None = None) -> Any:
    """A yes/no setting (bool)."""
    return _field(bool, np.bool_, key)


def hw_state(key: str | None = None) -> Any:
    """A ``hw.state`` a rule implies, as its code (int8, ``STATE_CODE``)."""
    return _field(STATE_CODE.__getitem__, np.int8, key)


def section(cls: type, key: str | None = None, prefix: str | None = None) -> Any:
    """A nested section: the policy's sub-dict ``key``, or the keys starting with ``prefix`` of this one."""
    return dataclasses.field(metadata={"section": cls, "key": key, "prefix": prefix})


@dataclass(frozen=True)
class RateParams:
    """A counter rate's bars (:meth:`Window.rate`): storm over the window, far above the cohort over the span."""

    storm_ratio: np.ndarray = number()
    cohort_ratio: np.ndarray = number()
    mad_k: np.ndarray = number()
    floor_per_minute: np.ndarray = number()


@dataclass(frozen=True)
class FallbackLimits:
    """Temperature limits for sensors that report none, Cel."""

    high_degraded: np.ndarray = number("high.degraded")
    high_critical: np.ndarray = number("high.critical")


@dataclass(frozen=True)
class ThermalPeerParams:
    """Hotter than its peers at the same load (:func:`otel_dra.classifier.peer_evidence.thermal_peers`)."""

    enabled: np.ndarray = flag()
    state: np.ndarray = hw_state()
    margin: np.ndarray = number()
    unknown_slot_margin: np.ndarray = number()
    mad_k: np.ndarray = number()
    hold_ratio: np.ndarray = number()
    sustain: np.ndarray = number()
    min_utilization: np.ndarray = number()
    slope: np.ndarray = number()
    min_node_devices: np.ndarray = number()
    min_slot_nodes: np.ndarray = number()
    change_margin: np.ndarray = number()
    change_floor: np.ndarray = number()
    history: np.ndarray = number()
    baseline_tau: np.ndarray = number()


@dataclass(frozen=True)
class ThermalParams:
    state: np.ndarray = hw_state()
    critical_state: np.ndarray = hw_state()
    min_fraction: np.ndarray = number()
    throttle_share: np.ndarray = number()
    slowdown_share: np.ndarray = number()
    duty: np.ndarray = number()
    fallback_limits: FallbackLimits = section(FallbackLimits)
    peers: ThermalPeerParams = section(ThermalPeerParams)


@dataclass(frozen=True)
class CoolingParams:
    state: np.ndarray = hw_state()
    min_rpm: np.ndarray = number()
    min_ratio: np.ndarray = number()
    warm: np.ndarray = number()
    min_fraction: np.ndarray = number()
    duty: np.ndarray = number()


@dataclass(frozen=True)
class MemoryEccParams:
    uncorrected: np.ndarray = number()
    retired_pages_failed: np.ndarray = number()
    retired_pages_predicted: np.ndarray = number()
    corrected_per_minute: np.ndarray = number()
    corrected: RateParams = section(RateParams, prefix="corrected_")


@dataclass(frozen=True)
class PowerDeliveryParams:
    state: np.ndarray = hw_state()
    errors: np.ndarray = number()
    voltage_fraction: np.ndarray = number()
    brake_share: np.ndarray = number()
    duty: np.ndarray = number()


@dataclass(frozen=True)
class PowerThrottlingParams:
    state: np.ndarray = hw_state()
    throttle_share: np.ndarray = number()
    pinned_ratio: np.ndarray = number()
    duty: np.ndarray = number()
    min_peers: np.ndarray = number()
    peer_quantile: np.ndarray = number()
    peer_margin: np.ndarray = number()
    busy_utilization: np.ndarray = number()
    load_coupling: np.ndarray = number()
    limit_ratio: np.ndarray = number()
    capped_share: np.ndarray = number()


@dataclass(frozen=True)
class MemoryPressureParams:
    state: np.ndarray = hw_state()
    full_is_evidence: np.ndarray = flag()
    utilization: np.ndarray = number()
    min_fraction: np.ndarray = number()
    duty: np.ndarray = number()
    out_of_memory: np.ndarray = number()
    events_window: np.ndarray = number()


@dataclass(frozen=True)
class LinkParams:
    state: np.ndarray = hw_state()
    default_generation: np.ndarray = number()
    default_width: np.ndarray = number()
    errors: RateParams = section(RateParams, prefix="")
    duty: np.ndarray = number()
    downgrade_fraction: np.ndarray = number()
    generation_min_utilization: np.ndarray = number()


@dataclass(frozen=True)
class DriverErrorsParams:
    application_repeats: np.ndarray = number()
    events_window: np.ndarray = number()


@dataclass(frozen=True)
class FirmwareParams:
    state: np.ndarray = hw_state()


@dataclass(frozen=True)
class DeviceResetParams:
    state: np.ndarray = hw_state()
    resets: np.ndarray = number()
    events_window: np.ndarray = number()


@dataclass(frozen=True)
class RuleParams:
    """Every rule's thresholds (fields: the policy's ``rules`` sections); arrays over policy groups."""

    thermal: ThermalParams = section(ThermalParams)
    cooling: CoolingParams = section(CoolingParams)
    memory_ecc: MemoryEccParams = section(MemoryEccParams)
    power_delivery: PowerDeliveryParams = section(PowerDeliveryParams)
    power_throttling: PowerThrottlingParams = section(PowerThrottlingParams)
    memory_pressure: MemoryPressureParams = section(MemoryPressureParams)
    link: LinkParams = section(LinkParams)
    driver_errors: DriverErrorsParams = section(DriverErrorsParams)
    firmware: FirmwareParams = section(FirmwareParams)
    device_reset: DeviceResetParams = section(DeviceResetParams)


def _shared(values: np.ndarray) -> np.ndarray:
    """``values`` over groups; where every group has the same one, a broadcast view of it (stride 0, over a
    one-value array: :func:`at_group` broadcasts that to any shape for less than ``np.broadcast_to`` costs)."""
    if values.size and bool((values == values[0]).all()):
        return _broadcast(values[:1].copy(), values.shape)
    return values


def _broadcast(one: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only view of ``shape`` whose every element is ``one``'s (a C-contiguous one-value array)."""
    view = np.ndarray(shape, one.dtype, one, 0, (0,) * len(shape))
    view.flags.writeable = False
    return view


def _compile(cls: type[S], groups: Sequence[Mapping[str, Any]], prefix: str = "") -> S:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = f.metadata
        key = meta["key"] or f.name
        if "section" in meta:
            if meta["prefix"] is not None:  # its keys sit in this section, under a prefix
                out[f.name] = _compile(meta["section"], groups, prefix + meta["prefix"])
            else:
                out[f.name] = _compile(meta["section"], [rules[key] for rules in groups])
        else:
            read = meta["read"]
            out[f.name] = _shared(np.asarray([read(rules[prefix + key]) for rules in groups], dtype=meta["dtype"]))
    return cls(**out)


def compile_rules(groups: Sequence[Mapping[str, Any]]) -> RuleParams:
    """The typed thresholds of every policy group, from each group's merged ``rules`` (the only place the
    rules' keys are read by name)."""
    return _compile(RuleParams, groups)


def at_group(values: np.ndarray, group: np.ndarray | Callable[[], np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """One threshold (an array over groups) for rows of ``shape`` in groups ``group`` (or a function that
    gives them: asked for only when the value differs by group): a shared value broadcast, a view."""
    if values.strides == (0,):
        one = values.base
        if isinstance(one, np.ndarray) and one.size == 1 and one.flags.c_contiguous:  # (what _shared made)
            return _broadcast(one, shape)
        return np.broadcast_to(values[0], shape)
    return values[group() if callable(group) else group]


def at_rows(params: S, group: np.ndarray | Callable[[], np.ndarray], shape: tuple[int, ...]) -> S:
    """A section (arrays over groups) for a set of rows of ``shape``: each threshold by :func:`at_group`."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(params):  # type: ignore[arg-type]
        values = getattr(params, f.name)
        if isinstance(values, np.ndarray):
            out[f.name] = at_group(values, group, shape)
        else:
            out[f.name] = at_rows(values, group, shape)
    return type(params)(**out)


def _frozen(params: S) -> S:
    """A section whose arrays are read-only: one :class:`RowParams` serves many evaluations, so no rule may
    write into a threshold it was given."""
    for f in dataclasses.fields(params):  # type: ignore[arg-type]
        values = getattr(params, f.name)
        if isinstance(values, np.ndarray):
            values.flags.writeable = False
        else:
            _frozen(values)
    return params


class RowParams:
    """The thresholds of a set of rows (``rows`` of the group table ``groups.group``, in groups ``group``):
    each rule's section read at the rows' groups on first use, and kept (read-only: an evaluation reads each
    section once, and :meth:`PolicyGroups.at` gives the same one to the evaluations that follow while the
    rows and their groups stay the same)."""

    def __init__(self, groups: PolicyGroups, rows: np.ndarray, group: np.ndarray) -> None:
        self._groups = groups
        self._shape = np.shape(rows)
        #: Each row's policy group.
        self.group = group

    def _at(self, section: S) -> S:
        return _frozen(at_rows(section, self.group, self._shape))

    @cached_property
    def thermal(self) -> ThermalParams:
        return self._at(self._groups.params.thermal)

    @cached_property
    def cooling(self) -> CoolingParams:
        return self._at(self._groups.params.cooling)

    @cached_property
    def memory_ecc(self) -> MemoryEccParams:
        return self._at(self._groups.params.memory_ecc)

    @cached_property
    def power_delivery(self) -> PowerDeliveryParams:
        return self._at(self._groups.params.power_delivery)

    @cached_property
    def power_throttling(self) -> PowerThrottlingParams:
        return self._at(self._groups.params.power_throttling)

    @cached_property
    def memory_pressure(self) -> MemoryPressureParams:
        return self._at(self._groups.params.memory_pressure)

    @cached_property
    def link(self) -> LinkParams:
        return self._at(self._groups.params.link)

    @cached_property
    def driver_errors(self) -> DriverErrorsParams:
        return self._at(self._groups.params.driver_errors)

    @cached_property
    def firmware(self) -> FirmwareParams:
        return self._at(self._groups.params.firmware)

    @cached_property
    def device_reset(self) -> DeviceResetParams:
        return self._at(self._groups.params.device_reset)
