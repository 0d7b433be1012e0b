"""Sink: a fleet's verdict metrics in the Prometheus text format, rendered without the SDK.

A fleet of 100,000 devices has 600,000 verdict series (five ``hw.status`` states and one
``dra.device.health`` each). Through the OpenTelemetry SDK's Prometheus reader that costs
about 38 µs a series, 23 s a cycle (BENCHMARKS.md); the fleet must publish every few
seconds. The series are the same ones the agent's :class:`~otel_dra.sinks.verdicts.VerdictMetrics`
emits through the SDK (same names, label names and values, checked by a test that parses
both), but their label strings are built once per device and reused, so a cycle only joins
ready-made strings with the current values. A device's labels are kept once, as one string
without ``hw_state`` and the health labels, which are spliced in where they sort (the health
labels' text is shared by every device with the same verdict): a few hundred bytes a device,
not six lines of them.

``k8s_node_name`` here is the device's node (the fleet has many), where the agent's comes
from its resource.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from otel_dra import conventions as cv
from otel_dra.classifier import Verdict
from otel_dra.sinks._mapping import prometheus_label
from otel_dra.vocabulary import HW_STATES

_STATUS = "hw_status"
_HEALTH = "dra_device_health"
_STATE_LABEL = prometheus_label(cv.HW_STATE)
_HEALTH_KEYS = (cv.DRA_DEVICE_HEALTH_STATE, cv.DRA_DEVICE_HEALTH_REASONS, cv.DRA_DEVICE_HEALTH_REMEDIATION)
#: Label names spliced into a device's labels each cycle: a device whose own labels include one keeps whole lines.
_SPLICED = frozenset({_STATE_LABEL, *(prometheus_label(k) for k in _HEALTH_KEYS)})
#: The five ``hw_status`` values of a device by its state's index in HW_STATES (-1: none, the verdict is Unknown).
_VALUES = {i: tuple("1" if j == i else "0" for j in range(len(HW_STATES))) for i in range(-1, len(HW_STATES))}
_STATE_INDEX = {state: i for i, state in enumerate(HW_STATES)}
#: Distinct (health, reasons, remediation) whose label text is kept for every device to share.
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


def _health_labels(verdict: Verdict) -> dict[str, str]:
    return dict(zip(_HEALTH_KEYS, (verdict.health, ",".join(verdict.reasons), verdict.remediation), strict=True))


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
    and the health labels, and where those go. A device with an attribute among those label names, or
    sorting between the health labels, keeps whole lines instead (``lines``, ``health``)."""

    __slots__ = ("attrs", "base", "health", "health_at", "lines", "state_at", "trio", "vkey")

    def __init__(self, verdict: Verdict, attrs: Mapping[str, str]) -> None:
        self.attrs = attrs
        base = {cv.HW_ID: verdict.hw_id, **attrs, cv.K8S_NODE_NAME_ATTR: verdict.node}
        pairs = _pairs(base)
        self.base = _join(pairs)
        spliced = not any(k in _SPLICED for k, _ in pairs)
        self.state_at = _offset(pairs, self.base, [_STATE_LABEL]) if spliced else -1
        self.health_at = _offset(pairs, self.base, sorted(_SPLICED - {_STATE_LABEL})) if spliced else -1
        self.lines: tuple[str, ...] | None = None
        if self.state_at < 0:
            self.lines = tuple(f"{_STATUS}{{{_labels({**base, cv.HW_STATE: state})}}} " for state in HW_STATES)
        self.vkey: tuple[object, ...] | None = None
        self.trio = ""
        self.health: str | None = None

    def status(self, state: str | None) -> str:
        """The five ``hw_status`` lines, 1 for ``state`` (none for an Unknown verdict)."""
        values = _VALUES[-1 if state is None else _STATE_INDEX.get(state, -1)]
        if self.lines is not None:
            return "\n".join(p + v for p, v in zip(self.lines, values, strict=True))
        head, tail = _split(self.base, self.state_at)
        return "\n".join(
            f'{_STATUS}{{{head}{_STATE_LABEL}="{s}"{tail}}} {v}' for s, v in zip(HW_STATES, values, strict=True)
        )

    def health_line(self, verdict: Verdict, texts: dict[tuple[object, ...], tuple[tuple[object, ...], str]]) -> str:
        """The ``dra_device_health`` line; ``texts``: the health labels' text by (health, reasons, remediation),
        shared by every device."""
        vkey = (verdict.health, verdict.reasons, verdict.remediation)
        if vkey != self.vkey:
            found = texts.get(vkey)
            if found is None:
                if len(texts) >= _MAX_HEALTH_TEXTS:
                    texts.clear()
                found = texts[vkey] = (vkey, _labels(_health_labels(verdict)))
            self.vkey, self.trio = found
            if self.health_at < 0:
                base = {cv.HW_ID: verdict.hw_id, **self.attrs, cv.K8S_NODE_NAME_ATTR: verdict.node}
                self.health = f"{_HEALTH}{{{_labels({**base, **_health_labels(verdict)})}}} 1"
        if self.health is not None:
            return self.health
        head, tail = _split(self.base, self.health_at)
        return f"{_HEALTH}{{{head}{self.trio}{tail}}} 1"


class VerdictText:
    """Renders ``hw_status`` and ``dra_device_health`` for every verdict; keeps each device's labels."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], _Device] = {}  # (node, hw.id) -> its labels
        self._health_texts: dict[tuple[object, ...], tuple[tuple[object, ...], str]] = {}

    def render(self, verdicts: Iterable[tuple[Verdict, Mapping[str, str]]]) -> bytes:
        """The text exposition of both metric families."""
        status = [
            f"# HELP {_STATUS} {cv.HW_STATUS.description}",
            f"# TYPE {_STATUS} gauge",
        ]
        health = [
            f"# HELP {_HEALTH} {cv.DRA_DEVICE_HEALTH.description}",
            f"# TYPE {_HEALTH} gauge",
        ]
        cache, texts = self._cache, self._health_texts
        seen = set()
        for verdict, attrs in verdicts:
            key = (verdict.node, verdict.hw_id)
            seen.add(key)
            device = cache.get(key)
            if device is None or device.attrs is not attrs:
                device = cache[key] = _Device(verdict, attrs)
            status.append(device.status(verdict.state))
            health.append(device.health_line(verdict, texts))
        if len(seen) != len(cache):  # devices gone: forget their labels
            self._cache = {k: v for k, v in cache.items() if k in seen}
        return ("\n".join(status) + "\n" + "\n".join(health) + "\n").encode()
