"""The board as users read it: ``/v1/devices`` carries every verdict's scope, and its group when it has one
(contract section 4), and the log line of a change names what a verdict about more than its device is about."""

from __future__ import annotations

import json
import logging

import pytest

from otel_dra.classifier import Verdict
from otel_dra.state.board import VerdictBoard

OWN = Verdict(1, "train-007", "gpu-0", "Healthy", "ok", (), "none", "fine", pool="train-007", device="gpu-0")
NODE_WIDE = Verdict(
    1,
    "train-007",
    "gpu-1",
    "Unhealthy",
    "failed",
    ("power_delivery",),
    "reboot_node",
    "power delivery faults on every GPU of the node",
    pool="train-007",
    device="gpu-1",
    scope="node",
    group="node/train-007",
)


def test_v1_devices_serves_scope_always_and_group_when_the_verdict_names_one():
    board = VerdictBoard()
    board.update([OWN, NODE_WIDE], lambda node, dev: {})
    status, kind, body = board.json_route()
    assert (status, kind) == ("200 OK", "application/json")
    devices = {d["hw.id"]: d for d in json.loads(body)["devices"]}
    assert (devices["gpu-1"]["scope"], devices["gpu-1"]["group"]) == ("node", "node/train-007")
    assert devices["gpu-0"]["scope"] == "device" and "group" not in devices["gpu-0"]
    assert [d["hw.id"] for d in json.loads(body)["devices"]] == ["gpu-1", "gpu-0"]  # unhealthy first, as before


class _Registry:
    """The two calls publish makes of a DeviceRegistry: every device known, no attributes."""

    def __init__(self) -> None:
        self.attrs: list[dict[str, str]] = [{}]

    def row(self, node: str, hw_id: str) -> int:
        return 0


def test_the_log_line_of_a_change_names_the_scope_and_group_of_a_verdict_beyond_the_device(
    caplog: pytest.LogCaptureFixture,
):
    board = VerdictBoard()
    with caplog.at_level(logging.DEBUG, logger="otel_dra.state.board"):
        board.publish([OWN, NODE_WIDE], _Registry())  # type: ignore[arg-type]
    lines = {r.getMessage().split()[2]: r.getMessage() for r in caplog.records}
    assert "remediation=reboot_node scope=node group=node/train-007: power delivery" in lines["device=gpu-1"]
    assert "scope=" not in lines["device=gpu-0"]  # a device's own verdict: the line it always was
