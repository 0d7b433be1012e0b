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
        assert v(cv.HW_THROTTLE_TIME.name, **{reason: "power"}) == pytest.approx(5.0)
        assert v(cv.HW_THROTTLE_TIME.name, **{reason: "other"}) == pytest.approx(1.5)
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
