"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection`` does it.

Several ``otel-dra fleet`` replicas hold the same view of the fleet; only the Lease holder writes
DeviceTaintRules. Each candidate, every ``retry_period`` (jittered by up to 1.2x, as client-go):

- reads the Lease; a missing one is created with itself as holder;
- a Lease another candidate holds is left alone until ``lease_duration`` has passed on *this*
  candidate's clock since the holder last changed the record (so clock skew between candidates
  does not matter, only their rates), then taken over with a replace on the read
  ``resourceVersion`` (two candidates racing: the API server lets one win, the other gets 409);
- the holder renews every ``retry_period`` and stops leading the moment ``renew_deadline`` has
  passed since the start of its last successful renewal, before any other candidate may take over.

One change from client-go, and why: a follower dates a changed record from when it sent its
*previous* read (the change happened after that read), not from the read that saw it, as long as
the two reads are less than ``lease_duration - renew_deadline`` apart. So after a leader dies, a
follower takes over within ``lease_duration`` of the leader's last renewal, not up to one retry
period later. The leader stops at most ``renew_deadline`` after it sent its last successful
renewal, which is before the follower's expiry. The price is the stricter check
``lease_duration > renew_deadline + 1.2 x retry_period``, so that polling every jittered retry
period keeps the reads close enough.

Not the ``kubernetes`` client's ``leaderelection`` package: it reads the process-wide default
client configuration instead of the ``ApiClient`` given, leads only once per process, and does not
release the Lease on shutdown (client-go's ``ReleaseOnCancel``, which this does: a graceful stop
hands over at the followers' next retry instead of after a whole lease duration).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_dra.component import ConfigError
from otel_dra.sinks.k8s import validation as val

log = logging.getLogger(__name__)

#: client-go's ``JitterFactor``: each wait is ``retry_period`` times U(1, 1.2).
JITTER = 1.2
#: Where a pod finds its own namespace when ``POD_NAMESPACE`` is not set.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "otel-dra"


def default_namespace() -> str:
    """``POD_NAMESPACE``, else the pod's service-account namespace, else ``otel-dra``."""
    env = os.environ.get("POD_NAMESPACE", "").strip()
    if env:
        return env
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def default_identity() -> str:
    """``POD_NAME`` (unique per pod), else client-go's ``<hostname>_<uuid>``."""
    return os.environ.get("POD_NAME", "").strip() or f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True)
class LeaseConfig:
    """Which Lease, who we are, and client-go's three timings (seconds; its defaults)."""

    name: str = "otel-dra-fleet"
    namespace: str = ""  # "": default_namespace()
    identity: str = ""  # "": default_identity()
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        for field, value in (
            ("{LeaseConfig.lease_duration_s}", self.lease_duration_s),
            ("{LeaseConfig.renew_deadline_s}", self.renew_deadline_s),
            ("{LeaseConfig.retry_period_s}", self.retry_period_s),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{field} must be a positive number of seconds, got {value}")
        if not self.lease_duration_s > self.renew_deadline_s + JITTER * self.retry_period_s:
            raise ConfigError(
                f"{{LeaseConfig.lease_duration_s}} ({self.lease_duration_s:g}s) must be greater than "
                f"{{LeaseConfig.renew_deadline_s}} ({self.renew_deadline_s:g}s) plus 1.2 x "
                f"{{LeaseConfig.retry_period_s}} ({self.retry_period_s:g}s), so a leader that stops renewing stops "
                "writing before another replica may take over"
            )
        if not self.renew_deadline_s > JITTER * self.retry_period_s:
            raise ConfigError(
                f"{{LeaseConfig.renew_deadline_s}} ({self.renew_deadline_s:g}s) must be greater than 1.2 x "
                f"{{LeaseConfig.retry_period_s}} ({self.retry_period_s:g}s), so a leader gets more than one try to "
                "renew"
            )
        for field, text, problem in (
            ("{LeaseConfig.name}", self.name, val.dns1123_subdomain_problem),
            ("{LeaseConfig.namespace}", self.namespace, val.dns1123_label_problem),
        ):
            found = problem(text) if text or field == "{LeaseConfig.name}" else None
            if found:
                raise ConfigError(f"{field} {text!r}: {found}")

    def resolved(self) -> LeaseConfig:
        """This config with the namespace and identity defaults filled in."""
        return LeaseConfig(
            self.name,
            self.namespace or default_namespace(),
            self.identity or default_identity(),
            self.lease_duration_s,
            self.renew_deadline_s,
            self.retry_period_s,
        )


def _now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _status_line(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "reason", "") or exc).splitlines()[0][:200]


class LeaderElector:
    """Campaigns for the Lease on a thread of its own; :meth:`is_leader` says whether to write now.

    ``on_started`` and ``on_stopped`` run on the elector's thread when leadership is won and lost
    (they must not block). After losing, the elector campaigns again, so a replica that lost the
    Lease to a network blip can lead again later; :meth:`is_leader` is the fence writers check."""

    def __init__(
        self,
        api_client: Any,
        config: LeaseConfig,
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        annotations: Callable[[], dict[str, str]] | None = None,
        adopt: Callable[[dict[str, str]], None] | None = None,
        watch: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        """``annotations``: what the holder writes on the Lease with every renewal (state the next leader
        needs: the brake on mass quarantine's); ``adopt``: given the Lease's annotations when a term
        begins, before this candidate writes its own (a new leader, or this one restarted, takes the
        state over instead of resetting it); ``watch``: given them at every renewal, after ``adopt`` (an
        operator's request written on the Lease: the brake's release)."""
        from kubernetes import client

        self.config = config.resolved()
        self._client = client
        self._api = client.CoordinationV1Api(api_client)
        self._on_started, self._on_stopped = on_started, on_stopped
        self._clock = clock
        self._lock = threading.Lock()
        self._renewed_at: float | None = None  # start of our last successful acquire or renew
        self._observed: tuple[Any, ...] | None = None  # the last record read
        self._observed_at = 0.0  # when, on our clock, that record may first have existed
        self._last_read_at: float | None = None
        self._transitions = 0
        self._error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.holder = ""  # the holder last seen
        self.terms = 0  # how many times this candidate became the leader
        self._annotations, self._adopt, self._watch = annotations, adopt, watch
        self._adopted = False  # this term took the Lease's annotations over

    @property
    def identity(self) -> str:
        return self.config.identity

    def is_leader(self) -> bool:
        """True while we hold the Lease and our last renewal is younger than ``renew_deadline``."""
        with self._lock:
            return self._renewed_at is not None and self._clock() < self._renewed_at + self.config.renew_deadline_s

    # -- one attempt -----------------------------------------------------------------------------
    def _record(self, spec: Any) -> tuple[Any, ...]:
        return (
            spec.holder_identity or "",
            spec.lease_duration_seconds,
            spec.acquire_time,
            spec.renew_time,
            spec.lease_transitions,
        )

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One Lease API call, bounded so that a hung one cannot outlast the renew deadline."""
        timeout = max(1.0, self.config.renew_deadline_s / 2)
        return fn(*args, _request_timeout=timeout)

    def try_acquire_or_renew(self) -> bool:
        """client-go's ``tryAcquireOrRenew``: one read and at most one write. True: we hold it now."""
        c, cfg = self._client, self.config
        started = self._clock()
        now = _now_utc()
        duration = max(1, math.ceil(cfg.lease_duration_s))
        try:
            lease = self._call(self._api.read_namespaced_lease, cfg.name, cfg.namespace)
        except c.ApiException as exc:
            if exc.status != 404:
                raise
            body = c.V1Lease(
                api_version="coordination.k8s.io/v1",
                kind="Lease",
                metadata=c.V1ObjectMeta(name=cfg.name, namespace=cfg.namespace),
                spec=c.V1LeaseSpec(
                    holder_identity=cfg.identity,
                    lease_duration_seconds=duration,
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=0,
                ),
            )
            self._carry(body)
            try:
                created = self._call(self._api.create_namespaced_lease, cfg.namespace, body)
            except c.ApiException as exc2:
                if exc2.status == 409:  # another candidate created it first
                    return False
                raise
            self._won(created, started, 0)
            return True
        read_done = self._clock()
        spec = lease.spec or c.V1LeaseSpec()
        record = self._record(spec)
        if record != self._observed:
            # Written after our previous read was sent: date it from then, while that bound is
            # tight enough to be safe (the gap is under lease_duration - renew_deadline); else
            # from now, as client-go does.
            previous = self._last_read_at
            tight = previous is not None and read_done - previous < cfg.lease_duration_s - cfg.renew_deadline_s
            self._observed = record
            self._observed_at = previous if tight and previous is not None else read_done
        self._last_read_at = started
        holder = spec.holder_identity or ""
        self.holder = holder
        mine = holder == cfg.identity
        if holder and not mine:
            self._adopted = False  # a term of ours that starts later takes over what the holder leaves
            with self._lock:
                self._renewed_at = None  # someone else holds it: if we led, we stop writing now
        if holder and not mine and started < self._observed_at + cfg.lease_duration_s:
            return False  # held, and not yet expired on our clock
        transitions = int(spec.lease_transitions or 0)
        if not mine:
            transitions += 1
        acquire_time = spec.acquire_time if mine and spec.acquire_time else now
        self._carry(lease)
        lease.spec = c.V1LeaseSpec(
            holder_identity=cfg.identity,
            lease_duration_seconds=duration,
            acquire_time=acquire_time,
            renew_time=now,
            lease_transitions=transitions,
        )
        try:
            updated = self._call(self._api.replace_namespaced_lease, cfg.name, cfg.namespace, lease)
        except c.ApiException as exc:
            if exc.status == 409:  # someone else wrote it since our read
                return False
            raise
        self._won(updated, started, transitions)
        return True

    def _carry(self, lease: Any) -> None:
        """Before writing ``lease`` as its holder: at a term's start, hand its annotations to ``adopt``; at every
        renewal, to ``watch``; then put ours on it (others' annotations are kept)."""
        if lease.metadata is None:
            lease.metadata = self._client.V1ObjectMeta(name=self.config.name, namespace=self.config.namespace)
        found = dict(lease.metadata.annotations or {})
        if not self._adopted and self._adopt is not None:
            self._adopt(found)
        self._adopted = True
        if self._watch is not None:
            self._watch(found)
        if self._annotations is not None:
            lease.metadata.annotations = {**found, **self._annotations()}

    def _won(self, lease: Any, started: float, transitions: int) -> None:
        with self._lock:
            self._renewed_at = started
        self._observed = self._record(lease.spec)
        self._observed_at = started
        self._transitions = transitions
        self.holder = self.config.identity

    def release(self) -> bool:
        """Give the Lease up (client-go's ``ReleaseOnCancel``): holder cleared, 1 s duration. Only
        when we still hold it; True when released."""
        import urllib3

        c, cfg = self._client, self.config
        with self._lock:
            held = self._renewed_at is not None
            self._renewed_at = None
        if not held:
            return False
        try:
            lease = self._call(self._api.read_namespaced_lease, cfg.name, cfg.namespace)
            if (lease.spec.holder_identity if lease.spec else None) != cfg.identity:
                return False
            now = _now_utc()
            lease.spec = c.V1LeaseSpec(
                holder_identity=None,
                lease_duration_seconds=1,
                acquire_time=now,
                renew_time=now,
                lease_transitions=self._transitions,
            )
            self._call(self._api.replace_namespaced_lease, cfg.name, cfg.namespace, lease)
        except (c.ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("leader election: could not release lease %s: %s", self._where(), _status_line(exc))
            return False
        log.info("leader election: %s released lease %s", cfg.identity, self._where())
        return True

    def _where(self) -> str:
        return f"{self.config.namespace}/{self.config.name}"

    # -- the loop ------------------------------------------------------------------------------
    def _attempt(self) -> bool:
        """One attempt; a failure is logged once per distinct error and counts as not holding."""
        import urllib3

        c = self._client
        try:
            ok = self.try_acquire_or_renew()
        except c.ApiException as exc:
            self._failed(exc.status, _status_line(exc))
            return False
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._failed(0, str(getattr(exc, "reason", None) or exc).splitlines()[0][:200])
            return False
        if self._error:
            log.info("leader election: the Lease API answers again")
            self._error = ""
        return ok

    def _failed(self, status: int, message: str) -> None:
        cfg = self.config
        if status in (401, 403):
            text = (
                f"{message}; otel-dra fleet needs get, create and update on leases.coordination.k8s.io "
                f"in namespace {cfg.namespace} (deploy/kubernetes/fleet)"
            )
        elif status:
            text = f"HTTP {status}: {message}"
        else:
            text = f"cannot reach the Kubernetes API: {message}"
        if text != self._error:
            log.error("leader election: lease %s: %s; retrying every %gs", self._where(), text, cfg.retry_period_s)
            self._error = text

    def _wait(self, seconds: float) -> bool:
        return self._stop.wait(max(0.0, seconds))

    def _run(self) -> None:
        cfg = self.config
        log.info("leader election: %s campaigning for lease %s", cfg.identity, self._where())
        while not self._stop.is_set():
            # Follower: try every jittered retry period, and right when the holder's lease expires.
            if not self._attempt():
                pause = cfg.retry_period_s * random.uniform(1.0, JITTER)
                if self.holder and self.holder != cfg.identity:
                    expiry = self._observed_at + cfg.lease_duration_s - self._clock()
                    if 0 < expiry < pause:
                        pause = expiry + 0.01
                self._wait(pause)
                continue
            self.terms += 1
            log.info("leader election: %s became the leader (lease %s)", cfg.identity, self._where())
            self._on_started()
            # Leader: renew every retry period until a renewal is overdue.
            while not self._wait(cfg.retry_period_s):
                if self._attempt():
                    continue
                if not self.is_leader():
                    break
            lost = not self._stop.is_set()
            if lost:
                self._adopted = False
                with self._lock:
                    self._renewed_at = None
                why = (
                    f"{self.holder} holds it now"
                    if self.holder and self.holder != cfg.identity
                    else f"no renewal within {cfg.renew_deadline_s:g}s"
                )
                log.warning("leader election: %s lost lease %s (%s); stopped writing", cfg.identity, self._where(), why)
            self._on_stopped()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Stop campaigning, and release the Lease if we hold it (a quick handover)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.release()
