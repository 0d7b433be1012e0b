"""The OTLP push's sending queue against a real collector endpoint (the fleet's OTLP receiver, real
gRPC on loopback) that goes away, comes back, or answers too slowly; the SDK's real gRPC exporter
behind it, fed by the agent's own metric sink (issue #7: "the buffered data goes out when it comes
back, up to a stated bound")."""

from __future__ import annotations

import logging
import math
import threading
import time
import tracemalloc

import pytest
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

from otel_dra import __version__
from otel_dra import conventions as cv
from otel_dra.frame import Frame, Schema
from otel_dra.receivers import OtlpReceiver
from otel_dra.sinks import provider
from otel_dra.sinks.metrics import MetricsSink
from otel_dra.sinks.sending_queue import SendingQueue
from otel_dra.sinks.verdict_metrics import VERDICT_METRICS
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from otel_dra.state import FrameStore
from tests.conftest import Inbox, free_port, wait_for

pytestmark = pytest.mark.realtime  # timed to a fraction of a second: run with the real-time modules

NODE = "node-q"


def times(inbox: Inbox) -> list[int]:
    """The times of every frame the collector decoded, in arrival order."""
    return [f.time_unix_nano for f in inbox.frames()]


class Collector:
    """The fleet's real OTLP/gRPC receiver (``start_receiver``) on one fixed port, stopped and started
    again; ``block``: it takes each request only once that event is set (a collector too slow to answer)."""

    def __init__(self, start_receiver) -> None:
        self.port = free_port()
        self._start = start_receiver
        self.receiver: OtlpReceiver | None = None

    def start(self, block: threading.Event | None = None, protocol: str = "grpc") -> Inbox:
        inbox = Inbox()

        def on_frames(frames: list[Frame]) -> None:
            if block is not None:
                block.wait(30)
            inbox(frames)

        endpoint = f"127.0.0.1:{self.port}"
        grpc, http = (endpoint, None) if protocol == "grpc" else (None, endpoint)
        self.receiver, _ = self._start(grpc_endpoint=grpc, http_endpoint=http, on_frames=on_frames)
        return inbox

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.shutdown(0.2)
            self.receiver = None


class PushingNode:
    """One agent's push path: the simulated source → store → MetricsSink → the SDK's periodic reader
    (collected by hand here) → SendingQueue → the SDK's OTLP gRPC exporter."""

    def __init__(self, port: int, protocol: str = "grpc", **queue_args) -> None:
        self.schema = Schema()
        self.src = SimulatedSource(SimulatorConfig(NODE, devices=2, seed=1), self.schema)
        self.store = FrameStore()
        self.queue = SendingQueue(provider.otlp_exporter(f"http://127.0.0.1:{port}", protocol), **queue_args)
        self.reader = PeriodicExportingMetricReader(self.queue, export_interval_millis=math.inf)
        self.mp = provider.build_meter_provider(NODE, [self.reader], 5000)
        meter = self.mp.get_meter(cv.AGENT_SCOPE, __version__)
        MetricsSink(self.store, self.schema, meter, max_age_s=3600.0, exclude=VERDICT_METRICS)
        self.sampled: list[int] = []

    def sample(self) -> float:
        """One sampling pass and one push; returns how long the push took the reader."""
        t = time.time_ns()
        time.sleep(0.002)  # distinct timestamps, even on a coarse clock
        self.store.put(self.src.read(t), time.monotonic_ns())
        self.sampled.append(t)
        t0 = time.monotonic()
        self.reader.collect()
        return time.monotonic() - t0

    def close(self) -> None:
        self.mp.shutdown(timeout_millis=2000)


@pytest.fixture
def collector(start_receiver):
    return Collector(start_receiver)


@pytest.fixture(autouse=True)
def short_exporter_timeout(monkeypatch):
    """Each attempt of the SDK exporter gives up after 1 s (its default is 10 s): the tests' outages are short."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")


def frame_times(inbox: Inbox) -> list[int]:
    return sorted(set(times(inbox)))


def test_an_outage_leaves_no_gap_once_the_collector_is_back(collector):
    before = collector.start()
    node = PushingNode(collector.port, max_age_s=60.0, backoff_s=(0.05, 0.2))
    try:
        for _ in range(2):
            node.sample()
        wait_for(lambda: len(frame_times(before)) == 2, 10, "the first two pushes")
        collector.stop()
        for _ in range(5):
            assert node.sample() < 0.5, "a push must never wait for the collector"
        wait_for(lambda: node.queue.stats()["failures"] >= 1, 10, "a failed attempt")
        assert node.queue.stats()["queued"] > 0
        after = collector.start()
        node.sample()
        wait_for(lambda: node.queue.stats()["queued"] == 0, 20, "the queue to drain")
        wait_for(lambda: len(frame_times(after)) == 6, 10, "every queued collection at the new collector")
        # Every collection made while it was away arrives, oldest first, then the newest.
        assert times(after) == sorted(times(after))
        assert frame_times(after) == [t for t in sorted(set(times(before) + times(after))) if t > times(before)[-1]]
        stats = node.queue.stats()
        assert stats["dropped"] == 0 and stats["failures"] == 0 and stats["sent"] > 0
    finally:
        node.close()


def test_what_is_older_than_the_max_age_is_dropped_and_counted(collector):
    clock = [0.0]
    node = PushingNode(collector.port, max_age_s=25.0, clock=lambda: clock[0], backoff_s=(0.05, 0.1))
    try:
        for _ in range(6):  # one every 10 s of the queue's clock, nobody listening
            clock[0] += 10.0
            node.sample()
        # Three are within the max age; a fourth, older, may still be in its (failing) attempt, which
        # decides its fate: then the next trim drops it.
        wait_for(lambda: node.queue.stats()["batches"] <= 3, 10, "the too-old collections to be dropped")
        stats = node.queue.stats()
        assert stats["batches"] == 3 and stats["dropped"] > 0
        inbox = collector.start()
        wait_for(lambda: node.queue.stats()["queued"] == 0, 20, "the queue to drain")
        # Only the collections within the max age arrive (the newest ones), in time order. (Points carry
        # the collection's time, taken after the sample's.)
        kept = stats["batches"]
        wait_for(lambda: len(frame_times(inbox)) == kept, 10, "the kept collections")
        assert times(inbox) == sorted(times(inbox)) and min(times(inbox)) > node.sampled[-kept]
    finally:
        node.close()


def test_the_point_bound_holds_memory_flat_through_a_long_outage(collector):
    node = PushingNode(collector.port, max_points=200, backoff_s=(0.05, 0.1))
    try:
        node.sample()
        per_push = node.queue.stats()["queued"]
        assert 0 < per_push <= 200
        for _ in range(20):
            node.sample()
        tracemalloc.start()
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(200):
            node.sample()
        grown, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        stats = node.queue.stats()
        assert stats["queued"] <= 200 and stats["batches"] == 200 // per_push
        assert stats["dropped"] >= 190 * per_push
        # 200 more collections made, none of them kept beyond the bound: memory did not follow.
        assert grown - base < 100 * per_push * 210, grown - base
    finally:
        node.close()


def test_a_slow_collector_never_delays_a_collection_and_catches_up(collector):
    block = threading.Event()
    inbox = collector.start(block)  # answers only once unblocked: every attempt times out
    node = PushingNode(collector.port, max_age_s=60.0, backoff_s=(0.05, 0.2))
    try:
        pushes = [node.sample() for _ in range(4)]
        assert max(pushes) < 0.5, pushes
        wait_for(lambda: node.queue.stats()["failures"] >= 1, 10, "an attempt to time out")
        block.set()
        wait_for(lambda: node.queue.stats()["queued"] == 0, 20, "the queue to drain")
        assert len(frame_times(inbox)) == 4 and node.queue.stats()["dropped"] == 0
    finally:
        block.set()
        node.close()


def test_shutdown_sends_what_is_queued_or_gives_up_at_once_when_the_collector_is_down(collector):
    block = threading.Event()
    inbox = collector.start(block)
    node = PushingNode(collector.port, backoff_s=(0.05, 0.1))
    node.sample()
    node.sample()
    assert node.queue.stats()["queued"] > 0  # the first attempt is waiting for the collector's answer
    threading.Timer(0.3, block.set).start()
    node.close()
    assert node.queue.stats()["queued"] == 0 and len(frame_times(inbox)) == 2
    collector.stop()

    down = PushingNode(collector.port, backoff_s=(5.0, 5.0))
    for _ in range(3):
        down.sample()
    wait_for(lambda: down.queue.stats()["failures"] >= 1, 10, "a failed attempt")
    t0 = time.monotonic()
    down.mp.shutdown(timeout_millis=4000)
    assert time.monotonic() - t0 < 2.0, "a collector that is down must not hold the shutdown for its budget"
    assert down.queue.export(None) is MetricExportResult.FAILURE  # after shutdown: refused, not queued
    assert down.queue.stats()["queued"] > 0


def test_the_queue_reports_its_size_and_outcomes_as_registered(collector):
    node = PushingNode(collector.port, max_points=50, backoff_s=(0.05, 0.1))
    reader = InMemoryMetricReader()
    mp = provider.build_meter_provider(NODE, [reader], 5000)
    node.queue.register_metrics(mp.get_meter(cv.AGENT_SCOPE, __version__))
    try:
        for _ in range(3):
            node.sample()
        data = reader.get_metrics_data()
        got = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
        size, points = got[cv.OTEL_DRA_PUSH_QUEUE_SIZE.name], got[cv.OTEL_DRA_PUSH_POINTS.name]
        assert size.unit == cv.OTEL_DRA_PUSH_QUEUE_SIZE.unit and points.unit == cv.OTEL_DRA_PUSH_POINTS.unit
        assert size.data.data_points[0].value == node.queue.stats()["queued"] > 0
        by_outcome = {p.attributes["outcome"]: p.value for p in points.data.data_points}
        assert by_outcome["dropped"] > 0 and set(by_outcome) == {"sent", "dropped"}
    finally:
        mp.shutdown()
        node.close()


def test_bad_bounds_are_refused():
    exporter = provider.otlp_exporter("http://127.0.0.1:1", "grpc")
    with pytest.raises(ValueError, match="max age"):
        SendingQueue(exporter, max_age_s=0)
    with pytest.raises(ValueError, match="max points"):
        SendingQueue(exporter, max_points=0)


def test_backoff_never_passes_its_cap_and_the_agent_retries_twice_an_interval():
    """A fleet paused longer than the exporter's timeout fails the agent's attempts; once it resumes, the node
    must be heard within the one interval of grace the fleet gives it, so the retry backoff (jitter included)
    never goes past its cap, and the agent's cap is half its push interval (15 s before, jittered up to 18 s:
    a 10 s node could be heard 18 s after the fleet came back, and read Unknown for a while)."""
    waits: list[float] = []

    class Recorded(threading.Event):
        """The sender's stop event: records each backoff it is asked to wait, and waits none of it."""

        def wait(self, timeout: float | None = None) -> bool:
            waits.append(float(timeout or 0.0))
            return self.is_set()

    exporter = provider.otlp_exporter("http://127.0.0.1:9", "grpc")
    exporter.export = lambda data, **_: MetricExportResult.FAILURE  # type: ignore[method-assign]
    queue = SendingQueue(exporter, backoff_s=(1.0, 5.0))
    queue._stopping = Recorded()
    queue.export(MetricsData(resource_metrics=[]))
    wait_for(lambda: len(waits) >= 200, 10, "200 failed attempts")
    queue._stopping.set()
    assert max(waits) <= 5.0, max(waits)  # jitter included: never past the cap
    assert min(waits[:1]) >= 0.8 and max(waits[20:]) > 4.0  # (it does back off: jittered, then at the cap)
    reader, pushed = provider.otlp_reader("http://127.0.0.1:9", "grpc", 10.0)
    assert pushed is not None and pushed.backoff_s == (1.0, 5.0)  # half the agent's 10 s interval
    pushed.shutdown(timeout_millis=100)
    reader.shutdown(timeout_millis=100)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_down_for_ten_minutes_is_a_few_summarised_lines(collector, caplog, protocol):
    """Issue #29: a dead collector made the SDK exporter write a warning and an error every few seconds,
    forever, each with another retry delay, so the flood limiter never folded them. Through the queue, ten
    minutes of the queue's clock without a collector (a real exporter failing against a closed port) write
    one line when it starts failing, one every five minutes with the attempts, the drops and the last error,
    and one when the collector is back: nothing of the exporter's own."""
    clock = [0.0]
    node = PushingNode(collector.port, protocol, max_age_s=60.0, clock=lambda: clock[0], backoff_s=(0.01, 0.02))
    caplog.set_level(logging.INFO)
    try:
        node.sample()
        for _ in range(20):  # ten minutes, a collection every 30 s
            failures = node.queue.stats()["failures"]
            wait_for(lambda f=failures: node.queue.stats()["failures"] > f, 10, "another failed attempt")
            clock[0] += 30.0
            node.sample()
        inbox = collector.start(protocol=protocol)
        wait_for(lambda: node.queue.stats()["queued"] == 0, 20, "the queue drained")
        assert frame_times(inbox)
    finally:
        node.close()
    collectors = ("otel_dra.receivers", "otel_dra.serve")  # the collector's own lines, not the pushing side's
    lines = [r for r in caplog.records if r.levelno >= logging.INFO and not r.name.startswith(collectors)]
    texts = [r.getMessage() for r in lines]
    assert not [r for r in lines if r.name.startswith("opentelemetry.exporter")], texts
    ours = [t for t in texts if t.startswith("OTLP push to")]
    assert len(ours) == len(texts) and 3 <= len(ours) <= 5, texts
    assert "failing:" in ours[0] and str(collector.port) in ours[0]
    assert any("failing for 5m" in t and "attempts" in t and "dropped" in t and "last error" in t for t in ours)
    assert "works again after 10m" in ours[-1]
