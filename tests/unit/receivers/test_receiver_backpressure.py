"""Overload is shed, not queued without bound: when the consumer is behind (the fleet's queue of frames
is full) or too many requests wait to be decoded, the receiver says "retry later" the way the
Collector's memory limiter does, and the SDK's exporters (behind the agent's sending queue) retry
until the fleet takes the data."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter
from opentelemetry.sdk.metrics.export import MetricExportResult

from otel_dra.frame import Frame
from tests.unit.receivers.test_receiver_otlp import EXPORT, GOOD, T0, Agent, gauge, gpu, pt, req, resource


class Switch:
    """A consumer's backlog: behind (seconds to wait) for the first ``times`` questions, then caught up."""

    def __init__(self, times: int, retry_s: float = 1.0) -> None:
        self.left = times
        self.retry_s = retry_s
        self.asked = 0

    def __call__(self) -> float | None:
        self.asked += 1
        if self.left > 0:
            self.left -= 1
            return self.retry_s
        return None


def test_a_full_queue_is_unavailable_with_retry_info_over_grpc_and_503_with_retry_after_over_http(start_receiver):
    backlog = Switch(times=2, retry_s=2.0)
    receiver, inbox = start_receiver(backlog=backlog)
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
        call = channel.unary_unary(EXPORT)
        try:
            call(GOOD.SerializeToString(), timeout=5)
            raise AssertionError("a full queue took the request")
        except grpc.RpcError as err:
            assert err.code() is grpc.StatusCode.UNAVAILABLE
            assert "overloaded" in err.details() and "retry in 2 s" in err.details()
            trailers = dict(err.trailing_metadata())
    info = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
    assert info.retry_delay.seconds == 2
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert status.code == code_pb2.UNAVAILABLE and status.details[0].Is(error_details_pb2.RetryInfo.DESCRIPTOR)

    request = urllib.request.Request(
        f"http://127.0.0.1:{receiver.http_port}/v1/metrics",
        data=GOOD.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    try:
        urllib.request.urlopen(request, timeout=5)
        raise AssertionError("a full queue took the request")
    except urllib.error.HTTPError as err:
        assert err.code == 503 and err.headers["Retry-After"] == "2"
        assert status_pb2.Status.FromString(err.read()).code == code_pb2.UNAVAILABLE
    assert inbox.frames() == []  # nothing was decoded: the node's time order is untouched
    with urllib.request.urlopen(request, timeout=5) as resp:  # caught up: taken
        assert resp.status == 200
    assert len(inbox.frames("node-1")) == 1
    requests = receiver.stats()["requests"]
    assert requests[("grpc", "overloaded")] == 1 and requests[("http", "overloaded")] == 1


def test_past_max_pending_requests_the_newcomers_are_told_to_retry(start_receiver):
    release = threading.Event()
    entered = threading.Semaphore(0)

    def slow(frames: list[Frame]) -> None:
        entered.release()
        release.wait(10)

    receiver, _ = start_receiver(on_frames=slow, max_pending=2)

    def send(k: int) -> grpc.StatusCode:
        body = req(resource(f"node-{k}", gauge("hw.power", pt(gpu(), 250.0)))).SerializeToString()
        with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            try:
                channel.unary_unary(EXPORT)(body, timeout=10)
                return grpc.StatusCode.OK
            except grpc.RpcError as err:
                return err.code()

    with ThreadPoolExecutor(6) as pool:
        first = [pool.submit(send, k) for k in range(2)]
        assert entered.acquire(timeout=5)  # one is in the consumer, the other waits for the lock
        time.sleep(0.3)
        extra = [pool.submit(send, k) for k in range(2, 6)]
        refused = [f.result(timeout=10) for f in extra]
        release.set()
        taken = [f.result(timeout=10) for f in first]
    assert taken == [grpc.StatusCode.OK] * 2
    assert refused == [grpc.StatusCode.UNAVAILABLE] * 4
    assert receiver.stats()["requests"][("grpc", "overloaded")] == 4


def test_the_sdk_exporter_retries_until_the_fleet_catches_up(start_receiver):
    """What the agent's sending queue pushes through: the SDK's gRPC exporter reads the retry delay,
    waits it, and sends again; the data arrives once the consumer has caught up."""
    backlog = Switch(times=2, retry_s=0.5)
    receiver, inbox = start_receiver(backlog=backlog)
    agent = Agent("node-a", devices=2, seed=1)
    exporter = GrpcExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True, timeout=20)
    try:
        _, data = agent.sample(T0)
        started = time.monotonic()
        assert exporter.export(data) is MetricExportResult.SUCCESS
        assert time.monotonic() - started >= 2 * 0.5  # it waited as told, twice
    finally:
        exporter.shutdown()
        agent.close()
    assert backlog.asked == 3 and len(inbox.frames("node-a")) == 1


def test_the_fleets_queue_of_frames_is_bounded_and_a_tick_drains_it():
    """The fleet asks the receivers to hold off once --max-queued-points values wait for the next tick."""
    import numpy as np

    from otel_dra import policy
    from otel_dra.config import FleetConfig
    from otel_dra.fleet import Fleet
    from otel_dra.frame import Column, DeviceTable, attrs_of

    fleet = Fleet(FleetConfig(max_queued_points=3, evaluate_every_s=3.0), policy.load())
    fleet.schema.index(Column("hw.power", attrs_of({})))
    fleet.schema.index(Column("hw.energy", attrs_of({})))
    table = DeviceTable("node-1", ("gpu-0",), ({},))
    assert fleet.backlog() is None
    fleet.on_frames([Frame(T0, table, np.full((1, 2), 1.0))])
    assert fleet.backlog() is None  # 2 of 3
    fleet.on_frames([Frame(T0 + 10**9, table, np.full((1, 2), 1.0))])
    assert fleet.backlog() == 3.0  # behind: retry after the next evaluation
    fleet.tick(T0 + 2 * 10**9)
    assert fleet.backlog() is None
