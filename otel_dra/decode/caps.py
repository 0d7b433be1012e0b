"""The caps (:mod:`~otel_dra.decode.limits`) as the decoders apply them: a point refused by one is a
:class:`Refusal`, and one request's refusals are a :class:`Tally`, one line per reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from otel_dra.decode import limits as lim
from otel_dra.decode.attributes import NODE
from otel_dra.decode.limits import DecodeLimits, node_name_problem
from otel_dra.decode.text import name

#: The reasons a point is refused by a cap (a target or a check answering one of these is a refusal).
LIMITED: Final = frozenset(lim.LIMIT_REASONS)
#: Refusals that depend on what other nodes hold (a slot may free up), or on who sent the request: never
#: baked into a cache.
VOLATILE: Final = frozenset({lim.NODES, lim.DEVICES, lim.FORBIDDEN_NODE})
#: Refusals of a device (by the node's or the fleet's cap): never cached, another node may have room for it.
DEVICE_REASONS: Final = frozenset({lim.DEVICES, lim.DEVICES_PER_NODE})


@dataclass(frozen=True, slots=True)
class Refusal:
    """A point refused by a cap: the reason, what it would have added (counted once per request) and
    that thing as a message names it. A series kind refused names its ``device`` too: the device step
    comes first, so whoever reuses the refusal for another point takes that step again
    (:meth:`DecoderCore._reuse`)."""

    reason: str
    key: Any
    example: str
    device: str | None = None


@dataclass(slots=True)
class _Count:
    points: int
    things: int
    nodes: int
    node: str  # the first node named
    example: str  # the first thing named


class Tally:
    """Points refused by the caps in one request (or one template), by reason: one line each, so a
    request naming 200,000 devices past a cap says so in one line, not 200,000."""

    def __init__(self) -> None:
        self.counts: dict[str, _Count] = {}
        self._seen: set[tuple[str, Any]] = set()
        self._nodes: set[tuple[str, str]] = set()

    def __bool__(self) -> bool:
        return bool(self.counts)

    def add(self, refusal: Refusal, node: str, n: int = 1) -> None:
        """``n`` points refused for ``refusal``, on ``node``."""
        reason = refusal.reason
        count = self.counts.get(reason)
        if count is None:
            count = self.counts[reason] = _Count(0, 0, 0, node, refusal.example)
        count.points += n
        if (reason, refusal.key) not in self._seen:
            self._seen.add((reason, refusal.key))
            count.things += 1
        if (reason, node) not in self._nodes:
            self._nodes.add((reason, node))
            count.nodes += 1

    def merge(self, other: Tally) -> None:
        """Add another section's counts (sections are counted apart: a device named in two is two)."""
        for reason, theirs in other.counts.items():
            mine = self.counts.get(reason)
            if mine is None:
                self.counts[reason] = _Count(theirs.points, theirs.things, theirs.nodes, theirs.node, theirs.example)
            else:
                mine.points += theirs.points
                mine.things += theirs.things
                mine.nodes += theirs.nodes

    def frozen(self) -> Tally:
        """The counts alone (a template keeps these, not the sets that made them)."""
        copy = Tally()
        copy.merge(self)
        return copy

    @property
    def volatile(self) -> bool:
        return not VOLATILE.isdisjoint(self.counts)

    def limited(self) -> dict[str, int]:
        """Points refused, by reason, in the order of LIMIT_REASONS."""
        return {r: self.counts[r].points for r in lim.LIMIT_REASONS if r in self.counts}

    def lines(self, limits: DecodeLimits) -> list[str]:
        """One short line per reason."""
        counts = self.counts
        return [_limit_line(reason, counts[reason], limits) for reason in lim.LIMIT_REASONS if reason in counts]


def _on(c: _Count, what: str) -> str:
    return f"{what} {name(c.node)}" if c.nodes == 1 else f"{c.nodes:,} {what}s (first {name(c.node)})"


def _limit_line(reason: str, c: _Count, limits: DecodeLimits) -> str:
    p = f"{c.points:,} point{'s' if c.points != 1 else ''}"
    if reason == lim.FORBIDDEN_NODE:
        return f"{p} of {_on(c, 'node')} refused: this client may not report for it (its certificate names another)"
    if reason == lim.NODE_NAME:
        return f"{p} of {_on(c, 'node')} refused: {NODE} {node_name_problem(c.node)}"
    if reason == lim.NODES:
        new = f"new node {name(c.node)}" if c.things == 1 else f"{c.things:,} new nodes (first {name(c.node)})"
        return f"{p} of {new} refused: more than {limits.max_nodes:,} nodes (--max-nodes)"
    if reason in (lim.DEVICES_PER_NODE, lim.DEVICES):
        new = f"new device {name(c.example)}" if c.things == 1 else f"{c.things:,} new devices"
        cap = (
            f"more than {limits.max_devices_per_node:,} devices on one node (--max-devices-per-node)"
            if reason == lim.DEVICES_PER_NODE
            else f"more than {limits.max_devices:,} devices in all (--max-devices)"
        )
        return f"{p} of {new} on {_on(c, 'node')} refused: {cap}"
    if reason == lim.SERIES:
        new = "a new series kind" if c.things == 1 else f"{c.things:,} new series kinds"
        return (
            f"{p} of {new} (first of {name(c.example)}) refused: more than {limits.max_series:,} "
            "series kinds (--max-series)"
        )
    return (
        f"{p} (first of {name(c.example)}) refused: an identity attribute longer than "
        f"{limits.max_attribute_length:,} characters (--max-attribute-length)"
    )
