"""The fleet's own rendering of the verdict metrics says exactly what the SDK path says, the verdict's scope and
group (contract section 4) included."""

import gzip
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_dra import conventions as cv
from otel_dra import forked
from otel_dra.classifier import Verdict
from otel_dra.sinks import provider, verdict_text
from otel_dra.sinks._mapping import prometheus_label
from otel_dra.sinks.exposition import Gzipped
from otel_dra.sinks.verdict_metrics import VerdictMetrics
from otel_dra.sinks.verdict_text import VerdictText
from otel_dra.state.board import VerdictBoard
from otel_dra.vocabulary import HW_STATES, SCOPES

REGISTRY = Path(__file__).resolve().parents[3] / "semconv" / "registry.yaml"

ATTRS = {"hw.type": "gpu", "hw.vendor": "NVIDIA", "dra.pool.name": "node-1", "dra.driver.name": "gpu.example.com"}
NODE_SCOPE = {"scope": "node", "group": "node/node-1"}
WORKLOAD_SCOPE = {"scope": "workload", "group": 'workload/ns/pod "quoted"'}


def board_of(verdicts: list[Verdict]) -> VerdictBoard:
    board = VerdictBoard()
    board.update(verdicts, lambda node, dev: {**ATTRS, "dra.device.name": dev, "hw.name": 'quote " and \\ back'})
    return board


def samples(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """The verdict series as Prometheus stores them: an empty label is no label. (The SDK's exporter writes
    every label of a family on every line, ``dra_device_health_group=""`` where a verdict has no group, once
    any verdict has one; the fleet's text leaves it out. Both are one series to Prometheus.)"""
    out = set()
    for family in text_string_to_metric_families(text):
        if family.name not in ("hw_status", "dra_device_health"):
            continue
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if not k.startswith("otel_scope") and v))
            out.add((s.name, labels, s.value))
    return out


def test_same_series_and_values_as_the_sdk_path():
    verdicts = [
        Verdict(1, "node-1", "gpu-0", "Healthy", "ok", (), "none", "fine"),
        Verdict(1, "node-1", "gpu-1", "Unhealthy", "failed", ("driver_errors", "memory_ecc"), "reset_device", "x"),
        Verdict(1, "node-1", "gpu-2", "Unknown", None, ("stale",), "none", "silent"),
        Verdict(1, "node-1", "gpu-3", "Healthy", "degraded", ("thermal",), "reduce_load", "hot"),
        Verdict(1, "node-1", "gpu-4", "Unhealthy", "failed", ("power_delivery",), "reboot_node", "x", **NODE_SCOPE),
        Verdict(1, "node-1", "gpu-5", "Healthy", "ok", (), "check_workload", "job", **WORKLOAD_SCOPE),
    ]
    board = board_of(verdicts)
    registry = CollectorRegistry()
    mp = provider.build_meter_provider("node-1", [provider.prometheus_reader(registry)], 10_000)
    VerdictMetrics(board, mp.get_meter("otel_dra"))
    sdk = generate_latest(registry).decode()
    mp.shutdown()
    ours = VerdictText().render(board.snapshot()).decode()
    assert samples(ours) == samples(sdk)
    assert len(samples(ours)) == 6 * 5 + 6


def states(text: str) -> dict[str, float]:
    return {dict(labels)["hw_state"]: value for name, labels, value in samples(text) if name == "hw_status"}


def test_cached_lines_follow_changes_and_forget_gone_devices():
    text = VerdictText()
    board = board_of([Verdict(1, "n", "gpu-0", "Healthy", "ok", (), "none", "")])
    assert states(text.render(board.snapshot()).decode())["ok"] == 1
    changed = Verdict(2, "n", "gpu-0", "Unhealthy", "failed", ("device_lost",), "reboot_node", "")
    board.update([changed], lambda node, dev: dict(ATTRS))
    rendered = text.render(board.snapshot()).decode()
    assert states(rendered) == {"ok": 0, "failed": 1, "degraded": 0, "predicted_failure": 0, "needs_cleaning": 0}
    assert 'dra_device_health_reasons="device_lost"' in rendered
    board.forget(lambda key: False)
    assert "gpu-0" not in text.render(board.snapshot()).decode()


def sdk_text(board: VerdictBoard) -> str:
    registry = CollectorRegistry()
    mp = provider.build_meter_provider("node-1", [provider.prometheus_reader(registry)], 10_000)
    VerdictMetrics(board, mp.get_meter("otel_dra"))
    text = generate_latest(registry).decode()
    mp.shutdown()
    return text


def reference(board: VerdictBoard) -> bytes:
    """The rendering spelled out: every line's labels made whole from the device's, sorted (what the fleet
    rendered before it kept one label string a device)."""

    def labels(attrs: dict[str, str]) -> str:
        def escape(v: str) -> str:
            return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

        return ",".join(f'{k}="{escape(v)}"' for k, v in sorted((prometheus_label(k), v) for k, v in attrs.items()))

    status = [f"# HELP hw_status {cv.HW_STATUS.description}", "# TYPE hw_status gauge"]
    health = [f"# HELP dra_device_health {cv.DRA_DEVICE_HEALTH.description}", "# TYPE dra_device_health gauge"]
    for v, attrs in board.snapshot():
        base = {cv.HW_ID: v.hw_id, **attrs, cv.K8S_NODE_NAME_ATTR: v.node}
        status += [f"hw_status{{{labels({**base, cv.HW_STATE: s})}}} {int(s == v.state)}" for s in HW_STATES]
        trio = {
            cv.DRA_DEVICE_HEALTH_STATE: v.health,
            cv.DRA_DEVICE_HEALTH_REASONS: ",".join(v.reasons),
            cv.DRA_DEVICE_HEALTH_REMEDIATION: v.remediation,
            cv.DRA_DEVICE_HEALTH_SCOPE: v.scope,
            **({cv.DRA_DEVICE_HEALTH_GROUP: v.group} if v.group is not None else {}),
        }
        health.append(f"dra_device_health{{{labels({**base, **trio})}}} 1")
    return ("\n".join(status) + "\n" + "\n".join(health) + "\n").encode()


def test_attributes_that_sort_among_the_spliced_labels_render_as_whole_lines_would():
    """A device's labels are kept once and hw_state and the health labels spliced in where they sort;
    attributes named like those labels (or like their label names), sorting between the health labels, or
    before or after every label, render as whole lines would, byte for byte, through verdict changes."""
    odd = {
        "gpu-0": {"a.first": "x", "zz.last": 'y "quoted" \\ and\nnewline'},
        "gpu-1": {"hw.state": "shadowed", "dra.device.health.state": "shadowed too"},
        "gpu-2": {"dra.device.health.score": "sorts between the health labels"},
        "gpu-3": {"hw_state": "same label name, another key"},
        "gpu-4": {},
        "gpu-6": {"dra.device.health.label": "sorts between the group and the reasons"},
        "gpu-7": {"dra.device.health.group": "shadowed by a verdict's group, or not"},
    }
    verdicts = [Verdict(1, "node-1", dev, "Unhealthy", "failed", ("memory_ecc",), "reset_device", "x") for dev in odd]
    verdicts.append(Verdict(1, "node-1", "gpu-5", "Unknown", None, ("stale",), "none", "silent"))
    board = VerdictBoard()
    board.update(verdicts, lambda node, dev: {**ATTRS, **odd.get(dev, {})})
    text = VerdictText()
    assert text.render(board.snapshot()) == reference(board)
    node_wide = [
        Verdict(2, "node-1", dev, "Unhealthy", "failed", ("cooling",), "reboot_node", "", **NODE_SCOPE) for dev in odd
    ]
    board.update(node_wide, lambda node, dev: {**ATTRS, **odd.get(dev, {})})
    assert text.render(board.snapshot()) == reference(board)
    healed = [Verdict(3, "node-1", dev, "Healthy", "ok", (), "none", "fine") for dev in odd]
    board.update(healed, lambda node, dev: {**ATTRS, **odd.get(dev, {})})
    assert text.render(board.snapshot()) == reference(board)


def test_devices_with_the_same_attribute_keys_share_one_shape_and_a_verdict_one_health_text():
    verdicts = [Verdict(1, "node-1", f"gpu-{i}", "Healthy", "ok", (), "none", "fine") for i in range(50)]
    board = board_of(verdicts)
    text = VerdictText()
    first = text.render(board.snapshot())
    assert text.render(board.snapshot()) == first
    assert len(text._shapes) == 1 and len(text._health_texts) == 1
    assert samples(first.decode()) == samples(sdk_text(board)) and first == reference(board)


def test_a_device_two_nodes_see_has_its_labels_on_each():
    shared = [Verdict(1, node, "gpu-0", "Healthy", "ok", (), "none", "fine") for node in ("node-1", "node-2")]
    board = VerdictBoard()
    board.update(shared, lambda node, dev: {**ATTRS, "dra.pool.name": node})
    text = VerdictText()
    assert text.render(board.snapshot()) == reference(board)
    assert text.render(board.snapshot()).count(b'hw_id="gpu-0"') == 2 * 6
    board.forget(lambda key: key[0] == "node-2")
    assert text.render(board.snapshot()) == reference(board)


#: Attribute keys a device may carry: ordinary ones, and ones named like (or sorting among) the labels placed
#: into every line, or before or after every label.
_KEYS = st.sampled_from(
    [
        "hw.type",
        "hw.vendor",
        "dra.pool.name",
        "dra.device.name",
        "a.first",
        "zz.last",
        "hw.state",
        "hw_state",
        "dra.device.health.state",
        "dra.device.health.score",
        "dra.device.health.label",
        "dra.device.health.group",
        "dra.device.health",
        "hw.id",
        "k8s.node.name",
        "1leading.digit",
        "hw-type",
        "f{string}'s \"source\\",  # (a label name of its own: nothing of it reaches a shape's code)
    ]
)
#: Label value characters: the three the text format escapes among plain and multi-byte ones.
_CHARS = st.sampled_from(['"', "\\", "\n", "a", "z", "é", "{", "}", " "])
_VERDICTS = st.sampled_from(
    [
        ("Healthy", "ok", (), "none", {}),
        ("Unhealthy", "failed", ("memory_ecc",), "reset_device", {}),
        ("Unknown", None, ("stale",), "none", {}),
        ("Healthy", "degraded", ("thermal",), "reduce_load", NODE_SCOPE),
        ("Unhealthy", "failed", ("power_delivery", "driver_errors"), "reboot_node", WORKLOAD_SCOPE),
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(_KEYS, st.text(alphabet=_CHARS, max_size=6), max_size=6),
            _VERDICTS,
            st.sampled_from(["n-1", "n-2"]),
        ),
        max_size=12,
    )
)
def test_any_attributes_render_as_whole_lines_would(devices):
    """Whatever attribute keys and values devices carry (quotes, backslashes, newlines, keys named like the placed
    labels or sorting among them, keys that share a label name), the text is byte for byte the lines made whole."""
    board = VerdictBoard()
    verdicts, attrs = [], {}
    for i, (own, (health, state, reasons, remediation, scope), node) in enumerate(devices):
        verdicts.append(Verdict(1, node, f"gpu-{i}", health, state, reasons, remediation, "x", **scope))
        attrs[(node, f"gpu-{i}")] = own
    board.update(verdicts, lambda node, dev: attrs[(node, dev)])
    text = VerdictText()
    assert text.render(board.snapshot()) == reference(board)
    assert text.render(board.snapshot()) == reference(board)


def health_labels(text: str) -> dict[str, dict[str, str]]:
    """Each device's ``dra_device_health`` labels, by its hw_id."""
    return {dict(labels)["hw_id"]: dict(labels) for name, labels, _ in samples(text) if name == "dra_device_health"}


def test_scope_is_always_a_label_and_the_group_only_when_the_verdict_names_one():
    """A device's own verdict says ``scope="device"`` and has no group label (absent, not "": Prometheus reads both
    the same, and an absent one costs nothing); one about its node names the node as its group, in both renderers,
    and the group follows the verdict as it changes, the cached label text too."""
    board = board_of(
        [
            Verdict(1, "node-1", "gpu-0", "Healthy", "ok", (), "none", "fine"),
            Verdict(1, "node-1", "gpu-1", "Unhealthy", "failed", ("power_delivery",), "reboot_node", "x", **NODE_SCOPE),
        ]
    )
    text = VerdictText()
    for rendered in (text.render(board.snapshot()).decode(), sdk_text(board)):
        by_device = health_labels(rendered)
        assert by_device["gpu-0"]["dra_device_health_scope"] == "device"
        assert "dra_device_health_group" not in by_device["gpu-0"]  # (empty on the SDK's line: see samples())
        assert by_device["gpu-1"]["dra_device_health_scope"] == "node"
        assert by_device["gpu-1"]["dra_device_health_group"] == "node/node-1"
    own = [line for line in text.render(board.snapshot()).splitlines() if line.startswith(b"dra_device_health{")]
    assert [b"dra_device_health_group" in line for line in own] == [False, True]
    moved = Verdict(
        2, "node-1", "gpu-1", "Unhealthy", "failed", ("power_delivery",), "reboot_node", "x", **WORKLOAD_SCOPE
    )
    board.update([moved], lambda node, dev: {**ATTRS, "dra.device.name": dev, "hw.name": 'quote " and \\ back'})
    rendered = text.render(board.snapshot())
    assert health_labels(rendered.decode())["gpu-1"]["dra_device_health_group"] == 'workload/ns/pod "quoted"'
    assert samples(rendered.decode()) == samples(sdk_text(board)) and rendered == reference(board)


def test_the_registry_lists_scope_and_group_on_dra_device_health_with_the_contracts_scopes():
    groups = yaml.safe_load(REGISTRY.read_text())["groups"]
    [metric] = [g for g in groups if g["type"] == "metric" and g["metric_name"] == cv.DRA_DEVICE_HEALTH.name]
    assert {cv.DRA_DEVICE_HEALTH_SCOPE, cv.DRA_DEVICE_HEALTH_GROUP} <= {a["ref"] for a in metric["attributes"]}
    attrs = {a.get("id"): a for g in groups if g["type"] == "attribute_group" for a in g["attributes"]}
    assert tuple(m["value"] for m in attrs[cv.DRA_DEVICE_HEALTH_SCOPE]["type"]["members"]) == SCOPES
    assert attrs[cv.DRA_DEVICE_HEALTH_GROUP]["type"] == "string"


def test_view_disagreement_follows_the_board_and_is_not_regrouped_while_it_stands(monkeypatch):
    """``dra.device.view.disagreement``: 1 for the node whose view of a shared device disagrees with the combined
    verdict; computed again only when the board moved (a fleet's 100,000 verdicts are not regrouped per scrape)."""
    from otel_dra.sinks import verdict_metrics

    def seen(node: str, health: str, state: str | None) -> Verdict:
        return Verdict(1, node, "gpu-0", health, state, (), "none", "x", pool="shared", device="gpu-0")

    board = VerdictBoard()
    board.update([seen("node-1", "Healthy", "ok"), seen("node-2", "Unhealthy", "failed")], lambda node, dev: ATTRS)
    registry = CollectorRegistry()
    mp = provider.build_meter_provider("fleet", [provider.prometheus_reader(registry)], 10_000)
    verdict_metrics.ViewDisagreement(board, mp.get_meter("otel_dra"), "any")
    groupings: list[str] = []
    real = verdict_metrics.VerdictBoard.devices

    def devices(self: VerdictBoard, mode: str, shared_only: bool = False) -> list:
        groupings.append(mode)
        return real(self, mode, shared_only)

    monkeypatch.setattr(verdict_metrics.VerdictBoard, "devices", devices)

    def disagreeing() -> dict[str, float]:
        families = text_string_to_metric_families(generate_latest(registry).decode())
        return {
            s.labels["dra_device_view_node"]: s.value
            for f in families
            if f.name == "dra_device_view_disagreement"
            for s in f.samples
        }

    try:
        assert disagreeing() == {"node-1": 1.0, "node-2": 0.0} and disagreeing() == {"node-1": 1.0, "node-2": 0.0}
        assert len(groupings) == 1  # (the board stood still between the two scrapes)
        board.update([seen("node-2", "Healthy", "ok")], lambda node, dev: ATTRS)
        assert disagreeing() == {"node-1": 0.0, "node-2": 0.0} and len(groupings) == 2
    finally:
        mp.shutdown()


def mixed_board(n: int) -> VerdictBoard:
    """``n`` devices over two nodes, every kind of verdict, some with attributes that make whole lines."""
    kinds = [
        ("Healthy", "ok", (), "none", {}),
        ("Unhealthy", "failed", ("memory_ecc",), "reset_device", {}),
        ("Unknown", None, ("stale",), "none", {}),
        ("Healthy", "degraded", ("thermal",), "reduce_load", NODE_SCOPE),
        ("Unhealthy", "failed", ("power_delivery",), "reboot_node", WORKLOAD_SCOPE),
    ]
    verdicts = []
    for i in range(n):
        health, state, reasons, remediation, scope = kinds[i % len(kinds)]
        verdicts.append(Verdict(1, f"node-{i % 2}", f"gpu-{i}", health, state, reasons, remediation, "x", **scope))
    board = VerdictBoard()
    odd = {"hw_state": "whole lines"}
    board.update(verdicts, lambda node, dev: {**ATTRS, "dra.device.name": dev, **(odd if dev == "gpu-3" else {})})
    return board


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 devices, and a fleet of 10 counted large: what 100,000 devices do, on a few."""
    monkeypatch.setattr(verdict_text, "BATCH", 4)
    monkeypatch.setattr(verdict_text, "LARGE_DEVICES", 10)
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)


@pytest.mark.parametrize("devices", [0, 1, 2, 11, 61])
def test_the_text_made_in_blocks_on_two_cores_is_the_text_made_on_one(small_blocks, devices):
    """A large fleet's text is made in blocks, half of them in a forked copy of the process, as gzip members: read
    as one stream, the same bytes as one process makes, with each family's lines together (as the text format
    asks)."""
    board = mixed_board(devices)
    made = VerdictText().gzipped(board.snapshot())
    assert isinstance(made, Gzipped) and gzip.decompress(bytes(made)) == reference(board)


def test_a_copy_that_cannot_be_made_or_fails_or_hangs_leaves_the_text_to_this_process(
    small_blocks, monkeypatch, caplog
):
    board = mixed_board(40)
    want = reference(board)
    parent = os.getpid()

    def no_fork() -> int:
        raise OSError(12, "Cannot allocate memory")

    with monkeypatch.context() as m:
        m.setattr(forked, "fork", no_fork)
        assert gzip.decompress(bytes(VerdictText().gzipped(board.snapshot()))) == want
    assert "could not fork" in caplog.text
    real = VerdictText._members

    def failing_in_the_copy(self, pairs):
        if os.getpid() != parent:
            raise RuntimeError("the copy fails")
        return real(self, pairs)

    def hanging_in_the_copy(self, pairs):
        if os.getpid() != parent:
            time.sleep(60)
        return real(self, pairs)

    for broken in (failing_in_the_copy, hanging_in_the_copy):
        caplog.clear()
        with monkeypatch.context() as m:
            m.setattr(VerdictText, "_members", broken)
            m.setattr(verdict_text, "SPLIT_TIMEOUT_S", 1.0)
            t0 = time.monotonic()
            assert gzip.decompress(bytes(VerdictText().gzipped(board.snapshot()))) == want
            assert time.monotonic() - t0 < 30
        assert "the forked copy sharing the work failed" in caplog.text


def test_only_a_large_fleet_is_kept_in_blocks_and_made_on_two_cores_where_it_may(small_blocks, monkeypatch):
    board = mixed_board(9)
    text = VerdictText()
    assert not isinstance(text.exposition(board.snapshot()), Gzipped)  # small: pieces, compressed by the cache
    board = mixed_board(30)
    forks: list[int] = []
    real = forked.fork

    def counted() -> int:
        pid = real()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(forked, "fork", counted)
    for cpus, fork, forked_too in ((1, True, False), (2, False, False), (2, True, True)):
        monkeypatch.setattr(forked, "usable_cpus", lambda cpus=cpus: cpus)
        made = VerdictText(fork=fork).exposition(board.snapshot())  # (fork=False: --no-render-fork)
        assert isinstance(made, Gzipped) and gzip.decompress(bytes(made)) == reference(board)
        assert bool(forks) == forked_too
        forks.clear()


def test_a_large_fleets_blocks_are_made_again_only_where_a_verdict_changed(small_blocks, monkeypatch):
    """Rendering a fleet of 100,000 devices for every changed verdict would cost a second of CPU each time it is
    scraped; the blocks whose board entries stand keep their text."""
    monkeypatch.setattr(forked, "usable_cpus", lambda: 1)  # (counted in this process)
    board = mixed_board(30)  # 8 blocks of 4 (the last of 2)
    made: list[tuple[str, ...]] = []
    real = VerdictText._members

    def counted(self, pairs):
        made.append(tuple(v.hw_id for v, _ in pairs))
        return real(self, pairs)

    monkeypatch.setattr(VerdictText, "_members", counted)
    text = VerdictText()

    def render() -> bytes:
        made.clear()
        rendered = text.exposition(board.snapshot())
        assert isinstance(rendered, Gzipped)
        return gzip.decompress(bytes(rendered))

    assert render() == reference(board) and len(made) == 8
    assert render() == reference(board) and made == []
    attrs = {**ATTRS, "dra.device.name": "gpu-5"}
    board.update(
        [Verdict(2, "node-1", "gpu-5", "Unhealthy", "failed", ("xid",), "reset_device", "x")], lambda n, d: attrs
    )
    assert render() == reference(board) and made == [("gpu-4", "gpu-5", "gpu-6", "gpu-7")]
    board.update([Verdict(2, "node-0", "gpu-30", "Healthy", "ok", (), "none", "new")], lambda n, d: attrs)
    assert render() == reference(board) and made == [("gpu-28", "gpu-29", "gpu-30")]
    board.forget(lambda key: key[1] != "gpu-25")  # (every block after it shifts)
    assert render() == reference(board) and made == [
        ("gpu-24", "gpu-26", "gpu-27", "gpu-28"),
        ("gpu-29", "gpu-30"),
    ]
