"""A failure clears when it was repaired, not after a quiet hour; a condition clears when it is over; silence
repairs nothing; a held fault belongs to the device (its serial number), not to its slot.

The repairs are what the anchors key on: DCGM keeps a volatile double-bit error failing until the GPU is reset
(its volatile counters then start over), NVIDIA's DRA driver keeps XID taints until the plugin restarts, and a
new serial number in a slot is another GPU (the counter baselines already check it)."""

from __future__ import annotations

import numpy as np
import pytest

from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier, Verdict
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of

S = 10**9
T0 = 1_800_000_000 * S
UNCORRECTED = Column("hw.errors", attrs_of({"error.type": "uncorrected"}))
RESET = Column("hw.errors", attrs_of({"error.type": "reset"}))
THROTTLE = Column("hw.throttle.time", attrs_of({"hw.throttle.reason": "power_cap"}))
XID79 = Column("hw.errors", attrs_of({"error.type": "driver", "hw.error.code": "79"}))
TEMP = Column("hw.temperature", attrs_of({"hw.sensor_location": "gpu"}), "temp/gpu", "temperature")


def gpu(serial: str) -> dict[str, str]:
    return {"hw.type": "gpu", "hw.vendor": "NVIDIA", "hw.model": "H100 80GB HBM3", "hw.serial_number": serial}


class Node:
    """One node of two GPUs sampled every 10 s, by hand; ``serials`` can change (a GPU swapped in its slot)."""

    def __init__(self, policy: policy_mod.Policy | None = None, restart_repairs: bool = False) -> None:
        self.policy = policy or policy_mod.load()
        self.schema = Schema()
        self.serials = ["SN-A", "SN-B"]
        self.classifier = Classifier(self.policy, self.schema, interval_s=10, restart_repairs=restart_repairs)
        self.t = 0
        self.counts = {"UNCORRECTED": [0.0, 0.0], "RESET": [0.0, 0.0], "THROTTLE": [50.0, 50.0], "XID79": [0.0, 0.0]}
        self.verdicts: dict[str, list[Verdict]] = {"gpu-0": [], "gpu-1": []}
        self.silent = False

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            now = T0 + self.t * S
            if not self.silent:
                table = DeviceTable("n1", ("gpu-0", "gpu-1"), tuple(gpu(s) for s in self.serials))
                cols = {name: self.schema.index(globals()[name]) for name in (*self.counts, "TEMP")}
                values = np.full((2, len(self.schema)), np.nan)
                for name, per_device in self.counts.items():
                    values[:, cols[name]] = per_device
                values[:, cols["TEMP"]] = 60.0
                self.classifier.ingest(Frame(now, table, values))
            for v in self.classifier.evaluate(now):
                self.verdicts[v.hw_id].append(v)
            for i in range(2):
                self.counts["THROTTLE"][i] += 1.0  # a busy GPU's cap time grows
            self.t += 10

    def until(self, device: str, predicate, limit_s: float) -> float | None:
        """Step until ``device``'s verdict meets ``predicate``; seconds it took (None: not within the limit)."""
        start = self.t
        while self.t - start <= limit_s:
            if self.verdicts[device] and predicate(self.verdicts[device][-1]):
                return self.t - start
            self.step()
        return None

    def last(self, device: str = "gpu-0") -> Verdict:
        return self.verdicts[device][-1]


def failed_by_ecc() -> Node:
    node = Node()
    node.step(3)
    node.counts["UNCORRECTED"][0] += 1  # one double-bit error on gpu-0
    node.step()
    assert node.last().reasons == ("memory_ecc",) and node.last().health == "Unhealthy"
    return node


def test_an_uncorrected_error_stays_failed_past_the_old_hour_without_a_reset() -> None:
    node = failed_by_ecc()
    node.step(2 * 360)  # two quiet hours
    last = node.last()
    assert (last.health, last.state, last.reasons, last.remediation) == (
        "Unhealthy",
        "failed",
        ("memory_ecc",),
        "reset_device",
    )
    assert "held until the device is reset" in node.classifier.current()[0].message


@pytest.mark.parametrize("how", ["reset event", "counters start over"])
def test_a_reset_then_a_clean_window_clears_it(how: str) -> None:
    node = failed_by_ecc()
    node.step(30)
    if how == "reset event":
        node.counts["RESET"][0] += 1
    else:  # the driver's volatile ECC counts restart after a reset
        node.counts["UNCORRECTED"][0] = 0.0
    node.step()
    assert node.last().health == "Unhealthy"
    held = node.classifier.current()[0].message
    assert "reset seen" in held and "clears after 5m clean" in held
    took = node.until("gpu-0", lambda v: v.health == "Healthy", 900)
    assert took is not None and 280 <= took <= 320, took  # the policy's clean_after_repair: 5m
    assert node.last().state == "ok" and node.last().reasons == ()
    assert node.last("gpu-1").state == "ok"


def test_an_error_after_the_reset_needs_another_reset() -> None:
    node = failed_by_ecc()
    node.counts["RESET"][0] += 1
    node.step(6)
    node.counts["UNCORRECTED"][0] += 1  # the reset did not fix it
    node.step(2 * 60)
    assert node.last().health == "Unhealthy"
    node.counts["RESET"][0] += 1
    assert node.until("gpu-0", lambda v: v.health == "Healthy", 900) is not None


def test_a_reboot_fault_needs_the_node_not_one_device() -> None:
    node = Node()
    node.step(3)
    node.counts["XID79"][0] += 1  # fallen off the bus: the XID's class says reboot the node
    node.step()
    assert node.last().remediation == "reboot_node" and node.last().health == "Unhealthy"
    node.counts["THROTTLE"][0] = 0.0  # only gpu-0's counters start over: a reset, not the reboot it needs
    node.step(60)
    assert node.last().health == "Unhealthy"
    node.counts["THROTTLE"] = [0.0, 0.0]  # every device's counters start over: the node rebooted
    node.counts["XID79"] = [0.0, 0.0]
    took = node.until("gpu-0", lambda v: v.health == "Healthy", 900)
    assert took is not None and took <= 320
    assert [v.state for v in node.verdicts["gpu-1"]] == ["ok"]  # the reboot was no news for gpu-1


def test_conditions_still_clear_with_their_hold_and_hold_stays_a_choice(tmp_path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("clears: {memory_ecc: hold}\n")
    node = Node(policy_mod.load(path))
    node.step(3)
    node.counts["UNCORRECTED"][0] += 1
    node.step()
    took = node.until("gpu-0", lambda v: v.health == "Healthy", 2 * 3600)
    assert took is not None and 3600 <= took <= 3600 + 400  # the old hour: chosen, not the default


def test_a_new_serial_in_the_slot_starts_clean() -> None:
    node = failed_by_ecc()
    node.step(10)
    node.serials[0] = "SN-C"  # another GPU in that slot, its counters its own
    node.counts["UNCORRECTED"][0] = 7.0
    node.step()
    last = node.last()
    assert (last.health, last.state, last.reasons) == ("Healthy", "ok", ())
    node.step(40)
    assert node.last().state == "ok"  # its own history is a baseline, not news


def test_silence_keeps_what_is_held_and_adds_stale() -> None:
    node = failed_by_ecc()
    node.silent = True
    node.step(3 * 360)  # three hours without a word: nothing was repaired (forgotten after the 1h device_ttl ...)
    last = node.last()
    assert (last.health, last.state, last.reasons, last.remediation) == (
        "Unknown",
        None,
        ("memory_ecc", "stale"),
        "reset_device",
    )
    assert node.last("gpu-1").reasons == ("stale",) and node.last("gpu-1").remediation == "none"
    node.silent = False  # (... and what it held is recalled when it is heard again)
    node.step(60)
    assert node.last().reasons == ("memory_ecc",) and node.last().health == "Unhealthy"


def restarted(node: Node, agent: bool) -> Node:
    """The same node's devices judged by a new process that recalled the old one's memory: the node's own agent
    (``agent``), or the fleet."""
    memory = node.classifier.remember(node.t)
    again = Node(restart_repairs=agent)
    again.t, again.counts = node.t, node.counts
    again.classifier.recall(memory, (T0 + node.t * S) / S)
    again.step()
    assert again.last().health == "Unhealthy"  # recalled: the restart itself is not a clean window
    return again


@pytest.mark.parametrize("agent", [True, False])
def test_the_agents_own_restart_is_the_reboot_the_fleets_is_not(agent: bool) -> None:
    node = Node()
    node.step(3)
    node.counts["XID79"][0] += 1
    node.step()
    assert node.last().remediation == "reboot_node"
    again = restarted(node, agent)
    took = again.until("gpu-0", lambda v: v.health == "Healthy", 900)
    assert (took is not None) == agent, took


def test_the_agents_restart_resets_no_device() -> None:
    again = restarted(failed_by_ecc(), agent=True)
    again.step(60)
    assert (
        again.last().reasons == ("memory_ecc",)
        and "held until the device is reset" in again.classifier.current()[0].message
    )


def test_a_held_fault_in_the_state_file_belongs_to_its_serial() -> None:
    node = failed_by_ecc()
    memory = node.classifier.remember(node.t)
    assert {m.hw_id: m.serial for m in memory} == {"gpu-0": "SN-A"}
    for serial, held in (("SN-A", True), ("SN-C", False)):
        again = Node()
        again.serials[0] = serial
        again.t = node.t
        again.classifier.recall(memory, (T0 + node.t * S) / S)
        again.step()
        assert (again.last().reasons == ("memory_ecc",)) == held, serial
