"""Sink: a fleet's verdict metrics in the Prometheus text format, rendered without the SDK.

A fleet of 100,000 devices has 600,000 verdict series (five ``hw_status`` states and one
``dra.device.health`` each). Through the OpenTelemetry SDK's Prometheus reader that costs
about 38 µs a series, 23 s a cycle (BENCHMARKS.md); the fleet must publish every few
seconds. The series are the same ones the agent's :class:`~otel_dra.sinks.verdict_metrics.VerdictSeries`
emits through the SDK (the attributes from its :func:`~otel_dra.sinks.verdict_metrics.health_attributes`;
checked by a test that parses both). Devices whose attributes have the same keys (every device of an agent
version) share one :class:`_Shape`: a function written for them whose f-strings make their label text (sorted by
label name, cut where ``hw_state`` and the health labels go) and their lines from that text, so a device's labels
are formatted once a render for its six lines (the health labels' text is shared by every device with the same
verdict). No label text is kept per device. A large fleet's text is kept gzip-compressed in blocks of devices and
made again only for the blocks where a verdict changed, on two cores when there are many, half in a forked copy of
the process (:meth:`VerdictText.gzipped`).

``k8s_node_name`` here is the device's node (the fleet has many), where the agent's comes
from its resource.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from zlib_ng import zlib_ng

from otel_dra import conventions as cv
from otel_dra import forked
from otel_dra.classifier import Verdict
from otel_dra.frame import FrozenAttrs
from otel_dra.sinks._mapping import prometheus_label
from otel_dra.sinks.exposition import Gzipped, gzip_member
from otel_dra.sinks.verdict_metrics import HEALTH_KEYS, health_attributes
from otel_dra.state.board import Pair
from otel_dra.vocabulary import HW_STATES

_STATUS = "hw_status"
_HEALTH = "dra_device_health"
_STATE_LABEL = prometheus_label(cv.HW_STATE)
#: Label names placed into a device's labels each cycle: a device whose own labels include one keeps whole lines
#: (the group's too, present or not, so a device's labels never sort between the health labels).
_SPLICED = frozenset({_STATE_LABEL, *(prometheus_label(k) for k in HEALTH_KEYS)})
#: What a label name may hold, and so what a :class:`_Shape` writes into its f-strings' source.
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: The five ``hw_status`` values of a device by its state's index in HW_STATES (-1: none, the verdict is Unknown).
_VALUES = {i: tuple("1" if j == i else "0" for j in range(len(HW_STATES))) for i in range(-1, len(HW_STATES))}
_STATE_INDEX = {state: i for i, state in enumerate(HW_STATES)}
#: Devices whose lines :meth:`VerdictText.chunks` makes at a time, and a large fleet's block of devices kept
#: (:meth:`VerdictText.gzipped`).
BATCH = 2048
#: A fleet this large keeps its text in blocks, made again only where a verdict changed, and has as many devices'
#: text made on two cores (:meth:`VerdictText.gzipped`); below it the fork and the compressing cost more than half a
#: rendering saves (20,000 devices: ~0.2 s on one core).
LARGE_DEVICES = 20_000
#: How long the forked copy may take to make its half before this process makes it instead.
SPLIT_TIMEOUT_S = 60.0
_STATUS_HEAD = f"# HELP {_STATUS} {cv.HW_STATUS.description}\n# TYPE {_STATUS} gauge\n".encode()
_HEALTH_HEAD = f"# HELP {_HEALTH} {cv.DRA_DEVICE_HEALTH.description}\n# TYPE {_HEALTH} gauge\n".encode()
_STATUS_HEAD_GZ, _HEALTH_HEAD_GZ = gzip_member(_STATUS_HEAD), gzip_member(_HEALTH_HEAD)
#: Distinct (health, reasons, remediation, scope, group) whose label text is kept for every device to share
#: (groups are nodes, workloads, links, firmware versions: a node's devices share one).
_MAX_HEALTH_TEXTS = 10_000
#: Distinct attribute key sets whose :class:`_Shape` is kept (one per agent version and device kind, in practice).
_MAX_SHAPES = 1_000

HealthTexts = dict[tuple[object, ...], str]

log = logging.getLogger(__name__)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(attrs: Mapping[str, str]) -> str:
    """``a="x",b="y"``: sorted by label name, as the SDK's exporter writes them."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted((prometheus_label(k), v) for k, v in attrs.items()))


def _identity(verdict: Verdict, attrs: Mapping[str, str]) -> dict[str, str]:
    """A device's own labels: its attributes, its ``hw.id`` (unless they carry one) and its node."""
    return {cv.HW_ID: verdict.hw_id, **attrs, cv.K8S_NODE_NAME_ATTR: verdict.node}


def _keys_values(attrs: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A device's attribute keys and values, in order, from any mapping (a :class:`FrozenAttrs` with pairs is read
    whole where it is used: :meth:`VerdictText._lines`)."""
    keys = tuple(attrs)
    return keys, tuple(attrs.values()) if type(attrs) is dict else tuple(attrs[k] for k in keys)


def health_text(verdict: Verdict, texts: HealthTexts) -> str:
    """The health labels' text of ``verdict``; ``texts``: by (health, reasons, remediation, scope, group), shared
    by every device."""
    key = (verdict.health, verdict.reasons, verdict.remediation, verdict.scope, verdict.group)
    text = texts.get(key)
    if text is None:
        if len(texts) >= _MAX_HEALTH_TEXTS:
            texts.clear()
        text = texts[key] = _labels(health_attributes(verdict))
    return text


class _Shape:
    """What every device whose attributes have the same keys shares: a function that makes its six lines from its
    label values, the health labels' text and its five ``hw_status`` values. It is written for the shape (as
    :func:`collections.namedtuple` writes its class): its label text as three f-strings (the labels before,
    between and after the two places where ``hw_state`` and the health labels go), made once for the six lines,
    and the lines as two f-strings over those texts. An f-string is compiled to a join of its pieces, where
    ``%`` parses its template a character at a time each call: 0.9 µs against 1.7 µs for fifteen labels on a
    2 GHz EPYC (a fleet's text is some 3 kB a device, 100,000 devices a scrape)."""

    __slots__ = ("lines",)

    def __init__(self, names: list[str], sources: list[int], state: int, health: int) -> None:
        """``names``: the label names, sorted; ``sources``: where each one's value is in a device's attribute
        values followed by its ``hw.id`` and node; ``state``, ``health``: the label index at which ``hw_state``
        goes, and the health labels'."""
        p, q = sorted((state, health))
        spans = ((0, p), (p, q), (q, len(names)))
        # (label names are [a-zA-Z0-9_] (_LABEL_NAME): nothing in them to escape in an f-string's source)
        texts = [",".join(f'{names[i]}="{{a{sources[i]}}}"' for i in range(a, b)) for a, b in spans]

        def line(metric: str, at: int, placed: str, value: str) -> str:
            """A line's f-string text: its labels' spans ({t0}-{t2}) with ``placed`` (literal text, or {h} for
            the health labels) where it sorts, and its value."""
            groups: list[str] = []
            for k, (a, b) in enumerate(spans):
                if a == at and placed not in groups:
                    groups.append(placed)
                if a < b:
                    groups.append(f"{{t{k}}}")
            return f"{metric}{{{{{','.join(groups)}}}}} {value}\n"

        status = "".join(line(_STATUS, state, f'{_STATE_LABEL}="{s}"', f"{{s{k}}}") for k, s in enumerate(HW_STATES))
        values = ", ".join(f"a{i}" for i in range(max(sources) + 1))
        flags = ", ".join(f"s{k}" for k in range(len(HW_STATES)))
        source = "\n".join(
            [
                "def lines(v, h, flags):",
                f"    {values}, = v",  # (a tuple of the device's values, in attribute order)
                f"    {flags}, = flags",
                *(f"    t{k} = f{text!r}" for k, text in enumerate(texts)),
                f"    return f{status!r}, f{line(_HEALTH, health, '{h}', '1')!r}",
            ]
        )
        namespace: dict[str, Callable[..., tuple[str, str]]] = {}
        exec(compile(source, f"<verdict lines: {len(names)} labels>", "exec"), namespace)
        self.lines = namespace["lines"]

    @staticmethod
    def of(keys: tuple[str, ...]) -> _Shape | None:
        """The shape of a device whose attributes have ``keys``; None when its lines must be made whole (a key's
        label is one of the placed ones, two keys share a label name, a label sorts between the health labels,
        or a label name is not one Prometheus takes)."""
        at: dict[str, int] = {}  # where each label's value is, as :func:`_identity` merges them
        for i, key in enumerate(keys):
            at.setdefault(key, i)
        at.setdefault(cv.HW_ID, len(keys))
        at[cv.K8S_NODE_NAME_ATTR] = len(keys) + 1
        labelled = sorted((prometheus_label(k), k) for k in at)
        names = [name for name, _ in labelled]
        if len(set(names)) < len(names) or _SPLICED & set(names):
            return None
        if not all(map(_LABEL_NAME.fullmatch, names)):  # (never, from prometheus_label: the f-strings' source is safe)
            return None
        health = {bisect.bisect_left(names, name) for name in _SPLICED - {_STATE_LABEL}}
        if len(health) != 1:
            return None
        return _Shape(names, [at[k] for _, k in labelled], bisect.bisect_left(names, _STATE_LABEL), *health)


class VerdictText:
    """Renders ``hw_status`` and ``dra_device_health`` for every verdict."""

    def __init__(self, fork: bool = True) -> None:
        """``fork``: a large fleet's text may be made on two cores (:meth:`exposition`)."""
        self._fork = fork
        self._health_texts: HealthTexts = {}
        self._shapes: dict[tuple[str, ...], _Shape | None] = {}  # attribute keys -> their devices' shape
        #: A large fleet's text as it was last made: each block's devices (the board's entries) and its members.
        self._blocks: list[tuple[Sequence[Pair], bytes, bytes]] = []

    def render(self, verdicts: Iterable[Pair]) -> bytes:
        """The text exposition of both metric families."""
        return b"".join(self.chunks(verdicts))

    def _shape(self, keys: tuple[str, ...]) -> _Shape | None:
        try:
            return self._shapes[keys]
        except KeyError:
            if len(self._shapes) >= _MAX_SHAPES:
                self._shapes.clear()
            shape = self._shapes[keys] = _Shape.of(keys)
            return shape

    def _lines(self, verdict: Verdict, attrs: Mapping[str, str]) -> tuple[str, str]:
        """A device's five ``hw_status`` lines and its ``dra_device_health`` line, from one look at its labels
        (the hot loop of a render: 100,000 calls for a fleet's, so written out rather than in helpers)."""
        if type(attrs) is FrozenAttrs and (pairs := attrs.pairs):  # (its pairs read whole, not a key at a time)
            keys, values = zip(*pairs)  # noqa: B905 (two-tuples each: checking each costs a tenth of a device's time)
        else:
            keys, values = _keys_values(attrs)
        shape = self._shapes.get(keys) or self._shape(keys)
        if shape is None:
            base = _identity(verdict, attrs)
            status = "".join(
                f"{_STATUS}{{{_labels({**base, cv.HW_STATE: s})}}} {int(s == verdict.state)}\n" for s in HW_STATES
            )
            return status, f"{_HEALTH}{{{_labels({**base, **health_attributes(verdict)})}}} 1\n"
        values = (*values, verdict.hw_id, verdict.node)
        joined = "".join(values)
        if '"' in joined or "\\" in joined or "\n" in joined:
            values = tuple(map(_escape, values))
        state = verdict.state
        flags = _VALUES[-1 if state is None else _STATE_INDEX.get(state, -1)]
        return shape.lines(values, health_text(verdict, self._health_texts), flags)

    def chunks(self, verdicts: Iterable[Pair], batch: int = BATCH) -> Iterator[bytes]:
        """:meth:`render`'s text in pieces of ``batch`` devices' lines, made as they are read: what a fleet
        of 100,000 devices renders (some 330 MB of text) need never be held at once
        (:class:`~otel_dra.sinks.exposition.ExpositionCache` compresses it as it comes).

        Each device's labels are looked at once, for both families: its ``dra_device_health`` line is made with
        its ``hw_status`` lines and held until that family's turn, compressed (a fortieth of its size; inflating
        it again costs a fifth of looking at the labels a second time)."""
        pairs = list(verdicts)
        yield _STATUS_HEAD
        held = zlib_ng.compressobj(1)
        packed: list[bytes] = []
        for at in range(0, len(pairs), batch):
            status, health = self._texts(pairs[at : at + batch])
            yield status
            packed.append(held.compress(health))
        packed.append(held.flush())
        yield _HEALTH_HEAD
        unpack = zlib_ng.decompressobj()
        for piece in packed:
            if text := unpack.decompress(piece):
                yield text

    def exposition(self, verdicts: Iterable[Pair]) -> Iterator[bytes] | Gzipped:
        """What :class:`~otel_dra.sinks.exposition.ExpositionCache` keeps of the verdicts: :meth:`chunks` of a
        small fleet; a large one's text gzip-compressed (the cache keeps a large rendering so anyway), its blocks
        kept and made again only where a verdict changed (:meth:`gzipped`)."""
        pairs = list(verdicts)
        if len(pairs) < LARGE_DEVICES:
            self._blocks = []
            return self.chunks(pairs)
        return self.gzipped(pairs)

    def gzipped(self, pairs: Sequence[Pair]) -> Gzipped:
        """:meth:`render`'s text as gzip members (RFC 1952's members one after another are one stream): each
        family's HELP and TYPE, then a member for each block of :data:`BATCH` devices' lines. A block whose
        devices, verdicts and attributes are those of the last call (the board's same entries) keeps its
        members; the others are made again (:meth:`_make`): a verdict that changed in a fleet of 100,000
        devices costs its block's 2,048 devices, not the fleet's."""
        blocks = [pairs[at : at + BATCH] for at in range(0, len(pairs), BATCH)]
        kept = self._blocks
        todo = [i for i, block in enumerate(blocks) if i >= len(kept) or kept[i][0] != block]
        made = self._make(blocks, todo)
        self._blocks = [(block, *made[i]) if i in made else kept[i] for i, block in enumerate(blocks)]
        status = [member for _, member, _ in self._blocks]
        health = [member for _, _, member in self._blocks]
        return Gzipped([_STATUS_HEAD_GZ, *status, _HEALTH_HEAD_GZ, *health])

    def _make(self, blocks: list[Sequence[Pair]], todo: list[int]) -> dict[int, tuple[bytes, bytes]]:
        """The members of the blocks ``todo``: on two cores when they hold :data:`LARGE_DEVICES` devices or more
        and this process may use two and fork, the second half made by a forked copy of it while this one makes
        the first (a fleet of 100,000 devices: ~1.0 s on one core of a 2 GHz EPYC, ~0.6 s on two).

        A copy that cannot be made, fails or is not done within :data:`SPLIT_TIMEOUT_S` costs a warning, and
        this process makes its half too: the text is the same either way."""
        devices = sum(len(blocks[i]) for i in todo)
        if not self._fork or devices < LARGE_DEVICES or not forked.can_fork() or forked.usable_cpus() < 2:
            return {i: self._members(blocks[i]) for i in todo}
        ours, theirs = todo[: len(todo) // 2], todo[len(todo) // 2 :]
        try:
            copy: forked.ForkedCall | None = forked.ForkedCall(
                lambda: [member for i in theirs for member in self._members(blocks[i])]
            )
        except OSError as exc:
            log.warning("rendering /metrics on one core: could not fork a copy of the fleet to share it (%s)", exc)
            copy = None
        made = {i: self._members(blocks[i]) for i in ours}
        parts = copy.result(SPLIT_TIMEOUT_S) if copy is not None else None
        if parts is None or len(parts) != 2 * len(theirs):
            if copy is not None:
                log.warning("rendering /metrics: the forked copy sharing the work failed; rendering its half here")
            parts = [member for i in theirs for member in self._members(blocks[i])]
        made.update((i, (parts[2 * k], parts[2 * k + 1])) for k, i in enumerate(theirs))
        return made

    def _members(self, pairs: Sequence[Pair]) -> tuple[bytes, bytes]:
        """``pairs``' ``hw_status`` lines and their ``dra_device_health`` lines as a gzip member each."""
        status, health = self._texts(pairs)
        return gzip_member(status), gzip_member(health)

    def _texts(self, pairs: Sequence[Pair]) -> tuple[bytes, bytes]:
        """``pairs``' ``hw_status`` lines and their ``dra_device_health`` lines, each family's as one text."""
        if not pairs:
            return b"", b""
        status, health = zip(*[self._lines(v, attrs) for v, attrs in pairs], strict=True)
        return "".join(status).encode(), "".join(health).encode()
