"""A line like one read before is read off its template (:mod:`otel_dra.decode.json_templates`), with the result the
walk gives: the same frames, errors and counts as a decoder without templates and as the plain parse, whatever the
times and values (numbers of every JSON form, ``-0``, non-finite, negative counters, times out of order, out of
range or ahead of the receiver's bound) and however many nodes a line holds."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_dra.decode import OtlpJsonDecoder
from otel_dra.decode.json_templates import make_template, points_of, resources_of
from otel_dra.frame import Schema
from tests.support.otlp_trace import PlainDecoder

S = 10**9
T0 = 1_795_000_000 * S


def _attrs(attrs: dict[str, str]) -> list[dict[str, Any]]:
    return [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]


#: A point's fields in the order a writer puts them: the scenario's (and protobuf's field order), the shared example's,
#: and the value first.
ORDERS = (("start", "time", "value"), ("time", "start", "value"), ("value", "time", "start"))


def _point(device: str, time: str, value: tuple[str, str], order: tuple[str, ...] = ORDERS[0]) -> dict[str, Any]:
    kind, text = value
    fields: dict[str, tuple[str, Any]] = {
        "start": ("startTimeUnixNano", str(T0)),
        "time": ("timeUnixNano", time),
        # asInt is a string (text as it is); asDouble a bare JSON number, put in below as its exact text.
        "value": ("asInt", text) if kind == "int" else ("asDouble", f"@@{text}@@"),
    }
    point: dict[str, Any] = {"attributes": _attrs({"hw.id": device, "hw.type": "gpu"})}
    point.update(fields[name] for name in order)
    return point


def _line(
    nodes: list[tuple[str, list[str], list[tuple[str, str]], list[tuple[str, str]]]], order: tuple[str, ...] = ORDERS[0]
) -> bytes:
    """One request: per node (name, each device's time, its power gauge's value, its energy counter's value)."""
    resources = []
    for node, times, power, energy in nodes:
        devices = [f"gpu-{i}" for i in range(len(times))]
        resources.append(
            {
                "resource": {"attributes": _attrs({"k8s.node.name": node})},
                "scopeMetrics": [
                    {
                        "scope": {"name": "test"},
                        "metrics": [
                            {
                                "name": "hw.power",
                                "unit": "W",
                                "gauge": {
                                    "dataPoints": [
                                        _point(d, t, v, order) for d, t, v in zip(devices, times, power, strict=True)
                                    ]
                                },
                            },
                            {
                                "name": "hw.energy",
                                "unit": "J",
                                "sum": {
                                    "aggregationTemporality": 2,
                                    "isMonotonic": True,
                                    "dataPoints": [
                                        _point(d, t, v, order) for d, t, v in zip(devices, times, energy, strict=True)
                                    ],
                                },
                            },
                        ],
                    }
                ],
            }
        )
    text = json.dumps({"resourceMetrics": resources}, separators=(",", ":"))
    return text.replace('"@@', "").replace('@@"', "").encode()


def _decoders(**kwargs: Any) -> list[OtlpJsonDecoder]:
    return [
        OtlpJsonDecoder(Schema(), **kwargs),
        OtlpJsonDecoder(Schema(), templates=False, **kwargs),
        PlainDecoder(Schema(), **kwargs),
    ]


def _seen(decoder: OtlpJsonDecoder, line: bytes, n: int) -> tuple[Any, ...]:
    result = decoder.decode(line, n)
    frames = []
    for f in result.frames:
        cells = {}
        for r, device in enumerate(f.devices.ids):
            for c in range(f.values.shape[1]):
                v = float(f.values[r, c])
                if not np.isnan(v):
                    cells[(device, decoder.schema.columns[c])] = (v, bool(np.signbit(v)))
        frames.append((f.time_unix_nano, f.devices.node, f.devices.ids, cells))
    kept = (result.errors, result.limited, result.points, result.rejected, result.problems, result.invalid)
    return frames, kept, result.stray, result.ignored, result.clock_jumps


def _agree(lines: list[bytes], **kwargs: Any) -> OtlpJsonDecoder:
    """Decode ``lines`` with templates, without, and by the plain parse: every line's result the same."""
    decoders = _decoders(**kwargs)
    for n, line in enumerate(lines, 1):
        ours, *theirs = (_seen(d, line, n) for d in decoders)
        for other in theirs:
            assert ours == other
    counts = ("lines", "lines_skipped", "points", "points_skipped")
    assert len({tuple(getattr(d, c) for c in counts) for d in decoders}) == 1
    return decoders[0]


@pytest.mark.parametrize(("order", "templated"), [(ORDERS[0], 4), (ORDERS[1], 4), (ORDERS[2], 0)])
def test_a_nodes_next_lines_are_read_off_its_template(order: tuple[str, ...], templated: int) -> None:
    """Every line after a node's first, in the orders writers put a point's fields (a value first: walked)."""
    lines = [
        _line(
            [("node-1", [str(T0 + k * S)] * 2, [("double", f"{100 + k}.5"), ("int", "7")], [("int", str(k))] * 2)],
            order,
        )
        for k in range(5)
    ]
    decoder = _agree(lines)
    assert decoder.lines_templated == templated


def test_a_changed_layout_is_read_by_the_walk_and_becomes_a_template_too() -> None:
    one = [("node-1", [str(T0)], [("double", "1")], [("int", "1")])]
    two = [("node-1", [str(T0 + S)] * 2, [("double", "1")] * 2, [("int", "1")] * 2)]
    lines = [_line(one), _line(two), _line([(*two[0][:1], [str(T0 + 2 * S)] * 2, *two[0][2:])])]
    decoder = _agree(lines)
    assert decoder.lines_templated == 1  # the third (the second is a new shape, walked)


def test_a_line_whose_numbers_no_template_places_is_walked_and_its_shape_not_split_again() -> None:
    """An exemplar's time and value beside a point's: the walk reads the line (and ignores the exemplar); its shape
    is marked, so its next lines are not split for a template they can't have."""

    def with_exemplar(k: int) -> bytes:
        doc = json.loads(_line([("node-1", [str(T0 + k * S)], [("double", "1.5")], [("int", str(k))])]))
        point = doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["gauge"]["dataPoints"][0]
        point["exemplars"] = [{"timeUnixNano": str(T0 + k * S), "asDouble": 2.5}]
        return json.dumps(doc, separators=(",", ":")).encode()

    decoder = _agree([with_exemplar(k) for k in range(4)])
    assert decoder.lines_templated == 0
    assert not any(shape.splits for shape in decoder._shapes._shapes.values())


def test_a_collectors_batches_of_changing_nodes_are_read_off_each_nodes_template() -> None:
    """A Collector's ``file`` exporter writes each batch of requests as one line: several nodes' resources side by
    side, a different mix in each line. Each resource is read off its node's template once the node was read."""
    names = [f"node-{k}" for k in range(6)]
    lines = []
    for k in range(12):
        batch = names[k % 3 :: 2] if k % 2 else names[k % 4 : k % 4 + 3]  # (a changing mix, each node in time order)
        lines.append(
            _line([(node, [str(T0 + k * S)] * 2, [("double", f"{k}.5")] * 2, [("int", str(k))] * 2) for node in batch])
        )
    decoder = _agree(lines)
    assert decoder.lines_templated >= 8  # (a line is read off templates once each of its nodes has one)


def test_a_resource_that_reads_like_the_start_of_another_makes_no_template_of_pieces() -> None:
    """Where the text ``},{"resource":`` sits inside a resource (a key the walk does not read) and the next resource
    does not start with it, the cut pieces are as many as the resources but not them: no template is made of them,
    and every line is walked."""

    def line(k: int) -> bytes:
        doc = json.loads(
            _line([(f"node-{i}", [str(T0 + k * S)], [("double", "1.5")], [("int", str(k))]) for i in (1, 2)])
        )
        first, second = doc["resourceMetrics"]
        first["scopeMetrics"].append({"resource": 1, "scope": {"name": "x"}, "metrics": []})
        doc["resourceMetrics"][1] = {"scopeMetrics": second["scopeMetrics"], "resource": second["resource"]}
        return json.dumps(doc, separators=(",", ":")).encode()

    assert len(resources_of(line(0)) or []) == 2
    decoder = _agree([line(k) for k in range(4)])
    assert decoder.lines_templated == 0


def test_a_key_that_looks_like_a_points_fields_is_not_taken_for_one() -> None:
    """An attribute list holding a key that ends like a point's time, beside a point whose value comes first (which
    the split does not find): the split finds as many texts as the walk reads points, yet not the walk's, so no
    template is made of the line and every line is walked."""

    def line(k: int) -> bytes:
        doc = json.loads(_line([("node-1", [str(T0 + k * S)], [("double", "1.5")], [("int", str(k))])]))
        metrics = doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
        metrics[0]["gauge"]["dataPoints"][0]["attributes"][0]['x"timeUnixNano'] = "5"
        energy = metrics[1]["sum"]["dataPoints"][0]
        energy.pop("timeUnixNano")
        energy.pop("startTimeUnixNano")  # (a start time before its value is a match of the split's: see below)
        energy["timeUnixNano"] = str(T0 + k * S)  # (after its value: this point is not split out)
        text = json.dumps(doc, separators=(",", ":"))
        return text.replace('"5"', '"5","asInt":"9"', 1).encode()

    assert len(points_of(line(0)).times) == 2  # type: ignore[union-attr]  # (the look-alike, and the power's)
    decoder = _agree([line(k) for k in range(4)])
    assert decoder.lines_templated == 0


def test_a_start_time_before_a_value_is_not_taken_for_the_points_time() -> None:
    """A point whose start time comes before its value and its time after (``"startTimeUnixNano":"S","asInt":"v",
    "timeUnixNano":"T"``) holds a match of the split at its start time. A line where S is T would make a template
    whose split reads S for the time; a next line with S moved and T kept (in the template's pieces) would be read
    off it at S. No template is made of such a line: every line is walked, with the walk's times."""

    def line(start: int, time: int, value: int) -> bytes:
        point = {"attributes": _attrs({"hw.id": "gpu-0"}), "startTimeUnixNano": str(start), "asInt": str(value)}
        point["timeUnixNano"] = str(time)
        metric = {"name": "hw.energy", "unit": "J", "sum": {"aggregationTemporality": 2, "isMonotonic": True}}
        metric["sum"]["dataPoints"] = [point]  # type: ignore[index]
        resource = {"resource": {"attributes": _attrs({"k8s.node.name": "node-1"})}}
        resource["scopeMetrics"] = [{"scope": {"name": "test"}, "metrics": [metric]}]
        return json.dumps({"resourceMetrics": [resource]}, separators=(",", ":")).encode()

    first = line(T0, T0, 5)
    split = points_of(first)
    assert split is not None and split.times == [str(T0).encode()]  # (the start time's digits)
    decoder = _agree([first, line(T0 - 5 * S, T0, 7), line(T0 + S, T0 + S, 9), line(T0 - 9 * S, T0 + S, 11)])
    assert decoder.lines_templated == 0


def test_lines_no_template_can_read_are_split_only_now_and_then(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream whose points the split does not find (a value before its time) is walked line after line: it pays
    for a split a line only until a few in a row found no template; once lines are read off templates again, each
    is split again."""
    from otel_dra.decode import otlp_json

    splits = []
    monkeypatch.setattr(otlp_json, "points_of", lambda raw: splits.append(raw) or points_of(raw))
    decoder = OtlpJsonDecoder(Schema())
    walked = [_line([("node-1", [str(T0 + k * S)], [("double", "1")], [("int", "1")])], ORDERS[2]) for k in range(64)]
    for k, text in enumerate(walked):
        decoder.decode(text, k)
    assert decoder.lines_templated == 0
    assert len(splits) <= otlp_json.MISSES_BEFORE_PROBING + 64 // otlp_json.PROBE_EVERY + 1
    again = [_line([("node-7", [str(T0 + k * S)], [("double", "2")], [("int", "1")])]) for k in range(1, 40)]
    for k, text in enumerate(again):
        decoder.decode(text, 100 + k)
    assert decoder.lines_templated >= len(again) - otlp_json.PROBE_EVERY - 1


def test_points_of_splits_times_and_values_and_digests_the_rest() -> None:
    text_a = b'{"x":[{"startTimeUnixNano":"1","timeUnixNano":"5","asInt":"-3"},{"timeUnixNano":"6","asDouble":1.5e3}]}'
    a = points_of(text_a)
    b = points_of(
        b'{"x":[{"startTimeUnixNano":"1","timeUnixNano":"7","asInt":"4"},{"timeUnixNano":"8","asDouble":-2}]}'
    )
    assert a is not None and b is not None
    assert a.key == b.key and a.times == [b"5", b"6"] and a.values() == [-3.0, 1500.0]
    assert b.values() == [4.0, -2.0]
    # A start time between a point's time and its value is left out of the digest; before them, it is a piece.
    between = points_of(b'{"x":[{"timeUnixNano":"5","startTimeUnixNano":"1","asInt":"-3"}]}')
    moved = points_of(b'{"x":[{"timeUnixNano":"9","startTimeUnixNano":"2","asInt":"0"}]}')
    assert between is not None and moved is not None and between.key == moved.key and moved.times == [b"9"]
    restarted = points_of(
        b'{"x":[{"startTimeUnixNano":"2","timeUnixNano":"5","asInt":"-3"},{"timeUnixNano":"6","asDouble":1.5e3}]}'
    )
    assert restarted is not None and restarted.key != a.key
    assert points_of(b'{"x":"\\u0000"}') is not None and points_of(b'{"x":"\x00"}') is None
    minus_zero = points_of(b'{"x":[{"timeUnixNano":"5","asDouble":-0}]}')
    assert minus_zero is not None and minus_zero.values() is None  # (the parser's 0, not float's -0.0: the walk's)
    # A time that is no point's (an exemplar's, another field's) makes no template.
    assert make_template(text_a, a, [0], [(0, False, 1)], ["node-1"]) is None
    template = make_template(text_a, a, [0, 1], [(0, False, 2)], ["node-1"])
    assert template is not None and template.single and template.counter.tolist() == [False, False]


NUMBERS = st.one_of(
    st.tuples(st.just("int"), st.sampled_from(["0", "-0", "7", "-5", "9007199254740993", "99999999999999999999"])),
    st.tuples(st.just("int"), st.integers(-(10**6), 10**12).map(str)),
    st.tuples(
        st.just("double"),
        st.sampled_from(["0", "-0", "-0.0", "1e400", "-1e400", "2.5E-3", "12345678901234567890123", "1e-320"]),
    ),
    st.tuples(st.just("double"), st.floats(allow_nan=False, allow_infinity=False).map(repr)),
    st.tuples(st.just("double"), st.integers(-(10**9), 10**9).map(str)),
    st.tuples(st.just("int"), st.sampled_from(['NaN", "x": "1', "1.5", " 3"])),  # strings the walk judges
)


@settings(
    max_examples=200, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data(), live=st.booleans())
def test_templates_read_every_line_as_the_walk_does(data: st.DataObject, live: bool) -> None:
    n_lines = data.draw(st.integers(2, 6))
    order = data.draw(st.sampled_from(ORDERS))
    devices = data.draw(st.integers(1, 3))
    names = ["node-a", "node-b"]
    lines = []
    clock = T0 + 3 * S
    for k in range(n_lines):
        nodes = []
        for node in names[: data.draw(st.integers(1, 2))]:
            base = T0 + k * S + data.draw(st.sampled_from([0, 0, 0, -2 * S, 30 * S]))  # in order, back, ahead
            times = [str(base)] * devices
            if data.draw(st.integers(0, 4)) == 0:  # a device at its own time, or out of range
                times[data.draw(st.integers(0, devices - 1))] = data.draw(
                    st.sampled_from([str(base + 1), "0", str(1 << 64), str(T0 - S)])
                )
            power = [data.draw(NUMBERS) if data.draw(st.integers(0, 3)) == 0 else ("double", "300.5") for _ in times]
            energy = [data.draw(NUMBERS) if data.draw(st.integers(0, 3)) == 0 else ("int", str(k)) for _ in times]
            nodes.append((node, times, power, energy))
        lines.append(_line(nodes, order))
    kwargs: dict[str, Any] = {"max_future_ns": 10 * S, "clock": lambda: clock} if live else {}
    _agree(lines, **kwargs)
