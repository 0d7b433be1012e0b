"""Benchmark of the fleet at scale as users run it: a real ``otel-dra fleet`` process, its memory with full
windows, its idle CPU and the time a scrape of its verdict series takes, read from outside (issue #32).

Run ``flock /tmp/bench.lock .venv/bin/python bench/bench_fleet_scale.py [--devices-list 8000,100000]
[--idle-devices 10000] [--scrape-devices 100000]`` (about 15 minutes on 2 cores, most of it pushing 100,000
devices' full windows); the figures go to the terminal and to ``BENCHMARKS.md`` (the section between the
``bench_fleet_scale`` markers).

The input: one agent's requests (its own SDK pipeline, 8 GPUs named by UUIDs, serialized as its OTLP exporter
does: ``bench_memory.agent_requests``), one per round, stamped 10 s apart and ending a few seconds before the run
starts. Every node's request of a round is that one with its node name, GPU UUIDs and serial numbers rewritten in
place (``bench_memory.Cloner``: fixed width, one numpy write), so nodes and devices are distinct and each
series' time advances by the sampling interval. The rounds are pushed back to back over OTLP/HTTP (``--lanes``
keep-alive connections, each node on one, in time order; a 503 is retried as the exporter does), faster than
real time: the fleet takes points stamped in the past (only a point behind its own series is refused) and judges
freshness by when a device was heard. ``window + 2`` rounds fill every device's window (30 samples of 10 s).

- **Memory** (each of ``--devices-list``): a fresh fleet, warmed by one extra node (its code loaded, a tick
  run), its RSS (``/proc/<pid>/status``) read then and again two ticks after the last round; the growth per
  device, less the arrays a device needs by design (the window store's and the horizon's, as
  ``bench_memory.window_arrays`` counts them, per device). A fleet of up to ``SMALL_FLEET`` devices is measured
  ``--repeats`` times (a fresh fleet each) and judged by the median: how many rows its devices end up in depends on
  how the pushes fall across its ticks (they grow to fit each tick's newcomers, and by an eighth more, at most
  ``registry.GROW_ROWS`` more below ``registry.EIGHTH_FROM`` rows), and at 8,000 devices the rows past them
  moved a reading by up to a kilobyte a device between runs (when they grew by an eighth). No scrape comes
  before the reading: the exposition renders nothing for nobody. Where the growth went: a probe loaded in the
  fleet (``sitecustomize``, answering SIGUSR1/SIGUSR2 only, signalled after each reading) tells glibc's
  ``mallinfo2`` (in use, free held, mmapped), the arrays on pages of their own (``registry.zeroed``, not malloc's),
  the classifier's rows (its capacity) and what ``gc.collect()`` +
  ``malloc_trim(0)`` give back; ``/proc/<pid>/smaps`` splits RSS by mapping (main heap, thread arenas, other
  anonymous, files); and a smaller fleet under ``tracemalloc`` (``--trace-devices``) names the lines that
  allocated it.
- **Idle** (``--idle-devices``): a fresh fleet fed full windows, then nothing: nobody pushes, nobody scrapes.
  Its CPU over ``--idle-seconds`` after the last round was ingested, per thread (``/proc/<pid>/task``): the main
  thread runs the evaluation ticks (every 5 s, every device judged), the others serve, render and write state.
- **Scrape** (``--scrape-devices``): ``GET /metrics`` on the fleet's ``--prometheus-port`` with gzip, as
  Prometheus asks: the first scrape (nobody scraped before: the rendering is made for it), an immediate repeat
  (the rendering cached), one after two ticks (re-rendered in the background while scraped), one without gzip.

The in-process figure beside the process's own: ``bench_memory.py``'s fleet child (decoder, ``Fleet.tick`` and
the exposition in one process, no sockets, 8 rounds) run in this same run at ``--in-process-devices``.
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import http.client
import json
import os
import pickle
import re
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402
from bench import bench_memory as bm  # noqa: E402
from bench import bench_receiver as br  # noqa: E402
from bench.bench_fleet_process import (  # noqa: E402
    CLOCK_TICKS,
    Fleet,
    cpu_s,
    profile_summary,
    record,
    rss_mb,
    spawn_fleet,
    stop,
)
from bench.bench_http import framed, read_response  # noqa: E402
from otel_dra.classifier.registry import EIGHTH_FROM, GROW_ROWS  # noqa: E402

kb = _report.kb

START, END = "<!-- bench_fleet_scale:start -->", "<!-- bench_fleet_scale:end -->"
TITLE = "## The fleet at scale: memory, idle CPU and scrape time of the real process (bench/bench_fleet_scale.py)"
TARGET_BYTES = 5_000  # per device, beyond the arrays it needs
#: Fleets up to this many devices are measured ``--repeats`` times (under a minute each), larger ones once.
SMALL_FLEET = 20_000
TARGET_IDLE = 0.02  # of one core
TARGET_SCRAPE_S = 1.0
INTERVAL_S = 10.0  # the agents' push interval, the fleet's --sample-interval (its default)
EVALUATE_EVERY_S = 5.0  # the fleet's default --evaluate-every
TRACE_FRAMES = 4  # frames tracemalloc keeps per allocation (a generic helper's callers named)
WARM_NODE = 99_999  # the node that warms a fresh fleet up (its 8 devices count in no figure)
PAPER_T0 = br.T0  # the receiver bench's fixed epoch: bench_memory's children stamp their clock from it


# -- the traffic --------------------------------------------------------------------------------------------------
@dataclass
class Traffic:
    """One round's request per :class:`bench_memory.Cloner`; ``points``: one node's points in each round."""

    cloners: list[bm.Cloner]
    points: list[int]


def build_traffic(rounds: int, end_ns: int) -> Traffic:
    """``rounds`` of node-00000's requests 10 s apart, the last stamped at ``end_ns``."""
    br.T0 = end_ns - (rounds - 1) * int(INTERVAL_S * 1e9)
    try:
        requests = bm.agent_requests(rounds)
    finally:
        br.T0 = PAPER_T0
    return Traffic([bm.Cloner(r) for r in requests], [br.count_points([r]) for r in requests])


@dataclass
class Pushed:
    requests: int = 0
    points: int = 0
    retries: int = 0
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def push(port: int, traffic: Traffic, nodes: Sequence[int], rounds: Sequence[int], lanes: int) -> Pushed:
    """Every node's request of each round, back to back on ``lanes`` keep-alive connections (each node on one,
    its rounds in order). A 503 or 429 (the fleet's queue is full until its next tick) is retried after a
    pause, a dropped connection reconnected, as the SDK exporter does."""
    lock = threading.Lock()
    out = Pushed()

    def lane(k: int) -> None:
        mine = list(nodes[k::lanes])
        sent = retries = 0
        errors: list[str] = []
        sock = socket.create_connection(("127.0.0.1", port))
        buf = bytearray()
        try:
            for r in rounds:
                cloner = traffic.cloners[r]
                for i in mine:
                    request = framed(cloner.node(i))
                    for _attempt in range(200):
                        try:
                            sock.sendall(request)
                            status = read_response(sock, buf)
                        except OSError:  # (ConnectionError included) the server closed it: a new connection
                            sock.close()
                            sock, buf = socket.create_connection(("127.0.0.1", port)), bytearray()
                            retries += 1
                            continue
                        if status in (429, 503):
                            retries += 1
                            time.sleep(0.5)
                            continue
                        if status != 200:
                            errors.append(f"HTTP {status}")
                        break
                    else:
                        errors.append("gave up after 200 attempts")
                    sent += 1
        finally:
            sock.close()
            with lock:
                out.requests += sent
                out.retries += retries
                out.errors += errors

    t0 = time.monotonic()
    threads = [threading.Thread(target=lane, args=(k,)) for k in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.wall_s = time.monotonic() - t0
    out.points = len(nodes) * sum(traffic.points[r] for r in rounds)
    return out


# -- reading a process from outside ---------------------------------------------------------------------------------
ARENA_ALIGN = 64 << 20  # glibc's thread arenas: heaps of at most 64 MiB, each aligned to it


def smaps(pid: int) -> dict[str, float]:
    """The process's resident MiB by kind of mapping (``/proc/<pid>/smaps``): files (code, libraries), the main
    heap (brk), glibc's thread arenas (anonymous, 64 MiB-aligned) and other anonymous mappings (malloc's large
    chunks, Python's object arenas)."""
    kinds: dict[str, float] = {}
    kind = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            start, end = (int(x, 16) for x in head[0].split("-"))
            name = head[5] if len(head) > 5 else ""
            if name == "[heap]":
                kind = "main heap (brk)"
            elif name.startswith("["):
                kind = "stacks and the rest"
            elif name:
                kind = "files (code, libraries)"
            elif start % ARENA_ALIGN == 0 and end - start <= ARENA_ALIGN:
                kind = "glibc's thread arenas"
            else:  # (adjacent mappings merge into one: their sizes tell nothing apart)
                kind = "other anonymous mappings (malloc's large chunks: arrays, buffers; Python's object arenas)"
        elif head and head[0] == "Rss:":
            kinds[kind] = kinds.get(kind, 0.0) + int(head[1]) / 1024.0
    return kinds


def threads_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each of the process's threads (user + system), by thread id."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # (a thread that ended)
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


# -- a probe inside the fleet: what its allocator holds ---------------------------------------------------------------
#: Loaded by the fleet's interpreter at start-up (``sitecustomize`` on its ``PYTHONPATH``): on SIGUSR1 it writes one
#: JSON line: glibc's ``mallinfo2`` (bytes in use and free in its heaps), VmRSS before and after ``gc.collect()`` and
#: ``malloc_trim(0)``, the device registries' capacity and size, the bytes of arrays on pages of their own, and,
#: when the fleet runs under ``PYTHONTRACEMALLOC``, a ``tracemalloc`` snapshot (dumped to a file). It changes nothing
#: in the fleet until signalled; it is signalled only after the figures are read.
PROBE = r"""
import ctypes, gc, json, os, signal, time, tracemalloc

def _rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

class _Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]

_probes = [0]

def _mapped():
    # Bytes of the numpy arrays on anonymous pages of their own (otel_dra.classifier.registry.zeroed: not
    # malloc's, so not in mallinfo2): every mmap an object's array attribute (or one in a list or tuple of them:
    # the horizon's running totals) is a view of, counted once.
    maps = {}
    for o in gc.get_objects():
        d = getattr(o, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for v in [x for v in d.values() for x in (v if isinstance(v, (list, tuple)) else (v,))]:
            base = v
            while type(base).__name__ in ("ndarray", "memoryview"):  # (numpy's view of a buffer: its memoryview)
                up = base.obj if type(base).__name__ == "memoryview" else base.base
                if up is None:
                    break
                base = up
            if type(base).__name__ == "mmap":
                maps[id(base)] = len(base)
    return sum(maps.values())

def _probe(signum, frame):
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Info
    where = os.environ["BENCH_PROBE_OUT"]
    out = {"rss": _rss()}
    if tracemalloc.is_tracing():
        out["snapshot"] = f"{where}.{_probes[0]}.snap"
        tracemalloc.take_snapshot().dump(out["snapshot"])
    _probes[0] += 1
    info = libc.mallinfo2()
    out["mallinfo"] = {n: getattr(info, n) for n, _ in _Info._fields_}
    out["registries"] = [[o.capacity, len(o)] for o in gc.get_objects() if type(o).__name__ == "DeviceRegistry"]
    out["mapped"] = _mapped()
    if signum != signal.SIGUSR1:  # (a look only: nothing collected, nothing trimmed)
        with open(where, "a") as f:
            f.write(json.dumps(out) + "\n")
        return
    gc.collect()
    out["rss_gc"] = _rss()
    t0 = time.perf_counter()
    libc.malloc_trim(0)
    out["trim_s"] = time.perf_counter() - t0
    out["rss_trim"] = _rss()
    with open(where, "a") as f:
        f.write(json.dumps(out) + "\n")

signal.signal(signal.SIGUSR1, _probe)
signal.signal(signal.SIGUSR2, _probe)
"""


def probed_env(workdir: Path, tracemalloc: bool = False) -> dict[str, str]:
    """Environment for a fleet with the probe: its folder on ``PYTHONPATH`` and where it writes."""
    folder = workdir / "probe"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(PROBE)
    env = {"PYTHONPATH": str(folder), "BENCH_PROBE_OUT": str(workdir / "probe.jsonl")}
    if tracemalloc:
        env["PYTHONTRACEMALLOC"] = str(TRACE_FRAMES)
    return env


def probe(fleet: Fleet, workdir: Path, trim: bool = True, timeout_s: float = 120.0) -> dict[str, Any]:
    """Signal the fleet's probe and wait for its line; ``trim``: collect and trim too (else a look only)."""
    out = workdir / "probe.jsonl"
    seen = len(out.read_text().splitlines()) if out.exists() else 0
    fleet.proc.send_signal(signal.SIGUSR1 if trim else signal.SIGUSR2)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = out.read_text().splitlines() if out.exists() else []
        if len(lines) > seen:
            return dict(json.loads(lines[seen]))
        time.sleep(0.2)
    raise RuntimeError("the fleet's probe did not answer")


# -- the arrays a device needs --------------------------------------------------------------------------------------
def window_bytes_per_device() -> float:
    """Bytes of the window arrays (``bench_memory.window_arrays``: the window store's and the horizon's) per row
    of capacity, as the fleet's classifier makes them (its policy, its sampling interval)."""
    from otel_dra import policy
    from otel_dra.classifier import Classifier
    from otel_dra.frame import Schema

    def total(capacity: int) -> int:
        c = Classifier(policy.load(), Schema(), interval_s=INTERVAL_S, capacity=capacity)
        return sum(a.nbytes for a in bm.window_arrays(c))

    return (total(2000) - total(1000)) / 1000


def window_samples() -> int:
    from otel_dra import policy
    from otel_dra.classifier.window import window_samples as ring

    return ring(policy.load().window_s, INTERVAL_S)


# -- the three measurements ------------------------------------------------------------------------------------------
def settle(s: float = 2 * EVALUATE_EVERY_S + 1) -> None:
    """Two ticks: everything queued is ingested and judged."""
    time.sleep(s)


def spawn_probed(workdir: Path, tracemalloc: bool = False, extra_env: dict[str, str] | None = None) -> Fleet:
    """``bench_fleet_process.spawn_fleet`` (its environment is this one's) with the probe loaded (and
    ``extra_env``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**probed_env(workdir, tracemalloc), **(extra_env or {})}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return spawn_fleet(workdir, INTERVAL_S)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fed_fleet(
    workdir: Path,
    traffic: Traffic,
    devices: int,
    lanes: int,
    tracemalloc: bool = False,
    extra_env: dict[str, str] | None = None,
) -> tuple[Fleet, dict[str, Any]]:
    """A fresh fleet, warmed up, its floor read (and its probe's look), then every round of ``devices / 8`` nodes
    pushed. With ``tracemalloc``, the fleet traces its allocations (the look takes a snapshot)."""
    fleet = spawn_probed(workdir, tracemalloc, extra_env)
    pid = fleet.proc.pid
    rounds = range(len(traffic.cloners))
    push(fleet.http, traffic, [WARM_NODE], rounds[:2], 1)
    settle(EVALUATE_EVERY_S + 1)
    floor: dict[str, Any] = {"rss_mb": rss_mb(pid), "smaps": smaps(pid), "cpu_s": cpu_s(pid)}
    floor["probe"] = probe(fleet, workdir, trim=False)
    nodes = range(devices // bm.PER_NODE)
    pushed = push(fleet.http, traffic, nodes, rounds, lanes)
    floor["push_cpu_s"] = cpu_s(pid) - floor["cpu_s"]
    floor["pushed"] = pushed
    settle()
    return fleet, floor


@dataclass
class Memory:
    devices: int
    floor_mb: float
    after_mb: float
    floor_smaps: dict[str, float]
    after_smaps: dict[str, float]
    pushed: Pushed
    push_cpu_s: float
    window_bytes: float  # per device
    probe: dict[str, Any]  # read after the figures: the allocator's view, RSS after gc.collect() and malloc_trim
    floor_probe: dict[str, Any]  # the allocator's view at the floor (nothing collected or trimmed)

    @property
    def growth(self) -> float:
        """Bytes of RSS growth per device."""
        return (self.after_mb - self.floor_mb) * 2**20 / self.devices

    @property
    def beyond(self) -> float:
        return self.growth - self.window_bytes

    @property
    def capacity(self) -> int:
        """Rows of the fleet's classifier (its registry's capacity)."""
        return _capacity(self.probe)

    @property
    def arrays(self) -> float:
        """Bytes a device of window arrays the fleet added since the floor: its rows grow to fit a tick's
        newcomers, and by an eighth more or a fixed step (the empty fleet's rows are in the floor)."""
        return (self.capacity - _capacity(self.floor_probe)) * self.window_bytes / self.devices

    @property
    def trimmed(self) -> float:
        """Bytes a device ``gc.collect()`` and ``malloc_trim(0)`` gave back to the system."""
        return (self.probe["rss"] - self.probe["rss_trim"]) / self.devices

    @property
    def mapped(self) -> float:
        """Growth of the arrays on pages of their own (``registry.zeroed``, not malloc's), bytes a device."""
        return (self.probe.get("mapped", 0) - self.floor_probe.get("mapped", 0)) / self.devices

    def malloc(self, field: str) -> float:
        """Growth of one of glibc's ``mallinfo2`` figures, bytes a device."""
        return (self.probe["mallinfo"][field] - self.floor_probe["mallinfo"][field]) / self.devices


def _capacity(probed: dict[str, Any]) -> int:
    return int(probed["registries"][0][0]) if probed.get("registries") else 0


def measure_memory(fleet: Fleet, floor: dict[str, Any], devices: int, window_bytes: float, workdir: Path) -> Memory:
    pid = fleet.proc.pid
    rss, kinds = rss_mb(pid), smaps(pid)
    return Memory(devices, floor["rss_mb"], rss, floor["smaps"], kinds, floor["pushed"], floor["push_cpu_s"],
                  window_bytes, probe(fleet, workdir), floor["probe"])  # fmt: skip


@dataclass
class Idle:
    devices: int
    seconds: float
    total_s: float
    ticks_s: float  # the main thread: the evaluation loop
    others_s: float
    rss_mb: float


def measure_idle(fleet: Fleet, seconds: float, devices: int) -> Idle:
    """The fleet's CPU over ``seconds`` with nobody pushing or scraping, the main thread (its ticks) apart."""
    pid = fleet.proc.pid
    before = threads_cpu(pid)
    t0 = time.monotonic()
    time.sleep(seconds)
    after = threads_cpu(pid)
    wall = time.monotonic() - t0
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    ticks = spent.get(pid, 0.0)
    return Idle(devices, wall, sum(spent.values()), ticks, sum(spent.values()) - ticks, rss_mb(pid))


@dataclass
class Scrape:
    what: str
    seconds: float
    first_byte_s: float
    nbytes: int
    gzipped: bool


def scrape(port: int, what: str, accept_gzip: bool = True) -> tuple[Scrape, bytes]:
    """One ``GET /metrics`` on a new connection, timed to its last byte."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    headers = {"Accept-Encoding": "gzip"} if accept_gzip else {}
    t0 = time.perf_counter()
    conn.request("GET", "/metrics", headers=headers)
    response = conn.getresponse()
    first = time.perf_counter() - t0
    body = response.read()
    wall = time.perf_counter() - t0
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"/metrics answered {response.status}")
    gzipped = response.getheader("Content-Encoding") == "gzip"
    return Scrape(what, wall, first, len(body), gzipped), body


@dataclass
class Scrapes:
    devices: int
    scrapes: list[Scrape]
    series: dict[str, int]
    text_bytes: int
    scraped_cpu_s: float  # the fleet's CPU over the two ticks between the repeat and the one after
    scraped_wall_s: float
    rss_before_mb: float
    rss_after_mb: float
    profile: list[str]  # py-spy over the two ticks while scraped


def measure_scrapes(fleet: Fleet, devices: int, workdir: Path) -> Scrapes:
    """The scrapes; between the repeat and the one after two ticks, the fleet's CPU, and where it goes
    (``py-spy``, as ``bench_fleet_process.py --profile`` samples and sums it: the rendering's own work)."""
    pid = fleet.proc.pid
    rss_before = rss_mb(pid)
    first, body = scrape(fleet.prom, "first (nobody scraped before: rendered for it)")
    repeat, _ = scrape(fleet.prom, "repeated at once (the cached rendering)")
    c0, t0 = cpu_s(pid), time.monotonic()
    raw = workdir / "profile-scraped.txt"
    spy = record(pid, 2 * EVALUATE_EVERY_S, raw)
    settle()
    scraped_cpu, scraped_wall = cpu_s(pid) - c0, time.monotonic() - t0
    spy.wait(60)
    profile = profile_summary(raw) if raw.exists() else ["(py-spy wrote nothing: is it installed?)"]
    later, _ = scrape(fleet.prom, "after two ticks (re-rendered in the background while scraped)")
    plain, _ = scrape(fleet.prom, "without gzip (a copy decompressed for it)", accept_gzip=False)
    text = gzip.decompress(body) if first.gzipped else body
    series = {name: text.count(b"\n" + name.encode() + b"{") for name in ("hw_status", "dra_device_health")}
    return Scrapes(devices, [first, repeat, later, plain], series, len(text), scraped_cpu, scraped_wall,
                   rss_before, rss_mb(pid), profile)  # fmt: skip


def _helper_lines() -> tuple[str, range]:
    """Where ``registry.grown`` is (file, lines): what it allocates is put down to the store that called it."""
    import inspect

    from otel_dra.classifier import registry

    lines, first = inspect.getsourcelines(registry.grown)
    return Path(inspect.getfile(registry)).resolve().relative_to(ROOT).as_posix(), range(first, first + len(lines))


def traced_growth(floor: Path, after: Path, devices: int) -> tuple[float, list[tuple[str, float]]]:
    """Bytes a device, traced by ``tracemalloc``, that the fleet's allocations grew between two snapshots: the
    total and by site: the innermost frame in ``otel_dra`` (a library's allocation is put down to our call of
    it), ``registry.grown``'s put down to the store that grew."""
    import tracemalloc

    helper, helper_lines = _helper_lines()
    old, new = tracemalloc.Snapshot.load(str(floor)), tracemalloc.Snapshot.load(str(after))
    sites: dict[str, int] = {}
    total = 0
    for diff in new.compare_to(old, "traceback"):
        total += diff.size_diff
        frames = []  # oldest first
        for f in diff.traceback:
            path = Path(f.filename)
            name = (
                path.resolve().relative_to(ROOT).as_posix()
                if path.is_absolute() and ROOT in path.resolve().parents
                else f.filename
            )
            if not (name == helper and f.lineno in helper_lines):
                frames.append(f"{name}:{f.lineno}")
        ours = [f for f in frames if f.startswith("otel_dra/")]
        site = ours[-1] if ours else (frames[-1] if frames else "?")
        sites[site] = sites.get(site, 0) + diff.size_diff
    top = sorted(sites.items(), key=lambda kv: -kv[1])
    return total / devices, [(site, nbytes / devices) for site, nbytes in top]


@dataclass
class Traced:
    devices: int
    traced: float  # what tracemalloc saw grow, a device
    sites: list[tuple[str, float]]


def trace(workdir: Path, traffic: Traffic, devices: int, lanes: int) -> Traced:
    """A fleet of ``devices`` under ``tracemalloc``: where its allocations grew, by site."""
    fleet, floor = fed_fleet(workdir, traffic, devices, lanes, tracemalloc=True)
    try:
        after = probe(fleet, workdir, trim=False, timeout_s=600)
    finally:
        stop(fleet.proc)
    traced, sites = traced_growth(Path(floor["probe"]["snapshot"]), Path(after["snapshot"]), devices)
    for snap in (floor["probe"]["snapshot"], after["snapshot"]):
        Path(snap).unlink()
    return Traced(devices, traced, sites)


def in_process(devices: int, workdir: Path) -> dict[str, Any]:
    """``bench_memory.py``'s fleet figure at ``devices`` (its children, this run): bytes a device beyond the
    window arrays, measured in one process with ``gc.collect()`` and ``malloc_trim`` before the reading."""
    templates = workdir / "in-process-requests.pickle"
    templates.write_bytes(pickle.dumps(bm.agent_requests(bm.ROUNDS)))  # (stamped from the receiver bench's epoch)
    nodes = str(devices // bm.PER_NODE)
    child, floor = bm.run_child("fleet", str(templates), nodes), bm.run_child("floor", "fleet", str(templates))
    return {"devices": child["devices"], "beyond": bm.per_device(child, floor), "parts": child["parts"],
            "window_bytes": child["window_bytes"] / child["devices"], "capacity": child["capacity"]}  # fmt: skip


# -- the report ------------------------------------------------------------------------------------------------------
def verdict(met: bool) -> str:
    return "✅ met" if met else "❌ missed"


def _run_label(m: Memory, memory: list[Memory]) -> str:
    """A run's column: its size, and which run of that size when there are several."""
    same = [r for r in memory if r.devices == m.devices]
    run = next(i for i, r in enumerate(same) if r is m) + 1
    return f"{m.devices:,} devices" + (f" (run {run})" if len(same) > 1 else "")


def memory_rows(m: Memory) -> list[str]:
    kinds = sorted(set(m.floor_smaps) | set(m.after_smaps), key=lambda k: -(m.after_smaps.get(k, 0)
                                                                          - m.floor_smaps.get(k, 0)))  # fmt: skip
    rows = []
    for kind in kinds:
        grew = (m.after_smaps.get(kind, 0.0) - m.floor_smaps.get(kind, 0.0)) * 2**20 / m.devices
        if abs(grew) >= 50:
            rows.append(f"| {m.devices:,} | {kind} | {m.floor_smaps.get(kind, 0):,.0f} MiB | "
                        f"{m.after_smaps.get(kind, 0):,.0f} MiB | {kb(grew)} |")  # fmt: skip
    return rows


def section(
    memory: list[Memory],
    idle: Idle | None,
    scrapes: Scrapes | None,
    inproc: dict[str, Any] | None,
    traced: Traced | None,
    rounds: int,
    ring: int,
    lanes: int,
    took_s: float,
    code: tuple[str, str] = ("", ""),
) -> str:
    lines = [
        START,
        TITLE,
        "",
        f"Measured {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')} on {_report.cpu_model()} "
        f"({os.cpu_count()} CPUs), {took_s:.0f} s in all. A real `otel-dra fleet` (defaults: `--sample-interval "
        f"{INTERVAL_S:g}`, ticks every {EVALUATE_EVERY_S:g} s) fed over OTLP/HTTP protobuf, {lanes} keep-alive "
        f"connections: one agent's requests (its SDK pipeline, 8 GPUs) cloned into every node by rewriting node "
        f"name, GPU UUIDs and serials in place, {rounds} rounds stamped 10 s apart and pushed back to back (the "
        f"window holds {ring} samples a device: every window full). Everything read from `/proc` from outside. Code "
        f"{code[0]}"
        + (
            f" at the start, **{code[1]} at the end: the shared tree changed during the run** (each fleet ran the "
            "code of its start)."
            if code[1] != code[0]
            else "."
        ),
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
    ]
    for devices in sorted({m.devices for m in memory}):
        runs = [m for m in memory if m.devices == devices]
        mid = statistics.median(m.beyond for m in runs)
        if len(runs) == 1:
            m = runs[0]
            measured = (
                f"{kb(m.beyond, 2)} ({kb(m.growth)} growth - {kb(m.window_bytes)} window arrays; {m.capacity:,} rows)"
            )
        else:
            each = ", ".join(f"{kb(m.beyond, 2)} ({m.capacity:,} rows)" for m in runs)
            measured = f"median {kb(mid, 2)} of {len(runs)} fresh fleets: {each}"
        lines.append(
            f"| Memory at {devices:,} devices: RSS growth per device beyond the arrays it needs <= "
            f"{kb(TARGET_BYTES)} | {measured} | {verdict(mid <= TARGET_BYTES)} |"
        )
    if idle is not None:
        lines.append(
            f"| Idle, {idle.devices:,} devices, nobody pushing or scraping: CPU between ticks < "
            f"{TARGET_IDLE:.0%} of a core | {idle.others_s / idle.seconds:.2%} (whole process, ticks included: "
            f"{idle.total_s / idle.seconds:.2%}) | {verdict(idle.others_s / idle.seconds < TARGET_IDLE)} "
            f"(whole process: {verdict(idle.total_s / idle.seconds < TARGET_IDLE)}) |"
        )
    if scrapes is not None:
        first, repeat = scrapes.scrapes[0], scrapes.scrapes[1]
        lines.append(
            f"| Scrape of {scrapes.devices:,} devices' verdict series < {TARGET_SCRAPE_S:g} s | first "
            f"{first.seconds:.2f} s, repeated {repeat.seconds:.3f} s | first {verdict(first.seconds < 1)}, "
            f"repeated {verdict(repeat.seconds < 1)} |"
        )
    lines += ["", "### Memory", ""]
    lines.append(
        "Growth = VmRSS two ticks after the last round - VmRSS of the fleet warmed up (one extra node pushed, a "
        "tick run: its code loaded). The arrays a device needs: the window store's ring, times and sums and the "
        f"horizon's buckets (`bench_memory.window_arrays`, {kb(memory[0].window_bytes if memory else 0)} a row of "
        "a classifier built as the fleet's). The fleet runs as it ships: it hands glibc's free heap back after a "
        "tick when there is enough of it (`--heap-trim`, on by default: `otel_dra/heap.py`), and nothing else is "
        "collected or trimmed before the reading (unlike the in-process figure); a probe loaded in it "
        "(`sitecustomize`, signalled after the reading) tells glibc's `mallinfo2`, the arrays the classifier keeps on "
        "pages of their own (`registry.zeroed`: grown window arrays, not malloc's), the classifier's rows, and what "
        "`gc.collect()` + `malloc_trim(0)` give back then."
    )
    lines += ["", "| devices | RSS floor | RSS, windows full | growth per device | beyond the window arrays | "
              "beyond, after `malloc_trim` | rows (capacity) | push: fleet CPU per point | pushed | 503s retried "
              "| errors |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m in memory:
        p = m.pushed
        lines.append(
            f"| {m.devices:,} | {m.floor_mb:,.0f} MiB | {m.after_mb:,.0f} MiB | {kb(m.growth)} | "
            f"{kb(m.beyond)} | {kb(m.beyond - m.trimmed)} | {m.capacity:,} | "
            f"{m.push_cpu_s / max(p.points, 1) * 1e6:.2f} µs | {p.requests:,} requests, {p.points:,} points in "
            f"{p.wall_s:.0f} s | {p.retries:,} | {len(p.errors)} |"
        )
    lines += ["", "Where a device's growth went (glibc's `mallinfo2` and the arrays on pages of their own, at the "
              "floor and with windows full; a device's "
              "share):", "", "| part | " + " | ".join(_run_label(m, memory) for m in memory) + " |",
              "|---|" + "---|" * len(memory)]  # fmt: skip
    parts: list[tuple[str, Callable[[Memory], float]]] = [
        ("window arrays its devices need (the baseline)", lambda m: m.window_bytes),
        (
            "window arrays of the rows added beyond its devices' (rows grow to fit a tick's newcomers, and by an "
            f"eighth more, at most {GROW_ROWS:,} more below {EIGHTH_FROM:,} rows; the empty fleet's 1,024 rows are in "
            "the floor)",
            lambda m: m.arrays - m.window_bytes,
        ),
        (
            "other memory in use: malloc's (Python's larger objects, the other arrays, buffers) and the arrays on "
            "pages of their own (`registry.zeroed`: the grown window arrays among them), less the window arrays",
            lambda m: m.malloc("uordblks") + m.malloc("hblkhd") + m.mapped - m.arrays,
        ),
        (
            "free memory malloc holds in its heaps (fragments of freed temporaries; what the fleet trimmed counts, "
            "not resident)",
            lambda m: m.malloc("fordblks"),
        ),
        ("... of which `gc.collect()` + `malloc_trim(0)` gave back", lambda m: m.trimmed),
        (
            "the rest: Python's small-object arenas, stacks, less free heap not resident (trimmed) and pages of "
            "the arrays not written yet",
            lambda m: m.growth - m.malloc("uordblks") - m.malloc("hblkhd") - m.mapped - m.malloc("fordblks"),
        ),
    ]
    for label, part in parts:
        lines.append(f"| {label} | " + " | ".join(kb(part(m)) for m in memory) + " |")
    lines += ["", "By kind of mapping (`/proc/<pid>/smaps`, Rss):", "",
              "| devices | mapping | floor | windows full | growth per device |", "|---|---|---|---|---|"]  # fmt: skip
    for m in memory:
        lines += memory_rows(m)
    if traced is not None:
        lines += [
            "",
            f"Where Python allocated it: a fleet of {traced.devices:,} devices run the same way under `tracemalloc` "
            f"({TRACE_FRAMES} frames; slower, so its figures are its own), snapshots at the floor and with windows "
            f"full compared; each site's growth a device (small fleet: fixed costs weigh more). `tracemalloc` saw "
            f"{kb(traced.traced)} a device grow (numpy's buffers included; its own tables make RSS no measure "
            "there): what the fleet's RSS grew beyond that is the allocator's (free memory held, fragmentation) "
            "and memory Python does not trace.",
            "",
            "| site | per device |",
            "|---|---|",
        ]
        lines += [f"| `{site}` | {kb(nbytes)} |" for site, nbytes in traced.sites[:12]]
    if inproc is not None:
        lines += [
            "",
            f"In-process figure, same run (`bench_memory.py`'s fleet child at {inproc['devices']:,} devices: decode, "
            f"`Fleet.tick` and the exposition in one process, no sockets, {bm.ROUNDS} rounds, `gc.collect()` and "
            f"`malloc_trim` before reading, the window arrays made resident): **{kb(inproc['beyond'])} a device "
            f"beyond the window arrays** of its capacity ({inproc['capacity']:,} rows, {kb(inproc['window_bytes'])} "
            "a device, subtracted whole). Its deep sizes:",
            "",
        ]
        lines += [f"- {label}: {kb(nbytes)}" for label, nbytes in inproc["parts"] if nbytes >= 50]
    if idle is not None:
        lines += [
            "",
            "### Idle",
            "",
            f"{idle.devices:,} devices fed full windows, then nobody pushes and nobody scrapes: the fleet's CPU "
            f"(`/proc/<pid>/task/*/stat`, every thread) over {idle.seconds:.0f} s from two ticks after the last "
            f"round (its devices go stale within that minute: the verdicts change once, as they would). The main "
            f"thread runs only the evaluation loop (a tick every {EVALUATE_EVERY_S:g} s judges every device): "
            f"between ticks = every other thread (the receivers' event loops, the decode worker, the `/metrics` "
            f"renderer, the SDK, the state writer).",
            "",
            "| threads | CPU | share of a core |",
            "|---|---|---|",
            f"| every thread but the ticks' (between ticks) | {idle.others_s:.2f} s | "
            f"{idle.others_s / idle.seconds:.2%} |",
            f"| the ticks (main thread) | {idle.ticks_s:.2f} s | {idle.ticks_s / idle.seconds:.2%} |",
            f"| whole process | {idle.total_s:.2f} s | {idle.total_s / idle.seconds:.2%} |",
            "",
            f"RSS at the end: {idle.rss_mb:,.0f} MiB.",
        ]
    if scrapes is not None:
        lines += [
            "",
            "### Scrape",
            "",
            f"`GET /metrics` on the fleet of {scrapes.devices:,} devices (windows full, right after the memory "
            f"reading), each on a new connection, timed to the last byte: "
            f"{scrapes.series['hw_status']:,} `hw_status` and {scrapes.series['dra_device_health']:,} "
            f"`dra_device_health` series, {scrapes.text_bytes / 2**20:,.0f} MiB of text.",
            "",
            "| scrape | answered in | first byte | body |",
            "|---|---|---|---|",
        ]
        for s in scrapes.scrapes:
            body = f"{s.nbytes / 2**20:,.1f} MiB" + (" gzip" if s.gzipped else " text")
            lines.append(f"| {s.what} | {s.seconds:.3f} s | {s.first_byte_s:.3f} s | {body} |")
        lines += [
            "",
            f"While scraped (within 5 minutes of a scrape) the fleet re-renders after every tick (its own series; "
            f"the verdict text only when a verdict changed): "
            f"{scrapes.scraped_cpu_s:.2f} CPU-seconds over {scrapes.scraped_wall_s:.0f} s with nothing pushed "
            f"({scrapes.scraped_cpu_s / scrapes.scraped_wall_s:.0%} of a core). RSS {scrapes.rss_before_mb:,.0f} MiB "
            f"before the scrapes (after the probe's `malloc_trim`), {scrapes.rss_after_mb:,.0f} MiB after (the "
            "rendering kept, gzip).",
            "",
            "Where the fleet's CPU goes while scraped (py-spy over those two ticks, active samples; stages as "
            "`bench_fleet_process.py --profile` sums them):",
            "",
            "```",
            *scrapes.profile,
            "```",
        ]
    devices = ",".join(str(m.devices) for m in memory)
    lines += [
        "",
        "Reproduce: `flock /tmp/bench.lock .venv/bin/python bench/bench_fleet_scale.py"
        + (f" --devices-list {devices}" if devices else "")
        + "`.",
        END,
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--devices-list", default="8000,100000", help="fleets whose memory is measured (8 GPUs a node)")
    ap.add_argument("--idle-devices", type=int, default=10_000, help="the idle fleet (0: none)")
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--scrape-devices", type=int, default=100_000, help="the scraped fleet (0: none)")
    ap.add_argument("--in-process-devices", type=int, default=8_000, help="bench_memory's in-process child (0: none)")
    ap.add_argument("--trace-devices", type=int, default=2_000, help="a fleet under tracemalloc (0: none)")
    ap.add_argument("--lanes", type=int, default=8, help="keep-alive connections the pushes share")
    ap.add_argument("--repeats", type=int, default=3, help=f"fresh fleets per size up to {SMALL_FLEET:,} devices")
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    ap.add_argument("--workdir", type=Path, help="keep the fleets' logs here (default: a temporary folder)")
    args = ap.parse_args()
    started = time.monotonic()
    code = bm.code_fingerprint()
    ring = window_samples()
    rounds = ring + 2
    traffic = build_traffic(rounds, time.time_ns() - 5 * 10**9)
    window_bytes = window_bytes_per_device()
    print(f"{rounds} rounds, {traffic.points[-1]} points a node a round; window arrays {window_bytes:,.0f} B a "
          "device", flush=True)  # fmt: skip
    sizes = [int(d) for d in args.devices_list.split(",") if d]
    memory: list[Memory] = []
    idle = scrapes = inproc = traced = None
    with tempfile.TemporaryDirectory(prefix="bench-fleet-scale-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.in_process_devices:
            print(f"in process ({args.in_process_devices:,} devices, bench_memory's child) ...", flush=True)
            inproc = in_process(args.in_process_devices, workdir)
            print(f"  {inproc['beyond']:,.0f} B a device beyond the window arrays", flush=True)
        wanted = sorted(set(sizes) | ({args.scrape_devices} if args.scrape_devices else set()))
        runs = [(d, k) for d in wanted for k in range(args.repeats if d in sizes and d <= SMALL_FLEET else 1)]
        for devices, k in runs:
            print(f"memory: {devices:,} devices, {rounds} rounds (run {k + 1}) ...", flush=True)
            where = workdir / f"fleet-{devices}-{k + 1}"
            fleet, floor = fed_fleet(where, traffic, devices, args.lanes)
            try:
                if devices in sizes:
                    memory.append(measure_memory(fleet, floor, devices, window_bytes, where))
                    m = memory[-1]
                    print(f"  growth {m.growth:,.0f} B a device, {m.beyond:,.0f} beyond the window arrays "
                          f"({m.capacity:,} rows); pushed {m.pushed}", flush=True)  # fmt: skip
                if devices == args.scrape_devices and k == 0:
                    print("scrapes ...", flush=True)
                    scrapes = measure_scrapes(fleet, devices, where)
                    print(f"  {scrapes.scrapes}", flush=True)
            finally:
                stop(fleet.proc)
        if args.idle_devices:
            print(f"idle: {args.idle_devices:,} devices, {args.idle_seconds:g} s ...", flush=True)
            fleet, _ = fed_fleet(workdir / "fleet-idle", traffic, args.idle_devices, args.lanes)
            try:
                idle = measure_idle(fleet, args.idle_seconds, args.idle_devices)
                print(f"  {idle}", flush=True)
            finally:
                stop(fleet.proc)
        if args.trace_devices:
            print(f"tracemalloc: {args.trace_devices:,} devices ...", flush=True)
            traced = trace(workdir / "fleet-traced", traffic, args.trace_devices, args.lanes)
            print(f"  {traced.traced:,.0f} B a device traced", flush=True)
    took = time.monotonic() - started
    text = section(memory, idle, scrapes, inproc, traced, rounds, ring, args.lanes, took,
                   (code, bm.code_fingerprint()))  # fmt: skip
    print(text)
    if not args.no_write:
        _report.write_section(START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
