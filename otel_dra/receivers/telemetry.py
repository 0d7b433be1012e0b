"""The OTLP receiver's own telemetry: its counters (requests, points, refusals, clock skew) and the
observable instruments that read them (project extensions, registered in semconv/registry.yaml)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_dra import conventions as cv
from otel_dra.decode.limits import LIMIT_REASONS

REQUESTS: Final = cv.OTEL_DRA_RECEIVER_REQUESTS
POINTS: Final = cv.OTEL_DRA_RECEIVER_POINTS
REFUSED: Final = cv.OTEL_DRA_RECEIVER_REFUSED
CLOCK_SKEW: Final = cv.OTEL_DRA_RECEIVER_CLOCK_SKEW
#: ``ahead``: points past --max-future ahead of this clock (refused); ``behind``: points more than a minute behind
#: what was read for their series (a clock that jumped back: taken, the series restarted).
CLOCK_DIRECTIONS: Final = ("ahead", "behind")
CONNECTIONS: Final = cv.OTEL_DRA_RECEIVER_CONNECTIONS
ATTRIBUTES_IGNORED: Final = cv.OTEL_DRA_RECEIVER_ATTRIBUTES_IGNORED
TRANSPORTS: Final = ("grpc", "http")
#: ``error``: the frames' consumer (``on_frames``) failed; the client gets INTERNAL / HTTP 500.
#: ``overloaded``: refused for now (backpressure); the client gets UNAVAILABLE / HTTP 503 and retries.
#: ``unauthenticated``: no bearer token, or a wrong one (``--auth-token-file``); UNAUTHENTICATED / HTTP 401.
OUTCOMES: Final = ("ok", "partial", "invalid", "too_large", "error", "overloaded", "unauthenticated")
#: ``ignored``: otel-dra's own telemetry in an agent's push (its verdicts, its queue's metrics), taken and set
#: aside: neither input nor a rejection, so it never makes a request partial.
POINT_OUTCOMES: Final = ("accepted", "rejected", "ignored")

Stats = dict[str, dict[Any, Any]]


class Counts:
    """The counters of both transports, and the requests now pending; read and changed under ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = {(t, o): 0 for t in TRANSPORTS for o in OUTCOMES}
        self.points = dict.fromkeys(POINT_OUTCOMES, 0)
        self.refused = dict.fromkeys(LIMIT_REASONS, 0)
        self.clock_skew = dict.fromkeys(CLOCK_DIRECTIONS, 0)  # points of nodes whose clock jumped
        self.stray = 0  # points taken with attributes not read (told once in the log, counted always)
        self.pending = 0  # requests being read or decoded (both transports)

    def count(self, transport: str, outcome: str, accepted: int = 0, rejected: int = 0, ignored: int = 0) -> None:
        with self.lock:
            self.requests[(transport, outcome)] += 1
            self.points["accepted"] += accepted
            self.points["rejected"] += rejected
            self.points["ignored"] += ignored

    def snapshot(self) -> Stats:
        """A copy of every counter, as :meth:`OtlpReceiver.stats` gives them (without ``connections``)."""
        with self.lock:
            return {
                "requests": dict(self.requests),
                "points": dict(self.points),
                "refused": dict(self.refused),
                "clock_skew": dict(self.clock_skew),
                "attributes_ignored": {"points": self.stray},
            }


def instrument(meter: Meter, stats: Callable[[], Stats], transports: Callable[[], list[str]]) -> None:
    """The receiver's instruments on ``meter``, each reading ``stats()``; requests only of the ``transports()``
    that listen."""

    def requests(_: CallbackOptions) -> Iterable[Observation]:
        counts = stats()["requests"]
        return [Observation(counts[(t, o)], {"transport": t, "outcome": o}) for t in transports() for o in OUTCOMES]

    def points(_: CallbackOptions) -> Iterable[Observation]:
        counts = stats()["points"]
        return [Observation(counts[o], {"outcome": o}) for o in POINT_OUTCOMES]

    def clock(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"direction": d}) for d, n in stats()["clock_skew"].items()]

    def stray(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(stats()["attributes_ignored"]["points"])]

    def refused(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"reason": reason}) for reason, n in stats()["refused"].items()]

    def connections(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(counts["open"], {"transport": t}) for t, counts in stats()["connections"].items()]

    for spec, callback in (
        (REQUESTS, requests),
        (POINTS, points),
        (REFUSED, refused),
        (CLOCK_SKEW, clock),
        (ATTRIBUTES_IGNORED, stray),
    ):
        meter.create_observable_counter(spec.name, callbacks=[callback], unit=spec.unit, description=spec.description)
    meter.create_observable_gauge(
        CONNECTIONS.name, callbacks=[connections], unit=CONNECTIONS.unit, description=CONNECTIONS.description
    )
