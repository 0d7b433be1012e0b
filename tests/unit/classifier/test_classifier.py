"""The classifier, judged on what it decides: every reason from its evidence, the traps that
must not raise a fault, hysteresis, escalation, staleness, and a registry that grows and forgets."""

from __future__ import annotations

import datetime as dt
import re

import numpy as np
import pytest

from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier, Verdict
from otel_dra.classifier.features import F
from otel_dra.faults import Fault
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of
from otel_dra.sources.simulated import SimulatedSource, SimulatorConfig

S = 10**9
T0 = 1_800_000_000 * S
GPU = {"hw.type": "gpu", "hw.vendor": "NVIDIA", "hw.model": "H100 80GB HBM3", "hw.firmware_version": "96.00.99.00.01"}


def load_policy(tmp_path, text: str = "") -> policy_mod.Policy:
    if not text:
        return policy_mod.load()
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return policy_mod.load(path)


def run_sim(faults, policy, devices=4, seconds=900, interval=10, node="n1"):
    """Feed a simulated node to a classifier; return every verdict emitted, by device."""
    src = SimulatedSource(SimulatorConfig(node, devices=devices, faults=tuple(faults), seed=4, start_unix_nano=T0))
    classifier = Classifier(policy, src.schema, interval_s=interval)
    out: dict[str, list[Verdict]] = {}
    for t in range(0, seconds + 1, interval):
        classifier.ingest(src.read(T0 + t * S))
        for v in classifier.evaluate(T0 + t * S):
            out.setdefault(v.hw_id, []).append(v)
    return out, classifier


def first(verdicts: list[Verdict], predicate) -> float | None:
    return next(((v.time_unix_nano - T0) / S for v in verdicts if predicate(v)), None)


EXPECTED = {
    # reason: (state, health, remediation, seconds after onset it must be seen by)
    "thermal": ("degraded", "Healthy", "reduce_load", 300),
    "cooling": ("failed", "Unhealthy", "reduce_load", 300),  # the simulated fan failure also overheats it
    "memory_ecc": ("failed", "Unhealthy", "reset_device", 20),
    "power_delivery": ("degraded", "Healthy", "reduce_load", 20),
    "power_throttling": ("degraded", "Healthy", "reduce_load", 300),
    "memory_pressure": ("degraded", "Healthy", "check_workload", 300),  # about what runs on it (scope workload)
    "link": ("degraded", "Healthy", "reduce_load", 300),
    "driver_errors": ("failed", "Unhealthy", "reset_device", 20),
    "device_reset": ("degraded", "Healthy", "reset_device", 120),
    "device_lost": ("failed", "Unhealthy", "reboot_node", 90),
    "vendor_status": ("failed", "Unhealthy", "reset_device", 20),
}


@pytest.mark.parametrize("reason", sorted(EXPECTED))
def test_each_reason_is_found_on_its_device_only(reason):
    state, health, remediation, deadline = EXPECTED[reason]
    verdicts, _ = run_sim([Fault("gpu-1", reason, 200)], policy_mod.load())
    seen = first(verdicts["gpu-1"], lambda v: reason in v.reasons)
    assert seen is not None and 200 <= seen <= 200 + deadline, (seen, [(v.reasons, v.hw_id) for v in verdicts["gpu-1"]])
    worst = [v for v in verdicts["gpu-1"] if reason in v.reasons][-1]
    assert (worst.state, worst.health, worst.remediation) == (state, health, remediation)
    assert worst.message.startswith(reason) or reason == "device_lost" or reason == "vendor_status"
    for other in ("gpu-0", "gpu-2", "gpu-3"):
        assert only_ok(verdicts[other]), verdicts[other]


def test_firmware_needs_a_policy_and_then_says_why(tmp_path):
    policy = load_policy(tmp_path, "rules: {firmware: {minimum: {NVIDIA: '96.00.61.00.01'}}}\n")
    verdicts, _ = run_sim([Fault("gpu-2", "firmware", 100)], policy, seconds=200)
    hit = [v for v in verdicts["gpu-2"] if "firmware" in v.reasons]
    assert hit and hit[0].state == "degraded" and hit[0].remediation == "update_firmware"
    assert "below the policy minimum 96.00.61.00.01" in hit[0].message
    assert first(verdicts["gpu-2"], lambda v: "firmware" in v.reasons) == 100


def test_a_silent_node_is_stale_not_lost():
    verdicts, _ = run_sim([Fault("*", "stale", 200)], policy_mod.load(), seconds=400)
    for device, seq in verdicts.items():
        last = seq[-1]
        assert (last.health, last.state, last.reasons, last.remediation) == ("Unknown", None, ("stale",), "none"), (
            device
        )
        assert not any(v.state == "failed" for v in seq)
        assert 200 + 60 <= first(seq, lambda v: v.health == "Unknown") <= 200 + 80


# -- hand-made telemetry for the traps and the state machine -------------------------------------------
TEMP = Column("hw.temperature", attrs_of({"hw.sensor_location": "gpu"}), "temp/gpu", "temperature")
TEMP_LIMIT = Column(
    "hw.temperature.limit",
    attrs_of({"hw.sensor_location": "gpu", "hw.limit_type": "high.degraded"}),
    "temp/gpu",
    "temperature",
)
UNCORRECTED = Column("hw.errors", attrs_of({"error.type": "uncorrected"}))
CORRECTED = Column("hw.errors", attrs_of({"error.type": "corrected"}))
XID13 = Column("hw.errors", attrs_of({"error.type": "driver", "hw.error.code": "13"}))


def only_ok(seq: list[Verdict]) -> bool:
    """A device's verdicts (only the changed ones are kept: its first, then each change) were all ``ok``: at
    least its first verdict must be there, or an ``all`` over nothing would pass."""
    return bool(seq) and all(v.state == "ok" for v in seq)


class Feed:
    """Frames built by hand: one node, named devices, chosen columns."""

    def __init__(self, policy, devices=("gpu-0", "gpu-1"), node="n1", interval=10):
        self.schema = Schema()
        self.table = DeviceTable(node, tuple(devices), tuple(dict(GPU) for _ in devices))
        self.classifier = Classifier(policy, self.schema, interval_s=interval)
        self.interval = interval
        self.t = 0
        self.verdicts: dict[str, list[Verdict]] = {d: [] for d in devices}

    def step(self, **columns: list[float]) -> list[Verdict]:
        """One sample: each keyword is a column name of this module, one value per device (None: absent)."""
        cols = {name: self.schema.index(globals()[name]) for name in columns}
        values = np.full((len(self.table), len(self.schema)), np.nan)
        for name, per_device in columns.items():
            values[:, cols[name]] = [np.nan if v is None else v for v in per_device]
        now = T0 + self.t * S
        self.classifier.ingest(Frame(now, self.table, values))
        out = self.classifier.evaluate(now)
        for v in out:
            self.verdicts[v.hw_id].append(v)
        self.t += self.interval
        return out

    def state(self, device: str) -> tuple[str, str | None, tuple[str, ...], str]:
        v = self.verdicts[device][-1]
        return v.health, v.state, v.reasons, v.remediation


def test_a_temperature_spike_is_not_thermal():
    feed = Feed(policy_mod.load())
    for k in range(60):
        spike = 99.0 if k in (20, 21) else 70.0
        feed.step(TEMP=[spike, 70.0], TEMP_LIMIT=[85.0, 85.0])
    assert only_ok(feed.verdicts["gpu-0"]), feed.verdicts["gpu-0"]


def test_sustained_heat_is_thermal_judged_against_the_devices_own_limit():
    feed = Feed(policy_mod.load())
    for _ in range(40):  # 80 C: under the 85 C fallback, above this device's own 78 C limit
        feed.step(TEMP=[80.0, 80.0], TEMP_LIMIT=[78.0, None])
    assert feed.state("gpu-0")[:3] == ("Healthy", "degraded", ("thermal",))
    assert feed.state("gpu-1")[:2] == ("Healthy", "ok")


def test_counter_resets_are_not_errors_and_a_first_sample_is_a_baseline():
    feed = Feed(policy_mod.load())
    feed.step(UNCORRECTED=[5.0, 0.0], CORRECTED=[1000.0, 3.0])  # history from before we looked
    for _ in range(10):
        feed.step(UNCORRECTED=[5.0, 0.0], CORRECTED=[1000.0, 3.0])
    feed.step(UNCORRECTED=[0.0, 0.0], CORRECTED=[0.0, 0.0])  # driver reload: counters restart
    for _ in range(10):
        feed.step(UNCORRECTED=[0.0, 0.0], CORRECTED=[1.0, 3.0])
    assert all(only_ok(seq) for seq in feed.verdicts.values()), feed.verdicts


def test_a_corrected_error_just_after_start_is_no_storm_but_a_storm_is():
    """Sampled every second, one corrected error in the first seconds once extrapolated to 28/min,
    over the policy's 6/min: a start-up false alarm (predicted_failure) seen end to end. A rate is
    judged over at least a minute, so one error is one a minute; twenty in seconds are still a storm."""
    quiet = [f"gpu-{i}" for i in range(2, 8)]  # the fleet's median rate stays 0, as on a healthy node
    feed = Feed(policy_mod.load(), devices=("gpu-0", "gpu-1", *quiet), interval=1)
    for k in range(30):
        one = 0.0 if k < 2 else 1.0
        storm = 0.0 if k < 2 else 20.0
        feed.step(CORRECTED=[one, storm, *[0.0] * len(quiet)])
    assert only_ok(feed.verdicts["gpu-0"]), feed.verdicts["gpu-0"]
    assert feed.state("gpu-1")[:3] == ("Healthy", "predicted_failure", ("memory_ecc",))
    assert all(only_ok(feed.verdicts[d]) for d in quiet)


def test_a_new_error_series_counts_its_whole_value():
    feed = Feed(policy_mod.load())
    for _ in range(5):
        feed.step(UNCORRECTED=[None, None], CORRECTED=[0.0, 0.0])
    feed.step(UNCORRECTED=[1.0, None], CORRECTED=[0.0, 0.0])  # the SDK creates the series at its first error
    assert feed.state("gpu-0") == ("Unhealthy", "failed", ("memory_ecc",), "reset_device")
    assert feed.state("gpu-1")[1] == "ok"


def test_one_application_error_is_not_a_fault_but_repeats_are():
    feed = Feed(policy_mod.load())
    for k in range(40):
        once = 1.0 if k >= 5 else None
        repeated = float(1 + k // 6) if k >= 5 else None
        feed.step(XID13=[once, repeated])
    assert only_ok(feed.verdicts["gpu-0"]), feed.verdicts["gpu-0"]
    assert feed.state("gpu-1") == ("Healthy", "degraded", ("driver_errors",), "check_workload")


def test_hysteresis_holds_a_reason_then_clears_it(tmp_path):
    policy = load_policy(tmp_path, "window: 1m\nhold: {thermal: 2m}\n")
    feed = Feed(policy)
    for _ in range(12):
        feed.step(TEMP=[95.0, 70.0], TEMP_LIMIT=[85.0, 85.0])
    assert feed.state("gpu-0")[2] == ("thermal",)
    cooled_at = feed.t
    while feed.state("gpu-0")[2]:
        feed.step(TEMP=[70.0, 70.0], TEMP_LIMIT=[85.0, 85.0])
        assert feed.t - cooled_at < 600
    cleared = (feed.verdicts["gpu-0"][-1].time_unix_nano - T0) / S
    # the window (1m) must stop showing the heat, then the hold (2m) must pass
    assert cooled_at + 120 <= cleared <= cooled_at + 60 + 120 + 20
    assert len([v for v in feed.verdicts["gpu-0"] if v.reasons]) >= 1
    held = [v for v in feed.verdicts["gpu-0"] if "last evidence" in v.message]
    assert not held or "clears after 2m" in held[0].message


def test_a_recurring_fault_climbs_its_ladder(tmp_path):
    # (time-based clearing, chosen explicitly: by default an uncorrected error waits for a reset, test_repair.py)
    policy = load_policy(
        tmp_path,
        "window: 1m\nhold: {memory_ecc: 1m}\nclears: {memory_ecc: hold}\nescalation: {window: 24h, after: 2}\n",
    )
    feed = Feed(policy)
    count = 0.0
    feed.step(UNCORRECTED=[count, 0.0])  # the first sample is a baseline
    remediations = []
    for episode in range(3):
        count += 1
        feed.step(UNCORRECTED=[count, 0.0])
        remediations.append(feed.state("gpu-0")[3])
        for _ in range(20):  # quiet long enough for the window and the hold to pass
            feed.step(UNCORRECTED=[count, 0.0])
        assert feed.state("gpu-0")[1] == "ok", episode
    assert remediations == ["reset_device", "replace_device", "replace_device"]


def test_device_lost_while_the_node_reports():
    feed = Feed(policy_mod.load())
    for _ in range(5):
        feed.step(TEMP=[70.0, 70.0])
    for _ in range(12):
        feed.step(TEMP=[None, 70.0])  # gpu-0 stops reporting
    assert feed.state("gpu-0") == ("Unhealthy", "failed", ("device_lost",), "reboot_node")
    assert "while node n1 still reports" in feed.verdicts["gpu-0"][-1].message
    assert feed.state("gpu-1")[:2] == ("Healthy", "ok")


def test_the_registry_grows_past_its_capacity_and_forgets_devices_after_the_ttl(tmp_path):
    policy = load_policy(tmp_path, "device_ttl: 5m\n")
    schema = Schema()
    classifier = Classifier(policy, schema, interval_s=10, capacity=2)
    col = schema.index(TEMP)
    for k in range(10):
        ids = tuple(f"gpu-{i}" for i in range(20 if k < 3 else 4))
        table = DeviceTable("n1", ids, tuple(dict(GPU) for _ in ids))
        values = np.full((len(ids), len(schema)), 70.0)
        values[:, col] = 70.0
        classifier.ingest(Frame(T0 + k * 60 * S, table, values))
        classifier.evaluate(T0 + k * 60 * S)
        if k < 3:
            assert classifier.registry.capacity >= 20
    assert len(classifier.registry) == 4  # 16 devices gone for longer than the TTL were forgotten
    assert {v.hw_id for v in classifier.current()} == {f"gpu-{i}" for i in range(4)}


def test_the_arrays_shrink_when_most_devices_are_gone_and_the_rest_keep_their_state(tmp_path):
    """1,000 devices, then 10 for longer than the TTL: every per-device array is cut to a few dozen rows
    (it only grew before), and the 10 left keep their held fault, their windows and their verdicts."""
    policy = load_policy(tmp_path, "device_ttl: 5m\n")
    schema = Schema()
    classifier = Classifier(policy, schema, interval_s=60)
    temp, ecc = schema.index(TEMP), schema.index(UNCORRECTED)
    many = tuple(f"gpu-{i}" for i in range(1000))
    few = many[-10:]  # the last rows: compaction must move them, not just cut the tail
    for k in range(12):
        ids = many if k < 2 else few
        values = np.full((len(ids), len(schema)), np.nan)
        values[:, temp] = 60.0 + np.asarray([int(d.removeprefix("gpu-")) for d in ids]) % 7
        values[:, ecc] = 0.0
        if k >= 6:
            values[-1, ecc] = 1.0  # gpu-999: one uncorrected error, held for the policy's hour
        classifier.ingest(Frame(T0 + k * 60 * S, DeviceTable("n1", ids, tuple(dict(GPU) for _ in ids)), values))
        classifier.evaluate(T0 + k * 60 * S)
    reg = classifier.registry
    assert len(reg) == 10
    assert reg.capacity <= 64, reg.capacity
    arrays = [classifier.store.ring, classifier.horizon.sums, classifier.engine.on, classifier.extractor.prev]
    assert all(reg.capacity in a.shape for a in arrays), [a.shape for a in arrays]
    assert classifier.store.ring.shape[2] == reg.capacity and len(classifier.groups.firmware_text) == reg.capacity
    now = {v.hw_id: v for v in classifier.current()}
    assert set(now) == set(few)
    assert (now["gpu-999"].health, now["gpu-999"].reasons) == ("Unhealthy", ("memory_ecc",))
    assert all(now[d].health == "Healthy" and now[d].state == "ok" for d in few[:-1])
    temps = classifier.store.latest()[F.TEMP_MAX, [reg.row("n1", d) for d in few]]
    assert temps.tolist() == [60.0 + i % 7 for i in range(990, 1000)]
    # ...and it grows again when devices come back, with no stale state in the reused rows.
    for k in range(12, 15):
        values = np.full((len(many), len(schema)), np.nan)
        values[:, temp], values[:, ecc] = 60.0, 1.0
        classifier.ingest(Frame(T0 + k * 60 * S, DeviceTable("n1", many, tuple(dict(GPU) for _ in many)), values))
        classifier.evaluate(T0 + k * 60 * S)
    assert len(reg) == 1000 and reg.capacity >= 1000
    now = {v.hw_id: v for v in classifier.current()}
    assert now["gpu-999"].reasons == ("memory_ecc",)
    assert now["gpu-0"].health == "Healthy", now["gpu-0"]  # a new baseline, not an increase from old state


def test_rows_grown_ahead_stay_zeros_until_given_out_and_are_judged_as_in_a_classifier_made_that_large(tmp_path):
    """Devices arriving over ticks, most leaving past the TTL (the arrays compact) and more coming back, into a
    classifier made with 2 rows and one made with 4,096: the same verdicts, tick by tick. In the one that grew,
    the rows past those given out are zeros in every part: a row's start state (-inf, NaN, -1: about a kB) is
    written when the registry first gives it out, so rows grown ahead of the devices cost no resident memory."""
    policy = load_policy(tmp_path, "device_ttl: 5m\n")
    sizes = [3, 40, 41, 300, 300, 10, 10, 10, 10, 10, 10, 10, 3000, 3000, 3001, 3001]
    runs = []
    for capacity in (2, 4096):
        schema = Schema()
        classifier = Classifier(policy, schema, interval_s=60, capacity=capacity)
        temp, ecc = schema.index(TEMP), schema.index(UNCORRECTED)
        seen = []
        for k, n in enumerate(sizes):
            ids = tuple(f"gpu-{i}" for i in range(n))
            values = np.full((n, len(schema)), np.nan)
            values[:, temp] = 60.0 + np.arange(n) % 7
            values[:, ecc] = 0.0
            values[5::97, ecc] = float(k)  # every 97th device counts uncorrected errors
            classifier.ingest(Frame(T0 + k * 60 * S, DeviceTable("n1", ids, tuple(dict(GPU) for _ in ids)), values))
            seen += sorted((k, v.hw_id, v.health, v.state, v.reasons) for v in classifier.evaluate(T0 + k * 60 * S))
        runs.append(seen)
        reg = classifier.registry
        if capacity == 2:
            assert reg._started < reg.capacity, (reg._started, reg.capacity)  # (rows to check)
            ahead = slice(reg._started, None)
            parts = [
                classifier.store.last[:, ahead],
                classifier.horizon.ids[:, ahead],
                classifier.engine.evidence_at[ahead],
                classifier.engine.key[ahead],
                classifier.extractor.prev[ahead],
                classifier.peers.hot_since[ahead],
                classifier.firmware_rates.settling_since[ahead],
                classifier.workload.crash_at[ahead],
            ]
            assert not any(part.any() for part in parts)
    assert any(v[2] == "Unhealthy" for v in runs[0]) and runs[0] == runs[1]


def test_a_first_batch_larger_than_the_initial_capacity_is_registered():
    schema = Schema()
    classifier = Classifier(policy_mod.load(), schema, interval_s=10)  # default capacity 64
    col = schema.index(TEMP)
    ids = tuple(f"gpu-{i}" for i in range(100))
    values = np.full((100, len(schema)), np.nan)
    values[:, col] = 60.0
    classifier.ingest(Frame(T0, DeviceTable("n1", ids, tuple(dict(GPU) for _ in ids)), values))
    assert len(classifier.registry) == 100
    assert len(classifier.evaluate(T0)) == 100


def test_the_clock_jumping_raises_no_false_alarm():
    """The node's clock steps back an hour, then forward two: no device is lost, stale or faulted."""
    feed = Feed(policy_mod.load())
    for _ in range(10):
        feed.step(TEMP=[60.0, 61.0], UNCORRECTED=[0.0, 0.0])
    feed.t -= 3600  # NTP steps the clock back
    for _ in range(10):
        feed.step(TEMP=[60.0, 61.0], UNCORRECTED=[0.0, 0.0])
    feed.t += 7200  # ...and forward
    for _ in range(10):
        feed.step(TEMP=[60.0, 61.0], UNCORRECTED=[0.0, 0.0])
    for device, seq in feed.verdicts.items():
        assert seq and all((v.health, v.state, v.reasons) == ("Healthy", "ok", ()) for v in seq), (device, seq)


def test_a_held_faults_message_gives_absolute_times_that_read_the_same_later(tmp_path):
    """Issue #29: "last evidence 10s ago" copied into a taint rule's annotation read the same four minutes
    later. A held reason's words give the moment (RFC 3339, UTC), so the message stays true where it is stored."""
    feed = Feed(load_policy(tmp_path, "window: 1m\n"))
    feed.step(UNCORRECTED=[0.0, 0.0])
    feed.step(UNCORRECTED=[1.0, 0.0])
    seen_at = feed.t - feed.interval  # (step advanced the clock past the sample that carried the error)
    for _ in range(12):
        feed.step(UNCORRECTED=[1.0, 0.0])
    now = {v.hw_id: v for v in feed.classifier.current()}["gpu-0"]
    held = [now.message] if "last evidence" in now.message else []
    assert held and now.health == "Unhealthy", now.message
    assert " ago" not in held[-1]
    stamp = re.search(r"last evidence at (\S+);", held[-1])
    assert stamp, held[-1]
    when = dt.datetime.fromisoformat(stamp.group(1).replace("Z", "+00:00")).timestamp()
    # (the window shows the error for its 1m, and that is evidence while it does)
    assert seen_at <= when - T0 / S <= seen_at + 60 + feed.interval, (stamp.group(1), seen_at)
