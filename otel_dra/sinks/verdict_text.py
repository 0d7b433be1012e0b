"""Sink: a fleet's verdict metrics in the Prometheus text format, rendered without the SDK.

A fleet of 100,000 devices has 600,000 verdict series (five ``hw.status`` states and one
``dra.device.health`` each). Through the OpenTelemetry SDK's Prometheus reader that costs
about 38 µs a series, 23 s a cycle (BENCHMARKS.md); the fleet must publish every few
seconds. The series are the same ones the agent's :class:`~otel_dra.sinks.verdict_metrics.VerdictSeries`
emits through the SDK (the attributes from its :func:`~otel_dra.sinks.verdict_metrics.health_attributes`;
checked by a test that parses both), but their label strings are built once per device and reused, so a cycle only joins
ready-made strings with the current values. A device's labels are kept once, as one string
without ``hw_state`` and the health labels, which are spliced in where they sort (the health
labels' text is shared by every device with the same verdict): a few hundred bytes a device,
not six lines of them.

``k8s_node_name`` here is the device's node (the fleet has many), where the agent's comes
from its resource.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping

from otel_dra import conventions as cv
from otel_dra.classifier import Verdict
from otel_dra.sinks._mapping import prometheus_label
from otel_dra.sinks.verdict_metrics import HEALTH_KEYS, health_attributes
from otel_dra.vocabulary import HW_STATES

_STATUS = "hw_status"
_HEALTH = "dra_device_health"
_STATE_LABEL = prometheus_label(cv.HW_STATE)
#: Label names spliced into a device's labels each cycle: a device whose own labels include one keeps whole lines
#: (the group's too, present or not, so a device's labels never sort between the health labels).
_SPLICED = frozenset({_STATE_LABEL, *(prometheus_label(k) for k in HEALTH_KEYS)})
#: The five ``hw_status`` values of a device by its state's index in HW_STATES (-1: none, the verdict is Unknown).
_VALUES = {i: tuple("1" if j == i else "0" for j in range(len(HW_STATES))) for i in range(-1, len(HW_STATES))}
_STATE_INDEX = {state: i for i, state in enumerate(HW_STATES)}
#: Devices whose lines :meth:`VerdictText.chunks` makes at a time.
BATCH = 2048
#: Distinct (health, reasons, remediation, scope, group) whose label text is kept for every device to share
#: (groups are nodes, workloads, links, firmware versions: a node's devices share one).
_MAX_HEALTH_TEXTS = 10_000


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _pairs(attrs: Mapping[str, str]) -> list[tuple[str, str]]:
    """(label name, value) of each attribute, sorted as the SDK's exporter writes them."""
    return sorted((prometheus_label(k), v) for k, v in attrs.items())


def _join(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def _labels(attrs: Mapping[str, str]) -> str:
    """``a="x",b="y"``: sorted by label name, as the SDK's exporter writes them."""
    return _join(_pairs(attrs))


def _offset(pairs: list[tuple[str, str]], text: str, names: Iterable[str]) -> int:
    """Where labels ``names`` go, together, in ``text`` (``pairs`` joined, none of them among ``pairs``): the
    character offset at which ``<labels>,`` is inserted, ``len(text) + 1`` to append ``,<labels>``; -1 when
    they do not sort next to each other among ``pairs``."""
    keys = [k for k, _ in pairs]
    places = {bisect.bisect_left(keys, name) for name in names}
    if len(places) != 1:
        return -1
    (k,) = places
    if k == len(pairs):
        return len(text) + 1
    return len(_join(pairs[:k])) + (1 if k else 0)


def _split(text: str, at: int) -> tuple[str, str]:
    """(head, tail) such that ``head + labels + tail`` is ``text`` with labels inserted at ``at`` (:func:`_offset`)."""
    if at > len(text):
        return f"{text},", ""
    return text[:at], f",{text[at:]}"


class _Device:
    """One device's labels: its attributes and identity rendered once as one string, without ``hw_state``
    and the health labels, and where those go (:class:`_Whole` when they can't be spliced in)."""

    __slots__ = ("attrs", "base", "health_at", "node", "state_at", "text")

    def __init__(self, verdict: Verdict, attrs: Mapping[str, str], pairs: list[tuple[str, str]], base: str) -> None:
        self.attrs, self.node, self.base = attrs, verdict.node, base
        self.state_at = _offset(pairs, base, [_STATE_LABEL])
        self.health_at = _offset(pairs, base, sorted(_SPLICED - {_STATE_LABEL}))
        self.text: tuple[tuple[object, ...], str] | None = None  # (its verdict's health key, their labels' text)

    @staticmethod
    def of(verdict: Verdict, attrs: Mapping[str, str]) -> _Device:
        base = {cv.HW_ID: verdict.hw_id, **attrs, cv.K8S_NODE_NAME_ATTR: verdict.node}
        pairs = _pairs(base)
        text = _join(pairs)
        device = _Device(verdict, attrs, pairs, text)
        if any(k in _SPLICED for k, _ in pairs) or device.state_at < 0 or device.health_at < 0:
            return _Whole(verdict, attrs, base)
        return device

    def status(self, state: str | None) -> str:
        """The five ``hw_status`` lines, 1 for ``state`` (none for an Unknown verdict)."""
        values = _VALUES[-1 if state is None else _STATE_INDEX.get(state, -1)]
        head, tail = _split(self.base, self.state_at)
        return "\n".join(
            f'{_STATUS}{{{head}{_STATE_LABEL}="{s}"{tail}}} {v}' for s, v in zip(HW_STATES, values, strict=True)
        )

    def health_text(self, verdict: Verdict, texts: dict[tuple[object, ...], tuple[tuple[object, ...], str]]) -> str:
        """The health labels' text of ``verdict``; ``texts``: by (health, reasons, remediation, scope, group), shared
        by every device."""
        vkey = (verdict.health, verdict.reasons, verdict.remediation, verdict.scope, verdict.group)
        text = self.text
        if text is None or vkey != text[0]:
            text = texts.get(vkey)
            if text is None:
                if len(texts) >= _MAX_HEALTH_TEXTS:
                    texts.clear()
                text = texts[vkey] = (vkey, _labels(health_attributes(verdict)))
            self.text = text
        return text[1]

    def health_line(self, verdict: Verdict, texts: dict[tuple[object, ...], tuple[tuple[object, ...], str]]) -> str:
        """The ``dra_device_health`` line."""
        trio = self.health_text(verdict, texts)
        head, tail = _split(self.base, self.health_at)
        return f"{_HEALTH}{{{head}{trio}{tail}}} 1"


class _Whole(_Device):
    """A device with an attribute among the spliced label names, or one that sorts between the health labels:
    its lines kept whole, as every line was before splicing."""

    __slots__ = ("health", "lines")

    def __init__(self, verdict: Verdict, attrs: Mapping[str, str], base: dict[str, str]) -> None:
        self.attrs, self.node, self.base, self.state_at, self.health_at, self.text = (
            attrs,
            verdict.node,
            "",
            -1,
            -1,
            None,
        )
        self.lines = tuple(f"{_STATUS}{{{_labels({**base, cv.HW_STATE: state})}}} " for state in HW_STATES)
        self.health = ""

    def status(self, state: str | None) -> str:
        values = _VALUES[-1 if state is None else _STATE_INDEX.get(state, -1)]
        return "\n".join(p + v for p, v in zip(self.lines, values, strict=True))

    def health_line(self, verdict: Verdict, texts: dict[tuple[object, ...], tuple[tuple[object, ...], str]]) -> str:
        text = self.text
        self.health_text(verdict, texts)
        if self.text is not text or not self.health:
            base = {cv.HW_ID: verdict.hw_id, **self.attrs, cv.K8S_NODE_NAME_ATTR: verdict.node}
            self.health = f"{_HEALTH}{{{_labels({**base, **health_attributes(verdict)})}}} 1"
        return self.health


class VerdictText:
    """Renders ``hw_status`` and ``dra_device_health`` for every verdict; keeps each device's labels, by its
    ``hw.id`` (a device that two nodes see: by node too)."""

    def __init__(self) -> None:
        self._cache: dict[str, _Device] = {}  # hw.id -> its labels (its node's: Device.node)
        self._more: dict[tuple[str, str], _Device] = {}  # (node, hw.id) -> ... of an hw.id another node has
        self._health_texts: dict[tuple[object, ...], tuple[tuple[object, ...], str]] = {}

    def render(self, verdicts: Iterable[tuple[Verdict, Mapping[str, str]]]) -> bytes:
        """The text exposition of both metric families."""
        return b"".join(self.chunks(verdicts))

    def _device(self, verdict: Verdict, attrs: Mapping[str, str]) -> _Device:
        cache, hw_id = self._cache, verdict.hw_id
        device = cache.get(hw_id)
        if device is not None and device.node != verdict.node:
            device = self._more.get((verdict.node, hw_id))
        if device is None or device.attrs is not attrs:
            device = _Device.of(verdict, attrs)
            held = cache.get(hw_id)
            if held is None or held.node == verdict.node:
                cache[hw_id] = device
            else:
                self._more[(verdict.node, hw_id)] = device
        return device

    def chunks(self, verdicts: Iterable[tuple[Verdict, Mapping[str, str]]], batch: int = BATCH) -> Iterator[bytes]:
        """:meth:`render`'s text in pieces of ``batch`` devices' lines, made as they are read: what a fleet
        of 100,000 devices renders (some 250 MB of text) need never be held at once
        (:class:`~otel_dra.sinks.exposition.ExpositionCache` compresses it as it comes)."""
        texts = self._health_texts
        pairs = list(verdicts)
        # (first every device's labels, kept: made apart from the lines below)
        devices = [self._device(verdict, attrs) for verdict, attrs in pairs]
        if len(devices) != len(self._cache) + len(self._more):  # devices gone: forget their labels
            seen = {(v.node, v.hw_id) for v, _ in pairs}
            self._cache = {k: d for k, d in self._cache.items() if (d.node, k) in seen}
            self._more = {k: d for k, d in self._more.items() if k in seen}
        yield f"# HELP {_STATUS} {cv.HW_STATUS.description}\n# TYPE {_STATUS} gauge\n".encode()
        for at in range(0, len(pairs), batch):
            chunk = zip(pairs[at : at + batch], devices[at : at + batch], strict=True)
            lines = [d.status(v.state) for (v, _), d in chunk]
            yield ("\n".join(lines) + "\n").encode()
        yield f"# HELP {_HEALTH} {cv.DRA_DEVICE_HEALTH.description}\n# TYPE {_HEALTH} gauge\n".encode()
        for at in range(0, len(pairs), batch):
            chunk = zip(pairs[at : at + batch], devices[at : at + batch], strict=True)
            lines = [d.health_line(v, texts) for (v, _), d in chunk]
            yield ("\n".join(lines) + "\n").encode()
