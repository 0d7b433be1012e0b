"""The fleet's OTLP metrics receiver: real gRPC and HTTP on loopback, requests made by the real
OpenTelemetry SDK exporters (fed by the agent's own metric sink) or forwarded by a real collector
(rotel), and the protobuf decoder's fast path checked against its plain path."""

from __future__ import annotations

import gzip
import http.client
import json
import math
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.json_format import MessageToJson
from google.rpc import code_pb2, status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import MetricsServiceStub
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult, MetricsData

from otel_dra import __version__
from otel_dra import conventions as cv
from otel_dra.decode import DecodeResult, OtlpJsonDecoder, proto_wire
from otel_dra.decode.limits import LIMIT_REASONS
from otel_dra.decode.otlp_proto import MalformedRequest, OtlpProtoDecoder
from otel_dra.frame import Column, Frame, Schema, attrs_of
from otel_dra.receivers.factory import new_receiver as OtlpReceiver
from otel_dra.receivers.handlers import GRPC_METHOD, GRPC_SERVICE, RequestPath
from otel_dra.receivers.telemetry import CONNECTIONS, POINTS, REFUSED, REQUESTS
from otel_dra.sinks import provider
from otel_dra.sinks.metrics import MetricsSink
from otel_dra.sinks.verdict_metrics import VERDICT_METRICS
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from otel_dra.state import FrameStore
from tests.conftest import free_port, rotel_binary, wait_for

S = 10**9
T0 = 1_795_000_000 * S
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
EXPORT = f"/{GRPC_SERVICE}/{GRPC_METHOD}"


# -- the agent side: the project's sink on the real SDK, one pipeline per simulated node ----------
class Agent:
    """One node's agent pipeline (``MetricsSink`` over a ``FrameStore`` on the real SDK), sampled
    on demand: what ``otel-dra run`` exports."""

    def __init__(self, node: str, devices: int = 3, seed: int = 0) -> None:
        self.node = node
        self.schema = Schema()
        self.src = SimulatedSource(SimulatorConfig(node, devices=devices, seed=seed, start_unix_nano=T0), self.schema)
        self.store = FrameStore()
        self.reader = InMemoryMetricReader()
        self.mp = provider.build_meter_provider(node, [self.reader], 5000)
        # As the agent has it: hw.status is the verdict's (another sink's), not the source's column.
        meter = self.mp.get_meter(cv.AGENT_SCOPE, __version__)
        MetricsSink(self.store, self.schema, meter, max_age_s=3600.0, exclude=VERDICT_METRICS)

    def sample(self, t: int) -> tuple[Frame, MetricsData]:
        frame = self.src.read(t)
        self.store.put(frame, time.monotonic_ns())
        data = self.reader.get_metrics_data()
        assert data is not None
        return frame, data

    def close(self) -> None:
        self.mp.shutdown()


def cells(frame: Frame, schema: Schema) -> dict[tuple[str, str, Column], float]:
    """Every value of a frame, keyed by (node, device, column)."""
    rows, cols = np.nonzero(~np.isnan(frame.values))
    node = frame.devices.node
    return {
        (node, frame.devices.ids[r], schema.columns[c]): float(frame.values[r, c])
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True)
    }


def exported(frame: Frame, schema: Schema) -> dict[tuple[str, str, Column], float]:
    """The cells of a source frame the agent exports (its hw.status is the verdict's, not these)."""
    return {key: v for key, v in cells(frame, schema).items() if key[2].metric not in VERDICT_METRICS}


def assert_same_frame(got: Frame, got_schema: Schema, sent: Frame, sent_schema: Schema) -> None:
    assert got.devices.node == sent.devices.node
    assert cells(got, got_schema) == exported(sent, sent_schema)
    for i, device in enumerate(sent.devices.ids):
        assert got.devices.attrs[got.devices.ids.index(device)] == sent.devices.attrs[i]


# -- requests by hand ----------------------------------------------------------------------------
def kvs(attrs: dict[str, str]) -> list[KeyValue]:
    return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attrs.items()]


def pt(attrs: dict, value: float | int | None, t: int = T0, as_int: bool = False) -> NumberDataPoint:
    point = NumberDataPoint(attributes=kvs(attrs), time_unix_nano=t, start_time_unix_nano=T0)
    if value is not None:
        if as_int:
            point.as_int = int(value)
        else:
            point.as_double = float(value)
    return point


def gauge(name: str, *points: NumberDataPoint) -> Metric:
    return Metric(name=name, unit="1", gauge=Gauge(data_points=points))


def counter(name: str, *points: NumberDataPoint, temporality: int = CUMULATIVE, monotonic: bool = True) -> Metric:
    return Metric(
        name=name, unit="1", sum=Sum(data_points=points, aggregation_temporality=temporality, is_monotonic=monotonic)
    )


def resource(node: str | None, *metrics: Metric, scope: str = "gpu-exporter") -> ResourceMetrics:
    attrs = {"service.name": "otel-dra"} | ({"k8s.node.name": node} if node is not None else {})
    scopes = [ScopeMetrics(scope=InstrumentationScope(name=scope), metrics=metrics)]
    return ResourceMetrics(resource=Resource(attributes=kvs(attrs)), scope_metrics=scopes)


def req(*resources: ResourceMetrics) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest(resource_metrics=resources)


def gpu(device: str = "gpu-0", **extra: str) -> dict[str, str]:
    return {"hw.id": device, "hw.type": "gpu", "hw.name": f"GPU {device}", **extra}


def temp_sensor(device: str = "gpu-0") -> dict[str, str]:
    return {"hw.id": f"{device}/temp/gpu", "hw.type": "temperature", "hw.parent": device, "hw.sensor_location": "gpu"}


POWER = Column("hw.power")
TEMP = Column("hw.temperature", attrs_of({"hw.sensor_location": "gpu"}), "temp/gpu", "temperature")
UNCORRECTED = Column("hw.errors", attrs_of({"error.type": "uncorrected"}))


def mixed_request(t: int = T0) -> tuple[ExportMetricsServiceRequest, int]:
    """A request with good points and one of each kind of bad one; returns it and how many are bad."""
    request = req(
        resource(
            "node-1",
            gauge("hw.power", pt(gpu("gpu-0"), 300.0, t), pt(gpu("gpu-1"), math.nan, t), pt({"hw.type": "gpu"}, 1, t)),
            gauge("hw.temperature", pt(temp_sensor("gpu-0"), 55.0, t)),
            counter("hw.errors", pt(gpu("gpu-0", **{"error.type": "uncorrected"}), -1.0, t)),
            counter("hw.energy", pt(gpu("gpu-0"), 5.0, t), temporality=DELTA),
            gauge("made.up.metric", pt(gpu("gpu-0"), 1.0, t), pt(gpu("gpu-1"), 1.0, t)),
        ),
        resource(None, gauge("hw.power", pt(gpu("gpu-9"), 1.0, t))),
    )
    return request, 1 + 1 + 1 + 1 + 2 + 1  # NaN, no hw.id, negative counter, delta, unknown x2, no node


# -- round trips: the SDK's exporters into the receiver --------------------------------------------
def test_grpc_round_trip_from_the_sdk_exporter(start_receiver):
    receiver, inbox = start_receiver()
    exporter = GrpcExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True, timeout=5)
    agents = [Agent("node-a", devices=3, seed=1), Agent("node-b", devices=2, seed=2)]
    sent: dict[str, list[Frame]] = {"node-a": [], "node-b": []}
    for k in range(3):
        for agent in agents:
            frame, data = agent.sample(T0 + k * 10 * S)
            sent[agent.node].append(frame)
            assert exporter.export(data) is MetricExportResult.SUCCESS
    exporter.shutdown()
    for agent in agents:
        node = agent.node
        got = inbox.frames(node)
        assert len(got) == 3
        assert [f.time_unix_nano for f in got] == sorted(f.time_unix_nano for f in got)
        for frame_got, frame_sent in zip(got, sent[node], strict=True):
            assert_same_frame(frame_got, receiver.schema, frame_sent, agent.schema)
        agent.close()
    stats = receiver.stats()
    assert stats["requests"][("grpc", "ok")] == 6
    assert stats["points"]["rejected"] == 0
    assert stats["points"]["accepted"] == sum(len(exported(f, a.schema)) for a in agents for f in sent[a.node])
    assert receiver._decoder.sections_fast == 4  # every node's second and third request took the fast path


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_http_round_trip_from_the_sdk_exporter(start_receiver, compression):
    receiver, inbox = start_receiver()
    url = f"http://127.0.0.1:{receiver.http_port}/v1/metrics"
    exporter = HttpExporter(endpoint=url, compression=compression, timeout=5)
    agent = Agent("node-h", devices=4, seed=4)
    sent = []
    for k in range(2):
        frame, data = agent.sample(T0 + k * 10 * S)
        sent.append(frame)
        assert exporter.export(data) is MetricExportResult.SUCCESS
    exporter.shutdown()
    agent.close()
    got = inbox.frames("node-h")
    assert len(got) == 2
    for frame_got, frame_sent in zip(got, sent, strict=True):
        assert_same_frame(frame_got, receiver.schema, frame_sent, agent.schema)
    assert receiver.stats()["requests"][("http", "ok")] == 2


def test_a_real_collector_forwards_into_the_receiver(start_receiver, tmp_path: Path):
    """rotel receives the agent's export and forwards it over OTLP/gRPC to the receiver."""
    receiver, inbox = start_receiver()
    grpc_in = f"127.0.0.1:{free_port()}"
    log = tmp_path / "rotel.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                rotel_binary(),
                "start",
                "--exporter",
                "otlp",
                "--otlp-exporter-endpoint",
                f"http://127.0.0.1:{receiver.grpc_port}",
                "--otlp-grpc-endpoint",
                grpc_in,
                "--otlp-http-endpoint",
                f"127.0.0.1:{free_port()}",
                "--batch-timeout",
                "100ms",
                "--log-file",
                str(tmp_path / "rotel.log"),
                "--pid-file",
                str(tmp_path / "rotel.pid"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},
        )
    try:
        wait_for(lambda: "Starting Rotel" in log.read_text(errors="replace"), 20, "rotel to start")
        exporter = GrpcExporter(endpoint=grpc_in, insecure=True, timeout=5)
        agent = Agent("node-r", devices=2, seed=5)
        sent = []
        for k in range(2):
            frame, data = agent.sample(T0 + k * 10 * S)
            sent.append(frame)
            assert exporter.export(data) is MetricExportResult.SUCCESS
            wait_for(lambda k=k: len(inbox.frames("node-r")) > k, 15, "rotel to forward the export")
        exporter.shutdown()
        agent.close()
        got = inbox.frames("node-r")
        for frame_got, frame_sent in zip(got, sent, strict=True):
            assert_same_frame(frame_got, receiver.schema, frame_sent, agent.schema)
        assert receiver.stats()["requests"][("grpc", "ok")] >= 2
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# -- errors and partial success ----------------------------------------------------------------------
def raw_grpc(port: int, body: bytes) -> tuple[grpc.StatusCode, bytes | str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(EXPORT)
        try:
            return grpc.StatusCode.OK, call(body, timeout=5)
        except grpc.RpcError as err:
            return err.code(), err.details()


def post(port: int, body: bytes, content_type: str = "application/x-protobuf", **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/metrics", data=body, headers={"Content-Type": content_type, **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


GOOD = req(resource("node-1", gauge("hw.power", pt(gpu(), 250.0))))


def test_malformed_bytes_are_invalid_argument_and_the_next_request_works(start_receiver):
    receiver, inbox = start_receiver()
    for garbage in (b"\x0a\xff\xff\xff\xff\x0f", b"\xff" * 20, b"\x0a\x05\x0a\x03\x0a\x01"):
        code, details = raw_grpc(receiver.grpc_port, garbage)
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (garbage, code, details)
        assert "not an ExportMetricsServiceRequest" in str(details)
        status, body = post(receiver.http_port, garbage)
        assert status == 400
        parsed = status_pb2.Status.FromString(body)
        assert parsed.code == code_pb2.INVALID_ARGUMENT and "not an ExportMetricsServiceRequest" in parsed.message
    status, body = post(receiver.http_port, b"{not json", "application/json")
    assert status == 400 and json.loads(body)["code"] == code_pb2.INVALID_ARGUMENT
    code, body = raw_grpc(receiver.grpc_port, GOOD.SerializeToString())
    assert code is grpc.StatusCode.OK
    assert ExportMetricsServiceResponse.FromString(body) == ExportMetricsServiceResponse()
    status, body = post(receiver.http_port, GOOD.SerializeToString())
    assert status == 200 and ExportMetricsServiceResponse.FromString(body) == ExportMetricsServiceResponse()
    assert len(inbox.frames("node-1")) == 2  # the same time twice is a resend, not out of order
    requests = receiver.stats()["requests"]
    assert requests[("grpc", "invalid")] == 3 and requests[("http", "invalid")] == 4
    assert requests[("grpc", "ok")] == 1 and requests[("http", "ok")] == 1


def test_oversized_requests_are_refused_and_counted(start_receiver):
    receiver, inbox = start_receiver(max_request_bytes=4096)
    small = GOOD.SerializeToString()
    big = req(resource("node-1", gauge("hw.power", *[pt(gpu(f"gpu-{i}"), 1.0) for i in range(60)])))
    body = big.SerializeToString()
    assert 4096 < len(body) <= 2 * 4096
    code, details = raw_grpc(receiver.grpc_port, body)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "over the limit" in str(details)
    code, _ = raw_grpc(receiver.grpc_port, b"\x0a" + b"x" * 100_000)  # past gRPC's own hard limit
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert post(receiver.http_port, body)[0] == 413
    bomb = gzip.compress(small + b"\x00" * 50_000)  # small on the wire, large inflated
    assert len(bomb) < 4096
    status, reply = post(receiver.http_port, bomb, **{"Content-Encoding": "gzip"})
    assert status == 413 and status_pb2.Status.FromString(reply).code == code_pb2.RESOURCE_EXHAUSTED
    assert raw_grpc(receiver.grpc_port, small)[0] is grpc.StatusCode.OK
    assert post(receiver.http_port, small)[0] == 200
    requests = receiver.stats()["requests"]
    assert requests[("grpc", "too_large")] == 1  # the one past the hard limit is gRPC's own refusal
    assert requests[("http", "too_large")] == 2
    assert len(inbox.frames()) == 2


def test_bad_points_are_a_partial_success_with_the_count_and_one_line(start_receiver):
    receiver, inbox = start_receiver()
    request, bad = mixed_request()
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
        response = MetricsServiceStub(channel).Export(request, timeout=5)
    partial = response.partial_success
    assert partial.rejected_data_points == bad
    message = partial.error_message
    assert "\n" not in message and message.startswith(f"{bad} of 9 data points rejected: ")
    for words in ("NaN", "has no hw.id", "on a counter", "delta sum", "made.up.metric", "; and 1 more"):
        assert words in message, words  # the first five problems in request order, the rest counted
    (frame,) = inbox.frames()
    values = cells(frame, receiver.schema)
    assert values == {("node-1", "gpu-0", POWER): 300.0, ("node-1", "gpu-0", TEMP): 55.0}
    # The same over HTTP, protobuf and JSON (the replay decoder's reading of the JSON mapping).
    later, _ = mixed_request(T0 + S)
    status, body = post(receiver.http_port, later.SerializeToString())
    assert status == 200
    assert ExportMetricsServiceResponse.FromString(body).partial_success.rejected_data_points == bad
    json_request = req(*later.resource_metrics[:1])  # the JSON decoder refuses a line with a node-less resource
    status, body = post(receiver.http_port, MessageToJson(json_request).encode(), "application/json")
    assert status == 200
    answer = json.loads(body)["partialSuccess"]
    assert int(answer["rejectedDataPoints"]) == bad - 1 and "NaN" in answer["errorMessage"]
    assert receiver.stats()["points"] == {"accepted": 2 + 2 + 2, "rejected": bad * 2 + bad - 1, "ignored": 0}


def test_a_push_on_a_keep_alive_connection_is_answered_where_it_arrives_as_the_handler_answers_it(
    start_receiver, monkeypatch
):
    """An agent's exporter keeps its connection: its pushes are answered on the event loop as they arrive
    (``_http_quick``), and each answer and count is the one the handler gives the same bytes on a
    ``Connection: close`` request (urllib's), which goes the handler's way: a success, bytes that don't parse,
    a partial success; one over the size limit is left to the handler, which refuses it (offered to the lane
    only when its head and body came in one read)."""
    taken: list[bool] = []
    quick = RequestPath._http_quick

    def counted(self, message, body, transport):
        reply = quick(self, message, body, transport)
        taken.append(reply is not None)
        return reply

    monkeypatch.setattr(RequestPath, "_http_quick", counted)
    receiver, inbox = start_receiver(max_request_bytes=4096)
    partial, _ = mixed_request()
    big = req(resource("node-1", gauge("hw.power", *[pt(gpu(f"gpu-{i}"), 1.0) for i in range(60)]))).SerializeToString()
    conn = http.client.HTTPConnection("127.0.0.1", receiver.http_port, timeout=5)
    for body in (GOOD.SerializeToString(), b"\xff" * 20, partial.SerializeToString(), big):
        before = Counter(receiver.stats()["requests"])
        conn.request("POST", "/v1/metrics", body, {"Content-Type": "application/x-protobuf"})
        reply = conn.getresponse()
        kept = (reply.status, reply.read())
        if reply.will_close:
            conn.close()
        between = Counter(receiver.stats()["requests"])
        assert post(receiver.http_port, body) == kept
        assert Counter(receiver.stats()["requests"]) - between == between - before
    assert kept[0] == 413
    assert taken[:3] == [True, True, True] and not any(taken[3:])  # (the big one: declined, or never offered)
    assert receiver.stats()["connections"]["http"]["accepted"] == 1 + 4, "the keep-alive pushes shared one connection"
    assert len(inbox.frames()) == 4


def self_telemetry_points(request: ExportMetricsServiceRequest) -> tuple[int, set[str]]:
    """The points (and names) of an agent's request that are not device input, counted without the decoder:
    everything but hw.*, and the agent's hw.status (its verdict)."""
    n, names = 0, set()
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == cv.AGENT_SCOPE
            for m in sm.metrics:
                if m.name not in cv.SAMPLED_METRICS or m.name == cv.HW_STATUS.name:
                    n += len(getattr(m, m.WhichOneof("data")).data_points)
                    names.add(m.name)
    return n, names


def test_an_agents_own_push_is_ok_and_its_self_telemetry_ignored(start_receiver):
    """`otel-dra run`'s push as it really is (the Agent itself: its sinks, verdicts and sending queue on the
    SDK's gRPC exporter) carries otel_dra.push.* and its verdicts beside hw.*: every request is ok, with no
    partial success, and those points are counted as ignored; the protobuf decoder (fast and plain) and the
    JSON decoder count them alike."""
    from otel_dra.agent import Agent as RealAgent
    from otel_dra.config import AgentConfig
    from otel_dra.sinks.config import EndpointConfig, OtlpPushConfig

    receiver, inbox = start_receiver()
    sent: list[bytes] = []
    decode = receiver._decoder.decode
    receiver._decoder.decode = lambda data, **kw: (sent.append(bytes(data)), decode(data, **kw))[1]  # type: ignore[method-assign]
    push = OtlpPushConfig(endpoint=f"http://127.0.0.1:{receiver.grpc_port}", protocol="grpc", export_interval_s=0.2)
    config = AgentConfig("node-self", source="simulated", devices=2, interval_s=0.2, seed=3)
    agent = RealAgent(replace(config, endpoint=EndpointConfig(port=0), otlp=push))
    running = threading.Thread(target=agent.run, daemon=True)
    running.start()
    try:
        wait_for(lambda: len(sent) >= 4, 20, "four pushes of the agent")
    finally:
        agent.stop()
        running.join(10)
    stats = receiver.stats()
    requests = {outcome: n for (_, outcome), n in stats["requests"].items() if n}
    assert set(requests) == {"ok"}, requests
    assert stats["points"]["rejected"] == 0 and stats["points"]["accepted"] > 0
    assert inbox.frames("node-self")
    parsed = [ExportMetricsServiceRequest.FromString(data) for data in sent]
    counted = [self_telemetry_points(request) for request in parsed]
    names = set().union(*(n for _, n in counted))
    assert set(cv.PUSH_METRICS) | {cv.HW_STATUS.name, cv.DRA_DEVICE_HEALTH.name} <= names, names
    assert stats["points"]["ignored"] == sum(n for n, _ in counted) > 0
    # Both decoders, and the protobuf one's template path, agree on every request.
    fast, plain = OtlpProtoDecoder(Schema()), OtlpProtoDecoder(Schema(), fast=False)
    as_json = OtlpJsonDecoder(Schema())
    for data, request, (ignored, _) in zip(sent, parsed, counted, strict=True):
        results = [fast.decode(data), plain.decode(data), as_json.decode(MessageToJson(request))]
        assert {(r.points, r.rejected, r.ignored, r.message) for r in results} == {(results[0].points, 0, ignored, "")}
        assert all(r.accepted == r.points > 0 for r in results)
    assert fast.sections_fast > 0, "the template path read none of the agent's requests"
    assert fast.points_ignored == plain.points_ignored == as_json.points_ignored == stats["points"]["ignored"]


def test_json_and_gzip_bodies_over_http(start_receiver):
    receiver, inbox = start_receiver()
    agent = Agent("node-j", devices=2, seed=7)
    frame, data = agent.sample(T0)
    agent.close()
    text = MessageToJson(encode_metrics(data)).encode()
    status, body = post(receiver.http_port, gzip.compress(text), "application/json", **{"Content-Encoding": "gzip"})
    assert status == 200 and json.loads(body) == {}
    (got,) = inbox.frames("node-j")
    assert_same_frame(got, receiver.schema, frame, agent.schema)
    assert post(receiver.http_port, b"x", "text/plain")[0] == 415
    assert post(receiver.http_port, text, "application/json", **{"Content-Encoding": "br"})[0] == 415
    assert post(receiver.http_port, b"\x1f\x8b not gzip", **{"Content-Encoding": "gzip"})[0] == 400


def test_receiver_metrics_through_the_meter(start_receiver):
    reader = InMemoryMetricReader()
    mp = provider.build_meter_provider("fleet", [reader], 5000)
    receiver, _ = start_receiver(meter=mp.get_meter("otel_dra", __version__))
    request, bad = mixed_request()
    raw_grpc(receiver.grpc_port, request.SerializeToString())
    raw_grpc(receiver.grpc_port, b"\xff")
    post(receiver.http_port, GOOD.SerializeToString())
    data = reader.get_metrics_data()
    mp.shutdown()
    seen = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                assert m.name == CONNECTIONS.name or m.data.is_monotonic, m.name
                for p in m.data.data_points:
                    seen[(m.name, m.unit, *sorted(p.attributes.items()))] = p.value
    requests = (REQUESTS.name, REQUESTS.unit)
    assert seen[(*requests, ("outcome", "partial"), ("transport", "grpc"))] == 1
    assert seen[(*requests, ("outcome", "invalid"), ("transport", "grpc"))] == 1
    assert seen[(*requests, ("outcome", "ok"), ("transport", "http"))] == 1
    assert seen[(*requests, ("outcome", "too_large"), ("transport", "http"))] == 0
    assert seen[(POINTS.name, POINTS.unit, ("outcome", "rejected"))] == bad
    assert seen[(POINTS.name, POINTS.unit, ("outcome", "accepted"))] == 3
    assert seen[(*requests, ("outcome", "overloaded"), ("transport", "grpc"))] == 0
    assert {k[2] for k in seen if k[0] == REFUSED.name} == {("reason", r) for r in LIMIT_REASONS}
    assert seen[(CONNECTIONS.name, CONNECTIONS.unit, ("transport", "http"))] >= 0


def test_a_failing_consumer_is_internal_and_the_receiver_keeps_serving(start_receiver):
    calls = []

    def broken(frames):
        calls.append(frames)
        if len(calls) == 1:
            raise RuntimeError("consumer bug")

    receiver, _ = start_receiver(on_frames=broken)
    assert raw_grpc(receiver.grpc_port, GOOD.SerializeToString())[0] is grpc.StatusCode.INTERNAL
    later = req(resource("node-1", gauge("hw.power", pt(gpu(), 250.0, T0 + S))))
    assert post(receiver.http_port, later.SerializeToString())[0] == 200
    assert receiver.stats()["requests"][("grpc", "error")] == 1


def test_endpoints_and_ports():
    receiver = OtlpReceiver(Schema(), lambda frames: None, grpc_endpoint=None, http_endpoint="127.0.0.1:0")
    receiver.start()
    try:
        assert receiver.grpc_port is None and receiver.http_port
        busy = OtlpReceiver(Schema(), lambda frames: None, None, f"127.0.0.1:{receiver.http_port}")
        with pytest.raises(OSError, match="cannot listen for OTLP/HTTP"):
            busy.start()
    finally:
        receiver.shutdown()
    assert receiver.http_port is None
    for bad in ("4317", "host:", "host:99999"):
        with pytest.raises(ValueError, match="not host:port"):
            OtlpReceiver(Schema(), lambda frames: None, grpc_endpoint=bad)
    with pytest.raises(ValueError, match="at least one"):
        OtlpReceiver(Schema(), lambda frames: None, None, None)


# -- the decoder: semantics ----------------------------------------------------------------------
def decode(*requests: ExportMetricsServiceRequest | bytes, fast: bool = True) -> tuple[OtlpProtoDecoder, list]:
    decoder = OtlpProtoDecoder(Schema(), fast=fast)
    return decoder, [decoder.decode(r) for r in requests]


def test_same_frames_as_the_replay_decoder_reads_from_the_json_mapping():
    agent = Agent("node-1", devices=3, seed=3)
    requests = [encode_metrics(agent.sample(T0 + k * 10 * S)[1]) for k in range(3)]
    agent.close()
    proto, results = decode(*requests)
    replay = OtlpJsonDecoder(Schema())
    for request, result in zip(requests, results, strict=True):
        frames, errors = replay.decode_line(MessageToJson(request), 1)
        assert not errors and result.rejected == 0
        assert [f.time_unix_nano for f in result.frames] == [f.time_unix_nano for f in frames]
        for a, b in zip(result.frames, frames, strict=True):
            assert_same_frame(a, proto.schema, b, replay.schema)
    assert proto.sections_fast == 2 and proto.sections_plain == 1


def test_a_collectors_batch_reads_its_new_sections_alone_and_refuses_a_malformed_one_whole():
    """A collector's batch is many nodes' sections: one that no template knows is parsed alone (the rest stay on
    the fast path, where the whole batch used to be parsed for it), with the same frames as a decoder that reads
    every section plainly; a malformed section still refuses the whole request."""
    agents = [Agent(f"node-{i}", devices=2, seed=i) for i in range(3)]
    rounds = [[encode_metrics(a.sample(T0 + k * 10 * S)[1]) for a in agents] for k in range(2)]
    for a in agents:
        a.close()
    batch = [
        ExportMetricsServiceRequest(resource_metrics=[rm for r in rs for rm in r.resource_metrics]) for rs in rounds
    ]
    # the second batch: node-0 and node-1 as before (fast), node-2 first seen (a new section's template)
    warm = ExportMetricsServiceRequest(resource_metrics=[*batch[0].resource_metrics[:2]])
    fast = OtlpProtoDecoder(Schema())
    parsed: list[str] = []
    whole = fast._parse
    fast._parse = lambda data, *rest: parsed.append(rest[0].__name__ if rest else "request") or whole(data, *rest)  # type: ignore[method-assign]
    got = [fast.decode(warm), fast.decode(batch[1])]
    assert parsed == ["ResourceMetrics", "ResourceMetrics", "ResourceMetrics"]  # never the whole batch
    plain, want = decode(warm, batch[1], fast=False)
    assert fast.sections_fast == 2 and fast.sections_plain == 3
    assert got[1].rejected == want[1].rejected == 0 and len(got[1].frames) == len(want[1].frames) == 3
    for a, b in zip(got[1].frames, want[1].frames, strict=True):
        assert_same_frame(a, fast.schema, b, plain.schema)
    data = bytearray(batch[1].SerializeToString())
    sections = proto_wire.sections(bytes(data))
    assert sections is not None and len(sections) == 3
    start, end = sections[2]
    data[start:end] = b"\xff" * (end - start)  # the third node's section: not a ResourceMetrics
    with pytest.raises(MalformedRequest):
        fast.decode(bytes(data))


def test_a_changed_attribute_of_the_same_length_is_seen():
    """The template compares every byte but the values: a firmware update that keeps the string's
    length changes nothing else in the request, and must still reach the device table."""
    before = req(resource("node-1", gauge("hw.power", pt(gpu(**{"hw.firmware_version": "96.00.99"}), 1.0))))
    after = req(resource("node-1", gauge("hw.power", pt(gpu(**{"hw.firmware_version": "96.00.30"}), 2.0, T0 + S))))
    decoder, (r1, r2) = decode(before, after)
    assert r1.frames[0].devices.attrs[0]["hw.firmware_version"] == "96.00.99"
    assert r2.frames[0].devices.attrs[0]["hw.firmware_version"] == "96.00.30"
    assert decoder.sections_fast == 0


def test_an_agents_own_hw_status_is_its_verdict_not_an_input():
    """As in replay: hw.status from scope otel_dra is an agent's verdict, neither read nor counted;
    another producer's hw.status is the device's own report. Same on the fast path."""
    status = counter("hw.status", pt(gpu(**{"hw.state": "failed"}), 1, as_int=True), monotonic=False)
    for scope, kept in ((cv.AGENT_SCOPE, False), ("gpu-exporter", True)):
        first = req(resource("node-1", status, gauge("hw.power", pt(gpu(), 300.0)), scope=scope))
        later = ExportMetricsServiceRequest()
        later.CopyFrom(first)
        for m in later.resource_metrics[0].scope_metrics[0].metrics:
            for p in getattr(m, m.WhichOneof("data")).data_points:
                p.time_unix_nano = T0 + S
        decoder, results = decode(first, later)
        assert decoder.sections_fast == 1
        for result in results:
            assert (result.points, result.rejected) == ((2, 0) if kept else (1, 0))
            got = {key[2].metric for key in cells(result.frames[0], decoder.schema)}
            assert got == ({"hw.status", "hw.power"} if kept else {"hw.power"})


def test_backwards_time_is_rejected_per_node_and_int_values_read():
    newer = req(resource("node-1", gauge("hw.power", pt(gpu(), 7, T0 + S, as_int=True))))
    older = req(resource("node-1", gauge("hw.power", pt(gpu(), 8, T0, as_int=True))))
    other = req(resource("node-2", gauge("hw.power", pt(gpu(), 9, T0, as_int=True))))
    _, (r1, r2, r3) = decode(newer, older, other)
    assert r1.frames[0].values[0, 0] == 7.0 and r2.frames == [] and r2.rejected == 1
    assert "older than" in r2.message and r3.frames[0].values[0, 0] == 9.0


def test_what_a_gone_node_leaves_in_the_decoders_is_forgotten_after_it_is_idle():
    """Node names churn (autoscaled node pools): a node's template goes after 15 idle minutes and its
    time floor after an idle hour, by the decoder's clock, so the decoder does not grow with every
    name it ever saw; a node that keeps pushing keeps both."""
    clock = [T0]
    decoder = OtlpProtoDecoder(Schema(), clock=lambda: clock[0])

    def send(node: str, t: int) -> DecodeResult:
        return decoder.decode(req(resource(node, gauge("hw.power", pt(gpu(), 1.0, t), pt(gpu("gpu-1"), 2.0, t)))))

    send("node-a", T0)
    send("node-b", T0)
    both = decoder.template_bytes
    assert both > 0
    for k in range(1, 121):  # 20 minutes: node-b pushes every 10 s, node-a is gone
        clock[0] = T0 + k * 10 * S
        assert send("node-b", clock[0]).rejected == 0
    assert decoder.sections_fast >= 119
    assert 0 < decoder.template_bytes < both, "node-a's template outlived its node"
    # Within the hour node-a's floor still holds (a point older than its newest is refused)...
    assert send("node-a", T0 - S).rejected == 2
    # ...after an idle hour it is forgotten: the node's next points are taken, whatever their time.
    clock[0] += 2 * 3600 * S
    send("node-b", clock[0])
    assert send("node-a", T0 - S).rejected == 0
    assert send("node-b", clock[0] - 20 * S).rejected == 2, "node-b kept pushing: its floor stays"
    # The receiver's JSON decoder forgets idle nodes too; replay's (no clock bound) never does.
    for live, expected in ((True, 0), (False, 1)):
        clock[0] = T0
        json_decoder = OtlpJsonDecoder(Schema(), max_future_ns=600 * S if live else None, clock=lambda: clock[0])
        line = lambda t: MessageToJson(req(resource("node-a", gauge("hw.power", pt(gpu(), 1.0, t)))))  # noqa: E731
        json_decoder.decode_line(line(T0), 1)
        clock[0] += 2 * 3600 * S
        json_decoder.decode_line(line(T0 + 10 * S).replace("node-a", "node-z"), 2)  # another node: the sweep
        json_decoder.decode_line(line(T0 - S), 3)
        assert json_decoder.points_skipped == expected, live


def test_one_frame_per_node_and_time_sensors_fold_into_their_device():
    request = req(
        resource(
            "node-1",
            gauge("hw.power", pt(gpu("gpu-0"), 1.0, T0 + S), pt(gpu("gpu-0"), 2.0, T0)),
            gauge("hw.temperature", pt(temp_sensor("gpu-0"), 40.0, T0)),
        ),
        resource("node-2", gauge("hw.power", pt(gpu("gpu-0"), 3.0, T0))),
    )
    decoder, (result,) = decode(request)
    keys = [(f.devices.node, f.time_unix_nano) for f in result.frames]
    assert keys == [("node-1", T0), ("node-2", T0), ("node-1", T0 + S)]
    first = cells(result.frames[0], decoder.schema)
    assert first == {("node-1", "gpu-0", POWER): 2.0, ("node-1", "gpu-0", TEMP): 40.0}


# -- the decoder: fast and plain paths agree ---------------------------------------------------------
def summary(result: DecodeResult | str, schema: Schema) -> object:
    if isinstance(result, str):
        return result
    frames = [
        (f.time_unix_nano, f.devices.node, f.devices.ids, f.devices.attrs, cells(f, schema)) for f in result.frames
    ]
    return (result.points, result.rejected, result.problems, result.problem_count, result.message, frames)


def run_both(requests: list[bytes]) -> OtlpProtoDecoder:
    """Both paths over the same requests, in order (so templates are built, then hit); the fast decoder."""
    fast, plain = OtlpProtoDecoder(Schema()), OtlpProtoDecoder(Schema(), fast=False)
    for data in requests:
        outcomes = []
        for decoder in (fast, plain):
            try:
                outcomes.append(summary(decoder.decode(data), decoder.schema))
            except MalformedRequest as exc:
                assert "\n" not in str(exc)
                outcomes.append("malformed")
        assert outcomes[0] == outcomes[1]
    return fast


NAMES = ["hw.power", "hw.errors", "hw.temperature", "hw.energy", "hw.status", "not.a.metric"]
DEVICES = ["gpu-0", "gpu-1"]
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.0, -1.0, 1.0, math.nan, math.inf]),
    st.integers(-(2**63), 2**63 - 1),
    st.none(),
)
TIMES = st.sampled_from([0, T0, T0 + S, T0 - S, 2**64 - 1])


@st.composite
def attribute_sets(draw) -> dict[str, str]:
    device = draw(st.sampled_from(DEVICES))
    choice = draw(st.sampled_from(["device", "sensor", "no-id", "sensor-no-type", "orphan-sensor", "extra"]))
    if choice == "device":
        return gpu(device, **{"hw.firmware_version": draw(st.sampled_from(["1.0", "2.0"]))})
    if choice == "sensor":
        return temp_sensor(device)
    if choice == "no-id":
        return {"hw.type": "gpu"}
    if choice == "sensor-no-type":
        return {"hw.id": f"{device}/temp", "hw.parent": device}
    if choice == "orphan-sensor":
        return {"hw.id": f"{device}/fan", "hw.type": "fan"}
    return gpu(device, **{"error.type": draw(st.sampled_from(["corrected", "uncorrected"]))})


@st.composite
def points(draw) -> NumberDataPoint:
    value = draw(VALUES)
    return pt(draw(attribute_sets()), value, draw(TIMES), as_int=isinstance(value, int))


@st.composite
def metrics(draw) -> Metric:
    name = draw(st.sampled_from(NAMES))
    pts = draw(st.lists(points(), max_size=4))
    kind = draw(st.sampled_from(["gauge", "sum", "delta", "updown", "histogram"]))
    if kind == "gauge":
        return gauge(name, *pts)
    if kind == "histogram":
        hist = Histogram(data_points=[HistogramDataPoint(time_unix_nano=T0, count=1, sum=2.0)] * len(pts))
        return Metric(name=name, histogram=hist)
    return counter(name, *pts, temporality=DELTA if kind == "delta" else CUMULATIVE, monotonic=kind != "updown")


@st.composite
def requests(draw) -> ExportMetricsServiceRequest:
    resources = draw(
        st.lists(
            st.builds(
                lambda node, ms, scope: resource(node, *ms, scope=scope),
                st.sampled_from(["node-1", "node-2", None]),
                st.lists(metrics(), max_size=4),
                st.sampled_from([cv.AGENT_SCOPE, "gpu-exporter"]),
            ),
            min_size=1,
            max_size=3,
        )
    )
    return req(*resources)


def with_new_values(request: ExportMetricsServiceRequest, draw) -> bytes:
    """The same request with other times and values in place: what an agent's next export is."""
    copy = ExportMetricsServiceRequest()
    copy.CopyFrom(request)
    for rm in copy.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.WhichOneof("data") in ("gauge", "sum"):
                    for p in getattr(m, m.WhichOneof("data")).data_points:
                        if p.time_unix_nano:
                            p.time_unix_nano = draw(st.sampled_from([T0, T0 + S, T0 + 2 * S, T0 - S, 2**64 - 1]))
                        kind = p.WhichOneof("value")
                        if kind == "as_double":
                            p.as_double = draw(st.floats(width=64))
                        elif kind == "as_int":
                            p.as_int = draw(st.integers(-(2**63), 2**63 - 1))
    return copy.SerializeToString()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fast_and_plain_paths_agree(data):
    base = data.draw(requests())
    sequence = [base.SerializeToString()] + [with_new_values(base, data.draw) for _ in range(3)]
    fast = run_both(sequence)
    assert fast.sections_fast > 0  # the later requests (same shape, new values) were read from templates


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_garbage_mutations_never_raise_and_paths_agree(data):
    base = data.draw(requests()).SerializeToString()
    sequence = [base]
    for _ in range(3):
        mutated = bytearray(base)
        for _ in range(data.draw(st.integers(1, 4))):
            op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
            at = data.draw(st.integers(0, max(0, len(mutated) - 1)))
            if op == "flip" and mutated:
                mutated[at] = data.draw(st.integers(0, 255))
            elif op == "cut":
                del mutated[at : at + data.draw(st.integers(1, 8))]
            else:
                mutated[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        sequence += [bytes(mutated), base]
    run_both(sequence)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise(blob):
    run_both([blob, blob])


def test_bounded_templates_and_sections_that_never_repeat_fall_back_to_the_plain_path():
    """With no room for templates, or a section whose bytes change in more than values (a histogram's
    sum), every request is read the plain way, with the same results; a key that keeps missing stops
    being rebuilt."""
    agent = Agent("node-1", devices=2, seed=1)
    requests = [encode_metrics(agent.sample(T0 + k * 10 * S)[1]).SerializeToString() for k in range(3)]
    agent.close()
    tiny = OtlpProtoDecoder(Schema(), max_template_bytes=1)
    plain = OtlpProtoDecoder(Schema(), fast=False)
    for data in requests:
        assert summary(tiny.decode(data), tiny.schema) == summary(plain.decode(data), plain.schema)
    assert tiny.sections_fast == 0 and tiny.template_bytes == 0

    def with_histogram(k: int) -> ExportMetricsServiceRequest:
        hist = Metric(name="http.duration", histogram=Histogram(data_points=[HistogramDataPoint(sum=float(k))]))
        return req(resource("node-1", gauge("hw.power", pt(gpu(), 1.0, T0 + k * S)), hist))

    decoder = OtlpProtoDecoder(Schema())
    builds = []
    build = decoder._build
    decoder._build = lambda *args: builds.append(1) or build(*args)  # type: ignore[method-assign]
    for k in range(10):
        result = decoder.decode(with_histogram(k))
        assert (result.points, result.rejected, len(result.frames)) == (2, 1, 1)
    assert decoder.sections_fast == 0 and len(decoder._templates) == 1
    assert len(builds) == 3  # the first sight and two retries; then the plain path alone


def test_message_input_and_bytes_input_agree():
    request, _ = mixed_request()
    _, (a,) = decode(request)
    _, (b,) = decode(request.SerializeToString())
    assert a.points == b.points == 9 and a.rejected == b.rejected == 7 and a.message == b.message
