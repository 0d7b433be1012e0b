"""Sink: verdicts where users look: ``hw.status``, ``dra.device.health``, and ``/v1/devices``.

- ``hw.status`` (upstream state set): one series per ``hw.state``, 1 for the verdict's
  state and 0 for the others; all 0 while the verdict is Unknown (no state is known).
- ``dra.device.health`` (project extension, info-style): value 1, the derived health
  attribute ``dra.device.health.state`` (Healthy / Unhealthy / Unknown) with the reasons,
  remediation and scope beside it, and the group when the verdict names one (a verdict about
  a node or workload: ``dra.device.health.group="node/train-007"``; absent, not empty, for a
  device's own, as Prometheus reads an absent label as "" anyway).
- ``/v1/devices``: every device's current verdict as JSON (the verdict line's keys plus
  ``since``), for ``otel-dra status`` and anything else that wants it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_dra import conventions as cv
from otel_dra.classifier.verdict import Verdict
from otel_dra.state.board import VerdictBoard
from otel_dra.vocabulary import DEFAULT_COMBINE, HW_STATES

log = logging.getLogger(__name__)

#: Metrics this sink owns; the telemetry sink leaves them alone.
VERDICT_METRICS = frozenset({cv.HW_STATUS.name, cv.DRA_DEVICE_HEALTH.name, cv.DRA_DEVICE_VIEW_DISAGREEMENT.name})


def _identity(attrs: Mapping[str, str], hw_id: str) -> dict[str, str]:
    return {cv.HW_ID: hw_id, **attrs}


#: The health attributes of ``dra.device.health``, in order; the group only when the verdict names one.
HEALTH_KEYS = (
    cv.DRA_DEVICE_HEALTH_STATE,
    cv.DRA_DEVICE_HEALTH_REASONS,
    cv.DRA_DEVICE_HEALTH_REMEDIATION,
    cv.DRA_DEVICE_HEALTH_SCOPE,
    cv.DRA_DEVICE_HEALTH_GROUP,
)


def health_attributes(verdict: Verdict) -> dict[str, str]:
    """A verdict's health attributes, for both renderers of ``dra.device.health``: state, reasons, remediation,
    scope, and the group only when the verdict has one (absent, not "": Prometheus reads an absent label as "",
    so a device's own verdict needs none)."""
    values = (verdict.health, ",".join(verdict.reasons), verdict.remediation, verdict.scope, verdict.group)
    return {k: v for k, v in zip(HEALTH_KEYS, values, strict=True) if v is not None}


class VerdictSeries:
    """``hw.status`` and ``dra.device.health`` through the OpenTelemetry SDK, reading a :class:`VerdictBoard`.

    Why a second renderer (:mod:`otel_dra.sinks.verdict_text`) remains beside this one: the agent pushes these
    series over OTLP, which only the SDK's readers do, and its one node's few devices cost nothing; a fleet
    publishes 600,000 of them for 100,000 devices, which through the SDK's observations cost about 38 us a
    series (BENCHMARKS.md), so the fleet renders the same series' text itself. Both take the attributes from
    :func:`health_attributes` and the states from ``HW_STATES``, and a test parses both outputs for equality."""

    def __init__(self, board: VerdictBoard, meter: Meter) -> None:
        self._board = board
        meter.create_observable_up_down_counter(
            cv.HW_STATUS.name, callbacks=[self._status], unit=cv.HW_STATUS.unit, description=cv.HW_STATUS.description
        )
        meter.create_observable_gauge(
            cv.DRA_DEVICE_HEALTH.name,
            callbacks=[self._health],
            unit=cv.DRA_DEVICE_HEALTH.unit,
            description=cv.DRA_DEVICE_HEALTH.description,
        )

    def _status(self, _: CallbackOptions) -> Iterable[Observation]:
        out = []
        for verdict, attrs in self._board.snapshot():
            base = _identity(attrs, verdict.hw_id)
            for state in HW_STATES:
                out.append(Observation(int(state == verdict.state), {**base, cv.HW_STATE: state}))
        return out

    def _health(self, _: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(1, {**_identity(attrs, verdict.hw_id), **health_attributes(verdict)})
            for verdict, attrs in self._board.snapshot()
        ]


class ViewDisagreement:
    """``dra.device.view.disagreement``: for a device seen from several nodes, 1 for each node whose view
    disagrees with the combined verdict (the policy's ``shared_devices.combine``)."""

    def __init__(self, board: VerdictBoard, meter: Meter, combine_mode: str = DEFAULT_COMBINE) -> None:
        self._board = board
        self._mode = combine_mode
        self._seen = -1  # the board's version the kept observations show
        self._last: list[Observation] = []
        meter.create_observable_gauge(
            cv.DRA_DEVICE_VIEW_DISAGREEMENT.name,
            callbacks=[self._disagreement],
            unit=cv.DRA_DEVICE_VIEW_DISAGREEMENT.unit,
            description=cv.DRA_DEVICE_VIEW_DISAGREEMENT.description,
        )

    def _disagreement(self, _: CallbackOptions) -> Iterable[Observation]:
        version = self._board.version
        if version == self._seen:  # (the board unchanged: the same observations, not 100,000 verdicts regrouped)
            return self._last
        out = []
        for shared in self._board.devices(self._mode, shared_only=True):
            for view in shared.views:
                attrs = {
                    cv.DRA_POOL_NAME: shared.pool,
                    cv.DRA_DEVICE_NAME: shared.device,
                    cv.DRA_DEVICE_VIEW_NODE: view.node,
                    cv.DRA_DEVICE_HEALTH_STATE: view.health,
                }
                out.append(Observation(int(view.node in shared.disagreeing), attrs))
        self._seen, self._last = version, out
        return out


class VerdictMetrics:
    """The agent's verdict metrics: :class:`VerdictSeries` and :class:`ViewDisagreement` on one board."""

    def __init__(self, board: VerdictBoard, meter: Meter, combine_mode: str = DEFAULT_COMBINE) -> None:
        self.series = VerdictSeries(board, meter)
        self.disagreement = ViewDisagreement(board, meter, combine_mode)
