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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector

from otel_dra import __version__
from otel_dra.classifier import Classifier, Verdict
from otel_dra.frame import Frame, Schema
from otel_dra.policy import Policy
from otel_dra.receivers.tls import TlsSettings, describe
from otel_dra.sinks import provider
from otel_dra.sinks.exposition import ExpositionCache, Renderer
from otel_dra.sinks.http import HttpEndpoint
from otel_dra.sinks.k8s.lease import LeaseConfig
from otel_dra.sinks.k8s.render import AUTO_API_VERSION, api_version_of
from otel_dra.sinks.verdict_text import VerdictText
from otel_dra.sinks.verdicts import VerdictMetrics
from otel_dra.state.board import VerdictBoard

log = logging.getLogger(__name__)

#: Per-instrument series limit for the fleet's verdict metrics (5 hw.status series per device).
FLEET_SERIES_LIMIT = 1_000_000


@dataclass(frozen=True)
class ClusterWriterConfig:
    """``--k8s-apply``: the fleet reconciles every DeviceTaintRule of the cluster, from its combined
    view (a device several nodes see gets one rule, per ``shared_devices.combine``). With
    ``leader_elect``, replicas elect one writer through a Lease; only it writes."""

    api_version: str = AUTO_API_VERSION  # auto: the newest the cluster serves
    driver: str | None = None  # the DRA driver of devices whose telemetry names none
    output_dir: str | None = None  # also write the rendered files here
    leader_elect: bool = True
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    resync_s: float = 60.0  # reapply this often even without a change (a rule deleted by hand returns)
    retry_s: float = 10.0

    def __post_init__(self) -> None:
        if self.api_version != AUTO_API_VERSION:
            api_version_of(self.api_version)  # ValueError naming the choices


@dataclass(frozen=True)
class FleetConfig:
    """What ``otel-dra fleet`` needs; validated by the CLI's option types and here."""

    host: str = "0.0.0.0"
    otlp_grpc_port: int = 4317
    otlp_http_port: int = 4318
    prometheus_port: int = 9464
    sample_interval_s: float = 10.0  # how often agents push: sizes the windows
    evaluate_every_s: float = 5.0
    max_request_bytes: int = 16 << 20
    node_name: str = ""
    tls: TlsSettings | None = None  # the OTLP receiver's TLS (both transports); None: plaintext
    max_future_s: float = 600.0  # points further ahead of the fleet's clock are rejected (0: no bound)
    k8s: ClusterWriterConfig | None = None  # --k8s-apply: the cluster's one DeviceTaintRule writer

    def __post_init__(self) -> None:
        for name in ("otlp_grpc_port", "otlp_http_port", "prometheus_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ValueError(f"--{name.replace('_', '-')} must be a TCP port (0 turns it off), got {port}")
        if not self.sample_interval_s > 0 or not self.evaluate_every_s > 0:
            raise ValueError("--sample-interval and --evaluate-every must be positive numbers of seconds")
        if not self.max_future_s >= 0:
            raise ValueError(f"--max-future must be 0 (no bound) or a number of seconds, got {self.max_future_s}")


class Fleet:
    """The fleet classifier and its receivers and sinks."""

    def __init__(self, config: FleetConfig, policy: Policy) -> None:
        self.config = config
        self.policy = policy
        self.schema = Schema()
        self.classifier = Classifier(policy, self.schema, interval_s=config.sample_interval_s, capacity=1024)
        self.board = VerdictBoard()
        self._pending: list[Frame] = []
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self._last_tick = 0.0
        self.ticks = 0
        self.receiver = None
        self.http: HttpEndpoint | None = None
        self.renderer: Renderer | None = None
        self.meter_provider = None
        self.elector: Any = None  # LeaderElector, with --k8s-apply and leader election
        self.k8s: Any = None  # K8sOutputSink, with --k8s-apply

    # -- data in -------------------------------------------------------------------------------
    def on_frames(self, frames: list[Frame]) -> None:
        """A request's frames (called on the receiver's threads): queued for the next tick."""
        if frames:
            with self._pending_lock:
                self._pending.extend(frames)

    def tick(self, now_unix_nano: int | None = None) -> list[Verdict]:
        """Ingest everything queued since the last tick, judge every device, publish the changes."""
        with self._pending_lock:
            frames, self._pending = self._pending, []
        now = time.time_ns() if now_unix_nano is None else now_unix_nano
        if frames:
            # The fleet's clock is the reference: a node is fresh when it was heard, whatever its own clock says.
            self.classifier.ingest_many(frames, now)
        changed = self.classifier.evaluate(now)
        self.board.publish(changed, self.classifier.registry)
        self._last_tick = time.monotonic()
        self.ticks += 1
        if self.renderer is not None:
            self.renderer.sampled()
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
        from otel_dra.sinks.k8s.lease import LeaderElector
        from otel_dra.sinks.k8s.sink import K8sOutputSink

        lease = k8s.lease.resolved()
        api_client = connect(user_agent=f"otel-dra/{__version__} (fleet; {lease.identity})", flag="--k8s-apply")
        if k8s.leader_elect:
            self.elector = LeaderElector(api_client, lease)
        self.k8s = K8sOutputSink(
            self.board,
            Path(k8s.output_dir) if k8s.output_dir else None,
            self.policy,
            k8s.api_version,
            k8s.driver,
            apply_rules=True,
            resync_s=k8s.resync_s,
            retry_s=k8s.retry_s,
            # A fresh fleet has not yet seen enough samples to re-find a fault: not deleting its rule yet.
            warmup_s=float(self.policy.data["min_samples"]) * self.config.sample_interval_s,
            api_client=api_client,
            leader=self.elector.is_leader if self.elector is not None else None,
            whole_fleet=True,
            name="cluster writer",
        )
        if self.elector is not None:
            self.elector.start()
        self.k8s.start()

    def start(self) -> None:
        """Bind every port (a port in use fails here, before anything runs)."""
        from otel_dra.receivers.otlp import OtlpReceiver

        cfg = self.config
        if cfg.k8s is not None:
            self._start_cluster_writer(cfg.k8s)
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        readers = [provider.prometheus_reader(registry)] if cfg.prometheus_port else []
        node = cfg.node_name or socket.gethostname()
        self.meter_provider = provider.build_meter_provider(node, readers, FLEET_SERIES_LIMIT)
        meter = self.meter_provider.get_meter("otel_dra.fleet", __version__)
        VerdictMetrics(self.board, meter, self.policy.data["shared_devices"]["combine"], states=False)
        verdict_text = VerdictText()
        grpc_at = f"{cfg.host}:{cfg.otlp_grpc_port}" if cfg.otlp_grpc_port else None
        http_at = f"{cfg.host}:{cfg.otlp_http_port}" if cfg.otlp_http_port else None
        self.receiver = OtlpReceiver(
            self.schema,
            self.on_frames,
            grpc_at,
            http_at,
            cfg.max_request_bytes,
            meter,
            tls=cfg.tls,
            max_future_s=cfg.max_future_s or None,
        )
        self.receiver.start()
        self._last_tick = time.monotonic()
        if cfg.prometheus_port:
            cache = ExpositionCache(
                registry, 3 * cfg.evaluate_every_s + 5, extra=lambda: verdict_text.render(self.board.snapshot())
            )
            routes = {"/healthz": self._healthz, "/v1/devices": self.board.json_route}
            self.http = HttpEndpoint(cfg.host, cfg.prometheus_port, cache, routes)
            self.renderer = Renderer(cache)
            self.renderer.start()
            self.http.start()
        log.info(
            "otel-dra %s fleet: OTLP gRPC %s, OTLP/HTTP %s (%s), verdicts every %gs",
            __version__,
            grpc_at or "off",
            http_at or "off",
            describe(cfg.tls),
            cfg.evaluate_every_s,
        )

    def run(self) -> None:
        """Tick every ``evaluate_every`` seconds until :meth:`stop`, then close everything."""
        try:
            self.start()
            next_at = time.monotonic() + self.config.evaluate_every_s
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                try:
                    self.tick()
                except Exception as exc:  # a failed tick must not end the fleet
                    log.error("evaluation tick failed; retrying next tick", exc_info=exc)
                next_at = max(next_at + self.config.evaluate_every_s, time.monotonic())
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self.k8s is not None:
            self.k8s.stop()  # no more writes, then the Lease goes to a standby at once
        if self.elector is not None:
            self.elector.stop()
        self.board.wake_all()
        if self.receiver is not None:
            self.receiver.stop(1.0)
        if self.http is not None:
            self.http.shutdown()
        if self.renderer is not None:
            self.renderer.stop()
        if self.meter_provider is not None:
            self.meter_provider.shutdown(timeout_millis=2000)
        if self.receiver is not None:  # it started
            log.info("fleet stopped after %d ticks, %d samples", self.ticks, self.classifier.ingested_samples)
