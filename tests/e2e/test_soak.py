"""The soak benchmark in its short form, as a test: ``otel-dra fleet``'s pipeline (its receiver's
decoder, its tick, its real /metrics endpoint) over 10 minutes of samples at full speed with node
churn: memory flat after warm-up, tick and decode stable, every reporting device on /metrics every
tick, nothing rejected, the registry bounded (issue #7)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_soak import RSS_GROWTH_LIMIT, SHORT_DEVICES, soak


def test_short_soak_holds_memory_latency_series_and_the_registry():
    r = soak(devices=SHORT_DEVICES, minutes=10)
    assert r.ticks == 60 and r.churned_nodes > 0
    assert r.growth < RSS_GROWTH_LIMIT, (r.rss_warm_mb, r.rss_end_mb)
    assert r.last_ms < 1.5 * r.first_ms + 2.0, (r.first_ms, r.last_ms)  # +2 ms: scheduler noise at this size
    assert r.decode_last_ms < 1.5 * r.decode_first_ms + 5.0, (r.decode_first_ms, r.decode_last_ms)
    assert r.dropped_ticks == 0 and r.rejected_points == 0
    assert r.max_registry < 2 * r.devices and r.capacity < 3 * r.devices
