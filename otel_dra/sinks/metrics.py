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

import numpy as np
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_dra import conventions as cv
from otel_dra.frame import DeviceTable, Frame, Schema
from otel_dra.sinks._mapping import series_attributes
from otel_dra.store import FrameStore


class MetricsSink:
    """Exposes the newest fresh frame through ``meter``'s instruments."""

    def __init__(self, store: FrameStore, schema: Schema, meter: Meter, max_age_s: float) -> None:
        self._store = store
        self._schema = schema
        self._max_age_ns = int(max_age_s * 1e9)
        self._groups: dict[str, np.ndarray] = {}
        self._groups_len = -1
        self._table: DeviceTable | None = None
        self._attrs: dict[int, list[dict[str, str]]] = {}
        create: dict[str, Callable[..., object]] = {
            cv.COUNTER: meter.create_observable_counter,
            cv.UPDOWNCOUNTER: meter.create_observable_up_down_counter,
            cv.GAUGE: meter.create_observable_gauge,
        }
        for spec in cv.METRICS.values():
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
        attrs = self._attrs.get(col)
        if attrs is None:
            column = self._schema.columns[col]
            attrs = [series_attributes(dev, a, column) for dev, a in zip(table.ids, table.attrs, strict=True)]
            self._attrs[col] = attrs
        return attrs

    def observations(self, frame: Frame, metric: str) -> list[Observation]:
        """The frame's series of ``metric``: every (device, column) with a value."""
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
