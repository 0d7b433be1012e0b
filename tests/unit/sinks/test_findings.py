"""A finding beyond a device (issue #31): its identity (the node is part of a ``pcie/`` group's, not of a fleet-wide
one's), the summary ``otel-dra status --by group`` shows, and its name as a Kubernetes label value."""

from __future__ import annotations

import re

import pytest

from otel_dra.classifier import Verdict
from otel_dra.sinks.findings import Finding, finding_of, label_value, summarize
from otel_dra.vocabulary import fabric_group, firmware_group, pcie_group

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # k8s.io/apimachinery validation


def v(node: str, hw_id: str, scope: str = "device", group: str | None = None, **kw) -> Verdict:
    fields = {"health": "Healthy", "state": "ok", "reasons": (), "remediation": "none", **kw}
    return Verdict(1, node, hw_id, message="", scope=scope, group=group, **fields)


@pytest.mark.parametrize(
    ("verdict", "finding", "name"),
    [
        (v("n1", "gpu-0"), None, None),
        (
            v("n1", "gpu-0", "link", pcie_group("0000:40:00.0")),
            ("link", "pcie/0000:40:00.0", "n1"),
            "n1/pcie/0000:40:00.0",
        ),
        (v("n1", "gpu-0", "node", "node/n1"), ("node", "node/n1", "n1"), "node/n1"),
        (v("n1", "gpu-0", "workload", "workload/node/n1"), ("workload", "workload/node/n1", "n1"), "workload/node/n1"),
        (v("n1", "gpu-0", "link", fabric_group("c4/1")), ("link", "fabric/c4/1", ""), "fabric/c4/1"),
        (v("n1", "gpu-0", "firmware", firmware_group("H100", "96.00")), ("firmware", "firmware/H100/96.00", ""), None),
        (v("n1", "gpu-0", "node"), ("node", "node", "n1"), "n1/node"),  # a scope without a group: its name
    ],
)
def test_a_findings_identity_holds_its_node_unless_the_group_is_fleet_wide(verdict, finding, name):
    got = finding_of(verdict)
    assert got == (Finding(*finding) if finding else None)
    if got is not None and name is not None:
        assert got.name == name


def test_the_same_pci_address_on_two_nodes_is_two_findings_a_firmware_version_one():
    verdicts = [
        *(v("n1", f"gpu-{i}", "link", "pcie/0000:40:00.0", health="Unhealthy", state="failed", reasons=("link",),
            remediation="reboot_node") for i in range(4)),
        v("n2", "gpu-0", "link", "pcie/0000:40:00.0", health="Unknown", state=None, reasons=("link", "stale")),
        v("n1", "gpu-7", "firmware", "firmware/H100/96.00", state="degraded", reasons=("firmware",),
          remediation="update_firmware"),
        v("n2", "gpu-7", "firmware", "firmware/H100/96.00", reasons=("firmware",), remediation="update_firmware"),
        v("n1", "gpu-5", health="Unhealthy", state="failed", reasons=("memory_ecc",)),  # a device's own: no finding
    ]  # fmt: skip
    got = summarize(verdicts)
    assert [(s.finding.group, s.finding.node, len(s.devices)) for s in got] == [
        ("pcie/0000:40:00.0", "n1", 4),  # Unhealthy first
        ("pcie/0000:40:00.0", "n2", 1),  # then Unknown
        ("firmware/H100/96.00", "", 2),
    ]
    firmware = got[2]
    assert (firmware.nodes, firmware.health, firmware.state, firmware.reasons) == (
        ("n1", "n2"),
        "Healthy",
        "degraded",  # the worst of ok and degraded
        ("firmware",),
    )
    assert got[1].reasons == ("link", "stale") and got[0].remediation == "reboot_node"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("n1/pcie/0000:40:00.0", "n1.pcie.0000-40-00.0"),
        ("node/train-007", "node.train-007"),
        ("firmware/NVIDIA H100 80GB HBM3/96.00.89.00.01", "firmware.NVIDIA-H100-80GB-HBM3.96.00.89.00.01"),
        ("/_odd_/", "odd"),  # starts and ends with an alphanumeric
        ("", ""),
    ],
)
def test_a_findings_name_as_a_label_value(text, want):
    assert label_value(text) == want and LABEL_VALUE.match(want)


def test_a_long_name_is_cut_to_63_and_hash_suffixed_so_two_long_names_stay_apart():
    head = "fabric/" + "a1b2c3d4-" * 10
    one, two = label_value(head + "clique-1"), label_value(head + "clique-2")
    assert one != two and len(one) == len(two) == 63
    assert all(LABEL_VALUE.match(x) and re.search(r"-[0-9a-f]{8}$", x) for x in (one, two))
    assert label_value(head + "clique-1") == one  # the same on every run and node
