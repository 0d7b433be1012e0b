"""The lean numpy helpers give numpy's own values (:mod:`otel_dra.classifier.numeric`), and the driver error
classes worked out per group give what a look-up per row did (:class:`~otel_dra.classifier.features.DriverClasses`)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from otel_dra import conventions as cv
from otel_dra.classifier.features import STATE_CODE, DeviceParams, DriverClasses, F, FeatureExtractor
from otel_dra.classifier.numeric import all_of, any_of, filled, flatnonzero, nan_to_num, nans, shaped
from otel_dra.classifier.rows import RowIndex
from otel_dra.frame import Column, Schema

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=6)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(values=hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=6), elements=floats))
def test_nan_to_num_is_numpys(values: np.ndarray) -> None:
    ours, theirs = nan_to_num(values), np.nan_to_num(values)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert np.array_equal(ours, theirs) and np.array_equal(np.signbit(ours), np.signbit(theirs))
    assert not np.shares_memory(ours, values)  # a new array, as numpy's (copy=True)


def test_nan_to_num_other_dtypes_go_to_numpy() -> None:
    ints = np.arange(4)
    assert nan_to_num(ints).dtype == ints.dtype and np.array_equal(nan_to_num(ints), ints)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    values=st.one_of(
        hnp.arrays(np.bool_, SHAPES),
        hnp.arrays(np.float64, SHAPES, elements=floats),
        hnp.arrays(np.int64, SHAPES, elements=st.integers(-2, 2)),
    )
)
def test_any_all_and_flatnonzero_are_numpys(values: np.ndarray) -> None:
    """NaN is true to both (ndarray.any counts it; so does a count of non-zero values), and an empty array is
    all and not any."""
    assert any_of(values) is bool(values.any()) and all_of(values) is bool(values.all())
    found = flatnonzero(values)
    assert found.dtype == np.flatnonzero(values).dtype and np.array_equal(found, np.flatnonzero(values))


@pytest.mark.parametrize("values", [np.float64(3.5), np.arange(1.0, 6.0), np.arange(5, dtype=np.int64)])
def test_shaped_is_np_broadcast_to(values: np.ndarray) -> None:
    got = shaped(np.asarray(values), (5,))
    np.testing.assert_array_equal(got, np.broadcast_to(values, (5,)))
    assert got.shape == (5,) and got.dtype == np.asarray(values).dtype
    with pytest.raises(ValueError):
        shaped(np.arange(3.0), (5,))


def test_nans_is_np_full_of_nan() -> None:
    for shape in (0, 5, (3, 4), (0, 2)):
        ours, theirs = nans(shape), np.full(shape, np.nan)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and np.isnan(ours).all()


def test_filled_is_np_full() -> None:
    for shape, value, dtype in ((5, -np.inf, np.float64), ((3, 4), 2.5, np.float64), (4, 0, np.int64), (0, 7, np.int8)):
        ours, theirs = filled(shape, value, dtype), np.full(shape, value, dtype)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)


def _params(groups: list[int], driver: DriverClasses) -> DeviceParams:
    one = np.ones(len(groups))
    thresholds = {
        f.name: one for f in fields(DeviceParams) if f.name not in ("groups", "driver", "rate_of_gen", "_driver")
    }
    return DeviceParams(**thresholds, groups=np.asarray(groups, dtype=np.intp), driver=driver)  # type: ignore[arg-type]


def test_driver_features_per_row_follow_each_groups_table() -> None:
    tables: list[dict[str, str]] = [{"13": "application", "79": "reset_device"}, {"79": "reboot_node"}]
    driver = DriverClasses(tables)
    # Code 79: reset in group 0, reboot in group 1; a batch of both has a mask for each.
    both = _params([0, 1, 1], driver).driver_features("79")
    assert [(f, None if m is None else m.tolist()) for f, m in both] == [
        (F.DRIVER_RESET, [True, False, False]),
        (F.DRIVER_REBOOT, [False, True, True]),
    ]
    # A batch of group 1 only: every row's (no mask), and the other class left out.
    assert _params([1, 1], driver).driver_features("79") == [(F.DRIVER_REBOOT, None)]
    # A code no table names is an application error everywhere.
    assert _params([0, 1], driver).driver_features("999") == [(F.DRIVER_APPLICATION, None)]
    # An ignored code counts toward nothing.
    tables[0]["43"] = "ignore"
    assert _params([0], driver).driver_features("43") == []
    # A group added later is read: the code's classes are worked out again.
    tables.append({"13": "mechanical"})
    assert [(f, None if m is None else m.tolist()) for f, m in _params([0, 2], driver).driver_features("13")] == [
        (F.DRIVER_APPLICATION, [True, False]),
        (F.DRIVER_MECHANICAL, [False, True]),
    ]


def _sample_stage_schema() -> Schema:
    """Two temperature sensors, one with its own degraded limit series, and four status series."""
    temp, status = cv.HW_TEMPERATURE.name, cv.HW_STATUS.name
    gpu = {"sensor": "temp/gpu", "sensor_type": "temperature"}
    mem = {"sensor": "temp/mem", "sensor_type": "temperature"}
    return Schema(
        [
            Column(temp, **gpu),
            Column(temp + ".limit", ((cv.HW_LIMIT_TYPE, "high.degraded"),), **gpu),
            Column(temp, **mem),
            *(Column(status, ((cv.HW_STATE, state),)) for state in ("ok", "degraded", "failed", "predicted_failure")),
        ]
    )


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 6), st.just(7)),
        elements=st.one_of(st.just(np.nan), st.sampled_from([0.0, 1.0]), st.floats(20, 110)),
    )
)
def test_the_sample_stage_reads_limits_and_states_as_each_sensor_and_series_says(values: np.ndarray) -> None:
    """A sensor's own limit where its series has a value, the policy's otherwise; the worst state any status series
    is on, 0 where some are read and none is on, NaN where none is read (each sensor and series read one by one)."""
    extractor = FeatureExtractor(_sample_stage_schema(), capacity=8)
    n = values.shape[0]
    params = _params([0] * n, DriverClasses([]))
    params.temp_degraded, params.temp_critical = np.full(n, 80.0), np.full(n, 95.0)
    feats = extractor.extract(np.arange(n), np.ones(n, dtype=bool), np.zeros(n), values, params)
    for i, row in enumerate(values):
        gpu_bar = 80.0 if np.isnan(row[1]) else row[1]
        temps = [(row[0], gpu_bar), (row[2], 80.0)]
        read = [t for t, _ in temps if not np.isnan(t)]
        hot = float(any(t > bar for t, bar in temps)) if read else np.nan
        crit = float(any(t > 95.0 for t, _ in temps)) if read else np.nan
        np.testing.assert_array_equal(feats[[F.TEMP_HOT, F.TEMP_CRIT], i], [hot, crit])
        codes = [STATE_CODE[s] for s in ("ok", "degraded", "failed", "predicted_failure")]
        states = row[3:]
        on = [c for c, v in zip(codes, states, strict=True) if v >= 1]
        worst = float(max(on)) if on else (0.0 if not np.isnan(states).all() else np.nan)
        np.testing.assert_array_equal(feats[F.VENDOR_STATE, i], worst)


def _gauge_schema(copies: int) -> Schema:
    """Every reduced gauge (power .. the PCIe generation's limit), each fed by ``copies`` series."""
    metrics = [
        cv.HW_POWER,
        cv.HW_POWER_LIMIT,
        cv.HW_GPU_UTILIZATION,
        cv.HW_GPU_MEMORY_UTILIZATION,
        cv.HW_GPU_MEMORY_USAGE,
        cv.HW_GPU_MEMORY_LIMIT,
        cv.HW_PCIE_LINK_WIDTH,
        cv.HW_PCIE_LINK_WIDTH_LIMIT,
        cv.HW_PCIE_LINK_GENERATION,
        cv.HW_PCIE_LINK_GENERATION_LIMIT,
    ]
    return Schema([Column(m.name, ((cv.HW_ID, f"part-{k}"),)) for m in metrics for k in range(copies)])


@pytest.mark.parametrize("copies", [1, 2])
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_gauges_read_off_one_block_are_what_reducing_each_column_gives(copies: int, data: st.DataObject) -> None:
    """A gauge fed by one column is that column, copied (FeatureExtractor._gauges); the features are the ones
    each gauge's own reduction gives (the plan told to reduce every one)."""
    schema = _gauge_schema(copies)
    values = data.draw(
        hnp.arrays(
            np.float64,
            st.tuples(st.integers(1, 6), st.just(len(schema))),
            elements=st.one_of(st.just(np.nan), st.sampled_from([-0.0, 0.0, 1.0, 4.0, 16.0]), st.floats(0, 700)),
        )
    )
    n = values.shape[0]
    features = []
    for single in (True, False):
        extractor = FeatureExtractor(schema, capacity=8)
        if not single:
            extractor.plan().single_gauge = {}
        assert bool(extractor.plan().single_gauge) == (single and copies == 1)
        features.append(
            extractor.extract(
                np.arange(n), np.ones(n, dtype=bool), np.zeros(n), values, _params([0] * n, DriverClasses([]))
            )
        )
    np.testing.assert_array_equal(features[0], features[1])
    assert np.array_equal(np.signbit(features[0]), np.signbit(features[1]))


def _counter_schema() -> Schema:
    """Counters of every kind the sample stage reads (two corrected-ECC series summed into one feature, driver
    error codes of two classes, power-cap time), retired pages, and the gauges the power limit is seen by."""
    errors, throttle = cv.HW_ERRORS.name, cv.HW_THROTTLE_TIME.name
    kind = cv.ERROR_TYPE_ATTR
    return Schema(
        [
            Column(errors, ((kind, "corrected"), (cv.HW_ID, "a"))),
            Column(errors, ((kind, "corrected"), (cv.HW_ID, "b"))),
            Column(errors, ((kind, "uncorrected"),)),
            Column(errors, ((kind, "driver"), (cv.HW_ERROR_CODE, "79"))),
            Column(errors, ((kind, "driver"), (cv.HW_ERROR_CODE, "13"))),
            Column(errors, ((kind, "retired_page"),)),
            Column(throttle, ((cv.HW_THROTTLE_REASON, "power"),)),
            Column(cv.HW_POWER.name),
            Column(cv.HW_GPU_UTILIZATION.name),
        ]
    )


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_a_batch_of_several_samples_a_device_is_the_rounds_one_after_another(data: st.DataObject) -> None:
    """The sample stage over a batch where devices repeat (FeatureExtractor.extract with ``rounds``) gives each
    sample the features, and leaves each device the baselines and last time, that the rounds one after another give:
    counters that climb, reset (go down), appear late or go unread, on new and known devices, in mixed groups."""
    schema = _counter_schema()
    n_rows = data.draw(st.integers(1, 4))
    rows = np.asarray(data.draw(st.lists(st.integers(0, n_rows - 1), min_size=1, max_size=10)), dtype=np.intp)
    n = rows.size
    counters = st.one_of(st.just(np.nan), st.sampled_from([0.0, 1.0, 2.0, 5.0, 100.0]), st.floats(0, 1e6))
    values = data.draw(hnp.arrays(np.float64, (n, len(schema)), elements=counters))
    times = np.cumsum(data.draw(hnp.arrays(np.float64, n, elements=st.floats(0, 30)))) + 1e9
    new = np.asarray(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    groups = data.draw(st.lists(st.integers(0, 1), min_size=n_rows, max_size=n_rows))
    driver = DriverClasses([{"79": "reset_device"}, {"79": "reboot_node", "13": "mechanical"}])
    # Rounds as the batch makes them: each row's k-th sample in round k.
    rank = np.asarray([int((rows[:i] == r).sum()) for i, r in enumerate(rows)])
    rounds = [np.flatnonzero(rank == k) for k in range(int(rank.max()) + 1)]
    history = data.draw(hnp.arrays(np.float64, (n_rows, len(schema)), elements=counters))  # an earlier sample
    merged, stepped = FeatureExtractor(schema, capacity=8), FeatureExtractor(schema, capacity=8)
    everyone = np.arange(n_rows)
    for extractor in (merged, stepped):
        extractor.extract(everyone, np.ones(n_rows, bool), np.full(n_rows, 1e9 - 60), history, _params(groups, driver))
    parts = [(RowIndex(rows[at]), at) for at in rounds]
    got = merged.extract(rows, new, times, values, _params([groups[r] for r in rows], driver), parts)
    want = np.full_like(got, np.nan)
    for at in rounds:
        r = rows[at]
        want[:, at] = stepped.extract(r, new[at], times[at], values[at], _params([groups[i] for i in r], driver))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(merged.prev, stepped.prev)
    np.testing.assert_array_equal(merged.prev_time, stepped.prev_time)
