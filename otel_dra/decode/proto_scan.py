"""The protobuf decoder's plain path, its first half: a section (one ResourceMetrics, as upb parsed it)
read for its structure: its node, its metrics and each point's target, or why it has none. What a
section's structure says is also what a template keeps (:mod:`~otel_dra.decode.proto_templates`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, ResourceMetrics

from otel_dra import conventions as cv
from otel_dra.decode.attributes import NODE, NOT_COLUMN_ATTRS, READ_ATTRIBUTES, intern
from otel_dra.decode.caps import Refusal, Tally
from otel_dra.decode.checks import UNKNOWN, metric_problem, self_telemetry
from otel_dra.decode.series import Target
from otel_dra.decode.text import PROTO_DIALECT

_DELTA: Final = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
#: A resource's node admitted: its device set (None: refused, and why); the decoder's ``_admit_node``.
AdmitNode = Callable[[str], tuple[set[str] | None, Refusal | None]]
#: Where a point of (metric, attributes) goes on a node that has named these devices; the decoder's ``_target``.
FindTarget = Callable[[str, dict[str, str], set[str]], Target | str | Refusal]


def value_str(value: AnyValue) -> str:
    """An attribute's value as the string the columnar model keeps (as the replay decoder reads
    the JSON mapping of the same value: bytes as base64, arrays and maps as compact JSON)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return repr(value.double_value)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return json.dumps(MessageToDict(getattr(value, kind)), sort_keys=True, separators=(",", ":"))


def kv_dict(items: Any) -> dict[str, str]:
    """A repeated ``KeyValue`` as a dict; the last of a repeated key wins. Values are interned (attributes.intern)."""
    out: dict[str, str] = {}
    kv: KeyValue
    for kv in items:
        key = kv.key
        out[key] = intern(key, value_str(kv.value))
    return out


@dataclass(slots=True)
class Candidate:
    """A point whose metric and attributes are usable; its time and value are still to be checked."""

    ordinal: int  # within its section, counting every data point
    metric: str
    index: int  # 0-based within its metric
    dev: int
    col: int
    descr: int  # index into the decoder's descriptive attribute sets, -1: none
    counter: bool
    point: Any  # the upb NumberDataPoint


@dataclass
class Scan:
    """What a section's structure says, before looking at times and values."""

    node: str | None
    points: int = 0
    rejected: int = 0
    ignored: int = 0  # points of otel-dra's own telemetry, set aside (checks.self_telemetry)
    stray: int = 0  # points with attributes not read (attributes.READ_ATTRIBUTES)
    problems: list[tuple[int, str]] = field(default_factory=list)  # (ordinal, text), in order
    unknown: list[tuple[int, str, int]] = field(default_factory=list)  # (first ordinal, metric, points)
    candidates: list[Candidate] = field(default_factory=list)
    shape: list[tuple[str | None, int, bool]] = field(default_factory=list)  # (kind, points, ignored) per metric
    tally: Tally = field(default_factory=Tally)  # points refused by the caps


def scan_section(rm: ResourceMetrics, admit_node: AdmitNode, find_target: FindTarget) -> Scan:
    """A section's structure: its node, metrics and each point's target (or why it has none)."""
    node = kv_dict(rm.resource.attributes).get(NODE) or None
    scan = Scan(node)
    devices: set[str] = set()
    refused: Refusal | None = None
    if node is not None:
        admitted, refused = admit_node(node)
        devices = admitted if admitted is not None else devices
    ordinal = 0
    for sm in rm.scope_metrics:
        from_agent = sm.scope.name == cv.AGENT_SCOPE
        for metric in sm.metrics:
            kind = metric.WhichOneof("data")
            body = getattr(metric, kind) if kind is not None else None
            points = body.data_points if body is not None else ()
            n = len(points)
            # otel-dra's own telemetry (an agent's verdicts, its push queue's metrics): not input, not a
            # rejection; counted apart (as in replay).
            ignored = self_telemetry(metric.name, from_agent)
            scan.shape.append((kind, n, ignored))
            if ignored:
                scan.ignored += n
                continue
            first, ordinal = ordinal, ordinal + n
            if node is None or n == 0 or refused is not None:
                continue
            assert body is not None  # it has points
            name = metric.name
            delta = kind == "sum" and body.aggregation_temporality == _DELTA
            problem = metric_problem(PROTO_DIALECT, name or None, kind, n, node, delta=delta)
            if problem is not None:
                scan.rejected += n
                if problem is UNKNOWN:
                    scan.unknown.append((first, name, n))
                else:
                    scan.problems.append((first, problem))
                continue
            counter = kind == "sum" and bool(body.is_monotonic)
            read = READ_ATTRIBUTES.get(name, NOT_COLUMN_ATTRS)
            for k, point in enumerate(points):
                attrs = kv_dict(point.attributes)
                target = find_target(name, attrs, devices)
                if isinstance(target, Refusal):
                    scan.rejected += 1
                    scan.tally.add(target, node)
                elif isinstance(target, str):
                    scan.rejected += 1
                    scan.problems.append((first + k, f"point {k + 1} of {name} {target}"))
                else:
                    scan.candidates.append(Candidate(first + k, name, k, *target, counter, point))
                    if not attrs.keys() <= read:
                        scan.stray += 1
    scan.points = ordinal
    if node is None:
        scan.rejected = ordinal
        if ordinal:
            scan.problems.append((0, f"a resource without {NODE}: its {ordinal:,} points rejected"))
    elif refused is not None:
        scan.rejected = ordinal
        if ordinal:
            scan.tally.add(refused, node, ordinal)
    return scan
