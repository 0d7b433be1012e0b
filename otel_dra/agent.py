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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from prometheus_client import CollectorRegistry, ProcessCollector

from otel_dra import __version__
from otel_dra import conventions as cv
from otel_dra.classifier import Classifier
from otel_dra.config import AgentConfig
from otel_dra.frame import Frame, Schema
from otel_dra.policy import load as load_policy
from otel_dra.sinks import provider
from otel_dra.sinks._mapping import series_per_device
from otel_dra.sinks.exposition import ExpositionCache, Renderer
from otel_dra.sinks.http import HttpEndpoint
from otel_dra.sinks.metrics import MetricsSink
from otel_dra.sinks.sending_queue import SendingQueue
from otel_dra.sinks.verdicts import VERDICT_METRICS, VerdictBoard, VerdictMetrics
from otel_dra.sources import Source
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from otel_dra.state import FrameStore

log = logging.getLogger(__name__)

#: Time the shutdown may spend flushing before the process gives up on it.
SHUTDOWN_BUDGET_S = 4.0


def choose_source(config: AgentConfig) -> tuple[str, str]:
    """``--source auto``'s choice and why: NVML if it loads and finds GPUs, else sysfs if it finds
    devices, else the simulator."""
    if config.source != "auto":
        return config.source, "chosen with --source"
    from otel_dra.sources.nvml import nvml_available

    ok, why_nvml = nvml_available()
    if ok:
        return "nvml", why_nvml
    accelerators = pci_accelerators(config.sysfs_root)
    if accelerators:
        return "sysfs", f"{why_nvml}; sysfs shows {len(accelerators)} PCI accelerator(s): {', '.join(accelerators[:4])}"
    return "simulated", f"{why_nvml}; no PCI display or processing accelerator under {config.sysfs_root}/bus/pci"


def pci_accelerators(sysfs_root: str) -> list[str]:
    """PCI addresses of display (class 0x03) and processing-accelerator (0x12) devices: what makes
    ``auto`` read sysfs. A node with only NICs does not: its agent is for accelerators."""
    found = []
    for device in sorted(Path(sysfs_root, "bus", "pci", "devices").glob("*")):
        try:
            klass = (device / "class").read_text().strip()
        except OSError:
            continue
        if klass.startswith(("0x03", "0x12")):
            found.append(device.name)
    return found


def build_source(config: AgentConfig, schema: Schema) -> tuple[Source, str]:
    """The source ``--source`` names (``auto`` picks one), and why it was chosen."""
    name, why = choose_source(config)
    if name == "nvml":
        from otel_dra.sources.nvml import NvmlSource

        return NvmlSource(config.node_name, schema), why
    if name == "sysfs":
        from otel_dra.sources.sysfs import SysfsSource

        return SysfsSource(config.node_name, config.sysfs_root, schema), why
    sim = SimulatorConfig(node_name=config.node_name, devices=config.devices, faults=config.faults, seed=config.seed)
    return SimulatedSource(sim, schema), why


def series_limit(schema: Schema, devices: int) -> int:
    """The per-instrument series limit for ``devices`` devices of this schema."""
    widest = max((len(cols) for cols in schema.by_metric().values()), default=1)
    return provider.cardinality_limit(devices, series_per_device(widest))


@dataclass
class _Sinks:
    meter_provider: MeterProvider
    http: HttpEndpoint | None
    renderer: Renderer | None
    kubelet: Any = None  # KubeletHealthServer
    registration: Any = None  # RegistrationServer
    k8s: Any = None  # K8sOutputSink


class Agent:
    """Wires the pipeline for one node and runs it until stopped."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.schema = Schema()
        self.store = FrameStore()
        self.source, self.source_reason = build_source(config, self.schema)
        self.policy = load_policy(config.policy_path)
        self.classifier = Classifier(self.policy, self.schema, interval_s=config.interval_s)
        self.board = VerdictBoard()
        self._stop = threading.Event()
        self._sinks: _Sinks | None = None
        self.samples = 0

    # -- wiring ----------------------------------------------------------------------
    def _start_sinks(self, devices: int) -> _Sinks:
        cfg = self.config
        readers: list[MetricReader] = []
        queue: SendingQueue | None = None
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # the agent's own CPU and memory, next to what it reports
        if cfg.prometheus_port:
            readers.append(provider.prometheus_reader(registry))
        if cfg.otlp_endpoint:
            export_s = cfg.otlp_export_interval_s
            if export_s is None and not os.environ.get("OTEL_METRIC_EXPORT_INTERVAL"):
                export_s = cfg.interval_s  # push every sample unless the user chose a cadence
            reader, queue = provider.otlp_reader(
                cfg.otlp_endpoint, cfg.otlp_protocol, export_s, cfg.otlp_queue_max_age_s, cfg.otlp_queue_max_points
            )
            readers.append(reader)
            kept = "no queue"
            if queue is not None:
                kept = f"queue: {cfg.otlp_queue_max_age_s:g}s, {cfg.otlp_queue_max_points:,} points"
            log.info("pushing OTLP (%s) to %s (%s)", cfg.otlp_protocol, cfg.otlp_endpoint, kept)
        meter_provider = provider.build_meter_provider(cfg.node_name, readers, series_limit(self.schema, devices))
        meter = meter_provider.get_meter(cv.AGENT_SCOPE, __version__)
        if queue is not None:
            queue.register_metrics(meter)
        health = self.board if cfg.health_attribute == "all" else None
        MetricsSink(self.store, self.schema, meter, cfg.stale_after_s, exclude=VERDICT_METRICS, health=health)
        combine_mode = self.policy.data["shared_devices"]["combine"]
        VerdictMetrics(self.board, meter, combine_mode)
        sinks = _Sinks(meter_provider, None, None)
        self._sinks = sinks  # stop() can close what started even if a later sink fails to
        self._start_kubernetes(sinks, meter, combine_mode)
        if cfg.prometheus_port:
            cache = ExpositionCache(registry, cfg.stale_after_s)
            routes = {"/healthz": self._healthz, "/v1/devices": self.board.json_route}
            sinks.http = HttpEndpoint(cfg.prometheus_host, cfg.prometheus_port, cache, routes)
            sinks.renderer = Renderer(cache)
            sinks.renderer.start()
            sinks.http.start()
        return sinks

    def _start_kubernetes(self, sinks: _Sinks, meter: Meter, combine_mode: str) -> None:
        """The kubelet health stream, its registration, and the taint/attribute output, as configured."""
        cfg = self.config
        endpoint = cfg.kubelet_endpoint
        if endpoint:
            from otel_dra.sinks.kubelet import KubeletHealthServer, RegistrationServer

            fresh_ns = int(cfg.stale_after_s * 1e9)
            sinks.kubelet = KubeletHealthServer(
                endpoint,
                self.board,
                cfg.kubelet_health_timeout_s,
                meter,
                liveness=lambda: self.store.latest(time.monotonic_ns(), fresh_ns) is not None,
                combine_mode=combine_mode,
            )
            sinks.kubelet.start()
            if cfg.register_with_kubelet:
                sinks.registration = RegistrationServer(cfg.plugin_registry, cfg.register_with_kubelet, endpoint)
                sinks.registration.start()
        if cfg.k8s_output:
            from otel_dra.sinks.k8s.sink import K8sOutputSink

            sinks.k8s = K8sOutputSink(
                self.board,
                Path(cfg.k8s_output),
                self.policy,
                cfg.k8s_api_version,
                cfg.k8s_driver,
                apply_rules=cfg.k8s_apply,
                attributes=cfg.k8s_attributes,
                warmup_s=float(self.policy.data["min_samples"]) * cfg.interval_s,
            )
            sinks.k8s.start()

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
        if self._sinks is not None and self._sinks.renderer is not None:
            self._sinks.renderer.sampled()
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
            self._sinks = self._start_sinks(len(first.devices))
            next_at = time.monotonic() + cfg.interval_s
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
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
        sinks = self._sinks
        self.board.wake_all()
        if sinks is not None:
            if sinks.registration is not None:
                sinks.registration.stop(0.5)
            if sinks.kubelet is not None:
                sinks.kubelet.stop(1.0)
            if sinks.k8s is not None:
                sinks.k8s.stop()
            if sinks.http is not None:
                sinks.http.shutdown()
            if sinks.renderer is not None:
                sinks.renderer.stop()
            done = threading.Thread(
                target=sinks.meter_provider.shutdown,
                kwargs={"timeout_millis": SHUTDOWN_BUDGET_S * 1000},
                daemon=True,
            )
            done.start()
            done.join(SHUTDOWN_BUDGET_S)
            if done.is_alive():
                log.warning("metric flush did not finish in %.0fs; exiting without it", SHUTDOWN_BUDGET_S)
        self.source.close()
        log.info("stopped after %d samples", self.samples)
