"""A batch of frames on its way in: its samples as arrays, their device rows, and the rounds they go in by.

A fleet tick brings thousands of frames; what is done per frame is a few comprehensions and a dictionary read
(a node sending the same devices again: :class:`SeenTable`), and the rest is array work over the whole batch.
A device sampled more than once in the batch gets its samples in order, one round each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from otel_dra import conventions as cv
from otel_dra.classifier.numeric import all_of, flatnonzero
from otel_dra.classifier.params import PolicyGroups
from otel_dra.classifier.registry import DeviceRegistry
from otel_dra.classifier.topology import Topology
from otel_dra.frame import DeviceTable, Frame, stacked


@dataclass(frozen=True, slots=True)
class Samples:
    """Samples, one a device row: whether the row is new, the sample's time and arrival (unix ns), its values
    (``(samples, schema columns)``)."""

    rows: np.ndarray
    new: np.ndarray
    times: np.ndarray
    values: np.ndarray
    arrivals: np.ndarray

    def picked(self, pick: np.ndarray) -> Samples:
        return Samples(self.rows[pick], self.new[pick], self.times[pick], self.values[pick], self.arrivals[pick])

    def rounds(self, ordered: bool) -> list[np.ndarray] | None:
        """Where the samples go in rounds that have every device at most once, each device's samples in arrival
        order (:func:`rounds_of` their rows); None where every device is sampled once (one round, the usual tick;
        ``ordered``: the rows are known to be unique, a single frame's)."""
        return None if ordered else rounds_of(self.rows)


def rounds_of(devices: np.ndarray) -> list[np.ndarray] | None:
    """Where samples of ``devices`` (per sample, a number that is its device's alone: its row, or a replay's decode
    stage's number for its node and ``hw.id``) go in rounds that have every device at most once, each device's
    samples in order: each round's positions among the samples, in order; None where every device is sampled
    once."""
    if all_of(devices[1:] > devices[:-1]):  # ascending: every device once
        return None
    # Occurrence rank of each device within the batch (0 for a device's first sample, 1 for its
    # second, ...), so each round has every device at most once, in arrival order. (Slices and concatenate, not
    # np.diff and np.r_: their Python-level cost is most of a small batch's.)
    order = np.argsort(devices, kind="stable")
    ordered = devices[order]
    starts = np.concatenate(([0], flatnonzero(ordered[1:] != ordered[:-1]) + 1))
    if starts.size == devices.size:  # every device once (the usual tick): one round, in batch order
        return None
    rank_sorted = np.arange(devices.size) - starts.repeat(np.concatenate((starts[1:], [devices.size])) - starts)
    rank = np.empty(devices.size, dtype=np.int64)
    rank[order] = rank_sorted
    return [flatnonzero(rank == r) for r in range(int(rank.max()) + 1)]


@dataclass(frozen=True, slots=True)
class Batch:
    """The frames of a batch that hold samples, as their device tables and their samples as arrays (one a device
    of a frame)."""

    tables: list[DeviceTable]  # per frame, its device table
    sizes: list[int]  # per frame, its devices
    offsets: np.ndarray  # per frame, where its samples start
    everyone: list[bool]  # per frame, whether it read every one of its devices
    values: np.ndarray  # (samples, schema columns), NaN: absent
    read: np.ndarray  # per sample, whether it read its device (a row all NaN was not read this time)
    times: np.ndarray  # per sample, its frame's time (unix ns)
    arrivals: np.ndarray  # per sample, when its frame was heard (unix ns, the reference clock)
    #: The rounds of its read samples (:meth:`Samples.rounds`) where they were worked out already, as a replay's
    #: decode stage does beside its decoding ([]: every device once); None: not yet.
    rounds: list[np.ndarray] | None = None

    @classmethod
    def of(cls, frames: list[Frame], arrivals_unix_nano: list[int] | int | None, ncols: int) -> Batch | None:
        """The batch of ``frames`` (``None``: none holds a sample), heard at ``arrivals_unix_nano`` (per frame,
        or one for all; default: each frame's own time), widened to ``ncols`` schema columns."""
        if arrivals_unix_nano is None or isinstance(arrivals_unix_nano, int):
            kept = [f for f in frames if len(f.values)]
            heard: list[int] | int | None = arrivals_unix_nano
        else:
            pairs = [(f, a) for f, a in zip(frames, arrivals_unix_nano, strict=True) if len(f.values)]
            kept, heard = [f for f, _ in pairs], [a for _, a in pairs]
        # One comprehension per column of the batch, not one loop doing all of them (thousands of frames a tick).
        matrices = [f.values for f in kept]
        sizes = [len(m) for m in matrices]
        return cls.of_parts([f.devices for f in kept], [f.time_unix_nano for f in kept], sizes, heard, matrices, ncols)

    @classmethod
    def of_parts(
        cls,
        tables: list[DeviceTable],
        stamps: list[int],
        sizes: list[int],
        heard: list[int] | int | None,
        matrices: list[np.ndarray],
        ncols: int,
        devices: np.ndarray | None = None,
    ) -> Batch | None:
        """The batch of frames given as their parts (frames with samples: each one's table, time, devices and when
        it was heard, as :meth:`of` takes them), their values as ``matrices``: one a frame, or fewer, each holding
        the next frames' rows (a decode process sends a batch's as one); ``None``: no frame. ``devices``: per
        sample, a number that is its device's alone (:func:`rounds_of`): the batch's rounds are worked out here."""
        if not tables:
            return None
        values = stacked(matrices, ncols)
        read = ~np.logical_and.reduce(np.isnan(values), axis=1)
        counts = np.asarray(sizes, dtype=np.intp)
        offsets = np.zeros(len(sizes), dtype=np.intp)
        np.cumsum(counts[:-1], out=offsets[1:])
        everyone = np.logical_and.reduceat(read, offsets).tolist()
        times = np.repeat(np.asarray(stamps, dtype=np.int64), counts)
        if heard is None:
            arrivals = times
        elif isinstance(heard, int):
            arrivals = np.full(times.shape, heard, dtype=np.int64)
        else:
            arrivals = np.repeat(np.asarray(heard, dtype=np.int64), counts)
        rounds = None
        if devices is not None:  # (the rounds of the read samples, as ingest_batch reads them: [] for none)
            rounds = [] if len(tables) == 1 else rounds_of(devices if all(everyone) else devices[read]) or []
        return cls(tables, sizes, offsets, everyone, values, read, times, arrivals, rounds)

    def samples(self, rows: np.ndarray, new: np.ndarray) -> Samples:
        """The samples that read their device, at ``rows`` (one a read sample); ``new``: per sample of the
        batch, whether its row is new."""
        if all(self.everyone):
            return Samples(rows, new, self.times, self.values, self.arrivals)
        read = self.read
        return Samples(rows, new[read], self.times[read], self.values[read], self.arrivals[read])


@dataclass(frozen=True, slots=True)
class SeenTable:
    """A node's device table last seen whole (every device read with it), and its rows, as of the registry's
    ``generation`` (its rows stand while it does not change)."""

    table: DeviceTable
    generation: int
    rows: np.ndarray

    def holds(self, table: DeviceTable, generation: int) -> bool:
        """Whether ``table``'s rows are these, at the registry's ``generation``."""
        return self.table is table and self.generation == generation


class DeviceRows:
    """The device rows of a batch's samples, registering new devices and noting changed attributes.

    Device tables are immutable and sources reuse them while nothing changes: only a new table (a device's
    attributes changed, or a new device) costs a look at each device. ``regrouped`` is called when a device's
    policy group may have changed."""

    def __init__(
        self, registry: DeviceRegistry, groups: PolicyGroups, regrouped: Callable[[], None], topology: Topology
    ) -> None:
        self.registry = registry
        self.groups = groups
        self.topology = topology
        self.regrouped = regrouped
        #: Per node, the last device table seen whole: a node sending the same devices again costs no look-up
        #: per device.
        self.tables: dict[str, SeenTable] = {}

    def keep_nodes(self) -> None:
        """The registry compacted: the tables of nodes with no device left are gone."""
        nodes = set(self.registry.nodes)
        self.tables = {node: seen for node, seen in self.tables.items() if node in nodes}

    def of(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """(rows of the batch's read samples, new: per sample of the batch, whether its row is new)."""
        tables = self.tables
        generation = self.registry.generation
        # Each frame's rows, when every frame is a table seen at this generation (a node sending the same
        # devices again); the tables not seen as they are may bring new devices.
        # (SeenTable.holds inlined here and below: a call per frame costs a tick of 1,250 frames a third of a ms.)
        found = [
            s.rows
            for t in batch.tables
            if (s := tables.get(t.node)) is not None and s.table is t and s.generation == generation
        ]
        new = np.zeros(batch.values.shape[0], dtype=bool)
        if len(found) == len(batch.tables) and all(batch.everyone):  # the usual tick: every frame seen, all read
            return (found[0] if len(found) == 1 else np.concatenate(found)), new
        fresh: dict[int, DeviceTable] = {}
        if len(found) != len(batch.tables):
            for t in batch.tables:
                s = tables.get(t.node)
                if s is None or s.table is not t:
                    fresh[id(t)] = t
        if fresh:  # room for all the new devices at once
            self.registry.reserve((t.node, t.ids) for t in fresh.values())
        looked = []
        generation = self.registry.generation
        read = batch.read
        for t, o, n, e in zip(batch.tables, batch.offsets.tolist(), batch.sizes, batch.everyone, strict=True):
            seen = tables.get(t.node)
            if e and seen is not None and seen.table is t and seen.generation == generation:  # (holds)
                looked.append(seen.rows)
                continue
            rows_f, new_f = self._of_table(t, read[o : o + n], e)
            looked.append(rows_f)
            if new_f.any():
                new[o : o + n][read[o : o + n]] = new_f
            generation = self.registry.generation
        return (looked[0] if len(looked) == 1 else np.concatenate(looked)), new

    def _of_table(self, table: DeviceTable, read: np.ndarray, everyone: bool) -> tuple[np.ndarray, np.ndarray]:
        """(rows, new mask) of the devices a frame of ``table`` read (``read``: which of its rows; ``everyone``:
        all)."""
        # A table is remembered as seen only once every one of its devices was read with it, so an attribute
        # change that arrives while its device is not read is noted when it is.
        seen = self.tables.get(table.node)
        if everyone and seen is not None and seen.holds(table, self.registry.generation):
            return seen.rows, np.zeros(len(seen.rows), dtype=bool)
        if everyone:
            rows, new = self.registry.rows_for(table.node, table.ids)
        else:
            ids = [dev for dev, ok in zip(table.ids, read.tolist(), strict=True) if ok]
            rows, new = self.registry.rows_for(table.node, ids)
        if seen is None or seen.table is not table or new.any():
            attrs = [a for a, ok in zip(table.attrs, read.tolist(), strict=True) if ok]
            new = new | self._note_attrs(rows, attrs, new)
        if everyone:
            self.tables[table.node] = SeenTable(table, self.registry.generation, rows)
        return rows, new

    def _note_attrs(self, rows: np.ndarray, attrs: Iterable[Mapping[str, str]], new: np.ndarray) -> np.ndarray:
        """Record the rows' attributes; a device whose attributes changed, or a new one (its id may name its
        slot), is classified again. A device whose serial number changed is another device in the same slot
        (replaced): it starts clean, as a new one; returns which rows were."""
        reg = self.registry
        replaced = np.zeros(len(new), dtype=bool)
        for i, (row, a, first) in enumerate(zip(rows.tolist(), attrs, new.tolist(), strict=True)):
            was = reg.attrs[row].get(cv.HW_SERIAL_NUMBER, "")
            if not first and was and a.get(cv.HW_SERIAL_NUMBER, was) != was:
                replaced[i] = True
                reg.renew(np.asarray([row]))
            if reg.set_attrs(row, a) or first or replaced[i]:
                key = reg.keys[row]
                self.groups.assign(row, a, key[1] if key is not None else "")
                self.topology.assign(row, key[0] if key is not None else "", a)
                self.regrouped()
        return replaced
