"""One verdict per DRA device when several nodes see it (network-attached devices).

A device is keyed by its DRA identity (``dra.pool.name``, ``dra.device.name``); when more
than one node reports it, each node's verdict is a *view*, and the views are combined by
policy:

- ``any``: the device is as bad as its worst view (one node seeing a failure is enough);
- ``majority``: as bad as at least half of its views say (one node's broken path doesn't
  fail a device the others see healthy);
- ``all``: only as bad as every view agrees.

Unknown views (a silent observer) don't vote while any view is known. The views that
disagree with the combined verdict are reported per node, so an admin can tell "the device
is broken" from "one node's path to it is".
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from otel_dra.classifier.verdict import Verdict
from otel_dra.vocabulary import COMBINE_MODES, REMEDIATIONS

_SEVERITY = {None: -1, "ok": 0, "predicted_failure": 1, "degraded": 2, "failed": 3}


@dataclass(frozen=True)
class DeviceView:
    """A DRA device's combined verdict and the views it came from."""

    pool: str
    device: str
    verdict: Verdict
    views: tuple[Verdict, ...]
    disagreeing: tuple[str, ...]  # nodes whose view's health differs from the combined one


def _rank(verdict: Verdict) -> int:
    return _SEVERITY[verdict.state]


def combine(views: Sequence[Verdict], mode: str) -> Verdict:
    """The combined verdict of several nodes' views of one device (see the module docstring)."""
    if mode not in COMBINE_MODES:
        raise ValueError(f"combine mode must be one of {', '.join(COMBINE_MODES)}, got {mode!r}")
    if len(views) == 1:
        return views[0]
    known = [v for v in views if v.health != "Unknown"] or list(views)
    ranked = sorted(known, key=_rank, reverse=True)  # worst first
    if mode == "any":
        pick = 0
    elif mode == "all":
        pick = len(ranked) - 1
    else:  # majority: the worst state that at least half of the views share or exceed
        pick = math.ceil(len(ranked) / 2) - 1
    chosen = ranked[pick]
    bar = _rank(chosen)
    agreeing = [v for v in known if _rank(v) >= bar]
    reasons = tuple(sorted({r for v in agreeing for r in v.reasons})) if bar > 0 else ()
    remediation = max((v.remediation for v in agreeing), key=REMEDIATIONS.index) if bar > 0 else "none"
    summary = f"seen from {len(views)} nodes ({mode}): " + ", ".join(
        f"{v.node} {v.health}{'/' + v.state if v.state else ''}" for v in views
    )
    message = summary + (f"; {chosen.message}" if bar > 0 else "")
    return replace(
        chosen,
        reasons=reasons,
        remediation=remediation,
        message=message,
        last_reported_time=max(v.last_reported_time for v in views),
    )


_IDENTITY = operator.attrgetter("pool", "device")


def by_device(verdicts: Iterable[Verdict], mode: str, shared_only: bool = False) -> list[DeviceView]:
    """Group verdicts by DRA identity and combine each group; verdicts without one are skipped. ``shared_only``:
    only the devices more than one node sees (a fleet's disagreement metric: the rest need no combining)."""
    if shared_only:  # (counted at C speed first: in a fleet of 100,000 devices a few are seen by several nodes)
        verdicts = list(verdicts)
        counts = Counter(map(_IDENTITY, verdicts))
        shared = {key for key, n in counts.items() if n > 1 and key[0] and key[1]}
        verdicts = itertools.compress(verdicts, map(shared.__contains__, map(_IDENTITY, verdicts))) if shared else []
    groups: dict[tuple[str, str], list[Verdict]] = defaultdict(list)
    for v in verdicts:
        pool, device = v.pool, v.device
        if pool and device:
            groups[(pool, device)].append(v)
    out = []
    for (pool, device), views in groups.items():
        combined = combine(views, mode)
        disagreeing = tuple(v.node for v in views if v.health != combined.health)
        out.append(DeviceView(pool, device, combined, tuple(views), disagreeing))
    return out
