"""Time order and what each node holds: per node, the newest time read for each of its series (an
older point is refused), its devices, and when it was last heard (an idle node is forgotten)."""

from __future__ import annotations

from typing import Final

import numpy as np

from otel_dra.classifier.numeric import all_of

#: A node not decoded for this long (by the decoder's clock) loses its time floor: with node names that churn,
#: the per-node floors would otherwise grow without end on a long-running receiver.
NODE_IDLE_NS: Final = 60 * 60 * 10**9
#: How often (by the decoder's clock) idle state is looked for.
SWEEP_EVERY_NS: Final = 60 * 10**9
#: A series' key in :class:`SeriesFloors`: ``device index << _COL_BITS | column``.
_COL_BITS: Final = 24


#: No series looked up (no point was older than every series' newest).
NO_FLOORS: Final = np.zeros(0, np.uint64)


def series_keys(dev: np.ndarray, col: np.ndarray) -> np.ndarray:
    """The :class:`SeriesFloors` keys of points with these device (series index) and column indices."""
    return (dev.astype(np.int64) << _COL_BITS) | col.astype(np.int64)


_U64: Final = np.dtype(np.uint64)
_ZERO_STRIDE: Final = (0,)


def uniform_times(t: int | np.integer, n: int) -> np.ndarray:
    """``n`` points' times, all ``t``: a read-only uint64 array that holds one number (zero strides), so what
    waits on a node's points at one time (:meth:`SeriesFloors.defer`) is eight bytes, not eight a point."""
    return np.ndarray((n,), _U64, np.uint64(t), 0, _ZERO_STRIDE)


def series_parts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The device (series index) and column indices of these :func:`series_keys` keys (int32 each)."""
    return (keys >> _COL_BITS).astype(np.int32), (keys & ((1 << _COL_BITS) - 1)).astype(np.int32)


class SeriesFloors:
    """One node's series (device, column) and the newest time read for each: sorted int64 keys
    (:func:`series_keys`) and their times, so a request's points are checked and advanced as arrays (one
    ``searchsorted``), whichever decoder or path read them. 16 bytes a series: a node holds only the series
    it has sent (its devices and the caps bound them). Points taken in order are only noted (:meth:`defer`)
    and applied at the next look-up, or once a few requests' worth wait: a node whose points come in order
    costs no look-up per request.

    One time for every series (a node whose requests carry all its series at one time, the usual) is kept as
    that number, and so is the time of points waiting at one time: not as arrays. A fleet keeps these per node
    for as long as it runs, and every numpy array, even one that holds a single number, has its shape in a
    chunk of malloc's of its own, made on the thread that decodes, among that thread's freed temporaries: two
    a node pinned a page each (``assembly.PackedArrays`` says how that was measured)."""

    __slots__ = ("_pending", "_times", "_uniform", "_waiting", "keys", "newest", "version")

    def __init__(self) -> None:
        self.keys = np.empty(0, np.int64)
        self._times: np.ndarray | None = np.empty(0, np.uint64)  # None: every series at ``_uniform``
        self._uniform = 0
        #: Bumped whenever the keys change (a new series): places taken before stay valid while it is the same.
        self.version = 0
        #: At least the newest time of any series (0: none): points none older than it need no look-up.
        self.newest = 0
        #: (keys, times, places, version) of points taken, waiting; keys None: they wait by their places alone;
        #: times an int: every one of them at that time.
        self._pending: list[tuple[np.ndarray | None, np.ndarray | int, np.ndarray | None, int]] = []
        self._waiting = 0  # points in _pending

    @property
    def times(self) -> np.ndarray:
        """Each series' newest time (read-only where every series is at one time: :func:`uniform_times`)."""
        if self._times is None:
            return uniform_times(self._uniform, len(self.keys))
        return self._times

    def defer(self, keys: np.ndarray, times: np.ndarray, at: np.ndarray | None, version: int, newest: int) -> None:
        """Points taken, their series' times to move up (``at``: their places, None: not looked up, as they
        were at ``version``; ``newest``: their newest time). Points of the same series as the last that
        waits, each batch at one time (``times`` a broadcast number: a node's usual request), wait as one
        batch at the later time: what waits for a node sending the same series is one batch, not one each."""
        self.newest = max(self.newest, newest)
        # Places found at the present version stand until what waits is applied (keys only change in advance,
        # which applies it first): such points wait by their places, not with a copy of their keys.
        placed = at is not None and version == self.version and len(at) > 0 and all_of(at >= 0)
        waiting: np.ndarray | int = int(times[0]) if times.strides == (0,) and len(times) else times
        pending = self._pending
        if pending and isinstance(waiting, int):
            last_keys, last_times, last_at, last_version = pending[-1]
            # (the same places or keys as the last batch's: the same number of points, each at one time)
            if last_version == version and isinstance(last_times, int):
                if placed and last_keys is None:
                    assert at is not None  # (placed)
                    same = last_at is not None and (last_at is at or np.array_equal(last_at, at))
                elif not placed and last_keys is not None:
                    same = last_keys is keys or np.array_equal(last_keys, keys)
                else:
                    same = False
                if same:
                    pending[-1] = (last_keys, max(last_times, waiting), last_at if last_at is not None else at, version)
                    return
        pending.append((None if placed else keys, waiting, at, version))
        self._waiting += len(keys)
        if self._waiting > 4 * len(self.keys) + 1024:
            self._flush()

    def settle(self) -> None:
        """Apply what waits (see :meth:`defer`): the times and places read next are the present's."""
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        pending, self._pending, self._waiting = self._pending, [], 0
        # (a batch waiting by its places alone has them at this version: its keys are the floors' own there)
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | None, int]] = []
        for k, t, at, v in pending:
            keys_of = self.keys[at] if k is None else k
            parts.append((keys_of, uniform_times(t, len(keys_of)) if isinstance(t, int) else t, at, v))
        places = [at if at is not None and v == self.version else self.floors(k)[1] for k, _, at, v in parts]
        if len(parts) == 1:
            keys, times = parts[0][0], parts[0][1]
            at = places[0]
        else:
            keys, times, at = (np.concatenate(x) for x in ([p[0] for p in parts], [p[1] for p in parts], places))
        self.advance(keys, times, at, None)

    def floors(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's newest time (uint64, 0 for a series not read yet) and its place (-1: none yet), which
        :meth:`advance` takes back: the keys only change there."""
        if self._pending:
            self._flush()
        n = len(self.keys)
        if not n:
            return np.zeros(len(keys), np.uint64), np.full(len(keys), -1, np.intp)
        at = np.searchsorted(self.keys, keys)
        np.minimum(at, n - 1, out=at)
        found = self.keys[at] == keys
        times = self.times
        if found.all():
            return times[at], at
        return np.where(found, times[at], np.uint64(0)), np.where(found, at, -1)

    def advance(self, keys: np.ndarray, times: np.ndarray, at: np.ndarray, restart: np.ndarray | None) -> None:
        """Points taken (``at``: their places, as :meth:`floors` gave them): each series' newest time moves
        up to its points'; the series in ``restart`` (their clock jumped back) start again from this
        request's points."""
        if self._pending:
            self._flush()
        floor = self.times.copy()  # (written below: an array of its own, whatever is kept)
        restarted = restart is not None and len(restart) > 0 and len(self.keys) > 0
        if restart is not None and restarted:
            floor[np.isin(self.keys, restart)] = 0
        found = at >= 0
        if found.all():
            np.maximum.at(floor, at, times)
        else:
            np.maximum.at(floor, at[found], times[found])
            new, inverse = np.unique(keys[~found], return_inverse=True)
            newest = np.zeros(len(new), np.uint64)
            np.maximum.at(newest, inverse, times[~found])
            merged = np.concatenate([self.keys, new])
            order = np.argsort(merged, kind="stable")
            self.keys, floor = merged[order], np.concatenate([floor, newest])[order]
            self.version += 1
        self.newest = int(floor.max()) if restarted else max(self.newest, int(times.max()))
        if len(floor) and floor[0] == self.newest and (floor == self.newest).all():
            # Every series read up to the same time (a node whose requests carry all its series at one time):
            # one number, not eight bytes a series.
            self._times, self._uniform = None, self.newest
        else:
            self._times = floor


class NodeFloors:
    """Per node, the newest time decoded for each of its series (an older point is rejected: input is in
    time order per series; :class:`SeriesFloors`), when (the decoder's clock) the node was last decoded, so
    an idle node can be forgotten, and the devices it has named (the caps count them): forgetting a node
    frees its slot, its devices and its series' times."""

    def __init__(self, now: int) -> None:
        self.series: dict[str, SeriesFloors] = {}
        self.seen: dict[str, int] = {}
        self.devices: dict[str, set[str]] = {}  # the nodes admitted, and each one's devices
        self.device_count = 0
        #: Each admitted node's admission number: a cache built on a node's devices checks it is still current.
        self.generation: dict[str, int] = {}
        self._generations = 0
        self.swept = now

    def of(self, node: str) -> SeriesFloors:
        """The node's series and their newest times (made empty on first use)."""
        floors = self.series.get(node)
        if floors is None:
            floors = self.series[node] = SeriesFloors()
        return floors

    def due(self, now: int) -> bool:
        """Whether it is time to look for idle nodes (or the clock went back)."""
        return now - self.swept > SWEEP_EVERY_NS or now < self.swept

    def forget_idle(self, now: int) -> None:
        """Drop every node not decoded for NODE_IDLE_NS: its floor, its slot and its devices."""
        self.swept = now
        for node in [n for n, at in self.seen.items() if now - at > NODE_IDLE_NS]:
            del self.seen[node]
            self.series.pop(node, None)
            self.generation.pop(node, None)
            self.device_count -= len(self.devices.pop(node, ()))

    def admit(self, node: str, now: int) -> set[str]:
        """A node taken in (the caller checked the caps): its device set, empty."""
        self.seen[node] = now
        self._generations += 1
        self.generation[node] = self._generations
        devices = self.devices[node] = set()
        return devices

    def advance(self, node: str, t: int, now: int) -> None:
        """A frame of ``node`` at ``t`` was made (its series' times move with :meth:`SeriesFloors.advance`)."""
        self.seen[node] = now
