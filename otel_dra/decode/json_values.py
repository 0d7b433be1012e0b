"""The JSON decoder's value reading: an ``AnyValue``, an attribute list, a point's time and value as the
protobuf JSON mapping writes them, each refused (:class:`Malformed`) when it is not of that mapping's shape."""

from __future__ import annotations

import json
import math
from typing import Any, Final

from otel_dra.decode.attributes import intern
from otel_dra.decode.text import name, short

#: The ``aggregationTemporality`` of a delta sum, as a number or the enum's name.
DELTA: Final = frozenset({1, "AGGREGATION_TEMPORALITY_DELTA"})
MAX_TIME: Final = 1 << 64  # a timeUnixNano is a fixed64: below this
#: A metric's data fields, in the order they are looked for.
KINDS: Final = ("gauge", "sum", "histogram", "exponentialHistogram", "summary")


class Malformed(Exception):
    """A part of the request that doesn't have the JSON mapping's shape."""


def any_value_str(value: Any) -> str:
    """An attribute's ``AnyValue`` as the string the columnar model keeps."""
    if type(value) is not dict:
        raise Malformed("is not an AnyValue object")
    if not value:
        return ""
    if len(value) != 1:
        raise Malformed(f"has several values ({', '.join(name(k) for k in sorted(value))})")
    ((kind, v),) = value.items()
    if kind == "stringValue" and type(v) is str:
        return v
    if kind == "boolValue" and type(v) is bool:
        return "true" if v else "false"
    try:
        if kind == "intValue" and (type(v) is int or (type(v) is str and v.isascii())):
            return str(int(v))
        if kind == "doubleValue" and type(v) in (int, float, str):
            return repr(float(v))
        if kind == "bytesValue" and type(v) is str:
            return v
        if kind in ("arrayValue", "kvlistValue") and type(v) is dict:
            return json.dumps(v, sort_keys=True, separators=(",", ":"))
    except (ValueError, OverflowError, RecursionError):
        pass
    raise Malformed(f"has a malformed {name(kind)}")


def attributes_of(items: Any) -> dict[str, str]:
    """A JSON ``attributes`` list (``[{"key": ..., "value": {...}}]``) as a dict; last key wins. Values are
    interned (attributes.intern)."""
    if type(items) is not list:
        raise Malformed("attributes are not a list")
    out: dict[str, str] = {}
    for i, kv in enumerate(items, 1):
        key = kv.get("key") if type(kv) is dict else None
        if type(key) is not str:
            raise Malformed(f"attribute {i} is not a key/value object")
        try:
            out[key] = intern(key, any_value_str(kv.get("value", {})))
        except Malformed as exc:
            raise Malformed(f"attribute {name(key)} {exc}") from None
    return out


def point_count(metric: Any) -> int:
    """The data points of a metric read only to be counted (0 when it has no list of them)."""
    body = None
    if type(metric) is dict:
        for kind in KINDS:
            body = metric.get(kind)
            if body is not None:
                break
    points = body.get("dataPoints", []) if type(body) is dict else None
    return len(points) if type(points) is list else 0


def to_time(ts: Any) -> int:
    """``timeUnixNano`` (a decimal string in the JSON mapping, or an int) as nanoseconds."""
    if type(ts) is str and ts.isascii() and ts.isdigit():
        if len(ts) > 20:  # past 2**64, and int() refuses very long digit strings
            raise Malformed(f"has timeUnixNano {short(ts)}, out of range")
        t = int(ts)
    elif type(ts) is int:
        t = ts
    elif ts is None:
        raise Malformed("has no timeUnixNano")
    else:
        raise Malformed(f"has timeUnixNano {short(ts)}, not an integer")
    if not 0 < t < MAX_TIME:
        raise Malformed(f"has timeUnixNano {short(t)}, out of range")
    return t


def to_value(point: dict[str, Any]) -> tuple[str, float | None]:
    """The point's ``asDouble`` or ``asInt`` as a float and the field it came from (None: neither);
    JSON's own ways to be no number at all are refused here, the rest is the core's."""
    raw = point.get("asDouble")
    field = "asDouble"
    if raw is None:
        raw, field = point.get("asInt"), "asInt"
    if raw is None:
        return field, None
    if type(raw) not in (float, int, str):
        raise Malformed(f"has {field} {short(raw)}, not a number")
    try:
        value = float(raw)
    except (ValueError, OverflowError):
        raise Malformed(f"has {field} {short(raw)}, not a number") from None
    if math.isinf(value) and type(raw) is str and raw.strip().lstrip("+-").lower() not in ("inf", "infinity"):
        raise Malformed(f"has {field} {short(raw)}, out of range")
    return field, value


def attrs_of_list(items: Any) -> dict[str, str] | str:
    """A JSON attribute list as a dict, or why it is malformed (a string)."""
    try:
        return attributes_of(items)
    except Malformed as exc:
        return str(exc)
