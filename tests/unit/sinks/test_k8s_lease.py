"""Leader election on a coordination.k8s.io/v1 Lease: candidates in this process, each with its own
``ApiClient`` (and User-Agent), against the fake API server over real HTTP."""

from __future__ import annotations

import threading
import time

import pytest

from otel_dra.cli.flags import FLAGS
from otel_dra.component import ConfigError
from otel_dra.sinks.k8s import apply as k8s_apply
from otel_dra.sinks.k8s.lease import LeaderElector, LeaseConfig
from tests.conftest import wait_for

pytestmark = pytest.mark.realtime  # real-time bounds: run with the other real-time modules, not beside them
FAST = {"lease_duration_s": 2.0, "renew_deadline_s": 1.2, "retry_period_s": 0.25}
JITTER_RETRY = 1.2 * FAST["retry_period_s"]


@pytest.fixture
def candidates(api):
    made: list[LeaderElector] = []

    def make(identity: str, **timings: float) -> LeaderElector:
        client = k8s_apply.connect(user_agent=f"otel-dra/test ({identity})")
        cfg = LeaseConfig(namespace="otel-dra", identity=identity, **{**FAST, **timings})
        elector = LeaderElector(client, cfg)
        made.append(elector)
        return elector

    yield make
    for e in made:
        e.shutdown()


def leader_and_standby(candidates) -> tuple[LeaderElector, LeaderElector]:
    """fleet-a leading, fleet-b started after it and following (it has read the Lease a few times)."""
    a, b = candidates("fleet-a"), candidates("fleet-b")
    a.start()
    wait_for(a.is_leader, 5, "fleet-a leading")
    b.start()
    time.sleep(0.6)
    assert not b.is_leader()
    return a, b


def leaders(electors: list[LeaderElector]) -> list[str]:
    return [e.identity for e in electors if e.is_leader()]


# -- the timings, checked as client-go checks them (plus the stricter handover rule) --------------
def test_the_defaults_are_client_gos():
    cfg = LeaseConfig()
    assert (cfg.lease_duration_s, cfg.renew_deadline_s, cfg.retry_period_s) == (15.0, 10.0, 2.0)
    assert cfg.name == "otel-dra-fleet"


@pytest.mark.parametrize(
    ("timings", "message"),
    [
        ({"lease_duration_s": 10.0, "renew_deadline_s": 10.0}, "lease-duration (10s) must be greater than"),
        ({"lease_duration_s": 12.0, "renew_deadline_s": 10.0}, "plus 1.2 x --leader-elect-retry-period (2s)"),
        ({"renew_deadline_s": 2.0, "retry_period_s": 2.0}, "renew-deadline (2s) must be greater than 1.2 x"),
        ({"retry_period_s": 0.0}, "retry-period must be a positive number of seconds"),
        ({"name": "Not_A_Name"}, "--leader-elect-resource-name 'Not_A_Name': must be a DNS subdomain"),
        ({"namespace": "a.b"}, "--leader-elect-resource-namespace 'a.b': must be a DNS label"),
    ],
)
def test_timings_and_names_that_cannot_work_are_refused_with_the_flag_to_fix(timings, message):
    """The config names its fields; the command line, through its one table, the flags to fix."""
    with pytest.raises(ConfigError) as refused:
        LeaseConfig(**timings)
    assert message in refused.value.named(FLAGS), refused.value.named(FLAGS)
    assert "--" not in str(refused.value)  # (the config knows no flag)


def test_namespace_and_identity_come_from_the_downward_api(monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "gpu-health")
    monkeypatch.setenv("POD_NAME", "otel-dra-fleet-1")
    cfg = LeaseConfig().resolved()
    assert (cfg.namespace, cfg.identity) == ("gpu-health", "otel-dra-fleet-1")
    monkeypatch.delenv("POD_NAME")
    a, b = LeaseConfig().resolved().identity, LeaseConfig().resolved().identity
    assert a != b and "_" in a  # client-go's <hostname>_<uuid>: two processes on one host differ


# -- election ---------------------------------------------------------------------------------------
def test_one_of_two_candidates_leads_and_the_lease_says_which(api, candidates):
    a, b = candidates("fleet-a"), candidates("fleet-b")
    a.start()
    b.start()
    wait_for(lambda: len(leaders([a, b])) == 1, 5, "a leader")
    seen: set[tuple[str, ...]] = set()
    for _ in range(40):  # 2 s: several renewals, never two leaders
        seen.add(tuple(leaders([a, b])))
        time.sleep(0.05)
    assert len(seen) == 1 and len(next(iter(seen))) == 1, seen
    [leader] = next(iter(seen))
    lease = api.lease()
    assert lease["spec"]["holderIdentity"] == leader
    assert lease["spec"]["leaseDurationSeconds"] == 2 and lease["spec"]["leaseTransitions"] == 0
    renewals = [w for w in api.writes if w.kind == "leases" and w.status == 200]
    assert renewals and all(leader in w.user_agent for w in renewals)  # the follower never wrote it


def test_a_graceful_stop_releases_the_lease_and_the_standby_takes_over_at_its_next_retry(api, candidates):
    a, b = leader_and_standby(candidates)
    stopped = time.monotonic()
    a.shutdown()
    assert api.lease()["spec"].get("holderIdentity") is None  # released, as client-go's ReleaseOnCancel
    wait_for(b.is_leader, 3, "fleet-b leading")
    assert time.monotonic() - stopped < 1.2 * FAST["retry_period_s"] + 0.5  # not a whole lease duration
    assert api.lease()["spec"]["leaseTransitions"] == 1


def test_a_dead_leader_is_replaced_within_a_lease_duration_and_a_retry_of_its_last_renewal(api, candidates):
    a, b = leader_and_standby(candidates)
    a._stop.set()  # dies: no more renewals, no release (as kill -9)
    died = time.monotonic()
    wait_for(b.is_leader, 5, "fleet-b leading", every=0.02)
    took = time.monotonic() - died
    last_renewal = max(w.at for w in api.writes if w.kind == "leases" and "fleet-a" in w.user_agent)
    acquired = min(w.at for w in api.writes if w.kind == "leases" and "fleet-b" in w.user_agent and w.status == 200)
    # As client-go: the standby takes over at its first retry after the lease expired (the retry period is
    # jittered up to 1.2x), so within one lease duration and one retry of the last renewal.
    assert acquired - last_renewal <= FAST["lease_duration_s"] + JITTER_RETRY + 0.05
    assert acquired - last_renewal >= FAST["renew_deadline_s"]  # and not before the old leader stopped
    assert took <= FAST["lease_duration_s"] + JITTER_RETRY + 0.05


def test_a_partitioned_leader_stops_writing_before_the_other_takes_over(api, candidates):
    a, b = leader_and_standby(candidates)
    flips: dict[str, float] = {}

    def watch() -> None:
        while "b" not in flips:
            now = time.monotonic()
            if "a" not in flips and not a.is_leader():
                flips["a"] = now
            if b.is_leader():
                flips["b"] = now
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    api.partitioned.add("fleet-a")  # a can no longer reach the API server; b can
    cut = time.monotonic()
    watcher.join(10)
    assert set(flips) == {"a", "b"}, flips
    assert flips["a"] < flips["b"]  # no moment with two writers
    assert flips["a"] - cut <= FAST["renew_deadline_s"] + 0.1  # a stopped by its renew deadline
    api.partitioned.clear()
    time.sleep(1.0)
    assert leaders([a, b]) == ["fleet-b"]  # a, back, follows: the lease is b's


def test_a_leader_that_finds_the_lease_taken_stops_writing_at_its_next_renewal(api, candidates, caplog):
    a = candidates("fleet-a")
    a.start()
    wait_for(a.is_leader, 5, "fleet-a leading")
    with api.lock:  # another writer took it (an admin, or a candidate with a skewed clock rate)
        lease = api.leases[("otel-dra", "otel-dra-fleet")]
        lease["spec"]["holderIdentity"] = "intruder"
        lease["metadata"]["resourceVersion"] = api._next_version()
    taken = time.monotonic()
    wait_for(lambda: not a.is_leader(), 3, "fleet-a stepping down", every=0.01)
    assert time.monotonic() - taken < JITTER_RETRY + 0.3  # its next renewal, not its renew deadline
    assert any("lost lease otel-dra/otel-dra-fleet (intruder holds it now)" in r.getMessage() for r in caplog.records)


def test_rbac_without_leases_is_logged_once_with_the_permission_to_grant(api, candidates, caplog):
    api.lease_verbs = {"create", "update"}
    elector = candidates("fleet-a")
    elector.start()
    time.sleep(1.0)
    assert not elector.is_leader()
    lines = [r.getMessage() for r in caplog.records if "leader election" in r.getMessage() and r.levelname == "ERROR"]
    assert len(lines) == 1, lines
    assert 'cannot get resource "leases" in API group "coordination.k8s.io"' in lines[0]
    assert "needs get, create and update on leases.coordination.k8s.io in namespace otel-dra" in lines[0]
    assert "retrying every 0.25s" in lines[0]


def test_an_unreachable_api_server_is_not_leadership(api, candidates, caplog):
    api.partitioned.add("fleet-a")
    elector = candidates("fleet-a")
    elector.start()
    time.sleep(0.8)
    assert not elector.is_leader() and api.lease() is None
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(lines) == 1 and "HTTP 503" in lines[0]


def test_a_missing_namespace_is_one_line_naming_it(api, candidates, caplog):
    api.namespaces = {"default"}
    elector = candidates("fleet-a")
    elector.start()
    time.sleep(0.8)
    assert not elector.is_leader()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and 'namespaces "otel-dra" not found' in errors[0]


def test_a_writer_whose_lease_lapses_mid_apply_stops_before_the_next_change(api):
    """The fence is asked before every write, not once per apply: a leader that loses the Lease
    while reconciling leaves the rest to its successor instead of racing it."""
    from otel_dra import policy as policy_mod
    from otel_dra.classifier.verdict import Verdict
    from otel_dra.sinks.k8s import render as r

    def sick(device: str) -> Verdict:
        return Verdict(
            time_unix_nano=1,
            node="node-a",
            hw_id=device,
            health="Unhealthy",
            state="failed",
            reasons=("memory_ecc",),
            remediation="replace_device",
            message="uncorrected ECC",
            pool="node-a",
            device=device,
            driver="gpu.example.com",
        )

    rendering = r.render([sick("gpu-0"), sick("gpu-1"), sick("gpu-2")], policy_mod.load())
    answers = iter([True, False])
    with pytest.raises(k8s_apply.NotLeader, match="stopped after 1 of 3 changes"):
        k8s_apply.apply(rendering, k8s_apply.connect(), whole_fleet=True, may_write=lambda: next(answers))
    assert len(api.objects) == 1 and [w.verb for w in api.rule_writes()] == ["POST"]
