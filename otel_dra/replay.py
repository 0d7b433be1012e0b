"""Replay: recorded OTLP JSON telemetry → the classifier → verdict lines (README, "Replay recorded telemetry").

Files are streamed: each line is decoded into frames (bad lines and points are skipped and
counted, never fatal) and queued; every few seconds of the recording's own clock (read off
the nodes' clocks with their offsets taken out, :class:`TraceClock`), the queue is ingested
as one batch and the classifier evaluates, as a fleet would have live. A verdict line is
written whenever a device's verdict changes, and not kept: what a replay holds is the
classifier's state, each device's last outcome for the summary (one shared tuple per
distinct outcome), and the timeline of every change only when a plot asks for it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from otel_dra.classifier import Classifier
from otel_dra.config import FleetConfig
from otel_dra.decode.limits import DecodeLimits
from otel_dra.decode.otlp_json import DecodeError, OtlpJsonDecoder, read_lines
from otel_dra.frame import Frame, Schema
from otel_dra.policy import Policy

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: How many decode errors are shown on stderr (all are counted).
SHOWN_ERRORS = 5


#: A verdict's outcome as the summary counts it: (health, hw.state, reasons).
Outcome = tuple[str, str | None, tuple[str, ...]]


@dataclass
class ReplayResult:
    """What a replay did: counts for the summary, the errors, the final verdicts, a timeline."""

    lines: int = 0
    lines_skipped: int = 0
    points: int = 0
    points_skipped: int = 0
    #: Of the points skipped, those refused by a cap (limits.py), by reason.
    limited: Counter[str] = field(default_factory=Counter)
    frames: int = 0
    evaluations: int = 0
    verdict_lines: int = 0
    errors: list[DecodeError] = field(default_factory=list)
    error_count: int = 0
    #: Per device, its last verdict's outcome: (health, hw.state, reasons), one tuple for each distinct one.
    final: dict[tuple[str, str], Outcome] = field(default_factory=dict)
    #: Per device, each verdict change: (time, health, hw.state, reasons); kept only when asked (a plot).
    timeline: dict[tuple[str, str], list[tuple[int, str, str | None, tuple[str, ...]]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    interval_s: float = 0.0
    first_time_ns: int = 0
    last_time_ns: int = 0

    @property
    def usable(self) -> bool:
        return self.frames > 0


#: The shortest sampling interval a replay judges over a whole window (it sizes the window's
#: ring); a node sampled faster is judged over its last ``window / RING_INTERVAL_S`` samples.
RING_INTERVAL_S = 5.0
#: Nodes not heard for this long no longer move the replay's clock.
CLOCK_QUORUM_S = 600.0
#: A node whose clock, once its offset is taken out, is this far from the newest any node has
#: said has had its clock stepped: its offset is learned again.
CLOCK_JUMP_S = 600.0
#: The replay's clock follows this quantile of the nodes' offset-corrected clocks: near the
#: front (it moves with every few lines, not in lumps), yet a node or two whose clock jumps
#: ahead move it by nothing.
CLOCK_QUANTILE = 0.75


class TraceClock:
    """The replay's reference clock, read off the recording itself.

    Lines come in arrival order (a Collector writes what it receives), each node's points
    stamped by that node's clock, and clocks differ (±90 s is common). Each node's offset
    from the replay's clock is learned when it is first heard (and again if its clock jumps),
    and the clock is a high quantile of the nodes' newest stamps with their offsets taken out
    (nodes heard within ``CLOCK_QUORUM_S``), never going back. A node is then judged by how much
    of this clock has passed since it was last heard, not by how its stamps compare with
    another node's; the clock's own time base is the first node's, which nothing depends on."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self._offset = np.zeros(0)  # seconds each node's clock is ahead of this one
        self._latest = np.zeros(0)  # each node's newest stamp, offset taken out
        self.now_ns = 0

    def heard(self, frames: list[Frame]) -> int:
        """Note the frames of one line; returns the clock (unix ns) after them."""
        for frame in frames:
            stamp = frame.time_unix_nano / 1e9
            i = self._index.get(frame.devices.node)
            if i is None:
                i = self._index[frame.devices.node] = len(self._index)
                self._offset = np.append(self._offset, stamp - self.now_ns / 1e9 if self.now_ns else 0.0)
                self._latest = np.append(self._latest, -np.inf)
            corrected = stamp - self._offset[i]
            front = float(self._latest.max())  # the newest any node has said (the clock may lag it)
            if np.isfinite(front) and abs(corrected - front) > CLOCK_JUMP_S:  # this node's clock was stepped
                self._offset[i] = stamp - front
                self._latest[i] = corrected = front
            self._latest[i] = max(self._latest[i], corrected)
        if frames:
            latest = self._latest
            recent = latest[latest >= latest.max() - CLOCK_QUORUM_S]
            k = int(CLOCK_QUANTILE * (recent.size - 1))  # one partition, not a sort
            self.now_ns = max(self.now_ns, round(float(np.partition(recent, k)[k]) * 1e9))
        return self.now_ns


def replay(
    paths: list[Path],
    policy: Policy,
    out: IO[str],
    progress: Callable[[int], None] | None = None,
    evaluate_every_s: float = FleetConfig.evaluate_every_s,
    limits: DecodeLimits | None = None,
    timeline: bool = False,
) -> ReplayResult:
    """Stream ``paths`` through the classifier, evaluating every ``evaluate_every_s`` of the
    recording's clock (:class:`TraceClock`); write changed verdicts to ``out``.

    Decoded frames are ingested in batches, once per evaluation, and dropped: a replay costs
    O(samples), and holds the classifier's state, not the recording, nor the verdicts it wrote
    (``timeline``: keep every change, for :func:`plot_timeline`). Verdict times are each
    device's own node's time (the input's time base), so they line up with its samples. ``limits``:
    the caps on what the input may create, as the fleet's receiver has them (skipped and counted)."""
    result = ReplayResult()
    schema = Schema()
    decoder = OtlpJsonDecoder(schema, limits=limits or DecodeLimits())
    classifier = Classifier(policy, schema, interval_s=RING_INTERVAL_S, node_time=True)
    clock = TraceClock()
    pending: list[Frame] = []
    heard: list[int] = []
    every_ns = round(evaluate_every_s * 1e9)
    next_eval: int | None = None
    outcomes: dict[Outcome, Outcome] = {}

    def judge(now_ns: int) -> None:
        if pending:
            classifier.ingest_many(pending, heard)
            pending.clear()
            heard.clear()
        for verdict in classifier.evaluate(now_ns):
            out.write(json.dumps(verdict.to_json(), separators=(", ", ": ")) + "\n")
            key = (verdict.node, verdict.hw_id)
            outcome: Outcome = (verdict.health, verdict.state, verdict.reasons)
            result.final[key] = outcomes.setdefault(outcome, outcome)
            if timeline:
                result.timeline[key].append((verdict.time_unix_nano, *outcome))
            result.verdict_lines += 1
            result.first_time_ns = min(result.first_time_ns or verdict.time_unix_nano, verdict.time_unix_nano)
        result.evaluations += 1

    for _path, lineno, raw in read_lines(paths):
        decoded = decoder.decode(raw, lineno)
        frames, errors = decoded.frames, decoded.errors
        if decoded.limited:
            result.limited.update(decoded.limited)
        if errors:
            result.error_count += len(errors)
            room = SHOWN_ERRORS - len(result.errors)
            if room > 0:
                result.errors.extend(errors[:room])
        if frames:
            now = clock.heard(frames)
            pending.extend(frames)
            heard.extend([now] * len(frames))
            result.frames += len(frames)
            if next_eval is None:
                next_eval = now
            if now >= next_eval:  # on a grid of the clock: one evaluation per step it moved past
                judge(now)
                next_eval += every_ns * ((now - next_eval) // every_ns + 1)
        if progress is not None:
            progress(len(raw) + 1)
        # Nothing of this line is held while the next is read and decoded (only its frames, in ``pending``).
        del raw, decoded, frames, errors
    if result.frames:
        judge(clock.now_ns)
        result.last_time_ns = clock.now_ns
        intervals = classifier.intervals(np.flatnonzero(classifier.registry.active))
        intervals = intervals[~np.isnan(intervals)]
        result.interval_s = float(np.median(intervals)) if intervals.size else evaluate_every_s
    result.lines = decoder.lines
    result.lines_skipped = decoder.lines_skipped
    result.points = decoder.points
    result.points_skipped = decoder.points_skipped
    return result


def skip_summary(result: ReplayResult) -> str:
    """What was skipped, in one line: lines, points and, of the points, those the caps refused by reason."""
    refused = ", ".join(f"{reason} {n}" for reason, n in result.limited.items())
    by_cap = f" (refused by caps: {refused})" if refused else ""
    return f"skipped: {result.lines_skipped} lines, {result.points_skipped} points{by_cap}"


def summary_rows(result: ReplayResult) -> list[tuple[str, str, int]]:
    """(health, state, devices) and (reason, -, devices) counts over the final verdicts."""
    states = Counter((health, state or "-") for health, state, _ in result.final.values())
    reasons = Counter(r for _, _, why in result.final.values() for r in why)
    rows = [(health, state, n) for (health, state), n in sorted(states.items())]
    rows += [(f"reason: {reason}", "", n) for reason, n in sorted(reasons.items())]
    return rows


#: hw.state → (fill, hatch). Okabe-Ito hues, told apart by more than red against green: ok is
#: the palest (what every healthy device shows), failed the darkest and cross-hatched, degraded
#: hatched, predicted_failure dotted; grey is Unknown (no hw.state: the device went silent).
STATE_STYLES: dict[str | None, tuple[str, str]] = {
    "ok": ("#a6d8f5", ""),  # a tint of Okabe-Ito sky blue
    "predicted_failure": ("#f0e442", ".."),  # yellow
    "degraded": ("#e69f00", "///"),  # orange
    "failed": ("#d55e00", "xxx"),  # vermillion
    None: ("#999999", ""),  # grey: Unknown
}
STATE_COLORS = {state: fill for state, (fill, _hatch) in STATE_STYLES.items()}
#: Up to this many devices, every device gets its row; beyond, only those that were ever not ok
#: do, and the rest share one summary row ("312 devices ok throughout").
PLOT_ALL_UP_TO = 40
#: The most device rows one plot draws: beyond, those with the least time not ok share a row.
PLOT_MAX_ROWS = 120
ROW_INCHES = 0.3
#: Episode labels: points, and roughly how wide a character of them is (in points).
LABEL_FONT = 7.0
LABEL_CHAR_PT = 4.3


@dataclass
class _Rows:
    """What one timeline plot draws: the device rows, and the devices it folds into summary rows."""

    keys: list[tuple[str, str]]
    ok_throughout: int
    not_drawn: int  # devices that were not ok at some time, left out past PLOT_MAX_ROWS


def _plot_rows(result: ReplayResult, end: int) -> _Rows:
    keys = sorted(result.timeline)
    if len(keys) <= PLOT_ALL_UP_TO:
        return _Rows(keys, 0, 0)
    bad_ns: dict[tuple[str, str], int] = {}
    for key in keys:
        seq = result.timeline[key]
        times = [t for t, *_ in seq[1:]] + [end]
        bad = sum(t1 - t0 for (t0, _h, state, _r), t1 in zip(seq, times, strict=True) if state != "ok")
        if bad or any(state != "ok" for _t, _h, state, _r in seq):
            bad_ns[key] = bad
    drawn = sorted(bad_ns, key=lambda k: -bad_ns[k])[:PLOT_MAX_ROWS]
    return _Rows(sorted(drawn), len(keys) - len(bad_ns), len(bad_ns) - len(drawn))


def _label(reasons: tuple[str, ...], state: str | None) -> str:
    return "+".join(reasons) if reasons else (state or "Unknown")


def draw_timeline(result: ReplayResult) -> Figure:
    """The figure :func:`plot_timeline` writes: a row per device (only those ever not ok, at fleet
    scale, with one row counting the rest), each verdict episode a bar in its hw.state's style,
    labelled with its reasons where they change; wall-clock time (UTC) along the axis."""
    import matplotlib

    matplotlib.use("Agg")
    import datetime as dt

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not result.timeline:
        raise ValueError("nothing to plot: the replay produced no verdicts")
    start = min(seq[0][0] for seq in result.timeline.values())
    end = max(result.last_time_ns, max(seq[-1][0] for seq in result.timeline.values()))
    end += int(max(result.interval_s, 1.0) * 1e9)
    rows = _plot_rows(result, end)
    summaries = [f"{n} devices ok throughout" for n in [rows.ok_throughout] if n]
    summaries += [f"{n} more devices not ok at some time (not drawn)" for n in [rows.not_drawn] if n]
    labels = [f"{node}/{device}" for node, device in rows.keys] + summaries
    n_rows = len(labels)
    fig_h = ROW_INCHES * n_rows + 2.2
    fig, ax = plt.subplots(figsize=(12, fig_h), layout="constrained")

    # Every episode of every drawn row, in arrays: one bar call per state, whatever the fleet's size.
    day_ns = 86_400e9
    ys: list[int] = []
    lefts: list[int] = []
    widths: list[int] = []
    states: list[str | None] = []
    span_days = (end - start) / day_ns
    day_per_pt = span_days / (72.0 * 12 * 0.78)  # the axes are most of the figure's 12 inches
    for y, key in enumerate(rows.keys):
        seq = result.timeline[key]
        label_end = -np.inf  # where the row's last label ends (days since the start)
        previous: tuple[str, ...] | None = None
        for (t0, _health, state, reasons), nxt in zip(seq, [*seq[1:], (end, "", None, ())], strict=True):
            ys.append(y)
            lefts.append(t0)
            widths.append(nxt[0] - t0)
            states.append(state if state in STATE_STYLES else None)  # a state this plot doesn't know: grey
            if state == "ok":
                previous = None
                continue
            x = (t0 - start) / day_ns
            text = _label(reasons, state)
            if reasons == previous or x < label_end:  # the same reasons still, or no room: no new label
                continue
            previous = reasons
            ax.text(
                mdates.date2num(np.datetime64(t0, "ns")) + 2 * day_per_pt,
                y,
                text,
                fontsize=LABEL_FONT,
                va="center",
                ha="left",
                clip_on=True,
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.75},
                gid="reason",
            )
            label_end = x + (len(text) * LABEL_CHAR_PT + 8) * day_per_pt
    y_arr = np.asarray(ys)
    left_arr = mdates.date2num(np.asarray(lefts, dtype="datetime64[ns]")) if lefts else np.zeros(0)
    width_arr = np.asarray(widths, dtype=np.float64) / day_ns
    state_arr = np.asarray([s or "" for s in states], dtype=object)
    for state, (fill, hatch) in STATE_STYLES.items():
        mine = state_arr == (state or "")
        if mine.any():
            ax.barh(
                y_arr[mine],
                width_arr[mine],
                left=left_arr[mine],
                height=0.8,
                color=fill,
                hatch=hatch or None,
                edgecolor="#333333" if hatch else "none",
                linewidth=0,
                label=state or "Unknown",
            )
    x0, x1 = mdates.date2num(np.asarray([start, end], dtype="datetime64[ns]"))
    if rows.ok_throughout:  # the devices folded into the summary row: ok from end to end
        ax.barh(len(rows.keys), x1 - x0, left=x0, height=0.8, color=STATE_COLORS["ok"], edgecolor="none", gid="summary")
    if rows.keys and summaries:
        ax.axhline(len(rows.keys) - 0.5, color="#555555", linewidth=0.8)

    ax.set_yticks(np.arange(n_rows), labels, fontsize=8)
    ax.set_ylim(n_rows - 0.4, -0.6)  # top to bottom, the summary rows last
    ax.set_xlim(x0, x1)
    locator = mdates.AutoDateLocator(tz=dt.UTC)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=dt.UTC))
    ax.set_xlabel("time (UTC, each device's node clock)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    nodes = len({node for node, _ in result.timeline})
    drawn = f"; drawn: the {len(rows.keys)} not ok at some time" if rows.ok_throughout or rows.not_drawn else ""
    ax.set_title(f"otel-dra replay: hw.state per device ({len(result.timeline)} devices on {nodes} nodes{drawn})")
    legend = [
        Patch(facecolor=fill, hatch=hatch or None, edgecolor="#333333" if hatch else "none", label=state or "Unknown")
        for state, (fill, hatch) in STATE_STYLES.items()
    ]
    fig.legend(handles=legend, loc="outside lower center", ncol=len(legend), frameon=False)
    return fig


def plot_timeline(result: ReplayResult, path: Path) -> None:
    """Draw :func:`draw_timeline` to the PNG ``path``."""
    import matplotlib.pyplot as plt

    fig = draw_timeline(result)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
