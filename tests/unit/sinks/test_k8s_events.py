"""Kubernetes Events for the cluster writer (issue #27): client-go's shape and rate limits, against the fake API
server, which enforces the events.k8s.io/v1 schema and the API server's own Event validation."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from otel_dra import policy as policy_mod
from otel_dra.sinks.k8s.events import NOTE_LIMIT, WARNING, EventRecorder, EventSettings, Ref
from tests.support.fake_apiserver import FakeApiServer

RULE = Ref("resource.k8s.io/v1", "DeviceTaintRule", "otel-dra-node-1-gpu-0-memory-ecc-1a2b3c")


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def recorder(clock: Clock, **settings: Any) -> EventRecorder:
    from otel_dra.sinks.k8s.apply import connect

    return EventRecorder(connect(), "health.otel-dra.io/fleet", "otel-dra-fleet-0", EventSettings(**settings), clock)


def test_an_event_about_a_cluster_scoped_rule_goes_to_default_in_client_gos_shape(api):
    clock = Clock()
    rec = recorder(clock)
    rec.record(RULE, WARNING, "DeviceTainted", "Taint", "node-1 gpu-0: memory_ecc, effect NoSchedule: ...")
    assert rec.flush()
    [event] = api.event_list("default")  # DeviceTaintRule is cluster-scoped: client-go's NamespaceDefault
    assert event["metadata"]["name"] == f"{RULE.name}.{int(clock.now * 1e9):x}"
    assert event["regarding"] == {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "name": RULE.name}
    assert event["reportingController"] == "health.otel-dra.io/fleet"
    assert event["reportingInstance"] == "otel-dra-fleet-0"
    assert (event["type"], event["reason"], event["action"]) == (WARNING, "DeviceTainted", "Taint")
    assert event["eventTime"] == "2027-01-15T08:00:00.000001+00:00" and "series" not in event  # RFC3339Micro
    assert rec.counts.created == 1 and rec.counts.dropped == 0


def test_the_same_event_again_becomes_a_series_written_when_it_starts_and_when_it_goes_quiet(api):
    clock = Clock()
    rec = recorder(clock)
    for _ in range(3):
        rec.record(RULE, WARNING, "DeviceTainted", "Taint", "the same note")
        clock.now += 10
    assert rec.flush()
    [event] = api.event_list("default")
    # Created once; the second started the series (one patch, which carries the count so far); the third only counted.
    assert event["series"]["count"] == 3 and rec.counts.created == 1 and rec.counts.patched == 1
    rec.record(RULE, WARNING, "DeviceTainted", "Taint", "the same note")
    rec._housekeep()  # not yet quiet for 6 minutes: nothing more is written
    assert rec.flush() and api.event_list("default")[0]["series"]["count"] == 3
    clock.now += 6 * 60
    rec._housekeep()  # quiet: the series' last count is written, then it is forgotten
    assert rec.flush() and api.event_list("default")[0]["series"]["count"] == 4
    rec._housekeep()
    rec.record(RULE, WARNING, "DeviceTainted", "Taint", "the same note")
    assert rec.flush() and len(api.event_list("default")) == 2  # after the finish, a new Event


def test_a_flapping_device_gets_25_events_then_one_per_five_minutes(api):
    clock = Clock()
    rec = recorder(clock)
    for i in range(40):
        rec.record(RULE, WARNING, "DeviceTainted", "Taint", f"flap {i}")
        clock.now += 1
    assert rec.flush(timeout_s=30)
    assert len(api.event_list("default")) == 25 and rec.counts.spam == 15
    clock.now += 300  # one token back
    rec.record(RULE, WARNING, "DeviceTainted", "Taint", "after five minutes")
    rec.record(RULE, WARNING, "DeviceTainted", "Taint", "and at once again")
    assert rec.flush() and len(api.event_list("default")) == 26 and rec.counts.spam == 16
    # Another object has its own bucket.
    rec.record(Ref("coordination.k8s.io/v1", "Lease", "otel-dra-fleet", "otel-dra"), WARNING, "X", "Y", "z")
    assert rec.flush() and len(api.event_list("otel-dra")) == 1


def test_a_long_note_is_clipped_to_the_api_servers_limit_and_accepted(api):
    rec = recorder(Clock())
    rec.record(RULE, WARNING, "DeviceTainted", "Taint", "x" * 5000)
    assert rec.flush() and rec.counts.dropped == 0
    assert len(api.event_list("default")[0]["note"]) == NOTE_LIMIT


def test_a_full_queue_drops_and_counts(api, caplog):
    rec = recorder(Clock(), max_queued=3)
    for i in range(5):
        rec.record(Ref("v1", "K", f"obj-{i}"), WARNING, "R", "A", "n")
    assert rec.counts.dropped == 2 and "too many queued" in caplog.text
    assert rec.flush() and len(api.event_list("default")) == 3


def _post(api: FakeApiServer, namespace: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{api.url}/apis/events.k8s.io/v1/namespaces/{namespace}/events",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _event(**change: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "r.1", "namespace": "default"},
        "eventTime": "2027-01-01T00:00:00.000000Z",
        "reportingController": "health.otel-dra.io/fleet",
        "reportingInstance": "fleet-0",
        "action": "Taint",
        "reason": "DeviceTainted",
        "regarding": {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "name": "r"},
        "note": "n",
        "type": "Warning",
    }
    body.update(change)
    return body


@pytest.mark.parametrize(
    ("change", "namespace", "message"),
    [
        ({"reportingController": ""}, "default", "reportingController: Required value"),
        ({"reportingController": "not a/qualified name!"}, "default", "reportingController: Invalid value"),
        ({"note": "x" * 1025}, "default", 'message: Invalid value: "": can have at most 1024 characters'),
        ({"type": "Error"}, "default", 'type: Invalid value: "": has invalid value: Error'),
        ({"series": {"count": 1, "lastObservedTime": "2027-01-01T00:00:00.000000Z"}}, "default", "series.count"),
        ({"metadata": {"name": "r.1", "namespace": "otel-dra"}}, "otel-dra", "does not match event.namespace"),
        ({"regarding": {"kind": "DeviceTaintRule", "name": "r", "colour": "red"}}, "default", "colour"),
    ],
)
def test_the_fake_api_server_refuses_an_event_the_real_one_refuses(api, change, namespace, message):
    code, body = _post(api, namespace, _event(**change))
    assert code == 422 and body["reason"] == "Invalid" and message in body["message"]
    assert body["message"].startswith('Event.events.k8s.io "r.1" is invalid: ')


def test_the_fake_api_server_takes_a_valid_event(api):
    code, body = _post(api, "default", _event())
    assert code == 201 and body["metadata"]["resourceVersion"]


# -- through the writer ------------------------------------------------------------------------------------------
def test_the_writer_records_why_a_device_was_tainted_and_when_it_was_untainted(tmp_path, api):
    from otel_dra.classifier.verdict import Verdict
    from otel_dra.sinks.k8s.apply import connect
    from otel_dra.sinks.k8s.sink import new_k8s_sink as K8sOutputSink
    from otel_dra.state.board import VerdictBoard

    policy_file = tmp_path / "p.yaml"
    policy_file.write_text("kubernetes: {taints: {effect: {by_state: {failed: NoSchedule}}}}\n")
    pol = policy_mod.load(policy_file)
    clock = Clock()
    events = EventRecorder(connect(), "health.otel-dra.io/fleet", "fleet-0", clock=clock)
    board = VerdictBoard()
    attrs = lambda node, hw: {"dra.driver.name": "gpu.nvidia.com"}  # noqa: E731
    message = "memory_ecc: uncorrected ECC errors: 1 in 5m"
    sick = Verdict(1, "node-1", "gpu-0", "Unhealthy", "failed", ("memory_ecc",), "reset_device", message,
                   pool="node-1", device="gpu-0")  # fmt: skip
    board.update([sick], attrs)
    sink = K8sOutputSink(board, None, pol, apply_rules=True, events=events, name="cluster writer")
    sink.render()
    assert sink.reconcile(force=True) and events.flush()
    [added] = api.event_list("default")
    assert added["regarding"]["kind"] == "DeviceTaintRule" and added["regarding"]["name"] in api.objects
    assert (added["type"], added["reason"], added["action"]) == ("Warning", "DeviceTainted", "Taint")
    note = added["note"]
    assert "node-1 gpu-0: memory_ecc, effect NoSchedule" in note and message in note and "reset_device" in note

    clock.now += 60
    well = Verdict(2, "node-1", "gpu-0", "Healthy", "ok", (), "none", "", pool="node-1", device="gpu-0")
    board.update([well], attrs)
    sink.render()
    assert sink.reconcile(force=True) and events.flush()
    removed = [e for e in api.event_list("default") if e["reason"] == "DeviceTaintRemoved"]
    assert len(removed) == 1 and removed[0]["type"] == "Normal" and removed[0]["action"] == "Untaint"
    assert "memory_ecc cleared; its NoSchedule taint is removed" in removed[0]["note"]
    assert not api.objects
