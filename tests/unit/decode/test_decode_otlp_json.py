"""The replay decoder reads OTLP JSON lines (the Collector file exporter's format) into Frames.

Requests come from the project's own pipeline through the real OpenTelemetry SDK and
protobuf JSON mapping (the round trip proves the decoder reads what the agent writes),
or are built by hand to hit one rule at a time.
"""

from __future__ import annotations

import copy
import gzip
import json
import time

import numpy as np
import pytest
from google.protobuf.json_format import MessageToDict, MessageToJson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_dra import __version__
from otel_dra.decode import DecodeError, InputFileError, OtlpJsonDecoder, read_lines
from otel_dra.decode import json_line as otlp_json
from otel_dra.faults import Fault
from otel_dra.frame import Column, Frame, Schema, attrs_of
from otel_dra.sinks import provider
from otel_dra.sinks.metrics import MetricsSink
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from otel_dra.state import FrameStore
from tests.support.otlp_trace import PlainDecoder

S = 10**9
T0 = 1_795_000_000 * S
DESCR = {
    "hw.type": "gpu",
    "hw.name": "GPU 0",
    "hw.vendor": "NVIDIA",
    "hw.model": "H100 80GB HBM3",
    "hw.serial_number": "SIM123",
    "hw.firmware_version": "96.00.99.00.01",
    "hw.driver_version": "580.95.05",
    "dra.driver.name": "gpu.nvidia.com",
    "dra.pool.name": "node-1",
    "dra.device.name": "gpu-0",
}


# -- building requests by hand (the JSON mapping, as the Collector writes it) -----------------
def kv(attrs: dict) -> list[dict]:
    return [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]


def pt(attrs: dict, value, t: int = T0, as_int: bool = False) -> dict:
    point = {"attributes": kv(attrs), "timeUnixNano": str(t), "startTimeUnixNano": str(T0)}
    point["asInt" if as_int else "asDouble"] = str(value) if as_int else value
    return point


def gauge(name: str, *points: dict) -> dict:
    return {"name": name, "unit": "1", "gauge": {"dataPoints": list(points)}}


def counter(name: str, *points: dict, temporality=2) -> dict:
    body = {"aggregationTemporality": temporality, "isMonotonic": True, "dataPoints": list(points)}
    return {"name": name, "unit": "1", "sum": body}


def updown(name: str, *points: dict) -> dict:
    return {"name": name, "unit": "1", "sum": {"aggregationTemporality": 2, "dataPoints": list(points)}}


def request(node: str | None, *metrics: dict, resources: list[dict] | None = None) -> dict:
    if resources is None:
        res_attrs = kv({"service.name": "x"} | ({"k8s.node.name": node} if node is not None else {}))
        resources = [{"resource": {"attributes": res_attrs}, "scopeMetrics": [{"metrics": list(metrics)}]}]
    return {"resourceMetrics": resources}


def dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def dev(device: str = "gpu-0", **extra: str) -> dict:
    return {"hw.id": device, **DESCR, "hw.name": f"GPU {device}", "dra.device.name": device, **extra}


def sensor(device: str, name: str, kind: str, **extra: str) -> dict:
    return {"hw.id": f"{device}/{name}", "hw.type": kind, "hw.parent": device, **extra}


def decode(*lines: bytes | str | dict, decoder: OtlpJsonDecoder | None = None):
    decoder = decoder or OtlpJsonDecoder(Schema())
    frames: list[Frame] = []
    errors: list[DecodeError] = []
    for n, line in enumerate(lines, 1):
        f, e = decoder.decode_line(dumps(line) if isinstance(line, dict) else line, n)
        frames += f
        errors += e
    return decoder, frames, errors


def cell(decoder: OtlpJsonDecoder, frame: Frame, device: str, column: Column) -> float:
    return float(frame.values[frame.devices.ids.index(device), decoder.schema.index(column)])


def cells(frame: Frame, schema: Schema) -> dict[tuple[str, Column], float]:
    """Every value of a frame, keyed by (device, column)."""
    rows, cols = np.nonzero(~np.isnan(frame.values))
    return {
        (frame.devices.ids[r], schema.columns[c]): float(frame.values[r, c])
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True)
    }


POWER = Column("hw.power")
ENERGY = Column("hw.energy")
TEMP = Column("hw.temperature", attrs_of({"hw.sensor_location": "gpu"}), "temp/gpu", "temperature")


# -- the round trip: what the agent writes, the decoder reads --------------------------------
def agent_request(frame: Frame, schema: Schema) -> dict:
    """``frame`` through the agent's sink and the OpenTelemetry SDK, as the OTLP exporter sends it."""
    store = FrameStore()
    store.put(frame, time.monotonic_ns())
    reader = InMemoryMetricReader()
    mp = provider.build_meter_provider(frame.devices.node, [reader], 5000)
    # As the agent does: its hw.status is its verdict (another sink's), not the source's column.
    MetricsSink(store, schema, mp.get_meter("otel_dra", __version__), max_age_s=3600.0, exclude={"hw.status"})
    data = reader.get_metrics_data()
    mp.shutdown()
    return MessageToDict(encode_metrics(data), use_integers_for_enums=True)


@pytest.fixture(scope="module")
def simulated() -> tuple[Frame, Schema, dict]:
    schema = Schema()
    config = SimulatorConfig("node-1", devices=3, seed=3, faults=(Fault("gpu-1", "driver_errors", 0.0),))
    src = SimulatedSource(config, schema)
    src.read(T0)
    frame = src.read(T0 + 10 * S)
    return frame, schema, agent_request(frame, schema)


def assert_same_frame(decoded: Frame, decoder: OtlpJsonDecoder, frame: Frame, schema: Schema) -> None:
    assert decoded.devices.node == frame.devices.node
    assert set(decoded.devices.ids) == set(frame.devices.ids)
    for i, device in enumerate(frame.devices.ids):
        assert decoded.devices.attrs[decoded.devices.ids.index(device)] == frame.devices.attrs[i]
    sent = {key: v for key, v in cells(frame, schema).items() if key[1].metric != "hw.status"}
    assert cells(decoded, decoder.schema) == sent


def test_round_trip_of_the_agents_own_output(simulated):
    frame, schema, doc = simulated
    decoder, frames, errors = decode(doc)
    assert errors == []
    assert len(frames) == 1
    assert_same_frame(frames[0], decoder, frame, schema)
    status = [i for i, c in enumerate(schema.columns) if c.metric == "hw.status"]
    assert decoder.points == int((~np.isnan(frame.values)).sum() - (~np.isnan(frame.values[:, status])).sum())
    assert (decoder.lines, decoder.lines_skipped, decoder.points_skipped) == (1, 0, 0)
    # A driver error code series born at run time comes back as its own column.
    xid = [c for c in decoder.schema.columns if ("hw.error.code", "119") in c.attrs]
    assert len(xid) == 1


def test_round_trip_with_enum_names_and_spaced_json(simulated):
    frame, schema, doc = simulated
    named = MessageToDict(encode_metrics_again(doc))  # enums as names: AGGREGATION_TEMPORALITY_CUMULATIVE
    assert "AGGREGATION_TEMPORALITY_CUMULATIVE" in json.dumps(named)
    spaced = MessageToJson(encode_metrics_again(doc), indent=None)
    assert '"attributes": [' in spaced
    for line in (dumps(named), spaced):
        decoder, frames, errors = decode(line)
        assert errors == []
        assert_same_frame(frames[0], decoder, frame, schema)


@pytest.mark.parametrize(("value", "kept"), [(b"NaN", None), (b"Infinity", None), (b"1" + b"0" * 30, 1e30)])
def test_what_orjson_refuses_the_fast_path_reads_as_json_does(value, kept, monkeypatch):
    """JSON's extensions that Python's json reads (NaN, Infinity) and an integer past 64 bits: orjson refuses
    the tokenized line, json reads it; the same frames and problems as the plain parse."""
    line = dumps(request("node-1", gauge("hw.power", pt(dev("gpu-0"), 1.0), pt(dev("gpu-1"), 123.5))))
    line = line.replace(b"123.5", value)
    fast_decoder, fast, fast_errors = decode(line)
    monkeypatch.setattr(OtlpJsonDecoder, "_tokenize", lambda self, line: None)
    plain_decoder, plain, plain_errors = decode(line)
    assert [str(e) for e in fast_errors] == [str(e) for e in plain_errors]
    assert (kept is None) == bool(fast_errors)
    (a,), (b,) = fast, plain
    assert cell(fast_decoder, a, "gpu-0", POWER) == cell(plain_decoder, b, "gpu-0", POWER) == 1.0
    if kept is not None:
        assert cell(fast_decoder, a, "gpu-1", POWER) == cell(plain_decoder, b, "gpu-1", POWER) == kept


def encode_metrics_again(doc: dict):
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    return ParseDict(doc, ExportMetricsServiceRequest())


def test_fast_and_plain_paths_agree(simulated, monkeypatch):
    """The tokenizing fast path is an optimisation: the plain parse gives the same frames."""
    _, _, doc = simulated
    later = copy.deepcopy(doc)
    for rm in later["resourceMetrics"]:
        for sm in rm["scopeMetrics"]:
            for m in sm["metrics"]:
                for p in next(iter(v for k, v in m.items() if k in ("gauge", "sum")))["dataPoints"]:
                    p["timeUnixNano"] = str(int(p["timeUnixNano"]) + 10 * S)
    fast_decoder, fast, fast_errors = decode(doc, later)
    monkeypatch.setattr(OtlpJsonDecoder, "_tokenize", lambda self, line: None)
    plain_decoder, plain, plain_errors = decode(doc, later)
    assert fast_errors == plain_errors == []
    assert len(fast) == len(plain) == 2
    for a, b in zip(fast, plain, strict=True):
        assert a.time_unix_nano == b.time_unix_nano
        assert cells(a, fast_decoder.schema) == cells(b, plain_decoder.schema)
        assert a.devices == b.devices


# -- files -------------------------------------------------------------------------------------
def test_read_lines_gzip_by_magic_bytes_and_plain(tmp_path, simulated):
    frame, schema, doc = simulated
    line = dumps(doc)
    gz = tmp_path / "recording.jsonl"  # gzip without the .gz suffix
    gz.write_bytes(gzip.compress(line + b"\n\n" + line + b"\r\n"))
    plain = tmp_path / "plain.jsonl.gz"  # plain text despite the suffix
    plain.write_bytes(b"\n" + line + b"\n   \n")
    got = list(read_lines([gz, plain]))
    assert [(p, n) for p, n, _ in got] == [(gz, 1), (gz, 3), (plain, 2)]
    assert all(raw == line for _, _, raw in got)
    decoder = OtlpJsonDecoder(Schema())
    _, _, raw = got[0]
    frames, errors = decoder.decode_line(raw, 1)
    assert errors == []
    assert_same_frame(frames[0], decoder, frame, schema)


def test_read_lines_reads_gzip_as_gzip_does(tmp_path):
    """Members one after another, zero padding after them, a line longer than a piece of the inflated text
    (files.PIECE_SIZE), CRLF and a last line without its newline: the lines Python's gzip reads."""
    from otel_dra.decode import files

    text = b"".join(b'{"n":%d}\r\n' % i for i in range(3000)) + b"\n" + b"x" * (3 * files.PIECE_SIZE + 7) + b"\nlast"
    half = len(text) // 2
    data = gzip.compress(text[:half]) + gzip.compress(text[half:]) + b"\0" * 100
    path = tmp_path / "two-members.jsonl.gz"
    path.write_bytes(data)
    with gzip.open(path, "rb") as f:
        want = [(n, raw.rstrip(b"\r\n")) for n, raw in enumerate(f, 1) if raw.strip()]
    assert [(n, raw) for _, n, raw in read_lines([path])] == want
    assert want[-1] == (3003, b"last") and len(want[-2][1]) == 3 * files.PIECE_SIZE + 7


def test_read_lines_names_a_missing_file(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(OSError) as info:
        list(read_lines([missing]))
    assert isinstance(info.value, InputFileError)
    assert str(missing) in str(info.value) and "\n" not in str(info.value)


def test_read_lines_reports_a_truncated_gzip_after_the_good_lines(tmp_path):
    data = gzip.compress(b"".join(b'{"n":%d}\n' % i for i in range(2000)))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) - 20])
    seen = []
    with pytest.raises(InputFileError, match=r"cut\.jsonl\.gz"):
        for _, n, _ in read_lines([cut]):
            seen.append(n)
    assert seen and seen == list(range(1, len(seen) + 1))


# -- identity: devices, sensors, descriptive attributes ----------------------------------------
def test_sensors_fold_into_their_parent_device():
    doc = request(
        "node-1",
        gauge("hw.power", pt(dev("gpu-0"), 300.0)),
        gauge(
            "hw.temperature",
            pt(sensor("gpu-0", "temp/gpu", "temperature", **{"hw.sensor_location": "gpu", "hw.name": "x"}), 61.5),
            pt({"hw.id": "board-temp-7", "hw.type": "temperature", "hw.parent": "gpu-0"}, 40.0),
            pt(sensor("gpu-1", "temp/gpu", "temperature", **{"hw.sensor_location": "gpu"}), 55.0),
        ),
    )
    decoder, (frame,), errors = decode(doc)
    assert errors == []
    assert frame.devices.ids == ("gpu-0", "gpu-1")  # sensors are never rows of their own
    assert frame.devices.attrs[0] == {k: v for k, v in dev("gpu-0").items() if k != "hw.id"}
    assert frame.devices.attrs[1] == {}  # gpu-1 sent no point of its own: nothing is known of it
    assert cell(decoder, frame, "gpu-0", TEMP) == 61.5  # the sensor's hw.name is not a column attribute
    assert cell(decoder, frame, "gpu-1", TEMP) == 55.0
    board = Column("hw.temperature", (), "board-temp-7", "temperature")  # no "<parent>/" prefix: the whole id
    assert cell(decoder, frame, "gpu-0", board) == 40.0
    assert cell(decoder, frame, "gpu-0", POWER) == 300.0
    assert np.isnan(cell(decoder, frame, "gpu-1", POWER))


def test_column_attrs_keep_what_says_which_series():
    states = ("ok", "degraded", "failed")
    doc = request(
        "node-1",
        updown("hw.status", *(pt(dev(**{"hw.state": s}), int(s == "failed"), as_int=True) for s in states)),
        counter("hw.errors", pt(dev(**{"error.type": "driver", "hw.error.code": "79"}), 2, as_int=True)),
    )
    decoder, (frame,), errors = decode(doc)
    assert errors == []
    for s in states:
        assert cell(decoder, frame, "gpu-0", Column("hw.status", attrs_of({"hw.state": s}))) == float(s == "failed")
    xid = Column("hw.errors", attrs_of({"error.type": "driver", "hw.error.code": "79"}))
    assert cell(decoder, frame, "gpu-0", xid) == 2.0


def test_non_string_attribute_values_become_strings():
    attrs = [
        {"key": "hw.id", "value": {"stringValue": "gpu-0"}},
        {"key": "hw.gpu.task", "value": {"intValue": "3"}},
        {"key": "flag", "value": {"boolValue": True}},
    ]
    flag = [attrs[0], {"key": "error.type", "value": {"boolValue": True}}]
    doc = request(
        "node-1",
        gauge("hw.gpu.utilization", {"attributes": attrs, "timeUnixNano": str(T0), "asDouble": 0.5}),
        gauge("hw.errors", {"attributes": flag, "timeUnixNano": str(T0), "asDouble": 2.0}),
    )
    decoder, (frame,), errors = decode(doc)
    assert errors == []
    # "flag" is no series attribute of hw.gpu.utilization (conventions.SERIES_ATTRIBUTES): ignored, the point taken.
    assert cell(decoder, frame, "gpu-0", Column("hw.gpu.utilization", attrs_of({"hw.gpu.task": "3"}))) == 0.5
    assert cell(decoder, frame, "gpu-0", Column("hw.errors", attrs_of({"error.type": "true"}))) == 2.0
    assert len(decoder.schema) == 2


def test_equal_device_tables_are_one_object():
    doc = request("node-1", gauge("hw.power", pt(dev("gpu-0"), 1.0), pt(dev("gpu-1"), 2.0)))
    later = request("node-1", gauge("hw.power", pt(dev("gpu-0"), 3.0, T0 + S), pt(dev("gpu-1"), 4.0, T0 + S)))
    _, (a, b), _ = decode(doc, later)
    assert a.devices is b.devices


def test_duplicate_points_last_wins():
    doc = request("node-1", gauge("hw.power", pt(dev(), 1.0), pt(dev(), 2.0)), gauge("hw.power", pt(dev(), 3.0)))
    decoder, (frame,), errors = decode(doc)
    assert errors == []
    assert cell(decoder, frame, "gpu-0", POWER) == 3.0


@pytest.mark.parametrize(
    ("name", "fast"),
    [
        ('GPU "0" <A&B> \\ / \t', True),  # escapes that can't spell a key keep the fast path
        ("GPU 0 [rev a]", False),  # a "]" inside a list: the regex can't delimit it, so the plain path
        ("GPU é \u2603", True),
    ],
)
def test_values_with_escapes_or_brackets_decode_on_either_path(name, fast):
    odd = dev("gpu-0", **{"hw.name": name})
    line = dumps(request("node-1", gauge("hw.power", pt(odd, 5.0)))).replace(b"<", b"\\u003c")  # as Go writes it
    decoder = OtlpJsonDecoder(Schema())
    assert (decoder._tokenize(line) is not None) == fast
    _, (frame,), errors = decode(line, decoder=decoder)
    assert errors == []
    assert frame.devices.attrs[0]["hw.name"] == name
    assert cell(decoder, frame, "gpu-0", POWER) == 5.0


def test_str_input_and_int_typed_numbers():
    doc = request("node-1", gauge("hw.power", {"attributes": kv(dev()), "timeUnixNano": T0, "asInt": 7}))
    decoder, (frame,), errors = decode(json.dumps(doc))
    assert errors == []
    assert frame.time_unix_nano == T0
    assert cell(decoder, frame, "gpu-0", POWER) == 7.0


# -- nodes and time -------------------------------------------------------------------------------
def test_one_frame_per_node_and_time_in_time_order():
    node_a = {
        "resource": {"attributes": kv({"k8s.node.name": "node-a"})},
        "scopeMetrics": [{"metrics": [gauge("hw.power", pt(dev(), 2.0, T0 + S), pt(dev(), 1.0, T0))]}],
    }
    node_b = {
        "resource": {"attributes": kv({"k8s.node.name": "node-b"})},
        "scopeMetrics": [{"metrics": [gauge("hw.power", pt(dev(), 9.0, T0))]}],
    }
    decoder, frames, errors = decode(request(None, resources=[node_a, node_b]))
    assert errors == []
    assert [(f.devices.node, f.time_unix_nano) for f in frames] == [
        ("node-a", T0),
        ("node-b", T0),
        ("node-a", T0 + S),
    ]
    assert [cell(decoder, f, "gpu-0", POWER) for f in frames] == [1.0, 9.0, 2.0]


def test_backwards_time_is_skipped_per_series():
    decoder = OtlpJsonDecoder(Schema())
    a_late = request("node-a", gauge("hw.power", pt(dev(), 1.0, T0 + 20 * S)))
    a_early = request("node-a", gauge("hw.power", pt(dev(), 2.0, T0 + 10 * S), pt(dev("gpu-1"), 3.0, T0 + 30 * S)))
    b_early = request("node-b", gauge("hw.power", pt(dev(), 4.0, T0 + 10 * S)))
    a_same = request("node-a", gauge("hw.power", pt(dev("gpu-1"), 5.0, T0 + 30 * S)))
    _, frames, errors = decode(a_late, a_early, b_early, a_same, decoder=decoder)
    assert [(f.devices.node, f.time_unix_nano, f.devices.ids) for f in frames] == [
        ("node-a", T0 + 20 * S, ("gpu-0",)),
        ("node-a", T0 + 30 * S, ("gpu-1",)),
        ("node-b", T0 + 10 * S, ("gpu-0",)),
        ("node-a", T0 + 30 * S, ("gpu-1",)),  # equal to the newest is not older
    ]
    assert [str(e) for e in errors] == [
        f"line 2: a point of hw.power (gpu-0) on node node-a is at {T0 + 10 * S}, "
        f"older than {T0 + 20 * S} already read for that series"
    ]
    assert (decoder.points, decoder.points_skipped) == (5, 1)


# -- bad lines: skipped whole, one error each -------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"resourceMetrics": [', "is not JSON"),
        (b"\xff\xfe\x00garbage", "is not"),
        (b"[1, 2]", "not an ExportMetricsServiceRequest object"),
        (b'"text"', "not an ExportMetricsServiceRequest object"),
        (b"{}", "has no resourceMetrics"),
        (b'{"resourceMetrics": {"a": 1}}', "resourceMetrics that is not a list"),
        (dumps(request(None, gauge("hw.power", pt(dev(), 1.0)))), "resource 1 has no k8s.node.name"),
        (dumps(request("", gauge("hw.power", pt(dev(), 1.0)))), "resource 1 has no k8s.node.name"),
        (b'{"resourceMetrics": [7]}', "resource 1 has no k8s.node.name"),
        (b'{"resourceMetrics": [{"resource": {"attributes": 5}}]}', "resource 1 has malformed attributes"),
        (b"[" * 100_000, "is not JSON"),
        ("\ud800", "is not JSON"),
    ],
)
def test_bad_lines_are_skipped_with_one_error(line, reason):
    decoder, frames, errors = decode(line, line)
    assert frames == []
    assert len(errors) == 2 and [e.line for e in errors] == [1, 2]
    assert reason in errors[0].message and errors[0].message.endswith("line skipped")
    assert str(errors[0]).startswith("line 1: ") and "\n" not in str(errors[0])
    assert (decoder.lines, decoder.lines_skipped, decoder.points, decoder.points_skipped) == (2, 2, 0, 0)


# -- bad points: skipped alone, reported, the rest of the line kept ---------------------------------
BAD_POINTS = [
    ({"attributes": kv({"hw.type": "gpu"}), "timeUnixNano": str(T0), "asDouble": 1.0}, "has no hw.id"),
    ({"attributes": kv({"hw.id": ""}), "timeUnixNano": str(T0), "asDouble": 1.0}, "has no hw.id"),
    ({"attributes": {"hw.id": "gpu-0"}, "timeUnixNano": str(T0), "asDouble": 1.0}, "attributes that are not a list"),
    ({"attributes": [{"key": 1}], "timeUnixNano": str(T0), "asDouble": 1.0}, "malformed attributes"),
    ({"attributes": kv(dev()), "timeUnixNano": "soon", "asDouble": 1.0}, "timeUnixNano 'soon', not an integer"),
    ({"attributes": kv(dev()), "timeUnixNano": 1.5e18, "asDouble": 1.0}, "not an integer"),
    ({"attributes": kv(dev()), "asDouble": 1.0}, "has no timeUnixNano"),
    ({"attributes": kv(dev()), "timeUnixNano": "9" * 5000, "asDouble": 1.0}, "out of range"),
    ({"attributes": kv(dev()), "timeUnixNano": "0", "asDouble": 1.0}, "out of range"),
    ({"attributes": kv(dev()), "timeUnixNano": str(T0), "asInt": "9" * 5000}, "out of range"),
    ({"attributes": kv(dev()), "timeUnixNano": str(T0)}, "has no value"),
    ({"attributes": kv(dev()), "timeUnixNano": str(T0), "asDouble": "abc"}, "asDouble 'abc', not a number"),
    ({"attributes": kv(dev()), "timeUnixNano": str(T0), "asDouble": True}, "asDouble true, not a number"),
    ({"attributes": kv(dev()), "timeUnixNano": str(T0), "asInt": [1]}, "asInt a list, not a number"),
    ({"attributes": kv(dev()), "timeUnixNano": str(T0), "asDouble": "NaN"}, "has asDouble NaN"),
    ({"attributes": kv(dev()), "timeUnixNano": str(T0), "asDouble": "Infinity"}, "has asDouble Infinity"),
    ({"attributes": kv(dev()), "timeUnixNano": str(T0), "asDouble": "-Infinity"}, "has asDouble -Infinity"),
    ({"attributes": kv(dev()), "timeUnixNano": str(T0), "asDouble": 1e999}, "has asDouble Infinity"),
    ({"attributes": kv(dev("gpu-0", **{"hw.type": "fan"})), "timeUnixNano": str(T0), "asDouble": 1.0}, "sensor"),
    ("a string", "is not an object"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD_POINTS)
def test_a_bad_point_is_skipped_and_its_neighbours_kept(bad, reason):
    doc = request("node-1", gauge("hw.power", pt(dev("gpu-0"), 1.0), bad, pt(dev("gpu-1"), 2.0)))
    decoder, frames, errors = decode(doc)
    assert len(errors) == 1 and errors[0].line == 1 and str(errors[0]) == f"line 1: {errors[0].message}"
    assert errors[0].message.startswith("point 2 of hw.power ") and reason in errors[0].message
    (frame,) = frames
    assert cell(decoder, frame, "gpu-0", POWER) == 1.0 and cell(decoder, frame, "gpu-1", POWER) == 2.0
    assert (decoder.points, decoder.points_skipped, decoder.lines_skipped) == (3, 1, 0)


def test_error_messages_say_what_and_where():
    lines = [dumps(request("node-1", gauge("hw.power", pt(dev(), 1.0))))] * 16
    no_id = {"attributes": kv({"hw.type": "gpu"}), "timeUnixNano": str(T0 + S), "asInt": "1"}
    good = pt(dev(**{"error.type": "corrected"}), 1, T0 + S, as_int=True)
    lines.append(dumps(request("node-1", counter("hw.errors", good, good, no_id))))
    _, _, errors = decode(*lines)
    assert [str(e) for e in errors] == ["line 17: point 3 of hw.errors has no hw.id"]


def test_negative_values_are_only_wrong_on_counters():
    doc = request(
        "node-1",
        counter("hw.energy", pt(dev("gpu-0"), 10.0), pt(dev("gpu-1"), -1.0), pt(dev("gpu-2"), "-3", as_int=True)),
        updown("hw.gpu.memory.usage", pt(dev("gpu-1"), -5.0)),
        gauge("hw.power", pt(dev("gpu-2"), -2.0)),
    )
    decoder, (frame,), errors = decode(doc)
    assert [e.message for e in errors] == [
        "point 2 of hw.energy (gpu-1) is -1 on a counter (cumulative, monotonic)",
        "point 3 of hw.energy (gpu-2) is -3 on a counter (cumulative, monotonic)",
    ]
    assert cell(decoder, frame, "gpu-0", ENERGY) == 10.0
    assert np.isnan(cell(decoder, frame, "gpu-1", ENERGY))
    assert cell(decoder, frame, "gpu-1", Column("hw.gpu.memory.usage")) == -5.0
    assert cell(decoder, frame, "gpu-2", POWER) == -2.0


def test_point_errors_are_capped_per_line_but_counted_exactly():
    bad = [{"attributes": kv({"hw.type": "gpu"}), "timeUnixNano": str(T0), "asDouble": 1.0}] * 1000
    doc = request("node-1", gauge("hw.power", pt(dev(), 1.0), *bad))
    decoder, frames, errors = decode(doc)
    cap = otlp_json.MAX_POINT_ERRORS_PER_LINE
    assert len(errors) == cap + 1
    assert errors[-1].message == f"{1000 - cap:,} more problems on this line not shown"
    assert (decoder.points, decoder.points_skipped) == (1001, 1000)
    assert len(frames) == 1


def test_unknown_metrics_one_error_per_name_per_line():
    scope = {
        "metrics": [
            gauge("hw.power", pt(dev(), 1.0)),
            gauge("gpu.fancy", pt(dev(), 1.0), pt(dev(), 2.0)),
            gauge("other.thing", pt(dev(), 1.0)),
        ]
    }
    resources = [{"resource": {"attributes": kv({"k8s.node.name": "node-1"})}, "scopeMetrics": [scope, scope]}]
    decoder, frames, errors = decode(request(None, resources=resources))
    assert sorted(e.message for e in errors) == [
        "unknown metric 'gpu.fancy' (4 points) skipped",
        "unknown metric 'other.thing' (2 points) skipped",
    ]
    assert (decoder.points, decoder.points_skipped) == (8, 6)
    assert cell(decoder, frames[0], "gpu-0", POWER) == 1.0


def test_delta_sums_and_histograms_are_skipped():
    hist = {"name": "hw.power", "histogram": {"dataPoints": [{"attributes": kv(dev())}]}}
    doc = request(
        "node-1",
        counter("hw.energy", pt(dev(), 5.0), temporality="AGGREGATION_TEMPORALITY_DELTA"),
        counter("hw.errors", pt(dev(**{"error.type": "corrected"}), 5.0), temporality=1),
        hist,
        gauge("hw.gpu.utilization", pt(dev(), 0.5)),
    )
    decoder, frames, errors = decode(doc)
    assert [e.message for e in errors] == [
        "hw.energy is a delta sum; only cumulative sums are read (1 points skipped)",
        "hw.errors is a delta sum; only cumulative sums are read (1 points skipped)",
        "hw.power is a histogram, not a gauge or sum (1 points skipped)",
    ]
    assert (decoder.points, decoder.points_skipped) == (4, 3)
    assert len(frames) == 1


def test_an_escaped_attributes_key_is_not_mistaken_for_a_token():
    # Warm the cache so that token 0 and 1 exist, then spoof an int "attributes" through an escape.
    good = dumps(request("node-1", gauge("hw.power", pt(dev(), 1.0))))
    spoof = good.replace(b'"attributes":[{"key":"hw.id"', b'"\\u0061ttributes":1,"x":[{"key":"hw.id"', 1)
    spoof = spoof.replace(b',"timeUnixNano":"%d"' % T0, b',"timeUnixNano":"%d"' % (T0 + S))
    spaced = good.replace(b'"attributes":[{"key":"hw.id"', b'"attributes" :1,"x":[{"key":"hw.id"', 1)
    spaced = spaced.replace(b',"timeUnixNano":"%d"' % T0, b',"timeUnixNano":"%d"' % (T0 + 2 * S))
    utf16 = good.replace(b'"attributes":[{"key":"hw.id"', b'"attributes":1,"x":[{"key":"hw.id"', 1)
    utf16 = utf16.replace(b',"timeUnixNano":"%d"' % T0, b',"timeUnixNano":"%d"' % (T0 + 3 * S))
    utf16 = utf16.decode().encode("utf-16-le")  # json.loads reads UTF-16 too
    _, frames, errors = decode(good, spoof, spaced, utf16)
    assert len(frames) == 1
    assert [str(e) for e in errors] == [
        "line 2: point 1 of hw.power has attributes that are not a list",
        "line 3: point 1 of hw.power has attributes that are not a list",
        "line 4: point 1 of hw.power has attributes that are not a list",
    ]


def test_a_broken_line_stays_broken_on_the_fast_path():
    """A token is a number: what follows the list it replaced must not run on into it."""
    good = dumps(request("node-1", gauge("hw.power", pt(dev(), 1.0))))
    for tail in (b"4", b".5", b"e3", b"E+1"):
        broken = good.replace(b'}}],"timeUnixNano"', b"}}]" + tail + b',"timeUnixNano"')
        _, frames, errors = decode(good, broken)
        assert len(frames) == 1
        assert len(errors) == 1 and errors[0].message.startswith("is not JSON")


# -- garbage never escapes as an exception ---------------------------------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
SPECIAL = st.sampled_from(
    ["NaN", "Infinity", "-1", "1e400", "", "gpu-0", "attributes", "hw.id", str(T0), '"attributes":[]', "]"]
)


def paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, (*prefix, i))


def replace_at(doc, path, new):
    if not path:
        return new
    doc = copy.deepcopy(doc)
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return doc


VALID = request(
    "node-1",
    gauge("hw.power", pt(dev("gpu-0"), 1.0), pt(dev("gpu-1"), 2.0)),
    counter("hw.energy", pt(dev("gpu-0"), 10.0, as_int=True)),
    gauge("hw.temperature", pt(sensor("gpu-0", "temp/gpu", "temperature", **{"hw.sensor_location": "gpu"}), 50.0)),
)
VALID_PATHS = list(paths(VALID))


def check_consistent(decoder: OtlpJsonDecoder, calls: int, kept: int) -> None:
    assert decoder.lines == calls
    assert 0 <= decoder.lines_skipped <= decoder.lines
    assert 0 <= decoder.points_skipped <= decoder.points
    assert kept <= decoder.points - decoder.points_skipped


def assert_paths_agree(lines: list[bytes | str]) -> None:
    fast, plain = OtlpJsonDecoder(Schema()), PlainDecoder(Schema())
    for n, line in enumerate(lines, 1):
        fast_frames, fast_errors = fast.decode_line(line, n)
        plain_frames, plain_errors = plain.decode_line(line, n)
        assert fast_errors == plain_errors
        assert [(f.time_unix_nano, f.devices) for f in fast_frames] == [
            (f.time_unix_nano, f.devices) for f in plain_frames
        ]
        for a, b in zip(fast_frames, plain_frames, strict=True):
            assert cells(a, fast.schema) == cells(b, plain.schema)
    counters = ("lines", "lines_skipped", "points", "points_skipped")
    assert [getattr(fast, c) for c in counters] == [getattr(plain, c) for c in counters]


def run_all(lines: list[bytes | str]) -> None:
    decoder = OtlpJsonDecoder(Schema())
    kept = 0
    for n, line in enumerate(lines, 1):
        frames, errors = decoder.decode_line(line, n)
        assert all(isinstance(e, DecodeError) and e.line == n and "\n" not in e.message for e in errors)
        assert len(errors) <= otlp_json.MAX_POINT_ERRORS_PER_LINE + otlp_json.MAX_METRIC_ERRORS_PER_LINE + 1
        for frame in frames:
            assert frame.values.shape == (len(frame.devices), frame.values.shape[1])
            assert frame.values.shape[1] <= len(decoder.schema)
            finite = frame.values[~np.isnan(frame.values)]
            assert np.isfinite(finite).all()
            kept += finite.size
        check_consistent(decoder, n, kept)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(VALID_PATHS) - 1), JSON_VALUES | SPECIAL), min_size=1, max_size=3))
def test_mutated_requests_never_raise(mutations):
    doc = VALID
    for index, value in mutations:
        path = VALID_PATHS[index]
        try:
            doc = replace_at(doc, path, value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    lines = [dumps(VALID), json.dumps(doc).encode(), json.dumps(doc, separators=(",", ":"))]
    run_all(lines)
    assert_paths_agree(lines)


def test_an_integer_past_64_bits_reads_as_json_reads_it() -> None:
    """orjson reads an integer past 64 bits as a float (json: the int it is); the fast path reads such a line as the
    plain parse does (found by the mutation test above: a request that is only ``-9223372036854775809``)."""
    lines = [b"-9223372036854775809", json.dumps(replace_at(VALID, VALID_PATHS[0], 18446744073709551616)).encode()]
    run_all(lines)
    assert_paths_agree(lines)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200) | JSON_VALUES.map(json.dumps))
def test_garbage_lines_never_raise(garbage):
    run_all([garbage, dumps(VALID)])


BYTES = [bytes([b]) for b in b'"[]{},:\\0123456789-eE .aN\xff']
SNIPPETS = [
    b'\\"',
    b"\\\\",
    b"\\u0061",
    b"\\u0073",
    b"\\u003c",
    b'"attributes":',
    b'"attributes":[]',
    b'"attributes" :[',
    b'"attributes":1,',
    b'{"key":"hw.id","value":{"stringValue":"gpu-9"}}',
    b"]",
    b"NaN",
]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_byte_mutations_of_a_valid_line_never_raise(data):
    """Byte edits, including the ones the tokenizer must see through (escapes, brackets, the key
    itself): never an exception, and the fast path always agrees with the plain parse."""
    line = bytearray(dumps(VALID))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(line) - 1))
        op = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        snippet = data.draw(st.sampled_from(list(BYTES) + SNIPPETS))
        if op == "delete":
            del line[at : at + len(snippet)]
        elif op == "insert":
            line[at:at] = snippet
        else:
            line[at : at + len(snippet)] = snippet
    run_all([dumps(VALID), bytes(line)])
    assert_paths_agree([dumps(VALID), bytes(line)])


def test_an_agents_own_hw_status_is_its_verdict_not_an_input():
    """An otel-dra agent's hw.status (scope otel_dra) is a verdict: reading it back as the device's
    own report would feed a fleet its agents' verdicts. Another producer's hw.status is input."""
    status = updown("hw.status", pt(dev(**{"hw.state": "failed"}), 1, as_int=True))
    power = gauge("hw.power", pt(dev(), 300.0))
    res = kv({"k8s.node.name": "node-1"})
    for scope, kept in (({"name": "otel_dra", "version": "0.1.0"}, False), ({"name": "gpu-exporter"}, True)):
        doc = {
            "resourceMetrics": [
                {"resource": {"attributes": res}, "scopeMetrics": [{"scope": scope, "metrics": [status, power]}]}
            ]
        }
        decoder = OtlpJsonDecoder(Schema())
        frames, errors = decoder.decode_line(dumps(doc), 1)
        assert not errors and len(frames) == 1
        names = {c.metric for c in decoder.schema.columns}
        assert "hw.power" in names
        assert ("hw.status" in names) is kept


def test_both_encodings_decode_into_one_result():
    """Issue #13: the JSON and protobuf decoders share one core and return one result type, so the
    receiver's partial success reads either as it is: same counts, same frames, same problems
    (each encoding naming its own fields), and an unusable request says why in ``invalid``."""
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_dra.decode import DecodeResult, OtlpProtoDecoder

    doc = request(
        "node-1",
        gauge("hw.power", pt(dev("gpu-0"), 100.0), pt({"hw.type": "gpu"}, 1.0)),
        gauge("vendor.bogus", pt(dev("gpu-0"), 1.0)),
        counter("hw.energy", pt(dev("gpu-0"), 5.0), temporality=1),
    )
    jd, pd = OtlpJsonDecoder(Schema()), OtlpProtoDecoder(Schema())
    from_json = jd.decode(dumps(doc), 1)
    from_proto = pd.decode(ParseDict(doc, ExportMetricsServiceRequest()).SerializeToString())
    assert type(from_json) is type(from_proto) is DecodeResult
    assert (from_json.points, from_json.rejected, from_json.accepted) == (4, 3, 1)
    assert (from_proto.points, from_proto.rejected, from_proto.accepted) == (4, 3, 1)
    assert from_json.message.startswith("3 of 4 data points rejected: ") and from_proto.message.startswith(
        "3 of 4 data points rejected: "
    )
    assert sorted(from_json.problems) == sorted(from_proto.problems)
    assert from_json.invalid is None and from_proto.invalid is None
    assert [f.values.tolist() for f in from_json.frames] == [f.values.tolist() for f in from_proto.frames]
    assert [str(e) for e in from_json.errors] == [f"line 1: {p}" for p in from_json.problems]
    skipped = jd.decode(b"[1, 2]", 2)
    assert skipped.invalid == "is a JSON list, not an ExportMetricsServiceRequest object; line skipped"
    assert not skipped.frames and [e.message for e in skipped.errors] == [skipped.invalid]


def test_otel_dras_own_telemetry_is_ignored_alike_by_both_decoders():
    """An agent pushes its verdicts, its kubelet stream's gauges and its push queue's metrics beside hw.*:
    none is input and none a rejection (counted as ignored), in the JSON decoder, the protobuf decoder and its
    template path alike; hw.status is ignored only from an agent's scope (from anyone else it is a device's),
    and a truly unknown metric is still rejected."""
    from google.protobuf.json_format import Parse
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_dra import conventions as cv
    from otel_dra.decode.otlp_proto import OtlpProtoDecoder

    def doc(t: int) -> dict:
        agents = [
            gauge("hw.power", pt(dev(), 300.0, t)),
            updown(
                "hw.status", pt(dev(**{"hw.state": "ok"}), 1, t, True), pt(dev(**{"hw.state": "failed"}), 0, t, True)
            ),
            gauge(cv.OTEL_DRA_PUSH_QUEUE_SIZE.name, pt({}, 12, t, True)),
            counter(
                cv.OTEL_DRA_PUSH_POINTS.name,
                pt({"outcome": "sent"}, 90, t, True),
                pt({"outcome": "dropped"}, 0, t, True),
            ),
            gauge(cv.DRA_DEVICE_HEALTH.name, pt(dev(**{"dra.device.health.state": "Healthy"}), 1, t, True)),
            gauge(cv.DRA_KUBELET_WATCHERS.name, pt({}, 1, t, True)),  # no hw.id: rejected if it were read
        ]
        others = [
            updown("hw.status", pt(dev("gpu-1", **{"hw.state": "ok"}), 1, t, True)),
            counter(cv.OTEL_DRA_PUSH_POINTS.name, pt({"outcome": "sent"}, 5, t, True)),
            gauge("made.up.metric", pt(dev(), 1.0, t)),
        ]
        attrs = kv({"k8s.node.name": "node-1"})
        scopes = [{"scope": {"name": cv.AGENT_SCOPE}, "metrics": agents}, {"scope": {"name": "x"}, "metrics": others}]
        return request(None, resources=[{"resource": {"attributes": attrs}, "scopeMetrics": scopes}])

    ignored, points, rejected = 2 + 1 + 2 + 1 + 1 + 1, 1 + 1 + 1, 1
    as_json, fast, plain = OtlpJsonDecoder(Schema()), OtlpProtoDecoder(Schema()), OtlpProtoDecoder(Schema(), fast=False)
    for t in (T0, T0 + S):
        proto = Parse(json.dumps(doc(t)), ExportMetricsServiceRequest()).SerializeToString()
        results = [as_json.decode(dumps(doc(t))), fast.decode(proto), plain.decode(proto)]
        for result in results:
            assert (result.points, result.rejected, result.ignored) == (points, rejected, ignored)
            assert "made.up.metric" in result.message and "otel_dra" not in result.message
            (frame,) = result.frames
            assert frame.devices.ids == ("gpu-0", "gpu-1")
    assert fast.sections_fast == 1, "the second request took the template path"
    assert as_json.points_ignored == fast.points_ignored == plain.points_ignored == 2 * ignored
    assert {c.metric for c in as_json.schema.columns} == {"hw.power", "hw.status"}


def test_shape_entries_packed_round_trip() -> None:
    """A shape's entries kept as int16 offsets read back as the entries they were (issue #17)."""
    from otel_dra.decode.json_shapes import UNKNOWN_ENTRY as _UNKNOWN
    from otel_dra.decode.json_shapes import Shape as _Shape
    from otel_dra.decode.json_shapes import packed as _packed

    for learned in ([_UNKNOWN, 70_000, 70_001, _UNKNOWN, 70_005], [5, -1, _UNKNOWN], [0, 40_000], [_UNKNOWN]):
        entries, base = _packed(learned)
        shape = _Shape(entries, (), entries, entries, {}, (), base)
        assert shape.positions() == learned
    assert _packed([_UNKNOWN, 70_000, 70_001])[0].dtype == np.int16


def test_entries_column_past_int16() -> None:
    """An entry's column past what int16 holds makes the columns int32, the earlier ones kept."""
    from otel_dra.decode.json_shapes import Entries as _Entries

    entries = _Entries()
    for i in range(3000):
        entries.add(i, i % 7, -1, False)
    entries.add(1, 40_000, 2, True)
    assert entries.col.dtype == np.int32
    assert entries.col[: entries.n].tolist() == [i % 7 for i in range(3000)] + [40_000]
    assert entries.dev[: entries.n].tolist() == [*range(3000), 1]
