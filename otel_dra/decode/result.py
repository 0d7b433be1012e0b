"""One result of decoding a request, whichever encoding it came in: what the receiver's OTLP partial
success and replay's report read as it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from otel_dra.decode.text import one_line
from otel_dra.frame import Frame

#: Problems quoted per request (the rest are counted): what goes into partial success's message.
MAX_PROBLEMS_PER_REQUEST: Final = 5


@dataclass(frozen=True)
class DecodeError:
    """One problem in the input, on one line: what is wrong and where."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True, slots=True)
class ClockJump:
    """A node's points whose times were out of line with the receiver's clock or with the node's own series,
    one per node and direction per request: ``ahead`` (past the receiver's bound: refused) or behind (further
    than CLOCK_JUMP_NS behind what was read for their series: taken, the series restarted)."""

    node: str
    ahead: bool
    offset_ns: int  # the largest: how far ahead of the receiver's clock, or behind the series' newest
    points: int

    @property
    def direction(self) -> str:
        return "ahead" if self.ahead else "behind"


@dataclass(frozen=True)
class DecodeResult:
    """One request (a replay line, a JSON body, a protobuf message) decoded, whichever encoding it came in:
    its frames and what was wrong with it, as OTLP partial success and replay's report need them."""

    frames: list[Frame]
    points: int = 0  # data points in the request, of any metric but otel-dra's own telemetry (``ignored``)
    rejected: int = 0  # of those, points not taken (bad, unknown metric, wrong kind, no node, out of order)
    problems: tuple[str, ...] = ()  # the first few problems quoted, one line each, in request order
    problem_count: int = 0  # problems the message speaks of (more than quoted: "; and N more")
    errors: tuple[
        DecodeError, ...
    ] = ()  # the JSON decoder's numbered line log (capped; its last entry counts the rest)
    invalid: str | None = None  # why the request as a whole can't be used (JSON: the line is skipped), else None
    #: Points refused by a cap, by reason (limits.LIMIT_REASONS): also counted in ``rejected``.
    limited: dict[str, int] = field(default_factory=dict)
    #: Points of otel-dra's own telemetry (:func:`~otel_dra.decode.checks.self_telemetry`): taken and set
    #: aside, neither in ``points`` nor rejected, so an agent's push of its queue's metrics is a success, not a
    #: partial one.
    ignored: int = 0
    #: Nodes whose clock jumped (points ahead of the bound, or far behind their series), each also logged.
    clock_jumps: tuple[ClockJump, ...] = ()
    #: Points taken that carried attributes otel-dra does not read
    #: (:data:`~otel_dra.decode.attributes.READ_ATTRIBUTES`): those attributes were ignored, never made a
    #: column (``otel_dra.receiver.attributes.ignored``).
    stray: int = 0

    @property
    def accepted(self) -> int:
        return self.points - self.rejected

    @property
    def message(self) -> str:
        """One line for ``partial_success.error_message``; empty when nothing was rejected."""
        if not self.rejected:
            return ""
        more = self.problem_count - len(self.problems)
        tail = f"; and {more:,} more" if more > 0 else ""
        shown = ": " + "; ".join(self.problems) if self.problems else ""
        return one_line(f"{self.rejected:,} of {self.points:,} data points rejected{shown}{tail}")
