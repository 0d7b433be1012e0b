"""The JSON decoder's templates: a line already read, by everything in it but its points' times and values, so that
a node's next line like it (the same series in the same order: only the times and values moved) is read off the
template, with no tokenizing, no parse and no walk: one regex split of the line gives its points' time and value
texts, and the pieces between them (its attribute lists among them), whose digest must be the template's. A request
of several nodes' resources (a Collector's batch, as its ``file`` exporter writes it: a different mix of nodes in
each line) is cut where each resource starts (:func:`resources_of`), and each resource is read off its own template:
the line holds them side by side, so it is read as the walk would read it when each one is (a template of a resource
is made only of a piece that is a JSON object on its own, one of as many as the walk read resources). A point's
fields are read in the orders writers put them: ``timeUnixNano`` then ``asInt``/``asDouble`` (protobuf's field order,
which the Collector's file exporter keeps), with ``startTimeUnixNano`` before them or between (a time the decoder
does not read; between, it is left out of the digest). A line whose points' fields come in another order is walked.

Sound because the pieces between the texts are the template's exact bytes, and the texts are a JSON number, or a
string of digits where the template had one: the line is then valid JSON whenever the template's was, with the same
objects, keys and arrays in the same places, so its walk would meet the same points, in the same order, with the
same entries, and read them as the template's walk did (the fast path). What the walk does besides is done by the
decoder alike: each node admitted, and the first point of each (node, time) checked as the walk's slow path checks
it. Anything the walk would say something about (a value not finite, a negative counter, a time out of range or past
the receiver's bound, a device refused) sends the line down the walk, which says it. A template is made only of a
line whose walk found nothing to say: every point taken, none skipped or set aside, and each time and value the split
found the walk's point's, in the walk's order, each time's text after a ``"timeUnixNano"`` key (no text that only
looks like a point's fields, in a key of an attribute list, beside a point or in its start time, is taken for one).

A value reads as the walk reads it, whichever of ``asInt`` and ``asDouble`` holds it: an ``asInt`` string's text by
``float``; an ``asDouble`` number's text by ``float`` too, which is the parser's value (both round correctly), but
for ``-0``, which the parser reads as the integer 0.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import numpy as np
import xxhash

if TYPE_CHECKING:
    from otel_dra.decode.json_shapes import FrameTable

#: A point's time and value: its time's digits (group 1), then (past a start time, whose digits are not kept) an
#: ``asInt`` string's digits (2) or an ``asDouble`` number (3, JSON's grammar for one). The pattern starts at the time
#: key's ``UnixNano`` (its ``"time`` stays in the piece before): a regex's scan for where a match may start stops at
#: each byte that is the pattern's first, and a line has a ``"`` every few bytes but a ``U`` twice a point (a split
#: of a node's export ~20% faster). A start time's key ends in ``UnixNano`` too: :func:`make_template` takes only
#: lines whose every match follows ``"time`` (:func:`_at_times`). Its repeats are possessive (Python 3.11's ``+``):
#: what follows a run of digits in the pattern is a non-digit or optional, so giving digits back never makes a match
#: that taking them all did not, and a start time's failed attempt (at its own ``UnixNano``, one a point) stops at
#: once instead of trying each shorter run of its digits (the same matches; the split ~13% faster).
_POINT: Final = re.compile(
    rb'UnixNano":"([0-9]{1,20}+)",(?:"startTimeUnixNano":"[0-9]{1,20}+",)?'
    rb'"as(?:Int":"(-?[0-9]{1,20}+)"|Double":(-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?(?:[eE][-+]?[0-9]++)?))'
)
#: Templates kept per node (a node's counters restarting changes its lines' start times: a new template), and in all.
MAX_TEMPLATES_PER_NODE: Final = 2
MAX_TEMPLATES: Final = 100_000
#: A request as the Collector's ``file`` exporter writes it (compact JSON): its resources' objects between these,
#: each but the first starting with ``{"resource":`` after a comma.
_REQUEST_START: Final = b'{"resourceMetrics":['
_REQUEST_END: Final = b"]}"
_NEXT_RESOURCE: Final = b'},{"resource":'


@dataclass(frozen=True, slots=True)
class Layout:
    """What a frame's entries alone decide (the lines of one template share it: only their values and times
    move): the entries (in the line's order), how many carry attributes not read, their series' keys in the
    node's floors, the frame's table, a digest of the entries, each point's cell in the frame's matrix, and the
    points kept where a later one names the same cell (None: all)."""

    entries: np.ndarray
    stray: int
    keys: np.ndarray
    found: FrameTable
    mark: bytes
    flat: np.ndarray
    keep: np.ndarray | None


@dataclass(frozen=True, slots=True)
class Template:
    """What a line's walk read, point by point in the line's order: each point's entry, whether its metric is a
    counter, and its resource's node (an index into ``nodes``)."""

    entries: np.ndarray  # int32
    counter: np.ndarray  # bool
    node: np.ndarray  # int16: the index of the point's node in ``nodes``
    nodes: tuple[str, ...]  # each resource's node, in the line's order
    single: bool  # one resource (a node's own export): every point is ``nodes[0]``'s
    admitted: tuple[tuple[str, int], ...]  # each node it names and that node's admission (NodeFloors.generation)
    #: Its lines' frame layout by the schema's width (the decoder's memo: the same for every line of it).
    layouts: dict[int, Layout] = field(default_factory=dict)


@dataclass(slots=True)
class Points:
    """A tokenized line split at its points' times and values: the digest of the pieces between them, and the
    texts (a value's ``asInt`` text or, where it has none, its ``asDouble`` text)."""

    key: bytes
    times: list[bytes]
    ints: list[bytes | None]
    doubles: list[bytes | None]

    def values(self) -> list[float] | None:
        """Each point's value as the walk reads it (None: a value the walk must read: ``-0`` as a number, the
        parser's integer 0)."""
        if b"-0" in self.doubles:
            return None
        return [float(i or d) for i, d in zip(self.ints, self.doubles, strict=True)]  # type: ignore[arg-type]


def points_of(text: bytes) -> Points | None:
    """A line's (or one resource's) points' times and values, and the digest of the rest (None: a NUL byte, which
    would make the digest of the pieces ambiguous; no JSON text holds one)."""
    if b"\0" in text:
        return None
    parts = _POINT.split(text)
    return Points(xxhash.xxh3_128_digest(b"\0".join(parts[0::4])), parts[1::4], parts[2::4], parts[3::4])


def _at_times(text: bytes) -> bool:
    """Whether each point the split finds in ``text`` follows a ``"time`` (its ``timeUnixNano`` key's, not a start
    time's ``startTimeUnixNano`` before a value: ``"startTimeUnixNano":"1","asInt":"2","timeUnixNano":"3"`` holds a
    match at the start time). A template's lines hold its pieces, so each of their matches follows ``"time`` too."""
    return all(text.endswith(b'"time', 0, m.start()) for m in _POINT.finditer(text))


def make_template(
    text: bytes,
    points: Points,
    entries: list[int],
    spans: list[tuple[int, bool, int]],
    nodes: list[str],
    generation: dict[str, int] | None = None,
) -> Template | None:
    """The template of a line (or one resource of it: ``text``, split into ``points``) whose walk took every point
    (``entries``, in the line's order), read metric by metric (``spans``: each metric's resource, whether it is a
    counter, and its points); None when the split did not find exactly those points (a point's fields in another
    order, an exemplar's time, a start time's digits taken for a time). ``generation``: each admitted node's
    admission, which the template stands by."""
    n = len(entries)
    counts = [count for _, _, count in spans]
    if len(points.times) != n or sum(counts) != n or len(nodes) > np.iinfo(np.int16).max or not _at_times(text):
        return None
    known = generation or {}
    return Template(
        np.asarray(entries, np.int32),
        np.repeat(np.asarray([counter for _, counter, _ in spans], bool), counts),
        np.repeat(np.asarray([resource for resource, _, _ in spans], np.int16), counts),
        tuple(nodes),
        len(nodes) == 1,
        tuple((node, known.get(node, -1)) for node in dict.fromkeys(nodes)),
    )


def resources_of(line: bytes) -> list[bytes] | None:
    """A request's resources' texts (each ``{"resource":...}`` object of its ``resourceMetrics``, in order), where
    it is laid out as the Collector's ``file`` exporter writes one (compact); None otherwise. Cut where the text
    says a resource starts: what a template is made of is checked to be one resource each (each a JSON object on its
    own, as many as the walk read), and a line is read off templates only where every piece is one's."""
    if not (line.startswith(_REQUEST_START) and line.endswith(_REQUEST_END)):
        return None
    pieces = line[len(_REQUEST_START) : -len(_REQUEST_END)].split(_NEXT_RESOURCE)
    if len(pieces) == 1:
        return pieces
    last = len(pieces) - 1
    return [(b'{"resource":' if i else b"") + piece + (b"}" if i < last else b"") for i, piece in enumerate(pieces)]


class Templates:
    """The templates kept, by key (:attr:`Points.key`): each node's last few (``MAX_TEMPLATES_PER_NODE``), at most
    ``MAX_TEMPLATES`` in all, the least recently made dropped first; one stands while each of its nodes is
    admitted as it was (not forgotten since)."""

    def __init__(self) -> None:
        self._kept: dict[bytes, Template] = {}
        self._node_keys: dict[str, list[bytes]] = {}

    def get(self, key: bytes, generation: dict[str, int]) -> Template | None:
        template = self._kept.get(key)
        if template is None or any(generation.get(node, -1) != at for node, at in template.admitted):
            return None
        return template

    def __contains__(self, key: bytes) -> bool:
        return key in self._kept

    def keep(self, key: bytes, template: Template) -> None:
        self._kept.pop(key, None)
        self._kept[key] = template
        for node, _ in template.admitted:
            keys = self._node_keys.setdefault(node, [])
            if key in keys:
                keys.remove(key)
            keys.append(key)
            while len(keys) > MAX_TEMPLATES_PER_NODE:
                self._kept.pop(keys.pop(0), None)
        while len(self._kept) > MAX_TEMPLATES:
            del self._kept[next(iter(self._kept))]  # (a node's list may name it still: a key not kept is no harm)

    def forget_nodes(self, known: Container[str]) -> None:
        """Drop the templates of nodes no longer ``known`` (live input: forgotten, idle too long)."""
        for node in [n for n in self._node_keys if n not in known]:
            for key in self._node_keys.pop(node):
                self._kept.pop(key, None)
