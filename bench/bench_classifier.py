"""Benchmarks of the classifier at fleet scale: one evaluation tick, and memory, at 100,000 devices.

Run ``.venv/bin/python bench/bench_classifier.py [--devices N] [--quick]``; figures go to the
terminal and to ``BENCHMARKS.md`` (the section between the ``bench_classifier`` markers).

Benchmarks, not timed tests: each figure is set beside a baseline measured in the same run.

1. **Tick**: a fleet of ``N`` simulated GPUs (8 per node) with a 5-minute window at 10 s
   sampling (30 samples per device) is ingested; then one tick (ingest one sample per device,
   evaluate every device) is timed, median over several ticks, and the evaluation alone.
2. **Naive twin**: the plain-Python, per-device, per-sample twin from the tests
   (``tests/support/naive_twin.py``) judges the same data. It is too slow for the whole fleet, so both
   run on the same subset of devices and the per-device cost is compared; the twin's time
   for the whole fleet is extrapolated linearly (it is per device by construction).
3. **Memory**: RSS of the process before and after building the fleet's state.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402
from otel_dra import policy as policy_mod  # noqa: E402
from otel_dra.classifier import Classifier  # noqa: E402
from otel_dra.frame import Frame, Schema  # noqa: E402
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig  # noqa: E402

BENCHMARKS_MD = _report.BENCHMARKS_MD
START, END = "<!-- bench_classifier:start -->", "<!-- bench_classifier:end -->"
TICK_TARGET_MS = 50.0
TWIN_TARGET_RATIO = 100.0
RSS_TARGET_MB = 1536.0
INTERVAL_S = 10.0
PER_NODE = 8
T0 = 1_800_000_000 * 10**9
console = Console()


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def node_frames(frame: Frame, per_node: int) -> list[Frame]:
    """Split one big simulated frame into per-node frames (as a fleet's nodes would send them)."""
    out = []
    table = frame.devices
    for start in range(0, len(table), per_node):
        stop = min(start + per_node, len(table))
        from otel_dra.frame import DeviceTable

        sub = DeviceTable(f"node-{start // per_node}", table.ids[start:stop], table.attrs[start:stop])
        out.append(Frame(frame.time_unix_nano, sub, frame.values[start:stop]))
    return out


class Fleet:
    """A simulated fleet fed to a classifier through the batch path (one ingest per tick)."""

    def __init__(self, devices: int, seed: int = 1) -> None:
        self.schema = Schema()
        self.source = SimulatedSource(SimulatorConfig("fleet", devices=devices, seed=seed), self.schema)
        self.policy = policy_mod.load()
        self.classifier = Classifier(self.policy, self.schema, interval_s=INTERVAL_S, capacity=devices)
        self.tick = 0
        first = self.source.read(T0)
        # Register every node's devices once (what a fleet receiver does as nodes appear).
        rows, new = [], []
        for f in node_frames(first, PER_NODE):
            r, n = self.classifier.registry.rows_for(f.devices.node, f.devices.ids)
            self.classifier.device_rows._note_attrs(r, f.devices.attrs, n)
            rows.append(r)
            new.append(n)
        self.rows = np.concatenate(rows)
        self.classifier.ingest_rows(self.rows, np.concatenate(new), T0, first.values)
        self.first = first

    def now(self) -> int:
        return T0 + int(self.tick * INTERVAL_S * 1e9)

    def ingest(self) -> Frame:
        self.tick += 1
        frame = self.source.read(self.now())
        self.classifier.ingest_rows(self.rows, np.zeros(self.rows.shape, bool), frame.time_unix_nano, frame.values)
        return frame


def bench_tick(devices: int, ticks: int) -> dict[str, float]:
    gc.collect()
    before = rss_mb()
    fleet = Fleet(devices)
    window = fleet.classifier.store.window
    for _ in range(window):  # fill the window
        fleet.ingest()
        fleet.classifier.evaluate(fleet.now())
    after = rss_mb()
    tick_ms, eval_ms, ingest_ms = [], [], []
    for _ in range(ticks):
        t0 = time.perf_counter()
        fleet.ingest()
        t1 = time.perf_counter()
        fleet.classifier.evaluate(fleet.now())
        t2 = time.perf_counter()
        ingest_ms.append(1e3 * (t1 - t0))
        eval_ms.append(1e3 * (t2 - t1))
        tick_ms.append(1e3 * (t2 - t0))
    sim_ms = statistics.median(_time_sim(fleet, 3))
    return {
        "devices": devices,
        "window": window,
        "eval_ms": statistics.median(eval_ms),
        "ingest_ms": statistics.median(ingest_ms) - sim_ms,
        "tick_ms": statistics.median(tick_ms) - sim_ms,
        "sim_ms": sim_ms,
        "rss_before_mb": before,
        "rss_after_mb": after,
    }


def _time_sim(fleet: Fleet, n: int) -> list[float]:
    """The simulator's own share of an ingest (not part of the classifier's cost)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fleet.source.read(fleet.now())
        out.append(1e3 * (time.perf_counter() - t0))
    return out


def bench_twin(devices: int, timed_ticks: int = 2) -> dict[str, float]:
    """The evaluation tick, vectorised vs naive twin, on the same fleet and the same frames."""
    from tests.support.naive_twin import NaiveClassifier

    schema = Schema()
    source = SimulatedSource(SimulatorConfig("fleet", devices=devices, seed=2), schema)
    policy = policy_mod.load()
    fast = Classifier(policy, schema, interval_s=INTERVAL_S, capacity=devices)
    slow = NaiveClassifier(policy, schema, interval_s=INTERVAL_S)
    window = fast.store.window
    fast_ms: list[float] = []
    slow_ms: list[float] = []
    for k in range(window + 1 + timed_ticks):
        now = T0 + int(k * INTERVAL_S * 1e9)
        frames = node_frames(source.read(now), PER_NODE)
        fast.ingest_many(frames)
        for frame in frames:
            slow.ingest(frame)
        timed = k > window  # full windows only
        t0 = time.perf_counter()
        fast.evaluate(now)
        t1 = time.perf_counter()
        if timed or k == 0:  # the twin's evaluation is slow: only where it is measured (and once to start)
            slow.evaluate(now)
        t2 = time.perf_counter()
        if timed:
            fast_ms.append(1e3 * (t1 - t0))
            slow_ms.append(1e3 * (t2 - t1))
    return {
        "devices": devices,
        "fast_tick_ms": statistics.median(fast_ms),
        "slow_tick_ms": statistics.median(slow_ms),
    }


def markdown(tick: dict[str, float], twin: dict[str, float], quick: bool) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    n = int(tick["devices"])
    twin_fleet_ms = twin["slow_tick_ms"] / twin["devices"] * n
    ratio_same = twin["slow_tick_ms"] / twin["fast_tick_ms"]
    ratio_fleet = twin_fleet_ms / tick["eval_ms"]
    rss = tick["rss_after_mb"] - tick["rss_before_mb"]
    ok = lambda hit: "✅ met" if hit else "❌ missed"  # noqa: E731
    cmd = ".venv/bin/python bench/bench_classifier.py" + (" --quick" if quick else "")
    rows = [
        (
            f"Evaluation tick, {n:,} devices, 5 m window at 10 s ({int(tick['window'])} samples)",
            f"{tick['eval_ms']:.1f} ms",
            f"< {TICK_TARGET_MS:g} ms",
            "—",
            "—",
            ok(tick["eval_ms"] < TICK_TARGET_MS),
        ),
        (
            f"Whole tick (ingest one sample per device + evaluate), {n:,} devices",
            f"{tick['tick_ms']:.1f} ms",
            "—",
            f"simulator's own {tick['sim_ms']:.0f} ms excluded",
            "—",
            "—",
        ),
        (
            f"Evaluation tick vs the naive twin, same data ({int(twin['devices']):,} devices, full windows)",
            f"{twin['fast_tick_ms']:.1f} ms vectorised",
            f">= {TWIN_TARGET_RATIO:g}x faster",
            f"{twin['slow_tick_ms']:.0f} ms twin",
            f"x{ratio_same:.0f}",
            ok(ratio_same >= TWIN_TARGET_RATIO),
        ),
        (
            f"... the twin extrapolated to {n:,} devices (its cost is per device)",
            f"{tick['eval_ms']:.1f} ms",
            f">= {TWIN_TARGET_RATIO:g}x faster",
            f"{twin_fleet_ms / 1e3:.1f} s twin",
            f"x{ratio_fleet:.0f}",
            ok(ratio_fleet >= TWIN_TARGET_RATIO),
        ),
        (
            f"RSS for {n:,} devices (classifier state, window full)",
            f"{rss:.0f} MB",
            f"< {RSS_TARGET_MB:g} MB",
            f"{tick['rss_before_mb']:.0f} MB before",
            f"+{rss:.0f} MB",
            ok(rss < RSS_TARGET_MB),
        ),
    ]
    lines = [
        START,
        "## Classifier at fleet scale (`bench/bench_classifier.py`)",
        "",
        f"Measured {now}{' (quick mode)' if quick else ''} on {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, numpy {np.__version__}.",
        "",
        "| figure | measured | target | baseline (same run) | ratio | verdict |",
        "|---|---|---|---|---|---|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        "- The fleet is simulated GPUs, 8 per node, fed through the batch path (one ingest per tick for all "
        "devices, as the fleet receiver batches requests); the window is full before timing starts. The "
        "evaluation runs every rule for every device and the verdict engine (hysteresis, escalation, change "
        "detection); the window store's running sums make it O(devices), not O(devices x samples).",
        "- The twin (`tests/support/naive_twin.py`) is the plain-Python, per-device, per-sample implementation of the "
        "same policy that the property tests check the classifier against. Both were fed the same per-node "
        "frames every tick; the evaluation ticks compared are those with full windows. The twin is too slow "
        "to judge 100,000 devices in a benchmark run, so its per-device cost is extrapolated (it loops over "
        "devices by construction).",
        "",
        f"Reproduce: `{cmd}`.",
        END,
    ]
    return "\n".join(lines) + "\n"


def write_section(section: str) -> None:
    """Replace (or append) our section of BENCHMARKS.md, leaving the rest of the file as it is."""
    _report.write_section(START, END, section, BENCHMARKS_MD)


def main() -> None:
    parser = argparse.ArgumentParser(description="classifier benchmarks")
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--twin-devices", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="10,000 devices, fewer ticks")
    args = parser.parse_args()
    devices = 10_000 if args.quick else args.devices
    console.print(f"tick: {devices:,} devices …")
    tick = bench_tick(devices, 3 if args.quick else 7)
    console.print(f"twin: {args.twin_devices:,} devices …")
    twin = bench_twin(2_000 if args.quick else args.twin_devices)
    section = markdown(tick, twin, args.quick)
    table = Table(title="classifier benchmarks")
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| figure"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not table.columns:
                for col in ("figure", "measured", "target", "baseline", "ratio", "verdict"):
                    table.add_column(col)
            table.add_row(*cells)
    console.print(table)
    write_section(section)
    console.print("wrote BENCHMARKS.md")


if __name__ == "__main__":
    main()
