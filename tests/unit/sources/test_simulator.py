"""The simulated node behaves like GPUs, and each injected reason leaves the evidence
failure-modes.md names for it, on the faulted device only."""

import numpy as np
import pytest

from otel_dra import conventions as cv
from otel_dra.faults import Fault
from otel_dra.frame import Frame
from otel_dra.sources.simulated import (
    BAD_FIRMWARE,
    DRIVER_FAULT_XID,
    TEMP_LIMITS_GPU,
    SimulatedSource,
    SimulatorConfig,
    driver_error_column,
    gpu_columns,
)

S = 10**9
COLS = gpu_columns()


def run(faults=(), devices=4, seconds=300, step=5, seed=7) -> tuple[SimulatedSource, list[Frame]]:
    src = SimulatedSource(SimulatorConfig("node-1", devices=devices, faults=tuple(faults), seed=seed))
    frames = [src.read(t * S) for t in range(0, seconds + 1, step)]
    return src, frames


def col(src: SimulatedSource, frame: Frame, key: str) -> np.ndarray:
    return frame.values[:, src.schema.index(COLS[key])]


def increase(src, frames, key, start=0):
    return col(src, frames[-1], key) - col(src, frames[start], key)


def test_healthy_node_is_plausible():
    src, frames = run()
    last = frames[-1]
    assert not np.isnan(last.values).any()
    temp, power = col(src, last, "temp.gpu"), col(src, last, "power")
    assert ((temp > 30) & (temp < TEMP_LIMITS_GPU["high.degraded"])).all()
    assert ((power > 60) & (power <= col(src, last, "power.limit.max"))).all()
    assert (increase(src, frames, "energy") > 0).all()
    assert (increase(src, frames, "errors.uncorrected") == 0).all()
    counters = [k for k in COLS if k.startswith(("errors.", "energy", "io.", "throttle."))]
    for key in counters:
        series = np.stack([col(src, f, key) for f in frames])
        assert (np.diff(series, axis=0) >= 0).all(), f"{key} is a counter and must not go down"


def test_simulation_is_repeatable_with_a_seed():
    a = run(seed=11)[1][-1].values
    b = run(seed=11)[1][-1].values
    assert np.array_equal(a, b, equal_nan=True)


def faulted(reason, at=60):
    src, frames = run([Fault("gpu-1", reason, at)])
    return src, frames, frames[at // 5]


def test_memory_ecc_uncorrected_rises_on_that_device_only():
    src, frames, onset = faulted("memory_ecc")
    before = frames.index(onset) - 1
    assert (increase(src, frames[: before + 1], "errors.uncorrected") == 0).all()
    rise = increase(src, frames, "errors.uncorrected")
    assert rise[1] >= 1 and (np.delete(rise, 1) == 0).all()
    assert increase(src, frames, "errors.retired_page")[1] >= 1


def test_thermal_sustains_above_the_degraded_limit_and_throttles():
    src, frames, _ = faulted("thermal")
    temps = np.stack([col(src, f, "temp.gpu") for f in frames[-20:]])
    assert (temps[:, 1] > TEMP_LIMITS_GPU["high.degraded"]).all()
    assert (temps[:, [0, 2, 3]] < TEMP_LIMITS_GPU["high.degraded"]).all()
    assert increase(src, frames, "throttle.thermal")[1] > 60


def test_cooling_stops_the_fan_and_heats_the_device():
    src, frames, _ = faulted("cooling")
    last = frames[-1]
    assert col(src, last, "fan.speed")[1] < col(src, last, "fan.limit.low.critical")[1]
    assert col(src, last, "temp.gpu")[1] > col(src, frames[0], "temp.gpu")[1] + 10


def test_power_throttling_pins_power_at_the_cap():
    src, frames, _ = faulted("power_throttling")
    last = frames[-1]
    assert col(src, last, "power")[1] == pytest.approx(col(src, last, "power.limit.max")[1])
    assert increase(src, frames, "throttle.power", start=13)[1] == pytest.approx(300 - 65, abs=5)


def test_power_delivery_errors_and_voltage_out_of_range():
    src, frames, _ = faulted("power_delivery")
    assert increase(src, frames, "errors.power")[1] >= 2
    assert col(src, frames[-1], "volt")[1] < col(src, frames[-1], "volt.limit.low.critical")[1]


def test_memory_pressure_fills_memory_and_runs_out():
    src, frames, _ = faulted("memory_pressure")
    assert col(src, frames[-1], "mem.util")[1] >= 0.95
    assert increase(src, frames, "errors.out_of_memory")[1] >= 2


def test_link_fault_raises_replays_and_halves_the_width():
    src, frames, _ = faulted("link")
    replays = increase(src, frames, "errors.link.pcie", start=13)
    assert replays[1] > 50 and (np.delete(replays, 1) < 5).all()
    assert col(src, frames[-1], "pcie.width")[1] < col(src, frames[-1], "pcie.width.limit")[1]


def test_driver_error_is_a_new_series_with_its_code():
    src, frames, _ = faulted("driver_errors")
    column = src.schema.index(driver_error_column(DRIVER_FAULT_XID))
    assert frames[0].values.shape[1] <= column, "the code's series is born at the first event"
    counts = frames[-1].values[:, column]
    assert counts[1] >= 1 and (np.delete(counts, 1) == 0).all()


def test_firmware_fault_reports_the_bad_version():
    _, frames, _ = faulted("firmware")
    assert frames[0].devices.attrs[1][cv.HW_FIRMWARE_VERSION] != BAD_FIRMWARE
    assert frames[-1].devices.attrs[1][cv.HW_FIRMWARE_VERSION] == BAD_FIRMWARE
    assert frames[-1].devices.attrs[0][cv.HW_FIRMWARE_VERSION] != BAD_FIRMWARE


def test_device_reset_recurs():
    src, frames, _ = faulted("device_reset")
    assert increase(src, frames, "errors.reset")[1] >= 3


def test_vendor_status_reports_failed():
    src, frames, _ = faulted("vendor_status")
    assert col(src, frames[-1], "status.failed")[1] == 1 and col(src, frames[-1], "status.ok")[1] == 0
    assert (col(src, frames[-1], "status.ok")[[0, 2, 3]] == 1).all()


def test_device_lost_silences_one_device_and_stale_the_whole_node():
    _, frames, _ = faulted("device_lost")
    assert np.isnan(frames[-1].values[1]).all() and not np.isnan(frames[-1].values[0]).any()
    _, frames, _ = faulted("stale")
    assert np.isnan(frames[-1].values).all() and not np.isnan(frames[0].values).any()


def test_unknown_device_in_a_fault_is_a_clear_error():
    with pytest.raises(ValueError, match=r"gpu-0 \.\. gpu-3"):
        SimulatorConfig("n", devices=4, faults=(Fault("gpu-9", "thermal"),))
