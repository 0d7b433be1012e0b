"""A bounded sending queue in front of the OTLP push exporter: the Collector exporterhelper's
``sending_queue`` and ``retry_on_failure``, for the SDK's exporters.

Why: the SDK's periodic reader hands each collection to its exporter once. When the collector
is down the exporter retries until its timeout (``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s) and then
the collection is gone, and while it retries the reader's thread, and so the next collection,
waits. Behind this queue the reader's ``export`` only enqueues: a sender thread pushes the queue
oldest first through the real exporter (whose own retries and backoff still apply), backs off
between failed attempts, and drops what is older than ``max_age_s`` or past ``max_points``
(oldest first, counted; the collection in an attempt is judged when the attempt ends, so the age
bound can be passed by one attempt, at most the exporter's timeout). So a dead or slow collector
never delays a collection, memory stays bounded (about 210 bytes per queued point), and after an
outage shorter than ``max_age_s`` the collector receives every collection in time order: the
fleet's windows have no gap.

With cumulative temporality (the agent's) a dropped collection loses no counter increments
either: the next one carries the totals.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_dra import conventions as cv
from otel_dra.sinks.config import OtlpPushConfig
from otel_dra.words import human_duration

log = logging.getLogger(__name__)

DEFAULT_MAX_AGE_S: Final = OtlpPushConfig.queue_max_age_s  # the push config owns the defaults
DEFAULT_MAX_POINTS: Final = OtlpPushConfig.queue_max_points
#: Backoff between failed attempts (on top of the exporter's own retries): first, then doubling up to the cap
#: (jittered, never past it; the agent's push caps it at half its interval: ``provider.otlp_reader``).
BACKOFF_FIRST_S: Final = 1.0
BACKOFF_MAX_S: Final = 15.0
_LOG_EVERY_S: Final = 60.0
#: While the collector stays down, one line this often says for how long, how many attempts, what was
#: dropped and the exporter's last error (issue #29: the SDK's own warning and error every few seconds, each
#: with a different retry delay, were never folded).
FAILING_LOG_EVERY_S: Final = 300.0
#: The SDK exporters' loggers, whose words during the queue's attempts are kept for those lines instead.
EXPORTER_LOGGERS: Final = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
)
OUTCOMES: Final = ("sent", "dropped")


class _AttemptWords(logging.Filter):
    """What the exporter logs on the sender's thread (its retries, its failure): kept as the last error,
    not written; the queue says it in its own, rarer lines."""

    def __init__(self) -> None:
        super().__init__()
        self.thread: threading.Thread | None = None
        self.last: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or threading.current_thread() is not self.thread:
            return True
        self.last = record.getMessage()[:300]
        return False


def count_points(data: MetricsData) -> int:
    """Data points in one collection (the unit the queue is bounded in, as the SDK's batch size is)."""
    return sum(
        len(metric.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics for metric in sm.metrics
    )


@dataclass
class _Entry:
    data: MetricsData
    points: int
    enqueued: float  # the queue's clock


class SendingQueue(MetricExporter):
    """Wraps ``exporter``: ``export`` enqueues and returns at once; a thread sends, oldest first.

    ``max_age_s``: a collection not sent within this time is dropped. ``max_points``: past this many
    queued points the oldest collections are dropped (the newest one is always kept). ``clock`` and
    ``backoff_s``: (first, cap) of the wait between failed attempts. :meth:`register_metrics` adds the
    queue's own metrics.
    """

    def __init__(
        self,
        exporter: MetricExporter,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        max_points: int = DEFAULT_MAX_POINTS,
        *,
        clock: Callable[[], float] = time.monotonic,
        backoff_s: tuple[float, float] = (BACKOFF_FIRST_S, BACKOFF_MAX_S),
    ) -> None:
        if not max_age_s > 0:
            raise ValueError(f"the sending queue's max age must be positive, got {max_age_s}")
        if max_points < 1:
            raise ValueError(f"the sending queue's max points must be at least 1, got {max_points}")
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self.exporter = exporter
        self.max_age_s = max_age_s
        self.max_points = max_points
        self._clock = clock
        self.backoff_s = backoff_s
        self._queue: deque[_Entry] = deque()
        self._queued_points = 0
        self._counts = dict.fromkeys(OUTCOMES, 0)
        self._failures = 0  # attempts in a row that failed
        self._inflight: _Entry | None = None
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._closed = False
        self._last_log = -_LOG_EVERY_S
        self._quiet_drops = 0
        self._failing_since = 0.0  # the queue's clock, at the first failed attempt in a row
        self._failing_said = 0.0  # when the last line about it was written
        self._failing_drops = 0  # points dropped since then
        self._words = _AttemptWords()
        self.endpoint = str(getattr(exporter, "_endpoint", "") or "the collector")
        self._thread: threading.Thread | None = None

    def register_metrics(self, meter: Meter) -> None:
        """The queue's size and its sent/dropped counters, on ``meter`` (the provider the queue feeds:
        its own figures travel with the data, and show on /metrics while the collector is away)."""
        size, points = cv.OTEL_DRA_PUSH_QUEUE_SIZE, cv.OTEL_DRA_PUSH_POINTS
        meter.create_observable_gauge(
            size.name, callbacks=[self._observe_size], unit=size.unit, description=size.description
        )
        meter.create_observable_counter(
            points.name, callbacks=[self._observe_points], unit=points.unit, description=points.description
        )

    # -- the reader's side -----------------------------------------------------------------------
    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        """Queue one collection for the sender; never blocks on the collector."""
        if self._closed:
            return MetricExportResult.FAILURE
        points = count_points(metrics_data)
        with self._cond:
            self._queue.append(_Entry(metrics_data, points, self._clock()))
            self._queued_points += points
            self._trim()
            if self._thread is None:
                self._thread = threading.Thread(target=self._send_loop, name="otlp-sending-queue", daemon=True)
                self._words.thread = self._thread
                for name in EXPORTER_LOGGERS:
                    logging.getLogger(name).addFilter(self._words)
                self._thread.start()
            self._cond.notify_all()
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Wait until the queue is empty (True) or the time is up (False)."""
        return self._drain(time.monotonic() + timeout_millis / 1000.0)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Send what is queued until the time is up (the reader passes ``timeout``, in ms), then stop:
        the exporter's shutdown also cuts an attempt in flight short."""
        timeout_ms = kwargs.get("timeout", timeout_millis)
        deadline = time.monotonic() + max(0.0, timeout_ms) / 1000.0
        with self._cond:
            self._closed = True
        self._drain(deadline - 0.25, while_failing=False)
        self._stopping.set()
        with self._cond:
            left = self._queued_points
            self._cond.notify_all()
        if left:
            log.warning("OTLP push: %d data points still queued at shutdown were not sent", left)
        self.exporter.shutdown(timeout_millis=max(0.0, deadline - time.monotonic()) * 1000.0)
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()) + 0.5)
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).removeFilter(self._words)

    # -- state -----------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """``queued`` points and collections now, ``sent`` and ``dropped`` points so far, ``failures`` in a row."""
        with self._cond:
            return {
                "queued": self._queued_points,
                "batches": len(self._queue),
                "failures": self._failures,
                **self._counts,
            }

    def _drain(self, deadline: float, while_failing: bool = True) -> bool:
        """Wait for an empty queue until ``deadline``; ``while_failing=False`` gives up as soon as an
        attempt fails (shutting down: a collector that is down now won't be up within the budget)."""
        with self._cond:
            while self._queue and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or (self._failures and not while_failing):
                    return False
                self._cond.wait(min(left, 0.1))
            return not self._queue

    def _trim(self) -> None:
        """Drop (oldest first) what is too old or too many; under the lock. The collection in flight
        stays (its attempt decides), and so does the newest unless it is itself too old."""
        now = self._clock()
        queue = self._queue
        skip = 1 if queue and queue[0] is self._inflight else 0
        dropped = 0
        while len(queue) > skip:
            entry = queue[skip]
            too_old = now - entry.enqueued > self.max_age_s
            too_many = self._queued_points > self.max_points and len(queue) > skip + 1
            if not (too_old or too_many):
                break
            del queue[skip]
            self._queued_points -= entry.points
            dropped += entry.points
        if dropped:
            self._counts["dropped"] += dropped
            self._note_drop(dropped)

    def _note_drop(self, points: int) -> None:
        """One warning a minute at most, with what was dropped since the last one; while attempts fail,
        the failing line says it instead."""
        if self._failures:
            self._failing_drops += points
            return
        self._quiet_drops += points
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            log.warning(
                "OTLP push: the collector has not taken data for a while; dropped the oldest %d queued data points "
                "(the queue keeps %gs or %d points)",
                self._quiet_drops,
                self.max_age_s,
                self.max_points,
            )
            self._quiet_drops = 0

    # -- the sender ------------------------------------------------------------------------------
    def _send_loop(self) -> None:
        while not self._stopping.is_set():
            with self._cond:
                self._trim()
                while not self._queue and not self._stopping.is_set():
                    self._cond.wait(1.0)
                if self._stopping.is_set():
                    return
                head = self._inflight = self._queue[0]
            try:
                ok = self.exporter.export(head.data) is MetricExportResult.SUCCESS
            except Exception as exc:  # an exporter bug must not end the push
                log.error("OTLP push: the exporter raised; will retry", exc_info=exc)
                ok = False
            with self._cond:
                self._inflight = None
                if ok:
                    self._queue.popleft()  # the head: trims leave the collection in flight alone
                    self._queued_points -= head.points
                    self._counts["sent"] += head.points
                    if self._failures:
                        log.info(
                            "OTLP push to %s works again after %s (%d attempts had failed)",
                            self.endpoint,
                            human_duration(self._clock() - self._failing_since),
                            self._failures,
                        )
                    self._failures = 0
                    self._cond.notify_all()
                    continue
                self._failures += 1
                failures = self._failures
                self._say_failing()
            first, cap = self.backoff_s
            delay = min(cap, first * 2 ** min(failures - 1, 16) * random.uniform(0.8, 1.2))  # never past the cap
            self._stopping.wait(delay)

    def _say_failing(self) -> None:
        """The first failed attempt in a row, and then every :data:`FAILING_LOG_EVERY_S`, one line each."""
        now, last = self._clock(), self._words.last or "no answer"
        if self._failures == 1:
            self._failing_since = self._failing_said = now
            self._failing_drops = 0
            log.warning(
                "OTLP push to %s failing: %s; retrying, and keeping up to %gs or %d points of data meanwhile",
                self.endpoint,
                last,
                self.max_age_s,
                self.max_points,
            )
        elif now - self._failing_said >= FAILING_LOG_EVERY_S:
            self._failing_said = now
            dropped, self._failing_drops = self._failing_drops, 0
            log.warning(
                "OTLP push to %s failing for %s (%d attempts%s; last error: %s)",
                self.endpoint,
                human_duration(now - self._failing_since),
                self._failures,
                f", the oldest {dropped:,} data points dropped" if dropped else "",
                last,
            )

    # -- metrics ---------------------------------------------------------------------------------
    def _observe_size(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.stats()["queued"])]

    def _observe_points(self, _: CallbackOptions) -> Iterable[Observation]:
        stats = self.stats()
        return [Observation(stats[o], {cv.PUSH_OUTCOME: o}) for o in OUTCOMES]
