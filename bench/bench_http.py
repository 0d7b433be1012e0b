"""Benchmark of the OTLP/HTTP receiver's HTTP path: requests per second, the bounded asyncio server
(``otel_dra/serve/``) against the hand-written threaded server it replaced, on the same requests in
the same run.

Run ``.venv/bin/python bench/bench_http.py [--baseline-rev 346d24a] [--nodes 50] [--rounds 20]``; the
figures go to the terminal and to ``BENCHMARKS.md`` (the section between the ``bench_http`` markers).

A benchmark, not a timed test. The requests are what agents send (``bench_receiver.agent_requests``:
the agent's own SDK pipeline, serialized as the OTLP exporter does, 8 GPUs a node). Each server runs
in its own process, the receiver of its revision with a consumer that drops the frames (the HTTP path
and the decoding are measured, not the classifier). The client, in another process, keeps
``--connections`` keep-alive connections, each carrying its nodes' requests in time order, and times
the whole set. The two servers take turns, three times each (A B A B A B); the best of each is
compared, as a ratio, since the machine is noisy.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402
from bench.bench_receiver import node_requests  # noqa: E402

START, END = "<!-- bench_http:start -->", "<!-- bench_http:end -->"
TURNS = 3

SERVER = r"""
import sys, threading
from otel_dra.frame import Schema
try:
    from otel_dra.receivers.factory import new_receiver
except ImportError:  # the baseline revision, before receivers took their configs whole
    from otel_dra.receivers import OtlpReceiver as new_receiver
receiver = new_receiver(Schema(), lambda frames: None, grpc_endpoint=None, http_endpoint="127.0.0.1:0")
receiver.start()
print(receiver.http_port, flush=True)
sys.stdin.read()
receiver.shutdown(1.0)
"""


def baseline_tree(rev: str) -> Path:
    """The package as it was at ``rev`` (``git archive``), in a temporary folder."""
    where = Path(tempfile.mkdtemp(prefix="otel-dra-baseline-"))
    archive = subprocess.run(["git", "archive", rev, "otel_dra"], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(where, filter="data")
    return where


class Server:
    """A receiver of one revision (``tree``: the folder holding its ``otel_dra``) in its own process."""

    def __init__(self, tree: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(15)


def framed(body: bytes) -> bytes:
    head = (
        "POST /v1/metrics HTTP/1.1\r\nHost: bench\r\nContent-Type: application/x-protobuf\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def read_response(sock: socket.socket, buf: bytearray) -> int:
    """Read one response off a keep-alive connection; its status."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection mid-response")
        rest += chunk
    buf[:] = rest[length:]
    return int(head.split(b" ", 2)[1])


def drive(port: int, lanes: list[list[bytes]]) -> float:
    """Send every lane's requests on its own connection, in order; the wall time of the whole set."""
    errors: list[str] = []

    def lane(requests: list[bytes]) -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            buf = bytearray()
            for request in requests:
                sock.sendall(request)
                status = read_response(sock, buf)
                if status != 200:
                    errors.append(f"HTTP {status}")

    threads = [threading.Thread(target=lane, args=(reqs,)) for reqs in lanes]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, e.g. {errors[0]}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-rev", default="346d24a", help="the revision with the threaded server")
    parser.add_argument("--nodes", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()

    print(f"building {args.nodes} nodes x {args.rounds} requests through the agent's SDK pipeline ...", flush=True)
    with ProcessPoolExecutor() as pool:
        per_node = list(pool.map(node_requests, [(i, 8, args.rounds) for i in range(args.nodes)]))
    lanes: list[list[bytes]] = [[] for _ in range(args.connections)]
    for k in range(args.rounds):  # each node's requests in time order, on one lane
        for i, reqs in enumerate(per_node):
            lanes[i % args.connections].append(framed(reqs[k]))
    total = args.nodes * args.rounds
    size = sum(len(r) for lane in lanes for r in lane) / total
    trees = {"before (threaded, hand-written)": baseline_tree(args.baseline_rev), "after (asyncio, aiohttp)": ROOT}
    best: dict[str, float] = {}
    for turn in range(TURNS):
        for name, tree in trees.items():
            server = Server(tree)
            try:
                wall = drive(server.port, lanes)
            finally:
                server.stop()
            rate = total / wall
            best[name] = max(best.get(name, 0.0), rate)
            print(f"turn {turn + 1}: {name}: {rate:,.0f} requests/s", flush=True)
    before, after = best.values()
    ratio = after / before
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = "\n".join(f"| {name} | {rate:,.0f} |" for name, rate in best.items())
    section = f"""{START}
## OTLP/HTTP: the bounded asyncio server against the threaded one it replaced

Measured {now} on {os.cpu_count()} CPUs ({_report.cpu_model()}), Python {platform.python_version()}: {total:,}
agent requests ({args.nodes} nodes x {args.rounds} exports, 8 GPUs each, {size / 1000:.0f} kB a request), sent
over {args.connections} keep-alive connections (each node's in time order) to `POST /v1/metrics` of an
`OtlpReceiver` whose consumer drops the frames: the HTTP path and the decoding, not the classifier. Before is
the receiver at `{args.baseline_rev}` (thread per connection, hand-written HTTP/1.1 and chunked parser), after is
this one (`otel_dra/serve/`: aiohttp's llhttp parser on an asyncio loop; a keep-alive push like these, whole and
under 256 kB, decoded and answered where its bytes arrive (the quick lane), any other on one worker thread). The
servers took turns, {TURNS} each; best of each. Both share this machine's two cores with the client sending.

| server | requests/s |
|---|---|
{rows}

After / before: **x{ratio:.2f}** (equal or faster: {"✅ met" if ratio >= 0.95 else "❌ not met"}; within 5% is
this machine's noise).

Reproduce: `.venv/bin/python bench/bench_http.py` (about a minute, most of it building the requests).
{END}
"""
    print(section)
    if not args.no_write:
        _report.write_section(START, END, section)
    return 0 if ratio >= 0.95 else 1


if __name__ == "__main__":
    raise SystemExit(main())
