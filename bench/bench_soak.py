"""Soak: the fleet classifier under a long run of simulated telemetry at full speed, with churn.

Run ``.venv/bin/python bench/bench_soak.py`` (100,000 devices, 10 minutes of 10 s samples) or
``--short`` (what CI runs: 4,000 devices, 10 minutes); figures go to ``BENCHMARKS.md``
between the ``bench_soak`` markers. Checked, and reported:

- memory: RSS growth after warm-up (the windows full) stays under 5%;
- latency: the tick (ingest + evaluate) in the last third of the run against the first third;
- no dropped series: every reporting device has a verdict on the board, every tick;
- churn: a share of the nodes is replaced by new ones every minute; devices gone longer than the
  TTL are forgotten, so the registry (and every per-device array) stays bounded.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402
from bench.bench_classifier import node_frames, rss_mb  # noqa: E402
from otel_dra import policy as policy_mod  # noqa: E402
from otel_dra.classifier import Classifier  # noqa: E402
from otel_dra.frame import DeviceTable, Frame, Schema  # noqa: E402
from otel_dra.sinks.verdicts import VerdictBoard  # noqa: E402
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig  # noqa: E402

START, END = "<!-- bench_soak:start -->", "<!-- bench_soak:end -->"
INTERVAL_S = 10.0
PER_NODE = 8
T0 = 1_800_000_000 * 10**9
RSS_GROWTH_LIMIT = 0.05


@dataclass
class SoakResult:
    devices: int
    ticks: int
    churned_nodes: int
    rss_warm_mb: float
    rss_end_mb: float
    first_ms: float
    last_ms: float
    max_registry: int
    capacity: int
    dropped_ticks: int

    @property
    def growth(self) -> float:
        return (self.rss_end_mb - self.rss_warm_mb) / self.rss_warm_mb


def soak(devices: int, minutes: float, churn_per_minute: float = 0.02, ttl: str = "2m") -> SoakResult:
    """Run the fleet classifier over ``minutes`` of samples for ``devices`` devices."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(f"device_ttl: {ttl}\n")
    policy = policy_mod.load(f.name)
    os.unlink(f.name)
    schema = Schema()
    source = SimulatedSource(SimulatorConfig("fleet", devices=devices, seed=3), schema)
    classifier = Classifier(policy, schema, interval_s=INTERVAL_S, capacity=devices)
    board = VerdictBoard()
    nodes = devices // PER_NODE
    generation = np.zeros(nodes, dtype=np.int64)  # a node that churns comes back under a new name
    rng = np.random.default_rng(5)
    ticks = int(minutes * 60 / INTERVAL_S)
    warm = classifier.store.window + 1
    latencies: list[float] = []
    rss_warm = 0.0
    max_registry = 0
    dropped = 0
    churned = 0
    for k in range(ticks):
        now = T0 + int(k * INTERVAL_S * 1e9)
        if k and k % int(60 / INTERVAL_S) == 0:  # once a minute, replace a share of the nodes
            gone = rng.random(nodes) < churn_per_minute
            generation[gone] += 1
            churned += int(gone.sum())
        frame = source.read(now)
        frames = [
            Frame(
                f.time_unix_nano,
                DeviceTable(f"{f.devices.node}-g{generation[i]}", f.devices.ids, f.devices.attrs),
                f.values,
            )
            for i, f in enumerate(node_frames(frame, PER_NODE))
        ]
        t0 = time.perf_counter()
        classifier.ingest_many(frames)
        board.publish(classifier.evaluate(now), classifier.registry)
        latencies.append(time.perf_counter() - t0)
        reporting = {(fr.devices.node, dev) for fr in frames for dev in fr.devices.ids}
        on_board = {(v.node, v.hw_id) for v, _ in board.snapshot()}
        dropped += int(not reporting <= on_board)
        max_registry = max(max_registry, len(classifier.registry))
        if k == warm:
            gc.collect()
            rss_warm = rss_mb()
    gc.collect()
    third = max(1, (ticks - warm) // 3)
    return SoakResult(
        devices=devices,
        ticks=ticks,
        churned_nodes=churned,
        rss_warm_mb=rss_warm,
        rss_end_mb=rss_mb(),
        first_ms=1e3 * statistics.median(latencies[warm : warm + third]),
        last_ms=1e3 * statistics.median(latencies[-third:]),
        max_registry=max_registry,
        capacity=classifier.registry.capacity,
        dropped_ticks=dropped,
    )


def markdown(r: SoakResult, short: bool) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ok = lambda hit: "✅ met" if hit else "❌ missed"  # noqa: E731
    rows = [
        (
            "RSS growth after warm-up",
            f"{100 * r.growth:+.1f}% ({r.rss_warm_mb:.0f} → {r.rss_end_mb:.0f} MB)",
            f"< {100 * RSS_GROWTH_LIMIT:g}%",
            ok(r.growth < RSS_GROWTH_LIMIT),
        ),
        (
            "Tick (ingest + evaluate), last third vs first third",
            f"{r.last_ms:.1f} ms vs {r.first_ms:.1f} ms",
            "stable (< x1.5)",
            ok(r.last_ms < 1.5 * r.first_ms),
        ),
        ("Ticks where a reporting device had no verdict", str(r.dropped_ticks), "0", ok(r.dropped_ticks == 0)),
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
                "## Soak: the fleet classifier over a long run, with churn (`bench/bench_soak.py`)",
                "",
                f"Measured {now} on {os.cpu_count()} CPUs, Python {platform.python_version()}: "
                f"{r.devices:,} devices, {r.ticks} ticks of {INTERVAL_S:g} s ({r.ticks * INTERVAL_S / 60:g} minutes "
                "of samples) at full speed; 2% of the nodes replaced by new ones every minute, device TTL 2 minutes."
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
    parser = argparse.ArgumentParser(description="fleet classifier soak")
    parser.add_argument("--short", action="store_true", help="4,000 devices (what CI runs)")
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args()
    result = soak(4_000 if args.short else args.devices, args.minutes)
    section = markdown(result, args.short)
    print(section)
    _report.write_section(START, END, section)


if __name__ == "__main__":
    main()
