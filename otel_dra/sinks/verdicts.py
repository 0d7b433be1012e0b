"""Sink: verdicts where users look: ``hw.status``, ``dra.device.health``, and ``/v1/devices``.

- ``hw.status`` (upstream state set): one series per ``hw.state``, 1 for the verdict's
  state and 0 for the others; all 0 while the verdict is Unknown (no state is known).
- ``dra.device.health`` (project extension, info-style): value 1, the derived health
  attribute ``dra.device.health.state`` (Healthy / Unhealthy / Unknown) with the reasons
  and remediation beside it.
- ``/v1/devices``: every device's current verdict as JSON (the verdict line's keys plus
  ``since``), for ``otel-dra status`` and anything else that wants it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_dra import conventions as cv
from otel_dra.classifier import Verdict
from otel_dra.classifier.verdicts import rfc3339
from otel_dra.classifier.views import DeviceView, by_device
from otel_dra.store.registry import DeviceRegistry
from otel_dra.vocabulary import HW_STATES

log = logging.getLogger(__name__)

#: Metrics this sink owns; the telemetry sink leaves them alone.
VERDICT_METRICS = frozenset({cv.HW_STATUS.name, cv.DRA_DEVICE_HEALTH.name, cv.DRA_DEVICE_VIEW_DISAGREEMENT.name})


class VerdictBoard:
    """The current verdict of every device, updated with the verdicts that changed."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._verdicts: dict[tuple[str, str], Verdict] = {}
        self._attrs: dict[tuple[str, str], Mapping[str, str]] = {}
        self.version = 0  # bumps on every change; watchers wait for it to move
        self.closed = False

    def update(self, changed: Iterable[Verdict], attrs_of: Callable[[str, str], Mapping[str, str]]) -> None:
        with self._lock:
            before = self.version
            for verdict in changed:
                key = (verdict.node, verdict.hw_id)
                self._verdicts[key] = verdict
                self._attrs[key] = attrs_of(*key)
                self.version += 1
            if self.version != before:
                self._lock.notify_all()

    def forget(self, keep: Callable[[tuple[str, str]], bool]) -> None:
        """Drop devices the classifier no longer knows (expired)."""
        with self._lock:
            gone = [k for k in self._verdicts if not keep(k)]
            for key in gone:
                del self._verdicts[key]
                self._attrs.pop(key, None)
                self.version += 1
            if gone:
                self._lock.notify_all()

    def wait_for_change(self, seen: int, timeout_s: float) -> int:
        """Block until the board moves past version ``seen`` or ``timeout_s`` passes; the version now.
        (The kubelet stream resends on every change and at least every timeout/3.)"""
        with self._lock:
            self._lock.wait_for(lambda: self.version != seen or self.closed, timeout_s)
            return self.version

    def wake_all(self) -> None:
        """Wake every waiter for good (shutdown): waits return at once from now on."""
        with self._lock:
            self.closed = True
            self._lock.notify_all()

    def snapshot(self) -> list[tuple[Verdict, Mapping[str, str]]]:
        with self._lock:
            return [(v, self._attrs[k]) for k, v in self._verdicts.items()]

    def publish(self, changed: list[Verdict], registry: DeviceRegistry) -> None:
        """The classifier's changed verdicts onto the board, each with its device's attributes from
        ``registry``; devices the registry has forgotten leave the board; one log line per change
        (a device's first, healthy verdict only at debug level)."""

        def attrs_of(node: str, hw_id: str) -> dict[str, str]:
            row = registry.row(node, hw_id)
            attrs = registry.attrs[row] if row is not None else {}
            return {k: v for k, v in attrs.items() if k != cv.HW_ID}

        self.update(changed, attrs_of)
        self.forget(lambda key: registry.row(*key) is not None)
        for v in changed:
            first = v.last_transition_time == v.time_unix_nano and v.health == "Healthy" and v.state == "ok"
            level = logging.DEBUG if first else logging.WARNING if v.health != "Healthy" else logging.INFO
            log.log(
                level,
                "verdict node=%s device=%s health=%s state=%s reasons=%s remediation=%s: %s",
                v.node,
                v.hw_id,
                v.health,
                v.state,
                ",".join(v.reasons) or "-",
                v.remediation,
                v.message,
            )

    def devices(self, mode: str) -> list[DeviceView]:
        """One verdict per DRA identity, several nodes' views combined by ``mode``."""
        return by_device((v for v, _ in self.snapshot()), mode)

    def health_by_device(self) -> dict[tuple[str, str], str]:
        with self._lock:
            return {k: v.health for k, v in self._verdicts.items()}

    def json_route(self) -> tuple[str, str, bytes]:
        """``/v1/devices``: unhealthy first, then Unknown, then by node and device."""
        order = {"Unhealthy": 0, "Unknown": 1, "Healthy": 2}
        rows = []
        for verdict, _ in sorted(self.snapshot(), key=lambda va: (order[va[0].health], va[0].node, va[0].hw_id)):
            line = verdict.to_json()
            line["since"] = rfc3339(verdict.last_transition_time)
            rows.append(line)
        return "200 OK", "application/json", json.dumps({"devices": rows}).encode()


def _identity(attrs: Mapping[str, str], hw_id: str) -> dict[str, str]:
    return {cv.HW_ID: hw_id, **attrs}


class VerdictMetrics:
    """``hw.status`` and ``dra.device.health`` instruments reading a :class:`VerdictBoard`, and
    ``dra.device.view.disagreement`` for devices seen from several nodes."""

    def __init__(self, board: VerdictBoard, meter: Meter, combine_mode: str = "any", states: bool = True) -> None:
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
        return [
            Observation(
                1,
                {
                    **_identity(attrs, verdict.hw_id),
                    cv.DRA_DEVICE_HEALTH_STATE: verdict.health,
                    cv.DRA_DEVICE_HEALTH_REASONS: ",".join(verdict.reasons),
                    cv.DRA_DEVICE_HEALTH_REMEDIATION: verdict.remediation,
                },
            )
            for verdict, attrs in self._board.snapshot()
        ]
