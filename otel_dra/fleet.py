"""Fleet mode: every node's telemetry in over OTLP, one classifier, the fleet's verdicts out.

receivers (OTLP gRPC and HTTP) → a batch buffer → the classifier (one window store for every
node's devices) → sinks (verdict metrics on /metrics, /v1/devices, logs). Requests are decoded
on their own threads and only queued there; the evaluation loop drains the queue and ingests it
as one batch every tick, so thousands of small requests cost one pass of array work, and a
slow tick never blocks a sender.

With ``--k8s-apply`` the fleet is also the cluster's one DeviceTaintRule writer: a
:class:`~otel_dra.sinks.k8s.sink.K8sOutputSink` over the fleet's board that owns every managed rule,
gated by a :class:`~otel_dra.sinks.k8s.lease.LeaderElector`, so of several replicas only the Lease
holder writes.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from otel_dra import __version__
from otel_dra.classifier import Classifier, Verdict
from otel_dra.component import Components
from otel_dra.config import ClusterWriterConfig, FleetConfig
from otel_dra.frame import Frame, Schema
from otel_dra.heap import HeapTrimmer, numpy_small_pages
from otel_dra.policy import Policy
from otel_dra.receivers.tls import describe
from otel_dra.sinks import provider
from otel_dra.sinks.endpoint import PrometheusEndpoint, Route
from otel_dra.sinks.k8s.brake import Brake, BudgetSettings, annotation_key
from otel_dra.sinks.verdict_metrics import ViewDisagreement
from otel_dra.sinks.verdict_text import VerdictText
from otel_dra.state import VerdictBoard
from otel_dra.state.persist import FLEET_FILE, StateFile, StateStore

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from otel_dra.receivers.otlp import OtlpReceiver
    from otel_dra.sinks.k8s.lease import LeaderElector
    from otel_dra.sinks.k8s.sink import K8sOutputSink

#: Per-instrument series limit for the fleet's verdict metrics (5 hw.status series per device).
FLEET_SERIES_LIMIT = 1_000_000
#: Time the shutdown may spend (the Lease release, the flush) before the process gives up on it.
SHUTDOWN_BUDGET_S = 5.0
STATE_FLUSH_S = 2.0  # of it, at most, for the state file's last write (the first thing done at shutdown)


class Fleet:
    """The fleet classifier and its receivers and sinks."""

    def __init__(self, config: FleetConfig, policy: Policy) -> None:
        self.config = config
        self.policy = policy
        self.schema = Schema()
        if config.heap.enabled:
            numpy_small_pages()  # (before the classifier's arrays: rows grown ahead stay unresident)
        self.classifier = Classifier(policy, self.schema, interval_s=config.sample_interval_s, capacity=1024)
        self.board = VerdictBoard()
        self._pending: list[Frame] = []
        self._arrivals: list[int] = []  # when each queued frame was heard (the fleet's clock)
        self._pending_points = 0  # cells of the queued frames' matrices: what the queue holds
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self._last_tick = 0.0
        self.ticks = 0
        self.components = Components(SHUTDOWN_BUDGET_S)
        self.receiver: OtlpReceiver | None = None
        self.endpoint: PrometheusEndpoint | None = None
        self.elector: LeaderElector | None = None  # with --k8s-apply and leader election
        self.k8s: K8sOutputSink | None = None  # with --k8s-apply
        # The cluster writer's budget of new acting taints (its metric reads 0 without a writer).
        self.brake = Brake(BudgetSettings.from_policy(self.policy))
        self.state: StateStore | None = None  # with a state directory: held faults across restarts
        self.heap = HeapTrimmer(config.heap)  # what the ticks and requests freed, handed back after a tick

    # -- data in -------------------------------------------------------------------------------
    def on_frames(self, frames: list[Frame], arrival_unix_nano: int | None = None) -> None:
        """A request's frames (called on the receiver's threads): queued for the next tick, each heard
        now (``arrival_unix_nano``: a test's clock), not when the tick that reads it runs: after a
        stall the kernel's buffered requests come in a burst, each heard at its arrival."""
        if frames:
            heard = time.time_ns() if arrival_unix_nano is None else arrival_unix_nano
            cells = sum(f.values.size for f in frames)
            with self._pending_lock:
                self._pending.extend(frames)
                self._arrivals.extend([heard] * len(frames))
                self._pending_points += cells

    def backlog(self) -> float | None:
        """Asked by the receivers before each request: None to take it, or seconds to wait when the queue
        is full (the next tick drains it)."""
        if self._pending_points < self.config.max_queued_points:
            return None
        return self.config.evaluate_every_s

    def tick(self, now_unix_nano: int | None = None, monotonic: float | None = None) -> list[Verdict]:
        """Ingest everything queued since the last tick, judge every device, publish the changes.
        ``now_unix_nano`` and ``monotonic``: a test's (or a simulation's) clocks. A tick far later than
        its schedule means the fleet itself stood still (:meth:`Classifier.pace`): nodes are then given a
        sampling interval to be heard before they are called stale (a simulation's tick, given ``now``
        and no ``monotonic``, is never late)."""
        if now_unix_nano is None or monotonic is not None:
            late = self.classifier.pace(self.config.evaluate_every_s, monotonic)
            if late:
                log.warning(
                    "the fleet stood still for %.0fs (stopped, throttled or paused; it could not read its sockets):"
                    " nodes get %gs to be heard before they are called stale",
                    late + self.config.evaluate_every_s,
                    self.config.sample_interval_s,
                )
        with self._pending_lock:
            frames, self._pending, self._pending_points = self._pending, [], 0
            arrivals, self._arrivals = self._arrivals, []
        now = time.time_ns() if now_unix_nano is None else now_unix_nano
        if frames:
            # The fleet's clock is the reference: a node is fresh when it was heard, whatever its own clock
            # says. Nothing is heard after the tick that reads it (a simulated clock may run behind the wall's).
            self.classifier.ingest_many(frames, [min(a, now) for a in arrivals])
        changed = self.classifier.evaluate(now)
        self.board.publish(changed, self.classifier.registry)
        self._last_tick = time.monotonic()
        self.ticks += 1
        if self.endpoint is not None:
            self.endpoint.sampled()
        return changed

    # -- running -------------------------------------------------------------------------------
    def _healthz(self) -> tuple[str, str, bytes]:
        """Healthy while the evaluation loop keeps ticking."""
        if time.monotonic() - self._last_tick <= 3 * self.config.evaluate_every_s + 5:
            return "200 OK", "text/plain", b"ok\n"
        return "503 Service Unavailable", "text/plain", b"the evaluation loop has stalled\n"

    def _start_cluster_writer(self, k8s: ClusterWriterConfig) -> None:
        """The DeviceTaintRule writer, and the election that decides whether it may write. Fails
        here (no kubeconfig, no client) before any port is bound."""
        from otel_dra.sinks.k8s.apply import connect
        from otel_dra.sinks.k8s.events import NORMAL, EventRecorder, Ref
        from otel_dra.sinks.k8s.lease import LeaderElector
        from otel_dra.sinks.k8s.sink import K8sOutputSink

        lease = k8s.lease.resolved()
        api_client = connect(user_agent=f"otel-dra/{__version__} (fleet; {lease.identity})", flag="--k8s-apply")
        domain = str(self.policy.sections["kubernetes"]["domain"])
        events = EventRecorder(api_client, f"{domain}/fleet", lease.identity) if k8s.events else None
        lease_ref = Ref("coordination.k8s.io/v1", "Lease", lease.name, lease.namespace) if k8s.leader_elect else None
        # The brake's state rides on the Lease: the next leader (or this one, restarted) holds the same brake.
        key = annotation_key(self.policy)

        def watch(found: dict[str, str]) -> None:
            if self.brake.watch(found, key) and events is not None and lease_ref is not None:
                note = f"released by an operator ({key}-release={found.get(f'{key}-release')})"
                events.record(lease_ref, NORMAL, "QuarantineBrakeReleased", "Release", note)

        elector = (
            LeaderElector(
                api_client,
                lease,
                annotations=lambda: self.brake.annotations(key),
                adopt=lambda found: self.brake.adopt(found, key),
                watch=watch,
            )
            if k8s.leader_elect
            else None
        )
        sink = K8sOutputSink(
            self.board,
            self.policy,
            k8s.sink,
            # A fresh fleet has not yet seen enough samples to re-find a fault: not deleting its rule yet.
            warmup_s=float(self.policy.min_samples) * self.config.sample_interval_s,
            api_client=api_client,
            leader=elector.is_leader if elector is not None else None,
            whole_fleet=True,
            name="cluster writer",
            # The one writer of the cluster's rules: a budget of new acting taints (kubernetes.budget).
            brake=self.brake,
            events=events,
            brake_ref=lease_ref,
        )
        if elector is not None:
            self.elector = self.components.start("leader election", elector)
        self.k8s = self.components.start("cluster writer", sink)

    def start(self) -> None:
        """Every component, in the order they shut down in reverse (but the state file, written first), the
        cluster writer (its Lease released then), the meter provider, the receivers, the HTTP endpoint,
        and the board. Binds every port here: a port in use fails before anything runs."""
        from otel_dra.receivers.factory import create_receiver

        cfg = self.config
        run = self.components
        if cfg.state_dir:  # recalled before the first tick; written first at shutdown
            state_file = StateFile(Path(cfg.state_dir) / FLEET_FILE, "fleet")
            self.state = run.start("state file", StateStore(self.classifier, state_file), first_s=STATE_FLUSH_S)
        if cfg.k8s is not None:
            self._start_cluster_writer(cfg.k8s)
        verdict_text = VerdictText(fork=cfg.render_fork)
        endpoint = None
        if cfg.endpoint.enabled:
            endpoint = PrometheusEndpoint(
                cfg.endpoint,
                3 * cfg.evaluate_every_s + 5,
                self.routes(),
                extra=lambda: verdict_text.exposition(self.board.snapshot()),
                description="The otel-dra fleet: verdicts for every node that pushes to it.",
                extra_version=lambda: self.board.version,  # (the verdict text changes only with the board)
            )
        readers = [endpoint.reader()] if endpoint is not None else []
        node = cfg.node_name or socket.gethostname()
        meter = provider.start_meter_provider(run, node, readers, FLEET_SERIES_LIMIT, "otel_dra.fleet")
        ViewDisagreement(self.board, meter, self.policy.shared_devices.combine)
        self.brake.instrument(meter)
        if self.k8s is not None:
            self.k8s.instrument(meter)
        rc = cfg.receiver
        receiver = create_receiver(rc, self.schema, self.on_frames, meter, self.backlog)
        self.receiver = run.start("OTLP receiver", receiver)
        self._last_tick = time.monotonic()
        if endpoint is not None:
            self.endpoint = run.start("HTTP endpoint", endpoint)
        run.start("verdict board", self.board)
        run.start("heap trimmer", self.heap)
        log.info(
            "otel-dra %s fleet: OTLP gRPC %s, OTLP/HTTP %s (%s), verdicts every %gs",
            __version__,
            rc.grpc_endpoint or "off",
            rc.http_endpoint or "off",
            describe(rc.tls),
            cfg.evaluate_every_s,
        )

    def routes(self) -> dict[str, Route]:
        return {"/healthz": self._healthz, "/v1/devices": self.board.json_route}

    def run(self) -> None:
        """Tick every ``evaluate_every`` seconds until :meth:`stop`, then close everything."""
        try:
            self.start()
            next_at = time.monotonic() + self.config.evaluate_every_s
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                if self.endpoint is not None:
                    # A rendering a scrape waits for goes first: half a period at most (never a stall, Freshness.pace).
                    self.endpoint.cache.idle(0.5 * self.config.evaluate_every_s)
                with self.heap.tick():  # (its large arrays on pages of their own, handed back as freed)
                    try:
                        self.tick()
                    except Exception as exc:  # a failed tick must not end the fleet
                        log.error("evaluation tick failed; retrying next tick", exc_info=exc)
                self.heap.after_tick()
                next_at = max(next_at + self.config.evaluate_every_s, time.monotonic())
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        started = self.receiver is not None
        self.components.shutdown()
        if started:
            log.info("fleet stopped (ticks: %d, samples: %d)", self.ticks, self.classifier.ingested_samples)
