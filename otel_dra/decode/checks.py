"""The metric and point checks, in their order and with their exact wording, for both encodings."""

from __future__ import annotations

import math
from typing import Final

from otel_dra import conventions as cv
from otel_dra.decode.text import Dialect, name, short

#: The metric kinds read (numbers); histograms and summaries are rejected by name.
NUMBER_KINDS: Final = ("gauge", "sum")
#: otel-dra's own telemetry that is not a device's: what an agent derives (verdicts, views, its kubelet
#: stream's gauges), its OTLP push queue's metrics, a fleet's receiver's. An agent pushes the first two
#: beside its hw.* samples; none is input (a verdict re-read as a column would make a series kind per
#: transition), and none is a mistake of the sender's.
SELF_TELEMETRY: Final = frozenset((set(cv.METRICS) - cv.SAMPLED_METRICS) | set(cv.PUSH_METRICS) | set(cv.FLEET_METRICS))


def self_telemetry(metric: object, from_agent: bool) -> bool:
    """Whether a metric's points are otel-dra's own telemetry, set aside before any check (counted in
    :attr:`DecodeResult.ignored`, never rejected): :data:`SELF_TELEMETRY` by name, whoever sent it, and
    ``hw.status`` from an agent's scope (``from_agent``), which is its verdict, not the device's own report
    (the same name from anyone else is a device's)."""
    if type(metric) is not str:
        return False
    return metric in SELF_TELEMETRY or (from_agent and metric == cv.HW_STATUS.name)


#: :func:`metric_problem`'s answer for a metric this project doesn't know: counted per name, reported once.
UNKNOWN: Final = ""


def metric_problem(
    dialect: Dialect,
    metric: str | None,
    kind: str | None,
    n: int,
    node: str,
    *,
    delta: bool = False,
    points_listed: bool = True,
) -> str | None:
    """Why a metric's ``n`` points are all skipped (None: they are read point by point; :data:`UNKNOWN`:
    an unknown metric). ``metric`` None: it has no name; ``kind`` None: no data field at all;
    ``points_listed`` False: its data points are not a list (JSON only); ``delta``: a delta sum.
    Asked only of metrics that are not :func:`self_telemetry` (those are set aside first)."""
    if metric is None:
        return f"a metric of node {name(node)} has no name ({dialect.count(n)} points skipped)"
    if metric not in cv.METRICS:
        return UNKNOWN
    if kind is None:
        return f"{metric} has no gauge or sum; skipped"
    if kind not in NUMBER_KINDS:
        return f"{metric} is a {kind}, not a gauge or sum ({dialect.count(n)} points skipped)"
    if not points_listed:
        return f"{metric} has dataPoints that are not a list; skipped"
    if delta:
        return f"{metric} is a delta sum; only cumulative sums are read ({dialect.count(n)} points skipped)"
    return None


def unknown_problem(dialect: Dialect, metric: str, n: int) -> str:
    """The one report of an unknown metric's points (all its points in the request together)."""
    return f"unknown metric {short(metric)} ({dialect.count(n)} points) skipped"


def value_problem(dialect: Dialect, device: str, field: str, value: float | None, counter: bool) -> str | None:
    """Why a point's value is not taken (None: it is): absent, not finite, negative on a counter."""
    if value is None:
        return f"({device}) has no value ({dialect.double} or {dialect.int})"
    if math.isnan(value):
        return f"({device}) has {field} NaN"
    if math.isinf(value):
        return f"({device}) has {field} {'Infinity' if value > 0 else '-Infinity'}"
    if counter and value < 0.0:
        return f"({device}) is {value:g} on a counter (cumulative, monotonic)"
    return None


def time_problem(node: str, t: int, floor: int, ceiling: int | None, max_future_ns: int) -> str | None:
    """Why a point's (valid) time is not taken (None: it is): too far ahead of the receiver's clock
    (``ceiling``: the latest time taken, None: no bound), or older than its series' newest (``floor``;
    0 or less: none read yet)."""
    if ceiling is not None and t > ceiling:
        ahead_s = (t - ceiling + max_future_ns) / 1e9
        return (
            f"on node {name(node)} is at {t}, {ahead_s:,.0f} s ahead of this receiver's clock (more than "
            f"{max_future_ns / 1e9:g} s): check that node's clock"
        )
    if floor > 0 and t < floor:
        return f"on node {name(node)} is at {t}, older than {floor} already read for that series"
    return None


def point_problem(
    dialect: Dialect,
    device: str,
    t: int,
    value: float | None,
    counter: bool,
    node: str,
    floor: int,
    ceiling: int | None,
    max_future_ns: int,
) -> str:
    """Why a point with a good target is not taken ("" when it is), for an encoding whose time is a
    plain integer (0: absent): its time, then its value, then time order."""
    if t == 0:
        return f"({device}) has no {dialect.time}"
    return (
        value_problem(dialect, device, dialect.double, value, counter)
        or time_problem(node, t, floor, ceiling, max_future_ns)
        or ""
    )
