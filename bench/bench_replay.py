"""Benchmark of the replay on a messy fleet: time and memory against a per-sample script, and the score table.

Run ``.venv/bin/python bench/bench_replay.py [--seeds 1,2,3] [--runs 2] [--small-runs 5] [--workdir DIR] [--quick]``;
the figures go to the terminal and to ``BENCHMARKS.md`` (only the section between the
``bench_replay`` markers is replaced). The full run takes 20 to 28 minutes on 2 cores.

A benchmark, not a timed test. The input is the scenario generator's long form
(``otel_dra.scenario.form("long", seed=N)``: 64 nodes x 8 GPUs, 2 hours, per-node sampling
intervals of 5 to 60 s with jitter and clock skew, every fault kind, traps and a silent node),
the shape a real fleet's Collector file has. ``--quick`` uses the short form (12 x 4, 50 minutes).
The time is also measured on a small fleet (``SMALL_FLEET``: the same form with 29 nodes x 1 GPU, 32
devices, the fewest the scenario places every fault and trap on), where what an evaluation costs
whatever the fleet's size weighs most.

1. **Time.** Both sides do the whole job from the same gzip file: read, gunzip, parse, judge,
   write verdict lines to a file. Each runs in its own fresh child process (so neither inherits
   the other's heap or warm caches), alternating, best of ``--runs`` (the small fleet's, of
   ``--small-runs``: its runs take seconds, and its ratio is read at the percent where this machine's
   speed drifts by more within an hour); the clock is a ``perf_counter`` around the work alone (no
   interpreter start or imports).

   Both fleets (the form's, and the small one) are timed so, each its own row and target; and again as a
   Collector writes them (:func:`batched_like_collector`: its batch processor as ``collector-config.yaml``
   sets it, 8,192 points or 2 s a request, behind its ``file`` exporter: each line a batch of several nodes'
   resources, a different mix each line), ours and the baseline on the same batched file.

   - **Ours**: :func:`otel_dra.replay.replay` with the default policy (``otel_dra.policy.load()``), as
     ``otel-dra replay`` runs it: decoding in a second process where a second core is there
     (:mod:`otel_dra.decode.stage`); and again with decoding in the same process (one core), so the table
     shows both, with each side's CPU time (``getrusage``, the decode process's included) beside its wall
     time. The two modes' verdict files are compared byte for byte.
   - **Baseline**: :func:`baseline_replay` below, the plain-Python per-sample rule set an operator
     would script: ``json.loads`` each line, walk resourceMetrics → scopeMetrics → metrics →
     dataPoints, key each point to its device ((``k8s.node.name``, ``hw.id``), or its ``hw.parent``
     for a sensor), gather one sample per device per line, and for every sample update that
     device's Python state and apply its rules: counter increases with reset handling (a value
     that went down is a new baseline; a series new on a known device counts whole), a deque of the
     last 5 minutes of samples with running sums, and the rules thermal (above the sensor's own
     ``hw.temperature.limit{high.degraded}``, else 85 °C, in ≥ 50% of the window), cooling (fan below
     its ``low.degraded`` limit, else 300 rpm or a 5% ratio, while above 40 °C, ≥ 50%), uncorrected
     ECC (an increase ≥ 1 in the window), corrected ECC (> 6/min), power throttling (throttle time
     increase / window seconds ≥ 0.5), memory pressure (utilization ≥ 0.95 in ≥ 80%), PCIe width
     below its maximum (≥ 50%), driver errors (any increase) and ``hw.status{failed}`` = 1; plus a
     staleness scan (devices not heard for 60 s of the trace's clock) every 5 s of trace time. It
     writes a verdict line whenever a device's set of flagged rules changes.

   Why it is fair: the baseline does *less* than we do (no cohorts, horizons, hysteresis,
   escalation, per-device intervals, clock skew or limits beyond the few above, and it keeps
   running sums rather than rescanning its window), so it is a floor on what a per-sample script
   costs, not a strawman. It need not agree with our verdicts: it is the cost of the approach.
2. **Memory.** Peak RSS (``VmHWM``) of our replay's child against (a) a child that only imports
   ``otel_dra`` and builds the classifier (the interpreter floor), (b) the RSS at the end of our
   replay with the classifier's state still alive (``VmRSS`` after ``gc.collect()`` and
   ``malloc_trim``; the replay's ``Classifier`` is subclassed in that child only to keep a
   reference to it), and (c) for contrast, a child that decodes every frame of the same file into a
   list and keeps them (what the replay did before it streamed). Target: our peak ≤ 2x (b), i.e.
   nothing transient the size of the recording is held.
3. **Score table.** Each seed's long form is generated (reused from ``--workdir`` when the same
   file is already there), replayed by our child (seed 1's from the timed runs) and scored with
   :func:`otel_dra.scenario.score_files`, against the scorer's own targets. Nothing here changes a
   threshold: this benchmark only measures. The public example (``../shared/examples``) is
   replayed too and scored by its own ``score_verdicts.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402

BENCHMARKS_MD = _report.BENCHMARKS_MD
EXAMPLES = ROOT.parent / "shared" / "examples"
EXAMPLE_FILE = EXAMPLES / "fleet-sample.jsonl.gz"
EXAMPLE_LABELS = EXAMPLES / "fleet-sample.labels.json"
EXAMPLE_SCORER = EXAMPLES / "score_verdicts.py"
START, END = "<!-- bench_replay:start -->", "<!-- bench_replay:end -->"
TIME_TARGET_RATIO = 0.35
#: The small fleet timed beside the form's: the form with these changed. 27 GPUs is what the scenario needs
#: outside the silent and the restarted node for every fault and trap; at one a node that is 29 nodes, and with
#: the hot-plugged and the shared device 32 devices.
SMALL_FLEET: dict[str, Any] = {"nodes": 29, "devices_per_node": 1}
RSS_TARGET_RATIO = 2.0
#: The Collector's batch processor as collector-config.yaml sets it: a request is sent at this many points, or
#: this long after its first.
BATCH_POINTS, BATCH_TIMEOUT_S = 8192, 2.0
PROGRESS_EVERY_S = 30.0
T_START = time.perf_counter()
#: The parent's start (wall clock), passed to the children so that every progress line counts from it.
T0_ENV = "BENCH_REPLAY_T0"
T0_WALL = float(os.environ.get(T0_ENV) or time.time())


def log(message: str) -> None:
    print(f"[{time.time() - T0_WALL:6.0f} s] {message}", file=sys.stderr, flush=True)


def code_fingerprint() -> str:
    """A hash of the code under test (``otel_dra/``'s Python and YAML): the tree is shared, so the run
    checks that it measured one version of it."""
    digest = hashlib.sha1()
    for path in sorted((ROOT / "otel_dra").rglob("*")):
        if path.suffix in (".py", ".yaml") and path.is_file():
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def code_label() -> str:
    """The commit measured, and whether ``otel_dra/`` had uncommitted changes."""
    try:
        git = ["git", "-C", str(ROOT)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "otel_dra"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "a source tree outside git"
    return f"commit `{head.stdout.strip()}`" + (
        " with uncommitted changes under otel_dra/" if dirty.stdout.strip() else ""
    )


# -- the baseline: a plain-Python per-sample rule set ------------------------------------------------

WINDOW_S = 300.0
STALE_S = 60.0
SCAN_EVERY_S = 5.0
MIN_SAMPLES = 3
FALLBACK_HOT_C = 85.0
MIN_RPM, MIN_RATIO, WARM_C = 300.0, 0.05, 40.0
#: Attributes that tell one series of a metric from another (the rest describe the device).
QUALIFIERS = frozenset(
    {"hw.state", "hw.limit_type", "error.type", "hw.error.code", "hw.throttle.reason", "hw.link.type",
     "hw.sensor_location", "network.io.direction"}
)  # fmt: skip
#: Rule inputs by series ("name|qualifier values", in their keys' order); counters are summed, gauges keep the last.
ROLES = {
    "hw.temperature|gpu": "temp",
    "hw.temperature.limit|high.degraded|gpu": "temp_limit",
    "hw.fan.speed": "rpm",
    "hw.fan.speed.limit|low.degraded": "rpm_limit",
    "hw.fan.speed_ratio": "ratio",
    "hw.errors|uncorrected": "unc",
    "hw.errors|corrected": "corr",
    "hw.throttle.time|power": "thr",
    "hw.gpu.memory.utilization": "mem",
    "hw.pcie.link.width": "width",
    "hw.pcie.link.width.limit|max": "width_limit",
    "hw.status|failed": "failed",
}
#: Flags that fail the device; the rest degrade it. Flags are the contract's reasons, but for corrected ECC.
UNHEALTHY = frozenset({"memory_ecc", "driver_errors", "vendor_status"})
REASON = {"memory_ecc_corrected": "memory_ecc"}


def role_of(series: str) -> str | None:
    if series.startswith("hw.errors|driver"):  # one series per hw.error.code
        return "drv"
    return ROLES.get(series)


class Device:
    """One device's state: counter baselines, remembered limits, the window and its running sums."""

    __slots__ = ("counters", "flags", "heard", "limits", "samples", "sums", "window")

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.limits: dict[str, float] = {}
        self.window: deque[tuple[float, int, int, float, float, float, int, int, float]] = deque()
        self.sums = [0, 0, 0.0, 0.0, 0.0, 0, 0, 0.0]  # hot, fan, unc, corr, thr, mem, width, drv
        self.flags: frozenset[str] = frozenset()
        self.heard = 0.0
        self.samples = 0

    def increase(self, series: str, value: float) -> float:
        """A counter's increase since its last value: reset → new baseline; new series on a known device → whole."""
        last = self.counters.get(series)
        self.counters[series] = value
        if last is None:
            return value if self.samples else 0.0
        return value - last if value >= last else 0.0

    def judge(self, t: float, v: dict[str, float]) -> frozenset[str]:
        """Add one sample to the window and apply every rule to it."""
        lim = self.limits
        for key in ("temp_limit", "rpm_limit", "width_limit"):
            if key in v:
                lim[key] = v[key]
        temp = v.get("temp", 0.0)
        hot = int(temp > lim.get("temp_limit", FALLBACK_HOT_C))
        fan = 0
        if temp > WARM_C:
            if "rpm" in v:
                fan = int(v["rpm"] < lim.get("rpm_limit", MIN_RPM))
            elif "ratio" in v:
                fan = int(v["ratio"] < MIN_RATIO)
        mem = int(v.get("mem", 0.0) >= 0.95)
        width = int("width" in v and v["width"] < lim.get("width_limit", v["width"]))
        row = (t, hot, fan, v.get("unc", 0.0), v.get("corr", 0.0), v.get("thr", 0.0), mem, width, v.get("drv", 0.0))
        w, s = self.window, self.sums
        w.append(row)
        for i in range(8):
            s[i] += row[i + 1]
        while t - w[0][0] > WINDOW_S:
            old = w.popleft()
            for i in range(8):
                s[i] -= old[i + 1]
        n = len(w)
        flags = set()
        if n >= MIN_SAMPLES:
            if s[0] >= 0.5 * n:
                flags.add("thermal")
            if s[1] >= 0.5 * n:
                flags.add("cooling")
            if s[5] >= 0.8 * n:
                flags.add("memory_pressure")
            if s[6] >= 0.5 * n:
                flags.add("link")
        if s[2] >= 1:
            flags.add("memory_ecc")
        if s[3] / (WINDOW_S / 60.0) > 6.0:
            flags.add("memory_ecc_corrected")
        if s[4] / WINDOW_S >= 0.5:
            flags.add("power_throttling")
        if s[7] >= 1:
            flags.add("driver_errors")
        if v.get("failed", 0.0) == 1.0:
            flags.add("vendor_status")
        return frozenset(flags)


def write_verdict(out: IO[str], t_ns: int, node: str, hw_id: str, flags: frozenset[str]) -> None:
    if "stale" in flags:
        health, state = "Unknown", None
    elif flags & UNHEALTHY:
        health, state = "Unhealthy", "failed"
    else:
        health, state = "Healthy", "degraded" if flags else "ok"
    doc = {"time_unix_nano": t_ns, "k8s.node.name": node, "hw.id": hw_id, "health": health, "hw.state": state,
           "reasons": sorted({REASON.get(f, f) for f in flags})}  # fmt: skip
    out.write(json.dumps(doc, separators=(", ", ": ")) + "\n")


def baseline_replay(path: Path, out: IO[str]) -> dict[str, int]:
    """The per-sample script: every line parsed whole, every sample judged as it comes (see the module doc)."""
    devices: dict[tuple[str, str], Device] = {}
    lines = points = verdicts = 0
    clock = next_scan = 0.0
    shown = time.perf_counter()
    with gzip.open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            doc = json.loads(raw)
            lines += 1
            for rm in doc.get("resourceMetrics", ()):
                node = ""
                for a in rm.get("resource", {}).get("attributes", ()):
                    if a["key"] == "k8s.node.name":
                        node = a["value"].get("stringValue", "")
                samples: dict[str, tuple[Device, dict[str, float], list[int]]] = {}
                for sm in rm.get("scopeMetrics", ()):
                    for m in sm.get("metrics", ()):
                        data = m.get("gauge") or m.get("sum")
                        if data is None:
                            continue
                        counter = bool(data.get("isMonotonic"))
                        for p in data.get("dataPoints", ()):
                            points += 1
                            hw_id = parent = None
                            quals = []
                            for a in p.get("attributes", ()):
                                k = a["key"]
                                if k == "hw.id":
                                    hw_id = a["value"].get("stringValue")
                                elif k == "hw.parent":
                                    parent = a["value"].get("stringValue")
                                elif k in QUALIFIERS:
                                    quals.append((k, str(a["value"].get("stringValue"))))
                            if len(quals) > 1:  # attribute order is the producer's: sort by key
                                quals.sort()
                            series = "|".join([m["name"], *(q[1] for q in quals)])
                            owner = parent or hw_id
                            if owner is None:
                                continue
                            entry = samples.get(owner)
                            if entry is None:
                                dev = devices.get((node, owner))
                                if dev is None:
                                    dev = devices[(node, owner)] = Device()
                                entry = samples[owner] = (dev, {}, [0])
                            dev, values, stamp = entry
                            stamp[0] = max(stamp[0], int(p.get("timeUnixNano", 0)))
                            role = role_of(series)
                            if role is None:
                                continue
                            value = float(p["asDouble"]) if "asDouble" in p else float(p.get("asInt", 0))
                            if counter:
                                values[role] = values.get(role, 0.0) + dev.increase(series, value)
                            else:
                                values[role] = value
                for owner, (dev, values, stamp) in samples.items():
                    t = stamp[0] / 1e9
                    clock = max(clock, t)
                    dev.heard = clock
                    dev.samples += 1
                    flags = dev.judge(t, values)
                    if flags != dev.flags or dev.samples == 1:
                        dev.flags = flags
                        write_verdict(out, stamp[0], node, owner, flags)
                        verdicts += 1
            if clock >= next_scan:  # the staleness scan, every SCAN_EVERY_S of trace time
                next_scan = clock + SCAN_EVERY_S
                for (node, hw_id), dev in devices.items():
                    if clock - dev.heard > STALE_S and "stale" not in dev.flags:
                        dev.flags = frozenset({"stale"})
                        write_verdict(out, round(clock * 1e9), node, hw_id, dev.flags)
                        verdicts += 1
            if lines % 500 == 0 and time.perf_counter() - shown > PROGRESS_EVERY_S:
                shown = time.perf_counter()
                log(f"  baseline: {lines:,} lines, {points:,} points")
    return {"lines": lines, "points": points, "verdict_lines": verdicts, "devices": len(devices)}


# -- children: one measurement each, JSON on stdout ----------------------------------------------------


def cpu_times() -> tuple[float, float]:
    """(this process's CPU-seconds, its waited-for children's): user + system."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def child_ours(path: Path, out_path: Path, decode_process: bool | None = None) -> dict[str, Any]:
    """Our replay, as the CLI runs it (``decode_process`` None: decoding in a second process where a second core
    is there), or with decoding in this one (False)."""
    import resource

    from otel_dra import policy as policy_mod
    from otel_dra import replay as replay_mod

    kept: list[Any] = []

    class KeptClassifier(replay_mod.Classifier):  # type: ignore[misc, name-defined]
        """The replay's classifier, kept alive past the call so its state can be measured."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            kept.append(self)

    replay_mod.Classifier = KeptClassifier  # type: ignore[misc]
    policy = policy_mod.load()
    calls = [0, time.perf_counter()]

    def progress(_: int) -> None:
        calls[0] += 1
        if calls[0] % 500 == 0 and time.perf_counter() - calls[1] > PROGRESS_EVERY_S:
            calls[1] = time.perf_counter()
            log(f"  ours: {calls[0]:,} steps")

    _report.trim()
    with out_path.open("w") as out:
        own0, kids0 = cpu_times()
        t0 = time.perf_counter()
        result = replay_mod.replay([path], policy, out, progress=progress, decode_process=decode_process)
        wall = time.perf_counter() - t0
        own1, kids1 = cpu_times()
    hwm = _report.proc_status_mb("VmHWM")
    decode_hwm = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # kB: the decode process, if any
    _report.trim()
    assert kept, "the replay built no classifier"
    return {
        "wall_s": wall,
        "cpu_s": own1 - own0 + kids1 - kids0,
        "decode_cpu_s": kids1 - kids0,
        "decode_hwm_mb": decode_hwm,
        "points": result.points,
        "lines": result.lines,
        "frames": result.frames,
        "verdict_lines": result.verdict_lines,
        "evaluations": result.evaluations,
        "errors": result.error_count,
        "devices": len(result.final),
        "hwm_mb": hwm,
        "rss_end_mb": _report.proc_status_mb("VmRSS"),
    }


def child_baseline(path: Path, out_path: Path) -> dict[str, Any]:
    _report.trim()
    with out_path.open("w") as out:
        own0, _ = cpu_times()
        t0 = time.perf_counter()
        counts = baseline_replay(path, out)
        wall = time.perf_counter() - t0
        own1, _ = cpu_times()
    return {
        "wall_s": wall,
        "cpu_s": own1 - own0,
        **counts,
        "hwm_mb": _report.proc_status_mb("VmHWM"),
        "rss_end_mb": _report.proc_status_mb("VmRSS"),
    }


def child_floor() -> dict[str, Any]:
    from otel_dra import policy as policy_mod
    from otel_dra import replay as replay_mod
    from otel_dra.frame import Schema

    classifier = replay_mod.Classifier(
        policy_mod.load(), Schema(), interval_s=replay_mod.RING_INTERVAL_S, node_time=True
    )
    _report.trim()
    assert classifier.registry is not None
    return {"rss_mb": _report.proc_status_mb("VmRSS"), "hwm_mb": _report.proc_status_mb("VmHWM")}


def child_decode_all(path: Path) -> dict[str, Any]:
    from otel_dra.decode import OtlpJsonDecoder, read_lines
    from otel_dra.frame import Schema

    decoder = OtlpJsonDecoder(Schema())
    frames: list[Any] = []
    t0 = time.perf_counter()
    for _, lineno, raw in read_lines([path]):
        frames.extend(decoder.decode_line(raw, lineno)[0])
    wall = time.perf_counter() - t0
    _report.trim()
    return {
        "wall_s": wall,
        "frames": len(frames),
        "points": decoder.points,
        "hwm_mb": _report.proc_status_mb("VmHWM"),
        "rss_end_mb": _report.proc_status_mb("VmRSS"),
    }


def run_child(kind: str, path: Path | None = None, out: Path | None = None) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; its JSON line on stdout is the answer."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind]
    if path is not None:
        cmd += ["--file", str(path)]
    if out is not None:
        cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"child {kind} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the parent: generate, measure, score, write ------------------------------------------------------


def recording_for(name: str, seed: int, workdir: Path, **changes: Any) -> tuple[Path, Path]:
    """The scenario's recording and labels in ``workdir`` (the form ``name`` with ``changes``), generated unless
    both are already there."""
    from otel_dra.scenario import form, run

    config = form(name, seed=seed, **changes)
    stem = f"fleet-{config.shape}-{config.nodes}x{config.devices_per_node}-{config.duration_s}s-seed{config.seed}"
    recording, labels = workdir / f"{stem}.jsonl.gz", workdir / f"{stem}.labels.json"
    if recording.exists() and labels.exists():  # the labels are written last: both there, the file is whole
        log(f"reusing {recording.name} ({recording.stat().st_size / 1e6:.0f} MB)")
        return recording, labels
    log(f"generating {name} form{' ' + str(changes) if changes else ''}, seed {seed} …")
    recording, labels = run(config, workdir)
    log(f"  wrote {recording.name} ({recording.stat().st_size / 1e6:.0f} MB)")
    return recording, labels


def batched_like_collector(recording: Path, duration_s: float) -> Path:
    """``recording`` (one node's export a line, arriving in line order) as a Collector's ``file`` exporter writes
    it behind its batch processor: the lines that arrive within ``BATCH_TIMEOUT_S`` of a batch's first (at the
    recording's mean arrival rate) and hold at most ``BATCH_POINTS`` points, as one request a line (their
    resources side by side, the compact JSON the exporter writes). Written next to it, reused when there."""
    out = recording.with_name(recording.name.replace(".jsonl.gz", ".batched.jsonl.gz"))
    if out.exists():
        return out
    with gzip.open(recording, "rb") as f:
        lines = sum(1 for _ in f)
    per_batch = max(1, round(BATCH_TIMEOUT_S * lines / duration_s))
    start, end = b'{"resourceMetrics":[', b"]}"
    partial = out.with_suffix(".partial")
    with gzip.open(recording, "rb") as src, gzip.open(partial, "wb", compresslevel=6) as dst:
        batch: list[bytes] = []
        points = 0

        def flush() -> None:
            nonlocal points
            if batch:
                dst.write(start + b",".join(batch) + end + b"\n")
            batch.clear()
            points = 0

        for raw in src:
            line = raw.rstrip(b"\r\n")
            if not (line.startswith(start) and line.endswith(end)):  # (not compact: as it would be written)
                line = json.dumps(json.loads(line), separators=(",", ":")).encode()
            n = line.count(b'"timeUnixNano"')
            if batch and (len(batch) >= per_batch or points + n > BATCH_POINTS):
                flush()
            batch.append(line[len(start) : -len(end)])
            points += n
        flush()
    partial.rename(out)
    return out


def score_seed(labels: Path, verdicts: Path) -> Any:
    from otel_dra.scenario import score as score_mod

    score_mod.EXAMPLES = 10**9  # every false positive and spurious Unknown, not the first ten
    return score_mod.score_files(labels, verdicts)


def score_example(workdir: Path) -> dict[str, Any] | None:
    if not (EXAMPLE_FILE.exists() and EXAMPLE_LABELS.exists() and EXAMPLE_SCORER.exists()):
        log(f"{EXAMPLE_FILE} is absent: no public-example row")
        return None
    log("replaying the public example …")
    verdicts = workdir / "fleet-sample.verdicts.jsonl"
    ours = run_child("ours", EXAMPLE_FILE, verdicts)
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE_SCORER), str(EXAMPLE_LABELS), str(verdicts), "--json"],
        stdout=subprocess.PIPE, text=True, check=True,
    )  # fmt: skip
    return {"replay": ours, "score": json.loads(proc.stdout.strip().splitlines()[-1])}


def pct(n: int, d: int) -> str:
    return f"{100 * n / d:.1f}%" if d else "—"


def ok(hit: bool) -> str:
    return "✅ met" if hit else "❌ missed"


def score_rows(
    scores: dict[int, Any], example: dict[str, Any] | None, extra: dict[str, Any] | None = None
) -> tuple[list[str], list[str]]:
    """The score table's rows (per seed, pooled, the public example; ``extra``: more runs by label, not pooled) and
    the list of what failed."""
    from otel_dra.scenario import passes
    from otel_dra.scenario.figures import EXTRA_TARGET, FP_TARGET, SOFT_TARGET

    rows, notes = [], []

    def row(label: str, s: dict[str, Any], met: str) -> str:
        cells = [
            label,
            f"{s['devices']:,}",
            f"{s['hard_detected']}/{s['hard_total']}",
            f"{s['soft_detected']}/{s['soft_total']} ({pct(s['soft_detected'], s['soft_total'])})",
            f"{s['fp_per_100']:.2f} ({s['fp_episodes']} in {s['device_hours']:,.0f} h)",
            f"{s['extra']:.2f} ({s['intermittent']} faults)",
            f"{s['spurious']}",
            f"{s['silent_unknown']}/{s['silent_devices']} / {s['silent_unhealthy']}",
            met,
        ]
        return "| " + " | ".join(cells) + " |"

    pooled = {k: 0.0 for k in ("devices", "hard_detected", "hard_total", "soft_detected", "soft_total",
                               "fp_episodes", "device_hours", "extra_sum", "intermittent", "spurious",
                               "unknown_bad", "silent_unknown", "silent_devices", "silent_unhealthy")}  # fmt: skip
    runs = [(f"seed {seed}", sc, True) for seed, sc in scores.items()]
    runs += [(label, sc, False) for label, sc in (extra or {}).items()]
    for name, sc, pool in runs:
        s = {
            "devices": sc.devices_total,
            "hard_detected": sc.hard_detected,
            "hard_total": sc.hard_total,
            "soft_detected": sc.soft_detected,
            "soft_total": sc.soft_total,
            "fp_episodes": sc.fp_episodes,
            "device_hours": sc.device_hours,
            "fp_per_100": sc.fp_per_100_device_hours,
            "extra": sc.extra_episodes_per_intermittent,
            "intermittent": sc.intermittent_faults,
            "spurious": sc.spurious_unknown_devices,
            "silent_unknown": sc.silent_node_unknown,
            "silent_devices": sc.silent_node_devices,
            "silent_unhealthy": sc.silent_node_unhealthy,
        }
        missed = passes(sc)
        rows.append(row(name, s, ok(not missed)))
        for key in pooled if pool else ():
            if key == "extra_sum":
                pooled[key] += round(sc.extra_episodes_per_intermittent * sc.intermittent_faults)
            elif key == "unknown_bad":  # the spurious-Unknown target: no episode, none at the end
                pooled[key] += sc.final_unknown_devices + sc.spurious_unknown_episodes
            else:
                pooled[key] += s[key]
        for target in missed:
            notes.append(f"- {name}, target missed: {target}")
        for m in sc.hard_missed:
            notes.append(f"- {name}, hard miss: `{m['kind']}` on {m['k8s.node.name']}/{m['hw.id']}: {m['why']}")
        for m in sc.soft_missed:
            notes.append(f"- {name}, soft miss: `{m['kind']}` on {m['k8s.node.name']}/{m['hw.id']}: {m['why']}")
        for fp in sc.fp_examples:
            notes.append(
                f"- {name}, false positive on {fp['k8s.node.name']}/{fp['hw.id']} (traps: "
                f"{', '.join(fp['traps'])}): {', '.join(fp['reasons']) or '-'} "
                f"({', '.join(fp['states'])}) from {fp['from_s']:.0f} s"
            )
        for u in sc.spurious_unknown_examples:
            to = "the end" if u["to_s"] is None else f"{u['to_s']:.0f} s"
            notes.append(
                f"- {name}, spurious Unknown on {u['k8s.node.name']}/{u['hw.id']}: {u['from_s']:.0f} s to {to}"
            )
    if len(scores) > 1:
        p = {k: int(v) if k != "device_hours" else v for k, v in pooled.items()}
        p["fp_per_100"] = 100 * p["fp_episodes"] / p["device_hours"] if p["device_hours"] else 0.0
        p["extra"] = p["extra_sum"] / p["intermittent"] if p["intermittent"] else 0.0
        met = (
            p["hard_detected"] == p["hard_total"]
            and (p["soft_detected"] / p["soft_total"] if p["soft_total"] else 1.0) >= SOFT_TARGET
            and p["fp_per_100"] <= FP_TARGET
            and p["extra"] <= EXTRA_TARGET
            and p["unknown_bad"] == 0
            and p["silent_unknown"] == p["silent_devices"]
            and p["silent_unhealthy"] == 0
        )
        each = all(not passes(sc) for sc in scores.values())
        rows.append(
            row(
                f"**all {len(scores)} seeds (pooled)**", p, f"{ok(met)} pooled; {'every' if each else 'not every'} seed"
            )
        )
    if example is not None:
        e = example["score"]
        hard_n, hard_d = (int(x) for x in e["hard_reached_failed"].split("/"))
        soft_n, soft_d = (int(x) for x in e["recall_soft"].split("/"))
        fails = e["false_positive_episodes"]
        met = hard_n == hard_d and soft_n == soft_d and fails == 0
        cells = [
            "public example (`fleet-sample.jsonl.gz`, its own scorer)",
            e["devices_with_verdicts"].split("/")[-1],
            f"{e['recall_hard']} ({e['hard_reached_failed']} failed)",
            f"{e['recall_soft']} ({pct(soft_n, soft_d)})",
            f"{e['fp_per_100_device_hours']:.2f} ({fails} episodes)",
            f"{e['extra_episodes_per_fault(flaps)']:.2f} (per fault)",
            "—",
            f"{e['silent_node_unknown']} / {e['silent_node_false_failures']}",
            f"{ok(met)} (target 5/5, 9/9, 0 FP)",
        ]
        rows.append("| " + " | ".join(cells) + " |")
        for kind in e.get("missed", []):
            notes.append(f"- public example, miss: `{kind}`")
        for ex in e.get("fp_examples", []):
            notes.append(f"- public example, false positive: {ex}")
    return rows, notes


def machine() -> str:
    import numpy as np

    return (
        f"{_report.cpu_model()}, {os.cpu_count()} CPUs (nproc), Python {platform.python_version()}, "
        f"numpy {np.__version__}, {platform.system()} {platform.machine()}"
    )


def time_rows(
    fleet: str,
    ours_runs: list[dict[str, Any]],
    one_runs: list[dict[str, Any]] | None,
    base_runs: list[dict[str, Any]],
) -> list[tuple[str, ...]]:
    """The time table's rows for one fleet: ours as the CLI runs it (its ratio and target), ours decoding in
    its own process (one core; where measured), and the baseline's."""
    best = min(ours_runs, key=lambda r: r["wall_s"])
    base = min(base_runs, key=lambda r: r["wall_s"])
    ratio = best["wall_s"] / base["wall_s"]
    rows: list[tuple[str, ...]] = [
        (f"Ours: `otel_dra.replay.replay`, default policy, as `otel-dra replay` runs it: decoding in a second "
         f"process ({fleet}, {best['devices']:,} devices)",
         f"{best['wall_s']:.1f} s", f"{best['cpu_s']:.1f} CPU-s ({best['decode_cpu_s']:.1f} decoding)",
         f"{best['points'] / best['wall_s']:,.0f} points/s", f"{best['verdict_lines']:,}",
         f"x{ratio:.3f} of the baseline's time", f"<= {TIME_TARGET_RATIO}x", ok(ratio <= TIME_TARGET_RATIO)),
        (f"Baseline: plain-Python per-sample rule set ({fleet})", f"{base['wall_s']:.1f} s",
         f"{base['cpu_s']:.1f} CPU-s", f"{base['points'] / base['wall_s']:,.0f} points/s",
         f"{base['verdict_lines']:,}", "—", "—", "—"),
    ]  # fmt: skip
    if one_runs:
        one = min(one_runs, key=lambda r: r["wall_s"])
        rows.insert(1, (f"Ours, decoding in the same process: one core ({fleet})", f"{one['wall_s']:.1f} s",
                        f"{one['cpu_s']:.1f} CPU-s", f"{one['points'] / one['wall_s']:,.0f} points/s",
                        f"{one['verdict_lines']:,}", f"x{one['wall_s'] / base['wall_s']:.3f}", "—", "—"))  # fmt: skip
    return rows


def markdown(
    args: argparse.Namespace,
    recording: Path,
    ours_runs: list[dict[str, Any]],
    one_runs: list[dict[str, Any]],
    base_runs: list[dict[str, Any]],
    small: tuple[Path, list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]],
    identical: bool,
    floor: dict[str, Any],
    decoded: dict[str, Any],
    seed_replays: dict[int, dict[str, Any]],
    scores: dict[int, Any],
    example: dict[str, Any] | None,
    base_score: Any,
    code: tuple[str, str, str],
    batched: dict[str, tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]],
    batched_score: dict[str, Any],
) -> str:
    best = min(ours_runs, key=lambda r: r["wall_s"])
    base = min(base_runs, key=lambda r: r["wall_s"])
    small_recording, small_ours, small_one, small_base, small_decoded = small
    small_best = min(small_ours, key=lambda r: r["wall_s"])
    small_one_best = min(small_one, key=lambda r: r["wall_s"])
    small_rest = small_one_best["wall_s"] - small_decoded["wall_s"]
    small_base_s = min(small_base, key=lambda r: r["wall_s"])["wall_s"]
    small_floor = max(small_decoded["wall_s"], small_rest) / small_base_s
    # Two cores do at most twice one core's work: however the stages are split, half their sum is a floor too.
    small_half = (small_decoded["wall_s"] + small_rest) / 2
    one_best = min(one_runs, key=lambda r: r["wall_s"])
    peak, state, floor_mb = best["hwm_mb"], best["rss_end_mb"], floor["rss_mb"]
    peak_ratio = peak / state
    share = decoded["wall_s"] / one_best["wall_s"]
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    fmt = ", ".join

    def times(runs: list[dict[str, Any]]) -> list[str]:
        return [f"{r['wall_s']:.1f}" for r in runs]

    form_name = "short" if args.quick else "long"
    size = recording.stat().st_size
    first_seed = args.seeds[0]
    rows = time_rows(f"{form_name} form", ours_runs, one_runs, base_runs) + time_rows(
        "small fleet", small_ours, small_one, small_base
    )
    batch_names = {"": f"{form_name} form", "small fleet ": "small fleet"}
    for fleet, (_, b_ours, b_base) in batched.items():
        rows += time_rows(f"{batch_names[fleet]}, Collector-batched", b_ours, None, b_base)
    mem_rows = [
        ("Ours: peak RSS of the replay (VmHWM)", f"{peak:,.0f} MB", f"x{peak_ratio:.2f} of the state",
         f"<= {RSS_TARGET_RATIO:g}x", ok(peak_ratio <= RSS_TARGET_RATIO)),
        ("Ours: the decode process's peak RSS (beside the above)", f"{best['decode_hwm_mb']:,.0f} MB", "—", "—",
         "—"),
        ("(b) RSS at the end, classifier state alive", f"{state:,.0f} MB",
         f"+{state - floor_mb:,.0f} MB over the floor", "—", "—"),
        ("(a) interpreter floor: imports + an empty classifier", f"{floor_mb:,.0f} MB", "—", "—", "—"),
        ("(c) contrast: every frame decoded into a list (VmHWM)", f"{decoded['hwm_mb']:,.0f} MB",
         f"x{decoded['hwm_mb'] / peak:.1f} our peak", "—", "—"),
        ("Baseline's peak RSS (VmHWM)", f"{base['hwm_mb']:,.0f} MB", f"x{base['hwm_mb'] / peak:.2f} our peak",
         "—", "—"),
    ]  # fmt: skip
    table_rows, notes = score_rows(scores, example, batched_score)
    seed_times = "; ".join(
        f"seed {s}: {r['wall_s']:.0f} s, {r['points']:,} points, {r['verdict_lines']:,} verdict lines"
        for s, r in seed_replays.items()
    )
    cmd = ".venv/bin/python bench/bench_replay.py" + (" --quick" if args.quick else "")
    if args.seeds != [1, 2, 3]:
        cmd += " --seeds " + ",".join(map(str, args.seeds))
    if args.runs != (1 if args.quick else 2):
        cmd += f" --runs {args.runs}"
    if args.small_runs != max(args.runs, args.runs if args.quick else 5):
        cmd += f" --small-runs {args.small_runs}"
    lines = [
        START,
        "## Replay of a messy fleet: time, memory and scores (`bench/bench_replay.py`)",
        "",
        f"Measured {now}{' (quick mode)' if args.quick else ''} on {machine()}. Code: {code[0]} (otel_dra/ "
        f"fingerprint `{code[1]}`).",
        *(
            [
                f"**Warning: otel_dra/ changed during this run (fingerprint `{code[1]}` → `{code[2]}`): the runs below "
                "measured different versions of the code. Rerun on a tree nobody is editing.**"
            ]
            if code[1] != code[2]
            else []
        ),
        f"Input: the scenario's {form_name} form, seed {first_seed} (`{recording.name}`), {best['lines']:,} lines, "
        f"{best['points']:,} points, {best['devices']:,} devices, {size / 1e6:.0f} MB gzip. Each side ran in its own "
        f"fresh child process, alternating, best of {args.runs}. The small fleet (best of {args.small_runs}: its runs "
        f"take seconds, and this machine's speed drifts more than its margin within an hour): the same form, seed "
        f"{first_seed}, "
        f"with {SMALL_FLEET['nodes']} nodes x {SMALL_FLEET['devices_per_node']} GPU (`{small_recording.name}`), "
        f"{small_best['lines']:,} lines, {small_best['points']:,} points, {small_best['devices']:,} devices, "
        f"{small_recording.stat().st_size / 1e6:.0f} MB gzip: every fault and trap still placed (the fewest devices "
        "the scenario places them on), where what an evaluation costs whatever the fleet's size weighs most.",
        "",
        "| what | best time | CPU time | throughput | verdict lines | vs baseline | target | verdict |",
        "|---|---|---|---|---|---|---|---|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        f"- Runs (s): ours {fmt(times(ours_runs))}; ours in one process {fmt(times(one_runs))}; baseline "
        f"{fmt(times(base_runs))}; small fleet: ours {fmt(times(small_ours))}; in one process "
        f"{fmt(times(small_one))}; baseline {fmt(times(small_base))}; "
        + "; ".join(
            f"{batch_names[fleet]}, Collector-batched: ours {fmt(times(b_ours))}; baseline {fmt(times(b_base))}"
            for fleet, (_, b_ours, b_base) in batched.items()
        )
        + ". Each reads, gunzips and "
        "parses the same file and writes verdict lines to a file; the time is the work alone (no interpreter "
        "start, no imports; the decode process's start is counted: a fork of the replay's process, as `otel-dra "
        "replay` makes it, its modules imported already). CPU time: user + system of "
        "the replay's process and its decode process, read with `getrusage` around the work. The decode process's "
        "peak RSS counts the pages it shares with the replay's, copied on write.",
        "- Collector-batched: the same recordings as a Collector's `file` exporter writes them behind its batch "
        f"processor (`collector-config.yaml`: {BATCH_POINTS:,} points or {BATCH_TIMEOUT_S:g} s a request), each line a "
        "batch of several nodes' resources, a different mix each line ("
        + "; ".join(
            f"{batch_names[fleet]}: `{path.name}`, {min(b_ours, key=lambda r: r['wall_s'])['lines']:,} lines"
            for fleet, (path, b_ours, _) in batched.items()
        )
        + "): the replay format the spec names (section 3). Each node's resource is read off its own template "
        "whatever mix its line holds; its verdicts differ from the one-node-a-line file's only where batching "
        "moved when a node's samples arrive.",
        "- Decoding in a second process (`otel_dra.decode.stage`, what `otel-dra replay` does where a second core "
        "is there): a replay takes its longer stage's time, decode or judge, not their sum; the CPU it spends is "
        "about the same plus the frames' pickling. Verdict files of the two modes: "
        + ("byte-identical." if identical else "**DIFFERENT (a bug)**."),
        "- The baseline (`baseline_replay` in the script) is what an operator would script: `json.loads` per line, "
        "a walk of every point to its device (a sensor to its `hw.parent`), one sample per device per line, per-device "
        "Python state (counter increases with reset handling, a 5-minute deque with running sums) and per-sample "
        "rules: thermal over its limit (or 85 °C) ≥ 50%, fan below its low limit while warm ≥ 50%, "
        "uncorrected ECC ≥ 1, corrected ECC > 6/min, power throttle share ≥ 0.5, memory ≥ 0.95 in ≥ 80%, PCIe "
        "width below its maximum ≥ 50%, driver errors, `hw.status{failed}`, and a 60 s staleness scan every 5 s "
        "of trace time. It does less than we do (no cohorts, horizons, hysteresis, skewed clocks), so the ratio "
        "is a floor; its verdicts are not ours.",
        f"- For contrast only, the baseline's own verdicts on seed {first_seed}, scored the same way: hard "
        f"{base_score.hard_detected}/{base_score.hard_total}, soft {base_score.soft_detected}/{base_score.soft_total}, "
        f"{base_score.fp_per_100_device_hours:.1f} false-positive episodes per 100 device-hours, "
        f"{base_score.spurious_unknown_devices} devices spuriously Unknown. Its cost buys per-sample rules without "
        "a fleet's context (cohorts, horizons, hysteresis, per-device intervals).",
        "- Where ours saves: gzip is inflated by zlib-ng in megabyte pieces, a node's export like one read before is "
        "read off its template by one regex split, nothing parsed (a line of a new layout: its attribute lists "
        "tokenized before parsing with orjson), and each becomes numpy frames (`bench_decode`), frames are ingested "
        "in batches every "
        "5 s of trace time and the rules are evaluated for all devices at once on running window sums "
        "(`bench_classifier`), instead of per-sample Python per device.",
        f"- Decoding alone (child (c) below: read, gunzip, frames, no classifier) took {decoded['wall_s']:.1f} s, "
        f"{100 * share:.0f}% of our best one-process replay ({best['points'] / decoded['wall_s']:,.0f} points/s; "
        "separate runs, so "
        "the share is approximate): "
        + (
            "on this input the replay is bound by its decoder, and the classifier's batched ingest and evaluation "
            "add little on top."
            if share >= 0.9
            else f"the classifier's batched ingest and evaluation take roughly the other {100 * (1 - share):.0f}%."
        ),
        f"- Small fleet: decoding alone took {small_decoded['wall_s']:.1f} s, "
        f"{100 * small_decoded['wall_s'] / small_one_best['wall_s']:.0f}% of our best one-process replay; the rest, "
        f"{small_rest:.1f} s over {small_best.get('evaluations', 0):,} evaluations (one every 5 s of the recording's "
        f"clock), is {1e3 * small_rest / max(1, small_best.get('evaluations', 0)):.1f} ms per batched ingest and "
        f"evaluation of {small_best['devices']:,} devices: a cost per evaluation, whatever the fleet's size, that a "
        "per-sample script does not have. "
        f"With the two stages on two cores, the replay takes at least the longer of them: here the "
        f"{'decoding' if small_decoded['wall_s'] >= small_rest else 'judging'}'s "
        f"{max(small_decoded['wall_s'], small_rest):.1f} s, x{small_floor:.3f} of the baseline's time"
        + (
            f", so meeting x{TIME_TARGET_RATIO} ({TIME_TARGET_RATIO * small_base_s:.1f} s) needs "
            + " and ".join(
                f"the {name} cut by {100 * (1 - TIME_TARGET_RATIO * small_base_s / stage_s):.0f}%"
                for name, stage_s in (("judging", small_rest), ("decoding", small_decoded["wall_s"]))
                if stage_s > TIME_TARGET_RATIO * small_base_s
            )
            + ", not the hand-off between them."
            if small_floor > TIME_TARGET_RATIO
            else "."
        )
        + f" Two cores do at most twice one core's work, so the two stages take at least half their sum however they "
        f"are split: {small_half:.1f} s, x{small_half / small_base_s:.3f} of the baseline's time"
        + (
            f": meeting x{TIME_TARGET_RATIO} needs "
            f"{2 * (small_half - TIME_TARGET_RATIO * small_base_s):.1f} s less work between them."
            if small_half > TIME_TARGET_RATIO * small_base_s
            else "."
        ),
        "",
        "| memory | RSS | relation | target | verdict |",
        "|---|---|---|---|---|",
        *("| " + " | ".join(r) + " |" for r in mem_rows),
        "",
        f"- The decoded state (b) is what the replay must hold: the classifier's windows, horizons and registry for "
        f"{best['devices']:,} devices, plus the interpreter. The peak is x{peak_ratio:.2f} of it"
        + (
            ": the replay holds one evaluation's batch of frames, not the recording. "
            if peak_ratio <= RSS_TARGET_RATIO
            else ", over the target: something transient (a batch, the verdict timeline) grows with the recording. "
        )
        + "Decoding every frame into a list first (c, what the "
        f"replay did before it streamed) peaks at {decoded['hwm_mb']:,.0f} MB for {decoded['frames']:,} frames, "
        f"x{decoded['hwm_mb'] / peak:.1f} our whole replay, and grows with the recording's length.",
        "",
        f"### Score table: the {form_name} form over seeds {', '.join(map(str, args.seeds))}",
        "",
        "Each seed is a new fleet (models, limits, intervals, skews, fault and trap placement). Scored by "
        "`otel_dra.scenario.score_files` against its targets: every hard fault failed in time (60 s; device_lost "
        "150 s), ≥ 95% soft faults flagged with a matching reason by their deadline, ≤ 0.3 false-positive episodes per "
        "100 device-hours, ≤ 0.1 extra episodes per intermittent fault, no spurious Unknown, the silent node Unknown "
        "and never Unhealthy. No threshold was changed for this run.",
        "",
        "| run | devices | hard faults failed in time | soft faults flagged in time | false-positive episodes "
        "/ 100 device-h | extra episodes / intermittent fault | spurious Unknown (devices) | silent node "
        "Unknown / Unhealthy | all targets |",
        "|---|---|---|---|---|---|---|---|---|",
        *table_rows,
        "",
        f"- Replays: {seed_times}.",
        "- The pooled row sums the seeds' counts (faults, episodes, device-hours) before dividing; the "
        "Collector-batched row (the first seed's recording as a Collector writes it, scored against the same labels) "
        "is not pooled.",
        "",
        "What failed (every miss, false positive and spurious Unknown):"
        if notes
        else "Nothing failed: no miss, no false positive, no spurious Unknown.",
        *(["", *notes] if notes else []),
        "",
        f"Reproduce: `{cmd}` (this run took {(time.perf_counter() - T_START) / 60:.1f} min, generation "
        "included; `--workdir DIR` keeps the generated recordings and reuses them).",
        END,
        "",
    ]
    return "\n".join(lines)


def child_main(args: argparse.Namespace) -> int:
    if args.child == "ours":
        doc = child_ours(args.file, args.out)
    elif args.child == "ours_one":
        doc = child_ours(args.file, args.out, decode_process=False)
    elif args.child == "baseline":
        doc = child_baseline(args.file, args.out)
    elif args.child == "floor":
        doc = child_floor()
    elif args.child == "decode_all":
        doc = child_decode_all(args.file)
    else:  # pragma: no cover - argparse's choices
        raise ValueError(args.child)
    print(json.dumps(doc))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short form, one run each (development)")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    parser.add_argument("--runs", type=int, default=None, help="timed runs per side, the best counts (2; quick 1)")
    parser.add_argument(
        "--small-runs", type=int, default=None, help="timed runs per side for the small fleet (5; quick: as --runs)"
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep and reuse recordings here (default: a temp dir)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    parser.add_argument(
        "--child", choices=("ours", "ours_one", "baseline", "floor", "decode_all"), help=argparse.SUPPRESS
    )
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_main(args)
    args.runs = args.runs or (1 if args.quick else 2)
    args.small_runs = max(args.runs, args.small_runs or (args.runs if args.quick else 5))
    os.environ[T0_ENV] = str(T0_WALL)
    label, before = code_label(), code_fingerprint()
    form_name = "short" if args.quick else "long"

    with tempfile.TemporaryDirectory(prefix="bench_replay.") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        first = args.seeds[0]
        files = {first: recording_for(form_name, first, workdir)}
        recording = files[first][0]
        verdicts = {seed: workdir / f"{form_name}-seed{seed}.verdicts.jsonl" for seed in args.seeds}
        small_recording = recording_for(form_name, first, workdir, **SMALL_FLEET)[0]
        from otel_dra.scenario import form

        duration_s = form(form_name, seed=first).duration_s
        log("the recordings as a Collector's file exporter writes them (batches of nodes) …")
        batched = {fleet: batched_like_collector(path, duration_s) for fleet, path in (("", recording),
                   ("small fleet ", small_recording))}  # fmt: skip
        # Per fleet: its recording, where each side's verdicts go, and each side's runs.
        fleets = {
            "": (recording, verdicts[first], workdir / f"{form_name}-baseline.verdicts.jsonl"),
            "small fleet ": (
                small_recording,
                workdir / f"{form_name}-small-seed{first}.verdicts.jsonl",
                workdir / f"{form_name}-small-baseline.verdicts.jsonl",
            ),
            **{
                f"{fleet}batched ": (
                    path,
                    workdir
                    / f"{form_name}-{fleet.strip() or 'form'}-batched-seed{first}.verdicts.jsonl".replace(" ", "-"),
                    workdir
                    / f"{form_name}-{fleet.strip() or 'form'}-batched-baseline.verdicts.jsonl".replace(" ", "-"),
                )
                for fleet, path in batched.items()
            },
        }
        all_kinds = ("ours", "ours_one", "baseline")
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {(f, k): [] for f in fleets for k in all_kinds}
        for r in range(args.small_runs):
            for fleet, (path, ours_out, base_out) in fleets.items():
                planned = args.small_runs if fleet.startswith("small fleet") else args.runs
                if r >= planned:
                    continue
                kinds = ("ours", "baseline") if "batched" in fleet else all_kinds  # (one mode: as the CLI runs)
                for kind in kinds if r % 2 == 0 else kinds[::-1]:
                    log(f"run {r + 1}/{planned}: {fleet}{kind} …")
                    out = {"ours": ours_out, "ours_one": ours_out.with_suffix(".one.jsonl")}.get(kind, base_out)
                    got = run_child(kind, path, out)
                    runs[(fleet, kind)].append(got)
                    log(
                        f"  {fleet}{kind}: {got['wall_s']:.1f} s, peak RSS {got['hwm_mb']:,.0f} MB, "
                        f"{got['verdict_lines']:,} lines"
                    )
        ours_runs, one_runs, base_runs = runs[("", "ours")], runs[("", "ours_one")], runs[("", "baseline")]
        identical = all(
            out.read_bytes() == out.with_suffix(".one.jsonl").read_bytes()
            for fleet, (_, out, _) in fleets.items()
            if "batched" not in fleet
        )
        batched_runs = {
            fleet: (batched[fleet], runs[(f"{fleet}batched ", "ours")], runs[(f"{fleet}batched ", "baseline")])
            for fleet in batched
        }
        log(f"verdicts of the two decode modes: {'identical' if identical else 'DIFFERENT'}")
        log("memory: the interpreter floor …")
        floor = run_child("floor")
        log("memory: every frame decoded into a list …")
        decoded = run_child("decode_all", recording)
        log(
            f"  decode-all: {decoded['wall_s']:.1f} s, peak RSS {decoded['hwm_mb']:,.0f} MB, "
            f"{decoded['frames']:,} frames"
        )
        log("small fleet: every frame decoded into a list …")
        small_decoded = run_child("decode_all", small_recording)
        small_runs = (
            small_recording,
            runs[("small fleet ", "ours")],
            runs[("small fleet ", "ours_one")],
            runs[("small fleet ", "baseline")],
            small_decoded,
        )
        seed_replays = {first: min(ours_runs, key=lambda x: x["wall_s"])}
        for seed in args.seeds[1:]:
            files[seed] = recording_for(form_name, seed, workdir)
            log(f"seed {seed}: replaying …")
            seed_replays[seed] = run_child("ours", files[seed][0], verdicts[seed])
            log(f"  seed {seed}: {seed_replays[seed]['wall_s']:.1f} s")
        scores = {seed: score_seed(files[seed][1], verdicts[seed]) for seed in args.seeds}
        example = score_example(workdir)
        base_score = score_seed(files[first][1], workdir / f"{form_name}-baseline.verdicts.jsonl")
        batched_score = {f"seed {first}, Collector-batched": score_seed(files[first][1], fleets["batched "][1])}
        after = code_fingerprint()
        if after != before:
            log(f"warning: otel_dra/ changed during the run ({before} → {after}): the figures mix versions")
        section = markdown(
            args, recording, ours_runs, one_runs, base_runs, small_runs, identical, floor, decoded, seed_replays,
            scores, example, base_score, (label, before, after), batched_runs, batched_score,
        )  # fmt: skip
        raw = {"ours": ours_runs, "ours_one": one_runs, "baseline": base_runs, "small_ours": small_runs[1],
               "small_ours_one": small_runs[2], "small_baseline": small_runs[3], "small_decode_all": small_decoded,
               "batched": {fleet.strip() or "form": {"ours": b[1], "baseline": b[2]} for fleet, b in
                           batched_runs.items()},
               "identical": identical,
               "floor": floor, "decode_all": decoded, "seeds": seed_replays,
               "scores": {seed: sc.to_json() for seed, sc in scores.items()}, "example": example,
               "baseline_score": base_score.to_json(), "code": [label, before, after]}  # fmt: skip
        (workdir / f"{form_name}-results.json").write_text(json.dumps(raw, indent=1) + "\n")
    print(section)
    if not args.no_write:
        _report.write_section(START, END, section, BENCHMARKS_MD)
        log("wrote BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
