"""Soak: ``otel-dra fleet`` under a long run of simulated telemetry at full speed, with churn.

Run ``.venv/bin/python bench/bench_soak.py`` (100,000 devices, 10 minutes of 10 s samples) or
``--short`` (what CI runs: 1,000 devices, 10 minutes); figures go to ``BENCHMARKS.md``
between the ``bench_soak`` markers.

The fleet is the one ``otel-dra fleet`` runs (:class:`otel_dra.fleet.Fleet`, started on loopback
ports): every tick, each node's OTLP request (the bytes an agent's exporter sends, made by the
agent's own pipeline) goes through the receiver's decoder into the fleet's queue, the fleet ticks
(ingest, evaluate, publish), and its real ``/metrics`` endpoint is scraped over HTTP. Requests are
fed in process (``OtlpReceiver.export_protobuf``, what the gRPC handler calls) so the figures are
the fleet's, not loopback's. Checked, and reported:

- memory: RSS growth after warm-up (the windows full) stays under 5%: the median RSS over the last
  third of the run against the median over the first third after warm-up, each reading taken after
  a garbage collection and ``malloc_trim`` (else a reading swings by a tenth at small sizes with the
  transient request and scrape buffers);
- latency: the tick (ingest + evaluate + publish) and the decode of a round, last third of the run
  against the first third;
- no dropped series: every tick, the scrape carries ``dra_device_health`` for every device that
  reported, and nothing was rejected;
- churn: a share of the nodes is replaced by new ones every minute; devices gone longer than the
  TTL are forgotten, so the registry (and every per-device array) stays bounded.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import gc
import logging
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402
from bench.bench_agent import free_port  # noqa: E402
from bench.bench_classifier import rss_mb  # noqa: E402
from bench.bench_receiver import agent_requests  # noqa: E402
from otel_dra import policy as policy_mod  # noqa: E402
from otel_dra.config import FleetConfig  # noqa: E402
from otel_dra.fleet import Fleet  # noqa: E402
from otel_dra.receivers.config import ReceiverConfig  # noqa: E402
from otel_dra.sinks.config import EndpointConfig  # noqa: E402

try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6")
    _LIBC.malloc_trim  # noqa: B018 - glibc only
except (OSError, AttributeError):
    _LIBC = None
START, END = "<!-- bench_soak:start -->", "<!-- bench_soak:end -->"
INTERVAL_S = 10.0
PER_NODE = 8
RSS_GROWTH_LIMIT = 0.05
SHORT_DEVICES = 1_000  # the short form, which CI runs (tests/e2e/test_soak.py)
#: A node name of fixed length: renaming a node (churn) must not move any byte of its request.
PLACEHOLDER = "node-000000-g000"
#: (No ``^`` with re.M: a pattern that starts with a literal is found by a fast scan, 3x faster on 250 MB.)
_DEVICE_HEALTH = re.compile(rb'dra_device_health\{[^}]*?hw_id="([^"]*)"[^}]*?k8s_node_name="([^"]*)"')
_ACCEPTED = re.compile(rb'^otel_dra_receiver_points_total\{[^}]*outcome="accepted"[^}]*\} (\S+)$', re.M)


def node_name(index: int, generation: int) -> bytes:
    name = f"node-{index:06d}-g{generation % 1000:03d}".encode()
    assert len(name) == len(PLACEHOLDER)
    return name


def settled_rss_mb() -> float:
    """RSS once garbage is collected and glibc has handed its free pages back (``malloc_trim``): what the
    process holds, without the swing of freed-but-kept heap from the tick's transient buffers."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    return rss_mb()


class Requests:
    """One node's agent request, made once by the agent's own pipeline, renamed and re-timed per node
    and tick with length-preserving byte edits (so the fleet's decoder sees what agents send)."""

    def __init__(self) -> None:
        self.template = agent_requests(PLACEHOLDER, PER_NODE, 1)[0]
        request = ExportMetricsServiceRequest.FromString(self.template)
        metric = request.resource_metrics[0].scope_metrics[0].metrics[0]
        self.stamp = getattr(metric, metric.WhichOneof("data")).data_points[0].time_unix_nano
        self.points = sum(
            len(getattr(m, m.WhichOneof("data")).data_points)
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        )

    def of(self, index: int, generation: int, t: int) -> bytes:
        old = b"\x19" + self.stamp.to_bytes(8, "little")  # field 3 (time_unix_nano), fixed64
        return self.template.replace(PLACEHOLDER.encode(), node_name(index, generation)).replace(
            old, b"\x19" + t.to_bytes(8, "little")
        )


@dataclass
class SoakResult:
    devices: int
    ticks: int
    churned_nodes: int
    rss_warm_mb: float
    rss_end_mb: float
    first_ms: float
    last_ms: float
    decode_first_ms: float
    decode_last_ms: float
    points_per_tick: int
    max_registry: int
    capacity: int
    dropped_ticks: int
    rejected_points: int

    @property
    def growth(self) -> float:
        return (self.rss_end_mb - self.rss_warm_mb) / self.rss_warm_mb


def scrape(url: str, accepted: int, timeout_s: float = 120.0) -> bytes:
    """The fleet's /metrics once it shows this tick (its receiver counter reads ``accepted``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read()
        found = _ACCEPTED.search(body)
        if found and float(found.group(1)) >= accepted:
            return body
        if time.monotonic() > deadline:
            raise RuntimeError(f"/metrics never showed this tick's {accepted} accepted points")
        time.sleep(0.05)


def soak(devices: int, minutes: float, churn_per_minute: float = 0.02, ttl: str = "2m") -> SoakResult:
    """Run ``otel-dra fleet``'s pipeline over ``minutes`` of samples for ``devices`` devices."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(f"device_ttl: {ttl}\n")
    policy = policy_mod.load(f.name)
    os.unlink(f.name)
    prom_port = free_port()
    config = FleetConfig(
        receiver=ReceiverConfig("127.0.0.1", grpc_port=free_port(), http_port=None),
        endpoint=EndpointConfig("127.0.0.1", prom_port),
        sample_interval_s=INTERVAL_S,
        evaluate_every_s=INTERVAL_S,
    )
    fleet = Fleet(config, policy)
    # Churned-away nodes go stale before their TTL: one WARNING line per device, thousands at full size.
    logging.getLogger("otel_dra.sinks.verdict_metrics").setLevel(logging.ERROR)
    fleet.start()
    receiver = fleet.receiver
    assert receiver is not None
    url = f"http://127.0.0.1:{prom_port}/metrics"
    requests = Requests()
    nodes = devices // PER_NODE
    generation = np.zeros(nodes, dtype=np.int64)  # a node that churns comes back under a new name
    rng = np.random.default_rng(5)
    ticks = int(minutes * 60 / INTERVAL_S)
    t0 = time.time_ns() - int((ticks + 2) * INTERVAL_S * 1e9)  # the run ends now: no point is in the future
    warm = fleet.classifier.store.window + 1
    latencies: list[float] = []
    decodes: list[float] = []
    rss: list[float] = []  # after every tick
    max_registry = dropped = churned = 0
    try:
        for k in range(ticks):
            now = t0 + int(k * INTERVAL_S * 1e9)
            if k and k % int(60 / INTERVAL_S) == 0:  # once a minute, replace a share of the nodes
                gone = rng.random(nodes) < churn_per_minute
                generation[gone] += 1
                churned += int(gone.sum())
            decoding = 0.0
            for i in range(nodes):
                data = requests.of(i, int(generation[i]), now)
                started = time.perf_counter()
                receiver.export_protobuf(data, "grpc")
                decoding += time.perf_counter() - started
            decodes.append(decoding)
            started = time.perf_counter()
            fleet.tick(now)
            latencies.append(time.perf_counter() - started)
            body = scrape(url, receiver.stats()["points"]["accepted"])
            on_metrics = set(_DEVICE_HEALTH.findall(body))
            reporting = {
                (f"gpu-{d}".encode(), node_name(i, int(generation[i]))) for i in range(nodes) for d in range(PER_NODE)
            }
            dropped += int(not reporting <= on_metrics)
            del body, on_metrics
            max_registry = max(max_registry, len(fleet.classifier.registry))
            rss.append(settled_rss_mb())
        third = max(1, (ticks - warm) // 3)
        return SoakResult(
            devices=nodes * PER_NODE,
            ticks=ticks,
            churned_nodes=churned,
            rss_warm_mb=statistics.median(rss[warm : warm + third]),
            rss_end_mb=statistics.median(rss[-third:]),
            first_ms=1e3 * statistics.median(latencies[warm : warm + third]),
            last_ms=1e3 * statistics.median(latencies[-third:]),
            decode_first_ms=1e3 * statistics.median(decodes[warm : warm + third]),
            decode_last_ms=1e3 * statistics.median(decodes[-third:]),
            points_per_tick=nodes * requests.points,
            max_registry=max_registry,
            capacity=fleet.classifier.registry.capacity,
            dropped_ticks=dropped,
            rejected_points=receiver.stats()["points"]["rejected"],
        )
    finally:
        fleet.close()


def markdown(r: SoakResult, short: bool) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ok = lambda hit: "✅ met" if hit else "❌ missed"  # noqa: E731
    rows = [
        (
            "RSS growth after warm-up (median, last third vs first third)",
            f"{100 * r.growth:+.1f}% ({r.rss_warm_mb:.0f} → {r.rss_end_mb:.0f} MB)",
            f"< {100 * RSS_GROWTH_LIMIT:g}%",
            ok(r.growth < RSS_GROWTH_LIMIT),
        ),
        (
            "Tick (ingest + evaluate + publish), last third vs first third",
            f"{r.last_ms:.1f} ms vs {r.first_ms:.1f} ms",
            "stable (< x1.5)",
            ok(r.last_ms < 1.5 * r.first_ms),
        ),
        (
            f"Decoding a round ({r.points_per_tick:,} points), last third vs first third",
            f"{r.decode_last_ms:.0f} ms vs {r.decode_first_ms:.0f} ms",
            "stable (< x1.5)",
            ok(r.decode_last_ms < 1.5 * r.decode_first_ms),
        ),
        (
            "Ticks whose /metrics lacked a reporting device; points rejected",
            f"{r.dropped_ticks}; {r.rejected_points}",
            "0; 0",
            ok(r.dropped_ticks == 0 and r.rejected_points == 0),
        ),
        (
            f"Registry under churn ({r.churned_nodes} nodes replaced)",
            f"at most {r.max_registry:,} devices, capacity {r.capacity:,}",
            f"bounded (< {2 * r.devices:,})",
            ok(r.max_registry < 2 * r.devices),
        ),
    ]
    return (
        "\n".join(
            [
                START,
                "## Soak: `otel-dra fleet` over a long run, with churn (`bench/bench_soak.py`)",
                "",
                f"Measured {now} on {os.cpu_count()} CPUs ({_report.cpu_model()}), Python "
                f"{platform.python_version()}: {r.devices:,} devices, {r.ticks} ticks of {INTERVAL_S:g} s "
                f"({r.ticks * INTERVAL_S / 60:g} minutes of samples) at full speed, each tick every node's OTLP "
                "request through the fleet's receiver, the fleet's tick, and a scrape of its /metrics; 2% of the "
                "nodes replaced by new ones every minute, device TTL 2 minutes. RSS is the one process's: the "
                "fleet and its load generator, which holds a copy of each scrape (about 2.5 kB a device)."
                + (" (Short form, as CI runs it.)" if short else ""),
                "",
                "| figure | measured | target | verdict |",
                "|---|---|---|---|",
                *("| " + " | ".join(row) + " |" for row in rows),
                "",
                f"Reproduce: `.venv/bin/python bench/bench_soak.py{' --short' if short else ''}`.",
                END,
            ]
        )
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="otel-dra fleet soak")
    parser.add_argument("--short", action="store_true", help=f"{SHORT_DEVICES:,} devices (what CI runs)")
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args()
    result = soak(SHORT_DEVICES if args.short else args.devices, args.minutes)
    section = markdown(result, args.short)
    print(section)
    _report.write_section(START, END, section)


if __name__ == "__main__":
    main()
