"""The node agent: source → store → sinks, on a fixed sampling schedule.

Sampling runs on the main loop; Prometheus scrapes and OTLP exports run on their
own threads and read the store, so a slow collector or scraper never delays a
sample. ``stop()`` (wired to SIGTERM/SIGINT by the CLI) flushes and returns
within a bounded time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics.export import MetricReader

from otel_dra import __version__, sources
from otel_dra import conventions as cv
from otel_dra.classifier import Classifier
from otel_dra.component import Components, OnShutdown
from otel_dra.config import AgentConfig
from otel_dra.frame import Frame, Schema
from otel_dra.sinks import provider
from otel_dra.sinks._mapping import series_per_device
from otel_dra.sinks.endpoint import PrometheusEndpoint, Route
from otel_dra.sinks.metrics import MetricsSink
from otel_dra.sinks.policy_sections import load_policy
from otel_dra.sinks.sending_queue import SendingQueue
from otel_dra.sinks.verdict_metrics import VERDICT_METRICS, VerdictMetrics
from otel_dra.sources import Source
from otel_dra.state import FrameStore, VerdictBoard
from otel_dra.state.persist import StateFile, StateStore, agent_file

log = logging.getLogger(__name__)

#: Time the shutdown may spend flushing before the process gives up on it.
SHUTDOWN_BUDGET_S = 4.0
STATE_FLUSH_S = 1.5  # of it, at most, for the state file's last write (the first thing done at shutdown)


def build_source(config: AgentConfig, schema: Schema) -> tuple[Source, str]:
    """The source ``--source`` names (``auto`` asks each real source what it would report), and why."""
    return sources.build(config, schema)


def series_limit(schema: Schema, devices: int) -> int:
    """The per-instrument series limit for ``devices`` devices of this schema."""
    widest = max((len(cols) for cols in schema.by_metric().values()), default=1)
    return provider.cardinality_limit(devices, series_per_device(widest))


class Agent:
    """Wires the pipeline for one node and runs it until stopped: source → store → classifier →
    sinks, each sink a component started in order and shut down in reverse."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.schema = Schema()
        self.store = FrameStore()
        self.source, self.source_reason = build_source(config, self.schema)
        self.policy = load_policy(config.policy_path)
        # On the devices' node: this agent's own restart, the devices present again, is the reboot_node repair.
        self.classifier = Classifier(self.policy, self.schema, interval_s=config.interval_s, restart_repairs=True)
        self.board = VerdictBoard()
        self.components = Components(SHUTDOWN_BUDGET_S)
        self.components.start("source", OnShutdown(lambda _t: self.source.close()))
        self.state: StateStore | None = None  # held faults across restarts, recalled before the first sample
        if config.state_dir:
            state_file = StateFile(Path(config.state_dir) / agent_file(config.node_name), "agent", config.node_name)
            store = StateStore(self.classifier, state_file)
            self.state = self.components.start("state file", store, first_s=STATE_FLUSH_S)
        self.endpoint: PrometheusEndpoint | None = None
        self._stop = threading.Event()
        self.samples = 0

    # -- wiring ----------------------------------------------------------------------
    def _start_sinks(self, devices: int) -> None:
        """Every sink, in the order they shut down in reverse: the meter provider (flushed last),
        the kubelet stream and its registration, the Kubernetes output, the HTTP endpoint, and the
        board (woken first, so no sink thread waits on it)."""
        cfg = self.config
        run = self.components
        endpoint = None
        if cfg.endpoint.enabled:
            about = f"The otel-dra node agent on node {cfg.node_name}."
            endpoint = PrometheusEndpoint(cfg.endpoint, cfg.stale_after_s, self.routes(), description=about)
        readers: list[MetricReader] = [endpoint.reader()] if endpoint is not None else []
        queue: SendingQueue | None = None
        push = cfg.otlp
        if push.endpoint:
            export_s = push.export_interval_s
            if export_s is None and not os.environ.get("OTEL_METRIC_EXPORT_INTERVAL"):
                export_s = cfg.interval_s  # push every sample unless the user chose a cadence
            reader, queue = provider.otlp_reader(
                push.endpoint, push.protocol, export_s, push.queue_max_age_s, push.queue_max_points
            )
            readers.append(reader)
            kept = "no queue"
            if queue is not None:
                kept = f"queue: {push.queue_max_age_s:g}s, {push.queue_max_points:,} points"
            log.info("pushing OTLP (%s) to %s (%s)", push.protocol, push.endpoint, kept)
        # otel_dra.source on the resource: metrics of simulated devices say so wherever they end up.
        meter = provider.start_meter_provider(
            run, cfg.node_name, readers, series_limit(self.schema, devices), cv.AGENT_SCOPE, source=self.source.name
        )
        if queue is not None:
            queue.register_metrics(meter)
        health = self.board if cfg.health_attribute == "all" else None
        MetricsSink(self.store, self.schema, meter, cfg.stale_after_s, exclude=VERDICT_METRICS, health=health)
        combine_mode = self.policy.shared_devices.combine
        VerdictMetrics(self.board, meter, combine_mode)
        self._start_kubernetes(meter, combine_mode)
        if endpoint is not None:
            self.endpoint = run.start("HTTP endpoint", endpoint)
        run.start("verdict board", self.board)

    def _start_kubernetes(self, meter: Meter, combine_mode: str) -> None:
        """The kubelet health stream, its registration, and the taint/attribute output, as configured."""
        cfg, run = self.config, self.components
        kubelet = cfg.kubelet
        endpoint = kubelet.endpoint
        if endpoint:
            from otel_dra.sinks.kubelet import KubeletHealthServer, RegistrationServer

            fresh_ns = int(cfg.stale_after_s * 1e9)
            server = KubeletHealthServer(
                endpoint,
                self.board,
                kubelet.health_timeout_s,
                meter,
                liveness=lambda: self.store.latest(time.monotonic_ns(), fresh_ns) is not None,
                combine_mode=combine_mode,
            )
            run.start("kubelet health stream", server)
            if kubelet.register_with:
                registration = RegistrationServer(kubelet.plugin_registry, kubelet.register_with, endpoint)
                run.start("kubelet registration", registration)
        k8s = cfg.k8s
        if k8s.output:
            from otel_dra.sinks.k8s.sink import K8sOutputSink

            warmup_s = float(self.policy.min_samples) * cfg.interval_s
            sink = K8sOutputSink(self.board, self.policy, k8s, warmup_s=warmup_s)
            run.start("Kubernetes output", sink)

    def routes(self) -> dict[str, Route]:
        return {"/healthz": self._healthz, "/v1/devices": self.board.json_route}

    def _healthz(self) -> tuple[str, str, bytes]:
        """Healthy while samples keep arriving: a wedged sampling loop fails the liveness probe."""
        fresh = self.store.latest(time.monotonic_ns(), int(self.config.stale_after_s * 1e9)) is not None
        if fresh:
            return "200 OK", "text/plain", b"ok\n"
        return "503 Service Unavailable", "text/plain", b"no fresh samples\n"

    # -- running ---------------------------------------------------------------------
    def sample_once(self) -> Frame:
        frame = self.source.read(time.time_ns())
        self.store.put(frame, time.monotonic_ns())
        self.classifier.ingest(frame)
        self.board.publish(self.classifier.evaluate(frame.time_unix_nano), self.classifier.registry)
        self.samples += 1
        if self.endpoint is not None:
            self.endpoint.sampled()
        return frame

    def run(self) -> None:
        """Sample every ``interval`` seconds until :meth:`stop`; then flush and close."""
        cfg = self.config
        log.info(
            "otel-dra %s starting: node=%s source=%s interval=%gs",
            __version__,
            cfg.node_name,
            self.source.name,
            cfg.interval_s,
        )
        log.info("source %s: %s", self.source.name, self.source_reason)
        for fault in cfg.faults:
            log.info("fault injection scheduled: %s", fault)
        try:
            first = self.sample_once()
            log.info("first sample: %d devices", len(first.devices))
            self._start_sinks(len(first.devices))
            next_at = time.monotonic() + cfg.interval_s
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                # A pass far behind schedule: the agent itself stood still (SIGSTOP, throttled), and a device
                # its source skips this pass is given a sampling interval before it is called stale.
                self.classifier.pace(cfg.interval_s)
                try:
                    self.sample_once()
                except Exception as exc:  # a failing pass must not end the agent
                    log.error("sampling pass failed; retrying next interval", exc_info=exc)
                next_at += cfg.interval_s
                if next_at < time.monotonic():  # fell behind (suspended, overloaded): skip, don't burst
                    next_at = time.monotonic() + cfg.interval_s
        finally:
            self._shutdown()

    def stop(self) -> None:
        self._stop.set()

    def _shutdown(self) -> None:
        log.info("stopping: flushing metrics")
        late = self.components.shutdown()
        if "meter provider" in late:
            log.warning("metric flush did not finish in %.0fs; exiting without it", SHUTDOWN_BUDGET_S)
        log.info("stopped after %d samples", self.samples)
