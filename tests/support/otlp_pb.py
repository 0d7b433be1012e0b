"""A request in OTLP's JSON mapping as protobuf bytes: ``ParseDict``'s, built sooner for requests of many points.

``ParseDict`` walks the JSON mapping a field at a time in Python: about 90 µs a data point here, so the decoders'
200,000-device request took 18 s to build, most of its test. A point of the plain shape the tests write (string
attributes, its times, ``asDouble`` as a number or ``asInt`` as a string) is set field by field on the message
instead; any other point, and everything around the points, still goes through ``ParseDict``. The bytes are
``ParseDict``'s (``tests/unit/decode/test_decode_limits.py`` checks both ways on such requests).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint

#: Metrics with fewer points than this are left to ParseDict whole.
MANY = 64
_PLAIN_KEYS = frozenset({"attributes", "timeUnixNano", "startTimeUnixNano", "asDouble", "asInt"})


def pb(doc: dict[str, Any]) -> bytes:
    """``ParseDict(doc, ExportMetricsServiceRequest()).SerializeToString()``."""
    pending: list[tuple[tuple[int, int, int, str], list[dict[str, Any]]]] = []
    resources = []
    for r, rm in enumerate(doc.get("resourceMetrics", [])):
        scopes = []
        for s, sm in enumerate(rm.get("scopeMetrics", [])):
            metrics = []
            for m, metric in enumerate(sm.get("metrics", [])):
                kind = next((k for k in ("gauge", "sum") if k in metric), None)
                points = metric[kind].get("dataPoints", []) if kind is not None else []
                if len(points) >= MANY:
                    pending.append(((r, s, m, kind), points))  # type: ignore[arg-type]
                    metric = {**metric, kind: {**metric[kind], "dataPoints": []}}  # type: ignore[dict-item]
                metrics.append(metric)
            scopes.append({**sm, "metrics": metrics} if "metrics" in sm else sm)
        resources.append({**rm, "scopeMetrics": scopes} if "scopeMetrics" in rm else rm)
    rest = {**doc, "resourceMetrics": resources} if "resourceMetrics" in doc else doc
    msg = ParseDict(rest, ExportMetricsServiceRequest())
    for (r, s, m, kind), points in pending:
        target = getattr(msg.resource_metrics[r].scope_metrics[s].metrics[m], kind).data_points
        for point in points:
            _point(point, target.add())
    return msg.SerializeToString()


def _string_attribute(a: Any) -> bool:
    return (
        type(a) is dict
        and a.keys() == {"key", "value"}
        and type(a["key"]) is str
        and type(a["value"]) is dict
        and a["value"].keys() == {"stringValue"}
        and type(a["value"]["stringValue"]) is str
    )


def _unsigned(v: Any) -> bool:
    if type(v) is str and v.isascii() and v.isdigit():
        v = int(v)
    return type(v) is int and 0 <= v < 1 << 64


def _signed(v: Any) -> bool:
    digits = v.removeprefix("-") if type(v) is str else ""
    return digits.isascii() and digits.isdigit() and -(1 << 63) <= int(v) < 1 << 63


def _point(point: dict[str, Any], into: NumberDataPoint) -> None:
    """One data point, set field by field when it has the plain shape, else by ParseDict."""
    if type(point) is not dict:
        ParseDict(point, into)  # (it says what is wrong)
        return
    attrs = point.get("attributes", [])
    double, integer = point.get("asDouble"), point.get("asInt")
    plain = (
        point.keys() <= _PLAIN_KEYS
        and all(_string_attribute(a) for a in attrs)
        and all(_unsigned(point.get(k, 0)) for k in ("timeUnixNano", "startTimeUnixNano"))
        and (double is None or type(double) in (int, float))
        and (integer is None or _signed(integer))
        and (double is None) != (integer is None)
    )
    if not plain:
        ParseDict(point, into)
        return
    for a in attrs:
        kv = into.attributes.add()
        kv.key = a["key"]
        kv.value.string_value = a["value"]["stringValue"]
    if "startTimeUnixNano" in point:
        into.start_time_unix_nano = int(point["startTimeUnixNano"])
    if "timeUnixNano" in point:
        into.time_unix_nano = int(point["timeUnixNano"])
    if double is not None:
        into.as_double = float(double)
    else:
        into.as_int = int(integer)  # type: ignore[arg-type]
