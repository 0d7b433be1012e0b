"""The soak benchmark in its short form, as a test: memory flat after warm-up, ticks stable, no
device without a verdict, the registry bounded while nodes churn (issue #7)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_soak import RSS_GROWTH_LIMIT, soak


def test_short_soak_holds_memory_latency_series_and_the_registry():
    r = soak(devices=4_000, minutes=10)
    assert r.ticks == 60 and r.churned_nodes > 0
    assert r.growth < RSS_GROWTH_LIMIT, (r.rss_warm_mb, r.rss_end_mb)
    assert r.last_ms < 1.5 * r.first_ms + 2.0, (r.first_ms, r.last_ms)  # +2 ms: scheduler noise at this size
    assert r.dropped_ticks == 0
    assert r.max_registry < 2 * r.devices and r.capacity < 3 * r.devices
