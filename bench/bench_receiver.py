"""Benchmark of the fleet's OTLP receiver path: protobuf requests into the window store, points per
second on one core.

Run ``.venv/bin/python bench/bench_receiver.py [--nodes 1000] [--devices 8]``; the figures go to the
terminal and to ``BENCHMARKS.md`` (only the section between the ``bench_receiver`` markers is
replaced).

A benchmark, not a timed test. The requests are what agents send: each simulated node runs the
agent's own pipeline (``MetricsSink`` on the OpenTelemetry SDK with the agent's resource and
views), and each collection is encoded and serialized exactly as the SDK's OTLP exporters do
(``encode_metrics(...).SerializeToString()``). One round is one export of every node; round 0
warms both sides up (first sight of every node and device), rounds 1-3 are timed, best of 3.

- **Fleet end to end**: what ``otel-dra fleet`` does with a round: :meth:`OtlpProtoDecoder.decode` of
  each request's bytes (the receiver's threads), the frames of the round in one
  ``Classifier.ingest_many`` and one ``evaluate`` (the fleet's tick). Its baseline in the same run: the
  same work with ``ingest_many`` per request (the fleet before it batched a tick's requests).
- **Decode alone**, against the same decoder with its templates' digest SHA-256 (before: XXH3-128).
- **Baseline** of the decoder: the generic path on the same bytes: ``ExportMetricsServiceRequest.FromString``,
  ``google.protobuf.json_format.MessageToDict``, then the replay decoder's plain walk of that dict
  into frames (the reading of the JSON mapping this project already has), then ``ingest_many`` per request.
- **Where the time goes**: one end-to-end round under cProfile, its time by stage.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import hashlib
import os
import platform
import pstats
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import google.protobuf
import numpy as np
from google.protobuf.internal import api_implementation
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_dra import __version__, policy
from otel_dra import conventions as cv
from otel_dra.classifier import Classifier
from otel_dra.decode import OtlpJsonDecoder
from otel_dra.decode import proto_templates as otlp_proto  # (where the templates' digests are made)
from otel_dra.decode.otlp_proto import OtlpProtoDecoder
from otel_dra.frame import Frame, Schema
from otel_dra.sinks import provider
from otel_dra.sinks.metrics import MetricsSink
from otel_dra.sinks.verdict_metrics import VERDICT_METRICS, VerdictMetrics
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from otel_dra.state import FrameStore, VerdictBoard

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402

BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
START, END = "<!-- bench_receiver:start -->", "<!-- bench_receiver:end -->"
TARGET_POINTS_PER_S = 1_000_000  # issue #17: the fleet end to end, on one core
S = 10**9
T0 = 1_795_000_000 * S
ROUNDS = 4  # round 0 warms up; 1..3 are timed


# -- the agents' requests ---------------------------------------------------------------------
def node_requests(args: tuple[int, int, int]) -> list[bytes]:
    """Node ``index``'s requests (``agent_requests`` for a process pool)."""
    index, devices, rounds = args
    return agent_requests(f"node-{index:04d}", devices, rounds, seed=index)


def agent_requests(
    node: str, devices: int, rounds: int, seed: int = 0, source: type[SimulatedSource] = SimulatedSource
) -> list[bytes]:
    """One node's agent pipeline, sampled ``rounds`` times: each collection serialized as the OTLP
    exporter sends it. Wired as ``otel-dra run`` wires it: the data sink, and the verdicts (``hw.status``,
    ``dra.device.health``) of the node's own classifier. ``source``: the simulator, or one that names its
    devices otherwise."""
    schema = Schema()
    src = source(SimulatorConfig(node, devices=devices, seed=seed, start_unix_nano=T0), schema)
    store = FrameStore()
    reader = InMemoryMetricReader()
    mp = provider.build_meter_provider(node, [reader], 5000)
    meter = mp.get_meter(cv.AGENT_SCOPE, __version__)
    MetricsSink(store, schema, meter, max_age_s=3600.0, exclude=VERDICT_METRICS)
    board = VerdictBoard()
    VerdictMetrics(board, meter)
    judge = Classifier(policy.load(), schema, interval_s=10.0)
    out = []
    for k in range(rounds):
        t = T0 + k * 10 * S
        frame = src.read(t)
        judge.ingest(frame)
        attrs = dict(zip(frame.devices.ids, frame.devices.attrs, strict=True))
        board.update(judge.evaluate(t), lambda _node, dev, attrs=attrs: attrs[dev])
        store.put(frame, time.monotonic_ns())
        data = reader.get_metrics_data()
        assert data is not None
        out.append(encode_metrics(data).SerializeToString())
    mp.shutdown()
    return out


def make_rounds(nodes: int, devices: int) -> list[list[bytes]]:
    """``ROUNDS`` rounds of one request per node (built on every CPU; nothing timed here)."""
    with ProcessPoolExecutor() as pool:
        per_node = list(pool.map(node_requests, [(i, devices, ROUNDS) for i in range(nodes)], chunksize=16))
    return [[reqs[k] for reqs in per_node] for k in range(ROUNDS)]


def count_points(requests: list[bytes]) -> int:
    """Points as the decoders count them (an agent's own ``hw.status``, its verdict, is not input)."""
    decoder = OtlpProtoDecoder(Schema(), fast=False)
    return sum(decoder.decode(request).points for request in requests)


# -- the two sides ------------------------------------------------------------------------------
class DictDecoder(OtlpJsonDecoder):
    """The replay decoder fed a dict already parsed (MessageToDict's output is the JSON mapping): its
    plain walk, without the text tokenizing that only applies to JSON text."""

    def _parse(self, text: Any, raw: bytes | None, reduced: bytes | None) -> tuple[Any, bool, str | None]:
        return text, False, None


def classifier(schema: Schema, nodes: int, devices: int) -> Classifier:
    return Classifier(policy.load(), schema, interval_s=10.0, capacity=nodes * devices)


Side = Callable[[list[bytes]], None]


class _Clock:
    """The round's evaluation time: each round is 10 s after the one before (as the requests are)."""

    def __init__(self) -> None:
        self.t = T0

    def next(self) -> int:
        now, self.t = self.t, self.t + 10 * S
        return now


def end_to_end(nodes: int, devices: int) -> Side:
    """The fleet's round: every request decoded, the round's frames in one ``ingest_many``, one ``evaluate``."""
    decoder = OtlpProtoDecoder(Schema())
    clf = classifier(decoder.schema, nodes, devices)
    clock = _Clock()

    def run(requests: list[bytes]) -> None:
        frames: list[Frame] = []
        for request in requests:
            frames += decoder.decode(request).frames
        clf.ingest_many(frames)
        clf.evaluate(clock.next())

    run.decoder = decoder  # type: ignore[attr-defined]
    return run


def ours(nodes: int, devices: int, fast: bool = True, evaluate: bool = True) -> Side:
    """The same with ``ingest_many`` per request, as ``on_frames`` hands them on (the fleet before batching)."""
    decoder = OtlpProtoDecoder(Schema(), fast=fast)
    clf = classifier(decoder.schema, nodes, devices)
    clock = _Clock()

    def run(requests: list[bytes]) -> None:
        for request in requests:
            clf.ingest_many(decoder.decode(request).frames)
        if evaluate:
            clf.evaluate(clock.next())

    return run


class _Sha256:
    """The templates' digest before XXH3-128 (the decode baseline), in ``xxhash``'s call shape."""

    @staticmethod
    def xxh3_128_digest(data: bytes | bytearray) -> bytes:
        return hashlib.sha256(data).digest()


def ours_decode_only(nodes: int, devices: int, sha256: bool = False) -> Side:
    decoder = OtlpProtoDecoder(Schema())

    def run(requests: list[bytes]) -> None:
        saved = otlp_proto.xxhash
        if sha256:
            otlp_proto.xxhash = _Sha256  # type: ignore[assignment]
        try:
            for request in requests:
                decoder.decode(request)
        finally:
            otlp_proto.xxhash = saved

    return run


def baseline(nodes: int, devices: int) -> Side:
    decoder = DictDecoder(Schema())
    clf = classifier(decoder.schema, nodes, devices)
    clock = _Clock()

    def run(requests: list[bytes]) -> None:
        for n, request in enumerate(requests, 1):
            doc = MessageToDict(ExportMetricsServiceRequest.FromString(request))
            frames, errors = decoder.decode_line(doc, n)  # type: ignore[arg-type]
            assert not errors, errors[:3]
            clf.ingest_many(frames)
        clf.evaluate(clock.next())

    return run


#: Profile stages: the first function of the round's call tree each one's time is read off (cumulative).
STAGES = (
    ("decode: template match (copy, gather, digest)", "otlp_proto.py", "_fast_section"),
    ("decode: values checked and scattered into frames", "otlp_proto.py", "_apply"),
    ("decode: the request's frames, series time order", "otlp_proto.py", "_frames"),
    ("ingest: each frame's rows (cached per device table)", "classifier/batch.py", "_of_frame"),
    ("ingest: features (counter increases, gauges)", "features.py", "extract"),
    ("ingest: window store", "window.py", "append"),
    ("ingest: long horizon", "horizon.py", "append"),
    ("evaluate: rules, verdict engine, freshness", "classifier/classifier.py", "evaluate"),
)


def profile_shares(nodes: int, devices: int, rounds: list[list[bytes]]) -> tuple[float, list[tuple[str, float]]]:
    """One end-to-end round under cProfile (after a warm-up round): its total and each stage's share."""
    side = end_to_end(nodes, devices)
    side(rounds[0])
    prof = cProfile.Profile()
    prof.enable()
    side(rounds[1])
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, _), (_, _, tt, _, _) in stats.items())
    shares = []

    def cumulative(path: str, func: str) -> float:
        return sum(ct for (file, _, name), (_, _, _, ct, _) in stats.items() if name == func and file.endswith(path))

    for label, path, func in STAGES:
        cum = cumulative(path, func)
        if func == "_fast_section":  # (it calls _apply, a stage of its own)
            cum -= cumulative("otlp_proto.py", "_apply")
        shares.append((label, cum / total))
    return total, shares


def timed(side: Side, rounds: list[list[bytes]]) -> list[float]:
    """Warm up on round 0, then one timed pass over each later round (times increase per node)."""
    side(rounds[0])
    times = []
    for requests in rounds[1:]:
        gc.collect()
        t0 = time.perf_counter()
        side(requests)
        times.append(time.perf_counter() - t0)
    return times


# -- the report -------------------------------------------------------------------------------
def machine() -> str:
    cpu = _report.cpu_model()
    return (
        f"{cpu or platform.processor() or 'unknown CPU'}, {os.cpu_count()} CPUs (nproc), "
        f"Python {platform.python_version()}, numpy {np.__version__}, protobuf {google.protobuf.__version__} "
        f"({api_implementation.Type()} backend), {platform.system()} {platform.machine()}"
    )


def write_section(section: str) -> None:
    """Replace (or append) our section of BENCHMARKS.md, leaving the rest of the file as it is."""
    _report.write_section(START, END, section, BENCHMARKS_MD)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes (one request each per round)")
    parser.add_argument("--devices", type=int, default=8, help="GPUs per node")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()

    t0 = time.perf_counter()
    print(f"building {ROUNDS} rounds of {args.nodes} agents' requests...", file=sys.stderr)
    rounds = make_rounds(args.nodes, args.devices)
    build_s = time.perf_counter() - t0
    points = count_points(rounds[1])
    size = sum(len(r) for r in rounds[1])

    e2e = end_to_end(args.nodes, args.devices)
    results = {"e2e": timed(e2e, rounds)}
    decoder: OtlpProtoDecoder = e2e.decoder  # type: ignore[attr-defined]
    results["per_request"] = timed(ours(args.nodes, args.devices), rounds)
    results["decode"] = timed(ours_decode_only(args.nodes, args.devices), rounds)
    results["decode_sha"] = timed(ours_decode_only(args.nodes, args.devices, sha256=True), rounds)
    print("profiling a round, then the plain path and the baseline (slow)...", file=sys.stderr)
    profiled_s, shares = profile_shares(args.nodes, args.devices, rounds)
    results["plain"] = timed(ours(args.nodes, args.devices, fast=False), rounds)
    results["baseline"] = timed(baseline(args.nodes, args.devices), rounds)

    best = {name: min(times) for name, times in results.items()}
    pps = {name: points / t for name, t in best.items()}
    met = pps["e2e"] >= TARGET_POINTS_PER_S
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    fmt = ", ".join

    def row(what: str, name: str, target: str = "—", verdict: str = "—", vs: str = "—") -> str:
        per_req = best[name] / args.nodes * 1e6
        return (
            f"| {what} | {best[name]:.3f} s | {per_req:,.0f} µs | {pps[name]:,.0f} points/s | {target} | {vs} | "
            f"{verdict} |"
        )

    def runs(name: str) -> str:
        return fmt(f"{t:.3f}" for t in results[name])

    lines = [
        START,
        "## OTLP receiver and the fleet's tick: protobuf requests to verdicts (`bench/bench_receiver.py`)",
        "",
        f"Measured {now} on {machine()}; one core (decode, ingest and evaluate are single-threaded).",
        f"Input: {args.nodes:,} nodes x {args.devices} simulated GPUs, one request per node per round as the "
        f"agent's SDK pipeline serializes it ({points / args.nodes:,.0f} points, {size / args.nodes / 1e3:,.0f} kB "
        f"per request; {points:,} points, {size / 1e6:,.1f} MB per round). Round 0 warms up; rounds 1-3 are "
        "timed, best of 3.",
        "",
        "| what | best round | per request | throughput | target | vs (same run) | verdict |",
        "|---|---|---|---|---|---|---|",
        row(
            "**Fleet end to end**: decode every request, the round's frames in one `ingest_many`, one `evaluate`",
            "e2e",
            f">= {TARGET_POINTS_PER_S:,} points/s",
            "✅ met" if met else "❌ missed",
            f"x{pps['e2e'] / pps['per_request']:.2f} the per-request row",
        ),
        row("... with `ingest_many` per request (the fleet before it batched a tick), one `evaluate`", "per_request"),
        row(
            "Decode alone (templates digested with XXH3-128)",
            "decode",
            vs=f"x{pps['decode'] / pps['decode_sha']:.2f} the SHA-256 row",
        ),
        row("... templates digested with SHA-256 (before)", "decode_sha"),
        row("Decode, plain path only (`fast=False`: upb parse, a walk over its messages), per-request ingest", "plain"),
        row(
            "**Baseline**: `FromString` + `MessageToDict` + the replay decoder's walk + `ingest_many` per request",
            "baseline",
            vs=f"end to end x{pps['e2e'] / pps['baseline']:,.0f} faster",
        ),
        "",
        f"Where an end-to-end round's time goes (cProfile of one round, {profiled_s:.3f} s profiled; profiling "
        "inflates call-heavy code, so read these as rough proportions):",
        "",
        "| stage | share |",
        "|---|---|",
        *(f"| {label} | {share:.0%} |" for label, share in shares),
        f"| the rest (request framing, frame assembly, batching) | {max(0.0, 1 - sum(x for _, x in shares)):.0%} |",
        "",
        f"- Runs (s): end to end {runs('e2e')}; per request {runs('per_request')}; decode alone {runs('decode')}; "
        f"decode with SHA-256 {runs('decode_sha')}; plain path {runs('plain')}; baseline {runs('baseline')}.",
        "- The fixed cost per frame that batching removes (issue #17): `ingest_many` runs its array work once per "
        "call, so one call per request paid it once per node; the fleet queues a tick's requests and ingests them "
        "in one call. What was left per frame, the look-up of each device's row, is cached per device table (a node "
        "sending the same devices again looks up none), and the templates' SHA-256, half of decoding a request, "
        "is XXH3-128 (2 µs for a 100 kB request instead of 90 µs; why a non-cryptographic digest is enough: "
        "`otel_dra/decode/proto_templates.py`, `Template`).",
        f"- Why decoding is fast: an agent's request repeats its previous one byte for byte except the 8-byte "
        "payloads of times and values, so after a node's first request each `ResourceMetrics` is checked against "
        "a template (payloads gathered and zeroed with one numpy fancy index, the rest digested and compared with "
        "the template's digest) and its values scattered into the frame with one numpy write. "
        f"`ResourceMetrics` sections read from templates over the 4 rounds: {decoder.sections_fast:,}; the plain "
        f"way: {decoder.sections_plain:,} (round 0, each node's first request). Templates held: "
        f"{decoder.template_bytes / 1e6:,.1f} MB for {args.nodes:,} nodes.",
        "",
        f"Reproduce: `.venv/bin/python bench/bench_receiver.py` (about {time.perf_counter() - t0 + 10:,.0f} s, "
        f"of which {build_s:,.0f} s builds the requests through the SDK and most of the rest is the baseline; "
        "`--nodes N` for another fleet size).",
        END,
        "",
    ]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        write_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
