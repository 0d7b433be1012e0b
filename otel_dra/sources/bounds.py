"""The agent's own sources are bounded like the decoders' input (:mod:`otel_dra.decode.limits`).

A node whose sysfs shows thousands of devices, or a driver that reports a multi-kB model or serial
string, must not make the agent hold thousands of rows or export megabyte labels. Every frame a
source produces goes through :func:`bound_frame` (:func:`otel_dra.sources.build` wraps the source in
:class:`BoundedSource`): the first ``max_devices_per_node`` devices are kept, a device whose
``hw.id`` is longer than ``max_attribute_length`` is dropped (an identity cut short could merge two
devices), and descriptive attribute values are shortened with :func:`~otel_dra.decode.limits.shorten`.

Device tables are immutable and consumers cache per table (by identity), so the bounded table of a
table is made once and reused for as long as the source reuses its own; the rows are a numpy slice.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from otel_dra.decode.limits import DecodeLimits, shorten
from otel_dra.frame import DeviceTable, Frame, Schema

if TYPE_CHECKING:
    from otel_dra.sources import Source

log = logging.getLogger(__name__)

#: Bounded tables remembered per source: a source alternates between a few (the simulator's
#: firmware states), and each must map to the same bounded table every time.
_TABLES_KEPT: Final = 8


@dataclass(frozen=True)
class Bounds:
    """What bounding one device table did: which rows are kept and what was cut."""

    table: DeviceTable
    #: The rows kept: a slice (a view of the values) when they are the first n, else their indices.
    rows: slice | np.ndarray
    #: Devices past ``max_devices_per_node``.
    over_cap: int = 0
    #: Devices dropped because their ``hw.id`` is longer than ``max_attribute_length``.
    long_ids: int = 0
    #: Descriptive attribute values shortened.
    shortened: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.over_cap or self.long_ids or self.shortened)


def _short_attrs(attrs: Mapping[str, str], limit: int) -> tuple[Mapping[str, str], int]:
    """``attrs`` with every value over ``limit`` shortened (the same mapping when none is), and how many were."""
    long = sum(1 for v in attrs.values() if len(v) > limit)
    if not long:
        return attrs, 0
    return {k: shorten(v, limit) for k, v in attrs.items()}, long


def bound_table(table: DeviceTable, limits: DecodeLimits) -> Bounds:
    """The bounded form of ``table`` (the table itself when it is within ``limits``)."""
    cap, limit = limits.max_devices_per_node, limits.max_attribute_length
    ok = [i for i, dev in enumerate(table.ids) if len(dev) <= limit]
    long_ids = len(table) - len(ok)
    over_cap = max(0, len(ok) - cap)
    kept = ok[:cap]
    rows: slice | np.ndarray = slice(0, len(kept)) if not long_ids else np.asarray(kept, dtype=np.intp)
    ids, attrs = table.ids, table.attrs
    if long_ids or over_cap:
        ids = tuple(ids[i] for i in kept)
        attrs = tuple(attrs[i] for i in kept)
    shortened = 0
    if any(len(v) > limit for a in attrs for v in a.values()):
        pairs = [_short_attrs(a, limit) for a in attrs]
        attrs = tuple(a for a, _ in pairs)
        shortened = sum(n for _, n in pairs)
    if not (long_ids or over_cap or shortened):
        return Bounds(table, rows)
    return Bounds(DeviceTable(table.node, ids, attrs), rows, over_cap, long_ids, shortened)


def bound_frame(frame: Frame, limits: DecodeLimits, bounds: Bounds | None = None) -> Frame:
    """``frame`` within ``limits``: at most ``max_devices_per_node`` rows, no value longer than
    ``max_attribute_length``. The frame itself when it already is; ``bounds``: its table's,
    when the caller has them (:class:`BoundedSource` keeps them per table)."""
    b = bounds if bounds is not None else bound_table(frame.devices, limits)
    if not b.changed:
        return frame
    return Frame(frame.time_unix_nano, b.table, frame.values[b.rows])


class BoundedSource:
    """A source whose every frame goes through :func:`bound_frame`; what it drops or cuts is
    logged once per change of its device table, not once per pass."""

    def __init__(self, source: Source, limits: DecodeLimits | None = None) -> None:
        self.source = source
        self.name: str = source.name
        self.schema: Schema = source.schema
        self.limits = limits if limits is not None else DecodeLimits()
        self._bounds: OrderedDict[int, tuple[DeviceTable, Bounds]] = OrderedDict()  # id(table) -> (table, bounds)
        self._said: tuple[int, int, int] = (0, 0, 0)

    def __getattr__(self, attr: str) -> Any:
        """Anything else is the wrapped source's (its handles, its settings)."""
        if attr == "source":  # not set yet: don't recurse
            raise AttributeError(attr)
        return getattr(self.source, attr)

    def bounds(self, table: DeviceTable) -> Bounds:
        """``table``'s bounds, made once per table (the same bounded table each pass)."""
        key = id(table)
        found = self._bounds.get(key)
        if found is not None and found[0] is table:
            self._bounds.move_to_end(key)
            return found[1]
        b = bound_table(table, self.limits)
        self._bounds[key] = (table, b)  # the table is kept, so its id is not reused while remembered
        while len(self._bounds) > _TABLES_KEPT:
            self._bounds.popitem(last=False)
        self._tell(table, b)
        return b

    def _tell(self, table: DeviceTable, b: Bounds) -> None:
        said = (b.over_cap, b.long_ids, b.shortened)
        if said == self._said:
            return
        self._said = said
        if b.over_cap:
            log.warning(
                "source %s: node %s shows %s devices; keeping the first %s (max_devices_per_node), dropping %s",
                self.name,
                table.node,
                f"{len(table) - b.long_ids:,}",
                f"{self.limits.max_devices_per_node:,}",
                f"{b.over_cap:,}",
            )
        if b.long_ids:
            log.warning(
                "source %s: dropping %s device(s) whose hw.id is longer than %s characters (max_attribute_length)",
                self.name,
                f"{b.long_ids:,}",
                f"{self.limits.max_attribute_length:,}",
            )
        if b.shortened:
            log.warning(
                "source %s: shortened %s attribute value(s) longer than %s characters (max_attribute_length)",
                self.name,
                f"{b.shortened:,}",
                f"{self.limits.max_attribute_length:,}",
            )

    def read(self, now_unix_nano: int) -> Frame:
        frame = self.source.read(now_unix_nano)
        return bound_frame(frame, self.limits, self.bounds(frame.devices))

    def close(self) -> None:
        self.source.close()
