"""The brake on mass quarantine: a budget of new acting taints, and what the writer does past it.

A policy mistake, a driver bug that bumps a counter on every GPU, or a telemetry glitch can make a
whole cluster Unhealthy in one evaluation; with ``NoExecute`` the cluster's one writer of
DeviceTaintRules would then evict every job. NVIDIA's NVSentinel has a circuit breaker for this and
AMD's GPU operator caps parallel remediations; this is ours (the policy's ``kubernetes.budget``):

- a *new acting taint* is a rendered rule whose effect is not ``None`` where the cluster has no rule
  of that name, or has it with a milder effect (``None`` to ``NoSchedule``, either to ``NoExecute``);
- over a sliding ``window``, the writer may add at most ``max(devices x share, 1)`` and at most
  ``devices`` of them (``no_execute_share``/``no_execute_devices`` for ``NoExecute``, tighter), counted
  by device;
- a batch that would go past either trips the brake: what still fits is written as rendered (most
  severe first, then by name), the rest of the batch, and every new acting taint while the brake
  holds, is written with the effect the cluster already has for it, ``None`` for a new rule: the
  fact is recorded, nothing more is taken away;
- a rule already acting keeps its effect; the brake only withholds new ones;
- it holds until an operator releases it, or for ``cooldown`` after it tripped (``0s``: until released);
  a release also empties the window, so the next batch has a whole budget again;
- its state rides on the leader's Lease (:meth:`Brake.annotations`, :meth:`Brake.adopt`), so a restarted
  leader, or the next one, holds the same brake;
- an operator releases it by writing a new value under ``<domain>/quarantine-brake-release`` on that
  Lease (``otel-dra k8s brake release`` does; so does ``kubectl annotate --overwrite``): the leader reads
  the Lease at every renewal (:meth:`Brake.watch`) and honours each new value once.

:func:`gate` is pure (rules, the cluster's rules, the state and the time in; rules and the state
out), so every path is tested without a cluster; :class:`Brake` keeps the state between batches.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from otel_dra.policy import Policy
from otel_dra.sinks.k8s.render import device_of, effect_of

log = logging.getLogger(__name__)

SECTION = "kubernetes"
NONE, NO_SCHEDULE, NO_EXECUTE = "None", "NoSchedule", "NoExecute"
#: How far each effect takes a device away: a change to a higher rank is a new acting taint.
RANK = {NONE: 0, NO_SCHEDULE: 1, NO_EXECUTE: 2}


@dataclass(frozen=True)
class BudgetSettings:
    """The policy's ``kubernetes.budget``, typed (seconds, shares of the fleet's devices, counts)."""

    window_s: float
    share: float
    devices: int
    no_execute_share: float
    no_execute_devices: int
    cooldown_s: float

    @classmethod
    def from_policy(cls, policy: Policy) -> BudgetSettings:
        b = policy.sections[SECTION]["budget"]
        return cls(
            window_s=float(b["window"]),
            share=float(b["share"]),
            devices=int(b["devices"]),
            no_execute_share=float(b["no_execute_share"]),
            no_execute_devices=int(b["no_execute_devices"]),
            cooldown_s=float(b["cooldown"]),
        )

    def allowed(self, fleet_devices: int) -> tuple[int, int]:
        """(acting, NoExecute) devices that may gain a new acting taint within a window: at least one each."""
        acting = min(self.devices, max(1, math.floor(fleet_devices * self.share)))
        no_execute = min(self.no_execute_devices, max(1, math.floor(fleet_devices * self.no_execute_share)), acting)
        return acting, no_execute


def annotation_key(policy: Policy) -> str:
    """The Lease annotation that carries the brake's state: ``<kubernetes.domain>/quarantine-brake``."""
    return f"{policy.sections[SECTION]['domain']}/quarantine-brake"


def release_key(key: str) -> str:
    """The Lease annotation an operator writes to release the brake whose state is under ``key``."""
    return f"{key}-release"


@dataclass(frozen=True)
class BrakeState:
    """What the brake remembers: when it tripped (None: it has not, or was released), why, and the new acting
    taints it let through within the window (time, device, effect)."""

    tripped_at: float | None = None
    why: str = ""
    added: tuple[tuple[float, str, str], ...] = ()
    withheld: int = 0  # rules written milder than rendered in the last batch
    released: str = ""  # the last release request honoured (the value of the release annotation)

    @property
    def tripped(self) -> bool:
        return self.tripped_at is not None


@dataclass
class Decision:
    """One batch through the brake."""

    rules: list[dict[str, Any]]
    state: BrakeState
    tripped_now: bool = False  # this batch tripped it
    released_now: bool = False  # its cool-down ran out before this batch
    withheld: list[str] = field(default_factory=list)  # rule names written milder than rendered


def _device(obj: Mapping[str, Any]) -> str:
    """The key a device is counted (and carried on the Lease) under: ``driver/pool/device``."""
    return "/".join(map(str, device_of(obj)))


def _with_effect(obj: Mapping[str, Any], effect: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    out["spec"]["taint"]["effect"] = effect
    return out


def gate(
    desired: Sequence[Mapping[str, Any]],
    existing: Sequence[Mapping[str, Any]],
    state: BrakeState,
    settings: BudgetSettings,
    fleet_devices: int,
    now: float,
) -> Decision:
    """The rules to write for ``desired`` given the cluster's ``existing`` managed rules (see the module doc)."""
    released = False
    if state.tripped and settings.cooldown_s > 0 and now >= (state.tripped_at or 0.0) + settings.cooldown_s:
        state, released = replace(state, tripped_at=None, why=""), True
    recent = tuple(a for a in state.added if now - a[0] < settings.window_s)
    have = {(o.get("metadata") or {}).get("name"): o for o in existing}
    acting_cap, no_execute_cap = settings.allowed(fleet_devices)
    acting_seen = {device for _, device, _ in recent}
    no_execute_seen = {device for _, device, effect in recent if effect == NO_EXECUTE}
    # New acting taints, most disruptive first, then by name (deterministic: the same batch trips the same way).
    new = []
    for obj in desired:
        effect = effect_of(obj)
        old = effect_of(have.get(obj["metadata"]["name"]))
        if RANK.get(effect, 0) > RANK.get(old, 0):
            new.append((-RANK[effect], obj["metadata"]["name"], obj))
    new.sort(key=lambda item: (item[0], item[1]))
    allowed: set[str] = set()
    withheld: list[str] = []
    added = list(recent)
    tripped_now = False
    for _, name, obj in new:
        effect, device = effect_of(obj), _device(obj)
        fits = not state.tripped and not tripped_now
        if fits and device not in acting_seen and len(acting_seen) >= acting_cap:
            fits = False
        if fits and effect == NO_EXECUTE and device not in no_execute_seen and len(no_execute_seen) >= no_execute_cap:
            fits = False
        if fits:
            allowed.add(name)
            acting_seen.add(device)
            if effect == NO_EXECUTE:
                no_execute_seen.add(device)
            added.append((now, device, effect))
            continue
        withheld.append(name)
        if not state.tripped and not tripped_now:
            tripped_now = True
    why = state.why
    if tripped_now:
        why = (
            f"{len(new)} new acting taints in one batch, over the budget of {acting_cap} devices "
            f"({no_execute_cap} NoExecute) per {settings.window_s:g}s for a fleet of {fleet_devices} devices"
        )
    out = []
    withheld_set = set(withheld)
    for obj in desired:
        name = obj["metadata"]["name"]
        if name in withheld_set:
            out.append(_with_effect(obj, effect_of(have.get(name)) if name in have else NONE))
        else:
            out.append(dict(obj))
    new_state = BrakeState(
        tripped_at=now if tripped_now else state.tripped_at,
        why=why,
        added=tuple(added),
        withheld=len(withheld),
        released=state.released,
    )
    return Decision(out, new_state, tripped_now, released, withheld)


def parse_state(text: str) -> BrakeState:
    """The state a Lease annotation carries (:meth:`Brake.annotations`). ValueError: it does not parse (an
    unreadable one is ignored: the brake starts released, as a new writer would)."""
    try:
        doc = json.loads(text)
        tripped = doc.get("trippedAt")
        return BrakeState(
            tripped_at=None if tripped is None else float(tripped),
            why=str(doc.get("why") or ""),
            added=tuple((float(a), str(d), str(e)) for a, d, e in doc.get("added") or []),
            released=str(doc.get("released") or ""),
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(str(exc)) from None


class Brake:
    """The brake's state between batches, read by the writer's thread and the metrics' (a lock between)."""

    def __init__(self, settings: BudgetSettings, state: BrakeState | None = None) -> None:
        self.settings = settings
        self._state = state or BrakeState()
        self._lock = threading.Lock()

    @property
    def state(self) -> BrakeState:
        with self._lock:
            return self._state

    def gate(
        self, desired: Sequence[Mapping[str, Any]], existing: Sequence[Mapping[str, Any]], devices: int, now: float
    ) -> Decision:
        with self._lock:
            decision = gate(desired, existing, self._state, self.settings, devices, now)
            self._state = decision.state
        return decision

    def annotations(self, key: str) -> dict[str, str]:
        """The state as a Lease annotation (``key``), so that the next leader, or this one restarted, holds the
        same brake: when it tripped, why, and the devices that gained an acting taint within the window (each
        once, its strongest effect: at most the budget's count)."""
        state = self.state
        added: dict[str, tuple[float, str]] = {}
        for at, device, effect in state.added:
            old = added.get(device)
            if old is None or RANK.get(effect, 0) >= RANK.get(old[1], 0):
                added[device] = (max(at, old[0]) if old else at, effect)
        doc = {
            "trippedAt": state.tripped_at,
            "why": state.why,
            "added": [[at, device, effect] for device, (at, effect) in sorted(added.items())],
            "released": state.released,
        }
        return {key: json.dumps(doc, separators=(",", ":"), sort_keys=True)}

    def adopt(self, annotations: Mapping[str, str], key: str) -> None:
        """Take over the state a Lease carries under ``key`` (see :func:`parse_state`)."""
        text = annotations.get(key)
        if text is None:
            return
        try:
            state = parse_state(text)
        except ValueError as exc:
            log.warning(
                "the brake on mass quarantine: annotation %s on the Lease is not readable (%s); ignored", key, exc
            )
            return
        with self._lock:
            self._state = state
        if state.tripped:
            log.error("the brake on mass quarantine holds (taken over from the Lease): %s", state.why)

    def instrument(self, meter: Any) -> None:
        """``otel_dra.k8s.brake.tripped`` and ``.withheld`` on ``meter`` (an OpenTelemetry Meter)."""
        from opentelemetry.metrics import CallbackOptions, Observation

        from otel_dra import conventions as cv

        def tripped(_: CallbackOptions) -> list[Observation]:
            return [Observation(int(self.state.tripped))]

        def withheld(_: CallbackOptions) -> list[Observation]:
            return [Observation(self.state.withheld)]

        for spec, callback in ((cv.OTEL_DRA_K8S_BRAKE_TRIPPED, tripped), (cv.OTEL_DRA_K8S_BRAKE_WITHHELD, withheld)):
            meter.create_observable_gauge(spec.name, callbacks=[callback], unit=spec.unit, description=spec.description)

    def watch(self, annotations: Mapping[str, str], key: str) -> bool:
        """Honour an operator's release written on the Lease (a value under :func:`release_key` not honoured
        before). True when this call released the brake."""
        token = annotations.get(release_key(key))
        if not token or token == self.state.released:
            return False
        was = self.release(token)
        if was:
            log.warning("the brake on mass quarantine was released by an operator (%s=%s)", release_key(key), token)
        else:
            log.info("a release of the brake on mass quarantine (%s) found it not tripped: nothing to do", token)
        return was

    def release(self, token: str = "") -> bool:
        """An operator's release: the brake opens and the window empties. True when it was tripped."""
        with self._lock:
            was = self._state.tripped
            self._state = replace(self._state, tripped_at=None, why="", added=(), withheld=0, released=token)
        return was


# -- the operator's side: otel-dra k8s brake status / release --------------------------------------------------
@dataclass(frozen=True)
class LeaseBrake:
    """What the leader's Lease says of the brake: its state (None: no leader has written one), the release asked
    for and not yet honoured (""), and the holder."""

    state: BrakeState | None
    pending_release: str
    holder: str


def read_lease_brake(lease: Any, key: str) -> LeaseBrake:
    """The brake as ``lease`` (a V1Lease) carries it under ``key``; ValueError when unreadable."""
    notes = (lease.metadata.annotations if lease.metadata else None) or {}
    state = parse_state(notes[key]) if key in notes else None
    asked = notes.get(release_key(key), "")
    pending = asked if asked and (state is None or asked != state.released) else ""
    return LeaseBrake(state, pending, (lease.spec.holder_identity if lease.spec else "") or "")


def request_release(
    api_client: Any, name: str, namespace: str, key: str, token: str, tries: int = 5, timeout_s: float = 10.0
) -> LeaseBrake:
    """Write ``token`` under :func:`release_key` on the Lease (read, then replace with its resourceVersion; a
    conflict with the leader's renewal is read again and retried): the leader honours it at its next renewal.
    Returns the brake as the Lease said before the write. Raises the client's ApiException."""
    from kubernetes import client

    api = client.CoordinationV1Api(api_client)
    for attempt in range(tries):
        lease = api.read_namespaced_lease(name, namespace, _request_timeout=timeout_s)
        before = read_lease_brake(lease, key)
        meta = lease.metadata or client.V1ObjectMeta(name=name, namespace=namespace)
        meta.annotations = {**(meta.annotations or {}), release_key(key): token}
        lease.metadata = meta
        try:
            api.replace_namespaced_lease(name, namespace, lease, _request_timeout=timeout_s)
            return before
        except client.ApiException as exc:
            if exc.status != 409 or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")
