"""`otel-dra replay --plot` at fleet scale (issue #15, item 9; issue #29), checked on what was drawn:
the rows (worst first, a node's identical ones folded), the summary row, the reasons on the episodes,
the kubelet's health under each row, a UTC date axis above and below, a height bounded at 500
devices, a legend clear of the title and a palette told apart by more than hue."""

from __future__ import annotations

import datetime as dt
import io
import itertools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

import matplotlib.dates as mdates
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from otel_dra.faults import Fault
from otel_dra.replay import ReplayResult, replay
from otel_dra.replay_plot import FRAME_INCHES, MAX_ROWS_INCHES, PLOT_MAX_ROWS, Change, plot_rows, plot_timeline
from tests.support.otlp_trace import T0, S, write_trace


def drawn(result: ReplayResult, path: Path, monkeypatch: pytest.MonkeyPatch) -> Figure:
    """Run plot_timeline as the CLI does, and keep the figure it saved."""
    saved: list[Figure] = []
    original = Figure.savefig

    def keep(self: Figure, *args: object, **kwargs: object) -> None:
        saved.append(self)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_timeline(result, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = saved
    FigureCanvasAgg(fig).draw()  # pyplot has closed it: a canvas of its own, to measure what it drew
    return fig


#: device index → its changes after T0: (seconds after T0, hw.state, reasons)
Faults = Mapping[int, Sequence[tuple[int, str | None, tuple[str, ...]]]]


def fleet(devices: int, faulty: Faults) -> ReplayResult:
    """``devices`` devices on nodes of 8, ok from T0 for two hours; ``faulty``: device index →
    (seconds after T0, hw.state, reasons) changes."""
    result = ReplayResult(interval_s=10.0, first_time_ns=T0, last_time_ns=T0 + 7200 * S)
    for i in range(devices):
        seq: list[Change] = [(T0 + (i % 7) * S, "Healthy", "ok", ())]
        for at, state, reasons in faulty.get(i, []):
            health = "Healthy" if state in ("ok", "degraded", "predicted_failure") else "Unhealthy"
            seq.append((T0 + at * S, health if state else "Unknown", state, reasons))
        result.timeline[(f"node-{i // 8:03d}", f"gpu-{i % 8}")] = seq
    return result


FAULTY: Faults = {
    3: [(1200, "degraded", ("thermal",)), (2400, "failed", ("thermal",))],
    17: [(900, "failed", ("memory_ecc",))],
    42: [(3000, "predicted_failure", ("memory_ecc",))],
    100: [(1800, None, ("stale",)), (2400, "ok", ())],
    101: [(1800, None, ("stale",)), (2400, "ok", ())],
    250: [(600, "degraded", ("link",)), (700, "ok", ()), (5000, "degraded", ("power_throttling",))],
}


def ytick_labels(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def lightness(color: str | tuple[float, ...]) -> float:
    """CIE L* (0 black .. 100 white) of an sRGB colour."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(color)]
    y = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    f = y ** (1 / 3) if y > 216 / 24389 else (24389 / 27 * y + 16) / 116
    return 116 * f - 16


def bars_by_state(fig: Figure) -> dict[str, BarContainer]:
    return {c.get_label(): c for c in fig.axes[0].containers if isinstance(c, BarContainer)}


def test_at_fleet_scale_only_devices_ever_not_ok_get_a_row_worst_first_and_the_rest_one_summary(tmp_path, monkeypatch):
    fig = drawn(fleet(320, FAULTY), tmp_path / "t.png", monkeypatch)
    labels = ytick_labels(fig)
    assert labels == [
        "node-002/gpu-1",  # failed (Unhealthy) at 900 s
        "node-000/gpu-3",  # failed at 2400 s, after a degraded spell
        "node-012: 2 of 8 devices",  # 100 and 101: Unknown (stale) over the same span, one row
        "node-031/gpu-2",  # degraded from 600 s (Healthy)
        "node-005/gpu-2",  # predicted_failure
        "314 devices ok throughout",
    ]
    assert fig.get_size_inches()[1] < 6  # six rows, not 320


def test_rows_sort_by_worst_verdict_then_its_first_time_then_node_and_device():
    faulty: Faults = {
        9: [(3000, "failed", ("memory_ecc",))],
        2: [(100, "degraded", ("thermal",)), (200, "ok", ())],  # degraded early, long over
        30: [(3000, "failed", ("device_lost",))],  # as 9: node/device decides
        5: [(1000, "degraded", ("link",)), (4000, "failed", ("link",))],  # failed last of the failed
        40: [(500, None, ("stale",)), (900, "ok", ())],  # Unknown: ahead of Healthy degraded devices
    }
    rows = plot_rows(fleet(48, faulty))
    assert [r.label for r in rows.rows] == [
        "node-001/gpu-1",
        "node-003/gpu-6",
        "node-000/gpu-5",
        "node-005/gpu-0",
        "node-000/gpu-2",
    ]
    assert [r.worst_at for r in rows.rows] == [T0 + at * S for at in (3000, 3000, 4000, 500, 100)]


def test_a_small_fleet_draws_every_device_a_nodes_identical_ones_in_one_row(tmp_path, monkeypatch):
    fig = drawn(fleet(12, {3: FAULTY[3]}), tmp_path / "t.png", monkeypatch)
    # node-000's seven ok devices start within seconds of each other: the same timeline, drawn once
    assert ytick_labels(fig) == ["node-000/gpu-3", "node-000: 7 of 8 devices", "node-001: 4 devices"]
    (folded,) = [r for r in plot_rows(fleet(12, {3: FAULTY[3]})).rows if r.label == "node-000: 7 of 8 devices"]
    assert folded.devices == tuple(("node-000", f"gpu-{i}") for i in (0, 1, 2, 4, 5, 6, 7))


def test_a_silent_node_folds_into_one_row_but_devices_that_differ_do_not():
    silent: Faults = {i: [(1800, None, ("stale",)), (2400, "ok", ())] for i in range(8, 16)}  # all of node-001
    apart: Faults = {16: [(1800, "failed", ("memory_ecc",))], 17: [(1900, "failed", ("memory_ecc",))]}  # 100 s apart
    same: Faults = {24: [(1800, "degraded", ("link",))], 25: [(1800, "degraded", ("thermal",))]}  # other reasons
    rows = plot_rows(fleet(48, {**silent, **apart, **same}))
    assert [r.label for r in rows.rows] == [
        "node-002/gpu-0",
        "node-002/gpu-1",
        "node-001: 8 devices",
        "node-003/gpu-0",
        "node-003/gpu-1",
    ]
    assert rows.summaries == ["36 devices ok throughout"]
    assert len(rows.rows[2].devices) == 8 and rows.rows[2].changes[1][2] is None


def test_more_devices_not_ok_than_rows_fold_into_a_counted_row_within_a_bounded_height(tmp_path, monkeypatch):
    many = {i: [(600 + 6 * i, "degraded", ("thermal",))] for i in range(0, 1000, 3)}  # 334 devices not ok
    result = fleet(1000, many)
    started = time.perf_counter()
    fig = drawn(result, tmp_path / "t.png", monkeypatch)
    assert time.perf_counter() - started < 30  # one bar call per state, not per sample or per device
    labels = ytick_labels(fig)
    assert len(labels) == PLOT_MAX_ROWS + 2
    assert labels[-2:] == [
        "666 devices ok throughout",
        f"{334 - PLOT_MAX_ROWS} more devices not ok at some time (not drawn)",
    ]
    # the ones drawn are the worst: all degraded, so the earliest onsets
    assert labels[0] == "node-000/gpu-0" and "node-124/gpu-7" not in labels
    assert fig.get_size_inches()[1] <= MAX_ROWS_INCHES + FRAME_INCHES <= 18  # rows get thinner, not the page taller


def test_a_500_device_fleet_stays_within_a_height_bound_and_keeps_its_labels_apart(tmp_path, monkeypatch):
    faulty: dict[int, Sequence[tuple[int, str | None, tuple[str, ...]]]] = {
        i: [(300 + 11 * i, "failed" if i % 4 else "degraded", ("memory_ecc",))] for i in range(0, 500, 2)
    }
    faulty |= {i: [(1800, None, ("stale",)), (2400, "ok", ())] for i in range(40, 48)}  # a silent node
    fig = drawn(fleet(500, faulty), tmp_path / "t.png", monkeypatch)
    labels = ytick_labels(fig)
    assert len(labels) == PLOT_MAX_ROWS + 2 and "node-005: 8 devices" not in labels[: PLOT_MAX_ROWS // 2]
    assert fig.get_size_inches()[1] <= 18
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].get_yticklabels()]
    assert all(a.y0 >= b.y1 - 0.5 for a, b in itertools.pairwise(boxes)), "row labels overlap"
    assert min(float(t.get_fontsize()) for t in fig.axes[0].get_yticklabels()) >= 4.5  # smaller, still legible


def test_each_episode_is_labelled_with_its_reasons(tmp_path, monkeypatch):
    fig = drawn(fleet(320, FAULTY), tmp_path / "t.png", monkeypatch)
    texts = [t.get_text() for t in fig.axes[0].texts]
    # thermal once for its two episodes (the reasons did not change), stale once for its folded row, both of 250's
    assert sorted(texts) == sorted(["thermal", "memory_ecc", "memory_ecc", "stale", "link", "power_throttling"])
    ax = fig.axes[0]
    (thermal,) = [t for t in ax.texts if t.get_text() == "thermal"]
    x, y = thermal.get_position()
    assert round(y) == ytick_labels(fig).index("node-000/gpu-3")
    onset = dt.datetime.fromtimestamp((T0 + 1200 * S) / 1e9, dt.UTC)
    assert abs(mdates.num2date(x, tz=dt.UTC) - onset) < dt.timedelta(minutes=2)  # at its episode's start


def test_the_kubelets_health_runs_in_a_strip_under_each_row(tmp_path, monkeypatch):
    fig = drawn(fleet(320, FAULTY), tmp_path / "t.png", monkeypatch)
    bars = bars_by_state(fig)
    assert {"health Healthy", "health Unhealthy", "health Unknown"} <= set(bars)
    row = ytick_labels(fig).index("node-002/gpu-1")  # failed, so Unhealthy, from 900 s
    (unhealthy,) = [p for p in bars["health Unhealthy"].patches if round(p.get_y() + p.get_height() / 2) == row]
    start = mdates.num2date(unhealthy.get_x(), tz=dt.UTC)
    assert start == dt.datetime.fromtimestamp((T0 + 900 * S) / 1e9, dt.UTC)
    (failed,) = [p for p in bars["failed"].patches if round(p.get_y() + p.get_height() / 2) == row]
    assert unhealthy.get_y() >= failed.get_y() + failed.get_height()  # under the hw.state bar, apart from it
    assert unhealthy.get_height() < failed.get_height() / 2  # a strip, narrower than the bar
    stale = ytick_labels(fig).index("node-012: 2 of 8 devices")
    assert any(round(p.get_y()) == stale for p in bars["health Unknown"].patches)
    # every row has its strip: the Healthy spells of the failed device too, and the summary row
    rows_with_strip = {
        round(p.get_y() + p.get_height() / 2)
        for c in bars.values()
        if (c.get_label() or "").startswith("health")
        for p in c.patches
    }
    assert rows_with_strip == set(range(len(ytick_labels(fig))))


def test_the_time_axis_is_wall_clock_utc(tmp_path, monkeypatch):
    fig = drawn(fleet(320, FAULTY), tmp_path / "t.png", monkeypatch)
    ax = fig.axes[0]
    formatter = ax.xaxis.get_major_formatter()
    assert isinstance(formatter, mdates.ConciseDateFormatter | mdates.DateFormatter | mdates.AutoDateFormatter)
    lo, hi = (mdates.num2date(x, tz=dt.UTC) for x in ax.get_xlim())
    assert lo == dt.datetime.fromtimestamp(T0 / 1e9, dt.UTC)
    assert dt.timedelta(hours=2) <= hi - lo <= dt.timedelta(hours=2, minutes=1)
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(":" in t for t in ticks[1:]), ticks  # 08:15, 08:30, ... not minutes since the start
    assert "UTC" in ax.get_xlabel()
    # and along the top as well: a tall plot is read from either end
    major = ax.xaxis.get_major_ticks()
    top = [t.label2.get_text() for t in major if t.label2.get_visible() and t.tick2line.get_visible()]
    bottom = [t.label1.get_text() for t in major if t.label1.get_visible()]
    assert top and top == bottom


def test_the_legend_is_clear_of_the_title_and_the_bars(tmp_path, monkeypatch):
    fig = drawn(fleet(320, FAULTY), tmp_path / "t.png", monkeypatch)
    ax = fig.axes[0]
    legends = [*fig.legends, *([ax.get_legend()] if ax.get_legend() else [])]
    assert len(legends) == 1
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas drawn()
    legend = legends[0].get_window_extent(renderer)
    title = ax.title.get_window_extent(renderer)
    assert not Bbox.intersection(legend, title)
    assert not Bbox.intersection(legend, ax.get_window_extent(renderer))  # outside the axes
    fig_box = fig.bbox
    assert fig_box.x0 <= legend.x0 and legend.x1 <= fig_box.x1 and fig_box.y0 <= legend.y0  # on the page
    labels = [t.get_text() for t in legends[0].get_texts()]
    # in two lines, column by column: the bars' hw.state above the strips' kubelet health
    assert labels == [
        "hw.state (bar):",
        "kubelet health (strip):",
        "ok",
        "Healthy",
        "predicted_failure",
        "Unhealthy",
        "degraded",
        "Unknown",
        "failed",
        "",
        "Unknown",
        "",
    ]


def test_the_states_differ_in_lightness_or_pattern_not_only_in_hue(tmp_path, monkeypatch):
    fig = drawn(fleet(320, FAULTY), tmp_path / "t.png", monkeypatch)
    bars = bars_by_state(fig)
    assert {"ok", "predicted_failure", "degraded", "failed", "Unknown"} <= set(bars)
    assert (
        lightness(bars["health Healthy"].patches[0].get_facecolor())
        - lightness(bars["health Unhealthy"].patches[0].get_facecolor())
        >= 50
    )  # Unhealthy stands out from Healthy in grey too
    style = {s: (bars[s].patches[0].get_facecolor(), bars[s].patches[0].get_hatch() or "") for s in bars}
    ok, failed = style["ok"], style["failed"]
    assert lightness(ok[0]) - lightness(failed[0]) >= 20  # failed much darker than ok, seen in grey too
    assert failed[1] and not ok[1]  # and patterned
    states = ["ok", "predicted_failure", "degraded", "failed", "Unknown"]
    for i, a in enumerate(states):
        for b in states[i + 1 :]:
            (fa, ha), (fb, hb) = style[a], style[b]
            assert ha != hb or abs(lightness(fa) - lightness(fb)) >= 10, (a, b)
    # no state is pure red or pure green, the pair a red-green colour-blind reader can't tell apart
    for fill, _ in style.values():
        r, g, b = to_rgb(fill)
        assert not (g > 0.5 and r < 0.3 and b < 0.3) and not (r > 0.7 and g < 0.3 and b < 0.3), fill


def test_a_replayed_trace_plots_its_reasons(tmp_path, monkeypatch):
    trace = write_trace(
        tmp_path / "t.jsonl.gz",
        {"node-a": (4, [Fault("gpu-1", "memory_ecc", 120)]), "node-b": (4, [])},
        seconds=600,
    )
    from otel_dra.policy import load

    result = replay([trace], load(), io.StringIO(), timeline=True)
    fig = drawn(result, tmp_path / "t.png", monkeypatch)
    assert ytick_labels(fig) == ["node-a/gpu-1", "node-a: 3 of 4 devices", "node-b: 4 devices"]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("memory_ecc" in t for t in texts), texts
    lo = mdates.num2date(fig.axes[0].get_xlim()[0], tz=dt.UTC)
    assert abs(lo - dt.datetime.fromtimestamp(T0 / 1e9, dt.UTC)) < dt.timedelta(minutes=1)
