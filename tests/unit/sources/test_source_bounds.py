"""The agent's sources are bounded like the decoders' input: a node showing thousands of devices, or
a driver reporting a multi-kB model or serial, makes no unbounded rows or labels."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from otel_dra import conventions as cv
from otel_dra.config import AgentConfig
from otel_dra.decode.limits import DecodeLimits
from otel_dra.frame import DeviceTable, Frame, Schema
from otel_dra.sources import Probe, build
from otel_dra.sources.bounds import BoundedSource, bound_frame, bound_table
from otel_dra.sources.nvml import NvmlSource


def fake_gpus(root, n: int) -> str:
    """``n`` NVIDIA display devices on the PCI bus, as sysfs lays them out."""
    pci = root / "bus" / "pci" / "devices"
    for i in range(n):
        device = pci / f"0000:{i // 256:02x}:{i % 256:02x}.0"
        device.mkdir(parents=True)
        (device / "class").write_text("0x030200\n")
        (device / "vendor").write_text("0x10de\n")
    return str(root)


def frame_of(n: int, columns: int = 3, **attrs: str) -> Frame:
    ids = tuple(f"gpu-{i}" for i in range(n))
    table = DeviceTable("node-a", ids, tuple({cv.HW_TYPE: "gpu", **attrs} for _ in ids))
    values = np.arange(n * columns, dtype=float).reshape(n, columns)
    return Frame(7, table, values)


@pytest.fixture(autouse=True)
def no_nvml(monkeypatch):
    """``auto`` asks sysfs whatever machine runs the tests."""
    monkeypatch.setattr(NvmlSource, "probe", classmethod(lambda cls, config: Probe("nvml", 0, "NVML did not load")))


def test_a_node_showing_thousands_of_devices_keeps_the_cap(tmp_path, caplog):
    root = fake_gpus(tmp_path, 1_000)
    source, _ = build(AgentConfig(node_name="n", source="auto", sysfs_root=root), Schema())
    assert source.name == "sysfs"
    cap = DecodeLimits().max_devices_per_node
    with caplog.at_level(logging.WARNING, logger="otel_dra.sources.bounds"):
        frames = [source.read(t) for t in range(3)]
    for frame in frames:
        assert len(frame.devices) == cap == 256
        assert frame.values.shape[0] == cap
        assert frame.devices.ids[0] == "0000:00:00.0"
    # The same bounded table every pass (consumers cache per table), and one warning, not one a pass.
    assert frames[0].devices is frames[1].devices is frames[2].devices
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1
    assert warned[0] == (
        "source sysfs: node n shows 1,000 devices; keeping the first 256 (max_devices_per_node), dropping 744"
    )


def test_the_simulator_is_bounded_too():
    limits = DecodeLimits(max_devices_per_node=16)
    sim, _ = build(AgentConfig(node_name="n", source="simulated", devices=40), Schema(), limits)
    frame = sim.read(0)
    assert len(frame.devices) == 16 and frame.values.shape[0] == 16
    assert frame.devices.ids == sim.source.read(0).devices.ids[:16]


def test_a_driver_reporting_multi_kb_strings_gets_short_labels(caplog):
    pytest.importorskip("pynvml")
    from tests.support.fake_nvml import FakeGpu, FakeNvml

    long_name = "NVIDIA " + "H" * 5_000
    gpus = [FakeGpu(uuid=f"GPU-{i}", name=long_name, serial="S" * 3_000) for i in range(2)]
    gpus.append(FakeGpu(uuid="GPU-" + "u" * 1_000))  # an identity can't be cut: two could merge
    source = BoundedSource(NvmlSource("node-a", nvml=FakeNvml(gpus)))
    try:
        with caplog.at_level(logging.WARNING, logger="otel_dra.sources.bounds"):
            first, second = source.read(1), source.read(2)
    finally:
        source.close()
    limit = DecodeLimits().max_attribute_length
    assert first.devices.ids == ("GPU-0", "GPU-1")
    assert first.values.shape[0] == 2
    for attrs in first.devices.attrs:
        assert all(len(v) <= limit for v in attrs.values())
        assert attrs[cv.HW_MODEL] == long_name[: limit - 1] + "…"
        assert attrs[cv.HW_SERIAL_NUMBER] == "S" * (limit - 1) + "…"
        assert attrs[cv.DRA_DEVICE_NAME].startswith("gpu-")  # short values are untouched
    assert second.devices is first.devices
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "source nvml: dropping 1 device(s) whose hw.id is longer than 256 characters (max_attribute_length)",
        "source nvml: shortened 6 attribute value(s) longer than 256 characters (max_attribute_length)",
    ]


def test_a_frame_within_the_limits_is_passed_through():
    frame = frame_of(8)
    assert bound_frame(frame, DecodeLimits()) is frame


def test_kept_rows_are_a_view_and_their_values_follow_their_devices():
    frame = frame_of(10)
    bounded = bound_frame(frame, DecodeLimits(max_devices_per_node=4))
    assert bounded.devices.ids == ("gpu-0", "gpu-1", "gpu-2", "gpu-3")
    assert np.shares_memory(bounded.values, frame.values)  # a slice, not a copy
    np.testing.assert_array_equal(bounded.values, frame.values[:4])


def test_a_device_with_an_over_long_id_is_dropped_and_the_rows_stay_aligned():
    table = DeviceTable("node-a", ("a", "b" * 300, "c", "d"), tuple({cv.HW_TYPE: "gpu"} for _ in range(4)))
    values = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])
    bounds = bound_table(table, DecodeLimits(max_devices_per_node=2))
    assert (bounds.long_ids, bounds.over_cap) == (1, 1)
    bounded = bound_frame(Frame(1, table, values), DecodeLimits(max_devices_per_node=2))
    assert bounded.devices.ids == ("a", "c")
    np.testing.assert_array_equal(bounded.values, [[0.0, 1.0], [4.0, 5.0]])


def test_alternating_tables_each_keep_their_bounded_table():
    """The simulator switches between tables (a firmware change and back): each maps to one bounded table."""
    tables = [frame_of(5, **{cv.HW_MODEL: c * 1_000}).devices for c in "xy"]

    class Flipping:
        name = "flipping"
        schema = Schema()

        def __init__(self) -> None:
            self.passes = 0

        def read(self, now_unix_nano: int) -> Frame:
            self.passes += 1
            return Frame(now_unix_nano, tables[self.passes % 2], np.zeros((5, 1)))

        def close(self) -> None:
            pass

    source = BoundedSource(Flipping())
    seen = [source.read(t).devices for t in range(6)]
    assert seen[0] is seen[2] is seen[4] and seen[1] is seen[3] is seen[5]
    assert seen[0] is not seen[1]
    assert source.passes == 6  # anything else is the wrapped source's


def test_a_large_frame_is_bounded_quickly():
    frame = frame_of(100_000, columns=40, **{cv.HW_SERIAL_NUMBER: "s" * 300})
    source = BoundedSource(type("Big", (), {"name": "big", "schema": Schema(), "read": lambda self, t: frame})())
    bounded = source.read(0)
    assert bounded.values.shape == (256, 40)
    assert all(len(a[cv.HW_SERIAL_NUMBER]) == 256 for a in bounded.devices.attrs)
