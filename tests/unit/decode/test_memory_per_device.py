"""What a device costs beyond its window (issue #17): the structures that keep it down, held to them.

- Devices with the same descriptive attributes share one read-only mapping, from the decoders' device
  tables through the classifier's registry to the verdict board (no copy per table, registry, board).
- The replay decoder keeps no Python object per series: what it holds grows by a handful of objects a
  device (the series index's), not by dozens a series (its attribute lists' text and dicts, as it did).
- The fleet decoder's templates of nodes laid out alike share their layout arrays, keep their own small arrays
  side by side in blocks, and what waits for a node's series' times is one batch, not one per request.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_dra import conventions as cv
from otel_dra import policy
from otel_dra.classifier import Classifier
from otel_dra.classifier.registry import EIGHTH_FROM, GROW_ROWS, DeviceRegistry, next_capacity
from otel_dra.decode import OtlpJsonDecoder
from otel_dra.decode.assembly import PackedArrays
from otel_dra.decode.otlp_proto import OtlpProtoDecoder
from otel_dra.frame import FrozenAttrs, Schema
from otel_dra.state import VerdictBoard

S = 10**9
T0 = 1_795_000_000 * S
ERROR_TYPES = ("corrected", "uncorrected", "pcie", "nvlink", "driver", "retired_page", "reset", "power")
DESCRIPTIVE = {cv.HW_TYPE: "gpu", cv.HW_VENDOR: "NVIDIA", cv.HW_MODEL: "H100 80GB HBM3", cv.DRA_DRIVER_NAME: "gpu.x"}


def kv(attrs: dict[str, str]) -> list[KeyValue]:
    return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attrs.items()]


def request(nodes: list[str], devices: int, t: int, serials: bool = False) -> ExportMetricsServiceRequest:
    """Each node's devices with the same descriptive attributes (unique serial numbers with ``serials``):
    a power gauge, and error counters of eight types (nine series a device)."""
    out = ExportMetricsServiceRequest()
    for n, node in enumerate(nodes):
        points: dict[str, list[NumberDataPoint]] = {"power": [], "errors": []}
        for d in range(devices):
            attrs = {cv.HW_ID: f"gpu-{d}", **DESCRIPTIVE}
            if serials:
                attrs[cv.HW_SERIAL_NUMBER] = f"SN{n:04d}{d:04d}"
            points["power"].append(NumberDataPoint(attributes=kv(attrs), time_unix_nano=t, as_double=300.0 + d))
            for kind in ERROR_TYPES:
                point = NumberDataPoint(
                    attributes=kv({**attrs, cv.ERROR_TYPE_ATTR: kind}), start_time_unix_nano=T0, time_unix_nano=t
                )
                point.as_int = d
                points["errors"].append(point)
        metrics = [
            Metric(name=cv.HW_POWER.name, gauge=Gauge(data_points=points["power"])),
            Metric(
                name=cv.HW_ERRORS.name,
                sum=Sum(
                    data_points=points["errors"],
                    is_monotonic=True,
                    aggregation_temporality=AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE,
                ),
            ),
        ]
        out.resource_metrics.append(
            ResourceMetrics(
                resource=Resource(attributes=kv({cv.K8S_NODE_NAME_ATTR: node})),
                scope_metrics=[ScopeMetrics(metrics=metrics)],
            )
        )
    return out


def json_line(nodes: list[str], devices: int, t: int, serials: bool = False) -> bytes:
    return json.dumps(MessageToDict(request(nodes, devices, t, serials)), separators=(",", ":")).encode()


def objects_reachable(root: object) -> int:
    """Objects ``root`` reaches (classes, modules and functions not followed)."""
    seen: set[int] = set()
    stack = [root]
    skip = (type, type(json), type(len), type(objects_reachable))
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        stack.extend(gc.get_referents(obj))
    return len(seen)


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_devices_with_the_same_descriptive_attributes_share_one_mapping(encoding):
    nodes = ["node-a", "node-b"]
    schema = Schema()
    proto = OtlpProtoDecoder(schema)
    replayed = OtlpJsonDecoder(schema)
    classifier = Classifier(policy.load(), schema, interval_s=10.0)
    board = VerdictBoard()
    for k in range(2):  # the first request the plain way, the second through a template (or a line's shape)
        t = T0 + k * 10 * S
        if encoding == "protobuf":
            frames = proto.decode(request(nodes, 3, t).SerializeToString()).frames
        else:
            frames = replayed.decode(json_line(nodes, 3, t)).frames
        classifier.ingest_many(frames)
        board.publish(classifier.evaluate(t), classifier.registry)
    mappings = [a for f in frames for a in f.devices.attrs]
    assert len(mappings) == 6 and dict(mappings[0]) == DESCRIPTIVE
    assert all(m is mappings[0] for m in mappings), "one mapping for every device with these attributes"
    assert isinstance(mappings[0], FrozenAttrs)
    registry = classifier.registry
    assert {id(registry.attrs[registry.row(node, f"gpu-{d}")]) for node in nodes for d in range(3)} == {id(mappings[0])}
    assert {id(attrs) for _, attrs in board.snapshot()} == {id(mappings[0])}


def test_the_registry_keeps_a_frozen_mapping_and_copies_any_other():
    classifier = Classifier(policy.load(), Schema())
    registry = classifier.registry
    (row,), _ = registry.rows_for("n", ["gpu-0"])
    frozen = FrozenAttrs(tuple(DESCRIPTIVE.items()))
    assert registry.set_attrs(row, frozen) and registry.attrs[row] is frozen
    mutable = {**DESCRIPTIVE, cv.HW_MODEL: "other"}
    assert registry.set_attrs(row, mutable)
    mutable[cv.HW_MODEL] = "changed after"
    assert registry.attrs[row][cv.HW_MODEL] == "other" and isinstance(registry.attrs[row], FrozenAttrs)
    assert not registry.set_attrs(row, {**DESCRIPTIVE, cv.HW_MODEL: "other"})  # equal: no change


def test_the_replay_decoder_keeps_no_python_object_per_series():
    """Each device has 9 series here; the decoder's objects grow by a few a device (its serial number and
    descriptive set in the series index), not by several a series, however many lines it reads."""

    def held(nodes: int) -> int:
        decoder = OtlpJsonDecoder(Schema())
        names = [f"node-{i:03d}" for i in range(nodes)]
        for k in range(3):
            for name in names:
                result = decoder.decode(json_line([name], 4, T0 + k * 10 * S, serials=True))
                assert result.frames and not result.errors
        gc.collect()
        return objects_reachable(decoder)

    small, large = held(4), held(12)
    per_device = (large - small) / ((12 - 4) * 4)
    assert per_device < 12, f"{per_device:.1f} objects a device"


def test_templates_laid_out_alike_share_their_arrays_and_a_node_waits_as_one_batch():
    decoder = OtlpProtoDecoder(Schema())
    for k in range(12):
        for node in ("node-a", "node-b"):  # (names of one length: their requests are laid out alike)
            decoder.decode(request([node], 4, T0 + k * 10 * S).SerializeToString())
    assert decoder.sections_fast == 2 * 11
    (a,), (b,) = decoder._templates.values()
    assert a.steps is b.steps and a.time_hole is b.time_hole and a.kind is b.kind and a.ordinal is b.ordinal
    assert a.layout is not None and b.layout is not None and a.layout.flat is b.layout.flat
    for node, template in (("node-a", a), ("node-b", b)):
        floors = decoder._floors.series[node]
        assert floors.keys is template.key, "a node's series in its template's order: one key array for both"
        assert len(floors._pending) <= 1, "what waits for a node sending the same series is one batch"
        waiting = floors._pending[0][1] if floors._pending else floors._uniform
        assert type(waiting) is int, "points at one time wait as one number, not an array"
        floors.settle()
        assert floors._times is None, "every series read up to one time: that number, not an array"
        assert (floors.times == T0 + 11 * 10 * S).all() and len(floors.times) == len(floors.keys)
    # What is each node's own (its series' keys, its devices' descriptive sets) lies side by side in one block,
    # not a chunk each among the decoding thread's temporaries (PackedArrays).
    block = a.key.base
    assert block is not None and a.key is not b.key and b.key.base is block
    assert a.row_descr is not None and b.row_descr is not None and a.row_descr.base is block
    # Time order still holds: a request older than what was read is refused, point by point.
    older = decoder.decode(request(["node-a"], 4, T0 + 5 * 10 * S).SerializeToString())
    assert older.rejected == older.points == 4 * (1 + len(ERROR_TYPES)) and not older.frames


def test_a_batch_that_brings_a_fleet_grows_the_arrays_once_to_fit_it():
    """The first tick of a fleet brings every node's devices (some nodes twice): the per-device arrays grow
    once, to about the devices' number (not by half again and again, up to a third too large)."""
    decoder = OtlpProtoDecoder(Schema())
    frames = []
    for k in range(2):
        for n in range(150):
            frames += decoder.decode(request([f"node-{n:03d}"], 8, T0 + k * 10 * S).SerializeToString()).frames
    classifier = Classifier(policy.load(), decoder.schema, interval_s=10.0)
    classifier.ingest_many(frames)
    assert len(classifier.registry) == 1200
    assert classifier.registry.capacity <= 1200 + 64, classifier.registry.capacity
    assert classifier.store.ring.shape[2] == classifier.registry.capacity


def test_devices_that_come_over_several_ticks_leave_few_rows_unused():
    """A fleet's devices arriving over two ticks (5,744 then 2,256, as a fleet of 8,000 pushed back to back
    does) and then a few at a time: the rows grow to fit each batch, and by ``GROW_ROWS`` for the stragglers
    (a small fleet: its rows grown ahead are resident, its copies cheap), so the arrays are never more than that
    larger than the devices; a large fleet grows by an eighth."""
    registry = DeviceRegistry(1024)
    registry.reserve([(f"node-{n}", [f"gpu-{i}" for i in range(8)]) for n in range(718)])
    for n in range(718):
        registry.rows_for(f"node-{n}", [f"gpu-{i}" for i in range(8)])
    registry.reserve([(f"node-{n}", [f"gpu-{i}" for i in range(8)]) for n in range(718, 1000)])
    for n in range(718, 1000):
        registry.rows_for(f"node-{n}", [f"gpu-{i}" for i in range(8)])
    assert len(registry) == 8000 and registry.capacity == 8000
    for n in range(1000, 1100):
        registry.rows_for(f"node-{n}", [f"gpu-{i}" for i in range(8)])
    assert registry.capacity == 8000 + 2 * GROW_ROWS and registry.capacity <= len(registry) + GROW_ROWS
    assert next_capacity(EIGHTH_FROM - 1, EIGHTH_FROM) == EIGHTH_FROM - 1 + GROW_ROWS
    assert next_capacity(1024, 1025) == 1024 + 128  # (an eighth, under GROW_ROWS)
    assert next_capacity(40_000, 40_001) == 45_000 and next_capacity(40_000, 50_000) == 50_000


def test_packed_arrays_are_read_only_copies_side_by_side_and_a_full_block_starts_another():
    packed = PackedArrays(block_bytes=256, max_bytes=64)
    arrays = [np.arange(5, dtype=np.int64), np.array([True, False, True]), np.arange(3, dtype=np.int32) - 7]
    out = [packed.pack(a.copy()) for a in arrays]
    for a, o in zip(arrays, out, strict=True):
        assert o.dtype == a.dtype and o.shape == a.shape and (o == a).all() and not o.flags.writeable
        assert o.ctypes.data % 16 == 0
    assert out[0].base is out[1].base is out[2].base, "one block"
    more = [packed.pack(np.arange(8, dtype=np.int64)) for _ in range(4)]  # 64 bytes each: the block holds two more
    assert more[1].base is out[0].base and more[2].base is more[3].base is not out[0].base
    assert (more[3] == np.arange(8)).all()
    big, empty = np.arange(9, dtype=np.int64), np.zeros(0)
    assert packed.pack(big) is big and not big.flags.writeable, "past max_bytes: the array itself"
    assert packed.pack(empty) is empty
