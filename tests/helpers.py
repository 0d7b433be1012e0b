"""Test helpers: collect what the agent's pipeline emits with the SDK's in-memory reader."""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum

from otel_dra import __version__
from otel_dra.frame import Frame, Schema
from otel_dra.sinks import provider
from otel_dra.sinks.metrics import MetricsSink
from otel_dra.store import FrameStore


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


def collect(frame: Frame, schema: Schema, limit: int = 2000) -> tuple[list[Point], dict]:
    """Run ``frame`` through the real metrics sink and SDK; return the points and resource attributes."""
    store = FrameStore()
    store.put(frame, time.monotonic_ns())
    reader = InMemoryMetricReader()
    mp = provider.build_meter_provider(frame.devices.node, [reader], limit)
    MetricsSink(store, schema, mp.get_meter("otel_dra", __version__), max_age_s=3600.0)
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
