"""The agent as a user runs it, watched by a kubelet-like client over its unix socket."""

from __future__ import annotations

import os
import queue
import re
import signal
import stat
import threading
import time
from pathlib import Path

import grpc
import pytest

from otel_dra.classifier import Verdict
from otel_dra.sinks.kubelet import MAX_RESEND_S, KubeletHealthServer, build_response
from otel_dra.sinks.kubelet.api import dra_health_v1alpha1_pb2 as pb
from otel_dra.sinks.kubelet.api import dra_health_v1alpha1_pb2_grpc as pb_grpc
from otel_dra.sinks.kubelet.api import pluginregistration_v1_pb2 as reg_pb
from otel_dra.sinks.kubelet.api import pluginregistration_v1_pb2_grpc as reg_grpc
from otel_dra.state.board import VerdictBoard
from tests.conftest import wait_for

pytestmark = pytest.mark.e2e
DEVICES = {f"gpu-{i}" for i in range(8)}
#: The services a kubelet 1.34+ accepts a DRA plugin registration for (dra_plugin_manager.go).
KUBELET_DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def go_list(items) -> str:
    """A []string as Go's %v prints it."""
    return "[" + " ".join(items) + "]"


#: The kubelet's health timeout where it uses no plugin's: always on 1.34, for 0/unset from 1.35.
KUBELET_DEFAULT_HEALTH_TIMEOUT_S = 30.0


class Kubelet:
    """Watches NodeWatchResources the way the kubelet does: one stream, retried every second; and
    judges each device's health the way the kubelet of ``version`` does.

    The kubelet's rules (pkg/kubelet/cm/dra/, kubernetes/kubernetes):

    - Last heard is the kubelet's own clock: ``updateHealthInfo`` (healthinfo.go) sets every reported
      device's ``LastUpdated = time.Now()`` on receipt; the plugin's ``last_updated_time`` is ignored.
    - A device is Unknown when ``now.Sub(LastUpdated) > timeout`` (strictly more), or when the cache
      has no entry for it (``getHealthInfo``, healthinfo.go); a timed-out device's message is cleared.
      A device missing from a report keeps its entry and times out the same way (phase 2).
    - 1.34 (healthinfo.go of v1.34: ``const healthTimeout = 30 * time.Second`` under
      "TODO(#133118): Make health timeout configurable"): one fixed 30 s for every device;
      ``health_check_timeout_seconds`` does not exist for it and is ignored.
    - 1.35+ (kubernetes/kubernetes#135147, "Added configurable per-device health check timeouts to
      the DRA health monitoring API", CHANGELOG-1.35.md; KEP-4680, kubernetes/enhancements#5476):
      manager.go's ``buildDeviceHealth`` takes ``health_check_timeout_seconds`` when > 0, else (0,
      unset, negative) ``DefaultHealthTimeout = 30 * time.Second`` (healthinfo.go); per device.
    - When the stream ends (EOF or error), ``HandleWatchResourcesStream`` (manager.go) defers
      ``clearDriver``: the driver's whole cache goes, so every device is Unknown at once.
    """

    def __init__(self, socket_path: Path | None, version: tuple[int, int] = (1, 35)) -> None:
        """``socket_path=None``: no stream, messages come through :meth:`receive` (unit tests)."""
        self.socket_path = socket_path
        self.version = version
        self.messages: queue.Queue[tuple[float, pb.NodeWatchResourcesResponse]] = queue.Queue()
        self.connects = 0
        self._lock = threading.Lock()
        #: The kubelet's health cache for this driver: (pool, device) -> (health, message, heard at, timeout).
        self._cache: dict[tuple[str, str], tuple[int, str, float, float]] = {}
        self._devices: dict[tuple[str, str], None] = {}  # every device ever heard of (the pods' devices)
        self._stop = threading.Event()
        if socket_path is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        assert self.socket_path is not None
        while not self._stop.is_set():
            if not self.socket_path.exists():
                time.sleep(0.2)
                continue
            with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
                stub = pb_grpc.DRAResourceHealthStub(channel)
                try:
                    self.connects += 1
                    for msg in stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=120):
                        at = time.monotonic()
                        self.receive(msg, at)
                        self.messages.put((at, msg))
                        if self._stop.is_set():
                            return
                    self.stream_ended()
                except grpc.RpcError:
                    self.stream_ended()
                    time.sleep(0.5)  # the kubelet retries every 5 s; faster here

    # -- the kubelet's health cache (healthinfo.go) ---------------------------------------------
    def timeout_for(self, health_check_timeout_seconds: int) -> float:
        """The timeout this kubelet gives a device that reported ``health_check_timeout_seconds``."""
        if self.version < (1, 35) or health_check_timeout_seconds <= 0:
            return KUBELET_DEFAULT_HEALTH_TIMEOUT_S
        return float(health_check_timeout_seconds)

    def receive(self, msg: pb.NodeWatchResourcesResponse, at: float) -> None:
        """One message of the stream, heard at ``at`` (monotonic seconds)."""
        with self._lock:
            for d in msg.devices:
                key = (d.device.pool_name, d.device.device_name)
                self._cache[key] = (d.health, d.message, at, self.timeout_for(d.health_check_timeout_seconds))
                self._devices[key] = None

    def stream_ended(self) -> None:
        """``clearDriver``: nothing is known about the driver's devices any more."""
        with self._lock:
            self._cache.clear()

    def health(self, at: float | None = None) -> dict[str, tuple[int, str]]:
        """Every device's (health, message) as this kubelet would put it in the pod status at ``at``."""
        at = time.monotonic() if at is None else at
        out: dict[str, tuple[int, str]] = {}
        with self._lock:
            for key in self._devices:
                entry = self._cache.get(key)
                if entry is None or at - entry[2] > entry[3]:
                    out[key[1]] = (pb.UNKNOWN, "")
                else:
                    out[key[1]] = (entry[0], entry[1])
        return out

    def unknown(self, at: float | None = None) -> set[str]:
        """The devices this kubelet considers Unknown at ``at`` (now by default)."""
        return {dev for dev, (h, _) in self.health(at).items() if h == pb.UNKNOWN}

    def deadline(self, device: str) -> float:
        """When this kubelet stops believing the last report of ``device`` (monotonic seconds)."""
        with self._lock:
            return min(at + t for (_, dev), (_, _, at, t) in self._cache.items() if dev == device)

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
    argv = ["run", "--source", "simulated", "--prometheus-port", "0", "--kubelet-socket", str(taken)]
    result = subprocess.run(
        [sys.executable, "-m", "otel_dra", *argv],
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


# -- the kubelet's health timeout, per kubelet version ----------------------------------------------
def healthy_report(timeout_s: float, n: int = 8) -> pb.NodeWatchResourcesResponse:
    """What the agent's server sends for ``--kubelet-health-timeout timeout_s``: n healthy devices."""
    server = KubeletHealthServer("/unused/dra.sock", VerdictBoard(), timeout_s)
    verdicts = [
        Verdict(0, "node-k", f"gpu-{i}", "Healthy", None, (), "none", "", pool="node-k", device=f"gpu-{i}")
        for i in range(n)
    ]
    return build_response(verdicts, server.timeout_field_s, int(time.time()))[0]


@pytest.mark.parametrize(
    ("timeout_s", "resend_s"), [(0.6, 0.2), (3, 1.0), (30, 10.0), (31, 10.0), (120, 10.0), (3600, 10.0)]
)
def test_the_resend_interval_is_a_third_of_the_timeout_and_never_more_than_10_s(timeout_s, resend_s):
    server = KubeletHealthServer("/unused/dra.sock", VerdictBoard(), timeout_s)
    assert server.resend_s == pytest.approx(resend_s)
    assert server.resend_s <= MAX_RESEND_S == KUBELET_DEFAULT_HEALTH_TIMEOUT_S / 3  # a 1.34 kubelet's 30 s / 3
    assert server.timeout_field_s == max(1, int(-(-timeout_s // 1)))  # what a 1.35+ kubelet is told


def test_the_stand_in_applies_each_kubelet_versions_timeout_rule():
    """1.34: a fixed 30 s whatever the device says; 1.35+: the device's health_check_timeout_seconds, 30 s
    for 0 or a negative value; Unknown only once strictly more than the timeout has passed, message
    cleared; and everything Unknown as soon as the stream ends."""
    for field, v134, v135 in [(120, 30, 120), (3, 30, 3), (0, 30, 30), (-5, 30, 30)]:
        msg = healthy_report(30)
        for d in msg.devices:
            d.health_check_timeout_seconds = field
        for version, timeout in [((1, 34), v134), ((1, 35), v135), ((1, 36), v135)]:
            kubelet = Kubelet(None, version)
            kubelet.receive(msg, at=100.0)
            assert kubelet.timeout_for(field) == timeout
            assert kubelet.unknown(100.0 + timeout) == set(), (version, field)
            assert all(h == pb.HEALTHY and m for h, m in kubelet.health(100.0 + timeout).values())
            assert kubelet.unknown(100.0 + timeout + 0.001) == DEVICES, (version, field)
            assert set(kubelet.health(100.0 + timeout + 0.001).values()) == {(pb.UNKNOWN, "")}
            kubelet.receive(msg, at=100.0 + timeout + 1)  # heard again: known again
            assert kubelet.unknown(100.0 + timeout + 1) == set()
            kubelet.stream_ended()
            assert kubelet.unknown(100.0 + timeout + 1) == DEVICES


@pytest.mark.parametrize("timeout_s", [30.0, 120.0])
def test_a_kubelet_1_34_never_times_out_a_device_at_the_agents_resend_cadence(timeout_s):
    """The agent's quiet-time cadence (the server's ``resend_s``) against a 1.34 kubelet's fixed 30 s
    over an hour of kubelet time, checked just before each resend arrives. The old cadence, a third of
    the configured timeout, loses every device on a 1.34 kubelet at 120 s (but not on 1.35+, which
    takes the device's 120 s): the check can fail."""
    cadence = KubeletHealthServer("/unused/dra.sock", VerdictBoard(), timeout_s).resend_s
    msg = healthy_report(timeout_s)
    for interval, version, lost in [
        (cadence, (1, 34), False),
        (timeout_s / 3, (1, 34), timeout_s > 90),
        (timeout_s / 3, (1, 35), False),
    ]:
        kubelet = Kubelet(None, version)
        kubelet.receive(msg, at=0.0)
        unknown_before_a_resend: set[str] = set()
        at = 0.0
        while at < 3600:
            at += interval
            unknown_before_a_resend |= kubelet.unknown(at - 1e-6)
            kubelet.receive(msg, at)
        assert unknown_before_a_resend == (DEVICES if lost else set()), (interval, version)


def test_a_kubelet_1_35_never_times_out_a_healthy_agents_devices(start_agent, kubelet_dir):
    sock = kubelet_dir / "dra.sock"
    start_agent("--interval", "1", "--kubelet-socket", str(sock), "--kubelet-health-timeout", "3")
    kubelet = Kubelet(sock, version=(1, 35))
    try:
        kubelet.messages.get(timeout=10)
        start = time.monotonic()
        while time.monotonic() - start < 3 * 1.5:  # past the devices' 3 s timeout: only resends keep them
            try:
                _, msg = kubelet.messages.get(timeout=0.1)
            except queue.Empty:
                pass
            else:
                assert {d.device.device_name for d in msg.devices} == DEVICES
                assert all(d.health_check_timeout_seconds == 3 and d.message for d in msg.devices)
            assert kubelet.unknown() == set(), kubelet.health()
        health = kubelet.health()
        assert set(health) == DEVICES and all(h == pb.HEALTHY and m for h, m in health.values())
    finally:
        kubelet.close()


def test_a_kubelet_1_34_never_times_out_the_agents_devices_with_the_default_or_a_longer_timeout(
    start_agent, kubelet_dir
):
    """A 1.34 kubelet ignores health_check_timeout_seconds and gives every device 30 s: the agent's
    quiet-time resend must come within that, with the default timeout and with 120 s. Each resend is
    waited for only until the 1.34 kubelet's deadline: a slower cadence fails here."""
    kubelets: dict[int, Kubelet] = {}
    for timeout in (30, 120):
        sock = kubelet_dir / f"dra-{timeout}.sock"
        args = ["--interval", "1", "--kubelet-socket", str(sock)]
        if timeout != 30:
            args += ["--kubelet-health-timeout", str(timeout)]  # 30 s: the agent's default, left unset
        start_agent(*args)
        kubelets[timeout] = Kubelet(sock, version=(1, 34))
    try:
        heard: dict[int, float] = {}
        for timeout, kubelet in kubelets.items():
            heard[timeout], msg = kubelet.messages.get(timeout=10)
            assert {d.health_check_timeout_seconds for d in msg.devices} == {timeout}
        for timeout, kubelet in kubelets.items():  # both agents run at once: one quiet gap of wall time
            deadline = kubelet.deadline("gpu-0")
            assert deadline == pytest.approx(heard[timeout] + KUBELET_DEFAULT_HEALTH_TIMEOUT_S)
            try:
                at, msg = kubelet.messages.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"--kubelet-health-timeout {timeout}: no resend within a 1.34 kubelet's 30 s; "
                    f"Unknown there: {sorted(kubelet.unknown())}"
                ) from None
            assert at - heard[timeout] <= MAX_RESEND_S + 1.5
            assert kubelet.unknown(at - 0.001) == set()
            assert {d.device.device_name for d in msg.devices} == DEVICES
    finally:
        for kubelet in kubelets.values():
            kubelet.close()


def test_the_kubelet_marks_the_devices_unknown_when_the_agent_stops_sending(start_agent, kubelet_dir):
    """SIGSTOP: the stream stays open but goes quiet, so a 1.35 kubelet turns every device Unknown once
    its 3 s have passed (a 1.34 kubelet, with its fixed 30 s, not yet); SIGCONT: known again; the agent
    stopped for good: the stream ends and both kubelets drop every device at once."""
    sock = kubelet_dir / "dra.sock"
    agent = start_agent("--interval", "1", "--kubelet-socket", str(sock), "--kubelet-health-timeout", "3")
    new, old = Kubelet(sock, version=(1, 35)), Kubelet(sock, version=(1, 34))
    try:
        for kubelet in (new, old):
            wait_for(lambda k=kubelet: set(k.health()) == DEVICES and not k.unknown(), 10, "every device known")
        agent.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            time.sleep(0.2)  # a message already on its way lands
            last_heard = new.deadline("gpu-0") - 3
            wait_for(lambda: new.unknown() == DEVICES, 3 + 2, "a 1.35 kubelet to time the devices out", every=0.05)
            # 3 s after the last report heard (resent every 1 s, so at most 1 s before the stop): the timeout
            assert time.monotonic() - last_heard > 3
            assert time.monotonic() - stopped <= 3 + 1.0
            assert old.unknown() == set()  # 30 s on 1.34
            assert new.connects == old.connects == 1  # the stream never ended: this was the timeout
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: not new.unknown(), 5, "the devices known again after SIGCONT")
        code, _ = agent.stop()
        assert code == 0
        for kubelet in (new, old):
            wait_for(lambda k=kubelet: k.unknown() == DEVICES, 3, "every device Unknown once the stream ends")
    finally:
        new.close()
        old.close()
