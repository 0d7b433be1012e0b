"""One corpus of bad inputs (issue #7) through every door: the replay decoder (a JSON line), the
protobuf decoder (the same request built with ``ParseDict``, or the raw bytes where there is no
request) and the real OTLP/HTTP receiver (both content types); then a corpus of policy files.

For each case: nothing but the documented exceptions escapes (none from the JSON decoder,
``MalformedRequest`` from the protobuf one, HTTP 200/400 from the receiver); the outcome is what
the case says (accepted, a point skipped and counted, or the whole request refused) with every
message on one line; a valid point beside the bad one in the same request arrives in a frame; and
for the big cases the peak memory of the decode stays under a stated multiple of the request's
size (``tracemalloc``'s peak; for the 100,000-device request, which tracemalloc would slow from
seconds to half a minute, the resident high-water mark of a fresh process decoding it). A
hypothesis property generalises the point cases: any point, any of its fields replaced by anything
or removed, beside a valid one, costs the valid one nothing.

Timestamps follow the decoders' documented rule (module docstrings of ``otlp_json`` and
``otlp_proto``): per node, a point older than the newest time already decoded is rejected. In
replay nothing bounds a time from above (only 0 and >= 2**64 are out of range), so a point a year
in the future is accepted (and from then on it is the node's newest: see
``test_a_point_from_the_future_makes_the_present_old``); the live receiver rejects points more
than ``--max-future`` (10 minutes) ahead of its clock, so there the same point is a counted skip.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import ParseError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from otel_dra import policy
from otel_dra.decode import OtlpJsonDecoder
from otel_dra.decode.otlp_proto import MalformedRequest, OtlpProtoDecoder
from otel_dra.frame import Column, Frame, Schema
from otel_dra.receivers.factory import new_receiver as OtlpReceiver
from tests.support.otlp_pb import pb

S = 10**9
T0 = 1_795_000_000 * S
YEAR = 365 * 86400 * S
NODE = "node-1"
GOOD_ID = "gpu-good"
GOOD_VALUE = 123.25
POWER = Column("hw.power")
MB = 1 << 20
N_DEVICES = 100_000


# -- building requests (the protobuf JSON mapping) ---------------------------------------------
def kv(attrs: dict[str, str]) -> list[dict]:
    return [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]


def pt(attrs: dict[str, str] | list, value: Any = 1.0, t: Any = T0, field: str = "asDouble") -> dict:
    return {"attributes": kv(attrs) if isinstance(attrs, dict) else attrs, "timeUnixNano": str(t), field: value}


def gpu(device: str, **extra: str) -> dict[str, str]:
    return {"hw.id": device, "hw.type": "gpu", **extra}


def good(t: int = T0) -> dict:
    return pt(gpu(GOOD_ID), GOOD_VALUE, t)


def gauge(name: str, *points: dict) -> dict:
    return {"name": name, "unit": "1", "gauge": {"dataPoints": list(points)}}


def counter(name: str, *points: dict, temporality: int = 2) -> dict:
    return {
        "name": name,
        "unit": "J",
        "sum": {"aggregationTemporality": temporality, "isMonotonic": True, "dataPoints": list(points)},
    }


def resource(node: str | None, *metrics: dict) -> dict:
    attrs = {"service.name": "x"} | ({"k8s.node.name": node} if node is not None else {})
    return {"resource": {"attributes": kv(attrs)}, "scopeMetrics": [{"metrics": list(metrics)}]}


def request(*metrics: dict, node: str = NODE) -> dict:
    return {"resourceMetrics": [resource(node, *metrics)]}


def beside(*bad_metrics: dict, t: int = T0) -> dict:
    """The bad metrics, then a valid hw.power point of GOOD_ID in the same request."""
    return request(*bad_metrics, gauge("hw.power", good(t)))


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def valid_line() -> bytes:
    return dumps(beside(gauge("hw.power", pt(gpu("gpu-0"), 1.0))))


# -- the corpus ----------------------------------------------------------------------------------
# Outcomes: "accept" (nothing rejected), "point" (points skipped, counted, the rest kept),
# "request" (JSON: line skipped / HTTP 400; protobuf: MalformedRequest), "any" (garbage bytes given
# to the protobuf decoder: MalformedRequest, or whatever a lucky parse makes of them, counted),
# "note" (JSON only: an error reported, nothing to count as skipped).
@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], dict | bytes]  # a request in the JSON mapping, or raw bytes
    json: str  # outcome for the JSON decoder
    proto: str | None  # outcome for the protobuf decoder; None: ParseDict can't build it (JSON-only)
    good_json: bool = True  # the valid point beside it arrives through the JSON decoder
    good_proto: bool = True
    prior: dict | None = None  # decoded first, on the same decoder
    peak_factor: float | None = None  # tracemalloc peak <= factor * request size (both encodings)
    value: float = GOOD_VALUE  # the GOOD_ID value expected in a frame
    live: str | None = None  # outcome at the live receiver (both encodings) where it differs from replay's


BIG = "x" * MB
RAW_GARBAGE = random.Random(7).randbytes(4096)

CASES: list[Case] = [
    # -- not a request at all
    Case("truncated_json", lambda: valid_line()[: len(valid_line()) // 2], "request", "any", False, False),
    Case("invalid_json", lambda: b'{"resourceMetrics": [}', "request", "any", False, False),
    Case("binary_garbage", lambda: RAW_GARBAGE, "request", "any", False, False),
    Case("not_utf8", lambda: b'{"resourceMetrics": ["\xff\xfe"]}', "request", "any", False, False),
    Case("deeply_nested_json", lambda: b"[" * 100_000 + b"]" * 100_000, "request", "any", False, False),
    Case("empty", lambda: b"", "request", "accept", False, False),
    Case("json_array", lambda: b"[1, 2, 3]", "request", "any", False, False),
    Case("resource_metrics_not_a_list", lambda: {"resourceMetrics": {"a": 1}}, "request", None, False, False),
    # -- wrong types (the JSON mapping can't carry them into protobuf: JSON only)
    Case("value_is_object", lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), {"x": 1}))), "point", None),
    Case("value_is_word", lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), "abc"))), "point", None),
    Case("time_is_float", lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), 1.0, 1.5))), "point", None),
    Case("time_past_2_64", lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), 1.0, 10**22))), "point", None),
    Case("attributes_not_a_list", lambda: beside(gauge("hw.power", pt("x", 1.0))), "point", None),
    Case(
        "attribute_two_values",
        lambda: beside(gauge("hw.power", pt([{"key": "hw.id", "value": {"stringValue": "a", "intValue": "1"}}]))),
        "point",
        None,
    ),
    # A metric that is not an object has no points to count: one error ("note"), nothing else lost.
    Case("metric_not_object", lambda: beside("hw.power"), "note", None),  # type: ignore[arg-type]
    # -- missing identity
    Case("no_hw_id", lambda: beside(gauge("hw.power", pt({"hw.type": "gpu"}, 1.0))), "point", "point"),
    Case(
        "sensor_without_parent",
        lambda: beside(gauge("hw.temperature", pt({"hw.id": "t0", "hw.type": "temperature"}, 40.0))),
        "point",
        "point",
    ),
    # JSON: a resource without k8s.node.name skips the whole line (documented in otlp_json._walk and
    # OtlpReceiver.export_json); protobuf: only that resource's points are rejected.
    Case(
        "no_node_name",
        lambda: {
            "resourceMetrics": [
                resource(None, gauge("hw.power", pt(gpu("gpu-0")))),
                resource(NODE, gauge("hw.power", good())),
            ]
        },
        "request",
        "point",
        good_json=False,
    ),
    # -- values
    Case("nan", lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), "NaN"))), "point", "point"),
    Case("infinity", lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), "Infinity"))), "point", "point"),
    Case("minus_infinity", lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), "-Infinity"))), "point", "point"),
    Case(
        "no_value",
        lambda: beside(gauge("hw.power", {"attributes": kv(gpu("gpu-0")), "timeUnixNano": str(T0)})),
        "point",
        "point",
    ),
    Case("negative_counter", lambda: beside(counter("hw.energy", pt(gpu("gpu-0"), -5.0))), "point", "point"),
    Case("delta_counter", lambda: beside(counter("hw.energy", pt(gpu("gpu-0"), 5.0), temporality=1)), "point", "point"),
    # A decrease of a cumulative counter is a reset, which OTLP allows: accepted (only < 0 is refused).
    Case(
        "decreasing_counter",
        lambda: beside(counter("hw.energy", pt(gpu("gpu-0"), 10.0, T0 + S)), t=T0 + S),
        "accept",
        "accept",
        prior=request(counter("hw.energy", pt(gpu("gpu-0"), 1000.0))),
    ),
    # -- time
    Case("time_zero", lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), 1.0, 0))), "point", "point"),
    Case(
        "no_time",
        lambda: beside(gauge("hw.power", {"attributes": kv(gpu("gpu-0")), "asDouble": 1.0})),
        "point",
        "point",
    ),
    Case(
        "time_a_year_ahead",
        lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), 1.0, T0 + YEAR))),
        "accept",
        "accept",
        live="point",
    ),
    Case(
        "time_before_node_newest",
        lambda: beside(gauge("hw.power", pt(gpu("gpu-0"), 1.0, T0)), t=T0 + 20 * S),
        "point",
        "point",
        prior=request(gauge("hw.power", pt(gpu("gpu-0"), 1.0, T0 + 10 * S))),
    ),
    # -- duplicates: accepted, the last one wins
    Case("duplicate_points", lambda: request(gauge("hw.power", pt(gpu(GOOD_ID), 1.0), good())), "accept", "accept"),
    # -- unknown metrics and kinds
    Case("unknown_metric", lambda: beside(gauge("vendor.bogus", pt(gpu("gpu-0")))), "point", "point"),
    Case(
        "newline_in_names",
        lambda: beside(
            gauge("bogus\nmetric", pt(gpu("gpu-0"))),
            gauge("hw.temperature", pt({"hw.id": "t\n0", "hw.type": "temperature"}, 40.0)),
        ),
        "point",
        "point",
    ),
    Case(
        "histogram_of_known_metric",
        lambda: beside(
            {
                "name": "hw.power",
                "histogram": {"aggregationTemporality": 2, "dataPoints": [{"timeUnixNano": str(T0), "count": "1"}]},
            }
        ),
        "point",
        "point",
    ),
    # -- big
    Case(
        "attribute_1mb",
        lambda: beside(gauge("hw.power", pt(gpu("gpu-0", **{"hw.model": BIG}), 1.0))),
        "accept",
        "accept",
        peak_factor=8,
    ),
    Case(
        "attribute_1mb_in_error",
        lambda: beside(gauge("hw.temperature", pt({"hw.id": BIG, "hw.type": "temperature"}, 40.0))),
        "point",
        "point",
        peak_factor=8,
    ),
    # The 1 MB node name is shared by 1,000 points: it must not be copied per point (that is 1 GB). It is
    # no Kubernetes node name (over 253 characters): its points are refused (issue #14), in one line.
    Case(
        "node_name_1mb_1000_points",
        lambda: {
            "resourceMetrics": [
                resource(BIG, gauge("hw.power", *(pt(gpu(f"gpu-{i}"), 1.0) for i in range(1000)))),
                resource(NODE, gauge("hw.power", good())),
            ]
        },
        "point",
        "point",
        peak_factor=8,
    ),
    # Past 256 devices on one node the new ones are refused (issue #14); the valid point comes first, so
    # its device is one of those kept.
    Case(
        "devices_100k",
        lambda: request(gauge("hw.power", good(), *(pt(gpu(f"gpu-{i}"), float(i)) for i in range(N_DEVICES)))),
        "point",
        "point",
        peak_factor=None,
    ),
]
# Bounds for the 100,000-device request, as resident memory a fresh process adds while decoding it
# (measured: JSON decoder 13x its line, protobuf decoder 31x its wire size, about 1.9 kB per device: one
# Python entry per distinct series; tracemalloc counts 12x and 25x); the bound leaves ~30% headroom.
PEAK_FACTOR_100K = {"json": 18, "proto": 42}


def good_values(frames: list[Frame], schema: Schema) -> list[float]:
    col = schema.index(POWER)
    return [float(f.values[f.devices.ids.index(GOOD_ID), col]) for f in frames if GOOD_ID in f.devices.ids]


def one_line(text: str) -> None:
    assert "\n" not in text and "\r" not in text, text[:200]
    assert len(text) < 2000, f"message of {len(text):,} characters: {text[:200]}"


def traced(fn: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


#: Run by a fresh interpreter: decode the file with the named decoder, print the resident memory added.
_PEAK_CHILD = """
import gc, re, sys
from pathlib import Path
from otel_dra.decode.otlp_json import OtlpJsonDecoder
from otel_dra.decode.otlp_proto import OtlpProtoDecoder
from otel_dra.frame import Schema

def kb(key):
    return int(re.search(key + r":\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1))

body = Path(sys.argv[2]).read_bytes()
gc.collect()
try:
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again from here
except OSError:
    pass  # not allowed: the mark keeps start-up's peak, about the RSS now (reading the body only grew it)
before = kb("VmRSS")
if sys.argv[1] == "json":
    OtlpJsonDecoder(Schema()).decode_line(body, 1)
else:
    OtlpProtoDecoder(Schema()).decode(body)
print((kb("VmHWM") - before) * 1024)
"""


def peak_in_fresh_process(decoder: str, body: bytes, tmp_path: Path) -> int:
    """Resident bytes a new process adds at its peak while ``decoder`` (json, proto) decodes ``body``."""
    path = tmp_path / f"body.{decoder}"
    path.write_bytes(body)
    child = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, decoder, str(path)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr[-2000:]
    return int(child.stdout.strip())


def peak_bound(case: Case, decoder: str, size: int) -> int | None:
    factor = PEAK_FACTOR_100K[decoder] if case.name == "devices_100k" else case.peak_factor
    return None if factor is None else int(factor * size)


def measured(case: Case, decoder: str, body: bytes, decode: Callable[[], Any], tmp_path: Path) -> tuple[Any, int]:
    """``decode()``'s result and its peak memory: tracemalloc's, or a fresh process's for the big request."""
    if case.name != "devices_100k":
        return traced(decode)
    return decode(), peak_in_fresh_process(decoder, body, tmp_path)


def case_node(case: Case) -> str:
    """Each case's requests name their own node: the live receiver keeps every node's newest time. (A
    Kubernetes node name: lowercase, no underscores; the decoders refuse any other.)"""
    return f"node-{case.name.replace('_', '-')}"


def prior_of(case: Case) -> dict | None:
    """The case's earlier request (the same node as the case's own), or None."""
    return None if case.prior is None else renode(json.loads(dumps(case.prior)), case_node(case))


_BUILT: dict[str, tuple[bytes, bytes | None]] = {}


def built(case: Case) -> tuple[bytes, bytes | None]:
    """(JSON body, protobuf body or None) on the case's own node, built once for every test."""
    if case.name not in _BUILT:
        doc = case.build()
        if isinstance(doc, bytes):
            _BUILT[case.name] = (doc, doc)
        else:
            doc = renode(doc, case_node(case))
            _BUILT[case.name] = (dumps(doc), pb(doc) if case.proto is not None else None)
    return _BUILT[case.name]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_json_decoder(case: Case, tmp_path: Path) -> None:
    body, _ = built(case)
    decoder = OtlpJsonDecoder(Schema())
    prior = prior_of(case)
    if prior is not None:
        decoder.decode_line(dumps(prior), 1)
    before = (decoder.lines_skipped, decoder.points_skipped)
    (frames, errors), peak = measured(case, "json", body, lambda: decoder.decode_line(body, 2), tmp_path)
    for e in errors:
        one_line(str(e))
    skipped = (decoder.lines_skipped - before[0], decoder.points_skipped - before[1])
    if case.json == "request":
        assert skipped[0] == 1 and len(errors) == 1 and not frames
    elif case.json == "point":
        assert skipped[0] == 0 and skipped[1] >= 1 and errors
    elif case.json == "note":
        assert skipped == (0, 0) and errors
    else:
        assert skipped == (0, 0) and not errors, errors
    assert good_values(frames, decoder.schema) == ([case.value] if case.good_json else [])
    bound = peak_bound(case, "json", len(body))
    if bound is not None:
        assert peak <= bound, f"peak {peak:,} B over {bound:,} B for a {len(body):,} B line"


@pytest.mark.parametrize("case", [c for c in CASES if c.proto is not None], ids=lambda c: c.name)
def test_proto_decoder(case: Case, tmp_path: Path) -> None:
    _, body = built(case)
    assert body is not None
    decoder = OtlpProtoDecoder(Schema())
    prior = prior_of(case)
    if prior is not None:
        decoder.decode(pb(prior))
    try:
        result, peak = measured(case, "proto", body, lambda: decoder.decode(body), tmp_path)
    except MalformedRequest as exc:
        one_line(str(exc))
        assert case.proto in ("request", "any"), str(exc)
        return
    one_line(result.message)
    for p in result.problems:
        one_line(p)
    assert case.proto != "request"
    if case.proto == "point":
        assert result.rejected >= 1 and result.message
    elif case.proto == "accept":
        assert result.rejected == 0 and not result.message, result.message
    if case.proto != "any":
        assert good_values(result.frames, decoder.schema) == ([case.value] if case.good_proto else [])
    bound = peak_bound(case, "proto", len(body))
    if bound is not None:
        assert peak <= bound, f"peak {peak:,} B over {bound:,} B for a {len(body):,} B request"


# -- a property: one bad point never costs its neighbours -------------------------------------------
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-0", "0x10", " 1 "]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
ANY_TIME = st.one_of(
    ANY_VALUE,
    st.integers(-5, 2**65).map(str),
    st.sampled_from([str(T0 - YEAR), str(T0 + YEAR), "18446744073709551616", "00001"]),
)
ANY_ATTRIBUTES = st.one_of(
    ANY_VALUE,
    st.lists(
        st.fixed_dictionaries(
            {
                "key": st.sampled_from(["hw.id", "hw.parent", "hw.type", "dra.pool.name", "x", ""]),
                "value": st.one_of(
                    st.fixed_dictionaries({"stringValue": st.text(max_size=6)}),
                    st.fixed_dictionaries({"intValue": st.integers(-9, 9).map(str)}),
                    st.fixed_dictionaries({"boolValue": st.booleans()}),
                    ANY_VALUE,
                ),
            }
        ),
        max_size=4,
    ),
)
FIELDS = {"asDouble": ANY_VALUE, "asInt": ANY_VALUE, "timeUnixNano": ANY_TIME, "attributes": ANY_ATTRIBUTES}


@st.composite
def bad_points(draw: st.DrawFn) -> dict:
    """A point of gpu-0 with some of its fields replaced by anything, or removed."""
    point = pt(gpu("gpu-0"), 1.0)
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=3, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            point.pop(name, None)
        else:
            point[name] = draw(FIELDS[name])
    return point


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_points(), st.sampled_from(["gauge", "counter"]))
def test_one_bad_point_never_costs_its_neighbours(point: dict, kind: str) -> None:
    """Hypothesis writes the bad point; beside it in the same request is a valid one. Both decoders
    keep the valid point, report at most one-line problems (counted skips, never the whole request),
    and raise nothing."""
    bad = gauge("hw.power", point) if kind == "gauge" else counter("hw.energy", point)
    doc = beside(bad)
    decoder = OtlpJsonDecoder(Schema())
    frames, errors = decoder.decode_line(dumps(doc), 1)
    for e in errors:
        one_line(str(e))
    assert decoder.lines_skipped == 0 and good_values(frames, decoder.schema) == [GOOD_VALUE]
    try:
        body = pb(doc)
    except (ParseError, ValueError, TypeError, OverflowError, AttributeError):
        return  # not expressible in protobuf (a wrong JSON type): the JSON decoder's case only
    proto = OtlpProtoDecoder(Schema())
    result = proto.decode(body)  # bytes ParseDict built are a request: no MalformedRequest
    one_line(result.message)
    for problem in result.problems:
        one_line(problem)
    assert good_values(result.frames, proto.schema) == [GOOD_VALUE]
    assert result.rejected <= result.points


# -- the real OTLP/HTTP receiver ------------------------------------------------------------------
@dataclass
class Live:
    receiver: OtlpReceiver
    schema: Schema
    got: list[Frame]


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    """One receiver for the whole corpus (stopping one takes half a second); each case has its own node."""
    schema, got = Schema(), []
    rec = OtlpReceiver(schema, got.extend, grpc_endpoint=None, http_endpoint="127.0.0.1:0", max_request_bytes=64 * MB)
    rec.start()
    try:
        yield Live(rec, schema, got)
    finally:
        rec.shutdown()


def renode(doc: dict, node: str) -> dict:
    """The request with NODE renamed (the receiver's decoders keep each node's newest time)."""
    for rm in doc["resourceMetrics"] if isinstance(doc["resourceMetrics"], list) else ():
        for attr in rm["resource"]["attributes"]:
            if attr["key"] == "k8s.node.name" and attr["value"]["stringValue"] == NODE:
                attr["value"]["stringValue"] = node
    return doc


def post(rec: OtlpReceiver, body: bytes, ctype: str) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{rec.http_port}/v1/metrics", data=body, headers={"Content-Type": ctype}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def check_http(status: int, reply: bytes, ctype: str, outcome: str) -> None:
    if status == 400:
        assert outcome in ("request", "any")
        message = json.loads(reply)["message"] if ctype == "application/json" else reply.decode("utf-8", "replace")
        one_line(message)
        return
    assert status == 200, (status, reply[:200])
    if outcome == "note":
        return
    if ctype == "application/json":
        partial = json.loads(reply or b"{}").get("partialSuccess", {})
        rejected, message = int(partial.get("rejectedDataPoints", 0)), partial.get("errorMessage", "")
    else:
        resp = ExportMetricsServiceResponse.FromString(reply)
        rejected, message = resp.partial_success.rejected_data_points, resp.partial_success.error_message
    one_line(message)
    assert outcome != "request"
    if outcome == "point":
        assert rejected >= 1 and message
    elif outcome == "accept":
        assert rejected == 0 and not message


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_http_receiver(case: Case, live: Live) -> None:
    node, prior = case_node(case), prior_of(case)
    json_body, proto_body = built(case)

    def values(start: int) -> list[float]:
        return good_values([f for f in live.got[start:] if f.devices.node == node], live.schema)

    if prior is not None:
        assert post(live.receiver, dumps(prior), "application/json")[0] == 200
    start = len(live.got)
    status, reply = post(live.receiver, json_body, "application/json")
    check_http(status, reply, "application/json", case.live or case.json)
    assert values(start) == ([case.value] if case.good_json else [])
    if proto_body is not None:
        if prior is not None:
            assert post(live.receiver, pb(prior), "application/x-protobuf")[0] == 200
        start = len(live.got)
        status, reply = post(live.receiver, proto_body, "application/x-protobuf")
        check_http(status, reply, "application/x-protobuf", case.live or case.proto or "any")
        if case.proto != "any":
            assert values(start) == ([case.value] if case.good_proto else [])
    assert live.receiver.stats()["requests"].get(("http", "error"), 0) == 0


def test_a_point_from_the_future_makes_the_present_old() -> None:
    """The documented rule, followed to its end (replay: no clock, no bound): after a point a year ahead,
    that series' points of the present are older than its newest and rejected (counted), in both decoders.
    Only that series: the node's other series keep theirs."""
    ahead = request(gauge("hw.power", pt(gpu("gpu-0"), 1.0, T0 + YEAR)))
    now = request(gauge("hw.power", pt(gpu("gpu-0"), 2.0, T0 + S)))
    other = request(gauge("hw.power", good(T0 + S)))
    jd = OtlpJsonDecoder(Schema())
    jd.decode_line(dumps(ahead), 1)
    frames, errors = jd.decode_line(dumps(now), 2)
    assert not frames and jd.points_skipped == 1 and "older than" in errors[0].message
    frames, errors = jd.decode_line(dumps(other), 3)
    assert not errors and good_values(frames, jd.schema) == [GOOD_VALUE]
    pd = OtlpProtoDecoder(Schema())
    pd.decode(pb(ahead))
    result = pd.decode(pb(now))
    assert not result.frames and result.rejected == 1 and "older than" in result.message
    result = pd.decode(pb(other))
    assert result.rejected == 0 and good_values(result.frames, pd.schema) == [GOOD_VALUE]


def test_the_live_receivers_future_bound_keeps_the_present() -> None:
    """With the receiver's bound (``max_future_ns``), the point a year ahead is the one rejected, with
    a line that says to check the node's clock, and the node's present points keep arriving."""
    ahead = request(gauge("hw.power", pt(gpu("gpu-0"), 1.0, T0 + YEAR)))
    now = request(gauge("hw.power", good(T0 + S)))
    bound = 600 * S
    clock = lambda: T0 + 2 * S  # noqa: E731
    jd = OtlpJsonDecoder(Schema(), max_future_ns=bound, clock=clock)
    frames, errors = jd.decode_line(dumps(ahead), 1)
    assert not frames and jd.points_skipped == 1
    one_line(errors[0].message)
    assert "ahead of this receiver's clock" in errors[0].message and "check that node's clock" in errors[0].message
    frames, errors = jd.decode_line(dumps(now), 2)
    assert not errors and good_values(frames, jd.schema) == [GOOD_VALUE]
    pd = OtlpProtoDecoder(Schema(), max_future_ns=bound, clock=clock)
    for fast in range(3):  # the plain path, then the template's (the same bytes but for the payloads)
        result = pd.decode(pb(request(gauge("hw.power", pt(gpu("gpu-0"), 1.0, T0 + YEAR + fast * S)))))
        assert not result.frames and result.rejected == 1 and "ahead of this receiver's clock" in result.message
    result = pd.decode(pb(now))
    assert result.rejected == 0 and good_values(result.frames, pd.schema) == [GOOD_VALUE]
    assert pd.sections_fast >= 1
    # Just inside the bound is accepted: the bound is the clock plus the tolerance, not the clock.
    inside = pd.decode(pb(request(gauge("hw.power", good(T0 + 2 * S + bound)))))
    assert inside.rejected == 0 and good_values(inside.frames, pd.schema) == [GOOD_VALUE]


# -- policy files ---------------------------------------------------------------------------------
LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
# The same bomb where the schema reads it: anchors in a valid key, the aliases in another.
LAUGHS_IN_SCHEMA = (
    "unhealthy_states: &a [failed, failed, failed, failed, failed, failed, failed, failed, failed]\n"
    "rules: {firmware: {deny: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]}}\n"
    "overrides: [{rules: {firmware: {deny: [*b, *b, *b, *b, *b, *b, *b, *b, *b]}}}]\n"
)
POLICY_CASES: list[tuple[str, bytes]] = [
    ("binary_garbage", RAW_GARBAGE),
    ("nul_byte", b"window: 5s\x00\n"),
    ("string_1mb", b'window: "' + b"x" * MB + b'"\n'),
    ("deeply_nested_lists", b"rules: " + b"[" * 5_000 + b"]" * 5_000 + b"\n"),
    ("deeply_nested_maps", b"rules: " + b"{a: " * 5_000 + b"1" + b"}" * 5_000 + b"\n"),
    ("billion_laughs", LAUGHS.encode()),
    ("billion_laughs_in_schema", LAUGHS_IN_SCHEMA.encode()),
    ("unknown_key", b"bogus: 1\n"),
    ("unknown_nested_key", b"rules: {thermal: {bogus: 1}}\n"),
    ("list_for_a_duration", b"window: [1, 2]\n"),
    ("bool_for_a_count", b"min_samples: yes\n"),
    ("string_for_a_number", b"rules: {thermal: {min_fraction: lots}}\n"),
    ("top_level_list", b"- 1\n- 2\n"),
    ("python_tag", b"window: !!python/object/apply:os.system [echo hi]\n"),
]
# The anchor bombs (9**9 "lol"s if expanded) must be refused without expanding: measured peak 0.2 MB.
BOMB_PEAK = 2 * MB


@pytest.mark.parametrize(("name", "text"), POLICY_CASES, ids=[n for n, _ in POLICY_CASES])
def test_policy_file(tmp_path: Path, name: str, text: bytes) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(text)

    def load() -> None:
        with pytest.raises(policy.PolicyError) as info:
            policy.load(path)
        one_line(str(info.value))

    if "laughs" not in name:
        load()  # (tracemalloc would make PyYAML's pure-Python scanner of 1 MB take 20 s)
        return
    _, peak = traced(load)
    assert peak <= BOMB_PEAK, f"peak {peak:,} B"
