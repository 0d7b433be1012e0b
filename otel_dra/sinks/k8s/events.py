"""Kubernetes Events (``events.k8s.io/v1``) for what the cluster writer does, so that
``kubectl get events`` answers "why was this GPU taken out?".

The writer must never wait on an Event, and a flapping device must not flood the API server, so
this follows client-go's ``k8s.io/client-go/tools/events`` recorder:

- :meth:`EventRecorder.record` only queues (at most ``max_queued``; past that the Event is dropped
  and counted, as client-go's ``ActionOrDrop`` does); a thread of its own writes;
- the Event is built as ``recorderImpl.makeEvent`` builds it: name ``<regarding's name>.<hex
  nanoseconds>``, the regarding object's namespace or ``default`` for a cluster-scoped one
  (a DeviceTaintRule), ``eventTime``, ``reportingController``/``reportingInstance``, ``action``;
- isomorphic Events (same regarding, related, action, reason, controller and note) are not created
  again: the second starts an ``EventSeries`` (count 2, patched onto the first), later ones only
  count, and the series is written every ``refresh_s`` (30 min) and once more when it has been
  quiet for ``finish_s`` (6 min), after which the next one is a new Event
  (``eventBroadcasterImpl.recordToSink``, ``refreshExistingEventSeries``, ``finishSeries``);
- each regarding object has a token bucket of ``spam_burst`` Events refilled at ``spam_qps`` (25, and
  one per 5 min: ``EventSourceObjectSpamFilter`` in client-go's ``tools/record``): a device that
  flaps gets its first 25 Events, then one per 5 min, and the rest are counted, not written;
- a write the server refuses (4xx) is dropped with one log line; one that fails otherwise is tried
  again up to ``max_tries`` times (client-go: 12, with a jittered sleep of about 10 s).

The API server's own rules for an ``events.k8s.io/v1`` Event (``ValidateEventCreate``: note at
most 1024 characters, reason and action at most 128, reportingController a qualified name) are
kept here, so an Event is never refused for its shape.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_dra.sinks.k8s.render import effect_of

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
#: ``ValidateEventCreate``'s limits (k8s.io/kubernetes pkg/apis/core/validation/events.go).
NOTE_LIMIT, REASON_LIMIT, ACTION_LIMIT, INSTANCE_LIMIT = 1024, 128, 128, 128
_NAME_LIMIT = 253  # a DNS subdomain: <regarding>.<16 hex digits>
_STRATEGIC = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class EventSettings:
    """client-go's ``tools/events`` constants, as settings so that tests can shorten them."""

    finish_s: float = 6 * 60.0
    refresh_s: float = 30 * 60.0
    max_queued: int = 1000
    max_tries: int = 12
    retry_s: float = 10.0
    request_timeout_s: float = 10.0
    spam_burst: int = 25
    spam_qps: float = 1.0 / 300.0


@dataclass(frozen=True)
class Ref:
    """An ObjectReference: what an Event is about (``regarding``) or also concerns (``related``)."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    def body(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass
class _Cached:
    """An Event written (or queued to be), and its series."""

    body: dict[str, Any]
    first_at: float
    count: int = 1
    last_at: float = 0.0
    sent_count: int = 1  # the count the server has


@dataclass
class _Job:
    key: tuple[Any, ...]
    create: bool  # create the Event, else patch its series
    tries: int = 0
    not_before: float = 0.0


def _micro(at: float) -> str:
    """``metav1.MicroTime`` in RFC 3339 with microseconds. The client re-serialises it with ``isoformat()``, which
    drops the fraction when it is zero, and the API server's ``RFC3339Micro`` parse then refuses the Event: so a
    time on a whole second is written a microsecond later."""
    stamp = dt.datetime.fromtimestamp(at, dt.UTC)
    if stamp.microsecond == 0:
        stamp += dt.timedelta(microseconds=1)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class EventCounts:
    """What the recorder did, for tests and the metrics."""

    created: int = 0
    patched: int = 0
    dropped: int = 0  # queue full, refused, or out of tries
    counted: int = 0  # folded into a series without a write
    spam: int = 0  # over their object's token bucket
    errors: list[str] = field(default_factory=list)


class EventRecorder:
    """Queues Events and writes them on its own thread (see the module doc)."""

    def __init__(
        self,
        api_client: Any,
        controller: str,
        instance: str,
        settings: EventSettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``controller``: the reportingController, a qualified name (``<domain>/fleet``); ``instance``: this
        replica (its Lease identity)."""
        from kubernetes import client

        self.settings = settings or EventSettings()
        self.controller = controller
        self.instance = _clip(instance, INSTANCE_LIMIT)
        self._client = client
        self._api = client.EventsV1Api(api_client)
        self._clock = clock
        self._lock = threading.Condition()
        self._queue: collections.deque[_Job] = collections.deque()
        self._cache: dict[tuple[Any, ...], _Cached] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_refresh = clock()
        self._buckets: dict[Ref, tuple[float, float]] = {}  # regarding: (tokens, when)
        self.counts = EventCounts()
        self._last_error = ""

    # -- what the writer calls ---------------------------------------------------------------------
    def record(
        self,
        regarding: Ref,
        type_: str,
        reason: str,
        action: str,
        note: str,
        related: Ref | None = None,
    ) -> None:
        """Queue one Event; never blocks (a full queue drops it, with a count)."""
        now = self._clock()
        note = _clip(note, NOTE_LIMIT)
        reason, action = _clip(reason, REASON_LIMIT), _clip(action, ACTION_LIMIT)
        key = (regarding, related, action, reason, self.controller, note)
        with self._lock:
            if not self._spend(regarding, now):
                self.counts.spam += 1
                return
            cached = self._cache.get(key)
            if cached is not None:
                cached.count += 1
                cached.last_at = now
                if cached.count == 2:  # the series starts: written now; later ones wait for a refresh or the finish
                    self._enqueue(_Job(key, create=False))
                else:
                    self.counts.counted += 1
                return
            name_part = regarding.name[: _NAME_LIMIT - 17]
            body: dict[str, Any] = {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{name_part}.{int(now * 1e9):x}",
                    "namespace": regarding.namespace or "default",
                },
                "eventTime": _micro(now),
                "reportingController": self.controller,
                "reportingInstance": self.instance,
                "action": action,
                "reason": reason,
                "regarding": regarding.body(),
                "note": note,
                "type": type_,
            }
            if related is not None:
                body["related"] = related.body()
            self._cache[key] = _Cached(body, first_at=now, last_at=now)
            self._enqueue(_Job(key, create=True))

    def _spend(self, regarding: Ref, now: float) -> bool:
        """One token from ``regarding``'s bucket (client-go's ``EventSourceObjectSpamFilter``); False: none left."""
        s = self.settings
        tokens, when = self._buckets.get(regarding, (float(s.spam_burst), now))
        tokens = min(float(s.spam_burst), tokens + max(0.0, now - when) * s.spam_qps)
        if tokens < 1.0:
            self._buckets[regarding] = (tokens, now)
            return False
        self._buckets[regarding] = (tokens - 1.0, now)
        if len(self._buckets) > 4 * s.max_queued:  # forget full buckets: they are what a new one would be
            full = [r for r, (t, w) in self._buckets.items() if t + (now - w) * s.spam_qps >= s.spam_burst]
            for r in full:
                del self._buckets[r]
        return True

    def _enqueue(self, job: _Job) -> None:
        if len(self._queue) >= self.settings.max_queued:
            self.counts.dropped += 1
            if self.counts.dropped == 1 or self.counts.dropped % 1000 == 0:
                log.error("kubernetes events: too many queued (%d); dropping Events", len(self._queue))
            return
        self._queue.append(job)
        self._lock.notify()

    # -- the thread ---------------------------------------------------------------------------------
    def _series_body(self, cached: _Cached) -> dict[str, Any]:
        return {"series": {"count": cached.count, "lastObservedTime": _micro(cached.last_at)}}

    def _write(self, job: _Job) -> bool:
        """One write; True when done with the job (written, or given up)."""
        with self._lock:
            cached = self._cache.get(job.key)
            if cached is None:
                return True
            body = dict(cached.body)
            patch = self._series_body(cached)
            count = cached.count
        meta = body["metadata"]
        timeout = self.settings.request_timeout_s
        try:
            if job.create:
                self._api.create_namespaced_event(meta["namespace"], body, _request_timeout=timeout)  # type: ignore[arg-type]
                self.counts.created += 1
            else:
                try:
                    self._api.patch_namespaced_event(
                        meta["name"], meta["namespace"], patch, _content_type=_STRATEGIC, _request_timeout=timeout
                    )
                except self._client.ApiException as exc:
                    if exc.status != 404:
                        raise
                    # client-go: the series' first Event is gone (expired): create it with the series.
                    self._api.create_namespaced_event(meta["namespace"], {**body, **patch}, _request_timeout=timeout)  # type: ignore[arg-type]
                self.counts.patched += 1
            with self._lock:
                cached.sent_count = max(cached.sent_count, count)
            return True
        except self._client.ApiException as exc:
            if exc.status is not None and 400 <= exc.status < 500:
                self._give_up(f"{exc.status} {exc.reason}: {str(exc.body or '')[:200]}")
                return True
            return self._retry(job, f"{exc.status} {exc.reason}")
        except Exception as exc:  # the connection failed: urllib3's errors vary
            return self._retry(job, f"{type(exc).__name__}: {exc}".splitlines()[0][:200])

    def _retry(self, job: _Job, error: str) -> bool:
        job.tries += 1
        if job.tries >= self.settings.max_tries:
            self._give_up(f"{error} ({job.tries} tries)")
            return True
        job.not_before = time.monotonic() + self.settings.retry_s * random.uniform(0.9, 1.1)
        with self._lock:
            self._queue.append(job)
        return False

    def _give_up(self, error: str) -> None:
        self.counts.dropped += 1
        self.counts.errors.append(error)
        if error != self._last_error:
            log.error("kubernetes events: an Event was not written (will not retry): %s", error)
        self._last_error = error

    def _housekeep(self) -> None:
        """client-go's ``finishSeries`` (a quiet series written a last time and forgotten; a lone Event forgotten
        after ``finish_s``) and ``refreshExistingEventSeries`` (every ``refresh_s``)."""
        now = self._clock()
        s = self.settings
        refresh = now - self._last_refresh >= s.refresh_s
        if refresh:
            self._last_refresh = now
        with self._lock:
            for key, cached in list(self._cache.items()):
                series = cached.count >= 2
                if now - cached.last_at >= s.finish_s:
                    if series and cached.count > cached.sent_count:
                        self._enqueue(_Job(key, create=False))
                        cached.sent_count = cached.count  # queued; forgotten once it is written
                    else:
                        del self._cache[key]
                elif refresh and series and cached.count > cached.sent_count:
                    self._enqueue(_Job(key, create=False))

    def _next(self) -> _Job | None:
        with self._lock:
            if not self._queue:
                self._lock.wait(timeout=1.0)
            for _ in range(len(self._queue)):
                job = self._queue.popleft()
                if job.not_before <= time.monotonic():
                    return job
                self._queue.append(job)
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            job = self._next()
            if job is not None:
                self._write(job)
            self._housekeep()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Write what is queued now (tests, and shutdown). True when the queue emptied in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                ready = [j for j in self._queue if j.not_before <= time.monotonic()]
                if not ready:
                    return not self._queue
                job = ready[0]
                self._queue.remove(job)
            self._write(job)
        return False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="k8s-events", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop the thread; what is still queued gets ``timeout_s`` to be written (Events are best effort)."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.flush(timeout_s)


def rule_ref(obj: Mapping[str, Any]) -> Ref:
    """The reference to a DeviceTaintRule (cluster-scoped: its Events go to ``default``, as client-go's do)."""
    meta = obj.get("metadata") or {}
    return Ref(
        str(obj.get("apiVersion") or ""),
        str(obj.get("kind") or "DeviceTaintRule"),
        meta["name"],
        "",
        str(meta.get("uid") or ""),
    )


@dataclass(frozen=True)
class Said:
    """What one Event says: its type, reason (CamelCase, the kind of change), action and note."""

    type: str
    reason: str
    action: str
    note: str


def taint_change(
    verb: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None, domain: str, withheld: str = ""
) -> Said:
    """The Event for a DeviceTaintRule the writer created, updated or deleted (``verb``), so that ``kubectl get
    events`` says which device, why (the failure reason and the evidence), what to do (the remediation) and
    what the taint does; ``withheld``: the effect the brake on mass quarantine kept back."""
    meta = obj.get("metadata") or {}
    notes = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    where = f"{notes.get(f'{domain}/node', '?')} {notes.get(f'{domain}/hw-id', '?')}"
    reason = labels.get(f"{domain}/reason", "?")
    effect = effect_of(obj)
    why = f"{notes.get(f'{domain}/message', '')}; remediation: {notes.get(f'{domain}/remediation', '?')}"
    held = f" (the brake on mass quarantine withheld {withheld})" if withheld else ""
    if verb == "create":
        return Said(WARNING, "DeviceTainted", "Taint", f"{where}: {reason}, effect {effect}{held}: {why}")
    if verb == "update":
        was = effect_of(old)
        change = f"effect {was} to {effect}" if was != effect else f"effect {effect}"
        return Said(WARNING, "DeviceTaintChanged", "Taint", f"{where}: {reason}, {change}{held}: {why}")
    return Said(NORMAL, "DeviceTaintRemoved", "Untaint", f"{where}: {reason} cleared; its {effect} taint is removed")
