"""The current verdict of every device: written by the classifier's loop, read by every sink
(verdict metrics, ``/v1/devices``, the kubelet stream, the Kubernetes writer), each on its own
thread. State between pipeline stages, so it lives beside them, not inside one sink."""

from __future__ import annotations

import json
import logging
import operator
import threading
from collections.abc import Callable, Iterable, Mapping

from otel_dra import conventions as cv
from otel_dra.classifier import Verdict
from otel_dra.classifier.registry import DeviceRegistry
from otel_dra.classifier.verdict import rfc3339
from otel_dra.classifier.views import DeviceView, by_device
from otel_dra.logs import keys

log = logging.getLogger(__name__)
_VERDICT = operator.itemgetter(0)
#: A device on the board: its verdict and its attributes (what every verdict sink reads).
Pair = tuple[Verdict, Mapping[str, str]]


class VerdictBoard:
    """The current verdict of every device, updated with the verdicts that changed."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        #: (verdict, its device's attributes) by (node, hw.id): a pair, so a snapshot is one C-level copy
        self._entries: dict[tuple[str, str], Pair] = {}
        self.version = 0  # bumps on every change; watchers wait for it to move
        self._registry_generation = -1  # the registry's generation :meth:`publish` last forgot devices at
        self.closed = False
        #: What the cluster says about each DRA device's taints, by (dra.pool.name, dra.device.name), as the
        #: cluster writer last read it back (JSON-ready; not a verdict change: it does not bump ``version``).
        self._cluster: dict[tuple[str, str], Mapping[str, object]] = {}

    def set_cluster(self, view: dict[tuple[str, str], Mapping[str, object]]) -> None:
        """Replace the cluster's view of the devices' taints (the writer's last read-back)."""
        with self._lock:
            self._cluster = view

    def cluster(self) -> dict[tuple[str, str], Mapping[str, object]]:
        with self._lock:
            return dict(self._cluster)

    def update(self, changed: Iterable[Verdict], attrs_of: Callable[[str, str], Mapping[str, str]]) -> None:
        with self._lock:
            before = self.version
            for verdict in changed:
                key = (verdict.node, verdict.hw_id)
                self._entries[key] = (verdict, attrs_of(*key))
                self.version += 1
            if self.version != before:
                self._lock.notify_all()

    def forget(self, keep: Callable[[tuple[str, str]], bool]) -> None:
        """Drop devices the classifier no longer knows (expired)."""
        with self._lock:
            gone = [k for k in self._entries if not keep(k)]
            for key in gone:
                del self._entries[key]
                self.version += 1
            if gone:
                self._lock.notify_all()

    def wait_for_change(self, seen: int, timeout_s: float) -> int:
        """Block until the board moves past version ``seen`` or ``timeout_s`` passes; the version now.
        (The kubelet stream resends on every change and at least every timeout/3.)"""
        with self._lock:
            self._lock.wait_for(lambda: self.version != seen or self.closed, timeout_s)
            return self.version

    def start(self) -> None:
        """A component with nothing to start: registered last, so shut down first."""

    def shutdown(self, timeout_s: float = 0.0) -> None:
        """Wake every waiter for good, so no sink thread is left waiting on the board."""
        self.wake_all()

    def wake_all(self) -> None:
        """Wake every waiter for good (shutdown): waits return at once from now on."""
        with self._lock:
            self.closed = True
            self._lock.notify_all()

    def snapshot(self) -> list[Pair]:
        with self._lock:
            return list(self._entries.values())

    def publish(self, changed: list[Verdict], registry: DeviceRegistry) -> None:
        """The classifier's changed verdicts onto the board, each with its device's attributes from
        ``registry``; devices the registry has forgotten leave the board. One log line per change, its
        verdict as keys of the line (``node``, ``device``, ``health``, ``state``, ``reasons``,
        ``remediation``, and ``scope``/``group`` for a verdict about more than its device): a failure at
        WARNING, every other change (a recovery) at INFO; only a device's first verdict, when healthy, at
        DEBUG."""

        def attrs_of(node: str, hw_id: str) -> Mapping[str, str]:
            row = registry.row(node, hw_id)
            attrs = registry.attrs[row] if row is not None else {}
            if cv.HW_ID not in attrs:
                return attrs  # (the registry's read-only mapping, shared, not a copy per device)
            return {k: v for k, v in attrs.items() if k != cv.HW_ID}

        with self._lock:
            known = {(v.node, v.hw_id) for v in changed if (v.node, v.hw_id) in self._entries}
        self.update(changed, attrs_of)
        if registry.generation != self._registry_generation:  # a device lost its row: forgotten ones leave
            self.forget(lambda key: registry.row(*key) is not None)
            self._registry_generation = registry.generation
        for v in changed:
            healthy = v.health == "Healthy" and v.state == "ok"
            first = (v.node, v.hw_id) not in known
            level = logging.DEBUG if first and healthy else logging.WARNING if v.health != "Healthy" else logging.INFO
            about = {} if v.scope == "device" else {"scope": v.scope, "group": v.group or "-"}
            fields = keys(
                node=v.node,
                device=v.hw_id,
                health=v.health,
                state=v.state,
                reasons=",".join(v.reasons) or "-",
                remediation=v.remediation,
                **about,
            )
            log.log(level, "verdict: %s", v.message, extra=fields)

    def devices(self, mode: str, shared_only: bool = False) -> list[DeviceView]:
        """One verdict per DRA identity, several nodes' views combined by ``mode`` (``shared_only``: only those
        several nodes see)."""
        with self._lock:
            verdicts = list(map(_VERDICT, self._entries.values()))
        return by_device(verdicts, mode, shared_only)

    def health_by_device(self) -> dict[tuple[str, str], str]:
        with self._lock:
            return {k: v.health for k, (v, _) in self._entries.items()}

    def json_route(self) -> tuple[str, str, bytes]:
        """``/v1/devices``: unhealthy first, then Unknown, then by node and device."""
        order = {"Unhealthy": 0, "Unknown": 1, "Healthy": 2}
        rows = []
        cluster = self.cluster()
        for verdict, _ in sorted(self.snapshot(), key=lambda va: (order[va[0].health], va[0].node, va[0].hw_id)):
            line = verdict.to_json()
            line["since"] = rfc3339(verdict.last_transition_time)
            said = cluster.get((verdict.pool or "", verdict.device or "")) if cluster else None
            if said is not None:
                line["cluster"] = said
            rows.append(line)
        return "200 OK", "application/json", json.dumps({"devices": rows}).encode()
