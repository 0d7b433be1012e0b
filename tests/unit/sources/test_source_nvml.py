"""NvmlSource against a fake pynvml: signals and units, per-device failures, XID events, and a
lost GPU judged by the real classifier."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pynvml")

from otel_dra import conventions as cv
from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier
from otel_dra.config import AgentConfig
from otel_dra.frame import Frame, Schema
from otel_dra.sources import SourceUnavailable
from otel_dra.sources import nvml as nvml_mod
from otel_dra.sources.nvml import DRA_DRIVER, NvmlSource, nvml_available, nvml_gpus
from tests.support.fake_nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_UNKNOWN,
    FakeGpu,
    FakeNvml,
)

T0 = 1_764_000_000_000_000_000
S = 1_000_000_000


def make(n: int = 3, **kw: object) -> tuple[FakeNvml, NvmlSource]:
    fake = FakeNvml([FakeGpu(uuid=f"GPU-{i:08d}-aaaa", **kw) for i in range(n)])  # type: ignore[arg-type]
    return fake, NvmlSource("node-a", nvml=fake)


def value(src: NvmlSource, frame: Frame, row: int, metric: str, **attrs: str) -> float:
    """The one column matching ``metric`` and ``attrs`` (a subset of its attributes)."""
    hits = [
        i
        for i, col in enumerate(src.schema.columns)
        if col.metric == metric and set(attrs.items()) <= set(col.attrs) and i < frame.values.shape[1]
    ]
    assert len(hits) == 1, (metric, attrs, hits)
    return float(frame.values[row, hits[0]])


def test_healthy_gpu_reports_every_signal_in_contract_units() -> None:
    _fake, src = make(2, fans_pct=[40, 55])
    try:
        f = src.read(T0)
        assert f.devices.ids == ("GPU-00000000-aaaa", "GPU-00000001-aaaa")
        attrs = f.devices.attrs[1]
        assert attrs[cv.HW_TYPE] == "gpu" and attrs[cv.HW_VENDOR] == "NVIDIA"
        assert attrs[cv.HW_NAME] == attrs[cv.HW_MODEL] == "NVIDIA H100 80GB HBM3"
        assert attrs[cv.HW_SERIAL_NUMBER] == "1654123456789"
        assert attrs[cv.HW_FIRMWARE_VERSION] == "96.00.99.00.01"
        assert attrs[cv.HW_DRIVER_VERSION] == "580.95.05"
        assert attrs[cv.DRA_DRIVER_NAME] == DRA_DRIVER == "gpu.nvidia.com"
        assert attrs[cv.DRA_POOL_NAME] == "node-a" and attrs[cv.DRA_DEVICE_NAME] == "gpu-1"
        v = lambda metric, **a: value(src, f, 1, metric, **a)  # noqa: E731
        loc, lim, et = cv.HW_SENSOR_LOCATION, cv.HW_LIMIT_TYPE, cv.ERROR_TYPE_ATTR
        assert v(cv.HW_TEMPERATURE.name, **{loc: "gpu"}) == 45
        assert v(cv.HW_TEMPERATURE_LIMIT.name, **{loc: "gpu", lim: "high.degraded"}) == 87
        assert v(cv.HW_TEMPERATURE_LIMIT.name, **{loc: "gpu", lim: "high.critical"}) == 92
        assert v(cv.HW_TEMPERATURE.name, **{loc: "memory"}) == 50
        assert v(cv.HW_TEMPERATURE_LIMIT.name, **{loc: "memory", lim: "high.degraded"}) == 95
        assert v(cv.HW_POWER.name) == pytest.approx(350.0)
        assert v(cv.HW_POWER_LIMIT.name, **{lim: "max"}) == pytest.approx(700.0)
        assert v(cv.HW_ENERGY.name) == pytest.approx(5_000_000.0)
        assert v(cv.HW_GPU_UTILIZATION.name, **{cv.HW_GPU_TASK: "general"}) == pytest.approx(0.60)
        assert v(cv.HW_GPU_MEMORY_USAGE.name) == 20 << 30
        assert v(cv.HW_GPU_MEMORY_LIMIT.name) == 80 << 30
        assert v(cv.HW_GPU_MEMORY_UTILIZATION.name) == pytest.approx(0.25)
        assert v(cv.HW_ERRORS.name, **{et: "corrected"}) == 3
        assert v(cv.HW_ERRORS.name, **{et: "uncorrected"}) == 0
        assert v(cv.HW_ERRORS.name, **{et: "retired_page"}) == 1  # 0 retired pages + 1 remapped row
        assert v(cv.HW_ERRORS.name, **{et: "link", cv.HW_LINK_TYPE: "pcie"}) == 2
        assert v(cv.HW_PCIE_LINK_WIDTH.name) == 16 and v(cv.HW_PCIE_LINK_WIDTH_LIMIT.name, **{lim: "max"}) == 16
        assert v(cv.HW_PCIE_LINK_GENERATION.name) == 5
        assert v(cv.HW_PCIE_LINK_GENERATION_LIMIT.name, **{lim: "max"}) == 5
        reason = cv.HW_THROTTLE_REASON
        assert v(cv.HW_THROTTLE_TIME.name, **{reason: "thermal"}) == pytest.approx(2.0)
        assert v(cv.HW_THROTTLE_TIME.name, **{reason: "power_cap"}) == pytest.approx(5.0)  # the power policy's
        assert v(cv.HW_THROTTLE_TIME.name, **{reason: "other"}) == pytest.approx(1.5)
        assert v(cv.HW_THROTTLE_TIME.name, **{reason: "hw_slowdown"}) == 0.0
        assert v(cv.HW_THROTTLE_TIME.name, **{reason: "power_brake"}) == 0.0
        assert not [c for c in src.schema.columns if dict(c.attrs).get(reason) == "power"]  # the cap is power_cap
        fans = {c.sensor: i for i, c in enumerate(src.schema.columns) if c.metric == cv.HW_FAN_SPEED_RATIO.name}
        assert f.values[1, fans["fan/0"]] == pytest.approx(0.40)
        assert f.values[1, fans["fan/1"]] == pytest.approx(0.55)
        assert all(c.sensor_type == "fan" for c in src.schema.columns if c.sensor in fans)
        # Nothing left NaN on a healthy GPU (no XID column exists yet).
        assert not np.isnan(f.values).any()
    finally:
        src.close()


def test_lost_gpu_gets_a_nan_row_and_the_others_keep_reporting() -> None:
    fake, src = make(3)
    try:
        assert not np.isnan(src.read(T0).values).any()
        fake.gpus[1].fail = NVML_ERROR_GPU_IS_LOST
        for k in range(1, 4):
            f = src.read(T0 + k * S)
            assert np.isnan(f.values[1]).all()
            assert not np.isnan(f.values[[0, 2]]).any()
            assert f.devices.ids[1] == "GPU-00000001-aaaa"  # still in the table, just not read
        fake.gpus[2].fail = NVML_ERROR_UNKNOWN
        f = src.read(T0 + 5 * S)
        assert np.isnan(f.values[1:]).all() and not np.isnan(f.values[0]).any()
        fake.gpus[1].fail = fake.gpus[2].fail = None  # recovered (reset): reads resume
        assert not np.isnan(src.read(T0 + 6 * S).values).any()
    finally:
        src.close()


def test_gpu_lost_at_start_joins_the_table_once_it_answers() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", fail=NVML_ERROR_GPU_IS_LOST)])
    src = NvmlSource("node-a", nvml=fake)
    try:
        assert src.read(T0).devices.ids == ("GPU-a",)
        fake.gpus[1].fail = None
        f = src.read(T0 + S)
        assert f.devices.ids == ("GPU-a", "GPU-b") and not np.isnan(f.values).any()
    finally:
        src.close()


def test_not_supported_fields_are_nan_only_and_not_asked_again() -> None:
    unsupported = {"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages"}
    fake, src = make(1, unsupported=unsupported, serial="x")
    fake.gpus[0].unsupported.add("nvmlDeviceGetSerial")
    src.close()
    src = NvmlSource("node-a", nvml=fake)
    try:
        f = src.read(T0)
        assert cv.HW_SERIAL_NUMBER not in f.devices.attrs[0]
        et = cv.ERROR_TYPE_ATTR
        assert math.isnan(value(src, f, 0, cv.HW_ENERGY.name))
        assert math.isnan(value(src, f, 0, cv.HW_ERRORS.name, **{et: "corrected"}))
        assert math.isnan(value(src, f, 0, cv.HW_ERRORS.name, **{et: "uncorrected"}))
        assert value(src, f, 0, cv.HW_ERRORS.name, **{et: "retired_page"}) == 1  # remapped rows still count
        assert value(src, f, 0, cv.HW_POWER.name) == pytest.approx(350.0)
        assert np.isnan(f.values[0]).sum() == 3
        calls = fake.gpus[0].calls
        src.read(T0 + S)
        calls_second = fake.gpus[0].calls - calls
        src.read(T0 + 2 * S)
        assert fake.gpus[0].calls - calls - calls_second == calls_second  # steady: unsupported calls skipped
    finally:
        src.close()


def test_memory_temperature_unsupported_leaves_only_it_nan() -> None:
    _fake, src = make(1, unsupported={"memory_temp"})
    try:
        f = src.read(T0)
        assert math.isnan(value(src, f, 0, cv.HW_TEMPERATURE.name, **{cv.HW_SENSOR_LOCATION: "memory"}))
        assert np.isnan(f.values[0]).sum() == 1
    finally:
        src.close()


def _xid(src: NvmlSource, f: Frame, code: str) -> np.ndarray:
    cols = [
        i
        for i, c in enumerate(src.schema.columns)
        if dict(c.attrs) == {cv.ERROR_TYPE_ATTR: "driver", cv.HW_ERROR_CODE: code}
    ]
    assert len(cols) == 1
    return f.values[:, cols[0]]


def wait_until(predicate: object, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_xid_events_become_driver_error_series_that_accumulate() -> None:
    fake, src = make(3)
    try:
        assert fake.registered == {0, 1, 2}
        before = len(src.schema)
        src.read(T0)
        fake.emit_xid(2, 79)
        wait_until(lambda: "79" in src._xids)
        f = src.read(T0 + S)
        assert len(src.schema) == before + 1  # a new series at the first event
        assert _xid(src, f, "79").tolist() == [0, 0, 1]
        fake.emit_xid(2, 79)
        fake.emit_xid(0, 13)
        fake.emit_xid(2, 79, by_uuid=True)  # a handle the source has not seen: found by UUID
        wait_until(lambda: src._xids.get("79", np.zeros(3))[2] == 3 and "13" in src._xids)
        f = src.read(T0 + 2 * S)
        assert _xid(src, f, "79").tolist() == [0, 0, 3]
        assert _xid(src, f, "13").tolist() == [1, 0, 0]
    finally:
        src.close()


def test_close_stops_the_event_thread_promptly_and_shuts_nvml_down() -> None:
    fake, src = make(2)
    thread = src._thread
    assert thread is not None and thread.is_alive()
    started = time.monotonic()
    src.close()
    assert time.monotonic() - started < 1.0
    assert not thread.is_alive()
    assert fake.freed and fake.shutdowns == 1
    src.close()  # idempotent
    assert fake.shutdowns == 1


def test_nvml_available() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    ok, why = nvml_available(fake)
    assert ok and "2 NVIDIA GPU" in why and fake.shutdowns == 1
    assert nvml_available(FakeNvml([])) == (False, "NVML loaded but found no GPU")
    broken = FakeNvml([FakeGpu(uuid="GPU-a")])
    broken.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    ok, why = nvml_available(broken)
    assert not ok and why.startswith("NVML did not load")
    assert nvml_gpus(fake) == (2, "2 NVIDIA GPU(s), driver 580.95.05")


def test_probe_counts_what_the_source_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` asks NvmlSource.probe; it answers with the count the source then reads."""
    fake = FakeNvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    monkeypatch.setattr(nvml_mod, "_import_pynvml", lambda: fake)
    config = AgentConfig(node_name="node-a", source="auto")
    probe = NvmlSource.probe(config)
    assert (probe.source, probe.found) == ("nvml", 2) and "2 NVIDIA GPU(s)" in probe.why
    src = NvmlSource.from_config(config, Schema())
    try:
        assert len(src.read(T0).devices) == probe.found
    finally:
        src.close()
    fake.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    assert NvmlSource.probe(config).found == 0


def test_nvml_that_does_not_load_is_a_one_line_reason_to_choose_another_source() -> None:
    """``--source nvml`` on a machine whose driver is missing: SourceUnavailable (the CLI's one line and
    exit 2), never the library's traceback."""
    broken = FakeNvml([FakeGpu(uuid="GPU-a")])
    broken.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(SourceUnavailable) as err:
        NvmlSource("node-a", nvml=broken)
    assert "\n" not in str(err.value) and "--source nvml" in str(err.value) and "--source auto" in str(err.value)


def test_lost_gpu_becomes_device_lost_while_others_stay_healthy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("stale_timeout: 20s\n")
    policy = policy_mod.load(path)
    fake, src = make(3)
    classifier = Classifier(policy, src.schema, interval_s=5.0)
    try:
        verdicts = {}
        for k in range(0, 121, 5):
            if k == 60:
                fake.gpus[1].fail = NVML_ERROR_GPU_IS_LOST
            now = T0 + k * S
            classifier.ingest(src.read(now))
            for verdict in classifier.evaluate(now):
                verdicts[verdict.hw_id] = verdict
        lost = verdicts["GPU-00000001-aaaa"]
        assert lost.health == "Unhealthy" and "device_lost" in lost.reasons
        for dev in ("GPU-00000000-aaaa", "GPU-00000002-aaaa"):
            assert verdicts[dev].health == "Healthy", verdicts[dev]
    finally:
        src.close()


# -- throttle time by cause (hw.throttle.time{hw.throttle.reason}) -------------------------------------
# Recorded pynvml answers, as data. Bits of nvmlDeviceGetCurrentClocksEventReasons (nvml.h's
# nvmlClocksEventReasons group; pynvml 13.615.71 nvmlClocksEventReason* / nvmlClocksThrottleReason*).
IDLE, APP_CLOCKS, SW_POWER_CAP, HW_SLOWDOWN = 0x1, 0x2, 0x4, 0x8
SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x20, 0x40, 0x80
# Field ids of the time counters (ns): the perf-policy ones (74 = NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP)
# and the slowdown ones as a 580.82+ driver numbers them (269 SW thermal, 270 HW thermal, 271 HW power brake).
FI_POWER, FI_THERMAL, FI_SYNC_BOOST, FI_BOARD_LIMIT, FI_RELIABILITY = 74, 75, 76, 77, 79
FI_SW_THERM, FI_HW_THERM, FI_POWER_BRAKE = 269, 270, 271
SLOWDOWN_IDS = {251, 252, 253, 269, 270, 271}

#: An H100 SXM training a model at its 700 W cap, driver 580.95.05: SW power cap set at most reads and
#: its counter growing ~6 s in 10; never thermally or hardware throttled. (seconds, bitmask, fields)
H100_AT_POWER_CAP = [
    (0, SW_POWER_CAP, {FI_POWER: 1_843_201_554_112, FI_THERMAL: 12_400_000_000, FI_SW_THERM: 12_400_000_000}),
    (10, SW_POWER_CAP, {FI_POWER: 1_843_207_498_870, FI_THERMAL: 12_400_000_000, FI_SW_THERM: 12_400_000_000}),
    (20, 0, {FI_POWER: 1_843_213_512_006, FI_THERMAL: 12_400_000_000, FI_SW_THERM: 12_400_000_000}),
    (30, SW_POWER_CAP, {FI_POWER: 1_843_213_512_006, FI_THERMAL: 12_400_000_000, FI_SW_THERM: 12_400_000_000}),
]
#: A GPU whose node's power controller asserts the brake, driver 580.95.05: NVML reports the brake with
#: the generic HW slowdown bit (0x80 | 0x8), and the brake counter runs with the wall clock.
BRAKED_WITH_COUNTERS = [
    (0, HW_POWER_BRAKE | HW_SLOWDOWN, {FI_POWER_BRAKE: 73_000_000_000, FI_HW_THERM: 1_500_000_000}),
    (5, HW_POWER_BRAKE | HW_SLOWDOWN, {FI_POWER_BRAKE: 78_000_000_000, FI_HW_THERM: 1_500_000_000}),
    (10, HW_POWER_BRAKE | HW_SLOWDOWN, {FI_POWER_BRAKE: 83_000_000_000, FI_HW_THERM: 1_500_000_000}),
]
#: The same brake on a 570 driver (no slowdown counters: the bitmask is sampled), then a hot GPU:
#: (seconds, bitmask, power_brake s, hw_slowdown s) with the reasons seen at one read held to the next.
BRAKED_DRIVER_570 = [
    (0, HW_POWER_BRAKE | HW_SLOWDOWN, 0.0, 0.0),
    (5, HW_POWER_BRAKE | HW_SLOWDOWN, 5.0, 0.0),
    (10, HW_POWER_BRAKE | HW_SLOWDOWN, 10.0, 0.0),
    (15, HW_POWER_BRAKE | HW_THERMAL | HW_SLOWDOWN, 15.0, 0.0),
    (20, HW_THERMAL | HW_SLOWDOWN, 20.0, 0.0),  # braked and hot: still the brake only
    (25, HW_SLOWDOWN, 20.0, 5.0),  # HW thermal with its HW slowdown bit: counted once
    (30, 0, 20.0, 10.0),  # the generic bit alone (a power fast trigger) is a hardware slowdown too
]
#: A GPU whose driver has no time counters at all (fields and violation status NOT_SUPPORTED): every
#: reason from the bitmask. (seconds, bitmask, power_cap, thermal, other, hw_slowdown, power_brake)
NO_COUNTERS = [
    (0, SW_POWER_CAP, 0.0, 0.0, 0.0, 0.0, 0.0),
    (10, SW_POWER_CAP | SW_THERMAL, 10.0, 0.0, 0.0, 0.0, 0.0),
    (20, IDLE, 20.0, 10.0, 0.0, 0.0, 0.0),
    (30, APP_CLOCKS, 20.0, 10.0, 0.0, 0.0, 0.0),  # idle counted nothing
    (40, IDLE, 20.0, 10.0, 10.0, 0.0, 0.0),
    (50, IDLE, 20.0, 10.0, 10.0, 0.0, 0.0),
]


def throttle(src: NvmlSource, frame: Frame, row: int = 0) -> dict[str, float]:
    """``hw.throttle.time`` of one GPU by reason (NaN where not reported)."""
    out = {}
    for i, col in enumerate(src.schema.columns):
        if col.metric == cv.HW_THROTTLE_TIME.name and i < frame.values.shape[1]:
            out[dict(col.attrs)[cv.HW_THROTTLE_REASON]] = float(frame.values[row, i])
    return out


def test_recorded_constants_are_pynvml_s_and_slowdown_ids_follow_the_driver() -> None:
    import pynvml

    assert (pynvml.nvmlClocksEventReasonGpuIdle, pynvml.nvmlClocksEventReasonSwPowerCap) == (IDLE, SW_POWER_CAP)
    assert pynvml.nvmlClocksThrottleReasonHwSlowdown == HW_SLOWDOWN
    assert pynvml.nvmlClocksEventReasonSwThermalSlowdown == SW_THERMAL
    assert pynvml.nvmlClocksThrottleReasonHwThermalSlowdown == HW_THERMAL
    assert pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown == HW_POWER_BRAKE
    assert pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP == pynvml.NVML_FI_DEV_PERF_POLICY_POWER == FI_POWER
    assert pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL == FI_THERMAL
    assert nvml_mod.slowdown_field_ids("580.95.05") == (FI_SW_THERM, FI_HW_THERM, FI_POWER_BRAKE)
    assert nvml_mod.slowdown_field_ids("590.44.01") == (269, 270, 271)
    assert nvml_mod.slowdown_field_ids("580.65.06") == (251, 252, 253)  # CUDA 13.0's nvml.h numbering
    assert nvml_mod.slowdown_field_ids("575.51.03") == (251, 252, 253)
    assert nvml_mod.slowdown_field_ids("570.172.08") is None  # 251 is power smoothing there
    assert nvml_mod.slowdown_field_ids("") is None and nvml_mod.slowdown_field_ids("n/a") is None


def test_h100_at_its_power_cap_reads_the_cap_counter_once() -> None:
    """The SW power cap's time is field 74's count, not that count plus the sampled 0x4 bit."""
    fake, src = make(1)
    gpu = fake.gpus[0]
    try:
        for seconds, mask, counters in H100_AT_POWER_CAP:
            gpu.clock_reasons, gpu.counters_ns = mask, {**counters, FI_HW_THERM: 0, FI_POWER_BRAKE: 0}
            t = throttle(src, src.read(T0 + seconds * S))
            assert t["power_cap"] == counters[FI_POWER] * 1e-9
            assert t["thermal"] == pytest.approx(12.4)
            assert t["hw_slowdown"] == 0.0 and t["power_brake"] == 0.0
            assert t["other"] == pytest.approx(1.5)  # board limit 1 s + reliability 0.5 s (fields 77, 79)
        assert "power" not in t
        assert gpu.called["nvmlDeviceGetViolationStatus"] == 0  # the fields answer: the deprecated getter unused
    finally:
        src.close()


def test_braked_gpu_with_counters_is_power_brake_only() -> None:
    fake, src = make(1)
    gpu = fake.gpus[0]
    try:
        for seconds, mask, counters in BRAKED_WITH_COUNTERS:
            gpu.clock_reasons, gpu.counters_ns = mask, counters
            t = throttle(src, src.read(T0 + seconds * S))
            assert t["power_brake"] == counters[FI_POWER_BRAKE] * 1e-9
            assert t["hw_slowdown"] == pytest.approx(1.5)  # the 0x8 that comes with the brake adds nothing
            assert t["power_cap"] == pytest.approx(5.0)
            assert t["thermal"] == pytest.approx(2.0)  # NVML_FI_DEV_PERF_POLICY_THERMAL (no field 269 here)
    finally:
        src.close()


def test_braked_gpu_on_a_driver_without_slowdown_counters_accumulates_the_bitmask() -> None:
    fake, src = make(1, counters_ns={})
    fake.driver = "570.172.08"
    src.close()
    src = NvmlSource("node-a", nvml=fake)
    gpu = fake.gpus[0]
    try:
        for seconds, mask, brake, slowdown in BRAKED_DRIVER_570:
            gpu.clock_reasons = mask
            t = throttle(src, src.read(T0 + seconds * S))
            assert (t["power_brake"], t["hw_slowdown"]) == (pytest.approx(brake), pytest.approx(slowdown)), seconds
            assert t["power_cap"] == pytest.approx(5.0) and t["thermal"] == pytest.approx(2.0)  # counters 74, 75
        assert not SLOWDOWN_IDS & set(gpu.fields_asked)  # 570's 251 is a power-smoothing setting: never asked
    finally:
        src.close()


def test_driver_without_any_counter_samples_every_reason_and_never_counts_idle() -> None:
    fake, src = make(1, counters_ns={}, violation_ns={})
    gpu = fake.gpus[0]
    try:
        seen = []
        for k, (seconds, mask, *expected) in enumerate(NO_COUNTERS):
            gpu.clock_reasons = mask
            t = throttle(src, src.read(T0 + seconds * S))
            got = [t[r] for r in ("power_cap", "thermal", "other", "hw_slowdown", "power_brake")]
            assert got == pytest.approx(expected), seconds
            seen.append(got)
            if k == 0:  # the first read found every counter unsupported: none is asked again
                asked, violations = len(gpu.fields_asked), gpu.called["nvmlDeviceGetViolationStatus"]
        assert len(gpu.fields_asked) - asked == len(NO_COUNTERS) - 1  # only memory temperature, once a read
        assert gpu.called["nvmlDeviceGetViolationStatus"] == violations
        assert (np.diff(np.array(seen), axis=0) >= 0).all()  # a counter only grows
    finally:
        src.close()


def test_idle_gpu_counts_no_throttle_time() -> None:
    fake, src = make(1, counters_ns={}, violation_ns={})
    fake.gpus[0].clock_reasons = IDLE
    try:
        for k in range(4):
            t = throttle(src, src.read(T0 + 10 * k * S))
        assert t == dict.fromkeys(("thermal", "power_cap", "power_brake", "hw_slowdown", "other"), 0.0)
    finally:
        src.close()


def test_older_pynvml_and_driver_names_of_the_reasons_bitmask() -> None:
    """nvidia-ml-py before the rename has only nvmlClocksThrottleReason* and ...ThrottleReasons(); a driver
    before the rename lacks nvmlDeviceGetCurrentClocksEventReasons (FUNCTION_NOT_FOUND): the older name is read."""
    old = FakeNvml([FakeGpu(uuid="GPU-a", counters_ns={}, violation_ns={})])
    old.hidden = frozenset(
        {"nvmlDeviceGetCurrentClocksEventReasons"} | {n for n in dir(old) if n.startswith("nvmlClocksEventReason")}
    )
    old_driver = FakeNvml([FakeGpu(uuid="GPU-b", counters_ns={}, violation_ns={})], driver="530.30.02")
    old_driver.driver_lacks.add("nvmlDeviceGetCurrentClocksEventReasons")
    for fake in (old, old_driver):
        src = NvmlSource("node-a", nvml=fake)
        gpu = fake.gpus[0]
        gpu.clock_reasons = HW_POWER_BRAKE | HW_SLOWDOWN
        try:
            for k in range(3):
                t = throttle(src, src.read(T0 + 10 * k * S))
            assert (t["power_brake"], t["hw_slowdown"]) == (20.0, 0.0)
            assert gpu.called["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3
            assert gpu.called["nvmlDeviceGetCurrentClocksEventReasons"] <= 1  # tried once where the name exists
        finally:
            src.close()


def test_a_renumbered_field_answering_a_setting_is_not_read_as_time(caplog: pytest.LogCaptureFixture) -> None:
    """A 580.76 driver is asked 251-253; if it speaks the newer numbering they are power-smoothing
    settings (unsigned int 0/1), not 64-bit counts: the bitmask is sampled instead."""
    from tests.support.fake_nvml import NVML_VALUE_TYPE_UNSIGNED_INT

    uint = NVML_VALUE_TYPE_UNSIGNED_INT
    gpu = FakeGpu(uuid="GPU-a", counters_ns={251: 1, 252: 0, 253: 1}, field_types={251: uint, 252: uint, 253: uint})
    fake = FakeNvml([gpu], driver="580.76.05")
    src = NvmlSource("node-a", nvml=fake)
    gpu.clock_reasons = HW_POWER_BRAKE | HW_SLOWDOWN
    try:
        for k in range(3):
            t = throttle(src, src.read(T0 + 5 * k * S))
        assert t["power_brake"] == pytest.approx(10.0) and t["hw_slowdown"] == 0.0
        assert t["thermal"] == pytest.approx(2.0)  # from NVML_FI_DEV_PERF_POLICY_THERMAL, the next field
        assert "not a time counter" in caplog.text
        assert gpu.fields_asked.count(253) == 1
    finally:
        src.close()


def test_a_counter_that_fails_one_read_is_nan_then_resumes_without_sampled_time() -> None:
    from tests.support.fake_nvml import NVML_ERROR_NO_DATA

    fake, src = make(1)
    gpu = fake.gpus[0]
    try:
        values = []
        for k, (seconds, mask, counters) in enumerate(BRAKED_WITH_COUNTERS):
            gpu.clock_reasons, gpu.counters_ns = mask, counters
            gpu.field_errors = {FI_POWER_BRAKE: NVML_ERROR_NO_DATA} if k == 1 else {}
            values.append(throttle(src, src.read(T0 + seconds * S))["power_brake"])
        assert values[0] == 73.0 and math.isnan(values[1]) and values[2] == 83.0
    finally:
        src.close()


def test_sampled_time_restarts_from_a_baseline_after_a_failed_read() -> None:
    fake, src = make(1, counters_ns={}, violation_ns={})
    gpu = fake.gpus[0]
    gpu.clock_reasons = SW_POWER_CAP
    try:
        assert throttle(src, src.read(T0))["power_cap"] == 0.0
        gpu.fail = NVML_ERROR_GPU_IS_LOST
        assert math.isnan(throttle(src, src.read(T0 + 10 * S))["power_cap"])
        gpu.fail = None
        assert throttle(src, src.read(T0 + 20 * S))["power_cap"] == 0.0  # the gap is not credited
        assert throttle(src, src.read(T0 + 30 * S))["power_cap"] == 10.0
    finally:
        src.close()


def test_without_field_values_the_violation_times_are_the_counters() -> None:
    """A driver whose nvmlDeviceGetFieldValues answers NOT_SUPPORTED: the perf-policy violation times
    (ns) are the counters, the power policy's as power_cap; the bits they time are not sampled too."""
    fake, src = make(1, unsupported={"nvmlDeviceGetFieldValues"})
    gpu = fake.gpus[0]
    try:
        for k, mask in enumerate((SW_POWER_CAP | HW_POWER_BRAKE | HW_SLOWDOWN, SW_POWER_CAP, SW_POWER_CAP)):
            gpu.clock_reasons = mask
            t = throttle(src, src.read(T0 + 10 * k * S))
            assert (t["power_cap"], t["thermal"], t["other"]) == (pytest.approx(5.0), 2.0, pytest.approx(1.5))
            if k == 0:
                asked = gpu.called["nvmlDeviceGetFieldValues"]
        assert (t["power_brake"], t["hw_slowdown"]) == (10.0, 0.0)  # sampled: no counter for them here
        assert gpu.called["nvmlDeviceGetFieldValues"] == asked  # not asked again after the first read
        assert gpu.called["nvmlDeviceGetViolationStatus"] == 3 * 5  # power, thermal, sync boost, board, reliability
    finally:
        src.close()
