"""A batch is the frames it holds: ``ingest_many`` of a fleet's tick leaves the classifier as ingesting
its frames one at a time, in order, would.

The batch path has a fast way for the usual tick (every frame a device table already seen, every device
read) and a slow one (new tables, new devices, devices not read, a node twice in a batch, empty frames,
each frame with its own arrival time). Hypothesis draws batches that mix them; both classifiers must agree
on every device's window, attributes, arrival and verdict.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_dra import policy as policy_mod
from otel_dra.classifier import Classifier
from otel_dra.classifier.batch import Batch
from otel_dra.frame import Column, DeviceTable, Frame, Schema, attrs_of

S = 10**9
T0 = 1_800_000_000 * S
TEMP = Column("hw.temperature", attrs_of({"hw.sensor_location": "gpu"}), "temp/gpu", "temperature")
UNCORRECTED = Column("hw.errors", attrs_of({"error.type": "uncorrected"}))
GPU = {"hw.type": "gpu", "hw.vendor": "NVIDIA", "hw.model": "H100 80GB HBM3"}
NODES = ("n1", "n2", "n3")
# Each node's device tables, as a decoder makes them: one object while nothing changes (so the fast path
# can know it), a new one when a firmware changes or a device joins.
TABLES = {
    node: (
        DeviceTable(node, ("gpu-0", "gpu-1"), tuple(dict(GPU, **{"hw.firmware_version": "1"}) for _ in range(2))),
        DeviceTable(node, ("gpu-0", "gpu-1"), tuple(dict(GPU, **{"hw.firmware_version": "2"}) for _ in range(2))),
        DeviceTable(node, ("gpu-0", "gpu-1", "gpu-2"), tuple(dict(GPU) for _ in range(3))),
        DeviceTable(node, (), ()),
    )
    for node in NODES
}

frame_spec = st.tuples(
    st.sampled_from(NODES),
    st.integers(0, 3),  # which table
    st.lists(st.sampled_from(["read", "silent", "temp only"]), min_size=3, max_size=3),
    st.integers(0, 5),  # the counter's step
    st.integers(0, 3),  # seconds between being sent and heard
)


def frames_of(
    specs: list[tuple[str, int, list[str], int, int]], tick: int, counters: dict[str, int]
) -> tuple[list[Frame], list[int]]:
    frames, heard = [], []
    for k, (node, which, reads, step, late) in enumerate(specs):
        table = TABLES[node][which]
        values = np.full((len(table), 2), np.nan)
        counters[node] = counters.get(node, 0) + step
        for i in range(len(table)):
            if reads[i] != "silent":
                values[i, 0] = 60.0 + 3 * i + step
            if reads[i] == "read":
                values[i, 1] = float(counters[node])
        t = T0 + (tick * 10 + k) * S  # a node twice in a batch: its later frame a second later
        frames.append(Frame(t, table, values))
        heard.append(t + late * S)
    return frames, heard


def state(classifier: Classifier, now: int) -> dict[tuple[str, str], tuple]:
    reg, store = classifier.registry, classifier.store
    out = {}
    for v in classifier.evaluate(now):
        row = reg.row(v.node, v.hw_id)
        out[(v.node, v.hw_id)] = (
            v.health,
            v.state,
            v.reasons,
            dict(reg.attrs[row]),
            float(reg.last_heard[row]),
            int(store.written[row]),
            store.sums[:, row].tolist(),
            store.counts[:, row].tolist(),
        )
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(frame_spec, min_size=0, max_size=6), min_size=1, max_size=8))
def test_a_batch_leaves_the_classifier_as_its_frames_one_at_a_time_would(batches):
    schema = Schema([TEMP, UNCORRECTED])
    batched = Classifier(policy_mod.load(), schema, interval_s=10)
    single = Classifier(policy_mod.load(), schema, interval_s=10)
    counters_a: dict[str, int] = {}
    counters_b: dict[str, int] = {}
    for tick, specs in enumerate(batches):
        frames, heard = frames_of(specs, tick, counters_a)
        batched.ingest_many(frames, heard)
        for frame, at in zip(*frames_of(specs, tick, counters_b), strict=True):
            single.ingest(frame, at)
        now = T0 + (tick * 10 + 9) * S
        assert state(batched, now) == state(single, now)


def test_the_usual_tick_twice_and_a_tick_with_one_table_new_agree_with_frames_one_at_a_time():
    """The fast path (every table seen, every device read), then a tick where one node's firmware changed."""
    specs = [(node, 0, ["read"] * 3, 1, 0) for node in NODES]
    changed = [(node, 1 if node == "n2" else 0, ["read"] * 3, 1, 0) for node in NODES]
    test_a_batch_leaves_the_classifier_as_its_frames_one_at_a_time_would.hypothesis.inner_test(
        [specs, specs, specs, changed, changed]
    )


def test_a_batch_of_frames_made_before_and_after_the_schema_grew() -> None:
    """A frame made before the schema grew is narrower: in one batch with wider frames its newer columns
    are absent, as they are when it is ingested alone."""
    schema = Schema([TEMP])
    batched = Classifier(policy_mod.load(), schema, interval_s=10)
    single = Classifier(policy_mod.load(), schema, interval_s=10)
    table = TABLES["n1"][0]
    narrow = [Frame(T0 + k * 10 * S, table, np.full((2, 1), 60.0 + k)) for k in range(3)]
    schema.index(UNCORRECTED)  # the schema grows: later frames carry the new column
    other = TABLES["n2"][0]
    wide = [Frame(T0 + k * 10 * S, other, np.asarray([[61.0 + k, 0.0], [62.0, float(k)]])) for k in range(3)]
    for k in range(3):
        batched.ingest_many([narrow[k], wide[k]])
        single.ingest_many([narrow[k]])
        single.ingest_many([wide[k]])
    now = T0 + 30 * S
    assert state(batched, now) == state(single, now)
    assert len(batched.current()) == 4


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=40))
def test_a_batchs_rounds_hold_each_device_once_its_samples_in_order(listed: list[int]) -> None:
    from otel_dra.classifier.batch import Samples

    rows = np.asarray(listed, dtype=np.int64)
    n = rows.size
    samples = Samples(rows, np.zeros(n, bool), np.zeros(n, np.int64), np.zeros((n, 1)), np.zeros(n, np.int64))
    rounds = samples.rounds(ordered=False)
    if len(set(listed)) == n:  # every device once: one round, the batch as it is
        assert rounds is None
        return
    assert rounds is not None
    # Round k holds each device's k-th sample, in the batch's order; together the rounds are every sample once.
    seen: dict[int, int] = {}
    expected: list[list[int]] = []
    for i, row in enumerate(listed):
        k = seen[row] = seen.get(row, -1) + 1
        expected += [[]] * (k + 1 - len(expected))
        expected[k] = [*expected[k], i]
    assert [list(r) for r in rounds] == expected


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frame_spec, min_size=1, max_size=8))
def test_rounds_worked_out_on_numbers_for_the_devices_are_those_of_their_rows(specs):
    """A replay's decode stage works a batch's rounds out beside its decoding, on its own number for each (node,
    hw.id) (``Batch.of_parts``'s ``devices``): they are the rounds the judge's side works out on the rows it gives
    them, devices not read left out, and a batch ingested with them leaves the classifier as one without."""
    schema = Schema([TEMP, UNCORRECTED])
    frames, heard = frames_of(specs, 0, {})
    kept = [(f, at) for f, at in zip(frames, heard, strict=True) if len(f.values)]
    numbers: dict[tuple[str, str], int] = {}
    devices = [numbers.setdefault((f.devices.node, d), len(numbers)) for f, _ in kept for d in f.devices.ids]

    def batch(with_numbers: bool) -> Batch | None:
        return Batch.of_parts(
            [f.devices for f, _ in kept],
            [f.time_unix_nano for f, _ in kept],
            [len(f.values) for f, _ in kept],
            [at for _, at in kept],
            [f.values for f, _ in kept],
            len(schema),
            np.asarray(devices, dtype=np.int64) if with_numbers else None,
        )

    ours, theirs = batch(True), batch(False)
    if ours is None or theirs is None:
        assert ours is None and theirs is None
        return
    assert theirs.rounds is None and ours.rounds is not None
    rows, new = Classifier(policy_mod.load(), schema, interval_s=10).device_rows.of(theirs)
    expected = theirs.samples(rows, new).rounds(ordered=len(theirs.tables) == 1)
    assert [r.tolist() for r in ours.rounds] == [r.tolist() for r in expected or []]
    with_rounds, without = (Classifier(policy_mod.load(), schema, interval_s=10) for _ in range(2))
    with_rounds.ingest_batch(ours)
    without.ingest_batch(theirs)
    now = T0 + 20 * S
    assert state(with_rounds, now) == state(without, now)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(frame_spec, min_size=0, max_size=6), min_size=1, max_size=8))
def test_a_batch_without_events_is_stored_as_with_the_look_for_them_each_round(batches):
    """A batch none of whose samples holds an event, a restart or a reset (``Classifier._quiet``) goes into the
    stores without the per-round look for repairs, a job's crash or the logs' samples: the same windows, horizon,
    registry times and verdicts as with it (a node twice in a batch: two rounds)."""
    schema = Schema([TEMP, UNCORRECTED])
    quiet = Classifier(policy_mod.load(), schema, interval_s=10)
    looked = Classifier(policy_mod.load(), schema, interval_s=10)
    looked._quiet = lambda feats: False  # type: ignore[method-assign]
    counters_a: dict[str, int] = {}
    counters_b: dict[str, int] = {}
    for tick, specs in enumerate(batches):
        quiet.ingest_many(*frames_of(specs, tick, counters_a))
        looked.ingest_many(*frames_of(specs, tick, counters_b))
        now = T0 + (tick * 10 + 9) * S
        assert state(quiet, now) == state(looked, now)
        for name in ("last_seen", "last_heard", "first_seen"):
            assert np.array_equal(getattr(quiet.registry, name), getattr(looked.registry, name), equal_nan=True), name
        assert np.array_equal(quiet.horizon.total_sums, looked.horizon.total_sums, equal_nan=True)
        assert np.array_equal(quiet.store.ring, looked.store.ring, equal_nan=True)  # (the workload's features too)
