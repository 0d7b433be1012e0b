"""Network-attached devices: several nodes' views of one DRA device, combined by policy."""

from dataclasses import replace

import pytest

from otel_dra.classifier import Verdict
from otel_dra.classifier.views import by_device, combine

STATES = {"Healthy": "ok", "Unhealthy": "failed", "Unknown": None}


def view(node: str, health: str, reasons=(), pool="fabric-1", device="nic-7", state=None) -> Verdict:
    state = state if state is not None else STATES[health]
    remediation = "reset_device" if health == "Unhealthy" else "none"
    return Verdict(
        1,
        node,
        "hw-" + device,
        health,
        state,
        tuple(reasons),
        remediation,
        f"{node} says {health}",
        pool=pool,
        device=device,
        last_reported_time={"n1": 5, "n2": 7, "n3": 6}.get(node, 1),
    )


ONE_BAD = [view("n1", "Unhealthy", ["link"]), view("n2", "Healthy"), view("n3", "Healthy")]
TWO_BAD = [view("n1", "Unhealthy", ["link"]), view("n2", "Unhealthy", ["device_lost"]), view("n3", "Healthy")]


@pytest.mark.parametrize(
    ("views", "mode", "health", "reasons"),
    [
        (ONE_BAD, "any", "Unhealthy", ("link",)),
        (ONE_BAD, "majority", "Healthy", ()),
        (ONE_BAD, "all", "Healthy", ()),
        (TWO_BAD, "any", "Unhealthy", ("device_lost", "link")),
        (TWO_BAD, "majority", "Unhealthy", ("device_lost", "link")),
        (TWO_BAD, "all", "Healthy", ()),
    ],
)
def test_modes(views, mode, health, reasons):
    combined = combine(views, mode)
    assert combined.health == health
    assert combined.reasons == reasons
    assert combined.remediation == ("reset_device" if health == "Unhealthy" else "none")
    assert combined.message.startswith(f"seen from 3 nodes ({mode}): n1 Unhealthy/failed")
    assert combined.last_reported_time == 7


def test_unknown_views_do_not_vote_while_any_view_is_known():
    views = [view("n1", "Unknown"), view("n2", "Unknown"), view("n3", "Unhealthy", ["thermal"])]
    assert combine(views, "majority").health == "Unhealthy"
    assert combine([view("n1", "Unknown"), view("n2", "Unknown")], "any").health == "Unknown"


def test_by_device_reports_the_disagreeing_nodes_and_passes_single_views_through():
    local = view("n1", "Healthy", device="gpu-0", pool="n1")
    nameless = view("n2", "Unhealthy", device="", pool="")
    out = {(d.pool, d.device): d for d in by_device([*ONE_BAD, local, nameless], "majority")}
    assert set(out) == {("fabric-1", "nic-7"), ("n1", "gpu-0")}
    shared = out[("fabric-1", "nic-7")]
    assert shared.verdict.health == "Healthy" and shared.disagreeing == ("n1",) and len(shared.views) == 3
    assert out[("n1", "gpu-0")].verdict is local and out[("n1", "gpu-0")].disagreeing == ()
    only = by_device([*ONE_BAD, local, nameless], "majority", shared_only=True)
    assert [(d.pool, d.device) for d in only] == [("fabric-1", "nic-7")] and only[0] == shared


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="any, majority, all"):
        combine(ONE_BAD, "most")


def test_scope_and_group_follow_the_chosen_view():
    """The combined verdict is the chosen view with the agreeing views' reasons and remediation
    (``dataclasses.replace``): what it is about, its scope and group, is the chosen view's."""
    link = replace(view("n1", "Unhealthy", ["link"]), scope="link", group="pcie/0000:40:00.0")
    views = [link, view("n2", "Healthy"), view("n3", "Healthy")]
    worst = combine(views, "any")
    assert (worst.node, worst.scope, worst.group) == ("n1", "link", "pcie/0000:40:00.0")
    held = combine(views, "majority")  # two healthy views of the device itself: theirs
    assert (held.health, held.scope, held.group) == ("Healthy", "device", None)
    assert combine([link], "all") is link
