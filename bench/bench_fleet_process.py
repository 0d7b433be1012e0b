"""Benchmark of what users run: a real ``otel-dra fleet`` process, pushed to from other processes, its CPU and
memory read from ``/proc`` (issue #32).

Run ``.venv/bin/python bench/bench_fleet_process.py [--nodes 1000] [--devices 8] [--rounds 8] [--interval 10]``;
the figures go to the terminal and to ``BENCHMARKS.md`` (the section between the ``bench_fleet_process`` markers).

The requests are what agents send (``bench_receiver.agent_requests``: each node's own agent pipeline on the
OpenTelemetry SDK, serialized as its OTLP exporter does), stamped from the start of the run. Two shapes:

- **direct**: every node pushes its own request once per interval over a keep-alive OTLP/HTTP connection, as
  the SDK exporter does (``--lanes`` connections, each node on one, spread over the interval);
- **collector**: the same requests go to a real collector (``rotel``, the one the suite runs), which batches
  them (``--batch-timeout``) and exports them to the fleet over OTLP/HTTP, gzip (the exporter's default), as
  ``collector-config.yaml`` describes for otelcol;
- **collector-grpc**: the same, the collector exporting OTLP/gRPC (gzip) to the fleet's gRPC port.

The collector's batches: otelcol's batch processor as ``collector-config.yaml`` sets it sends a batch once it
holds ``send_batch_size`` (8,192) points, whole requests (its ``send_batch_max_size`` is 0: no split), some 24
nodes of 8 GPUs. rotel sends at ``--batch-max-size`` and splits the node that crosses it, and the split it
makes (rotel 0.0.1a15) leaves that node's metrics without their resource, which the fleet rightly refuses (no
``k8s.node.name``): one node in each batch lost. So the collector here batches by time, ``--batch-timeout``
200 ms at 1,000 nodes every 10 s (about 22 nodes a batch, otelcol's size), and its size cap is set past any
batch (:data:`ROTEL_BATCH_MAX`): nothing is split.

Measured from outside, over the rounds after ``--warmup`` (held until the warmup rounds are answered and the fleet
has gone quiet: its first sight of the nodes is reported apart): the fleet's CPU seconds (``/proc/<pid>/stat``,
user + system, every thread) per point pushed, and its RSS (``/proc/<pid>/status``) before the first push and at
the end, per device. The baseline in the same run: the collector itself forwarding the same traffic to a sink
(rotel's ``blackhole`` exporter), its own CPU per point: the fleet's whole cost in units of what a collector costs
to carry the same data. A benchmark, not a test: nothing is asserted.

``--profile``: the fleet sampled by ``py-spy`` (``pip install -e '.[bench]'``) over the measured rounds of each
shape, its active samples split by stage (request handling, decode, ingest, evaluation, the metrics exposition
and the SDK, the rest) and its busiest functions listed: the profile chooses the next step.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402
from bench.bench_http import framed, read_response  # noqa: E402
from bench.bench_receiver import agent_requests, count_points  # noqa: E402

START, END = "<!-- bench_fleet_process:start -->", "<!-- bench_fleet_process:end -->"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: The shapes with a collector in front of the fleet, by the protocol it exports to the fleet with.
COLLECTOR_SHAPES = ("collector", "collector-grpc")
#: Issue #32's targets, points per CPU-second of the fleet (the gRPC variant has none: the config uses HTTP).
TARGETS = {"direct": 500_000, "collector": 1_000_000}
#: rotel's batch size cap, past any batch of the run: a batch it splits loses a node's resource (see above).
ROTEL_BATCH_MAX = 1_000_000
IN_PROCESS = (
    "In-process figures elsewhere in this file (`bench_receiver.py`: decode, `ingest_many` and `evaluate` timed in "
    "one process; `bench_memory.py`: the arrays' bytes) measure those functions, not this process; the figures here "
    "are the process's own."
)


# -- the agents' requests ---------------------------------------------------------------------------------------
def _node(args: tuple[int, int, int, int]) -> list[bytes]:
    index, devices, rounds, start_ns = args
    import bench.bench_receiver as br

    br.T0 = start_ns  # (the agents' clock: now, not the receiver bench's fixed epoch)
    return agent_requests(f"node-{index:04d}", devices, rounds, seed=index)


def make_rounds(nodes: int, devices: int, rounds: int, start_ns: int) -> list[list[bytes]]:
    with ProcessPoolExecutor() as pool:
        per_node = list(pool.map(_node, [(i, devices, rounds, start_ns) for i in range(nodes)], chunksize=16))
    return [[reqs[k] for reqs in per_node] for k in range(rounds)]


# -- the processes ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system, all threads, and its children's once reaped: the copies a
    large fleet forks to render /metrics on two cores), read from outside."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout_s:g}s")


@dataclass
class Fleet:
    proc: subprocess.Popen[bytes]
    http: int
    grpc: int
    prom: int


def spawn_fleet(workdir: Path, interval: float) -> Fleet:
    http, grpc, prom = free_port(), free_port(), free_port()
    argv = [sys.executable, "-m", "otel_dra", "fleet", "--host", "127.0.0.1", "--otlp-http-port", str(http)]
    argv += ["--otlp-grpc-port", str(grpc), "--prometheus-port", str(prom), "--sample-interval", f"{interval:g}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["XDG_STATE_HOME"] = str(workdir / "state")
    with (workdir / "fleet.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    fleet = Fleet(proc, http, grpc, prom)
    wait_port(prom, proc, "the fleet")
    wait_port(http, proc, "the fleet's OTLP/HTTP receiver")
    return fleet


def spawn_rotel(workdir: Path, tag: str, exporter: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    import rotel

    binary = Path(rotel.__file__).parent / "rotel-agent"
    http, grpc = free_port(), free_port()
    argv = [str(binary), "start", *exporter, "--otlp-grpc-endpoint", f"127.0.0.1:{grpc}"]
    argv += ["--otlp-http-endpoint", f"127.0.0.1:{http}", "--log-file", str(workdir / f"rotel-{tag}.log")]
    argv += ["--pid-file", str(workdir / f"rotel-{tag}.pid")]
    with (workdir / f"rotel-{tag}.out").open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
    wait_port(http, proc, f"rotel ({tag})")
    return proc, http


def batching(timeout: str) -> list[str]:
    """rotel's batch settings: by time, never split (see the module's docstring)."""
    return ["--batch-timeout", timeout, "--batch-max-size", str(ROTEL_BATCH_MAX)]


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the push ----------------------------------------------------------------------------------------------------
def push(
    port: int,
    rounds: list[list[bytes]],
    interval: float,
    lanes: int,
    each_round: list[float],
    warmup: int,
    settle: Callable[[], object],
) -> list[str]:
    """Every round's requests, node by node spread over ``interval`` seconds, on ``lanes`` keep-alive
    connections; ``each_round`` gets each round's start (monotonic) before it is sent. The lanes stop after the
    first ``warmup`` rounds until every one of them is answered and ``settle()`` returns (the receiver has drained
    what they left it), and the measured rounds start then, on the same schedule. Returns the errors."""
    errors: list[str] = []
    nodes = len(rounds[0])
    start = time.monotonic() + 0.5
    resume = [start + warmup * interval]  # when the round ``warmup`` starts (moved by the settling)

    def settled() -> None:
        settle()
        resume[0] = max(resume[0], time.monotonic() + 0.2)

    gate = threading.Barrier(lanes + 1, action=settled) if warmup else None

    def begins(r: int) -> float:
        return start + r * interval if r < warmup else resume[0] + (r - warmup) * interval

    def lane(k: int) -> None:
        mine = list(range(k, nodes, lanes))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            buf = bytearray()
            for r, requests in enumerate(rounds):
                if r == warmup and gate is not None:
                    gate.wait()
                for j, node in enumerate(mine):
                    due = begins(r) + interval * 0.9 * (j / max(1, len(mine)))
                    time.sleep(max(0.0, due - time.monotonic()))
                    sock.sendall(framed(requests[node]))
                    status = read_response(sock, buf)
                    if status != 200 and len(errors) < 20:
                        errors.append(f"HTTP {status}")

    def clock() -> None:
        for r in range(len(rounds)):
            if r == warmup and gate is not None:
                gate.wait()
            time.sleep(max(0.0, begins(r) - time.monotonic()))
            each_round.append(time.monotonic())

    threads = [threading.Thread(target=lane, args=(k,)) for k in range(lanes)]
    threads.append(threading.Thread(target=clock))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def settler(pid: int, window_s: float = 1.0, busy: float = 0.25, timeout_s: float = 600.0) -> Callable[[], float]:
    """A wait until process ``pid`` is quiet (under ``busy`` of a core over ``window_s``): it has drained what it
    was sent. Returns the seconds it waited. Without it, a slow machine's first sight of 1,000 nodes (each node's
    first request read the plain way and its template built: ~30 CPU-seconds on a 2 GHz EPYC) ran on into the
    measured rounds and was counted as their cost."""

    def wait() -> float:
        began = time.monotonic()
        last = cpu_s(pid)
        while time.monotonic() - began < timeout_s:
            time.sleep(window_s)
            now = cpu_s(pid)
            if now - last < busy * window_s:
                break
            last = now
        return time.monotonic() - began

    return wait


# -- the profile -------------------------------------------------------------------------------------------------
#: Stages of the fleet's work, by what a sampled stack holds (the first that matches, in this order).
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("evaluation", ("evaluate (otel_dra/classifier",)),
    ("ingest", ("ingest_many (otel_dra/classifier",)),
    ("decode", ("otel_dra/decode/",)),
    ("metrics exposition and SDK", ("sinks/exposition", "verdict_text", "prometheus_client", "opentelemetry/")),
    ("request handling (HTTP, gRPC)", ("otel_dra/serve/", "otel_dra/receivers/", "grpc/", "asyncio/", "socket")),
)


def profile_summary(raw: Path) -> list[str]:
    """py-spy's collapsed stacks as stage shares and the functions with the most own samples."""
    stages: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        stage = next((name for name, marks in STAGES if any(m in stack for m in marks)), "other")
        stages[stage] = stages.get(stage, 0) + n
        leaf = stack.rsplit(";", 1)[-1]
        own[leaf] = own.get(leaf, 0) + n
    if not total:
        return ["(no samples)"]
    out = [f"{total:,} active samples: " + ", ".join(
        f"{name} {100 * n / total:.0f}%" for name, n in sorted(stages.items(), key=lambda kv: -kv[1]))]  # fmt: skip
    out += [f"  {100 * n / total:4.1f}%  {name}" for name, n in sorted(own.items(), key=lambda kv: -kv[1])[:12]]
    return out


def record(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` for ``seconds`` into ``out`` (collapsed stacks), started now."""
    argv = [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-d", str(max(1, round(seconds)))]
    argv += ["-r", "100", "-f", "raw", "-o", str(out), "--nonblocking"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def push_measured(
    port: int,
    rounds: list[list[bytes]],
    interval: float,
    lanes: int,
    warmup: int,
    measured_from: Callable[[], None],
    settle: Callable[[], object],
) -> list[str]:
    """:func:`push`, the measured rounds held until the ``warmup`` rounds are answered and ``settle()`` returns,
    calling ``measured_from`` as the first measured round starts (the CPU readings of the measured rounds begin
    there), then waiting an interval for the last round's requests to be handled (and a collector's batches
    delivered). Returns the errors."""
    starts: list[float] = []

    def watch() -> None:
        while len(starts) <= warmup and not done.is_set():
            time.sleep(0.01)
        if len(starts) > warmup:
            measured_from()

    done = threading.Event()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        errors = push(port, rounds, interval, lanes, starts, warmup, settle)
    finally:
        done.set()
        watcher.join()
    time.sleep(interval)
    return errors


@dataclass
class Measured:
    shape: str
    points: int
    fleet_cpu_s: float
    collector_cpu_s: float | None
    rss_before_mb: float
    rss_after_mb: float
    wall_s: float
    errors: list[str]
    learn_cpu_s: float  # the fleet's CPU over the warmup rounds, to settled (first sight of every node)
    settle_s: float  # how long after the warmup's last answer it took to go quiet
    profile: list[str] | None = None

    @property
    def points_per_cpu_s(self) -> float:
        return self.points / self.fleet_cpu_s if self.fleet_cpu_s > 0 else float("inf")


def measure(
    shape: str,
    workdir: Path,
    rounds: list[list[bytes]],
    points: list[int],
    interval: float,
    lanes: int,
    warmup: int,
    batch_timeout: str,
    profile: bool = False,
) -> Measured:
    """One shape: a fresh fleet (and, for the collector shape, a rotel in front of it), the rounds pushed,
    the CPU of the rounds after ``warmup`` (sampled at their starts, and one interval after the last)."""
    fleet = spawn_fleet(workdir, interval)
    collector = None
    try:
        if shape in COLLECTOR_SHAPES:
            protocol, fleet_port = ("grpc", fleet.grpc) if shape == "collector-grpc" else ("http", fleet.http)
            exporter = ["--exporter", "otlp", "--otlp-exporter-endpoint", f"http://127.0.0.1:{fleet_port}"]
            exporter += ["--otlp-exporter-protocol", protocol, *batching(batch_timeout)]
            collector, port = spawn_rotel(workdir, "forward", exporter)
        else:
            port = fleet.http
        time.sleep(2.0)  # (settled: imports done, first ticks run)
        rss_before = rss_mb(fleet.proc.pid)
        marks: list[tuple[float, float | None]] = []
        raw = workdir / f"profile-{shape}.txt"
        spy: list[subprocess.Popen[bytes]] = []

        def measured_from() -> None:
            marks.append((cpu_s(fleet.proc.pid), cpu_s(collector.pid) if collector else None))
            if profile:
                spy.append(record(fleet.proc.pid, (len(rounds) - warmup) * interval, raw))

        quiet = settler(fleet.proc.pid)
        learned: list[tuple[float, float]] = []  # (seconds it took to go quiet, the fleet's CPU then)

        def settle() -> None:
            learned.append((quiet(), cpu_s(fleet.proc.pid)))

        t0, cpu0 = time.monotonic(), cpu_s(fleet.proc.pid)
        errors = push_measured(port, rounds, interval, lanes, warmup, measured_from, settle)
        end = (cpu_s(fleet.proc.pid), cpu_s(collector.pid) if collector else None)
        wall = time.monotonic() - t0
        rss_after = rss_mb(fleet.proc.pid)
        (f0, c0) = marks[0]
        fleet_cpu = end[0] - f0
        coll_cpu = end[1] - c0 if end[1] is not None and c0 is not None else None
        summary = None
        if spy:
            spy[0].wait(60)
            summary = profile_summary(raw) if raw.exists() else ["(py-spy wrote nothing: is it installed?)"]
        settle_s, learn_cpu = (learned[0][0], learned[0][1] - cpu0) if learned else (0.0, 0.0)
        return Measured(
            shape,
            sum(points[warmup:]),
            fleet_cpu,
            coll_cpu,
            rss_before,
            rss_after,
            wall,
            errors,
            learn_cpu,
            settle_s,
            summary,
        )
    finally:
        if collector is not None:
            stop(collector)
        stop(fleet.proc)


def baseline(workdir: Path, rounds: list[list[bytes]], points: list[int], interval: float, lanes: int, warmup: int,
             batch_timeout: str) -> float:  # fmt: skip
    """The collector alone: rotel receiving the same pushes and exporting to its blackhole; its CPU seconds over
    the measured rounds."""
    proc, port = spawn_rotel(workdir, "sink", ["--exporter", "blackhole", *batching(batch_timeout)])
    try:
        marks: list[float] = []
        errors = push_measured(
            port, rounds, interval, lanes, warmup, lambda: marks.append(cpu_s(proc.pid)), settler(proc.pid)
        )
        if errors:
            raise RuntimeError(f"the collector refused requests: {errors[:3]}")
        return cpu_s(proc.pid) - marks[0]
    finally:
        stop(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2, help="rounds before the measured ones")
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--lanes", type=int, default=16, help="keep-alive connections the pushes share")
    ap.add_argument("--batch-timeout", default="200ms", help="the collector's batch timeout (see the docstring)")
    ap.add_argument("--shapes", default="direct,collector,collector-grpc")
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    ap.add_argument("--profile", action="store_true", help="sample the fleet with py-spy over the measured rounds")
    ap.add_argument("--workdir", type=Path, help="keep the logs and profiles here (default: a temporary folder)")
    args = ap.parse_args()
    started = time.monotonic()
    print(f"building {args.rounds} rounds of {args.nodes} agents' requests ...", flush=True)
    rounds = make_rounds(args.nodes, args.devices, args.rounds, time.time_ns())
    points = [count_points(r) for r in rounds]
    shapes = [s for s in args.shapes.split(",") if s]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-process-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for shape in shapes:
            print(f"{shape}: pushing for {args.rounds * args.interval:g}s ...", flush=True)
            results.append(measure(shape, workdir, rounds, points, args.interval, args.lanes, args.warmup,
                                   args.batch_timeout, args.profile))  # fmt: skip
            print(f"  {results[-1]}", flush=True)
        print("baseline: the collector alone ...", flush=True)
        collector_alone = baseline(workdir, rounds, points, args.interval, args.lanes, args.warmup,
                                   args.batch_timeout)  # fmt: skip
    measured = sum(points[args.warmup :])
    devices = args.nodes * args.devices
    lines = [
        START,
        "## The fleet as users run it: a real process, pushed to (bench/bench_fleet_process.py)",
        "",
        f"Measured {dt.date.today().isoformat()} on {_report.cpu_model()} ({os.cpu_count()} CPUs), "
        f"{time.monotonic() - started:.0f} s in all. {args.nodes} nodes x {args.devices} GPUs, one OTLP/HTTP "
        f"protobuf request per node every {args.interval:g} s (the agents' own SDK pipeline, serialized as its "
        f"exporter does), {args.rounds} rounds, the last {args.rounds - args.warmup} measured ({measured:,} "
        f"points). CPU and RSS of each process read from /proc; the fleet's windows hold {args.rounds} of their "
        f"30 samples at the end (RSS growth here is not the full windows' figure: `bench_fleet_scale` measures "
        f"that).",
        "",
        "| shape | fleet points per CPU-second | target | fleet CPU | collector CPU | fleet RSS growth per device "
        "| errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in results:
        coll = f"{m.collector_cpu_s:.2f} s" if m.collector_cpu_s is not None else "-"
        growth = (m.rss_after_mb - m.rss_before_mb) * 1024 / devices
        target = TARGETS.get(m.shape)
        verdict = "-" if target is None else f">= {target:,} " + ("✅" if m.points_per_cpu_s >= target else "❌")
        lines.append(
            f"| {m.shape} | {m.points_per_cpu_s:,.0f} | {verdict} | {m.fleet_cpu_s:.2f} s | {coll} | "
            f"{growth:.1f} kB | {len(m.errors)} |"
        )
    per_point = collector_alone / measured if measured else float("nan")
    lines += ["", f"First sight, not in the figures above: the {args.warmup} warmup round(s) (each node's first "
              "request read the plain way and its template built) and the fleet's work until it was quiet again; "
              "the measured rounds were held until then, on the same schedule."]  # fmt: skip
    lines += [f"- {m.shape}: {m.learn_cpu_s:.1f} CPU-seconds; quiet {m.settle_s:.0f} s after the warmup's last answer."
              for m in results]  # fmt: skip
    lines += [
        "",
        f"Baseline, same run: rotel alone receiving the same pushes and dropping them (`--exporter blackhole`): "
        f"{collector_alone:.2f} CPU-seconds, {measured / collector_alone:,.0f} points per CPU-second "
        f"({per_point * 1e6:.2f} µs a point).",
    ]
    for m in results:
        lines.append(
            f"- {m.shape}: the fleet's whole cost is {m.fleet_cpu_s / collector_alone:.1f}x the collector's own "
            "for the same traffic."
        )
    for m in results:
        if m.profile:
            title = f"Where the fleet's CPU goes ({m.shape}, py-spy, active samples):"
            lines += ["", title, "", "```", *m.profile, "```"]
    lines += ["", IN_PROCESS]
    lines += ["", f"Reproduce: `.venv/bin/python bench/bench_fleet_process.py --nodes {args.nodes}`.", END, ""]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        _report.write_section(START, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
