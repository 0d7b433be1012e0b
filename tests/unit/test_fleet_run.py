"""The fleet's run loop against a rendering of ``/metrics``: a tick does not start while one runs (``Fleet.run``
waits up to half a period for it), so a scrape that waits for a rendering does not share this process's
interpreter with a tick (in process at 100,000 devices, a rendering took half as long again beside ticks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from otel_dra import policy
from otel_dra.classifier import Verdict
from otel_dra.config import FleetConfig
from otel_dra.fleet import Fleet
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.sinks.config import EndpointConfig
from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.realtime

PERIOD_S = 0.3  # the fleet's tick period: it waits up to half of it (0.15 s) for a rendering
HOLD_S = 0.06  # each rendering's length here: well under that bound, so a tick due during one waits it out
GAP_S = 0.04  # between renderings


class SlowCollector(Collector):
    """A registry collector that takes ``HOLD_S`` to collect while armed, a rendering that long: it keeps when each
    such collection ran (inside the rendering, so a tick seen within one started while a rendering ran)."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.spans: list[tuple[float, float]] = []

    def collect(self) -> Iterator[Metric]:
        if self.armed.is_set():
            t0 = time.monotonic()
            time.sleep(HOLD_S)
            self.spans.append((t0, time.monotonic()))
        return iter(())


def test_a_tick_due_while_a_rendering_runs_starts_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    config = FleetConfig(
        receiver=ReceiverConfig(grpc_port=0, http_port=0),
        endpoint=EndpointConfig(port=free_port()),
        evaluate_every_s=PERIOD_S,
    )
    fleet = Fleet(config, policy.load())
    ticks: list[float] = []
    tick = fleet.tick

    def timed_tick() -> list[Verdict]:  # (as Fleet.run calls it)
        ticks.append(time.monotonic())
        return tick()

    monkeypatch.setattr(fleet, "tick", timed_tick)
    runner = threading.Thread(target=fleet.run)
    runner.start()
    slow = SlowCollector()
    try:
        wait_for(lambda: fleet.endpoint is not None and len(ticks) >= 1, 10, "the fleet's first tick", 0.02)
        assert fleet.endpoint is not None
        fleet.endpoint.registry.register(slow)
        slow.armed.set()
        end = time.monotonic() + 15 * PERIOD_S
        while time.monotonic() < end:  # renderings back to back, as a scrape that finds the rendering stale asks
            fleet.endpoint.cache.render()
            time.sleep(GAP_S)
    finally:
        fleet.stop()
        runner.join(10)
    spans = slow.spans
    during = [t for t in ticks if any(a < t < b for a, b in spans)]
    assert len(spans) >= 20
    # Ticks went on, each once the rendering it was due in was done (some 15 of them).
    assert len([t for t in ticks if spans[0][0] < t < spans[-1][1]]) >= 8
    assert during == [], f"{len(during)} ticks started while a rendering ran"
