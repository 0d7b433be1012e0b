"""A recording's lines: per-node templates of OTLP JSON with slots for the stamps and values.

Why templates: between two lines of a node only values and stamps change, never the attribute JSON, so
a node's line is built once per set of series (a new error code, a device gone, a restart) and then
written as one ``%`` format of the simulation's values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from otel_dra import conventions as cv
from otel_dra.scenario.plan import Node, Plan
from otel_dra.scenario.series import METRIC_ORDER, SERIES
from otel_dra.scenario.simulation import FleetSim

SERVICE_NAME: Final = "otel-dra-scenario"
SCOPE_NAME: Final = "otel-dra.scenario"


#: Where a line's stamp goes in a template: json.dumps escapes every control character, so no
#: attribute text can hold a NUL.
_STAMP: Final = "\0"


def _attr(key: str, value: str) -> str:
    return '{"key":' + json.dumps(key) + ',"value":{"stringValue":' + json.dumps(value) + "}}"


@dataclass
class Template:
    """A line cut at its stamps (``stamp.join(parts)``), then ``%`` slots for ``idx``'s values."""

    parts: list[str]
    idx: np.ndarray


@dataclass
class LineTemplates:
    """Per-node line templates: the JSON of a line with ``%`` slots for its stamps and values."""

    plan: Plan
    sim: FleetSim
    cache: dict[tuple[Any, ...], Template] = field(default_factory=dict)
    attrs: dict[tuple[int, int], str] = field(default_factory=dict)

    def point_attrs(self, row: int, k: int) -> str:
        found = self.attrs.get((row, k))
        if found is None:
            d, s = self.plan.devices[row], SERIES[k]
            if s.sensor is None:
                parts = [_attr(cv.HW_ID, d.hw_id)] + [_attr(a, v) for a, v in d.attrs.items()]
            else:
                parts = [
                    _attr(cv.HW_ID, f"{d.hw_id}/{s.sensor}"),
                    _attr(cv.HW_TYPE, s.sensor_type or ""),
                    _attr(cv.HW_PARENT, d.hw_id),
                ]
            parts += [_attr(a, v) for a, v in s.attrs]
            found = self.attrs[(row, k)] = ("[" + ",".join(parts) + "]").replace("%", "%%")
        return found

    def template(self, node: Node, rows: list[int]) -> Template:
        sim = self.sim
        key = (node.index, tuple(rows), sim.on[rows].tobytes(), sim.version[node.index])
        found = self.cache.get(key)
        if found is not None:
            return found
        ncols = len(SERIES)
        metrics: list[str] = []
        idx: list[int] = []
        for metric in METRIC_ORDER:
            keys = _KEYS_OF_METRIC[metric]
            points: list[str] = []
            for row in rows:
                for k in keys:
                    if not sim.on[row, k]:
                        continue
                    s = SERIES[k]
                    value = '"asInt":"%d"}' if s.as_int else f'"asDouble":%.{s.decimals}f}}'
                    start = ""
                    if s.is_sum:
                        at = sim.start_override.get((row, k), sim.node_start[node.index])
                        start = f'"startTimeUnixNano":"{at}",'
                    head = '{"attributes":' + self.point_attrs(row, k) + "," + start
                    points.append(head + '"timeUnixNano":"' + _STAMP + '",' + value)
                    idx.append(row * ncols + k)
            if points:
                metrics.append(_METRIC_HEAD[metric] + ",".join(points) + "]}}")
        head = (
            '{"resourceMetrics":[{"resource":{"attributes":['
            + _attr(cv.K8S_NODE_NAME_ATTR, node.name).replace("%", "%%")
            + ","
            + _attr(cv.SERVICE_NAME_ATTR, SERVICE_NAME)
            + ']},"scopeMetrics":[{"scope":{"name":"'
            + SCOPE_NAME
            + '","version":"1"},"metrics":['
        )
        text = head + ",".join(metrics) + "]}]}]}"
        found = self.cache[key] = Template(text.split(_STAMP), np.asarray(idx, np.intp))
        return found


def _metric_head(metric: str) -> str:
    spec = cv.METRICS[metric]
    unit = json.dumps(spec.unit).replace("%", "%%")
    if spec.instrument == cv.GAUGE:
        return '{"name":"' + metric + '","unit":' + unit + ',"gauge":{"dataPoints":['
    monotonic = "true" if spec.instrument == cv.COUNTER else "false"
    return (
        '{"name":"'
        + metric
        + '","unit":'
        + unit
        + ',"sum":{"aggregationTemporality":2,"isMonotonic":'
        + monotonic
        + ',"dataPoints":['
    )


_KEYS_OF_METRIC: Final[dict[str, tuple[int, ...]]] = {
    m: tuple(i for i, s in enumerate(SERIES) if s.metric == m) for m in METRIC_ORDER
}
_METRIC_HEAD: Final = {m: _metric_head(m) for m in METRIC_ORDER}
