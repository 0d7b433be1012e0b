"""The protobuf wire reader the templates are built with: where each ResourceMetrics of a request starts
and ends, and where each number point's 8-byte payloads (start time, time, value) are in it.

It reads only what a template needs and bails (:class:`Bail`) on anything else (repeated singular fields,
groups, mistyped fields): upb's parse, the plain path, decides those.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import xxhash

from otel_dra.decode.checks import NUMBER_KINDS

# Wire field numbers (opentelemetry/proto/metrics/v1/metrics.proto).
METRIC_KIND_FIELDS: Final = {5: "gauge", 7: "sum", 9: "histogram", 10: "exponential_histogram", 11: "summary"}
_P_START, _P_TIME, _P_DOUBLE, _P_INT = 2, 3, 4, 6
#: A point's value kind: none, ``as_double``, ``as_int``.
NONE, DOUBLE, INT = 0, 1, 2


class Bail(Exception):
    """The wire walker met something it does not handle; the plain path decides."""


def varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise Bail
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def fields(data: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, payload start, payload end) of each field in ``data[pos:end]``."""
    while pos < end:
        key, pos = varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0 or key >= 1 << 32:
            raise Bail
        if wire == 0:
            _, stop = varint(data, pos, end)
        elif wire == 1:
            stop = pos + 8
        elif wire == 2:
            length, pos = varint(data, pos, end)
            stop = pos + length
        elif wire == 5:
            stop = pos + 4
        else:  # groups and invalid wire types
            raise Bail
        if stop > end:
            raise Bail
        yield number, wire, pos, stop
        pos = stop


def walk_point(data: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """Offsets of a NumberDataPoint's start time, time, as_double, as_int payloads (-1: absent)."""
    offs = {_P_START: -1, _P_TIME: -1, _P_DOUBLE: -1, _P_INT: -1}
    for number, wire, a, _ in fields(data, pos, end):
        if number in offs:
            if wire != 1 or offs[number] >= 0:
                raise Bail  # repeated or mistyped: protobuf's merge rules, left to upb
            offs[number] = a
    if offs[_P_DOUBLE] >= 0 and offs[_P_INT] >= 0:
        raise Bail
    return offs[_P_START], offs[_P_TIME], offs[_P_DOUBLE], offs[_P_INT]


def walk_section(data: bytes, pos: int, end: int) -> list[tuple[str | None, list[tuple[int, int, int, int]]]]:
    """Each metric of a ResourceMetrics in order: its kind and, for gauges and sums, its points' offsets."""
    metrics: list[tuple[str | None, list[tuple[int, int, int, int]]]] = []
    for number, wire, a, b in fields(data, pos, end):
        if number != 2:
            continue
        if wire != 2:
            raise Bail
        for number2, wire2, a2, b2 in fields(data, a, b):
            if number2 != 2:
                continue
            if wire2 != 2:
                raise Bail
            kind: str | None = None
            body = (0, 0)
            for number3, wire3, a3, b3 in fields(data, a2, b2):
                if number3 in METRIC_KIND_FIELDS:
                    if wire3 != 2 or kind is not None:
                        raise Bail
                    kind, body = METRIC_KIND_FIELDS[number3], (a3, b3)
            points: list[tuple[int, int, int, int]] = []
            if kind in NUMBER_KINDS:
                for number4, wire4, a4, b4 in fields(data, *body):
                    if number4 == 1:
                        if wire4 != 2:
                            raise Bail
                        points.append(walk_point(data, a4, b4))
            metrics.append((kind, points))
    return metrics


def sections(data: bytes) -> list[tuple[int, int]] | None:
    """(start, end) of each ResourceMetrics of a request, or None for anything but a plain list of them."""
    out: list[tuple[int, int]] = []
    pos, end = 0, len(data)
    try:
        while pos < end:
            if data[pos] != 0x0A:  # field 1, length-delimited
                return None
            length, pos = varint(data, pos + 1, end)
            if pos + length > end:
                return None
            out.append((pos, pos + length))
            pos += length
    except Bail:
        return None
    return out


def template_key(data: bytes, start: int, end: int) -> tuple[int, int]:
    """Where to look for a section's template: a 64-bit digest of its resource's bytes, and its length (cheap,
    not a proof: the template's own digest is; what is kept per node is two numbers, not its resource)."""
    if end > start and data[start] == 0x0A:
        try:
            length, pos = varint(data, start + 1, end)
        except Bail:
            return 0, end - start
        if pos + length <= end:
            return xxhash.xxh3_64_intdigest(memoryview(data)[pos : pos + length]), end - start
    return 0, end - start
