"""NvmlSource on the node's real NVIDIA GPUs: every contract signal with sane values and limits,
and the latency of one sampling pass. Skipped where pynvml can't load or finds no GPU."""

from __future__ import annotations

import time

import numpy as np
import pytest

from otel_dra import conventions as cv
from otel_dra.sources.nvml import NvmlSource, nvml_available

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (otel-dra[nvidia])")
_ok, _why = nvml_available(pynvml)
pytestmark = pytest.mark.skipif(not _ok, reason=f"no usable NVIDIA GPU: {_why}")

#: (metric, attribute subset) -> (low, high) sane bounds; None for "any finite value >= 0".
SANE: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, float] | None] = {
    (cv.HW_TEMPERATURE.name, ((cv.HW_SENSOR_LOCATION, "gpu"),)): (5.0, 110.0),
    (cv.HW_TEMPERATURE_LIMIT.name, ((cv.HW_SENSOR_LOCATION, "gpu"), (cv.HW_LIMIT_TYPE, "high.degraded"))): (
        60.0,
        120.0,
    ),
    (cv.HW_TEMPERATURE_LIMIT.name, ((cv.HW_SENSOR_LOCATION, "gpu"), (cv.HW_LIMIT_TYPE, "high.critical"))): (
        60.0,
        130.0,
    ),
    (cv.HW_POWER.name, ()): (1.0, 1500.0),
    (cv.HW_POWER_LIMIT.name, ((cv.HW_LIMIT_TYPE, "max"),)): (50.0, 1500.0),
    (cv.HW_ENERGY.name, ()): None,
    (cv.HW_GPU_UTILIZATION.name, ()): (0.0, 1.0),
    (cv.HW_GPU_MEMORY_USAGE.name, ()): None,
    (cv.HW_GPU_MEMORY_LIMIT.name, ()): (1 << 30, 1 << 40),
    (cv.HW_GPU_MEMORY_UTILIZATION.name, ()): (0.0, 1.0),
    (cv.HW_ERRORS.name, ((cv.ERROR_TYPE_ATTR, "link"),)): None,
    (cv.HW_PCIE_LINK_WIDTH.name, ()): (1.0, 32.0),
    (cv.HW_PCIE_LINK_WIDTH_LIMIT.name, ()): (1.0, 32.0),
    (cv.HW_PCIE_LINK_GENERATION.name, ()): (1.0, 7.0),
    (cv.HW_PCIE_LINK_GENERATION_LIMIT.name, ()): (1.0, 7.0),
    (cv.HW_THROTTLE_TIME.name, ((cv.HW_THROTTLE_REASON, "thermal"),)): None,
    (cv.HW_THROTTLE_TIME.name, ((cv.HW_THROTTLE_REASON, "power_cap"),)): None,
}
#: Present on data-center GPUs (ECC on); reported, not required.
OPTIONAL = (
    (cv.HW_ERRORS.name, ((cv.ERROR_TYPE_ATTR, "corrected"),)),
    (cv.HW_ERRORS.name, ((cv.ERROR_TYPE_ATTR, "uncorrected"),)),
    (cv.HW_ERRORS.name, ((cv.ERROR_TYPE_ATTR, "retired_page"),)),
    (cv.HW_TEMPERATURE.name, ((cv.HW_SENSOR_LOCATION, "memory"),)),
    (cv.HW_THROTTLE_TIME.name, ((cv.HW_THROTTLE_REASON, "other"),)),
    (cv.HW_THROTTLE_TIME.name, ((cv.HW_THROTTLE_REASON, "hw_slowdown"),)),
    (cv.HW_THROTTLE_TIME.name, ((cv.HW_THROTTLE_REASON, "power_brake"),)),
)


def _column(src: NvmlSource, metric: str, attrs: tuple[tuple[str, str], ...]) -> int:
    hits = [i for i, c in enumerate(src.schema.columns) if c.metric == metric and set(attrs) <= set(c.attrs)]
    assert len(hits) == 1, (metric, attrs)
    return hits[0]


def test_real_gpus_report_every_contract_signal() -> None:
    src = NvmlSource("real-node")
    try:
        first = src.read(time.time_ns())
        time.sleep(1.0)
        frame = src.read(time.time_ns())
        assert len(frame.devices) >= 1
        for r, dev in enumerate(frame.devices.ids):
            attrs = frame.devices.attrs[r]
            assert dev.startswith(("GPU-", "MIG-")) and attrs[cv.HW_TYPE] == "gpu"
            assert attrs[cv.DRA_DEVICE_NAME] == f"gpu-{r}" and attrs[cv.HW_DRIVER_VERSION]
            row = frame.values[r]
            assert not np.isnan(row).all(), f"{dev}: not read at all"
            for (metric, sub), bounds in SANE.items():
                v = row[_column(src, metric, sub)]
                assert np.isfinite(v) and v >= 0, f"{dev} {metric}{dict(sub)} = {v}"
                if bounds is not None:
                    assert bounds[0] <= v <= bounds[1], f"{dev} {metric}{dict(sub)} = {v} not in {bounds}"
            loc = (cv.HW_SENSOR_LOCATION, "gpu")
            degraded = row[_column(src, cv.HW_TEMPERATURE_LIMIT.name, (loc, (cv.HW_LIMIT_TYPE, "high.degraded")))]
            critical = row[_column(src, cv.HW_TEMPERATURE_LIMIT.name, (loc, (cv.HW_LIMIT_TYPE, "high.critical")))]
            assert degraded <= critical
            mem = row[_column(src, cv.HW_GPU_MEMORY_USAGE.name, ())]
            assert mem <= row[_column(src, cv.HW_GPU_MEMORY_LIMIT.name, ())]
            energy = _column(src, cv.HW_ENERGY.name, ())
            assert row[energy] >= first.values[r, energy], "energy is cumulative"
            for metric, sub in OPTIONAL:
                print(f"{dev} optional {metric}{dict(sub)} = {row[_column(src, metric, sub)]}")
    finally:
        src.close()


def test_sampling_pass_latency_per_gpu() -> None:
    src = NvmlSource("real-node")
    try:
        src.read(time.time_ns())  # warm: discovery of unsupported fields and fans
        passes = 5
        started = time.perf_counter()
        for _ in range(passes):
            frame = src.read(time.time_ns())
        elapsed = (time.perf_counter() - started) / passes
        per_gpu_ms = 1000.0 * elapsed / len(frame.devices)
        print(f"nvml: {len(frame.devices)} GPU(s), {elapsed * 1000:.1f} ms per pass, {per_gpu_ms:.1f} ms per GPU")
        assert elapsed < 5.0  # a pass must fit well inside the 10 s sampling interval
    finally:
        started = time.perf_counter()
        src.close()
        assert time.perf_counter() - started < 2.0


def _fields(handle: object, ids: list[int]) -> dict[int, tuple[int, int, float]]:
    """field id -> (nvmlReturn, valueType, value) as this driver answers."""
    out = {}
    for fv in pynvml.nvmlDeviceGetFieldValues(handle, ids):
        value = float("nan")
        if fv.nvmlReturn == 0:
            value = float(
                getattr(fv.value, ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[fv.valueType])
            )
        out[int(fv.fieldId)] = (int(fv.nvmlReturn), int(fv.valueType), value)
    return out


def test_throttle_counters_are_what_the_source_takes_them_for() -> None:
    """What this driver answers for the clock-event time counters: the slowdown ids the source picks for its
    version are 64-bit counts (or NOT_SUPPORTED), every counter is in ns (it grows no faster than the wall
    clock), field 74 is the power policy's violation time, and the reasons bitmask is an int. Prints both
    numberings' answers, so a run on a new driver shows whether _SLOWDOWN_FIELD_IDS needs a line."""
    from otel_dra.sources.nvml import slowdown_field_ids

    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        ids = slowdown_field_ids(driver)
        counts = {
            pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG,
            pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG,
        }
        asked = [74, 75, 76, 77, 79, 251, 252, 253, 269, 270, 271]
        for index in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            started = time.monotonic()
            first = _fields(h, asked)
            power = pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER).violationTime
            time.sleep(2.0)
            second = _fields(h, asked)
            elapsed_ns = (time.monotonic() - started) * 1e9
            reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            print(f"GPU {index} driver {driver}: slowdown ids {ids}, reasons {reasons:#x}")
            for fid in asked:
                print(f"  field {fid}: (return, type, value) {first[fid]} -> {second[fid]}")
            assert isinstance(reasons, int)
            for fid in ids or ():
                code, value_type, _ = second[fid]
                assert code != 0 or value_type in counts, f"field {fid} is not a count on driver {driver}"
            for fid in [74, 75, 76, 77, 79, *(ids or ())]:
                (c1, _, v1), (c2, _, v2) = first[fid], second[fid]
                if c1 == 0 and c2 == 0:
                    assert 0 <= v2 - v1 <= elapsed_ns * 1.05 + 1e7, f"field {fid} grew {v2 - v1} in {elapsed_ns} ns"
            if first[74][0] == 0:
                assert abs(first[74][2] - power) <= elapsed_ns, "field 74 is the power policy's violation time"
    finally:
        pynvml.nvmlShutdown()
