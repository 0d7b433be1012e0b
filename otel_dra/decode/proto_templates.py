"""The protobuf decoder's templates: a section (one ResourceMetrics) already decoded, kept so that the
same section with new times and values is read as arrays (see :mod:`~otel_dra.decode.otlp_proto`): what
a template holds (:class:`Template`, :class:`Layout`), how it is built from a scanned section
(:func:`build_template`) and the store that keeps them (:class:`Templates`, least recently used first)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

import numpy as np
import xxhash

from otel_dra.decode.assembly import scatter
from otel_dra.decode.caps import Tally
from otel_dra.decode.checks import NUMBER_KINDS
from otel_dra.decode.floors import SeriesFloors, series_keys
from otel_dra.decode.proto_scan import Scan
from otel_dra.decode.proto_wire import DOUBLE, INT, NONE, Bail, template_key, walk_section
from otel_dra.frame import DeviceTable

#: Bytes of templates kept (about 20 kB per node of 8 GPUs: some 25,000 nodes); the least recently used go first.
MAX_TEMPLATE_BYTES: Final = 512 << 20
#: Templates kept per (resource, section length): a node alternating between a few shapes.
MAX_TEMPLATES_PER_KEY: Final = 2
#: A template unused this long (by the decoder's clock) is dropped: its node is gone, or renamed (node names
#: churn in autoscaled clusters, and each would otherwise hold its ~20 kB until ``max_template_bytes``).
TEMPLATE_IDLE_NS: Final = 15 * 60 * 10**9

#: After this many misses in a row for one key, stop building templates for it (a section whose bytes change
#: in more than values, e.g. a histogram) and only retry every ``_RETRY_EVERY`` requests.
_MISS_STREAK: Final = 3
_RETRY_EVERY: Final = 64
#: A template that refused nothing: one empty tally for all, never added to.
NO_TALLY: Final = Tally()


@dataclass(slots=True)
class Layout:
    """Where a list of points lands in a frame: the device table, and the cell (row * ncols + column) of
    each kept point in a frame ``ncols`` wide (re-cut when the schema has grown)."""

    table: DeviceTable
    flat: np.ndarray
    ncols: int
    keep: np.ndarray | None  # indices of the points kept (duplicates: the last wins); None = all, in order

    def recut(self, ncols: int, share: Callable[[np.ndarray], np.ndarray]) -> None:
        """The cells in a frame ``ncols`` wide (the schema grew), through ``share``."""
        if self.ncols != ncols:
            rows, cols = np.divmod(self.flat.astype(np.int64), self.ncols)
            self.flat, self.ncols = share((rows * ncols + cols).astype(np.int32)), ncols

    def fill(self, values: np.ndarray, ncols: int) -> np.ndarray:
        if self.ncols != ncols:
            self.recut(ncols, lambda flat: flat)
        return scatter(len(self.table), ncols, self.flat, values if self.keep is None else values[self.keep])


@dataclass(slots=True)
class Template:
    """A section already decoded: the digest of its bytes with the value payloads zeroed, and where
    each point goes. A digest rather than the bytes themselves: a fleet's templates would otherwise
    hold a copy of every node's last request (100 kB for 8 GPUs). XXH3-128 makes an accidental false
    match as unlikely as a hardware error (2^-128) and costs about 2 µs for such a request, where SHA-256
    cost 90 µs, half of decoding it. It is not collision-resistant against a crafted request, and needs
    not be: a section read from a template is taken only from a client that may speak for the template's
    node (``_may_speak``), and its values go to that node's devices, which such a client may report for
    with a request of its own anyway."""

    digest: bytes
    steps: np.ndarray  # where each 8-byte payload zeroed (start time, time, value of each point) starts: the
    # first's offset, then each one's distance from the one before (uint16 when they fit: see holes)
    node: str | None
    points: int
    rejected: int
    ignored: int
    stray: int
    problems: tuple[tuple[int, str], ...]
    unknown: tuple[tuple[int, str, int], ...]
    tally: Tally  # points refused by the caps: they stay refused while the node's devices are these
    generation: int  # the node's admission its devices were counted in; -1: a node refused (or none)
    # Candidates, as arrays: where each one goes and what it reads from the gathered payloads. What only
    # says how the section is laid out (holes, kinds, counters, ordinals, cells) is one array for every
    # template laid out alike (``build_template``'s ``share``: a fleet's nodes mostly are); the device
    # and column of each candidate are read off its key when needed (floors.series_parts).
    key: np.ndarray  # each candidate's series (floors.series_keys): its time order is checked per series
    # Each candidate's descriptive set: its device's (``row_descr``, by its row in the layout) where it
    # carries one (``carries``, shared), when every device has one; else all of them (``full_descr``).
    full_descr: np.ndarray | None
    carries: np.ndarray | None
    row_descr: np.ndarray | None
    counter: np.ndarray
    any_counter: bool
    time_hole: np.ndarray  # index into holes, -1: no time field (zero)
    value_hole: np.ndarray | None  # index into holes, -1: no value; None when simple (then time_hole + 1)
    kind: np.ndarray  # NONE, DOUBLE, INT
    simple: bool  # every candidate has a time and a double value, right after its time
    layout: Layout | None  # where the candidates land when all of them are good and share one time
    # For messages only: each candidate's position in the section; the first position of each metric with
    # candidates, and its name (a candidate's metric is the last to start at or before it).
    ordinal: np.ndarray
    blocks: np.ndarray
    names: tuple[str, ...]
    # Where its candidates' series are in its node's SeriesFloors, while that holds the same series (a cache).
    places: np.ndarray | None = None
    places_of: SeriesFloors | None = None
    places_version: int = -1

    @property
    def descr(self) -> np.ndarray:
        """Each candidate's descriptive set (-1: none)."""
        if self.full_descr is not None:
            return self.full_descr
        assert self.layout is not None and self.carries is not None and self.row_descr is not None
        rows = self.layout.flat // self.layout.ncols
        return np.where(self.carries, self.row_descr[rows], -1).astype(np.int32)

    @property
    def holes(self) -> np.ndarray:
        """The start of every payload zeroed, from the section's start (made per request, kept as small steps:
        ``add.accumulate`` itself, not ``np.cumsum``'s wrapper, which cost half again on a node's 856 holes)."""
        return np.add.accumulate(self.steps, dtype=np.intp)

    def where(self, i: int) -> str:
        """Candidate ``i`` as a message names it: ``point <n> of <metric>``."""
        b = int(np.searchsorted(self.blocks, self.ordinal[i], side="right")) - 1
        return f"point {int(self.ordinal[i]) - int(self.blocks[b]) + 1} of {self.names[b]}"

    @property
    def nbytes(self) -> int:
        """What this template holds (counting shared arrays too: a bound, not an exact figure)."""
        arrays = (self.steps, self.key, self.counter, self.time_hole, self.kind, self.ordinal)
        holes = 0 if self.value_hole is None else self.value_hole.nbytes
        holes += self.full_descr.nbytes if self.full_descr is not None else self.key.nbytes // 8
        layout = 0 if self.layout is None else self.layout.flat.nbytes
        places = self.key.nbytes // 2  # (filled in on first use: counted from the start, so the sum stays put)
        return (
            sum(a.nbytes for a in arrays)
            + holes
            + places
            + layout
            + 100 * (len(self.problems) + len(self.names))
            + 1024
        )


#: Equal read-only arrays as one object (:meth:`~otel_dra.decode.assembly.SharedArrays.share`).
Share = Callable[[np.ndarray], np.ndarray]
#: Where points land: the decoder's layout of (node, devices, columns, descriptive sets).
LayoutOf = Callable[[str, np.ndarray, np.ndarray, np.ndarray], Layout]
#: Where to look for a section's template (:func:`~otel_dra.decode.proto_wire.template_key`).
Key = tuple[int, int]


def _words(buf: bytearray) -> np.ndarray:
    """The little-endian 8-byte word at every byte offset of ``buf`` (a view: writing a word writes its bytes),
    so that payloads at unaligned offsets are read and zeroed by one index each, not eight."""
    return np.ndarray((max(0, len(buf) - 7),), "<u8", buf, 0, (1,))


class Templates:
    """The templates kept, a few per :data:`Key`, least recently used first, bounded by ``max_bytes`` and by
    idleness (:meth:`sweep`); a key whose sections keep missing (bytes that change in more than values, e.g.
    a histogram) is only retried now and then."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._kept: dict[Key, list[Template]] = {}
        self._used: dict[Key, int] = {}  # key -> when (clock) a template of it was last used
        self._streak: dict[Key, int] = {}  # key -> templates built for it in a row without a match

    def __len__(self) -> int:
        return len(self._kept)

    def values(self) -> Iterator[list[Template]]:
        return iter(self._kept.values())

    def find(
        self, data: bytes, start: int, end: int, generation: dict[str, int]
    ) -> tuple[Key, Template, np.ndarray] | None:
        """The template a section matches, with its payloads as 8-byte words (None: none matches). A
        template of a node forgotten since (``generation``: each admitted node's) is not looked at: its
        devices are counted again, the plain way."""
        key = template_key(data, start, end)
        candidates = self._kept.get(key)
        if candidates is None:
            return None
        section = memoryview(data)[start:end]
        for tmpl in candidates:
            if tmpl.generation >= 0 and generation.get(tmpl.node or "") != tmpl.generation:
                continue
            copy = bytearray(section)
            words = _words(copy)
            holes = tmpl.holes
            raw = words[holes]
            words[holes] = 0
            if xxhash.xxh3_128_digest(copy) == tmpl.digest:
                return key, tmpl, raw
        return None

    def hit(self, key: Key, now: int) -> None:
        """A template of ``key`` was used: most recently used last."""
        self._kept[key] = self._kept.pop(key)
        self._used[key] = now
        self._streak.pop(key, None)

    def wanted(self, key: Key) -> bool:
        """Whether to build a template of a section of ``key`` that matched none: after a few misses in a
        row, only every so often."""
        streak = self._streak.get(key, 0)
        if key in self._kept or streak:
            self._streak[key] = streak + 1
            if streak + 1 >= _MISS_STREAK and (streak + 1) % _RETRY_EVERY:
                return False
        return True

    def keep(self, key: Key, tmpl: Template, now: int) -> None:
        """A template built: first of its key's, the least recently used dropped past ``max_bytes``."""
        kept = self._kept.pop(key, [])
        kept.insert(0, tmpl)
        self.nbytes += tmpl.nbytes
        for old in kept[MAX_TEMPLATES_PER_KEY:]:
            self.nbytes -= old.nbytes
        self._kept[key] = kept[:MAX_TEMPLATES_PER_KEY]
        self._used[key] = now
        while self.nbytes > self.max_bytes and self._kept:
            oldest = next(iter(self._kept))
            self.nbytes -= sum(t.nbytes for t in self._kept.pop(oldest))
            self._streak.pop(oldest, None)
            self._used.pop(oldest, None)

    def sweep(self, now: int) -> None:
        """Drop the templates unused for TEMPLATE_IDLE_NS."""
        while self._kept:
            oldest = next(iter(self._kept))
            if now - self._used.get(oldest, now) <= TEMPLATE_IDLE_NS:
                break
            self.nbytes -= sum(t.nbytes for t in self._kept.pop(oldest))
            self._used.pop(oldest, None)
        self._streak = {k: n for k, n in self._streak.items() if k in self._kept}


def _payloads(data: bytes, start: int, end: int, scan: Scan) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """The walker's offsets matched with upb's reading of the same bytes: where every payload zeroed starts
    (from the section's start), and each candidate's (time hole, value hole, value kind), holes by index."""
    walked = walk_section(data, start, end)
    if [(kind, len(points)) if kind in NUMBER_KINDS else kind for kind, points in walked] != [
        (kind, n) if kind in NUMBER_KINDS else kind for kind, n, _ in scan.shape
    ]:
        raise Bail
    holes: list[int] = []
    at: dict[int, tuple[int, int, int]] = {}  # ordinal -> (time hole, value hole, kind)
    ordinal = 0
    for (kind, points), (_, n, ignored) in zip(walked, scan.shape, strict=True):
        if kind not in NUMBER_KINDS:
            ordinal += 0 if ignored else n
            continue
        for start_off, time_off, double_off, int_off in points:
            if start_off >= 0:
                holes.append(start_off - start)
            time_hole = value_hole = -1
            if time_off >= 0:
                time_hole = len(holes)
                holes.append(time_off - start)
            value_kind = DOUBLE if double_off >= 0 else INT if int_off >= 0 else NONE
            if value_kind != NONE:
                value_hole = len(holes)
                holes.append((double_off if value_kind == DOUBLE else int_off) - start)
            if not ignored:  # an ignored metric's payloads vary too: zeroed, never read
                at[ordinal] = (time_hole, value_hole, value_kind)
                ordinal += 1
    wheres = [at[c.ordinal] for c in scan.candidates]
    for c, (_, _, value_kind) in zip(scan.candidates, wheres, strict=True):
        which = c.point.WhichOneof("value")
        if value_kind != (NONE if which is None else DOUBLE if which == "as_double" else INT):
            raise Bail
    return np.asarray(holes, np.int32), wheres


def _by_row(
    layout: Layout | None, descr: np.ndarray, share: Share, pack: Share
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """A template's descriptive sets as (full_descr, carries, row_descr): each device's set once, by its row,
    where every point of a device that carries one carries the same (else every point's, in full)."""
    if layout is None or layout.keep is not None:
        return descr, None, None
    rows = layout.flat // layout.ncols
    carries = descr >= 0
    row_descr = np.full(len(layout.table), -1, np.int32)
    row_descr[rows[carries]] = descr[carries]
    if (np.where(carries, row_descr[rows], -1) == descr).all():
        return None, share(carries), pack(row_descr)
    return descr, None, None


def build_template(
    data: bytes,
    start: int,
    end: int,
    scan: Scan,
    generation: int,
    layout_of: LayoutOf,
    share: Share,
    names: Callable[[tuple[str, ...]], tuple[str, ...]],
    pack: Share,
) -> Template:
    """The template of a section just scanned (``generation``: its node's admission, -1: none). What only
    says how it is laid out is shared (``share``, ``names``) with the templates laid out alike; what is its node's
    own is packed with other templates' (``pack``: :class:`~otel_dra.decode.assembly.PackedArrays`). Raises
    :class:`~otel_dra.decode.proto_wire.Bail` when its bytes can't be trusted to repeat."""
    hole_arr, wheres = _payloads(data, start, end, scan)
    masked = bytearray(memoryview(data)[start:end])
    _words(masked)[hole_arr] = 0
    cands = scan.candidates
    dev = np.asarray([c.dev for c in cands], np.int32)
    col = np.asarray([c.col for c in cands], np.int32)
    descr = np.asarray([c.descr for c in cands], np.int32)
    time_holes = np.asarray([w[0] for w in wheres], np.int32)
    value_holes = np.asarray([w[1] for w in wheres], np.int32)
    kinds = np.asarray([w[2] for w in wheres], np.int8)
    counter = np.asarray([c.counter for c in cands], bool)
    ordinals = np.asarray([c.ordinal for c in cands], np.int32)
    simple = bool(len(cands)) and bool((time_holes >= 0).all() and (kinds == DOUBLE).all())
    simple = simple and bool((value_holes == time_holes + 1).all())
    layout = layout_of(scan.node, dev, col, descr) if scan.node is not None and len(cands) else None
    blocks = dict.fromkeys((c.ordinal - c.index, c.metric) for c in cands)  # each metric's first position
    key = series_keys(dev, col)
    order = _key_order(key, dev, descr, layout)
    if order is not None:  # candidates in their series' order: the node's time floors can be this key array
        key, descr, counter, time_holes, value_holes, kinds, ordinals = (
            a[order] for a in (key, descr, counter, time_holes, value_holes, kinds, ordinals)
        )
        assert layout is not None  # (what _key_order checked)
        layout.flat = layout.flat[order]
    full_descr, carries, row_descr = _by_row(layout, descr, share, pack)
    if layout is not None:
        layout.flat = share(layout.flat)
    key = pack(key)
    steps = np.diff(hole_arr, prepend=0)
    small = len(steps) == 0 or (int(steps.min()) >= 0 and int(steps.max()) < 1 << 16)
    return Template(
        digest=xxhash.xxh3_128_digest(masked),
        steps=share(steps.astype(np.uint16 if small else np.int32)),
        node=scan.node,
        points=scan.points,
        rejected=scan.rejected,
        ignored=scan.ignored,
        stray=scan.stray,
        problems=tuple(scan.problems),
        unknown=tuple(scan.unknown),
        tally=scan.tally.frozen() if scan.tally else NO_TALLY,
        generation=generation,
        full_descr=full_descr,
        carries=carries,
        row_descr=row_descr,
        counter=share(counter),
        key=key,
        any_counter=bool(counter.any()),
        time_hole=share(time_holes),
        value_hole=None if simple else share(value_holes),
        kind=share(kinds),
        simple=simple,
        layout=layout,
        ordinal=share(ordinals),
        blocks=share(np.asarray([start for start, _ in blocks], np.int32)),
        names=names(tuple(name for _, name in blocks)),
    )


def _key_order(key: np.ndarray, dev: np.ndarray, descr: np.ndarray, layout: Layout | None) -> np.ndarray | None:
    """The order that sorts a template's candidates by series, when they may be read in any order: each
    series once (no cell written twice, no time order between them), each device with one descriptive set
    (a device's attributes merge in point order otherwise); None when they must stay in request order."""
    if layout is None or layout.keep is not None or len(key) < 2:
        return None
    order = np.argsort(key, kind="stable")
    if not (np.diff(key[order]) > 0).all():
        return None
    carried = descr >= 0
    if len(np.unique(dev[carried])) != len(np.unique(np.stack([dev[carried], descr[carried]]), axis=1).T):
        return None
    return order
