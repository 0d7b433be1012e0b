"""Real components for end-to-end tests: the agent and the fleet as processes, the fleet's OTLP
receiver in process, a Prometheus server (Debian's package, installed when missing) and an
OpenTelemetry collector (rotel, from PyPI), all on loopback ports picked at run time and stopped
afterwards."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from otel_dra.frame import Frame, Schema
from otel_dra.receivers.factory import new_receiver as OtlpReceiver

REPO = Path(__file__).resolve().parents[1]

# No per-example deadline anywhere: beside the real-clock tests on the other worker, a 200 ms
# deadline measures the machine's load, not the code (hypothesis advises the same for CI).
hypothesis_settings.register_profile("otel-dra", deadline=None)
hypothesis_settings.load_profile("otel-dra")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_for(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.2) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (OSError, ValueError):
            last = None
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


#: Modules whose tests run real processes against real clocks (every e2e-marked test's), and those (marked realtime)
#: that time something in process to a fraction of a second (the soak's ticks, the kubelet stream's
#: resends, the sending queue's pushes). Under xdist (pyproject's addopts) they form one work unit: one
#: worker runs them one after another, so they never race each other for the CPU, while the
#: other modules, each a unit of its own (its module-scoped fixtures are made once), run beside.
#: ``otel-dra run`` and ``fleet`` keep held faults in ``$XDG_STATE_HOME/otel-dra`` (issue #16): never the
#: user's own, and never shared between tests. Every process a test starts inherits this worker's directory
#: (module-scoped fixtures' processes included); each test gets its own below, and ``spawn_fleet`` its own too.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="otel-dra-tests-state-")
#: A suite started in the background of a shell without job control (``nohup ./.ci/run &``) inherits SIGINT ignored,
#: and so would every process it starts: the CLI processes that tests end with Ctrl-C would never end.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's processes remember only what that test made them see."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))


REALTIME_MODULES = frozenset(
    {
        "test_deploy.py",
        "test_e2e_alertmanager.py",
        "test_e2e_attacks.py",
        "test_e2e_auth.py",
        "test_e2e_fleet.py",
        "test_e2e_fleet_k8s.py",
        "test_e2e_kubelet.py",
        "test_e2e_otlp.py",
        "test_e2e_outage.py",
        "test_e2e_pause.py",
        "test_e2e_prometheus.py",
        "test_e2e_sources.py",
        "test_e2e_state.py",
        "test_fleet_run.py",
        "test_grafana_rules.py",
        "test_k8s_lease.py",
        "test_kubelet_stream.py",
        "test_receiver_tls.py",
        "test_sending_queue.py",
        "test_soak.py",
    }
)


#: Realtime tests that mostly wait out a long real interval (a 60 s stale timeout, a fleet stopped for ten of them, a
#: collector down past a stale timeout, an agent's restart), with seconds of tolerance: one worker of their own
#: sleeps through them beside the others (three minutes of the realtime worker's ten), then leaves.
LONG_WAITS = frozenset(
    {
        "tests/e2e/test_e2e_kubelet.py::test_done_when_with_every_default",
        "tests/e2e/test_e2e_pause.py::test_a_fleet_stopped_for_ten_stale_timeouts_calls_no_node_stale_but_the_silent_one",
        "tests/e2e/test_e2e_fleet.py::test_alerts_stay_quiet_when_only_the_collector_fails",
        "tests/e2e/test_e2e_fleet.py::test_an_agent_restart_raises_no_false_alarm",
    }
)


def _long_wait(nodeid: str) -> bool:
    return nodeid.split("[", 1)[0] in LONG_WAITS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An e2e or realtime test outside REALTIME_MODULES would race the others under xdist: say so, don't run.
    A LONG_WAITS entry that names no test (renamed, moved) would quietly join the others: say so too."""
    marked = ("e2e", "realtime")
    stray = sorted(
        {
            i.path.name
            for i in items
            if any(i.get_closest_marker(m) for m in marked) and i.path.name not in REALTIME_MODULES
        }
    )
    if stray:
        raise pytest.UsageError(
            f"e2e or realtime tests in {', '.join(stray)}: add the module to REALTIME_MODULES in conftest.py"
        )
    gone = [
        nodeid
        for nodeid in sorted(LONG_WAITS)
        if f"def {nodeid.rsplit('::', 1)[1]}(" not in (config.rootpath / nodeid.split("::")[0]).read_text()
    ]
    if gone:
        raise pytest.UsageError(f"LONG_WAITS in conftest.py names tests that are gone: {', '.join(gone)}")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker a core for the CPU-bound modules, one for the realtime unit (waiting most of its time: the second
    core of two sat idle for a third of the run without a worker beside it), and one for LONG_WAITS (asleep most of
    the time). The CPU-bound workers run at a lower priority (:func:`pytest_runtest_setup`): a fourth worker at
    the realtime unit's priority left the real processes it times too little CPU (a fleet took over 10 s to answer
    the 200,000-device attack's request; tried, 2026-12-08)."""
    from xdist.plugin import pytest_xdist_auto_num_workers as cores

    return cores(config) if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") else cores(config) + 2


#: How much lower a worker that runs neither the realtime unit nor LONG_WAITS runs (``nice``): under CFS a process at
#: nice 10 gets about a tenth of a core's time where one at 0 wants it, so the realtime unit's processes and clocks
#: see a quiet machine, and the CPU-bound modules take whatever they leave.
CPU_BOUND_NICE = 10
_worker_placed: list[bool] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A worker's first test says what it runs: the scheduler (:func:`pytest_xdist_make_scheduler`) hands out the
    realtime unit and LONG_WAITS first, each to a worker of its own, so a worker whose first test is neither never
    gets them, and lowers its priority for good (an unprivileged process cannot raise it again)."""
    if _worker_placed or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _worker_placed.append(True)
    if item.path.name not in REALTIME_MODULES and not _long_wait(item.nodeid):
        with contextlib.suppress(OSError):  # (a sandbox that refuses setpriority: the worker runs as it was)
            os.nice(CPU_BOUND_NICE)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadscope`` with REALTIME_MODULES as one scope (xdist's ``loadgroup`` would do it by
    marker, but pytest 9.2 ignores the test ids xdist 3.8 rewrites for it), given first to the first worker, and
    LONG_WAITS as another, given first to the next, which takes nothing else (three workers or more: with fewer they
    stay with the realtime scope). Every other worker's first test is of a CPU-bound module (its priority:
    :func:`pytest_runtest_setup`)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    waits_apart = len(config.getoption("tx") or ()) >= 3

    class RealtimeTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if waits_apart and _long_wait(nodeid):
                return "long waits"
            module = nodeid.split("::", 1)[0]
            return "realtime" if Path(module).name in REALTIME_MODULES else module

        def _assign_work_unit(self, node: object) -> None:
            if not self.assigned_work[node]:  # a worker's first unit: the realtime unit, then the long waits
                if "realtime" in self.workqueue:
                    self.workqueue.move_to_end("realtime", last=False)  # (however many tests other modules hold)
                elif "long waits" in self.workqueue:
                    self.workqueue.move_to_end("long waits", last=False)  # the realtime worker has its unit
            super()._assign_work_unit(node)

        def _reschedule(self, node: object) -> None:
            if "long waits" in self.assigned_work[node]:
                if not node.shutting_down:
                    node.shutdown()  # its worker takes nothing else: it runs what it has, then leaves
                return
            super()._reschedule(node)

    return RealtimeTogether(config, log)


# -- the agent ---------------------------------------------------------------------------
@dataclass
class AgentProcess:
    port: int
    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> str:
        status, body = http_get(self.url + "/metrics")
        assert status == 200
        return body.decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> tuple[int, float]:
        """Signal the agent; return its exit code and how long it took to exit."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, time.monotonic() - t0

    def logs(self) -> str:
        return self.log.read_text()


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    """Start ``otel-dra run`` as a user would (the installed CLI, its own process)."""
    started: list[AgentProcess] = []

    def start(
        *args: str,
        env: dict[str, str] | None = None,
        port: int | None = None,
        wait: bool = True,
        pick_source: bool = False,
    ) -> AgentProcess:
        """``pick_source``: leave ``--source`` to the agent (``auto``); otherwise the simulated fleet,
        whatever hardware the machine running the tests has."""
        port = port or free_port()
        log = tmp_path / f"agent-{len(started)}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        full_env.update(env or {})
        argv = [sys.executable, "-m", "otel_dra", "run", "--prometheus-host", "127.0.0.1", *args]
        if not pick_source and "--source" not in args:
            argv += ["--source", "simulated"]
        if "OTEL_EXPORTER_PROMETHEUS_PORT" not in full_env:
            argv += ["--prometheus-port", str(port)]
        else:
            port = int(full_env["OTEL_EXPORTER_PROMETHEUS_PORT"])
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
        agent = AgentProcess(port, proc, log)
        started.append(agent)
        if wait:
            wait_for(lambda: http_get(agent.url + "/healthz", 1)[0] == 200 or proc.poll() is not None, 30, "agent")
            assert proc.poll() is None, f"agent exited early:\n{agent.logs()}"
        return agent

    yield start
    for agent in started:
        agent.stop(signal.SIGKILL)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for unix sockets: their paths are limited to 107 bytes, and pytest's
    tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="od-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- the fleet ---------------------------------------------------------------------------
@dataclass
class FleetProcess:
    ports: dict[str, int]  # grpc, http, prom
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prom']}"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def spawn_fleet(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, name: str = "fleet", nofile: int | None = None
) -> FleetProcess:
    """``otel-dra fleet`` as a user runs it, on free loopback ports, 1 s sampling and evaluation; healthy.
    ``name``: its log is ``<name>.log`` (several fleets in one test). ``nofile``: its open-files limit
    (``ulimit -n``), soft and hard."""
    ports = {"grpc": free_port(), "http": free_port(), "prom": free_port()}
    log = tmp_path / f"{name}.log"
    argv = [sys.executable, "-m", "otel_dra", "fleet", "--host", "127.0.0.1", "--otlp-grpc-port", str(ports["grpc"])]
    argv += ["--otlp-http-port", str(ports["http"]), "--prometheus-port", str(ports["prom"])]
    argv += ["--sample-interval", "1", "--evaluate-every", "1", *args]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    clean["XDG_STATE_HOME"] = str(tmp_path / f"{name}-state")  # its own memory (a module's fleet too)
    limit = None if nofile is None else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**clean, **(env or {})}, preexec_fn=limit
        )
    fleet = FleetProcess(ports, proc, log)
    wait_for(lambda: http_get(fleet.url + "/healthz", 1)[0] == 200 or proc.poll() is not None, 30, "the fleet")
    assert proc.poll() is None, log.read_text()
    return fleet


# -- the fleet's OTLP receiver, in process ------------------------------------------------
class Inbox:
    """``on_frames``: what the receiver handed on, per call."""

    def __init__(self) -> None:
        self.calls: list[list[Frame]] = []
        self.lock = threading.Lock()

    def __call__(self, frames: list[Frame]) -> None:
        with self.lock:
            self.calls.append(frames)

    def frames(self, node: str | None = None) -> list[Frame]:
        with self.lock:
            return [f for call in self.calls for f in call if node is None or f.devices.node == node]


@pytest.fixture
def start_receiver() -> Iterator:
    running: list[OtlpReceiver] = []

    def start(**kwargs) -> tuple[OtlpReceiver, Inbox]:
        inbox = Inbox()
        receiver = OtlpReceiver(
            kwargs.pop("schema", Schema()),
            kwargs.pop("on_frames", inbox),
            grpc_endpoint=kwargs.pop("grpc_endpoint", "127.0.0.1:0"),
            http_endpoint=kwargs.pop("http_endpoint", "127.0.0.1:0"),
            **kwargs,
        )
        receiver.start()
        running.append(receiver)
        return receiver, inbox

    yield start
    for receiver in running:
        receiver.shutdown(0.5)


# -- Prometheus --------------------------------------------------------------------------
def ensure_binary(name: str, debian_package: str) -> str:
    """The binary's path, installing the Debian package when it is missing and we may."""
    path = shutil.which(name)
    if path:
        return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        # One install at a time across xdist workers (dpkg's own lock would fail the second one).
        with open(Path(tempfile.gettempdir()) / "otel-dra-tests-apt.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = shutil.which(name)
            if not path:
                env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
                install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", debian_package]
                if subprocess.run(install, env=env, capture_output=True).returncode != 0:
                    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
                    subprocess.run(install, env=env, capture_output=True, check=False)
                path = shutil.which(name)
    if not path:
        pytest.fail(
            f"{name} is needed by this test: install Debian's '{debian_package}' package (apt-get install "
            f"{debian_package}) or put {name} on PATH"
        )
    return path


@dataclass
class PrometheusServer:
    url: str
    proc: subprocess.Popen

    def query(self, promql: str) -> list[dict]:
        q = urllib.parse.urlencode({"query": promql})
        status, body = http_get(f"{self.url}/api/v1/query?{q}")
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", data
        return data["data"]["result"]


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[[list[str]], PrometheusServer]]:
    binary = ensure_binary("prometheus", "prometheus")
    servers: list[PrometheusServer] = []

    def start(targets: list[str]) -> PrometheusServer:
        port = free_port()
        work = tmp_path / f"prometheus-{len(servers)}"
        work.mkdir()
        config = work / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: otel-dra\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
        )
        log = (work / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        server = PrometheusServer(f"http://127.0.0.1:{port}", proc)
        servers.append(server)
        wait_for(lambda: http_get(server.url + "/-/ready", 1)[0] == 200, 60, "Prometheus to be ready")
        return server

    yield start
    for server in servers:
        server.proc.terminate()
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            server.proc.kill()


# -- an OpenTelemetry collector (rotel) ---------------------------------------------------
@dataclass
class CollectorPoint:
    resource: dict[str, str]
    metric: str
    unit: str
    data_type: str
    monotonic: bool | None
    attrs: dict[str, str]
    value: float
    time_unix_nano: int = 0


def parse_rotel_debug(text: str) -> list[CollectorPoint]:
    """Parse rotel's ``--debug-log metrics --debug-log-verbosity detailed`` output
    (the Collector debug exporter's layout) into points."""
    points: list[CollectorPoint] = []
    resource: dict[str, str] = {}
    metric = unit = data_type = ""
    monotonic: bool | None = None
    attrs: dict[str, str] = {}
    section = ""
    stamp = 0
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("ResourceMetrics #"):
            resource, section = {}, "resource"
        elif line == "Resource attributes:":
            section = "resource"
        elif line.startswith("Metric #"):
            section, monotonic = "descriptor", None
        elif line.startswith("NumberDataPoints #"):
            attrs, section, stamp = {}, "point", 0
        elif line.startswith("Timestamp: ") and section == "point":
            stamp = int(line[11:])
        elif line.startswith("-> "):
            key, _, val = line[3:].partition(": ")
            if section == "descriptor":
                if key == "Name":
                    metric = val
                elif key == "Unit":
                    unit = val
                elif key == "DataType":
                    data_type = val
                elif key == "IsMonotonic":
                    monotonic = val == "true"
            else:
                inner = val[val.index("(") + 1 : -1] if "(" in val and val.endswith(")") else val
                (resource if section == "resource" else attrs)[key] = inner
        elif line.startswith("Value: ") and section == "point":
            points.append(
                CollectorPoint(dict(resource), metric, unit, data_type, monotonic, dict(attrs), float(line[7:]), stamp)
            )
    return points


@dataclass
class Collector:
    grpc_endpoint: str
    http_endpoint: str
    proc: subprocess.Popen
    out: Path

    def points(self) -> list[CollectorPoint]:
        return parse_rotel_debug(self.out.read_text(errors="replace"))


def rotel_binary() -> str:
    try:
        import rotel
    except ImportError:
        pytest.fail("rotel is needed by this test: pip install -e '.[test]'")
    path = Path(rotel.__file__).parent / "rotel-agent"
    assert path.exists(), f"rotel's collector binary is missing at {path}"
    return str(path)


#: rotel as a test sink: drops what it receives, prints every point (parse_rotel_debug reads it).
DEBUG_SINK = ("--exporter", "blackhole", "--debug-log", "metrics", "--debug-log-verbosity", "detailed")


def spawn_rotel(
    tmp_path: Path, tag: str, exporter_args: tuple[str, ...] = DEBUG_SINK, grpc_port: int | None = None
) -> Collector:
    """A rotel collector on loopback (``grpc_port``, or a free one), started and ready."""
    grpc_port, http_port = grpc_port or free_port(), free_port()
    out = tmp_path / f"rotel-{tag}.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [
                rotel_binary(),
                "start",
                *exporter_args,
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{grpc_port}",
                "--otlp-http-endpoint",
                f"127.0.0.1:{http_port}",
                "--log-file",
                str(tmp_path / f"rotel-{tag}.log"),
                "--pid-file",
                str(tmp_path / f"rotel-{tag}.pid"),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},
        )
    collector = Collector(f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}", proc, out)
    wait_for(lambda: "Starting Rotel" in out.read_text(errors="replace"), 20, "rotel to start")
    return collector


def stop_rotel(collector: Collector) -> None:
    collector.proc.terminate()
    try:
        collector.proc.wait(10)
    except subprocess.TimeoutExpired:
        collector.proc.kill()


@pytest.fixture
def start_collector(tmp_path: Path) -> Iterator[Callable[[], Collector]]:
    running: list[Collector] = []

    def start() -> Collector:
        collector = spawn_rotel(tmp_path, str(len(running)))
        running.append(collector)
        return collector

    yield start
    for collector in running:
        stop_rotel(collector)
