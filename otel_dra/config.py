"""The agent's configuration: one typed object, validated on construction, made of each
component's own config (:mod:`otel_dra.sinks.config`), with ``NODE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` resolved here."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from otel_dra.component import ConfigError as ConfigError  # (the CLI and tests import it from here too)
from otel_dra.decode.limits import DecodeLimits
from otel_dra.faults import Fault
from otel_dra.heap import HeapTrimConfig
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.scenario.load import PROFILES as LOAD_PROFILES
from otel_dra.sinks.config import EndpointConfig, K8sOutputConfig, KubeletConfig, OtlpPushConfig
from otel_dra.sinks.k8s.lease import LeaseConfig
from otel_dra.sinks.k8s.versions import API_VERSIONS, AUTO_API_VERSION
from otel_dra.sources import SOURCES

HEALTH_ATTRIBUTE_MODES = ("metric", "all")


def resolve_node_name(flag: str | None, env: Mapping[str, str] = os.environ) -> str:
    """``--node-name``, else ``k8s.node.name`` in ``OTEL_RESOURCE_ATTRIBUTES`` (read by the SDK's own
    detector, so its escaping rules apply), else ``NODE_NAME``, else the host name."""
    if flag:
        return flag
    from opentelemetry.sdk.resources import OTELResourceDetector  # only when running

    from_resource = OTELResourceDetector().detect().attributes.get("k8s.node.name")
    return str(from_resource or "") or env.get("NODE_NAME") or socket.gethostname()


@dataclass(frozen=True)
class AgentConfig:
    """Everything ``otel-dra run`` needs: the source's and the classifier's settings here, each
    sink's in its own config (with its defaults and checks); invalid values raise
    :class:`ConfigError`, one line naming the field (the CLI names its flag)."""

    node_name: str
    source: str = "auto"
    devices: int = 8
    faults: tuple[Fault, ...] = ()
    interval_s: float = 5.0
    seed: int | None = None
    #: --load: what the simulated GPUs run (otel_dra.scenario.load.PROFILES); idle for any real source.
    load: str = "idle"
    sysfs_root: str = "/sys"
    policy_path: str | None = None
    health_attribute: str = "metric"  # metric: dra.device.health only; all: also on every hw.* series
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    otlp: OtlpPushConfig = field(default_factory=OtlpPushConfig)
    kubelet: KubeletConfig = field(default_factory=KubeletConfig)
    k8s: K8sOutputConfig = field(default_factory=K8sOutputConfig)
    #: --state-dir: where the verdict engine's memory is kept across restarts (agent-<node>.json); None: not kept.
    state_dir: str | None = None

    def __post_init__(self) -> None:
        if self.k8s.apply and not self.k8s.output:
            raise ConfigError(
                "{K8sOutputConfig.apply} needs {K8sOutputConfig.output} DIR (the rules are written there, then applied)"
            )
        if self.source not in SOURCES:
            raise ConfigError(f"{{AgentConfig.source}} {self.source!r} is not known; use one of: {', '.join(SOURCES)}")
        if self.faults and self.source not in ("simulated", "auto"):
            raise ConfigError(
                "{AgentConfig.faults} injects into the simulated source only; use {AgentConfig.source} simulated"
            )
        if self.load not in LOAD_PROFILES:
            raise ConfigError(
                f"{{AgentConfig.load}} {self.load!r} is not known; use one of: {', '.join(LOAD_PROFILES)}"
            )
        if self.load != "idle" and not (self.source == "simulated" or (self.source == "auto" and self.faults)):
            raise ConfigError(
                f"{{AgentConfig.load}} {self.load} shapes the simulated source's GPUs only; add {{AgentConfig.source}} "
                "simulated (real GPUs run what they run)"
            )
        if not 1 <= self.devices <= DecodeLimits.max_devices_per_node:
            raise ConfigError(
                f"{{AgentConfig.devices}} must be 1 to {DecodeLimits.max_devices_per_node} (the per-node device "
                f"limit), got {self.devices}"
            )
        if not (self.interval_s > 0):
            raise ConfigError(f"{{AgentConfig.interval_s}} must be a positive number of seconds, got {self.interval_s}")
        if self.health_attribute not in HEALTH_ATTRIBUTE_MODES:
            raise ConfigError(f"{{AgentConfig.health_attribute}} must be one of {', '.join(HEALTH_ATTRIBUTE_MODES)}")
        if not self.node_name:
            raise ConfigError("node name is empty; set {AgentConfig.node_name} or NODE_NAME")

    @property
    def stale_after_s(self) -> float:
        """How old the newest frame may be before sinks stop exporting it (three missed passes)."""
        return 3.0 * self.interval_s


@dataclass(frozen=True)
class ClusterWriterConfig:
    """``otel-dra fleet --k8s-apply``: the fleet reconciles every DeviceTaintRule of the cluster,
    from its combined view (a device several nodes see gets one rule, per
    ``shared_devices.combine``). With ``leader_elect``, replicas elect one writer through a Lease."""

    api_version: str = AUTO_API_VERSION  # auto: the newest the cluster serves
    driver: str | None = None  # the DRA driver of devices whose telemetry names none
    output_dir: str | None = None  # also write the rendered files here
    leader_elect: bool = True
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    events: bool = True  # a Kubernetes Event (events.k8s.io/v1) for every rule change and for the brake
    resync_s: float = K8sOutputConfig.resync_s
    retry_s: float = K8sOutputConfig.retry_s

    @property
    def sink(self) -> K8sOutputConfig:
        """The writer's own settings: it always applies, and writes files only with an output directory."""
        return K8sOutputConfig(
            output=self.output_dir,
            api_version=self.api_version,
            driver=self.driver,
            apply=True,
            resync_s=self.resync_s,
            retry_s=self.retry_s,
        )

    def __post_init__(self) -> None:
        if self.api_version != AUTO_API_VERSION and self.api_version not in API_VERSIONS:
            raise ConfigError(
                f"{{ClusterWriterConfig.api_version}} {self.api_version!r} is not one of: "
                f"auto, {', '.join(API_VERSIONS)}"
            )


@dataclass(frozen=True)
class FleetConfig:
    """Everything ``otel-dra fleet`` needs: its own cadence here, each component's in its config."""

    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    sample_interval_s: float = 10.0  # how often agents push (their OTEL_METRIC_EXPORT_INTERVAL): sizes the windows
    evaluate_every_s: float = 5.0
    node_name: str = ""  # the fleet's own k8s.node.name on its self-telemetry; default: the host name
    k8s: ClusterWriterConfig | None = None  # --k8s-apply: the cluster's one DeviceTaintRule writer
    #: Points decoded but not yet ingested (the queue between the receivers and the next tick). Past it the
    #: receivers answer with backpressure until a tick drains it (``--max-queued-points``): about 12 bytes a point.
    max_queued_points: int = 4_000_000
    #: --state-dir: where the verdict engine's memory is kept across restarts (fleet.json); None: not kept.
    state_dir: str | None = None
    #: --no-heap-trim: keep glibc's free heap resident instead of handing it back after ticks (and numpy's
    #: arrays on the huge pages it asks for).
    heap: HeapTrimConfig = field(default_factory=HeapTrimConfig)
    #: --no-render-fork: make a large fleet's /metrics text on one core, never in a forked copy of the process
    #: (``otel_dra.sinks.verdict_text``: the copy holds pages of its own while it renders).
    render_fork: bool = True

    def __post_init__(self) -> None:
        if not self.sample_interval_s > 0 or not self.evaluate_every_s > 0:
            raise ConfigError(
                "{FleetConfig.sample_interval_s} and {FleetConfig.evaluate_every_s} must be positive numbers of seconds"
            )
        if self.max_queued_points < 1:
            raise ConfigError(f"{{FleetConfig.max_queued_points}} must be at least 1, got {self.max_queued_points}")
