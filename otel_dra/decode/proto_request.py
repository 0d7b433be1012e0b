"""The protobuf decoder's scratch for one request: its counts and problems, and its good points by (node,
time), read from templates or the plain way alike, until they become frames and the result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from otel_dra.decode.caps import Tally
from otel_dra.decode.checks import unknown_problem
from otel_dra.decode.limits import DecodeLimits
from otel_dra.decode.proto_templates import Layout, Template
from otel_dra.decode.result import MAX_PROBLEMS_PER_REQUEST, ClockJump, DecodeResult
from otel_dra.decode.text import PROTO_DIALECT, one_line
from otel_dra.frame import Frame


def _first(item: tuple[int, str]) -> int:
    return item[0]


@dataclass
class Points:
    """Good points of one node at one time, in request order: series key (device and column,
    floors.series_keys), descriptive set, value."""

    key: np.ndarray
    descr: np.ndarray | None  # None: its template's (``source``), read when needed
    values: np.ndarray
    layout: Layout | None = None  # precomputed (a template's): where these points land
    source: Template | None = None

    def descriptive(self) -> np.ndarray:
        if self.descr is not None:
            return self.descr
        assert self.source is not None  # (what _apply passes)
        return self.source.descr


@dataclass
class Request:
    """Per-request scratch."""

    points: int = 0
    rejected: int = 0
    ignored: int = 0
    stray: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)  # the first few, by ordinal
    problem_count: int = 0
    unknown: dict[str, list[int]] = field(default_factory=dict)  # metric -> [first ordinal, points]
    tally: Tally = field(default_factory=Tally)  # points refused by the caps, by reason
    slots: dict[tuple[str, int], list[Points]] = field(default_factory=dict)  # (node, time) -> parts

    def problem(self, ordinal: int, text: str) -> None:
        """Note a problem; only the first few by position in the request are kept (whatever the
        order they are found in: a section's structural problems come before its points')."""
        self.problem_count += 1
        self.problems.append((ordinal, text))
        if len(self.problems) > 4 * MAX_PROBLEMS_PER_REQUEST:
            self.problems.sort(key=_first)
            del self.problems[MAX_PROBLEMS_PER_REQUEST:]

    def section(
        self,
        points: int,
        rejected: int,
        ignored: int,
        stray: int,
        problems: Sequence[tuple[int, str]],
        unknown: Sequence[tuple[int, str, int]],
        base: int,
    ) -> None:
        """A section's counts and structural problems (``base``: its first point's ordinal in the request)."""
        self.points += points
        self.rejected += rejected
        self.ignored += ignored
        self.stray += stray
        for ordinal, text in problems:
            self.problem(base + ordinal, text)
        for ordinal, name, n in unknown:
            seen = self.unknown.get(name)
            if seen is None:
                self.unknown[name] = [base + ordinal, n]
            else:
                seen[1] += n

    def add_points(
        self,
        node: str,
        key: np.ndarray,
        descr: np.ndarray | None,
        times: np.ndarray,
        values: np.ndarray,
        layout: Layout | None = None,
        source: Template | None = None,
    ) -> None:
        """Good points of one section (their series keys), split by time (in order of first appearance);
        ``descr`` None: ``source``'s (a template's whole list of points)."""
        if not len(key):
            return
        if (times == times[0]).all():
            self.slots.setdefault((node, int(times[0])), []).append(Points(key, descr, values, layout, source))
            return
        if descr is None:
            assert source is not None
            descr = source.descr
        uniq, index = np.unique(times, return_index=True)
        for t in uniq[np.argsort(index, kind="stable")].tolist():
            mask = times == t
            self.slots.setdefault((node, int(t)), []).append(Points(key[mask], descr[mask], values[mask]))

    def result(self, frames: list[Frame], limits: DecodeLimits, clock_jumps: tuple[ClockJump, ...]) -> DecodeResult:
        """The request's result: its unknown metrics and its caps' refusals (one line each, first: one line
        says what many points share) join its problems, the first few quoted in request order."""
        for name, (ordinal, n) in self.unknown.items():
            self.problem_count += 1
            self.problems.append((ordinal, unknown_problem(PROTO_DIALECT, name, n)))
        for line in reversed(self.tally.lines(limits)):
            self.problem_count += 1
            self.problems.append((-1, line))
        self.problems.sort(key=_first)
        problems = tuple(one_line(text) for _, text in self.problems[:MAX_PROBLEMS_PER_REQUEST])
        return DecodeResult(
            frames,
            self.points,
            self.rejected,
            problems,
            self.problem_count,
            limited=self.tally.limited(),
            ignored=self.ignored,
            clock_jumps=clock_jumps,
            stray=self.stray,
        )


def time_of(key: tuple[str, int]) -> int:
    return key[1]
