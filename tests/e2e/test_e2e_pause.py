"""A fleet that was paused knows it (issue #16), for real: `otel-dra fleet` fed real OTLP/HTTP
requests by pushers, stopped (SIGSTOP, as a long pause or a throttled container would) for ten of
its policy's stale timeouts, then continued. Its nodes never went silent, so none may read
`Unknown`; a node that did go silent as the fleet stopped is `Unknown` a sampling interval or two
after the fleet resumed, not a stale timeout later."""

from __future__ import annotations

import http.client
import json
import math
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from tests.conftest import FleetProcess, http_get, spawn_fleet, wait_for

pytestmark = pytest.mark.e2e

STALE_TIMEOUT_S = 3
STALL_S = 10 * STALE_TIMEOUT_S
PUSH_EVERY_S = 1.0  # every node's requests, all on one schedule (spawn_fleet's --sample-interval is 1 s)
EVALUATE_EVERY_S = 0.25  # so what came before the stop was read before it, not by the tick after it
NODES = ("node-a", "node-b", "node-c")
SILENT = "node-quiet"  # stops pushing as the fleet is stopped
GPUS = 2


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def request(node: str) -> bytes:
    t = time.time_ns()
    points = [
        NumberDataPoint(time_unix_nano=t, as_double=250.0, attributes=[kv("hw.id", f"gpu-{i}"), kv("hw.type", "gpu")])
        for i in range(GPUS)
    ]
    metric = Metric(name="hw.power", unit="W", gauge=Gauge(data_points=points))
    resource = ResourceMetrics(
        resource=Resource(attributes=[kv("k8s.node.name", node)]), scope_metrics=[ScopeMetrics(metrics=[metric])]
    )
    return ExportMetricsServiceRequest(resource_metrics=[resource]).SerializeToString()


class Pusher(threading.Thread):
    """One node's pushes, every ``PUSH_EVERY_S``, whether or not the fleet answers: a request the fleet
    does not answer in time is given up (its connection reset, so the fleet cannot read it later) and
    the next one follows on schedule, as an agent's would. So what the fleet hears after it resumes
    is only what the nodes send after it resumed."""

    def __init__(self, port: int, node: str, base: float) -> None:
        super().__init__(daemon=True, name=f"push-{node}")
        self.port = port
        self.node = node
        self.base = base  # the schedule: base + k * PUSH_EVERY_S on the monotonic clock
        self.quiet = threading.Event()  # set: push no more
        self.done = threading.Event()

    def run(self) -> None:
        k = 0
        while not self.done.wait(max(0.0, self.base + k * PUSH_EVERY_S - time.monotonic())):
            if not self.quiet.is_set():
                self.push()
            k = max(k + 1, math.ceil((time.monotonic() - self.base) / PUSH_EVERY_S))  # a slot missed is skipped

    def push(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=PUSH_EVERY_S / 2)
        try:
            conn.request("POST", "/v1/metrics", request(self.node), {"Content-Type": "application/x-protobuf"})
            conn.getresponse().read()
        except OSError:  # the fleet stopped: give the request up
            if conn.sock is not None:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        finally:
            conn.close()


@pytest.fixture
def paused_fleet(tmp_path) -> Iterator[tuple[FleetProcess, dict[str, Pusher]]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"stale_timeout: {STALE_TIMEOUT_S}s\n")
    fleet = spawn_fleet(tmp_path, "--policy", str(policy), "--evaluate-every", str(EVALUATE_EVERY_S))
    base = time.monotonic() + PUSH_EVERY_S
    pushers = {node: Pusher(fleet.ports["http"], node, base) for node in (*NODES, SILENT)}
    for p in pushers.values():
        p.start()
    try:
        yield fleet, pushers
    finally:
        for p in pushers.values():
            p.done.set()
        fleet.proc.send_signal(signal.SIGCONT)
        fleet.stop()
        for p in pushers.values():
            p.join(5)


def test_a_fleet_stopped_for_ten_stale_timeouts_calls_no_node_stale_but_the_silent_one(paused_fleet):
    fleet, pushers = paused_fleet

    def devices() -> list[dict]:
        return json.loads(http_get(fleet.url + "/v1/devices")[1])["devices"]

    every = (len(NODES) + 1) * GPUS
    wait_for(lambda: len(ds := devices()) == every and {d["health"] for d in ds} == {"Healthy"}, 30, "all Healthy")
    time.sleep(2)
    pushers[SILENT].quiet.set()  # its last request answered before the fleet stops
    base = pushers[SILENT].base
    # Stopped 0.6 of a period after the pushes, whose requests were read (and judged) by then; it
    # resumes as long after (STALL_S is whole periods), 0.4 s before the next pushes.
    time.sleep(2 * PUSH_EVERY_S)
    time.sleep((base - time.monotonic() + 0.6 * PUSH_EVERY_S) % PUSH_EVERY_S)
    stopped_ns = time.time_ns()
    fleet.proc.send_signal(signal.SIGSTOP)
    time.sleep(STALL_S)
    fleet.proc.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    seen: list[tuple[float, dict]] = []
    while time.monotonic() < resumed + 6:
        seen.extend((time.monotonic() - resumed, d) for d in devices())
        time.sleep(0.1)
    assert fleet.proc.poll() is None, fleet.log.read_text()[-3000:]
    talking = [(t, d) for t, d in seen if d["k8s.node.name"] != SILENT]
    assert {(d["k8s.node.name"], d["hw.id"]) for _, d in talking} == {
        (n, f"gpu-{g}") for n in NODES for g in range(GPUS)
    }
    unknown = sorted({(round(t, 1), d["k8s.node.name"], d["hw.id"]) for t, d in talking if d["health"] != "Healthy"})
    assert not unknown, f"not Healthy after the fleet's own stall (s after SIGCONT, node, device): {unknown}"
    # Nor Unknown for a moment between two reads: no talking device's verdict changed since before the stop.
    changed = sorted({(d["k8s.node.name"], d["hw.id"]) for _, d in talking if d["last_transition_time"] > stopped_ns})
    assert not changed, f"verdicts that changed across the stall: {changed}"
    quiet = [t for t, d in seen if d["k8s.node.name"] == SILENT and d["health"] == "Unknown"]
    # Stale a sampling interval (1 s) after the resume, give or take a tick and a read, not 3 s later.
    assert quiet and min(quiet) < 2.5, f"the silent node, s after SIGCONT when Unknown: {quiet[:5]}"
