"""Sink: the store's newest frame as OpenTelemetry observable instruments.

One asynchronous instrument per metric of :mod:`otel_dra.conventions`; on every
collection (a Prometheus scrape, an OTLP export) its callback turns the frame's
columns for that metric into observations. Attribute dictionaries are built once
per device table and column and reused, so a collection only pairs values with
ready-made attributes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_dra import conventions as cv
from otel_dra.frame import DeviceTable, Frame, Schema
from otel_dra.sinks._mapping import series_attributes
from otel_dra.state import FrameStore


class HealthSource(Protocol):
    """Where the derived health per device comes from (the verdict board)."""

    version: int

    def health_by_device(self) -> dict[tuple[str, str], str]: ...


class MetricsSink:
    """Exposes the newest fresh frame through ``meter``'s instruments."""

    def __init__(
        self,
        store: FrameStore,
        schema: Schema,
        meter: Meter,
        max_age_s: float,
        exclude: Iterable[str] = (),
        health: HealthSource | None = None,
    ) -> None:
        """Instruments for the sampled (``hw.*``) metrics; ``exclude``: those another sink owns (the
        verdict sink's ``hw.status``). ``health``:
        with ``--health-attribute=all``, stamps ``dra.device.health.state`` on every series."""
        self._store = store
        self._schema = schema
        self._max_age_ns = int(max_age_s * 1e9)
        self._groups: dict[str, np.ndarray] = {}
        self._groups_len = -1
        self._table: DeviceTable | None = None
        self._attrs: dict[int, list[dict[str, str]]] = {}
        self._health = health
        self._health_version = -1
        self._health_map: dict[tuple[str, str], str] = {}
        create: dict[str, Callable[..., object]] = {
            cv.COUNTER: meter.create_observable_counter,
            cv.UPDOWNCOUNTER: meter.create_observable_up_down_counter,
            cv.GAUGE: meter.create_observable_gauge,
        }
        skip = set(exclude) | (set(cv.METRICS) - cv.SAMPLED_METRICS)
        self._skip = skip
        for spec in cv.METRICS.values():
            if spec.name in skip:
                continue
            create[spec.instrument](
                spec.name,
                callbacks=[self._callback(spec.name)],
                unit=spec.unit,
                description=spec.description,
            )

    def _callback(self, metric: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            frame = self._store.latest(time.monotonic_ns(), self._max_age_ns)
            return () if frame is None else self.observations(frame, metric)

        return observe

    def _columns(self, metric: str) -> np.ndarray:
        if self._groups_len != len(self._schema):
            self._groups = self._schema.by_metric()
            self._groups_len = len(self._schema)
        return self._groups.get(metric, np.empty(0, dtype=np.intp))

    def _column_attrs(self, table: DeviceTable, col: int) -> list[dict[str, str]]:
        if table is not self._table:
            self._table, self._attrs = table, {}
        if self._health is not None and self._health.version != self._health_version:
            self._health_version = self._health.version
            self._health_map = self._health.health_by_device()
            self._attrs = {}
        attrs = self._attrs.get(col)
        if attrs is None:
            column = self._schema.columns[col]
            attrs = [series_attributes(dev, a, column) for dev, a in zip(table.ids, table.attrs, strict=True)]
            if self._health is not None:
                for dev, series in zip(table.ids, attrs, strict=True):
                    state = self._health_map.get((table.node, dev))
                    if state is not None:
                        series[cv.DRA_DEVICE_HEALTH_STATE] = state
            self._attrs[col] = attrs
        return attrs

    def observations(self, frame: Frame, metric: str) -> list[Observation]:
        """The frame's series of ``metric``: every (device, column) with a value."""
        if metric in self._skip:
            return []
        cols = self._columns(metric)
        cols = cols[cols < frame.values.shape[1]]
        if cols.size == 0:
            return []
        block = frame.values[:, cols]
        rows, which = np.nonzero(~np.isnan(block))
        if rows.size == 0:
            return []
        values = block[rows, which].tolist()
        per_col = [self._column_attrs(frame.devices, int(c)) for c in cols]
        return [Observation(v, per_col[j][r]) for v, r, j in zip(values, rows.tolist(), which.tolist(), strict=True)]
