"""Time order per series, the bound ahead of the clock and clock jumps (issue #16), through both decoders
and both protobuf paths: a point stamped ahead holds back only the series it names, only until its own
time; with ``clock_jump_ns`` (the receiver's) a point more than that behind its series is a clock that
jumped back, taken and reported; replay (no ``clock_jump_ns``) keeps refusing it. The same requests
give the JSON decoder, the protobuf templates and the protobuf plain path the same frames, counts and
jumps (a hypothesis property, as test_decode_limits.py has for the caps)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_dra.decode import DecodeResult, OtlpJsonDecoder, OtlpProtoDecoder
from otel_dra.decode.core import CLOCK_JUMP_NS
from otel_dra.frame import Frame, Schema
from tests.unit.decode.test_decode_limits import dumps, gauge, gpu, kv, pb, pt, request, resource

S = 10**9
T0 = 1_795_000_000 * S
NOW = T0 + 100 * S  # the decoders' clock


def errors(*points: dict) -> dict:
    return {
        "name": "hw.errors",
        "unit": "{error}",
        "sum": {"aggregationTemporality": 2, "isMonotonic": True, "dataPoints": list(points)},
    }


class Three:
    """The JSON decoder, the protobuf decoder (templates) and its plain path, on one clock."""

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("clock", lambda: NOW)
        self.decoders = (
            OtlpJsonDecoder(Schema(), **kw),
            OtlpProtoDecoder(Schema(), **kw),
            OtlpProtoDecoder(Schema(), fast=False, **kw),
        )
        self.lines = 0

    def decode(self, doc: dict) -> tuple[DecodeResult, DecodeResult, DecodeResult]:
        self.lines += 1
        j, p, q = self.decoders
        return j.decode(dumps(doc), self.lines), p.decode(pb(doc)), q.decode(pb(doc))


def cells(frames: list[Frame], schema: Schema) -> set[tuple[str, int, str, Any, float]]:
    columns = schema.columns
    out = set()
    for f in frames:
        for r, device in enumerate(f.devices.ids):
            for c in range(f.values.shape[1]):
                v = f.values[r, c]
                if v == v:
                    col = columns[c]
                    out.add((f.devices.node, f.time_unix_nano, device, (col.metric, col.attrs), float(v)))
    return out


def jumps(result: DecodeResult) -> set[tuple[str, bool, int, int]]:
    return {(j.node, j.ahead, j.offset_ns, j.points) for j in result.clock_jumps}


def node_request(node: str, t: int, devices: tuple[str, ...] = ("gpu-0", "gpu-1"), value: float = 1.0) -> dict:
    return request(resource(node, gauge("hw.power", *(pt(gpu(d), value, t) for d in devices))))


def test_a_point_stamped_ahead_holds_back_only_its_own_series() -> None:
    three = Three(max_future_ns=600 * S)  # no clock jumps: replay's rule, with the live bound
    three.decode(node_request("node-1", T0))
    ahead = request(resource("node-1", gauge("hw.power", pt(gpu("gpu-0"), 9.0, T0 + 590 * S))))
    for result in three.decode(ahead):
        assert result.rejected == 0 and not result.clock_jumps
    for k in range(1, 4):  # the node's honest requests: gpu-1's series is taken, gpu-0's waits
        for result, decoder in zip(three.decode(node_request("node-1", T0 + k * 10 * S)), three.decoders, strict=True):
            assert (result.points, result.rejected) == (2, 1)
            assert {c[2] for c in cells(result.frames, decoder.schema)} == {"gpu-1"}
            assert "older than" in result.message and "already read for that series" in result.message
    for result in three.decode(node_request("node-1", T0 + 590 * S)):  # its own time: both again
        assert (result.points, result.rejected) == (2, 0)


def test_a_point_far_behind_its_series_is_a_clock_jump_taken_and_told() -> None:
    three = Three(max_future_ns=600 * S, clock_jump_ns=CLOCK_JUMP_NS)
    three.decode(node_request("node-1", T0))
    for result in three.decode(node_request("node-1", T0 + 590 * S)):  # inside the bound: taken
        assert result.rejected == 0 and not result.clock_jumps
    # 30 s behind is out of order (refused); 580 s behind is a jump (taken, the series restart from it).
    for result in three.decode(node_request("node-1", T0 + 560 * S, ("gpu-0",))):
        assert result.rejected == 1 and not result.clock_jumps
    for result in three.decode(node_request("node-1", T0 + 10 * S)):
        assert result.rejected == 0 and jumps(result) == {("node-1", False, 580 * S, 2)}
    for result in three.decode(node_request("node-1", T0 + 20 * S)):  # the series go on from there
        assert result.rejected == 0 and not result.clock_jumps
    for result in three.decode(node_request("node-2", NOW + 601 * S)):  # past the bound: refused, told
        assert result.rejected == 2 and jumps(result) == {("node-2", True, 601 * S, 2)}


VALUES: list[float | str] = [1.0, 2.0, "NaN", -1.0]
TIMES = [T0, T0 + 10 * S, T0 + 20 * S, T0 + 50 * S, T0 + 590 * S, T0 + 700 * S, NOW + 30 * S, 0]


@st.composite
def requests(draw: st.DrawFn) -> dict:
    resources = []
    for _ in range(draw(st.integers(1, 3))):
        node = draw(st.sampled_from(["node-1", "node-2"]))
        metrics = []
        for _ in range(draw(st.integers(1, 2))):
            pts = [
                pt(
                    gpu(draw(st.sampled_from(["gpu-0", "gpu-1"])), **{"error.type": "uncorrected"}),
                    draw(st.sampled_from(VALUES)),
                    draw(st.sampled_from(TIMES)),
                )
                for _ in range(draw(st.integers(0, 4)))
            ]
            metrics.append(errors(*pts) if draw(st.booleans()) else gauge("hw.power", *pts))
        resources.append(
            {"resource": {"attributes": kv({"k8s.node.name": node})}, "scopeMetrics": [{"metrics": metrics}]}
        )
    return request(*resources)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requests(), min_size=1, max_size=4), st.sampled_from([None, 20 * S, 600 * S]), st.booleans())
def test_json_and_protobuf_decoders_agree_on_time(docs: list[dict], bound: int | None, live: bool) -> None:
    three = Three(max_future_ns=bound, clock_jump_ns=CLOCK_JUMP_NS if live else None)
    for doc in docs * 2:  # twice: the protobuf decoder's second reading is its template's
        j, p, q = three.decode(doc)
        assert (j.points, j.rejected) == (p.points, p.rejected) == (q.points, q.rejected)
        assert jumps(j) == jumps(p) == jumps(q)
        schemas = [d.schema for d in three.decoders]
        assert cells(j.frames, schemas[0]) == cells(p.frames, schemas[1]) == cells(q.frames, schemas[2])
