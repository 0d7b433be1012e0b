"""A verdict and its wire format: the one writer (:meth:`Verdict.to_json`) and the one reader
(:meth:`Verdict.from_json`) of the verdict line that ``replay`` writes, ``/v1/devices`` serves,
``k8s render`` and ``status`` read back and the scorer scores (contract section 4; README,
"Replay recorded telemetry"). Extended by adding keys only: a reader ignores keys it does not know.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otel_dra import conventions as cv
from otel_dra.vocabulary import HEALTH, REASONS, REMEDIATIONS, SCOPES


def rfc3339(unix_nano: int) -> str:
    return dt.datetime.fromtimestamp(unix_nano / 1e9, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class VerdictInputError(ValueError):
    """A verdict that cannot be read; ``str()`` is one line naming where (file and line, or field)."""


def check_judgement(
    where: str, health: object, state: object, reasons: object, remediation: object, scope: object
) -> tuple[str, str | None, tuple[str, ...], str, str]:
    """The judgement a verdict carries, checked against the contract's vocabularies: shared by the verdict
    line and the state file's remembered verdict (``classifier.memory``), which store it under other keys."""
    if health not in HEALTH:
        raise VerdictInputError(f"{where}: health {health!r} is not one of: {', '.join(HEALTH)}")
    if state is not None and not isinstance(state, str):
        raise VerdictInputError(f"{where}: hw.state {state!r} is not a string")
    if not isinstance(reasons, list | tuple) or not all(r in REASONS for r in reasons):
        raise VerdictInputError(f"{where}: reasons {reasons!r} are not contract reasons ({', '.join(REASONS)})")
    if remediation not in REMEDIATIONS:
        raise VerdictInputError(f"{where}: remediation {remediation!r} is not one of: {', '.join(REMEDIATIONS)}")
    if scope not in SCOPES:
        raise VerdictInputError(f"{where}: scope {scope!r} is not one of: {', '.join(SCOPES)}")
    return str(health), state, tuple(reasons), str(remediation), str(scope)


def _int(row: Mapping[str, Any], key: str, where: str, required: bool = False) -> int:
    """Unix nanoseconds, as an integer, or written as a whole float or a string of digits (other writers)."""
    value = row.get(key)
    if value is None and not required:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise VerdictInputError(f"{where}: {key} {value!r} is not unix nanoseconds (an integer)")


def _text(row: Mapping[str, Any], key: str, where: str) -> str | None:
    value = row.get(key)
    if value is not None and not isinstance(value, str):
        raise VerdictInputError(f"{where}: {key} {value!r} is not a string")
    return value


_REQUIRED = (cv.K8S_NODE_NAME_ATTR, cv.HW_ID, "health")


@dataclass(frozen=True, slots=True)
class Verdict:
    """One device's verdict: the verdict line's fields, in the vocabulary of ``otel_dra.vocabulary``,
    plus the seed thread's transition and report times. Slotted: a fleet's board holds one per device."""

    time_unix_nano: int
    node: str
    hw_id: str
    health: str
    state: str | None
    reasons: tuple[str, ...]
    remediation: str
    message: str
    pool: str | None = None
    device: str | None = None
    last_transition_time: int = 0  # unix ns
    last_reported_time: int = 0  # unix ns: the device's newest sample
    driver: str | None = None  # dra.driver.name, when the telemetry carries it
    #: What the verdict is about (``otel_dra.vocabulary.SCOPES``): the device itself, or what it shares
    #: (the workload on it, its node, ...), named by ``group`` (``node/train-007``); None for a device's own.
    scope: str = "device"
    group: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The verdict line (README, "Replay recorded telemetry"; extended by adding keys only)."""
        out: dict[str, Any] = {
            "time_unix_nano": self.time_unix_nano,
            cv.K8S_NODE_NAME_ATTR: self.node,
            cv.HW_ID: self.hw_id,
            "health": self.health,
            cv.HW_STATE: self.state,
            "reasons": list(self.reasons),
            "remediation": self.remediation,
            "message": self.message,
        }
        if self.pool is not None:
            out[cv.DRA_POOL_NAME] = self.pool
        if self.device is not None:
            out[cv.DRA_DEVICE_NAME] = self.device
        if self.driver is not None:
            out[cv.DRA_DRIVER_NAME] = self.driver
        out["scope"] = self.scope
        if self.group is not None:
            out["group"] = self.group
        out["last_transition_time"] = self.last_transition_time
        out["last_reported_time"] = self.last_reported_time
        return out

    @classmethod
    def from_json(cls, row: object, where: str, timed: bool = False) -> Verdict:
        """A verdict line, checked: :class:`VerdictInputError` naming ``where`` and the field otherwise. A line
        without ``scope`` (an older agent's) is about the device; one without ``remediation``, ``none``; one
        without ``time_unix_nano`` is at 0 unless ``timed`` (a scorer places verdicts in time: it needs one)."""
        if not isinstance(row, Mapping):
            raise VerdictInputError(f"{where}: expected a verdict object, got {type(row).__name__}")
        missing = [k for k in _REQUIRED if not isinstance(row.get(k), str)]
        if missing:
            raise VerdictInputError(f"{where}: not a verdict line: no {', '.join(missing)}")
        health, state, reasons, remediation, scope = check_judgement(
            where,
            row["health"],
            row.get(cv.HW_STATE),
            row.get("reasons") or [],
            row.get("remediation") or "none",
            row.get("scope") or "device",
        )
        message = row.get("message")
        return cls(
            time_unix_nano=_int(row, "time_unix_nano", where, required=timed),
            node=row[cv.K8S_NODE_NAME_ATTR],
            hw_id=row[cv.HW_ID],
            health=health,
            state=state,
            reasons=reasons,
            remediation=remediation,
            message=message if isinstance(message, str) else "",
            pool=_text(row, cv.DRA_POOL_NAME, where),
            device=_text(row, cv.DRA_DEVICE_NAME, where),
            last_transition_time=_int(row, "last_transition_time", where),
            last_reported_time=_int(row, "last_reported_time", where),
            driver=_text(row, cv.DRA_DRIVER_NAME, where),
            scope=scope,
            group=_text(row, "group", where),
        )
