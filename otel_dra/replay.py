"""Replay: recorded OTLP JSON telemetry → the classifier → verdict lines (telemetry.md §3).

Files are decoded into frames (bad lines and points are skipped and counted, never fatal),
frames are ordered by sample time across nodes (lines are in time order per node only), and
the classifier evaluates at every sample time, so staleness and windows read exactly as they
would have live. A verdict line is written whenever a device's verdict changes.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from otel_dra.classifier import Classifier, Verdict
from otel_dra.decode.otlp_json import DecodeError, OtlpJsonDecoder, read_lines
from otel_dra.frame import Frame, Schema
from otel_dra.policy import Policy

#: How many decode errors are shown on stderr (all are counted).
SHOWN_ERRORS = 5


@dataclass
class ReplayResult:
    """What a replay did: counts for the summary, the errors, the final verdicts, a timeline."""

    lines: int = 0
    lines_skipped: int = 0
    points: int = 0
    points_skipped: int = 0
    frames: int = 0
    evaluations: int = 0
    verdict_lines: int = 0
    errors: list[DecodeError] = field(default_factory=list)
    error_count: int = 0
    final: dict[tuple[str, str], Verdict] = field(default_factory=dict)
    timeline: dict[tuple[str, str], list[tuple[int, str, str | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    interval_s: float = 0.0
    first_time_ns: int = 0
    last_time_ns: int = 0

    @property
    def usable(self) -> bool:
        return self.frames > 0


def estimate_interval(frames: list[Frame]) -> float:
    """The typical sampling interval: the median step between a node's consecutive samples."""
    times: dict[str, list[int]] = defaultdict(list)
    for frame in frames:
        times[frame.devices.node].append(frame.time_unix_nano)
    steps = [b - a for ts in times.values() for a, b in zip(sorted(set(ts)), sorted(set(ts))[1:], strict=False)]
    return statistics.median(steps) / 1e9 if steps else 10.0


def decode_files(
    paths: Iterable[Path], schema: Schema, result: ReplayResult, progress: Callable[[int], None] | None = None
) -> list[Frame]:
    """Every frame in ``paths``; errors are kept (the first few) and counted (all)."""
    decoder = OtlpJsonDecoder(schema)
    frames: list[Frame] = []
    for _path, lineno, raw in read_lines(paths):
        decoded, errors = decoder.decode_line(raw, lineno)
        frames.extend(decoded)
        if errors:
            result.error_count += len(errors)
            room = SHOWN_ERRORS - len(result.errors)
            if room > 0:
                result.errors.extend(errors[:room])
        if progress is not None:
            progress(len(raw) + 1)
    result.lines = decoder.lines
    result.lines_skipped = decoder.lines_skipped
    result.points = decoder.points
    result.points_skipped = decoder.points_skipped
    result.frames = len(frames)
    return frames


def by_time(frames: list[Frame]) -> Iterator[tuple[int, list[Frame]]]:
    """Frames grouped by sample time, oldest first (stable within a time)."""
    order = sorted(range(len(frames)), key=lambda i: frames[i].time_unix_nano)
    group: list[Frame] = []
    current = None
    for i in order:
        t = frames[i].time_unix_nano
        if t != current and group:
            yield current, group  # type: ignore[misc]
            group = []
        current = t
        group.append(frames[i])
    if group:
        yield current, group  # type: ignore[misc]


def replay(
    paths: list[Path],
    policy: Policy,
    out: IO[str],
    decode_progress: Callable[[int], None] | None = None,
    eval_progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Decode ``paths``, evaluate at every sample time, write changed verdicts to ``out``."""
    result = ReplayResult()
    schema = Schema()
    frames = decode_files(paths, schema, result, decode_progress)
    if not frames:
        return result
    result.interval_s = estimate_interval(frames)
    classifier = Classifier(policy, schema, interval_s=result.interval_s)
    groups = list(by_time(frames))
    result.first_time_ns, result.last_time_ns = groups[0][0], groups[-1][0]
    for done, (t, group) in enumerate(groups, 1):
        classifier.ingest_many(group)
        for verdict in classifier.evaluate(t):
            out.write(json.dumps(verdict.to_json(), separators=(", ", ": ")) + "\n")
            key = (verdict.node, verdict.hw_id)
            result.final[key] = verdict
            result.timeline[key].append((t, verdict.health, verdict.state))
            result.verdict_lines += 1
        result.evaluations += 1
        if eval_progress is not None:
            eval_progress(done, len(groups))
    return result


def summary_rows(result: ReplayResult) -> list[tuple[str, str, int]]:
    """(health, state, devices) and (reason, -, devices) counts over the final verdicts."""
    states = Counter((v.health, v.state or "-") for v in result.final.values())
    reasons = Counter(r for v in result.final.values() for r in v.reasons)
    rows = [(health, state, n) for (health, state), n in sorted(states.items())]
    rows += [(f"reason: {reason}", "", n) for reason, n in sorted(reasons.items())]
    return rows


STATE_COLORS = {
    "ok": "#4caf50",
    "predicted_failure": "#ffc107",
    "degraded": "#ff9800",
    "failed": "#e53935",
    None: "#9e9e9e",
}


def plot_timeline(result: ReplayResult, path: Path) -> None:
    """A state timeline per device: one row each, coloured by hw.state (grey: Unknown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    keys = sorted(result.timeline)
    if not keys:
        raise ValueError("nothing to plot: the replay produced no verdicts")
    start, end = result.first_time_ns, result.last_time_ns + int(result.interval_s * 1e9)
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(keys) + 1.6))
    for y, key in enumerate(keys):
        seq = result.timeline[key]
        for (t0, _health, state), nxt in zip(seq, [*seq[1:], (end, "", None)], strict=True):
            ax.barh(
                y,
                (nxt[0] - t0) / 6e10,
                left=(t0 - start) / 6e10,
                color=STATE_COLORS.get(state, "#9e9e9e"),
                height=0.8,
                edgecolor="none",
            )
    ax.set_yticks(np.arange(len(keys)), [f"{n}/{d}" for n, d in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("minutes since the first sample")
    ax.set_title("otel-dra replay: hw.state per device (grey: Unknown)")
    legend = [Patch(color=c, label=s or "Unknown") for s, c in STATE_COLORS.items()]
    ax.legend(
        handles=legend, loc="lower center", bbox_to_anchor=(0.5, 1.0 + 0.4 / (len(keys) + 4)), ncol=5, frameon=False
    )
    ax.set_xlim(0, (end - start) / 6e10)
    fig.tight_layout(rect=(0, 0.9 / (0.32 * len(keys) + 1.6), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
