"""A job's crash is not a fault of each device it ran on: telling the workload's events from the device's.

When a job crashes, every GPU it held reports an application-class driver error (XID 13, 31, 43) and an
out-of-memory event at once; a job that crash-loops does it every few minutes. Counted per device, that is
eight devices with ``driver_errors``, climbing toward ``replace_device``, for a bug in the job. Real device
faults land on one device while its neighbours in the same job stay clean (NVSentinel tells them apart by
the fault's hardware location history; failure-modes.md).

So, per sample, each node's application errors and OOMs are split before they reach the event logs: those
that landed on ``min_devices`` or more of a node's GPUs in the same sample, or within ``together_s`` of such a
crash on the node (a crash's events may straddle two samples), or both kinds at once on one GPU (its process
died: a one-GPU job's crash), are the workload's (the
``WORKLOAD_APPLICATION`` / ``WORKLOAD_OOM`` features and their logs); the rest stay the device's. Events a
device logged alone shortly before its node's crash are moved over too. Array work over the batch's rows;
only the rows of a node that just crashed are looked at again.
"""

from __future__ import annotations

import numpy as np

from otel_dra.classifier.events import EventLog
from otel_dra.classifier.features import F
from otel_dra.classifier.numeric import any_of, flatnonzero, nan_to_num
from otel_dra.classifier.registry import grown_rows

#: Device features split into the workload's, and where each goes.
SPLIT: tuple[tuple[F, F], ...] = (
    (F.DRIVER_APPLICATION, F.WORKLOAD_APPLICATION),
    (F.OUT_OF_MEMORY, F.WORKLOAD_OOM),
)

#: The workload's event features, as rows of the feature-major array (what :meth:`WorkloadSplit.none_moved` zeroes).
_WORKLOAD_FEATURES = np.asarray([workload_f for _, workload_f in SPLIT], dtype=np.intp)


class WorkloadSplit:
    """Per row, when its node last had a job crash (its node's clock); splits each batch's events."""

    def __init__(self, capacity: int, min_devices: int, together_s: float) -> None:
        self.min_devices = min_devices
        self.together_s = together_s
        self.crash_at = np.full(capacity, -np.inf)

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.crash_at = grown_rows(self.crash_at, capacity, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        self.crash_at[rows] = -np.inf

    def none_moved(self, feats: np.ndarray) -> None:
        """The workload's event features of samples none of whose events is moved (``feats``, ``(features, rows)``,
        in place): zero, what :meth:`split` starts from."""
        feats[_WORKLOAD_FEATURES] = 0.0

    def split(
        self,
        rows: np.ndarray,
        node_of: np.ndarray,
        active: np.ndarray,
        time_s: np.ndarray,
        feats: np.ndarray,
        logs: dict[F, EventLog],
    ) -> None:
        """Move this batch's crash events (``feats``, ``(features, rows)``, in place) to the workload's
        features, and events ``logs`` holds of a crashed node's devices from just before it to the
        workload's logs. ``node_of``/``active``: the registry's, for every row."""
        self.none_moved(feats)
        kinds = [feats[device_f] > 0 for device_f, _ in SPLIT]  # (NaN: no event)
        hit = kinds[0] | kinds[1]
        if not any_of(hit):
            return
        nodes = node_of[rows]
        counts = np.bincount(nodes[hit], minlength=int(nodes.max()) + 1)
        together = hit & (counts[nodes] >= self.min_devices)
        near = hit & (np.abs(time_s - self.crash_at[rows]) <= self.together_s)
        # An application error and an out-of-memory event on one GPU at once: its process died (a one-GPU job's
        # crash looks so); the GPU's own faults come one kind at a time.
        died = kinds[0] & kinds[1]
        moved = together | near | died
        for device_f, workload_f in SPLIT:
            amount = nan_to_num(feats[device_f])
            feats[workload_f] = np.where(moved, amount, 0.0)
            feats[device_f] = np.where(moved & ~np.isnan(feats[device_f]), 0.0, feats[device_f])
        if not together.any():
            return
        # A crash now: every device of its node carries its time, and what they logged alone just before is its.
        when = np.full(counts.shape[0], -np.inf)
        np.maximum.at(when, nodes[together], time_s[together])
        crashed = flatnonzero(np.isfinite(when))
        members = flatnonzero(active & np.isin(node_of, crashed))
        at = when[node_of[members]]
        self.crash_at[members] = np.fmax(self.crash_at[members], at)
        for device_f, workload_f in SPLIT:
            logs[device_f].move(members, at - self.together_s, logs[workload_f])
