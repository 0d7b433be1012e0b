"""The JSON decoder's per-line state: the line's log of problems (capped) and its scratch, among it what
is known of each attribute list of a tokenized line (:mod:`~otel_dra.decode.json_shapes`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from otel_dra.decode.caps import Tally
from otel_dra.decode.checks import unknown_problem
from otel_dra.decode.json_shapes import Shape
from otel_dra.decode.json_templates import Template
from otel_dra.decode.json_values import attrs_of_list
from otel_dra.decode.limits import DecodeLimits
from otel_dra.decode.result import MAX_PROBLEMS_PER_REQUEST, ClockJump, DecodeError, DecodeResult
from otel_dra.decode.text import JSON_DIALECT, one_line
from otel_dra.frame import Frame

#: Point-level problems reported per line; the rest are counted in one summary error.
MAX_POINT_ERRORS_PER_LINE: Final = 5
#: Metric-level notes (unknown metric, wrong kind) reported per line before summarising.
MAX_METRIC_ERRORS_PER_LINE: Final = 10


class LineLog:
    """The errors of one line, capped so a garbage line can't flood the output."""

    def __init__(self, lineno: int) -> None:
        self.lineno = lineno
        self.limit_errors: list[DecodeError] = []  # one per cap reason, first: they say what many points share
        self.metric_errors: list[DecodeError] = []
        self.point_errors: list[DecodeError] = []
        self.hidden = 0

    def metric(self, message: str) -> None:
        if len(self.metric_errors) < MAX_METRIC_ERRORS_PER_LINE:
            self.metric_errors.append(DecodeError(self.lineno, one_line(message)))
        else:
            self.hidden += 1

    def point(self, message: str) -> None:
        if len(self.point_errors) < MAX_POINT_ERRORS_PER_LINE:
            self.point_errors.append(DecodeError(self.lineno, one_line(message)))
        else:
            self.hidden += 1

    @property
    def empty(self) -> bool:
        """Whether nothing is logged (:meth:`errors` would be empty)."""
        return not (self.limit_errors or self.metric_errors or self.point_errors or self.hidden)

    def errors(self) -> list[DecodeError]:
        out = self.limit_errors + self.metric_errors + self.point_errors
        if self.hidden:
            out.append(DecodeError(self.lineno, f"{self.hidden:,} more problems on this line not shown"))
        return out


@dataclass
class Line:
    """Per-line scratch of :meth:`~otel_dra.decode.otlp_json.OtlpJsonDecoder.decode`."""

    log: LineLog
    entries: list[int]
    slots: list[int]
    values: list[float]
    slot_node: list[str]
    slot_time: list[int]
    slot_of: dict[tuple[str, int], int]
    unknown: dict[str, int]  # unknown metric name -> points skipped
    times: dict[str, dict[str, int]]  # node -> timeUnixNano text -> slot (-1: older than the node's newest)
    tally: Tally  # points refused by the caps
    points: int = 0
    skipped: int = 0
    ignored: int = 0  # points of otel-dra's own telemetry, set aside (checks.self_telemetry)
    stray: int = 0  # points with attributes not read (attributes.READ_ATTRIBUTES)
    # A tokenized line: its attribute lists' text by position, and what is known of each position.
    texts: list[bytes] | None = None
    # ... parsed (a line of a new shape: each checked to be a JSON array; None where one was checked in a line before)
    items: list[Any] | None = None
    shape: Shape | None = None  # the line's shape, when one was read before
    ents: list[int] = field(default_factory=list)  # each position's entry (the shape's; UNKNOWN_ENTRY without)
    attrs: dict[int, dict[str, str] | str] = field(default_factory=dict)  # positions' attributes, as read
    metric: int = 0  # the metric being read, counted in the line's order
    # What a line read without a shape learns, for the shape made of it (None: none is made).
    learned: list[int] | None = None
    names: list[str | None] = field(default_factory=list)
    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)
    resources: dict[int, dict[str, str] | str] = field(default_factory=dict)
    # Each metric read (its points taken, or some): its resource (by index), whether a counter, its points; what a
    # template of the line is made of (json_templates).
    spans: list[tuple[int, bool, int]] = field(default_factory=list)
    resource: int = 0  # the resource being read
    # Read off templates (json_templates): each resource's (or the whole line's) template, its points' slot (-1:
    # several: in ``slots``) and their values.
    parts: list[tuple[Template, int, Any, np.ndarray]] = field(default_factory=list)

    @classmethod
    def new(cls, log: LineLog) -> Line:
        """A line's scratch before anything of it is read."""
        return cls(log, [], [], [], [], [], {}, {}, {}, Tally())

    def attrs_at(self, raw: Any) -> dict[str, str] | str:
        """The attributes of a resource or point: from its list's position in a tokenized line (read once
        per line), or read from its list."""
        if self.texts is not None and type(raw) is int:
            found = self.attrs.get(raw)
            if found is None:
                items = self.items[raw] if self.items is not None else None
                if items is None:  # (not parsed: a list checked in a line before, or a line of a shape read before)
                    items = json.loads(self.texts[raw])
                found = self.attrs[raw] = attrs_of_list(items)
            return found
        if raw is None:
            return {}
        return attrs_of_list(raw)

    def resource_attrs(self, raw: Any) -> dict[str, str] | str:
        """A resource's attributes: its shape's, or read (and kept for the shape being learned)."""
        if self.texts is not None and type(raw) is int:
            if self.shape is not None:
                found = self.shape.resources.get(raw)
                if found is not None:
                    return found
            attrs = self.attrs_at(raw)
            if self.learned is not None:
                self.resources[raw] = attrs
            return attrs
        return self.attrs_at(raw)

    def result(self, frames: list[Frame], limits: DecodeLimits, clock_jumps: tuple[ClockJump, ...]) -> DecodeResult:
        """The line's result: its unknown metrics and its caps' refusals (one line each, first: one line says
        what many points share) join its log; the first few of it quoted."""
        log = self.log
        if not (self.unknown or self.tally.counts) and log.empty:
            # Nothing to say (a line read off its template, as most are): the result without the log's assembly.
            return DecodeResult(
                frames, self.points, self.skipped, ignored=self.ignored, clock_jumps=clock_jumps, stray=self.stray
            )
        for metric, n in self.unknown.items():
            log.metric(unknown_problem(JSON_DIALECT, metric, n))
        log.limit_errors = [DecodeError(log.lineno, one_line(text)) for text in self.tally.lines(limits)]
        errors = tuple(log.errors())
        # The log already counts what it cuts (its last entry), so the message quotes and counts no more.
        quoted = tuple(e.message for e in errors[:MAX_PROBLEMS_PER_REQUEST])
        return DecodeResult(
            frames,
            self.points,
            self.skipped,
            quoted,
            len(quoted),
            errors,
            limited=self.tally.limited(),
            ignored=self.ignored,
            clock_jumps=clock_jumps,
            stray=self.stray,
        )
