"""Test helpers: collect what the agent's pipeline emits with the SDK's in-memory reader."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum

from otel_dra import __version__
from otel_dra.frame import Frame, Schema
from otel_dra.sinks import provider
from otel_dra.sinks.kubelet import KubeletHealthServer
from otel_dra.sinks.metrics import MetricsSink
from otel_dra.sinks.verdict_metrics import VERDICT_METRICS, VerdictMetrics
from otel_dra.state import FrameStore, VerdictBoard


@dataclass(frozen=True)
class Point:
    metric: str
    unit: str
    kind: str  # counter | updowncounter | gauge, as the semconv model names them
    attrs: dict
    value: float


def kind_of(data: object) -> str:
    if isinstance(data, Sum):
        return "counter" if data.is_monotonic else "updowncounter"
    assert isinstance(data, Gauge), type(data)
    return "gauge"


def collect(
    frame: Frame, schema: Schema, limit: int = 2000, board: VerdictBoard | None = None, health_all: bool = False
) -> tuple[list[Point], dict]:
    """Run ``frame`` through the real metric sinks and SDK; return the points and resource attributes.

    Without a ``board``, ``hw.status`` is the source's own column (as an input would carry it);
    with one, it is the verdict, as the agent emits it."""
    store = FrameStore()
    store.put(frame, time.monotonic_ns())
    reader = InMemoryMetricReader()
    mp = provider.build_meter_provider(frame.devices.node, [reader], limit)
    meter = mp.get_meter("otel_dra", __version__)
    if board is None:
        MetricsSink(store, schema, meter, max_age_s=3600.0)
    else:
        MetricsSink(store, schema, meter, 3600.0, exclude=VERDICT_METRICS, health=board if health_all else None)
        VerdictMetrics(board, meter)
        KubeletHealthServer("/nonexistent/never-started.sock", board, meter=meter)  # its gauges read the board
    data = reader.get_metrics_data()
    mp.shutdown()
    points: list[Point] = []
    resource: dict = {}
    for rm in data.resource_metrics:
        resource = dict(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    points.append(Point(m.name, m.unit, kind_of(m.data), dict(p.attributes), p.value))
    return points, resource


def resident_bytes() -> int:
    """This process's resident set (``/proc/self/statm``), in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def freed_inside_the_heap(total: int = 192 << 20, piece: int = 96 << 10) -> list[bytearray]:
    """``total`` bytes in pieces under glibc's mmap threshold (so in its heap), written, then freed; a small
    piece kept after each (over Python's 512-byte small-object limit: from glibc's heap too), so the freed
    pages are in the middle of the heap (glibc gives back only its top by itself). Returns what is kept."""
    pieces, kept = [], []
    for _ in range(total // piece):
        pieces.append(bytearray(b"\x01") * piece)
        kept.append(bytearray(b"\x02") * 1024)
    del pieces
    return kept
