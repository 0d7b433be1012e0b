"""Fault injection requests: ``DEVICE:REASON[@SECONDS]``, reasons as ``otel_dra.vocabulary.REASONS`` names them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from otel_dra.vocabulary import REASONS

_FAULT = re.compile(r"^(?P<device>[^:@\s]+):(?P<reason>[a-z_]+)(?:@(?P<at>[0-9]+(?:\.[0-9]+)?))?$")

#: A device part that means "the whole node" (useful for ``stale``).
ANY_DEVICE = "*"


@dataclass(frozen=True)
class Fault:
    """Inject ``reason`` on ``device`` (an ``hw.id``, or ``*``) ``at`` seconds after start."""

    device: str
    reason: str
    at: float = 0.0

    def __str__(self) -> str:
        return f"{self.device}:{self.reason}@{self.at:g}"


class FaultSpecError(ValueError):
    """A ``--fault`` value that does not parse; the message says how to fix it."""


def parse_fault(text: str) -> Fault:
    """Parse ``DEVICE:REASON[@SECONDS]``; the error lists every valid reason."""
    match = _FAULT.match(text.strip())
    if match is None:
        raise FaultSpecError(
            f"{text!r} is not DEVICE:REASON[@SECONDS] (e.g. gpu-3:memory_ecc@30); reasons: {', '.join(REASONS)}"
        )
    reason = match["reason"]
    if reason not in REASONS:
        raise FaultSpecError(f"unknown reason {reason!r} in {text!r}; valid reasons: {', '.join(REASONS)}")
    return Fault(match["device"], reason, float(match["at"] or 0.0))
