"""Sink: a fleet's verdict metrics in the Prometheus text format, rendered without the SDK.

A fleet of 100,000 devices has 600,000 verdict series (five ``hw.status`` states and one
``dra.device.health`` each). Through the OpenTelemetry SDK's Prometheus reader that costs
about 38 µs a series, 23 s a cycle (BENCHMARKS.md); the fleet must publish every few
seconds. The series are the same ones the agent's :class:`~otel_dra.sinks.verdicts.VerdictMetrics`
emits through the SDK (same names, label names and values, checked by a test that parses
both), but their label strings are built once per device and reused, so a cycle only joins
ready-made strings with the current values.

``k8s_node_name`` here is the device's node (the fleet has many), where the agent's comes
from its resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from otel_dra import conventions as cv
from otel_dra.classifier import Verdict
from otel_dra.sinks._mapping import prometheus_label
from otel_dra.vocabulary import HW_STATES

_STATUS = "hw_status"
_HEALTH = "dra_device_health"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(attrs: Mapping[str, str]) -> str:
    """``a="x",b="y"``: sorted by label name, as the SDK's exporter writes them."""
    pairs = sorted((prometheus_label(k), v) for k, v in attrs.items())
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


class VerdictText:
    """Renders ``hw_status`` and ``dra_device_health`` for every verdict; caches each device's labels."""

    def __init__(self) -> None:
        # (node, hw.id) -> (attributes seen, the five hw_status line prefixes, verdict key, health line)
        self._cache: dict[tuple[str, str], tuple[Mapping[str, str], list[str], tuple[object, ...], str]] = {}

    def _lines(self, verdict: Verdict, attrs: Mapping[str, str]) -> tuple[list[str], str]:
        key = (verdict.node, verdict.hw_id)
        vkey = (verdict.health, verdict.reasons, verdict.remediation)
        cached = self._cache.get(key)
        if cached is not None and cached[0] is attrs and cached[2] == vkey:
            return cached[1], cached[3]
        base = {cv.HW_ID: verdict.hw_id, **attrs, cv.K8S_NODE_NAME_ATTR: verdict.node}
        if cached is not None and cached[0] is attrs:
            prefixes = cached[1]
        else:
            prefixes = [f"{_STATUS}{{{_labels({**base, cv.HW_STATE: state})}}} " for state in HW_STATES]
        labels = {
            **base,
            cv.DRA_DEVICE_HEALTH_STATE: verdict.health,
            cv.DRA_DEVICE_HEALTH_REASONS: ",".join(verdict.reasons),
            cv.DRA_DEVICE_HEALTH_REMEDIATION: verdict.remediation,
        }
        line = f"{_HEALTH}{{{_labels(labels)}}} 1"
        self._cache[key] = (attrs, prefixes, vkey, line)
        return prefixes, line

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
        seen = set()
        for verdict, attrs in verdicts:
            seen.add((verdict.node, verdict.hw_id))
            prefixes, line = self._lines(verdict, attrs)
            current = HW_STATES.index(verdict.state) if verdict.state in HW_STATES else -1
            status.extend(p + ("1" if i == current else "0") for i, p in enumerate(prefixes))
            health.append(line)
        if len(seen) != len(self._cache):  # devices gone: forget their lines
            self._cache = {k: v for k, v in self._cache.items() if k in seen}
        return ("\n".join(status) + "\n" + "\n".join(health) + "\n").encode()
