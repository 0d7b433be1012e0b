"""No series dropped: more devices than the SDK's default limit of 2,000 series per
instrument allows, and every one of them arrives, none folded into the overflow series."""

from otel_dra.agent import series_limit
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig
from tests.support.helpers import collect

DEVICES = 1000


def test_a_thousand_devices_times_eight_error_types_all_arrive():
    src = SimulatedSource(SimulatorConfig("big-node", devices=DEVICES, seed=5))
    frame = src.read(0)
    points, _ = collect(frame, src.schema, limit=series_limit(src.schema, DEVICES))
    errors = [p for p in points if p.metric == "hw.errors"]
    assert not any("otel.metric.overflow" in p.attrs for p in points)
    keys = {(p.attrs["hw.id"], p.attrs["error.type"], p.attrs.get("hw.link.type")) for p in errors}
    assert len(errors) == len(keys) == DEVICES * 8  # 6 types + link on pcie and nvlink
    assert len({p.attrs["hw.id"] for p in errors}) == DEVICES
    temps = [p for p in points if p.metric == "hw.temperature"]
    assert len(temps) == DEVICES * 2


def test_the_sdk_default_would_have_folded_them():
    """The reason the limit is sized: with the default, the same frame loses series."""
    src = SimulatedSource(SimulatorConfig("big-node", devices=DEVICES, seed=5))
    points, _ = collect(src.read(0), src.schema, limit=2000)
    assert any("otel.metric.overflow" in p.attrs for p in points)
