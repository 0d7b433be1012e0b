"""Series identity: which device and column a point of (metric, attribute set) lands in, and the
descriptive attributes it carries. One place, so both encodings agree."""

from __future__ import annotations

from collections.abc import Callable

from otel_dra import conventions as cv
from otel_dra.decode import limits as lim
from otel_dra.decode.attributes import DESCRIPTIVE, NO_ATTRIBUTES
from otel_dra.decode.caps import Refusal
from otel_dra.decode.limits import DEFAULT_LIMITS, DecodeLimits, shorten
from otel_dra.decode.text import name
from otel_dra.frame import Column, Schema, attrs_of
from otel_dra.vocabulary import SENSOR_TYPES

#: Where a point goes: (device index, column index, descriptive set index or -1 for none).
Target = tuple[int, int, int]
#: Says whether a device may be added to the node being read: None (it may, and now it is), or the refusal.
Admit = Callable[[str], "Refusal | None"]


class SeriesIndex:
    """Devices and descriptive attribute sets, interned, and the identity rules that map a point's
    (metric, attributes) to them (``semconv/registry.yaml``): one place, so both encodings agree."""

    def __init__(self, schema: Schema, limits: DecodeLimits = DEFAULT_LIMITS) -> None:
        self.schema = schema
        self.limits = limits
        self.dev_index: dict[str, int] = {}
        self.dev_names: list[str] = []
        self.descr_index: dict[tuple[tuple[str, str], ...], int] = {}
        self.descrs: list[tuple[tuple[str, str], ...]] = []

    @property
    def size(self) -> int:
        """What the index holds (its caller bounds it by dropping the whole index)."""
        return max(len(self.dev_names), len(self.descrs))

    def device(self, dev: int) -> str:
        """A device's name as it goes into a message."""
        return name(self.dev_names[dev])

    def target(self, metric: str, attrs: dict[str, str], admit: Admit | None = None) -> Target | str | Refusal:
        """Where a point of ``metric`` with ``attrs`` goes; or why it can't go anywhere (a string), or
        the cap that refuses it (a :class:`Refusal`: an identity attribute too long, a series kind or,
        through ``admit``, a device too many). A sensor (``hw.parent`` set) folds into its parent's row
        as its own column; a device keeps its descriptive attributes, shortened to the length cap.
        A device is interned only once admitted, so refused devices cost no state. The column is the metric
        and its series attributes (``conventions.SERIES_ATTRIBUTES``, a closed set per metric); any other
        attribute is ignored, never a column of its own (the point is taken)."""
        hw_id = attrs.get(cv.HW_ID)
        if not hw_id:
            return f"has no {cv.HW_ID}"
        cap = self.limits.max_attribute_length
        parent = attrs.get(cv.HW_PARENT)
        hw_type = attrs.get(cv.HW_TYPE)
        series = cv.SERIES_ATTRIBUTES.get(metric, NO_ATTRIBUTES)
        rest = attrs_of({k: v for k, v in attrs.items() if k in series}) if series else ()
        if (
            len(hw_id) > cap
            or (parent is not None and len(parent) > cap)
            or (parent and hw_type is not None and len(hw_type) > cap)
            or any(len(k) > cap or len(v) > cap for k, v in rest)
        ):
            return Refusal(lim.ATTRIBUTE_LENGTH, metric, metric)
        if parent:
            if not hw_type:
                return f"({name(hw_id)}) has {cv.HW_PARENT} but no {cv.HW_TYPE}"
            device = parent
        else:
            if hw_type in SENSOR_TYPES:
                return f"({name(hw_id)}) is a {hw_type} sensor without {cv.HW_PARENT}"
            device = hw_id
        if admit is not None:  # before the series cap: each refusal stays what it was when the point repeats
            refused = admit(device)
            if refused is not None:
                return refused
        descr = -1
        pairs: tuple[tuple[str, str], ...] = ()
        if parent:
            assert hw_type  # checked above
            prefix = parent + "/"
            sensor = hw_id[len(prefix) :] if hw_id.startswith(prefix) and len(hw_id) > len(prefix) else hw_id
            column = Column(metric, rest, sensor, hw_type)
        else:
            column = Column(metric, rest)
            pairs = tuple((k, shorten(attrs[k], cap)) for k in DESCRIPTIVE if k in attrs)
        col = self.schema.find(column)
        if col is None and len(self.schema) >= self.limits.max_series:
            return Refusal(lim.SERIES, column, metric, device)
        if pairs:
            descr = self.descr_index.get(pairs, -1)
            if descr < 0:
                descr = self.descr_index[pairs] = len(self.descrs)
                self.descrs.append(pairs)
        dev = self.dev_index.get(device)
        if dev is None:
            dev = self.dev_index[device] = len(self.dev_names)
            self.dev_names.append(device)
        return dev, self.schema.index(column) if col is None else col, descr
