"""Memory per device beyond the window arrays: the fleet at 100,000 devices, a replay at 10,000 (issue #17).

Run ``.venv/bin/python bench/bench_memory.py [--devices 100000] [--replay-devices 10000] [--quick]``; the
figures go to the terminal and to ``BENCHMARKS.md`` (only the section between the ``bench_memory``
markers is replaced). The full run takes about 5 minutes on 2 cores, most of it the fleet's first
round (every node's first request goes the decoder's plain way).

A benchmark, not a test. Each figure is measured in a fresh child process against a baseline in the
same run: the interpreter floor (a child with the same imports, the same request templates and the
same components built empty) and the window arrays' own ``nbytes`` (the window store's ring, times and
running sums, the horizon's buckets: what a device costs by design, made resident before measuring).
Everything else a device costs counts: the classifier's other arrays, the registry, the verdict board,
label strings, caches of the decoders, the rendered ``/metrics``, the replay's result.

1. **Fleet**: what ``otel-dra fleet`` holds, built the way it runs. One agent's OTLP protobuf requests
   (the agent's own SDK pipeline, 8 simulated GPUs, ``bench_receiver.agent_requests``) are cloned into
   ``N / 8`` nodes by rewriting the fixed-width node name and serial numbers in the bytes (each node's
   request differs from the others' as real ones do: in its node and devices), decoded by one
   :class:`~otel_dra.decode.otlp_proto.OtlpProtoDecoder` configured as the receiver configures it,
   queued with :meth:`Fleet.on_frames`, then each round :meth:`Fleet.tick` (``ingest_many``,
   ``evaluate``, the verdict board's publish) and the ``/metrics`` rendering
   (:class:`~otel_dra.sinks.exposition.ExpositionCache` over the SDK's registry with the fleet's
   verdict text), one gzip scrape at the end. ``ROUNDS`` rounds of 10 s. Then ``gc.collect()`` and
   ``malloc_trim``, and ``VmRSS``.
2. **Replay**: :func:`otel_dra.replay.replay` of an OTLP JSON lines recording (gzip) of ``M`` devices
   (the same agent's requests in the protobuf JSON mapping, cloned the same way), verdict lines to
   ``/dev/null``, decoding in the same process (``otel-dra replay --one-process``: with a decode process,
   the decoder's state would be in that process's RSS, not this one's). The replay's classifier, decoder and
   result are kept alive past the call (subclassed in that child only to keep a reference); ``VmRSS`` after
   ``gc.collect()`` and ``malloc_trim``, and the peak (``VmHWM``).
3. **Breakdown**: after the measurement, in the same child, every large object's deep size
   (``sys.getsizeof`` over its referents, each object counted once, in the order of the table), so the
   figure is accounted for; "the rest" is what RSS holds beyond that (the interpreter's free lists, the
   allocator's fragmentation).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import json
import os
import pickle
import platform
import re
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402

BENCHMARKS_MD = _report.BENCHMARKS_MD
START, END = "<!-- bench_memory:start -->", "<!-- bench_memory:end -->"
TARGET_BYTES = 5_000  # per device, beyond the window arrays (issue #17)
PER_NODE = 8
ROUNDS = 8  # of the fleet: round 0 is every node's first request; the rest are steady
REPLAY_TICKS = 8  # lines per node in the replay's recording, 10 s apart
S = 10**9
#: A memory page: what :func:`make_resident` writes a byte of.
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
T0 = 1_795_000_000 * S
T0_WALL = time.time()


def log(message: str) -> None:
    print(f"[{time.time() - T0_WALL:6.0f} s] {message}", file=sys.stderr, flush=True)


proc_status_mb, trim = _report.proc_status_mb, _report.trim
kb = _report.kb


def code_fingerprint() -> str:
    """A hash of the code under test (``otel_dra/``'s Python and YAML): the tree is shared, so the run
    checks that every child measured one version of it."""
    digest = hashlib.sha1()
    for path in sorted((ROOT / "otel_dra").rglob("*")):
        if path.suffix in (".py", ".yaml") and path.is_file():
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


# -- the input: one agent's requests, cloned into a fleet ---------------------------------------------
NODE_TEMPLATE = b"node-00000"
UUID_TEMPLATE = b"GPU-00000000"  # each device's hw.id: GPU-<node, 8 digits>-0000-4000-8000-<device, 12 digits>
_SERIAL = re.compile(rb"SIM\d{10}")


class Cloner:
    """One node's request (or JSON line) as any node's: the node name's five digits, the node's eight in each
    device's UUID (its ``hw.id``) and each device's serial number's ten rewritten in place (fixed width, so
    no length field moves), with one numpy write."""

    def __init__(self, data: bytes) -> None:
        self.base = np.frombuffer(data, np.uint8)
        node_at = [m.start() + len(NODE_TEMPLATE) - 5 for m in re.finditer(re.escape(NODE_TEMPLATE), data)]
        uuid_at = [m.start() + 4 for m in re.finditer(re.escape(UUID_TEMPLATE), data)]
        serials = sorted(set(_SERIAL.findall(data)))
        serial_at = [[m.start() + 3 for m in re.finditer(re.escape(s), data)] for s in serials]
        self.counts = [len(node_at), len(uuid_at)] + [len(at) for at in serial_at]
        spans = [(node_at, 5), (uuid_at, 8), *((at, 10) for at in serial_at)]
        self.index = np.concatenate(
            [(np.asarray(at, np.intp)[:, None] + np.arange(width)).ravel() for at, width in spans if at]
        )

    def node(self, i: int) -> bytes:
        digits = [f"{i:05d}".encode() * self.counts[0], f"{i:08d}".encode() * self.counts[1]]
        digits += [f"{i:05d}{d:05d}".encode() * n for d, n in enumerate(self.counts[2:])]
        buf = self.base.copy()
        buf[self.index] = np.frombuffer(b"".join(digits), np.uint8)
        return buf.tobytes()


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def agent_requests(rounds: int) -> list[bytes]:
    """Node ``node-00000``'s requests, one per round 10 s apart, as its agent's SDK pipeline sends them
    (``bench_receiver.agent_requests``), its GPUs named by UUIDs as NVML names them (the simulator's
    ``gpu-0`` .. ``gpu-7`` would be the same eight names on every node)."""
    from bench import bench_receiver
    from otel_dra.sources.simulated import SimulatedSource

    class UuidSource(SimulatedSource):
        def __init__(self, config: Any, schema: Any = None) -> None:
            super().__init__(config, schema)
            self._ids = tuple(f"{UUID_TEMPLATE.decode()}-0000-4000-8000-{d:012d}" for d in range(config.devices))

    return bench_receiver.agent_requests(NODE_TEMPLATE.decode(), PER_NODE, rounds, seed=0, source=UuidSource)


def write_recording(path: Path, requests: list[bytes], nodes: int) -> int:
    """The replay's input: each request in the protobuf JSON mapping, one line per node per round (a
    Collector's file exporter, gzip); returns the bytes before compression."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    lines = [
        Cloner(json.dumps(MessageToDict(ExportMetricsServiceRequest.FromString(r)), separators=(",", ":")).encode())
        for r in requests
    ]
    total = 0
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)  # gzip framing
    with path.open("wb") as out:
        for cloner in lines:
            for i in range(nodes):
                line = cloner.node(i) + b"\n"
                total += len(line)
                out.write(packer.compress(line))
        out.write(packer.flush())
    return total


# -- accounting: deep sizes, each object once ----------------------------------------------------------
_ATOMIC = (type, type(sys), type(len), type(log), type(log.__code__))


def deep_size(roots: Iterable[object], seen: set[int]) -> int:
    """Bytes of ``roots`` and everything they reach that ``seen`` does not hold yet (added to it). Classes,
    modules, functions and code are not followed (shared by everything); a numpy view counts its base."""
    total = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _ATOMIC):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)  # (an ndarray that owns its data counts it)
        if isinstance(obj, np.ndarray):
            if obj.base is not None:
                stack.append(obj.base)
            if obj.dtype != object:
                continue
        stack.extend(gc.get_referents(obj))
    return total


def window_arrays(classifier: Any) -> list[np.ndarray]:
    """The window arrays: the window store's and the horizon's (the baseline a device costs by design)."""
    out = []
    for part in (classifier.store, classifier.horizon):
        for value in vars(part).values():
            if isinstance(value, np.ndarray):
                out.append(value)
            elif isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
                out.extend(value)
    return out


def make_resident(classifier: Any) -> None:
    """Every page of the classifier's arrays in memory, as a long run has them (rows and horizon buckets
    all written once): zeroed pages never written would not count in RSS. A byte of each page is written
    back from a copy (``array[...] = array`` is a no-op numpy skips: same data, same strides)."""
    for part in (
        classifier.store,
        classifier.horizon,
        classifier.registry,
        classifier.extractor,
        classifier.groups,
        classifier.engine,
        *classifier.events.values(),
    ):
        for value in vars(part).values():
            for array in value if isinstance(value, list) else [value]:
                if isinstance(array, np.ndarray) and array.flags.writeable and array.size:
                    if array.flags.c_contiguous:
                        raw = array.reshape(-1).view(np.uint8)
                        raw[::PAGE_BYTES] = raw[::PAGE_BYTES].copy()
                    else:
                        array[...] = array.copy()


def breakdown(parts: list[tuple[str, Callable[[], Iterable[object]]]], devices: int) -> list[tuple[str, float]]:
    seen: set[int] = set()
    return [(label, deep_size(roots(), seen) / devices) for label, roots in parts]


# -- the children ---------------------------------------------------------------------------------------
def _fleet_parts(fleet: Any, decoder: Any, text: Any, cache: Any) -> list[tuple[str, Callable[[], Iterable[object]]]]:
    c = fleet.classifier
    reg = c.registry
    numpy_parts = [reg, c.extractor, c.groups, c.engine, *c.events.values()]
    return [
        ("window arrays (the baseline)", lambda: window_arrays(c)),
        (
            "classifier: other per-device arrays (registry, features, policy groups, verdict engine, events)",
            lambda: [v for p in numpy_parts for v in vars(p).values() if isinstance(v, np.ndarray)],
        ),
        ("registry: device keys, rows, attributes (Python objects)", lambda: [reg]),
        ("classifier: the rest (device tables seen, evidence texts, policy)", lambda: [c]),
        ("verdict board: verdicts and attributes", lambda: [fleet.board]),
        ("/metrics verdict text: label cache", lambda: [text]),
        ("/metrics rendered body (and its gzip)", lambda: [cache]),
        (
            "decoder: series index (devices, descriptive sets), series cache",
            lambda: [decoder._series, decoder._targets],
        ),
        ("decoder: device tables", lambda: [decoder._tables]),
        ("decoder: time floors per node and series", lambda: [decoder._floors]),
        ("decoder: templates", lambda: [decoder._templates]),
        ("decoder: the rest", lambda: [decoder]),
        ("fleet: the rest", lambda: [fleet]),
    ]


def _fleet_imports() -> dict[str, Any]:
    import logging

    from prometheus_client import CollectorRegistry

    from otel_dra import policy
    from otel_dra.config import FleetConfig
    from otel_dra.decode.core import CLOCK_JUMP_NS
    from otel_dra.decode.otlp_proto import OtlpProtoDecoder
    from otel_dra.fleet import FLEET_SERIES_LIMIT, Fleet
    from otel_dra.receivers.config import ReceiverConfig
    from otel_dra.sinks import provider
    from otel_dra.sinks.exposition import ExpositionCache
    from otel_dra.sinks.verdict_metrics import ViewDisagreement
    from otel_dra.sinks.verdict_text import VerdictText

    logging.getLogger("otel_dra").setLevel(logging.ERROR)  # (a fleet's verdict log lines: not measured here)
    return {
        "CollectorRegistry": CollectorRegistry,
        "policy": policy,
        "FleetConfig": FleetConfig,
        "CLOCK_JUMP_NS": CLOCK_JUMP_NS,
        "OtlpProtoDecoder": OtlpProtoDecoder,
        "FLEET_SERIES_LIMIT": FLEET_SERIES_LIMIT,
        "Fleet": Fleet,
        "ReceiverConfig": ReceiverConfig,
        "provider": provider,
        "ExpositionCache": ExpositionCache,
        "VerdictText": VerdictText,
        "ViewDisagreement": ViewDisagreement,
    }


def _build_fleet(m: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
    """The fleet's components as ``Fleet.start`` wires them, without sockets: the classifier and board
    (``Fleet``), the receiver's decoder, the verdict text and the exposition cache over the SDK registry."""
    config = m["FleetConfig"]()
    policy = m["policy"].load()
    fleet = m["Fleet"](config, policy)
    rc = m["ReceiverConfig"]()
    decoder = m["OtlpProtoDecoder"](
        fleet.schema, max_future_ns=int(rc.max_future_s * S), limits=rc.limits, clock_jump_ns=m["CLOCK_JUMP_NS"]
    )
    text = m["VerdictText"]()
    render = getattr(text, "chunks", text.render)  # (as Fleet.start wires it; the code before had only render)
    registry = m["CollectorRegistry"]()
    provider = m["provider"]
    meter_provider = provider.build_meter_provider(
        "fleet", [provider.prometheus_reader(registry)], m["FLEET_SERIES_LIMIT"]
    )
    m["ViewDisagreement"](fleet.board, meter_provider.get_meter("otel_dra.fleet"), policy.shared_devices.combine)
    cache = m["ExpositionCache"](
        registry, 3 * config.evaluate_every_s + 5, extra=lambda: render(fleet.board.snapshot())
    )
    return fleet, decoder, text, cache, meter_provider


def child_floor(kind: str, templates: Path) -> dict[str, Any]:
    """The interpreter floor: the same imports, the same templates read, the components built empty."""
    if kind == "fleet":
        m = _fleet_imports()
        requests = pickle.loads(templates.read_bytes())
        cloners = [Cloner(r) for r in requests]
        built = _build_fleet(m)
        assert cloners and built
    else:
        m = _replay_imports()
        replay_mod = m["replay_mod"]
        empty = replay_mod.Classifier(m["policy"].load(), interval_s=replay_mod.RING_INTERVAL_S, node_time=True)
        assert empty.registry is not None
    trim()
    return {"rss_mb": proc_status_mb("VmRSS"), "hwm_mb": proc_status_mb("VmHWM")}


def child_fleet(templates: Path, nodes: int) -> dict[str, Any]:
    m = _fleet_imports()
    requests = pickle.loads(templates.read_bytes())
    cloners = [Cloner(r) for r in requests]
    fleet, decoder, text, cache, _mp = _build_fleet(m)
    rounds = []
    for k, cloner in enumerate(cloners):
        now = T0 + k * 10 * S + S  # a second after the agents' collection
        t0 = time.perf_counter()
        for i in range(nodes):
            result = decoder.decode(cloner.node(i))
            fleet.on_frames(result.frames, now)
        t1 = time.perf_counter()
        fleet.tick(now)
        t2 = time.perf_counter()
        cache.render()  # (the renderer thread's work after each tick)
        t3 = time.perf_counter()
        rounds.append((t1 - t0, t2 - t1, t3 - t2))
        log(f"  fleet round {k}: decode {t1 - t0:.1f} s, tick {t2 - t1:.1f} s, /metrics {t3 - t2:.1f} s")
    scraped = cache.body(True)  # Prometheus scrapes with gzip: the compressed body is kept beside the text
    assert scraped
    del scraped, result
    classifier = fleet.classifier
    make_resident(classifier)
    trim()
    rss, hwm = proc_status_mb("VmRSS"), proc_status_mb("VmHWM")
    devices = len(classifier.registry)
    window = sum(a.nbytes for a in window_arrays(classifier))
    log("  fleet: accounting for every large object ...")
    parts = breakdown(_fleet_parts(fleet, decoder, text, cache), devices)
    return {
        "rss_mb": rss,
        "hwm_mb": hwm,
        "devices": devices,
        "capacity": classifier.registry.capacity,
        "nodes": len(classifier.registry.nodes),
        "window_bytes": window,
        "parts": parts,
        "rounds": rounds,
        "verdicts": len(fleet.board.snapshot()),
        "template_bytes": decoder.template_bytes,
        "body_bytes": len(cache.body(False) or b""),
        "fingerprint": code_fingerprint(),
    }


def _replay_imports() -> dict[str, Any]:
    from otel_dra import policy
    from otel_dra import replay as replay_mod
    from otel_dra.decode import stage as stage_mod

    return {"policy": policy, "replay_mod": replay_mod, "stage_mod": stage_mod}


def child_replay(path: Path) -> dict[str, Any]:
    m = _replay_imports()
    replay_mod = m["replay_mod"]
    kept: dict[str, Any] = {}

    class KeptClassifier(replay_mod.Classifier):  # type: ignore[name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            kept["classifier"] = self

    stage_mod = m["stage_mod"]

    class KeptDecoder(stage_mod.OtlpJsonDecoder):  # type: ignore[name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            kept["decoder"] = self

    replay_mod.Classifier = KeptClassifier
    stage_mod.OtlpJsonDecoder = KeptDecoder
    t0 = time.perf_counter()
    with open(os.devnull, "w") as out:  # one process (--one-process): the decoder's state beside the classifier's
        result = replay_mod.replay([path], m["policy"].load(), out, decode_process=False)
    wall = time.perf_counter() - t0
    classifier, decoder = kept["classifier"], kept["decoder"]
    make_resident(classifier)
    trim()
    rss, hwm = proc_status_mb("VmRSS"), proc_status_mb("VmHWM")
    devices = len(classifier.registry)
    window = sum(a.nbytes for a in window_arrays(classifier))
    reg = classifier.registry
    numpy_parts = [reg, classifier.extractor, classifier.groups, classifier.engine, *classifier.events.values()]
    parts = breakdown(
        [
            ("window arrays (the baseline)", lambda: window_arrays(classifier)),
            (
                "classifier: other per-device arrays (registry, features, policy groups, verdict engine, events)",
                lambda: [v for p in numpy_parts for v in vars(p).values() if isinstance(v, np.ndarray)],
            ),
            ("registry: device keys, rows, attributes (Python objects)", lambda: [reg]),
            ("classifier: the rest (device tables seen, evidence texts, policy)", lambda: [classifier]),
            ("replay result: final verdicts, timeline", lambda: [result]),
            ("decoder: attribute-list tokens and entries", lambda: [decoder]),
        ],
        devices,
    )
    return {
        "rss_mb": rss,
        "hwm_mb": hwm,
        "devices": devices,
        "capacity": reg.capacity,
        "window_bytes": window,
        "parts": parts,
        "wall_s": wall,
        "lines": result.lines,
        "points": result.points,
        "verdict_lines": result.verdict_lines,
        "fingerprint": code_fingerprint(),
    }


def run_child(*args: str) -> dict[str, Any]:
    """This script in a fresh interpreter, its answer as JSON on its last stdout line."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the report -----------------------------------------------------------------------------------------
def per_device(child: dict[str, Any], floor: dict[str, Any]) -> float:
    """Bytes a device costs beyond the window arrays: the child's RSS over the floor, less the window arrays."""
    return ((child["rss_mb"] - floor["rss_mb"]) * 2**20 - child["window_bytes"]) / child["devices"]


def section(
    fleet: dict[str, Any],
    fleet_floor: dict[str, Any],
    rep: dict[str, Any],
    rep_floor: dict[str, Any],
    args: Any,
    elapsed: float,
    recording: dict[str, Any],
    before: dict[str, Any] | None = None,
) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ok = lambda hit: "✅ met" if hit else "❌ missed"  # noqa: E731
    f_dev, r_dev = per_device(fleet, fleet_floor), per_device(rep, rep_floor)

    def row(what: str, child: dict[str, Any], floor: dict[str, Any], figure: float) -> str:
        beyond = (child["rss_mb"] - floor["rss_mb"]) * 2**20
        return (
            f"| {what} | {kb(figure)} a device | <= {kb(TARGET_BYTES)} | floor {floor['rss_mb']:,.0f} MiB; window "
            f"arrays {child['window_bytes'] / 2**20:,.0f} MiB ({kb(child['window_bytes'] / child['devices'])} a "
            f"device); RSS {child['rss_mb']:,.0f} MiB, {beyond / 2**20:,.0f} MiB over the floor | "
            f"{ok(figure <= TARGET_BYTES)} |"
        )

    def before_row(kind: str, what: str) -> list[str]:
        if before is None or kind not in before:
            return []
        child, floor = before[kind]["child"], before[kind]["floor"]
        then = per_device(child, floor)
        return [
            f"| ... {what} with {args.before_label} (code {child['fingerprint']}, same script) | {kb(then)} a "
            f"device | — | RSS {child['rss_mb']:,.0f} MiB, floor {floor['rss_mb']:,.0f} MiB | "
            f"x{then / (f_dev if kind == 'fleet' else r_dev):.1f} of it now |"
        ]

    def parts_table(child: dict[str, Any], floor: dict[str, Any]) -> list[str]:
        beyond = (child["rss_mb"] - floor["rss_mb"]) * 2**20 / child["devices"]
        listed = [(label, b) for label, b in child["parts"] if b >= 1.0]
        counted = sum(b for _, b in child["parts"])
        rows = sorted(listed[1:], key=lambda lb: -lb[1])
        out = ["| consumer | per device | share of the figure |", "|---|---|---|"]
        figure = per_device(child, floor)
        out.append(f"| {listed[0][0]} | {kb(listed[0][1])} | (not counted) |")
        for label, b in rows:
            out.append(f"| {label} | {kb(b)} | {b / figure:.0%} |")
        rest = beyond - counted
        out.append(
            f"| the rest: allocator fragmentation, free lists, what no object above reaches | {kb(rest)} | "
            f"{rest / figure:.0%} |"
        )
        return out

    fr = fleet["rounds"]
    quick = " (quick mode)" if args.quick else ""
    lines = [
        START,
        "## Memory per device beyond the window arrays (`bench/bench_memory.py`)",
        "",
        f"Measured {now}{quick} on {_report.cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__}; code {fleet['fingerprint']}. Each figure in a fresh child process: (RSS after "
        "`gc.collect()` and `malloc_trim` - the floor's RSS - the window arrays' `nbytes`) / devices. The floor: a "
        "child with the same imports and the same components built empty. The window arrays (window store ring, "
        "times and sums; horizon buckets) are made resident first, as a long run has them.",
        "",
        "| figure | measured | target | baseline (same run) | verdict |",
        "|---|---|---|---|---|",
        row(
            f"**Fleet**, {fleet['devices']:,} devices ({fleet['nodes']:,} nodes x {PER_NODE}): OTLP protobuf decoded, "
            f"{len(fr)} ticks, board, /metrics rendered and scraped",
            fleet,
            fleet_floor,
            f_dev,
        ),
        *before_row("fleet", "the fleet"),
        row(
            f"**Replay**, {rep['devices']:,} devices: {rep['lines']:,} OTLP JSON lines, state, decoder and result "
            "alive",
            rep,
            rep_floor,
            r_dev,
        ),
        *before_row("replay", "the replay"),
        f"| ... replay's peak (VmHWM) over the floor, less the window arrays | "
        f"{kb(((rep['hwm_mb'] - rep_floor['rss_mb']) * 2**20 - rep['window_bytes']) / rep['devices'])} a device | — | "
        f"VmHWM {rep['hwm_mb']:,.0f} MiB | — |",
        "",
        f"Fleet: where a device's {kb(f_dev)} goes (deep sizes, each object counted once, in the order "
        "listed in `bench_memory.py`):",
        "",
        *parts_table(fleet, fleet_floor),
        "",
        f"Replay: where a device's {kb(r_dev)} goes:",
        "",
        *parts_table(rep, rep_floor),
        "",
        f"- Fleet input: one agent's requests (its SDK pipeline, {PER_NODE} simulated GPUs) cloned into "
        f"{fleet['nodes']:,} nodes by rewriting the node name and serial numbers in place; round 0 is each node's "
        f"first request (the decoder's plain way: {fr[0][0]:,.0f} s), rounds 1-{len(fr) - 1} steady (decode "
        f"{np.median([r[0] for r in fr[1:]]):.1f} s, tick {np.median([r[1] for r in fr[1:]]):.1f} s, /metrics "
        f"{np.median([r[2] for r in fr[1:]]):.1f} s, medians). Registry capacity {fleet['capacity']:,} rows; "
        f"/metrics body {fleet['body_bytes'] / 2**20:,.0f} MiB as text (kept gzip-compressed); decoder templates "
        f"{fleet['template_bytes'] / 2**20:,.0f} MiB.",
        f"- Replay input: {recording['nodes']:,} nodes x {PER_NODE} GPUs, {REPLAY_TICKS} lines a node 10 s apart "
        f"({recording['bytes'] / 1e9:,.1f} GB of JSON, gzip), {rep['points']:,} points, replayed in "
        f"{rep['wall_s']:,.0f} s; "
        f"{rep['verdict_lines']:,} verdict lines.",
        "",
        f"Reproduce: `.venv/bin/python bench/bench_memory.py{' --quick' if args.quick else ''}` (this run took "
        f"{elapsed / 60:,.0f} min).",
        END,
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=100_000, help="fleet devices (8 a node)")
    parser.add_argument("--replay-devices", type=int, default=10_000, help="replay devices (8 a node)")
    parser.add_argument("--quick", action="store_true", help="10,000 fleet devices, 2,000 replayed")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    parser.add_argument(
        "--only", choices=("fleet", "replay"), help="measure one figure and print it (nothing is written)"
    )
    parser.add_argument("--json-out", type=Path, help="also write the measurements here (for --before)")
    parser.add_argument(
        "--before",
        type=Path,
        help="a --json-out of this script run on the code before a change: a row per figure says what it measured",
    )
    parser.add_argument("--before-label", default="the code before", help="what --before measured (a commit)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "floor":
            out = child_floor(rest[0], Path(rest[1]))
        elif kind == "fleet":
            out = child_fleet(Path(rest[0]), int(rest[1]))
        else:
            out = child_replay(Path(rest[0]))
        print(json.dumps(out))
        return 0
    fleet_nodes = (10_000 if args.quick else args.devices) // PER_NODE
    replay_nodes = (2_000 if args.quick else args.replay_devices) // PER_NODE
    fingerprint = code_fingerprint()
    with tempfile.TemporaryDirectory(prefix="bench_memory-") as tmp:
        templates = Path(tmp) / "requests.pickle"
        log(f"one agent's requests through its SDK pipeline ({max(ROUNDS, REPLAY_TICKS)} rounds) ...")
        requests = agent_requests(max(ROUNDS, REPLAY_TICKS))
        templates.write_bytes(pickle.dumps(requests[:ROUNDS]))
        recording = Path(tmp) / "fleet.jsonl.gz"
        written = 0
        if args.only != "fleet":
            log(f"the replay's recording: {replay_nodes:,} nodes x {REPLAY_TICKS} lines ...")
            written = write_recording(recording, requests[:REPLAY_TICKS], replay_nodes)
        del requests
        measured: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        if args.only != "replay":
            log(f"fleet of {fleet_nodes * PER_NODE:,} devices ({ROUNDS} rounds) ...")
            measured["fleet"] = (
                run_child("fleet", str(templates), str(fleet_nodes)),
                run_child("floor", "fleet", str(templates)),
            )
        if args.only != "fleet":
            log(f"replay of {replay_nodes * PER_NODE:,} devices ...")
            measured["replay"] = (run_child("replay", str(recording)), run_child("floor", "replay", str(templates)))
    if args.only:
        child, floor = measured[args.only]
        print(f"{args.only}: {per_device(child, floor):,.0f} bytes a device beyond the window arrays")
        for label, nbytes in child["parts"]:
            print(f"  {nbytes:8,.0f}  {label}")
        return 0
    (fleet, fleet_floor), (rep, replay_floor) = measured["fleet"], measured["replay"]
    for child in (fleet, rep):
        if child["fingerprint"] != fingerprint:
            raise SystemExit("the code under test changed during the run (a shared tree): run it again")
    if args.json_out:
        args.json_out.write_text(json.dumps({k: {"child": c, "floor": f} for k, (c, f) in measured.items()}))
    before = json.loads(args.before.read_text()) if args.before else None
    text = section(
        fleet,
        fleet_floor,
        rep,
        replay_floor,
        args,
        time.time() - T0_WALL,
        {"nodes": replay_nodes, "bytes": written},
        before,
    )
    print(text)
    if not args.no_write:
        _report.write_section(START, END, text, BENCHMARKS_MD)
    return 0


if __name__ == "__main__":
    sys.exit(main())
