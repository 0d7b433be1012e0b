"""Recorded-telemetry fixtures: simulated nodes written as OTLP JSON lines, the Collector's
file-exporter format, through the project's own metric sink and the real OpenTelemetry SDK
and protobuf JSON mapping (so replay reads exactly what an agent sends)."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterable
from pathlib import Path

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_dra import __version__
from otel_dra.decode import OtlpJsonDecoder
from otel_dra.faults import Fault
from otel_dra.frame import Frame, Schema
from otel_dra.sinks import provider
from otel_dra.sinks.metrics import MetricsSink
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from otel_dra.state import FrameStore

S = 10**9
T0 = 1_795_000_000 * S


class Recorder:
    """A node's frames as its agent would send them: the metric sink and the SDK's pipeline, built once and read
    once a frame, as an agent's are (built afresh for every frame they cost a long trace some 13% more)."""

    def __init__(self, node: str, schema: Schema) -> None:
        self.store = FrameStore()
        self.reader = InMemoryMetricReader()
        self.mp = provider.build_meter_provider(node, [self.reader], 5000)
        MetricsSink(self.store, schema, self.mp.get_meter("otel_dra", __version__), max_age_s=3600.0)

    def request(self, frame: Frame) -> dict:
        """One ExportMetricsServiceRequest (JSON mapping) for ``frame``, stamped with the frame's time."""
        self.store.put(frame, time.monotonic_ns())
        data = self.reader.get_metrics_data()
        return _stamped(MessageToDict(encode_metrics(data), use_integers_for_enums=True), frame)

    def close(self) -> None:
        self.mp.shutdown()


def request(frame: Frame, schema: Schema) -> dict:
    """One ExportMetricsServiceRequest (JSON mapping) for ``frame``, stamped with the frame's time."""
    recorder = Recorder(frame.devices.node, schema)
    try:
        return recorder.request(frame)
    finally:
        recorder.close()


def _stamped(doc: dict, frame: Frame) -> dict:
    """Every point of ``doc`` stamped with the frame's time (and the trace's start)."""
    for rm in doc.get("resourceMetrics", []):
        for sm in rm.get("scopeMetrics", []):
            for metric in sm.get("metrics", []):
                for kind in ("gauge", "sum"):
                    for point in metric.get(kind, {}).get("dataPoints", []):
                        point["timeUnixNano"] = str(frame.time_unix_nano)
                        point["startTimeUnixNano"] = str(T0)
    return doc


def write_trace(
    path: Path,
    nodes: dict[str, tuple[int, Iterable[Fault]]],
    seconds: int,
    interval: int = 10,
    silent: dict[str, tuple[int, int]] | None = None,
    extra_lines: Iterable[str] = (),
) -> Path:
    """``nodes``: name → (devices, faults). ``silent``: name → (from s, to s) with no lines.
    Lines are in time order per node, interleaved by node, as a Collector writes them."""
    sources = {
        node: SimulatedSource(
            SimulatorConfig(node, devices=n, faults=tuple(faults), seed=i, start_unix_nano=T0), Schema()
        )
        for i, (node, (n, faults)) in enumerate(nodes.items())
    }
    recorders = {node: Recorder(node, src.schema) for node, src in sources.items()}
    lines = []
    for t in range(0, seconds + 1, interval):
        for node, src in sources.items():
            frame = src.read(T0 + t * S)
            quiet = (silent or {}).get(node)
            if quiet and quiet[0] <= t < quiet[1]:
                continue
            lines.append(json.dumps(recorders[node].request(frame)))
    for recorder in recorders.values():
        recorder.close()
    lines.extend(extra_lines)
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def read_verdicts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def power_line(node: str, devices: int, time_unix_nano: str = "1") -> str:
    """One OTLP JSON line of ``devices`` hw.power points for ``node`` (a name the caps may refuse, or more devices
    than a node may have)."""
    pts = [
        {
            "attributes": [{"key": "hw.id", "value": {"stringValue": f"gpu-{i}"}}],
            "timeUnixNano": time_unix_nano,
            "asDouble": 1.0,
        }
        for i in range(devices)
    ]
    res = {"attributes": [{"key": "k8s.node.name", "value": {"stringValue": node}}]}
    metric = {"name": "hw.power", "gauge": {"dataPoints": pts}}
    return json.dumps({"resourceMetrics": [{"resource": res, "scopeMetrics": [{"metrics": [metric]}]}]})


class PlainDecoder(OtlpJsonDecoder):
    """The JSON decoder without its tokenizing fast path (so without shapes and templates either): the reference the
    fast paths must match."""

    def _tokenize(self, line: bytes) -> bytes | None:
        return None
