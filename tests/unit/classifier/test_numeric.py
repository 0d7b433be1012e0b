"""The lean numpy helpers give numpy's own values (:mod:`otel_dra.classifier.numeric`), and the driver error
classes worked out per group give what a look-up per row did (:class:`~otel_dra.classifier.features.DriverClasses`)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from otel_dra.classifier.features import DeviceParams, DriverClasses, F
from otel_dra.classifier.numeric import nan_to_num

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


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


def _params(groups: list[int], driver: DriverClasses) -> DeviceParams:
    one = np.ones(len(groups))
    thresholds = {
        f.name: one for f in fields(DeviceParams) if f.name not in ("groups", "driver", "per_lane_rate", "_driver")
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
