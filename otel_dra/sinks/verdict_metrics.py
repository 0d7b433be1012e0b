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
from otel_dra.state.board import VerdictBoard
from otel_dra.vocabulary import DEFAULT_COMBINE, HW_STATES

log = logging.getLogger(__name__)

#: Metrics this sink owns; the telemetry sink leaves them alone.
VERDICT_METRICS = frozenset({cv.HW_STATUS.name, cv.DRA_DEVICE_HEALTH.name, cv.DRA_DEVICE_VIEW_DISAGREEMENT.name})


def _identity(attrs: Mapping[str, str], hw_id: str) -> dict[str, str]:
    return {cv.HW_ID: hw_id, **attrs}


class VerdictMetrics:
    """``hw.status`` and ``dra.device.health`` instruments reading a :class:`VerdictBoard`, and
    ``dra.device.view.disagreement`` for devices seen from several nodes."""

    def __init__(
        self, board: VerdictBoard, meter: Meter, combine_mode: str = DEFAULT_COMBINE, states: bool = True
    ) -> None:
        """``states=False`` leaves ``hw.status`` and ``dra.device.health`` to another renderer
        (the fleet's :mod:`otel_dra.sinks.verdict_text`) and keeps only the disagreement gauge."""
        self._board = board
        self._mode = combine_mode
        meter.create_observable_gauge(
            cv.DRA_DEVICE_VIEW_DISAGREEMENT.name,
            callbacks=[self._disagreement],
            unit=cv.DRA_DEVICE_VIEW_DISAGREEMENT.unit,
            description=cv.DRA_DEVICE_VIEW_DISAGREEMENT.description,
        )
        if not states:
            return
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

    def _disagreement(self, _: CallbackOptions) -> Iterable[Observation]:
        out = []
        for shared in self._board.devices(self._mode):
            if len(shared.views) < 2:
                continue
            for view in shared.views:
                attrs = {
                    cv.DRA_POOL_NAME: shared.pool,
                    cv.DRA_DEVICE_NAME: shared.device,
                    cv.DRA_DEVICE_VIEW_NODE: view.node,
                    cv.DRA_DEVICE_HEALTH_STATE: view.health,
                }
                out.append(Observation(int(view.node in shared.disagreeing), attrs))
        return out

    def _health(self, _: CallbackOptions) -> Iterable[Observation]:
        out = []
        for verdict, attrs in self._board.snapshot():
            health = {
                **_identity(attrs, verdict.hw_id),
                cv.DRA_DEVICE_HEALTH_STATE: verdict.health,
                cv.DRA_DEVICE_HEALTH_REASONS: ",".join(verdict.reasons),
                cv.DRA_DEVICE_HEALTH_REMEDIATION: verdict.remediation,
                cv.DRA_DEVICE_HEALTH_SCOPE: verdict.scope,
            }
            if verdict.group is not None:
                health[cv.DRA_DEVICE_HEALTH_GROUP] = verdict.group
            out.append(Observation(1, health))
        return out
