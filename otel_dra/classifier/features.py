"""Sample stage: one batch of raw series (devices x columns) → the fixed features the rules read.

Whatever series a source or decoder brings (any number of sensors, links, driver codes),
each device's sample is reduced to one row of :class:`F` features:

- *indicators* (0/1): the per-sample predicate a "sustained" rule counts over its window
  (temperature above its limit, fan near zero while warm, ...), judged against the
  device's own ``*.limit`` series first and the policy's fallback otherwise;
- *increases*: counter deltas since the device's previous sample, with the contract's
  rules (§2): a counter that goes down was reset and restarts from its new value as a
  baseline; a series first seen on a known device counts its whole value; a device seen
  for the first time brings its history, so its first values are a baseline;
- *gauges*: the latest value where a rule needs one (vendor state, retired pages).

All of it is array work over the batch's rows; the only Python loops are over columns
and features, a fixed handful, never over devices or points.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

import numpy as np

from otel_dra import conventions as cv
from otel_dra.classifier.numeric import all_of, any_of, flatnonzero, nan_to_num, nans, shaped
from otel_dra.classifier.registry import grown, grown_rows
from otel_dra.classifier.rows import RowIndex
from otel_dra.frame import Column, Schema


class F(IntEnum):
    """Per-sample features, the window store's columns."""

    DT = 0  # seconds since the device's previous sample (0 for its first)
    TEMP_MAX = 1  # hottest sensor, Cel
    TEMP_HOT = 2  # 1: a sensor above its high.degraded limit
    TEMP_CRIT = 3  # 1: a sensor above its high.critical limit
    COOLING_BAD = 4  # 1: a fan near zero / below its low limit while the device is warm
    VOLT_BAD = 5  # 1: a voltage outside its critical limits
    POWER_PINNED = 6  # 1: power at its cap
    MEM_FULL = 7  # 1: memory utilization at or above the policy limit
    WIDTH_DOWN = 8  # 1: PCIe width below its maximum
    GEN_DOWN = 9  # 1: PCIe generation below its maximum while under load
    LINK_EXPECTED = 10  # expected link replays per minute for the negotiated width and generation
    VENDOR_STATE = 11  # reported hw.status: 0 ok, 1 predicted_failure, 2 degraded, 3 failed
    RETIRED_TOTAL = 12  # retired pages / remapped rows, cumulative
    THROTTLE_THERMAL = 13  # increase, seconds
    THROTTLE_POWER = 14  # increase, seconds
    ECC_CORRECTED = 15  # increases, errors ...
    ECC_UNCORRECTED = 16
    LINK_ERRORS = 17
    POWER_ERRORS = 18
    RESETS = 19
    OUT_OF_MEMORY = 20
    DRIVER_APPLICATION = 21
    DRIVER_RESET = 22
    DRIVER_REBOOT = 23
    DRIVER_MECHANICAL = 24
    UTIL = 25  # utilization (general task), 0..1
    THROTTLE_BRAKE = 26  # increase, seconds: the hardware power brake (asserted from outside the device)
    THROTTLE_SLOWDOWN = 27  # increase, seconds: the device's own hardware slowdown
    # Application driver errors and out-of-memory events that landed on several GPUs of a node at once: a
    # job's crash (the classifier moves them here from DRIVER_APPLICATION / OUT_OF_MEMORY, see workload.py).
    WORKLOAD_APPLICATION = 28
    WORKLOAD_OOM = 29
    # The device's power cap (hw.power.limit{max}), W; where it reports none, the power it drew in a sample capped
    # for the policy's capped_share of its interval (NaN in other samples).
    POWER_LIMIT = 30
    BUSY = 31  # 1: utilization at or above the policy's busy_utilization (its demand may reach the cap)
    RESTARTS = 32  # counter series that went down this sample: they started over (a reset, a driver or agent restart)


N_FEATURES = len(F)

#: hw.state as a severity code: the order a device's state is the worst of.
STATE_CODE: dict[str, int] = {"ok": 0, "predicted_failure": 1, "degraded": 2, "failed": 3, "needs_cleaning": 2}
STATE_OF_CODE: tuple[str, ...] = ("ok", "predicted_failure", "degraded", "failed")

_ERROR_FEATURES: dict[str, F] = {
    "corrected": F.ECC_CORRECTED,
    "uncorrected": F.ECC_UNCORRECTED,
    "link": F.LINK_ERRORS,
    "reset": F.RESETS,
    "power": F.POWER_ERRORS,
    "out_of_memory": F.OUT_OF_MEMORY,
}
#: ``hw.throttle.reason`` -> the throttle-time feature it feeds (contract §2: ``power``, a cap whose cause was not
#: reported, is read as ``power_cap``; ``other`` (sync boost, clock settings) is not throttling a rule judges).
_THROTTLE_FEATURES: dict[str, F] = {
    "thermal": F.THROTTLE_THERMAL,
    "power": F.THROTTLE_POWER,
    "power_cap": F.THROTTLE_POWER,
    "power_brake": F.THROTTLE_BRAKE,
    "hw_slowdown": F.THROTTLE_SLOWDOWN,
}
_DRIVER_FEATURES: dict[str, F | None] = {
    "ignore": None,
    "application": F.DRIVER_APPLICATION,
    "reset_device": F.DRIVER_RESET,
    "reboot_node": F.DRIVER_REBOOT,
    "mechanical": F.DRIVER_MECHANICAL,
}


class DriverClasses:
    """Each driver error code's class in each policy group (by its vendor's table; unknown codes: application), as
    the features it counts toward: worked out once a code, and again only when a group was added, so that a
    batch's rows (each batch its own :class:`DeviceParams`) look no table up."""

    def __init__(self, code_tables: list[dict[str, str]]) -> None:
        self.code_tables = code_tables  # per group: driver error code -> class (the groups' owner appends)
        self._by_code: dict[str, tuple[int, list[tuple[F, np.ndarray | None]]]] = {}

    def features(self, code: str) -> list[tuple[F, np.ndarray | None]]:
        """(feature, which groups class ``code`` so: None for all of them) for each feature some group counts
        ``code`` toward."""
        groups = len(self.code_tables)
        kept = self._by_code.get(code)
        if kept is None or kept[0] != groups:
            classes = [table.get(code, "application") for table in self.code_tables]
            out: list[tuple[F, np.ndarray | None]] = []
            for name, feat in _DRIVER_FEATURES.items():
                mine = np.asarray([klass == name for klass in classes], dtype=bool)
                if feat is not None and mine.any():
                    out.append((feat, None if mine.all() else mine))
            kept = self._by_code[code] = (groups, out)
        return kept[1]


@dataclass
class DeviceParams:
    """Per-row thresholds the sample stage needs, resolved from the policy per device model."""

    temp_degraded: np.ndarray  # fallback limits, Cel
    temp_critical: np.ndarray
    fan_min_rpm: np.ndarray
    fan_min_ratio: np.ndarray
    warm: np.ndarray
    pinned_ratio: np.ndarray
    capped_share: np.ndarray  # a sample's share of its interval at the power cap that shows the cap in its power
    mem_full: np.ndarray
    gen_min_util: np.ndarray
    busy_util: np.ndarray
    default_gen: np.ndarray
    default_width: np.ndarray
    groups: np.ndarray  # policy group of each row
    driver: DriverClasses  # each driver error code's class in each group
    #: PCIe replays a lane may make a minute, by link generation 0..16 (0 where the policy names none; fleet-wide).
    rate_of_gen: np.ndarray = field(default_factory=lambda: np.zeros(17))
    #: Per driver error code, what :meth:`driver_features` gave (these params serve batch after batch).
    _driver: dict[str, list[tuple[F, np.ndarray | None]]] = field(default_factory=dict, repr=False, compare=False)

    def driver_features(self, code: str) -> list[tuple[F, np.ndarray | None]]:
        """The features driver error ``code`` counts toward, each with the rows whose class it is (None: every
        row's); a class no row gives it is left out (it would add nothing)."""
        kept = self._driver.get(code)
        if kept is None:
            kept = []
            for feat, per_group in self.driver.features(code):
                mine = None if per_group is None else per_group[self.groups]
                if mine is None or all_of(mine):
                    kept.append((feat, None))
                elif any_of(mine):
                    kept.append((feat, mine))
            self._driver[code] = kept
        return kept


@dataclass
class _Plan:
    """Which columns feed which feature; rebuilt when the schema grows."""

    width: int
    counter_cols: np.ndarray
    counter_feature: np.ndarray  # feature per counter column, -1 for driver (by code) or unused
    driver_cols: list[tuple[int, str]]
    retired_cols: np.ndarray
    temp: list[tuple[int, int, int]]  # (temp col, high.degraded limit col or -1, high.critical limit col or -1)
    fans: list[tuple[int, int, int]]  # (speed col or -1, ratio col or -1, low limit col or -1)
    volts: list[tuple[int, int, int]]  # (voltage col, low.critical col or -1, high.critical col or -1)
    power: np.ndarray
    power_limit: np.ndarray
    mem_util: np.ndarray
    mem_usage: np.ndarray
    mem_limit: np.ndarray
    util: np.ndarray
    width_cols: np.ndarray
    width_max: np.ndarray
    gen_cols: np.ndarray
    gen_max: np.ndarray
    status: list[tuple[int, int]]  # (column, state code)
    single_features: np.ndarray = field(init=False)  # features fed by one counter column ...
    single_positions: np.ndarray = field(init=False)  # ... and that column's place among counter_cols
    summed: list[tuple[int, np.ndarray]] = field(init=False)  # (feature, places) fed by several
    driver_positions: np.ndarray = field(init=False)  # each driver column's place among counter_cols
    # The temperature and status columns as arrays (the sample stage reads them as one block each).
    temp_cols: np.ndarray = field(init=False)
    temp_limits: np.ndarray = field(init=False)  # (2, sensors): high.degraded and high.critical limit columns, -1
    status_cols: np.ndarray = field(init=False)
    status_codes: np.ndarray = field(init=False)
    # The reduced gauges (power .. gen_max) fed by one column each (the usual case: one series a device), by name:
    # a column's fmax/fmin over itself is the column, copied out of the row-major values (0.3 us against a
    # gather and a reduction's 2 us at 32 rows, 0.28 against 0.67 ms at 100,000; a view would leave every later
    # step reading it a cache line a row, and a gather of them all into one block costs more). The others reduce.
    single_gauge: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.single_gauge = {name: int(cols[0]) for name in _REDUCED if (cols := getattr(self, name)).size == 1}
        self.temp_cols = np.asarray([t for t, _, _ in self.temp], dtype=np.intp)
        self.temp_limits = np.asarray([[d for _, d, _ in self.temp], [c for _, _, c in self.temp]], dtype=np.intp)
        self.status_cols = np.asarray([c for c, _ in self.status], dtype=np.intp)
        self.status_codes = np.asarray([code for _, code in self.status], dtype=np.float64)
        # A feature fed by one counter column (the usual case) is that column's increase: one gather
        # for all of them. Only a feature fed by several sums them (NaN where none was read).
        fed = self.counter_feature
        features, counts = np.unique(fed[fed >= 0], return_counts=True)
        single = features[counts == 1]
        self.single_features = single.astype(np.intp)
        self.single_positions = np.asarray([int(flatnonzero(fed == f)[0]) for f in single], dtype=np.intp)
        self.summed = [(int(f), flatnonzero(fed == f)) for f in features[counts > 1]]
        place = {int(c): j for j, c in enumerate(self.counter_cols.tolist())}
        self.driver_positions = np.asarray([place[col] for col, _ in self.driver_cols], dtype=np.intp)


def _attr(column: Column, key: str) -> str | None:
    return dict(column.attrs).get(key)


def build_plan(columns: tuple[Column, ...]) -> _Plan:
    """Map every known column to the feature it feeds."""
    by_sensor_limits: dict[tuple[str | None, str], dict[str, int]] = {}
    for i, col in enumerate(columns):
        limit = _attr(col, cv.HW_LIMIT_TYPE)
        if limit is not None:
            base = col.metric.removesuffix(".limit")
            by_sensor_limits.setdefault((col.sensor, base), {})[limit] = i

    def limit_of(col: Column, metric: str, *kinds: str) -> int:
        limits = by_sensor_limits.get((col.sensor, metric), {})
        return next((limits[k] for k in kinds if k in limits), -1)

    counter_cols: list[int] = []
    counter_feature: list[int] = []
    driver_cols: list[tuple[int, str]] = []
    retired: list[int] = []
    temp: list[tuple[int, int, int]] = []
    fans: dict[str | None, list[int]] = {}
    volts: list[tuple[int, int, int]] = []
    simple: dict[str, list[int]] = {}
    status: list[tuple[int, int]] = []
    for i, col in enumerate(columns):
        m = col.metric
        if m == cv.HW_ERRORS.name:
            etype = _attr(col, cv.ERROR_TYPE_ATTR) or ""
            if etype == "retired_page":
                retired.append(i)
            elif etype == "driver":
                driver_cols.append((i, _attr(col, cv.HW_ERROR_CODE) or ""))
                counter_cols.append(i)
                counter_feature.append(-1)
            elif etype in _ERROR_FEATURES:
                counter_cols.append(i)
                counter_feature.append(int(_ERROR_FEATURES[etype]))
        elif m == cv.HW_THROTTLE_TIME.name:
            throttle = _THROTTLE_FEATURES.get(_attr(col, cv.HW_THROTTLE_REASON) or "")
            if throttle is not None:
                counter_cols.append(i)
                counter_feature.append(int(throttle))
        elif m == cv.HW_TEMPERATURE.name:
            temp.append((i, limit_of(col, m, "high.degraded", "throttled"), limit_of(col, m, "high.critical")))
        elif m in (cv.HW_FAN_SPEED.name, cv.HW_FAN_SPEED_RATIO.name):
            fans.setdefault(col.sensor, [-1, -1, -1])[0 if m == cv.HW_FAN_SPEED.name else 1] = i
            low = limit_of(col, cv.HW_FAN_SPEED.name, "low.degraded", "low.critical")
            if m == cv.HW_FAN_SPEED.name:
                fans[col.sensor][2] = low
        elif m == cv.HW_VOLTAGE.name:
            volts.append((i, limit_of(col, m, "low.critical"), limit_of(col, m, "high.critical")))
        elif m == cv.HW_STATUS.name:
            state = _attr(col, cv.HW_STATE)
            if state in STATE_CODE:
                status.append((i, STATE_CODE[state]))
        elif m == cv.HW_POWER_LIMIT.name:
            if _attr(col, cv.HW_LIMIT_TYPE) in (None, "max"):
                simple.setdefault("power_limit", []).append(i)
        elif m == cv.HW_GPU_UTILIZATION.name:
            if _attr(col, cv.HW_GPU_TASK) in (None, "general"):
                simple.setdefault("util", []).append(i)
        else:
            key = {
                cv.HW_POWER.name: "power",
                cv.HW_GPU_MEMORY_UTILIZATION.name: "mem_util",
                cv.HW_GPU_MEMORY_USAGE.name: "mem_usage",
                cv.HW_GPU_MEMORY_LIMIT.name: "mem_limit",
                cv.HW_PCIE_LINK_WIDTH.name: "width",
                cv.HW_PCIE_LINK_WIDTH_LIMIT.name: "width_max",
                cv.HW_PCIE_LINK_GENERATION.name: "gen",
                cv.HW_PCIE_LINK_GENERATION_LIMIT.name: "gen_max",
            }.get(m)
            if key is not None:
                simple.setdefault(key, []).append(i)

    def ix(cols: list[int]) -> np.ndarray:
        return np.asarray(cols, dtype=np.intp)

    return _Plan(
        width=len(columns),
        counter_cols=ix(counter_cols),
        counter_feature=np.asarray(counter_feature, dtype=np.intp),
        driver_cols=driver_cols,
        retired_cols=ix(retired),
        temp=temp,
        fans=[(speed, ratio, low) for speed, ratio, low in fans.values()],
        volts=volts,
        power=ix(simple.get("power", [])),
        power_limit=ix(simple.get("power_limit", [])),
        mem_util=ix(simple.get("mem_util", [])),
        mem_usage=ix(simple.get("mem_usage", [])),
        mem_limit=ix(simple.get("mem_limit", [])),
        util=ix(simple.get("util", [])),
        width_cols=ix(simple.get("width", [])),
        width_max=ix(simple.get("width_max", [])),
        gen_cols=ix(simple.get("gen", [])),
        gen_max=ix(simple.get("gen_max", [])),
        status=status,
    )


#: The gauges the sample stage reduces across their columns (fmax or fmin), by their plan's field.
_REDUCED: Final = (
    "power",
    "power_limit",
    "mem_util",
    "mem_usage",
    "mem_limit",
    "util",
    "width_cols",
    "width_max",
    "gen_cols",
    "gen_max",
)


#: The driver's error classes' features, as rows of the feature-major array (:meth:`FeatureExtractor._counters`).
_DRIVER_ROWS: Final = np.asarray([f for f in _DRIVER_FEATURES.values() if f is not None], dtype=np.intp)


def _reduce(values: np.ndarray, cols: np.ndarray, op: np.ufunc) -> np.ndarray:
    """``op`` (fmax/fmin) across ``cols`` per row, ignoring NaN; NaN where all are NaN."""
    if cols.size == 0:
        return nans(values.shape[0])
    return op.reduce(values[:, cols], axis=1)


def _sum_known(block: np.ndarray) -> np.ndarray:
    """Per row of ``block``, the sum of its known (not NaN) values; NaN where none is known (ufuncs' own
    reductions: ndarray.all and .sum add a Python-level call each)."""
    absent = np.isnan(block)
    return np.where(np.logical_and.reduce(absent, axis=1), np.nan, np.add.reduce(np.where(absent, 0.0, block), axis=1))


def _indicators(out: np.ndarray, marks: list[tuple[F, np.ndarray, np.ndarray]]) -> None:
    """Indicator features into ``out`` (``(samples, features)``, a view of the feature-major array): each
    (feature, condition, known) 1.0 / 0.0 where its inputs were known, NaN where they were not (absent from the
    window); all of them in one pass (a small batch pays each numpy call's fixed cost, not its work)."""
    if marks:
        features, conditions, known = zip(*marks, strict=True)
        out.T[list(features)] = np.where(np.array(known), np.array(conditions), np.nan)


class FeatureExtractor:
    """Turns batches of raw series into feature rows; keeps each series' previous counter value."""

    def __init__(self, schema: Schema, capacity: int) -> None:
        self.schema = schema
        self._plan: _Plan | None = None
        #: The last cumulative value per (row, counter): one column per counter column of the plan (in its
        #: order: the schema only appends, so a counter keeps its place), never one per schema column, so
        #: gauges, and columns no rule reads, cost nothing here.
        self.prev = np.full((capacity, 8), np.nan)
        self.prev_time = np.full(capacity, np.nan)

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.prev = grown_rows(self.prev, capacity, keep=keep)
        self.prev_time = grown_rows(self.prev_time, capacity, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        self.prev[rows] = np.nan
        self.prev_time[rows] = np.nan

    def plan(self) -> _Plan:
        if self._plan is None or self._plan.width != len(self.schema):
            self._plan = build_plan(self.schema.columns)
            counters = len(self._plan.counter_cols)
            if self.prev.shape[1] < counters:
                self.prev = grown(self.prev, max(counters, 2 * self.prev.shape[1]), np.nan, axis=1)
        return self._plan

    def extract(
        self,
        rows: np.ndarray | RowIndex,
        new: np.ndarray,
        time_s: np.ndarray,
        values: np.ndarray,
        params: DeviceParams,
        rounds: list[tuple[RowIndex, np.ndarray]] | None = None,
    ) -> np.ndarray:
        """Features for each sample, ``(features, samples)``: one sample of each row (rows unique), or with
        ``rounds``, several of a row (a device sampled more than once in a batch): each round's rows and their
        positions among the samples, every row at most once a round, in order. What a device carries from one
        sample to the next (its last time, its counters' baselines) moves on round by round; the rest is worked out
        once for every sample, the same values as round by round. ``values`` is ``(samples, columns)``, NaN =
        absent; ``new`` marks devices seen for the first time; ``params`` holds per-sample thresholds."""
        plan = self.plan()
        n = len(rows)
        if values.shape[1] < plan.width:  # a frame made before the schema grew: the newer columns are absent
            values = np.concatenate([values, np.full((n, plan.width - values.shape[1]), np.nan)], axis=1)
        parts: list[tuple[RowIndex, np.ndarray | None]] = [(RowIndex.of(rows), None)] if rounds is None else [*rounds]
        # Feature-major, as the stores keep them: ``out`` is its (rows, features) view, whose columns
        # (one feature of every row, what each step below writes) are contiguous.
        major = nans((N_FEATURES, n))
        out = major.T
        # NaN is "not read" throughout: comparisons and sums over it are expected (one context for both stages).
        with np.errstate(invalid="ignore", divide="ignore"):
            inc = self._carried(plan, parts, new, shaped(np.asarray(time_s), (n,)), values, out)
            self._counters(plan, inc, values, out, params)
            self._gauges(plan, values, out, params)
        return major

    def _carried(
        self,
        plan: _Plan,
        parts: list[tuple[RowIndex, np.ndarray | None]],
        new: np.ndarray,
        time_s: np.ndarray,
        values: np.ndarray,
        out: np.ndarray,
    ) -> np.ndarray | None:
        """What each sample takes from its device's previous one, round by round (``parts``: each round's rows and
        positions, None for all): its time step, and its counters' increases (returned, None without a counter
        column), with the restarts among them; each device's last time and baselines move on to the sample's."""
        cols = plan.counter_cols
        k = cols.size
        increases = np.empty((out.shape[0], k)) if k and parts[0][1] is not None else None  # (rounds: one array)
        for ix, at in parts:
            t = time_s if at is None else time_s[at]
            prev_t = ix.take(self.prev_time)
            step = np.where(np.isnan(prev_t), 0.0, np.maximum(t - prev_t, 0.0))
            ix.put(self.prev_time, t)
            if at is None:
                out[:, F.DT] = step
            else:
                out[at, F.DT] = step
            if not k:
                continue
            v = values[:, cols] if at is None else values[at[:, None], cols]
            baselines = self.prev[:, :k]  # counter j of the plan keeps its baseline in prev[:, j]
            prev = ix.take(baselines)
            have = ~np.isnan(v)
            # New series on a known device: all of it is new. A device's first sample: a baseline.
            # Gone down: reset, the new value is the new baseline. Otherwise the difference.
            inc = v - prev  # NaN where the series was not read
            down = v < prev
            np.copyto(inc, 0.0, where=down)
            first = np.isnan(prev) & have
            if any_of(first):
                fresh = new if at is None else new[at]
                inc[first] = np.where(fresh[:, None], 0.0, v)[first]
            ix.put(baselines, np.where(have, v, prev))
            if at is None:
                out[:, F.RESTARTS] = np.add.reduce(down, axis=1)
                return inc
            assert increases is not None
            out[at, F.RESTARTS] = np.add.reduce(down, axis=1)
            increases[at] = inc
        return increases

    # -- counters ------------------------------------------------------------------------------
    def _counters(
        self, plan: _Plan, inc: np.ndarray | None, values: np.ndarray, out: np.ndarray, params: DeviceParams
    ) -> None:
        """The counter features of every sample from its increases (``inc``: per counter column of the plan)."""
        if inc is not None:
            out[:, plan.single_features] = inc[:, plan.single_positions]
            for f, positions in plan.summed:
                block = inc[:, positions]
                out[:, f] = _sum_known(block)
            if plan.driver_cols:
                out.T[_DRIVER_ROWS] = 0.0  # (the feature-major rows: one assignment for the four)
                driver = nan_to_num(inc[:, plan.driver_positions])  # (one call: its fixed cost is many a column's)
                for j, (_, code) in enumerate(plan.driver_cols):
                    d = driver[:, j]
                    for feat, mine in params.driver_features(code):
                        out[:, feat] += d if mine is None else np.where(mine, d, 0.0)
        if plan.retired_cols.size:
            out[:, F.RETIRED_TOTAL] = _sum_known(values[:, plan.retired_cols])

    # -- gauges --------------------------------------------------------------------------------
    def _gauges(self, plan: _Plan, values: np.ndarray, out: np.ndarray, p: DeviceParams) -> None:
        n = values.shape[0]
        # The indicator features' (feature, condition, known), written at once at the end (_indicators).
        marks: list[tuple[F, np.ndarray, np.ndarray]] = []
        if plan.temp:
            temps = values[:, plan.temp_cols]
            deg = self._limits(values, plan.temp_limits[0], p.temp_degraded)
            crit = self._limits(values, plan.temp_limits[1], p.temp_critical)
            known = ~np.logical_and.reduce(np.isnan(temps), axis=1)
            out[:, F.TEMP_MAX] = np.fmax.reduce(temps, axis=1)
            marks.append((F.TEMP_HOT, np.logical_or.reduce(temps > deg, axis=1), known))
            marks.append((F.TEMP_CRIT, np.logical_or.reduce(temps > crit, axis=1), known))
        if plan.fans:
            low = np.zeros(n, dtype=bool)
            known = np.zeros(n, dtype=bool)
            for speed, ratio, limit in plan.fans:
                if speed >= 0:
                    rpm = values[:, speed]
                    floor = values[:, limit] if limit >= 0 else nans(n)
                    floor = np.where(np.isnan(floor), p.fan_min_rpm, np.maximum(floor, p.fan_min_rpm))
                    low |= rpm < floor
                    known |= ~np.isnan(rpm)
                if ratio >= 0:
                    low |= values[:, ratio] < p.fan_min_ratio
                    known |= ~np.isnan(values[:, ratio])
            warm = out[:, F.TEMP_MAX] >= p.warm
            marks.append((F.COOLING_BAD, low & warm, known & ~np.isnan(out[:, F.TEMP_MAX])))
        if plan.volts:
            bad = np.zeros(n, dtype=bool)
            known = np.zeros(n, dtype=bool)
            for volt, lo, hi in plan.volts:
                v = values[:, volt]
                if lo >= 0:
                    bad |= v < values[:, lo]
                if hi >= 0:
                    bad |= v > values[:, hi]
                known |= ~np.isnan(v) & ((lo >= 0) | (hi >= 0))
            marks.append((F.VOLT_BAD, bad, known))
        single = plan.single_gauge

        def reduced(name: str, op: np.ufunc) -> np.ndarray:
            col = single.get(name)
            return values[:, col].copy() if col is not None else _reduce(values, getattr(plan, name), op)

        power = reduced("power", np.fmax)
        cap = reduced("power_limit", np.fmin)
        marks.append((F.POWER_PINNED, power >= p.pinned_ratio * cap, ~np.isnan(power) & ~np.isnan(cap)))
        # No limit reported: a sample at the power cap for capped_share of its interval or more reached the limit
        # it is held to, and its power (read at one moment) is at most that limit.
        dt = out[:, F.DT]
        capped = (out[:, F.THROTTLE_POWER] >= p.capped_share * dt) & (dt > 0)
        out[:, F.POWER_LIMIT] = np.where(np.isnan(cap), np.where(capped, power, np.nan), cap)
        mem = reduced("mem_util", np.fmax)
        usage = reduced("mem_usage", np.fmax) / reduced("mem_limit", np.fmax)
        mem = np.where(np.isnan(mem), usage, mem)
        marks.append((F.MEM_FULL, mem >= p.mem_full, ~np.isnan(mem)))
        width, width_max = reduced("width_cols", np.fmin), reduced("width_max", np.fmax)
        gen, gen_max = reduced("gen_cols", np.fmin), reduced("gen_max", np.fmax)
        util = reduced("util", np.fmax)
        out[:, F.UTIL] = util
        marks.append((F.BUSY, util >= p.busy_util, ~np.isnan(util)))
        marks.append((F.WIDTH_DOWN, width < width_max, ~np.isnan(width) & ~np.isnan(width_max)))
        loaded = np.where(np.isnan(util), True, util >= p.gen_min_util)
        marks.append((F.GEN_DOWN, (gen < gen_max) & loaded, ~np.isnan(gen) & ~np.isnan(gen_max)))
        lanes = np.where(np.isnan(width), p.default_width, width)
        generation = np.minimum(np.maximum(np.where(np.isnan(gen), p.default_gen, gen), 1), 16).astype(int)
        out[:, F.LINK_EXPECTED] = p.rate_of_gen[generation] * lanes
        if plan.status:
            # The worst state any status series reports on (1), NaN where none does.
            status = values[:, plan.status_cols]
            reported = np.fmax.reduce(np.where(status >= 1, plan.status_codes, np.nan), axis=1)
            any_known = ~np.logical_and.reduce(np.isnan(status), axis=1)
            out[:, F.VENDOR_STATE] = np.where(any_known & np.isnan(reported), 0.0, reported)
        _indicators(out, marks)

    @staticmethod
    def _limits(values: np.ndarray, cols: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        """Per (row, sensor): the sensor's own limit where reported (its column, -1 for none), the policy
        fallback otherwise."""
        own = values[:, cols]
        missing = cols < 0  # (-1 read the last column: those sensors have no limit series)
        if any_of(missing):
            own[:, missing] = np.nan
        return np.where(np.isnan(own), fallback[:, None], own)
