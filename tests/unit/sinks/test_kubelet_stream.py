"""The kubelet's device-health stream and plugin registration, spoken to as the kubelet does: a client
generated from the same protos dials the real unix socket (``grpc.insecure_channel("unix://...")``) and
reads ``NodeWatchResources``; no gRPC is mocked. A real ``VerdictBoard`` holds real ``Verdict``s (one
test drives it from the classifier and the simulator)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import queue
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_dra import policy
from otel_dra.classifier import Classifier, Verdict
from otel_dra.faults import Fault
from otel_dra.sinks.kubelet import (
    HEALTH_SERVICES,
    KubeletHealthServer,
    KubeletSocketError,
    RegistrationServer,
    build_response,
    truncate_message,
)
from otel_dra.sinks.kubelet.api import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from otel_dra.state.board import VerdictBoard

pytestmark = pytest.mark.realtime  # timed to a fraction of a second: run with the real-time modules

REPO = Path(__file__).resolve().parents[3]
S = 10**9
REPORTED_S = 1_800_000_000
API = {
    "v1alpha1": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
    "v1": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
}
pb = dra_health_v1alpha1_pb2


# -- helpers -------------------------------------------------------------------------------
def verdict(
    dev: str,
    health: str = "Healthy",
    *,
    state: str | None = "ok",
    reasons: tuple[str, ...] = (),
    remediation: str = "none",
    message: str = "no evidence of a fault in the last 5m",
    pool: str | None = "node-a",
    device: str | None = "",
    reported_s: int = REPORTED_S,
) -> Verdict:
    return Verdict(
        time_unix_nano=time.time_ns(),
        node="node-a",
        hw_id=dev,
        health=health,
        state=state,
        reasons=reasons,
        remediation=remediation,
        message=message,
        pool=pool,
        device=dev if device == "" else device,
        last_transition_time=REPORTED_S * S,
        last_reported_time=reported_s * S,
    )


def healthy_board(n: int = 8) -> VerdictBoard:
    board = VerdictBoard()
    board.update([verdict(f"gpu-{i}") for i in range(n)], lambda _n, _h: {})
    return board


def publish(board: VerdictBoard, *verdicts: Verdict) -> None:
    board.update(list(verdicts), lambda _n, _h: {})


def health_of(msg: pb.NodeWatchResourcesResponse) -> dict[str, int]:
    return {d.device.device_name: d.health for d in msg.devices}


class Watch:
    """A kubelet-like watcher: one ``NodeWatchResources`` stream read on its own thread."""

    def __init__(self, path: str, version: str = "v1alpha1", channel: grpc.Channel | None = None) -> None:
        self.own_channel = channel is None
        self.channel = channel or grpc.insecure_channel(f"unix://{path}")
        mod, stubs = API[version]
        self.call = stubs.DRAResourceHealthStub(self.channel).NodeWatchResources(
            mod.NodeWatchResourcesRequest(), wait_for_ready=True
        )
        self.messages: queue.Queue = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.ended = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for msg in self.call:
                self.messages.put((time.monotonic(), msg))
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.ended.set()

    def next(self, timeout: float = 3.0) -> tuple[float, pb.NodeWatchResourcesResponse]:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message within {timeout}s (error: {self.error})") from None

    def until(
        self, predicate: Callable[[pb.NodeWatchResourcesResponse], bool], timeout: float = 3.0
    ) -> tuple[float, pb.NodeWatchResourcesResponse]:
        deadline = time.monotonic() + timeout
        while True:
            at, msg = self.next(max(0.01, deadline - time.monotonic()))
            if predicate(msg):
                return at, msg
            if time.monotonic() > deadline:
                raise AssertionError("the expected message never came")

    def drain(self) -> None:
        while not self.messages.empty():
            self.messages.get_nowait()

    def close(self) -> None:
        self.call.cancel()
        if self.own_channel:
            self.channel.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


@pytest.fixture
def serve(sock_dir: Path) -> Iterator[Callable[..., KubeletHealthServer]]:
    started: list[KubeletHealthServer] = []

    def start(board: VerdictBoard, path: Path | None = None, **kwargs: object) -> KubeletHealthServer:
        server = KubeletHealthServer(str(path or sock_dir / "plugins" / "dra.sock"), board, **kwargs)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown(0.2)


@pytest.fixture
def watches() -> Iterator[list[Watch]]:
    opened: list[Watch] = []
    yield opened
    for w in opened:
        w.close()


# -- the protos ----------------------------------------------------------------------------
def test_committed_stubs_are_what_the_generator_writes(tmp_path):
    pytest.importorskip("grpc_tools")
    subprocess.run([sys.executable, str(REPO / "scripts" / "gen_protos.py"), "--out", str(tmp_path)], check=True)
    api = Path("otel_dra/sinks/kubelet/api")
    fresh = {p.name: p.read_bytes() for p in (tmp_path / api).glob("*_pb2*.py")}
    committed = {p.name: p.read_bytes() for p in (REPO / api).glob("*_pb2*.py")}
    assert sorted(fresh) == sorted(committed), "run .venv/bin/python scripts/gen_protos.py"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stubs out of date, run .venv/bin/python scripts/gen_protos.py: {stale}"


@pytest.mark.parametrize("mod", [dra_health_v1alpha1_pb2, dra_health_v1_pb2], ids=["v1alpha1", "v1"])
def test_health_proto_matches_the_kubelet(mod):
    d = mod.DESCRIPTOR
    service = d.services_by_name["DRAResourceHealth"]
    method = service.methods_by_name["NodeWatchResources"]
    assert f"/{service.full_name}/{method.name}" == f"/{d.package}.DRAResourceHealth/NodeWatchResources"
    assert d.package in ("v1alpha1", "v1")
    assert method.server_streaming and not method.client_streaming
    assert method.input_type.name == "NodeWatchResourcesRequest" and not method.input_type.fields
    assert method.output_type.name == "NodeWatchResourcesResponse"

    def numbers(name: str) -> dict[str, int]:
        return {f.name: f.number for f in d.message_types_by_name[name].fields}

    assert numbers("NodeWatchResourcesResponse") == {"devices": 1}
    assert numbers("DeviceHealth") == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert numbers("DeviceIdentifier") == {"pool_name": 1, "device_name": 2}
    assert {v.name: v.number for v in d.enum_types_by_name["HealthStatus"].values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }


def test_registration_proto_matches_the_kubelet():
    d = pluginregistration_v1_pb2.DESCRIPTOR
    assert d.package == "pluginregistration"
    methods = d.services_by_name["Registration"].methods_by_name
    assert {m: (methods[m].input_type.name, methods[m].output_type.name) for m in methods} == {
        "GetInfo": ("InfoRequest", "PluginInfo"),
        "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse"),
    }
    fields = {name: {f.name: f.number for f in m.fields} for name, m in d.message_types_by_name.items()}
    assert fields["PluginInfo"] == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert fields["RegistrationStatus"] == {"plugin_registered": 1, "error": 2}


# -- the stream ----------------------------------------------------------------------------
def test_first_message_is_the_full_list_then_resent_within_a_third_of_the_timeout(serve, watches):
    server = serve(healthy_board(8), health_check_timeout_s=1.5)
    w = Watch(server.socket_path)
    watches.append(w)
    t0, first = w.next()
    assert [d.device.device_name for d in first.devices] == [f"gpu-{i}" for i in range(8)]
    for d in first.devices:
        assert d.device.pool_name == "node-a"
        assert d.health == pb.HEALTHY
        assert d.last_updated_time == REPORTED_S
        assert d.health_check_timeout_seconds == 2  # 1.5 s, rounded up to the field's whole seconds
        assert d.message == "Healthy: state=ok reasons=none remediation=none; no evidence of a fault in the last 5m"
    times = [t0] + [w.next()[0] for _ in range(3)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap <= 0.5 + 0.15 for gap in gaps), gaps  # timeout / 3, plus scheduling slack
    assert all(gap >= 0.3 for gap in gaps), gaps  # and not a busy loop


@pytest.mark.parametrize("version", ["v1alpha1", "v1"])
def test_a_transition_to_unhealthy_arrives_quickly_with_its_message(serve, watches, version):
    board = healthy_board(4)
    server = serve(board, health_check_timeout_s=30.0)
    w = Watch(server.socket_path, version)
    watches.append(w)
    _, first = w.next()
    assert set(health_of(first).values()) == {pb.HEALTHY}
    sent = time.monotonic()
    publish(
        board,
        verdict(
            "gpu-2",
            "Unhealthy",
            state="failed",
            reasons=("memory_ecc",),
            remediation="reset_device",
            message="3 uncorrected ECC errors in the last 5m",
        ),
    )
    at, msg = w.next(1.0)  # the periodic resend is 10 s away: this is the change
    assert at - sent < 0.25
    assert health_of(msg) == {"gpu-0": pb.HEALTHY, "gpu-1": pb.HEALTHY, "gpu-2": pb.UNHEALTHY, "gpu-3": pb.HEALTHY}
    (gpu2,) = [d for d in msg.devices if d.device.device_name == "gpu-2"]
    assert gpu2.message == (
        "Unhealthy: state=failed reasons=memory_ecc remediation=reset_device; 3 uncorrected ECC errors in the last 5m"
    )
    assert gpu2.health_check_timeout_seconds == 30


def test_unknown_maps_to_unknown_and_a_missing_report_time_is_now(serve, watches):
    board = VerdictBoard()
    publish(board, verdict("gpu-0", "Unknown", state=None, reasons=("stale",), message="", reported_s=0))
    server = serve(board)
    w = Watch(server.socket_path)
    watches.append(w)
    before = int(time.time())
    _, msg = w.next()
    (d,) = msg.devices
    assert d.health == pb.UNKNOWN
    assert d.message == "Unknown: state=unknown reasons=stale remediation=none"
    assert before - 1 <= d.last_updated_time <= int(time.time()) + 1


def test_ten_watchers_all_get_updates_and_one_leaving_frees_its_stream(serve, watches):
    board = healthy_board(8)
    server = serve(board, health_check_timeout_s=30.0)
    ws = [Watch(server.socket_path, "v1" if i % 2 else "v1alpha1") for i in range(10)]
    watches.extend(ws)
    for w in ws:
        assert len(w.next()[1].devices) == 8
    wait_until(lambda: server.watchers == 10)

    ws[3].close()  # disconnects mid-stream
    wait_until(lambda: server.watchers == 9, 1.0)  # its server-side stream ended
    publish(board, verdict("gpu-5", "Unhealthy", state="failed", reasons=("driver_errors",)))
    for i, w in enumerate(ws):
        if i == 3:
            continue
        _, msg = w.until(lambda m: health_of(m)["gpu-5"] == pb.UNHEALTHY, 2.0)
        assert len(msg.devices) == 8


def test_a_disconnected_watcher_gives_its_thread_back(serve, watches):
    server = serve(healthy_board(2), max_workers=2)
    a, b = Watch(server.socket_path), Watch(server.socket_path)
    watches += [a, b]
    a.next(), b.next()
    c = Watch(server.socket_path)  # beyond the bound: refused at once, not queued
    watches.append(c)
    assert c.ended.wait(2.0) and c.error is not None
    assert c.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    a.close()
    wait_until(lambda: server.watchers == 1, 1.0)
    d = Watch(server.socket_path)  # a's worker is free again
    watches.append(d)
    assert len(d.next()[1].devices) == 2


def test_stop_ends_every_stream_promptly(serve, watches):
    server = serve(healthy_board(4), health_check_timeout_s=30.0)
    ws = [Watch(server.socket_path) for _ in range(3)]
    watches.extend(ws)
    for w in ws:
        w.next()
    t0 = time.monotonic()
    server.shutdown(timeout_s=1.0)
    assert time.monotonic() - t0 < 2.0
    for w in ws:
        assert w.ended.wait(1.0), "the stream outlived the server"
    assert server.watchers == 0
    assert not os.path.exists(server.socket_path)


def test_restarted_server_on_the_same_path_serves_the_reconnecting_kubelet(serve, watches, sock_dir):
    board = healthy_board(3)
    path = sock_dir / "plugins" / "dra.sock"
    first = serve(board, path)
    # One channel for the whole test, as the kubelet keeps one per plugin and re-calls on it.
    channel = grpc.insecure_channel(
        f"unix://{path}", options=[("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 200)]
    )
    try:
        w = Watch(str(path), channel=channel)
        watches.append(w)
        assert len(w.next()[1].devices) == 3
        first.shutdown(0.2)
        assert w.ended.wait(2.0)
        publish(board, verdict("gpu-1", "Unhealthy", state="failed"))
        serve(board, path)
        again = Watch(str(path), channel=channel)  # the kubelet's retry
        watches.append(again)
        _, msg = again.next(5.0)
        assert health_of(msg) == {"gpu-0": pb.HEALTHY, "gpu-1": pb.UNHEALTHY, "gpu-2": pb.HEALTHY}
    finally:
        channel.close()


def test_devices_without_pool_or_device_are_left_out_and_counted(serve, watches):
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    board = VerdictBoard()
    publish(
        board,
        verdict("gpu-0"),
        verdict("gpu-1", pool=None),
        verdict("gpu-2", device=None),
        verdict("gpu-3", pool="", device=""),
    )
    server = serve(board, meter=meter)
    w = Watch(server.socket_path)
    watches.append(w)
    _, msg = w.next()
    assert [d.device.device_name for d in msg.devices] == ["gpu-0"]
    wait_until(lambda: server.watchers == 1)

    def gauge(name: str) -> tuple[float, str]:
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        (point,) = metric.data.data_points
                        return point.value, metric.unit
        raise AssertionError(f"{name} not exported")

    assert gauge("dra.kubelet.devices.unidentified") == (3, "{device}")
    assert gauge("dra.kubelet.watchers") == (1, "{stream}")
    w.close()
    wait_until(lambda: server.watchers == 0)
    assert gauge("dra.kubelet.watchers") == (0, "{stream}")


def test_the_message_is_cut_to_1024_characters(serve, watches):
    board = VerdictBoard()
    evidence = "température élevée " * 200  # multi-byte characters across the cut
    publish(board, verdict("gpu-0", "Unhealthy", state="failed", reasons=("thermal",), message=evidence))
    server = serve(board)
    w = Watch(server.socket_path)
    watches.append(w)
    (d,) = w.next()[1].devices
    assert len(d.message) <= 1024 and len(d.message.encode()) <= 1024
    assert d.message.startswith("Unhealthy: state=failed reasons=thermal remediation=none; température")
    assert d.message.endswith("...")
    assert len(d.message.encode()) >= 1024 - 4  # cut at the limit, not far before it


def test_truncation_keeps_messages_at_the_limit_and_cuts_on_a_character_boundary():
    assert truncate_message("a" * 1024) == "a" * 1024
    assert truncate_message("a" * 1025) == "a" * 1021 + "..."
    cut = truncate_message("é" * 600)  # 1,200 bytes
    assert cut == "é" * 510 + "..." and len(cut.encode()) == 1023
    assert truncate_message("\ud800 lone surrogate") == "? lone surrogate"


# -- the socket ----------------------------------------------------------------------------
def test_socket_is_owner_only_and_its_directory_is_created(serve, sock_dir):
    path = sock_dir / "deep" / "er" / "dra.sock"
    serve(healthy_board(1), path)
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) & 0o077 == 0


def test_a_stale_socket_is_replaced(serve, watches, sock_dir, caplog):
    path = sock_dir / "dra.sock"
    crashed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    crashed.bind(str(path))
    crashed.close()  # the file stays, nobody listens: what a crash leaves
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    server = serve(healthy_board(2), path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    w = Watch(server.socket_path)
    watches.append(w)
    assert len(w.next()[1].devices) == 2
    assert "took over" not in caplog.text


def test_a_live_socket_is_taken_over_with_a_warning(serve, watches, sock_dir, caplog):
    path = sock_dir / "dra.sock"
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.bind(str(path))
    old.listen()
    try:
        with caplog.at_level(logging.WARNING, logger="otel_dra.sinks.kubelet"):
            server = serve(healthy_board(1), path)
        assert f"took over {path}" in caplog.text
        w = Watch(server.socket_path)
        watches.append(w)
        assert len(w.next()[1].devices) == 1
    finally:
        old.close()


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_a_path_that_is_not_a_socket_is_refused(sock_dir, kind):
    path = sock_dir / "dra.sock"
    if kind == "file":
        path.write_text("precious")
    elif kind == "directory":
        path.mkdir()
    else:
        target = sock_dir / "target.sock"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(target))
        s.close()
        path.symlink_to(target)
    server = KubeletHealthServer(str(path), healthy_board(1))
    with pytest.raises(KubeletSocketError) as err:
        server.start()
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "not a socket" in message
    assert os.path.lexists(path)
    if kind == "file":
        assert path.read_text() == "precious"


def test_a_relative_or_overlong_path_is_refused():
    with pytest.raises(KubeletSocketError, match="absolute"):
        KubeletHealthServer("dra.sock", VerdictBoard()).start()
    with pytest.raises(KubeletSocketError, match="107"):
        KubeletHealthServer("/tmp/" + "x" * 120 + "/dra.sock", VerdictBoard()).start()


# -- registration --------------------------------------------------------------------------
def test_registration_answers_get_info_and_logs_the_kubelets_verdict(sock_dir, caplog):
    endpoint = str(sock_dir / "plugins" / "gpu.example.com" / "dra.sock")
    reg = RegistrationServer(str(sock_dir / "registry"), "gpu.example.com", endpoint, list(HEALTH_SERVICES))
    reg.start()
    try:
        assert reg.socket_path == str(sock_dir / "registry" / "gpu.example.com-reg.sock")
        assert stat.S_IMODE(os.stat(reg.socket_path).st_mode) == 0o600
        with grpc.insecure_channel(f"unix://{reg.socket_path}") as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=5)
            assert info.type == "DRAPlugin"
            assert info.name == "gpu.example.com"
            assert info.endpoint == endpoint
            assert list(info.supported_versions) == ["v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"]
            with caplog.at_level(logging.INFO, logger="otel_dra.sinks.kubelet"):
                stub.NotifyRegistrationStatus(
                    pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=False, error="none of services"),
                    timeout=5,
                )
                assert reg.notified.is_set() and reg.status == (False, "none of services")
                stub.NotifyRegistrationStatus(
                    pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=5
                )
                assert reg.status == (True, "")
        rejected = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(rejected) == 1 and "rejected DRA plugin gpu.example.com: none of services" in rejected[0].message
        assert "\n" not in rejected[0].getMessage()
        assert any("kubelet registered DRA plugin gpu.example.com" in r.message for r in caplog.records)
    finally:
        reg.shutdown(0.2)
    assert not os.path.exists(reg.socket_path)


def test_registration_refuses_to_claim_services_it_does_not_serve(sock_dir):
    with pytest.raises(ValueError, match=r"v1\.DRAPlugin"):
        RegistrationServer(str(sock_dir), "gpu.example.com", "/x/dra.sock", ["v1.DRAPlugin", "v1.DRAResourceHealth"])
    with pytest.raises(ValueError, match="DNS subdomain"):
        RegistrationServer(str(sock_dir), "../evil", "/x/dra.sock", list(HEALTH_SERVICES))


# -- end to end: simulator → classifier → board → stream -----------------------------------
def test_a_simulated_fault_reaches_the_kubelet(serve, watches):
    t0 = 1_800_000_000 * S
    source = SimulatedSource(
        SimulatorConfig("node-a", devices=4, faults=(Fault("gpu-2", "memory_ecc", 30.0),), seed=4, start_unix_nano=t0)
    )
    classifier = Classifier(policy.load(), source.schema, interval_s=10)
    board = VerdictBoard()

    def step(t: int) -> None:
        classifier.ingest(source.read(t0 + t * S))
        changed = classifier.evaluate(t0 + t * S)
        registry = classifier.registry

        def attrs_of(node: str, hw_id: str) -> dict[str, str]:
            row = registry.row(node, hw_id)
            return dict(registry.attrs[row]) if row is not None else {}

        board.update(changed, attrs_of)

    step(0)
    server = serve(board, health_check_timeout_s=30.0)
    w = Watch(server.socket_path)
    watches.append(w)
    _, first = w.next()
    assert [(d.device.pool_name, d.device.device_name) for d in first.devices] == [
        ("node-a", f"gpu-{i}") for i in range(4)
    ]
    assert set(health_of(first).values()) == {pb.HEALTHY}
    for t in range(10, 121, 10):
        step(t)
    _, msg = w.until(lambda m: health_of(m)["gpu-2"] == pb.UNHEALTHY, 3.0)
    (gpu2,) = [d for d in msg.devices if d.device.device_name == "gpu-2"]
    assert gpu2.message.startswith("Unhealthy: state=failed reasons=memory_ecc")
    assert health_of(msg)["gpu-0"] == pb.HEALTHY
    assert gpu2.last_updated_time >= 1_800_000_000


def test_two_views_of_one_device_are_reported_once_the_worse_one():
    seen_here = verdict("gpu-0")
    seen_there = dataclasses.replace(seen_here, node="node-b", health="Unhealthy", state="failed")
    for order in ([seen_here, seen_there], [seen_there, seen_here]):
        response, left_out = build_response(order, 30, REPORTED_S)
        assert not left_out
        assert [(d.device.device_name, d.health) for d in response.devices] == [("gpu-0", pb.UNHEALTHY)]


def test_resends_pause_while_the_verdicts_are_stale_but_changes_still_go_out(serve, watches):
    live = threading.Event()
    board = healthy_board(2)
    server = serve(board, health_check_timeout_s=0.6, liveness=live.is_set)  # resend every 0.2 s when live
    w = Watch(server.socket_path)
    watches.append(w)
    w.next()  # the first list always goes out
    time.sleep(0.7)
    assert w.messages.empty(), "resent stale verdicts"
    publish(board, verdict("gpu-1", "Unhealthy", state="failed"))
    _, msg = w.next(1.0)
    assert health_of(msg)["gpu-1"] == pb.UNHEALTHY
    live.set()
    t0, _ = w.next(1.0)
    t1, _ = w.next(1.0)
    assert t1 - t0 < 0.2 + 0.15


# -- faults and bad input (issue #7) ----------------------------------------------------------
HEALTH_METHODS = [
    f"/{mod.DESCRIPTOR.services_by_name['DRAResourceHealth'].full_name}/NodeWatchResources" for mod, _ in API.values()
]


def test_any_request_bytes_on_the_stream_are_answered_and_the_server_keeps_serving(serve, watches):
    """Hypothesis feeds arbitrary bytes as the request of both versions' NodeWatchResources over the
    real socket: each call either streams the device list (bytes that parse as the empty request)
    or ends with a gRPC status; the server never dies, keeps no stream behind, and the next
    kubelet is served."""
    server = serve(healthy_board(2), health_check_timeout_s=30.0)
    channel = grpc.insecure_channel(f"unix://{server.socket_path}")
    calls = {m: channel.unary_stream(m) for m in HEALTH_METHODS}  # no serializers: raw bytes both ways
    outcomes: set[str] = set()

    @settings(max_examples=80, deadline=None)
    @given(st.sampled_from(HEALTH_METHODS), st.binary(max_size=64))
    def one(method: str, blob: bytes) -> None:
        call = calls[method](blob, timeout=5)
        try:
            msg = pb.NodeWatchResourcesResponse.FromString(next(call))
            assert sorted(d.device.device_name for d in msg.devices) == ["gpu-0", "gpu-1"]
            outcomes.add("streamed")
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT), exc
            outcomes.add("refused")
        finally:
            call.cancel()

    try:
        one()
    finally:
        channel.close()
    assert outcomes == {"streamed", "refused"}, outcomes  # both kinds of input were seen
    wait_until(lambda: server.watchers == 0, 5.0)
    w = Watch(server.socket_path)
    watches.append(w)
    assert len(w.next()[1].devices) == 2


def test_a_stream_opened_right_after_a_change_starts_from_it_even_when_the_follower_lags(serve, watches):
    """The server's follower thread learns of board changes a moment late (a loaded node; seen in CI
    as a kubelet reconnecting and being told the list from before the change). A new stream must
    start from the board as it is, not from what the follower has seen so far."""
    board = healthy_board(3)
    woken = board.wait_for_change

    def late(seen: int, timeout_s: float) -> int:
        version = woken(seen, timeout_s)
        if version != seen:
            time.sleep(1.0)  # the follower is slow to pass the change on
        return version

    board.wait_for_change = late  # type: ignore[method-assign]
    server = serve(board, health_check_timeout_s=30.0)
    wait_until(lambda: time.time() % 1.0 < 0.2, 2.0)  # all of it within one second: the encoding cache's key
    before = Watch(server.socket_path)  # a stream open since before the change, as the kubelet's was
    watches.append(before)
    assert set(health_of(before.next()[1]).values()) == {pb.HEALTHY}
    publish(board, verdict("gpu-1", "Unhealthy", state="failed", reasons=("device_lost",)))
    w = Watch(server.socket_path)
    watches.append(w)
    _, first = w.next()
    assert health_of(first) == {"gpu-0": pb.HEALTHY, "gpu-1": pb.UNHEALTHY, "gpu-2": pb.HEALTHY}
    assert health_of(before.next()[1]) == health_of(first)  # the older stream is told once the follower is


def test_a_kubelet_that_keeps_reconnecting_starts_from_the_current_list_and_leaves_nothing(serve, watches):
    """The kubelet drops its stream (restart, network blip) while verdicts change, many times: every
    new stream's first message is the list as it is now, and no stream or thread stays behind."""
    board = healthy_board(3)
    server = serve(board, health_check_timeout_s=30.0)
    w = Watch(server.socket_path)
    w.next()
    w.close()
    wait_until(lambda: server.watchers == 0, 3.0)
    threads = threading.active_count()
    for i in range(20):
        sick = f"gpu-{i % 3}"
        publish(board, *(verdict(f"gpu-{j}") for j in range(3) if f"gpu-{j}" != sick))
        publish(board, verdict(sick, "Unhealthy", state="failed", reasons=("device_lost",)))
        again = Watch(server.socket_path)  # what the kubelet sees after it reconnects
        _, msg = again.next()
        expected = {f"gpu-{j}": pb.HEALTHY for j in range(3)} | {sick: pb.UNHEALTHY}
        assert health_of(msg) == expected, (i, health_of(msg))
        again.close()
    wait_until(lambda: server.watchers == 0, 3.0)
    wait_until(lambda: threading.active_count() <= threads + 2, 5.0)
