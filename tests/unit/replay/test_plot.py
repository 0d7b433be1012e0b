"""`otel-dra replay --plot` at fleet scale (issue #15, item 9), checked on what was drawn: the rows,
the summary row, the reasons on the episodes, a UTC date axis, a legend clear of the title and
a palette told apart by more than hue."""

from __future__ import annotations

import datetime as dt
import io
import time
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
from otel_dra.replay import ReplayResult, plot_timeline, replay
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


def fleet(devices: int, faulty: dict[int, list[tuple[int, str | None, tuple[str, ...]]]]) -> ReplayResult:
    """``devices`` devices on nodes of 8, ok from T0 for two hours; ``faulty``: device index →
    (seconds after T0, hw.state, reasons) changes."""
    result = ReplayResult(interval_s=10.0, first_time_ns=T0, last_time_ns=T0 + 7200 * S)
    for i in range(devices):
        seq = [(T0 + (i % 7) * S, "Healthy", "ok", ())]
        for at, state, reasons in faulty.get(i, []):
            health = "Healthy" if state in ("ok", "degraded", "predicted_failure") else "Unhealthy"
            seq.append((T0 + at * S, health if state else "Unknown", state, reasons))
        result.timeline[(f"node-{i // 8:03d}", f"gpu-{i % 8}")] = seq
    return result


FAULTY = {
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


def test_at_fleet_scale_only_devices_ever_not_ok_get_a_row_and_the_rest_one_summary(tmp_path, monkeypatch):
    fig = drawn(fleet(320, FAULTY), tmp_path / "t.png", monkeypatch)
    labels = ytick_labels(fig)
    assert labels == [
        "node-000/gpu-3",
        "node-002/gpu-1",
        "node-005/gpu-2",
        "node-012/gpu-4",
        "node-012/gpu-5",
        "node-031/gpu-2",
        "314 devices ok throughout",
    ]
    assert fig.get_size_inches()[1] < 6  # seven rows, not 320


def test_a_small_fleet_draws_every_device(tmp_path, monkeypatch):
    fig = drawn(fleet(12, {3: FAULTY[3]}), tmp_path / "t.png", monkeypatch)
    assert ytick_labels(fig) == [f"node-00{i // 8}/gpu-{i % 8}" for i in range(12)]


def test_more_devices_not_ok_than_rows_fold_into_a_counted_row(tmp_path, monkeypatch):
    from otel_dra.replay import PLOT_MAX_ROWS

    many = {i: [(600 + i, "degraded", ("thermal",))] for i in range(0, 1000, 3)}  # 334 devices not ok
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
    # the ones drawn are those not ok the longest: the earliest onsets
    assert labels[0] == "node-000/gpu-0" and "node-124/gpu-7" not in labels


def test_each_episode_is_labelled_with_its_reasons(tmp_path, monkeypatch):
    fig = drawn(fleet(320, FAULTY), tmp_path / "t.png", monkeypatch)
    texts = [t.get_text() for t in fig.axes[0].texts]
    # thermal once for its two episodes (the reasons did not change), both stale episodes, both of 250's
    assert sorted(texts) == sorted(
        ["thermal", "memory_ecc", "memory_ecc", "stale", "stale", "link", "power_throttling"]
    )
    ax = fig.axes[0]
    (thermal,) = [t for t in ax.texts if t.get_text() == "thermal"]
    x, y = thermal.get_position()
    assert y == ytick_labels(fig).index("node-000/gpu-3")
    onset = dt.datetime.fromtimestamp((T0 + 1200 * S) / 1e9, dt.UTC)
    assert abs(mdates.num2date(x, tz=dt.UTC) - onset) < dt.timedelta(minutes=2)  # at its episode's start


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
    assert labels == ["ok", "predicted_failure", "degraded", "failed", "Unknown"]


def test_the_states_differ_in_lightness_or_pattern_not_only_in_hue(tmp_path, monkeypatch):
    fig = drawn(fleet(320, FAULTY), tmp_path / "t.png", monkeypatch)
    bars = bars_by_state(fig)
    assert {"ok", "predicted_failure", "degraded", "failed", "Unknown"} <= set(bars)
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
    assert ytick_labels(fig) == [f"node-{n}/gpu-{i}" for n in "ab" for i in range(4)]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("memory_ecc" in t for t in texts), texts
    lo = mdates.num2date(fig.axes[0].get_xlim()[0], tz=dt.UTC)
    assert abs(lo - dt.datetime.fromtimestamp(T0 / 1e9, dt.UTC)) < dt.timedelta(minutes=1)
