"""The timeline ``otel-dra replay --plot`` draws (issues #15 and #29), in two steps: :func:`plot_rows`
decides what gets a row (pure, numpy: the worst devices first, a node's identical rows folded into
one, the healthy rest counted), and :func:`draw_timeline` draws those rows. Each row is a bar in
hw.state's style over time, with a thin strip at its foot in the kubelet's health, so both what the
hardware said and what the scheduler heard read off one row.

matplotlib is optional (``otel-dra[plot]``): it is imported only when a figure is drawn.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from otel_dra.replay import ReplayResult

Key = tuple[str, str]
#: One verdict change of a device: (time ns, health, hw.state, reasons), as ReplayResult keeps it.
Change = tuple[int, str, str | None, tuple[str, ...]]

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
#: The kubelet's health → the fill of the strip along each row's foot: black where it was told
#: Unhealthy (what takes a device out of scheduling), so it stands out in grey print too.
HEALTH_COLORS: dict[str, str] = {
    "Healthy": "#80cfb9",  # a tint of Okabe-Ito bluish green
    "Unhealthy": "#000000",
    "Unknown": "#999999",  # the grey of no hw.state: silent
}
#: How bad a verdict is, to sort rows by: the kubelet's health first, as what the scheduler acts on
#: (Unhealthy, then Unknown: a silent device), then hw.state (failed, then degraded: a policy may
#: call degraded Unhealthy; a Healthy degraded device comes after the silent ones).
HEALTH_RANK: dict[str, int] = {"Healthy": 0, "Unknown": 1, "Unhealthy": 2}
STATE_RANK: dict[str | None, int] = {"ok": 0, None: 1, "predicted_failure": 2, "degraded": 3, "failed": 4}
#: Up to this many devices, every device gets its row (a node's identical ones folded); beyond,
#: only those that were ever not ok do, and the rest share one summary row ("312 devices ok throughout").
PLOT_ALL_UP_TO = 40
#: The most rows one plot draws: beyond, the least severe share a counted row.
PLOT_MAX_ROWS = 120
#: A row's height while few; past MAX_ROWS_INCHES in all, rows get thinner and their text smaller.
ROW_INCHES = 0.3
MAX_ROWS_INCHES = 15.0
#: Above and below the rows: title, both time axes, the legend (inches).
FRAME_INCHES = 2.4
FIG_WIDTH = 12.0
#: Episode labels: points at most, and roughly how wide a character is for each point of size.
LABEL_FONT = 7.0
LABEL_CHAR_EM = 0.62
#: A node's devices fold into one row when their changes are this close (a share of the plot's
#: span: about a pixel), so devices a node reported in the same breath are not drawn apart.
FOLD_RESOLUTION = 1000


@dataclass(frozen=True)
class PlotRow:
    """One drawn row: a device, or several of one node whose timelines are the same."""

    label: str
    devices: tuple[Key, ...]
    #: The timeline drawn (the first device's: the others' differ by under FOLD_RESOLUTION).
    changes: Sequence[Change]
    #: The worst verdict of the row (_scores: health, then hw.state) and when it first came.
    worst: int
    worst_at: int


@dataclass(frozen=True)
class PlotRows:
    """What one timeline plot draws: its rows, worst first, and the devices counted in summary rows."""

    rows: list[PlotRow]
    ok_throughout: int
    not_drawn: int  # devices that were not ok at some time, left out past PLOT_MAX_ROWS
    start: int
    end: int
    devices: int
    nodes: int

    @property
    def summaries(self) -> list[str]:
        out = [f"{n} devices ok throughout" for n in [self.ok_throughout] if n]
        return out + [f"{n} more devices not ok at some time (not drawn)" for n in [self.not_drawn] if n]

    @property
    def labels(self) -> list[str]:
        return [row.label for row in self.rows] + self.summaries


def _scores(changes: list[Change]) -> np.ndarray:
    states = np.fromiter((STATE_RANK.get(c[2], STATE_RANK[None]) for c in changes), np.int64, len(changes))
    health = np.fromiter((HEALTH_RANK.get(c[1], HEALTH_RANK["Unknown"]) for c in changes), np.int64, len(changes))
    return health * len(STATE_RANK) + states


def _fold(times: list[np.ndarray], tolerance: float) -> list[list[int]]:
    """Indices into ``times`` (the change times of one node's devices whose changes are the same
    but for their times) grouped where every time is within ``tolerance`` of the group's first."""
    groups: list[list[int]] = []
    left = list(range(len(times)))
    while left:
        first = times[left[0]]
        near = [i for i in left if np.abs(times[i] - first).max(initial=0) <= tolerance]
        groups.append(near)
        left = [i for i in left if i not in near]
    return groups


def plot_rows(result: ReplayResult) -> PlotRows:
    """The rows of the plot, worst first: by the worst verdict over the replay, then when it first
    came, then node/device; each node's devices with the same timeline share a row. At fleet scale
    devices ok throughout are only counted, and past PLOT_MAX_ROWS the least severe rows are too."""
    if not result.timeline:
        raise ValueError("nothing to plot: the replay produced no verdicts")
    keys = sorted(result.timeline)
    seqs = [result.timeline[k] for k in keys]
    counts = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    flat = [c for s in seqs for c in s]
    times = np.fromiter((c[0] for c in flat), np.int64, len(flat))
    start = int(times.min())
    end = max(result.last_time_ns, int(times.max())) + int(max(result.interval_s, 1.0) * 1e9)
    # Per device, its worst verdict and the first time it had it: reduced over each device's changes.
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    score = _scores(flat)
    worst = np.maximum.reduceat(score, offsets)
    at_worst = np.where(score == np.repeat(worst, counts), times, np.iinfo(np.int64).max)
    worst_at = np.minimum.reduceat(at_worst, offsets)

    ok = worst == 0
    shown = np.flatnonzero(~ok) if len(keys) > PLOT_ALL_UP_TO else np.arange(len(keys))
    per_node = Counter(node for node, _ in keys)
    similar: defaultdict[tuple[str, tuple[object, ...]], list[int]] = defaultdict(list)
    for i in shown.tolist():  # the same changes but for their times: candidates to fold
        similar[(keys[i][0], tuple(c[1:] for c in seqs[i]))].append(i)
    tolerance = (end - start) / FOLD_RESOLUTION
    rows: list[PlotRow] = []
    for (node, _), members in similar.items():
        stamps = [times[offsets[i] : offsets[i] + counts[i]] for i in members]
        for group in _fold(stamps, tolerance):
            idx = [members[g] for g in group]
            if len(idx) == 1:
                label = "/".join(keys[idx[0]])
            elif len(idx) == per_node[node]:
                label = f"{node}: {len(idx)} devices"
            else:
                label = f"{node}: {len(idx)} of {per_node[node]} devices"
            first = idx[0]
            rows.append(
                PlotRow(label, tuple(keys[i] for i in idx), seqs[first], int(worst[first]), int(worst_at[idx].min()))
            )
    rows.sort(key=lambda r: (-r.worst, r.worst_at, r.devices[0]))
    not_drawn = sum(len(r.devices) for r in rows[PLOT_MAX_ROWS:])
    return PlotRows(
        rows=rows[:PLOT_MAX_ROWS],
        ok_throughout=int(ok.sum()) if len(keys) > PLOT_ALL_UP_TO else 0,
        not_drawn=not_drawn,
        start=start,
        end=end,
        devices=len(keys),
        nodes=len(per_node),
    )


@dataclass(frozen=True)
class _Layout:
    """Sizes that follow the number of rows, so 500 devices fit a page: the figure's height is bounded."""

    height: float
    tick_font: float
    label_font: float

    @classmethod
    def for_rows(cls, n: int) -> _Layout:
        pitch = min(ROW_INCHES, MAX_ROWS_INCHES / max(n, 1))  # inches per row
        font = float(np.clip(pitch * 72 * 0.62, 4.5, 8.0))
        return cls(pitch * n + FRAME_INCHES, font, min(LABEL_FONT, font))


#: Within a row (y grows downwards): the hw.state bar on top, a gap, the health strip at its foot.
BAR_TOP, BAR_BOTTOM, STRIP_TOP, STRIP_BOTTOM = -0.42, 0.16, 0.2, 0.42


def _draw_bars(ax: Axes, plot: PlotRows) -> None:
    """Every episode of every row, as arrays: one barh call per hw.state and per health."""
    import matplotlib.dates as mdates

    seqs = [row.changes for row in plot.rows]
    counts = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    flat = [c for s in seqs for c in s]
    t0 = np.fromiter((c[0] for c in flat), np.int64, len(flat))
    t1 = np.append(t0[1:], plot.end)
    last = np.cumsum(counts) - 1
    t1[last] = plot.end  # a row's last episode lasts to the end
    y = np.repeat(np.arange(len(seqs)), counts)
    if plot.ok_throughout:  # the devices folded into the summary row: ok and Healthy from end to end
        flat.append((plot.start, "Healthy", "ok", ()))
        t0, t1, y = np.append(t0, plot.start), np.append(t1, plot.end), np.append(y, len(seqs))
    left = mdates.date2num(t0.astype("datetime64[ns]"))
    width = (t1 - t0) / 86_400e9
    states = np.array([c[2] if c[2] in STATE_STYLES and c[2] else "" for c in flat], dtype=object)
    health = np.array([c[1] for c in flat], dtype=object)
    bar = BAR_BOTTOM - BAR_TOP
    for state, (fill, hatch) in STATE_STYLES.items():
        mine = states == (state or "")
        if mine.any():
            ax.barh(
                y[mine] + (BAR_TOP + BAR_BOTTOM) / 2,
                width[mine],
                left=left[mine],
                height=bar,
                color=fill,
                hatch=hatch or None,
                edgecolor="#333333" if hatch else "none",
                linewidth=0,
                label=state or "Unknown",
            )
    strip = STRIP_BOTTOM - STRIP_TOP
    for name, fill in HEALTH_COLORS.items():
        mine = health == name if name != "Unknown" else ~np.isin(health, ["Healthy", "Unhealthy"])
        if mine.any():
            ax.barh(
                y[mine] + (STRIP_TOP + STRIP_BOTTOM) / 2,
                width[mine],
                left=left[mine],
                height=strip,
                color=fill,
                linewidth=0,
                label=f"health {name}",
                gid="health",
            )


def _draw_reasons(ax: Axes, plot: PlotRows, font: float) -> None:
    """Each not-ok episode labelled with its reasons where they change, where there is room."""
    import matplotlib.dates as mdates

    day_ns = 86_400e9
    span_days = (plot.end - plot.start) / day_ns
    day_per_pt = span_days / (72.0 * FIG_WIDTH * 0.78)  # the axes are most of the figure's width
    for y, row in enumerate(plot.rows):
        label_end = -np.inf  # where the row's last label ends (days since the start)
        previous: tuple[str, ...] | None = None
        for t0, _health, state, reasons in row.changes:
            if state == "ok":
                previous = None
                continue
            x = (t0 - plot.start) / day_ns
            text = "+".join(reasons) if reasons else (state or "Unknown")
            if reasons == previous or x < label_end:  # the same reasons still, or no room: no new label
                continue
            previous = reasons
            ax.text(
                mdates.date2num(np.datetime64(t0, "ns")) + 2 * day_per_pt,
                y + (BAR_TOP + BAR_BOTTOM) / 2,
                text,
                fontsize=font,
                va="center",
                ha="left",
                clip_on=True,
                bbox={"boxstyle": "round,pad=0.12", "facecolor": "white", "edgecolor": "none", "alpha": 0.75},
                gid="reason",
            )
            label_end = x + (len(text) * LABEL_CHAR_EM * font + 8) * day_per_pt


def _time_axes(ax: Axes, plot: PlotRows) -> None:
    """Wall-clock UTC along the bottom and the top: a tall plot is read from either end."""
    import datetime as dt

    import matplotlib.dates as mdates

    x0, x1 = mdates.date2num(np.asarray([plot.start, plot.end], dtype="datetime64[ns]"))
    ax.set_xlim(x0, x1)
    locator = mdates.AutoDateLocator(tz=dt.UTC)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=dt.UTC))
    ax.tick_params(axis="x", top=True, labeltop=True, labelsize=8)
    ax.set_xlabel("time (UTC, each device's node clock)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)


def _legend(fig: Figure) -> None:
    """One legend under the plot, in two lines: the bars' hw.state, then the strips' kubelet health."""
    from matplotlib.patches import Patch

    def blank(label: str = "") -> Patch:
        return Patch(facecolor="none", edgecolor="none", label=label)

    states = [
        Patch(facecolor=fill, hatch=hatch or None, edgecolor="#333333" if hatch else "none", label=state or "Unknown")
        for state, (fill, hatch) in STATE_STYLES.items()
    ]
    healths = [Patch(facecolor=fill, edgecolor="none", label=name) for name, fill in HEALTH_COLORS.items()]
    healths += [blank() for _ in range(len(states) - len(healths))]
    # column by column: a header over each line, then a state above a health
    handles = [blank("hw.state (bar):"), blank("kubelet health (strip):")]
    for state, health in zip(states, healths, strict=True):
        handles += [state, health]
    fig.legend(
        handles=handles,
        labels=[h.get_label() for h in handles],
        loc="outside lower center",
        ncol=len(states) + 1,
        frameon=False,
        fontsize=8,
        handlelength=1.6,
        columnspacing=1.2,
    )


def draw_timeline(result: ReplayResult) -> Figure:
    """The figure :func:`plot_timeline` writes: the rows of :func:`plot_rows`, each verdict episode a
    bar in its hw.state's style over a strip in the kubelet's health, labelled with its reasons
    where they change; wall-clock time (UTC) above and below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot = plot_rows(result)
    labels = plot.labels
    layout = _Layout.for_rows(len(labels))
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, layout.height), layout="constrained")
    _draw_bars(ax, plot)
    _draw_reasons(ax, plot, layout.label_font)
    if plot.rows and plot.summaries:
        ax.axhline(len(plot.rows) - 0.5, color="#555555", linewidth=0.8)
    ax.set_yticks(np.arange(len(labels)), labels, fontsize=layout.tick_font)
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # top to bottom, worst first, the summary rows last
    _time_axes(ax, plot)
    drawn = ""
    if plot.ok_throughout or plot.not_drawn:
        drawn = f"; drawn: {sum(len(r.devices) for r in plot.rows)} not ok at some time"
    ax.set_title(
        f"otel-dra replay: hw.state and kubelet health per device, worst first "
        f"({plot.devices} devices on {plot.nodes} nodes{drawn})",
        fontsize=10,
    )
    _legend(fig)
    return fig


def plot_timeline(result: ReplayResult, path: Path) -> None:
    """Draw :func:`draw_timeline` to the PNG ``path``."""
    import matplotlib.pyplot as plt

    fig = draw_timeline(result)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
