"""The agent as a user runs it, watched by a kubelet-like client over its unix socket."""

from __future__ import annotations

import os
import queue
import re
import stat
import threading
import time
from pathlib import Path

import grpc
import pytest

from otel_dra.kubelet.api import dra_health_v1alpha1_pb2 as pb
from otel_dra.kubelet.api import dra_health_v1alpha1_pb2_grpc as pb_grpc
from otel_dra.kubelet.api import pluginregistration_v1_pb2 as reg_pb
from otel_dra.kubelet.api import pluginregistration_v1_pb2_grpc as reg_grpc
from tests.conftest import wait_for

pytestmark = pytest.mark.e2e
DEVICES = {f"gpu-{i}" for i in range(8)}
#: The services a kubelet 1.34+ accepts a DRA plugin registration for (dra_plugin_manager.go).
KUBELET_DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def go_list(items) -> str:
    """A []string as Go's %v prints it."""
    return "[" + " ".join(items) + "]"


class Kubelet:
    """Watches NodeWatchResources the way the kubelet does: one stream, retried every second."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.messages: queue.Queue[tuple[float, pb.NodeWatchResourcesResponse]] = queue.Queue()
        self.connects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.socket_path.exists():
                time.sleep(0.2)
                continue
            with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
                stub = pb_grpc.DRAResourceHealthStub(channel)
                try:
                    self.connects += 1
                    for msg in stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=120):
                        self.messages.put((time.monotonic(), msg))
                        if self._stop.is_set():
                            return
                except grpc.RpcError:
                    time.sleep(0.5)  # the kubelet retries every 5 s; faster here

    def next(self, timeout: float = 10.0) -> tuple[float, dict[str, tuple[int, str]]]:
        at, msg = self.messages.get(timeout=timeout)
        return at, {d.device.device_name: (d.health, d.message) for d in msg.devices}

    def until(self, predicate, timeout: float, what: str) -> dict[str, tuple[int, str]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                _, health = self.next(max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if predicate(health):
                return health
        raise AssertionError(f"timed out waiting for {what}")

    def close(self) -> None:
        self._stop.set()

    @staticmethod
    def register(reg_sock: Path) -> tuple[bool, str, reg_pb.PluginInfo]:
        """The kubelet's plugin watcher on one ``<driver>-reg.sock``: ``GetInfo``, then the DRA plugin
        manager's rule (the plugin must list a ``DRAPlugin`` service it serves), then
        ``NotifyRegistrationStatus`` with the verdict. Returns (registered, error, info)."""
        with grpc.insecure_channel(f"unix://{reg_sock}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg_pb.InfoRequest(), timeout=5)
            services = list(info.supported_versions)
            error = ""
            if info.type != "DRAPlugin":
                error = f"no handler registered for plugin type: {info.type}"
            elif not any(s in KUBELET_DRA_SERVICES for s in services):
                error = f"none of services supported by the plugin {go_list(services)} are supported by the kubelet"
            stub.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=not error, error=error), timeout=5
            )
        return not error, error, info


@pytest.fixture
def kubelet_dir(sock_dir: Path) -> Path:
    return sock_dir / "plugins" / "otel-dra.example.com"


def test_device_lost_turns_unhealthy_after_the_stale_timeout_and_the_rest_stay_healthy(
    start_agent, tmp_path, kubelet_dir
):
    policy = tmp_path / "policy.yaml"
    policy.write_text("stale_timeout: 5s\n")  # the contract's 60 s default, shortened for the test
    sock = kubelet_dir / "dra.sock"
    agent = start_agent(
        "--interval",
        "1",
        "--kubelet-socket",
        str(sock),
        "--kubelet-health-timeout",
        "3",
        "--fault",
        "gpu-2:device_lost@4",
        "--policy",
        str(policy),
        "--node-name",
        "node-k",
    )
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    kubelet = Kubelet(sock)
    try:
        _, first = kubelet.next()
        assert set(first) == DEVICES and all(h == pb.HEALTHY for h, _ in first.values())
        # Nothing changes for a while: the list is still resent (well inside the 3 s timeout).
        t0, _ = kubelet.next()
        t1, _ = kubelet.next()
        assert t1 - t0 <= 1.5
        lost = kubelet.until(lambda h: h["gpu-2"][0] == pb.UNHEALTHY, 20, "gpu-2 UNHEALTHY")
        lost_at = time.monotonic()
        assert "device_lost" in lost["gpu-2"][1] and "reboot_node" in lost["gpu-2"][1]
        assert all(h == pb.HEALTHY for dev, (h, _) in lost.items() if dev != "gpu-2")
        # fault at 4 s + stale timeout 5 s, judged at the next sample: within one interval after.
        assert lost_at - agent.started <= 4 + 5 + 1 + 3  # + start-up time of the process
        for _ in range(3):
            _, later = kubelet.next()
            assert later["gpu-2"][0] == pb.UNHEALTHY
            assert all(h == pb.HEALTHY for dev, (h, _) in later.items() if dev != "gpu-2")
    finally:
        kubelet.close()


def test_the_kubelet_reconnects_after_an_agent_restart(start_agent, tmp_path, kubelet_dir):
    sock = kubelet_dir / "dra.sock"
    args = ("--interval", "1", "--kubelet-socket", str(sock), "--kubelet-health-timeout", "3")
    first = start_agent(*args)
    kubelet = Kubelet(sock)
    try:
        assert set(kubelet.next()[1]) == DEVICES
        code, took = first.stop()
        assert code == 0 and took < 5
        second = start_agent(*args)  # the socket file left behind is replaced
        assert second.proc.poll() is None
        wait_for(lambda: kubelet.connects >= 2, 20, "the kubelet to reconnect")
        health = kubelet.until(lambda h: set(h) == DEVICES, 20, "the full list after the restart")
        assert all(h == pb.HEALTHY for h, _ in health.values())
    finally:
        kubelet.close()


def start_registering(start_agent, sock_dir):
    """An agent that registers its health socket as ``otel-dra.example.com``: (agent, its -reg.sock,
    the health socket it announces)."""
    registry = sock_dir / "plugins_registry"
    sock = sock_dir / "plugins" / "otel-dra.example.com" / "dra.sock"
    agent = start_agent(
        "--interval",
        "1",
        "--register-with-kubelet",
        "otel-dra.example.com",
        "--kubelet-socket",
        str(sock),
        "--plugin-registry",
        str(registry),
    )
    reg_sock = registry / "otel-dra.example.com-reg.sock"
    wait_for(reg_sock.exists, 10, "the registration socket")
    return agent, reg_sock, sock


def test_registration_announces_the_health_socket(start_agent, sock_dir):
    _, reg_sock, sock = start_registering(start_agent, sock_dir)
    with grpc.insecure_channel(f"unix://{reg_sock}") as channel:
        info = reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=5)
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", "otel-dra.example.com", str(sock))
    assert "v1alpha1.DRAResourceHealth" in info.supported_versions


def test_a_path_that_is_not_a_socket_is_a_one_line_error(start_agent, tmp_path):
    import subprocess
    import sys

    taken = tmp_path / "not-a-socket"
    taken.write_text("precious")
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", "run", "--prometheus-port", "0", "--kubelet-socket", str(taken)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("otel-dra: error:")
    assert taken.read_text() == "precious"


def test_done_when_with_every_default(start_agent, kubelet_dir):
    """Issue #4's check as a user runs it: `otel-dra run --kubelet-socket ... --fault gpu-2:device_lost@10`
    with the default 5 s interval and 60 s stale timeout: gpu-2 goes UNHEALTHY within one interval after
    the stale timeout, every other device stays HEALTHY."""
    sock = kubelet_dir / "dra.sock"
    agent = start_agent("--kubelet-socket", str(sock), "--fault", "gpu-2:device_lost@10")
    kubelet = Kubelet(sock)
    try:
        first = kubelet.next()[1]
        assert set(first) == DEVICES and all(h == pb.HEALTHY for h, _ in first.values())
        lost = kubelet.until(lambda h: h["gpu-2"][0] != pb.HEALTHY, 100, "gpu-2 to leave HEALTHY")
        after = time.monotonic() - agent.started
        assert lost["gpu-2"][0] == pb.UNHEALTHY
        assert all(h == pb.HEALTHY for dev, (h, _) in lost.items() if dev != "gpu-2")
        # The device's last report is the sample at 5 s (the one at 10 s finds it gone); the stale timeout
        # (60 s) runs from there, and the next sample (every 5 s) sees it: 65-70 s, plus the start-up.
        assert 5 + 60 <= after <= 10 + 60 + 5 + 4, after
    finally:
        kubelet.close()


def test_a_kubelet_refuses_otel_dras_own_health_only_registration(start_agent, sock_dir):
    """otel-dra serves only DRAResourceHealth, so a kubelet 1.34+ refuses its registration and says why:
    the default DaemonSet does not register (deploy/README.md, "Relaying health to the kubelet")."""
    agent, reg_sock, _ = start_registering(start_agent, sock_dir)
    registered, error, info = Kubelet.register(reg_sock)
    assert not any(s.endswith(".DRAPlugin") for s in info.supported_versions)
    assert registered is False
    assert error == (
        f"none of services supported by the plugin {go_list(info.supported_versions)} are supported by the kubelet"
    )
    assert re.fullmatch(
        r"none of services supported by the plugin \[[^]]*DRAResourceHealth[^]]*\] are supported "
        r"by the kubelet",
        error,
    )
    wait_for(lambda: "kubelet rejected DRA plugin otel-dra.example.com" in agent.logs(), 10, "the rejection logged")
    assert error in agent.logs()


class _DriverRegistration(reg_grpc.RegistrationServicer):
    """A DRA driver's registration, as a driver that serves DRAPlugin answers it."""

    def __init__(self, versions: list[str]) -> None:
        self.versions = versions
        self.statuses: list[tuple[bool, str]] = []

    def GetInfo(self, request, context):
        return reg_pb.PluginInfo(
            type="DRAPlugin", name="gpu.example.com", endpoint="/x/dra.sock", supported_versions=self.versions
        )

    def NotifyRegistrationStatus(self, request, context):
        self.statuses.append((request.plugin_registered, request.error))
        return reg_pb.RegistrationStatusResponse()


@pytest.mark.parametrize(
    ("versions", "accepted"),
    [
        (["v1.DRAPlugin", "v1.DRAResourceHealth"], True),
        (["v1beta1.DRAPlugin"], True),
        (["v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"], False),
    ],
)
def test_the_kubelet_stand_in_accepts_only_a_registration_listing_a_dra_plugin_service(sock_dir, versions, accepted):
    from concurrent.futures import ThreadPoolExecutor

    driver = _DriverRegistration(versions)
    server = grpc.server(ThreadPoolExecutor(2))
    reg_grpc.add_RegistrationServicer_to_server(driver, server)
    reg_sock = sock_dir / "gpu.example.com-reg.sock"
    server.add_insecure_port(f"unix://{reg_sock}")
    server.start()
    try:
        registered, error, _ = Kubelet.register(reg_sock)
    finally:
        server.stop(0).wait(2)
    assert registered is accepted
    expected = (
        "" if accepted else f"none of services supported by the plugin {go_list(versions)} are supported by the kubelet"
    )
    assert error == expected
    assert driver.statuses == [(accepted, expected)]
