"""The board as users read it: ``/v1/devices`` carries every verdict's scope, and its group when it has one
(contract section 4), and the log line of a change names what a verdict about more than its device is about."""

from __future__ import annotations

import json
import logging

import pytest

from otel_dra.classifier import Verdict
from otel_dra.classifier.registry import DeviceRegistry
from otel_dra.logs import OneLineFormatter
from otel_dra.state.board import VerdictBoard
from tests.support.logfmt import logfmt

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
    """What publish reads of a DeviceRegistry: every device known, no attributes, nothing ever forgotten."""

    def __init__(self) -> None:
        self.attrs: list[dict[str, str]] = [{}]
        self.generation = 0

    def row(self, node: str, hw_id: str) -> int:
        return 0


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_each_change_is_a_line_whose_verdict_is_keys_a_log_shipper_reads(
    caplog: pytest.LogCaptureFixture, log_format: str
):
    """Issue #29: the verdict sat inside ``msg``, so Loki's ``| logfmt`` got no ``device`` or ``health``. Each
    is a key of its own now, in both formats, with ``scope`` and ``group`` for a verdict beyond its device."""
    board = VerdictBoard()
    formatter = OneLineFormatter(log_format)
    with caplog.at_level(logging.DEBUG, logger="otel_dra.state.board"):
        board.publish([OWN, NODE_WIDE], _Registry())  # type: ignore[arg-type]
    parse = logfmt if log_format == "logfmt" else json.loads
    lines = {f["device"]: f for f in (parse(formatter.format(r)) for r in caplog.records)}
    wide = lines["gpu-1"]
    assert {k: wide[k] for k in ("node", "health", "state", "reasons", "remediation", "scope", "group")} == {
        "node": "train-007",
        "health": "Unhealthy",
        "state": "failed",
        "reasons": "power_delivery",
        "remediation": "reboot_node",
        "scope": "node",
        "group": "node/train-007",
    }
    assert wide["msg"] == "verdict: power delivery faults on every GPU of the node" and wide["level"] == "WARNING"
    own = lines["gpu-0"]
    assert (own["health"], own["reasons"], own["remediation"]) == ("Healthy", "-", "none") and "scope" not in own


def test_a_recovery_is_logged_at_info_and_only_a_first_healthy_verdict_at_debug(caplog: pytest.LogCaptureFixture):
    """Issue #29: "first verdict" was true of every return to Healthy, so a recovery left no line at the
    default level while its failure was a WARNING."""
    board = VerdictBoard()
    failed = Verdict(5, "train-007", "gpu-0", "Unhealthy", "failed", ("memory_ecc",), "reset_device", "ECC")
    recovered = Verdict(9, "train-007", "gpu-0", "Healthy", "ok", (), "none", "fine again")
    with caplog.at_level(logging.DEBUG, logger="otel_dra.state.board"):
        for verdicts in ([OWN], [failed], [recovered]):
            board.publish(verdicts, _Registry())  # type: ignore[arg-type]
    assert [r.levelname for r in caplog.records] == ["DEBUG", "WARNING", "INFO"]


def test_devices_the_registry_forgets_leave_the_board_and_are_only_looked_for_when_it_forgot_one():
    """A device expired from the registry leaves the board at the next publish; while the registry forgets
    nothing, a publish looks up only the changed verdicts' devices, not every device on the board each tick."""
    registry = DeviceRegistry()
    rows, _ = registry.rows_for("train-007", ["gpu-0", "gpu-1"])
    registry.last_heard[rows] = [100.0, 10.0]
    board = VerdictBoard()
    board.publish([OWN, NODE_WIDE], registry)
    looked: list[tuple[str, str]] = []
    real = registry.row
    registry.row = lambda node, hw_id: looked.append((node, hw_id)) or real(node, hw_id)  # type: ignore[method-assign]
    board.publish([], registry)
    board.publish([OWN], registry)
    assert looked == [("train-007", "gpu-0")] and len(board.snapshot()) == 2
    registry.expire(now_s=120.0, ttl_s=60.0)  # gpu-1, last heard at 10 s, is gone
    board.publish([], registry)
    assert [v.hw_id for v, _ in board.snapshot()] == ["gpu-0"]
