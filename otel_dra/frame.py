"""The columnar data model every stage shares: devices as rows, series kinds as columns.

A *column* is one kind of series a device can have (``hw.errors`` with
``error.type=uncorrected``; ``hw.temperature`` of its ``temp/gpu`` sensor). A
*frame* is one sampling pass: a float64 matrix ``devices x columns`` where NaN
means "not read this time". Sources produce frames, the store keeps them, sinks
turn them into OpenTelemetry series. No stage holds per-point Python objects.
"""

from __future__ import annotations

import threading
from collections.abc import ItemsView, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from otel_dra import conventions as cv

Attrs = tuple[tuple[str, str], ...]


def attrs_of(mapping: Mapping[str, str]) -> Attrs:
    """A hashable, order-independent form of an attribute mapping."""
    return tuple(sorted(mapping.items()))


class FrozenAttrs(Mapping[str, str]):
    """A device's descriptive attributes, read-only, over a tuple of (key, value) pairs (distinct keys).

    What a fleet keeps of each device's attributes: one of these, shared by its device tables, the
    classifier's registry and the verdict board, about 50 bytes over the pairs (the decoders' own, not a
    copy), where a dict of ten attributes is 350. Looking a key up reads the pairs in turn: a device has a
    dozen attributes, read when its verdict or its labels are made, not per sample."""

    __slots__ = ("_pairs",)

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self._pairs: tuple[tuple[str, str], ...] = pairs if type(pairs) is tuple else tuple(pairs)

    @classmethod
    def of(cls, mapping: Mapping[str, str]) -> FrozenAttrs:
        """``mapping`` itself when it is one, else a copy."""
        return mapping if isinstance(mapping, FrozenAttrs) else cls(tuple(mapping.items()))

    def __getitem__(self, key: str) -> str:
        for k, v in self._pairs:
            if k == key:
                return v
        raise KeyError(key)

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        for k, v in self._pairs:
            if k == key:
                return v
        return default

    def __contains__(self, key: object) -> bool:
        return any(k == key for k, _ in self._pairs)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def items(self) -> ItemsView[str, str]:
        return _PairItems(self)

    def __repr__(self) -> str:
        return f"FrozenAttrs({dict(self._pairs)!r})"

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(key, value) in order, as held: what a renderer reads whole without a lookup per key."""
        return self._pairs


class _PairItems(ItemsView[str, str]):
    """A :class:`FrozenAttrs`' items, read straight off its pairs."""

    _mapping: FrozenAttrs

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._mapping._pairs)


#: A device without descriptive attributes.
NO_ATTRS: FrozenAttrs = FrozenAttrs()


@dataclass(frozen=True)
class Column:
    """One kind of series per device.

    ``sensor`` names a child component of the device (``temp/gpu``, ``fan/0``):
    its series carry ``hw.id=<device>/<sensor>``, ``hw.type=<sensor_type>`` and
    ``hw.parent=<device>``, as the contract's identity rules ask.
    """

    metric: str
    attrs: Attrs = ()
    sensor: str | None = None
    sensor_type: str | None = None

    def __post_init__(self) -> None:
        if self.metric not in cv.METRICS:
            raise ValueError(f"column for unknown metric {self.metric!r}: declare it in otel_dra.conventions")
        if (self.sensor is None) != (self.sensor_type is None):
            raise ValueError(f"column {self.metric}: sensor and sensor_type go together")


class Schema:
    """The growing list of columns. Columns are appended, never removed or reordered,
    so a column index stays valid for the life of the process."""

    def __init__(self, columns: Iterable[Column] = ()) -> None:
        self._lock = threading.Lock()
        self._columns: list[Column] = []
        self._index: dict[Column, int] = {}
        for column in columns:
            self.index(column)

    def index(self, column: Column) -> int:
        """The column's index, appending it on first sight (a new series kind)."""
        found = self._index.get(column)
        if found is not None:
            return found
        with self._lock:
            found = self._index.get(column)
            if found is None:
                found = len(self._columns)
                self._columns.append(column)
                self._index[column] = found
            return found

    def find(self, column: Column) -> int | None:
        """The column's index, None when it has none (a lookup that adds nothing: the caps ask first)."""
        return self._index.get(column)

    def __len__(self) -> int:
        return len(self._columns)

    @property
    def columns(self) -> tuple[Column, ...]:
        return tuple(self._columns)

    def by_metric(self) -> dict[str, np.ndarray]:
        """Column indices grouped by metric name."""
        groups: dict[str, list[int]] = {}
        for i, column in enumerate(tuple(self._columns)):
            groups.setdefault(column.metric, []).append(i)
        return {metric: np.asarray(idx, dtype=np.intp) for metric, idx in groups.items()}


@dataclass(frozen=True, slots=True)
class DeviceTable:
    """Identity and descriptive attributes of a node's devices, one row each.

    Immutable: a source that sees an attribute change (a firmware update) makes a
    new table, so consumers can cache per table.
    """

    node: str
    ids: tuple[str, ...]
    attrs: tuple[Mapping[str, str], ...]  # hw.type, hw.name, hw.vendor, ..., dra.* (not hw.id)

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.attrs):
            raise ValueError("DeviceTable: ids and attrs differ in length")
        if len(set(self.ids)) != len(self.ids):
            raise ValueError(f"DeviceTable for node {self.node}: hw.id values must be unique")

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Frame:
    """One sampling pass over a node's devices."""

    time_unix_nano: int
    devices: DeviceTable
    values: np.ndarray = field(repr=False)  # float64, shape (len(devices), n_columns); NaN = missing

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape[0] != len(self.devices):
            raise ValueError(
                f"Frame values must be (devices, columns); got {self.values.shape} for {len(self.devices)} devices"
            )


def widened(values: np.ndarray, width: int) -> np.ndarray:
    """A frame's values made before the schema grew to ``width`` columns are narrower: the newer columns are absent
    (NaN); values that wide already are returned as they are."""
    if values.shape[1] == width:
        return values
    out = np.full((values.shape[0], width), np.nan)  # (np.pad's fixed cost is ten times this)
    out[:, : values.shape[1]] = values
    return out


def stacked(matrices: list[np.ndarray], width: int) -> np.ndarray:
    """Frames' values one after another, ``(their rows, width)``: each :func:`widened` where the schema grew since it
    was made (one as it is, when it is the only one and as wide)."""
    if not matrices:
        return np.zeros((0, width))
    try:
        values = matrices[0] if len(matrices) == 1 else np.concatenate(matrices)
    except ValueError:  # frames of different widths: each padded to the schema's
        values = np.concatenate([widened(m, width) for m in matrices])
    return widened(values, width)
